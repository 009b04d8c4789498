"""Graphs as plain JSON data, never pickle. Nodes are listed in topological order and name their
inputs by index; each attribute is encoded so that it decodes to an equal value of the same type,
because nodes are hash-consed on exactly that (1 and 1.0 and True are three different nodes).
Weights are not included: the caller stores them in safetensors and re-attaches them on load.

Attribute encoding: bool, int and str are themselves; a tuple is a list; the rest are tagged
one-key objects — {"float": repr}, {"dtype": "f32"}, {"expr": terms}. An expression's terms are
[[atoms, coeff], ...], an atom a symbol name or {"call": fn, "args": [terms, ...]}.
"""
from __future__ import annotations

import json
from typing import Any

import numpy as np

from .dtypes import DType
from .errors import KilnError
from .graph import Graph, Node, toposort
from .ops import Op
from .symbolic import Call, Expr

GRAPH_FORMAT = 1


# ---- to JSON ------------------------------------------------------------------------------------

def graph_to_json(graph: Graph) -> dict:
    # inputs are roots too: an argument no output reads is still part of the call signature
    nodes = toposort([*graph.outputs, *graph.inputs])
    index = {id(n): i for i, n in enumerate(nodes)}
    return {
        "format": GRAPH_FORMAT,
        "nodes": [{"op": n.op.value, "inputs": [index[id(i)] for i in n.inputs],
                   "attrs": {k: _encode(v, f"{n.op.value}.{k}") for k, v in n.attrs.items()}}
                  for n in nodes],
        "inputs": [index[id(n)] for n in graph.inputs],
        "outputs": [index[id(n)] for n in graph.outputs],
        "symbols": {name: [lo, hi] for name, (lo, hi) in graph.symbols.items()},
        "in_spec": _dump_spec(graph.in_spec),
        "out_spec": _dump_spec(graph.out_spec),
    }


def _encode(value: Any, where: str) -> Any:
    # exact types: a numpy scalar (a float subclass) would come back as a plain float, another node
    if type(value) in (bool, int, str):
        return value
    if type(value) is float:
        return {"float": repr(value)}  # repr round-trips every float, -0.0, inf and nan included
    if type(value) is tuple:
        return [_encode(v, where) for v in value]
    if isinstance(value, DType):
        return {"dtype": value.value}
    if isinstance(value, Expr):
        return {"expr": _expr_terms(value)}
    raise KilnError(f"kiln: cannot serialize attribute {where} = {value!r} ({type(value).__name__})")


def _expr_terms(expr: Expr) -> list:
    return [[[_atom(a) for a in mono], coeff] for mono, coeff in expr.terms]


def _atom(atom: str | Call) -> str | dict:
    if isinstance(atom, str):
        return atom
    return {"call": atom.fn, "args": [_expr_terms(a) for a in atom.args]}


def expr_to_json(expr: Expr) -> dict:
    """One symbolic expression as JSON (kernel descriptions use it)."""
    return _encode(expr, "expression")


def expr_from_json(data: Any) -> Expr:
    try:
        value = _decode(data)
    except ValueError as err:
        raise KilnError(f"kiln: malformed expression JSON: {err}") from err
    if not isinstance(value, Expr):
        raise KilnError(f"kiln: malformed expression JSON: {data!r} is not an expression")
    return value


# ---- from JSON ----------------------------------------------------------------------------------

def graph_from_json(data: dict, weights: dict[str, np.ndarray] | None = None) -> Graph:
    """The graph `graph_to_json` described; with `weights`, each weight node gets its array."""
    if not isinstance(data, dict) or "format" not in data:
        raise KilnError("kiln: malformed graph JSON: not an object with a 'format' key")
    if data["format"] != GRAPH_FORMAT:
        raise KilnError(f"kiln: graph JSON has format {data['format']!r}, this Kiln reads format "
                        f"{GRAPH_FORMAT}; compile the model again with this version")
    try:
        nodes: list[Node] = []
        for entry in data["nodes"]:
            inputs = [nodes[_index(i, len(nodes))] for i in entry["inputs"]]
            attrs = {k: _decode(v) for k, v in entry["attrs"].items()}
            nodes.append(Node(Op(entry["op"]), inputs, **attrs))
        graph = Graph(
            inputs=[nodes[_index(i, len(nodes))] for i in data["inputs"]],
            outputs=[nodes[_index(i, len(nodes))] for i in data["outputs"]],
            symbols={name: (_int(lo), _int(hi)) for name, (lo, hi) in data["symbols"].items()},
            in_spec=_load_spec(data["in_spec"]),
            out_spec=_load_spec(data["out_spec"]))
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as err:
        raise KilnError(f"kiln: malformed graph JSON: {type(err).__name__}: {err}") from err
    if weights is not None:
        graph.weights = _checked_weights(graph, weights)
    return graph


def _index(i: Any, count: int) -> int:
    # only earlier nodes: a negative or forward index would silently pick the wrong node
    if type(i) is not int or not 0 <= i < count:
        raise IndexError(f"node index {i!r} is not one of the {count} nodes before it")
    return i


def _int(value: Any) -> int:
    if type(value) is not int:
        raise ValueError(f"expected an integer, got {value!r}")
    return value


def _decode(value: Any) -> Any:
    if type(value) in (bool, int, str):
        return value
    if type(value) is list:
        return tuple(_decode(v) for v in value)
    if type(value) is dict and len(value) == 1:
        (tag, payload), = value.items()
        if tag == "float" and type(payload) is str:
            return float(payload)
        if tag == "dtype":
            return DType(payload)
        if tag == "expr":
            return _expr(payload)
    raise ValueError(f"not an encoded attribute: {value!r}")


def _expr(terms: list) -> Expr:
    # the terms were canonical when written, so building from them directly gives the same Expr
    return Expr({tuple(_decode_atom(a) for a in mono): _int(coeff) for mono, coeff in terms})


def _decode_atom(atom: Any) -> str | Call:
    if type(atom) is str:
        return atom
    if type(atom) is dict and atom.keys() == {"call", "args"} and atom["call"] in Call.FNS:
        return Call(atom["call"], tuple(_expr(a) for a in atom["args"]))
    raise ValueError(f"not an encoded dimension atom: {atom!r}")


# torch's pytree specs: torch is imported only where a spec is written or its structure used (a
# module's outputs), so that the e-graph's process, which reads region graphs, and an LM
# artifact's load (whose graphs torch.export gave specs nothing reads) start without it
class SavedSpec:
    """A pytree spec as read from JSON, parsed (importing torch, about a second) when asked for."""

    def __init__(self, text: str):
        self.text = text

    def resolved(self):
        from torch.utils._pytree import treespec_loads
        return treespec_loads(self.text)


def resolve_spec(spec):
    """A graph's in_spec or out_spec as torch's pytree functions take it (None stays None)."""
    return spec.resolved() if isinstance(spec, SavedSpec) else spec


def _dump_spec(spec) -> str | None:
    if spec is None or isinstance(spec, SavedSpec):
        return None if spec is None else spec.text
    from torch.utils._pytree import treespec_dumps
    return treespec_dumps(spec)


def _load_spec(text: str | None) -> SavedSpec | None:
    """torch's spec JSON, [protocol, tree], checked for its form without torch."""
    if text is None:
        return None
    data = json.loads(text)
    if not (isinstance(data, list) and len(data) == 2 and isinstance(data[0], int)):
        raise ValueError(f"not a pytree spec: {text[:40]!r}")
    return SavedSpec(text)


def _checked_weights(graph: Graph, weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    for node in graph.weight_nodes():
        name = node.attrs["name"]
        if name not in weights:
            raise KilnError(f"kiln: the graph reads weight '{name}', which the weights lack")
        shape = tuple(d.value for d in node.shape)
        array = weights[name]
        if array.shape != shape or array.dtype != node.dtype.np:
            raise KilnError(f"kiln: weight '{name}' is {array.dtype}{list(array.shape)}, the graph "
                            f"expects {node.dtype.np}{list(shape)}")
    return dict(weights)
