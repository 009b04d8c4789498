"""A candidate whose temporaries would take more than CANDIDATE_MEMORY_SHARE of the device's
memory is rejected as "memory" before anything is allocated or compiled (compiler/measure.py):
on an H200 a prefill candidate asked for 23.6 GB at once, and the other workers' candidates ran
out of memory beside it."""
from __future__ import annotations

from kiln.codegen.policy import POLICIES
from kiln.codegen.schedule import schedule
from kiln.compiler import measure
from kiln.compiler.measure import Measurer
from kiln.runtime.cpu import CpuBackend
from kiln.runtime.executor import plan_buffers
from kiln.search.tunedb import TuneDB
from tests.test_worker import _region

UNFUSED = "inline4-bcast0"      # exp2(x) in a temporary of its own: memory to count


def test_a_candidate_over_its_share_of_memory_is_rejected_before_it_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE", str(tmp_path))
    region, outputs = _region()
    backend = CpuBackend()
    needed = sum(plan_buffers(schedule(region.graph(outputs), POLICIES[UNFUSED]), reuse=False).slot_bytes)
    assert needed > 0
    with TuneDB(tmp_path / "tune.sqlite") as db:
        monkeypatch.setattr(measure, "CANDIDATE_MEMORY_SHARE", (needed - 1) / backend.memory_bytes())
        refused = Measurer(backend, db, "m", region).evaluate(outputs, UNFUSED)
        assert refused.status == "memory" and "its temporaries take" in refused.detail
        assert not any(tmp_path.rglob("*.so"))            # nothing compiled for it
        monkeypatch.setattr(measure, "CANDIDATE_MEMORY_SHARE", needed / backend.memory_bytes())
        assert Measurer(backend, db, "m", region).evaluate(outputs, UNFUSED).status == "ok"
        assert any(tmp_path.rglob("*.so"))
