"""Kiln: a search-based tensor compiler and executor.

The public names load on first use (PEP 562): `import kiln` costs the IR's errors and dtypes
only, so the CLI answers at once, and running a compiled model (`kiln.load`) never imports the
frontend's torch.export machinery or the search's egglog."""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from .ir import DType, ExportError, Graph, KilnError, KilnTypeError, ShapeError, UnsupportedOp

if TYPE_CHECKING:
    from .frontend import interpret, lower
    from .compiler.driver import compile, compile_lm
    from .runtime.model import CompiledModel

_LAZY = {   # name -> (module, attribute path)
    "interpret": (".frontend", "interpret"),
    "lower": (".frontend", "lower"),
    "compile": (".compiler.driver", "compile"),
    "compile_lm": (".compiler.driver", "compile_lm"),
    "CompiledModel": (".runtime.model", "CompiledModel"),
    "load": (".runtime.model", "CompiledModel.load"),
}


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'kiln' has no attribute {name!r}")
    module, attribute = _LAZY[name]
    value = importlib.import_module(module, __name__)
    for part in attribute.split("."):
        value = getattr(value, part)
    globals()[name] = value      # later look-ups are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


__version__ = "0.1.0"
__all__ = ["CompiledModel", "DType", "ExportError", "Graph", "KilnError", "KilnTypeError", "ShapeError",
           "UnsupportedOp", "__version__", "compile", "compile_lm", "interpret", "load", "lower"]
