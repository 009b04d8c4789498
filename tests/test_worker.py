"""Candidates measured in a worker process: a kernel that crashes or hangs costs only its
candidate and its own configuration. The faults are real: a compiled kernel in the cache is
replaced by one that segfaults or never returns, and the real worker runs it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from kiln.codegen.kernel import KernelConfig
from kiln.codegen.policy import POLICIES
from kiln.codegen.schedule import schedule
from kiln.ir import DType, Node, Op, evaluate
from kiln.ir.build import reduce
from kiln.ir.symbolic import shape_of
from kiln.runtime.cpu import CpuBackend, cache_dir
from kiln.compiler.measure import PHASES, Measurer, Region
from kiln.compiler.progress import spent_text
from kiln.compiler.worker import IsolatedEvaluate
from kiln.search.tuner import RegionTuner
from kiln.search.tunedb import TuneDB

VARIANT = next(iter(POLICIES))


def _region(plain: bool = False) -> Region:
    """exp2(x[8, 64]) times w[64, 16] (x itself where `plain`), summed over 64: one reduction
    kernel, several configurations to time. Not a plain product by default: a product is also a
    library call, whose win by LIBRARY_PRUNE over the default would leave planted
    configurations untimed."""
    x = Node(Op.INPUT, name="x", role="input", shape=shape_of((8, 64, 1)), dtype=DType.F32)
    w = Node(Op.INPUT, name="w", role="weight", shape=shape_of((1, 64, 16)), dtype=DType.F32)
    product = Node(Op.MUL, [Node(Op.EXPAND, [x if plain else Node(Op.EXP2, [x])], shape=shape_of((8, 64, 16))),
                            Node(Op.EXPAND, [w], shape=shape_of((8, 64, 16)))])
    out = reduce(Op.SUM_REDUCE, product, [1])
    rng = np.random.default_rng(0)
    weights = {"w": rng.standard_normal((1, 64, 16)).astype(np.float32)}
    args = [rng.standard_normal((8, 64, 1)).astype(np.float32)]
    want = evaluate([out], {x: args[0], w: weights["w"]}, {})
    return Region([x], weights, {}, args, want), [out]


def _plant(cache, body: str, default: bool = False, params: str = "void", outputs=None) -> tuple[str, str]:
    """Replace the compiled kernel of the first kernel (of `outputs`' program, or the region's)
    in its default configuration, or in its first generated configuration after the default, by
    `void NAME(params) { body }`; returns its name and configuration."""
    region, region_outputs = _region()
    program = schedule(region.graph(outputs or region_outputs), POLICIES[VARIANT])
    kernel = program.kernels[0]
    backend = CpuBackend()
    config = backend.default_config() if default else next(
        c for c in backend.config_space(kernel)[1:] if isinstance(c, KernelConfig))
    name, _ = backend.render(kernel, config)
    so = cache / "planted.so"
    src = cache / "planted.c"
    src.write_text(f"void {name}({params}) {{ {body} }}\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-O0", "-o", str(so), str(src)], check=True)
    (cache / f"{name}.ref").write_text(so.name)
    return name, config.key()


@pytest.mark.parametrize("fault, status, body", [
    ("segfault", "crash", "*(volatile int*)0 = 1;"),
    ("hang", "timeout", "for (;;) {}"),
])
def test_a_faulting_kernel_costs_only_its_candidate_and_configuration(tmp_path, monkeypatch, fault,
                                                                      status, body):
    monkeypatch.setenv("KILN_CACHE", str(tmp_path))
    planted, config = _plant(cache_dir(), body)
    region, outputs = _region()
    db_path = tmp_path / "tune.sqlite"
    # the hang is caught by the per-configuration limit, well before the candidate's
    evaluate_ = IsolatedEvaluate("cpu", db_path, "test-machine", region, timeout_s=60, trial_timeout_s=5)
    try:
        # the fault is the configuration's, not the candidate's: a fresh worker takes the same
        # candidate, skips the failed configuration and times the rest
        outcome = evaluate_(outputs, VARIANT)
        assert outcome.status == "ok", outcome
        assert outcome.estimate_s > 0
        assert evaluate_.restarts == 1
        assert evaluate_.kernels_measured >= 2
        with TuneDB(db_path) as db:
            failure = db.kernel_failure("test-machine", planted, config, {})
        assert failure[0] == status, failure
        # later candidates never run it again
        assert evaluate_(outputs, VARIANT).status == "ok"
        assert evaluate_.restarts == 1
    finally:
        evaluate_.close()


def test_a_candidate_whose_default_kernel_crashes_is_rejected(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE", str(tmp_path))
    _plant(cache_dir(), "*(volatile int*)0 = 1;", default=True)
    region, outputs = _region()
    evaluate_ = IsolatedEvaluate("cpu", tmp_path / "tune.sqlite", "test-machine", region, timeout_s=60)
    try:
        outcome = evaluate_(outputs, VARIANT)
        assert outcome.status == "crash", outcome
        assert "SIGSEGV" in outcome.detail
        assert evaluate_.restarts == 1
    finally:
        evaluate_.close()



def test_a_wrong_configuration_does_not_spoil_the_kernels_measured_after_it(tmp_path, monkeypatch):
    """The first kernel's planted configuration writes garbage (and is rejected); the second
    kernel reads the first's output, and none of its configurations may be rejected for that."""
    monkeypatch.setenv("KILN_CACHE", str(tmp_path))
    region, (first,) = _region()                                   # [8, 1, 16]
    v = Node(Op.INPUT, name="v", role="weight", shape=shape_of((1, 16, 4)), dtype=DType.F32)
    rows = Node(Op.RESHAPE, [first], shape=shape_of((8, 16, 1)))
    second = reduce(Op.SUM_REDUCE, Node(Op.MUL, [Node(Op.EXPAND, [rows], shape=shape_of((8, 16, 4))),
                                                 Node(Op.EXPAND, [v], shape=shape_of((8, 16, 4)))]), [1])
    planted, config = _plant(cache_dir(), "for (int i = 0; i < 128; i++) out[i] = 1e6f;",
                             params="float* out", outputs=[second])
    weights = {**region.weights, "v": np.random.default_rng(1).standard_normal((1, 16, 4)).astype(np.float32)}
    w = next(n for n in region.graph([second]).weight_nodes() if n.attrs["name"] == "w")
    want = evaluate([second], {region.inputs[0]: region.args[0], w: weights["w"], v: weights["v"]}, {})
    region = Region(region.inputs, weights, {}, region.args, want)
    backend = CpuBackend()
    with TuneDB(tmp_path / "tune.sqlite") as db:
        outcome = Measurer(backend, db, "test-machine", region).evaluate([second], VARIANT)
        assert outcome.status == "ok", outcome
        program = schedule(region.graph([second]), POLICIES[VARIANT])
        rejected = [(name, c.key()) for k in program.kernels for c in backend.config_space(k)
                    for name in [backend.render(k, c)[0]]
                    if db.kernel_failure("test-machine", name, c.key(), {})]
    assert len(program.kernels) == 2
    assert rejected == [(planted, config)]


def _big_then_small() -> tuple[Region, Node, list]:
    """exp2(x[32, 4096]) times w[4096, 64], then that [32, 64] times v[64]: the second product
    does a 4,096th of the first's work, so its time (about 1.5 us here, mostly the threads' start)
    stays far under SEARCH_SHARE of the region's on a loaded machine too (with w[1024, 64] it took
    1.7%, and CI once timed it over 2%). (region, the output, its two kernels in order)."""
    rng = np.random.default_rng(3)
    x = Node(Op.INPUT, name="x", role="input", shape=shape_of((32, 4096, 1)), dtype=DType.F32)
    w = Node(Op.INPUT, name="w", role="weight", shape=shape_of((1, 4096, 64)), dtype=DType.F32)
    v = Node(Op.INPUT, name="v", role="weight", shape=shape_of((1, 64, 1)), dtype=DType.F32)
    big = reduce(Op.SUM_REDUCE, Node(Op.MUL, [
        Node(Op.EXPAND, [Node(Op.EXP2, [x])], shape=shape_of((32, 4096, 64))),
        Node(Op.EXPAND, [w], shape=shape_of((32, 4096, 64)))]), [1])                 # [32, 1, 64]
    rows = Node(Op.RESHAPE, [big], shape=shape_of((32, 64, 1)))
    small = reduce(Op.SUM_REDUCE, Node(Op.MUL, [rows, Node(Op.EXPAND, [v], shape=shape_of((32, 64, 1)))]), [1])
    weights = {"w": rng.standard_normal((1, 4096, 64)).astype(np.float32) / 64,
               "v": rng.standard_normal((1, 64, 1)).astype(np.float32)}
    args = [rng.standard_normal((32, 4096, 1)).astype(np.float32)]
    want = evaluate([small], {x: args[0], w: weights["w"], v: weights["v"]}, {})
    region = Region([x], weights, {}, args, want)
    kernels = schedule(region.graph([small]), POLICIES[VARIANT]).kernels
    assert len(kernels) == 2          # in order: the large product, then the small one reading it
    return region, small, kernels


def _timed_configs(tmp_path, deadline, finalist: bool) -> tuple[list, list]:
    """Each kernel's configurations a candidate's evaluation timed, and those it could have."""
    from kiln.search.budget import Deadline
    region, small, kernels = _big_then_small()
    backend = CpuBackend()
    with TuneDB(tmp_path / "tune.sqlite") as db:
        measurer = Measurer(backend, db, "test-machine", region,
                            deadline=None if deadline is None else Deadline(deadline))
        outcome = measurer.evaluate([small], VARIANT, finalist=finalist)
        assert outcome.status == "ok", outcome
        limit = measurer.max_configs if finalist else measurer.search_configs
        space = [backend.config_space(k)[:limit] for k in kernels]
        timed = [[c for c in configs if db.kernel_time("test-machine", backend.render(k, c)[0], c.key(), {})]
                 for k, configs in zip(kernels, space)]
    return timed, space


def _kept(space: list) -> list:
    """The configurations a kernel left untuned is still timed in: its default and library call."""
    from kiln.codegen.library import LibraryConfig
    return [c for c in space if c is space[0] or isinstance(c, LibraryConfig)]


def test_past_the_deadline_only_the_kernels_that_carry_the_time_are_tuned(tmp_path, monkeypatch):
    """With the budget spent, a candidate's kernels are timed in the default configuration and,
    where the product can be one, as a library call (no compile, and it can win by 100x on a
    large product); a kernel with a tenth of the region's time or more still has its other
    configurations timed (what the user runs for good), a small one waits for a compile with
    budget left."""
    monkeypatch.setenv("KILN_CACHE", str(tmp_path))
    (big_timed, small_timed), (big_space, small_space) = _timed_configs(tmp_path, 0, finalist=False)
    assert big_timed == big_space
    assert small_timed == _kept(small_space) and len(small_timed) < len(small_space)


def test_a_search_candidate_tunes_the_kernels_that_carry_the_time_and_a_finalist_all(tmp_path, monkeypatch):
    """Within the budget too, a search candidate's kernel under SEARCH_SHARE of the region's time
    keeps its default (or library call): compiling and timing its other configurations costs
    more than it can save. A finalist's kernels are all tuned."""
    monkeypatch.setenv("KILN_CACHE", str(tmp_path))
    (big_timed, small_timed), (big_space, small_space) = _timed_configs(tmp_path / "search", None, finalist=False)
    assert big_timed == big_space
    assert small_timed == _kept(small_space) and len(small_timed) < len(small_space)
    (_, small_timed), (_, small_space) = _timed_configs(tmp_path / "final", None, finalist=True)
    assert small_timed == small_space


def test_one_worker_serves_region_after_region(tmp_path, monkeypatch):
    """A compile loads each distinct region into the same worker: its start-up is paid once."""
    monkeypatch.setenv("KILN_CACHE", str(tmp_path))
    first, outputs = _region()
    # the second region: the same program on other values, whose reference differs
    x, w = first.inputs[0], next(n for n in first.graph(outputs).weight_nodes())
    rng = np.random.default_rng(7)
    weights = {"w": rng.standard_normal((1, 64, 16)).astype(np.float32)}
    args = [rng.standard_normal((8, 64, 1)).astype(np.float32)]
    second = Region([x], weights, {}, args, evaluate(outputs, {x: args[0], w: weights["w"]}, {}))
    evaluate_ = IsolatedEvaluate("cpu", tmp_path / "tune.sqlite", "test-machine", timeout_s=60)
    try:
        evaluate_.load(first)
        assert evaluate_(outputs, VARIANT).status == "ok"
        pid = evaluate_._processes[0]._proc.pid
        evaluate_.load(second)
        assert evaluate_(outputs, VARIANT).status == "ok"
        assert evaluate_._processes[0]._proc.pid == pid and evaluate_.restarts == 0
        # the worker checks against the region it holds: the first region's reference fails here
        evaluate_.load(Region([x], weights, {}, args, first.want))
        assert evaluate_(outputs, VARIANT).status == "wrong"
        assert evaluate_._processes[0]._proc.pid == pid
    finally:
        evaluate_.close()



PARENT = """
import sys
from tests.test_worker import VARIANT, _region
from kiln.compiler.worker import IsolatedEvaluate
region, outputs = _region()
IsolatedEvaluate("cpu", sys.argv[1], "test-machine", region, timeout_s=600,
                 trial_timeout_s=600)(outputs, VARIANT)
"""


def test_a_worker_stuck_in_a_kernel_exits_when_its_parent_is_killed(tmp_path, monkeypatch):
    """A compile killed while its worker runs a kernel that never returns: the worker never
    reads the end of its stdin, and spun on for ever, orphaned (seen here after a killed test
    run). Now it exits within seconds of its parent."""
    monkeypatch.setenv("KILN_CACHE", str(tmp_path))
    monkeypatch.setenv("TMPDIR", str(tmp_path))      # the worker's folder, and its trial file
    planted, config = _plant(cache_dir(), "for (;;) {}")
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(tmp_path / "tune.sqlite")],
                              cwd=Path(__file__).parents[1], stderr=subprocess.DEVNULL)
    try:
        deadline, hung = time.monotonic() + 120, None
        while hung is None and time.monotonic() < deadline:
            trial = next(tmp_path.glob("kiln-worker-*/trial-*.json"), None)
            try:
                current = json.loads(trial.read_text()) if trial else {}
            except (OSError, ValueError):   # written as we read, or gone between its trials
                current = {}
            if (current.get("name"), current.get("config")) == (planted, config):
                hung = _worker_of(parent.pid)
            time.sleep(0.2)
        assert hung is not None, "the worker never reached the planted kernel"
        time.sleep(1)    # well inside the kernel
        parent.kill()
        parent.wait()
        gone = time.monotonic() + 10
        while _alive(hung) and time.monotonic() < gone:
            time.sleep(0.2)
        assert not _alive(hung), "the worker outlived its parent"
    finally:
        parent.kill()


def _worker_of(pid: int) -> int:
    (child,) = [int(stat.parent.name) for stat in Path("/proc").glob("[0-9]*/stat")
                if _stat(stat)[1:2] == [str(pid)]]
    return child


def _alive(pid: int) -> bool:
    state = _stat(Path(f"/proc/{pid}/stat"))
    return bool(state) and state[0] != "Z"


def _stat(path: Path) -> list[str]:
    """State and parent pid, from /proc/PID/stat ([] once the process is gone)."""
    try:
        return path.read_text().rsplit(")", 1)[1].split()[:2]
    except OSError:
        return []


def test_a_killed_compiles_worker_folder_is_removed_by_the_next(tmp_path, monkeypatch):
    """A compile killed with SIGKILL leaves its worker folder behind; the next compile's worker
    removes folders whose compiling process is gone, and keeps those of one still running."""
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    orphan = tmp_path / f"kiln-worker-{gone.pid}-abc"
    running = tmp_path / f"kiln-worker-{os.getpid()}-def"
    for folder in (orphan, running):
        (folder / "region1").mkdir(parents=True)
    worker = IsolatedEvaluate("cpu", tmp_path / "tune.sqlite", "fp")
    try:
        assert not orphan.exists() and running.exists()
        assert worker.root.parent == tmp_path
        assert worker.root.name.startswith(f"kiln-worker-{os.getpid()}-")
    finally:
        worker.close()
    assert not worker.root.exists()


def test_a_candidates_time_is_accounted_by_phase(tmp_path, monkeypatch):
    """Where a measured candidate's time went, as the compile report and the benches show it: each
    phase of its evaluation in the worker, and the round trip to it, adding up to its wall time."""
    monkeypatch.setenv("KILN_CACHE", str(tmp_path))
    region, outputs = _region()
    evaluate_ = IsolatedEvaluate("cpu", tmp_path / "tune.sqlite", "test-machine", region, timeout_s=60)
    try:
        evaluate_(outputs, VARIANT)                    # the worker started and the region loaded
        start = time.monotonic()
        outcome = evaluate_(outputs, "inline4-bcast0")  # another policy: kernels not yet measured
        wall = time.monotonic() - start
    finally:
        evaluate_.close()
    assert outcome.status == "ok"
    # one worker has the device to itself: it never waits for a turn
    assert set(outcome.spent) == {*PHASES, "round trip"} - {"device wait"}
    assert all(seconds >= 0 for seconds in outcome.spent.values())
    assert outcome.spent["compile"] > 0 and outcome.spent["time"] > 0
    assert sum(outcome.spent.values()) == pytest.approx(wall, rel=0.05, abs=0.01)
    # the tuner sums what its measured candidates spent, per region
    with TuneDB(tmp_path / "tune.sqlite") as db:
        tuner = RegionTuner("r", "r", outputs, None, [VARIANT], lambda o, v: outcome, lambda o, v: lambda: 1.0, db, "compile")
        tuner._try("original", None, outputs)
    assert tuner.progress.spent == outcome.spent
    text = spent_text(tuner.progress.spent, tuner.progress.measured)
    assert text.startswith(f"{sum(outcome.spent.values()):.2f} s a candidate: ")
    assert all(f"{phase} " in text for phase in outcome.spent)
