"""A generated CUDA kernel run on the CPU, for the logic a machine without a GPU can still check:
g++ compiles the kernel's source against a small shim (a block's threads as std::threads, a
block barrier and a barrier per warp for __syncthreads and the shuffles, blocks one after
another, so that `__shared__` storage can be static), and `launch` runs a grid. Memory ordering,
timing and anything the shim leaves out (f16's PTX, vector loads but bf16x8 and f32x8, plain or streaming) are not covered: the
GPU tests are."""
from __future__ import annotations

import ctypes
import subprocess
from pathlib import Path

import numpy as np

from kiln.codegen.c_emit import SHARED_HELPERS

SHIM = r"""
#include <stdint.h>
#include <math.h>
#include <string.h>
#include <atomic>
#include <barrier>
#include <thread>
#include <vector>
#define __device__
#define __forceinline__ inline
#define __global__
#define __launch_bounds__(n)
#define __restrict__ __restrict
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
struct kiln_dim { unsigned x, y, z; };
static thread_local kiln_dim threadIdx, blockIdx;
static kiln_dim gridDim, blockDim;
static std::barrier<>* kiln_block_barrier;
static std::vector<std::barrier<>*> kiln_warp_barriers;
static uint64_t kiln_exchange[1024];
static inline float __int_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
static inline float __int_as_float(int u) { float f; memcpy(&f, &u, 4); return f; }
static inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
static inline void __syncthreads() { kiln_block_barrier->arrive_and_wait(); }
static inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
template <typename T> static inline T kiln_from_lane(unsigned, T v, unsigned lane) {
  // every lane of the warp posts its value, then reads `lane`'s (within the warp)
  std::barrier<>* warp = kiln_warp_barriers[threadIdx.x / 32];
  memcpy(&kiln_exchange[threadIdx.x], &v, sizeof(T));
  warp->arrive_and_wait();
  T other;
  memcpy(&other, &kiln_exchange[(threadIdx.x & ~31u) | (lane & 31u)], sizeof(T));
  warp->arrive_and_wait();
  return other;
}
template <typename T> static inline T __shfl_xor_sync(unsigned m, T v, int offset) {
  return kiln_from_lane(m, v, (threadIdx.x & 31u) ^ (unsigned)offset);
}
template <typename T> static inline T __shfl_sync(unsigned m, T v, int lane) { return kiln_from_lane(m, v, (unsigned)lane); }
template <typename T> static inline T kiln_shfl_xor(T v, int o) { return __shfl_xor_sync(0xffffffffu, v, o); }
struct uint4 { unsigned x, y, z, w; };
static inline void kiln_bf16x8(float* v, const uint16_t* p) {
  for (int i = 0; i < 8; i++) v[i] = __int_as_float(((unsigned)p[i]) << 16);
}
static inline void kiln_f32x8(float* v, const float* p) {
  for (int i = 0; i < 8; i++) v[i] = p[i];
}
// a streaming read's hint (past L1, an L2 prefetch) changes no value
static inline void kiln_bf16x8_stream(float* v, const uint16_t* p) { kiln_bf16x8(v, p); }
static inline void kiln_f32x8_stream(float* v, const float* p) { kiln_f32x8(v, p); }
static inline unsigned atomicAdd(unsigned* p, unsigned v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
template <typename T> static inline T __ldcg(const T* p) { T v; __atomic_load(p, &v, __ATOMIC_SEQ_CST); return v; }
static inline float kiln_bf16_load(uint16_t h) { return __int_as_float(((unsigned)h) << 16); }
static inline uint16_t kiln_bf16_store(float f) {
  unsigned u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
static inline float kiln_bf16_round(float f) { return kiln_bf16_load(kiln_bf16_store(f)); }
static inline bool kiln_f2bool(float f) { return (__float_as_uint(f) << 1) != 0; }
// the tensor-core product's warp instructions (codegen/cuda_gemm.py), by the PTX fragment layouts
// of ldmatrix and mma.sync m16n8k16 (lane l: g = l / 4, t = l % 4); copies are synchronous
#define KILN_GEMM_HELPERS
static uint32_t kiln_fragments[1024][6];
static inline void kiln_gemm_copy16(uint16_t* to, const uint16_t* from, bool in) {
  if (in) memcpy(to, from, 16); else memset(to, 0, 16);
}
static inline void kiln_gemm_commit() {}
template <int N> static inline void kiln_gemm_wait() {}
static inline void kiln_gemm_ldsm_x4(uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3, const uint16_t* p) {
  // matrix i's row r is at the address lane 8i + r gives; a lane holds row g's halves 2t, 2t + 1
  uint32_t* regs[4] = {&r0, &r1, &r2, &r3};
  const unsigned lane = threadIdx.x & 31u;
  for (unsigned i = 0; i < 4; i++) {
    const uint16_t* row = kiln_from_lane(0xffffffffu, p, 8 * i + lane / 4);
    memcpy(regs[i], row + 2 * (lane % 4), 4);
  }
}
static inline float kiln_fragment_half(unsigned lane, int reg, unsigned half) {
  return kiln_bf16_load((uint16_t)(kiln_fragments[(threadIdx.x & ~31u) | lane][reg] >> (16 * half)));
}
static inline void kiln_gemm_mma_bf16(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
  // A 16 x 16: a0 (g, 2t..), a1 (g + 8, 2t..), a2 (g, 2t + 8..), a3 (g + 8, 2t + 8..);
  // B 16 x 8 (k, n): b0 (2t.., g), b1 (2t + 8.., g); C: c0, c1 (g, 2t..), c2, c3 (g + 8, 2t..)
  const unsigned lane = threadIdx.x & 31u;
  std::barrier<>* warp = kiln_warp_barriers[threadIdx.x / 32];
  uint32_t mine[6] = {a[0], a[1], a[2], a[3], b0, b1};
  memcpy(kiln_fragments[threadIdx.x], mine, sizeof mine);
  warp->arrive_and_wait();
  for (int e = 0; e < 4; e++) {
    const unsigned row = lane / 4 + (e >> 1) * 8, col = 2 * (lane % 4) + (e & 1);
    float sum = c[e];
    for (unsigned k = 0; k < 16; k++) {
      const float x = kiln_fragment_half((row % 8) * 4 + (k % 8) / 2, (row >= 8) + 2 * (k >= 8), k % 2);
      const float y = kiln_fragment_half(col * 4 + (k % 8) / 2, 4 + (k >= 8), k % 2);
      sum += x * y;
    }
    c[e] = sum;
  }
  warp->arrive_and_wait();
}
// the fused attention's (codegen/cuda_attention.py), bf16's, and the warp votes it takes
#define KILN_ATTENTION_HELPERS
static inline float kiln_exp2(float x) { return exp2f(x); }
#define KILN_ATTENTION_bf16
static inline uint32_t kiln_pack_bf16(float lo, float hi) {
  return (uint32_t)kiln_bf16_store(lo) | ((uint32_t)kiln_bf16_store(hi) << 16);
}
static inline void kiln_mma_bf16(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) { kiln_gemm_mma_bf16(c, a, b0, b1); }
static inline void kiln_copy16(uint16_t* to, const uint16_t* from, bool in) { kiln_gemm_copy16(to, from, in); }
static inline void kiln_commit() {}
static inline void kiln_wait_previous() {}
static inline void kiln_ldsm_x2(uint32_t& r0, uint32_t& r1, const uint16_t* p) {
  uint32_t* regs[2] = {&r0, &r1};
  const unsigned lane = threadIdx.x & 31u;
  for (unsigned i = 0; i < 2; i++) {
    const uint16_t* row = kiln_from_lane(0xffffffffu, p, 8 * i + lane / 4);
    memcpy(regs[i], row + 2 * (lane % 4), 4);
  }
}
static inline void kiln_ldsm_x4(uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3, const uint16_t* p) {
  kiln_gemm_ldsm_x4(r0, r1, r2, r3, p);
}
static inline void kiln_ldsm_trans(uint32_t** regs, unsigned matrices, const uint16_t* p) {
  // transposed: a lane holds column g's elements at rows 2t and 2t + 1 of each matrix
  const unsigned lane = threadIdx.x & 31u;
  for (unsigned i = 0; i < matrices; i++) {
    const uint16_t* upper = kiln_from_lane(0xffffffffu, p, 8 * i + 2 * (lane % 4));
    const uint16_t* lower = kiln_from_lane(0xffffffffu, p, 8 * i + 2 * (lane % 4) + 1);
    *regs[i] = (uint32_t)upper[lane / 4] | ((uint32_t)lower[lane / 4] << 16);
  }
}
static inline void kiln_ldsm_x4_trans(uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3, const uint16_t* p) {
  uint32_t* regs[4] = {&r0, &r1, &r2, &r3};
  kiln_ldsm_trans(regs, 4, p);
}
template <typename T, typename F> static inline T kiln_warp_fold(T v, F f) {
  // every lane's value, folded in lane order, for every lane
  T out = v;
  for (unsigned lane = 0; lane < 32; lane++) {
    const T other = kiln_from_lane(0xffffffffu, v, lane);
    out = lane ? f(out, other) : other;
  }
  return out;
}
static inline bool __any_sync(unsigned, bool p) { return kiln_warp_fold((int)p, [](int a, int b) { return a | b; }); }
static inline bool __all_sync(unsigned, bool p) { return kiln_warp_fold((int)p, [](int a, int b) { return a & b; }); }
static inline unsigned __reduce_max_sync(unsigned, unsigned v) {
  return kiln_warp_fold(v, [](unsigned a, unsigned b) { return a > b ? a : b; });
}
static inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
static inline unsigned __vmaxu2(unsigned a, unsigned b) {
  const unsigned lo = (a & 0xFFFFu) > (b & 0xFFFFu) ? (a & 0xFFFFu) : (b & 0xFFFFu);
  const unsigned hi = (a >> 16) > (b >> 16) ? (a >> 16) : (b >> 16);
  return lo | (hi << 16);
}
""" + SHARED_HELPERS.replace("KILN_FN", "static inline")


def build(source: str, name: str, params: list[str], folder: Path):
    """The kernel `name` (its parameters' C types, in order) in a library whose `kiln_launch`
    runs a grid of blocks, each of `threads` threads, one block after another."""
    args = ", ".join(f"({t})a[{i}]" for i, t in enumerate(params))
    launcher = f"""
extern "C" void kiln_launch(void** a, unsigned grid, unsigned threads, unsigned rows) {{
  gridDim = {{grid, rows, 1}}; blockDim = {{threads, 1, 1}};
  for (unsigned b = 0; b < grid * rows; b++) {{
    std::barrier<> block(threads);
    kiln_block_barrier = &block;
    std::vector<std::barrier<>*> warps;
    for (unsigned w = 0; w < (threads + 31) / 32; w++) warps.push_back(new std::barrier<>(32));
    kiln_warp_barriers = warps;
    std::vector<std::thread> pool;
    for (unsigned t = 0; t < threads; t++)
      pool.emplace_back([=] {{ threadIdx = {{t, 0, 0}}; blockIdx = {{b % grid, b / grid, 0}}; {name}({args}); }});
    for (auto& th : pool) th.join();
    for (auto* w : warps) delete w;
  }}
}}
"""
    unit = folder / f"{name}.cpp"
    unit.write_text(SHIM + source.replace('extern "C" ', "") + launcher)
    lib = folder / f"{name}.so"
    result = subprocess.run(["g++", "-std=c++20", "-O1", "-pthread", "-shared", "-fPIC", str(unit), "-o", str(lib)],
                            capture_output=True, text=True)
    if result.returncode:
        raise RuntimeError(result.stderr[-3000:])
    return ctypes.CDLL(str(lib))


def launch(lib, arrays: list[np.ndarray], grid: int, threads: int, rows: int = 1) -> None:
    """A grid of `grid` × `rows` blocks (blockIdx.x, blockIdx.y) of `threads` threads."""
    pointers = (ctypes.c_void_p * len(arrays))(*[a.ctypes.data for a in arrays])
    lib.kiln_launch(pointers, ctypes.c_uint(grid), ctypes.c_uint(threads), ctypes.c_uint(rows))
