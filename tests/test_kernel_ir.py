"""The kernel IR's scalars: hashed by structure, equal trees one object, numbers kept exact.

Every scalar once hashed to 0 (its cached hash's field defaulted to the value that meant
"computed"), so each set or dict of scalars was a list compared node by node: scheduling a
Qwen3-MoE layer under an attention policy took 70 s, and rendering every Llama kernel 2.5x its
time now."""
from __future__ import annotations

import gc
import weakref

from kiln.codegen.c_emit import literal
from kiln.codegen.c_kernel import _within
from kiln.codegen.kernel import (Apply, Bind, Const, InRange, IndexValue, Load, Reduce, alpha_canonical,
                                  bound_names, free_vars, nodes, renamed)
from kiln.ir import DType, Op
from kiln.ir.symbolic import Expr, sym


def test_distinct_scalars_hash_apart():
    scalars = [Const(float(v), DType.F32) for v in range(100)]
    scalars += [Load(f"b{v}", sym("i") + v, DType.F32) for v in range(100)]
    assert len({hash(s) for s in scalars}) == len(scalars)


def test_a_tree_built_twice_is_one_object():
    def tree():
        value = Load("x", sym("i"), DType.F32)
        for k in range(2000):       # deep: a structural comparison would walk all of it
            value = Apply(Op.ADD, (value, Const(float(k), DType.F32)), DType.F32)
        return value

    first, second = tree(), tree()
    assert first is second
    assert len(nodes(first, second)) == len(nodes(first)) == 1 + 2 * 2000


def test_constants_python_calls_equal_stay_apart():
    zero, negative_zero = Const(0.0, DType.F32), Const(-0.0, DType.F32)
    assert zero is not negative_zero
    assert literal(negative_zero.value, DType.F32).startswith("-")
    assert Const(1, DType.I64) is not Const(1.0, DType.I64)
    assert Const(True, DType.BOOL) is not Const(1, DType.BOOL)


def test_interning_keeps_no_dead_tree_alive():
    leaf = Const(12345.5, DType.F32)
    gone = weakref.ref(Apply(Op.MUL, (leaf, leaf), DType.F32))
    gc.collect()
    assert gone() is None


def _partner_sum(step: str, bound: str, depth: str) -> Reduce:
    """Σ_k W[bound·8 + k] with `bound` the partner of `step` (rotary's rotate-half), as the
    scheduler writes one copy of it: each copy names its own bind and reduction variables."""
    partner = IndexValue((sym(step) + 4) % 8, DType.I64)
    body = Bind(bound, partner, Load("w", sym(bound) * 8 + sym(depth), DType.F32), DType.F32)
    return Reduce(Op.SUM_REDUCE, depth, Expr.of(8), body, DType.F32)


def test_copies_that_differ_in_bound_names_canonicalize_equal():
    first, second = _partner_sum("i", "g1", "r1"), _partner_sum("i", "g2", "r2")
    assert first is not second
    assert alpha_canonical(first) is alpha_canonical(second)
    # a free variable is not a bound one: another point's copy stays apart
    assert alpha_canonical(_partner_sum("j", "g1", "r1")) is not alpha_canonical(first)


def test_renaming_a_variable_renames_the_binds_that_read_it():
    """Two copies of a value bound per step, one renamed to a row's variable, never share a bind's
    name in one kernel (the emitter would take the first copy's index for the second's)."""
    original = _partner_sum("i", "g1", "r1")
    copy = renamed(original, {"i": "kiln_row"})
    binds = [s for s in nodes(copy) if isinstance(s, Bind)]
    assert [b.var for b in binds] == ["g1_kiln_row"]
    assert "kiln_row" in free_vars(copy, {}) and "i" not in free_vars(copy, {})


def test_bound_names_pair_the_variables_two_copies_bind():
    """A merged kernel's second copy of a reduction takes the first's names, its inner ones too,
    so that the emitter sees one value (the heads policy's norm over the partials' sum)."""
    first, second = _partner_sum("i", "g1", "r1"), _partner_sum("i", "g2", "r2")
    names = bound_names(first, second)
    assert names == {"r2": "r1", "g2": "g1"}
    assert renamed(second, names) is first


def test_an_index_a_bind_computes_is_within_a_row_only_where_every_value_is():
    """Rotary's partner of feature d in a row of 64: d + 32 in the first half, d - 32 in the
    second, each clamped as the lowering writes it. A row's partner is read from the row only
    where no step's partner lies outside it."""
    d = sym("d")
    partner = Apply(Op.WHERE, (InRange(d, Expr.of(0), Expr.of(32)),
                               IndexValue(Expr.of(31).min(Expr.of(0).max(d)) + 32, DType.I64),
                               IndexValue(Expr.of(31).min(Expr.of(0).max(d - 32)), DType.I64)), DType.I64)
    steps = {"d": (0, 63)}
    assert _within(partner, steps, 64)
    assert not _within(partner, steps, 48)                                  # 32 + 31 past a row of 48
    assert not _within(IndexValue(d + 1, DType.I64), steps, 64)             # the last step's is 64
    assert not _within(IndexValue(d + sym("pos"), DType.I64), steps, 64)    # unbounded
    assert not _within(Load("ids", d, DType.I64), steps, 64)                # read, not computed
