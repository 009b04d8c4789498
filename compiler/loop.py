"""Compiling one graph: split it into regions at layer boundaries, and for each structurally
distinct region saturate it, search its candidates (checked, measured, journaled) within its share
of the budget, and keep the winner with each kernel's fastest configuration (`compiled.py` runs
it)."""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..codegen.schedule import POLICIES
from ..ir import Graph, evaluate, regions as regionlib
from ..ir.graph import is_weight
from ..rewrites.registry import library
from ..runtime.compiled import Choice, CompiledGraph, read_inputs, region_graph, replays
from ..runtime.executor import fixed_symbols
from ..search.budget import Deadline
from ..search import extract
from ..search.provenance import rules_used
from ..search.saturate import Limits, StageReport, saturate
from ..search.tunedb import TuneDB
from ..search.tuner import Progress, RegionTuner
from .measure import Measurer, Region
from .worker import IsolatedEvaluate


# of a region's share of the budget, the search's; the rest measures and times its finalists
SEARCH_SHARE = 0.75
# past the share, at most this much of it more to find the rules a rewritten winner needs
PROVENANCE_SHARE = 0.05


@dataclass
class RegionReport:
    key: str
    label: str
    count: int
    nodes: int
    stages: list[StageReport]
    progress: Progress
    winner: str
    variant: str
    estimate_s: float
    end_to_end_s: float
    saturate_s: float
    search_s: float
    kernels: list[dict] = field(default_factory=list)   # the winner's, with times and traffic
    rules: list[str] = field(default_factory=list)      # the rewrites the winner needs
    rules_undecided: list[str] = field(default_factory=list)   # fired, not checked in time


@dataclass
class GraphReport:
    regions: list[RegionReport] = field(default_factory=list)
    kernels_measured: int = 0
    worker_restarts: int = 0      # workers lost to a crashing or hanging candidate
    seconds: float = 0.0


def compile_graph(graph: Graph, backend, args: list[np.ndarray], seconds: float, db: TuneDB,
                  fingerprint: str, *, compile_id: str | None = None, seed: int = 0,
                  max_candidates: int = 100_000, isolate: bool | IsolatedEvaluate = True,
                  on_progress: Callable[[Progress, float], None] = lambda p, left: None,
                  ) -> tuple[CompiledGraph, GraphReport]:
    """Search every distinct region of `graph` within `seconds` in all; `args` are call inputs
    whose reference run supplies each region's inputs (real activations). `isolate`: measure
    candidates in a worker process (compiler/worker.py), so a crashing kernel costs only itself;
    a worker passed in (one for every graph of a compile: its start-up paid once) stays open."""
    start, budget = time.monotonic(), Deadline(seconds)
    compile_id = compile_id or uuid.uuid4().hex
    parts = regionlib.split(graph)
    groups = regionlib.distinct(parts)
    reps = [group[0] for group in groups.values()]
    inflows, env = regionlib.sample_inflows(graph, reps, args)
    total_work = sum(g[0].size * len(g) for g in groups.values())
    rules = list(library().values())
    report, choices = GraphReport(), {}
    # candidates run their kernels for the first time in a worker process (one for all regions);
    # the winner's kernels, checked there, run here
    own = isolate is True
    isolated = IsolatedEvaluate(backend.name, db.path, fingerprint) if own else isolate or None
    measured, restarts = (isolated.kernels_measured, isolated.restarts) if isolated else (0, 0)
    # half the budget is shared equally (a small region can hold the heaviest kernel, the
    # vocabulary projection), half by work (IR nodes times repeats); each region takes its share
    # of the time left when it starts, so the graph ends within `seconds`
    weights = [0.5 / len(groups) + 0.5 * g[0].size * len(g) / total_work for g in groups.values()]
    left = sum(weights)
    try:
        for (key, group), feeds, weight in zip(groups.items(), inflows, weights):
            share = budget.share(weight, left)
            left -= weight
            _search_region(graph, key, group, feeds, env, backend, db, fingerprint, compile_id, seed,
                           max_candidates, rules, isolated, report, choices, on_progress, share)
    finally:
        if isolated:
            report.kernels_measured += isolated.kernels_measured - measured
            report.worker_restarts += isolated.restarts - restarts
            if own:
                isolated.close()
    report.seconds = time.monotonic() - start
    return CompiledGraph(graph, choices, backend), report


def _search_region(graph, key, group, feeds, env, backend, db, fingerprint, compile_id, seed, max_candidates,
                   rules, isolated, report, choices, on_progress, share: Deadline) -> None:
    """Saturate, search and tune one distinct region by `share`; records its choice and report.
    The search stops at SEARCH_SHARE of it; the rest is the finalists' (every configuration of
    their kernels measured, each timed whole)."""
    rep = group[0]
    deadline = Deadline(share.remaining() * SEARCH_SHARE)
    t0 = time.monotonic()
    saturated = saturate(rep.outputs, rules, Limits(max_seconds=max(1.0, deadline.remaining() / 4)))
    saturate_s = time.monotonic() - t0
    inputs = [i for i in rep.inputs if not is_weight(i)]
    sub = region_graph(graph, rep, rep.outputs)
    region = Region(inputs, sub.weights, dict(graph.symbols), [feeds[i] for i in inputs],
                    evaluate(rep.outputs, feeds, env), sizes=dict(env), recorded=replays(graph),
                    fixed=fixed_symbols(read_inputs(graph)))
    measurer = Measurer(backend, db, fingerprint, region, deadline=deadline)
    if isolated:
        isolated.load(region, deadline)
    label = rep.label if len(group) == 1 else f"{rep.label} (x{len(group)})"

    def end_to_end(outputs, variant: str) -> float:
        """A finalist is what the user may run: the configurations of its kernels are measured
        past the search's deadline, until the region's (in the worker, where a crashing one costs
        only itself; candidates evaluated late had only their default configurations timed), then
        it is timed whole."""
        measurer.deadline = share
        if isolated:
            isolated.deadline = share
            isolated(outputs, variant)
        return measurer.end_to_end(outputs, variant)
    # every policy is tried while the budget lasts, in an order that puts the likely winners
    # first: in decode (GEMVs, bound by launches and bytes) the fused ones, fewest kernels first;
    # in prefill (GEMMs a library call takes whole, rows a prompt's length) the plain ones, fused
    # attention first, then those running softmax and the norms a row at a time
    gemv = not region.fixed
    variants = sorted(POLICIES, key=lambda v: (POLICIES[v].attention == gemv, POLICIES[v].merges != gemv,
                                               POLICIES[v].rows == gemv, POLICIES[v].epilogues != gemv))
    tuner = RegionTuner(key, label, rep.outputs, saturated, variants,
                        isolated or measurer.evaluate, end_to_end, db, compile_id, seed,
                        lambda p, d=deadline: on_progress(p, d.remaining()))
    winner = tuner.run(deadline, max_candidates)
    rules_needed, undecided = _rules_used(rep, rules, saturated, winner, share)
    _, program, configs = measurer.build(winner.outputs, winner.variant)
    choices[key] = Choice(winner.outputs, winner.variant, configs)
    report.kernels_measured += measurer.kernels_measured
    report.regions.append(RegionReport(
        key, label, len(group), rep.size, saturated.stages, winner.progress, winner.key,
        winner.variant, winner.estimate_s, winner.end_to_end_s, saturate_s,
        time.monotonic() - t0 - saturate_s, measurer.kernel_report(program, configs), rules_needed, undecided))


def _rules_used(rep, rules, saturated, winner, share: Deadline) -> tuple[list[str], list[str]]:
    """The rewrites the winner needs (none for the program as lowered), found by saturating again
    without each rule that fired, within the share or PROVENANCE_SHARE of it past its end."""
    if winner.genome is None:
        return [], []
    rewrites = {r.full_name for rs in rules if rs.stage != "analysis" for r in rs.rules}
    fired = sorted({name for stage in saturated.stages for name, n in stage.matches.items()
                    if n and name in rewrites})
    stop = Deadline(max(share.remaining(), PROVENANCE_SHARE * share.seconds))
    choice = extract.choice(saturated.graph, winner.genome)
    return rules_used(rep.outputs, rules, fired, saturated.graph, choice,
                      Limits(max_seconds=max(1.0, stop.remaining() / 4)), lambda: stop.expired)
