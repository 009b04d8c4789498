"""A readable listing of a graph: one SSA line per node, weights by name, symbols with ranges."""
from __future__ import annotations

from typing import Any

from .dtypes import DType
from .graph import Graph, Node, is_weight
from .ops import Op
from .symbolic import Expr, fmt_shape


def _value(v: Any) -> str:
    if isinstance(v, Expr):
        return str(v)
    if isinstance(v, DType):
        return repr(v)
    if isinstance(v, tuple):
        return "(" + ", ".join(_value(x) for x in v) + ")"
    return repr(v)


def format_graph(graph: Graph, max_lines: int | None = None) -> str:
    names: dict[int, str] = {}
    lines = []
    head = ", ".join(f"{n.attrs['name']}: {n.dtype!r}{fmt_shape(n.shape)}" for n in graph.inputs)
    ranges = ", ".join(f"{lo} <= {s} <= {hi}" for s, (lo, hi) in graph.symbols.items())
    lines.append(f"graph({head})" + (f"  where {ranges}" if ranges else ""))
    body = []
    for node in graph.nodes():
        if node.op is Op.INPUT:
            names[id(node)] = ("@" if is_weight(node) else "%") + node.attrs["name"]
            continue
        name = f"%{len(body)}"
        names[id(node)] = name
        body.append(f"  {name} = {_call(node, names)} : {node.dtype!r}{fmt_shape(node.shape)}")
    if max_lines is not None and len(body) > max_lines:
        hidden = len(body) - max_lines
        body = body[:max_lines // 2] + [f"  ... {hidden} more nodes ..."] + body[-max_lines // 2:]
    lines += body
    lines.append("  return " + ", ".join(names[id(o)] for o in graph.outputs))
    return "\n".join(lines)


def _call(node: Node, names: dict[int, str]) -> str:
    args = [names[id(i)] for i in node.inputs]
    args += [f"{k}={_value(v)}" for k, v in node.attrs.items() if k != "dtype" or node.op is Op.CAST]
    return f"{node.op.value}({', '.join(args)})"


def summary(graph: Graph) -> str:
    nodes = graph.nodes()
    weights = graph.weight_nodes()
    params = sum(graph.weights[w.attrs["name"]].size for w in weights)
    counts = ", ".join(f"{op} {n}" for op, n in graph.op_counts().items())
    return (f"{len(nodes)} nodes, {len(graph.inputs)} inputs, {len(weights)} weights "
            f"({params / 1e6:.1f}M values), {len(graph.outputs)} outputs\n  {counts}")
