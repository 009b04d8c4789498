"""The CPU's deployed launch mode: a region's kernels run as one generated C call (runtime/
cpu_region.py). It must compute exactly what the kernel-by-kernel path computes (the tuner's),
with symbols, with a library call splitting the region, with the KV cache written in place, and
survive an artifact's save and load."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

from kiln.codegen.c_runner import is_runner
from kiln.codegen.kernel import KernelConfig
from kiln.codegen.library import LibraryConfig, as_gemm
from kiln.codegen.policy import FusionPolicy
from kiln.codegen.schedule import schedule
from kiln.frontend.hf import lower_causal_lm
from kiln.ir import DType, Graph, KilnError, Op
from kiln.ir.build import elementwise, permute
from kiln.ir.decode import CACHES_START, decode_args
from kiln.ir.symbolic import sym
from kiln.runtime.compiled import CompiledGraph
from kiln.runtime.cpu import CpuBackend
from kiln.runtime.executor import Executor
from kiln.runtime.model import CompiledModel, fingerprint
from tests.helpers import tiny_llama
from tests.test_library import inp, matmul


@pytest.fixture(scope="module")
def tiny_lm():
    return lower_causal_lm(tiny_llama(2, seed=3), 24)


def both_ways(graph: Graph, program, configs) -> tuple[Executor, Executor]:
    backend = CpuBackend()
    deployed = Executor(graph, program, configs, backend, deployed=True)
    return deployed, Executor(graph, program, configs, backend)


def test_a_prefill_region_with_a_symbol_equals_the_kernel_by_kernel_path(tiny_lm):
    graph = tiny_lm.prefill
    runner = CompiledGraph.untuned(graph, CpuBackend())
    kernel_by_kernel = CompiledGraph.untuned(graph, CpuBackend())
    for ex in kernel_by_kernel.executors:
        ex.runner = None
    assert all(ex.runner.steps == 1 for ex in runner.executors)
    assert any(k.symbols for ex in runner.executors for k in ex.program.kernels), "the prompt length is a symbol"
    rng = np.random.default_rng(0)
    for length in (2, 9, 23, 5):       # a longer call, then a shorter one: no stale symbol
        ids = rng.integers(0, 64, (1, length))
        for got, want in zip(runner(ids), kernel_by_kernel(ids)):
            np.testing.assert_array_equal(got, want)


def test_a_library_call_splits_the_region_into_steps_around_it():
    x = inp("x", (sym("t"), 12))
    w = inp("w", (10, 12), role="weight")
    rng = np.random.default_rng(1)
    weights = {"w": rng.standard_normal((10, 12)).astype(np.float32)}
    # generated kernels before and after the product
    squared = elementwise(Op.MUL, x, elementwise(Op.SQRT, elementwise(Op.MUL, x, x)))
    out = elementwise(Op.ADD, matmul(squared, permute(w, (1, 0))), matmul(x, permute(w, (1, 0))))
    graph = Graph([x], [out, squared], weights=weights, symbols={"t": (1, 16)})
    program = schedule(graph, FusionPolicy(0, 0))
    gemms = [i for i, k in enumerate(program.kernels) if as_gemm(k)]
    assert gemms and gemms[0] > 0 and gemms[-1] < len(program.kernels) - 1
    configs = [LibraryConfig() if i == gemms[0] else KernelConfig() for i in range(len(program.kernels))]
    deployed, plain = both_ways(graph, program, configs)
    assert deployed.runner.steps == 2
    for t in (3, 16, 1):
        value = rng.standard_normal((t, 12)).astype(np.float32)
        for got, want in zip(deployed(value), plain(value)):
            np.testing.assert_array_equal(got, want)


def test_a_timed_run_takes_each_kernels_time_where_it_runs_and_computes_the_same():
    """The diagnostic runner (the bench's kernels timed in the step): every kernel gets a time,
    the library call between its steps too, and the region computes what the deployed one does."""
    x = inp("x", (sym("t"), 12))
    w = inp("w", (10, 12), role="weight")
    rng = np.random.default_rng(4)
    graph = Graph([x], [elementwise(Op.ADD, matmul(elementwise(Op.MUL, x, x), permute(w, (1, 0))),
                                    matmul(x, permute(w, (1, 0))))],
                  weights={"w": rng.standard_normal((10, 12)).astype(np.float32)}, symbols={"t": (1, 16)})
    program = schedule(graph, FusionPolicy(0, 0))
    first = next(i for i, k in enumerate(program.kernels) if as_gemm(k))
    configs = [LibraryConfig() if i == first else KernelConfig() for i in range(len(program.kernels))]
    deployed, plain = both_ways(graph, program, configs)
    value = rng.standard_normal((9, 12)).astype(np.float32)
    seconds = (ctypes.c_double * len(program.kernels))()
    deployed.runner.timing(seconds)
    got = deployed(value)
    assert all(s > 0 for s in seconds), list(seconds)
    for mine, want in zip(got, plain(value)):
        np.testing.assert_array_equal(mine, want)
    deployed.runner.timing(None)        # plain again: nothing written
    seconds[:] = [0.0] * len(program.kernels)
    deployed(value)
    assert not any(seconds)


def test_regions_share_one_scratch_for_their_temporaries(tiny_lm):
    """Regions run one after another: a compiled graph holds its largest region's temporaries
    plus every region's outputs (which later regions read), not every region's temporaries,
    and still computes what the interpreter does."""
    from kiln.ir import run
    graph = tiny_lm.prefill
    compiled = CompiledGraph.untuned(graph, CpuBackend())
    assert compiled.peak_bytes < sum(ex.plan.peak_bytes for ex in compiled.executors)
    scratch = {id(b) for b in compiled.scratch.buffers}
    for ex in compiled.executors:      # an output never lies in the shared memory
        for name in ex.program.outputs:
            if name in ex.plan.slot_of:
                assert id(ex.arrays[name]) not in scratch
    ids = np.random.default_rng(3).integers(0, 64, (1, 19))
    for got, want in zip(compiled(ids), run(graph, [ids])):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_decode_updates_the_kv_cache_in_place_as_the_kernel_by_kernel_path_does(tiny_lm):
    graph = tiny_lm.decode
    program = schedule(graph)
    assert program.aliases, "decode writes its caches in place"
    deployed, plain = both_ways(graph, program, [KernelConfig()] * len(program.kernels))
    rng = np.random.default_rng(2)
    shapes = [tuple(d.value for d in n.shape) for n in graph.inputs[CACHES_START:]]
    caches = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    theirs = [c.copy() for c in caches]
    for pos in (0, 1, 7, 23):
        token = rng.integers(0, 64, (1, 1))
        got = deployed(*decode_args(graph, token, pos, caches))
        want = plain(*decode_args(graph, token, pos, theirs))
        np.testing.assert_array_equal(got[0], want[0])
        assert all(g is c for g, c in zip(got[1:], caches)), "the caller's caches, written through"
        for mine, other in zip(caches, theirs):
            np.testing.assert_array_equal(mine, other)


def test_runner_sources_travel_in_the_artifact_and_are_checked_on_load(tiny_lm, tmp_path):
    compiled = CompiledGraph.untuned(tiny_lm.decode, CpuBackend())
    runners = {n: s for n, s in compiled.sources.items() if is_runner(n)}
    # one runner per distinct region: the two identical layers share theirs
    assert len(compiled.regions) == 4 and len(runners) == len({r.key for r in compiled.regions}) == 3
    model = CompiledModel("module", {"forward": compiled}, {}, fingerprint("cpu"))
    model.save(tmp_path / "a")
    for name, source in runners.items():
        assert (tmp_path / "a" / "kernels" / f"{name}.c").read_text() == source
    loaded = CompiledModel.load(tmp_path / "a").graphs["forward"]
    assert {n for n in loaded.sources if is_runner(n)} == set(runners)
    args = decode_args(tiny_lm.decode, np.array([[5]]), 3, [
        np.zeros(tuple(d.value for d in n.shape), np.float32) for n in tiny_lm.decode.inputs[CACHES_START:]])
    np.testing.assert_array_equal(loaded(*[np.copy(a) for a in args])[0], compiled(*args)[0])
    name = sorted(runners)[0]
    (tmp_path / "a" / "kernels" / f"{name}.c").write_text(runners[name] + "/* edited */\n")
    with pytest.raises(KilnError, match=f"altered after it was written: kernels/{name}.c"):
        CompiledModel.load(tmp_path / "a")


def test_a_bf16_decode_through_the_runner_equals_the_kernel_by_kernel_path():
    lm = lower_causal_lm(tiny_llama(1, seed=4).to(dtype=__import__("torch").bfloat16), 16)
    program = schedule(lm.decode)
    deployed, plain = both_ways(lm.decode, program, [KernelConfig(parallel=0)] * len(program.kernels))
    caches = [np.zeros(tuple(d.value for d in n.shape), n.dtype.np) for n in lm.decode.inputs[CACHES_START:]]
    theirs = [c.copy() for c in caches]
    got = deployed(*decode_args(lm.decode, np.array([[9]]), 4, caches))[0]
    want = plain(*decode_args(lm.decode, np.array([[9]]), 4, theirs))[0]
    assert got.dtype == DType.BF16.np
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))
