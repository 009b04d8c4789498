"""Tensor factories: constants broadcast to a shape, and ranges as Iota."""
from __future__ import annotations

from ...ir import DType, Expr, Node
from ...ir import build
from .. import math as m
from ..registry import LowerCtx, aten, register_lowering, unsupported


@register_lowering(aten.full.default, aten.new_full.default)
def lower_full(ctx: LowerCtx, *args, **kwargs):
    fill = args[-1]
    if isinstance(fill, Expr):
        return build.broadcast_to(build.cast(build.scalar_of(fill), ctx.out_dtype), ctx.out_shape)
    return build.constant(fill, ctx.out_dtype, ctx.out_shape)


@register_lowering(aten.full_like.default)
def lower_full_like(ctx: LowerCtx, x, fill, **kwargs):
    return lower_full(ctx, fill)


@register_lowering(aten.zeros.default, aten.zeros_like.default, aten.new_zeros.default,
                   aten.empty.memory_format, aten.empty_like.default, aten.new_empty.default,
                   aten.empty_strided.default, aten.new_empty_strided.default, aten.empty_permuted.default)
def lower_zeros(ctx: LowerCtx, *args, **kwargs):
    # empty tensors hold unspecified values; zeros keep the reference deterministic
    return build.constant(0, ctx.out_dtype, ctx.out_shape)


@register_lowering(aten.ones.default, aten.ones_like.default, aten.new_ones.default)
def lower_ones(ctx: LowerCtx, *args, **kwargs):
    return build.constant(1, ctx.out_dtype, ctx.out_shape)


@register_lowering(aten.scalar_tensor.default)
def lower_scalar_tensor(ctx: LowerCtx, value, **kwargs):
    return lower_full(ctx, value)


@register_lowering(aten.arange.start_step, aten.arange.default, aten.arange.start)
def lower_arange(ctx: LowerCtx, *args, **kwargs):
    numbers = [a for a in args if isinstance(a, (int, float, Expr))]
    start, step = (numbers[0] if len(numbers) > 1 else 0), (numbers[2] if len(numbers) > 2 else 1)
    length = ctx.out_shape[0]
    if ctx.out_dtype.is_int and not any(isinstance(v, float) for v in (start, step)):
        return build.iota(length, ctx.out_dtype, start=start, step=step)
    # float ranges: start + i * step, computed in f32 then rounded once
    i = build.cast(build.iota(length), DType.F32)
    values = m.add(m.mul(i, _f32(step)), _f32(start))
    return build.cast(values, ctx.out_dtype)


def _f32(value) -> Node:
    if isinstance(value, Expr):
        return build.cast(build.scalar_of(value), DType.F32)
    return build.constant(value, DType.F32)


def _triangle(ctx: LowerCtx, x: Node, diagonal, lower: bool) -> Node:
    rows, cols = x.shape[-2], x.shape[-1]
    i = build.reshape(build.iota(rows), (rows, 1))
    j = build.reshape(build.iota(cols), (1, cols))
    offset = m.sub(j, i)                                             # col - row
    bound = build.constant(diagonal, DType.I64)
    keep = m.le(offset, bound) if lower else m.le(bound, offset)
    return m.where(keep, x, build.constant(0, x.dtype))


@register_lowering(aten.tril.default)
def lower_tril(ctx: LowerCtx, x, diagonal=0):
    return _triangle(ctx, x, diagonal, lower=True)


@register_lowering(aten.triu.default)
def lower_triu(ctx: LowerCtx, x, diagonal=0):
    return _triangle(ctx, x, diagonal, lower=False)


# random numbers: a Kiln graph is deterministic, checked against the reference (export in eval mode,
# where dropout is the identity; sample outside the graph)
for _target in (aten.rand.default, aten.randn.default, aten.rand_like.default, aten.randn_like.default,
                aten.randint_like.default, aten.randint_like.low_dtype, aten.bernoulli.p,
                aten.bernoulli.default, aten.native_dropout.default, aten.normal.Tensor_Tensor,
                aten.normal_functional.default, aten.uniform.default, aten.exponential.default,
                aten.multinomial.default, aten.rrelu_with_noise_functional.default):
    unsupported(_target, "random numbers: Kiln graphs are deterministic (export in eval mode)")
