"""Data-dependent reads: embedding, index_select, index and gather all become Gather (writes are
in scatter.py)."""
from __future__ import annotations

from ...ir import DType, Expr, Node, Op, UnsupportedOp
from ...ir import build
from ...ir.symbolic import prod
from .. import math as m
from ..registry import LowerCtx, aten, register_lowering, unsupported


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
    if x.rank == 0:  # the index can only be 0 (or -1): x repeated in the index's shape
        return build.broadcast_to(x, index.shape)
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


# outputs whose size depends on the values: Kiln's graphs have shapes known before the data
for _target in (aten.nonzero.default, aten.masked_select.default, aten._unique2.default,
                aten.unique_consecutive.default, aten.unique_dim.default, aten._local_scalar_dense.default):
    unsupported(_target, "the result's shape (or a Python number) depends on the values; "
                         "use torch.where or a fixed-size formulation")
unsupported(aten.embedding_renorm.default, "embedding max_norm rescales the weight in place")
unsupported(aten._embedding_bag_forward_only.default, "embedding_bag has no lowering yet (embedding has)")
