"""The prefill program generation runs computes the last position's logits only: the restriction
is pushed back through what only the logits read, and the KV-cache outputs stay whole."""
from __future__ import annotations

import numpy as np

from kiln.ir import DType, Graph, Node, Op, run
from kiln.ir.build import elementwise, expand, permute, reduce, reshape
from kiln.ir.last_position import LENGTH, last_position, padded_length, prompt_args
from kiln.ir.symbolic import shape_of, sym


def _head_products_per_position(graph: Graph, vocab: int) -> int:
    """Multiplies into the vocabulary whose shape grows with the prompt length."""
    return sum(1 for n in graph.nodes() if n.op is Op.MUL and n.shape[-1:] == (vocab,)
               and any(not d.is_const for d in n.shape))


def test_a_causal_lm_prefill_gives_the_last_row_and_the_same_caches():
    from kiln.frontend.hf import lower_causal_lm
    from tests.helpers import tiny_llama
    graph = lower_causal_lm(tiny_llama(2, vocab_size=97), 16).prefill
    last = last_position(graph)
    rng = np.random.default_rng(0)
    for length in (2, 9):
        ids = rng.integers(0, 97, (1, length))
        full, part = run(graph, [ids]), run(last, [ids])
        assert part[0].shape == (1, 1, full[0].shape[2])
        np.testing.assert_allclose(part[0], full[0][:, -1:], rtol=1e-5, atol=1e-6)
        for whole, cache in zip(full[1:], part[1:]):       # every position's keys and values
            np.testing.assert_array_equal(cache, whole)
    # the vocabulary head's product is one row now, not one per position
    vocab = full[0].shape[2]
    assert _head_products_per_position(graph, vocab) == 1 and _head_products_per_position(last, vocab) == 0


def test_a_node_another_output_reads_is_sliced_not_recomputed():
    """y = sum(exp(x) * x over the last axis) is restricted, but exp(x), which the second output
    returns whole, is computed once and sliced."""
    x = Node(Op.INPUT, name="x", role="input", shape=shape_of((2, sym("t"), 3)), dtype=DType.F32)
    shared = Node(Op.EXP2, [x])
    y = reduce(Op.SUM_REDUCE, elementwise(Op.MUL, shared, x), [2])
    graph = Graph([x], [y, shared], symbols={"t": (1, 8)})
    last = last_position(graph)
    exps = [n for n in last.nodes() if n.op is Op.EXP2]
    assert exps == [shared]
    value = np.random.default_rng(1).standard_normal((2, 5, 3)).astype(np.float32)
    full, part = run(graph, [value]), run(last, [value])
    np.testing.assert_allclose(part[0], full[0][:, -1:], rtol=1e-6)
    np.testing.assert_array_equal(part[1], full[1])


def test_the_restriction_goes_through_permutes_broadcasts_and_reshapes():
    """A head-like chain: [1, t, 4] reshaped to [t, 4, 1], broadcast against a weight, summed,
    permuted: the result equals the full program's last index; a reshape that merges the axis
    with another one is sliced instead."""
    x = Node(Op.INPUT, name="x", role="input", shape=shape_of((1, sym("t"), 4)), dtype=DType.F32)
    w = Node(Op.INPUT, name="w", role="input", shape=shape_of((4, 6)), dtype=DType.F32)
    t = sym("t")
    product = elementwise(Op.MUL, expand(reshape(x, (t, 4, 1)), (t, 4, 6)), expand(reshape(w, (1, 4, 6)), (t, 4, 6)))
    head = permute(reshape(reduce(Op.SUM_REDUCE, product, [1]), (1, t, 6)), (0, 2, 1))      # [1, 6, t]
    merged = reshape(elementwise(Op.MUL, x, x), (1, t * 4))                                 # [1, 4t]
    graph = Graph([x, w], [head, merged], symbols={"t": (1, 8)})
    rng = np.random.default_rng(2)
    values = [rng.standard_normal((1, 7, 4)).astype(np.float32), rng.standard_normal((4, 6)).astype(np.float32)]
    for output, axis in ((0, 2), (1, 1)):
        last = last_position(graph, output, axis)
        full, part = run(graph, values)[output], run(last, values)[output]
        want = np.take(full, [full.shape[axis] - 1], axis=axis)
        np.testing.assert_allclose(part, want, rtol=1e-6)
    assert any(n.op is Op.SLICE for n in last_position(graph, 1, 1).nodes())


def test_a_padded_prompt_gives_its_last_real_position_and_its_caches():
    """at_length: ids padded past the prompt give the logits of the prompt's last token and, for
    the prompt's positions, the caches of the unpadded prompt (causal attention keeps the real
    positions blind to the padding)."""
    from kiln.frontend.hf import lower_causal_lm
    from tests.helpers import tiny_llama
    graph = lower_causal_lm(tiny_llama(2, vocab_size=97), 40).prefill
    at = last_position(graph, at_length=True)
    assert at.inputs[-1].attrs["name"] == LENGTH and at.symbols[LENGTH] == (1, 40)
    rng = np.random.default_rng(3)
    for length in (2, 9, 33):
        ids = rng.integers(0, 97, (1, length))
        full = run(graph, [ids])
        args = prompt_args(at, ids, pad=True)
        assert args[0].shape[1] == padded_length(length, 40) >= length
        part = run(at, args)
        np.testing.assert_allclose(part[0], full[0][:, -1:], rtol=1e-5, atol=1e-6)
        for whole, cache in zip(full[1:], part[1:]):      # caches are [1, heads, max_seq + 1, dim]
            np.testing.assert_allclose(cache[:, :, :length], whole[:, :, :length], rtol=1e-5, atol=1e-6)
        unpadded = run(at, prompt_args(at, ids))
        np.testing.assert_allclose(unpadded[0], full[0][:, -1:], rtol=1e-5, atol=1e-6)


def test_prompts_pad_to_a_few_lengths():
    assert [padded_length(n, 704) for n in (1, 2, 32, 33, 64, 65, 300, 512, 513, 704)] == \
        [32, 32, 32, 64, 64, 128, 512, 512, 704, 704]
    assert padded_length(5, 16) == 16


def test_prefill_is_recorded_at_each_prompt_length_and_decode_once():
    """A recording holds the symbols the inputs a graph reads give (a prompt's length: every
    product's rows) and reads the others on the device (decode's window, a padded prompt's real
    length): decode records once, prefill at each (padded) length."""
    from kiln.frontend.hf import lower_causal_lm
    from kiln.runtime.compiled import read_inputs, replays
    from kiln.runtime.executor import fixed_symbols
    from tests.helpers import tiny_llama
    lm = lower_causal_lm(tiny_llama(1), 16)
    at = last_position(lm.prefill, at_length=True)
    assert all(replays(g) for g in (lm.decode, lm.prefill, at))
    assert fixed_symbols(read_inputs(lm.decode)) == frozenset()
    assert fixed_symbols(read_inputs(at)) == {at.inputs[0].shape[1].symbol_name}


def test_every_kernel_of_a_last_position_prefill_has_a_cuda_configuration_space():
    """The last layer's products have fixed extents but read their row at an offset the prompt
    length gives: whether cuBLAS takes one is decided at the call's sizes, not at none."""
    from kiln.codegen.library import LibraryConfig, as_gemm
    from kiln.codegen.policy import POLICIES
    from kiln.codegen.schedule import schedule
    from kiln.frontend.hf import lower_causal_lm
    from kiln.runtime.cuda import CudaBackend
    from kiln.compiler.measure import kernel_space
    from tests.helpers import tiny_llama
    graph = last_position(lower_causal_lm(tiny_llama(1), 16).prefill, at_length=True)
    seq = graph.inputs[0].shape[1].symbol_name
    offset_only = 0
    for policy in POLICIES.values():
        for kernel in schedule(graph, policy).kernels:
            space = CudaBackend.config_space(kernel)
            gemm = as_gemm(kernel)
            if gemm is not None and gemm.symbols and all(e.is_const for e in gemm.extents.values()):
                offset_only += 1
                assert LibraryConfig() in space, kernel.label
                # where the prefill replays recordings, the row's offset (the prompt's real
                # length, which varies between replays) keeps it to generated code
                assert LENGTH in gemm.symbols
                assert LibraryConfig() not in kernel_space(CudaBackend, kernel, True, frozenset({seq}))
    assert offset_only
