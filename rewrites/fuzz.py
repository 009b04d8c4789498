"""The soundness fuzzer: random small programs, saturated with the rules under test, and every
e-node of every e-class evaluated with numpy; two members of one e-class that disagree (in value,
shape or dtype) convict the rule that put them together, and a rule that never fires is reported
too, since a rule the fuzzer cannot reach is a rule it has not checked.

How a program is checked: class values are computed bottom-up (a class's value comes from any
member whose children already have values), then every member of every class is evaluated by the
op table from its children's class values and compared with the class's value, with a tolerance
for the dtype, NaN where NaN, infinities exact. Analysis facts are checked the same way: a class
whose `const_value` is v must hold v everywhere. A finite-only rule (a reassociated product, which
may overflow in one order only) is held to its contract: where a program's members disagree only
with it among the rules, and agree wherever both sides are finite, the rule is not convicted. The culprit is found by re-saturating the failing
program with fewer rules until each one left is needed; the counterexample is then shrunk to the
smallest part of the program that still shows the disagreement.
"""
from __future__ import annotations

import json
import time
import warnings
from dataclasses import dataclass, field

import numpy as np

from ..ir import DType, KilnTypeError, Node, Op, ShapeError, toposort
from ..ir.ops import OPS, EvalCtx
from ..ir.symbolic import Expr, fmt_shape
from ..search.adapter import Decoder, EClass, ENode
from ..search.dsl import Rule
from ..search.saturate import Limits, Saturated, saturate
from .fuzz_programs import SYMBOLS, Draw, Program, describe, draw_inputs, held_constants, random_program
from ..search.rulesets import Ruleset
from .registry import library

LIMITS = Limits(max_enodes=3000, max_iterations=8, max_seconds=5.0)
# Sound rewrites of floats may round differently (x * 2 -> x + x is exact, (a + b) + c -> a + (b + c)
# is not): values agree within RTOL of the larger, plus a few EPS of the largest operand of a sum.
RTOL = {DType.F32: 1e-5, DType.F16: 4e-3, DType.BF16: 3e-2}
EPS = {DType.F32: 2.0 ** -23, DType.F16: 2.0 ** -10, DType.BF16: 2.0 ** -7}
WELL_CHECKED = 3   # past the first `programs`, keep drawing while a rule fired in fewer programs
_CANCELLING = {Op.ADD, Op.SUM_REDUCE}   # their rounding error scales with the operands, not the sum


@dataclass
class Issue:
    """Two members of one e-class that disagree, or a member that cannot be built or run."""
    kind: str            # values differ | shape or dtype differs | does not build | raises | analysis
    eclass: str
    first: str           # the member the class's value came from
    second: str          # the member that disagrees with it
    detail: str
    draw: int | None = None
    size: int = 0        # nodes below the class (smaller issues make better counterexamples)


@dataclass
class Unsound:
    rule: Rule | None    # None: the disagreement could not be pinned on one rule
    enablers: list[str]  # rules that had to run before it
    program: Program     # the smallest program found that shows it
    issue: Issue
    draw: Draw | None

    def format(self) -> str:
        name = f"{self.rule.full_name} ({self.rule.why})" if self.rule else "no single rule"
        lines = [f"UNSOUND {name}"]
        if self.enablers:
            lines.append(f"  (after {', '.join(self.enablers)})")
        where = f" in e-class {self.issue.eclass}" if self.issue.eclass else ""
        lines.append(f"  {self.issue.kind}{where}:")
        lines += [f"    {member}" for member in (self.issue.first, self.issue.second) if member]
        lines += ["    " + line for line in self.issue.detail.splitlines()]
        lines.append("  smallest program that shows it:")
        lines += ["    " + line for line in self.program.text().splitlines()]
        if self.draw is not None:
            lines.append(f"  on the inputs (draw {self.issue.draw}):")
            lines += ["  " + line for line in describe(self.draw, self.program).splitlines()]
        return "\n".join(lines)


@dataclass
class FuzzReport:
    rules: list[Rule]
    programs: int = 0
    draws: int = 0
    enodes: int = 0                      # e-node evaluations (one per member per draw)
    seconds: float = 0.0
    fired: dict[str, int] = field(default_factory=dict)      # rule -> matches over all programs
    fired_in: dict[str, int] = field(default_factory=dict)   # rule -> programs it matched in
    unsound: list[Unsound] = field(default_factory=list)

    @property
    def never_fired(self) -> list[Rule]:
        return [r for r in self.rules if not self.fired.get(r.full_name)]

    @property
    def ok(self) -> bool:
        return not self.unsound and not self.never_fired

    def summary(self) -> str:
        topics = sorted({r.topic for r in self.rules})
        return (f"{len(self.rules)} rules ({', '.join(topics)}) on {self.programs} programs x "
                f"{self.draws} draws: {self.enodes:,} e-node evaluations, {len(self.unsound)} unsound, "
                f"{len(self.never_fired)} never fired ({self.seconds:.1f} s)")

    def format(self) -> str:
        parts = [u.format() for u in self.unsound]
        for rule in self.never_fired:
            parts.append(f"NEVER FIRED {rule.full_name} ({rule.why}): it matched nothing in "
                         f"{self.programs} random programs, so it is unchecked; bias the generator in "
                         "rewrites/fuzz_programs.py toward its pattern, or fix the pattern")
        parts.append(self.summary())
        return "\n\n".join(parts)


# --- evaluating an e-graph ---------------------------------------------------------------------
class _Evaluation:
    """Class values of one saturated program for each draw, and the members that disagree."""

    def __init__(self, sat: Saturated, draws: list[Draw], finite_only: bool = False):
        self.sat, self.draws, self.dec = sat, draws, Decoder(sat.encoded, sat.graph)
        self.finite_only = finite_only      # compare only elements finite on both sides
        self.classes = sat.graph.term_classes
        self.kids = {n.id: self.dec.term_children(n) for c in self.classes for n in c.nodes}
        self.rep: dict[str, Node] = {}        # class -> the IR node its value came from
        self.source: dict[str, ENode] = {}    # class -> the member that node was built from
        self.values: list[dict[str, np.ndarray]] = [{} for _ in draws]
        self.issues: list[Issue] = []
        self.broken: set[str] = set()         # members that cannot be built or run
        self.evaluated = 0

    def ready(self, enode: ENode) -> bool:
        return enode.id not in self.broken and all(k in self.rep for k in self.kids[enode.id])

    def args(self, enode: ENode, draw: int) -> list[np.ndarray]:
        return [self.values[draw][k] for k in self.kids[enode.id]]

    def class_values(self) -> None:
        """Bottom-up to a fixpoint (the e-graph may have cycles): any ready member gives its class
        a value."""
        pending = list(self.classes)
        while pending:
            waiting = [cls for cls in pending if not self._give_value(cls)]
            if len(waiting) == len(pending):
                return
            pending = waiting

    def _give_value(self, cls: EClass) -> bool:
        for enode in filter(self.ready, cls.nodes):
            try:
                node = self.dec.node(enode, self.rep)
                out = [_run(node, self.args(enode, i), d) for i, d in enumerate(self.draws)]
            except Exception as err:  # a member that cannot be built or run convicts a rule
                self.broken.add(enode.id)
                self.issues.append(self._broken(cls, enode, err))
                continue
            self.rep[cls.id], self.source[cls.id] = node, enode
            for values, value in zip(self.values, out):
                values[cls.id] = value
            self.evaluated += len(self.draws)
            return True
        return False

    def compare_members(self) -> None:
        sizes = {cid: len(toposort([node])) for cid, node in self.rep.items()}
        for cls in self.classes:
            for enode in cls.nodes:
                if cls.id in self.rep and enode is not self.source[cls.id] and self.ready(enode):
                    issue = self._compare(cls, enode)
                    if issue is not None:
                        issue.size = sizes[cls.id]
                        self.issues.append(issue)
        self.issues += _check_const_values(self.sat, self.rep, self.values, sizes)

    def _compare(self, cls: EClass, enode: ENode) -> Issue | None:
        ref, source = self.rep[cls.id], self.source[cls.id]
        try:
            node = self.dec.node(enode, self.rep)
        except (ShapeError, KilnTypeError) as err:
            return self._broken(cls, enode, err)
        if node.shape != ref.shape or node.dtype is not ref.dtype:
            return Issue("shape or dtype differs", cls.id, _show(ref), _show(node),
                         f"{ref.dtype!r}{fmt_shape(ref.shape)} vs {node.dtype!r}{fmt_shape(node.shape)}")
        for i, draw in enumerate(self.draws):
            self.evaluated += 1
            try:
                out = _run(node, self.args(enode, i), draw)
            except Exception as err:  # numpy's errors (a bad index) are not Kiln's types
                return Issue("raises", cls.id, _show(ref), _show(node), f"{type(err).__name__}: {err}", i)
            # rounding in a sum scales with its operands, not with the sum
            sums = node.op in _CANCELLING or ref.op in _CANCELLING
            operands = self.args(enode, i) + self.args(source, i) if sums else []
            why = _differs(self.values[i][cls.id], out, ref.dtype, operands, self.finite_only)
            if why:
                return Issue("values differ", cls.id, f"{_show(ref)} = {_brief(self.values[i][cls.id])}",
                             f"{_show(node)} = {_brief(out)}", why, i)
        return None

    def _broken(self, cls: EClass, enode: ENode, err: Exception) -> Issue:
        inputs = ", ".join(_show(self.rep[k]) for k in self.kids[enode.id])
        first = _show(self.rep[cls.id]) if cls.id in self.rep else "(no other member has a value)"
        kind = "does not build" if isinstance(err, (ShapeError, KilnTypeError)) else "raises"
        return Issue(kind, cls.id, first, f"{enode.op}({inputs})", f"{type(err).__name__}: {err}")


def evaluate_egraph(sat: Saturated, draws: list[Draw], finite_only: bool = False) -> tuple[list[Issue], int]:
    """Every member of every e-class, evaluated from its children's class values, per draw:
    the issues found and the number of e-node evaluations."""
    ev = _Evaluation(sat, draws, finite_only)
    ev.class_values()
    ev.compare_members()
    return ev.issues, ev.evaluated


def _run(node: Node, args: list[np.ndarray], draw: Draw) -> np.ndarray:
    if node.op is Op.INPUT:
        return draw.feeds[node.attrs["name"]]
    shape = tuple(d.evaluate(draw.env) for d in node.shape)
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        out = np.asarray(OPS[node.op].evaluate(EvalCtx(node.attrs, shape, node.dtype, draw.env), *args))
    if out.shape != shape or out.dtype != node.dtype.np:
        raise ShapeError(f"evaluated to {out.dtype}{list(out.shape)}, expected {node.dtype!r}{list(shape)}")
    return out


def _differs(a: np.ndarray, b: np.ndarray, dtype: DType, operands: list[np.ndarray],
             finite_only: bool = False) -> str:
    """Why a and b are not the same value ('' when they are), NaN-aware; `finite_only`: on the
    elements finite in both."""
    if a.shape != b.shape:
        return f"shapes {a.shape} and {b.shape}"
    if not dtype.is_float:
        bad = a != b
    else:
        x, y = a.astype(np.float64), b.astype(np.float64)
        finite = np.isfinite(x) & np.isfinite(y)
        scale = max([np.abs(v[np.isfinite(v)]).max(initial=0.0) for v in
                     (x, y, *(o.astype(np.float64) for o in operands if o.dtype.kind == "f"))])
        with np.errstate(invalid="ignore"):
            close = np.abs(x - y) <= RTOL[dtype] * np.maximum(np.abs(x), np.abs(y)) + 4 * EPS[dtype] * scale
        bad = np.where(finite, ~close, False if finite_only else ~((x == y) | (np.isnan(x) & np.isnan(y))))
    if not bad.any():
        return ""
    where = tuple(int(i) for i in np.argwhere(bad)[0])
    return (f"at index {where}: {a[where].item()!r} vs {b[where].item()!r} "
            f"({int(bad.sum())} of {bad.size} elements differ)")


def _check_const_values(sat: Saturated, rep, values, sizes) -> list[Issue]:
    """The const_value analysis says every element of a class is v: check it on the values."""
    issues = []
    for cls in sat.graph.classes.values():
        literal = next((n.op for n in cls.nodes if n.id.startswith("primitive-")), None)
        for enode in cls.nodes:
            if enode.op != "const_value" or enode.children[0] not in rep or literal is None:
                continue
            term = enode.children[0]
            text = json.loads(literal)
            for i, v in enumerate(values):
                expected = np.full(v[term].shape, _number(text)).astype(v[term].dtype)
                why = _differs(expected, v[term], rep[term].dtype, [])
                if why:
                    issues.append(Issue("analysis", term, f"const_value = {text}",
                                        f"{_show(rep[term])} = {_brief(v[term])}", why, i, sizes[term]))
                    break
    return issues


def _number(text: str):
    return text == "True" if text in ("True", "False") else float(text)


def _show(node: Node, depth: int = 3) -> str:
    """A term as one line: inputs by name, constants by value, deep subterms elided."""
    if node.op is Op.INPUT:
        return node.attrs["name"]
    if node.op is Op.CONSTANT:
        return repr(node.attrs["value"])
    if node.op in (Op.RESHAPE, Op.EXPAND) and _const(node) is not None:
        return f"{_const(node)!r}{fmt_shape(node.shape)}"
    if depth == 0:
        return "..."
    attrs = [f"{k}={_attr(v)}" for k, v in node.attrs.items() if k != "dtype" or node.op is Op.CAST]
    return f"{node.op.value}({', '.join([_show(i, depth - 1) for i in node.inputs] + attrs)})"


def _const(node: Node):
    while node.op in (Op.RESHAPE, Op.EXPAND):
        node = node.inputs[0]
    return node.attrs["value"] if node.op is Op.CONSTANT else None


def _attr(value) -> str:
    if isinstance(value, tuple):
        return "(" + ", ".join(map(_attr, value)) + ")"
    return str(value) if isinstance(value, Expr) else repr(value)


def _brief(value: np.ndarray) -> str:
    return np.array2string(value, precision=5, threshold=8, edgeitems=2, separator=", ").replace("\n", "")


# --- checking rules ----------------------------------------------------------------------------
def _rulesets(rules: list[tuple[str, Rule]]) -> list[Ruleset]:
    by_stage: dict[str, list[Rule]] = {}
    for stage, rule in rules:
        by_stage.setdefault(stage, []).append(rule)
    return [Ruleset(f"fuzz-{stage}", stage, rs) for stage, rs in by_stage.items()]


def _try_program(program: Program, rules, draws: list[Draw],
                 finite_only: bool = False) -> tuple[Saturated | None, list[Issue], int]:
    """Saturate and evaluate; a saturation that egglog refuses (an illegal merge of an analysis
    without merge function: two values for one class) is itself an issue."""
    try:
        sat = saturate(program.outputs, _rulesets(rules), LIMITS, isolate=False)
    except Exception as err:  # egglog raises its own error types
        return None, [Issue("saturation fails", "", "", "", f"{type(err).__name__}: {err}")], 0
    issues, n = evaluate_egraph(sat, draws, finite_only)
    return sat, issues, n


def _within_contract(program: Program, base, active, draws: list[Draw]) -> bool:
    """Whether `program`'s issues are a finite-only rule's, within its contract: gone without the
    finite-only rules (every other rule stays checked on every value, infinities and NaN
    included), and with them wherever both sides of each comparison are finite."""
    plain = [r for r in active if not r[1].finite_only]
    return (len(plain) < len(active) and not _try_program(program, base + plain, draws)[1]
            and not _try_program(program, base + active, draws, finite_only=True)[1])


def _blame(program: Program, base, tested, draws) -> tuple[tuple[str, Rule] | None, list]:
    """The rule to blame for `program`'s issue, and the rules that reproduce it (culprit last).

    The rules are first cut down to a set where each one is needed (dropping any one makes the
    issue go away). In that set, a false analysis fact is blamed on an analysis rule and a
    disagreement between members on a rewrite; rules under test before the library's analysis
    rules, and the last such rule before earlier ones (which are then the rules it needed)."""
    fails = lambda rules: _try_program(program, rules, draws)[1]
    rules = base + tested
    for rule in reversed(base + tested):
        fewer = [r for r in rules if r is not rule]
        if fails(fewer):
            rules = fewer
    issues = fails(rules)
    if not issues:  # not reproducible (a time limit, say)
        return None, base + tested
    facts_only = all(i.kind == "analysis" for i in issues)
    suspects = [r for r in rules if (r[0] == "analysis") == facts_only] or rules
    suspects = [r for r in suspects if any(r is t for t in tested)] or suspects
    culprit = suspects[-1]
    return culprit, [r for r in rules if r is not culprit] + [culprit]


def _shrink(program: Program, rules, draws: list[Draw]) -> tuple[Program, list[Draw], Issue]:
    """The smallest counterexample found: the smallest term of the program that still fails as
    the only output, then its subterms cut into fresh inputs (holding the same values) while it
    still fails (constants stay: the rules under test match on them), then on fresh inputs with
    the symbols at their smallest values if those still show it."""
    part = None
    for node in sorted(toposort(program.outputs), key=lambda n: len(toposort([n]))):
        if node.op is not Op.INPUT and _try_program(program.restricted([node]), rules, draws)[1]:
            part = program.restricted([node])
            break
    part = part or program
    for node in reversed(toposort(part.outputs)[:-1]):  # nearest the root first
        if node.op in (Op.INPUT, Op.CONSTANT) or _const(node) is not None:
            continue
        if all(n is not node for n in toposort(part.outputs)):
            continue  # already cut away with a term above it
        smaller, smaller_draws = part.cut(node, draws)
        if _try_program(smaller, rules, smaller_draws)[1]:
            part, draws = smaller, smaller_draws
    issue = min(_try_program(part, rules, draws)[1], key=lambda i: i.size)
    if issue.kind in ("values differ", "analysis"):  # fresh inputs at the smallest symbol values
        rng, lowest = np.random.default_rng(0), {s: lo for s, (lo, _) in SYMBOLS.items()}
        for kind in (0, 0, 1, 1, 2, 2):
            draw = draw_inputs(part, rng, kind, env=lowest)
            found = [i for i in _try_program(part, rules, [draw])[1] if i.kind == issue.kind]
            if found:
                return part, [draw], min(found, key=lambda i: i.size)
    return part, draws, issue


def _tally(report: FuzzReport, sat: Saturated | None) -> None:
    matches: dict[str, int] = {}
    for stage in sat.stages if sat else []:
        for name, count in stage.matches.items():
            matches[name] = matches.get(name, 0) + count
    for name, count in matches.items():
        report.fired[name] = report.fired.get(name, 0) + count
        report.fired_in[name] = report.fired_in.get(name, 0) + (count > 0)


def check(rulesets: list[Ruleset], programs: int = 200, draws: int = 3, seed: int = 0,
          extra: int = 3) -> FuzzReport:
    """Fuzz the rules of `rulesets` (with the library's analysis rules) on `programs` random
    programs, and on up to `extra` times as many more while some rule has fired in fewer than
    WELL_CHECKED of them."""
    start = time.perf_counter()
    rulesets = list(rulesets)
    tested = [(rs.stage, r) for rs in sorted(rulesets, key=lambda rs: rs.stage != "analysis")
              for r in rs.rules]
    topics = {rs.topic for rs in rulesets}
    base = [(rs.stage, r) for rs in library().values() if rs.stage == "analysis" and rs.topic not in topics
            for r in rs.rules]
    report = FuzzReport([r for _, r in tested], draws=draws)
    active = list(tested)
    rng = np.random.default_rng(seed)
    hints = held_constants(r for _, r in tested)
    for index in range(programs * (1 + extra)):
        if index >= programs and all(report.fired_in.get(r.full_name, 0) >= WELL_CHECKED
                                     for _, r in active):
            break
        report.programs += 1
        program = random_program(rng, hints)
        run = [draw_inputs(program, rng, k % 3) for k in range(draws)]
        sat, issues, n = _try_program(program, base + active, run)
        report.enodes += n
        _tally(report, sat)
        if not issues or _within_contract(program, base, active, run):
            continue
        culprit, rules = _blame(program, base, active, run)
        small, run, issue = _shrink(program, rules, run)
        enablers = [r.full_name for stage, r in rules[:-1] if stage != "analysis"] if culprit else []
        report.unsound.append(Unsound(culprit[1] if culprit else None, enablers, small, issue,
                                      run[issue.draw] if issue.draw is not None else None))
        if culprit is None:
            break  # nothing to take out; more programs would repeat the same report
        # keep looking for other unsound rules without it
        active, base = ([r for r in rules if r is not culprit] for rules in (active, base))
    report.seconds = time.perf_counter() - start
    return report
