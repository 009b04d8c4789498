"""Data-dependent writes: SliceUpdate when the written positions are one contiguous run (the KV
cache), else a one-hot match of each index against the positions it may write."""
from __future__ import annotations

import math

from ...ir import DType, Expr, Node, Op, UnsupportedOp
from ...ir import build
from ...ir.ops import IOTA_INDEX
from ...ir.symbolic import prod
from .. import math as m
from ..registry import LowerCtx, aten, register_lowering
from .indexing import linear_index, wrap_negative
from .reductions import product
from .views import normalize_slice, pad_axis


def contiguous_run_start(idx: Node) -> Node | None:
    """The start s when idx is s + arange(n) (the shape of a KV-cache write), else None."""
    while idx.op is Op.CAST:
        idx = idx.inputs[0]
    if idx.rank != 1:
        return None
    if idx.shape[0] == 1:
        return build.reshape(idx, ())
    offset = _ramp_offset(idx)
    if offset is not None:
        return build.scalar_of(offset)
    if idx.op is Op.ADD:
        for ramp, base in (idx.inputs, idx.inputs[::-1]):
            offset = _ramp_offset(ramp)
            if offset is not None and _is_broadcast_scalar(base):
                start = build.reshape(build.slice_axis(base, 0, 0, 1), ())
                return m.add(start, build.cast(build.scalar_of(offset), start.dtype))
    return None


def _ramp_offset(node: Node) -> Expr | None:
    """k when node is the Iota k, k+1, k+2, ... (through casts), else None."""
    while node.op is Op.CAST:
        node = node.inputs[0]
    if node.op is not Op.IOTA:
        return None
    offset = node.attrs["expr"] - Expr.of(IOTA_INDEX)
    return None if IOTA_INDEX in offset.symbols() else offset


def _is_broadcast_scalar(node: Node) -> bool:
    while node.op in (Op.EXPAND, Op.RESHAPE, Op.CAST):
        node = node.inputs[0]
    return node.rank == 0 or all(d == 1 for d in node.shape)


def scatter_axis(x: Node, axis: int, idx: Node, values: Node, accumulate: bool) -> Node:
    """x with values[..., t, ...] written (or added) at x[..., idx[t], ...] along axis."""
    n, t = x.shape[axis], idx.shape[0]
    if t == 0:  # nothing to write
        return x
    values = build.cast(build.broadcast_to(values, x.shape[:axis] + (t,) + x.shape[axis + 1:]), x.dtype)
    start = None if accumulate else contiguous_run_start(idx)
    if start is not None:
        return Node(Op.SLICE_UPDATE, [x, values, build.cast(start, DType.I64)], axis=axis)
    hit = m.eq(build.reshape(wrap_negative(idx, n), (t, 1)), build.reshape(build.iota(n), (1, n)))  # [t, n]
    along = tuple(n if a == axis else Expr.of(1) for a in range(x.rank))
    if not accumulate:
        # the last write to j wins, as in torch's sequential loop: gather values at that t
        order = build.reshape(build.iota(t, start=1), (t, 1))
        last = Node(Op.MAX_REDUCE, [m.where(hit, order, m.c(0, order))], axis=0)      # [n], 0: none
        written = m.lt(m.c(0, last), last)
        picked = Node(Op.GATHER, [values, m.maximum(m.sub(last, m.c(1, last)), m.c(0, last))], axis=axis)
        return m.where(build.reshape(written, along), picked, x)
    # added: new[..., j] = sum of values[..., t] where hit[t, j], in at least f32 (a select, not
    # a multiply by the mask: inf * 0 would be NaN)
    moved = [a for a in range(x.rank) if a != axis] + [axis]
    moved_v = build.permute(values, moved)
    work = DType.F32 if x.dtype.is_float or x.dtype is DType.BOOL else x.dtype
    v = build.cast(build.reshape(moved_v, moved_v.shape + (Expr.of(1),)), work)
    new = Node(Op.SUM_REDUCE, [m.where(hit, v, m.c(0, v))], axis=v.rank - 2)
    back = list(range(x.rank - 1))
    back.insert(axis, x.rank - 1)
    return build.cast(m.add(build.cast(x, work), build.permute(new, back)), x.dtype)


@register_lowering(aten.index_put.default)
def lower_index_put(ctx: LowerCtx, x, indices, values, accumulate=False):
    dims = [i for i, t in enumerate(indices) if t is not None]
    if len(dims) == 1 and indices[dims[0]].dtype is DType.BOOL:
        mask = build.broadcast_to(indices[dims[0]], x.shape[:dims[0] + indices[dims[0]].rank])
        mask = build.reshape(mask, mask.shape + (Expr.of(1),) * (x.rank - mask.rank))
        if not all(d == 1 for d in values.shape):
            raise UnsupportedOp("kiln: index_put with a bool mask takes one value only")
        fill = build.cast(build.reshape(values, ()), x.dtype)
        return m.add(x, fill) if accumulate else m.where(mask, fill, x)
    if len(dims) != 1 or indices[dims[0]].rank != 1:
        raise UnsupportedOp("kiln: index_put lowers one 1-d index tensor on one axis "
                            f"(got index tensors on axes {dims})")
    return scatter_axis(x, dims[0], indices[dims[0]], values, accumulate)


def _index_write(x: Node, dim: int, index: Node, source: Node, accumulate: bool) -> Node:
    """index_copy / index_add: scatter_axis with the index as a vector (a 0-d x is a 1-vector)."""
    if x.rank == 0:
        return build.reshape(_index_write(build.reshape(x, (1,)), 0, index, source, accumulate), ())
    index = build.reshape(index, (prod(index.shape),))
    return scatter_axis(x, dim % x.rank, index, source, accumulate)


@register_lowering(aten.index_copy.default)
def lower_index_copy(ctx: LowerCtx, x, dim, index, source):
    return _index_write(x, dim, index, source, accumulate=False)


@register_lowering(aten.index_add.default)
def lower_index_add(ctx: LowerCtx, x, dim, index, source, alpha=1):
    source = source if alpha == 1 else m.mul(source, m.c(alpha, source))
    return _index_write(x, dim, index, source, accumulate=True)


@register_lowering(aten.slice_scatter.default)
def lower_slice_scatter(ctx: LowerCtx, x, src, dim=0, start=None, end=None, step=1):
    dim = dim % x.rank
    lo, hi = normalize_slice(x.shape[dim], start, end)
    if step != 1:
        positions = build.iota(src.shape[dim], DType.I64, start=lo, step=step)
        return scatter_axis(x, dim, positions, src, accumulate=False)
    return Node(Op.SLICE_UPDATE, [x, build.cast(src, x.dtype), build.scalar_of(lo)], axis=dim)


@register_lowering(aten.select_scatter.default)
def lower_select_scatter(ctx: LowerCtx, x, src, dim, index):
    dim = dim % x.rank
    index = Expr.of(index)
    if index.is_const and index.value < 0:
        index = x.shape[dim] + index
    src = build.reshape(build.cast(src, x.dtype), x.shape[:dim] + (Expr.of(1),) + x.shape[dim + 1:])
    return Node(Op.SLICE_UPDATE, [x, src, build.scalar_of(index)], axis=dim)


# --- scatter: out[..., index[p], ...] = src[p] along dim, for every position p of index ---------
def _scatter(ctx: LowerCtx, x: Node, dim: int, index: Node, src, reduce: str | None,
             include_self: bool = True) -> Node:
    """With dim moved last, row r of index [R.., T] writes src[r, t] at x[r, index[r, t]]: hit[r, t, j]
    says whether it lands on j, and reduce combines what lands (None: the last write wins, as in
    torch's sequential loop). R may be shorter than x's extents: the rest of x stays as it is."""
    if x.rank == 0:
        src = build.reshape(src, (1,)) if isinstance(src, Node) else src
        out = _scatter(ctx, build.reshape(x, (1,)), 0, build.reshape(index, (1,)), src, reduce, include_self)
        return build.reshape(out, ())
    dim = dim % x.rank
    last = [a for a in range(x.rank) if a != dim] + [dim]
    if isinstance(src, Node):
        for axis, size in enumerate(index.shape):
            src = build.slice_axis(src, axis, 0, size)
        src = build.permute(build.cast(src, x.dtype), last)
    else:
        src = build.constant(src, x.dtype, tuple(index.shape[a] for a in last))
    idx, n = build.permute(index, last), x.shape[dim]
    if idx.shape[-1] == 0:  # nothing to write
        return build.cast(x, ctx.out_dtype)
    hit = m.eq(build.reshape(wrap_negative(idx, n), idx.shape + (Expr.of(1),)),
               build.reshape(build.iota(n), (Expr.of(1),) * idx.rank + (n,)))      # [R.., T, n]
    count = Node(Op.SUM_REDUCE, [build.cast(hit, DType.I64)], axis=idx.rank - 1)  # [R.., n]
    new = _last_write(src, hit) if reduce is None else _reduce(reduce, src, hit)
    moved = build.permute(x, last)
    for axis, (size, full) in enumerate(zip(src.shape[:-1], moved.shape[:-1])):
        new, count = pad_axis(new, axis, 0, full - size), pad_axis(count, axis, 0, full - size)
    written = m.lt(m.c(0, count), count)
    out = _with_self(reduce, include_self, build.cast(moved, new.dtype), new, written, count)
    back = list(range(x.rank - 1))
    back.insert(dim, x.rank - 1)
    return build.cast(build.permute(out, back), ctx.out_dtype)


def _last_write(src: Node, hit: Node) -> Node:
    """src[r, t] for the last t that lands on j: one Gather through a flat index into src."""
    t = src.shape[-1]
    order = build.reshape(build.iota(t, start=1), (t, 1))
    latest = Node(Op.MAX_REDUCE, [m.where(hit, order, m.c(0, order))], axis=hit.rank - 2)  # [R.., n]
    coords = [build.reshape(build.iota(size), tuple(size if a == axis else Expr.of(1)
                                                    for a in range(latest.rank)))
              for axis, size in enumerate(src.shape[:-1])]
    coords.append(m.maximum(m.sub(latest, m.c(1, latest)), m.c(0, latest)))
    flat = linear_index(build.broadcast(*coords), src.shape)
    return Node(Op.GATHER, [build.reshape(src, (prod(src.shape),)), flat], axis=0)


def _reduce(reduce: str, src: Node, hit: Node) -> Node:
    """What lands on each j, combined over t (in f32 for floats and bools, i64 for integers)."""
    work = DType.F32 if src.dtype.is_float or src.dtype is DType.BOOL else DType.I64
    v = build.cast(build.reshape(src, src.shape + (Expr.of(1),)), work)                  # [R.., T, 1]
    axis = hit.rank - 2
    if reduce in ("sum", "mean"):
        return Node(Op.SUM_REDUCE, [m.where(hit, v, m.c(0, v))], axis=axis)
    if reduce == "prod":
        return product(m.where(hit, v, m.c(1, v)), axis)
    lowest = m.c(-math.inf if work.is_float else -2**63, v)
    if reduce == "amax":
        return Node(Op.MAX_REDUCE, [m.where(hit, v, lowest)], axis=axis)
    if reduce == "amin":
        return m.neg(Node(Op.MAX_REDUCE, [m.where(hit, m.neg(v), lowest)], axis=axis))
    raise UnsupportedOp(f"kiln: scatter with reduce='{reduce}'")


def _with_self(reduce, include_self: bool, x: Node, new: Node, written: Node, count: Node) -> Node:
    if reduce == "mean":
        total, n = (m.add(x, new), m.add(count, m.c(1, count))) if include_self else (new, count)
        n = build.cast(n, total.dtype)
        new = m.div(total, n) if total.dtype.is_float else m.floor_divide(total, n)
    elif reduce is not None and include_self:
        combine = {"sum": m.add, "prod": m.mul, "amax": m.maximum, "amin": m.minimum}[reduce]
        new = combine(x, new)
    return m.where(written, new, x)


@register_lowering(aten.scatter.src, aten.scatter.value)
def lower_scatter(ctx: LowerCtx, x, dim, index, src):
    return _scatter(ctx, x, dim, index, src, None)


@register_lowering(aten.scatter.reduce, aten.scatter.value_reduce)
def lower_scatter_legacy_reduce(ctx: LowerCtx, x, dim, index, src, reduce):
    return _scatter(ctx, x, dim, index, src, {"add": "sum", "multiply": "prod"}[reduce])


@register_lowering(aten.scatter_add.default)
def lower_scatter_add(ctx: LowerCtx, x, dim, index, src):
    return _scatter(ctx, x, dim, index, src, "sum")


@register_lowering(aten.scatter_reduce.two)
def lower_scatter_reduce(ctx: LowerCtx, x, dim, index, src, reduce, include_self=True):
    return _scatter(ctx, x, dim, index, src, reduce, include_self)
