"""Idioms of the lowered transformer, matched whole where a rule is sound only inside the idiom:
the RMSNorm's sum of squares and attention's softmax. Each gives the tuner kernels that order the
reductions and the elementwise work differently, not a reordering within one kernel.

Rules that would reassociate a product are left out: `w * (x * r)` as `(w * x) * r` (the norm's
weight or its row factor moved across the LM head) overflows where the lowered order does not
(x = w = 1e30: x * x = inf makes r = 0, so the model gives 0 and the reordering NaN). The mean's
1/n cannot be folded into the sqrt either: it reaches each region as an input (the prologue
computes it), so no rule can know its sign, and egglog cannot build the new constant.
"""
from ..search.dsl import (add, constant, dim_lit, dims, eq, exp2, expand, holds, i64, ints, max_reduce, mul,
                          recip, reshape, rewrites, split_axis, strings, sum_reduce, terms, where)
from .split import FACTORS

STAGE = "idioms"

flag, neg, no, r, scale, v, x, yes = terms("flag neg no r scale v x yes")
shape, row, ones, pv, wide = dims("shape row ones pv wide")
axis, k, last = ints("axis k last")
(dtype,) = strings("dtype")

LOG2E = "1.4426950408889634"   # the frontend's exp(x) is exp2(x * log2 e)

# softmax over the last axis of `shape` as the frontend lowers it: e = exp2((x - max x) * log2 e),
# each row's max and sum reshaped to `row` (= shape with a size-1 last axis) and broadcast back.
# e is in [0, 1] and the row sum in [1, n] (or NaN): so the row factor 1/sum is in (0, 1].
numerator = exp2(mul(add(x, expand(mul(reshape(max_reduce(x, last), row), neg), shape)), scale))
factor = recip(reshape(sum_reduce(numerator, last), row))
SOFTMAX = [eq(last).to(shape.length() - 1), eq(row).to(shape.set(last, dim_lit(1))),
           holds(neg, "-1.0"), holds(scale, LOG2E)]


def zeros(at):
    return expand(reshape(constant("0.0", dtype), ones), at)


# the safe softmax's rows without a finite score (a flag per row) give 0, not NaN
row_mask = where(reshape(flag, row), no, yes)
FORMS = {  # name: (probabilities as lowered, numerator, row factor)
    "plain": (mul(numerator, expand(factor, shape)), numerator, factor),
    "masked": (where(expand(row_mask, shape), zeros(shape), mul(numerator, expand(factor, shape))),
               where(expand(row_mask, shape), zeros(shape), numerator), where(row_mask, zeros(row), factor)),
}


def pv_product(p, at):
    """sum_k p[.., k] * v[.., k, ..]: the probabilities reshaped to `pv` (their last axis at `at`,
    a size-1 axis after it) and broadcast to `wide`, times v, summed over `at`."""
    return sum_reduce(mul(expand(reshape(p, pv), wide), v), at)


# `pv` keeps the probabilities' last axis whole at `at`, with only size-1 axes after it
PV = [eq(pv.length()).to(axis + 2), eq(pv[axis]).to(shape[last]), eq(pv[axis + 1]).to(dim_lit(1))]

RULES = rewrites("idioms", [
    # split-K for the norm: sum over d of x * x in two stages; x's shape is read from the multiply
    # that normalizes it (within rounding: squares are never negative, so no partial sum cancels)
    *[(f"rmsnorm-split-squares-by{f}", f"the norm's sum of squares over d = sum over d/{f} of sums over {f}",
       sum_reduce(mul(x, x), 2),
       sum_reduce(sum_reduce(reshape(mul(x, x), split_axis(shape, 3, 2, k / f, i64(f))), 3), 2),
       mul(x, expand(r, shape)), eq(shape.length()).to(i64(3)), eq(shape[2]).to(dim_lit(k)),
       eq(k % f).to(i64(0)), k >= 2 * f) for f in FACTORS],
    # flash-attention's order: normalize after the PV product, once per output row instead of once
    # per score: sum_k (e_k / s) v_k = (sum_k e_k v_k) / s, and with e_k and 1/s in [0, 1] no product
    # overflows in one order only (a masked row is 0 either way)
    *[(f"softmax-normalize-after-pv-{name}", "sum_k (e_k / s) v_k = (sum_k e_k v_k) / s",
       pv_product(p, axis),
       mul(pv_product(num, axis), expand(reshape(per_row, pv.remove(axis)), wide.remove(axis))),
       *SOFTMAX, *PV) for name, (p, num, per_row) in FORMS.items()],
])
