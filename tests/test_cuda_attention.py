"""Prefill's fused attention on tensor cores (codegen/cuda_attention.py) without a GPU: its CUDA
source compiled by g++ against tests/cuda_on_cpu.py's shim (ldmatrix, mma.sync and the warp votes
emulated by their layouts and meanings) and run on the CPU against the interpreter. The same source
the GPU runs; speed and memory ordering are the GPU tests' (tests/test_cuda.py)."""
from __future__ import annotations

import shutil

import numpy as np
import pytest

from kiln.codegen.policy import POLICIES
from kiln.codegen.schedule import schedule
from kiln.ir import DType
from tests.test_cuda import tiny_case


def _prefill_attention(length: int):
    """The heads64 Llama's fused prefill attention (64-wide heads, 4 sharing 2, causal), its
    inputs and the interpreter's value of it, on a prompt of `length` tokens padded to its bucket
    (the padding's rows fully masked)."""
    from kiln.codegen.attention import as_attention
    from kiln.ir import evaluate
    from kiln.ir.last_position import last_position, prompt_args
    _, lm = tiny_case("heads64_bf16")
    graph = last_position(lm.prefill, at_length=True)
    program = schedule(graph, POLICIES["inline12-bcast1-rows-attention"])
    kernel = next(k for k in program.kernels if as_attention(k) and as_attention(k).query is not None)
    args = prompt_args(graph, np.random.default_rng(length).integers(0, 64, (1, length)), pad=True)
    feeds = {**dict(zip(graph.inputs, args)), **{n: graph.weights[n.attrs["name"]] for n in graph.weight_nodes()}}
    env = graph.bind_symbols([np.shape(x) for x in args], [np.asarray(x).dtype for x in args])
    names = [b.name for b in kernel.inputs]
    values = evaluate([program.nodes[n] for n in [kernel.output.name, *names]], feeds, env)
    inputs = [np.ascontiguousarray(v).reshape(-1) for v in values[1:]]
    inputs = [v.view(np.uint16) if b.dtype in (DType.BF16, DType.F16) else v for b, v in zip(kernel.inputs, inputs)]
    return kernel, env, values[0], inputs


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed here")
@pytest.mark.parametrize("length", [20, 150])
def test_fused_prefill_attention_runs_on_the_cpu_equal_the_interpreter(length, tmp_path):
    """Every tiling, on a prompt whose rows span several tiles of keys: tiles below the causal
    diagonal (the mask one value over a warp's rows and the tile's keys, computed once a tile),
    on it (each element's), above it (hidden: skipped once shown faint), the ragged last tile and
    the padding's rows. The Llama's mask is a test of positions, so the once-a-tile form must be in
    the source."""
    from kiln.codegen.attention import as_attention
    from kiln.codegen.c_emit import STORAGE
    from kiln.codegen.cuda_attention import attention_space, emit_cuda_attention
    from kiln.ir.compare import mismatch, tolerance
    from tests.cuda_on_cpu import build, launch
    kernel, env, want, inputs = _prefill_attention(length)
    a = as_attention(kernel)
    loops = dict(kernel.loops)
    rows, heads = loops[a.query].evaluate(env), 1
    for var in a.batch:
        heads *= loops[var].evaluate(env)
    assert rows >= length
    symbols = np.array([env[s] for s in kernel.symbols], np.int64)
    types = [f"{STORAGE[b.dtype]}*" for b in (*kernel.outputs, *kernel.inputs)] + ["const int64_t*"]
    for config in attention_space(kernel):
        name = "k_" + config.key().replace("-", "_")
        source = emit_cuda_attention(a, config, name)
        assert "kiln_uv" in source
        library = build(source, name, types, tmp_path)
        out = np.full(want.size, np.nan, np.float32).astype(kernel.output.dtype.np)    # a kernel must write
        stored = out.view(np.uint16) if kernel.output.dtype in (DType.BF16, DType.F16) else out
        launch(library, [stored, *inputs, symbols], -(-rows // config.rows), config.rows * 2, heads)
        problem = mismatch(out.astype(np.float32).reshape(want.shape), np.asarray(want, np.float32),
                           tolerance([np.dtype(DType.BF16.np)]))
        assert not problem, f"{length} tokens [{config.key()}]: {problem}"
