"""What a report page is built from: an artifact's manifest and report.json, or a running compile's
journal, and the tuning database's candidate rows of that compile (read-only)."""
from __future__ import annotations

import json
import math
import sqlite3
from dataclasses import dataclass, fields
from pathlib import Path

from ..compiler.driver import _journal_path
from ..ir import KilnError
from ..ir.artifact import MANIFEST
from ..search.tunedb import CandidateRecord, TuneDB


@dataclass
class Source:
    """What a page is built from. In progress, `graphs` is built from the database rows alone."""
    folder: Path
    finished: bool
    manifest: dict
    graphs: dict[str, dict]                   # report.json's "graphs"
    db: Path | None
    rows: list[CandidateRecord] | None        # None where the database cannot be read ...
    db_note: str = ""                         # ... and why


def load(folder: Path) -> Source:
    if (folder / MANIFEST).is_file():
        manifest = read_json(folder / MANIFEST)
        graphs = read_json(folder / "report.json").get("graphs") or {}
        ids = [g["compile_id"].split(":")[0] for g in graphs.values() if g.get("compile_id")]
        dbs = [Path(g["db"]) for g in graphs.values() if g.get("db")]
        db = dbs[0] if dbs else None
        rows, note = candidate_rows(db, ids[0] if ids else None)
        return Source(folder, True, manifest, graphs, db, rows, note)
    journal = _journal_path(folder)
    if journal.is_file():
        data = read_json(journal)
        db = Path(data["db"]) if data.get("db") else TuneDB.default_path()
        rows, note = candidate_rows(db, data.get("compile_id"))
        if not data.get("db"):
            note = f"the journal names no database; read the default one, {db}. {note}"
        from .. import __version__
        from ..runtime.hardware import fingerprint_cpu
        manifest = {"kiln_version": __version__, "hardware": fingerprint_cpu()}
        return Source(folder, False, manifest, graphs_from_rows(rows or []), db, rows, note)
    if folder.exists() and not folder.is_dir():
        raise KilnError(f"kiln: {folder} is not a folder; pass the folder `kiln compile --out` wrote")
    if folder.is_dir():
        raise KilnError(f"kiln: {folder} is not a Kiln artifact (it has no {MANIFEST}) and no "
                        "compile is writing to it")
    raise KilnError(f"kiln: {folder} does not exist and no compile is writing to it")


def read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise KilnError(f"kiln: cannot read {path}: {getattr(err, 'strerror', None) or err}") from err
    if not isinstance(data, dict):
        raise KilnError(f"kiln: {path} is not a JSON object")
    return data


def candidate_rows(db: Path | None, compile_id: str | None) -> tuple[list[CandidateRecord] | None, str]:
    """Every candidate row of one compile (all its graphs), read-only: a report never writes."""
    if db is None or compile_id is None:
        return None, "this report names no tuning database, so rejected candidates are not counted"
    if not db.is_file():
        return None, f"the tuning database {db} is missing, so rejected candidates are not counted"
    prefix = f"{compile_id}:"
    columns = ", ".join(f.name for f in fields(CandidateRecord))
    try:
        conn = sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True, timeout=10)
        try:
            rows = conn.execute(f"SELECT {columns} FROM candidates WHERE substr(compile_id, 1, ?) = ? "
                                "ORDER BY seq", (len(prefix), prefix)).fetchall()
        finally:
            conn.close()
    except sqlite3.Error as err:
        return None, f"cannot read the tuning database {db} ({err}), so rejected candidates are not counted"
    return [CandidateRecord(*row) for row in rows], ""


def graphs_from_rows(rows: list[CandidateRecord]) -> dict[str, dict]:
    """Per graph and region of a running compile: candidates tried and valid, and the best
    estimate against candidates and against time, as report.json's "progress" holds them."""
    graphs: dict[str, dict[str, list[CandidateRecord]]] = {}
    for row in rows:
        graph = row.compile_id.partition(":")[2]
        graphs.setdefault(graph, {}).setdefault(row.region, []).append(row)
    out = {}
    for graph, regions in graphs.items():
        listed = []
        for key, records in regions.items():
            tried, valid, first, best, curve = 0, 0, None, None, []
            for r in records:
                tried += 1
                if r.status == "ok" and r.estimate_s is not None:
                    valid += 1
                    first = first if first is not None else r.estimate_s
                    best = r.estimate_s if best is None else min(best, r.estimate_s)
                curve.append([r.recorded_at - records[0].recorded_at, tried,
                              best if best is not None else math.nan])
            listed.append({"key": key, "label": f"region {key}", "progress": {
                "tried": tried, "valid": valid, "first_valid_s": first, "best_s": best, "curve": curve}})
        out[graph] = {"regions": listed, "compile_id": records[0].compile_id}
    return out
