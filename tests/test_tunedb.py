"""The tuning database on real SQLite files: round trips, failures, candidates, schema checks and
durability across a SIGKILL."""
import signal
import sqlite3
import subprocess
import sys

import pytest

from kiln.ir.errors import KilnError
from kiln.search.tunedb import SCHEMA_VERSION, CandidateRecord, TuneDB

KEY = ("fp0123", "src-abc", '{"block":128}')


@pytest.fixture
def db(tmp_path):
    with TuneDB(tmp_path / "tuning.sqlite") as db:
        yield db


def test_creates_parent_folders_in_wal_mode(tmp_path):
    path = tmp_path / "a" / "b" / "tuning.sqlite"
    TuneDB(path).close()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("SELECT version FROM schema_version").fetchall() == [(SCHEMA_VERSION,)]


def test_default_path_follows_env(monkeypatch, tmp_path):
    monkeypatch.delenv("KILN_TUNING_DB", raising=False)
    assert TuneDB.default_path().parts[-3:] == (".cache", "kiln", "tuning.sqlite")
    monkeypatch.setenv("KILN_TUNING_DB", str(tmp_path / "mine.sqlite"))
    assert TuneDB.default_path() == tmp_path / "mine.sqlite"


def test_kernel_round_trip_survives_reopen(tmp_path):
    path = tmp_path / "tuning.sqlite"
    with TuneDB(path) as db:
        assert db.kernel_time(*KEY, {"seq": 8}) is None
        db.record_kernel(*KEY, {"seq": 8}, median_s=1.5e-4, samples=20)
        db.record_kernel(*KEY, {"seq": 16}, median_s=2.5e-4, samples=20)
    with TuneDB(path) as db:
        assert db.kernel_time(*KEY, {"seq": 8}) == 1.5e-4
        assert db.kernel_time(*KEY, {"seq": 16}) == 2.5e-4
        assert db.kernel_time("other-machine", *KEY[1:], {"seq": 8}) is None


def test_record_kernel_replaces(db):
    db.record_kernel(*KEY, {}, median_s=3.0, samples=5)
    db.record_kernel(*KEY, {}, median_s=2.0, samples=9)
    assert db.kernel_time(*KEY, {}) == 2.0
    assert db.stats(KEY[0])["kernels"] == 1


def test_symbols_order_does_not_matter(db):
    db.record_kernel(*KEY, {"m": 4, "n": 64}, median_s=0.5, samples=3)
    assert db.kernel_time(*KEY, {"n": 64, "m": 4}) == 0.5
    assert db.kernel_time(*KEY, {"n": 64, "m": 5}) is None


def test_failures_and_latest_outcome_wins(db):
    assert db.kernel_failure(*KEY, {"seq": 8}) is None
    db.record_kernel(*KEY, {"seq": 8}, median_s=1.0, samples=3)
    db.record_kernel_failure(*KEY, {"seq": 8}, "nan", "output 3 has NaN at [0, 5]")
    assert db.kernel_failure(*KEY, {"seq": 8}) == ("nan", "output 3 has NaN at [0, 5]")
    assert db.kernel_time(*KEY, {"seq": 8}) is None  # a kernel that now fails has no usable time
    db.record_kernel(*KEY, {"seq": 8}, median_s=0.9, samples=3)
    assert db.kernel_failure(*KEY, {"seq": 8}) is None
    assert db.kernel_time(*KEY, {"seq": 8}) == 0.9


def test_failure_reason_is_checked(db):
    with pytest.raises(ValueError, match="slow"):
        db.record_kernel_failure(*KEY, {}, "slow", "")
    assert db.kernel_failure(*KEY, {}) is None


def test_stats_counts_per_fingerprint(db):
    db.record_kernel(*KEY, {"seq": 1}, median_s=1.0, samples=3)
    db.record_kernel(*KEY, {"seq": 2}, median_s=1.0, samples=3)
    db.record_kernel_failure(*KEY, {"seq": 3}, "timeout", "over 10 s")
    db.record_kernel_failure(*KEY, {"seq": 4}, "crash", "SIGSEGV")
    db.record_kernel_failure(*KEY, {"seq": 5}, "crash", "SIGBUS")
    db.record_kernel("other", *KEY[1:], {"seq": 1}, median_s=1.0, samples=3)
    assert db.stats(KEY[0]) == {"kernels": 2, "failures": 3,
                                "failure_reasons": {"timeout": 1, "crash": 2}}
    assert db.stats("nobody") == {"kernels": 0, "failures": 0, "failure_reasons": {}}


def test_candidates_in_recording_order(db):
    db.record_candidate("c1", "attn", "h2", "ok", estimate_s=2e-3, end_to_end_s=5e-3)
    db.record_candidate("c1", "mlp", "h9", "wrong", detail="max error 0.3")
    db.record_candidate("c1", "attn", "h1", "timeout", estimate_s=9e-3)
    db.record_candidate("c2", "attn", "h2", "ok")
    assert [(c.region, c.candidate_hash) for c in db.candidates("c1")] == \
        [("attn", "h2"), ("mlp", "h9"), ("attn", "h1")]
    assert [c.candidate_hash for c in db.candidates("c1", region="attn")] == ["h2", "h1"]
    assert [c.compile_id for c in db.candidates("c2")] == ["c2"]
    assert db.candidates("c3") == []


def test_candidate_lookup(db):
    db.record_candidate("c1", "mlp", "h9", "wrong", detail="max error 0.3")
    db.record_candidate("c1", "attn", "h2", "ok", estimate_s=2e-3, end_to_end_s=5e-3)
    got = db.candidate("c1", "attn", "h2")
    assert isinstance(got, CandidateRecord)
    assert (got.status, got.estimate_s, got.end_to_end_s, got.detail) == ("ok", 2e-3, 5e-3, "")
    assert got.recorded_at > 0
    assert db.candidate("c1", "mlp", "h9").detail == "max error 0.3"
    assert db.candidate("c1", "attn", "nope") is None
    with pytest.raises(ValueError, match="maybe"):
        db.record_candidate("c1", "attn", "h3", "maybe")


def test_recording_a_candidate_again_replaces_it(db):
    db.record_candidate("c1", "attn", "h1", "ok", estimate_s=1.0)
    db.record_candidate("c1", "attn", "h2", "ok", estimate_s=2.0)
    db.record_candidate("c1", "attn", "h1", "crash", detail="SIGSEGV")
    records = db.candidates("c1")
    assert [(c.candidate_hash, c.status) for c in records] == [("h2", "ok"), ("h1", "crash")]
    assert records[1].estimate_s is None


def test_write_is_visible_to_another_connection_at_once(tmp_path):
    path = tmp_path / "tuning.sqlite"
    with TuneDB(path) as writer, TuneDB(path) as reader:
        writer.record_kernel(*KEY, {"seq": 8}, median_s=0.25, samples=7)
        assert reader.kernel_time(*KEY, {"seq": 8}) == 0.25


def test_workers_opening_a_new_file_at_once_all_get_it(tmp_path):
    """Workers side by side open the database together: switching a new file to its write-ahead
    log takes a lock SQLite's busy timeout does not wait for ("database is locked" at once, in
    about one attempt of 40 here before the switch was retried)."""
    import threading
    from concurrent.futures import ThreadPoolExecutor
    for attempt in range(100):
        path, start = tmp_path / f"new{attempt}.sqlite", threading.Barrier(4)

        def open_and_write(k):
            start.wait()
            with TuneDB(path) as db:
                db.record_kernel("fp", f"k{k}", "c", {}, 1e-6, 3)

        with ThreadPoolExecutor(4) as pool:
            list(pool.map(open_and_write, range(4)))
        with TuneDB(path) as db:
            assert db.stats("fp")["kernels"] == 4


def test_schema_mismatch_names_file_and_remedy(tmp_path):
    path = tmp_path / "tuning.sqlite"
    TuneDB(path).close()
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION + 1,))
    with pytest.raises(KilnError) as err:
        TuneDB(path)
    message = str(err.value)
    assert str(path) in message
    assert f"schema version {SCHEMA_VERSION + 1}" in message
    assert "delete" in message and "--db" in message


def test_foreign_sqlite_file_is_refused(tmp_path):
    path = tmp_path / "other.sqlite"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE notes (text TEXT)")
    with pytest.raises(KilnError, match="no schema_version table"):
        TuneDB(path)
    with sqlite3.connect(path) as conn:  # refused without adding our tables to it
        names = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
    assert names == {"notes"}


def test_file_that_is_not_a_database_is_refused(tmp_path):
    path = tmp_path / "tuning.sqlite"
    path.write_bytes(b"this is not sqlite at all, just some text " * 100)
    with pytest.raises(KilnError) as err:
        TuneDB(path)
    assert str(path) in str(err.value) and "delete" in str(err.value)


def test_measurement_survives_sigkill(tmp_path):
    path = tmp_path / "tuning.sqlite"
    child = (
        "import os, sys\n"
        "from kiln.search.tunedb import TuneDB\n"
        "db = TuneDB(sys.argv[1])\n"
        f"db.record_kernel(*{KEY!r}, {{'seq': 32}}, median_s=0.125, samples=11)\n"
        "os.kill(os.getpid(), 9)\n"
    )
    proc = subprocess.run([sys.executable, "-c", child, str(path)], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    with TuneDB(path) as db:
        assert db.kernel_time(*KEY, {"seq": 32}) == 0.125
