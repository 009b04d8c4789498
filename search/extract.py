"""Candidate programs out of a saturated e-graph: one e-node per reachable Term e-class, acyclic.

A candidate is a *genome*: for every Term e-class (in `ChoiceSpace` order) the index of its chosen
e-node, -1 where the chosen program does not reach the class. Genomes are normalized to the
reachable classes, so a genome is exactly "the choice restricted to the classes the program uses",
and candidates are deduplicated by it (`Candidate.key` hashes it). That is the same as
deduplicating the rebuilt programs: in a congruence-closed e-graph every term lives in exactly one
e-class and every e-node is unique, so two choices that differ on a reachable class spell different
terms there, and the programs differ. The tests check this on the rebuilt IR as well.

Drawing is a depth-first walk from the roots (iterative: transformer graphs are thousands of classes
deep). Each class tries its e-nodes starting from a uniformly random one (or a preferred one, when
repairing a mutated genome); an e-node whose subtree reaches a class on the current path would close
a cycle (`x * 1 = x` puts `Mul(x, 1)` in x's own class), so the walk backtracks to the next e-node.
Classes finished during a failed attempt stay valid: their subtrees avoid every class on the path.
Walks are capped; past the cap the draw restarts, and the last resort prefers each class's
least-height e-node, which never closes a cycle (heights strictly fall along such a walk).
"""
from __future__ import annotations

import hashlib
import heapq
import math
import random
import time
import weakref
from array import array
from dataclasses import dataclass
from typing import Sequence

from ..ir import Node
from .adapter import Decoder, EGraphView, ENode, Encoded, term_children

Genome = tuple[int, ...]
_UNSEEN, _ON_PATH, _DONE = 0, 1, 2
_RESTARTS = 3


@dataclass(frozen=True)
class Candidate:
    genome: Genome
    key: str            # 16 hex digits of the genome: the structural hash of the chosen program

    @classmethod
    def of(cls, genome: Genome) -> Candidate:
        digest = hashlib.blake2b(array("i", genome).tobytes(), digest_size=8).hexdigest()
        return cls(genome, digest)


class ChoiceSpace:
    """The Term e-classes of a view as integer tables, built once per view (see `space`)."""

    def __init__(self, view: EGraphView):
        term = [c for c in view.classes.values() if c.type == "Term"]
        index = {c.id: k for k, c in enumerate(term)}
        self.view_ref = weakref.ref(view)
        self.class_ids = [c.id for c in term]
        self.enodes: list[list[ENode]] = [c.nodes for c in term]
        self.children: list[list[tuple[int, ...]]] = [
            [tuple(index[k] for k in term_children(view, n)) for n in c.nodes] for c in term]
        self.roots = [index[r] for r in view.roots]
        self.choosable = [k for k, nodes in enumerate(self.enodes) if len(nodes) > 1]
        self.lowest = _least_height_enodes(self.children)
        self.steps_cap = 20 * sum(len(n) for n in self.enodes) + 1000

    def log10_size(self) -> float:
        """log10 of the product of e-nodes per class: an upper bound on the distinct programs
        (cycles and classes that a choice leaves unreached make the true count smaller)."""
        return sum(math.log10(len(self.enodes[k])) for k in self.choosable)


_SPACES: dict[int, ChoiceSpace] = {}


def space(view: EGraphView) -> ChoiceSpace:
    """The view's choice tables, cached while the view lives."""
    cached = _SPACES.get(id(view))
    if cached is None or cached.view_ref() is not view:
        cached = _SPACES[id(view)] = ChoiceSpace(view)
        weakref.finalize(view, _SPACES.pop, id(view), None)
    return cached


def _least_height_enodes(children: list[list[tuple[int, ...]]]) -> list[int]:
    """Per class, an e-node of least height (leaves 0, else 1 + the highest child class), found
    Dijkstra-style: classes settle in order of height, an e-node is ready once all its children
    have settled. An e-node on a cycle never becomes ready."""
    waiting = [[len(kids) for kids in nodes] for nodes in children]
    parents: list[list[tuple[int, int]]] = [[] for _ in children]
    heap: list[tuple[int, int, int]] = []
    for c, nodes in enumerate(children):
        for j, kids in enumerate(nodes):
            for k in kids:
                parents[k].append((c, j))
            if not kids:
                heap.append((0, c, j))
    heapq.heapify(heap)
    best = [-1] * len(children)
    while heap:
        height, c, j = heapq.heappop(heap)
        if best[c] >= 0:
            continue
        best[c] = j
        for p, pj in parents[c]:
            waiting[p][pj] -= 1
            if waiting[p][pj] == 0:
                heapq.heappush(heap, (height + 1, p, pj))
    return best


def _walk(s: ChoiceSpace, rng: random.Random, prefer: Sequence[int] | None) -> Genome | None:
    """One acyclic choice (None when the walk ran past its cap)."""
    n = len(s.class_ids)
    pick = [-1] * n
    state = bytearray(n)
    children = s.children
    steps = 0

    def frame(c: int) -> list[int]:  # [class, first e-node tried, e-nodes tried, next child]
        count = len(children[c])
        first = prefer[c] if prefer is not None and prefer[c] >= 0 else (
            rng.randrange(count) if count > 1 else 0)
        return [c, first, 0, 0]

    for root in s.roots:
        if state[root] == _DONE:
            continue
        state[root] = _ON_PATH
        stack = [frame(root)]
        while stack:
            top = stack[-1]
            c = top[0]
            options = children[c]
            if top[2] == len(options):  # every e-node closes a cycle through the path: back up
                state[c] = _UNSEEN
                stack.pop()
                if not stack:
                    raise ValueError(f"e-class {s.class_ids[c]} has no acyclic e-node")
                stack[-1][2] += 1
                stack[-1][3] = 0
                continue
            node = (top[1] + top[2]) % len(options)
            kids = options[node]
            i = top[3]
            while i < len(kids) and state[kids[i]] == _DONE:
                i += 1
            if i == len(kids):
                pick[c] = node
                state[c] = _DONE
                stack.pop()
                continue
            top[3] = i
            kid = kids[i]
            if state[kid] == _ON_PATH:
                top[2] += 1
                top[3] = 0
                continue
            steps += 1
            if steps > s.steps_cap:
                return None
            state[kid] = _ON_PATH
            stack.append(frame(kid))
    return _reachable_only(s, pick)


def _reachable_only(s: ChoiceSpace, pick: list[int]) -> Genome:
    """The choice restricted to the classes reachable from the roots through chosen e-nodes."""
    out = [-1] * len(pick)
    stack = list(s.roots)
    while stack:
        c = stack.pop()
        if out[c] < 0:
            out[c] = pick[c]
            stack.extend(k for k in s.children[c][pick[c]] if out[k] < 0)
    return tuple(out)


def draw(view: EGraphView, rng: random.Random, prefer: Sequence[int] | None = None) -> Genome:
    """A random acyclic genome; classes with a preferred e-node try it first."""
    s = space(view)
    for _ in range(_RESTARTS):
        genome = _walk(s, rng, prefer)
        if genome is not None:
            return genome
    return _walk(s, rng, s.lowest)


def choice(view: EGraphView, genome: Genome) -> dict[str, ENode]:
    """The genome as {e-class id: e-node} over the reachable Term classes (what `Decoder` reads)."""
    s = space(view)
    return {s.class_ids[c]: s.enodes[c][j] for c, j in enumerate(genome) if j >= 0}


def decode(enc: Encoded, view: EGraphView, genome: Genome) -> list[Node]:
    return Decoder(enc, view).build(choice(view, genome))


def candidates(view: EGraphView, n: int, rng: random.Random, seconds: float | None = None,
               give_up_after: int = 200) -> list[Candidate]:
    """Up to n distinct random candidates; stops early at the time budget, or after
    `give_up_after` draws in a row found nothing new (the space is nearly exhausted)."""
    seen: set[Genome] = set()
    out: list[Candidate] = []
    misses = 0
    deadline = None if seconds is None else time.perf_counter() + seconds
    while len(out) < n and misses < give_up_after:
        if deadline is not None and time.perf_counter() > deadline:
            break
        genome = draw(view, rng)
        if genome in seen:
            misses += 1
            continue
        misses = 0
        seen.add(genome)
        out.append(Candidate.of(genome))
    return out


# --- genetic search over genomes (the tuner supplies measured times) ---------------------------
def mutate(genome: Genome, view: EGraphView, rng: random.Random, rate: float = 0.05) -> Genome:
    """Re-pick each reachable choosable class's e-node with probability `rate` (at least one), then
    repair: the walk keeps every gene it can and re-draws classes the new choices newly reach."""
    s = space(view)
    genes = list(genome)
    reached = [c for c in s.choosable if genes[c] >= 0]
    changed = [c for c in reached if rng.random() < rate] or (
        [rng.choice(reached)] if reached else [])
    for c in changed:
        other = rng.randrange(len(s.enodes[c]) - 1)
        genes[c] = other + (other >= genes[c])
    return draw(view, rng, genes)


def neighbours(genome: Genome, view: EGraphView, n: int, rng: random.Random) -> list[Candidate]:
    """Up to n distinct genomes one class's e-node away from `genome` (each repaired as a mutation
    is), the genome itself never among them."""
    seen, out = {genome}, []
    for _ in range(20 * n):
        if len(out) >= n:
            break
        child = mutate(genome, view, rng, rate=0.0)
        if child not in seen:
            seen.add(child)
            out.append(Candidate.of(child))
    return out


def crossover(a: Genome, b: Genome, view: EGraphView, rng: random.Random) -> Genome:
    """Each class's gene from one parent or the other (uniform), repaired like a mutation."""
    genes = [x if y < 0 or (x >= 0 and rng.random() < 0.5) else y for x, y in zip(a, b)]
    return draw(view, rng, genes)


def genetic_candidates(view: EGraphView, scored: Sequence[tuple[Genome, float]], n: int,
                       rng: random.Random, rate: float = 0.05, crossover_share: float = 0.5,
                       elite: float = 0.25) -> list[Candidate]:
    """Up to n new distinct candidates bred from the fastest scored genomes (seconds, lower is
    better): crossovers of two parents and mutations of one, parents picked by 2-way tournament
    among the best quarter. Genomes already scored are never returned."""
    if not scored:
        return candidates(view, n, rng)
    ranked = [g for g, _ in sorted(scored, key=lambda gs: gs[1])]
    parents = ranked[:max(2, math.ceil(len(ranked) * elite))]
    seen = {tuple(g) for g in ranked}
    out: list[Candidate] = []
    for _ in range(20 * n + 100):
        if len(out) >= n:
            break
        first = parents[min(rng.randrange(len(parents)), rng.randrange(len(parents)))]
        if len(parents) > 1 and rng.random() < crossover_share:
            second = parents[min(rng.randrange(len(parents)), rng.randrange(len(parents)))]
            child = crossover(first, second, view, rng)
        else:
            child = mutate(first, view, rng, rate)
        if child not in seen:
            seen.add(child)
            out.append(Candidate.of(child))
    return out
