"""Rulesets and how a process loads them: a rule module's topic, stage and rules, found again by
source (a module name or a rule file's path) in a process that did not load it (the e-graph's).
The saturation engine consumes these; the rule modules themselves live in `rewrites/`, above the
engine (`rewrites/registry.py` finds them), so the engine never imports them by name."""
from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..ir import KilnError
from .dsl import Rule

# stages run in this order; a topic module names its stage with STAGE
STAGES = ("analysis", "algebra", "views", "reductions", "idioms")


@dataclass
class Ruleset:
    topic: str
    stage: str
    rules: list[Rule]
    disabled: dict[str, tuple[str, Rule]] = field(default_factory=dict)


def from_module(topic: str, module, source: str) -> Ruleset:
    stage = getattr(module, "STAGE", None)
    if stage not in STAGES:
        raise KilnError(f"kiln: rule module {topic} has STAGE={stage!r}; use one of {', '.join(STAGES)}")
    rules = [replace(r, source=source) for r in module.RULES]
    disabled = {name: (reason, replace(r, source=source))
                for name, (reason, r) in getattr(module, "DISABLED", {}).items()}
    return Ruleset(topic, stage, rules, disabled)


_LOADED: dict[str, Ruleset] = {}


def find(source: str, full_name: str) -> Rule:
    """A rule, enabled or disabled, from the module or rule file `source`: how a process that
    did not load it (the e-graph's) gets it. Each source is loaded once per process."""
    if source not in _LOADED:
        if Path(source).suffix == ".py":
            _LOADED[source] = load_file(source)
        else:
            _LOADED[source] = from_module(source.rsplit(".", 1)[-1], importlib.import_module(source), source)
    ruleset = _LOADED[source]
    for rule in [*ruleset.rules, *(r for _, r in ruleset.disabled.values())]:
        if rule.full_name == full_name:
            return rule
    raise KilnError(f"kiln: {source} defines no rule {full_name}")


def load_file(path: str) -> Ruleset:
    """A rule file outside the package (a researcher's draft, or a planted wrong rule in a test)."""
    file = Path(path)
    if not file.is_file():
        raise KilnError(f"kiln: no rule file at {path}")
    spec = importlib.util.spec_from_file_location(f"kiln_rules_{file.stem}", file)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as err:  # a draft rule file can fail in any way; say where
        raise KilnError(f"kiln: cannot load rules from {path}: {type(err).__name__}: {err}") from err
    if not hasattr(module, "RULES"):
        raise KilnError(f"kiln: {path} defines no RULES list")
    return from_module(file.stem, module, str(file.resolve()))
