"""Finds rule modules: every module of this package with RULES, and rule files given by path."""
from __future__ import annotations

import importlib
import importlib.util
import pkgutil
from dataclasses import dataclass, field
from pathlib import Path

from ..ir import KilnError
from ..search.dsl import Rule

# stages run in this order; a topic module names its stage with STAGE
STAGES = ("analysis", "algebra", "views", "reductions", "idioms", "fusion", "lowering")


@dataclass
class Ruleset:
    topic: str
    stage: str
    rules: list[Rule]
    disabled: dict[str, tuple[str, Rule]] = field(default_factory=dict)


def _from_module(topic: str, module) -> Ruleset:
    stage = getattr(module, "STAGE", None)
    if stage not in STAGES:
        raise KilnError(f"kiln: rule module {topic} has STAGE={stage!r}; use one of {', '.join(STAGES)}")
    return Ruleset(topic, stage, list(module.RULES), dict(getattr(module, "DISABLED", {})))


def library() -> dict[str, Ruleset]:
    """Every rule module of the package, by topic."""
    from .. import rewrites
    out = {}
    for info in pkgutil.iter_modules(rewrites.__path__):
        module = importlib.import_module(f"{rewrites.__name__}.{info.name}")
        if hasattr(module, "RULES"):
            out[info.name] = _from_module(info.name, module)
    return out


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
    return _from_module(file.stem, module)
