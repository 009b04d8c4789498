"""Layer dedupe: a model splits at its residual stream, identical layers hash alike, and region
programs chosen per distinct region stitch back into a graph that computes the original."""
import random

import numpy as np
import pytest

from kiln.ir import DType, Graph, Node, Op, build, evaluate, run
from kiln.ir.decode import decode_args
from kiln.ir.symbolic import shape_of
from kiln.rewrites.registry import library
from kiln.ir import regions
from kiln.search import extract
from kiln.ir.compare import agrees
from kiln.search.saturate import saturate
from kiln.tests.helpers import tiny_llama


@pytest.fixture(scope="module")
def llama_three_layers():
    from kiln.frontend import hf
    return hf.lower_causal_lm(tiny_llama(3), max_seq=16)


def call_args(lm, which: str) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    if which == "prefill":
        return [rng.integers(0, 64, (1, 6))]
    caches = [rng.standard_normal(lm.cache.shape).astype(np.float32) for _ in range(2 * lm.cache.layers)]
    return decode_args(lm.decode, np.array([[5]]), 4, caches)


@pytest.mark.parametrize("which", ["prefill", "decode"])
def test_three_layers_are_one_distinct_region(llama_three_layers, which):
    graph = getattr(llama_three_layers, which)
    parts = regions.split(graph)
    assert [r.label for r in parts] == ["prologue", "layer 0", "layer 1", "layer 2", "epilogue"]
    groups = regions.distinct(parts)
    assert len(groups) == 3
    layers = groups[parts[1].key]
    assert [r.label for r in layers] == ["layer 0", "layer 1", "layer 2"]
    # one program for all three: the same Nodes, fed different weights
    assert all(r.outputs == layers[0].outputs for r in layers)
    names = [{f.attrs["name"] for f in r.feeds if ".layers." in f.attrs.get("name", "")} for r in layers]
    assert all(names) and names[0].isdisjoint(names[1]), "each layer reads its own weights"


@pytest.mark.parametrize("which", ["prefill", "decode"])
def test_each_region_program_computes_what_it_stands_for(llama_three_layers, which):
    graph = getattr(llama_three_layers, which)
    parts = regions.split(graph)
    args = call_args(llama_three_layers, which)
    inflows, env = regions.sample_inflows(graph, parts, args)
    leaves = dict(zip(graph.inputs, args)) | {w: graph.weights[w.attrs["name"]] for w in graph.weight_nodes()}
    for region, feeds in zip(parts, inflows):
        got = evaluate(region.outputs, feeds, env)
        want = evaluate(region.produces, leaves, env)
        assert all(np.array_equal(g, w) for g, w in zip(got, want)), region.label
        program = region.program(graph)
        got = run(program, [feeds[i] for i in program.inputs], env)
        assert all(np.array_equal(g, w) for g, w in zip(got, want)), region.label


@pytest.mark.parametrize("which", ["prefill", "decode"])
def test_stitched_candidates_equal_the_original(llama_three_layers, which):
    graph = getattr(llama_three_layers, which)
    parts = regions.split(graph)
    assert regions.stitch(graph, parts).outputs == graph.outputs   # nothing chosen: the same nodes
    args = call_args(llama_three_layers, which)
    want = run(graph, args)
    rng = random.Random(0)
    rules = list(library().values())
    saturated = {key: saturate(group[0].outputs, rules, isolate=False)
                 for key, group in regions.distinct(parts).items()}
    changed = 0
    for _ in range(3):  # a fresh candidate per distinct region, searched once, used by every copy
        chosen = {key: extract.decode(sat.encoded, sat.graph, extract.draw(sat.graph, rng))
                  for key, sat in saturated.items()}
        stitched = regions.stitch(graph, parts, chosen)
        changed += stitched.outputs != graph.outputs
        assert all(agrees(g, w) for g, w in zip(run(stitched, args), want))
    assert changed, "the candidates never changed the program"


@pytest.mark.parametrize("which", ["prefill", "decode"])
def test_no_region_outputs_a_view(llama_three_layers, which):
    """A view read across a cut is taken in by its readers and its source crosses instead: a view
    as a region's output would be a copy kernel (decode's rotary tables expanded to the heads)."""
    graph = getattr(llama_three_layers, which)
    outputs = {id(o) for o in graph.outputs}
    views = {Op.RESHAPE, Op.EXPAND, Op.PERMUTE, Op.SLICE}
    for region in regions.split(graph):
        crossing = [p for p in region.produces if p.op in views and id(p) not in outputs]
        assert not crossing, f"{region.label} outputs views {[p.op.value for p in crossing]}"


def test_prefill_computes_its_rotary_tables_and_mask_once(llama_three_layers):
    """Values no user input reaches that every layer reads through a view (a prefill's rotary
    tables from an iota of positions, its causal mask) are computed in the prologue and flow into
    the layers: each layer once computed them again (six kernels a layer on Llama-3.2-1B)."""
    from kiln.ir.graph import toposort
    parts = regions.split(llama_three_layers.prefill)
    computed = [{n.op for n in toposort(r.outputs)} for r in parts]
    assert Op.SIN in computed[0]
    assert all(Op.SIN not in ops and Op.MOD not in ops for ops in computed[1:-1])


def test_a_graph_without_layers_is_one_region():
    x = Node(Op.INPUT, name="x", role="input", shape=shape_of((2, 3)), dtype=DType.F32)
    w = Node(Op.INPUT, name="proj.weight", role="weight", shape=shape_of((2, 3)), dtype=DType.F32)
    y = build.elementwise(Op.ADD, Node(Op.EXP2, [x]), w)
    graph = Graph([x], [y, build.constant(2.0, DType.F32)],
                  weights={"proj.weight": np.ones((2, 3), np.float32)})
    parts = regions.split(graph)
    assert [r.label for r in parts] == ["whole"]
    args = [np.arange(6, dtype=np.float32).reshape(2, 3)]
    stitched = regions.stitch(graph, parts)
    assert all(np.array_equal(a, b) for a, b in zip(run(stitched, args), run(graph, args)))


def test_region_hash_ignores_names_but_not_structure():
    def layer(prefix: str, scale: float) -> regions.Region:
        x = Node(Op.INPUT, name=f"{prefix}.x", role="input", shape=shape_of((4,)), dtype=DType.F32)
        w = Node(Op.INPUT, name=f"{prefix}.w", role="weight", shape=shape_of((4,)), dtype=DType.F32)
        y = build.elementwise(Op.MUL, build.elementwise(Op.ADD, x, w), build.constant(scale, DType.F32))
        return regions.split(Graph([x], [y], weights={f"{prefix}.w": np.ones(4, np.float32)}))[0]

    assert layer("a", 2.0).key == layer("b", 2.0).key
    assert layer("a", 2.0).key != layer("a", 3.0).key
