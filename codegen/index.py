"""Index arithmetic for kernels: views become index expressions on loads, simplified with the
ranges of loop variables so that a reshape that splits an axis and a later one that merges it
back cost no division in the generated loop."""
from __future__ import annotations

from typing import Mapping, Sequence

from ..ir.symbolic import Call, Expr, prod, sym

Bounds = Mapping[str, tuple[int, int]]   # inclusive ranges of loop variables and symbols


def substitute(expr: Expr, env: Mapping[str, Expr], bounds: Bounds | None = None) -> Expr:
    """expr with the named symbols replaced by expressions (calls rebuilt, so they re-simplify;
    with `bounds`, divisions also simplify by the ranges of what they divide)."""
    out = Expr.of(0)
    for mono, coeff in expr.terms:
        term = Expr.of(coeff)
        for atom in mono:
            term = term * (env.get(atom, sym(atom)) if isinstance(atom, str)
                           else _call(atom.fn, [substitute(a, env, bounds) for a in atom.args], bounds))
        out = out + term
    return out


def _call(fn: str, args: list[Expr], bounds: Bounds | None = None) -> Expr:
    a, b = args
    if bounds is not None and fn in ("floordiv", "mod"):
        return (floordiv if fn == "floordiv" else mod)(a, b, bounds)
    return {"floordiv": lambda: a // b, "mod": lambda: a % b,
            "max": lambda: a.max(b), "min": lambda: a.min(b)}[fn]()


def interval(expr: Expr, bounds: Bounds) -> tuple[int, int] | None:
    """Inclusive range of expr given ranges of its symbols; None where a symbol is unbounded."""
    lo = hi = 0
    for mono, coeff in expr.terms:
        t_lo = t_hi = coeff
        for atom in mono:
            r = bounds.get(atom) if isinstance(atom, str) else _call_interval(atom, bounds)
            if r is None:
                return None
            products = (t_lo * r[0], t_lo * r[1], t_hi * r[0], t_hi * r[1])
            t_lo, t_hi = min(products), max(products)
        lo, hi = lo + t_lo, hi + t_hi
    return lo, hi


def _call_interval(call: Call, bounds: Bounds) -> tuple[int, int] | None:
    a = interval(call.args[0], bounds)
    b = interval(call.args[1], bounds)
    if a is None or b is None:
        return None
    if call.fn in ("max", "min"):
        f = max if call.fn == "max" else min
        return f(a[0], b[0]), f(a[1], b[1])
    if b[0] <= 0 or a[0] < 0:
        return None
    if call.fn == "floordiv":
        return a[0] // b[1], a[1] // b[0]
    return 0, min(a[1], b[1] - 1)


def floordiv(expr: Expr, d: Expr, bounds: Bounds) -> Expr:
    """expr // d, dropping the division when the part of expr not divisible by d lies in [0, d)."""
    if d.is_const and d.value > 0:
        whole, rest = _split_multiples(expr, d.value)
        r = interval(rest, bounds)
        if r is not None and 0 <= r[0] and r[1] < d.value:
            return Expr({m: c // d.value for m, c in whole.terms})
    return expr // d


def mod(expr: Expr, d: Expr, bounds: Bounds) -> Expr:
    if d.is_const and d.value > 0:
        _, rest = _split_multiples(expr, d.value)
        r = interval(rest, bounds)
        if r is not None and 0 <= r[0] and r[1] < d.value:
            return rest
        return rest % d
    r, dr = interval(expr, bounds), interval(d, bounds)
    if r is not None and dr is not None and 0 <= r[0] and r[1] < dr[0]:
        return expr
    return expr % d


def _split_multiples(expr: Expr, d: int) -> tuple[Expr, Expr]:
    whole = {m: c for m, c in expr.terms if c % d == 0}
    rest = {m: c for m, c in expr.terms if c % d != 0}
    return Expr(whole), Expr(rest)


def linear(index: Sequence[Expr], shape: Sequence[Expr]) -> Expr:
    """The row-major offset of index in a contiguous tensor of shape."""
    offset, stride = Expr.of(0), Expr.of(1)
    for i, n in zip(reversed(index), reversed(shape)):
        offset = offset + i * stride
        stride = stride * n
    return offset


def reshape_index(index: Sequence[Expr], out_shape: Sequence[Expr], in_shape: Sequence[Expr],
                  bounds: Bounds, probe: Mapping[str, int]) -> list[Expr]:
    """The input index that a reshape reads for an output index. Axes are grouped where the
    running products of both shapes meet, so a split or a merge touches only its own axes;
    `probe` gives symbols representative values for deciding which side to extend."""
    result: list[Expr] = [Expr.of(0)] * len(in_shape)
    out_axes = [a for a, n in enumerate(out_shape) if n != 1]
    in_axes = [a for a, n in enumerate(in_shape) if n != 1]
    i = j = 0
    while i < len(out_axes) or j < len(in_axes):
        group_out, group_in = [out_axes[i]] if i < len(out_axes) else [], [in_axes[j]] if j < len(in_axes) else []
        i, j = i + len(group_out), j + len(group_in)
        size_out = prod(out_shape[a] for a in group_out)
        size_in = prod(in_shape[a] for a in group_in)
        while size_out != size_in:
            can_out, can_in = i < len(out_axes), j < len(in_axes)
            if not (can_out or can_in):
                break
            if can_out and (not can_in or size_out.evaluate(probe) < size_in.evaluate(probe)):
                group_out.append(out_axes[i])
                size_out, i = size_out * out_shape[out_axes[i]], i + 1
            else:
                group_in.append(in_axes[j])
                size_in, j = size_in * in_shape[in_axes[j]], j + 1
        flat = linear([index[a] for a in group_out], [out_shape[a] for a in group_out])
        flat_bounds = dict(bounds)
        stride = Expr.of(1)
        for pos in range(len(group_in) - 1, -1, -1):
            axis = group_in[pos]
            value = floordiv(flat, stride, flat_bounds) if stride != 1 else flat
            if pos > 0:
                value = mod(value, in_shape[axis], flat_bounds)
            result[axis] = value
            stride = stride * in_shape[axis]
    return result


def stride(index: Expr, var: str) -> int | None:
    """The coefficient of var in index when it appears only linearly (0 when not at all); None
    otherwise (in a product of variables or inside a division)."""
    coeff = 0
    for mono, c in index.terms:
        if mono == (var,):
            coeff += c
        elif any(a == var if isinstance(a, str) else var in a.symbols() for a in mono):
            return None
    return coeff
