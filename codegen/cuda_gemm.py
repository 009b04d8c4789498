"""Products on tensor cores with their epilogues: a kernel whose value is any elementwise function
E of one matrix product, out[m, n] = E(Σ_k a[m, k] · b[n, k], loads at (m, n)), with a and b
16-bit and contiguous along k, runs as a tiled GEMM (the prefill issue: a fused residual add or
cast must not force a product off the tensor cores, where the library call cannot take E).

A block computes a `rows` × `cols` tile of the output, its warps a grid of sub-tiles; the k axis
is walked 32 at a time, each step's tiles of a and b staged in shared memory by cp.async several
buffers deep (the steps ahead arrive while this one computes: a step's products take a few hundred
cycles, a load from memory more) and read through ldmatrix into mma.sync m16n8k16 (f16/bf16 in,
f32 accumulate). A staged row is 64 bytes, its four 16-byte chunks permuted by the row (XOR
swizzle) so that ldmatrix's eight rows fall in distinct banks without padding: three stages of
128 × 128 fit the 48 KB a block holds without opting in to more. At the end each lane holds its accumulators'
points and computes E there, with the C body renderer: whatever E the model has is computed as
the interpreter computes it."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..ir.dtypes import DType
from ..ir.ops import Op
from ..ir.symbolic import Expr
from .attention import snippet
from .c_emit import COMPUTE, STORAGE, index_code, store_code
from .kernel import Apply, Kernel, Reduce, nodes
from .library import Operand, as_gemm

STEP = 32            # k per staged step: a staged row is 64 bytes, four 16-byte chunks
SHARED_BYTES = 48 * 1024      # what a block may hold without opting in to more
_MMA = {DType.BF16: "bf16", DType.F16: "f16"}


@dataclass(frozen=True)
class MmaConfig:
    """A block's output tile (`rows` × `cols`), its warps' grid over it (`warps_m` × `warps_n`,
    each warp's sub-tile a multiple of 16 both ways) and how many steps of k are staged at once."""
    rows: int = 128
    cols: int = 128
    warps_m: int = 2
    warps_n: int = 2
    stages: int = 3

    @property
    def threads(self) -> int:
        return 32 * self.warps_m * self.warps_n

    def key(self) -> str:
        return f"mma-m{self.rows}-n{self.cols}-w{self.warps_m}x{self.warps_n}-s{self.stages}"

    def to_json(self) -> dict:
        return {"mma": [self.rows, self.cols, self.warps_m, self.warps_n, self.stages]}

    @staticmethod
    def from_json(data: dict) -> MmaConfig:
        return MmaConfig(*(int(x) for x in data["mma"]))


def shared_bytes(config: MmaConfig) -> int:
    return config.stages * (config.rows + config.cols) * STEP * 2


# large tiles for long prompts (a warp's 64 × 64 reads each fragment for 8 products), small ones
# where few rows would leave most of the GPU idle
MMA_SPACE = tuple(c for c in (MmaConfig(128, 128, 2, 2, 3), MmaConfig(128, 128, 2, 4, 3),
                              MmaConfig(64, 128, 2, 2, 4), MmaConfig(64, 64, 2, 2, 4))
                  if shared_bytes(c) <= SHARED_BYTES)


@dataclass(frozen=True)
class TensorGemm:
    kernel: Kernel
    product: Reduce
    m: str                   # the output loop a reads
    n: str                   # the output loop b reads
    extent_m: Expr
    extent_n: Expr
    depth: int               # k's extent
    a: Operand               # strides by m and k (1)
    b: Operand               # strides by n and k (1)

    @property
    def dtype(self) -> DType:
        return self.a.dtype


def as_tensor_gemm(kernel: Kernel) -> TensorGemm | None:
    """The kernel as a tiled product with an epilogue, or None: two output loops, one reduction in
    its value, a sum of f32 products of two f16 (or two bf16) loads, each contiguous along k and
    every row starting 16 bytes aligned, k's extent a multiple of 8."""
    if kernel.also or len(kernel.loops) != 2 or not kernel.output.dtype.is_float:
        return None
    reductions = [s for s in nodes(kernel.value) if isinstance(s, Reduce)]
    if len(reductions) != 1:
        return None
    product = reductions[0]
    if not (isinstance(product.body, Apply) and product.body.op is Op.MUL and product.body.dtype is DType.F32
            and all(isinstance(x, Apply) and x.op is Op.CAST for x in product.body.args)):
        return None
    gemm = as_gemm(dataclasses.replace(kernel, value=product))
    if gemm is None or gemm.batch or len(gemm.m) != 1 or len(gemm.n) != 1 or gemm.k != (product.var,):
        return None
    (m,), (n,), k = gemm.m, gemm.n, product.var
    if {m, n} != {v for v, _ in kernel.loops} or gemm.a.dtype not in _MMA or gemm.b.dtype is not gemm.a.dtype:
        return None
    depth = gemm.extents[k]
    if not depth.is_const or depth.value % 8:
        return None
    for operand, row in ((gemm.a, m), (gemm.b, n)):
        if operand.strides.get(k) != Expr.of(1) or set(operand.strides) != {row, k}:
            return None
        if not (_aligned(operand.offset) and _aligned(operand.strides[row])):
            return None
    return TensorGemm(kernel, product, m, n, gemm.extents[m], gemm.extents[n], depth.value, gemm.a, gemm.b)


def _aligned(e: Expr) -> bool:
    """Whether e is a multiple of 8 whatever its symbols (8 halves: 16 bytes)."""
    return all(c % 8 == 0 for _, c in e.terms)


def mma_space(kernel: Kernel) -> list[MmaConfig]:
    return list(MMA_SPACE) if as_tensor_gemm(kernel) else []


def emit_cuda_gemm(g: TensorGemm, config: MmaConfig, name: str) -> str:
    kernel = g.kernel
    wm, wn = config.rows // config.warps_m, config.cols // config.warps_n
    if wm % 16 or wn % 16 or config.stages < 2:
        raise ValueError(f"config {config.key()}: each warp's tile must be a multiple of 16 both ways, "
                         "and at least two steps staged")
    mt, nt, stages = wm // 16, wn // 8, config.stages
    params = [f"{STORAGE[kernel.output.dtype]}* __restrict__ {kernel.output.name}"]
    params += [f"const {STORAGE[b.dtype]}* __restrict__ {b.name}" for b in kernel.inputs]
    params.append("const int64_t* __restrict__ kiln_sym")
    out = [f'extern "C" __global__ void __launch_bounds__({config.threads}) {name}({", ".join(params)}) {{']
    body = [f"const int64_t {s} = kiln_sym[{i}];" for i, s in enumerate(kernel.symbols)]
    body += [f"__shared__ __align__(16) uint16_t kiln_as[{stages}][{config.rows * STEP}], "
             f"kiln_bs[{stages}][{config.cols * STEP}];",
             "const int kiln_warp = threadIdx.x / 32, kiln_lane = threadIdx.x % 32;",
             "const int kiln_g = kiln_lane >> 2, kiln_t = kiln_lane & 3;",
             f"const int64_t kiln_nm = {index_code(g.extent_m)}, kiln_nn = {index_code(g.extent_n)};",
             f"const int64_t kiln_m0 = (int64_t)blockIdx.y * {config.rows}, kiln_n0 = (int64_t)blockIdx.x * {config.cols};",
             f"const int kiln_wm = (kiln_warp / {config.warps_n}) * {wm}, kiln_wn = (kiln_warp % {config.warps_n}) * {wn};",
             f"float kiln_acc[{mt}][{nt}][4] = {{}};",
             f"const int kiln_steps = {-(-g.depth // STEP)};",
             *_sources(g, config),
             # the steps before the first, one commit each (empty past the last step: the count of
             # groups a wait leaves pending stays the same at every step)
             "#pragma unroll",
             f"for (int kiln_ahead = 0; kiln_ahead < {stages - 1}; kiln_ahead++) {{",
             "  if (kiln_ahead < kiln_steps) {",
             *("    " + x for x in _stage(g, config, "kiln_ahead", "kiln_ahead")),
             "  }",
             "  kiln_gemm_commit();",
             "}",
             "for (int kiln_step = 0; kiln_step < kiln_steps; kiln_step++) {",
             f"  kiln_gemm_wait<{stages - 2}>();   // this step's copies have landed (this thread's)",
             "  __syncthreads();   // everyone's; and every warp is done with the buffer refilled next",
             f"  const int kiln_next = kiln_step + {stages - 1};",
             "  if (kiln_next < kiln_steps) {",
             *("    " + x for x in _stage(g, config, "kiln_next", f"kiln_next % {stages}")),
             "  }",
             "  kiln_gemm_commit();",
             f"  const uint16_t* kiln_at = kiln_as[kiln_step % {stages}];",
             f"  const uint16_t* kiln_bt = kiln_bs[kiln_step % {stages}];",
             "  #pragma unroll",
             f"  for (int kiln_kk = 0; kiln_kk < {STEP // 16}; kiln_kk++) {{",
             f"    uint32_t kiln_fa[{mt}][4], kiln_fb[{nt}][2];",
             "    #pragma unroll",
             f"    for (int kiln_i = 0; kiln_i < {mt}; kiln_i++)",
             "      kiln_gemm_ldsm_x4(kiln_fa[kiln_i][0], kiln_fa[kiln_i][1], kiln_fa[kiln_i][2], kiln_fa[kiln_i][3],",
             "                        &kiln_at[kiln_swizzled(kiln_wm + kiln_i * 16 + (kiln_lane & 15), "
             "kiln_kk * 2 + (kiln_lane >> 4))]);",
             "    #pragma unroll",
             f"    for (int kiln_j = 0; kiln_j < {nt // 2}; kiln_j++)",
             "      kiln_gemm_ldsm_x4(kiln_fb[2 * kiln_j][0], kiln_fb[2 * kiln_j][1], kiln_fb[2 * kiln_j + 1][0],",
             "                        kiln_fb[2 * kiln_j + 1][1],",
             "                        &kiln_bt[kiln_swizzled(kiln_wn + kiln_j * 16 + (kiln_lane & 7) + ((kiln_lane >> 4) << 3), "
             "kiln_kk * 2 + ((kiln_lane >> 3) & 1))]);",
             "    #pragma unroll",
             f"    for (int kiln_i = 0; kiln_i < {mt}; kiln_i++)",
             "      #pragma unroll",
             f"      for (int kiln_j = 0; kiln_j < {nt}; kiln_j++)",
             f"        kiln_gemm_mma_{_MMA[g.dtype]}(kiln_acc[kiln_i][kiln_j], kiln_fa[kiln_i], kiln_fb[kiln_j][0], kiln_fb[kiln_j][1]);",
             "  }",
             "}"]
    body += _epilogue(g, mt, nt)
    out += ["  " + line for line in body]
    out.append("}")
    return _HELPERS + "\n".join(out) + "\n"


def _operands(g: TensorGemm, config: MmaConfig):
    """Per operand: its name in the code, its operand, its staged tile's rows, where its rows
    start, how many there are, its shared array."""
    return (("a", g.a, config.rows, "kiln_m0", "kiln_nm", "kiln_as"),
            ("b", g.b, config.cols, "kiln_n0", "kiln_nn", "kiln_bs"))


def _sources(g: TensorGemm, config: MmaConfig) -> list[str]:
    """This thread's 16-byte chunks of each staged tile, the same at every step but for k: each
    chunk's row's start (null past the last row) and its place in the swizzled tile; its column
    in a step is the thread's (`kiln_col`).
    Computed once, so that a step's staging is a few integer ops a copy."""
    lines = []
    for tag, operand, tile, origin, extent, _ in _operands(g, config):
        chunks = tile * STEP // 8
        if chunks % config.threads:
            raise ValueError(f"config {config.key()}: {chunks} chunks of a staged tile among {config.threads} threads")
        per = chunks // config.threads
        row_var = g.m if operand is g.a else g.n
        lines += [f"const uint16_t* kiln_{tag}_src[{per}];",
                  f"int kiln_{tag}_at[{per}];",
                  "#pragma unroll",
                  f"for (int kiln_u = 0; kiln_u < {per}; kiln_u++) {{",
                  f"  const int kiln_r = (threadIdx.x + kiln_u * {config.threads}) / {STEP // 8};",
                  f"  const int64_t kiln_row = {origin} + kiln_r;",
                  f"  kiln_{tag}_src[kiln_u] = kiln_row < {extent} ? {operand.buffer} + ({index_code(operand.offset)}) + "
                  f"kiln_row * ({index_code(operand.strides[row_var])}) : nullptr;",
                  f"  kiln_{tag}_at[kiln_u] = kiln_swizzled(kiln_r, threadIdx.x % {STEP // 8});",
                  "}"]
    lines.append(f"const int kiln_col = (threadIdx.x % {STEP // 8}) * 8;    // the k of this thread's chunks in a step")
    return lines


def _stage(g: TensorGemm, config: MmaConfig, step: str, buffer: str) -> list[str]:
    """Request step `step`'s tiles of a and b into shared buffer `buffer`, 16 bytes a copy; zeros
    past the last row or k (a zero adds nothing to a sum of products)."""
    lines = [f"const int kiln_k = {step} * {STEP} + kiln_col;"]
    for tag, operand, tile, _, _, dest in _operands(g, config):
        lines += ["#pragma unroll",
                  f"for (int kiln_u = 0; kiln_u < {tile * STEP // 8 // config.threads}; kiln_u++) {{",
                  f"  const bool kiln_in = kiln_{tag}_src[kiln_u] != nullptr && kiln_k < {g.depth};",
                  f"  kiln_gemm_copy16(&{dest}[{buffer}][kiln_{tag}_at[kiln_u]], "
                  f"kiln_in ? kiln_{tag}_src[kiln_u] + kiln_k : {operand.buffer}, kiln_in);",
                  "}"]
    return ["{", *("  " + x for x in lines), "}"]


def _epilogue(g: TensorGemm, mt: int, nt: int) -> list[str]:
    """Each accumulator's point: E computed there, with the product's sum as the accumulator
    (rounded first where the sum is 16-bit), and stored."""
    kernel, product = g.kernel, g.product
    total = "kiln_acc[kiln_i][kiln_j][kiln_c]"
    if product.dtype in _MMA:
        total = f"kiln_{product.dtype.value}_round({total})"
    return ["#pragma unroll",
            f"for (int kiln_i = 0; kiln_i < {mt}; kiln_i++) {{",
            "  #pragma unroll",
            f"  for (int kiln_j = 0; kiln_j < {nt}; kiln_j++) {{",
            "    #pragma unroll",
            "    for (int kiln_c = 0; kiln_c < 4; kiln_c++) {",
            f"      const int64_t {g.m} = kiln_m0 + kiln_wm + kiln_i * 16 + kiln_g + (kiln_c >> 1) * 8;",
            f"      const int64_t {g.n} = kiln_n0 + kiln_wn + kiln_j * 8 + 2 * kiln_t + (kiln_c & 1);",
            f"      if ({g.m} < kiln_nm && {g.n} < kiln_nn) {{",
            f"        const {COMPUTE[product.dtype]} kiln_p = {total};",
            f"        {COMPUTE[kernel.value.dtype]} kiln_out;",
            *("        " + x for x in snippet(kernel.value, {product: "kiln_p"}, "kiln_out")),
            f"        {kernel.output.name}[{index_code(kernel.store)}] = {store_code('kiln_out', kernel.output.dtype)};",
            "      }",
            "    }",
            "  }",
            "}"]


_HELPERS = r"""
#ifndef KILN_GEMM_SWIZZLE
#define KILN_GEMM_SWIZZLE
// the element offset of 16-byte chunk `chunk` (of four) of staged row `row`: chunks permuted by
// the row, so that eight consecutive rows' same chunk lie in eight distinct groups of banks
__device__ __forceinline__ int kiln_swizzled(int row, int chunk) { return row * 32 + ((chunk ^ ((row >> 1) & 3)) << 3); }
#endif
// the PTX the template uses (tests/cuda_on_cpu.py emulates these on the CPU)
#ifndef KILN_GEMM_HELPERS
#define KILN_GEMM_HELPERS
__device__ __forceinline__ void kiln_gemm_mma_bf16(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void kiln_gemm_mma_f16(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void kiln_gemm_copy16(uint16_t* to, const uint16_t* from, bool in) {
  const unsigned s = (unsigned)__cvta_generic_to_shared(to);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(s), "l"(from), "r"(in ? 16 : 0));
}
__device__ __forceinline__ void kiln_gemm_commit() { asm volatile("cp.async.commit_group;"); }
// at most N of this thread's committed groups still pending (a barrier after makes it everyone's)
template <int N> __device__ __forceinline__ void kiln_gemm_wait() { asm volatile("cp.async.wait_group %0;" :: "n"(N) : "memory"); }
__device__ __forceinline__ void kiln_gemm_ldsm_x4(uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3,
                                                  const uint16_t* p) {
  const unsigned s = (unsigned)__cvta_generic_to_shared(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(s));
}
#endif
"""
