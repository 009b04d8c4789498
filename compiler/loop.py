"""Compiling one graph: split it into regions at layer boundaries, and for each structurally
distinct region saturate it, search its candidates (checked, measured, journaled) within its share
of the budget, and keep the winner with each kernel's fastest configuration (`compiled.py` runs
it)."""
from __future__ import annotations

import hashlib
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..codegen.policy import POLICIES
from ..ir import Graph, Node, Op, evaluate, regions as regionlib
from ..ir.serialize import graph_from_json, graph_to_json
from ..ir.graph import is_weight
from ..rewrites.registry import library
from ..runtime.compiled import Choice, CompiledGraph, read_inputs, records, region_graph
from ..runtime.executor import fixed_symbols
from ..search.budget import Deadline
from ..search import extract
from ..search.provenance import rules_used
from ..search.saturate import Limits, StageReport, saturate
from ..search.tunedb import TuneDB
from ..search.tuner import ORIGINAL, REMEMBERED, Finalist, Progress, RegionTuner
from .measure import Measurer, Region
from .worker import IsolatedEvaluate


# of a region's share of the budget, the search's; the rest measures and times its finalists
SEARCH_SHARE = 0.75
# of the budget, the most spent measuring every region's program as lowered before the search
LOWERED_SHARE = 0.1
# of the search budget, the part shared evenly among regions (the rest goes by measured time)
EVEN_SHARE = 0.1
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
    budget_s: float = 0.0         # its share of the budget, by the measured time of its program as lowered
    lowered_end_to_end_s: float | None = None   # the program as lowered, timed as the winner ...
    lowered_variant: str = ""                   # ... under the search's first policy, this one
    finalists: list[Finalist] = field(default_factory=list)   # timed whole, fastest first


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
    rules = list(library().values())
    report, choices = GraphReport(), {}
    # candidates run their kernels for the first time in a worker process (one for all regions);
    # the winner's kernels, checked there, run here
    own = isolate is True
    isolated = IsolatedEvaluate(backend.name, db.path, fingerprint) if own else isolate or None
    measured, restarts = (isolated.kernels_measured, isolated.restarts) if isolated else (0, 0)
    try:
        searches = [_RegionSearch(graph, key, group, feeds, env, backend, db, fingerprint, compile_id, seed,
                                  isolated, on_progress) for (key, group), feeds in zip(groups.items(), inflows)]
        # first every region's program as lowered, measured: the budget goes where the time is
        lowered = budget.share(LOWERED_SHARE, 1.0)
        costs = [search.lowered_cost(lowered.share(1, len(searches) - k)) for k, search in enumerate(searches)]
        weights = budget_weights(costs, [search.rep.size * len(search.group) for search in searches])
        left = sum(weights)
        for search, weight in zip(searches, weights):
            share = budget.share(weight, left)    # of the time left when it starts: the graph ends on time
            left -= weight
            search.run(share, rules, max_candidates, report, choices)
    finally:
        if isolated:
            report.kernels_measured += isolated.kernels_measured - measured
            report.worker_restarts += isolated.restarts - restarts
            if own:
                isolated.close()
    report.seconds = time.monotonic() - start
    return CompiledGraph(graph, choices, backend, regions=parts), report


def budget_weights(costs: list[float | None], work: list[int]) -> list[float]:
    """Each region's share of the search budget: EVEN_SHARE of it evenly, the rest by the measured
    time of its program as lowered times its repeats (by IR nodes times repeats where a region's
    program as lowered has no valid time)."""
    timed = [(c, w) for c, w in zip(costs, work) if c is not None]
    # a region without a time counts as its work at the timed regions' seconds per node
    per_node = sum(c for c, _ in timed) / sum(w for _, w in timed) if timed else 1.0
    spread = [c if c is not None else w * per_node for c, w in zip(costs, work)]
    total = sum(spread) or 1.0
    return [EVEN_SHARE / len(costs) + (1 - EVEN_SHARE) * c / total for c in spread]


class _RegionSearch:
    """One distinct region: its program as lowered measured first (`lowered_cost`), then saturated,
    searched and tuned within its share (`run`)."""

    def __init__(self, graph, key, group, feeds, env, backend, db, fingerprint, compile_id, seed, isolated,
                 on_progress):
        self.graph, self.key, self.group, self.isolated = graph, key, group, isolated
        self.db, self.fingerprint, self.compile_id = db, fingerprint, compile_id
        self.rep = rep = group[0]
        inputs = [i for i in rep.inputs if not is_weight(i)]
        sub = region_graph(graph, rep, rep.outputs)
        self.region = Region(inputs, sub.weights, dict(graph.symbols), [feeds[i] for i in inputs],
                             evaluate(rep.outputs, feeds, env), sizes=dict(env), recorded=records(backend, graph),
                             fixed=fixed_symbols(read_inputs(graph)))
        self.measurer = Measurer(backend, db, fingerprint, self.region)
        self.label = rep.label if len(group) == 1 else f"{rep.label} (x{len(group)})"
        # every policy is tried while the budget lasts, in an order that puts the likely winners
        # first: fused attention (one pass over the cache, in decode as in prefill), then in decode
        # (GEMVs, bound by launches and bytes) the fused ones, fewest kernels first; in prefill
        # (GEMMs a library call takes whole, rows a prompt's length) the plain ones, then those
        # running softmax and the norms a row at a time; only the backend's policies, and a
        # prompt's attention (a row of heads a position) has no head's slice to split
        gemv = not self.region.fixed
        variants = sorted((v for v, p in POLICIES.items() if backend.name in p.backends and (gemv or not p.heads)),
                          key=lambda v: (not POLICIES[v].attention, POLICIES[v].merges != gemv,
                                         POLICIES[v].rows == gemv, POLICIES[v].epilogues != gemv))
        self.deadline = Deadline(0.0)
        self._finalists_tuned: set[tuple] = set()
        self.tuner = RegionTuner(key, self.label, rep.outputs, None, variants,
                                 isolated or self.measurer.evaluate, self._end_to_end, db, compile_id, seed,
                                 lambda p: on_progress(p, self.deadline.remaining()),
                                 prepare_finalists=self._tune_finalists)

    def _remembered(self) -> dict[str, tuple[str, list[Node], list[str]]]:
        """Earlier compiles' fastest winners of this region on this hardware, by candidate key:
        (variant, outputs over this region's inputs, the rules they need)."""
        by_name = {n.attrs["name"]: n for n in self.rep.inputs}
        out = {}
        for variant, program, rules, _ in self.db.winners(self.fingerprint, self.key):
            if variant not in POLICIES:
                continue      # a policy this Kiln no longer has
            outputs = regionlib.rebuild(graph_from_json(program).outputs,
                                        lambda n: by_name.get(n.attrs["name"]) if n.op is Op.INPUT else None)
            digest = hashlib.blake2b(json.dumps(program, sort_keys=True).encode(), digest_size=8).hexdigest()
            out[f"{REMEMBERED}-{digest}"] = (variant, outputs, rules)
        return out

    def _load(self, deadline: Deadline) -> None:
        self.deadline = self.measurer.deadline = deadline
        if self.isolated:
            self.isolated.load(self.region, deadline)

    def lowered_cost(self, deadline: Deadline) -> float | None:
        """The program as lowered (its first policy, always measured), times the region's repeats:
        what this region costs before any search (None where it has no valid time)."""
        self._load(deadline)
        estimate = self.tuner.measure_lowered(deadline)
        return estimate * len(self.group) if estimate is not None else None

    def _end_to_end(self, outputs, variant: str) -> Callable[[], float]:
        """A finalist is what the user may run: the configurations of its kernels are measured
        past the search's deadline, until the region's (in the worker, where a crashing one costs
        only itself; candidates evaluated late had only their default configurations timed), then
        it is built as deployed, and the tuner times it whole in rounds beside the other finalists."""
        self.measurer.deadline = self.share
        self._tune_finalists([(outputs, variant)])
        return self.measurer.end_to_end(outputs, variant)

    def _tune_finalists(self, finalists: list[tuple[list[Node], str]]) -> None:
        """Every configuration of the finalists' kernels measured in the workers, side by side
        where there are several (once per finalist)."""
        if not self.isolated:
            return
        self.isolated.deadline = self.share
        # the tuner keeps a finalist's outputs alive: their ids name it
        fresh = {(variant, *map(id, outputs)): (outputs, variant) for outputs, variant in finalists}
        fresh = [finalist for key, finalist in fresh.items() if key not in self._finalists_tuned]
        # finalists share most of their kernels: the first tunes those, the rest then their own
        for batch in (fresh[:1], fresh[1:]):
            for future in [self.isolated.submit(outputs, variant, finalist=True) for outputs, variant in batch]:
                future.result()
        self._finalists_tuned.update((variant, *map(id, outputs)) for outputs, variant in fresh)

    def run(self, share: Deadline, rules, max_candidates: int, report: GraphReport, choices: dict) -> None:
        """Saturate, search and tune by `share`; records the choice and the report. The search stops
        at SEARCH_SHARE of it; the rest is the finalists' (every configuration of their kernels
        measured, each timed whole)."""
        rep, self.share = self.rep, share
        budget_s = share.remaining()
        deadline = Deadline(budget_s * SEARCH_SHARE)
        t0 = time.monotonic()
        # with no time left (the graphs before overran) no e-graph: its second or more would
        # only lengthen the overrun, and the program as lowered stands
        saturated = (None if deadline.expired else
                     saturate(rep.outputs, rules, Limits(max_seconds=max(1.0, deadline.remaining() / 4))))
        saturate_s = time.monotonic() - t0
        self._load(deadline)
        self.tuner.saturated = saturated
        remembered = self._remembered()
        winner = self.tuner.run(deadline, max_candidates, [(key, variant, outputs)
                                                           for key, (variant, outputs, _) in remembered.items()])
        if winner.key.startswith(REMEMBERED):
            rules_needed, undecided = remembered[winner.key.rsplit("/", 1)[0]][2], []
        else:
            rules_needed, undecided = _rules_used(rep, rules, saturated, winner, share)
        if not winner.key.startswith(ORIGINAL):    # the program as lowered is tried in every compile anyway
            self.db.record_winner(self.fingerprint, self.key, winner.variant, _program_json(winner.outputs),
                                  rules_needed, winner.end_to_end_s, self.compile_id)
        _, program, configs = self.measurer.build(winner.outputs, winner.variant)
        choices[self.key] = Choice(winner.outputs, winner.variant, configs)
        report.kernels_measured += self.measurer.kernels_measured
        report.regions.append(RegionReport(
            self.key, self.label, len(self.group), rep.size, saturated.stages if saturated else [],
            winner.progress, winner.key,
            winner.variant, winner.estimate_s, winner.end_to_end_s, saturate_s,
            time.monotonic() - t0 - saturate_s, self.measurer.kernel_report(program, configs), rules_needed,
            undecided, budget_s, winner.lowered_end_to_end_s, self.tuner.variants[0], winner.finalists))


def _program_json(outputs: list[Node]) -> dict:
    return graph_to_json(Graph(inputs=[], outputs=list(outputs), weights={}, symbols={}))


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
