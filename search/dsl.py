"""The vocabulary rule files in `rewrites/` write with: the constructors, pattern variables, and
`Rule`s with a topic, a name and a one-line reason. Rule files import this module, never egglog,
so that egglog stays behind `search/`."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from egglog import String, Vec, eq, function, i64, ne, rule, set_, union, vars_

from .language import CONSTRUCTORS, Dim, Term, dim_lit, dim_sym, rule_name

# one constructor per op of the op table, by its rule name (mul, sum_reduce, slice_, ...)
globals().update({rule_name(op): constructor for op, constructor in CONSTRUCTORS.items()})

__all__ = [
    "Dim", "Rule", "String", "Term", "Vec", "const_value", "dim_lit", "dim_sym", "dims", "eq", "holds",
    "facts", "i64", "ints", "ne", "perms", "rewrites", "rule", "set_", "split_axis", "strings", "terms",
    "union", *(rule_name(op) for op in CONSTRUCTORS),
]


@function(egg_fn="const_value", merge=None)
def const_value(t: Term) -> String:
    """Analysis: the exact text of the value every element of t holds, where t is a constant
    broadcast by views. No merge: two different values in one e-class is an unsound rule."""


def holds(t: Term, value: str | String):
    """Condition: t is a constant (through views) whose every element is `value` (exact text)."""
    return eq(const_value(t)).to(String(value) if isinstance(value, str) else value)


def terms(names: str) -> list[Term]:
    return list(vars_(names, Term))


def dims(names: str) -> list[Vec[Dim]]:
    return list(vars_(names, Vec[Dim]))


def perms(names: str) -> list[Vec[i64]]:
    return list(vars_(names, Vec[i64]))


def ints(names: str) -> list[i64]:
    return list(vars_(names, i64))


def strings(names: str) -> list[String]:
    return list(vars_(names, String))


def split_axis(shape: Vec[Dim], rank: int, axis: int, outer: i64, inner: i64) -> Vec[Dim]:
    """`shape` (a Vec of `rank` dims) with one axis cut into [outer, inner]: egglog's Vec has no
    insert, so the Vec is rebuilt."""
    return Vec[Dim](*[shape[i] for i in range(axis)], dim_lit(outer), dim_lit(inner),
                    *[shape[i] for i in range(axis + 1, rank)])


@dataclass(frozen=True)
class Rule:
    """A named rewrite: `topic/name` is how reports, the fuzzer and `kiln rules list` call it."""
    topic: str
    name: str
    why: str
    egg: Any
    source: str = ""    # the module or rule file that defines it, where a fresh process finds it
    # sound within rounding only where both sides stay finite (a reassociated product may
    # overflow in one order only); the fuzzer checks it on that contract
    finite_only: bool = False

    @property
    def full_name(self) -> str:
        return f"{self.topic}/{self.name}"


def rewrites(topic: str, table: Iterable[tuple], finite_only: bool = False) -> list[Rule]:
    """Rules from rows (name, why, lhs, rhs, *conditions): when lhs matches and the conditions
    hold, rhs joins lhs's e-class."""
    out = []
    for name, why, lhs, rhs, *conditions in table:
        egg = rule(lhs, *conditions, name=f"{topic}/{name}").then(union(lhs).with_(rhs))
        out.append(Rule(topic, name, why, egg, finite_only=finite_only))
    return out


def facts(topic: str, table: Iterable[tuple]) -> list[Rule]:
    """Analysis rules from rows (name, why, [conditions], [actions])."""
    return [Rule(topic, name, why, rule(*conditions, name=f"{topic}/{name}").then(*actions))
            for name, why, conditions, actions in table]
