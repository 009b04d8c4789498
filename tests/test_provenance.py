"""search/provenance.py: an e-graph holds a candidate exactly when it has each chosen e-node over
the same children; the rules a rewritten candidate needs are found by leaving rules out."""
import random

import torch

from kiln.frontend.lower import lower
from kiln.ir import Op, toposort
from kiln.rewrites.registry import library
from kiln.search import extract
from kiln.search.provenance import holds, lowered_genome, rules_used
from kiln.search.rulesets import Ruleset
from kiln.search.saturate import Limits, saturate


class Chain(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Parameter(torch.randn(8, 8)), torch.nn.Parameter(torch.randn(8, 8))

    def forward(self, x):
        return (self.a @ self.b) @ x


def widest_product(outputs) -> int:
    return max(n.shape[2].value for n in toposort(outputs) if n.op is Op.MUL)


def test_the_rules_a_reassociated_chain_needs_are_named():
    graph = lower(Chain(), (torch.randn(8, 1),))
    rulesets = list(library().values())
    full = saturate(graph.outputs, rulesets, isolate=False)
    bare = saturate(graph.outputs, [], isolate=False).graph
    rng = random.Random(0)
    drawn = [c.genome for c in extract.candidates(full.graph, 200, rng)]
    decoded = {g: extract.decode(full.encoded, full.graph, g) for g in drawn}
    # (A·B)·x multiplies across 8 columns of B; A·(B·x) never: one of each among the draws
    lowered = next(g for g in drawn if widest_product(decoded[g]) == 8 and holds(bare, full.graph,
                                                                                 extract.choice(full.graph, g)))
    rewritten = next(g for g in drawn if widest_product(decoded[g]) == 1)
    assert not holds(bare, full.graph, extract.choice(full.graph, rewritten))
    fired = sorted({name for s in full.stages for name, n in s.matches.items() if n
                    and name.split("/")[0] not in ("analysis", "compare")})
    needed, undecided = rules_used(graph.outputs, rulesets, fired, full.graph,
                                   extract.choice(full.graph, rewritten), Limits())
    assert not undecided and any(name.startswith("contraction/matrix-chain") for name in needed)
    # the rules named suffice: saturated with them alone, the e-graph holds the candidate
    alone = [Ruleset(rs.topic, rs.stage, [r for r in rs.rules if r.full_name in needed or rs.stage == "analysis"])
             for rs in rulesets]
    assert holds(saturate(graph.outputs, alone, isolate=False).graph, full.graph,
                 extract.choice(full.graph, rewritten))
    # a candidate the program as lowered spells needs no rule
    assert rules_used(graph.outputs, rulesets, fired, full.graph, extract.choice(full.graph, lowered),
                      Limits()) == ([], [])


def test_the_program_as_lowered_is_found_in_its_saturated_egraph_and_its_neighbours_rewrite_one_place():
    """The tuner breeds from the program as lowered: its choice in the saturated e-graph spells the
    lowered program (the bare e-graph holds it), and each neighbour changes one class's e-node."""
    graph = lower(Chain(), (torch.randn(8, 1),))
    full = saturate(graph.outputs, list(library().values()), isolate=False)
    bare = saturate(graph.outputs, [], isolate=False).graph
    lowered = lowered_genome(full, random.Random(0))
    assert holds(bare, full.graph, extract.choice(full.graph, lowered))
    assert widest_product(extract.decode(full.encoded, full.graph, lowered)) == 8
    near = extract.neighbours(lowered, full.graph, 6, random.Random(1))
    assert len(near) == 6 and lowered not in {c.genome for c in near}
    for c in near:      # of the classes both reach, one chose another e-node
        assert sum(a != b for a, b in zip(lowered, c.genome) if a >= 0 and b >= 0) == 1
    assert any(not holds(bare, full.graph, extract.choice(full.graph, c.genome)) for c in near)
