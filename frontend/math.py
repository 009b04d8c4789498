"""Composite math in primitives: what PyTorch calls one op, Kiln writes with the ~16 it has.

Every function takes and returns `Node`s (broadcasting like NumPy) and works in the dtype of its
inputs; callers pick the compute dtype (f32 for f16/bf16, as PyTorch's CPU kernels do).
"""
from __future__ import annotations

import math

from ..ir import DType, Node, Op
from ..ir import build

LOG2E = 1.0 / math.log(2.0)
LN2 = math.log(2.0)


def c(value, like: Node) -> Node:
    return build.constant(value, like.dtype)


def add(a: Node, b: Node) -> Node:
    return build.elementwise(Op.ADD, a, b)


def mul(a: Node, b: Node) -> Node:
    return build.elementwise(Op.MUL, a, b)


def lt(a: Node, b: Node) -> Node:
    return build.elementwise(Op.LESS_THAN, a, b)


def where(cond: Node, a: Node, b: Node) -> Node:
    return build.elementwise(Op.WHERE, cond, a, b)


def unary(op: Op, x: Node) -> Node:
    return Node(op, [x])


def recip(x: Node) -> Node:
    return unary(Op.RECIP, x)


def sqrt(x: Node) -> Node:
    return unary(Op.SQRT, x)


def fmod(a: Node, b: Node) -> Node:
    return build.elementwise(Op.MOD, a, b)


def neg(x: Node) -> Node:
    return mul(x, c(-1, x)) if x.dtype is not DType.BOOL else logical_not(x)


def sub(a: Node, b: Node) -> Node:
    return add(a, neg(b))


def div(a: Node, b: Node) -> Node:
    return mul(a, recip(b))


# --- logic ------------------------------------------------------------------------------------
def logical_not(x: Node) -> Node:
    return where(to_bool(x), build.constant(False, DType.BOOL), build.constant(True, DType.BOOL))


def to_bool(x: Node) -> Node:
    if x.dtype is DType.BOOL:
        return x
    return logical_not(eq(x, c(0, x)))


def logical_and(a: Node, b: Node) -> Node:
    return mul(to_bool(a), to_bool(b))


def logical_or(a: Node, b: Node) -> Node:
    return add(to_bool(a), to_bool(b))


def logical_xor(a: Node, b: Node) -> Node:
    a, b = to_bool(a), to_bool(b)
    return logical_or(lt(a, b), lt(b, a))


def isnan(x: Node) -> Node:
    if not x.dtype.is_float:
        return build.constant(False, DType.BOOL, x.shape)
    # NaN is the one value that compares false with both infinities
    return logical_not(logical_or(lt(x, c(math.inf, x)), lt(c(-math.inf, x), x)))


def eq(a: Node, b: Node) -> Node:
    neither = logical_not(logical_or(lt(a, b), lt(b, a)))
    return logical_and(neither, logical_not(isnan(a))) if a.dtype.is_float else neither


def ne(a: Node, b: Node) -> Node:
    return logical_not(eq(a, b))


def le(a: Node, b: Node) -> Node:
    return logical_or(lt(a, b), eq(a, b))


def maximum(a: Node, b: Node) -> Node:
    return where(lt(a, b), b, a)


def minimum(a: Node, b: Node) -> Node:
    return where(lt(b, a), b, a)


def abs_(x: Node) -> Node:
    return where(lt(x, c(0, x)), neg(x), x)


def sign(x: Node) -> Node:
    return sub(build.cast(lt(c(0, x), x), x.dtype), build.cast(lt(x, c(0, x)), x.dtype))


# --- transcendental ---------------------------------------------------------------------------
def exp(x: Node) -> Node:
    return unary(Op.EXP2, mul(x, c(LOG2E, x)))


def log(x: Node) -> Node:
    return mul(unary(Op.LOG2, x), c(LN2, x))


def sigmoid(x: Node) -> Node:
    return recip(add(c(1, x), exp(neg(x))))


def tanh(x: Node) -> Node:
    return sub(mul(c(2, x), sigmoid(mul(c(2, x), x))), c(1, x))


def cos(x: Node) -> Node:
    # reduce the range first so that a large angle keeps its precision when shifted by pi/2
    return unary(Op.SIN, add(fmod(x, c(2 * math.pi, x)), c(math.pi / 2, x)))


def erf(x: Node) -> Node:
    """Abramowitz & Stegun 7.1.26: |error| < 1.5e-7 on the whole line."""
    a1, a2, a3, a4, a5, p = 0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429, 0.3275911
    ax = abs_(x)
    t = recip(add(c(1, x), mul(c(p, x), ax)))
    poly = c(a5, x)
    for coeff in (a4, a3, a2, a1):
        poly = add(mul(poly, t), c(coeff, x))
    y = sub(c(1, x), mul(mul(poly, t), exp(neg(mul(ax, ax)))))
    return where(lt(x, c(0, x)), neg(y), y)


def floor(x: Node) -> Node:
    if not x.dtype.is_float:
        return x
    truncated = sub(x, fmod(x, c(1, x)))
    return where(lt(x, truncated), sub(truncated, c(1, x)), truncated)


def ceil(x: Node) -> Node:
    return neg(floor(neg(x))) if x.dtype.is_float else x


def trunc(x: Node) -> Node:
    return sub(x, fmod(x, c(1, x))) if x.dtype.is_float else x


def round_half_even(x: Node) -> Node:
    r = floor(add(x, c(0.5, x)))
    tie = eq(sub(r, x), c(0.5, x))
    odd = ne(fmod(r, c(2, x)), c(0, x))
    return where(logical_and(tie, odd), sub(r, c(1, x)), r)


def remainder(a: Node, b: Node) -> Node:
    """Python's %: the sign of the divisor."""
    r = fmod(a, b)
    fix = logical_and(ne(r, c(0, r)), logical_xor(lt(r, c(0, r)), lt(b, c(0, b))))
    return where(fix, add(r, b), r)


def floor_divide(a: Node, b: Node) -> Node:
    if a.dtype.is_float:
        return floor(div(sub(a, remainder(a, b)), b))
    # integers: (a - a mod b) is an exact multiple of b; f32 divides it exactly below 2**24
    exact = build.cast(sub(a, remainder(a, b)), DType.F32)
    return build.cast(round_half_even(div(exact, build.cast(b, DType.F32))), a.dtype)


def pow_(x: Node, y: Node | float) -> Node:
    if not isinstance(y, Node):
        return _pow_scalar(x, float(y))
    magnitude = unary(Op.EXP2, mul(y, unary(Op.LOG2, abs_(x))))
    y_is_int = eq(floor(y), y)
    y_is_odd = ne(fmod(y, c(2, y)), c(0, y))
    negative = where(y_is_int, where(y_is_odd, neg(magnitude), magnitude), c(math.nan, x))
    out = where(lt(x, c(0, x)), negative, magnitude)
    return where(eq(y, c(0, y)), c(1, x), out)


def _pow_scalar(x: Node, y: float) -> Node:
    if y == 0.5:
        return sqrt(x)
    if y == -0.5:
        return recip(sqrt(x))
    if y == 0:
        return build.constant(1, x.dtype, x.shape)
    if y == int(y) and abs(y) <= 64:
        n, result, base = abs(int(y)), None, x
        while n:  # square-and-multiply
            if n & 1:
                result = base if result is None else mul(result, base)
            n >>= 1
            if n:
                base = mul(base, base)
        return recip(result) if y < 0 else result
    return pow_(x, c(y, x))
