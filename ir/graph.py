"""The hash-consed DAG: a `Node` is immutable and built once per structure, so equal subgraphs are
the same object and identity comparison is structural comparison."""
from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

import numpy as np

from .dtypes import DType
from .errors import KilnTypeError, ShapeError
from .ops import OPS, Op, OpSpec
from .symbolic import Expr, Shape, fmt_shape

_INTERNED: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def _attr_key(value: Any) -> Any:
    """A hash key that tells apart what == merges: -0.0 from 0.0, True from 1, NaN from itself."""
    if isinstance(value, (bool, int, float)):
        return (type(value).__name__, repr(value))
    if isinstance(value, tuple):
        return tuple(_attr_key(v) for v in value)
    return value


class Node:
    __slots__ = ("op", "inputs", "attrs", "dtype", "shape", "__weakref__")
    op: Op
    inputs: tuple[Node, ...]
    attrs: dict[str, Any]
    dtype: DType
    shape: Shape

    def __new__(cls, op: Op, inputs: Iterable[Node] = (), **attrs: Any) -> Node:
        spec = OPS[op]
        inputs = tuple(inputs)
        if set(attrs) != set(spec.attrs):
            raise TypeError(f"{op.value} takes attributes {spec.attrs}, got {tuple(attrs)}")
        if spec.arity is not None and len(inputs) != spec.arity:
            raise TypeError(f"{op.value} takes {spec.arity} inputs, got {len(inputs)}")
        if spec.arity is None and not inputs:
            raise TypeError(f"{op.value} needs at least one input")
        ordered = tuple(attrs[name] for name in spec.attrs)
        key = (op, tuple(id(i) for i in inputs), _attr_key(ordered))
        node = _INTERNED.get(key)
        if node is not None:
            return node
        named = dict(zip(spec.attrs, ordered))
        dtype = spec.dtype_rule([i.dtype for i in inputs], named)
        shape = tuple(spec.shape_rule([i.shape for i in inputs], named))
        node = object.__new__(cls)
        for slot, value in (("op", op), ("inputs", inputs), ("attrs", named), ("dtype", dtype),
                            ("shape", shape)):
            object.__setattr__(node, slot, value)
        _INTERNED[key] = node
        return node

    @property
    def spec(self) -> OpSpec:
        return OPS[self.op]

    @property
    def rank(self) -> int:
        return len(self.shape)

    def replace(self, inputs: Iterable[Node] | None = None, **attrs: Any) -> Node:
        return Node(self.op, self.inputs if inputs is None else inputs, **{**self.attrs, **attrs})

    def __setattr__(self, name, value):
        raise AttributeError("Node is immutable; use replace(...)")

    def __reduce__(self):
        raise TypeError("Nodes are never pickled; artifacts are JSON")

    def __repr__(self) -> str:
        attrs = ", ".join(f"{k}={_fmt_attr(v)}" for k, v in self.attrs.items()
                          if k not in ("shape", "dtype") or self.op is not Op.INPUT)
        return f"{self.op.value}({attrs}) -> {self.dtype!r}{fmt_shape(self.shape)}"


def _fmt_attr(value: Any) -> str:
    if isinstance(value, tuple):
        return "(" + ", ".join(_fmt_attr(v) for v in value) + ")"
    if isinstance(value, (Expr, DType)):
        return str(value) if isinstance(value, Expr) else repr(value)
    return repr(value)


def toposort(roots: Iterable[Node]) -> list[Node]:
    """Every node reachable from roots, each after its inputs; iterative (graphs are deep)."""
    order: list[Node] = []
    seen: set[int] = set()
    stack: list[tuple[Node, bool]] = [(r, False) for r in reversed(list(roots))]
    while stack:
        node, expanded = stack.pop()
        if expanded:
            order.append(node)
            continue
        if id(node) in seen:
            continue
        seen.add(id(node))
        stack.append((node, True))
        stack.extend((i, False) for i in reversed(node.inputs) if id(i) not in seen)
    return order


@dataclass
class Graph:
    """A lowered program: user inputs in call order, outputs, and the named weights.

    `out_spec` restores the module's output structure (a pytree spec); `symbols` maps each
    symbolic dimension to its inclusive (min, max) range.
    """
    inputs: list[Node]
    outputs: list[Node]
    weights: dict[str, np.ndarray] = field(default_factory=dict)
    symbols: dict[str, tuple[int, int]] = field(default_factory=dict)
    out_spec: Any = None
    in_spec: Any = None

    def nodes(self) -> list[Node]:
        return toposort(self.outputs)

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes())

    def weight_nodes(self) -> list[Node]:
        return [n for n in self.nodes() if is_weight(n)]

    def op_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for n in self.nodes():
            counts[n.op.value] = counts.get(n.op.value, 0) + 1
        return dict(sorted(counts.items(), key=lambda kv: -kv[1]))

    def bind_symbols(self, shapes: list[tuple[int, ...]], dtypes: list[np.dtype]) -> dict[str, int]:
        """Check call inputs against the graph's and return the symbol values they imply."""
        if len(shapes) != len(self.inputs):
            raise KilnTypeError(f"the graph takes {len(self.inputs)} inputs, got {len(shapes)}")
        env: dict[str, int] = {}
        for node, shape in zip(self.inputs, shapes):
            for dim, actual in zip(node.shape, shape):
                if dim.symbol_name is not None:
                    env.setdefault(dim.symbol_name, actual)
        for i, (node, shape, dtype) in enumerate(zip(self.inputs, shapes, dtypes)):
            name = node.attrs["name"]
            if np.dtype(dtype) != node.dtype.np:
                raise KilnTypeError(f"input {i} ('{name}'): expected dtype {node.dtype!r}, "
                                    f"got {np.dtype(dtype)}")
            expected = tuple(d.evaluate(env) if d.symbols() <= env.keys() else None for d in node.shape)
            if len(shape) != len(expected) or any(e is not None and e != a for e, a in zip(expected, shape)):
                raise ShapeError(f"input {i} ('{name}'): expected shape {fmt_shape(node.shape)}"
                                 f"{self._ranges_text()}, got {tuple(shape)}")
        for name, value in env.items():
            lo, hi = self.symbols.get(name, (0, None))
            if value < lo or (hi is not None and value > hi):
                raise ShapeError(f"symbol '{name}' = {value} is outside its range [{lo}, {hi}] "
                                 "fixed when the model was lowered")
        return env

    def _ranges_text(self) -> str:
        if not self.symbols:
            return ""
        return " with " + ", ".join(f"{lo} <= {n} <= {hi}" for n, (lo, hi) in self.symbols.items())


def positional(order: Iterable[Node]) -> set[int]:
    """Ids of the nodes of `order` (children first) computed elementwise from iotas and constants
    alone, such as a causal mask: a kernel that reads one can compute it from its indices."""
    from .ops import Kind
    pointwise = (Kind.UNARY, Kind.BINARY, Kind.TERNARY, Kind.CAST, Kind.VIEW)
    out: set[int] = set()
    for n in order:
        if n.op in (Op.IOTA, Op.CONSTANT) or (n.inputs and OPS[n.op].kind in pointwise
                                               and all(id(i) in out for i in n.inputs)):
            out.add(id(n))
    return out


def is_weight(node: Node) -> bool:
    return node.op is Op.INPUT and node.attrs["role"] == "weight"
