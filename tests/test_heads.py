"""The `heads` fusion policy (codegen/heads.py): a decode layer's attention as one kernel a head,
the output projection's partials summed by the kernels that read them, checked against the
reference interpreter."""
import numpy as np
import pytest

from kiln.codegen.heads import _heads, split_by_heads
from kiln.codegen.kernel import split_reductions
from kiln.codegen.packing import PackedWeights
from kiln.codegen.policy import POLICIES
from kiln.codegen.schedule import schedule
from kiln.ir import Graph, Node, Op, regions as regionlib, run
from kiln.ir.build import reshape
from kiln.ir.regions import rebuild
from kiln.ir.decode import decode_args
from kiln.runtime.cpu import CpuBackend

from .helpers import tiny_llama
from .kernel_check import check

HEADS = next(key for key, policy in POLICIES.items() if policy.heads)


@pytest.fixture
def rng():
    return np.random.default_rng(3)


@pytest.fixture(scope="module")
def grouped_lm():
    """Four query heads of depth 16 over two KV heads, two layers."""
    from kiln.frontend.hf import lower_causal_lm
    return lower_causal_lm(tiny_llama(2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2), 16)


def _args(lowered, rng, pos: int) -> list[np.ndarray]:
    caches = [c.shape for c in lowered.cache.zeros()]
    return decode_args(lowered.decode, rng.integers(0, 64, (1, 1)), pos,
                       [rng.standard_normal(s).astype(np.float32) for s in caches])


def test_the_output_projection_splits_by_head_and_keeps_its_value(grouped_lm, rng):
    graph, partials, packings = split_by_heads(grouped_lm.decode)
    # one split a layer: the products over the heads' outputs laid end to end
    assert len(partials) == 2
    shapes = {tuple(d.value for d in n.shape if d != 1) for n in graph.nodes() if id(n) in partials}
    assert shapes == {(4, 64)}
    args = _args(grouped_lm, rng, 9)
    want = run(grouped_lm.decode, [a.copy() for a in args])
    got = run(graph, [a.copy() for a in args])
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def test_a_decode_layer_runs_as_four_kernels(grouped_lm):
    """The caches' update, attention with the head's slice of the output projection, gate and up,
    down with the residual: the query's projection, scores, softmax and the partials' sum hold no
    kernel of their own."""
    graph = grouped_lm.decode
    layer = regionlib.split(graph)[1]
    program = schedule(layer.program(graph), POLICIES[HEADS])
    assert len(program.kernels) == 4
    attention = program.kernels[1]
    assert [str(e) for _, e in attention.loops] == ["4", "64"]      # a head, an output feature


def test_a_heads_slice_of_the_output_projection_is_read_contiguously(grouped_lm):
    """The projection's weight, [feature, head·depth + d], is read from a head-major copy: a
    head's slice is one contiguous block, not a run of `depth` values a row."""
    graph = grouped_lm.decode
    layer = regionlib.split(graph)[1].program(graph)
    program = schedule(layer, POLICIES[HEADS])
    (name, packing), = program.packings.items()
    weight, copy = layer.weights[packing.source], PackedWeights(layer.weights, program.packings)[name]
    assert weight.shape == (64, 64) and copy.shape == (4, 64, 16) and copy.flags.c_contiguous
    for head in range(4):
        np.testing.assert_array_equal(copy[head], weight[:, 16 * head:16 * (head + 1)])
    sources = [{program.buffers[b.name].source for b in k.inputs} for k in program.kernels]
    assert name in sources[1] and not any(packing.source in s for s in sources)


def test_gate_and_up_sum_the_partials_and_square_the_residual_once(grouped_lm):
    """The merged gate and up kernel reads the residual the partials complete: its norm's sum of
    squares is one reduction, though each product's copy names its inner sum apart."""
    graph = grouped_lm.decode
    layer = regionlib.split(graph)[1].program(graph)
    gate_up = schedule(layer, POLICIES[HEADS]).kernels[2]
    assert gate_up.also, "gate and up are one kernel"
    once, _ = split_reductions(*(w.value for w in gate_up.writes))
    assert sorted(r.extent.value for r in once) == [64, 64, 64]       # squares, gate's row, up's row


def _read_at(program, kernel, roles) -> dict[str, int]:
    """How many places in the kernel's C read each of its inputs of these roles, by source."""
    _, source = CpuBackend().render(kernel, CpuBackend.default_config(kernel))
    return {program.buffers[b.name].source or b.name: source.count(f"{b.name}[") for b in kernel.inputs
            if program.buffers[b.name].role in roles}


def test_a_heads_kernel_computes_its_scores_and_its_query_once(grouped_lm):
    """Softmax's max, its sum and P.V's weights read one row of scores, and rotary reads a query
    feature's partner from the row of projections: the query's weight and the caches are each
    read at one place, not once for each of the four score loops and twice for the query."""
    graph = grouped_lm.decode
    program = schedule(regionlib.split(graph)[1].program(graph), POLICIES[HEADS])
    reads = _read_at(program, program.kernels[1], ("weight", "temp"))
    assert len(reads) == 5 and set(reads.values()) == {1}, reads   # norm, query, output; the caches


def test_gate_and_up_add_up_the_heads_partials_once(grouped_lm):
    """The residual the partials complete is read by the norm's sum of squares and by the
    normalized row: the partials are added up once, a head's row at a time."""
    graph = grouped_lm.decode
    program = schedule(regionlib.split(graph)[1].program(graph), POLICIES[HEADS])
    partials = _read_at(program, program.kernels[2], ("temp",))
    assert list(partials.values()) == [1], partials


@pytest.mark.parametrize("pos", [0, 6, 15])
def test_the_heads_policy_computes_what_the_interpreter_does(grouped_lm, rng, pos):
    check(grouped_lm.decode, _args(grouped_lm, rng, pos), policies=[POLICIES[HEADS]], sets=(0, 1, 2))


def _query_projection_split_in_two(graph):
    """`graph` with the query's projection (64 features from the hidden size, 64) summed as two
    sums of 32, nested: what the search's split rule makes of it (rewrites/split.py)."""
    def swap(node):
        if node.op is Op.SUM_REDUCE and node.inputs[0].op is Op.MUL and _heads(node) is None:
            axis, product = node.attrs["axis"], node.inputs[0]
            if product.shape[axis] == 64 and node.shape[-1] == 64:
                parts = reshape(product, (*product.shape[:axis], 2, 32, *product.shape[axis + 1:]))
                return Node(Op.SUM_REDUCE, [Node(Op.SUM_REDUCE, [parts], axis=axis + 1)], axis=axis)
        return None
    return Graph(inputs=graph.inputs, outputs=rebuild(graph.outputs, swap), weights=graph.weights,
                 symbols=graph.symbols, out_spec=graph.out_spec, in_spec=graph.in_spec)


@pytest.mark.parametrize("pos", [0, 9])
def test_a_query_projection_whose_sum_is_split_runs_under_the_heads_policy(grouped_lm, rng, pos):
    """A head's query row staged from a sum split in two: the row is computed outside the
    reductions the head's loop nests, so it reads none of their variables (a rewritten program
    once failed to compile on `r6 undeclared`)."""
    check(_query_projection_split_in_two(grouped_lm.decode), _args(grouped_lm, rng, pos),
          policies=[POLICIES[HEADS]], sets=(0, 1))


def test_a_prefill_has_nothing_to_split(grouped_lm):
    """A prompt's attention output is [position, head, depth]: no product sums a [head, depth]
    value alone, so prefill keeps its projections whole (its GEMMs are library calls)."""
    graph, partials, packings = split_by_heads(grouped_lm.prefill)
    assert not partials and not packings and graph is grouped_lm.prefill
