"""The e-graph language: one egglog constructor per IR op, named by the op table's `egg_name`,
generated from the op table: `FIELDS` says how each op's inputs and attributes become constructor
arguments (from its arity and attributes), and the adapter is generic over it. Inputs and Iotas are opaque leaves (a key into the adapter's leaf table), so rules
never see a weight's name or an Iota's index expression. Symbolic dimensions are `Dim`s: a
literal, or a symbolic expression by its canonical text.
"""
from __future__ import annotations

import builtins
import inspect
from enum import Enum

from egglog import Expr, StringLike, Vec, function, i64, i64Like

from ..ir.ops import OPS, Op


class Dim(Expr, egg_sort="Dim"):
    """A dimension: DLit(n) for a constant, DSym(text) for a symbolic expression."""


@function(egg_fn="DLit")
def dim_lit(value: i64Like) -> Dim: ...


@function(egg_fn="DSym")
def dim_sym(text: StringLike) -> Dim: ...


class Term(Expr, egg_sort="Term"):
    """A tensor-valued IR node."""


class Field(Enum):
    TERM = "term"        # one tensor input
    TERMS = "terms"      # all inputs, as Vec[Term] (Concat)
    LEAF = "leaf"        # a key into the leaf table (Input, Iota)
    INT = "int"          # i64 attribute
    NUMBER = "number"    # a Python number as its exact text: egglog's f64 merges -0.0 with 0.0
    TEXT = "text"        # String attribute (dtype names)
    DIM = "dim"          # one Dim attribute
    DIMS = "dims"        # Vec[Dim] attribute (shapes)
    INTS = "ints"        # Vec[i64] attribute (permutations)


# how each attribute of the op table becomes a constructor argument
_ATTRIBUTE = {"axis": Field.INT, "step": Field.INT, "dtype": Field.TEXT, "value": Field.NUMBER,
              "perm": Field.INTS, "shape": Field.DIMS, "start": Field.DIM, "stop": Field.DIM,
              "before": Field.DIM, "after": Field.DIM}
LEAVES = (Op.INPUT, Op.IOTA)      # opaque to rules: a key into the adapter's leaf table


def _fields(op: Op) -> tuple[tuple[str, Field], ...]:
    spec = OPS[op]
    if op in LEAVES:
        return (("key", Field.LEAF),)
    unknown = [a for a in spec.attrs if a not in _ATTRIBUTE]
    if unknown:
        raise KeyError(f"{op.value}'s attribute {unknown[0]!r} has no e-graph field kind: add it to "
                       "search/language.py's _ATTRIBUTE")
    inputs = (("", Field.TERMS),) if spec.arity is None else (("", Field.TERM),) * spec.arity
    return inputs + tuple((a, _ATTRIBUTE[a]) for a in spec.attrs)


# per op: (IR attribute or "" for an input, field kind) in constructor argument order
FIELDS: dict[Op, tuple[tuple[str, Field], ...]] = {op: _fields(op) for op in OPS}

_ARGUMENT = {Field.TERM: Term, Field.TERMS: Vec[Term], Field.LEAF: StringLike, Field.INT: i64Like,
             Field.NUMBER: StringLike, Field.TEXT: StringLike, Field.DIM: Dim, Field.DIMS: Vec[Dim],
             Field.INTS: Vec[i64]}


def rule_name(op: Op) -> str:
    """The name rules call an op's constructor by: the op's, lower case (slice_ and input_ where
    it would hide a Python builtin)."""
    name = op.name.lower()
    return name + "_" if hasattr(builtins, name) else name


def _constructor(op: Op):
    """The egglog function of one op, its argument types from FIELDS (a test checks every op
    round-trips through it)."""
    names = [attr or f"x{i}" for i, (attr, _) in enumerate(FIELDS[op])]

    def constructor(*args): ...
    constructor.__name__ = constructor.__qualname__ = rule_name(op)
    constructor.__signature__ = inspect.Signature(
        [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in names])
    constructor.__annotations__ = {**{n: _ARGUMENT[kind] for n, (_, kind) in zip(names, FIELDS[op])},
                                   "return": Term}
    return function(egg_fn=OPS[op].egg_name)(constructor)


CONSTRUCTORS = {op: _constructor(op) for op in FIELDS}
