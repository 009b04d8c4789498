"""The e-graph language: one egglog constructor per IR op, named by the op table's `egg_name`.

`FIELDS` says how each op's inputs and attributes become constructor arguments; the adapter is
generic over it. Inputs and Iotas are opaque leaves (a key into the adapter's leaf table), so rules
never see a weight's name or an Iota's index expression. Symbolic dimensions are `Dim`s: a
literal, or a symbolic expression by its canonical text.
"""
from __future__ import annotations

from enum import Enum

from egglog import Expr, StringLike, Vec, function, i64, i64Like

from ..ir.ops import BINARY, UNARY, Op


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


T, I = Field.TERM, Field.INT
# per op: (IR attribute or "" for an input, field kind) in constructor argument order
FIELDS: dict[Op, tuple[tuple[str, Field], ...]] = {
    **{op: (("", T),) for op in UNARY},
    **{op: (("", T), ("", T)) for op in BINARY},
    Op.WHERE: (("", T), ("", T), ("", T)),
    Op.SUM_REDUCE: (("", T), ("axis", I)),
    Op.MAX_REDUCE: (("", T), ("axis", I)),
    Op.IOTA: (("key", Field.LEAF),),
    Op.CAST: (("", T), ("dtype", Field.TEXT)),
    Op.GATHER: (("", T), ("", T), ("axis", I)),
    Op.SLICE_UPDATE: (("", T), ("", T), ("", T), ("axis", I)),
    Op.CONSTANT: (("value", Field.NUMBER), ("dtype", Field.TEXT)),
    Op.INPUT: (("key", Field.LEAF),),
    Op.PERMUTE: (("", T), ("perm", Field.INTS)),
    Op.RESHAPE: (("", T), ("shape", Field.DIMS)),
    Op.EXPAND: (("", T), ("shape", Field.DIMS)),
    Op.SLICE: (("", T), ("axis", I), ("start", Field.DIM), ("stop", Field.DIM), ("step", I)),
    Op.PAD: (("", T), ("axis", I), ("before", Field.DIM), ("after", Field.DIM), ("value", Field.NUMBER)),
    Op.CONCAT: (("", Field.TERMS), ("axis", I)),
}


# --- the constructors (argument types follow FIELDS; a test checks every op round-trips) -------
@function(egg_fn=Op.EXP2.value)
def exp2(x: Term) -> Term: ...


@function(egg_fn=Op.LOG2.value)
def log2(x: Term) -> Term: ...


@function(egg_fn=Op.SIN.value)
def sin(x: Term) -> Term: ...


@function(egg_fn=Op.SQRT.value)
def sqrt(x: Term) -> Term: ...


@function(egg_fn=Op.RECIP.value)
def recip(x: Term) -> Term: ...


@function(egg_fn=Op.ADD.value)
def add(a: Term, b: Term) -> Term: ...


@function(egg_fn=Op.MUL.value)
def mul(a: Term, b: Term) -> Term: ...


@function(egg_fn=Op.MOD.value)
def mod(a: Term, b: Term) -> Term: ...


@function(egg_fn=Op.LESS_THAN.value)
def less_than(a: Term, b: Term) -> Term: ...


@function(egg_fn=Op.WHERE.value)
def where(cond: Term, a: Term, b: Term) -> Term: ...


@function(egg_fn=Op.SUM_REDUCE.value)
def sum_reduce(x: Term, axis: i64Like) -> Term: ...


@function(egg_fn=Op.MAX_REDUCE.value)
def max_reduce(x: Term, axis: i64Like) -> Term: ...


@function(egg_fn=Op.IOTA.value)
def iota(key: StringLike) -> Term: ...


@function(egg_fn=Op.CAST.value)
def cast(x: Term, dtype: StringLike) -> Term: ...


@function(egg_fn=Op.GATHER.value)
def gather(table: Term, index: Term, axis: i64Like) -> Term: ...


@function(egg_fn=Op.SLICE_UPDATE.value)
def slice_update(dst: Term, src: Term, start: Term, axis: i64Like) -> Term: ...


@function(egg_fn=Op.CONSTANT.value)
def constant(value: StringLike, dtype: StringLike) -> Term: ...


@function(egg_fn=Op.INPUT.value)
def input_(key: StringLike) -> Term: ...


@function(egg_fn=Op.PERMUTE.value)
def permute(x: Term, perm: Vec[i64]) -> Term: ...


@function(egg_fn=Op.RESHAPE.value)
def reshape(x: Term, shape: Vec[Dim]) -> Term: ...


@function(egg_fn=Op.EXPAND.value)
def expand(x: Term, shape: Vec[Dim]) -> Term: ...


@function(egg_fn=Op.SLICE.value)
def slice_(x: Term, axis: i64Like, start: Dim, stop: Dim, step: i64Like) -> Term: ...


@function(egg_fn=Op.PAD.value)
def pad(x: Term, axis: i64Like, before: Dim, after: Dim, value: StringLike) -> Term: ...


@function(egg_fn=Op.CONCAT.value)
def concat(inputs: Vec[Term], axis: i64Like) -> Term: ...


CONSTRUCTORS = {
    Op.EXP2: exp2, Op.LOG2: log2, Op.SIN: sin, Op.SQRT: sqrt, Op.RECIP: recip, Op.ADD: add,
    Op.MUL: mul, Op.MOD: mod, Op.LESS_THAN: less_than, Op.WHERE: where, Op.SUM_REDUCE: sum_reduce,
    Op.MAX_REDUCE: max_reduce, Op.IOTA: iota, Op.CAST: cast, Op.GATHER: gather,
    Op.SLICE_UPDATE: slice_update, Op.CONSTANT: constant, Op.INPUT: input_, Op.PERMUTE: permute,
    Op.RESHAPE: reshape, Op.EXPAND: expand, Op.SLICE: slice_, Op.PAD: pad, Op.CONCAT: concat,
}
