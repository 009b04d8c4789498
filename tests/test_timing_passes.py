"""A kernel configuration a finalist uses is timed in two passes apart in time, its best counting:
a burst of load during its one pass of the search must not decide the program the user keeps."""
from __future__ import annotations

import time

from kiln.codegen.policy import POLICIES
from kiln.codegen.schedule import schedule
from kiln.compiler.measure import KERNEL_TIMING_PASSES, Measurer
from kiln.runtime.cpu import CpuBackend
from kiln.search.tunedb import TuneDB
from tests.test_worker import VARIANT, _region

BURST_S = 0.02      # a kernel of this region runs in microseconds


class Burst(CpuBackend):
    """Each launch of one configuration of one kernel sleeps first while `on` (another process
    taking the cores it waits for)."""

    def __init__(self, target: str):
        super().__init__()
        self.target, self.on = target, True

    def launcher(self, fn, kernel, config):
        launch = super().launcher(fn, kernel, config)
        if self.render(kernel, config)[0] + config.key() != self.target:
            return launch

        def slowed(args, env):
            if self.on:
                time.sleep(BURST_S)
            launch(args, env)
        return slowed


def test_a_burst_of_load_in_the_search_is_timed_again_for_a_finalist(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE", str(tmp_path))
    region, outputs = _region()
    kernel = schedule(region.graph(outputs), POLICIES[VARIANT]).kernels[0]
    probe = CpuBackend()
    configs = probe.config_space(kernel)
    slowed = configs[1]                      # the first generated configuration after the default
    name = probe.render(kernel, slowed)[0]
    backend = Burst(name + slowed.key())
    with TuneDB(tmp_path / "tune.sqlite") as db:
        measurer = Measurer(backend, db, "test-machine", region)
        assert measurer.evaluate(outputs, VARIANT).status == "ok"   # a search candidate: one pass
        assert db.kernel_time("test-machine", name, slowed.key(), {}) >= BURST_S
        assert db.kernel_passes("test-machine", name, slowed.key(), {}) == 1
        backend.on = False                   # the burst is over before the finalists are built
        _, _, chosen = measurer.build(outputs, VARIANT)
        assert db.kernel_time("test-machine", name, slowed.key(), {}) < BURST_S
        # every configuration measured has its passes, and the choice is the fastest of their bests
        timed = {c.key(): db.kernel_time("test-machine", probe.render(kernel, c)[0], c.key(), {})
                 for c in configs}
        timed = {key: t for key, t in timed.items() if t is not None}
        assert len(timed) > 2
        assert all(db.kernel_passes("test-machine", probe.render(kernel, c)[0], c.key(), {}) == KERNEL_TIMING_PASSES
                   for c in configs if c.key() in timed)
        assert timed[chosen[0].key()] == min(timed.values())
        # a later build times nothing again
        measurer.build(outputs, VARIANT)
        assert db.kernel_passes("test-machine", name, slowed.key(), {}) == KERNEL_TIMING_PASSES


def test_a_version_1_database_keeps_its_times_as_one_pass(tmp_path):
    import sqlite3
    path = tmp_path / "old.sqlite"
    with sqlite3.connect(path) as conn:       # the kernels table as version 1 made it
        conn.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
        conn.execute("INSERT INTO schema_version VALUES (1)")
        conn.execute("CREATE TABLE kernels (fingerprint TEXT NOT NULL, source_hash TEXT NOT NULL, "
                     "config TEXT NOT NULL, symbols TEXT NOT NULL, median_s REAL NOT NULL, samples INTEGER "
                     "NOT NULL, measured_at REAL NOT NULL, PRIMARY KEY (fingerprint, source_hash, config, symbols))")
        conn.execute("INSERT INTO kernels VALUES ('m', 'k_1', 'c', '{}', 0.5, 3, 1.0)")
    conn.close()
    with TuneDB(path) as db:
        assert db.kernel_time("m", "k_1", "c", {}) == 0.5
        assert db.kernel_passes("m", "k_1", "c", {}) == 1
        db.confirm_kernel("m", "k_1", "c", {}, 0.75, 4)      # a slower pass keeps the best
        assert db.kernel_time("m", "k_1", "c", {}) == 0.5
        db.confirm_kernel("m", "k_1", "c", {}, 0.25, 4)
        assert db.kernel_time("m", "k_1", "c", {}) == 0.25
        assert db.kernel_passes("m", "k_1", "c", {}) == 3
