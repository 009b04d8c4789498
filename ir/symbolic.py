"""Symbolic integer expressions for dimensions (sequence length, position, batch).

An expression is kept in a canonical polynomial form — a sum of integer-weighted products of
atoms — so that `seq*9 + seq - seq` and `10*seq` are the same object by value. Atoms are symbol
names or opaque calls (floordiv, mod, max, min) that could not be simplified away.
"""
from __future__ import annotations

import math
from functools import lru_cache
from typing import Mapping, Union

Monomial = tuple  # sorted tuple of atoms; () is the constant monomial
IntLike = Union[int, "Expr"]


class Call:
    """An atom that is not a plain symbol: fn(args) with fn in floordiv, mod, max, min."""
    __slots__ = ("fn", "args", "_key")
    FNS = {"floordiv": lambda a, b: a // b, "mod": lambda a, b: a % b, "max": max, "min": min}

    def __init__(self, fn: str, args: tuple[Expr, ...]):
        self.fn, self.args = fn, args
        self._key = f"{fn}({', '.join(map(str, args))})"

    def __eq__(self, other):
        return isinstance(other, Call) and self._key == other._key

    def __hash__(self):
        return hash(self._key)

    def __str__(self):
        return self._key

    def evaluate(self, env: Mapping[str, int]) -> int:
        return Call.FNS[self.fn](*(a.evaluate(env) for a in self.args))

    def symbols(self) -> set[str]:
        return set().union(*(a.symbols() for a in self.args))


def _atom_key(atom) -> str:
    return atom if isinstance(atom, str) else "~" + atom._key


class Expr:
    """An immutable integer expression; build with `sym`, `const` or arithmetic on them."""
    __slots__ = ("terms", "_hash")

    def __init__(self, terms: Mapping[Monomial, int]):
        items = [(m, c) for m, c in terms.items() if c != 0]
        if len(items) > 1:
            items.sort(key=lambda mc: (not mc[0], [_atom_key(a) for a in mc[0]]))
        self.terms = tuple(items)
        self._hash = hash(self.terms)

    @staticmethod
    def _ordered(terms: tuple) -> Expr:
        """An expression of terms already in canonical order, none zero (a scaled expression's)."""
        out = object.__new__(Expr)
        out.terms, out._hash = terms, hash(terms)
        return out

    # --- construction -------------------------------------------------------------------------
    @staticmethod
    def of(value: IntLike | str) -> Expr:
        if isinstance(value, Expr):
            return value
        if isinstance(value, str):
            return _symbol(value)
        if isinstance(value, (bool,)) or not isinstance(value, int):
            try:
                value = int(value)  # numpy integers
            except (TypeError, ValueError):
                raise TypeError(f"not an integer dimension: {value!r}") from None
        return _constant(value)

    # --- queries ------------------------------------------------------------------------------
    @property
    def is_const(self) -> bool:
        return all(m == () for m, _ in self.terms)

    @property
    def value(self) -> int:
        if not self.is_const:
            raise ValueError(f"dimension {self} is symbolic, not a constant")
        return self.terms[0][1] if self.terms else 0

    @property
    def symbol_name(self) -> str | None:
        """The symbol's name when the expression is one bare symbol, else None."""
        if len(self.terms) == 1:
            (mono, coeff), = self.terms
            if coeff == 1 and len(mono) == 1 and isinstance(mono[0], str):
                return mono[0]
        return None

    def symbols(self) -> set[str]:
        out: set[str] = set()
        for mono, _ in self.terms:
            for atom in mono:
                out |= {atom} if isinstance(atom, str) else atom.symbols()
        return out

    def evaluate(self, env: Mapping[str, int]) -> int:
        total = 0
        for mono, coeff in self.terms:
            prod = coeff
            for atom in mono:
                if isinstance(atom, str):
                    if atom not in env:
                        raise KeyError(f"no value bound for symbol '{atom}'")
                    prod *= env[atom]
                else:
                    prod *= atom.evaluate(env)
            total += prod
        return total

    def _content(self) -> int:
        return math.gcd(*(c for _, c in self.terms)) if self.terms else 0

    # --- arithmetic ---------------------------------------------------------------------------
    def __add__(self, other: IntLike) -> Expr:
        other = Expr.of(other)
        if not other.terms:
            return self
        if not self.terms:
            return other
        acc = dict(self.terms)
        for m, c in other.terms:
            acc[m] = acc.get(m, 0) + c
        return Expr(_fold_divmod(acc))

    __radd__ = __add__

    def __neg__(self) -> Expr:
        return Expr({m: -c for m, c in self.terms})

    def __sub__(self, other: IntLike) -> Expr:
        return self + (-Expr.of(other))

    def __rsub__(self, other: IntLike) -> Expr:
        return Expr.of(other) - self

    def __mul__(self, other: IntLike) -> Expr:
        other = Expr.of(other)
        for a, b in ((self, other), (other, self)):     # by a constant: each coefficient scaled
            if not b.terms:
                return _ZERO
            if len(b.terms) == 1 and not b.terms[0][0]:
                k = b.terms[0][1]
                return a if k == 1 else Expr._ordered(tuple((m, c * k) for m, c in a.terms))
        acc: dict[Monomial, int] = {}
        for m1, c1 in self.terms:
            for m2, c2 in other.terms:
                m = tuple(sorted(m1 + m2, key=_atom_key))
                acc[m] = acc.get(m, 0) + c1 * c2
        return Expr(acc)

    __rmul__ = __mul__

    def __floordiv__(self, other: IntLike) -> Expr:
        other = Expr.of(other)
        if other.is_const:
            d = other.value
            if d == 0:
                raise ZeroDivisionError(f"dimension {self} divided by zero")
            if self.is_const:
                return Expr.of(self.value // d)
            if self._content() % d == 0:
                return Expr({m: c // d for m, c in self.terms})
        elif self == other:
            return Expr.of(1)
        else:
            quotient = self.exact_div(other)
            if quotient is not None:
                return quotient
        return Expr({(Call("floordiv", (self, other)),): 1})

    def exact_div(self, other: Expr) -> Expr | None:
        """self / other when other is a single monomial dividing every term; else None."""
        if len(other.terms) != 1:
            return None
        (dmono, dcoeff), = other.terms
        acc = {}
        for mono, coeff in self.terms:
            rest = list(mono)
            for atom in dmono:
                if atom not in rest:
                    return None
                rest.remove(atom)
            if coeff % dcoeff:
                return None
            acc[tuple(rest)] = coeff // dcoeff
        return Expr(acc)

    def __mod__(self, other: IntLike) -> Expr:
        other = Expr.of(other)
        if other.is_const and self.is_const:
            return Expr.of(self.value % other.value)
        if other.is_const and self._content() % other.value == 0:
            return _ZERO
        if self == other:
            return _ZERO
        return Expr({(Call("mod", (self, other)),): 1})

    def max(self, other: IntLike) -> Expr:
        return _minmax("max", self, Expr.of(other))

    def min(self, other: IntLike) -> Expr:
        return _minmax("min", self, Expr.of(other))

    # --- comparison and printing --------------------------------------------------------------
    def __eq__(self, other) -> bool:
        if other is self:
            return True
        if isinstance(other, int):
            other = Expr.of(other)
        return isinstance(other, Expr) and self._hash == other._hash and self.terms == other.terms

    def __hash__(self) -> int:
        return self._hash

    def __str__(self) -> str:
        if not self.terms:
            return "0"
        parts = []
        for mono, coeff in self.terms:
            names = [str(a) for a in mono]
            if not names:
                parts.append(str(coeff))
            elif coeff == 1:
                parts.append("*".join(names))
            elif coeff == -1:
                parts.append("-" + "*".join(names))
            else:
                parts.append("*".join(names + [str(coeff)]))
        return " + ".join(parts).replace("+ -", "- ")

    def __repr__(self) -> str:
        return f"Expr({self})"


_ZERO = Expr({})


@lru_cache(maxsize=4096)
def _constant(value: int) -> Expr:
    return Expr({(): value}) if value else _ZERO


@lru_cache(maxsize=4096)
def _symbol(name: str) -> Expr:
    return Expr({(name,): 1})


def _fold_divmod(acc: dict[Monomial, int]) -> dict[Monomial, int]:
    """k*d*floordiv(x, d) + k*mod(x, d) = k*x (a reshape that splits an axis and one that merges
    it back read the same element: without the fold the offset is not linear in x, and a kernel
    cannot read it with vector loads). Holds for floor and for truncating division alike, each
    with its own remainder."""
    for mono, k in list(acc.items()):
        if k == 0 or len(mono) != 1 or not isinstance(mono[0], Call) or mono[0].fn != "mod":
            continue
        x, d = mono[0].args
        quotient = (Call("floordiv", (x, d)),)
        if d.is_const and acc.get(quotient, 0) == k * d.value and acc.get(mono, 0) == k:
            del acc[mono], acc[quotient]
            for m, c in x.terms:
                acc[m] = acc.get(m, 0) + k * c
    return acc


def _minmax(fn: str, a: Expr, b: Expr) -> Expr:
    if a == b:
        return a
    if a.is_const and b.is_const:
        return Expr.of(max(a.value, b.value) if fn == "max" else min(a.value, b.value))
    diff = a - b
    if diff.is_const:  # a = b + k decides the order without knowing b
        a_larger = diff.value > 0
        return a if a_larger == (fn == "max") else b
    return Expr({(Call(fn, tuple(sorted((a, b), key=str))),): 1})


def sym(name: str) -> Expr:
    return Expr.of(name)


def const(value: int) -> Expr:
    return Expr.of(value)


def prod(dims) -> Expr:
    out = Expr.of(1)
    for d in dims:
        out = out * d
    return out


Shape = tuple[Expr, ...]


def shape_of(dims) -> Shape:
    return tuple(Expr.of(d) for d in dims)


def fmt_shape(shape: Shape) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"
