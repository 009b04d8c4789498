"""A search candidate's kernel tries first the configurations that ran faster than the default on
kernels of its kin (its shape, from any candidate), keeps a place for one that none of them has
tried, and leaves out those they ran slower (compiler/measure.py: kin_order): candidates sharing
kins try every configuration between them, at the search's few configurations a kernel, then
only those that won."""
from __future__ import annotations

from kiln.codegen.kernel import KernelConfig
from kiln.codegen.library import LibraryConfig
from kiln.codegen.policy import POLICIES
from kiln.codegen.schedule import schedule
from kiln.compiler.measure import Measurer, kin, kin_order
from kiln.runtime.cpu import CpuBackend
from kiln.search.tunedb import TuneDB
from tests.test_worker import VARIANT, _region

CONFIGS = [KernelConfig(unroll=u) for u in (1, 2, 4, 8, 16, 32)]      # the first is the default


def test_without_ranks_a_kernel_takes_the_backends_first_configurations():
    assert kin_order(CONFIGS, {}, 3) == CONFIGS[:3]


def test_faster_kin_configurations_come_first_with_one_place_for_an_untried_one():
    ranks = {"k_a": {CONFIGS[1].key(): 1.3, CONFIGS[4].key(): 0.2, CONFIGS[2].key(): 0.8},
             "k_b": {CONFIGS[1].key(): 1.3, CONFIGS[4].key(): 0.8}}        # 4: a mean of 0.5
    assert kin_order(CONFIGS, ranks, 3) == [CONFIGS[0], CONFIGS[4], CONFIGS[3]]
    assert kin_order(CONFIGS, ranks, 4) == [CONFIGS[0], CONFIGS[4], CONFIGS[2], CONFIGS[3]]


def test_once_the_kin_tried_everything_the_fastest_are_taken():
    ranks = {"k_a": {c.key(): 1.0 - 0.1 * i for i, c in enumerate(CONFIGS[1:], 1)}}
    assert kin_order(CONFIGS, ranks, 3) == [CONFIGS[0], CONFIGS[5], CONFIGS[4]]


def test_configurations_the_kin_ran_slower_than_the_default_are_left_out():
    ranks = {"k_a": {c.key(): 1.5 for c in CONFIGS[1:]} | {CONFIGS[3].key(): 0.9}}
    assert kin_order(CONFIGS, ranks, 4) == [CONFIGS[0], CONFIGS[3]]
    assert kin_order(CONFIGS, {"k_a": {c.key(): 1.5 for c in CONFIGS[1:3]}}, 3) == [CONFIGS[0], *CONFIGS[3:5]]


def test_a_library_call_stays_among_those_always_measured():
    configs = [CONFIGS[0], LibraryConfig(), *CONFIGS[1:]]
    ranks = {"k_a": {c.key(): 0.5 for c in CONFIGS[1:4]}}
    assert kin_order(configs, ranks, 3)[:2] == configs[:2]


def test_the_kin_ratios_are_kept_per_kernel_and_machine(tmp_path):
    with TuneDB(tmp_path / "tune.sqlite") as db:
        db.record_kin_ratios("m", "Sum[8]", "k_a", {"u2": 0.5, "u4": 2.0})
        db.record_kin_ratios("m", "Sum[8]", "k_b", {"u2": 1.5})
        db.record_kin_ratios("m", "Sum[16]", "k_c", {"u2": 9.0})
        db.record_kin_ratios("other machine", "Sum[8]", "k_a", {"u2": 9.0})
        db.record_kin_ratios("m", "Sum[8]", "k_b", {"u2": 1.25})
        assert db.kin_ratios("m", ["Sum[8]"]) == {"Sum[8]": {"k_a": {"u2": 0.5, "u4": 2.0}, "k_b": {"u2": 1.25}}}


def test_a_second_candidate_of_the_kin_tries_a_configuration_the_first_did_not(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE", str(tmp_path))
    region, outputs = _region()
    kernel = schedule(region.graph(outputs), POLICIES[VARIANT]).kernels[0]
    backend = CpuBackend()
    space = backend.config_space(kernel)
    assert len(space) > 3

    def measured(db) -> set[str]:
        return {c.key() for c in space if db.kernel_time("m", backend.render(kernel, c)[0], c.key(), {}) is not None}

    with TuneDB(tmp_path / "tune.sqlite") as db:
        assert Measurer(backend, db, "m", region, search_configs=2).evaluate(outputs, VARIANT).status == "ok"
        first = measured(db)
        assert first == {space[0].key(), space[1].key()}
        default = backend.render(kernel, space[0])[0]
        assert set(db.kin_ratios("m", [kin(kernel)])[kin(kernel)][default]) == {space[1].key()}
        # the next candidate with a kernel of this kin (here the same kernel again) explores, and
        # its estimate weighs every configuration this kernel was measured in
        again = Measurer(backend, db, "m", region, search_configs=2).evaluate(outputs, VARIANT)
        assert measured(db) == first | {space[2].key()}
        assert again.estimate_s == min(db.kernel_time("m", backend.render(kernel, c)[0], c.key(), {})
                                       for c in space[:3])
