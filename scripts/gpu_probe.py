"""Kernel-structure probe for decode on the GPU (a study, not part of the compiler): hand-written
variants of the decode step's heaviest kernel shapes, each timed as the user runs kernels (a CUDA
graph replaying 32 launches over rotating weights, so nothing is served from L2), beside cuBLAS
(torch) where it applies. What wins here is what the CUDA template should be able to express.
Usage on the GPU machine: python3 scripts/gpu_probe.py  (prints a table; JSON to $OUT/probe.json)"""
import json
import os
import re

import cupy as cp
import numpy as np
import torch

ROT = 32
PRELUDE = r"""
typedef unsigned short u16;
__device__ __forceinline__ float lo(unsigned w) { return __int_as_float(w << 16); }
__device__ __forceinline__ float hi(unsigned w) { return __int_as_float(w & 0xffff0000u); }
__device__ __forceinline__ uint4 ld_stream(const void* p) {
  uint4 r; asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                        : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p)); return r; }
__device__ __forceinline__ float dot8(uint4 w, uint4 x) {
  return lo(w.x)*lo(x.x) + hi(w.x)*hi(x.x) + lo(w.y)*lo(x.y) + hi(w.y)*hi(x.y)
       + lo(w.z)*lo(x.z) + hi(w.z)*hi(x.z) + lo(w.w)*lo(x.w) + hi(w.w)*hi(x.w); }
__device__ __forceinline__ float warp_sum(float v, int width) {
  for (int o = width / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o); return v; }
"""

GEMV = {
# today's template: a warp per row, grid-stride, int64 indices, unroll 4
"warp_i64": r"""
extern "C" __global__ void __launch_bounds__(BLOCK) f(float* out, const u16* w, const u16* x) {
  const int lane = threadIdx.x % 32;
  for (long long row = ((long long)blockIdx.x * blockDim.x + threadIdx.x) / 32; row < N; row += (long long)gridDim.x * blockDim.x / 32) {
    float acc = 0;
    #pragma unroll 4
    for (long long b = lane * 8; b < K; b += 256) acc += dot8(*(const uint4*)(w + K * row + b), *(const uint4*)(x + b));
    acc = warp_sum(acc, 32);
    if (lane == 0) out[row] = acc;
  }
}""",
# a warp per row, int32, fully unrolled, weights streamed past L1
"warp_full_nc": r"""
extern "C" __global__ void __launch_bounds__(BLOCK) f(float* out, const u16* w, const u16* x) {
  const int lane = threadIdx.x % 32, row = blockIdx.x * (BLOCK / 32) + threadIdx.x / 32;
  if (row >= N) return;
  const u16* wr = w + (long long)row * K;
  uint4 v[K / 256];
  #pragma unroll
  for (int i = 0; i < K / 256; i++) v[i] = ld_stream(wr + i * 256 + lane * 8);
  float acc = 0;
  #pragma unroll
  for (int i = 0; i < K / 256; i++) acc += dot8(v[i], *(const uint4*)(x + i * 256 + lane * 8));
  acc = warp_sum(acc, 32);
  if (lane == 0) out[row] = acc;
}""",
# a warp per row, loads in batches of 4 (fewer registers for long rows), streamed
"warp_batch4_nc": r"""
extern "C" __global__ void __launch_bounds__(BLOCK) f(float* out, const u16* w, const u16* x) {
  const int lane = threadIdx.x % 32, row = blockIdx.x * (BLOCK / 32) + threadIdx.x / 32;
  if (row >= N) return;
  const u16* wr = w + (long long)row * K;
  float acc = 0;
  #pragma unroll
  for (int i = 0; i < K / 256; i += 4) {
    uint4 v[4];
    #pragma unroll
    for (int j = 0; j < 4; j++) v[j] = ld_stream(wr + (i + j) * 256 + lane * 8);
    #pragma unroll
    for (int j = 0; j < 4; j++) acc += dot8(v[j], *(const uint4*)(x + (i + j) * 256 + lane * 8));
  }
  acc = warp_sum(acc, 32);
  if (lane == 0) out[row] = acc;
}""",
# a block per row (long rows, few of them): every thread a slice, shared-memory combine
"block_row_nc": r"""
extern "C" __global__ void __launch_bounds__(BLOCK) f(float* out, const u16* w, const u16* x) {
  __shared__ float part[BLOCK / 32];
  const int row = blockIdx.x, t = threadIdx.x;
  const u16* wr = w + (long long)row * K;
  float acc = 0;
  #pragma unroll
  for (int i = 0; i < K / (BLOCK * 8); i++) acc += dot8(ld_stream(wr + (i * BLOCK + t) * 8), *(const uint4*)(x + (i * BLOCK + t) * 8));
  acc = warp_sum(acc, 32);
  if (t % 32 == 0) part[t / 32] = acc;
  __syncthreads();
  if (t == 0) { float s = 0; for (int i = 0; i < BLOCK / 32; i++) s += part[i]; out[row] = s; }
}""",
}

# the same with plain loads (L1 allocating)
GEMV["warp_full"] = GEMV["warp_full_nc"].replace("ld_stream(", "*(const uint4*)(")

# attention's P.V at decode: out[h, d] = sum_j p[h, j] v[h / 4, j, d]; 32 heads, 8 kv heads, d 64
PV = {
"lanes_on_j": r"""
extern "C" __global__ void __launch_bounds__(256) f(float* out, const float* p, const u16* v) {
  const int lane = threadIdx.x % 32;
  for (int pt = (blockIdx.x * 256 + threadIdx.x) / 32; pt < 32 * 64; pt += gridDim.x * 8) {
    const int h = pt / 64, d = pt % 64;
    float acc = 0;
    #pragma unroll 4
    for (int j = lane; j < S; j += 32) acc += p[h * S + j] * __int_as_float(((unsigned)v[((h / 4) * S + j) * 64 + d]) << 16);
    acc = warp_sum(acc, 32);
    if (lane == 0) out[pt] = acc;
  }
}""",
# lanes on d (coalesced rows of v), SLICES warps-worth of threads split j; shared-memory combine
"lanes_on_d": r"""
extern "C" __global__ void __launch_bounds__(64 * SLICES) f(float* out, const float* p, const u16* v) {
  __shared__ float part[SLICES][64];
  const int h = blockIdx.x, d = threadIdx.x % 64, s = threadIdx.x / 64;
  const u16* vh = v + (h / 4) * S * 64;
  float acc = 0;
  #pragma unroll 4
  for (int j = s; j < S; j += SLICES) acc += p[h * S + j] * __int_as_float(((unsigned)vh[j * 64 + d]) << 16);
  part[s][d] = acc;
  __syncthreads();
  if (s == 0) { for (int i = 1; i < SLICES; i++) acc += part[i][d]; out[h * 64 + d] = acc; }
}""",
}

# attention's scores at decode: s[h, j] = sum_d q[h, d] k[h / 4, j, d]
QK = {
"thread_per_score": r"""
extern "C" __global__ void __launch_bounds__(128) f(float* out, const float* q, const u16* k) {
  for (int pt = blockIdx.x * 128 + threadIdx.x; pt < 32 * S; pt += gridDim.x * 128) {
    const int h = pt / S, j = pt % S;
    const u16* kr = k + ((h / 4) * S + j) * 64;
    float acc = 0;
    #pragma unroll
    for (int i = 0; i < 8; i++) { uint4 w = *(const uint4*)(kr + i * 8); const float* qq = q + h * 64 + i * 8;
      acc += lo(w.x)*qq[0] + hi(w.x)*qq[1] + lo(w.y)*qq[2] + hi(w.y)*qq[3] + lo(w.z)*qq[4] + hi(w.z)*qq[5] + lo(w.w)*qq[6] + hi(w.w)*qq[7]; }
    out[pt] = acc;
  }
}""",
"group8": r"""
extern "C" __global__ void __launch_bounds__(256) f(float* out, const float* q, const u16* k) {
  const int lane = threadIdx.x % 8;
  for (int pt = (blockIdx.x * 256 + threadIdx.x) / 8; pt < 32 * S; pt += gridDim.x * 32) {
    const int h = pt / S, j = pt % S;
    uint4 w = *(const uint4*)(k + ((h / 4) * S + j) * 64 + lane * 8); const float* qq = q + h * 64 + lane * 8;
    float acc = lo(w.x)*qq[0] + hi(w.x)*qq[1] + lo(w.y)*qq[2] + hi(w.y)*qq[3] + lo(w.z)*qq[4] + hi(w.z)*qq[5] + lo(w.w)*qq[6] + hi(w.w)*qq[7];
    acc = warp_sum(acc, 8);
    if (lane == 0) out[pt] = acc;
  }
}""",
}


def fill(body: str, **values) -> str:
    """The kernel source with each placeholder word (N, K, BLOCK, S, SLICES) replaced."""
    for word, value in values.items():
        body = re.sub(rf"\b{word}\b", str(value), body)
    return PRELUDE + body


def graph_time(launch, rotations: int) -> float:
    """Seconds per launch: a CUDA graph of `rotations` launches (each on its own buffers), replayed."""
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        launch(0)
        stream.synchronize()
        stream.begin_capture()
        for r in range(rotations):
            launch(r)
        graph = stream.end_capture()
        graph.launch(stream)
        stream.synchronize()
        times = []
        for _ in range(15):
            a, b = cp.cuda.Event(), cp.cuda.Event()
            a.record(stream)
            graph.launch(stream)
            b.record(stream)
            b.synchronize()
            times.append(cp.cuda.get_elapsed_time(a, b) / 1e3 / rotations)
    return float(np.median(times))


def bf16(a: np.ndarray) -> np.ndarray:
    return (a.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)


def main():
    rng = np.random.default_rng(0)
    results = []
    for n, k in ((8192, 2048), (2048, 8192), (2048, 2048), (512, 2048), (128256, 2048)):
        rot = ROT if n * k * 2 * ROT < 4e9 else 4
        ws = [cp.asarray(bf16(rng.standard_normal((n, k)).astype(np.float32) * 0.02)) for _ in range(rot)]
        x = cp.asarray(bf16(rng.standard_normal(k).astype(np.float32)))
        want = (ws[0].astype(cp.uint32) << 16).view(cp.float32).reshape(n, k) @ (x.astype(cp.uint32) << 16).view(cp.float32)
        out = cp.empty(n, cp.float32)
        for name, body in GEMV.items():
            for block in (128, 256, 512):
                if name == "block_row_nc" and (k % (block * 8) or n > 8192):
                    continue
                src = fill(body, BLOCK=block, N=n, K=k)
                try:
                    fn = cp.RawModule(code=src, options=("--std=c++17",)).get_function("f")
                except Exception as err:
                    print(name, block, "compile failed", str(err)[:200])
                    continue
                grid = n if name == "block_row_nc" else (min(n * 32 // block, 65535 * 8) if name == "warp_i64" else -(-n * 32 // block))
                launch = lambda r: fn((grid,), (block,), (out, ws[r], x))
                out.fill(float("nan"))
                launch(0)
                err = float(cp.abs(out - want).max() / cp.abs(want).max())
                t = graph_time(launch, rot)
                results.append({"kind": "gemv", "shape": [n, k], "variant": name, "block": block, "s": t,
                                "tb_per_s": n * k * 2 / t / 1e12, "rel_err": err})
        tw = [torch.from_numpy(((np.asarray(w.get()).astype(np.uint32) << 16).view(np.float32)).reshape(n, k)).cuda().bfloat16() for w in ws[:rot]]
        tx = torch.from_numpy(((x.get().astype(np.uint32) << 16).view(np.float32))).cuda().bfloat16()
        tout = [None] * rot

        def tlaunch(r):
            torch.mv(tw[r], tx, out=tout[r])
        for r in range(rot):
            tout[r] = torch.empty(n, dtype=torch.bfloat16, device="cuda")
        g = torch.cuda.CUDAGraph()
        torch.mv(tw[0], tx, out=tout[0]); torch.cuda.synchronize()
        with torch.cuda.graph(g):
            for r in range(rot):
                tlaunch(r)
        g.replay(); torch.cuda.synchronize()
        ts = []
        for _ in range(15):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record(); g.replay(); b.record(); b.synchronize()
            ts.append(a.elapsed_time(b) / 1e3 / rot)
        t = float(np.median(ts))
        results.append({"kind": "gemv", "shape": [n, k], "variant": "torch.mv (cuBLAS)", "block": 0, "s": t,
                        "tb_per_s": n * k * 2 / t / 1e12, "rel_err": 0.0})
        del ws, tw
    for s in (704, 4096):
        p = [cp.asarray(rng.random((32, s)).astype(np.float32) / s) for _ in range(ROT)]
        v = [cp.asarray(bf16(rng.standard_normal((8, s, 64)).astype(np.float32))) for _ in range(ROT)]
        vf = (v[0].astype(cp.uint32) << 16).view(cp.float32)
        want = cp.stack([p[0][h] @ vf[h // 4] for h in range(32)])
        out = cp.empty((32, 64), cp.float32)
        for name, body in PV.items():
            for slices in ((1,) if name == "lanes_on_j" else (4, 8, 16)):
                src = fill(body, SLICES=slices, S=s)
                fn = cp.RawModule(code=src, options=("--std=c++17",)).get_function("f")
                launch = (lambda r: fn((256,), (256,), (out, p[r], v[r]))) if name == "lanes_on_j" else \
                         (lambda r: fn((32,), (64 * slices,), (out, p[r], v[r])))
                out.fill(float("nan"))
                launch(0)
                err = float(cp.abs(out - want).max() / cp.abs(want).max())
                t = graph_time(launch, ROT)
                results.append({"kind": "pv", "shape": [32, s, 64], "variant": f"{name}{slices if slices > 1 else ''}",
                                "block": 0, "s": t, "tb_per_s": 8 * s * 64 * 2 / t / 1e12, "rel_err": err})
        q = [cp.asarray(rng.standard_normal((32, 64)).astype(np.float32)) for _ in range(ROT)]
        kc = [cp.asarray(bf16(rng.standard_normal((8, s, 64)).astype(np.float32))) for _ in range(ROT)]
        kf = (kc[0].astype(cp.uint32) << 16).view(cp.float32)
        want = cp.stack([kf[h // 4] @ q[0][h] for h in range(32)])
        out = cp.empty((32, s), cp.float32)
        for name, body in QK.items():
            fn = cp.RawModule(code=fill(body, S=s), options=("--std=c++17",)).get_function("f")
            block = 128 if name == "thread_per_score" else 256
            grid = -(-32 * s * (1 if name == "thread_per_score" else 8) // block)
            launch = lambda r: fn((grid,), (block,), (out, q[r], kc[r]))
            out.fill(float("nan"))
            launch(0)
            err = float(cp.abs(out - want).max() / cp.abs(want).max())
            t = graph_time(launch, ROT)
            results.append({"kind": "qk", "shape": [32, s, 64], "variant": name, "block": block, "s": t,
                            "tb_per_s": 8 * s * 64 * 2 / t / 1e12, "rel_err": err})
    for r in results:
        print(f"{r['kind']:5s} {str(r['shape']):18s} {r['variant']:20s} {r['block']:4d} {r['s'] * 1e6:8.2f} us "
              f"{r['tb_per_s']:6.2f} TB/s  err {r['rel_err']:.1e}")
    with open(os.path.join(os.environ.get("OUT", "."), "probe.json"), "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
