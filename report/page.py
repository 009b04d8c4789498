"""`kiln report`: one self-contained HTML page about a compile (no scripts, no fetches; charts are
inline SVG). For an artifact it reads `manifest.json`, `report.json` and the tuning database's
candidate rows; for a compile still running (no artifact yet, its journal beside the output
folder) it shows what the database holds so far."""
from __future__ import annotations

import math
import os
import platform
import re
import tempfile
import time
from html import escape
from pathlib import Path

from ..compiler.progress import spent_text
from ..ir import KilnError
from .source import Source, load
from .svg import Bar, PALETTE, Series, Strip, bar_chart, step_chart, strip_chart

REPORT_HTML = "report.html"
STATUSES = ("ok", "wrong", "nan", "crash", "compile", "timeout", "memory")   # the table's column order
ORIGINAL = "original/"             # the key prefix of the program as lowered
NUMBER = re.compile(r"^(-|[\d.,]+ ?[a-zA-Zµ%/]*)$")   # a figure with its unit: right-aligned


def write_report(folder: str | Path, out: str | Path | None = None) -> Path:
    """Write the page for an artifact folder (default `<folder>/report.html`) or for the compile
    writing to `folder` now (default `<parent>/<name>.report.html`); returns its path."""
    folder = Path(folder)
    source = load(folder)
    if out is None:
        out = folder / REPORT_HTML if source.finished else folder.parent / f"{folder.name}.report.html"
    out = Path(out)
    _write_atomic(out, render(source))
    return out


# --- the page -------------------------------------------------------------------------------------

CSS = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 24px auto; max-width: 1180px; color: #222;
       padding: 0 16px; }
h1 { font-size: 22px; } h2 { font-size: 19px; margin-top: 36px; border-bottom: 2px solid #ccc; }
h3 { font-size: 16px; margin-top: 24px; } h4 { font-size: 14px; margin: 16px 0 6px; }
table { border-collapse: collapse; margin: 6px 0 12px; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #f3f3f3; } td.n { text-align: right; font-variant-numeric: tabular-nums; }
code { font-size: 12px; white-space: nowrap; }
td.n { white-space: nowrap; } .note { color: #555; max-width: 900px; }
.charts { display: flex; flex-wrap: wrap; gap: 12px 28px; align-items: flex-start; }
.warn { background: #fff4d6; border: 1px solid #e6c35c; padding: 8px 12px; }
section.region { border-left: 3px solid #0072b2; padding-left: 14px; }
"""


class Raw(str):
    """A table cell that is HTML already (its text escaped where it was built)."""


def render(src: Source) -> str:
    info = src.manifest.get("info", {})
    name = info.get("model") or info.get("architecture") or src.folder.name
    title = f"Kiln compile report: {name}" + ("" if src.finished else " (in progress)")
    body = [f"<h1>{escape(title)}</h1>", _summary(src)]
    for graph, data in src.graphs.items():
        body.append(_graph(graph, data, src))
    if not src.graphs:
        body.append('<p class="warn">No candidate has been recorded for this compile yet.</p>')
    body += [_hardware(src), _legend()]
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{escape(title)}</title><style>{CSS}</style></head><body>\n"
            + "\n".join(body) + "\n</body></html>\n")


def _summary(src: Source) -> str:
    info = src.manifest.get("info", {})
    lines = [f"<p>{'Artifact' if src.finished else 'Output folder'} <code>{escape(str(src.folder))}"
             f"</code>; page written {escape(time.strftime('%Y-%m-%d %H:%M:%S'))}.</p>"]
    if not src.finished:
        lines.append('<p class="warn">This compile has not finished: the page shows the candidates '
                     "recorded so far. Kernels, e-graph growth and rules appear once the artifact is "
                     "written; run <code>kiln report</code> again then.</p>")
    if info:
        lines.append(_table(["model", "value"], [[k, _value(v)] for k, v in info.items()], figures=False))
    if src.rows is None:
        lines.append(f'<p class="warn">{escape(src.db_note)}.</p>')
    elif src.db_note:
        lines.append(f'<p class="note">{escape(src.db_note)}</p>')
    return "\n".join(lines)


def _graph(name: str, g: dict, src: Source) -> str:
    regions = g.get("regions", [])
    out = [f"<h2>Graph {escape(name)}</h2>"]
    if src.finished:
        total_est = sum(r["estimate_s"] * r["count"] for r in regions)
        total_e2e = sum(r["end_to_end_s"] * r["count"] for r in regions)
        tried = sum(r["progress"]["tried"] for r in regions)
        out.append(f"<p>Search {_s(g.get('seconds'))}, {tried:,} candidates tried, "
                   f"{g.get('kernels_measured', 0):,} kernel timings made; the winner runs "
                   f"{g.get('kernels', 0)} kernels, estimate {_s(total_est)} (sum of tuned kernel "
                   f"times), {_s(total_e2e)} timed end to end region by region; peak temporaries "
                   f"{_bytes(g.get('peak_bytes'))}. Compile id <code>{escape(g.get('compile_id', ''))}"
                   "</code>.</p>")
    out.append(_regions_table(regions, src.finished, total_e2e if src.finished else 0.0))
    out.append("<h3>Search curve</h3><p class=\"note\">Best estimate so far (the sum of the candidate's "
               "tuned kernel times) against candidates tried and against wall time since the "
               "region's search began.</p>")
    unit, scale = _unit(max((r["progress"].get("first_valid_s") or 0) * (r.get("count") or 1)
                            for r in regions) if regions else 0)
    charts = []
    if src.finished and regions:
        charts += _end_to_end_charts(regions, unit, scale)
    for i, r in enumerate(regions):
        curve = r["progress"]["curve"]
        color = PALETTE[i % len(PALETTE)]
        by_n = Series(r["label"], [(n, b * scale) for _, n, b in curve if b is not None], color)
        by_t = Series(r["label"], [(t, b * scale) for t, _, b in curve if b is not None], color)
        charts.append(step_chart([by_n], f"{r['label']}: best against candidates", "candidates tried", unit))
        charts.append(step_chart([by_t], f"{r['label']}: best against time", "seconds", unit))
    out.append(f'<div class="charts">{"".join(charts)}</div>')
    out.append(_rejections(g, regions, src))
    if src.finished:
        copy = g.get("copy_bytes_per_s")
        out += [_region(r, copy) for r in regions]
    return "\n".join(out)


def _regions_table(regions: list[dict], finished: bool, total_e2e: float) -> str:
    if not finished:
        return _table(["region", "tried", "valid", "first valid", "best", "gain"], [
            [r["label"], *_progress_cells(r["progress"])] for r in regions])
    rows = []
    for r in regions:
        share = r["end_to_end_s"] * r["count"] / total_e2e if total_e2e else math.nan
        rows.append([r["label"], r["count"], r["nodes"], _s(r["budget_s"]) if r.get("budget_s") else "-",
                     *_progress_cells(r["progress"]),
                     _s(r["end_to_end_s"]), _lowered_cell(r), _gain_text(end_to_end_gain(r)),
                     _pct(share), Raw(f"<code>{escape(r['winner'])}</code>"),
                     ", ".join(r.get("rules", [])) or ("none" if "rules" in r else "-"), _s(r["saturate_s"]),
                     _s(r["search_s"]), _per_minute(r["progress"], r["progress"].get("search_s") or r["search_s"]),
                     spent_text(r["progress"].get("spent", {}), r["progress"].get("measured", 0))
                     if r["progress"].get("spent") else "-"])
    return _table(["region", "repeats", "IR nodes", "budget", "tried", "valid", "first valid", "best estimate", "gain",
                   "end to end", "as lowered, end to end", "gain end to end", "share", "winner", "rewrites it needs", "saturate", "search", "candidates a minute",
                   "where a candidate's time went"], rows)


def _per_minute(progress: dict, seconds: float | None) -> str:
    """How fast the search measured candidates (checked against the reference, tuned, timed): those
    a resumed compile took from the database cost it nothing and do not count (reports written
    before the count existed count every candidate tried)."""
    measured = progress.get("measured", progress["tried"])
    return f"{measured / seconds * 60:.1f}" if seconds else "-"


def end_to_end_gain(r: dict) -> float | None:
    """The program as lowered (under the search's first policy, `lowered_variant`) over the
    winner, both timed whole in the launch mode a user gets (None in reports from before compiles
    timed it, or where it crashed)."""
    lowered = r.get("lowered_end_to_end_s")
    return lowered / r["end_to_end_s"] if lowered and r.get("end_to_end_s") else None


def _lowered_cell(r: dict) -> object:
    if not _finite(r.get("lowered_end_to_end_s")):
        return "-"
    return Raw(f"{escape(_s(r['lowered_end_to_end_s']))} (<code>{escape(r.get('lowered_variant', ''))}</code>)")


def _gain_text(gain: float | None) -> str:
    return f"{gain:.2f}x" if gain else "-"


def _progress_cells(p: dict) -> list:
    first, best = p.get("first_valid_s"), p.get("best_s")
    gain = f"{first / best:.2f}x" if first and best else "-"
    return [p["tried"], p["valid"], _s(first), _s(best), gain]


def _end_to_end_charts(regions: list[dict], unit: str, scale: float) -> list[str]:
    """The graph's estimate as the regions are searched one after another: the sum of repeats
    times best estimate so far, a region not searched yet counting at its first valid one."""
    current = [r["progress"]["first_valid_s"] for r in regions]
    if any(c is None for c in current):
        return []
    by_n, by_t, n0, t0 = [], [], 0, 0.0
    for i, r in enumerate(regions):
        t0 += r["saturate_s"]
        for t, n, best in r["progress"]["curve"]:
            if _finite(best):
                current[i] = min(current[i], best)
            total = sum(c * x["count"] for c, x in zip(current, regions)) * scale
            by_n.append((n0 + n, total))
            by_t.append((t0 + t, total))
        n0, t0 = n0 + r["progress"]["tried"], t0 + r["search_s"]
    color = "#000000"
    return [step_chart([Series("end to end", by_n, color)], "whole graph: best against candidates",
                       "candidates tried (all regions)", unit),
            step_chart([Series("end to end", by_t, color)], "whole graph: best against time",
                       "seconds since the graph's search began", unit)]


def _rejections(g: dict, regions: list[dict], src: Source) -> str:
    out = ["<h3>Candidates rejected</h3>"]
    if src.rows is None:
        return out[0] + f'<p class="warn">{escape(src.db_note)}.</p>'
    rows = [r for r in src.rows if r.compile_id == g.get("compile_id")]
    labels = {r["key"]: r["label"] for r in regions}
    statuses = list(STATUSES) + sorted({r.status for r in rows} - set(STATUSES))
    counts: dict[str, dict[str, int]] = {}
    for r in rows:
        per = counts.setdefault(r.region, {})
        per[r.status] = per.get(r.status, 0) + 1
    table = [[labels.get(k, k), *(per.get(s, 0) for s in statuses), sum(per.values())]
             for k, per in counts.items()]
    table.append(["all regions", *(sum(per.get(s, 0) for per in counts.values()) for s in statuses),
                  len(rows)])
    out.append(f"<p class=\"note\">Every candidate (program and fusion policy) recorded in "
               f"<code>{escape(str(src.db))}</code>, by outcome; all but <b>ok</b> are rejections "
               "(see the legend).</p>")
    out.append(_table(["region", *statuses, "total"], table))
    examples = [[labels.get(r.region, r.region), r.status, Raw(f"<code>{escape(r.candidate_hash)}</code>"),
                 r.detail[:300]] for r in rows if r.status != "ok"]
    if examples:
        out.append("<h4>Rejected candidates (first 20)</h4>")
        out.append(_table(["region", "reason", "candidate", "detail"], examples[:20]))
    return "\n".join(out)


def _region(r: dict, copy_bytes_per_s: float | None) -> str:
    out = [f'<section class="region"><h3>Region {escape(r["label"])}</h3>',
           f"<p>Winner <code>{escape(r['winner'])}</code> with fusion policy <code>"
           f"{escape(r['variant'])}</code>: estimate {_s(r['estimate_s'])}, end to end "
           f"{_s(r['end_to_end_s'])}; {r['count']} repeat(s), {r['nodes']} IR nodes. Region key "
           f"<code>{escape(r['key'])}</code>.</p>",
           _gap(r["estimate_s"], r["end_to_end_s"]), _finalists(r),
           _kernels(r.get("kernels", []), copy_bytes_per_s, r["estimate_s"]), _stages(r), _rules(r),
           "</section>"]
    return "\n".join(out)


def _finalists(r: dict) -> str:
    """The finalists timed whole, fastest first, with each round: those the timing could not tell
    from the fastest (round by round) are marked tied, and the fewest kernels among them won."""
    finalists = r.get("finalists") or []
    if not finalists:
        return ""
    # (an artifact compiled before finalists were timed in rounds lists its passes)
    timings = [f.get("rounds", f.get("passes", [])) for f in finalists]
    rows = [[Raw(f"{i}. <code>{escape(f['key'])}</code>" + (" <b>(winner)</b>" if f["key"] == r["winner"] else "")),
             f["kernels"] if f["kernels"] is not None else "-", _s(f["end_to_end_s"]),
             ", ".join(_s(t) for t in times) or "from the database", "tied" if f["tied"] else "-"]
            for i, (f, times) in enumerate(zip(finalists, timings), 1)]
    unit, scale = _unit(min(f["end_to_end_s"] for f in finalists))
    strips = [Strip(f"{i}. {f['kernels'] if f['kernels'] is not None else '?'} kernels",
                    [t * scale for t in times], f["end_to_end_s"] * scale,
                    "#000000" if f["key"] == r["winner"] else PALETTE[2] if f["tied"] else "#999999")
              for i, (f, times) in enumerate(zip(finalists, timings), 1)]
    chart = strip_chart(strips, f"{r['label']}: finalists' rounds (black: the winner; green: tied with the "
                        "fastest; grey: slower; a tick: the median)", unit)
    return ("<h4>Finalists, timed whole</h4>" + chart
            + _table(["finalist", "kernels", "end to end (median round)", "rounds", "tied with the fastest"], rows))


def _gap(estimate_s: float | None, end_to_end_s: float | None) -> str:
    """Why a region's time run whole differs from the sum of its kernels' (beyond a third)."""
    if not estimate_s or not end_to_end_s or 2 / 3 < end_to_end_s / estimate_s < 3 / 2:
        return ""
    ratio = end_to_end_s / estimate_s
    if ratio > 1:
        why = ("what runs between the kernels counts there and not in the estimate, which sums "
               "kernels timed one at a time: launches, the threads' start and joins, a region "
               "call's own work")
    else:
        why = ("each kernel was timed alone from a cold cache, while run in order a kernel reads "
               "what the one before it left in the cache")
    return f'<p class="note">End to end is {ratio:.2f}x the estimate: {why}.</p>'



def _kernels(kernels: list[dict], copy: float | None, estimate_s: float) -> str:
    out = ["<h4>The winner's kernels</h4>"]
    if not kernels:
        return out[0] + "<p>This artifact's report lists no kernels.</p>"
    total = sum(k["seconds"] or 0.0 for k in kernels)
    out.append("<p class=\"note\">In the order they run; times are per run of the region (a "
               "repeated layer runs them once per repeat), each share is of the region's kernel time."
               "</p>")
    if estimate_s and not 2 / 3 < total / estimate_s < 3 / 2:
        out.append(f'<p class="warn">These kernel times sum to {_s(total)}, but the winner was '
                   f"estimated at {_s(estimate_s)}: the configurations it was built with are not "
                   "the ones it was estimated with.</p>")
    rows = []
    for i, k in enumerate(kernels):
        s = k.get("seconds")
        bw = k["bytes"] / s if s else math.nan
        rows.append([i, k["label"], Raw(f"<code>{escape(k['function'])}</code>"),
                     Raw(f"<code>{escape(k['config'])}</code>"), _s(s),
                     _pct(s / total if s and total else math.nan), _bytes(k["bytes"]), _rate(bw, "B/s"),
                     _pct(bw / copy if copy else math.nan), _rate(k["ops"] / s if s else math.nan, "FLOP/s")])
    out.append(_table(["#", "kernel", "function", "configuration", "time", "share", "bytes moved",
                       "bandwidth", "of copy bound", "arithmetic"], rows))
    ops = sorted({k["label"].split("[")[0] for k in kernels})
    ranked = sorted(enumerate(kernels), key=lambda ik: -(ik[1]["seconds"] or 0.0))
    bars = [Bar(f"#{i} {k['label']}", k["seconds"] or 0.0,
                f"{_s(k['seconds'])} ({_pct((k['seconds'] or 0.0) / total if total else math.nan)})",
                PALETTE[ops.index(k["label"].split("[")[0]) % len(PALETTE)]) for i, k in ranked[:40]]
    out.append(bar_chart(bars, "kernel time (one run of the region)"))
    if len(ranked) > 40:
        out.append(f"<p class=\"note\">{len(ranked) - 40} shorter kernels not drawn.</p>")
    return "\n".join(out)


def _stages(r: dict) -> str:
    stages = r.get("stages", [])
    rows = [["lowered program", "", r["nodes"], "", "", "(IR nodes)"]]
    rows += [[s["stage"], s["iterations"], s["enodes"], s["eclasses"], _s(s["seconds"]), s["stop"]]
             for s in stages]
    bars = [Bar("lowered program IR nodes", r["nodes"], f"{r['nodes']:,}", "#999999")]
    for s in stages:
        bars += [Bar(f"{s['stage']} e-nodes", s["enodes"], f"{s['enodes']:,}", PALETTE[0]),
                 Bar(f"{s['stage']} e-classes", s["eclasses"], f"{s['eclasses']:,}", PALETTE[1])]
    return "\n".join([f"<h4>E-graph growth per saturation stage ({_s(r.get('saturate_s'))} in all)</h4>",
                      _table(["stage", "iterations", "e-nodes", "e-classes", "time", "stopped"], rows),
                      bar_chart(bars, "e-graph size after each stage", width=560, label_width=150)])


def _rules(r: dict) -> str:
    fired: dict[str, list] = {}
    tried = set()
    for s in r.get("stages", []):
        for rule, n in s.get("matches", {}).items():
            tried.add(rule)
            if n:
                entry = fired.setdefault(rule, [0, []])
                entry[0] += n
                entry[1].append(s["stage"])
    out = ["<h4>Rewrites the winner uses</h4>", _winner_rules(r), "<h4>Rules that fired in this region</h4>"]
    needed = set(r.get("rules", []))
    ranked = sorted(fired.items(), key=lambda kv: -kv[1][0])
    rows = [[rule, n, ", ".join(stages), "yes" if rule in needed else ""] for rule, (n, stages) in ranked]
    out.append(_table(["rule", "matches", "stages", "the winner needs it"], rows) if rows
               else "<p>No rule matched.</p>")
    if tried - fired.keys():
        out.append(f"<p class=\"note\">{len(tried - fired.keys())} more rules were run and never "
                   "matched.</p>")
    return "\n".join(out)


def _winner_rules(r: dict) -> str:
    """The rules the winner needs: without any one of them (the others kept) the e-graph no longer
    holds it (search/provenance.py)."""
    if r["winner"].startswith(ORIGINAL):
        return "<p><b>The winner is the program as lowered: it uses no rewrite.</b></p>"
    if "rules" not in r:   # an artifact from before the compile recorded them
        return "<p class=\"note\">This compile did not record which rewrites its winner needs.</p>"
    out = []
    if r["rules"]:
        gain = _progress_cells(r["progress"])[4]
        whole = end_to_end_gain(r)
        whole = f", {whole:.2f}x end to end" if whole else ""
        out.append(f"<p>The winner ({gain} over the program as lowered by estimate{whole}) is reached "
                   "through these rewrites; without any one of them the e-graph no longer holds it:</p>")
        out.append("<ul>" + "".join(f"<li><code>{escape(name)}</code></li>" for name in r["rules"]) + "</ul>")
    else:
        out.append("<p>The winner differs from the program as lowered only in how the e-graph spells it: "
                   "it needs none of the rules that fired.</p>")
    if r.get("rules_undecided"):
        out.append(f"<p class=\"note\">Not checked in the time left ({len(r['rules_undecided'])} rules): "
                   + ", ".join(f"<code>{escape(n)}</code>" for n in r["rules_undecided"]) + ".</p>")
    return "\n".join(out)


def _hardware(src: Source) -> str:
    from .. import __version__
    hw = src.manifest.get("hardware", {})
    rows = [[k, _value(v)] for k, v in hw.items()]
    if src.manifest.get("hardware_id"):
        rows.append(["fingerprint id", src.manifest["hardware_id"]])
    copies = [g["copy_bytes_per_s"] for g in src.graphs.values() if g.get("copy_bytes_per_s")]
    if copies:
        rows.append(["memory copy bandwidth (measured)", _rate(copies[0], "B/s")])
    rows += [["Kiln (compiled it)", src.manifest.get("kiln_version", "?")],
             ["Kiln (wrote this page)", __version__], ["Python (wrote this page)", platform.python_version()]]
    where = "the machine it was tuned on" if src.finished else \
        "this machine (a compile in progress has not written its own yet)"
    return f"<h2>Hardware and versions</h2><p class=\"note\">Fingerprint of {where}.</p>" + \
        _table(["", "value"], rows, figures=False)


def _legend() -> str:
    items = [
        ("configuration <code>outer0-par1-simd1-unroll1</code>", "the knobs of the loop-nest template "
         "every CPU kernel is rendered from: <b>outer</b> = which output loop runs outermost; "
         "<b>par</b> = how many outer loops OpenMP splits among threads (0: one thread); <b>simd</b> "
         "= reduction loops vectorized (1) or not (0); <b>unroll</b> = reduction unroll factor."),
        ("configuration <code>library-gemm</code>", "the kernel is a matrix product run as one library "
         "call (BLAS through numpy on the CPU, cuBLAS through CuPy on the GPU) instead of generated "
         "code; it won the timing against the generated configurations."),
        ("fusion policy <code>inline12-bcast1</code>", "how much elementwise work a kernel may recompute "
         "instead of reading it from a stored buffer: <b>inline</b> ops for a value several kernels "
         "read, <b>bcast</b> ops for one read under a broadcast."),
        ("estimate", "the sum of the candidate's kernel times, each kernel in its fastest configuration."),
        ("candidates a minute", "candidates measured over the search's time (the finalists' tuning "
         "and timing after it not counted; reports before it existed: over the region's time): each "
         "one scheduled, checked against the reference and its kernels tuned and timed (those a "
         "resumed compile found in the tuning database not counted)."),
        ("where a candidate's time went", "per measured candidate: <b>schedule</b> (its kernels "
         "formed), <b>build</b> (rendered and compiled in their default configurations), <b>check</b> "
         "(its outputs and each configuration's computed on the device), <b>compare</b> (those "
         "against the reference's, on the host, the device let go), <b>render</b> and "
         "<b>compile</b> (the configurations tuned), <b>time</b> (their timings), <b>round trip</b> "
         "(to and from the worker process that measures it)."),
        ("end to end", "the region run whole in the launch mode a user gets (a CUDA graph's replay "
         "on the GPU, one C call on the CPU), median of several runs; the winner is the fastest of "
         "the best few estimates by this time."),
        ("bandwidth / of copy bound", "the fewest bytes a kernel must move (each input read once, the "
         "output written once) divided by its time, and that as a share of the memory copy bandwidth "
         "measured on all cores (read plus written)."),
        ("arithmetic", "arithmetic operations per second (selects, casts and loads not counted)."),
        ("ok / wrong / nan", "agreed with the reference interpreter / outputs differ from it / NaN or "
         "inf where the reference is finite."),
        ("crash / compile / timeout", "the backend raised or the kernel crashed / gcc refused the "
         "kernel source / ran past its time limit."),
    ]
    return "<h2>Legend</h2><dl>" + "".join(f"<dt><b>{k}</b></dt><dd>{v}</dd>" for k, v in items) + "</dl>"


# --- formatting -----------------------------------------------------------------------------------

def _table(headers: list[str], rows: list[list], figures: bool = True) -> str:
    """Cells escaped (but Raw ones); with `figures`, numbers are right-aligned."""
    def cell(v) -> str:
        if isinstance(v, Raw):
            return f"<td>{v}</td>"
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            v = f"{v:,}"
        text = escape(str(v))
        return f'<td class="n">{text}</td>' if figures and NUMBER.match(text) else f"<td>{text}</td>"
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(cell(v) for v in row) + "</tr>\n" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>\n{body}</tbody></table>"


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v)


def _value(v) -> str:
    if isinstance(v, list):
        return ", ".join(map(str, v)) or "(none)"
    return "-" if v is None else str(v)


def _unit(seconds: float) -> tuple[str, float]:
    """The axis unit for times up to `seconds`, and the factor from seconds to it."""
    if seconds >= 1:
        return "s", 1.0
    return ("ms", 1e3) if seconds >= 1e-3 else ("µs", 1e6)


def _s(seconds) -> str:
    if not _finite(seconds):
        return "-"
    unit, scale = _unit(seconds)
    return f"{seconds * scale:,.3g} {unit}" if seconds else "0 s"


def _bytes(n) -> str:
    if not _finite(n):
        return "-"
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:,} B"


def _rate(x, unit: str) -> str:
    if not _finite(x):
        return "-"
    for prefix, size in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if x >= size:
            return f"{x / size:.3g} {prefix}{unit}"
    return f"{x:.3g} {unit}"


def _pct(x) -> str:
    return f"{100 * x:.1f}%" if _finite(x) else "-"


def _write_atomic(path: Path, text: str) -> None:
    """Into a temporary sibling, then renamed over `path`: a reader sees the old page or the new."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as err:
        raise KilnError(f"kiln: cannot write {path}: {err.strerror or err}") from err
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException as err:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(err, OSError):
            raise KilnError(f"kiln: cannot write {path}: {err.strerror or err}") from err
        raise
