"""`kiln bench search`: the e-graph stage of a compile, measured per model.

Per model: lower one graph (prefill by default), split it into regions and dedupe them, then for
each distinct region saturate it with the whole rule library, and draw distinct candidates for up
to a time budget. The e-graph stage time is split + saturation + extraction (lowering is reported
apart). For scale, the whole graph is also saturated once without dedupe. A sample of each region's
candidates is checked against the reference interpreter on real activations, and one whole graph
stitched from a candidate per distinct region is checked end to end.
"""
from __future__ import annotations

import os
import platform
import random
import time
from dataclasses import asdict

import numpy as np
from rich.console import Console
from rich.table import Table

from ..ir import DType, Graph, evaluate, regions, run
from ..ir.compare import agrees
from ..rewrites.registry import library
from ..search import extract
from ..search.saturate import Limits, saturate
from .frontend import write_json

CHECK_SEQ = 8              # prompt length of the reference run that supplies region inflows
TARGET_STAGE_S = 60.0      # the whole e-graph stage, on one core


def lower_graph(spec: str, which: str, max_seq: int) -> tuple[Graph, int]:
    """One graph of a causal LM (prefill or decode) and its vocabulary size; lowering only the
    graph asked for halves the time of `hf.lower_causal_lm`."""
    from ..frontend import catalog, hf
    model = catalog.load(spec).model
    cache = hf.cache_spec(model, max_seq)
    graph = hf.lower_prefill(model, cache) if which == "prefill" else hf.lower_decode(model, cache)
    return graph, int(model.config.get_text_config().vocab_size)


def sample_args(graph: Graph, vocab: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Token ids (and a position) for integer inputs, N(0, 1) for float inputs (a decode's cache);
    symbolic lengths at CHECK_SEQ."""
    env = {name: min(max(CHECK_SEQ, lo), hi) for name, (lo, hi) in graph.symbols.items()}
    args = []
    for node in graph.inputs:
        shape = tuple(d.evaluate(env) for d in node.shape)
        if node.dtype is DType.BOOL:
            args.append(rng.integers(0, 2, shape).astype(bool))
        elif node.dtype.is_int:
            args.append(rng.integers(0, min(vocab, CHECK_SEQ), shape).astype(node.dtype.np))
        else:
            args.append(rng.standard_normal(shape).astype(node.dtype.np))
    return args


def _timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def measure(spec: str, which: str = "prefill", per_region: int = 1000, seconds: float = 10.0,
            check: int = 20, max_seq: int = 64, seed: int = 0, whole: bool = True) -> dict:
    (graph, vocab), lower_s = _timed(lambda: lower_graph(spec, which, max_seq))
    rules = list(library().values())
    parts, split_s = _timed(lambda: regions.split(graph))
    groups = regions.distinct(parts)
    rng = random.Random(seed)
    args = sample_args(graph, vocab, np.random.default_rng(seed))
    inflows, env = regions.sample_inflows(graph, [g[0] for g in groups.values()], args)
    rows, chosen = [], {}
    for (key, group), feeds in zip(groups.items(), inflows):
        rep = group[0]
        sat, sat_s = _timed(lambda: saturate(rep.outputs, rules, Limits()))
        space = extract.space(sat.graph)
        drawn, draw_s = _timed(lambda: extract.candidates(sat.graph, per_region, rng, seconds))
        want = evaluate(rep.outputs, feeds, env)
        sample = drawn[:check]
        (failed, programs), check_s = _timed(lambda: _check(sat, sample, feeds, env, want))
        if programs:
            chosen[key] = programs[-1]
        rows.append({
            "region": rep.label if len(group) == 1 else f"{rep.label} (x{len(group)})",
            "key": key, "regions": len(group), "nodes": rep.size,
            "stages": [asdict(s) | {"matches": sum(s.matches.values())} for s in sat.stages],
            "saturate_s": sat_s, "eclasses": len(space.class_ids),
            "enodes": sum(len(n) for n in space.enodes), "log10_programs_bound": space.log10_size(),
            "candidates": len(drawn), "extract_s": draw_s,
            # fewer than asked, before the time budget: draws stopped finding new programs
            "exhausted": len(drawn) < per_region and draw_s < seconds, "checked": len(sample),
            "check_failures": failed, "check_s": check_s,
        })
    stitched = regions.stitch(graph, parts, chosen)
    pairs = list(zip(run(stitched, args), run(graph, args)))
    stitched_ok = all(agrees(a, b) for a, b in pairs)
    # regions are checked one by one; end to end their rounding compounds over the layers
    stitched_error = max(float(np.abs(a.astype(np.float64) - b).max() / max(np.abs(b).max(), 1e-30))
                         for a, b in pairs if b.dtype.kind == "f")
    report = {
        "model": spec, "graph": which, "nodes": len(graph.nodes()), "lower_s": lower_s,
        "split_s": split_s, "regions": len(parts), "distinct": len(groups), "per_region": rows,
        "stage_s": split_s + sum(r["saturate_s"] + r["extract_s"] for r in rows),
        "stitched_check": stitched_ok, "stitched_error": stitched_error, "cores": os.cpu_count(),
    }
    if whole:
        report["whole_graph"] = _whole_graph(graph, rules, args, rng)
    return report


def _whole_graph(graph: Graph, rules, args, rng: random.Random, draws: int = 50) -> dict:
    """The same search without dedupe: one e-graph for the whole model, a few draws from it (the
    extractor's cost per e-class at full depth), two of them run end to end."""
    sat, saturate_s = _timed(lambda: saturate(graph.outputs, rules, Limits()))
    drawn, draw_s = _timed(lambda: extract.candidates(sat.graph, draws, rng))
    want = run(graph, args)
    checked = [all(agrees(g, w) for g, w in zip(run(_with_outputs(graph, outputs), args), want))
               for outputs in (extract.decode(sat.encoded, sat.graph, c.genome) for c in drawn[:2])]
    classes = len(extract.space(sat.graph).class_ids)
    return {"saturate_s": saturate_s, "eclasses": classes,
            "stages": [asdict(s) | {"matches": sum(s.matches.values())} for s in sat.stages],
            "candidates": len(drawn), "extract_s": draw_s,
            "us_per_eclass": draw_s / max(len(drawn), 1) / max(classes, 1) * 1e6,
            "checked": len(checked), "check_failures": checked.count(False)}


def _with_outputs(graph: Graph, outputs) -> Graph:
    return Graph(inputs=list(graph.inputs), outputs=list(outputs), weights=graph.weights,
                 symbols=dict(graph.symbols))


def _check(sat, sample, feeds, env, want) -> tuple[int, list]:
    """Decode and run each sampled candidate; count those that disagree with the reference."""
    failed, programs = 0, []
    for candidate in sample:
        try:
            outputs = extract.decode(sat.encoded, sat.graph, candidate.genome)
            ok = all(agrees(g, w) for g, w in zip(evaluate(outputs, feeds, env), want))
        except Exception:  # a wrong rewrite can make a program that does not even run: a failure
            ok = False
        failed += not ok
        if ok:
            programs.append(outputs)
    return failed, programs


def run_search_bench(specs: list[str], which: str, per_region: int, seconds: float, check: int,
                     json_path: str | None, whole: bool = True) -> list[dict]:
    console = Console()
    if not console.is_terminal:
        console = Console(width=200)
    console.print(f"machine: {platform.machine()}, {os.cpu_count()} cores; graph: {which}; up to "
                  f"{per_region} candidates or {seconds:g} s per distinct region; {check} checked "
                  f"per region against the reference (prompt {CHECK_SEQ} tokens)")
    reports = []
    for spec in specs:
        with console.status(f"measuring {spec} ..."):
            reports.append(measure(spec, which, per_region, seconds, check, whole=whole))
    console.print(_summary_table(reports))
    for r in reports:
        console.print(_region_table(r))
    if json_path:
        write_json(json_path, reports)
    return reports


def _summary_table(reports: list[dict]) -> Table:
    table = Table(title="kiln bench search (e-graph stage = split + saturate + extract; "
                        f"target {TARGET_STAGE_S:.0f} s on one core)")
    for col in ("model", "IR nodes", "lower", "regions (distinct)", "split", "saturate", "extract",
                "e-graph stage", "no dedupe: saturate", "e-classes", "draw per e-class",
                "checked (failed)", "stitched = original (max rel. error)"):
        table.add_column(col, justify="right")
    for r in reports:
        rows = r["per_region"]
        whole = r.get("whole_graph") or {}
        checked = sum(x["checked"] for x in rows) + whole.get("checked", 0)
        failed = sum(x["check_failures"] for x in rows) + whole.get("check_failures", 0)
        table.add_row(
            _short(f"{r['model']} {r['graph']}"), f"{r['nodes']:,}", f"{r['lower_s']:.1f} s",
            f"{r['regions']} ({r['distinct']})", f"{r['split_s']:.2f} s",
            f"{sum(x['saturate_s'] for x in rows):.1f} s", f"{sum(x['extract_s'] for x in rows):.1f} s",
            f"{r['stage_s']:.1f} s" + ("" if r["stage_s"] <= TARGET_STAGE_S else " (over)"),
            f"{whole['saturate_s']:.1f} s" if whole else "-",
            f"{whole['eclasses']:,}" if whole else "-",
            f"{whole['us_per_eclass']:.1f} us" if whole else "-",
            f"{checked} ({failed})",
            f"{'yes' if r['stitched_check'] else 'NO'} ({r['stitched_error']:.0e})")
    return table


def _short(text: str, width: int = 28) -> str:
    return text if len(text) <= width else text[:width - 3] + "..."


def _region_table(report: dict) -> Table:
    table = Table(title=f"{_short(report['model'], 60)} {report['graph']}: distinct regions")
    for col in ("region", "IR nodes", "stage", "iters", "e-nodes", "e-classes", "saturate",
                "stop", "programs <=", "candidates", "extract", "per draw", "checked (failed)"):
        table.add_column(col, justify="right")
    for x in report["per_region"]:
        stages = x["stages"] or [{"stage": "-", "iterations": 0, "enodes": x["enodes"],
                                  "eclasses": x["eclasses"], "stop": "no rules"}]
        once = [x["region"], f"{x['nodes']:,}"]
        drawn = [f"1e{x['log10_programs_bound']:.0f}",
                 f"{x['candidates']:,}" + (" (all)" if x["exhausted"] else ""),
                 f"{x['extract_s']:.2f} s", f"{x['extract_s'] / max(x['candidates'], 1) * 1e3:.2f} ms",
                 f"{x['checked']} ({x['check_failures']})"]
        for k, s in enumerate(stages):
            first = k == 0
            table.add_row(*(once if first else ["", ""]), s["stage"], str(s["iterations"]),
                          f"{s['enodes']:,}", f"{s['eclasses']:,}",
                          f"{x['saturate_s']:.2f} s" if first else "", s["stop"],
                          *(drawn if first else [""] * len(drawn)))
    return table
