"""Staged equality saturation with limits, guarded in a child process.

Stages run in order (analysis rules run to saturation before every iteration of every stage).
After each iteration the e-node count, the iteration count and the stage's wall time are checked
against the limits. The e-graph lives in a child process: an egglog abort or running out of memory
(the child's address space is capped) ends that stage with the e-graph the previous stage
reached, and the report says so, instead of taking the compile down; so does a child silent far
past its stage's limit (hung), which prints its Python stack before it is killed.

The child is forked from a fresh server process, never from the caller: egglog's thread pool
(rayon) is process-wide, and a child forked from a caller that had used egglog inherits the pool
without its threads, so the first parallel step or e-graph freed there waits forever. The
program crosses as graph JSON and the rules as (source, name), loaded again in the child.
"""
from __future__ import annotations

import faulthandler
import json
import multiprocessing
import resource
import time
from dataclasses import dataclass, field

from egglog import EGraph, ruleset

from ..ir import Graph, KilnError
from ..ir.serialize import graph_from_json, graph_to_json
from ..rewrites.registry import Ruleset, find
from .adapter import EGraphView, Encoded, dump, encode, new_egraph, view
from .language import CONSTRUCTORS

@dataclass(frozen=True)
class Limits:
    max_enodes: int = 500_000
    max_iterations: int = 12
    max_seconds: float = 60.0          # per stage
    memory_bytes: int = 8 << 30        # the child's address space
    slack_seconds: float = 30.0        # past twice max_seconds, a silent child is taken for hung

    @property
    def patience(self) -> float:
        """A stage reports within its time limit plus one iteration; a child silent longer is hung."""
        return self.max_seconds * 2 + self.slack_seconds


@dataclass
class StageReport:
    stage: str
    iterations: int = 0
    enodes: int = 0
    eclasses: int = 0
    seconds: float = 0.0
    stop: str = "saturated"            # saturated | node limit | iteration limit | time limit | crashed: ...
    matches: dict[str, int] = field(default_factory=dict)


@dataclass
class Saturated:
    encoded: Encoded
    graph: EGraphView
    stages: list[StageReport]


_TERM_CONSTRUCTORS = set(CONSTRUCTORS.values())  # egglog functions compare and hash by reference


def _enode_count(egraph: EGraph) -> int:
    return sum(size for fn, size in egraph.all_function_sizes() if fn in _TERM_CONSTRUCTORS)


def _run_stages(enc: Encoded, stages: list[tuple[str, list]], analysis: list, limits: Limits, send) -> None:
    egraph = new_egraph(enc)
    analyses = ruleset(*(r.egg for r in analysis), name="analysis") if analysis else None
    for stage, rules in stages:
        report = StageReport(stage)
        rules_now = ruleset(*(r.egg for r in rules), name=f"stage-{stage}") if rules else None
        if analyses is not None:
            schedule = analyses.saturate() + rules_now if rules_now is not None else analyses.saturate()
        else:
            schedule = rules_now
        if schedule is None:
            send(("stage", report, dump(egraph)))
            continue
        start = time.perf_counter()
        while True:
            run = egraph.run(schedule)
            report.iterations += 1
            for decl, n in run.num_matches_per_rule.items():
                name = getattr(decl, "name", None) or str(decl)
                report.matches[name] = report.matches.get(name, 0) + n
            report.enodes = _enode_count(egraph)
            report.seconds = time.perf_counter() - start
            if not run.updated:
                report.stop = "saturated"
            elif report.enodes > limits.max_enodes:
                report.stop = "node limit"
            elif report.iterations >= limits.max_iterations:
                report.stop = "iteration limit"
            elif report.seconds > limits.max_seconds:
                report.stop = "time limit"
            else:
                continue
            break
        send(("stage", report, dump(egraph)))


def _child(conn, program: dict, ops: list[str], stage_refs: list, analysis_refs: list,
           limits: Limits) -> None:
    # an abort here is expected and reported by the parent; no Python crash dump on stderr
    faulthandler.disable()
    # but a hang shows its stack on stderr before the parent's patience runs out and kills it
    watchdog = lambda: faulthandler.dump_traceback_later(max(1.0, limits.patience - 2))

    def send(message) -> None:
        conn.send(message)
        watchdog()

    watchdog()
    resource.setrlimit(resource.RLIMIT_AS, (limits.memory_bytes, limits.memory_bytes))
    try:
        enc = encode(graph_from_json(program).outputs)
        if [n.op.value for n in enc.order] != ops:  # the parent reads the dump by let names
            raise RuntimeError("the program read back in the e-graph process differs from the caller's")
        stages = [(stage, [find(*ref) for ref in refs]) for stage, refs in stage_refs]
        _run_stages(enc, stages, [find(*ref) for ref in analysis_refs], limits, send)
        conn.send(("done", None, None))
    except Exception as err:  # egglog raises its own error types; report any, the parent decides
        conn.send(("error", f"{type(err).__name__}: {err}", None))
    finally:
        conn.close()


def _plan(rulesets: list[Ruleset]) -> tuple[list[tuple[str, list]], list]:
    from ..rewrites.registry import STAGES
    analysis = [r for rs in rulesets if rs.stage == "analysis" for r in rs.rules]
    stages = [(stage, [r for rs in rulesets if rs.stage == stage for r in rs.rules])
              for stage in STAGES if stage != "analysis"]
    stages = [(s, rules) for s, rules in stages if rules]
    # analysis rules alone (a check of the analysis ruleset) still run, as a stage of their own
    return stages or ([("analysis", [])] if analysis else []), analysis


def saturate(outputs, rulesets: list[Ruleset], limits: Limits = Limits(), isolate: bool = True) -> Saturated:
    """Grow the program below `outputs` with the rulesets, stage by stage, within the limits."""
    enc = encode(outputs)
    stages, analysis = _plan(rulesets)
    reports: list[StageReport] = []
    last_dump = None
    if not isolate:
        messages: list = []
        _run_stages(enc, stages, analysis, limits, messages.append)
        for _, report, dumped in messages:
            report.eclasses = _term_classes(dumped)
            reports.append(report)
            last_dump = dumped
    else:
        last_dump = _saturate_in_child(enc, stages, analysis, limits, reports)
    if last_dump is None:  # nothing finished: the unsaturated program itself
        last_dump = dump(new_egraph(enc))
    return Saturated(enc, view(enc, last_dump), reports)


def _ref(rule) -> tuple[str, str]:
    if not rule.source:
        raise KilnError(f"kiln: rule {rule.full_name} has no source; take rules from the library or "
                        "a rule file (rewrites.registry) so that the e-graph's process can load them")
    return rule.source, rule.full_name


def _context():
    from ..rewrites.registry import modules
    context = multiprocessing.get_context("forkserver")
    # the server imports egglog and the rules once; each child forks from it
    context.set_forkserver_preload([__name__, *modules()])
    return context


def _saturate_in_child(enc, stages, analysis, limits, reports) -> str | None:
    """Saturate in a child; the e-graph the last finished stage reached."""
    context = _context()
    parent, child = context.Pipe(duplex=False)
    args = (child, graph_to_json(Graph(inputs=[], outputs=list(enc.outputs))),
            [n.op.value for n in enc.order], [(stage, [_ref(r) for r in rules]) for stage, rules in stages],
            [_ref(r) for r in analysis], limits)
    proc = context.Process(target=_child, args=args, daemon=True)
    proc.start()
    child.close()
    last_dump, hung = None, False
    while True:
        try:
            if not parent.poll(limits.patience):
                proc.kill()
                hung = True
                raise EOFError
            kind, report, dumped = parent.recv()
        except EOFError:  # the child died mid-stage (an egglog abort or out of memory), or hung
            proc.join()
            kind = "error"
            if hung:
                report = f"the e-graph process hung (no report in {limits.patience:.0f} s; killed)"
            elif not reports and proc.exitcode == 1:  # Python failed before the child's own code
                raise KilnError(
                    "kiln: the e-graph process failed to start (its error is on stderr). Most often: "
                    "multiprocessing runs the main script again in it, so a script that calls Kiln "
                    "must guard its entry point with `if __name__ == \"__main__\":`")
            else:
                report = f"the e-graph process died (exit code {proc.exitcode})"
        if kind == "stage":
            report.eclasses = _term_classes(dumped)
            reports.append(report)
            last_dump = dumped
            continue
        if kind == "error":
            done = {r.stage for r in reports}
            stage = next((s for s, _ in stages if s not in done), "?")
            reports.append(StageReport(stage, stop=f"crashed: {report}; kept the e-graph before it"))
        proc.join()
        return last_dump


def _term_classes(dumped: str) -> int:
    return sum(1 for c in json.loads(dumped)["class_data"].values() if c["type"] == "Term")
