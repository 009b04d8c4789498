"""Reductions: move SumReduce and MaxReduce across adds, constant factors, exp2 and each other, so
that extraction can choose how much work happens before a reduction and how much after it.

A reduction drops its axis (ir/ops.py `_reduce_shape`): axis b of sum(x, a) is axis b of x when
b < a, and axis b + 1 otherwise. Rules see a shape only as the Vec of a Reshape or Expand, so those
that need one match a view and take the reduced axis out of its Vec.
"""
from ..search.dsl import (String, add, constant, dim_lit, dims, eq, exp2, expand, ints, max_reduce, mul, ne,
                          reshape, rewrites, strings, sum_reduce, terms)

STAGE = "reductions"

a, b, x = terms("a b x")
axis, other = ints("axis other")
s, t = dims("s t")
value, dtype = strings("value dtype")

REDUCE = {"sum": sum_reduce, "max": max_reduce}
VIEWS = {"reshape": reshape, "expand": expand}


def broadcast_constant(ones, shape):
    """The pattern's constant as the frontend broadcasts a scalar: reshaped to ones, expanded."""
    return expand(reshape(constant(value, dtype), ones), shape)


RULES = rewrites("reductions", [
    ("sum-of-add", "sum(a + b) = sum(a) + sum(b): reassociates the sum (within rounding)",
     sum_reduce(add(a, b), axis), add(sum_reduce(a, axis), sum_reduce(b, axis))),
    # The constant is rebuilt at the reduced shape from its Vecs, so only a scalar broadcast by
    # Expand qualifies (a factor that varies along the other axes has no shape the DSL can name).
    # It must be finite: sum([0, 1] * inf) is NaN, sum([0, 1]) * inf is inf.
    ("sum-pulls-constant", "sum(x * c) = sum(x) * c for a finite scalar constant c (within rounding)",
     sum_reduce(mul(x, broadcast_constant(s, t)), axis),
     mul(sum_reduce(x, axis), broadcast_constant(s.remove(axis), t.remove(axis))),
     ne(value).to(String("inf")), ne(value).to(String("-inf"))),
    # exp2 is monotone and keeps NaN, so the largest input gives the largest output (exact); not
    # sqrt or log2, whose NaN for a negative element the max of their inputs would not see
    ("max-of-exp2", "max(exp2(x)) = exp2(max(x)): exp2 is monotone",
     max_reduce(exp2(x), axis), exp2(max_reduce(x, axis))),
    # Two reductions in either order (`other` is the outer one's axis, counted after the inner one
    # dropped its own). Each direction builds the order the other one starts from: both are needed.
    *[(f"{name}-swap-{way}", f"{name}({name}(x, a), b) = {swapped}",
       red(red(x, axis), other), red(red(x, inner), outer), condition)
      for name, red in REDUCE.items()
      for way, swapped, condition, inner, outer in (
          ("down", f"{name}({name}(x, b), a - 1) for b < a", other < axis, other, axis - 1),
          ("up", f"{name}({name}(x, b + 1), a) for b >= a", other >= axis, other + 1, axis))],
    # over one element the reduction only drops the axis (exact)
    *[(f"{name}-unit-axis-{view}", f"{name} over a size-1 axis of {view}(x) = a reshape without it",
       red(v(x, s), axis), reshape(v(x, s), s.remove(axis)), eq(s[axis]).to(dim_lit(1)))
      for name, red in REDUCE.items() for view, v in VIEWS.items()],
])
