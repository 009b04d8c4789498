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


def test_a_hung_child_is_killed_and_the_saturation_runs_again(monkeypatch, tmp_path, recwarn):
    """The first child hangs before any rule runs (as one did on CI, once in many runs): after the
    patience it is killed, and a fresh child saturates."""
    from kiln.search import saturate as module
    run_stages, marker = module._run_stages, tmp_path / "hung-once"

    def hang_the_first_time(*args):
        if not marker.exists():
            marker.touch()
            time.sleep(3600)
        run_stages(*args)

    monkeypatch.setattr(module, "_run_stages", hang_the_first_time)
    limits = Limits(max_seconds=1, slack_seconds=1)
    start = time.perf_counter()
    result = saturate([long_sum(4)], [library()["algebra"]], limits)
    assert marker.exists() and time.perf_counter() - start < 3 * limits.patience
    (algebra,) = result.stages
    assert algebra.stop == "saturated" and algebra.enodes > 0
    assert any("hung (no report in 3 s; killed)" in str(w.message) for w in recwarn)
