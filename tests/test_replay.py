"""The logic around recorded launches (CUDA graphs), run here without a GPU: a CPU backend that
records launches instead of running them while capturing, and replays the record. Device arrays
are told from host ones by type, as CuPy's are; host inputs must go through fixed buffers and
the KV cache must be used where it lies, or a replay computes from stale memory. The real CUDA
graph is tested on the GPU (tests/test_cuda.py)."""
from __future__ import annotations

import numpy as np
import pytest

from kiln.frontend.hf import lower_causal_lm
from kiln.ir import ShapeError
from kiln.ir.decode import CACHES_START, WINDOW, decode_args
from kiln.runtime.compiled import CompiledGraph, read_inputs, replays
from kiln.runtime.executor import fixed_symbols
from kiln.runtime.cpu import CpuBackend
from tests.helpers import tiny_llama


class DeviceArray(np.ndarray):
    """An array in the recording backend's "device" memory."""


class RecordingCpuBackend(CpuBackend):
    # as CUDA's: kernels run through their launchers (which this backend records), never as one
    # C call per region, and a prefill is recorded at each padded length
    region_runner = None
    records_each_size = True

    def __init__(self):
        super().__init__()
        self.record: list | None = None
        self.captures = 0

    # all memory the backend hands out is "device" memory, views of it too
    def allocate(self, nbytes: int):
        return super().allocate(nbytes).view(DeviceArray)

    def upload(self, array):
        return np.array(array, order="C", copy=True).view(DeviceArray)

    def input(self, array):
        # as CuPy's: a device array is used as it is; a host one is copied to the device
        return array if isinstance(array, DeviceArray) else self.upload(super().input(array))

    def resident(self, array, written: bool) -> bool:
        return isinstance(array, DeviceArray)

    @staticmethod
    def address(array) -> int:
        return array.ctypes.data

    @staticmethod
    def write(buffer, array) -> None:
        buffer[...] = array

    def launcher(self, fn, kernel, config):
        launch = super().launcher(fn, kernel, config)

        def recorded(args, env):
            if self.record is None:
                launch(args, env)
            else:
                self.record.append((launch, list(args), env))
        return recorded

    @staticmethod
    def capturable(fn, env) -> bool:
        return True

    def capture(self, body):
        self.record, self.captures = [], self.captures + 1
        try:
            body()
            record = self.record
        finally:
            self.record = None
        return lambda: [launch(args, env) for launch, args, env in record]


def test_decode_replays_a_record_and_matches_a_plain_run():
    lm = lower_causal_lm(tiny_llama(2, seed=5), 24)
    replaying = CompiledGraph.untuned(lm.decode, RecordingCpuBackend())
    plain = CompiledGraph.untuned(lm.decode, CpuBackend())
    assert replaying._replayable
    backend = replaying.backend
    zeros = [np.zeros(tuple(d.value for d in n.shape), n.dtype.np) for n in lm.decode.inputs[CACHES_START:]]
    rng = np.random.default_rng(0)
    for caches_round in range(2):     # a new KV cache (a new prompt) is recorded again
        device_caches = [backend.input(z) for z in zeros]
        host_caches = [z.copy() for z in zeros]
        for pos in range(5):          # the window grows with pos; the recording stays
            token = np.array([[rng.integers(0, 64)]])
            got, *kept = replaying(*decode_args(lm.decode, token, pos, device_caches))
            want, *host_caches = plain(*decode_args(lm.decode, token, pos, host_caches))
            np.testing.assert_array_equal(np.asarray(got), want)
            assert all(k is c for k, c in zip(kept, device_caches)), "the cache is updated in place"
            for d, h in zip(device_caches, host_caches):
                np.testing.assert_array_equal(np.asarray(d), h)
        assert backend.captures == caches_round + 1


def test_replayed_outputs_are_the_callers_to_keep():
    lm = lower_causal_lm(tiny_llama(1, seed=6), 16)
    decode = CompiledGraph.untuned(lm.decode, RecordingCpuBackend())
    caches = [decode.backend.input(np.zeros(tuple(d.value for d in n.shape), n.dtype.np))
              for n in lm.decode.inputs[CACHES_START:]]
    first = decode(*decode_args(lm.decode, np.array([[3]]), 0, caches))[0]
    kept = np.array(first)
    decode(*decode_args(lm.decode, np.array([[9]]), 1, caches))
    np.testing.assert_array_equal(np.asarray(first), kept)   # not overwritten by the next replay


def test_a_replayed_step_still_refuses_a_window_past_the_cache():
    """A replay skips the full input check the recording made; a symbol out of range still fails."""
    lm = lower_causal_lm(tiny_llama(1, seed=6), 16)
    decode = CompiledGraph.untuned(lm.decode, RecordingCpuBackend())
    caches = [decode.backend.input(np.zeros(tuple(d.value for d in n.shape), n.dtype.np))
              for n in lm.decode.inputs[CACHES_START:]]
    for pos in (0, 1):     # the first call runs launched, the second records
        decode(*decode_args(lm.decode, np.array([[3]]), pos, caches))
    args = decode_args(lm.decode, np.array([[3]]), 2, caches)
    args[[n.attrs["name"] for n in lm.decode.inputs].index(WINDOW)] = np.zeros(17, np.bool_)
    with pytest.raises(ShapeError, match="window's range 2..16"):
        decode(*args)
    assert decode.backend.captures == 1


def test_a_padded_prefill_replays_one_recording_per_padded_length():
    """Prompts of 3, 9 and 20 tokens pad to 32 tokens and 40 to 64: the first call of a padded
    length runs launched, later ones replay its recording; each gives the logits and caches of
    the prompt run alone, unpadded."""
    from kiln.ir.last_position import last_position, prompt_args
    lm = lower_causal_lm(tiny_llama(1, seed=8), 64)
    graph = last_position(lm.prefill, at_length=True)
    replaying = CompiledGraph.untuned(graph, RecordingCpuBackend())
    plain = CompiledGraph.untuned(graph, CpuBackend())
    rng = np.random.default_rng(2)
    for length in (3, 9, 20, 40, 5, 41):
        ids = rng.integers(0, 64, (1, length))
        got = replaying(*prompt_args(graph, ids, pad=True))
        want = plain(*prompt_args(graph, ids))
        np.testing.assert_allclose(np.asarray(got[0]), want[0], rtol=1e-5, atol=1e-6)
        for cache, whole in zip(got[1:], want[1:]):
            np.testing.assert_allclose(np.asarray(cache)[:, :, :length], whole[:, :, :length], rtol=1e-5, atol=1e-6)
    assert replaying.backend.captures == 2 and len(replaying._recordings) == 2


def test_finalists_are_timed_as_the_user_runs_them(tmp_path):
    """A region of decode (whose outputs have fixed sizes; its attention reads a window of
    symbolic length) is timed end to end as the replay of one recording, the launch mode decode
    runs in; a region of prefill too, recorded at the prompt's length, as a prefill replays."""
    from kiln.ir import evaluate
    from kiln.compiler.measure import Measurer, Region
    from kiln.ir import regions
    from kiln.search.tunedb import TuneDB
    from tests.test_worker import VARIANT
    lm = lower_causal_lm(tiny_llama(1, seed=7), 16)
    rng = np.random.default_rng(1)
    calls = {"decode": decode_args(lm.decode, np.array([[3]]), 2, [
                 rng.standard_normal(tuple(d.value for d in n.shape)).astype(n.dtype.np)
                 for n in lm.decode.inputs[CACHES_START:]]),
             "prefill": [rng.integers(0, 64, (1, 5))]}
    for which in ("decode", "prefill"):
        graph = getattr(lm, which)
        layer = next(r for r in regions.split(graph) if r.label == "layer 0")
        (feeds,), env = regions.sample_inflows(graph, [layer], calls[which])
        program = layer.program(graph)
        args = [feeds[i] for i in program.inputs]
        want = evaluate(layer.outputs, {**dict(zip(program.inputs, args)),
                                        **{i: program.weights[i.attrs["name"]] for i in layer.inputs
                                           if i.attrs["role"] == "weight"}}, env)
        backend = RecordingCpuBackend()
        measurer = Measurer(backend, TuneDB(tmp_path / f"{which}.sqlite"), "test",
                            Region(program.inputs, program.weights, dict(graph.symbols), args, want,
                                   sizes=env, recorded=replays(graph),
                                   fixed=fixed_symbols(read_inputs(graph))))
        assert measurer.end_to_end(layer.outputs, VARIANT)() > 0
        assert backend.captures == 1


def test_the_cpu_replays_a_decode_step_as_one_call_with_library_products_called_back():
    """The CPU backend records a decode step's region calls and replays them with one C call; a
    product its search gave numpy's BLAS is called back into Python from the replay. Each step
    equals the reference interpreter's, the caller's caches are written in place, and one
    recording serves every position (the window is a symbol the kernels read). A prefill, whose
    prompt length a recording would fix, runs launched: the CPU pads no prompt."""
    from kiln.codegen.kernel import KernelConfig
    from kiln.codegen.library import LibraryConfig, as_gemm
    from kiln.codegen.policy import POLICIES
    from kiln.codegen.schedule import schedule
    from kiln.ir import regions, run
    from kiln.runtime.compiled import Choice, region_graph
    lm = lower_causal_lm(tiny_llama(2, seed=9), 24)
    graph, variant = lm.decode, next(iter(POLICIES))
    choices = {}
    for region in regions.split(graph):
        program = schedule(region_graph(graph, region, region.outputs), POLICIES[variant])
        configs = [LibraryConfig() if as_gemm(k) and not k.symbols else KernelConfig() for k in program.kernels]
        choices.setdefault(region.key, Choice(region.outputs, variant, configs))
    decode = CompiledGraph(graph, choices, CpuBackend())
    assert decode.records and any(ex.runner.library_calls for ex in decode.executors)
    assert not CompiledGraph.untuned(lm.prefill, CpuBackend()).records
    rng = np.random.default_rng(4)
    caches = [rng.standard_normal(tuple(d.value for d in n.shape)).astype(n.dtype.np)
              for n in graph.inputs[CACHES_START:]]
    theirs = [c.copy() for c in caches]
    for pos in range(6):
        args = decode_args(graph, rng.integers(0, 64, (1, 1)), pos, caches)
        got = decode(*args)
        want = run(graph, [*args[:CACHES_START], *theirs])
        np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-6)
        assert all(g is c for g, c in zip(got[1:], caches)), "the caller's caches, written through"
        for mine, reference in zip(caches, want[1:]):
            np.testing.assert_allclose(mine, reference, rtol=1e-5, atol=1e-6)
        theirs = [np.asarray(w) for w in want[1:]]
    assert decode.replayed and len(decode._recordings) == 1
