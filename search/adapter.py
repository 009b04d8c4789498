"""IR <-> egglog: insert a graph (one `let` per node, linear time), dump the e-graph to JSON and
read it as typed e-classes and e-nodes, and rebuild IR from a choice of one e-node per e-class.

Nothing here parses e-node labels: constructor names are the op table's egg names, and primitive
literals are decoded by their declared type (i64, f64, String).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

from egglog import EGraph, Vec, i64

from ..ir import DType, Expr, Node, Op
from ..ir.graph import toposort
from .language import CONSTRUCTORS, FIELDS, Dim, Field, dim_lit, dim_sym

OP_BY_EGG = {op.value: op for op in Op}


@dataclass
class Encoded:
    """A program prepared for the e-graph: its nodes in insertion order and the tables needed to
    read programs back out (pure Python, so a parent process can hold it while a child saturates)."""
    outputs: list[Node]
    order: list[Node]                                        # children before parents
    leaves: dict[str, Node] = field(default_factory=dict)   # leaf key -> Input/Iota node
    dims: dict[str, Expr] = field(default_factory=dict)     # canonical text -> symbolic dim

    @property
    def roots(self) -> list[str]:
        """The let names of the outputs."""
        index_of = {id(n): i for i, n in enumerate(self.order)}
        return [f"n{index_of[id(o)]}" for o in self.outputs]


def _leaf_key(node: Node, index: int) -> str:
    return f"input:{node.attrs['name']}" if node.op is Op.INPUT else f"iota:{index}"


def encode(outputs: list[Node]) -> Encoded:
    enc = Encoded(list(outputs), toposort(outputs))
    for index, node in enumerate(enc.order):
        for attr, kind in FIELDS[node.op]:
            if kind is Field.LEAF:
                enc.leaves[_leaf_key(node, index)] = node
            elif kind in (Field.DIM, Field.DIMS):
                value = node.attrs[attr]
                for d in (value if kind is Field.DIMS else (value,)):
                    if not d.is_const:
                        enc.dims[str(d)] = d
    return enc


def _dim(e: Expr):
    return dim_lit(e.value) if e.is_const else dim_sym(str(e))


def insert(enc: Encoded, egraph: EGraph) -> None:
    """One let per node, children before parents: linear in the program's size."""
    terms: dict[int, object] = {}
    for index, node in enumerate(enc.order):
        inputs = iter(node.inputs)
        args = []
        for attr, kind in FIELDS[node.op]:
            value = node.attrs.get(attr)
            if kind is Field.TERM:
                args.append(terms[id(next(inputs))])
            elif kind is Field.TERMS:
                args.append(Vec(*(terms[id(i)] for i in node.inputs)))
            elif kind is Field.LEAF:
                args.append(_leaf_key(node, index))
            elif kind is Field.INT:
                args.append(i64(int(value)))
            elif kind is Field.NUMBER:
                args.append(repr(value))
            elif kind is Field.TEXT:
                args.append(value.value)
            elif kind is Field.DIM:
                args.append(_dim(value))
            elif kind is Field.DIMS:
                args.append(Vec(*(_dim(d) for d in value)) if value else Vec[Dim].empty())
            elif kind is Field.INTS:
                args.append(Vec(*(i64(int(v)) for v in value)) if value else Vec[i64].empty())
        terms[id(node)] = egraph.let(f"n{index}", CONSTRUCTORS[node.op](*args))


# --- the JSON dump as typed e-classes -----------------------------------------------------------
@dataclass(frozen=True)
class ENode:
    id: str
    op: str
    children: tuple[str, ...]     # e-class ids


@dataclass
class EClass:
    id: str
    type: str
    nodes: list[ENode]


@dataclass
class EGraphView:
    classes: dict[str, EClass]
    roots: list[str]              # e-class ids of the outputs, in order

    @property
    def term_classes(self) -> list[EClass]:
        return [c for c in self.classes.values() if c.type == "Term"]

    def enode_count(self) -> int:
        return sum(len(c.nodes) for c in self.term_classes)


def new_egraph(enc: Encoded) -> EGraph:
    egraph = EGraph()
    insert(enc, egraph)
    return egraph


def dump(egraph: EGraph) -> str:
    """The e-graph as JSON text (what a saturating child process sends back)."""
    return egraph._egraph.serialize([]).to_json()


def view(enc: Encoded, dumped: str) -> EGraphView:
    dump = json.loads(dumped)
    class_of = {nid: n["eclass"] for nid, n in dump["nodes"].items()}
    classes: dict[str, EClass] = {}
    for cid, data in dump["class_data"].items():
        classes[cid] = EClass(cid, data["type"], [])
    for nid, n in dump["nodes"].items():
        if n.get("subsumed"):
            continue
        node = ENode(nid, n["op"], tuple(class_of[c] for c in n["children"]))
        classes.setdefault(n["eclass"], EClass(n["eclass"], n["eclass"].rsplit("-", 1)[0], []))
        classes[n["eclass"]].nodes.append(node)
    lets = {name.strip().lstrip("$"): cid for cid, data in dump["class_data"].items()
            for name in data.get("let", "").split(",") if name.strip()}
    return EGraphView(classes, [lets[r] for r in enc.roots])


def term_children(graph: EGraphView, enode: ENode) -> list[str]:
    """The e-class ids of an e-node's tensor inputs, in input order (a Concat's Vec[Term] members
    included); attribute classes, and the analysis facts they may hold, are not inputs."""
    out = []
    for (_, kind), child in zip(FIELDS[OP_BY_EGG[enode.op]], enode.children):
        if kind is Field.TERM:
            out.append(child)
        elif kind is Field.TERMS:
            out.extend(graph.classes[child].nodes[0].children)
    return out


# --- a choice of e-nodes back to IR ------------------------------------------------------------
class Decoder:
    """Rebuilds IR from chosen e-nodes; shapes and dtypes are re-derived by the op table."""

    def __init__(self, enc: Encoded, graph: EGraphView):
        self.enc, self.graph = enc, graph

    def literal(self, cid: str):
        cls = self.graph.classes[cid]
        node = cls.nodes[0]
        if cls.type in ("i64", "String"):
            # the literal itself has no children; analysis entries (const_value) may share its class
            node = next(n for n in cls.nodes if not n.children)
        if cls.type == "i64":
            return int(node.op)
        if cls.type == "String":
            return json.loads(node.op)
        if cls.type == "Dim":
            value = self.literal(node.children[0])
            return Expr.of(value) if node.op == "DLit" else self.enc.dims[value]
        return tuple(self.literal(c) for c in node.children)   # a Vec of literals or dims

    def build(self, choice: dict[str, ENode]) -> list[Node]:
        built: dict[str, Node] = {}
        order: list[str] = []
        stack, seen = list(self.graph.roots), set()
        while stack:  # post-order over the chosen DAG, iteratively
            cid = stack.pop()
            if cid in seen:
                order.append(cid)
                continue
            seen.add(cid)
            stack.append(cid)
            stack.extend(c for c in self.term_children(choice[cid]) if c not in seen)
        for cid in order:
            if cid not in built:
                built[cid] = self.node(choice[cid], built)
        return [built[r] for r in self.graph.roots]

    def term_children(self, enode: ENode) -> list[str]:
        return term_children(self.graph, enode)

    def node(self, enode: ENode, built: dict[str, Node]) -> Node:
        """One e-node as IR, its inputs taken from `built` (e-class id -> Node); the op table
        re-derives shape and dtype, so an ill-typed e-node raises ShapeError or KilnTypeError."""
        op = OP_BY_EGG[enode.op]
        inputs, attrs = [], {}
        for (attr, kind), child in zip(FIELDS[op], enode.children):
            if kind is Field.TERM:
                inputs.append(built[child])
            elif kind is Field.TERMS:
                inputs.extend(built[c] for c in self.graph.classes[child].nodes[0].children)
            elif kind is Field.LEAF:
                return self.enc.leaves[self.literal(child)]
            elif kind is Field.TEXT:
                attrs[attr] = DType(self.literal(child))
            elif kind is Field.NUMBER:
                attrs[attr] = _number(self.literal(child))
            else:
                attrs[attr] = self.literal(child)
        return Node(op, inputs, **attrs)


def _number(text: str) -> bool | int | float:
    """Inverse of repr() for the numbers constants hold (floats include inf, -0.0 and nan)."""
    if text in ("True", "False"):
        return text == "True"
    try:
        return int(text)
    except ValueError:
        return float(text)
