"""The primitive IR: op table, symbolic dims, hash-consed graph and the numpy reference."""
from .dtypes import DType
from .errors import ExportError, KilnError, KilnTypeError, ShapeError, UnsupportedOp
from .graph import Graph, Node, toposort
from .interpret import evaluate, run
from .ops import OPS, Op
from .symbolic import Expr, const, sym

__all__ = ["DType", "Expr", "ExportError", "Graph", "KilnError", "KilnTypeError", "Node", "OPS", "Op",
           "ShapeError", "UnsupportedOp", "const", "evaluate", "run", "sym", "toposort"]
