"""The rule library and its soundness fuzzer: every shipped ruleset passes; planted wrong rules,
and rules that never fire, are caught and named; the disabled rule really blows up; `kiln rules`."""
import dataclasses
import textwrap

import pytest
from click.testing import CliRunner

from kiln.cli import main
from kiln.ir import DType, Node, Op
from kiln.ir.symbolic import Expr
from kiln.rewrites.fuzz import check
from kiln.rewrites.registry import library
from kiln.search.rulesets import Ruleset, load_file
from kiln.search.saturate import Limits, saturate

TINY_LLAMA = ("hf:LlamaForCausalLM hidden_size=32 intermediate_size=64 num_hidden_layers=1 "
              "num_attention_heads=2 num_key_value_heads=1 vocab_size=64")


def rule_file(tmp_path, name: str, body: str) -> str:
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(body))
    return str(path)


@pytest.fixture
def planted(tmp_path):
    """A draft rule file with two sound rules and a wrong one: x * 1 = x + 1."""
    return rule_file(tmp_path, "planted", """
        from kiln.search.dsl import add, holds, mul, rewrites, terms

        STAGE = "algebra"
        c, x = terms("c x")
        RULES = rewrites("planted", [
            ("mul-commutes", "a * b = b * a", mul(c, x), mul(x, c)),
            ("mul-one-is-add-one", "x * 1 = x + 1 (wrong on purpose)", mul(x, c), add(x, c),
             holds(c, "1.0")),
            ("mul-two", "x * 2 = x + x: both round 2x once", mul(x, c), add(x, x), holds(c, "2.0")),
        ])
    """)


# --- the library -------------------------------------------------------------------------------
@pytest.mark.parametrize("topic", sorted(library()))
def test_every_ruleset_is_sound_and_fires(topic):
    report = check([library()[topic]])
    assert report.ok, report.format()
    assert report.enodes > 1000


def test_the_new_topics_are_in_the_library():
    """The parametrized fuzz above covers every topic the registry finds; these must be among them."""
    lib = library()
    assert lib["reductions"].stage == "reductions" and lib["compare"].stage == "analysis"
    assert lib["idioms"].stage == "idioms"


def test_reordered_reductions_stay_small():
    """Four nested sums over four axes: the swap rules reach every order, one e-class per set of
    reduced axes (2^4 - 1 besides the input) and one e-node per (set, last axis reduced): 32."""
    x = Node(Op.INPUT, name="x", role="input", shape=tuple(map(Expr.of, (2, 3, 4, 5))), dtype=DType.F32)
    total = x
    for _ in range(4):
        total = Node(Op.SUM_REDUCE, [total], axis=0)
    (stage,) = saturate([total], [library()["reductions"]], Limits(max_enodes=10_000)).stages
    assert stage.stop == "saturated" and stage.enodes == 1 + 32


def test_the_whole_library_together_is_sound():
    report = check(list(library().values()), seed=1)
    assert report.ok, report.format()
    assert {r.full_name for r in report.rules} == {r.full_name for rs in library().values() for r in rs.rules}


def test_disabled_add_associates_blows_up():
    """Beside commutativity, reassociating a 10-term sum grows without end; without it the same
    program saturates at once (why `algebra/add-associates` is disabled)."""
    algebra = library()["algebra"]
    reason, associates = algebra.disabled["add-associates"]
    assert "explodes" in reason
    xs = [Node(Op.INPUT, name=f"x{i}", role="input", shape=(Expr.of(4),), dtype=DType.F32)
          for i in range(10)]
    total = xs[0]
    for x in xs[1:]:
        total = Node(Op.ADD, [total, x])
    limits = Limits(max_enodes=20_000, max_iterations=50, max_seconds=60)
    stage = lambda rules: saturate([total], [Ruleset("algebra", "algebra", rules)], limits).stages[-1]
    without = stage(algebra.rules)
    assert without.stop == "saturated" and without.enodes < 100
    blown = stage([*algebra.rules, associates])
    assert blown.stop == "node limit" and blown.enodes > 20_000


# --- planted rules -----------------------------------------------------------------------------
def test_a_planted_wrong_rule_is_caught_and_named(planted):
    report = check([load_file(planted)], programs=60)
    assert not report.ok
    (unsound,) = report.unsound
    assert unsound.rule.full_name == "planted/mul-one-is-add-one"
    assert unsound.issue.kind == "values differ"
    assert unsound.program.size <= 5  # shrunk to x * 1 (1 broadcast by two views)
    text = report.format()
    assert "UNSOUND planted/mul-one-is-add-one" in text and "Mul(" in text and "Add(" in text
    assert "planted/mul-two" not in text.split("\n\n")[0]  # the sound rules are not blamed


def test_a_finite_only_rule_is_held_to_its_contract(tmp_path):
    """The matrix-chain rules disagree with the program on draws that overflow (the fuzzer's
    infinities make A·B inf and (A·B)·x NaN where A·(B·x) is finite): marked finite-only they
    pass; the same rule unmarked is convicted; and a finite-only rule wrong on finite values, a
    chain that doubles, is still caught."""
    contraction = library()["contraction"]
    chains = [r for r in contraction.rules if r.name.startswith("matrix-chain")]
    assert chains and all(r.finite_only for r in chains)
    assert check([Ruleset("contraction", "reductions", chains)], programs=120).ok
    unmarked = [dataclasses.replace(r, finite_only=False) for r in chains]
    assert check([Ruleset("contraction", "reductions", unmarked)], programs=120).unsound
    path = rule_file(tmp_path, "chain", """
        from kiln.search.dsl import add, dims, expand, i64, mul, reshape, rewrites, sum_reduce, terms

        STAGE = "reductions"
        a, b, x = terms("a b x")
        left, right, t, outer_left, outer_right, wide = dims("left right t outer_left outer_right wide")
        inner = sum_reduce(mul(expand(reshape(a, left), t), expand(reshape(b, right), t)), i64(1))
        chain = sum_reduce(mul(expand(reshape(inner, outer_left), wide), expand(reshape(x, outer_right), wide)),
                           i64(1))
        RULES = rewrites("planted", [
            ("chain-doubles", "(A·B)·X = (A·B)·X + (A·B)·X (wrong on purpose)", chain, add(chain, chain)),
        ], finite_only=True)
    """)
    report = check([load_file(path)], programs=200)
    assert [u.rule.full_name for u in report.unsound] == ["planted/chain-doubles"], report.format()


def test_a_rule_that_drops_a_reduction_is_caught(tmp_path):
    path = rule_file(tmp_path, "drop", """
        from kiln.search.dsl import ints, rewrites, sum_reduce, terms

        STAGE = "reductions"
        (x,) = terms("x")
        (axis,) = ints("axis")
        RULES = rewrites("planted", [("sum-drop", "sum(x) = x (wrong)", sum_reduce(x, axis), x)])
    """)
    (unsound,) = check([load_file(path)], programs=60).unsound
    assert unsound.rule.full_name == "planted/sum-drop"
    assert unsound.issue.kind == "shape or dtype differs"
    assert [n.op for n in unsound.program.outputs] == [Op.SUM_REDUCE]


def test_a_wrong_analysis_fact_is_caught(tmp_path):
    path = rule_file(tmp_path, "fact", """
        from kiln.search.dsl import const_value, facts, holds, mul, set_, strings, terms

        STAGE = "analysis"
        x, y = terms("x y")
        (value,) = strings("value")
        RULES = facts("planted", [
            ("const-through-mul", "x * y is constant when x is (wrong)",
             [holds(x, value), mul(x, y)], [set_(const_value(mul(x, y))).to(value)]),
        ])
    """)
    (unsound,) = check([load_file(path)], programs=60).unsound
    assert unsound.rule.full_name == "planted/const-through-mul"
    assert unsound.issue.kind == "analysis"


def test_a_rule_unsound_only_on_special_values_is_caught(tmp_path):
    """x * 0 = 0 fails on inf and NaN only: the third draw of each program holds such values."""
    path = rule_file(tmp_path, "zero", """
        from kiln.search.dsl import holds, mul, rewrites, terms

        STAGE = "algebra"
        c, x = terms("c x")
        RULES = rewrites("planted", [("mul-zero", "x * 0 = 0", mul(x, c), c, holds(c, "0.0"))])
    """)
    (unsound,) = check([load_file(path)], programs=100).unsound
    assert unsound.rule.full_name == "planted/mul-zero"
    assert "nan" in unsound.issue.detail


def test_a_softmax_factor_without_its_mask_is_caught(tmp_path):
    """Normalizing a masked softmax after the PV product needs the mask on the row factor too: a
    row with no finite score has a NaN sum, which the mask turns into 0. The fuzzer masks whole
    rows with -inf, so it sees that row."""
    path = rule_file(tmp_path, "unmasked", """
        from kiln.rewrites.idioms import FORMS, PV, SOFTMAX, axis, factor, pv, pv_product, wide
        from kiln.search.dsl import expand, mul, reshape, rewrites

        STAGE = "idioms"
        p, numerator, _ = FORMS["masked"]
        RULES = rewrites("planted", [("unmasked-factor", "the masked row's factor left unmasked",
                                      pv_product(p, axis), mul(pv_product(numerator, axis),
                                          expand(reshape(factor, pv.remove(axis)), wide.remove(axis))),
                                      *SOFTMAX, *PV)])
    """)
    (unsound,) = check([load_file(path)], programs=400).unsound
    assert unsound.rule.full_name == "planted/unmasked-factor" and "nan" in unsound.issue.detail


def test_a_rule_that_never_fires_is_reported(tmp_path):
    path = rule_file(tmp_path, "never", """
        from kiln.search.dsl import exp2, rewrites, sin, terms

        STAGE = "algebra"
        (x,) = terms("x")
        RULES = rewrites("planted", [("deep", "a pattern no random program holds",
                                      sin(sin(sin(exp2(exp2(exp2(x)))))), x)])
    """)
    report = check([load_file(path)], programs=20, extra=0)
    assert [r.full_name for r in report.never_fired] == ["planted/deep"]
    assert not report.unsound and not report.ok
    assert "NEVER FIRED planted/deep" in report.format()


# --- the command line --------------------------------------------------------------------------
def test_cli_rules_check_passes_on_a_ruleset():
    result = CliRunner().invoke(main, ["rules", "check", "--ruleset", "algebra", "--programs", "100"])
    assert result.exit_code == 0, result.output
    rules = len(library()["algebra"].rules)
    assert "algebra/neg-neg" in result.output and f"ok: {rules} rules (algebra)" in result.output


def test_cli_rules_check_fails_on_a_planted_rule(planted):
    result = CliRunner().invoke(main, ["rules", "check", "--rules", planted, "--programs", "60"])
    assert result.exit_code == 1
    assert "UNSOUND planted/mul-one-is-add-one" in result.output
    assert "smallest program that shows it" in result.output


def test_cli_rules_errors_are_one_line():
    runner = CliRunner()
    result = runner.invoke(main, ["rules", "check", "--ruleset", "nope"])
    assert result.exit_code == 1 and result.output.startswith("kiln: no ruleset 'nope'; topics: ")
    result = runner.invoke(main, ["rules", "check", "--rules", "/nonexistent/rules.py"])
    assert result.exit_code == 1 and result.output.startswith("kiln: no rule file at /nonexistent/rules.py")


def test_cli_rules_list():
    result = CliRunner().invoke(main, ["rules", "list"])
    assert result.exit_code == 0, result.output
    for rs in library().values():
        for rule in rs.rules:
            assert rule.full_name in result.output and rule.why in result.output
    assert "algebra/add-associates" in result.output and "explodes" in result.output


def test_cli_rules_list_on_a_model_shows_what_fired():
    result = CliRunner().invoke(main, ["rules", "list", TINY_LLAMA])
    assert result.exit_code == 0, result.output
    assert "saturated with the library" in result.output
    names = {r.full_name for rs in library().values() for r in rs.rules}
    matches = {line.split()[0]: int(line.split()[2]) for line in result.output.splitlines()
               if line.split() and line.split()[0] in names}
    assert set(matches) == names and matches["algebra/mul-commutes"] > 0
    assert matches["idioms/rmsnorm-split-squares-by2"] > 0
    assert matches["idioms/softmax-normalize-after-pv-masked"] > 0
