"""Softmax and the normalization layers: statistics in f32 (opmath), the result in the input's dtype."""
from __future__ import annotations

from ...ir import DType, Expr, Node
from ...ir import build
from ...ir.symbolic import prod
from .. import math as m
from ..registry import LowerCtx, aten, register_lowering
from ...ir.tensors import kiln_dtype
from .pointwise import opmath
from .reductions import amax, count, mean, reduce_axes, sum_


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
    top = amax(y, reduce_axes(y, dims), keepdim=True)
    # an all -inf row has top = -inf; shift by 0 there so it stays -inf instead of NaN
    top = m.where(m.isnan(m.sub(top, top)), m.c(0, top), top)
    out = m.add(m.log(sum_(m.exp(m.sub(y, top)), reduce_axes(y, dims), keepdim=True)), top)
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
    return _as_recorded(ctx, out, mu, rstd)




def _as_recorded(ctx: LowerCtx, *outs: Node) -> tuple[Node, ...]:
    """Each output in the dtype torch.export recorded for it: the statistics, computed in f32,
    come back in the input's dtype as torch returns them."""
    return tuple(build.cast(o, kiln_dtype(v.dtype)) for o, v in zip(outs, ctx.val))


def _per_channel(v: Node | None, like: Node) -> Node | None:
    """A [C] vector shaped to broadcast along axis 1 of like ([N, C, ...])."""
    if v is None:
        return None
    return build.reshape(build.cast(v, like.dtype), (v.shape[0],) + (Expr.of(1),) * (like.rank - 2))


def _affine(y: Node, weight: Node | None, bias: Node | None) -> Node:
    if weight is not None:
        y = m.mul(y, weight)
    return y if bias is None else m.add(y, bias)


def _batch_stats(y: Node) -> tuple[Node, Node, list[int]]:
    """Mean and biased variance per channel (axis 1) over the batch and spatial axes."""
    axes = [a for a in range(y.rank) if a != 1]
    mu = mean(y, axes, keepdim=True)
    centered = m.sub(y, mu)
    return mu, mean(m.mul(centered, centered), axes, keepdim=True), axes


@register_lowering(aten._native_batch_norm_legit_no_training.default)
def lower_batch_norm_eval(ctx: LowerCtx, x, weight, bias, running_mean, running_var, momentum, eps):
    y = build.cast(x, opmath(x.dtype))
    mu, var = _per_channel(running_mean, y), _per_channel(running_var, y)
    out = _affine(m.mul(m.sub(y, mu), m.recip(m.sqrt(m.add(var, m.c(eps, y))))),
                  _per_channel(weight, y), _per_channel(bias, y))
    empty = build.constant(0, y.dtype, (0,))  # torch returns empty saved statistics in eval mode
    return _as_recorded(ctx, out, empty, empty)


@register_lowering(aten._native_batch_norm_legit_functional.default, aten._native_batch_norm_legit.no_stats)
def lower_batch_norm_train(ctx: LowerCtx, x, weight, bias, *rest):
    """Training mode: normalize by the batch's statistics; the functional form also returns the
    running statistics updated with momentum (the variance unbiased, as torch keeps it)."""
    running_mean, running_var = rest[:2] if len(rest) == 5 else (None, None)
    momentum, eps = rest[-2:]
    y = build.cast(x, opmath(x.dtype))
    mu, var, axes = _batch_stats(y)
    rstd = m.recip(m.sqrt(m.add(var, m.c(eps, y))))
    out = _affine(m.mul(m.sub(y, mu), rstd), _per_channel(weight, y), _per_channel(bias, y))
    channels = (x.shape[1],)
    outs = [out, build.reshape(mu, channels), build.reshape(rstd, channels)]
    if running_mean is not None and len(ctx.val) == 5:
        n = count(y, axes)
        unbiased = m.mul(build.reshape(var, channels), m.div(n, m.maximum(m.sub(n, m.c(1, n)), m.c(0, n))))
        keep = m.c(1 - momentum, n)
        for old, new in ((running_mean, build.reshape(mu, channels)), (running_var, unbiased)):
            updated = m.add(m.mul(build.cast(old, DType.F32), keep), m.mul(new, m.c(momentum, n)))
            outs.append(updated)
    return _as_recorded(ctx, *outs)


@register_lowering(aten.native_group_norm.default)
def lower_group_norm(ctx: LowerCtx, x, weight, bias, n, channels, spatial, groups, eps):
    """Statistics over each group of channels and all spatial positions: x as [N, G, C/G * HW]."""
    y = build.cast(x, opmath(x.dtype))
    grouped = build.reshape(y, (x.shape[0], Expr.of(groups), x.shape[1] // groups * prod(x.shape[2:])))
    mu = mean(grouped, [2], keepdim=True)
    centered = m.sub(grouped, mu)
    rstd = m.recip(m.sqrt(m.add(mean(m.mul(centered, centered), [2], keepdim=True), m.c(eps, y))))
    normed = build.reshape(m.mul(centered, rstd), y.shape)
    out = _affine(normed, _per_channel(weight, y), _per_channel(bias, y))
    stats = (x.shape[0], Expr.of(groups))
    return _as_recorded(ctx, out, build.reshape(mu, stats), build.reshape(rstd, stats))

