"""The prefill program generation runs: logits for the last position only. Sampling reads one
row of the vocabulary head; computing all T rows is most of a short prompt's work on the GPU
(512 x 2048 x 128,256 for Llama-3.2-1B) and on the CPU alike.

`last_position` restricts one output to the last index of an axis and pushes that restriction
back through the nodes only that output reads: elementwise ops and casts, reductions over other
axes, broadcasts, permutes and reshapes that keep the axis whole. Where it meets a node that
something else reads (the residual stream the KV-cache outputs need) it slices there. For a
causal LM this computes the final norm, the head and the last layer's query, attention and MLP
for one position, while the caches are written for all.

With `at_length`, the index is a symbol read from a graph input of its own, LENGTH [n] (its values
never read, as decode's window): the last position of the first n. A prompt padded to a longer
length then gives the logits of its last real token, so that one recording (a CUDA graph) of the
program at a padded length serves every prompt that pads to it: causal attention keeps the real
positions blind to the padding, and decode overwrites the cache slots it filled before reading them."""
from __future__ import annotations

import math
from collections import defaultdict

import numpy as np

from .build import slice_axis
from .dtypes import DType
from .graph import Graph, Node, toposort
from .ops import Kind, Op
from .symbolic import Expr, sym

LENGTH = "length"     # the symbol and input name of the length whose last position counts

_ELEMENTWISE = (Kind.UNARY, Kind.BINARY, Kind.TERNARY, Kind.CAST)


def last_position(graph: Graph, output: int = 0, axis: int = 1, at_length: bool = False) -> Graph:
    """`graph` with output `output` restricted to the last index along `axis` (kept, of size 1);
    with `at_length`, to index n - 1 for an input LENGTH [n] appended to the graph's inputs."""
    target = graph.outputs[output]
    inputs, symbols = list(graph.inputs), dict(graph.symbols)
    position = None
    if at_length:
        size = target.shape[axis]
        longest = size.value if size.is_const else graph.symbols[size.symbol_name][1]
        symbols[LENGTH] = (1, longest)
        inputs.append(Node(Op.INPUT, name=LENGTH, role="input", shape=(sym(LENGTH),), dtype=DType.BOOL))
        position = sym(LENGTH) - 1
    order = toposort(graph.outputs)
    readers: dict[int, set[int]] = defaultdict(set)
    for node in order:
        for i in node.inputs:
            readers[id(i)].add(id(node))
    others = {id(o) for k, o in enumerate(graph.outputs) if k != output}
    exclusive = {id(target)}          # nodes whose every reader the target alone needs
    for node in reversed(order):
        if id(node) not in others and readers[id(node)] and readers[id(node)] <= exclusive:
            exclusive.add(id(node))
    done: dict[tuple[int, int], Node] = {}

    def last(node: Node, axis: int) -> Node:
        key = (id(node), axis)
        if key not in done:
            done[key] = _last(node, axis)
        return done[key]

    def _last(node: Node, axis: int) -> Node:
        length = node.shape[axis]
        if length == Expr.of(1):     # a broadcast along the axis: every position's value
            return node
        pushed = _pushed_axes(node, axis) if id(node) in exclusive else None
        if pushed is None:
            start = length - 1 if position is None else position
            return slice_axis(node, axis, start, start + 1)
        inputs = [x if a is None else last(x, a) for x, a in zip(node.inputs, pushed)]
        shape = node.shape[:axis] + (Expr.of(1),) + node.shape[axis + 1:]
        if node.op in (Op.EXPAND, Op.RESHAPE):
            return Node(node.op, inputs, shape=shape)
        return node.replace(inputs)

    outputs = list(graph.outputs)
    outputs[output] = last(target, axis)
    return Graph(inputs, outputs, weights=graph.weights, symbols=symbols,
                 out_spec=graph.out_spec, in_spec=graph.in_spec)


PAD_SHORTEST = 32     # the shortest padded prompt; then doubling


def padded_length(length: int, longest: int) -> int:
    """The length a prompt of `length` tokens pads to: 32, 64, 128, ... at most `longest`."""
    return min(longest, max(PAD_SHORTEST, 1 << (length - 1).bit_length()))


def prompt_args(graph: Graph, ids: np.ndarray, pad: bool = False) -> list:
    """A prefill graph's inputs for the prompt `ids` [1, n]. Where the graph reads a LENGTH input
    (last_position's at_length), that input; with `pad`, ids padded with zeros to padded_length."""
    length = np.shape(ids)[1]
    if not graph.inputs or graph.inputs[-1].attrs["name"] != LENGTH:
        return [ids]
    if pad:
        size = graph.inputs[0].shape[1]
        longest = size.value if size.is_const else graph.symbols[size.symbol_name][1]
        padding = padded_length(length, longest) - length
        if padding > 0:
            ids = np.concatenate([ids, np.zeros((1, padding), np.asarray(ids).dtype)], axis=1)
    return [ids, np.zeros(length, dtype=np.bool_)]


def _pushed_axes(node: Node, axis: int) -> list[int | None] | None:
    """For each input, the axis whose last index gives `node`'s last index along `axis` (None:
    that input is read whole, a broadcast along the axis); None where the restriction cannot go
    through `node` itself."""
    kind, (first, *_) = node.spec.kind, node.inputs or (None,)
    if kind in _ELEMENTWISE:
        return [axis] * len(node.inputs)
    if kind is Kind.REDUCE:
        return [axis if axis < node.attrs["axis"] else axis + 1]
    if node.op is Op.PERMUTE:
        return [node.attrs["perm"][axis]]
    if node.op is Op.EXPAND:
        return [None if first.shape[axis] == Expr.of(1) else axis]
    if node.op is Op.RESHAPE:     # the same axis, with as many elements before it
        before = math.prod(node.shape[:axis], start=Expr.of(1))
        for j, size in enumerate(first.shape):
            if size == node.shape[axis] and math.prod(first.shape[:j], start=Expr.of(1)) == before:
                return [j]
    return None
