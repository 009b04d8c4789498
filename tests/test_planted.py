"""The planted suite: small modules where one known rewrite makes the program many times faster
(the lowered form does a product or a broadcast the rewritten one does not). A compile with a
one-minute budget on the CPU must pick the fast form, and its report and `kiln rules list
--artifact` name the rewrite.

The fast form is checked by its structure (its largest intermediate tensor is a small fraction
of the lowered program's), not by a time; the gains a run measured are in the report (and the
README's figures come from `kiln rules list --artifact` after such a compile)."""
import math
import sqlite3

import numpy as np
import pytest
import torch
from click.testing import CliRunner

import kiln
from kiln.cli import main
from kiln.ir import toposort
from kiln.ir.ops import VIEWS

N = 256


class TwoMatrices(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Parameter(torch.randn(N, N) / 16)
        self.b = torch.nn.Parameter(torch.randn(N, N) / 16)


class Chain(TwoMatrices):
    """(A·B)·x with x a column: an N×N×N product where two matrix-vector products do."""

    def forward(self, x):
        return (self.a @ self.b) @ x


class MergedProjection(TwoMatrices):
    """x·(A·B), two projections merged into one matrix first: x·A then ·B is two small products."""

    def forward(self, x):
        return x @ (self.a @ self.b)


class OuterSum(torch.nn.Module):
    """Σ_j u_i·v_j: an outer product summed, where u_i·Σ_j v_j costs n instead of n²."""

    def forward(self, u, v):
        return (u[:, None] * v[None, :]).sum(1)


CASES = {  # name: (module, inputs, the rule the fast form needs: one of the matrix-chain rules, which
    # spell the product with or without its broadcasts to its own shape)
    "matrix-chain": (Chain, lambda: (torch.randn(N, 1),), "contraction/matrix-chain-"),
    "merged-projection": (MergedProjection, lambda: (torch.randn(2, N),), "contraction/matrix-chain-"),
    "outer-product-sum": (OuterSum, lambda: (torch.randn(4096), torch.randn(4096)),
                          "contraction/sum-pulls-broadcast-factor"),
}


def largest(outputs) -> int:
    """The elements of the largest tensor the program computes (a view computes nothing)."""
    return max(math.prod(d.value for d in n.shape) for n in toposort(outputs) if n.op not in VIEWS)


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_one_minute_compile_picks_the_planted_rewrite(name, tmp_path):
    torch.manual_seed(0)
    make, inputs, rule = CASES[name]
    module, args = make(), inputs()
    compiled = kiln.compile(module, args, budget="1m", db=tmp_path / "tune.sqlite", progress=False)
    (region,) = compiled.report["graphs"]["forward"]["regions"]
    assert not region["winner"].startswith("original/"), region
    assert any(name.startswith(rule) for name in region["rules"]), region["rules"]
    graph = compiled.graphs["forward"]
    (choice,) = graph.choices.values()
    assert largest(choice.outputs) * 16 <= largest(graph.graph.outputs)
    with torch.no_grad():
        expected = module(*args).numpy()
    got = np.asarray(compiled(*args))
    assert np.abs(got - expected).max() <= 1e-3 * np.abs(expected).max()
    compiled.save(tmp_path / "art")
    listed = CliRunner().invoke(main, ["rules", "list", "--artifact", str(tmp_path / "art")])
    assert listed.exit_code == 0, listed.output
    needs = next(line for line in listed.output.splitlines() if line.strip().startswith("needs:"))
    assert rule in needs and "over the program as lowered" in listed.output
    # the program as lowered is timed whole too, and the gain over it is reported both ways
    assert region["lowered_end_to_end_s"] > 0 and "x end to end (" in listed.output, listed.output


def test_a_later_compile_times_an_earlier_winner_beside_its_own(tmp_path):
    """The database keeps each compile's winner per region: a second compile of the chain on the
    same database that may try nothing past the program as lowered (max_candidates=1) still
    checks the first compile's reassociated program and times it end to end beside its own
    finalists, and ends with the fastest it timed: on a quiet machine the reassociated program,
    with its rules. (On CI's shared cores a burst of load once timed the 30 us program at 16 ms,
    so which one wins is the measurement's, not this test's, to say.)"""
    torch.manual_seed(0)
    module, args = Chain(), (torch.randn(N, 1),)
    first = kiln.compile(module, args, budget="30s", db=tmp_path / "tune.sqlite", progress=False)
    (found,) = first.report["graphs"]["forward"]["regions"]
    assert any(name.startswith("contraction/matrix-chain-") for name in found["rules"]), found
    again = kiln.compile(module, args, budget="30s", db=tmp_path / "tune.sqlite", progress=False,
                         max_candidates=1)
    (kept,) = again.report["graphs"]["forward"]["regions"]
    with sqlite3.connect(tmp_path / "tune.sqlite") as db:
        (compile_id, status), = db.execute(
            "SELECT compile_id, status FROM candidates WHERE candidate_hash LIKE 'remembered-%'")
        timed = dict(db.execute("SELECT candidate_hash, end_to_end_s FROM candidates "
                                "WHERE compile_id = ? AND end_to_end_s IS NOT NULL", (compile_id,)))
    remembered = [key for key in timed if key.startswith("remembered-")]
    assert status == "ok" and len(remembered) == 1 and any(k.startswith("original/") for k in timed), timed
    assert kept["winner"] == min(timed, key=timed.get), (kept, timed)
    if kept["winner"].startswith("remembered-"):
        assert kept["rules"] == found["rules"], kept
        graph = again.graphs["forward"]
        (choice,) = graph.choices.values()
        assert largest(choice.outputs) * 16 <= largest(graph.graph.outputs)
    with torch.no_grad():
        expected = module(*args).numpy()
    assert np.abs(np.asarray(again(*args)) - expected).max() <= 1e-3 * np.abs(expected).max()
