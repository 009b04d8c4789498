"""The CUDA template's streaming reads (CudaConfig.stream): a GEMV's weight rows, each read by one
output point, go past L1 with an L2 prefetch, while the x row that every point reads still goes
through L1 (streamed too, it made an H100's 2048->512 product 8% slower:
benchmarks/h100-gemv-probe-2026-12-06.txt). Without a GPU the source is compiled by nvcc and run
on the CPU through tests/cuda_on_cpu.py's shim; with one, it runs against the interpreter."""
from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import replace

import numpy as np
import pytest

from kiln.codegen.c_emit import STORAGE
from kiln.codegen.cuda_config import CudaConfig, config_space
from kiln.codegen.cuda_emit import PRELUDE, emit_cuda
from kiln.codegen.schedule import schedule
from kiln.frontend.lowerings.reductions import matmul
from kiln.ir import DType, Graph, Node, Op, evaluate
from kiln.ir.build import permute
from kiln.ir.compare import mismatch, tolerance
from kiln.ir.symbolic import shape_of
from tests.test_cuda import needs_gpu

STREAMED = "ld.global.nc.L1::no_allocate.L2::256B.v4.u32"


def _gemv(n: int, k: int):
    """x [1, k] times a weight [n, k], bf16, as the frontend lowers it: (the product's kernel, the
    node it computes, x's node, the weight's node)."""
    x = Node(Op.INPUT, name="x", role="input", shape=shape_of((1, k)), dtype=DType.BF16)
    w = Node(Op.INPUT, name="w", role="weight", shape=shape_of((n, k)), dtype=DType.BF16)
    program = schedule(Graph([x], [matmul(x, permute(w, (1, 0)), DType.BF16)]))
    kernel = program.kernels[0]
    return kernel, program.nodes[kernel.output.name], x, w


def _operands(kernel, node, x, w, seed: int):
    """Random x and weight as the kernel's input buffers, in its order (bf16 as its bits), and the
    interpreter's value of the node the kernel computes."""
    rng = np.random.default_rng(seed)
    (_, k), (n, _) = (tuple(d.value for d in v.shape) for v in (x, w))
    values = {x: rng.standard_normal((1, k)).astype(DType.BF16.np),
              w: (rng.standard_normal((n, k)) * 0.05).astype(DType.BF16.np)}
    by_size = {v.size: v for v in values.values()}
    inputs = [np.ascontiguousarray(by_size[b.size.value]).reshape(-1).view(np.uint16) for b in kernel.inputs]
    return inputs, evaluate([node], values, {})[0]


def test_a_gemv_over_long_rows_is_offered_its_weight_streamed_third():
    """Third in the space (within a search candidate's first four): the second form, a row a block
    of 128, streaming; a product over short rows (256: the form is offered from 1,024) is not."""
    kernel, _, _, _ = _gemv(64, 2048)
    space = config_space(kernel)
    assert space[2] == replace(space[1], stream=True) and space[1].group == 128
    assert sum(c.stream for c in space) == 1
    assert CudaConfig.from_json(json.loads(json.dumps(space[2].to_json()))) == space[2]
    short, _, _, _ = _gemv(64, 256)
    assert not any(c.stream for c in config_space(short))


def test_a_finalist_still_times_every_configuration_it_timed_before_the_streaming_form():
    """With the streaming form third, a CUDA finalist's reach (CudaBackend.finalist_configs, 14)
    still takes in every configuration the first 12 held without it (for 8192->2048 a block of 512
    a row, its best on an H100, and groups of 64, its best on the H200), for Llama-3.2-1B's five
    products, library calls among the space."""
    from kiln.runtime.cuda import CudaBackend
    for n, k in ((2048, 2048), (512, 2048), (8192, 2048), (2048, 8192), (128256, 2048)):
        kernel, _, _, _ = _gemv(n, k)
        space = CudaBackend.config_space(kernel)
        reached = space[:CudaBackend.finalist_configs]
        streaming = [c for c in space if getattr(c, "stream", False)]   # library calls have no such flag
        assert streaming and streaming[0] in reached
        assert set([c for c in space if c not in streaming][:12]) <= set(reached), (n, k)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed here")
def test_a_streaming_gemv_reads_its_weight_past_l1_and_x_through_it(tmp_path):
    kernel, _, _, _ = _gemv(64, 2048)
    source = emit_cuda(kernel, replace(config_space(kernel)[1], stream=True), "gemv")
    reads = [line.strip() for line in source.splitlines() if "kiln_bf16x8" in line]
    weight, row = (next(b.name for b in kernel.inputs if b.size.value == size) for size in (64 * 2048, 2048))
    assert [r for r in reads if f"{weight} +" in r] and all("_stream(" in r for r in reads if f"{weight} +" in r)
    assert [r for r in reads if f"{row} +" in r] and not any("_stream(" in r for r in reads if f"{row} +" in r)
    unit = tmp_path / "gemv.cu"
    unit.write_text(PRELUDE + source)
    result = subprocess.run(["nvcc", "-arch=sm_90", "--ptx", str(unit), "-o", str(tmp_path / "gemv.ptx")],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    ptx = (tmp_path / "gemv.ptx").read_text()
    assert STREAMED in ptx and "ld.global.nc.v4.u32" in ptx


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed here")
def test_a_streaming_gemv_run_on_the_cpu_equals_the_interpreter(tmp_path):
    """The CUDA source, compiled by g++ against the shim (threads, shuffles and the block's
    barrier emulated), 16 rows of 1,024, against the interpreter."""
    from tests.cuda_on_cpu import build, launch
    kernel, node, x, w = _gemv(16, 1024)
    config = replace(config_space(kernel)[1], stream=True)
    assert config in config_space(kernel)
    types = [f"{STORAGE[b.dtype]}*" for b in (*kernel.outputs, *kernel.inputs)] + ["const int64_t*"]
    library = build(emit_cuda(kernel, config, "gemv"), "gemv", types, tmp_path)
    inputs, want = _operands(kernel, node, x, w, seed=5)
    out = np.full(16, np.nan, kernel.output.dtype.np)
    launch(library, [out, *inputs, np.zeros(1, np.int64)], 16 // config.points_per_block, config.block)
    problem = mismatch(out.reshape(np.shape(want)), np.asarray(want, np.float32), tolerance([np.dtype(DType.BF16.np)]))
    assert not problem, problem


@needs_gpu
def test_a_streaming_gemv_equals_the_interpreter_on_the_gpu():
    """Llama-3.2-1B's 2048->512 product, its weight streamed, launched as the runtime launches it."""
    import cupy as cp
    from kiln.runtime.cuda import CudaBackend
    backend = CudaBackend()
    kernel, node, x, w = _gemv(512, 2048)
    config = replace(config_space(kernel)[1], stream=True)
    name, source = backend.render(kernel, config)
    launcher = backend.launcher(backend.compile({name: source})[name], kernel, config)
    inputs, want = _operands(kernel, node, x, w, seed=6)
    out = cp.full(512, cp.nan, kernel.output.dtype.np)
    launcher([out, *[cp.asarray(a) for a in inputs], backend.symbol_buffer(0)], {})
    problem = mismatch(out.get().reshape(np.shape(want)), np.asarray(want, np.float32),
                       tolerance([np.dtype(DType.BF16.np)]))
    assert not problem, problem
