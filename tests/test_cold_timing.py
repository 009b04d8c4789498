"""The CPU times kernels and regions with their weights evicted from the caches before each call,
as a decode step finds them (each weight read once, from memory); activations stay where the
previous kernel left them. No timing is asserted: which arrays are evicted, and when."""
from __future__ import annotations

import numpy as np

from kiln.runtime.cpu import CpuBackend
from kiln.compiler.measure import Measurer
from kiln.search.tunedb import TuneDB
from tests.test_worker import VARIANT, _region


class EvictionLog(CpuBackend):
    """Counts, per timed call, the arrays evicted before it."""

    def __init__(self):
        super().__init__()
        self.evicted: list[set[int]] = []
        self.calls_after_eviction = 0

    def evicter(self, arrays):
        evict = super().evicter(arrays)

        def run():
            evict()
            self.evicted.append({a.ctypes.data for a in arrays})
        return run

    def time(self, fn, target_s, most, before=None):
        def counted():
            self.calls_after_eviction += before is not None
            fn()
        return super().time(counted, target_s, most, before)


def test_evicting_keeps_the_values():
    backend = CpuBackend()
    weights = [np.arange(n, dtype=np.float32) for n in (1, 17, 100_003)]
    kept = [w.copy() for w in weights]
    backend.evicter(weights)()
    for w, k in zip(weights, kept):
        np.testing.assert_array_equal(w, k)


def test_kernel_and_region_timings_evict_the_weights_before_every_call(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE", str(tmp_path))
    region, outputs = _region()          # exp2(x[8, 64, 1]) times the weight w[1, 64, 16]
    backend = EvictionLog()
    with TuneDB(tmp_path / "tune.sqlite") as db:
        measurer = Measurer(backend, db, "test-machine", region)
        assert measurer.evaluate(outputs, VARIANT).status == "ok"
        assert backend.evicted and len(backend.evicted) == backend.calls_after_eviction
        backend.evicted.clear()
        measurer.end_to_end(outputs, VARIANT, repeats=4)()
    assert len(backend.evicted) >= 4
    # the weight alone, never the activation the kernel reads (it is warm in a real step)
    assert all(len(addresses) == 1 for addresses in backend.evicted)
    assert len({a for addresses in backend.evicted for a in addresses}) == 1
