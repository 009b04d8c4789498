"""`--budget` parsing, the deadline, and the CPU fingerprint that tuned times are keyed by."""
import time

import pytest

from kiln.ir.errors import KilnError
from kiln.runtime.hardware import ISA_FLAGS, describe_mismatch, fingerprint_cpu, fingerprint_id
from kiln.search.budget import Deadline, parse_budget


@pytest.mark.parametrize("text, seconds", [
    ("90s", 90), ("10m", 600), ("2h", 7200), ("8h", 28800), ("1h30m", 5400), ("1m30s", 90),
    ("1h0m5s", 3605), ("1.5h", 5400), ("45", 45), ("2.5", 2.5), (" 2H ", 7200),
])
def test_parse_budget(text, seconds):
    assert parse_budget(text) == seconds


@pytest.mark.parametrize("text", ["", "   ", "abc", "10x", "1h30", "h", "m5", "30s1h", "1e3", "inf",
                                  "nan", "1 h"])
def test_parse_budget_rejects_non_durations(text):
    with pytest.raises(KilnError) as err:
        parse_budget(text)
    assert str(err.value) == f"kiln: --budget {text!r} is not a duration; use e.g. 90s, 10m, 2h, 1h30m"


@pytest.mark.parametrize("text", ["0", "0s", "0h0m", "-5", "-5m", "-1h30m"])
def test_parse_budget_rejects_zero_and_negative(text):
    with pytest.raises(KilnError, match="must be more than zero; use e.g. 90s") as err:
        parse_budget(text)
    assert repr(text) in str(err.value)


def test_deadline():
    long = Deadline(3600)
    assert not long.expired
    assert 3590 < long.remaining() <= 3600
    short = Deadline(0.05)
    time.sleep(0.06)
    assert short.expired
    assert short.remaining() == 0.0


def test_fingerprint_keys_and_stability():
    info = fingerprint_cpu()
    assert set(info) == {"cpu", "logical_cores", "usable_cores", "isa", "gcc", "os", "machine"}
    assert isinstance(info["cpu"], str) and info["cpu"]
    assert info["logical_cores"] >= info["usable_cores"] >= 1
    assert set(info["isa"]) <= set(ISA_FLAGS)
    assert info["gcc"] is None or info["gcc"][0].isdigit()
    again = fingerprint_cpu()
    assert again == info
    assert fingerprint_id(again) == fingerprint_id(info)


def test_fingerprint_id_is_canonical():
    a = {"cpu": "X", "usable_cores": 2, "isa": ["avx"]}
    b = {"isa": ["avx"], "usable_cores": 2, "cpu": "X"}
    assert fingerprint_id(a) == fingerprint_id(b)
    assert len(fingerprint_id(a)) == 16 and int(fingerprint_id(a), 16) >= 0
    assert fingerprint_id(a) != fingerprint_id(dict(a, usable_cores=4))


def test_describe_mismatch_names_differing_keys():
    here = fingerprint_cpu()
    assert describe_mismatch(here, dict(here)) is None
    built = dict(here, cpu="AMD EPYC 7B13", usable_cores=here["usable_cores"] + 2)
    message = describe_mismatch(built, here)
    assert message == (f"built for cpu 'AMD EPYC 7B13', {here['usable_cores'] + 2} usable cores; "
                       f"this machine has cpu {here['cpu']!r}, {here['usable_cores']} usable cores")
    assert "gcc" not in message and "logical" not in message


def test_describe_mismatch_missing_values_and_lists():
    message = describe_mismatch({"gcc": "13.2.0", "isa": ["avx2", "fma"]}, {"gcc": None, "isa": []})
    assert message == "built for gcc 13.2.0, ISA extensions avx2+fma; this machine has no gcc, " \
                      "ISA extensions (none)"
    assert "extra 'x'" in describe_mismatch({}, {"extra": "x"})


def test_the_search_budget_goes_where_the_measured_time_is():
    """A layer region repeated 16 times at 50 us a step (800 us) beside a prologue of 10 us and a
    head of 190 us: the layer takes 0.1/3 + 0.9 * 0.8 of the search budget. A region whose program
    as lowered had no valid time counts its IR work at the timed regions' seconds per node."""
    from kiln.compiler.loop import EVEN_SHARE, budget_weights
    weights = budget_weights([10e-6, 16 * 50e-6, 190e-6], [100, 1600, 300])
    assert sum(weights) == pytest.approx(1.0)
    assert weights[1] == pytest.approx(EVEN_SHARE / 3 + (1 - EVEN_SHARE) * 0.8)
    assert weights[0] < weights[2] < weights[1]
    # 1e-3 s over 2,000 nodes: an untimed region of 2,000 nodes counts as 1e-3 s, half the total
    untimed = budget_weights([None, 1e-3], [2000, 2000])
    assert untimed == pytest.approx([0.5, 0.5])
    assert budget_weights([None, None], [1, 3]) == pytest.approx([EVEN_SHARE / 2 + (1 - EVEN_SHARE) / 4,
                                                                 EVEN_SHARE / 2 + (1 - EVEN_SHARE) * 3 / 4])
