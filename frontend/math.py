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


def isinf(x: Node) -> Node:
    if not x.dtype.is_float:
        return build.constant(False, DType.BOOL, x.shape)
    return eq(abs_(x), c(math.inf, x))


def eq(a: Node, b: Node) -> Node:
    neither = logical_not(logical_or(lt(a, b), lt(b, a)))
    return logical_and(neither, logical_not(isnan(a))) if a.dtype.is_float else neither


def ne(a: Node, b: Node) -> Node:
    return logical_not(eq(a, b))


def le(a: Node, b: Node) -> Node:
    return logical_or(lt(a, b), eq(a, b))


def _may_be_nan(x: Node) -> bool:
    while x.op in (Op.EXPAND, Op.RESHAPE):
        x = x.inputs[0]
    return x.dtype.is_float and not (x.op is Op.CONSTANT and not math.isnan(x.attrs["value"]))


def maximum(a: Node, b: Node) -> Node:
    """NaN if either is NaN, as torch.maximum: the compare alone would pass over a NaN in b."""
    return where(logical_or(lt(a, b), isnan(b)) if _may_be_nan(b) else lt(a, b), b, a)


def minimum(a: Node, b: Node) -> Node:
    return where(logical_or(lt(b, a), isnan(b)) if _may_be_nan(b) else lt(b, a), b, a)


def abs_(x: Node) -> Node:
    return where(lt(x, c(0, x)), neg(x), x)


def sign(x: Node) -> Node:
    if x.dtype is DType.BOOL:
        return x
    return sub(build.cast(lt(c(0, x), x), x.dtype), build.cast(lt(x, c(0, x)), x.dtype))


# --- transcendental ---------------------------------------------------------------------------
def exp(x: Node) -> Node:
    return unary(Op.EXP2, mul(x, c(LOG2E, x)))


def log(x: Node) -> Node:
    return mul(unary(Op.LOG2, x), c(LN2, x))


def log1p(x: Node) -> Node:
    """log(1 + x) keeping a small x that 1 + x rounds away (Goldberg): log(u) * x / (u - 1)."""
    u = add(c(1, x), x)
    scaled = mul(log(u), div(x, sub(u, c(1, x))))
    return where(eq(u, c(1, x)), x, where(eq(u, c(math.inf, x)), u, scaled))


def expm1(x: Node) -> Node:
    """exp(x) - 1 without the cancellation near 0 (Kahan): (u - 1) * x / log(u) with u = exp(x)."""
    u = exp(x)
    less = sub(u, c(1, x))
    scaled = mul(less, div(x, log(u)))
    exact = logical_or(eq(less, c(-1, x)), eq(u, c(math.inf, x)))   # far from 0: u - 1 is right
    return where(eq(u, c(1, x)), x, where(exact, less, scaled))


def elu(x: Node, alpha: Node | None = None, scale: Node | None = None,
        input_scale: Node | None = None) -> Node:
    below = expm1(x if input_scale is None else mul(x, input_scale))
    out = where(lt(c(0, x), x), x, below if alpha is None else mul(below, alpha))
    return out if scale is None else mul(out, scale)


def sigmoid(x: Node) -> Node:
    return recip(add(c(1, x), exp(neg(x))))


def tanh(x: Node) -> Node:
    return sub(mul(c(2, x), sigmoid(mul(c(2, x), x))), c(1, x))


# pi/2 in three parts (Cephes' DP1..DP3, doubled): the first two end in zero bits, so k * part is
# exact and x - k * pi/2 keeps its precision for |x| up to about 8192
_PIO2 = (1.5703125, 4.837512969970703125e-4, 7.54978995489188216e-8)


def _quadrant(x: Node) -> tuple[Node, Node]:
    """(k, r) with x = k * pi/2 + r and |r| <= pi/4 (Cody-Waite reduction)."""
    k = floor(add(mul(x, c(2 / math.pi, x)), c(0.5, x)))
    r = x
    for part in _PIO2:
        r = sub(r, mul(k, c(part, x)))
    return k, r


def cos(x: Node) -> Node:
    """By quadrant: cos(k pi/2 + r) is cos r, -sin r, -cos r, sin r. Shifting to sin(x + pi/2)
    instead rounds the sum: 2e-4 off at rotary-embedding angles (~8000), 100% near the zeros."""
    k, r = _quadrant(x)
    q = remainder(k, c(4, k))
    sin_r, half = unary(Op.SIN, r), unary(Op.SIN, mul(r, c(0.5, r)))
    cos_r = sub(c(1, r), mul(c(2, r), mul(half, half)))            # 1 - 2 sin^2(r/2): no cancellation
    return where(lt(q, c(0.5, q)), cos_r, where(lt(q, c(1.5, q)), neg(sin_r),
                                                where(lt(q, c(2.5, q)), neg(cos_r), sin_r)))


def tan(x: Node) -> Node:
    return div(unary(Op.SIN, x), cos(x))


def atan(x: Node) -> Node:
    """Cephes atanf (~2 ulp): |x| reduced to [0, tan(pi/8)] by atan(x) = pi/2 - atan(1/x) above
    tan(3pi/8) and pi/4 + atan((x - 1) / (x + 1)) above tan(pi/8), then an odd polynomial."""
    ax = abs_(x)
    big = lt(c(2.414213562373095, x), ax)
    mid = logical_and(lt(c(0.4142135623730950, x), ax), logical_not(big))
    r = where(big, neg(recip(ax)), where(mid, div(sub(ax, c(1, x)), add(ax, c(1, x))), ax))
    base = where(big, c(math.pi / 2, x), where(mid, c(math.pi / 4, x), c(0, x)))
    z = mul(r, r)
    poly = c(8.05374449538e-2, x)
    for coeff in (-1.38776856032e-1, 1.99777106478e-1, -3.33329491539e-1):
        poly = add(mul(poly, z), c(coeff, x))
    y = add(base, add(mul(mul(poly, z), r), r))
    return where(lt(x, c(0, x)), neg(y), y)


def atan2(y: Node, x: Node) -> Node:
    """atan(y / x) moved to x's half-plane; the axes and the four infinite corners exactly."""
    y, x = build.broadcast(y, x)
    pi = c(math.pi, x)
    angle = atan(div(y, x))
    angle = where(lt(x, c(0, x)), where(lt(y, c(0, y)), sub(angle, pi), add(angle, pi)), angle)
    on_axis = where(lt(c(0, y), y), c(math.pi / 2, x), where(lt(y, c(0, y)), c(-math.pi / 2, x), c(0, x)))
    angle = where(logical_and(eq(x, c(0, x)), logical_not(isnan(y))), on_axis, angle)
    corner = mul(where(lt(c(0, x), x), c(math.pi / 4, x), c(3 * math.pi / 4, x)), sign(y))
    return where(logical_and(isinf(x), isinf(y)), corner, angle)


def asin(x: Node) -> Node:
    return atan2(x, sqrt(mul(sub(c(1, x), x), add(c(1, x), x))))


def acos(x: Node) -> Node:
    return atan2(sqrt(mul(sub(c(1, x), x), add(c(1, x), x))), x)


def sinh(x: Node) -> Node:
    # expm1 on both sides: for a small x, e^x - e^-x would cancel
    return mul(sub(expm1(x), expm1(neg(x))), c(0.5, x))


def cosh(x: Node) -> Node:
    return mul(add(exp(x), exp(neg(x))), c(0.5, x))


def asinh(x: Node) -> Node:
    """sign(x) log1p(|x| + x^2 / (1 + sqrt(1 + x^2))); past 2**60, x^2 overflows: log|x| + ln 2."""
    ax = abs_(x)
    xx = mul(ax, ax)
    near = log1p(add(ax, div(xx, add(c(1, x), sqrt(add(c(1, x), xx))))))
    out = where(lt(ax, c(2.0 ** 60, x)), near, add(log(ax), c(LN2, x)))
    return where(lt(x, c(0, x)), neg(out), out)


def acosh(x: Node) -> Node:
    """log1p((x - 1) + sqrt((x - 1)(x + 1))); past 2**60, log x + ln 2."""
    less = sub(x, c(1, x))
    near = log1p(add(less, sqrt(mul(less, add(x, c(1, x))))))
    return where(lt(x, c(2.0 ** 60, x)), near, add(log(x), c(LN2, x)))


def atanh(x: Node) -> Node:
    # (log1p(x) - log1p(-x)) / 2: 1 + x is exact near -1, where 2x / (1 - x) would round
    return mul(sub(log1p(x), log1p(neg(x))), c(0.5, x))


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


# Giles, "Approximating the erfinv function" (GPU Computing Gems, 2011), single precision: a
# polynomial in w = -log(1 - x^2), one for the centre (w < 5) and one in sqrt(w) for the tails
_ERFINV_CENTRE = (2.81022636e-08, 3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087,
                  -0.00125372503, -0.00417768164, 0.246640727, 1.50140941)
_ERFINV_TAIL = (-0.000200214257, 0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773,
                -0.0076224613, 0.00943887047, 1.00167406, 2.83297682)


def erfinv(x: Node) -> Node:
    """The inverse of erf on [-1, 1] (relative error about 1e-7); +-inf at +-1, NaN outside."""
    w = neg(log(mul(sub(c(1, x), x), add(c(1, x), x))))
    centre, tail = sub(w, c(2.5, x)), sub(sqrt(w), c(3, x))

    def horner(coeffs, t):
        p = c(coeffs[0], x)
        for coeff in coeffs[1:]:
            p = add(mul(p, t), c(coeff, x))
        return p
    p = where(lt(w, c(5, x)), horner(_ERFINV_CENTRE, centre), horner(_ERFINV_TAIL, tail))
    # at +-1 the tail's polynomial meets inf - inf: the limit instead
    return where(eq(abs_(x), c(1, x)), mul(x, c(math.inf, x)), mul(p, x))


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
    if not x.dtype.is_float:
        return x
    r = floor(add(x, c(0.5, x)))
    tie = eq(sub(r, x), c(0.5, x))
    odd = ne(fmod(r, c(2, x)), c(0, x))
    return where(logical_and(tie, odd), sub(r, c(1, x)), r)


def remainder(a: Node, b: Node) -> Node:
    """Python's %: the sign of the divisor."""
    r = fmod(a, b)
    fix = logical_and(ne(r, c(0, r)), logical_xor(lt(r, c(0, r)), lt(b, c(0, b))))
    return where(fix, add(r, b), r)


def _whole_quotient(n: Node, b: Node) -> Node:
    """n / b for n an exact multiple of b: the quotient rounded to the nearest integer, since
    n * (1/b) rounds twice and may land just below it. Integers divide in f32, exact below 2**24."""
    work = n.dtype if n.dtype.is_float else DType.F32
    q = div(build.cast(n, work), build.cast(b, work))
    nearest = floor(add(q, c(0.5, q)))
    if n.dtype.is_float:  # from 2**23 on every float is an integer already
        return where(lt(abs_(q), c(2.0 ** 23, q)), nearest, q)
    return build.cast(nearest, n.dtype)


def _by_zero(a: Node, b: Node, quotient: Node) -> Node:
    """A float divided by zero is a / b (+-inf or NaN) in every rounding mode."""
    return where(eq(b, c(0, b)), div(a, b), quotient) if a.dtype.is_float else quotient


def floor_divide(a: Node, b: Node) -> Node:
    return _by_zero(a, b, _whole_quotient(sub(a, remainder(a, b)), b))


def trunc_divide(a: Node, b: Node) -> Node:
    return _by_zero(a, b, _whole_quotient(sub(a, fmod(a, b)), b))


def pow_(x: Node, y: Node | float) -> Node:
    if not isinstance(y, Node):
        return _pow_scalar(x, y)
    if not x.dtype.is_float:
        return _pow_int(x, y)
    magnitude = unary(Op.EXP2, mul(y, unary(Op.LOG2, abs_(x))))
    y_is_int = eq(floor(y), y)
    y_is_odd = ne(fmod(y, c(2, y)), c(0, y))
    negative = where(y_is_int, where(y_is_odd, neg(magnitude), magnitude), c(math.nan, x))
    out = where(lt(x, c(0, x)), negative, magnitude)
    return where(eq(y, c(0, y)), c(1, x), out)


def _pow_int(x: Node, y: Node, bits: int = 6) -> Node:
    """Integer powers by square-and-multiply over the exponent's low bits. Below 2**bits that is
    exact; above it only 0 and +-1 stay in int64 range, and the rule for |x| <= 1 covers them."""
    one = c(1, x)
    result, base = one, x
    for k in range(bits):
        bit = le(c(1 << k, y), fmod(y, c(2 << k, y)))         # bit k of y, for y >= 0
        result = mul(result, where(bit, base, one))
        base = mul(base, base)
    # torch's integer pow: 1**y = 1, (-1)**y = +-1, 0**y = 0 for y != 0; a negative y truncates to 0
    unit = where(ne(fmod(y, c(2, y)), c(0, y)), x, one)
    small = where(eq(x, c(0, x)), where(eq(y, c(0, y)), one, c(0, x)), unit)
    large = where(lt(y, c(0, y)), c(0, x), result)
    return where(le(abs_(x), one), small, large)


def _pow_scalar(x: Node, y: float) -> Node:
    y = float(y)
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
