"""Layer dedupe: cut a model's graph at its residual stream into regions (prologue, one per layer,
epilogue), make each region a small program of its own, group the regions that are the same program
up to weight and input names, and stitch chosen region programs back into a whole graph.

How the cuts are found (no module labels needed; the IR carries none):
- Layer weights are the weights named `<prefix>.<i>.<rest>` under the most-indexed prefix
  (`model.layers.7.mlp.up_proj.weight` is layer 7). `layer(n)` is the largest layer index among the
  weights a node reads, directly or not (-1 for none).
- The stream is the chain of nodes that every path from the token input to the main output (the
  output with the most ancestors, the logits) passes through. In a DAG, a node lies on every s-t path
  exactly when no edge of the s-t subgraph jumps over it in topological order, which one sweep finds.
  The token input is the one whose stream starts with computed nodes (the embedding) and is the
  longest; a KV cache or position input also reaches the logits, but enters the layers elsewhere.
- The cut after layer j is the last stream node with layer(n) <= j: the residual value the next
  layer starts from (j = -1 gives the embedding output). Every layer spans the same number of stream
  nodes, so the cut after the last layer is that many nodes past the cut before it; what follows it
  (final norm, head) is the epilogue, whose own weights carry no layer index.
- A node belongs to region k when k cuts lie strictly above it. Nodes that depend on user inputs
  but not on the stream (decode's positions and mask) land in the prologue and flow into every
  layer alike. Values that depend on no user input go where they are read: into the one region that
  reads them (weight transposes, constants), or, computed values read by several regions (a
  prefill's rotary tables and mask), into the prologue, so the first layer reads them as the others.
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np

from . import Graph

from . import Node

from . import Op

from . import evaluate
from .graph import is_weight, positional, toposort
from .printer import format_graph

# views that only re-index their one input (no pad value, no second input)
_FREE_VIEWS = frozenset({Op.RESHAPE, Op.EXPAND, Op.PERMUTE, Op.SLICE})
_LAYER_WEIGHT = re.compile(r"^(.*?)\.(\d+)\.")


@dataclass
class Region:
    """One region as a program over its own Input nodes (`in<k>` for values flowing in, `w<k>` for
    weights, numbered in a canonical traversal), so identical layers yield identical Nodes."""
    index: int
    label: str                 # "prologue", "layer 3", "epilogue" or "whole"
    inputs: list[Node]         # the program's Input nodes, in canonical order
    outputs: list[Node]        # the program
    feeds: list[Node]          # per input: the whole-graph node whose value flows in
    produces: list[Node]       # per output: the whole-graph node it computes
    key: str                   # structural hash: weight and input names do not enter it

    def program(self, graph: Graph) -> Graph:
        """The region as a runnable graph; its weights are the whole graph's arrays it reads."""
        weights = {i.attrs["name"]: graph.weights[f.attrs["name"]]
                   for i, f in zip(self.inputs, self.feeds) if is_weight(i)}
        return Graph(inputs=[i for i in self.inputs if not is_weight(i)], outputs=list(self.outputs),
                     weights=weights, symbols=dict(graph.symbols))

    @property
    def size(self) -> int:
        return sum(1 for n in toposort(self.outputs) if n.op is not Op.INPUT)


def split(graph: Graph) -> list[Region]:
    """The graph's regions in evaluation order (each reads only graph inputs and earlier regions)."""
    order = graph.nodes()
    user = {id(n) for n in graph.inputs}
    dependent = _dependent(order, user)
    layer_index, layers = _layer_weights(graph)
    layer = _weight_layer(order, layer_index)
    cuts = _stream_cuts(graph, order, dependent, layer, layers)
    cut_number = {id(c): k for k, c in enumerate(cuts)}
    region_of: dict[int, int] = {}
    for n in order:  # regions only grow along edges: k cuts above the inputs, +1 past a cut
        if id(n) in dependent and n.op is not Op.INPUT:
            region_of[id(n)] = max((region_of.get(id(i), 0) + (id(i) in cut_number)
                                    for i in n.inputs if id(i) in dependent), default=0)
    count = len(cuts) + 1 if cuts else 1
    hoisted = _hoist_shared(order, dependent, region_of) if cuts else set()
    exported = _exported(graph, order, region_of) | hoisted
    sunk = _sink_views(graph, order, region_of, exported)
    members: list[list[Node]] = [[] for _ in range(count)]
    for n in order:
        if id(n) in region_of:
            members[region_of[id(n)]].append(n)
    free_outputs = [o for o in graph.outputs if id(o) not in dependent and id(o) not in region_of
                    and o.op is not Op.INPUT]
    regions = []
    for k, nodes in enumerate(members):
        outs = [n for n in nodes if id(n) in exported] + (free_outputs if k == count - 1 else [])
        if outs:
            regions.append(_region(len(regions), _label(k, count, bool(cuts), layers), outs,
                                   lambda n, k=k: n.op is Op.INPUT or (region_of.get(id(n), k) != k
                                                                       and id(n) not in sunk)))
    return regions


def distinct(regions: Sequence[Region]) -> dict[str, list[Region]]:
    """Regions grouped by structural hash, in order of first appearance."""
    groups: dict[str, list[Region]] = {}
    for r in regions:
        groups.setdefault(r.key, []).append(r)
    return groups


def stitch(graph: Graph, regions: Sequence[Region],
           chosen: Mapping[str, Sequence[Node]] | None = None) -> Graph:
    """The whole graph with each region replaced by `chosen[region.key]`: outputs over that group's
    Input nodes, shared by every region of the group (a region missing from `chosen` keeps its own)."""
    chosen = chosen or {}
    value: dict[int, Node] = {}                    # whole-graph node id -> its stitched node
    for region in regions:
        outs = chosen.get(region.key, region.outputs)
        inflow = {id(i): value.get(id(f), f) for i, f in zip(region.inputs, region.feeds)}
        for original, new in zip(region.produces, rebuild(outs, lambda n: inflow.get(id(n)))):
            value[id(original)] = new
    return Graph(inputs=list(graph.inputs), outputs=[value.get(id(o), o) for o in graph.outputs],
                 weights=graph.weights, symbols=dict(graph.symbols), out_spec=graph.out_spec,
                 in_spec=graph.in_spec)


def sample_inflows(graph: Graph, regions: Sequence[Region], args: Sequence[np.ndarray]
                   ) -> tuple[list[dict[Node, np.ndarray]], dict[str, int]]:
    """Per region: a value for each of its Input nodes, taken from one reference run of the whole
    graph on `args` (real activations, so a candidate is checked where the model operates)."""
    args = [np.asarray(a) for a in args]
    env = graph.bind_symbols([a.shape for a in args], [a.dtype for a in args])
    leaves: dict[Node, np.ndarray] = dict(zip(graph.inputs, args))
    leaves.update({w: graph.weights[w.attrs["name"]] for w in graph.weight_nodes()})
    inner = list({id(f): f for r in regions for f in r.feeds if f.op is not Op.INPUT}.values())
    values = dict(zip(map(id, inner), evaluate(inner, leaves, env))) if inner else {}
    per_region = [{i: values[id(f)] if id(f) in values else leaves[f]
                   for i, f in zip(r.inputs, r.feeds)} for r in regions]
    return per_region, env


def rebuild(outputs: Sequence[Node], swap: Callable[[Node], Node | None]) -> list[Node]:
    """The program under `outputs` with every node that `swap` maps replaced (and not descended
    into); iterative, since graphs are deep."""
    new: dict[int, Node] = {}
    stack: list[tuple[Node, bool]] = [(o, False) for o in reversed(outputs)]
    while stack:
        node, expanded = stack.pop()
        if id(node) in new:
            continue
        if not expanded:
            swapped = swap(node)
            if swapped is not None:
                new[id(node)] = swapped
                continue
            stack.append((node, True))
            stack.extend((i, False) for i in reversed(node.inputs) if id(i) not in new)
            continue
        inputs = [new[id(i)] for i in node.inputs]
        same = all(a is b for a, b in zip(inputs, node.inputs))
        new[id(node)] = node if same else node.replace(inputs=inputs)
    return [new[id(o)] for o in outputs]


# --- analysis of the whole graph ----------------------------------------------------------------
def _dependent(order: list[Node], user: set[int]) -> set[int]:
    """Ids of the nodes that depend on a user input (the user inputs included)."""
    out = set(user)
    for n in order:
        if any(id(i) in out for i in n.inputs):
            out.add(id(n))
    return out


def _layer_weights(graph: Graph) -> tuple[dict[str, int], int]:
    """Weight name -> layer index for the most-indexed `<prefix>.<i>.` family, and the layer count."""
    families: dict[str, dict[str, int]] = {}
    for name in graph.weights:
        m = _LAYER_WEIGHT.match(name)
        if m:
            families.setdefault(m.group(1), {})[name] = int(m.group(2))
    if not families:
        return {}, 0
    best = max(families.values(), key=lambda f: len(set(f.values())))
    indices = sorted(set(best.values()))
    if indices != list(range(len(indices))):
        return {}, 0
    return best, len(indices)


def _weight_layer(order: list[Node], layer_index: dict[str, int]) -> dict[int, int]:
    layer: dict[int, int] = {}
    for n in order:
        own = layer_index.get(n.attrs["name"], -1) if is_weight(n) else -1
        layer[id(n)] = max([own, *(layer[id(i)] for i in n.inputs)])
    return layer


def _stream_cuts(graph: Graph, order: list[Node], dependent: set[int], layer: dict[int, int],
                 layers: int) -> list[Node]:
    """The residual values between prologue, layers and epilogue ([] where no layered stream)."""
    if layers == 0:
        return []
    position = {id(n): k for k, n in enumerate(order)}
    consumers: dict[int, list[Node]] = {}
    for n in order:
        for i in n.inputs:
            consumers.setdefault(id(i), []).append(n)
    outputs = [o for o in graph.outputs if id(o) in dependent]
    if not outputs:
        return []
    # every node's ancestors (itself among them) as a bitset over `order`, in one pass: a
    # traversal per output took seconds on decode's 61 outputs, at every artifact load
    ancestry: dict[int, int] = {}
    for k, n in enumerate(order):
        bits = 1 << k
        for i in n.inputs:
            bits |= ancestry[id(i)]
        ancestry[id(n)] = bits
    sink = max(outputs, key=lambda o: ancestry[id(o)].bit_count())
    mask = ancestry[id(sink)]
    above = {id(n) for k, n in enumerate(order) if mask >> k & 1}
    best: tuple[tuple[bool, int], list[Node]] = ((False, 0), [])
    for source in graph.inputs:
        if id(source) in above:
            stream = _on_every_path(source, above, consumers, position)
            at = _cut_positions(stream, layer, layers)
            # the token input's stream starts with a computed prologue (the embedding); a KV cache
            # or position input has no prologue of its own; then the longest stream wins
            score = (bool(at) and at[0] > 0, len(stream))
            if at and score > best[0]:
                best = (score, [stream[k] for k in at])
    return best[1]


def _cut_positions(stream: list[Node], layer: dict[int, int], layers: int) -> list[int]:
    """Where the stream crosses from the prologue to layer 0, ..., and from the last layer to the
    epilogue ([] where it does not pass every layer in order)."""
    at: list[int] = []
    k = 0
    for j in range(-1, layers - 1):  # the cut after the prologue, then after each layer but the last
        while k + 1 < len(stream) and layer[id(stream[k + 1])] <= j:
            k += 1
        if layer[id(stream[k])] > j or (at and k == at[-1]):
            return []
        at.append(k)
    if layers >= 2:  # the last layer spans as many stream nodes as the one before it
        last = at[-1] + at[-1] - at[-2]
        if last < len(stream) and layer[id(stream[last])] == layers - 1:
            at.append(last)
    return at


def _on_every_path(source: Node, allowed: set[int], consumers: dict[int, list[Node]],
                   position: dict[int, int]) -> list[Node]:
    """Nodes on every path from source to the sink whose ancestors are `allowed`, in order: those no
    edge of the source-sink subgraph jumps over in topological order."""
    reached, stack = {id(source): source}, [source]
    while stack:
        for c in consumers.get(id(stack.pop()), ()):
            if id(c) in allowed and id(c) not in reached:
                reached[id(c)] = c
                stack.append(c)
    nodes = sorted(reached.values(), key=lambda n: position[id(n)])
    rank = {id(n): r for r, n in enumerate(nodes)}
    jumps = [0] * (len(nodes) + 1)
    for n in nodes:
        for c in consumers.get(id(n), ()):
            if id(c) in rank and rank[id(c)] > rank[id(n)] + 1:
                jumps[rank[id(n)] + 1] += 1
                jumps[rank[id(c)]] -= 1
    out, open_edges = [], 0
    for r, n in enumerate(nodes):
        open_edges += jumps[r]
        if open_edges == 0:
            out.append(n)
    return out


def _hoist_shared(order: list[Node], dependent: set[int], region_of: dict[int, int]) -> set[int]:
    """Move into the prologue (region 0) each computed value that depends on no user input and
    that several regions read (a prefill's rotary tables): it is then computed once, and every
    layer reads it alike. Constants and views of one leaf stay copied into each region that reads
    them, where rules can see the value; so do values computed elementwise from positions alone
    (iotas and constants: a prefill's causal mask), which the kernel that reads one computes from
    its indices instead of reading a [seq, seq] tensor (fused attention skips the masked tiles)."""
    leafy: set[int] = set()
    computed_from_positions = positional(order)
    for n in order:
        if not n.inputs or id(n) in computed_from_positions or (n.op in (Op.RESHAPE, Op.EXPAND, Op.CAST)
                                                                and id(n.inputs[0]) in leafy):
            leafy.add(id(n))
    readers: dict[int, set[int]] = {}
    hoisted: set[int] = set()
    for n in reversed(order):  # readers before what they read
        if id(n) in region_of:
            here = {region_of[id(n)]}
        elif id(n) not in dependent and n.op is not Op.INPUT:
            here = readers.get(id(n), set())
            if len(here) > 1 and id(n) not in leafy:
                region_of[id(n)] = 0
                hoisted.add(id(n))
                here = {0}
        else:
            continue
        for i in n.inputs:
            if id(i) not in dependent:
                readers.setdefault(id(i), set()).update(here)
    return hoisted


def _exported(graph: Graph, order: list[Node], region_of: dict[int, int]) -> set[int]:
    """Ids of region nodes read outside their region: a later region, or the graph's outputs."""
    out = {id(o) for o in graph.outputs if id(o) in region_of}
    for n in order:
        if id(n) in region_of:
            out.update(id(i) for i in n.inputs
                       if id(i) in region_of and region_of[id(i)] != region_of[id(n)])
    return out


def _sink_views(graph: Graph, order: list[Node], region_of: dict[int, int], exported: set[int]) -> set[int]:
    """Views that cross a cut are recomputed by their readers (a view is an index expression,
    free where it is read) and their sources cross instead: a region's output is never a view,
    which would cost a copy kernel (decode's rotary tables expanded to every head, read by every
    layer). Updates `exported`; returns the ids of the views each reader takes in."""
    outputs = {id(o) for o in graph.outputs}
    sunk: set[int] = set()
    for n in reversed(order):       # readers first: a chain of views sinks whole
        if id(n) in exported and n.op in _FREE_VIEWS and id(n) in region_of and id(n) not in outputs:
            exported.discard(id(n))
            sunk.add(id(n))
            source = n.inputs[0]
            if id(source) not in region_of and not _leafy(source):
                # a hoisted view's source, computed from no user input (a prefill's rotary
                # tables, its causal mask): computed where the view was hoisted, once, not again
                # in every region that reads the view
                region_of[id(source)] = region_of[id(n)]
            if id(source) in region_of:
                exported.add(id(source))
    return sunk


def _leafy(n: Node) -> bool:
    """A constant, an iota or an input, through views and casts: each region keeps its own copy,
    where rules can see the value."""
    while n.inputs and n.op in _FREE_VIEWS | {Op.CAST}:
        n = n.inputs[0]
    return not n.inputs


def _label(k: int, count: int, layered: bool, layers: int) -> str:
    if not layered:
        return "whole"
    if k == 0:
        return "prologue"
    return f"layer {k - 1}" if k <= layers else "epilogue"


# --- one region as a canonical program ------------------------------------------------------------
def _region(index: int, label: str, outputs: list[Node], external: Callable[[Node], bool]) -> Region:
    """Outputs are ordered by their structure with all inflows alike (ties keep graph order), then
    inflows are numbered in a depth-first walk from them: both ignore names, so two layers that
    compute the same program number their inputs alike and rebuild to the same Nodes."""
    anonymous = rebuild(outputs, lambda n: _inflow(n, "?") if external(n) else None)
    rank = {id(a): r for r, a in enumerate(sorted({id(a): a for a in anonymous}.values(),
                                                  key=lambda a: format_graph(Graph([], [a]))))}
    ordered = [o for _, o in sorted(zip(anonymous, outputs), key=lambda p: rank[id(p[0])])]
    feeds: list[Node] = []
    inputs: list[Node] = []

    def number(n: Node) -> Node | None:
        if not external(n):
            return None
        inputs.append(_inflow(n, f"{'w' if is_weight(n) else 'in'}{len(feeds)}"))
        feeds.append(n)
        return inputs[-1]

    program = rebuild(ordered, number)
    text = format_graph(Graph([i for i in inputs if not is_weight(i)], program))
    key = hashlib.sha256(text.encode()).hexdigest()[:16]
    return Region(index, label, inputs, program, feeds, ordered, key)


def _inflow(n: Node, name: str) -> Node:
    return Node(Op.INPUT, name=name, role="weight" if is_weight(n) else "input", shape=n.shape,
                dtype=n.dtype)
