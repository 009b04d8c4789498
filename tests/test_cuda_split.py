"""A split configuration of the query projection with its rotary, at a prompt's last position.
There the projection's points are fixed (one position), so a split is offered; the rotary's
partner row is chosen by a bind, and the prompt's length is a symbol of the kernel. The emitter
once kept the two rows' sums in loops of their own, taking the symbol for the variable of a loop
not open, and every split of that kernel crashed its candidate: 306 of a Llama-3.2-1B compile's
candidates on an H100, the merged policies' (benchmarks/h100-llama-3.2-1b-bf16-cold-2026-12-06-failures.txt).
So did every decode-layer candidate of the merge-rows policies: softmax's maximum and its guard,
which a rewrite leaves in a kernel of their own, read the live window. Without a GPU the source
runs on the CPU through tests/cuda_on_cpu.py's shim."""
from __future__ import annotations

import random
import shutil

import numpy as np
import pytest

from kiln.codegen.c_emit import STORAGE
from kiln.codegen.cuda_config import config_space, point_reductions, split_scratch
from kiln.codegen.cuda_emit import emit_cuda
from kiln.codegen.policy import POLICIES
from kiln.codegen.schedule import schedule
from kiln.ir import DType, evaluate
from kiln.ir.compare import mismatch, tolerance
from kiln.ir.last_position import last_position, prompt_args
from tests.test_cuda import tiny_case


def _split_rotary_kernel():
    """The tiny bf16 Llama's last-position prefill under the merge policy, its kernel whose sums
    share one loop only through a bind (rotary's partner row), and the program and graph."""
    _, lm = tiny_case("tiny1_bf16")
    graph = last_position(lm.prefill, at_length=True)
    program = schedule(graph, POLICIES["inline64-bcast16-epilogue-merge"])
    kernel = next(k for k in program.kernels if len(point_reductions(k)) == 2 and k.symbols
                  and any(c.split > 1 for c in config_space(k)))
    return kernel, program, graph


def test_every_split_the_last_position_is_offered_renders():
    """Each configuration of each kernel of the last-position prefill, under each CUDA policy,
    renders; the rotary projection's split sums its two rows in one loop."""
    _, lm = tiny_case("tiny1_bf16")
    graph = last_position(lm.prefill, at_length=True)
    splits = 0
    for policy in (p for p in POLICIES.values() if "cuda" in p.backends):
        for kernel in schedule(graph, policy).kernels:
            for config in config_space(kernel):
                assert emit_cuda(kernel, config, "k")
                splits += config.split > 1
    assert splits
    kernel, _, _ = _split_rotary_kernel()
    config = next(c for c in config_space(kernel) if c.split > 1)
    assert emit_cuda(kernel, config, "k").count("for (int64_t kiln_base") == 1


def test_every_configuration_of_drawn_decode_layer_candidates_renders():
    """Rewritten programs, as the search draws them from a decode layer's e-graph, under the
    merge-rows policies (where every candidate crashed): each configuration of each kernel renders,
    the splits among them."""
    from kiln.ir import regions as regionlib
    from kiln.rewrites.registry import library
    from kiln.runtime.compiled import region_graph
    from kiln.search import extract
    from kiln.search.saturate import Limits, saturate
    _, lm = tiny_case("tiny2_f32")
    layer = next(group[0] for group in regionlib.distinct(regionlib.split(lm.decode)).values() if len(group) > 1)
    saturated = saturate(layer.outputs, list(library().values()), Limits(max_seconds=10))
    policies = [p for p in POLICIES.values() if "cuda" in p.backends and p.merges and p.rows]
    splits = 0
    for candidate in extract.candidates(saturated.graph, 6, random.Random(0)):
        outputs = extract.decode(saturated.encoded, saturated.graph, candidate.genome)
        for policy in policies:
            for kernel in schedule(region_graph(lm.decode, layer, outputs), policy).kernels:
                for config in config_space(kernel):
                    assert emit_cuda(kernel, config, "k")
                    splits += config.split > 1
    assert policies and splits


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed here")
@pytest.mark.parametrize("parts", [4, 16])
def test_a_split_rotary_projection_run_on_the_cpu_equals_the_interpreter(tmp_path, parts):
    """Launched twice (the last block to arrive resets its counters for the next launch), on a
    random 5-token prompt, against the interpreter's value of the node the kernel computes."""
    from tests.cuda_on_cpu import build, launch
    kernel, program, graph = _split_rotary_kernel()
    config = next(c for c in config_space(kernel) if c.split == parts)
    ids = np.random.default_rng(7).integers(0, 64, (1, 5))
    args = prompt_args(graph, ids)
    env = graph.bind_symbols([np.shape(a) for a in args], [np.asarray(a).dtype for a in args])
    feeds = {**dict(zip(graph.inputs, args)),
             **{n: graph.weights[n.attrs["name"]] for n in graph.weight_nodes()}}
    names = [b.name for b in kernel.inputs] + [kernel.output.name]
    *inputs, want = evaluate([program.nodes[n] for n in names], feeds, env)

    def bits(value, dtype: DType):
        value = np.ascontiguousarray(np.asarray(value).astype(dtype.np)).reshape(-1)
        return value.view(np.uint16) if dtype is DType.BF16 else value
    arrays = [bits(v, b.dtype) for v, b in zip(inputs, kernel.inputs)]
    symbols = np.array([env[s] for s in kernel.symbols], np.int64)
    scratch_bytes, counters = split_scratch(kernel, config)
    scratch, arrivals = np.zeros(scratch_bytes, np.uint8), np.zeros(counters, np.uint32)
    types = [f"{STORAGE[b.dtype]}*" for b in (*kernel.outputs, *kernel.inputs)] + [
        "const int64_t*", "unsigned char*", "unsigned int*"]
    library = build(emit_cuda(kernel, config, "split"), "split", types, tmp_path)
    points = int(np.prod([e.value for _, e in kernel.loops]))
    grid = -(-points * config.group // config.block) * parts
    rtol = tolerance([np.dtype(DType.BF16.np)])
    for _ in range(2):
        out = np.full(points, np.nan, kernel.output.dtype.np)
        launch(library, [out, *arrays, symbols, scratch, arrivals], grid, config.block)
        problem = mismatch(out.astype(np.float32).reshape(np.shape(want)), np.asarray(want, np.float32), rtol)
        assert not problem, problem
        assert not arrivals.any()
