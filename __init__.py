"""Kiln: a search-based tensor compiler and executor."""
from .frontend import interpret, lower
from .ir import DType, ExportError, Graph, KilnError, KilnTypeError, ShapeError, UnsupportedOp
from .runtime.driver import compile, compile_lm
from .runtime.model import CompiledModel

load = CompiledModel.load

__version__ = "0.1.0"
__all__ = ["CompiledModel", "DType", "ExportError", "Graph", "KilnError", "KilnTypeError", "ShapeError",
           "UnsupportedOp", "__version__", "compile", "compile_lm", "interpret", "load", "lower"]
