"""The egglog adapter: every op survives IR -> e-graph -> JSON view -> IR unchanged."""
import math

import numpy as np

from kiln.ir import DType, Node, Op, build, evaluate
from kiln.ir.ops import UNARY
from kiln.ir.symbolic import Expr, sym
from kiln.search.adapter import Decoder, dump, encode, new_egraph, view
from kiln.search.language import CONSTRUCTORS, FIELDS


def program_with_every_op() -> list[Node]:
    s = sym("seq")
    x = Node(Op.INPUT, name="x", role="input", shape=(s, Expr.of(4)), dtype=DType.F32)
    w = Node(Op.INPUT, name="w", role="weight", shape=(Expr.of(4), Expr.of(3)), dtype=DType.F32)
    pos = Node(Op.INPUT, name="pos", role="input", shape=(), dtype=DType.I64)
    y = build.elementwise(Op.ADD, x, build.constant(-0.0, DType.F32))
    for op in UNARY:      # a unary op added to the table joins the program by itself
        y = Node(op, [y])
    y = build.elementwise(Op.MUL, y, build.constant(math.inf, DType.F32))
    y = build.elementwise(Op.MOD, y, build.constant(3.5, DType.F32))
    mask = build.elementwise(Op.LESS_THAN, y, build.constant(math.nan, DType.F32))
    y = build.elementwise(Op.WHERE, mask, y, build.constant(1.0, DType.F32))
    mm = Node(Op.SUM_REDUCE, [build.elementwise(
        Op.MUL, build.reshape(y, (s, 4, 1)), build.permute(build.permute(w, (1, 0)), (1, 0)))], axis=1)
    top = Node(Op.MAX_REDUCE, [mm], axis=1)
    ramp = build.cast(build.iota(s, DType.I64, start=s * 2 + 1), DType.F32)
    table = Node(Op.GATHER, [w, build.cast(build.iota(2, DType.I32), DType.I64)], axis=0)
    padded = Node(Op.PAD, [Node(Op.SLICE, [mm], axis=1, start=Expr.of(1), stop=Expr.of(3), step=1)],
                  axis=1, before=Expr.of(0), after=Expr.of(1), value=-1.0)
    joined = Node(Op.CONCAT, [padded, mm, padded], axis=0)
    cache = Node(Op.SLICE_UPDATE, [build.constant(0.0, DType.F32, (8, 3)), table, pos], axis=0)
    flag = build.constant(True, DType.BOOL, (s,))
    return [top, ramp, joined, cache, build.reshape(table, (6,)), build.reshape(pos, ()), flag,
            build.constant(-7, DType.I32)]


def test_every_op_has_a_constructor_and_fields():
    assert set(FIELDS) == set(Op) == set(CONSTRUCTORS)


def test_round_trip_returns_the_same_nodes():
    outputs = program_with_every_op()
    assert {n.op for n in build_all(outputs)} == set(Op)
    enc, graph = encoded_view(outputs)
    assert len(graph.term_classes) == len(build_all(outputs)) == graph.enode_count()
    choice = {c.id: c.nodes[0] for c in graph.classes.values()}
    rebuilt = Decoder(enc, graph).build(choice)
    assert all(a is b for a, b in zip(rebuilt, outputs))  # hash-consing: same structure, same node


def test_round_trip_of_a_lowered_model_evaluates_the_same():
    import torch
    import kiln
    from kiln.tests.helpers import Logits, tiny_llama
    g = kiln.lower(Logits(tiny_llama(1)), (torch.randint(0, 64, (1, 6)),))
    enc, graph = encoded_view(g.outputs)
    rebuilt = Decoder(enc, graph).build({c.id: c.nodes[0] for c in graph.classes.values()})
    ids = np.random.default_rng(1).integers(0, 64, (1, 6))
    feeds = {n: g.weights[n.attrs["name"]] for n in g.weight_nodes()} | {g.inputs[0]: ids}
    np.testing.assert_array_equal(evaluate(rebuilt, feeds)[0], evaluate(g.outputs, feeds)[0])


def encoded_view(outputs):
    enc = encode(outputs)
    return enc, view(enc, dump(new_egraph(enc)))


def build_all(outputs):
    from kiln.ir import toposort
    return toposort(outputs)
