"""Split a matrix product's reduction into two stages (split-K): sum over k of x is the sum of f
partial sums, each over a run of k / f consecutive elements. f is small (2..32), so the partials
stay few: f per output, not k / f (a vocabulary head's partials over runs of 2 would be half its
whole broadcast product). The candidates differ in how the work is cut (more blocks on a short
output, or one pass), and the measured time decides which cut wins for each shape. It reassociates
the sum (within rounding). (A max of a product is rare in models, so max has no such rules.)

A rule reads the product's shape from an Expand it multiplies (in decode the other factor is a
weight's Reshape, not an Expand); egglog's Vec has no insert, so each (rank, axis) the frontend's
products take gets its own rule, and each factor too.
"""
from ..search.dsl import (dim_lit, dims, eq, expand, i64, ints, mul, reshape, rewrites, split_axis,
                          sum_reduce, terms)

STAGE = "reductions"

FACTORS = (2, 4, 8, 16, 32)
# [a, k, j] products (linear layers, reduced over k or, transposed, j) and [b, a, k, j] (attention)
PLACES = ((3, 1), (3, 2), (4, 2), (4, 3))

a, b = terms("a b")
shape, = dims("shape")
k, = ints("k")


def _rule(rank: int, axis: int, factor: int) -> tuple:
    product = mul(expand(a, shape), b)
    parts = reshape(product, split_axis(shape, rank, axis, i64(factor), k / factor))
    return (f"split-sum-rank{rank}-axis{axis}-by{factor}",
            f"sum over k = sum of {factor} partial sums over runs of k/{factor}",
            sum_reduce(product, axis), sum_reduce(sum_reduce(parts, axis + 1), axis),
            eq(shape.length()).to(i64(rank)), eq(shape[axis]).to(dim_lit(k)),
            eq(k % factor).to(i64(0)), k >= 2 * factor)


RULES = rewrites("split", [_rule(rank, axis, factor) for rank, axis in PLACES for factor in FACTORS])
