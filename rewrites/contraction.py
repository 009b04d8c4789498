"""Contraction order: how much of a product's work happens before a sum and how much after it.

A matrix chain as the frontend lowers it, (A·B)·X, computes an m×k×n product before a small one;
A·(B·X) computes two small ones where X is a vector: the classic e-graph win (Tensat, TASO). A
factor that does not vary along a sum's axis (broadcast along it) moves out of the sum, and a sum
over an axis a broadcast does not touch is taken before the broadcast: an outer product summed,
u_i·Σ_j v_j, costs n instead of n².

These reassociate products, so they are *finite-only* rules: the two sides agree within rounding
wherever both stay finite, but one order may overflow where the other does not (A·B = inf while
B·x = 0 makes (A·B)·x NaN and A·(B·x) 0). The fuzzer checks them on that contract
(rewrites/fuzz.py), and `kiln rules list` marks them.

A matrix product [m, k] x [k, n] is lowered as reshape(a, [m, k, 1]) broadcast to [m, k, n]
times reshape(b, [1, k, n]) broadcast to [m, k, n], summed over axis 1; the frontend leaves out a
broadcast to the shape it already has (the left one where n = 1).
"""
from ..search.dsl import Dim, Vec, dim_lit, dims, eq, expand, i64, ints, mul, reshape, rewrites, sum_reduce, terms

STAGE = "reductions"

a, b, x, z = terms("a b x z")
s, t, left, right, outer_left, outer_right, wide = dims("s t left right outer_left outer_right wide")
(axis,) = ints("axis")
ONE = dim_lit(1)


def product(p, q, m, k, n):
    """p [m, k] times q [k, n] as the frontend lowers it (broadcasts to their own shape included:
    a view that does nothing)."""
    full = Vec[Dim](m, k, n)
    return sum_reduce(mul(expand(reshape(p, Vec[Dim](m, k, ONE)), full),
                          expand(reshape(q, Vec[Dim](ONE, k, n)), full)), i64(1))


def _factors(p, q, pl, ql, full, column: bool):
    """The lowered product's pattern over shape variables: p reshaped to `pl`, q to `ql`, both
    broadcast to `full` (p's broadcast left out where the result is a column)."""
    lhs = reshape(p, pl) if column else expand(reshape(p, pl), full)
    return sum_reduce(mul(lhs, expand(reshape(q, ql), full)), i64(1))


def _shapes(pl, ql):
    return [eq(pl.length()).to(i64(3)), eq(pl[2]).to(ONE), eq(ql.length()).to(i64(3)), eq(ql[0]).to(ONE)]


def _chain_rules():
    rows = []
    for column in (False, True):
        tail = "-column" if column else ""
        why = " (X a column: its broadcast left out)" if column else ""
        # (A·B)·X: A [m, k] as left, B [k, n] as right; X [n, p] against the product
        inner = _factors(a, b, left, right, t, column=False)
        chain = _factors(inner, x, outer_left, outer_right, wide, column)
        m, k, n, p = left[0], left[1], right[2], (ONE if column else outer_right[2])
        conditions = [*_shapes(left, right), *_shapes(outer_left, outer_right)]
        if column:
            conditions.append(eq(outer_right[2]).to(ONE))
        rows.append((f"matrix-chain-right{tail}", f"(A·B)·X = A·(B·X): an m×k×n product becomes k×n×p{why}",
                     chain, product(a, product(b, x, k, n, p), m, k, p), *conditions))
        # A·(B·X): A [m, k]; B [k, n] as left, X [n, p] as right, the product against A
        inner = _factors(b, x, left, right, t, column)
        chain = _factors(a, inner, outer_left, outer_right, wide, column)
        m, k, n, p = outer_left[0], left[0], left[1], (ONE if column else right[2])
        conditions = [*_shapes(left, right), *_shapes(outer_left, outer_right)]
        if column:
            conditions.append(eq(right[2]).to(ONE))
        rows.append((f"matrix-chain-left{tail}", f"A·(B·X) = (A·B)·X{why}",
                     chain, product(product(a, b, m, k, n), x, m, n, p), *conditions))
    return rows


RULES = rewrites("contraction", [
    *_chain_rules(),
    # z reshaped to s (size 1 along the axis) and broadcast: the same at every step of the sum
    ("sum-pulls-broadcast-factor", "sum_j(x_j · y) = sum_j(x_j) · y for y broadcast along j",
     sum_reduce(mul(x, expand(reshape(z, s), t)), axis),
     mul(sum_reduce(x, axis), expand(reshape(z, s.remove(axis)), t.remove(axis))),
     eq(s[axis]).to(ONE)),
], finite_only=True)

RULES += rewrites("contraction", [
    # a broadcast along other axes repeats the sum's terms, each sum the same: sum first
    ("sum-before-broadcast", "sum over an axis a broadcast leaves alone = the broadcast of the sum",
     sum_reduce(expand(reshape(z, s), t), axis),
     expand(sum_reduce(reshape(z, s), axis), t.remove(axis)),
     eq(s[axis]).to(t[axis])),
])
