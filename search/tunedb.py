"""The tuning database: measured kernel times, failed kernels and per-compile candidate results.

One SQLite file in WAL mode, shared by every compile on the machine. Each write is its own
committed transaction, so a compile killed mid-search (even by SIGKILL) keeps every measurement
it finished. Values are plain columns or canonical JSON, never pickles.
"""
from __future__ import annotations

import json
import os
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

from ..ir.errors import KilnError

SCHEMA_VERSION = 2
FAILURE_REASONS = frozenset({"wrong", "nan", "crash", "timeout", "compile", "memory"})
BUSY_TIMEOUT_S = 30.0        # a connection waits this long for another's write instead of failing
CANDIDATE_STATUSES = FAILURE_REASONS | {"ok"}

_KERNEL_KEY = "fingerprint TEXT NOT NULL, source_hash TEXT NOT NULL, config TEXT NOT NULL, " \
              "symbols TEXT NOT NULL"
_KERNEL_PK = "PRIMARY KEY (fingerprint, source_hash, config, symbols)"
_KERNEL_WHERE = "fingerprint = ? AND source_hash = ? AND config = ? AND symbols = ?"

# Each statement runs alone: executescript would commit the transaction that guards the set-up.
_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)",
    f"CREATE TABLE IF NOT EXISTS kernels ({_KERNEL_KEY}, median_s REAL NOT NULL, "
    f"samples INTEGER NOT NULL, measured_at REAL NOT NULL, passes INTEGER NOT NULL DEFAULT 1, {_KERNEL_PK})",
    f"CREATE TABLE IF NOT EXISTS kernel_failures ({_KERNEL_KEY}, reason TEXT NOT NULL, "
    f"detail TEXT NOT NULL, failed_at REAL NOT NULL, {_KERNEL_PK})",
    "CREATE TABLE IF NOT EXISTS candidates (seq INTEGER PRIMARY KEY AUTOINCREMENT, "
    "compile_id TEXT NOT NULL, region TEXT NOT NULL, candidate_hash TEXT NOT NULL, "
    "status TEXT NOT NULL, estimate_s REAL, end_to_end_s REAL, detail TEXT NOT NULL, "
    "recorded_at REAL NOT NULL, UNIQUE (compile_id, region, candidate_hash))",
    # each compile's winner per region, its program as graph JSON: a later compile of the region
    # on this hardware times the best of them beside its own finalists
    "CREATE TABLE IF NOT EXISTS winners (fingerprint TEXT NOT NULL, region TEXT NOT NULL, "
    "variant TEXT NOT NULL, program TEXT NOT NULL, rules TEXT NOT NULL, end_to_end_s REAL NOT NULL, "
    "compile_id TEXT NOT NULL, recorded_at REAL NOT NULL, PRIMARY KEY (fingerprint, region, variant, program))",
    # per kernel and configuration, its time over its default configuration's, by the kernel's
    # kin (kernels of one shape, from any candidate): what a search candidate's new kernel of that
    # kin tries first (compiler/measure.py: kin)
    "CREATE TABLE IF NOT EXISTS kin_ratios (fingerprint TEXT NOT NULL, kin TEXT NOT NULL, "
    "kernel TEXT NOT NULL, config TEXT NOT NULL, ratio REAL NOT NULL, "
    "PRIMARY KEY (fingerprint, kin, kernel, config))",
)


@dataclass(frozen=True)
class CandidateRecord:
    seq: int
    compile_id: str
    region: str
    candidate_hash: str
    status: str              # "ok" or a rejection reason (FAILURE_REASONS)
    estimate_s: float | None
    end_to_end_s: float | None
    detail: str
    recorded_at: float


_CANDIDATE_COLUMNS = ("seq, compile_id, region, candidate_hash, status, estimate_s, end_to_end_s, "
                      "detail, recorded_at")


def symbols_key(symbols: dict[str, int]) -> str:
    """How a kernel record's symbols are stored."""
    return json.dumps(symbols, sort_keys=True, separators=(",", ":"))


def _kernel_key(fingerprint: str, source_hash: str, config: str,
                symbols: dict[str, int]) -> tuple[str, str, str, str]:
    # sorted keys: {"m": 1, "n": 2} and {"n": 2, "m": 1} must hit the same row
    return fingerprint, source_hash, config, symbols_key(symbols)


class TuneDB:
    def __init__(self, path: str | Path):
        self.path = Path(path).expanduser()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S)
        try:
            self._write_ahead()
            # a commit reaches the write-ahead log, not the disk: a process killed (even by SIGKILL)
            # loses nothing, an OS crash at most the last commits, never the file's consistency;
            # a measured kernel's record took 0.4-0.8 ms synced, half a decode candidate's
            # bookkeeping on this VM
            self._conn.execute("PRAGMA synchronous=NORMAL")
            self._set_up()
        except BaseException as err:
            self._conn.close()
            # a locked or read-only file is not the file's fault: only a broken one is worth deleting
            if getattr(err, "sqlite_errorname", None) in ("SQLITE_NOTADB", "SQLITE_CORRUPT"):
                raise KilnError(f"kiln: the tuning database {self.path} is unreadable ({err}); "
                                "delete it or pass --db with another path") from err
            raise

    def _write_ahead(self) -> None:
        """The write-ahead log, which lets one process write while others read. Switching a new
        file to it takes a lock that SQLite's busy timeout does not wait for: two workers opening
        a new file at once saw "database is locked" at once; the switch is retried instead."""
        waited = time.monotonic() + BUSY_TIMEOUT_S
        while True:
            try:
                self._conn.execute("PRAGMA journal_mode=WAL")
                return
            except sqlite3.OperationalError as err:
                if "locked" not in str(err) or time.monotonic() > waited:
                    raise
                time.sleep(0.01)

    @staticmethod
    def default_path() -> Path:
        return Path(os.environ.get("KILN_TUNING_DB") or Path.home() / ".cache/kiln/tuning.sqlite")

    def _set_up(self):
        """Check the schema version, then create what is missing; IMMEDIATE so that two compiles
        opening a new file at once cannot both write a version row."""
        with self._conn:
            self._conn.execute("BEGIN IMMEDIATE")
            tables = {row[0] for row in self._conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table'")}
            found = None
            if "schema_version" in tables:
                row = self._conn.execute("SELECT version FROM schema_version").fetchone()
                found = row[0] if row else None
            elif tables:
                found = "unknown (no schema_version table)"
            if found == 1:     # version 2 counts a kernel's timing passes: a version-1 time is one pass
                self._conn.execute("ALTER TABLE kernels ADD COLUMN passes INTEGER NOT NULL DEFAULT 1")
                self._conn.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION,))
                found = SCHEMA_VERSION
            if found is not None and found != SCHEMA_VERSION:
                raise KilnError(f"kiln: the tuning database {self.path} has schema version {found}, "
                                f"this kiln uses {SCHEMA_VERSION}; delete the file (its measurements "
                                "are lost) or pass --db with another path")
            for statement in _SCHEMA:
                self._conn.execute(statement)
            if found is None:
                self._conn.execute("INSERT INTO schema_version VALUES (?)", (SCHEMA_VERSION,))

    # kernel measurements: a key holds its latest outcome, a time or a failure, never both

    def kernel_time(self, fingerprint: str, source_hash: str, config: str,
                    symbols: dict[str, int]) -> float | None:
        row = self._conn.execute(f"SELECT median_s FROM kernels WHERE {_KERNEL_WHERE}",
                                 _kernel_key(fingerprint, source_hash, config, symbols)).fetchone()
        return row[0] if row else None

    def record_kernel(self, fingerprint: str, source_hash: str, config: str, symbols: dict[str, int],
                      median_s: float, samples: int):
        key = _kernel_key(fingerprint, source_hash, config, symbols)
        with self._conn:
            self._conn.execute(f"DELETE FROM kernel_failures WHERE {_KERNEL_WHERE}", key)
            self._conn.execute("INSERT OR REPLACE INTO kernels (fingerprint, source_hash, config, symbols, "
                               "median_s, samples, measured_at, passes) VALUES (?, ?, ?, ?, ?, ?, ?, 1)",
                               (*key, median_s, samples, time.time()))

    def kernel_records(self, fingerprint: str, source_hashes) -> tuple[dict[tuple, tuple[float, int]], set[tuple]]:
        """Every recorded time (median, passes) and every failure of these kernels, in all their
        configurations, keyed (source_hash, config, symbols): one tuning's look-ups in two queries."""
        hashes, times, failed = sorted(set(source_hashes)), {}, set()
        for i in range(0, len(hashes), 500):        # under SQLite's limit on a statement's parameters
            chunk = hashes[i:i + 500]
            where = f"fingerprint = ? AND source_hash IN ({', '.join('?' * len(chunk))})"
            for h, c, sy, median, passes in self._conn.execute(
                    f"SELECT source_hash, config, symbols, median_s, passes FROM kernels WHERE {where}",
                    (fingerprint, *chunk)):
                times[(h, c, sy)] = (median, passes)
            failed |= set(self._conn.execute(
                f"SELECT source_hash, config, symbols FROM kernel_failures WHERE {where}", (fingerprint, *chunk)))
        return times, failed

    def kernel_passes(self, fingerprint: str, source_hash: str, config: str, symbols: dict[str, int]) -> int:
        """How many timing passes a kernel's recorded time is the best of (0: none recorded)."""
        row = self._conn.execute(f"SELECT passes FROM kernels WHERE {_KERNEL_WHERE}",
                                 _kernel_key(fingerprint, source_hash, config, symbols)).fetchone()
        return row[0] if row else 0

    def confirm_kernel(self, fingerprint: str, source_hash: str, config: str, symbols: dict[str, int],
                       median_s: float, samples: int):
        """A later timing pass of a recorded kernel: its time becomes the best of its passes (load
        on a shared machine only ever slows a pass). Its first measurement's time stays its
        `measured_at`."""
        with self._conn:
            self._conn.execute(f"UPDATE kernels SET median_s = MIN(median_s, ?), samples = samples + ?, "
                               f"passes = passes + 1 WHERE {_KERNEL_WHERE}",
                               (median_s, samples, *_kernel_key(fingerprint, source_hash, config, symbols)))

    def kernel_failure(self, fingerprint: str, source_hash: str, config: str,
                       symbols: dict[str, int]) -> tuple[str, str] | None:
        row = self._conn.execute(f"SELECT reason, detail FROM kernel_failures WHERE {_KERNEL_WHERE}",
                                 _kernel_key(fingerprint, source_hash, config, symbols)).fetchone()
        return (row[0], row[1]) if row else None

    def record_kernel_failure(self, fingerprint: str, source_hash: str, config: str,
                              symbols: dict[str, int], reason: str, detail: str = ""):
        if reason not in FAILURE_REASONS:
            raise ValueError(f"failure reason {reason!r} is not one of {sorted(FAILURE_REASONS)}")
        key = _kernel_key(fingerprint, source_hash, config, symbols)
        with self._conn:
            self._conn.execute(f"DELETE FROM kernels WHERE {_KERNEL_WHERE}", key)
            self._conn.execute("INSERT OR REPLACE INTO kernel_failures VALUES (?, ?, ?, ?, ?, ?, ?)",
                               (*key, reason, detail, time.time()))

    # candidates of one compile; recording one again replaces it and moves it to the end

    def record_candidate(self, compile_id: str, region: str, candidate_hash: str, status: str,
                         estimate_s: float | None = None, end_to_end_s: float | None = None,
                         detail: str = ""):
        if status not in CANDIDATE_STATUSES:
            raise ValueError(f"candidate status {status!r} is not one of {sorted(CANDIDATE_STATUSES)}")
        with self._conn:
            self._conn.execute(
                "INSERT OR REPLACE INTO candidates (compile_id, region, candidate_hash, status, "
                "estimate_s, end_to_end_s, detail, recorded_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (compile_id, region, candidate_hash, status, estimate_s, end_to_end_s, detail,
                 time.time()))

    def candidates(self, compile_id: str, region: str | None = None) -> list[CandidateRecord]:
        where, args = "compile_id = ?", (compile_id,)
        if region is not None:
            where, args = where + " AND region = ?", args + (region,)
        rows = self._conn.execute(
            f"SELECT {_CANDIDATE_COLUMNS} FROM candidates WHERE {where} ORDER BY seq", args)
        return [CandidateRecord(*row) for row in rows]

    def candidate(self, compile_id: str, region: str, candidate_hash: str) -> CandidateRecord | None:
        row = self._conn.execute(
            f"SELECT {_CANDIDATE_COLUMNS} FROM candidates "
            "WHERE compile_id = ? AND region = ? AND candidate_hash = ?",
            (compile_id, region, candidate_hash)).fetchone()
        return CandidateRecord(*row) if row else None

    # winners: what a region's compiles chose, so that a longer compile never ends slower

    def record_winner(self, fingerprint: str, region: str, variant: str, program: dict, rules: list[str],
                      end_to_end_s: float, compile_id: str):
        with self._conn:
            self._conn.execute(
                "INSERT OR REPLACE INTO winners VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (fingerprint, region, variant, json.dumps(program, sort_keys=True, separators=(",", ":")),
                 json.dumps(rules), end_to_end_s, compile_id, time.time()))

    def winners(self, fingerprint: str, region: str, limit: int = 2) -> list[tuple[str, dict, list[str], float]]:
        """The region's fastest recorded winners: (variant, program, rules, end-to-end seconds)."""
        rows = self._conn.execute(
            "SELECT variant, program, rules, end_to_end_s FROM winners WHERE fingerprint = ? AND region = ? "
            "ORDER BY end_to_end_s LIMIT ?", (fingerprint, region, limit))
        return [(variant, json.loads(program), json.loads(rules), seconds) for variant, program, rules, seconds in rows]

    def record_kin_ratios(self, fingerprint: str, kin: str, kernel: str, ratios: dict[str, float]) -> None:
        """`kernel`'s time in each configuration over its time in its default one."""
        with self._conn:
            self._conn.executemany("INSERT OR REPLACE INTO kin_ratios VALUES (?, ?, ?, ?, ?)",
                                   [(fingerprint, kin, kernel, c, r) for c, r in ratios.items()])

    def kin_ratios(self, fingerprint: str, kins) -> dict[str, dict[str, dict[str, float]]]:
        """Per kin, per kernel, per configuration: the ratio recorded."""
        kins, out = sorted(set(kins)), {}
        for i in range(0, len(kins), 500):        # under SQLite's limit on a statement's parameters
            chunk = kins[i:i + 500]
            for kin, kernel, config, ratio in self._conn.execute(
                    "SELECT kin, kernel, config, ratio FROM kin_ratios WHERE fingerprint = ? AND "
                    f"kin IN ({', '.join('?' * len(chunk))})", (fingerprint, *chunk)):
                out.setdefault(kin, {}).setdefault(kernel, {})[config] = ratio
        return out

    def recorded_since(self, compile_id: str, started_at: float) -> tuple[int, int, float | None]:
        """What a compile recorded: its candidates (every graph's, ids `compile_id:graph`), the
        kernel timings measured since it began, and when it recorded its last candidate."""
        (candidates, last), = self._conn.execute(
            "SELECT COUNT(*), MAX(recorded_at) FROM candidates WHERE compile_id LIKE ?", (f"{compile_id}:%",))
        (kernels,), = self._conn.execute("SELECT COUNT(*) FROM kernels WHERE measured_at >= ?", (started_at,))
        return candidates, kernels, last

    def stats(self, fingerprint: str) -> dict:
        """Counts for a report: kernels measured on this machine, failures in all and per reason."""
        (kernels,), = self._conn.execute("SELECT COUNT(*) FROM kernels WHERE fingerprint = ?",
                                         (fingerprint,))
        reasons = dict(self._conn.execute(
            "SELECT reason, COUNT(*) FROM kernel_failures WHERE fingerprint = ? GROUP BY reason",
            (fingerprint,)))
        return {"kernels": kernels, "failures": sum(reasons.values()), "failure_reasons": reasons}

    def close(self):
        self._conn.close()

    def __enter__(self) -> TuneDB:
        return self

    def __exit__(self, *exc):
        self.close()
