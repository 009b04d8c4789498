"""Staged saturation: limits end a stage, and an egglog abort ends it without taking the caller down."""
import time

from kiln.ir import DType, Node, Op
from kiln.ir.symbolic import Expr
from kiln.rewrites.registry import Ruleset, library
from kiln.search.saturate import Limits, saturate


def long_sum(terms: int) -> Node:
    xs = [Node(Op.INPUT, name=f"x{i}", role="input", shape=(Expr.of(4),), dtype=DType.F32)
          for i in range(terms)]
    total = xs[0]
    for x in xs[1:]:
        total = Node(Op.ADD, [total, x])
    return total


def with_associativity() -> list[Ruleset]:
    """The library's algebra plus its disabled associativity rule as a later stage: commutativity
    and associativity together reach every bracketing of the sum (2^n - 1 e-classes)."""
    lib = library()
    boom = Ruleset("boom", "reductions", [lib["algebra"].disabled["add-associates"][1]])
    return [lib["analysis"], lib["algebra"], boom]


def test_node_limit_ends_the_stage_and_says_so():
    result = saturate([long_sum(12)], with_associativity(), Limits(max_enodes=2_000))
    algebra, boom = result.stages
    assert algebra.stop == "saturated"
    assert boom.stop == "node limit" and boom.enodes > 2_000
    assert len(result.graph.term_classes) == boom.eclasses


def test_an_egglog_abort_keeps_the_previous_stage():
    """22 terms need millions of e-classes; capped at 1 GiB the child process aborts."""
    result = saturate([long_sum(22)], with_associativity(),
                      Limits(max_enodes=10**9, max_iterations=100, max_seconds=120, memory_bytes=1 << 30))
    algebra, boom = result.stages
    assert algebra.stop == "saturated"
    assert boom.stage == "reductions" and boom.stop.startswith("crashed: the e-graph process died")
    assert len(result.graph.term_classes) == algebra.eclasses  # what the algebra stage reached



def test_the_egraph_process_does_not_inherit_the_callers_state(monkeypatch):
    """A child forked from the caller inherits its state, egglog's thread pool among it: when the
    caller had used egglog, the child waited forever on pool threads that fork did not copy (seen
    on CI). Here the caller's state is a saturation that would hang; the e-graph's process,
    forked from a fresh server, never sees it."""
    from kiln.search import saturate as module

    def hang(*args):
        time.sleep(3600)

    monkeypatch.setattr(module, "_run_stages", hang)
    # the patience covers the server's start (seconds) when this test runs alone
    limits = Limits(max_seconds=1, slack_seconds=20)
    (algebra,) = saturate([long_sum(4)], [library()["algebra"]], limits).stages
    assert algebra.stop == "saturated" and algebra.enodes > 0
