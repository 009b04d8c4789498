"""What a small GEMV's time is made of, on the product the GEMV table leaves short (2048 -> 512 at
86% of a copy of as many bytes on the H200): the template's configurations (wider than its
search space: blocks of 32 and 64 threads too) with the weight read plainly and streaming
(CudaConfig.stream: past L1, with a 256-byte L2 prefetch; x through L1), hand-written kernels that give each
group of threads several rows (so the x vector is read once for them), and the floors in this
launch mode: an empty kernel, a copy of as many bytes, a read of the weight's bytes that writes
nothing. Every kernel is timed as the GEMV table times it (a replayed CUDA graph over rotating
weights). Usage on the GPU machine: python3 scripts/gemv_probe.py [N K ...]  (JSON to
$OUT/gemv-probe.json)"""
import json
import os
import sys

import cupy as cp
import numpy as np

from kiln.ir import DType
from kiln.codegen.cuda_config import CudaConfig, config_space, splittable
from kiln.codegen.cuda_emit import PRELUDE
from kiln.runtime.cuda import CudaBackend
from gemv_table import ROTATIONS_BYTES, gemv_kernel
from kernel_timing import bf16_bits, from_bits, graph_seconds

# how a kernel reads the weight: plainly, or streaming (past L1, a 256-byte L2 prefetch: PRELUDE's
# `_stream` reads, what CudaConfig.stream gives the template)
MODES = {"plain": "", "stream": "_stream"}

HAND = r"""
// ROWS rows per block of GROUP threads, every load issued before any product
extern "C" __global__ void __launch_bounds__(GROUP) NAME(float* out, const uint16_t* w, const uint16_t* x) {
  __shared__ float partial[ROWS][GROUP / 32 + 1];
  const int lane = threadIdx.x;
  const long row0 = (long)blockIdx.x * ROWS;
  uint4 xs[STEPS], ws[ROWS][STEPS];
  #pragma unroll
  for (int s = 0; s < STEPS; s++) xs[s] = *(const uint4*)(x + (s * GROUP + lane) * 8);
  #pragma unroll
  for (int r = 0; r < ROWS; r++)
    #pragma unroll
    for (int s = 0; s < STEPS; s++) ws[r][s] = kiln_read16MODE(w + (row0 + r) * KDIM + (s * GROUP + lane) * 8);
  #pragma unroll
  for (int r = 0; r < ROWS; r++) {
    float acc = 0;
    #pragma unroll
    for (int s = 0; s < STEPS; s++) {
      const unsigned a[4] = {xs[s].x, xs[s].y, xs[s].z, xs[s].w}, b[4] = {ws[r][s].x, ws[r][s].y, ws[r][s].z, ws[r][s].w};
      #pragma unroll
      for (int v = 0; v < 4; v++)
        acc += __int_as_float(a[v] << 16) * __int_as_float(b[v] << 16)
             + __int_as_float(a[v] & 0xffff0000u) * __int_as_float(b[v] & 0xffff0000u);
    }
    #pragma unroll
    for (int o = 16; o > 0; o /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (GROUP == 32) { if (lane == 0) out[row0 + r] = acc; }
    else if ((lane & 31) == 0) partial[r][lane >> 5] = acc;
  }
  if (GROUP > 32) {
    __syncthreads();
    if (lane < ROWS) {
      float acc = 0;
      for (int k = 0; k < GROUP / 32; k++) acc += partial[lane][k];
      out[row0 + lane] = acc;
    }
  }
}
"""

FLOOR = r"""
// every 16 bytes of the weight read once, nothing written unless a sum is exactly 1e30 (never)
extern "C" __global__ void __launch_bounds__(256) kiln_readMODE(float* out, const uint16_t* w, long n16) {
  const long i = (long)blockIdx.x * 256 + threadIdx.x;
  if (i >= n16) return;
  float v[8]; kiln_bf16x8MODE(v, w + i * 8);
  float s = v[0] + v[1] + v[2] + v[3] + v[4] + v[5] + v[6] + v[7];
  if (s == 1e30f) out[0] = s;
}
"""


def hand_source(rows: int, group: int, k: int, mode: str) -> str:
    steps = k // (group * 8)
    return (HAND.replace("NAME", f"hand_r{rows}_g{group}{mode}").replace("ROWS", str(rows))
            .replace("GROUP", str(group)).replace("STEPS", str(steps)).replace("KDIM", str(k))
            .replace("MODE", mode))


def module_source(rendered: list[str], hands: list[tuple[int, int]], k: int) -> str:
    """The template's kernels, then the floors and the hand-written kernels in both modes."""
    return PRELUDE + "\n".join(rendered) + "".join(
        FLOOR.replace("MODE", mode) + "".join(hand_source(r, g, k, mode) for r, g in hands)
        for mode in MODES.values())


def probe(backend, n: int, k: int, rng) -> list[dict]:
    kernel = gemv_kernel(n, k)
    rotations = int(max(4, min(32, ROTATIONS_BYTES // (n * k * 2))))
    weights = [cp.asarray(bf16_bits(rng.standard_normal((n, k)) * 0.02)) for _ in range(rotations)]
    x = cp.asarray(bf16_bits(rng.standard_normal(k)))
    want = from_bits(weights[0].get()).reshape(n, k) @ from_bits(x.get())
    out = cp.empty(n, dtype=cp.float32)
    assert kernel.outputs[0].dtype is DType.F32, "the product's kernel writes f32 (its cast is a kernel apart)"
    symbols = backend.symbol_buffer(0)
    weight_name = next(b.name for b in kernel.inputs if b.size.value == n * k)
    order = [b.name for b in (*kernel.outputs, *kernel.inputs)]
    offered = [c for c in config_space(kernel) if isinstance(c, CudaConfig)]
    width = offered[0].vector
    grid = [CudaConfig(block, group, width, split=parts, stream=stream) for block in (32, 64, 128, 256)
            for group in (32, 64, 128, 256) for parts in (1, 2) for stream in (False, True)
            if group <= block and (parts == 1 or splittable(kernel))]
    configs = list(dict.fromkeys(offered + grid))
    sources = {}
    for c in configs:
        try:
            sources[c] = backend.render(kernel, c)
        except ValueError as err:
            print(f"  {c.key()}: {err}")
    # at most 16 weight vectors a thread holds, so nothing spills
    hands = [(rows, group) for rows in (1, 2, 4) for group in (32, 64, 128, 256)
             if k % (group * 8) == 0 and n % rows == 0 and rows * k // (group * 8) <= 16]
    rows_out = []

    def timed(label, read, launch, check=True):
        launch(0)
        error = float(np.abs(out.get() - want).max() / np.abs(want).max()) if check else 0.0
        seconds = graph_seconds(launch, rotations)
        rows_out.append({"shape": [n, k], "kernel": label, "weight read": read, "s": seconds,
                         "bytes_per_s": n * k * 2 / seconds, "rel_err": error})

    module = cp.RawModule(code=module_source([s for _, s in sources.values()], hands, k), options=("--std=c++17",))
    for config, (name, _) in sources.items():
        launcher = backend.launcher(module.get_function(name), kernel, config)
        timed(config.key() + ("" if config in offered else " (not offered)"), "stream" if config.stream else "plain",
              lambda r, launcher=launcher: launcher(
                  [out if b == kernel.outputs[0].name else weights[r] if b == weight_name else x
                   for b in order] + [symbols], {}))
    for read, mode in MODES.items():
        for rows, group in hands:
            fn = module.get_function(f"hand_r{rows}_g{group}{mode}")
            timed(f"hand rows{rows} group{group}", read,
                  lambda r, fn=fn, rows=rows: fn((n // rows,), (group,), (out, weights[r], x)))
        floor, n16 = module.get_function(f"kiln_read{mode}"), n * k // 8
        timed("floor: read the weight, write nothing", read,
              lambda r, floor=floor: floor((-(-n16 // 256),), (256,), (out, weights[r], np.int64(n16))), check=False)
    empty = cp.RawKernel('extern "C" __global__ void kiln_empty() {}', "kiln_empty")
    timed("floor: empty kernel", "", lambda r: empty((1,), (32,), ()), check=False)
    copy_from = [cp.ones(n * k // 4, cp.float32) for _ in weights]
    copy_to = [cp.empty_like(a) for a in copy_from]
    timed("floor: copy of as many bytes", "", lambda r: copy_to[r].__setitem__(slice(None), copy_from[r]),
          check=False)
    return rows_out


def main():
    backend, rng = CudaBackend(), np.random.default_rng(0)
    numbers = [int(a) for a in sys.argv[1:]] or [512, 2048, 2048, 2048, 2048, 8192]
    rows = []
    for n, k in zip(numbers[::2], numbers[1::2]):
        rows += probe(backend, n, k, rng)
        shape = [r for r in rows if r["shape"] == [n, k]]
        copy = next(r for r in shape if r["kernel"] == "floor: copy of as many bytes")
        print(f"{k} -> {n}: copy of as many bytes {copy['s'] * 1e6:.2f} us")
        for r in sorted(shape, key=lambda r: r["s"]):
            flag = "" if r["rel_err"] < 1e-2 else f"  WRONG ({r['rel_err']:.2g})"
            print(f"  {r['s'] * 1e6:7.2f} us {copy['s'] / r['s']:6.1%} of the copy  {r['kernel']:<44} {r['weight read']}{flag}")
        with open(os.path.join(os.environ.get("OUT", "."), "gemv-probe.json"), "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
