"""Data-dependent indexing: reads become Gather, writes become SliceUpdate when the written
positions are one contiguous run (the KV cache), and a one-hot select otherwise."""
from __future__ import annotations

from ...ir import DType, Expr, Node, Op, UnsupportedOp
from ...ir import build
from ...ir.ops import IOTA_INDEX
from ...ir.symbolic import prod
from .. import math as m
from ..registry import LowerCtx, aten, register_lowering
from .views import normalize_slice


def wrap_negative(idx: Node, size: Expr) -> Node:
    """Python-style negative indices: i < 0 means size + i."""
    idx = build.cast(idx, DType.I64)
    n = build.scalar_of(size)
    return m.where(m.lt(idx, m.c(0, idx)), m.add(idx, n), idx)


def linear_index(coords: list[Node], sizes: tuple[Expr, ...]) -> Node:
    """Row-major flat index of coordinates (broadcast together) into a block of `sizes`."""
    flat, stride = None, Expr.of(1)
    for coord, size in reversed(list(zip(coords, sizes))):
        term = coord if stride == 1 else m.mul(coord, build.scalar_of(stride))
        flat = term if flat is None else m.add(flat, term)
        stride = stride * size
    return flat


@register_lowering(aten.embedding.default)
def lower_embedding(ctx: LowerCtx, weight, indices, padding_idx=-1, scale_grad=False, sparse=False):
    return Node(Op.GATHER, [weight, build.cast(indices, DType.I64)], axis=0)


@register_lowering(aten.index_select.default)
def lower_index_select(ctx: LowerCtx, x, dim, index):
    dim = dim % max(x.rank, 1)
    if x.rank == 0:
        return x
    return Node(Op.GATHER, [x, wrap_negative(index, x.shape[dim])], axis=dim)


@register_lowering(aten.index.Tensor)
def lower_index(ctx: LowerCtx, x, indices):
    dims = [i for i, t in enumerate(indices) if t is not None]
    if any(indices[d].dtype is DType.BOOL for d in dims):
        raise UnsupportedOp("kiln: indexing with a bool mask gives a data-dependent shape; "
                            "use torch.where instead")
    coords = build.broadcast(*(wrap_negative(indices[d], x.shape[d]) for d in dims))
    if dims != list(range(dims[0], dims[0] + len(dims))):
        # torch puts the result axes first when the indexed axes are not adjacent
        x = build.permute(x, dims + [a for a in range(x.rank) if a not in dims])
        dims = list(range(len(dims)))
    first, block = dims[0], x.shape[dims[0]:dims[-1] + 1]
    flat = coords[0] if len(coords) == 1 else linear_index(coords, block)
    merged = build.reshape(x, x.shape[:first] + (prod(block),) + x.shape[dims[-1] + 1:])
    return Node(Op.GATHER, [merged, flat], axis=first)


@register_lowering(aten.gather.default)
def lower_gather(ctx: LowerCtx, x, dim, index, sparse_grad=False):
    """out[i..] = x[i.. with axis dim replaced by index[i..]], through one flat Gather."""
    if x.rank == 0:
        return x
    dim = dim % x.rank
    coords = []
    for axis, size in enumerate(index.shape):
        if axis == dim:
            coords.append(wrap_negative(index, x.shape[dim]))
        else:
            shape = tuple(size if a == axis else Expr.of(1) for a in range(index.rank))
            coords.append(build.broadcast_to(build.reshape(build.iota(size), shape), index.shape))
    flat_x = build.reshape(x, (prod(x.shape),))
    return Node(Op.GATHER, [flat_x, linear_index(coords, x.shape)], axis=0)


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
    values = build.cast(build.broadcast_to(values, x.shape[:axis] + (t,) + x.shape[axis + 1:]), x.dtype)
    start = None if accumulate else contiguous_run_start(idx)
    if start is not None:
        return Node(Op.SLICE_UPDATE, [x, values, build.cast(start, DType.I64)], axis=axis)
    # one-hot: hit[t, j] = idx[t] == j; new[..., j] = sum_t values[..., t] * hit[t, j]
    hit = m.eq(build.reshape(wrap_negative(idx, n), (t, 1)), build.reshape(build.iota(n), (1, n)))
    last = [a for a in range(x.rank) if a != axis] + [axis]
    moved_x, moved_v = build.permute(x, last), build.permute(values, last)
    work = DType.F32 if x.dtype.is_float or x.dtype is DType.BOOL else x.dtype
    terms = m.mul(build.reshape(build.cast(moved_v, work), moved_v.shape + (Expr.of(1),)),
                  build.cast(hit, work))
    new = build.cast(Node(Op.SUM_REDUCE, [terms], axis=terms.rank - 2), x.dtype)
    if accumulate:
        out = m.add(moved_x, new)
    else:
        written = Node(Op.MAX_REDUCE, [hit], axis=0)
        out = m.where(written, new, moved_x)
    back = list(range(x.rank - 1))
    back.insert(axis, x.rank - 1)
    return build.permute(out, back)


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


@register_lowering(aten.index_copy.default)
def lower_index_copy(ctx: LowerCtx, x, dim, index, source):
    return scatter_axis(x, dim % x.rank, index, source, accumulate=False)


@register_lowering(aten.index_add.default)
def lower_index_add(ctx: LowerCtx, x, dim, index, source, alpha=1):
    source = source if alpha == 1 else m.mul(source, m.c(alpha, source))
    return scatter_axis(x, dim % x.rank, index, source, accumulate=True)


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
