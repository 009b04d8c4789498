"""Kernel IR -> CUDA C (NVRTC through CuPy, or nvcc for a compile check).

The output loops become one grid-stride loop over output points; `group` threads share a point
and split its reduction (warp shuffles, then shared memory past 32 threads), with `vector`
consecutive elements per thread and step so that contiguous rows are read with 16-byte loads.
Subexpressions are hoisted exactly as on the CPU (the C emitter's scalar body); f16/bf16 are
stored as bits and computed in f32."""
from __future__ import annotations

from ..ir.dtypes import DType
from ..ir.symbolic import Expr, sym
from .c_emit import COMPUTE, SHARED_HELPERS, STORAGE, _Body, index_code, reduction_accumulator, store_code
from .cuda_config import (PARTIAL_BYTES, STREAM, VECTOR_READ, VECTOR_UNPACK, CudaConfig, loads_in, per_point,
                          point_reductions, points_per_thread, runs_of, splittable, vector_width)
from .index import stride, substitute
from .kernel import (Kernel, Load, Reduce, Scalar, Write, free_vars, renamed, row_reductions,
                     split_reductions, staged_rows)
from .pairs import pairable, paired

PRELUDE = r"""
#ifdef __CUDACC_RTC__
typedef long long int64_t;
typedef unsigned long long uint64_t;
typedef int int32_t;
typedef unsigned int uint32_t;
typedef unsigned short uint16_t;
#define INT64_C(x) (x##LL)
#define INT64_MIN (-9223372036854775807LL - 1)
#define INT32_MIN (-2147483647 - 1)
#define INFINITY __int_as_float(0x7f800000)
#define NAN __int_as_float(0x7fffffff)
#else
#include <stdint.h>
#include <math.h>
#endif
""" + SHARED_HELPERS.replace("KILN_FN", "__device__ __forceinline__") + r"""__device__ __forceinline__ float kiln_bf16_load(uint16_t h) { return __int_as_float(((unsigned)h) << 16); }
__device__ __forceinline__ uint16_t kiln_bf16_store(float f) {
  unsigned u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
__device__ __forceinline__ float kiln_f16_load(uint16_t h) {
  float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f;
}
__device__ __forceinline__ uint16_t kiln_f16_store(float f) {
  uint16_t h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h;
}
__device__ __forceinline__ float kiln_bf16_round(float f) { return kiln_bf16_load(kiln_bf16_store(f)); }
__device__ __forceinline__ float kiln_f16_round(float f) { return kiln_f16_load(kiln_f16_store(f)); }
// on the bits: CuPy compiles with -ftz=true, under which f != 0 is false for a subnormal f
__device__ __forceinline__ bool kiln_f2bool(float f) { return (__float_as_uint(f) << 1) != 0; }
// a butterfly step of a warp's reduction, for each accumulator type
__device__ __forceinline__ float kiln_shfl_xor(float v, int o) { return __shfl_xor_sync(0xffffffffu, v, o); }
__device__ __forceinline__ bool kiln_shfl_xor(bool v, int o) { return __shfl_xor_sync(0xffffffffu, (int)v, o) != 0; }
__device__ __forceinline__ int32_t kiln_shfl_xor(int32_t v, int o) { return __shfl_xor_sync(0xffffffffu, v, o); }
__device__ __forceinline__ int64_t kiln_shfl_xor(int64_t v, int o) {
  return (int64_t)__shfl_xor_sync(0xffffffffu, (long long)v, o);
}
"""

PRELUDE += r"""
__device__ __forceinline__ uint4 kiln_read16(const void* p) { return *(const uint4*)p; }
__device__ __forceinline__ uint2 kiln_read8(const void* p) { return *(const uint2*)p; }
__device__ __forceinline__ uint4 kiln_read16_stream(const void* p) {
#if __CUDA_ARCH__ >= 800
  uint4 r;
  asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
      : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
  return r;
#else
  return kiln_read16(p);
#endif
}
__device__ __forceinline__ uint2 kiln_read8_stream(const void* p) {
#if __CUDA_ARCH__ >= 800
  uint2 r;
  asm("ld.global.nc.L1::no_allocate.L2::256B.v2.u32 {%0,%1}, [%2];" : "=r"(r.x), "=r"(r.y) : "l"(p));
  return r;
#else
  return kiln_read8(p);
#endif
}
""" + "".join(
    f"__device__ __forceinline__ void {VECTOR_READ[key]}{mode}(float* v, const {STORAGE[key[0]]}* p) {{\n"
    f"  {raw} r = kiln_read{16 if raw == 'uint4' else 8}{mode}(p); {unpack}\n}}\n"
    for key, (raw, unpack) in VECTOR_UNPACK.items() for mode in ("", STREAM)) + "".join(
    f"__device__ __forceinline__ void kiln_f32x8{mode}(float* v, const float* p) {{ "
    f"kiln_f32x4{mode}(v, p); kiln_f32x4{mode}(v + 4, p + 4); }}\n" for mode in ("", STREAM))


class _CudaBody(_Body):
    def __init__(self, kernel: Kernel, config: CudaConfig, writes: tuple[Write, ...]):
        # levels: 0 before the points' loop, 1 a point's; by rows 1 a row's, 2 a point's
        levels = [("kiln_row", Expr.of(1))] if config.row else []
        values = tuple(w.value for w in writes)
        super().__init__(levels + [("kiln_point", Expr.of(1))], config, values, kernel.symbols)
        self.level.update({v: 1 for v, _ in kernel.loops})
        # a point's variables, and the indices bound from them alone (rotary's partner, a pair's
        # second point): a load they index reads a row of its own at each point
        loop_vars = {v for v, _ in kernel.loops}
        self.point_vars = loop_vars | {name for name, b in self.binds.items()
                                       if free_vars(b.value, self.vars_memo) <= loop_vars}
        if config.row:
            self.level[kernel.loops[-1][0]] = 2
            self.cooperative = set(row_reductions(kernel) or ())
        else:
            self.cooperative = (set(split_reductions(*values)[0])
                                if config.group > 1 or config.vector > 1 or config.split > 1 else set())
        self.vectors: dict[Load, tuple[str, int]] = {}   # a load read as one lane of a vector
        self.shared: list[str] = []
        self.rows = staged_rows(kernel) if config.stage else {}

    def emit(self, s: Scalar):
        if isinstance(s, Load) and s in self.vectors:
            return self.vectors[s]
        return super().emit(s)

    def loop_pragmas(self, group: list[Reduce], accs: list[str]) -> list[str]:
        return ["#pragma unroll 4"]

    def siblings(self, s: Reduce) -> list[Reduce]:
        # a shared loop is split among the group's threads only where all of it is shareable
        return [r for r in super().siblings(s) if (r in self.cooperative) == (s in self.cooperative)]

    def reduce(self, s: Reduce):
        if s not in self.cooperative:
            return super().reduce(s)
        config = self.config
        group_of = self.siblings(s)
        members = [renamed(r, {r.var: s.var}) for r in group_of]
        level = self.level_of(free_vars(s, self.vars_memo))
        base_level, inner_level = level + 1, level + 2
        saved = {k: self.blocks.get(k) for k in (base_level, inner_level)}
        saved_memo = dict(self.memo)
        outer, inner = [], []
        self.blocks[base_level], self.blocks[inner_level] = outer, inner
        self.level[s.var] = inner_level
        # each shared loop reads vectors where all its rows allow the config's width
        width = config.vector if all(vector_width(r) >= config.vector for r in members) else 1
        staged = self.stage(members, s.var, inner_level, width, outer)
        if width > 1:   # 16-byte loads of the contiguous rows, once per step
            for load in dict.fromkeys(l for r in members for l in loads_in(r.body, staged)):
                if stride(load.index, s.var) != 1 or load in self.vectors:
                    continue
                self.count += 1
                name = f"kv{self.count}"
                at = index_code(substitute(load.index, {s.var: sym("kiln_base")}))
                read = VECTOR_READ[(load.dtype, width)] + (STREAM if config.stream and per_point(load, self.point_vars) else "")
                outer.append(f"float {name}[{width}]; {read}({name}, {load.buffer} + {at});")
                self.vectors[load] = (f"{name}[kiln_v]", inner_level)
        self.active.update(group_of)
        values = [self.emit(r.body)[0] for r in members]
        self.active.difference_update(group_of)
        for k, block in saved.items():
            self.blocks[k] = block if block is not None else []
        self.memo = {k: v for k, v in self.memo.items() if k in saved_memo or v[1] <= level}
        block = self.blocks[level]
        accs, updates, combines = [], [], []
        for r, value in zip(members, values):
            self.count += 1
            acc = f"acc{self.count}"
            acc_type, init, combine = reduction_accumulator(r)
            block.append(f"{acc_type} {acc} = {init};")
            accs.append((acc, acc_type))
            updates.append(f"{acc} = {combine.format(a=acc, b=f'({acc_type}){value}')};")
            combines.append(combine)
        # a reduction before the points' loop (the norm's sum a merged GEMV reads at every point)
        # is shared by the whole block, computed once, not once per group of its points
        wide = level == 0
        extent, parts = index_code(s.extent), config.split
        group, lane = (config.block, "threadIdx.x") if wide else (config.group, "kiln_lane")
        begin = ""
        if parts > 1:   # this block's part of the steps: whole vectors, the last part shorter
            if set(group_of) != self.cooperative:
                raise ValueError("a split configuration needs every reduction of a point in one loop")
            self.count += 1
            start, end = f"kiln_begin{self.count}", f"kiln_end{self.count}"
            block.append(f"const int64_t {start} = kiln_part * ((({extent}) + {parts * width - 1}) / "
                         f"{parts * width} * {width});")
            block.append(f"const int64_t {end} = kiln_min({start} + ((({extent}) + {parts * width - 1}) / "
                         f"{parts * width} * {width}), {extent});")
            begin, extent = f"{start} + ", end
        # unrolled, so that each thread has several loads in flight: one at a time leaves a
        # memory-bound reduction (a GEMV) far from the bandwidth; wholly where the steps are few
        # and known (the H200 probe: a warp-per-row GEMV 2048 -> 8192 took 9.9 us unrolled
        # wholly with 32-bit indices, 11.6 us unrolled by 4 with 64-bit ones)
        steps = -(-s.extent.value // (group * width * parts)) if s.extent.is_const else None
        block.append("#pragma unroll" if steps is not None and steps <= 16 else "#pragma unroll 4")
        if width > 1:
            block.append(f"for (int64_t kiln_base = {begin}{lane} * {width}; kiln_base < {extent}; "
                         f"kiln_base += {group * width}) {{")
            block.extend("  " + line for line in outer)
            block.append("  #pragma unroll")
            block.append(f"  for (int kiln_v = 0; kiln_v < {width}; kiln_v++) {{")
            block.append(f"    const int64_t {s.var} = kiln_base + kiln_v; (void){s.var};")
            block.extend("    " + line for line in inner)
            block.extend("    " + update for update in updates)
            block.append("  }")
            block.append("}")
        else:
            block.append(f"for (int64_t {s.var} = {begin}{lane}; {s.var} < {extent}; {s.var} += {group}) {{")
            block.extend("  " + line for line in outer + inner)
            block.extend("  " + update for update in updates)
            block.append("}")
        results = [self._combine(acc, acc_type, combine, block, group)
                   for (acc, acc_type), combine in zip(accs, combines)]
        if parts > 1:
            self._finish_split(accs, combines, block)
        results = [(self.temp(f"({COMPUTE[r.dtype]}){acc}", r.dtype, level), level)
                   for r, acc in zip(members, results)]
        for r, result in zip(group_of[1:], results[1:]):
            self.memo[r] = result
        return results[0]

    def _finish_split(self, accs: list[tuple[str, str]], combines: list[str], block: list[str]) -> None:
        """Each block writes its parts' partial values; the last block of a point's parts to
        arrive reads them all, in order (the sum does not depend on which block came last), and
        goes on to finish the point; the others go on to their next points."""
        parts, count = self.config.split, len(accs)

        def partial(k: int, part: str) -> str:
            return f"kiln_scratch + {PARTIAL_BYTES} * ((kiln_point * {count} + {k}) * {parts} + {part})"
        block.append("if (kiln_lane == 0 && kiln_slot < kiln_points) {")
        block.extend(f"  *({acc_type}*)({partial(k, 'kiln_part')}) = {acc};" for k, (acc, acc_type) in enumerate(accs))
        block.append("}")
        block.append("__threadfence();   // the partials visible to the block that arrives last")
        block.append("__syncthreads();")
        block.append("if (threadIdx.x == 0) {")
        block.append(f"  const int64_t kiln_counter = kiln_first / {self.config.points_per_block};")
        block.append(f"  kiln_last = atomicAdd(kiln_arrivals + kiln_counter, 1u) == {parts - 1}u;")
        block.append("  if (kiln_last) kiln_arrivals[kiln_counter] = 0u;   // ready for the next launch")
        block.append("}")
        block.append("__syncthreads();")
        block.append("if (!kiln_last) continue;")
        block.append("__threadfence();")
        for k, ((acc, acc_type), combine) in enumerate(zip(accs, combines)):
            first, other = (f"*(volatile {acc_type}*)({partial(k, part)})" for part in ("0", "kiln_p"))
            block.append(f"{acc} = {first};")
            block.append(f"for (int kiln_p = 1; kiln_p < {parts}; kiln_p++) {acc} = {combine.format(a=acc, b=other)};")

    def staged_read(self, array: str, var: str, level: int, width: int, outer: list[str]) -> tuple[str, int]:
        if width == 1:
            return f"{array}[{var}]", level
        self.count += 1      # `width` at a time, one vector read a step
        name = f"kv{self.count}"
        outer.append(f"float {name}[{width}]; {VECTOR_READ[(DType.F32, width)]}({name}, {array} + kiln_base);")
        return f"{name}[kiln_v]", level

    def staging(self, name: str, extent: int, lines: list[str], value: str) -> None:
        """All the block's threads fill the shared array, then wait for one another."""
        self.shared.append(f"__shared__ __align__(16) float {name}[{extent}];")
        first = self.blocks[0]
        first.append(f"for (int64_t kiln_row = threadIdx.x; kiln_row < {extent}; kiln_row += {self.config.block}) {{")
        first.extend("  " + line for line in lines)
        first.append(f"  {name}[kiln_row] = (float){value};")
        first.append("}")
        first.append("__syncthreads();")

    def _combine(self, acc: str, acc_type: str, combine: str, block: list[str], group: int) -> str:
        """The partial values of one accumulator a group of `group` threads shares (the config's,
        or the whole block) combined, in every thread of the group."""
        config = self.config
        if config.across and group == config.group:   # threads block / group apart: through shared memory
            shared, stride = f"kiln_shared{self.count}", config.points_per_block
            self.count += 1
            self.shared.append(f"__shared__ {acc_type} {shared}[{config.block}];")
            block.append(f"{shared}[threadIdx.x] = {acc};")
            block.append("__syncthreads();")
            block.append(f"{acc} = {shared}[threadIdx.x % {stride}];")
            block.append(f"for (int kiln_w = 1; kiln_w < {group}; kiln_w++) "
                         f"{acc} = {combine.format(a=acc, b=f'{shared}[kiln_w * {stride} + threadIdx.x % {stride}]')};")
            block.append("__syncthreads();")
            return acc
        # every lane shuffles exactly once per step, outside the combine's branches: a shuffle
        # that only some lanes reach never completes (the max's `||` and `?:` branch per lane)
        for offset in _halvings(min(group, 32)):
            block.append(f"{{ const {acc_type} kiln_other = __shfl_xor_sync(0xffffffffu, {acc}, {offset}); "
                         f"{acc} = {combine.format(a=acc, b='kiln_other')}; }}")
        if group > 32:   # one value per warp through shared memory, then each thread combines its group's
            shared, warps = f"kiln_shared{self.count}", group // 32
            self.count += 1
            self.shared.append(f"__shared__ {acc_type} {shared}[{config.block // 32}];")
            block.append(f"if ((threadIdx.x & 31) == 0) {shared}[threadIdx.x >> 5] = {acc};")
            block.append("__syncthreads();")
            first = f"kiln_offset * {warps} + " if config.block > group else ""
            block.append(f"{acc} = {shared}[{first}0];")
            block.append(f"for (int kiln_w = 1; kiln_w < {warps}; kiln_w++) "
                         f"{acc} = {combine.format(a=acc, b=f'{shared}[{first}kiln_w]')};")
            block.append("__syncthreads();")
        return acc


def _halvings(n: int) -> list[int]:
    out, k = [], n // 2
    while k >= 1:
        out.append(k)
        k //= 2
    return out


def emit_cuda(kernel: Kernel, config: CudaConfig, name: str) -> str:
    """One `extern "C" __global__` function; launch it with `config.block` threads per block.

    A block takes `block / group` consecutive points per step of a loop every thread of the block
    runs alike (warp shuffles and block barriers need all of them), so threads past the last
    point compute the last point again and store nothing."""
    if (config.group > 1 or config.vector > 1 and not runs_of(kernel, config.vector)) and not point_reductions(kernel):
        raise ValueError(f"config {config.key()} needs a kernel with a reduction per point, or points "
                         f"in runs of {config.vector} along its last loop")
    if config.split > 1 and not splittable(kernel):
        raise ValueError(f"config {config.key()} needs fixed points whose reductions share one loop")
    if config.across:
        if config.block % config.group or config.vector != 1:
            raise ValueError("an across group divides the block and reads no vectors")
    elif config.group not in (1, 2, 4, 8, 16, 32) and (config.group % 32 or config.block % config.group):
        raise ValueError("a group is a power of two up to a warp, or whole warps dividing the block")
    if config.row and (config.split > 1 or config.stage or config.across or not row_reductions(kernel)):
        raise ValueError(f"config {config.key()} needs a kernel with reductions per row")
    if config.pair and (config.split > 1 or config.row or config.across or not pairable(kernel)):
        raise ValueError(f"config {config.key()} needs a kernel whose points read a sum at a partner "
                         "point, and neither a split nor rows nor groups across the points")
    kernel, writes = paired(kernel) if config.pair else (kernel, kernel.writes)
    body = _CudaBody(kernel, config, writes)
    point_level = 2 if config.row else 1
    guard = "if (kiln_slot < kiln_rows) " if config.row else "if (kiln_lane == 0 && kiln_slot < kiln_points) "
    for write in writes:
        value, _ = body.emit(write.value)
        body.blocks[point_level].append(f"{guard}{write.output.name}[{index_code(write.store)}] = "
                                        f"{store_code(value, write.output.dtype)};")
    params = [f"{STORAGE[b.dtype]}* __restrict__ {b.name}" for b in kernel.outputs]
    params += [f"const {STORAGE[b.dtype]}* __restrict__ {b.name}" for b in kernel.inputs]
    params.append("const int64_t* __restrict__ kiln_sym")
    if config.split > 1:   # split_scratch's memory, after the symbols
        params += ["unsigned char* __restrict__ kiln_scratch", "unsigned int* __restrict__ kiln_arrivals"]
    lines = [f'extern "C" __global__ void __launch_bounds__({config.block}) {name}({", ".join(params)}) {{']
    lines += [f"  const int64_t {s} = kiln_sym[{i}];" for i, s in enumerate(kernel.symbols)]
    lines += ["  " + line for line in body.shared]
    group, per_block, parts = config.group, config.points_per_block, config.split
    if config.across:
        lines.append(f"  const int kiln_lane = threadIdx.x / {per_block}, kiln_offset = threadIdx.x % {per_block};")
    else:
        lines.append(f"  const int kiln_lane = threadIdx.x % {group}, kiln_offset = threadIdx.x / {group};")
    if config.row:
        return "\n".join(lines + _by_rows(kernel, config, body)) + "\n"
    lines += ["  " + line for line in body.blocks[0]]
    run = points_per_thread(kernel, config)
    loops = list(kernel.loops)
    if run > 1:   # a thread per run of `run` points along the last loop
        (last, extent) = loops[-1]
        loops[-1] = (f"{last}_run", Expr.of(extent.value // run))
    total = " * ".join(f"({index_code(e)})" for _, e in loops) or "INT64_C(1)"
    lines.append(f"  const int64_t kiln_points = {total};")
    if parts > 1:   # blocks come in runs of `parts`: one run per block's worth of points
        lines.append("  __shared__ bool kiln_last;")
        lines.append(f"  const int kiln_part = blockIdx.x % {parts};")
    first, stride = ("(int64_t)blockIdx.x", "(int64_t)gridDim.x") if parts == 1 else \
        (f"(int64_t)(blockIdx.x / {parts})", f"(int64_t)(gridDim.x / {parts})")
    lines.append(f"  for (int64_t kiln_first = {first} * {per_block}; kiln_first < kiln_points; "
                 f"kiln_first += {stride} * {per_block}) {{")
    lines.append("    const int64_t kiln_slot = kiln_first + kiln_offset;")
    lines.append("    const int64_t kiln_point = kiln_slot < kiln_points ? kiln_slot : kiln_points - 1; (void)kiln_point;")
    lines += ["    " + line for line in _decomposed("kiln_point", loops, kernel.bounds)]
    if run > 1:
        lines.append("    #pragma unroll")
        lines.append(f"    for (int kiln_v = 0; kiln_v < {run}; kiln_v++) {{")
        lines.append(f"      const int64_t {last} = {last}_run * {run} + kiln_v;")
        lines += ["      " + line for line in body.blocks[1]]
        lines.append("    }")
    else:
        lines += ["    " + line for line in body.blocks[1]]
    lines.append("  }")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _by_rows(kernel: Kernel, config: CudaConfig, body: _CudaBody) -> list[str]:
    """A row configuration's loops: each group of `group` threads takes a row (every loop but
    the last), its reductions once, then the row's points. A block's groups take consecutive
    rows, all of its threads alike (for the shuffles and barriers of the rows' reductions), so a
    group past the last row computes the last row again and stores nothing."""
    *outer, (last, extent) = kernel.loops
    rows = " * ".join(f"({index_code(e)})" for _, e in outer)
    per_block = config.points_per_block
    lines = ["  " + line for line in body.blocks[0]]
    lines.append(f"  const int64_t kiln_rows = {rows};")
    lines.append(f"  for (int64_t kiln_first = (int64_t)blockIdx.x * {per_block}; kiln_first < kiln_rows; "
                 f"kiln_first += (int64_t)gridDim.x * {per_block}) {{")
    lines.append("    const int64_t kiln_slot = kiln_first + kiln_offset;")
    lines.append("    const int64_t kiln_row = kiln_slot < kiln_rows ? kiln_slot : kiln_rows - 1;")
    lines += ["    " + line for line in _decomposed("kiln_row", outer, kernel.bounds)]
    lines += ["    " + line for line in body.blocks[1]]
    lines.append("    #pragma unroll 4")
    lines.append(f"    for (int64_t {last} = kiln_lane; {last} < {index_code(extent)}; {last} += {config.group}) {{")
    lines += ["      " + line for line in body.blocks[2]]
    lines.append("    }")
    lines.append("  }")
    lines.append("}")
    return lines


def _decomposed(flat: str, loops, bounds) -> list[str]:
    """The loop variables of a flat index over `loops` (the last varying fastest). In 32-bit
    arithmetic where the index stays below 2^31 at the symbols' upper bounds (`bounds`, the
    kernel's): a 64-bit division by a prompt's length costs several times a 32-bit one."""
    if len(loops) == 1:
        return [f"const int64_t {loops[0][0]} = {flat};"]
    largest = 1
    upper = {s: hi for s, _, hi in bounds}
    for _, extent in loops:
        largest *= extent.evaluate(upper) if extent.symbols() <= upper.keys() else 2 ** 31
    kind = "int" if largest < 2 ** 31 else "int64_t"
    lines, rest = [f"const {kind} kiln_flat = ({kind}){flat};"], "kiln_flat"
    for k, (var, extent) in reversed(list(enumerate(loops))):
        e = f"({kind}){index_code(extent)}"
        if k == 0:
            lines.append(f"const int64_t {var} = {rest};")
        else:
            lines.append(f"const int64_t {var} = {rest} % {e};")
            lines.append(f"const {kind} kiln_rest{k} = {rest} / {e};")
            rest = f"kiln_rest{k}"
    return lines
