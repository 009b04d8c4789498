"""The CUDA backend. Without a GPU, every template's CUDA output is still compiled with nvcc
(where nvcc is present) and checked against golden snapshots; with one, compiled programs are
checked against the reference and PyTorch."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

import kiln
from kiln.codegen.cuda_config import CudaConfig, config_space, point_reductions
from kiln.codegen.cuda_emit import PRELUDE, _halvings, emit_cuda
from kiln.codegen.kernel import row_reductions
from kiln.codegen.library import LibraryConfig, as_gemm, is_library
from kiln.codegen.policy import POLICIES
from kiln.codegen.schedule import schedule
from kiln.frontend.hf import load_lowered, lower_causal_lm
from kiln.ir import DType, run
from kiln.ir.decode import CACHES_START, decode_args
from kiln.ir.errors import CompileError
from tests.helpers import tiny_llama

GOLDEN = Path(__file__).parent / "golden"


def _gpu_reason() -> str | None:
    try:
        import cupy
        if cupy.cuda.runtime.getDeviceCount() > 0:
            return None
        return "CuPy finds no CUDA device"
    except Exception as err:   # no package or no driver
        return f"no usable CuPy/CUDA here ({type(err).__name__})"


needs_gpu = pytest.mark.skipif(_gpu_reason() is not None, reason=f"needs a GPU: {_gpu_reason()}")


def lowered(model, max_seq: int, tag: str):
    """The model lowered here, or, where this torch cannot export it (the GPU machine's older
    torch), the graphs `kiln lower` saved under $KILN_TEST_LOWERED/<tag> on a machine that can."""
    try:
        return lower_causal_lm(model, max_seq)
    except kiln.ExportError as err:
        saved = os.environ.get("KILN_TEST_LOWERED")
        if not saved:
            pytest.skip(f"this torch cannot export the model ({err}); set KILN_TEST_LOWERED")
        return load_lowered(str(Path(saved) / tag), model)


# tag: (layers, seed, dtype, max_seq, other LlamaConfig fields)
TINY_CASES = {"tiny1_bf16": (1, 0, torch.bfloat16, 16, {}), "tiny2_f32": (2, 3, torch.float32, 48, {}),
              "tiny2_bf16": (2, 4, torch.bfloat16, 32, {}),
              # heads 64 wide, as real models have them (fused attention's tiles), 4 sharing 2
              "heads64_bf16": (2, 5, torch.bfloat16, 192,
                               {"hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2}),
              "heads64_f32": (2, 6, torch.float32, 192,
                              {"hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2})}


def tiny_model(tag: str):
    layers, seed, dtype, _, config = TINY_CASES[tag]
    return tiny_llama(layers, seed=seed, **config).to(dtype)


def tiny_case(tag: str):
    model = tiny_model(tag)
    return model, lowered(model, TINY_CASES[tag][3], tag)


@pytest.fixture(scope="module")
def tiny_kernels():
    """Every kernel of a tiny bf16 Llama's decode and prefill programs, under each fusion policy,
    but fused attention's (its own template: test_attention.py)."""
    from kiln.codegen.attention import as_attention
    _, lm = tiny_case("tiny1_bf16")
    kernels = {k: None for g in (lm.decode, lm.prefill) for p in POLICIES.values()
               if "cuda" in p.backends for k in schedule(g, p).kernels}
    return [k for k in kernels if not as_attention(k)]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed here")
def test_every_template_configuration_compiles_with_nvcc(tiny_kernels, tmp_path):
    sources = [emit_cuda(k, c, f"k{i}_{j}") for i, k in enumerate(tiny_kernels)
               for j, c in enumerate(config_space(k))]
    assert len(sources) > len(tiny_kernels)          # several configurations per kernel
    unit = tmp_path / "all.cu"
    unit.write_text(PRELUDE + "\n".join(sources))
    result = subprocess.run(["nvcc", "-arch=sm_90", "--ptx", str(unit), "-o", str(tmp_path / "all.ptx")],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    ptx = (tmp_path / "all.ptx").read_text()
    assert "ld.global.v4" in ptx or "ld.global.nc.v4" in ptx     # the 16-byte vector loads are there


# NVRTC, which the runtime compiles with, has no <stdint.h>: PRELUDE defines the integer types
# the emitters use. nvcc, which the tests here compile with, has them all, so a source naming
# another passes here and fails on the GPU (uintptr_t did once).
NOT_IN_NVRTC = re.compile(r"\b(u?intptr_t|u?int8_t|int16_t|std::)")


def test_generated_sources_name_only_integer_types_nvrtc_has(tiny_kernels):
    from kiln.codegen.attention import as_attention
    from kiln.codegen.cuda_attention import attention_space
    from kiln.codegen.cuda_decode_attention import emit_cuda_decode_attention
    sources = [emit_cuda(k, c, f"k{i}_{j}") for i, k in enumerate(tiny_kernels) for j, c in enumerate(config_space(k))]
    sources += [emit_cuda_decode_attention(as_attention(k), c, "k") for tag in DECODE_ATTENTION
                for _, _, fused in _decode_attention_kernels(tag) for k in fused for c in attention_space(k)]
    named = {m.group(0) for source in sources for m in NOT_IN_NVRTC.finditer(source)}
    assert not named, f"generated CUDA names {sorted(named)}, which NVRTC does not define"


def test_a_staged_configuration_computes_a_shared_row_once_per_block(tiny_kernels):
    """With the norm merged into gate and up, every row's threads would recompute the normalized
    input; staged, the block computes it once into shared memory before the points' loop, and the
    products read it there (the GPU tests check every such configuration against the
    interpreter)."""
    kernel = next(k for k in tiny_kernels if k.label == "Cast[1, 1, 64]" and len(point_reductions(k)) == 3)
    staged = next(c for c in config_space(kernel) if c.stage)
    assert staged.points_per_block > 1
    before, loop = emit_cuda(kernel, staged, "k").split("kiln_points =")
    assert "kiln_stage0[kiln_row] =" in before and before.rstrip().endswith("const int64_t")
    assert "__syncthreads();" in before and "kiln_stage0 + kiln_base" in loop and "kiln_row" not in loop
    plain = emit_cuda(kernel, config_space(kernel)[0], "k")
    assert "kiln_stage" not in plain


def test_a_row_configuration_computes_softmax_once_per_row(tiny_kernels):
    """Under the rows policy, softmax's any, max and sum run inside the kernel of its
    probabilities, which a group of threads runs a row at a time: the row's reductions once,
    shared by the group, then its points; the prefill's products are still plain (library calls)."""
    _, lm = tiny_case("tiny1_bf16")
    plain, rows = (schedule(lm.prefill, POLICIES[p]) for p in ("inline12-bcast1", "inline12-bcast1-rows"))
    assert len(rows.kernels) < len(plain.kernels)
    assert sum(map(bool, map(as_gemm, rows.kernels))) == sum(map(bool, map(as_gemm, plain.kernels)))
    softmax = next(k for k in rows.kernels if k.label.startswith("Where") and row_reductions(k))
    assert len(row_reductions(softmax)) == 3
    space = config_space(softmax)
    assert all(c.row for c in space)
    for config in space:     # a warp per row combines by shuffles alone; wider groups also by barriers
        row, points = emit_cuda(softmax, config, "k").split("const int64_t kiln_row =")[1].rsplit("\n    for (int64_t ", 1)
        assert row.count("__shfl_xor_sync") == 3 * len(_halvings(min(config.group, 32)))
        assert row.count("__syncthreads();") == (0 if config.group <= 32 else 6)
        assert "__shfl_xor_sync" not in points and "__syncthreads" not in points


def test_a_split_configuration_shares_a_long_reduction_among_blocks(tiny_kernels):
    """Few points with long reductions (P.V over the context, a GEMV of few rows) are offered a
    split: each block reduces its part, and the last block of a point's parts to arrive combines
    the partials in order and resets its counter for the next launch (the GPU tests check every
    such configuration against the interpreter, launched twice). Softmax merged into P.V is not
    offered one: its sum needs the whole max first."""
    from kiln.codegen.cuda_config import split_scratch, splittable
    offered = [k for k in tiny_kernels if any(c.split > 1 for c in config_space(k))]
    assert any(k.label.startswith("SumReduce") for k in offered)
    assert any(c.across and c.split > 1 for k in offered for c in config_space(k))   # P.V
    merged = [k for k in tiny_kernels if len(point_reductions(k)) > 1 and not splittable(k)]
    assert merged and not any(c.split > 1 for k in merged for c in config_space(k))
    kernel = offered[0]
    config = next(c for c in config_space(kernel) if c.split == 4)
    source = emit_cuda(kernel, config, "k")
    assert "atomicAdd(kiln_arrivals" in source and "kiln_arrivals[kiln_counter] = 0u" in source
    assert "if (!kiln_last) continue;" in source and "kiln_p < 4" in source
    points = int(np.prod([e.value for _, e in kernel.loops]))
    scratch, counters = split_scratch(kernel, config)
    assert scratch == points * len(point_reductions(kernel)) * 4 * 8
    assert counters == -(-points // config.points_per_block)
    assert split_scratch(kernel, config_space(kernel)[0]) == (0, 0)
    with pytest.raises(ValueError, match="split"):
        emit_cuda(merged[0], CudaConfig(256, 32, 1, split=4), "k")


def test_every_lane_reaches_every_warp_shuffle(tiny_kernels):
    """A full-mask shuffle that only some lanes reach never completes: a max's combine branches
    per lane, so the shuffle must be taken once, in a statement of its own, before it."""
    shuffles = [line.strip() for k in tiny_kernels for c in config_space(k) if c.group > 1
                for line in emit_cuda(k, c, "k").splitlines() if "__shfl" in line]
    assert any("MaxReduce" in k.label for k in tiny_kernels) and shuffles
    for line in shuffles:
        assert line.count("__shfl") == 1 and line.startswith("{ const ") and "kiln_other = __shfl" in line, line


def _golden_cases(kernels):
    """A GEMV-like reduction (the widest kernel with a reduction) and an elementwise kernel."""
    reducing = [k for k in kernels if point_reductions(k)]
    gemv = max(reducing, key=lambda k: k.reduce_extent.value if k.reduce_extent is not None
               and k.reduce_extent.is_const else 0)
    elementwise = next(k for k in kernels if not point_reductions(k) and len(k.loops) >= 2)
    return {"gemv_warp_vector": (gemv, CudaConfig(256, 32, config_space(gemv)[0].vector)),
            "gemv_block": (gemv, CudaConfig(256, 256, 1)),
            "elementwise": (elementwise, CudaConfig(256, 1, 1))}


def test_a_library_call_is_offered_only_where_cublas_takes_it_at_fixed_sizes(tiny_kernels):
    """Decode's sizes are fixed: a product cuBLAS cannot take in one call would fall back to
    CuPy's allocating matmul and keep the step from replaying a CUDA graph, so the search is never
    offered it. Attention's f32 x bf16 P.V is taken: its values widened into f32 scratch first."""
    from kiln.codegen.library import as_gemm
    from kiln.runtime.cublas import plan
    from kiln.runtime.cuda import CudaBackend
    fixed = [k for k in tiny_kernels if as_gemm(k) and all(e.is_const for e in as_gemm(k).extents.values())]
    offered = {k: LibraryConfig() in CudaBackend.config_space(k) for k in fixed}
    for kernel, library in offered.items():
        assert library == (plan(as_gemm(kernel), {}) is not None), kernel.label
    mixed = [k for k in offered if as_gemm(k).a.dtype is not as_gemm(k).b.dtype]
    assert mixed and all(offered[k] and plan(as_gemm(k), {}).gathers[0].to is DType.F32 for k in mixed)


def test_a_product_with_an_f32_operand_is_offered_tf32_after_cublas_in_f32(tiny_kernels):
    """TF32 is one more library configuration, right after the f32 call, for products with an f32
    operand (the check at the model's tolerance decides whether its rounding is allowed); a
    product of 16-bit operands already runs on tensor cores and is offered none."""
    from kiln.codegen.library import as_gemm
    from kiln.runtime.cublas import TF32
    from kiln.runtime.cuda import CudaBackend
    products = [k for k in tiny_kernels if as_gemm(k) and LibraryConfig() in CudaBackend.config_space(k)]
    with_f32 = {k: DType.F32 in (as_gemm(k).a.dtype, as_gemm(k).b.dtype) for k in products}
    assert any(with_f32.values()) and not all(with_f32.values())
    for kernel, f32 in with_f32.items():
        space = CudaBackend.config_space(kernel)
        assert (LibraryConfig(TF32) in space) == f32, kernel.label
        if f32:
            assert space.index(LibraryConfig(TF32)) == space.index(LibraryConfig()) + 1
            names = {CudaBackend.render(kernel, c)[0] for c in (LibraryConfig(), LibraryConfig(TF32))}
            assert len(names) == 2      # timed and recorded apart


def test_the_cublas_library_is_found_where_the_process_loaded_it():
    """Kiln calls the libcublas CuPy loaded (a second copy would be a second cuBLAS): its path is
    read from the process's mappings; here, with no cuBLAS, the C library stands in."""
    from kiln.runtime.cublas import _loaded_library
    path = _loaded_library("libc.so")
    assert path.startswith("/") and Path(path).exists()
    assert _loaded_library("libkiln-nothing.so") == "libkiln-nothing.so"


def test_rendered_kernels_match_golden_snapshots(tiny_kernels):
    """A change to what the emitter writes must be deliberate: KILN_UPDATE_GOLDEN=1 rewrites the
    snapshots, and the diff goes into the commit."""
    for name, (kernel, config) in _golden_cases(tiny_kernels).items():
        rendered = emit_cuda(kernel, config, name)
        path = GOLDEN / f"{name}.cu"
        if os.environ.get("KILN_UPDATE_GOLDEN"):
            path.parent.mkdir(exist_ok=True)
            path.write_text(rendered)
        assert path.exists(), f"no snapshot {path}; run with KILN_UPDATE_GOLDEN=1"
        assert rendered == path.read_text(), f"{name} differs from its snapshot {path}"


def test_every_configuration_round_trips_through_the_artifacts_json(tiny_kernels):
    """A loaded CUDA artifact rebuilds each kernel's configuration from JSON, library calls too."""
    from kiln.runtime.cuda import CudaBackend
    configs = {c for k in tiny_kernels for c in CudaBackend.config_space(k)}
    assert any(isinstance(c, LibraryConfig) for c in configs) and len(configs) > 2
    for config in configs:
        assert CudaBackend.config_from_json(json.loads(json.dumps(config.to_json()))) == config


def test_cuda_backend_without_a_gpu_says_so():
    if _gpu_reason() is None:
        pytest.skip("this machine has a GPU")
    from kiln.runtime.model import make_backend
    with pytest.raises(kiln.KilnError, match="cuda backend needs CuPy and an NVIDIA GPU"):
        make_backend("cuda")


@needs_gpu
def test_a_process_gives_back_its_pool_only_when_the_device_runs_short(monkeypatch):
    """runtime/cuda.py: trim. Eight workers' CuPy pools, each keeping a prefill candidate's freed
    intermediates, filled an H200; a process now gives its pool's free blocks back before a
    candidate when less than _TRIM_BELOW of the device is free, and keeps them otherwise (the next
    candidate reuses them). Whole free chunks only: tests before this one in the process may still
    hold arrays of the pool, and the free pieces of a chunk they share stay (16,896 bytes on an
    H100), so the test asks for the 64 MiB block back, not for an empty pool."""
    from kiln.runtime.cuda import CudaBackend
    backend = CudaBackend()
    pool = backend.cp.get_default_memory_pool()
    block = backend.allocate(64 << 20)
    del block
    kept = pool.free_bytes()
    monkeypatch.setattr("kiln.runtime.cuda._TRIM_BELOW", 0.0)       # never short
    backend.trim()
    assert pool.free_bytes() == kept >= 64 << 20
    held = pool.total_bytes()
    monkeypatch.setattr("kiln.runtime.cuda._TRIM_BELOW", 1.01)      # always short
    backend.trim()
    assert pool.total_bytes() <= held - (64 << 20) and pool.free_bytes() < 64 << 20


@needs_gpu
def test_kernels_compiled_in_one_unit_are_found_again_and_a_rejected_one_is_named(tmp_path, monkeypatch):
    """runtime/cache.py: units. A fresh backend (the next worker, a loaded artifact) asks for the
    unit a kernel was compiled in, which CuPy's disk cache serves, and compiles no new one; a
    kernel NVRTC rejects is named, and the kernels compiled with it are kept."""
    from kiln.runtime.cuda import CudaBackend
    monkeypatch.setenv("KILN_CACHE", str(tmp_path))
    monkeypatch.setattr("kiln.runtime.cuda.usable_cores", lambda: 2)      # five kernels, two units
    sources = {f"k_unit{i}": f'extern "C" __global__ void k_unit{i}(float* x) {{ x[threadIdx.x] += {i}.0f; }}\n'
               for i in range(5)}
    CudaBackend().compile(sources)
    folder = tmp_path / "cuda-units"
    made = sorted(folder.glob("*.cu"))
    assert len(made) == 2
    x = __import__("cupy").zeros(32, dtype="float32")
    CudaBackend().compile({"k_unit3": sources["k_unit3"]})["k_unit3"]((1,), (32,), (x,))
    assert float(x[0]) == 3.0 and sorted(folder.glob("*.cu")) == made
    bad = {"k_unit_bad": 'extern "C" __global__ void k_unit_bad(float* x) { x[0] = no_such_name; }\n',
           "k_unit_good": 'extern "C" __global__ void k_unit_good(float* x) { x[0] = 7.0f; }\n'}
    monkeypatch.setattr("kiln.runtime.cuda.usable_cores", lambda: 1)      # the two in one unit
    with pytest.raises(CompileError, match="k_unit_bad"):
        CudaBackend().compile(bad)
    made = sorted(folder.glob("*.cu"))
    CudaBackend().compile({"k_unit_good": bad["k_unit_good"]})["k_unit_good"]((1,), (1,), (x,))
    assert float(x[0]) == 7.0 and sorted(folder.glob("*.cu")) == made


@needs_gpu
def test_fp32_greedy_tokens_equal_pytorch_on_the_gpu(tmp_path):
    model, lm = tiny_case("tiny2_f32")
    compiled = kiln.compile_lm(model, max_seq=48, backend="cuda", budget="20s",
                               db=tmp_path / "tune.sqlite", progress=False, lowered=lm)
    rng = np.random.default_rng(1)
    for length in (1, 5):
        ids = rng.integers(0, 64, length).tolist()
        x = torch.tensor([ids])
        with torch.no_grad():
            want = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=32,
                                  do_sample=False)[0].tolist()
        assert compiled.generate(ids, max_new_tokens=32) == want
    # the artifact `kiln compile` writes and `kiln generate` reads gives the same tokens
    compiled.save(tmp_path / "artifact")
    loaded = kiln.CompiledModel.load(tmp_path / "artifact")
    assert loaded.backend == "cuda"
    assert loaded.generate(ids, max_new_tokens=32) == want


@needs_gpu
def test_workers_side_by_side_on_the_gpu_take_turns_and_agree(tmp_path):
    """Two workers measure a compile's candidates side by side, taking turns on the GPU: every
    region's candidates valid, the wait for a turn accounted, greedy tokens still PyTorch's."""
    model, lm = tiny_case("tiny2_f32")
    compiled = kiln.compile_lm(model, max_seq=48, backend="cuda", budget="20s", db=tmp_path / "tune.sqlite",
                               progress=False, lowered=lm, workers=2)
    regions = [r for g in compiled.report["graphs"].values() for r in g["regions"]]
    assert all(r["progress"]["valid"] == r["progress"]["tried"] for r in regions)
    assert any("device wait" in r["progress"]["spent"] for r in regions)
    ids = [3, 14, 15, 9]
    x = torch.tensor([ids])
    with torch.no_grad():
        want = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=16, do_sample=False)[0].tolist()
    assert compiled.generate(ids, max_new_tokens=16) == want


@needs_gpu
def test_bf16_logits_within_2e_2_of_pytorch(tmp_path):
    model, lm = tiny_case("tiny2_bf16")
    compiled = kiln.compile_lm(model, max_seq=32, backend="cuda", budget="20s",
                               db=tmp_path / "tune.sqlite", progress=False, lowered=lm, all_logits=True)
    ids = torch.tensor([[3, 14, 15, 9, 26, 5]])
    with torch.no_grad():
        want = model.cuda()(input_ids=ids.cuda(), attention_mask=torch.ones_like(ids).cuda()).logits
    got = compiled(ids).float().numpy()
    want = want.float().cpu().numpy()
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 2e-2


def with_cublas_products(compiled):
    """The same regions with every matrix product the search may run as a cuBLAS call run so."""
    from kiln.runtime.compiled import Choice, CompiledGraph, replays
    from kiln.compiler.measure import kernel_space
    choices = {}
    recorded = replays(compiled.graph)
    for key, choice in compiled.choices.items():
        executor = next(ex for r, ex in zip(compiled.regions, compiled.executors) if r.key == key)
        configs = [LibraryConfig() if LibraryConfig() in kernel_space(compiled.backend, k, recorded, executor.fixed) else c
                   for k, c in zip(executor.program.kernels, choice.configs)]
        choices[key] = Choice(choice.outputs, choice.variant, configs)
    return CompiledGraph(compiled.graph, choices, compiled.backend)


@pytest.mark.parametrize("products", ["generated", "cublas"])
@needs_gpu
def test_decode_replays_one_cuda_graph_per_token_with_the_same_results(products):
    """Whatever the search picks, cuBLAS calls included, decode replays one recording."""
    from kiln.runtime.compiled import CompiledGraph
    from kiln.runtime.cuda import CudaBackend
    _, lm = tiny_case("tiny2_bf16")
    backend = CudaBackend()
    decode = CompiledGraph.untuned(lm.decode, backend)
    if products == "cublas":
        decode = with_cublas_products(decode)
        assert any(is_library(name) for name in decode.sources)
    assert decode._replayable
    rng = np.random.default_rng(2)
    zeros = [np.zeros(tuple(d.value for d in n.shape), n.dtype.np) for n in lm.decode.inputs[CACHES_START:]]
    replayed, launched = [backend.input(z) for z in zeros], [backend.input(z) for z in zeros]
    for pos in range(6):       # the window (a symbol) grows with pos: one recording serves all
        token = np.array([[rng.integers(0, 64)]])
        got = decode(*decode_args(lm.decode, token, pos, replayed))[0]
        host = decode_args(lm.decode, token, pos, [])
        want = decode._run([*(backend.input(a) for a in host), *launched], copy=True)[0]
        assert np.array_equal(backend.cp.asnumpy(got), backend.cp.asnumpy(want))
    assert decode.replayed
    for a, b in zip(replayed, launched):   # the cache was written in place by the replays
        assert np.array_equal(backend.cp.asnumpy(a), backend.cp.asnumpy(b))


@pytest.mark.parametrize("products", ["generated", "cublas"])
@needs_gpu
def test_a_padded_prefill_replays_one_recording_per_padded_length(products):
    """Prompts of 5, 9 and 20 tokens pad to 32 (this model's max_seq): the first call runs
    launched, the later ones replay one recording of the 32-token program, cuBLAS calls included,
    and each gives the last real token's logits and the prompt's caches of the prompt run alone."""
    from kiln.ir.last_position import last_position, prompt_args
    from kiln.runtime.compiled import CompiledGraph
    from kiln.runtime.cuda import CudaBackend
    _, lm = tiny_case("tiny2_bf16")
    backend = CudaBackend()
    graph = last_position(lm.prefill, at_length=True)
    prefill = CompiledGraph.untuned(graph, backend)
    if products == "cublas":
        prefill = with_cublas_products(prefill)
        assert any(is_library(name) for name in prefill.sources)
    assert prefill.records
    rng = np.random.default_rng(4)
    for length in (5, 9, 20, 5):
        ids = rng.integers(0, 64, (1, length))
        padded = prompt_args(graph, ids, pad=True)
        assert padded[0].shape == (1, 32)
        got = [backend.cp.asnumpy(a).astype(np.float32) for a in prefill(*padded)]
        alone = prefill._run([backend.input(a) for a in prompt_args(graph, ids)], copy=True)
        want = [backend.cp.asnumpy(a).astype(np.float32) for a in alone]
        np.testing.assert_allclose(got[0], want[0], rtol=2e-2, atol=2e-2)
        for cache, whole in zip(got[1:], want[1:]):
            np.testing.assert_allclose(cache[:, :, :length], whole[:, :, :length], rtol=2e-2, atol=2e-2)
    assert prefill.replayed and len(prefill._recordings) == 1


@pytest.mark.parametrize("step,policy", [("decode", "inline12-bcast1-epilogue"),
                                         ("decode", "inline64-bcast16-epilogue-merge"),
                                         ("decode", "inline64-bcast16-epilogue-merge-rows"),
                                         ("decode", "inline12-bcast1-rows"), ("prefill", "inline12-bcast1-rows")])
@needs_gpu
def test_every_configuration_of_every_kernel_equals_the_interpreter(step, policy):
    """Each template configuration (sub-warp, warp, block and across groups, vectors, unrolled
    reductions, several shared by a group, a block per row) of each kernel of a bf16 decode step
    or 20-token prefill under a policy, each kernel's output checked against the interpreter's
    value of the node it holds, on random caches (the tuner checks a configuration against the
    default one; this checks the default too)."""
    from kiln.ir import evaluate
    from kiln.ir.compare import mismatch, tolerance
    from kiln.ir.last_position import prompt_args
    from kiln.runtime.cuda import CudaBackend
    from kiln.runtime.executor import Executor
    _, lm = tiny_case("tiny2_bf16")
    graph, backend = getattr(lm, step), CudaBackend()
    program = schedule(graph, POLICIES[policy])
    rng = np.random.default_rng(3)
    if step == "decode":
        args = decode_args(graph, np.array([[7]]), 11, [
            (rng.standard_normal(tuple(d.value for d in n.shape)) * 0.5).astype(n.dtype.np)
            for n in graph.inputs[CACHES_START:]])
    else:
        args = prompt_args(graph, rng.integers(0, 64, (1, 20)))
    feeds = {**dict(zip(graph.inputs, args)), **{n: graph.weights[n.attrs["name"]] for n in graph.weight_nodes()}}
    names = [k.output.name for k in program.kernels]
    env = graph.bind_symbols([np.shape(a) for a in args], [np.asarray(a).dtype for a in args])
    want = dict(zip(names, evaluate([program.nodes[n] for n in names], feeds, env)))
    rtol = tolerance([np.dtype(DType.BF16.np)])
    spaces = [config_space(k) for k in program.kernels]
    checked = set()
    for j in range(max(len(s) for s in spaces)):
        configs = [s[min(j, len(s) - 1)] for s in spaces]
        executor = Executor(graph, program, configs, backend, reuse=False)
        for launch in range(2):   # a split configuration's counters are left ready for the next
            got = executor.trace(*[np.copy(a) for a in args])
            for kernel, config, name in zip(program.kernels, configs, names):
                problem = mismatch(got[name], want[name], rtol)
                assert not problem, f"{kernel.label} [{config.key()}], launch {launch + 1}: {problem}"
                checked.add((kernel.label, config.key()))
    keys = {key for _, key in checked}
    if policy.endswith("rows"):   # softmax (and the prefill norms) a block per row
        assert any(k.endswith("-row") for k in keys)
        if "merge" in policy:     # P.V over the window split among blocks
            assert any("across" in k and "split" in k for k in keys)
        return
    assert any("across" in k for k in keys) and any("group8-" in k for k in keys)
    assert any("split" in k for k in keys)
    if policy.endswith("merge"):   # groups of whole warps, several a block, staging their rows
        assert any("block512-group128" in k and "stage" in k for k in keys)


@pytest.mark.parametrize("length", [20, 150])
@needs_gpu
def test_fused_attention_of_each_tiling_equals_the_interpreter(length):
    """Each tiling of the fused attention kernel (tensor cores; query rows and keys in tiles, ragged
    at both ends, masked tiles skipped) of a bf16 Llama with 64-wide heads, 4 sharing 2, on a
    prompt padded to its bucket (the padding's rows fully masked: the guard's zeros), against the
    interpreter's value of the node it holds; the other kernels at their defaults."""
    from kiln.codegen.attention import as_attention
    from kiln.codegen.cuda_attention import attention_space
    from kiln.ir import evaluate
    from kiln.ir.compare import mismatch, tolerance
    from kiln.ir.last_position import prompt_args
    from kiln.runtime.cuda import CudaBackend
    from kiln.runtime.executor import Executor
    from kiln.ir.last_position import last_position
    _, lm = tiny_case("heads64_bf16")
    graph, backend = last_position(lm.prefill, at_length=True), CudaBackend()
    program = schedule(graph, POLICIES["inline12-bcast1-rows-attention"])
    # the last layer's, for the last position alone, is decode's form (its own test below)
    fused = [k for k in program.kernels if as_attention(k) and as_attention(k).query is not None]
    assert len(fused) == 1
    args = prompt_args(graph, np.random.default_rng(length).integers(0, 64, (1, length)), pad=True)
    assert args[0].shape[1] > length
    feeds = {**dict(zip(graph.inputs, args)), **{n: graph.weights[n.attrs["name"]] for n in graph.weight_nodes()}}
    names = [k.output.name for k in program.kernels]
    env = graph.bind_symbols([np.shape(a) for a in args], [np.asarray(a).dtype for a in args])
    want = dict(zip(names, evaluate([program.nodes[n] for n in names], feeds, env)))
    rtol = tolerance([np.dtype(DType.BF16.np)])
    for config in attention_space(fused[0]):
        configs = [config if k is fused[0] else backend.default_config(k) for k in program.kernels]
        got = Executor(graph, program, configs, backend, reuse=False).trace(*[np.copy(a) for a in args])
        for kernel, name in zip(program.kernels, names):
            problem = mismatch(got[name], want[name], rtol)
            assert not problem, f"{kernel.label} [{config.key()}]: {problem}"


DECODE_ATTENTION = ("heads64_bf16", "heads64_f32")   # q, k and v rounded to bf16; an f32 model's


def _decode_attention_kernels(tag: str):
    """A tiny Llama's decode under the policies that fuse its attention: each head one query, its
    keys the pair's (heads64: 4 over 2)."""
    from kiln.codegen.attention import as_attention
    _, lm = tiny_case(tag)
    out = []
    for policy in ("inline12-bcast1-rows-attention", "inline64-bcast16-epilogue-merge-rows-attention"):
        program = schedule(lm.decode, POLICIES[policy])
        out.append((lm.decode, program, [k for k in program.kernels if as_attention(k)]))
    return out


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed here")
def test_decode_attention_compiles_with_nvcc_in_every_split(tmp_path):
    """Decode's fused attention (one query a head) in each split of the keys among blocks compiles
    for the H200; a split's blocks combine through scratch memory and an arrival counter."""
    from kiln.codegen.attention import as_attention
    from kiln.codegen.cuda_attention import attention_space
    from kiln.codegen.cuda_decode_attention import emit_cuda_decode_attention
    sources = []
    for _, _, fused in (c for tag in DECODE_ATTENTION for c in _decode_attention_kernels(tag)):
        assert fused and all(as_attention(k).query is None for k in fused)
        for k in fused:
            space = attention_space(k)
            assert [c.split for c in space][0] == 1 and max(c.split for c in space) > 1
            sources += [emit_cuda_decode_attention(as_attention(k), c, f"k{len(sources)}_{j}")
                        for j, c in enumerate(space)]
    assert any("atomicAdd(kiln_arrivals" in s for s in sources)
    unit = tmp_path / "decode.cu"
    unit.write_text(PRELUDE + "\n".join(sources))
    result = subprocess.run(["nvcc", "-arch=sm_90", "--ptx", str(unit), "-o", str(tmp_path / "decode.ptx")],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed here")
@pytest.mark.parametrize("tag", DECODE_ATTENTION)
def test_decode_attention_splits_run_on_the_cpu_equal_the_interpreter(tmp_path, tag):
    """Without a GPU: decode's fused attention kernel, as generated for CUDA, compiled by g++
    against tests/cuda_on_cpu.py's shim (threads, barriers and shuffles emulated, blocks in
    turn), each split launched twice at three cache positions, against the interpreter's value
    of the node it holds. The same source the GPU runs; what the shim cannot show (memory
    ordering across blocks, speed) the GPU test below does."""
    from kiln.codegen.attention import as_attention
    from kiln.codegen.c_emit import STORAGE
    from kiln.codegen.cuda_attention import attention_space
    from kiln.codegen.cuda_decode_attention import WARPS, emit_cuda_decode_attention, points, split_scratch
    from kiln.ir import evaluate
    from kiln.ir.compare import mismatch, tolerance
    from tests.cuda_on_cpu import build, launch
    graph, program, fused = _decode_attention_kernels(tag)[1]
    kernel = fused[0]
    a = as_attention(kernel)
    rtol = tolerance([np.dtype(a.dtype.np)])
    libraries = {}
    for position in (0, 11, TINY_CASES[tag][3] - 8):       # up to most of the cache
        rng = np.random.default_rng(position)
        args = decode_args(graph, np.array([[7]]), position, [
            (rng.standard_normal(tuple(d.value for d in n.shape)) * 0.5).astype(n.dtype.np)
            for n in graph.inputs[CACHES_START:]])
        feeds = {**dict(zip(graph.inputs, args)), **{n: graph.weights[n.attrs["name"]] for n in graph.weight_nodes()}}
        env = graph.bind_symbols([np.shape(x) for x in args], [np.asarray(x).dtype for x in args])
        names = [b.name for b in kernel.inputs]
        values = evaluate([program.nodes[n] for n in [kernel.output.name, *names]], feeds, env)
        want, inputs = values[0], [np.ascontiguousarray(v).reshape(-1) for v in values[1:]]
        inputs = [v.view(np.uint16) if b.dtype in (DType.BF16, DType.F16) else v for b, v in zip(kernel.inputs, inputs)]
        # the same values one element past a 16-byte boundary: key rows read an element at a time
        shifted = [np.concatenate([v[:1], v])[1:] if v.dtype == np.uint16 else v for v in inputs]
        assert all(v.ctypes.data % 16 for v in shifted if v.dtype == np.uint16)
        symbols = np.array([env[s] for s in kernel.symbols], np.int64)
        for config in attention_space(kernel):
            if config not in libraries:
                source = emit_cuda_decode_attention(a, config, f"k_split{config.split}")
                types = ([f"{STORAGE[b.dtype]}*" for b in (*kernel.outputs, *kernel.inputs)] + ["const int64_t*"]
                         + (["unsigned char*", "unsigned int*"] if config.split > 1 else []))
                libraries[config] = build(source, f"k_split{config.split}", types, tmp_path)
            scratch_bytes, counters = split_scratch(a, config)
            scratch, arrivals = np.zeros(max(scratch_bytes, 8), np.uint8), np.zeros(max(counters, 1), np.uint32)
            for operands in (inputs, shifted):   # two launches: the counters are left ready for the next
                out = np.full(want.size, np.nan, kernel.output.dtype.np)     # a kernel must write
                extra = [scratch, arrivals] if config.split > 1 else []
                stored = out.view(np.uint16) if kernel.output.dtype in (DType.BF16, DType.F16) else out
                launch(libraries[config], [stored, *operands, symbols, *extra], points(a) * config.split, WARPS * 32)
                got = out.astype(np.float32).reshape(want.shape)
                problem = mismatch(got, np.asarray(want, np.float32), rtol)
                assert not problem, f"position {position} [{config.key()}]: {problem}"
                assert not arrivals.any()


@pytest.mark.parametrize("position", [0, 11, 150])
@needs_gpu
def test_decode_attention_of_each_split_equals_the_interpreter(position):
    """Each split of decode's fused attention, launched twice (a split's counters are left ready
    for the next launch), against the interpreter's value of the node it holds, at a few cache
    positions (the window from one key to most of the cache); the other kernels at their
    defaults, on random caches."""
    from kiln.codegen.attention import as_attention
    from kiln.codegen.cuda_attention import attention_space
    from kiln.ir import evaluate
    from kiln.ir.compare import mismatch, tolerance
    from kiln.runtime.cuda import CudaBackend
    from kiln.runtime.executor import Executor
    backend = CudaBackend()
    rng = np.random.default_rng(position)
    for tag, (graph, program, fused) in ((t, c) for t in DECODE_ATTENTION for c in _decode_attention_kernels(t)):
        rtol = tolerance([np.dtype(as_attention(fused[0]).dtype.np)])
        at = min(position, TINY_CASES[tag][3] - 8)        # within the smaller case's cache
        args = decode_args(graph, np.array([[7]]), at, [
            (rng.standard_normal(tuple(d.value for d in n.shape)) * 0.5).astype(n.dtype.np)
            for n in graph.inputs[CACHES_START:]])
        feeds = {**dict(zip(graph.inputs, args)), **{n: graph.weights[n.attrs["name"]] for n in graph.weight_nodes()}}
        names = [k.output.name for k in program.kernels]
        env = graph.bind_symbols([np.shape(a) for a in args], [np.asarray(a).dtype for a in args])
        want = dict(zip(names, evaluate([program.nodes[n] for n in names], feeds, env)))
        for config in attention_space(fused[0]):
            configs = [config if as_attention(k) else backend.default_config(k) for k in program.kernels]
            executor = Executor(graph, program, configs, backend, reuse=False)
            for launch in range(2):
                got = executor.trace(*[np.copy(a) for a in args])
                for kernel, name in zip(program.kernels, names):
                    problem = mismatch(got[name], want[name], rtol)
                    assert not problem, f"{kernel.label} [{config.key()}], launch {launch + 1}: {problem}"


def attention_cases() -> dict:
    """tests/test_attention.py's attentions by name: the random sdpa modules, one normalized after
    the product, two under a finite mask (the quiet one's hidden tiles skipped, the loud one's
    not: a key's product outweighs its mask)."""
    from tests.test_attention import far_mask_case, normalized_after_case, sdpa_case
    return {**{f"sdpa-{seed}": lambda seed=seed: sdpa_case(seed) for seed in range(16)},
            "normalized-after": normalized_after_case, "far-mask-quiet": lambda: far_mask_case(False),
            "far-mask-loud": lambda: far_mask_case(True)}


def attention_graph(name: str):
    """An attention of attention_cases lowered here, or, where this torch cannot export it, as
    save_tiny_cases saved it."""
    from kiln.frontend.lower import lower
    from kiln.ir.serialize import graph_from_json
    module, args = attention_cases()[name]()
    try:
        return lower(module, args), module, args
    except kiln.ExportError:
        saved = os.environ.get("KILN_TEST_LOWERED")
        if not saved:
            pytest.skip("this torch cannot export the attention; set KILN_TEST_LOWERED")
        return graph_from_json(json.loads((Path(saved) / f"{name}.json").read_text())), module, args


@pytest.mark.parametrize("name", [*(f"sdpa-{seed}" for seed in range(16)), "normalized-after", "far-mask-quiet",
                                  "far-mask-loud"])
@needs_gpu
def test_fused_attention_of_random_sdpa_on_tensor_cores_equals_the_interpreter(name):
    """The fuzzed attentions of test_attention.py under every tiling of the tensor-core pass: the
    interpreter's output within the 16-bit type's tolerance, PyTorch's within 2e-2."""
    from kiln.codegen.attention import as_attention
    from kiln.codegen.cuda_attention import attention_space
    from kiln.ir.tensors import to_numpy
    from kiln.ir.compare import mismatch, tolerance
    from kiln.runtime.cuda import CudaBackend
    from kiln.runtime.executor import Executor
    graph, module, args = attention_graph(name)
    program = schedule(graph, POLICIES["inline12-bcast1-rows-attention"])
    fused = program.kernels[-1]
    assert as_attention(fused)
    inputs = [to_numpy(a) for a in args]
    want = run(graph, inputs)[0]
    eager = module(*args).float().numpy()
    backend = CudaBackend()
    for config in attention_space(fused):
        configs = [config if k is fused else backend.default_config(k) for k in program.kernels]
        got = Executor(graph, program, configs, backend).host_outputs(*inputs)[0]
        problem = mismatch(got, want, tolerance([inputs[0].dtype]))
        assert not problem, f"{config.key()}: {problem}"
        np.testing.assert_allclose(np.asarray(got, np.float32), eager, rtol=2e-2, atol=2e-2)


@needs_gpu
def test_executors_of_one_model_read_one_copy_of_each_weight():
    """decode, decode_long and the prefill buckets, like every candidate of a region, read the
    same host weights: the GPU holds each once."""
    from kiln.runtime.cuda import CudaBackend
    from kiln.runtime.executor import Executor
    _, lm = tiny_case("tiny1_bf16")
    backend, program = CudaBackend(), schedule(lm.decode)
    first, second = (Executor(lm.decode, program, [CudaConfig()] * len(program.kernels), backend)
                     for _ in range(2))
    weights = [name for name, b in program.buffers.items() if b.role == "weight"]
    assert weights and all(first.arrays[n].data.ptr == second.arrays[n].data.ptr for n in weights)


@needs_gpu
def test_cublas_takes_every_library_case_and_a_recording_replays_a_gathered_operand():
    """Every library case runs as cuBLAS calls equal to the reference (GQA's bf16 values widened
    into f32 scratch under f32 weights among them). Attention's output read as
    [seq, heads * d] (a reduction over two variables that do not flatten) is gathered into the
    launcher's scratch first; at fixed sizes, as decode runs it, a CUDA graph records the gather
    and the call and replays them on new values."""
    import cupy as cp
    from kiln.codegen.library import as_gemm
    from kiln.codegen.policy import FusionPolicy
    from kiln.ir import Graph
    from kiln.ir.build import permute, reshape
    from kiln.runtime.cuda import CudaBackend
    from kiln.runtime.executor import Executor
    from tests.kernel_check import run_problems
    from tests.test_library import cases, inp, matmul, policy

    def library_executor(graph, fusion=FusionPolicy(4, 0)):
        program = schedule(graph, fusion)
        configs = [LibraryConfig() if as_gemm(k) else CudaConfig() for k in program.kernels]
        return Executor(graph, program, configs, backend)
    backend, rng = CudaBackend(), np.random.default_rng(5)
    for name, inputs, out, weights in cases():
        executor = library_executor(Graph(inputs, [out], weights=weights, symbols={"t": (1, 16)}), policy(name))
        for t in (1, 7):
            args = [rng.standard_normal(tuple(d.evaluate({"t": t}) for d in i.shape)).astype(i.dtype.np)
                    for i in inputs]
            assert not run_problems(executor, args), (name, t)
    heads, wo = inp("heads", (3, 5, 8)), inp("wo", (6, 24), role="weight")
    merged = reshape(permute(heads, (1, 0, 2)), (5, 24))
    graph = Graph([heads], [matmul(merged, permute(wo, (1, 0)))],
                  weights={"wo": rng.standard_normal((6, 24)).astype(np.float32)})
    executor = library_executor(graph)
    assert executor.replayable
    (gemm_fn,) = [fn for fn, (n, _) in zip(executor.functions, executor.sources) if is_library(n)]
    assert len(gemm_fn.plan({}).gathers) == 1
    x = cp.asarray(rng.standard_normal((3, 5, 8)).astype(np.float32))
    replay = executor.record([x])
    for _ in range(2):
        x[...] = cp.asarray(rng.standard_normal((3, 5, 8)).astype(np.float32))
        replay()
        inputs, env = executor.bind([x])
        got = cp.asnumpy(executor.result(executor.program.outputs[0], inputs, env))
        np.testing.assert_allclose(got, run(graph, [cp.asnumpy(x)])[0], rtol=1e-5, atol=1e-5)


@needs_gpu
def test_tf32_products_stay_within_tf32_rounding_of_the_reference():
    """Every library case with an f32 operand run as a TF32 cuBLAS call: within the 10-bit
    mantissa's rounding of the reference, not equal to f32's (the tensor cores did round)."""
    from kiln.codegen.library import as_gemm
    from kiln.ir import Graph
    from kiln.runtime.cublas import TF32
    from kiln.runtime.cuda import CudaBackend
    from kiln.runtime.executor import Executor
    from tests.test_library import cases, policy
    backend, rng, rounded = CudaBackend(), np.random.default_rng(6), 0
    for name, inputs, out, weights in cases():
        graph = Graph(inputs, [out], weights=weights, symbols={"t": (1, 16)})
        program = schedule(graph, policy(name))
        gemms = [as_gemm(k) for k in program.kernels]
        if not any(g and DType.F32 in (g.a.dtype, g.b.dtype) for g in gemms):
            continue
        configs = [LibraryConfig(TF32) if g and DType.F32 in (g.a.dtype, g.b.dtype) else CudaConfig() for g in gemms]
        executor = Executor(graph, program, configs, backend)
        args = [rng.standard_normal(tuple(d.evaluate({"t": 7}) for d in i.shape)).astype(i.dtype.np) for i in inputs]
        got = executor.host_outputs(*args)[0].astype(np.float64)
        want = run(graph, args)[0].astype(np.float64)
        error = np.abs(got - want).max() / np.abs(want).max()
        assert error < 1e-2, name
        rounded += error > 1e-6
    assert rounded


@pytest.mark.parametrize("source", list(DType), ids=repr)
@needs_gpu
def test_cuda_kernels_cast_as_the_reference_does(source):
    """The cast edge values of tests/test_cast.py, every pair of dtypes and back, on the GPU."""
    from kiln.runtime.cuda import CudaBackend
    from kiln.runtime.executor import Executor
    from tests.test_cast import cast_graph, same
    graph, args = cast_graph(source)
    program = schedule(graph)
    executor = Executor(graph, program, [CudaConfig()] * len(program.kernels), CudaBackend())
    for got, want in zip(executor.host_outputs(*args), run(graph, args)):
        assert same(got, want), (got, want)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed here")
def test_cast_kernels_compile_with_nvcc(tmp_path):
    from tests.test_cast import cast_graph
    kernels = [k for source in DType for k in schedule(cast_graph(source)[0]).kernels]
    unit = tmp_path / "casts.cu"
    unit.write_text(PRELUDE + "\n".join(emit_cuda(k, CudaConfig(), f"k{i}") for i, k in enumerate(kernels)))
    result = subprocess.run(["nvcc", "-arch=sm_90", "--ptx", str(unit), "-o", str(tmp_path / "casts.ptx")],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]


def save_tiny_cases(folder: str) -> None:
    """What the GPU machine's KILN_TEST_LOWERED points at (scripts/gpu_session.sh)."""
    from kiln.frontend.hf import save_lowered
    Path(folder).mkdir(parents=True, exist_ok=True)
    from kiln.frontend.lower import lower
    from kiln.ir.serialize import graph_to_json
    for tag, (_, _, _, max_seq, _) in TINY_CASES.items():
        save_lowered(lower_causal_lm(tiny_model(tag), max_seq), str(Path(folder) / tag))
    for name, case in attention_cases().items():
        (Path(folder) / f"{name}.json").write_text(json.dumps(graph_to_json(lower(*case()))))
