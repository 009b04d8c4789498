"""Which rewrites a candidate depends on: the rules without which the e-graph no longer holds it.

A candidate is a choice of e-nodes in the saturated e-graph. The e-graph of the same program
saturated with fewer rules holds the candidate when each chosen e-node has a twin there (the same
constructor over the twins of its children, the same literal attributes) and the roots come out
as that e-graph's roots. Starting from the rules that fired, each is left out in turn and kept out
where the candidate is still held without it: what remains is a set of rules the candidate needs,
each one (a minimal set, not always the only one: two rules that each build the same e-node are
interchangeable, and the first tried is dropped)."""
from __future__ import annotations

import random
from typing import Callable

from . import extract
from .adapter import EGraphView, ENode, dump, new_egraph, view
from .extract import Genome
from .rulesets import Ruleset
from .saturate import Limits, Saturated, saturate


def _literal_key(graph: EGraphView, cid: str, terms: Callable[[str], object], memo: dict) -> object:
    """An attribute class (a number, a text, a shape) by its structure, Term classes inside it (a
    Concat's list) by `terms`; analysis facts that may share the class are not part of it."""
    if cid in memo:
        return memo[cid]
    cls = graph.classes[cid]
    if cls.type == "Term":
        return terms(cid)
    memo[cid] = key = frozenset(
        (n.op, tuple(_literal_key(graph, k, terms, memo) for k in n.children)) for n in cls.nodes
        if n.op == "vec-of" or not any(graph.classes[k].type == "Term" for k in n.children))
    return key


def _twins(graph: EGraphView, chosen: EGraphView, choice: dict[str, ENode]) -> dict[str, tuple[str, int] | None]:
    """For each class of `chosen` the candidate reaches: the class of `graph` holding the twin of
    its chosen e-node and that e-node's index there (None where `graph` holds no twin)."""
    index: dict[tuple, tuple[str, int]] = {}
    memo: dict = {}
    for cls in graph.term_classes:
        for i, n in enumerate(cls.nodes):
            index[(n.op, tuple(_literal_key(graph, k, lambda c: c, memo) for k in n.children))] = cls.id, i
    twin: dict[str, tuple[str, int] | None] = {}
    memo_chosen: dict = {}
    stack = list(chosen.roots)
    while stack:        # children first (iterative: programs are deep)
        top = stack[-1]
        if top in twin:
            stack.pop()
            continue
        kids = [k for k in choice[top].children if chosen.classes[k].type == "Term" and k not in twin]
        kids += [t for k in choice[top].children if chosen.classes[k].type != "Term"
                 for t in _terms_inside(chosen, k) if t not in twin]
        if kids:
            stack.extend(kids)
            continue
        stack.pop()
        n = choice[top]
        if any(twin.get(t) is None for t in _terms_below(chosen, n)):
            twin[top] = None
            continue
        key = (n.op, tuple(_literal_key(chosen, k, lambda c: twin[c][0], memo_chosen) for k in n.children))
        twin[top] = index.get(key)
    return twin


def holds(graph: EGraphView, chosen: EGraphView, choice: dict[str, ENode]) -> bool:
    """Whether `graph` holds the candidate `choice` makes of `chosen`'s e-classes, with the same
    roots."""
    twin = _twins(graph, chosen, choice)
    return all(twin[r] is not None and twin[r][0] == g for r, g in zip(chosen.roots, graph.roots))


def lowered_genome(saturated: Saturated, rng: random.Random) -> Genome:
    """The program as lowered, as a choice in its saturated e-graph (which holds it: an e-graph
    only grows): each class it reaches gets the e-node it was encoded as. Where rewrites merged two
    of its classes (`x` and `x * 1`), the walk keeps one of their e-nodes, repairing any cycle."""
    plain = view(saturated.encoded, dump(new_egraph(saturated.encoded)))
    twin = _twins(saturated.graph, plain, {c.id: c.nodes[0] for c in plain.term_classes})
    s = extract.space(saturated.graph)
    position = {cid: k for k, cid in enumerate(s.class_ids)}
    prefer = [-1] * len(s.class_ids)
    for found in twin.values():
        if found is not None:
            prefer[position[found[0]]] = found[1]
    return extract.draw(saturated.graph, rng, prefer)


def _terms_inside(graph: EGraphView, cid: str) -> list[str]:
    """Term classes inside an attribute class (a Concat's Vec[Term])."""
    cls = graph.classes[cid]
    return [k for n in cls.nodes if n.op == "vec-of" for k in n.children if graph.classes[k].type == "Term"]


def _terms_below(graph: EGraphView, n: ENode) -> list[str]:
    out = []
    for k in n.children:
        out += [k] if graph.classes[k].type == "Term" else _terms_inside(graph, k)
    return out


def rules_used(outputs, rulesets: list[Ruleset], fired: list[str], chosen: EGraphView,
               choice: dict[str, ENode], limits: Limits, stop: Callable[[], bool] = lambda: False
               ) -> tuple[list[str], list[str]]:
    """(the rules among `fired` the candidate needs, those not decided before `stop` said so)."""
    needed, out = [], set()
    pending = sorted(fired)
    while pending:
        if stop():
            return needed, pending
        name = pending.pop(0)
        trial = out | {name}
        fewer = [Ruleset(rs.topic, rs.stage, [r for r in rs.rules if r.full_name not in trial])
                 for rs in rulesets]
        if holds(saturate(outputs, fewer, limits).graph, chosen, choice):
            out = trial
        else:
            needed.append(name)
    return needed, []
