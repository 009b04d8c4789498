"""Staged saturation: limits end a stage, and an egglog abort ends it without taking the caller down."""
import subprocess
import sys
import textwrap
import time

import pytest

from kiln.ir import DType, KilnError, Node, Op
from kiln.ir.symbolic import Expr
from kiln.rewrites.registry import library
from kiln.search.rulesets import Ruleset, load_file
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
    on CI). Here the caller's state is a saturation that would hang; the e-graph's process, a
    fresh interpreter, never sees it."""
    from kiln.search import saturate as module

    def hang(*args):
        time.sleep(3600)

    monkeypatch.setattr(module, "_run_stages", hang)
    limits = Limits(max_seconds=1, slack_seconds=20)
    (algebra,) = saturate([long_sum(4)], [library()["algebra"]], limits).stages
    assert algebra.stop == "saturated" and algebra.enodes > 0


def test_a_hung_egraph_process_shows_its_stack_is_killed_and_replaced(tmp_path, capfd):
    """A rule file that never finishes loading in the e-graph's process: past the patience the
    child is killed (its stack on stderr first), the report says hung, and the next saturation
    gets a fresh child."""
    path = tmp_path / "sleepy.py"
    path.write_text(textwrap.dedent("""
        import sys, time
        from kiln.search.dsl import rewrites, terms, add

        STAGE = "algebra"
        x, y = terms("x y")
        RULES = rewrites("sleepy", [("add-commutes", "x + y = y + x", add(x, y), add(y, x))])
        if sys.argv[0].endswith("egraph_process.py"):   # only where the e-graph grows
            time.sleep(3600)
    """))
    limits = Limits(max_seconds=1, slack_seconds=3)   # patience 5 s; the stack after 3 s
    (stage,) = saturate([long_sum(4)], [load_file(str(path))], limits).stages
    assert stage.stop.startswith("crashed: the e-graph process hung (no report in 5 s; killed)")
    assert "sleepy.py" in capfd.readouterr().err    # where it hung
    (algebra,) = saturate([long_sum(4)], [library()["algebra"]], limits).stages
    assert algebra.stop == "saturated" and algebra.enodes > 0


def test_an_egraph_process_that_cannot_start_says_why(tmp_path, monkeypatch):
    (tmp_path / "egglog.py").write_text("raise ImportError('planted: no egglog here')\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))   # shadows egglog in the child only
    limits = Limits(memory_bytes=(8 << 30) + 4096)     # another cap: a fresh child, not the shared one
    with pytest.raises(KilnError, match="e-graph process failed to start") as err:
        saturate([long_sum(4)], [library()["algebra"]], limits)
    assert "planted: no egglog here" in str(err.value)


def test_a_script_without_a_main_guard_compiles(tmp_path):
    """A forkserver or spawn start runs the caller's main script again in the child; a fresh
    interpreter does not, so a plain script needs no `if __name__ == "__main__":`."""
    script = tmp_path / "plain.py"
    script.write_text(textwrap.dedent("""
        import torch, kiln

        module = torch.nn.Linear(8, 4)
        cm = kiln.compile(module, (torch.randn(2, 8),), backend="cpu", budget="10s", progress=False)
        x = torch.randn(2, 8)
        with torch.no_grad():
            error = (torch.as_tensor(cm(x)) - module(x)).abs().max().item()
        print(f"max abs error {error:.3g}:", "values match" if error < 1e-4 else "values differ")
        assert error < 1e-4
    """))
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                         cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "values match" in run.stdout
