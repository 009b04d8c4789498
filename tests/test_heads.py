"""The `heads` fusion policy (codegen/heads.py): a decode layer's attention as one kernel a head,
the output projection's partials summed by the kernels that read them, checked against the
reference interpreter."""
import numpy as np
import pytest

from kiln.codegen.heads import split_by_heads
from kiln.codegen.schedule import POLICIES, schedule
from kiln.ir import regions as regionlib, run
from kiln.ir.decode import decode_args

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
    graph, partials = split_by_heads(grouped_lm.decode)
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


@pytest.mark.parametrize("pos", [0, 6, 15])
def test_the_heads_policy_computes_what_the_interpreter_does(grouped_lm, rng, pos):
    check(grouped_lm.decode, _args(grouped_lm, rng, pos), policies=[POLICIES[HEADS]], sets=(0, 1, 2))


def test_a_prefill_has_nothing_to_split(grouped_lm):
    """A prompt's attention output is [position, head, depth]: no product sums a [head, depth]
    value alone, so prefill keeps its projections whole (its GEMMs are library calls)."""
    graph, partials = split_by_heads(grouped_lm.prefill)
    assert not partials and graph is grouped_lm.prefill
