"""Candidate extraction: every candidate is acyclic, distinct, and computes what the original does."""
import functools
import itertools
import random

import numpy as np
import pytest
import torch

import kiln
from kiln.ir import DType, Node, Op, build, evaluate
from kiln.ir.symbolic import shape_of
from kiln.rewrites.registry import library
from kiln.search import extract
from kiln.search.adapter import EClass, EGraphView, ENode
from kiln.ir.compare import agrees
from kiln.search.saturate import saturate
from kiln.tests.helpers import Logits, tiny_llama


def assert_valid(view: EGraphView, genome) -> None:
    """Reachable classes have a choice, the others none, and the chosen graph has no cycle."""
    s = extract.space(view)
    colour = [0] * len(genome)                      # 0 unseen, 1 on the path, 2 done
    for root in s.roots:
        stack = [(root, False)]
        while stack:
            c, leaving = stack.pop()
            if leaving:
                colour[c] = 2
                continue
            if colour[c] == 2:
                continue
            assert colour[c] == 0, f"cycle through {s.class_ids[c]}"
            assert genome[c] >= 0, f"{s.class_ids[c]} is reached but has no choice"
            colour[c] = 1
            stack.append((c, True))
            stack.extend((k, False) for k in s.children[c][genome[c]] if colour[k] != 2)
    assert all((g >= 0) == (col == 2) for g, col in zip(genome, colour)), "unreached classes chosen"


def run_all(outputs, feeds, env=None):
    return evaluate(outputs, feeds, env or {})


# --- a hand-made e-graph with cycles -------------------------------------------------------------
def cyclic_view() -> EGraphView:
    """R = A + B | B + A;  A = x | A * one | exp2(B);  B = log2(A) | y;  one = 1.
    A * one closes a cycle at once, exp2(B) with B = log2(A) through B. The leaves x, y and 1 are
    Input/Constant e-nodes whose attribute children are left out: nothing here decodes them."""
    def cls(cid, *nodes):
        return EClass(cid, "Term", [ENode(f"{cid}.{k}", op, kids) for k, (op, kids) in enumerate(nodes)])
    classes = [cls("R", ("Add", ("A", "B")), ("Add", ("B", "A"))),
               cls("A", ("Input", ()), ("Mul", ("A", "one")), ("Exp2", ("B",))),
               cls("B", ("Log2", ("A",)), ("Input", ())),
               cls("one", ("Constant", ()))]
    return EGraphView({c.id: c for c in classes}, ["R"])


def acyclic_choices(view: EGraphView) -> set:
    """Every acyclic choice, restricted to the reachable classes, by brute force."""
    s = extract.space(view)
    out = set()
    for picks in itertools.product(*(range(len(n)) for n in s.enodes)):
        genome = extract._reachable_only(s, list(picks))
        try:
            assert_valid(view, genome)
        except AssertionError:
            continue
        out.add(genome)
    return out


def test_draws_are_acyclic_and_reach_every_acyclic_choice():
    view = cyclic_view()
    every = acyclic_choices(view)
    assert len(every) == 6   # R's 2 orders x (A, B) in {(x, log2 A), (x, y), (exp2 B, y)}
    rng = random.Random(0)
    drawn = [extract.draw(view, rng) for _ in range(2000)]
    for genome in drawn:
        assert_valid(view, genome)
    assert set(drawn) == every
    counts = {g: drawn.count(g) for g in every}
    assert min(counts.values()) > 2000 / len(every) / 4   # uniform-ish: no choice starved


def test_candidates_are_distinct_and_stop_when_the_space_is_exhausted():
    view = cyclic_view()
    found = extract.candidates(view, 1000, random.Random(1))
    assert len(found) == len(acyclic_choices(view))
    assert len({c.key for c in found}) == len(found)


def test_mutation_and_crossover_keep_choices_acyclic():
    view = cyclic_view()
    rng = random.Random(2)
    parents = [extract.draw(view, rng) for _ in range(20)]
    for a, b in zip(parents, parents[1:]):
        assert_valid(view, extract.mutate(a, view, rng, rate=0.9))
        assert_valid(view, extract.crossover(a, b, view, rng))


def test_identity_rule_cycle_in_a_real_egraph():
    """`x * 1 = x` merges Mul(x, 1) into x's class: the class then reads itself."""
    x, w = (Node(Op.INPUT, name=n, role="input", shape=shape_of((3, 4)),
                                dtype=DType.F32) for n in "xw")
    y = build.elementwise(Op.MUL, x, build.constant(1.0, DType.F32))
    mul, add = (functools.partial(build.elementwise, op) for op in (Op.MUL, Op.ADD))
    z = add(Node(Op.EXP2, [y]), mul(mul(y, w), add(x, w)))
    sat = saturate([z], list(library().values()), isolate=False)
    view = sat.graph
    s = extract.space(view)
    assert any(c in kids for c, nodes in enumerate(s.children) for kids in nodes), "no cycle formed"
    feeds = {n: np.random.default_rng(k).standard_normal((3, 4)).astype(np.float32)
             for k, n in enumerate((x, w))}
    want = run_all([z], feeds)
    found = extract.candidates(view, 500, random.Random(3))
    assert len(found) > 4
    for c in found:
        assert_valid(view, c.genome)
        assert agrees(run_all(extract.decode(sat.encoded, view, c.genome), feeds)[0], want[0])


# --- lowered programs: thousands of candidates against the reference ----------------------------
class Block(torch.nn.Module):
    """A small attention-like block: matmuls, softmax, a residual and an RMS norm."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(8, 8))
        self.v = torch.nn.Parameter(torch.randn(8, 8))
        self.g = torch.nn.Parameter(torch.randn(8))

    def forward(self, x):
        scores = torch.softmax((x @ self.w) @ x.transpose(-1, -2) * 0.3, dim=-1)
        h = x + scores @ (x @ self.v)
        return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * self.g


def check_candidates(graph, sat, args, n, rng):
    feeds = dict(zip(graph.inputs, args)) | {w: graph.weights[w.attrs["name"]] for w in graph.weight_nodes()}
    env = graph.bind_symbols([a.shape for a in args], [a.dtype for a in args])
    want = run_all(graph.outputs, feeds, env)
    found = extract.candidates(sat.graph, n, rng)
    assert len(found) == n
    programs = []
    for c in found:
        assert_valid(sat.graph, c.genome)
        outputs = extract.decode(sat.encoded, sat.graph, c.genome)
        programs.append(outputs)                     # kept alive: hash-consed nodes compare by id
        got = run_all(outputs, feeds, env)
        assert all(agrees(g, w) for g, w in zip(got, want)), f"candidate {c.key} differs"
    assert len({tuple(map(id, p)) for p in programs}) == n, "two candidates rebuilt the same program"
    return found


def test_two_thousand_candidates_of_a_small_block_equal_the_reference():
    torch.manual_seed(0)
    graph = kiln.lower(Block().eval(), (torch.randn(5, 8),))
    sat = saturate(graph.outputs, list(library().values()))
    args = [np.random.default_rng(0).standard_normal((5, 8)).astype(np.float32)]
    check_candidates(graph, sat, args, 2000, random.Random(4))


@pytest.fixture(scope="module")
def llama_one_layer():
    """A 1-layer random Llama's logits for 6 tokens, saturated with the whole rule library."""
    graph = kiln.lower(Logits(tiny_llama(1)), (torch.randint(0, 64, (1, 6)),))
    return graph, saturate(graph.outputs, list(library().values()))


def test_candidates_of_a_one_layer_llama_equal_the_reference(llama_one_layer):
    graph, sat = llama_one_layer
    args = [np.random.default_rng(1).integers(0, 64, (1, 6))]
    check_candidates(graph, sat, args, 600, random.Random(5))


def test_genetic_candidates_are_new_valid_and_correct(llama_one_layer):
    graph, sat = llama_one_layer
    rng = random.Random(6)
    scored = [(c.genome, rng.random()) for c in extract.candidates(sat.graph, 40, rng)]
    bred = extract.genetic_candidates(sat.graph, scored, 100, rng)
    assert len(bred) == 100
    assert len({c.genome for c in bred} | {g for g, _ in scored}) == 140
    args = [np.random.default_rng(2).integers(0, 64, (1, 6))]
    feeds = {graph.inputs[0]: args[0]} | {w: graph.weights[w.attrs["name"]] for w in graph.weight_nodes()}
    env = {}
    want = run_all(graph.outputs, feeds, env)
    for c in bred:
        assert_valid(sat.graph, c.genome)
    for c in bred[:20]:
        got = run_all(extract.decode(sat.encoded, sat.graph, c.genome), feeds, env)
        assert all(agrees(g, w) for g, w in zip(got, want))
