"""The CUDA emitter's configurations: how a kernel's points and reductions map onto threads
(CudaConfig), the configurations the search may time for a kernel (config_space) and what they
need at launch, and the vector reads a reduction may use."""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..ir.dtypes import DType
from ..ir.symbolic import Expr
from .c_emit import _inside
from .index import stride
from .kernel import Kernel, Load, Reduce, Scalar, free_vars, row_reductions, split_reductions, staged_rows
from .pairs import pairable

# 16 bytes at a time (8 for four 16-bit elements): how a vector of each storage type is read and
# unpacked into floats. Each helper comes twice: reading plainly (through L1, where a row that many
# points read, a GEMV's x, is found again), and streaming (`_stream`: past L1, with a 256-byte L2
# prefetch) for a row each point reads once, a GEMV's weight row: on an H100, GEMVs that streamed
# the weight ran 1-8% faster (benchmarks/h100-gemv-probe-2026-12-06.txt), where streaming x too
# made the 2048->512 product 8% slower
VECTOR_UNPACK = {  # (dtype, width): (the raw read's type, the unpacking of r into v)
    (DType.BF16, 8): ("uint4", "unsigned w[4] = {r.x, r.y, r.z, r.w};\n  #pragma unroll\n  for (int i = 0; i < 4; i++) "
                               "{ v[2*i] = __int_as_float(w[i] << 16); v[2*i+1] = __int_as_float(w[i] & 0xffff0000u); }"),
    (DType.F16, 8): ("uint4", "unsigned w[4] = {r.x, r.y, r.z, r.w};\n  #pragma unroll\n  for (int i = 0; i < 4; i++) "
                              "{ v[2*i] = kiln_f16_load((uint16_t)(w[i] & 0xffffu)); "
                              "v[2*i+1] = kiln_f16_load((uint16_t)(w[i] >> 16)); }"),
    (DType.BF16, 4): ("uint2", "v[0] = __int_as_float(r.x << 16); v[1] = __int_as_float(r.x & 0xffff0000u);\n"
                               "  v[2] = __int_as_float(r.y << 16); v[3] = __int_as_float(r.y & 0xffff0000u);"),
    (DType.F16, 4): ("uint2", "v[0] = kiln_f16_load((uint16_t)(r.x & 0xffffu)); v[1] = kiln_f16_load((uint16_t)(r.x >> 16));\n"
                              "  v[2] = kiln_f16_load((uint16_t)(r.y & 0xffffu)); v[3] = kiln_f16_load((uint16_t)(r.y >> 16));"),
    (DType.F32, 4): ("uint4", "v[0] = __uint_as_float(r.x); v[1] = __uint_as_float(r.y); "
                              "v[2] = __uint_as_float(r.z); v[3] = __uint_as_float(r.w);"),
}
VECTOR_READ = {(dtype, width): f"kiln_{dtype.value}x{width}" for dtype, width in (*VECTOR_UNPACK, (DType.F32, 8))}
STREAM = "_stream"


@dataclass(frozen=True)
class CudaConfig:
    """`block` threads per block; `group` threads per output point, which split its reduction (a
    power of two up to a warp, combined by shuffles, or whole warps dividing the block, their
    warps' values combined through shared memory); `vector` elements each thread reads per step of
    its reduction (in a kernel without reductions, the points each thread takes: a run along the
    last loop). `across`: a group's threads lie `block / group` apart,
    so that neighbouring threads take neighbouring points and read a row that runs along the
    points, not along the reduction, in one coalesced access (attention's P.V reads the V cache
    down its columns); they combine through shared memory. `stage`: what a shared reduction's steps
    compute from its variable alone (the normalized row a norm-merged GEMV reads) is computed once
    per block into shared memory before the points, not once per point (and the launch holds no
    more blocks than the GPU runs at once, each looping over its share of the points). `split`: the reduction's
    steps are shared among `split` blocks (split-K, flash-decoding's split of the context), each
    writing its partial value to scratch memory; the last of them to arrive combines the partials in
    order and finishes the point, so a few long reductions (P.V over a long context, a 512-row GEMV)
    fill the GPU in one launch. `row`: a group per row (every output loop but the last) instead
    of per point: the reductions the row's points share (kernel.row_reductions: softmax's max and
    sum, a norm's sum of squares) are computed once by the group, then its threads take the row's
    points. `stream`: the vectors of a row each point reads alone (a GEMV's weight row) are read past
    L1 with an L2 prefetch; those every point reads (x) still through L1. `pair`: a group takes a
    point and its partner (codegen/pairs.py: rotary's d and d ± depth/2), the two sums both read
    once, not each point both."""
    block: int = 256
    group: int = 1
    vector: int = 1
    across: bool = False
    stage: bool = False
    split: int = 1
    row: bool = False
    stream: bool = False
    pair: bool = False

    @property
    def points_per_block(self) -> int:
        return self.block // self.group

    def key(self) -> str:
        return (f"block{self.block}-group{self.group}-vector{self.vector}" + ("-across" if self.across else "")
                + ("-stage" if self.stage else "") + (f"-split{self.split}" if self.split > 1 else "")
                + ("-row" if self.row else "") + ("-stream" if self.stream else "") + ("-pair" if self.pair else ""))

    def to_json(self) -> dict:
        return {"block": self.block, "group": self.group, "vector": self.vector, "across": self.across,
                "stage": self.stage, "split": self.split, "row": self.row, "stream": self.stream, "pair": self.pair}

    @staticmethod
    def from_json(data: dict) -> CudaConfig:
        return CudaConfig(int(data["block"]), int(data["group"]), int(data["vector"]),
                          bool(data.get("across", False)), bool(data.get("stage", False)),
                          int(data.get("split", 1)), bool(data.get("row", False)), bool(data.get("stream", False)),
                          bool(data.get("pair", False)))




def point_reductions(kernel: Kernel) -> list[Reduce]:
    """The reductions a group of threads can share: those computed once per output point, whose
    value reads no variable of a reduction around them (a GEMV, and the norm or softmax statistics
    merged into it), outermost first."""
    return split_reductions(*(w.value for w in kernel.writes))[0]


def splittable(kernel: Kernel) -> bool:
    """Whether a `split` configuration can share the kernel's reductions among blocks: its points
    are fixed in number (the scratch for their partials is allocated once), and its reductions
    per point run in one loop (one extent, none reading another: a GEMV, P.V, softmax's max), so
    that one arrival per block finishes them all. Softmax merged into P.V is not: its sum needs the
    whole max first."""
    reductions = point_reductions(kernel)
    if not reductions or not all(e.is_const for _, e in kernel.loops):
        return False
    loop_vars = {v for v, _ in kernel.loops}
    return all(r.extent == reductions[0].extent and free_vars(r, {}) & loop_vars
               and not any(other is not r and _inside(r, other) for other in reductions)
               for r in reductions)


# the bytes of one partial value in a split configuration's scratch (the widest accumulator)
PARTIAL_BYTES = 8


def split_scratch(kernel: Kernel, config: CudaConfig) -> tuple[int, int]:
    """What a split configuration's launch needs besides the kernel's buffers: the bytes of its
    partial values (per point, per reduction, per part) and its count of arrival counters (one per
    block's worth of points, zero between launches: the last block to arrive resets its own)."""
    if config.split == 1:
        return 0, 0
    points = 1
    for _, e in kernel.loops:
        points *= e.value
    reductions = len(point_reductions(kernel))
    return points * reductions * config.split * PARTIAL_BYTES, -(-points // config.points_per_block)


def vector_width(reduce: Reduce) -> int:
    """The widest vector (8 or 4 elements) that every contiguous load of the reduction can read
    in one aligned access; 1 when none can."""
    loads = [l for l in loads_in(reduce.body) if stride(l.index, reduce.var) == 1]
    if not loads or not reduce.extent.is_const or any((l.dtype, 4) not in VECTOR_READ for l in loads):
        return 1
    for width in (8, 4):
        if reduce.extent.value % width == 0 and all(aligned_run(l.index, reduce.var, width) for l in loads):
            return width
    return 1


# a row at least this long is shared by a whole block first
_LONG_ROW = 1024
# a row at least this long fills a block's warps: a row configuration beats recomputing the
# row's reductions at every point, and the point configurations are not offered
_ROW_POINTS = 32


def config_space(kernel: Kernel) -> list[CudaConfig]:
    per_row = row_reductions(kernel)
    rows = []
    if per_row:
        width = max(vector_width(r) for r in per_row)
        # a warp per row first (its reductions combined by shuffles alone, several rows a block),
        # then a row shared by a few warps or a whole block; a long row of known length (a norm's)
        # a block first: on the H200 a 512-token prefill's norm over 2048 took 7.0-9.2 us a block
        # per row and 29-30 us a warp per row, softmax's rows of a prompt's length 29.5 us a warp
        # per row and 72.4 us a block per row
        shapes = ((256, 32), (128, 32), (256, 64), (256, 256), (512, 512), (256, 16))
        last = kernel.loops[-1][1]
        if last.is_const and last.value >= _LONG_ROW:
            shapes = ((256, 256), (512, 512), (256, 64), (256, 32), (128, 32))
        rows = [CudaConfig(block, group, width, row=True) for block, group in shapes]
        if not last.is_const or last.value >= _ROW_POINTS:
            return rows
    return rows + _point_space(kernel)


def runs_of(kernel: Kernel, width: int) -> bool:
    """Whether a kernel's points split into runs of `width` along its (constant) last loop."""
    return bool(kernel.loops) and kernel.loops[-1][1].is_const and kernel.loops[-1][1].value % width == 0


def points_per_thread(kernel: Kernel, config: CudaConfig) -> int:
    """A kernel without reductions reads `vector` as the points each thread takes: a run along
    the last loop."""
    return config.vector if config.vector > 1 and not point_reductions(kernel) else 1


def _point_space(kernel: Kernel) -> list[CudaConfig]:
    shared = point_reductions(kernel)
    if not shared:
        plain = [CudaConfig(256, 1, 1), CudaConfig(128, 1, 1), CudaConfig(512, 1, 1)]
        several = [CudaConfig(256, 1, width) for width in (4, 8) if runs_of(kernel, width)]
        # a prompt's many points: several a thread first (one index decomposition for them all,
        # their loads in flight together)
        sized = any(not e.is_const for _, e in kernel.loops)
        return several + plain if sized else plain + several
    reduce = shared[0]
    width = vector_width(reduce)
    space = [CudaConfig(256, 32, width), CudaConfig(128, 128, width), CudaConfig(256, 256, width),
             CudaConfig(512, 512, width), CudaConfig(128, 32, width), CudaConfig(128, 64, width)]
    if width > 1:
        steps = reduce.extent.value // width
        # short rows: a few threads each (a 64-long attention score: 8 threads of 8 elements)
        space += [CudaConfig(256, group, width) for group in (4, 8, 16) if steps <= 4 * group]
        # a thread per point reading 16 bytes at a time: rows too short to share
        space += [CudaConfig(128, 1, width)]
    if any(stride(l.index, reduce.var) not in (0, 1) for l in loads_in(reduce.body)):
        # a load runs across the reduction (the V cache under P.V): threads along the points
        space += [CudaConfig(block, block // 64, 1, across=True) for block in (256, 512, 1024)]
    space += [CudaConfig(256, 1, 1), CudaConfig(256, 32, 1), CudaConfig(256, 256, 1)]
    # a search candidate has its kernels' first four configurations timed: a row a block of 128
    # (second) won Llama's K and V projection with its cache write and its 2048-row GEMV in three
    # H100 compiles, where it came 7th and 9th, behind the staged and split forms, and only a
    # finalist's tuning reached it
    if staged_rows(kernel):   # staged, third: several points a block share the rows they stage
        staged = [CudaConfig(512, 128, width, stage=True), CudaConfig(1024, 128, width, stage=True),
                  CudaConfig(256, 32, width, stage=True), CudaConfig(512, 32, width, stage=True),
                  CudaConfig(256, 8, width, stage=True)]
        space = space[:2] + staged + space[2:]
    if splittable(kernel) and _few_blocks(kernel, space[0]):
        # split next: the first configuration, and the first that reads across, in 4 and 16 parts
        bases = [space[0]] + [c for c in space if c.across][:1]
        space = space[:2] + [replace(c, split=parts) for c in bases for parts in (4, 16)] + space[2:]
    points = {v for v, _ in kernel.loops}
    if width > 1 and reduce.extent.value >= _LONG_ROW and any(
            per_point(l, points) for r in shared for l in loads_in(r.body) if stride(l.index, r.var) == 1):
        # third, the second form (a row a block of 128: the usual winner of a GEMV) streaming the
        # long rows its points read once, within a search candidate's first four
        space.insert(2, replace(space[1], stream=True))
    if pairable(kernel):
        # each form taking a point and its partner first (it reads the weights half as often),
        # the forms computing both sums at every point after them
        space = [replace(c, pair=True) for c in space if c.split == 1 and not c.across] + space
    return list(dict.fromkeys(space))


# fewer blocks than this leave SMs idle on a large GPU (the H200 has 132): a split may fill them
_SPLIT_BELOW_BLOCKS = 512


def _few_blocks(kernel: Kernel, config: CudaConfig) -> bool:
    points = 1
    for _, e in kernel.loops:
        points *= e.value
    return points * config.group < _SPLIT_BELOW_BLOCKS * config.block


def loads_in(s: Scalar, skip: set[Scalar] = frozenset()) -> list[Load]:
    """The loads in `s`, those inside the subexpressions `skip` aside."""
    out, stack, seen = [], [s], set()
    while stack:
        x = stack.pop()
        if id(x) in seen or x in skip:
            continue
        seen.add(id(x))
        if isinstance(x, Load):
            out.append(x)
        stack.extend(x.children())
    return out


def per_point(load: Load, point_vars: set[str]) -> bool:
    """Whether a load reads a row of its own at each point: its index names a point's variable."""
    return bool(load.index.symbols() & point_vars)


def aligned_run(index: Expr, var: str, width: int) -> bool:
    return all(c % width == 0 for mono, c in index.terms if mono != (var,))
