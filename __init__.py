"""Kiln: a search-based tensor compiler and executor."""
from .frontend import interpret, lower
from .ir import DType, ExportError, Graph, KilnError, KilnTypeError, ShapeError, UnsupportedOp

__version__ = "0.1.0"
__all__ = ["DType", "ExportError", "Graph", "KilnError", "KilnTypeError", "ShapeError", "UnsupportedOp",
           "__version__", "interpret", "lower"]
