"""Finds the library's rule modules: every module of this package with RULES (a rule file given by
path loads through search/rulesets.py's load_file)."""
from __future__ import annotations

import importlib
import pkgutil

from ..search.rulesets import Ruleset, from_module


def modules() -> list[str]:
    """The names of the package's modules, rule modules among them."""
    from .. import rewrites
    return [f"{rewrites.__name__}.{info.name}" for info in pkgutil.iter_modules(rewrites.__path__)]


def library() -> dict[str, Ruleset]:
    """Every rule module of the package, by topic."""
    out = {}
    for name in modules():
        module = importlib.import_module(name)
        if hasattr(module, "RULES"):
            topic = name.rsplit(".", 1)[-1]
            out[topic] = from_module(topic, module, name)
    return out
