"""Staged equality saturation with limits, guarded in a child process.

Stages run in order (analysis rules run to saturation before every iteration of every stage).
After each iteration the e-node count, the iteration count and the stage's wall time are checked
against the limits. The e-graph lives in a child process: an egglog abort or running out of memory
(the child's address space is capped) ends that stage with the e-graph the previous stage
reached, and the report says so, instead of taking the compile down; so does a child silent far
past its stage's limit (hung), which prints its Python stack before it is killed.

The child is a fresh interpreter (`egraph_process`), never a fork: egglog's thread pool (rayon)
is process-wide, and a child forked from a caller that had used egglog inherits the pool without
its threads, so the first parallel step or e-graph freed there waits forever; and a forkserver or
spawn start runs the caller's main script again in the child, which breaks a plain script
without an `if __name__ == "__main__":` guard. The program crosses as graph JSON and the rules as
(source, name), loaded again in the child; reports and e-graph dumps come back as JSON lines.
One child serves saturation after saturation (its start-up, a second of imports, is paid once)
and is replaced after it crashed or hung.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field

from egglog import EGraph, ruleset

from ..ir import Graph, KilnError
from ..ir.serialize import graph_to_json
from .rulesets import Ruleset
from . import egraph_process
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
    """Saturate stage by stage; `send(report, dump)` after each stage (the child's next line)."""
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
            send(report, dump(egraph))
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
        send(report, dump(egraph))


def _plan(rulesets: list[Ruleset]) -> tuple[list[tuple[str, list]], list]:
    from .rulesets import STAGES
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
        _run_stages(enc, stages, analysis, limits, lambda report, dumped: messages.append((report, dumped)))
        for report, dumped in messages:
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


def _saturate_in_child(enc, stages, analysis, limits, reports) -> str | None:
    """Saturate in the e-graph process; the e-graph the last finished stage reached."""
    request = {"program": graph_to_json(Graph(inputs=[], outputs=list(enc.outputs))),
               "ops": [n.op.value for n in enc.order],
               "stages": [(stage, [_ref(r) for r in rules]) for stage, rules in stages],
               "analysis": [_ref(r) for r in analysis], "limits": asdict(limits)}
    last_dump, failure = None, None
    with egraph_process.lease(limits.memory_bytes) as child:
        message = child.receive(limits.patience) if child.send(request) else None
        while isinstance(message, dict) and "stage" in message:
            report = StageReport(**message["stage"])
            report.eclasses = _term_classes(message["dump"])
            reports.append(report)
            last_dump = message["dump"]
            message = child.receive(limits.patience)
        if message is egraph_process.SILENT:
            child.exit_text()  # kills it
            failure = f"the e-graph process hung (no report in {limits.patience:.0f} s; killed)"
        elif message is None:  # the child died mid-stage (an egglog abort or out of memory)
            failure = f"the e-graph process died ({child.exit_text()})"
        elif "error" in message:
            failure = message["error"]
        else:
            child.done(message["address_space"])
    if failure is not None:
        done = {r.stage for r in reports}
        stage = next((s for s, _ in stages if s not in done), "?")
        reports.append(StageReport(stage, stop=f"crashed: {failure}; kept the e-graph before it"))
    return last_dump


def _term_classes(dumped: str) -> int:
    return sum(1 for c in json.loads(dumped)["class_data"].values() if c["type"] == "Term")
