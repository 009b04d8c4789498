"""Shape and movement ops: they become views (Reshape, Permute, Expand, Slice, Pad, Concat)."""
from __future__ import annotations

from ...ir import DType, Expr, Node, Op, ShapeError, UnsupportedOp
from ...ir import build
from ...ir.symbolic import fmt_shape, prod
from ..registry import LowerCtx, aten, register_lowering

_INT64_MAX = 2**63 - 1


def infer_shape(x: Node, sizes) -> tuple[Expr, ...]:
    """Resolve one -1 in a requested shape against x's element count."""
    sizes = [Expr.of(s) for s in sizes]
    unknown = [i for i, s in enumerate(sizes) if s == -1]
    if not unknown:
        return tuple(sizes)
    known = prod(s for s in sizes if s != -1)
    total = prod(x.shape)
    missing = total.exact_div(known) if not known.is_const else total // known
    if missing is None:
        missing = total // known
    sizes[unknown[0]] = missing
    return tuple(sizes)


@register_lowering(aten.view.default, aten.reshape.default, aten._unsafe_view.default,
                   aten.view_copy.default)
def lower_view(ctx: LowerCtx, x, sizes):
    return build.reshape(x, ctx.out_shape if any(isinstance(s, Expr) for s in sizes)
                         else infer_shape(x, sizes))


@register_lowering(aten.permute.default, aten.permute_copy.default)
def lower_permute(ctx: LowerCtx, x, dims):
    return build.permute(x, [d % x.rank for d in dims])


@register_lowering(aten.transpose.int)
def lower_transpose(ctx: LowerCtx, x, a, b):
    if x.rank == 0:  # torch lets a 0-d tensor swap its (non-existent) axis 0 or -1 with itself
        return x
    perm = list(range(x.rank))
    a, b = a % x.rank, b % x.rank
    perm[a], perm[b] = perm[b], perm[a]
    return build.permute(x, perm)


@register_lowering(aten.t.default)
def lower_t(ctx: LowerCtx, x):
    return build.permute(x, list(range(x.rank))[::-1])


@register_lowering(aten.unsqueeze.default)
def lower_unsqueeze(ctx: LowerCtx, x, dim):
    dim = dim % (x.rank + 1)
    return build.reshape(x, x.shape[:dim] + (Expr.of(1),) + x.shape[dim:])


@register_lowering(aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims)
def lower_squeeze(ctx: LowerCtx, x, dims=None):
    return build.reshape(x, ctx.out_shape)


@register_lowering(aten.expand.default, aten.expand_copy.default)
def lower_expand(ctx: LowerCtx, x, sizes, implicit=False):
    lead = len(sizes) - x.rank
    shape = [x.shape[i - lead] if (s == -1 and i >= lead) else Expr.of(s) for i, s in enumerate(sizes)]
    return build.broadcast_to(x, tuple(shape))


def normalize_slice(dim: Expr, start, end) -> tuple[Expr, Expr]:
    """Python slice bounds (None, negative, past the end) as 0 <= start <= stop <= dim."""
    def bound(v, default):
        if v is None:
            return default
        v = Expr.of(v)
        if v.is_const and v.value >= _INT64_MAX // 2:
            return dim
        if v.is_const and v.value < 0:
            v = dim + v
        if v.is_const and dim.is_const:
            return Expr.of(min(max(v.value, 0), dim.value))
        return v  # symbolic bounds are in range: torch.export guards them
    return bound(start, Expr.of(0)), bound(end, dim)


@register_lowering(aten.slice.Tensor, aten.slice_copy.Tensor)
def lower_slice(ctx: LowerCtx, x, dim=0, start=None, end=None, step=1):
    dim = dim % x.rank
    lo, hi = normalize_slice(x.shape[dim], start, end)
    if (hi - lo).is_const and (hi - lo).value <= 0:
        lo = hi
    return build.slice_axis(x, dim, lo, hi, step)


@register_lowering(aten.select.int, aten.select_copy.int)
def lower_select(ctx: LowerCtx, x, dim, index):
    dim = dim % x.rank
    index = Expr.of(index)
    if index.is_const and index.value < 0:
        index = x.shape[dim] + index
    out = build.slice_axis(x, dim, index, index + 1)
    return build.reshape(out, x.shape[:dim] + x.shape[dim + 1:])


@register_lowering(aten.cat.default, aten.concat.default)
def lower_cat(ctx: LowerCtx, tensors, dim=0):
    dim = dim % len(ctx.out_shape)
    # torch skips empty 1-d tensors whatever the rank of the others; empty parts add nothing
    tensors = [build.cast(t, ctx.out_dtype) for t in tensors
               if not (t.rank == 1 and t.shape[0] == 0) and t.shape[dim] != 0]
    if not tensors:
        return build.constant(0, ctx.out_dtype, ctx.out_shape)
    return tensors[0] if len(tensors) == 1 else Node(Op.CONCAT, tensors, axis=dim)


@register_lowering(aten.split_with_sizes.default, aten.split_with_sizes_copy.default)
def lower_split_with_sizes(ctx: LowerCtx, x, sizes, dim=0):
    dim = dim % x.rank
    outs, offset = [], Expr.of(0)
    for size in sizes:
        outs.append(build.slice_axis(x, dim, offset, offset + size))
        offset = offset + size
    return outs


@register_lowering(aten.split.Tensor, aten.split_copy.Tensor)
def lower_split(ctx: LowerCtx, x, size, dim=0):
    dim = dim % x.rank
    length = x.shape[dim]
    if not length.is_const:
        raise ShapeError(f"split of a symbolic axis {fmt_shape(x.shape)} into chunks of {size}")
    n = length.value
    return lower_split_with_sizes(ctx, x, [min(size, n - i) for i in range(0, n, size)], dim)


@register_lowering(aten.unbind.int, aten.unbind_copy.int)
def lower_unbind(ctx: LowerCtx, x, dim=0):
    dim = dim % x.rank
    return [lower_select(ctx, x, dim, i) for i in range(x.shape[dim].value)]


def pad_axis(x: Node, axis: int, before, after, value: float = 0.0) -> Node:
    """Pad one axis with value; a negative width crops instead."""
    before, after = Expr.of(before), Expr.of(after)
    if before.is_const and before.value < 0:
        x = build.slice_axis(x, axis, -before, x.shape[axis])
        before = Expr.of(0)
    if after.is_const and after.value < 0:
        x = build.slice_axis(x, axis, 0, x.shape[axis] + after)
        after = Expr.of(0)
    if before != 0 or after != 0:
        x = Node(Op.PAD, [x], axis=axis, before=before, after=after, value=float(value))
    return x


@register_lowering(aten.constant_pad_nd.default)
def lower_pad(ctx: LowerCtx, x, pad, value=0):
    # pad lists (before, after) pairs from the last axis backwards
    for i in range(len(pad) // 2):
        x = pad_axis(x, x.rank - 1 - i, pad[2 * i], pad[2 * i + 1], value)
    return x


@register_lowering(aten.repeat.default)
def lower_repeat(ctx: LowerCtx, x, repeats):
    lead = len(repeats) - x.rank
    x = build.reshape(x, (1,) * lead + x.shape)
    # interleave a repeat axis before each axis, expand it, and merge the pairs
    paired = build.reshape(x, tuple(d for s in x.shape for d in (Expr.of(1), s)))
    grown = build.expand(paired, tuple(d for r, s in zip(repeats, x.shape) for d in (Expr.of(r), s)))
    return build.reshape(grown, tuple(Expr.of(r) * s for r, s in zip(repeats, x.shape)))


def flip(x: Node, axes) -> Node:
    """Reversed along each axis: a Gather of n-1, n-2, ..., 0 (a Slice cannot step backwards)."""
    for axis in axes:
        n = x.shape[axis]
        x = Node(Op.GATHER, [x, build.iota(n, DType.I64, start=n - 1, step=-1)], axis=axis)
    return x


@register_lowering(aten.flip.default)
def lower_flip(ctx: LowerCtx, x, dims):
    return flip(x, [d % x.rank for d in dims]) if x.rank else x


@register_lowering(aten.diagonal.default, aten.diagonal_copy.default)
def lower_diagonal(ctx: LowerCtx, x, offset=0, dim1=0, dim2=1):
    """Move the two axes last and flatten them: the diagonal is then a Slice with step cols + 1."""
    dim1, dim2 = dim1 % x.rank, dim2 % x.rank
    rows, cols = x.shape[dim1], x.shape[dim2]
    moved = build.permute(x, [a for a in range(x.rank) if a not in (dim1, dim2)] + [dim1, dim2])
    flat = build.reshape(moved, moved.shape[:-2] + (rows * cols,))
    length = ctx.out_shape[-1]
    start = Expr.of(offset) if offset >= 0 else cols * -offset
    stop = start + (length - 1) * (cols + 1) + 1 if length != 0 else start
    if not cols.is_const:
        raise UnsupportedOp(f"kiln: the diagonal of a matrix {cols} wide needs a symbolic slice step")
    return build.slice_axis(flat, flat.rank - 1, start, stop, cols.value + 1)
