"""Candidates measured side by side: several worker processes compile at once and take turns on
the device to check and time, and the tuner keeps that many candidates in flight."""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from click.testing import CliRunner

from kiln.cli import main
from kiln.codegen.policy import POLICIES
from kiln.compiler.measure import Measurer
from kiln.compiler.worker import IsolatedEvaluate, _cores_of, default_width
from kiln.runtime.cache import unit_of
from kiln.runtime.cpu import CpuBackend, cache_dir
from kiln.search.budget import Deadline
from kiln.search.saturate import Limits, saturate
from kiln.search.tuner import Outcome, RegionTuner
from kiln.search.tunedb import TuneDB
from kiln.tests.test_saturate import long_sum, with_associativity
from kiln.tests.test_worker import _region


def test_two_workers_measure_candidates_side_by_side(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE", str(tmp_path))
    region, outputs = _region()
    variants = list(POLICIES)[:4]
    evaluate_ = IsolatedEvaluate("cpu", tmp_path / "tune.sqlite", "test-machine", region, timeout_s=60, width=2)
    try:
        outcomes = [f.result() for f in [evaluate_.submit(outputs, v) for v in variants]]
        pids = {p._proc.pid for p in evaluate_._processes}
    finally:
        evaluate_.close()
    assert [o.status for o in outcomes] == ["ok"] * len(variants)
    assert len(pids) == 2                       # both workers took candidates
    assert evaluate_.kernels_measured > 0 and evaluate_.restarts == 0
    # a worker that shares the device accounts its wait for a turn
    assert all("device wait" in o.spent for o in outcomes)
    with TuneDB(tmp_path / "tune.sqlite") as db:
        assert db.stats("test-machine")["kernels"] >= 1


class _Turns:
    """A device lock that knows which thread holds it."""

    def __init__(self):
        self._lock, self.holder = threading.Lock(), None

    def __enter__(self):
        self._lock.acquire()
        self.holder = threading.get_ident()

    def __exit__(self, *exc):
        self.holder = None
        self._lock.release()


def test_a_measurer_compiles_off_the_device_and_runs_kernels_on_it(tmp_path, monkeypatch):
    """Compiles (the long part on a GPU host) never hold the device; every timing, check launch
    and poisoned output does: two measurers in threads, sharing one device."""
    monkeypatch.setenv("KILN_CACHE", str(tmp_path))
    region, outputs = _region()
    device, seen = _Turns(), []

    class Watched(CpuBackend):
        def compile(self, functions):
            # kernels compiled now (the executor's look-up of those compiled before is not a compile)
            if any(n.startswith("k_") and unit_of(cache_dir(), n) is None for n in functions):
                seen.append(("compile", device.holder == threading.get_ident()))
            return super().compile(functions)

        def time(self, fn, *args, **kw):
            seen.append(("time", device.holder == threading.get_ident()))
            return super().time(fn, *args, **kw)

        def poison(self, buffer, dtype):
            seen.append(("poison", device.holder == threading.get_ident()))
            super().poison(buffer, dtype)

    def measure(variant):
        with TuneDB(tmp_path / "tune.sqlite") as db:
            return Measurer(Watched(), db, "test-machine", region, device=device).evaluate(outputs, variant)

    with ThreadPoolExecutor(2) as pool:
        outcomes = list(pool.map(measure, list(POLICIES)[:4]))
    assert [o.status for o in outcomes] == ["ok"] * 4
    kinds = {kind for kind, _ in seen}
    assert kinds == {"compile", "time", "poison"}
    assert all(held == (kind != "compile") for kind, held in seen), seen


def test_the_tuner_keeps_its_evaluates_width_in_flight(tmp_path):
    """An evaluate with `submit` and `width` 3: the tuner has three candidates measured at once,
    notes each once, and stops at max_candidates counting those in flight."""
    program = [long_sum(6)]
    saturated = saturate(program, with_associativity(), Limits(max_enodes=4_000))
    flying, most = [0], [0]
    count = threading.Lock()

    def depth(node):
        return 1 + max((depth(k) for k in node.inputs), default=0)

    def measure(outputs, variant):
        with count:
            flying[0] += 1
            most[0] = max(most[0], flying[0])
        time.sleep(0.02)
        with count:
            flying[0] -= 1
        return Outcome("ok", 1e-6 * sum(depth(o) for o in outputs))

    class SideBySide:
        width = 3

        def __init__(self):
            self.pool = ThreadPoolExecutor(self.width)

        def submit(self, outputs, variant):
            return self.pool.submit(measure, outputs, variant)

        def __call__(self, outputs, variant):
            return measure(outputs, variant)

    evaluate = SideBySide()
    with TuneDB(tmp_path / "tune.sqlite") as db:
        tuner = RegionTuner("r", "layer", program, saturated, ["a"], evaluate,
                            end_to_end=lambda outputs, variant: lambda: measure(outputs, variant).estimate_s,
                            db=db, compile_id="c1", seed=3)
        tuner.measure_lowered(Deadline(60))
        winner = tuner.run(Deadline(60), max_candidates=12)
        recorded = len(db.candidates("c1", "r"))
    evaluate.pool.shutdown()
    assert most[0] == 3
    assert tuner.progress.tried == tuner.progress.measured == recorded == 12
    assert winner.estimate_s == min(e for e, *_ in tuner.ok)


def test_one_worker_on_the_cpu_several_beside_a_gpu_each_on_cores_of_its_own(monkeypatch):
    assert default_width("cpu") == 1
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(16)), raising=False)
    assert default_width("cuda") == 8
    assert [_cores_of("cuda", 8, k) for k in (0, 7)] == [[0, 1], [14, 15]]
    assert _cores_of("cpu", 8, 0) is None and _cores_of("cuda", 1, 0) is None
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert default_width("cuda") == 1


def test_workers_side_by_side_are_refused_on_the_cpu(tmp_path):
    """A CPU kernel is timed on every core: a second worker's compiles would be timed with it."""
    result = CliRunner().invoke(main, ["compile", "smollm2", "--out", str(tmp_path / "art"), "--workers", "2"])
    assert result.exit_code != 0
    assert "--workers 2 needs a GPU backend" in result.output
    assert not (tmp_path / "art").exists()


def test_one_candidate_at_a_time_keeps_to_one_worker(tmp_path, monkeypatch):
    """A region's program as lowered and the finalists are measured one at a time: the workers
    beyond the first start only for candidates in flight side by side."""
    monkeypatch.setenv("KILN_CACHE", str(tmp_path))
    region, outputs = _region()
    evaluate_ = IsolatedEvaluate("cpu", tmp_path / "tune.sqlite", "test-machine", region, timeout_s=60, width=3)
    try:
        for variant in list(POLICIES)[:3]:
            assert evaluate_(outputs, variant).status == "ok"
        started = [p for p in evaluate_._processes if p._proc is not None]
    finally:
        evaluate_.close()
    assert len(started) == 1


@pytest.mark.parametrize("width", [1, 2])
def test_a_closed_evaluate_leaves_no_worker(tmp_path, monkeypatch, width):
    monkeypatch.setenv("KILN_CACHE", str(tmp_path))
    region, outputs = _region()
    evaluate_ = IsolatedEvaluate("cpu", tmp_path / "tune.sqlite", "test-machine", region, timeout_s=60, width=width)
    futures = [evaluate_.submit(outputs, v) for v in list(POLICIES)[:2 * width]]
    futures[0].result()
    processes = [p._proc for p in evaluate_._processes if p._proc is not None]
    evaluate_.close()
    assert processes and all(proc.poll() is not None for proc in processes)
    assert not evaluate_.root.exists()


def test_a_search_with_two_workers_still_finds_the_planted_rewrite(tmp_path, monkeypatch):
    """The whole region search with two workers side by side (on the CPU only for this test: the
    compile refuses it there, and a kernel timed beside the other worker's compile takes longer;
    the planted chain's rewrite saves 100-fold): every candidate is journaled once, and the
    winner is the rewritten chain."""
    import torch
    from kiln.compiler.loop import compile_graph
    from kiln.frontend.lower import lower
    from kiln.ir.tensors import to_numpy
    from kiln.tests.test_planted import Chain, N, largest
    monkeypatch.setenv("KILN_CACHE", str(tmp_path))
    torch.manual_seed(0)
    module, args = Chain(), (torch.randn(N, 1),)
    graph = lower(module, args)
    with TuneDB(tmp_path / "tune.sqlite") as db:
        evaluate_ = IsolatedEvaluate("cpu", db.path, "test-machine", timeout_s=60, width=2)
        try:
            compiled, report = compile_graph(graph, CpuBackend(), [to_numpy(a) for a in args], 30, db,
                                             "test-machine", compile_id="c", isolate=evaluate_)
        finally:
            evaluate_.close()
        journaled = db.candidates("c")
    (region,) = report.regions
    assert region.progress.measured == len(journaled) == len({c.candidate_hash for c in journaled})
    assert region.progress.measured > 2 and "device wait" in region.progress.spent
    (choice,) = compiled.choices.values()
    assert largest(choice.outputs) * 16 <= largest(graph.outputs)
