"""Elementwise ATen ops: one line each, on top of `frontend.math`.

Arguments are promoted the way PyTorch promotes them, f16/bf16 compute in f32 (PyTorch's
"opmath"), and the result is cast to the dtype torch.export recorded for the node.
"""
from __future__ import annotations

import math as pymath
from typing import Callable

from ...ir import DType, Node, Op, UnsupportedOp
from ...ir.ops import VIEWS
from ...ir import build
from ...ir.symbolic import Expr
from .. import math as m
from ..registry import LowerCtx, aten, register_lowering, unsupported

_RANK = {DType.BOOL: 0, DType.I32: 1, DType.I64: 1, DType.F16: 2, DType.BF16: 2, DType.F32: 2}


def promote(args) -> DType:
    """torch's result type for tensors and Python scalars (0-d tensors count as tensors)."""
    tensors = [a.dtype for a in args if isinstance(a, Node)]
    scalars = [a for a in args if not isinstance(a, Node) and a is not None]
    top = max((_RANK[d] for d in tensors), default=-1)
    scalar_top = max((2 if isinstance(s, float) else 0 if isinstance(s, bool) else 1 for s in scalars),
                     default=-1)
    if scalar_top > top:
        return {2: DType.F32, 1: DType.I64, 0: DType.BOOL}[scalar_top]
    best = [d for d in tensors if _RANK[d] == top]
    if top == 2:
        return best[0] if len(set(best)) == 1 else DType.F32
    if top == 1:
        return DType.I64 if DType.I64 in best else DType.I32
    return DType.BOOL


def opmath(dtype: DType) -> DType:
    return DType.F32 if dtype in (DType.F16, DType.BF16) else dtype


def operands(ctx: LowerCtx, args, dtype: DType) -> list[Node]:
    out = []
    for a in args:
        if isinstance(a, Node):
            out.append(build.cast(a, dtype))
        elif isinstance(a, Expr):
            out.append(build.cast(build.scalar_of(a), dtype))
        else:
            out.append(build.constant(a, dtype))
    return out


def pointwise(fn: Callable[..., Node], *targets, float_only: bool = False) -> None:
    """Register fn(*operands) for targets: operands promoted, computed in opmath, cast to the output."""
    def lower(ctx: LowerCtx, *args, **kwargs):
        args = args + tuple(kwargs.values())
        dtype = promote(args)
        if float_only and not dtype.is_float:
            dtype = DType.F32
        result = fn(*operands(ctx, args, opmath(dtype)))
        return build.cast(result, ctx.out_dtype)
    lower.__name__ = f"lower_{fn.__name__}"
    register_lowering(*targets)(lower)


def _scaled(fn):
    """aten.add/sub with alpha: a + alpha * b."""
    def with_alpha(a, b, alpha=None):
        return fn(a, b if alpha is None else m.mul(b, alpha))
    with_alpha.__name__ = fn.__name__
    return with_alpha


# arithmetic
pointwise(_scaled(m.add), aten.add.Tensor, aten.add.Scalar)
pointwise(_scaled(m.sub), aten.sub.Tensor, aten.sub.Scalar)
pointwise(lambda a, b, alpha=None: m.sub(b, a if alpha is None else m.mul(a, alpha)),
          aten.rsub.Tensor, aten.rsub.Scalar)
pointwise(m.mul, aten.mul.Tensor, aten.mul.Scalar)
pointwise(m.div, aten.div.Tensor, aten.div.Scalar, float_only=True)
pointwise(m.neg, aten.neg.default)
pointwise(m.recip, aten.reciprocal.default, float_only=True)
pointwise(m.remainder, aten.remainder.Tensor, aten.remainder.Scalar)
pointwise(m.fmod, aten.fmod.Tensor, aten.fmod.Scalar)
pointwise(m.floor_divide, aten.floor_divide.default)
pointwise(m.pow_, aten.pow.Tensor_Tensor, aten.pow.Scalar)
pointwise(m.abs_, aten.abs.default)
pointwise(m.sign, aten.sign.default)
pointwise(m.maximum, aten.maximum.default)
pointwise(m.minimum, aten.minimum.default)
pointwise(m.floor, aten.floor.default)
pointwise(m.ceil, aten.ceil.default)
pointwise(m.trunc, aten.trunc.default)
pointwise(m.round_half_even, aten.round.default)

# transcendental
pointwise(m.exp, aten.exp.default, float_only=True)
pointwise(lambda x: m.unary(Op.EXP2, x), aten.exp2.default, float_only=True)
pointwise(m.expm1, aten.expm1.default, float_only=True)
pointwise(m.log, aten.log.default, float_only=True)
pointwise(lambda x: m.unary(Op.LOG2, x), aten.log2.default, float_only=True)
pointwise(lambda x: m.mul(m.unary(Op.LOG2, x), m.c(pymath.log10(2), x)), aten.log10.default,
          float_only=True)
pointwise(m.log1p, aten.log1p.default, float_only=True)
pointwise(m.sqrt, aten.sqrt.default, float_only=True)
pointwise(lambda x: m.recip(m.sqrt(x)), aten.rsqrt.default, float_only=True)
pointwise(lambda x: m.unary(Op.SIN, x), aten.sin.default, float_only=True)
pointwise(m.cos, aten.cos.default, float_only=True)
pointwise(m.tan, aten.tan.default, float_only=True)
pointwise(m.asin, aten.asin.default, float_only=True)
pointwise(m.acos, aten.acos.default, float_only=True)
pointwise(m.atan, aten.atan.default, float_only=True)
pointwise(m.atan2, aten.atan2.default, float_only=True)
pointwise(m.sinh, aten.sinh.default, float_only=True)
pointwise(m.cosh, aten.cosh.default, float_only=True)
pointwise(m.asinh, aten.asinh.default, float_only=True)
pointwise(m.acosh, aten.acosh.default, float_only=True)
pointwise(m.atanh, aten.atanh.default, float_only=True)
pointwise(m.sigmoid, aten.sigmoid.default, float_only=True)
pointwise(m.tanh, aten.tanh.default, float_only=True)
pointwise(m.erf, aten.erf.default, float_only=True)
pointwise(m.erfinv, aten.erfinv.default, float_only=True)
pointwise(m.elu, aten.elu.default, float_only=True)

# comparisons and logic (bool results)
pointwise(m.lt, aten.lt.Tensor, aten.lt.Scalar)
pointwise(lambda a, b: m.lt(b, a), aten.gt.Tensor, aten.gt.Scalar)
pointwise(m.le, aten.le.Tensor, aten.le.Scalar)
pointwise(lambda a, b: m.le(b, a), aten.ge.Tensor, aten.ge.Scalar)
pointwise(m.eq, aten.eq.Tensor, aten.eq.Scalar)
pointwise(m.ne, aten.ne.Tensor, aten.ne.Scalar)
pointwise(m.logical_not, aten.logical_not.default)
pointwise(m.logical_and, aten.logical_and.default)
pointwise(m.logical_or, aten.logical_or.default)
pointwise(m.logical_xor, aten.logical_xor.default)
pointwise(m.isnan, aten.isnan.default)
pointwise(m.isinf, aten.isinf.default)


def _zero_one(x: Node) -> bool:
    """Whether every value of x is 0 or 1: a bool (widened, viewed) or such a constant."""
    while x.dtype is not DType.BOOL and (x.op is Op.CAST or x.op in VIEWS):
        x = x.inputs[0]
    return x.dtype is DType.BOOL or (x.op is Op.CONSTANT and x.attrs["value"] in (0, 1))


def _bitwise(logic, with_bit):
    """A bitwise op: on bools the logic op; on integers where one operand is 0 or 1 (a bool
    mask widened, CPM-Ant's attention mask), `with_bit(x, b, bit)` in arithmetic from x's lowest
    bit (Python's x % 2: 0 or 1 at either sign, two's complement); two general integers have no
    primitive."""
    def lower(a, b):
        if a.dtype is DType.BOOL:
            return logic(a, b)
        if not _zero_one(b):
            a, b = b, a
        if not _zero_one(b):
            raise_unsupported_bitwise()
        return with_bit(a, b, m.remainder(a, m.c(2, a)))
    lower.__name__ = logic.__name__
    return lower


def raise_unsupported_bitwise():
    raise UnsupportedOp("kiln: bitwise ops on two integers have no primitive (only bool operands, or an "
                        "integer with a bool or a 0/1 constant, lower)")


pointwise(_bitwise(m.logical_and, lambda x, b, bit: m.mul(b, bit)),
          aten.bitwise_and.Tensor, aten.bitwise_and.Scalar)
pointwise(_bitwise(m.logical_or, lambda x, b, bit: m.add(x, m.mul(b, m.sub(m.c(1, x), bit)))),
          aten.bitwise_or.Tensor, aten.bitwise_or.Scalar)
pointwise(_bitwise(m.logical_xor, lambda x, b, bit: m.add(x, m.mul(b, m.sub(m.c(1, x), m.mul(m.c(2, x), bit))))),
          aten.bitwise_xor.Tensor, aten.bitwise_xor.Scalar)
# ~x = -x - 1 in two's complement, wrapping alike at the most negative value
pointwise(lambda x: m.logical_not(x) if x.dtype is DType.BOOL else m.sub(m.neg(x), m.c(1, x)),
          aten.bitwise_not.default)
unsupported(aten.bitwise_left_shift.Tensor, "no shift primitive")
unsupported(aten.bitwise_right_shift.Tensor, "no shift primitive")

# functions without a primitive formulation accurate to f32 yet (each needs range-split series)
for _target in (aten.erfc.default, aten.erfinv.default, aten.lgamma.default, aten.digamma.default,
                aten.polygamma.default, aten.i0.default, aten.special_i0e.default, aten.special_i1.default,
                aten.special_i1e.default, aten.special_erfcx.default, aten.special_ndtri.default,
                aten.igamma.default, aten.igammac.default, aten.special_zeta.default):
    unsupported(_target, "a special function with no accurate formulation in Kiln's primitives yet")
for _target in (aten.nextafter.default, aten.frexp.Tensor, aten.ldexp.Tensor, aten.signbit.default,
                aten.copysign.Tensor):
    unsupported(_target, "reads or writes the float's bits; no bit-level primitive")
for _target in (aten.complex.default, aten.polar.default, aten.view_as_complex.default,
                aten.view_as_real.default, aten._conj.default, aten.angle.default, aten._fft_r2c.default,
                aten._fft_c2c.default, aten._fft_c2r.default):
    unsupported(_target, "complex numbers: Kiln's dtypes are real")


@register_lowering(aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar)
def lower_where(ctx: LowerCtx, cond, a, b):
    dtype = ctx.out_dtype
    a, b = operands(ctx, (a, b), dtype)
    return m.where(build.cast(cond, DType.BOOL), a, b)


@register_lowering(aten.div.Tensor_mode)
def lower_div_mode(ctx: LowerCtx, a, b, rounding_mode=None):
    fn = {None: m.div, "trunc": m.trunc_divide, "floor": m.floor_divide}[rounding_mode]
    dtype = promote([a, b])
    if rounding_mode is None and not dtype.is_float:
        dtype = DType.F32
    return build.cast(fn(*operands(ctx, [a, b], opmath(dtype))), ctx.out_dtype)


@register_lowering(aten.clamp.default, aten.clamp.Tensor)
def lower_clamp(ctx: LowerCtx, x, lo=None, hi=None):
    dtype = opmath(promote([x, lo, hi]))
    x, = operands(ctx, [x], dtype)
    if lo is not None:
        x = m.maximum(x, operands(ctx, [lo], dtype)[0])
    if hi is not None:
        x = m.minimum(x, operands(ctx, [hi], dtype)[0])
    return build.cast(x, ctx.out_dtype)


@register_lowering(aten.relu.default)
def lower_relu(ctx: LowerCtx, x):
    return m.maximum(x, m.c(0, x))


@register_lowering(aten.hardtanh.default)
def lower_hardtanh(ctx: LowerCtx, x, lo=-1.0, hi=1.0):
    return lower_clamp(ctx, x, lo, hi)


@register_lowering(aten.leaky_relu.default)
def lower_leaky_relu(ctx: LowerCtx, x, slope=0.01):
    return m.where(m.lt(m.c(0, x), x), x, m.mul(x, m.c(slope, x)))


@register_lowering(aten.gelu.default)
def lower_gelu(ctx: LowerCtx, x, approximate="none"):
    y = build.cast(x, opmath(x.dtype))
    if approximate == "tanh":
        inner = m.mul(m.c(pymath.sqrt(2 / pymath.pi), y),
                      m.add(y, m.mul(m.c(0.044715, y), m.mul(y, m.mul(y, y)))))
        cdf = m.mul(m.c(0.5, y), m.add(m.c(1, y), m.tanh(inner)))
    else:
        cdf = m.mul(m.c(0.5, y), m.add(m.c(1, y), m.erf(m.mul(y, m.c(pymath.sqrt(0.5), y)))))
    return build.cast(m.mul(y, cdf), x.dtype)


@register_lowering(aten._to_copy.default, aten.clone.default, aten.alias.default,
                   aten.lift_fresh_copy.default, aten.detach.default, aten.contiguous.default)
def lower_copy(ctx: LowerCtx, x, *args, **kwargs):
    """Copies and dtype conversions: values flow through, cast to the recorded dtype."""
    return build.cast(x, ctx.out_dtype)


@register_lowering(aten.copy.default)
def lower_copy_into(ctx: LowerCtx, dst, src, non_blocking=False):
    """The functional copy_: src's values (broadcast) in dst's shape and dtype."""
    return build.cast(build.broadcast_to(src, dst.shape), ctx.out_dtype)


@register_lowering(aten.pow.Tensor_Scalar)
def lower_pow_scalar(ctx: LowerCtx, x, exponent):
    """A constant exponent: square-and-multiply or sqrt where it is exact, exp2/log2 otherwise."""
    dtype = opmath(promote([x, exponent]))
    return build.cast(m.pow_(build.cast(x, dtype), exponent), ctx.out_dtype)
