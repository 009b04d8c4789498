"""The tensor-core GEMM template (codegen/cuda_gemm.py): which products it takes, its CUDA source
compiled by nvcc, run on the CPU against tests/cuda_on_cpu.py's emulation of ldmatrix and
mma.sync, and, with a GPU, every tiling against the interpreter."""
from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest

from kiln.codegen.cuda_emit import PRELUDE
from kiln.codegen.policy import POLICIES
from kiln.codegen.schedule import schedule
from kiln.ir import DType
from tests.test_cuda import needs_gpu, tiny_case


def _tensor_core_products(tag: str) -> list:
    """The kernels of the tiny Llama's prefill (every position) that the tensor-core template takes,
    under each fusion policy, once each."""
    from kiln.codegen.cuda_gemm import as_tensor_gemm
    _, lm = tiny_case(tag)
    kernels = {k: None for p in POLICIES.values() if "cuda" in p.backends for k in schedule(lm.prefill, p).kernels}
    return [k for k in kernels if as_tensor_gemm(k)]


def test_the_tensor_core_template_takes_products_with_their_epilogues_and_16_bit_operands_only():
    """bf16 prefill's projections are taken, among them ones whose value is more than the product:
    the up projection times SiLU of the gate's, which it reads (an epilogue with a load of its
    own); an f32 model's products are not (mma.sync reads 16-bit operands), nor is decode's
    one-row product (a GEMV)."""
    from kiln.codegen.cuda_gemm import as_tensor_gemm
    from kiln.codegen.kernel import Load, Reduce, nodes
    taken = _tensor_core_products("tiny2_bf16")
    assert any(isinstance(k.value, Reduce) for k in taken)
    assert any(isinstance(s, Load) for k in taken
               for s in nodes(k.value, enter=lambda s: not isinstance(s, Reduce)))
    _, f32 = tiny_case("tiny2_f32")
    assert not [k for p in POLICIES.values() for k in schedule(f32.prefill, p).kernels if as_tensor_gemm(k)]
    _, bf16 = tiny_case("tiny2_bf16")
    assert not [k for p in POLICIES.values() for k in schedule(bf16.decode, p).kernels if as_tensor_gemm(k)]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed here")
def test_tensor_core_products_compile_with_nvcc_in_every_tiling(tmp_path):
    from kiln.codegen.cuda_gemm import MMA_SPACE, as_tensor_gemm, emit_cuda_gemm
    kernels = _tensor_core_products("tiny2_bf16")
    unit = tmp_path / "gemm.cu"
    unit.write_text(PRELUDE + "\n".join(emit_cuda_gemm(as_tensor_gemm(k), c, f"k{i}_{j}")
                                        for i, k in enumerate(kernels) for j, c in enumerate(MMA_SPACE)))
    result = subprocess.run(["nvcc", "-arch=sm_90", "--ptx", str(unit), "-o", str(tmp_path / "gemm.ptx")],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    ptx = (tmp_path / "gemm.ptx").read_text()
    assert "mma.sync.aligned.m16n8k16" in ptx and "ldmatrix" in ptx and "cp.async" in ptx


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed here")
def test_tensor_core_products_run_on_the_cpu_equal_the_interpreter(tmp_path):
    """Without a GPU: the tensor-core template's kernels, as generated for CUDA, compiled by g++
    against tests/cuda_on_cpu.py's shim (ldmatrix and mma.sync emulated by their fragment
    layouts), on a 150-token prompt (rows and columns ragged at a tile's edge, k over several
    staged steps), against the interpreter's value of the node each holds: the up projection with
    SiLU of the gate's as its epilogue in each tiling, a plain product and one whose store is
    permuted in the first (the shim runs a block's threads as threads of the CPU: minutes for all)."""
    from kiln.codegen.c_emit import STORAGE
    from kiln.codegen.cuda_gemm import MMA_SPACE, as_tensor_gemm, emit_cuda_gemm
    from kiln.codegen.kernel import Load, Reduce, nodes
    from kiln.ir import evaluate
    from kiln.ir.compare import mismatch, tolerance
    from kiln.ir.last_position import prompt_args
    from tests.cuda_on_cpu import build, launch
    _, lm = tiny_case("heads64_bf16")
    graph = lm.prefill
    program = schedule(graph, POLICIES["inline12-bcast1-epilogue"])
    taken = [k for k in program.kernels if as_tensor_gemm(k)]

    def has_epilogue_load(k) -> bool:
        return any(isinstance(s, Load) for s in nodes(k.value, enter=lambda s: not isinstance(s, Reduce)))
    chosen = [next(k for k in taken if isinstance(k.value, Reduce)), next(k for k in taken if has_epilogue_load(k)),
              next(k for k in taken if k.label.startswith("Reshape"))]
    args = prompt_args(graph, np.random.default_rng(0).integers(0, 64, (1, 150)), pad=False)
    feeds = {**dict(zip(graph.inputs, args)), **{n: graph.weights[n.attrs["name"]] for n in graph.weight_nodes()}}
    env = graph.bind_symbols([np.shape(a) for a in args], [np.asarray(a).dtype for a in args])
    rtol = tolerance([np.dtype(DType.BF16.np)])
    for i, kernel in enumerate(chosen):
        g = as_tensor_gemm(kernel)
        values = evaluate([program.nodes[n] for n in [kernel.output.name, *(b.name for b in kernel.inputs)]], feeds, env)
        want, inputs = values[0], [np.ascontiguousarray(v).reshape(-1) for v in values[1:]]
        inputs = [v.view(np.uint16) if b.dtype in (DType.BF16, DType.F16) else v for b, v in zip(kernel.inputs, inputs)]
        symbols = np.array([env[s] for s in kernel.symbols], np.int64)
        types = [f"{STORAGE[b.dtype]}*" for b in (*kernel.outputs, *kernel.inputs)] + ["const int64_t*"]
        for j, config in enumerate(MMA_SPACE if has_epilogue_load(kernel) else MMA_SPACE[:1]):
            name = f"k{i}_{j}"
            lib = build(emit_cuda_gemm(g, config, name), name, types, tmp_path)
            out = np.full(want.size, np.nan, kernel.output.dtype.np)     # a kernel must write
            stored = out.view(np.uint16) if kernel.output.dtype in (DType.BF16, DType.F16) else out
            launch(lib, [stored, *inputs, symbols], -(-g.extent_n.evaluate(env) // config.cols), config.threads,
                   -(-g.extent_m.evaluate(env) // config.rows))
            problem = mismatch(out.astype(np.float32).reshape(want.shape), np.asarray(want, np.float32), rtol)
            assert not problem, f"{kernel.label} [{config.key()}]: {problem}"


@pytest.mark.parametrize("length", [20, 150])
@needs_gpu
def test_tensor_core_products_of_each_tiling_equal_the_interpreter(length):
    """Every kernel the tensor-core template takes in the heads64 Llama's prefill (products with
    and without epilogues; rows ragged at the tile's edge), in each tiling at once, the other
    kernels at their defaults, against the interpreter's value of the node each holds."""
    from kiln.codegen.cuda_gemm import MMA_SPACE, as_tensor_gemm
    from kiln.ir import evaluate
    from kiln.ir.compare import mismatch, tolerance
    from kiln.ir.last_position import last_position, prompt_args
    from kiln.runtime.cuda import CudaBackend
    from kiln.runtime.executor import Executor
    _, lm = tiny_case("heads64_bf16")
    graph, backend = last_position(lm.prefill, at_length=True), CudaBackend()
    args = prompt_args(graph, np.random.default_rng(length).integers(0, 64, (1, length)), pad=True)
    feeds = {**dict(zip(graph.inputs, args)), **{n: graph.weights[n.attrs["name"]] for n in graph.weight_nodes()}}
    env = graph.bind_symbols([np.shape(a) for a in args], [np.asarray(a).dtype for a in args])
    rtol = tolerance([np.dtype(DType.BF16.np)])
    for policy in ("inline12-bcast1-epilogue", "inline64-bcast16-epilogue", "inline12-bcast1-rows-attention"):
        program = schedule(graph, POLICIES[policy])
        taken = [k for k in program.kernels if as_tensor_gemm(k)]
        assert taken, policy
        names = [k.output.name for k in program.kernels]
        want = dict(zip(names, evaluate([program.nodes[n] for n in names], feeds, env)))
        for config in MMA_SPACE:
            configs = [config if k in taken else backend.default_config(k) for k in program.kernels]
            got = Executor(graph, program, configs, backend, reuse=False).trace(*[np.copy(a) for a in args])
            for kernel, name in zip(program.kernels, names):
                problem = mismatch(got[name], want[name], rtol)
                assert not problem, f"{policy} {kernel.label} [{config.key()}]: {problem}"
