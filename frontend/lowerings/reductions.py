"""Reductions and the normalizations built on them; matmuls as broadcast multiply + SumReduce."""
from __future__ import annotations

from ...ir import DType, Expr, Node, Op
from ...ir import build
from ...ir.symbolic import prod
from .. import math as m
from ..registry import LowerCtx, aten, register_lowering
from .pointwise import opmath


def _axes(x: Node, dims) -> list[int]:
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return list(range(x.rank))
    dims = [dims] if isinstance(dims, int) else dims
    return [d % max(x.rank, 1) for d in dims] if x.rank else []


def count(x: Node, axes: list[int]) -> Node:
    """How many elements the axes hold, as an f32 scalar (symbolic sizes included)."""
    return build.cast(build.scalar_of(prod(x.shape[a] for a in axes)), DType.F32)


def sum_(x: Node, axes: list[int], keepdim: bool = False) -> Node:
    return build.reduce(Op.SUM_REDUCE, x, axes, keepdim)


def amax(x: Node, axes: list[int], keepdim: bool = False) -> Node:
    return build.reduce(Op.MAX_REDUCE, x, axes, keepdim)


def mean(x: Node, axes: list[int], keepdim: bool = False) -> Node:
    total = sum_(x, axes, keepdim)
    return m.div(total, build.cast(count(x, axes), total.dtype))


@register_lowering(aten.sum.dim_IntList, aten.sum.default)
def lower_sum(ctx: LowerCtx, x, dims=None, keepdim=False, dtype=None):
    work = opmath(ctx.out_dtype) if ctx.out_dtype is not DType.BOOL else DType.I64
    return build.cast(sum_(build.cast(x, work), _axes(x, dims), keepdim), ctx.out_dtype)


@register_lowering(aten.mean.dim, aten.mean.default)
def lower_mean(ctx: LowerCtx, x, dims=None, keepdim=False, dtype=None):
    return build.cast(mean(build.cast(x, opmath(ctx.out_dtype)), _axes(x, dims), keepdim),
                      ctx.out_dtype)


@register_lowering(aten.amax.default)
def lower_amax(ctx: LowerCtx, x, dims=(), keepdim=False):
    return amax(x, _axes(x, dims), keepdim)


@register_lowering(aten.amin.default)
def lower_amin(ctx: LowerCtx, x, dims=(), keepdim=False):
    if x.dtype is DType.BOOL:
        return m.logical_not(amax(m.logical_not(x), _axes(x, dims), keepdim))
    return m.neg(amax(m.neg(x), _axes(x, dims), keepdim))


def arg_best(x: Node, axis: int, keepdim: bool, largest: bool) -> tuple[Node, Node]:
    """(values, first index of the max or min) along one axis, as torch.max(dim) returns."""
    y = x if largest else (m.neg(x) if x.dtype is not DType.BOOL else m.logical_not(x))
    best = amax(y, [axis], keepdim=True)
    n = x.shape[axis]
    idx = build.reshape(build.iota(n), tuple(n if i == axis else Expr.of(1) for i in range(x.rank)))
    idx = build.broadcast_to(idx, x.shape)
    # the first index reaching the best: max over (n - i) where equal
    hit = m.where(m.eq(y, build.broadcast_to(best, x.shape)), m.sub(build.broadcast_to(
        build.cast(build.scalar_of(n), DType.I64), x.shape), idx), build.constant(0, DType.I64, x.shape))
    first = m.sub(build.cast(build.scalar_of(n), DType.I64), amax(hit, [axis], keepdim))
    values = build.reduce(Op.MAX_REDUCE, y, [axis], keepdim)
    values = values if largest else (m.neg(values) if x.dtype is not DType.BOOL else m.logical_not(values))
    return values, first


@register_lowering(aten.max.dim)
def lower_max_dim(ctx: LowerCtx, x, dim, keepdim=False):
    return arg_best(x, dim % x.rank, keepdim, largest=True)


@register_lowering(aten.min.dim)
def lower_min_dim(ctx: LowerCtx, x, dim, keepdim=False):
    return arg_best(x, dim % x.rank, keepdim, largest=False)


@register_lowering(aten.max.default)
def lower_max(ctx: LowerCtx, x):
    return amax(x, _axes(x, None))


@register_lowering(aten.min.default)
def lower_min(ctx: LowerCtx, x):
    return lower_amin(ctx, x, None)


def _arg(ctx: LowerCtx, x, dim, keepdim, largest):
    if dim is None:
        flat = build.reshape(x, (prod(x.shape),))
        return arg_best(flat, 0, False, largest)[1]
    return arg_best(x, dim % x.rank, keepdim, largest)[1]


@register_lowering(aten.argmax.default)
def lower_argmax(ctx: LowerCtx, x, dim=None, keepdim=False):
    return _arg(ctx, x, dim, keepdim, largest=True)


@register_lowering(aten.argmin.default)
def lower_argmin(ctx: LowerCtx, x, dim=None, keepdim=False):
    return _arg(ctx, x, dim, keepdim, largest=False)


@register_lowering(aten.any.dim, aten.any.dims, aten.any.default)
def lower_any(ctx: LowerCtx, x, dims=None, keepdim=False):
    return amax(m.to_bool(x), _axes(x, dims), keepdim)


@register_lowering(aten.all.dim, aten.all.dims, aten.all.default)
def lower_all(ctx: LowerCtx, x, dims=None, keepdim=False):
    return m.logical_not(amax(m.logical_not(m.to_bool(x)), _axes(x, dims), keepdim))


@register_lowering(aten.var.correction, aten.var.dim)
def lower_var(ctx: LowerCtx, x, dims=None, unbiased=None, keepdim=False, correction=None):
    return build.cast(_var(x, dims, unbiased, correction, keepdim)[0], ctx.out_dtype)


@register_lowering(aten.var_mean.correction)
def lower_var_mean(ctx: LowerCtx, x, dims=None, correction=None, keepdim=False):
    var, mu = _var(x, dims, None, correction, keepdim)
    return build.cast(var, ctx.out_dtype), build.cast(mu, ctx.out_dtype)


def _var(x: Node, dims, unbiased, correction, keepdim):
    y = build.cast(x, opmath(x.dtype))
    axes = _axes(y, dims)
    mu = mean(y, axes, keepdim=True)
    centered = m.sub(y, mu)
    ddof = 1 if correction is None and unbiased in (None, True) else (correction or 0)
    n = m.sub(count(y, axes), build.constant(ddof, DType.F32))
    var = m.div(sum_(m.mul(centered, centered), axes, keepdim), n)
    return var, (mu if keepdim else build.reshape(mu, var.shape))


@register_lowering(aten._softmax.default)
def lower_softmax(ctx: LowerCtx, x, dim, half_to_float=False):
    y = build.cast(x, opmath(x.dtype))
    e = m.exp(m.sub(y, amax(y, [dim], keepdim=True)))
    return build.cast(m.div(e, sum_(e, [dim], keepdim=True)), ctx.out_dtype)


@register_lowering(aten._log_softmax.default)
def lower_log_softmax(ctx: LowerCtx, x, dim, half_to_float=False):
    y = build.cast(x, opmath(x.dtype))
    shifted = m.sub(y, amax(y, [dim], keepdim=True))
    return build.cast(m.sub(shifted, m.log(sum_(m.exp(shifted), [dim], keepdim=True))), ctx.out_dtype)


@register_lowering(aten.logsumexp.default)
def lower_logsumexp(ctx: LowerCtx, x, dims, keepdim=False):
    y = build.cast(x, opmath(ctx.out_dtype))
    top = amax(y, _axes(y, dims), keepdim=True)
    # an all -inf row has top = -inf; shift by 0 there so it stays -inf instead of NaN
    top = m.where(m.isnan(m.sub(top, top)), m.c(0, top), top)
    out = m.add(m.log(sum_(m.exp(m.sub(y, top)), _axes(y, dims), keepdim=True)), top)
    return build.cast(build.reshape(out, ctx.out_shape), ctx.out_dtype)


@register_lowering(aten.native_layer_norm.default)
def lower_layer_norm(ctx: LowerCtx, x, normalized_shape, weight, bias, eps):
    y = build.cast(x, opmath(x.dtype))
    axes = list(range(x.rank - len(normalized_shape), x.rank))
    mu = mean(y, axes, keepdim=True)
    centered = m.sub(y, mu)
    rstd = m.recip(m.sqrt(m.add(mean(m.mul(centered, centered), axes, keepdim=True), m.c(eps, y))))
    out = m.mul(centered, rstd)
    if weight is not None:
        out = m.mul(out, build.cast(weight, out.dtype))
    if bias is not None:
        out = m.add(out, build.cast(bias, out.dtype))
    return build.cast(out, x.dtype), mu, rstd


@register_lowering(aten.cumsum.default)
def lower_cumsum(ctx: LowerCtx, x, dim, dtype=None):
    """out[i] = sum_j x[j] * (j <= i): a triangular mask contraction, O(n^2) along the axis."""
    work = opmath(ctx.out_dtype)
    y = build.cast(x, work)
    dim = dim % y.rank if y.rank else 0
    if y.rank == 0:
        return build.cast(y, ctx.out_dtype)
    n = y.shape[dim]
    j, i = build.reshape(build.iota(n), (n, 1)), build.reshape(build.iota(n), (1, n))
    mask = build.cast(m.le(j, i), work)                       # [j, i]
    moved = build.permute(y, [a for a in range(y.rank) if a != dim] + [dim])
    terms = m.mul(build.reshape(moved, moved.shape + (Expr.of(1),)), mask)  # [..., j, i]
    out = sum_(terms, [y.rank - 1])
    back = list(range(y.rank - 1))
    back.insert(dim, y.rank - 1)
    return build.cast(build.permute(out, back), ctx.out_dtype)


def matmul(a: Node, b: Node, out_dtype: DType) -> Node:
    """[..., M, K] @ [..., K, N] as Mul of broadcasts + SumReduce over K, in f32 for f16/bf16."""
    work = opmath(out_dtype)
    a, b = build.cast(a, work), build.cast(b, work)
    a3 = build.reshape(a, a.shape + (Expr.of(1),))            # [..., M, K, 1]
    b3 = build.reshape(b, b.shape[:-2] + (Expr.of(1),) + b.shape[-2:])  # [..., 1, K, N]
    product = m.mul(a3, b3)                                   # [..., M, K, N]
    return build.cast(Node(Op.SUM_REDUCE, [product], axis=product.rank - 2), out_dtype)


@register_lowering(aten.mm.default, aten.bmm.default)
def lower_mm(ctx: LowerCtx, a, b):
    return matmul(a, b, ctx.out_dtype)


@register_lowering(aten.addmm.default)
def lower_addmm(ctx: LowerCtx, bias, a, b, beta=1, alpha=1):
    work = opmath(ctx.out_dtype)
    out = matmul(a, b, work)
    if alpha != 1:
        out = m.mul(out, m.c(alpha, out))
    scaled_bias = build.cast(bias, work) if beta == 1 else m.mul(build.cast(bias, work), m.c(beta, out))
    return build.cast(m.add(out, scaled_bias), ctx.out_dtype)


@register_lowering(aten.baddbmm.default)
def lower_baddbmm(ctx: LowerCtx, bias, a, b, beta=1, alpha=1):
    return lower_addmm(ctx, bias, a, b, beta, alpha)
