"""The IR on its own: op table, symbolic dims, hash-consing, and the reference interpreter."""
import pickle

import numpy as np
import pytest

from kiln.ir import DType, Graph, KilnTypeError, Node, Op, ShapeError, build, evaluate, run
from kiln.ir.ops import OPS, Kind
from kiln.ir.printer import format_graph
from kiln.ir.symbolic import Expr, const, sym

rng = np.random.default_rng(0)


def inp(name, shape, dtype=DType.F32, role="input"):
    return Node(Op.INPUT, name=name, role=role, shape=tuple(Expr.of(d) for d in shape), dtype=dtype)


# --- op table ---------------------------------------------------------------------------------
def test_every_op_has_a_complete_spec():
    assert set(OPS) == set(Op)
    assert len({s.egg_name for s in OPS.values()}) == len(OPS)
    for op, spec in OPS.items():
        assert spec.op is op
        assert callable(spec.dtype_rule) and callable(spec.shape_rule) and callable(spec.evaluate)
        assert spec.arity is None or spec.arity >= 0
        assert isinstance(spec.kind, Kind)


def test_elementwise_ops_need_explicit_broadcast():
    a, b = inp("a", (2, 3)), inp("b", (1, 3))
    with pytest.raises(ShapeError, match="broadcast with Expand"):
        Node(Op.ADD, [a, b])
    assert build.elementwise(Op.ADD, a, b).shape == (2, 3)


def test_dtype_rules_reject_bad_inputs():
    with pytest.raises(KilnTypeError, match="float"):
        Node(Op.RECIP, [inp("i", (2,), DType.I32)])
    with pytest.raises(KilnTypeError, match="one dtype"):
        Node(Op.ADD, [inp("a", (2,)), inp("b", (2,), DType.F16)])
    with pytest.raises(KilnTypeError, match="bool condition"):
        Node(Op.WHERE, [inp("c", (2,)), inp("a", (2,)), inp("b", (2,))])


# --- symbolic dims ----------------------------------------------------------------------------
def test_symbolic_expressions_simplify_to_one_canonical_form():
    s, p = sym("seq"), sym("pos")
    assert s * 9 + s - s == 9 * s
    assert (s + p) * 2 - p == 2 * s + p
    assert (s * 576).exact_div(s * 9) == const(64)
    assert (s * 6 + 3) // 3 == 2 * s + 1
    assert (s * 10) % 5 == 0
    assert (s + 1).max(s) == s + 1 and (s - 2).min(s) == s - 2
    assert str(s * 9 + 3) == "seq*9 + 3"


def test_symbolic_evaluation_matches_python_integers():
    s, p = sym("s"), sym("p")
    for expr, fn in [((s * 3 + p) // 2, lambda a, b: (a * 3 + b) // 2),
                     ((s + 5) % p, lambda a, b: (a + 5) % b),
                     (s.max(p) - s.min(p), lambda a, b: max(a, b) - min(a, b))]:
        for a, b in [(1, 2), (7, 3), (100, 9)]:
            assert expr.evaluate({"s": a, "p": b}) == fn(a, b)
    with pytest.raises(KeyError, match="'s'"):
        s.evaluate({})


# --- hash-consing -----------------------------------------------------------------------------
def test_equal_structures_are_one_node():
    x = inp("x", (4,))
    assert Node(Op.EXP2, [x]) is Node(Op.EXP2, [x])
    assert build.constant(0.0, DType.F32) is not build.constant(-0.0, DType.F32)
    with pytest.raises(AttributeError):
        x.op = Op.SIN
    with pytest.raises(TypeError, match="never pickled"):
        pickle.dumps(x)


# --- interpreter ------------------------------------------------------------------------------
@pytest.mark.parametrize("layout", ["mm", "bmm", "transposed", "broadcast-batch", "vector"])
def test_contraction_path_equals_elementwise_sum(layout):
    """SumReduce(Mul) is evaluated through matmul; it must equal materializing the product."""
    shapes = {"mm": ((5, 7), (7, 3), "mk,kn"), "bmm": ((2, 5, 7), (2, 7, 3), "bmk,bkn"),
              "transposed": ((7, 5), (3, 7), "km,nk"), "broadcast-batch": ((1, 5, 7), (4, 7, 3), "bmk,bkn"),
              "vector": ((7,), (7, 3), "k,kn")}
    sa, sb, _ = shapes[layout]
    a, b = inp("a", sa), inp("b", sb)
    from kiln.frontend.lowerings.reductions import matmul
    if layout == "transposed":
        a_, b_ = build.permute(a, (1, 0)), build.permute(b, (1, 0))
    elif layout == "vector":
        a_, b_ = build.reshape(a, (1, 7)), b
    else:
        a_, b_ = a, b
    out = matmul(a_, b_, DType.F32)
    product = out.inputs[0]
    va, vb = rng.standard_normal(sa).astype(np.float32), rng.standard_normal(sb).astype(np.float32)
    fast, materialized = evaluate([out, product], {a: va, b: vb})
    np.testing.assert_allclose(fast, materialized.sum(axis=product.rank - 2), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("axis", [0, 1])
def test_split_contraction_path_equals_elementwise_sum(axis):
    """SumReduce(Reshape(Mul)) over half of a split axis (rewrites/split.py) goes through matmul
    on views of the operands; it must equal materializing the product."""
    from kiln.frontend.lowerings.reductions import matmul
    a, b = inp("a", (5, 12)), inp("b", (12, 3))
    product = matmul(a, b, DType.F32).inputs[0]                     # [5, 12, 3], k at axis 1
    if axis == 0:
        product = build.permute(product, (1, 0, 2))               # not a Mul: the plain path
    split = (4, 3, 5, 3) if axis == 0 else (5, 4, 3, 3)
    partial = Node(Op.SUM_REDUCE, [build.reshape(product, split)], axis=axis + 1)
    va, vb = rng.standard_normal((5, 12)).astype(np.float32), rng.standard_normal((12, 3)).astype(np.float32)
    got, whole = evaluate([partial, product], {a: va, b: vb})
    np.testing.assert_allclose(got, whole.reshape(split).sum(axis=axis + 1), rtol=1e-5, atol=1e-5)


def test_low_precision_computes_in_f32_and_rounds_once():
    a, b = inp("a", (64,), DType.BF16), inp("b", (64,), DType.BF16)
    va = rng.standard_normal(64).astype(DType.BF16.np)
    vb = rng.standard_normal(64).astype(DType.BF16.np)
    out, = evaluate([Node(Op.ADD, [a, b])], {a: va, b: vb})
    assert out.dtype == DType.BF16.np
    np.testing.assert_array_equal(out, (va.astype(np.float32) + vb.astype(np.float32)).astype(DType.BF16.np))


def test_sum_of_bf16_accumulates_in_f32():
    x = inp("x", (4096,), DType.BF16)
    values = np.full(4096, 1.0, dtype=DType.BF16.np)
    out, = evaluate([Node(Op.SUM_REDUCE, [x], axis=0)], {x: values})
    assert float(out) == 4096.0  # a bf16 accumulator stalls at 256


def test_iota_and_symbolic_scalars():
    s = sym("s")
    ramp = build.iota(s, DType.I64, start=s, step=2)
    length = build.scalar_of(s * 3)
    out_ramp, out_len = evaluate([ramp, length], {}, {"s": 4})
    np.testing.assert_array_equal(out_ramp, [4, 6, 8, 10])
    assert int(out_len) == 12


def test_slice_update_writes_at_a_runtime_offset():
    cache, new, pos = inp("cache", (2, 8)), inp("new", (2, 3)), inp("pos", (), DType.I64)
    out = Node(Op.SLICE_UPDATE, [cache, new, pos], axis=1)
    vc, vn = rng.standard_normal((2, 8)).astype(np.float32), rng.standard_normal((2, 3)).astype(np.float32)
    got, = evaluate([out], {cache: vc, new: vn, pos: np.int64(4)})
    want = vc.copy()
    want[:, 4:7] = vn
    np.testing.assert_array_equal(got, want)
    with pytest.raises(IndexError, match="does not fit"):
        evaluate([out], {cache: vc, new: vn, pos: np.int64(6)})


def test_views_follow_numpy():
    x = inp("x", (2, 3, 4))
    v = rng.standard_normal((2, 3, 4)).astype(np.float32)
    cases = [
        (build.permute(x, (2, 0, 1)), np.transpose(v, (2, 0, 1))),
        (build.reshape(x, (6, 4)), v.reshape(6, 4)),
        (build.slice_axis(x, 2, 1, 4, 2), v[:, :, 1:4:2]),
        (Node(Op.PAD, [x], axis=1, before=const(1), after=const(2), value=-1.0),
         np.pad(v, [(0, 0), (1, 2), (0, 0)], constant_values=-1.0)),
        (Node(Op.CONCAT, [x, x], axis=0), np.concatenate([v, v], 0)),
        (build.broadcast_to(build.slice_axis(x, 0, 0, 1), (5, 3, 4)), np.broadcast_to(v[:1], (5, 3, 4))),
    ]
    outs = evaluate([c[0] for c in cases], {x: v})
    for got, (_, want) in zip(outs, cases):
        np.testing.assert_array_equal(got, want)


# --- graph calls ------------------------------------------------------------------------------
def _graph():
    s = sym("seq")
    x, w = inp("x", (1, s)), inp("w", (3,), role="weight")
    out = build.elementwise(Op.MUL, build.reshape(x, (1, s, 1)), w)
    return Graph(inputs=[x], outputs=[out], weights={"w": np.arange(3, dtype=np.float32)},
                 symbols={"seq": (2, 16)})


def test_graph_run_binds_symbols_from_input_shapes():
    v = rng.standard_normal((1, 5)).astype(np.float32)
    out, = run(_graph(), [v])
    np.testing.assert_array_equal(out, v[:, :, None] * np.arange(3, dtype=np.float32))


@pytest.mark.parametrize("value, error, match", [
    (np.zeros((2, 5), np.float32), ShapeError, r"input 0 \('x'\): expected shape \[1, seq\]"),
    (np.zeros((1, 5), np.int64), KilnTypeError, r"input 0 \('x'\): expected dtype f32"),
    (np.zeros((1, 40), np.float32), ShapeError, r"'seq' = 40 is outside its range \[2, 16\]"),
])
def test_graph_run_rejects_wrong_inputs_by_name(value, error, match):
    with pytest.raises(error, match=match):
        run(_graph(), [value])


def test_printer_names_weights_and_symbols():
    text = format_graph(_graph())
    assert "graph(x: f32[1, seq])  where 2 <= seq <= 16" in text
    assert "@w" in text and "return %" in text


# --- comparison with the reference ------------------------------------------------------------
def _weighed_whole(got, want, rtol):
    """The comparison over every element in float64, as it was before elements with the
    reference's very bits were passed over: the oracle the fast path must agree with."""
    got, want = got.astype(np.float64), want.astype(np.float64)
    finite = np.isfinite(want)
    if (~np.isfinite(got) & finite).any():
        return "nan"
    scale = float(np.abs(want[finite]).max()) if finite.any() else 1.0
    return None if np.allclose(got, want, rtol=rtol, atol=rtol * scale, equal_nan=True) else "wrong"


def test_comparison_passing_over_identical_bits_decides_as_the_whole_comparison():
    from kiln.ir.compare import RTOL, mismatch
    draws = np.random.default_rng(7)
    for dtype in (np.float32, np.float16, DType.BF16.np):
        rtol = RTOL[np.dtype(dtype)]
        for trial in range(300):
            want = (draws.standard_normal((4, 33)) * 10.0 ** draws.integers(-3, 4)).astype(dtype)
            if trial % 5 == 0:
                want.flat[draws.integers(want.size)] = [np.nan, np.inf, -np.inf][trial % 3]
            got = want.copy()
            for _ in range(draws.integers(0, 4)):         # a few elements off, by a little or a lot
                k = draws.integers(got.size)
                got.flat[k] = [got.flat[k] * (1 + 10.0 ** draws.integers(-6, 1)), np.nan, np.inf,
                               got.flat[k] + rtol][draws.integers(4)]
            result = mismatch(got, want, rtol)
            assert (result and result[0]) == _weighed_whole(got, want, rtol), (dtype, trial)
