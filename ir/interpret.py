"""The numpy reference interpreter: the ground truth every rewrite and kernel is checked against.

Each op's meaning comes from the op table. One evaluation strategy is added on top, not a new
meaning: SumReduce(Mul(a, b)) — a matmul in this IR — is computed as a batched matmul of the
un-broadcast operands instead of materializing the broadcast product, so a 128k-vocab head does
not allocate vocab x dim x seq floats. So is a sum over part of a split axis of a product,
SumReduce(Reshape(Mul(a, b))), the first stage of a split reduction (rewrites/split.py).
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from .dtypes import accumulator, from_numpy
from .graph import Graph, Node
from .ops import OPS, EvalCtx, Op


def contracted_product(node: Node) -> Node | None:
    """The Mul a SumReduce contracts: its input, or the input of a Reshape that only splits one
    axis of it in two (which numpy does on the broadcast operands without a copy)."""
    if node.op is not Op.SUM_REDUCE:
        return None
    x = node.inputs[0]
    if x.op is Op.RESHAPE and x.inputs[0].op is Op.MUL and _splits_one_axis(x.inputs[0].shape, x.shape):
        return x.inputs[0]
    return x if x.op is Op.MUL else None


def _splits_one_axis(before: tuple, after: tuple) -> bool:
    return len(after) == len(before) + 1 and any(
        after[:i] == before[:i] and after[i + 2:] == before[i + 1:] and after[i] * after[i + 1] == before[i]
        for i in range(len(before)))


def _reads(node: Node) -> tuple[Node, ...]:
    product = contracted_product(node)
    return product.inputs if product is not None else node.inputs


def _schedule(outputs: list[Node]) -> list[Node]:
    order, seen = [], set()
    stack = [(o, False) for o in reversed(outputs)]
    while stack:
        node, expanded = stack.pop()
        if expanded:
            order.append(node)
        elif id(node) not in seen:
            seen.add(id(node))
            stack.append((node, True))
            stack.extend((r, False) for r in reversed(_reads(node)) if id(r) not in seen)
    return order


def _contract(a: np.ndarray, b: np.ndarray, axis: int, out_dtype: np.dtype) -> np.ndarray:
    """sum(a * b, axis) through matmul: an axis broadcast in one operand is the other's matrix axis."""
    acc = accumulator(from_numpy(out_dtype)).np
    a = np.moveaxis(a.astype(acc, copy=False), axis, -1)
    b = np.moveaxis(b.astype(acc, copy=False), axis, -1)
    outer = range(a.ndim - 1)
    if a.size == 0 or b.size == 0:  # no products: an empty result, or sums of nothing
        return np.zeros(np.broadcast_shapes(a.shape, b.shape)[:-1], out_dtype)

    def flat(x: np.ndarray, d: int) -> bool:
        return x.shape[d] == 1 or x.strides[d] == 0

    batch = [d for d in outer if not flat(a, d) and not flat(b, d)]
    rows = [d for d in outer if not flat(a, d) and flat(b, d)]
    cols = [d for d in outer if flat(a, d) and not flat(b, d)]
    shape = tuple(max(a.shape[d], b.shape[d]) for d in outer)

    def matrix(x: np.ndarray, mid: list[int]) -> np.ndarray:
        """x as (batch, mid, K): the axes outside batch + mid are flat in x, so index them at 0."""
        kept = batch + mid
        x = x[tuple(slice(None) if d in kept else 0 for d in outer)]
        ascending = sorted(kept)
        x = np.transpose(x, [ascending.index(d) for d in kept] + [len(kept)])
        size = int(np.prod([shape[d] for d in mid]))
        return np.ascontiguousarray(x).reshape(-1, size, a.shape[-1])

    lhs, rhs = matrix(a, rows), matrix(b, cols)
    if lhs.shape[0] == 1:  # one matrix: the 2-D product takes BLAS's transposed path, no copy
        out = (lhs[0] @ rhs[0].T)[None]
    else:
        out = np.matmul(lhs, np.ascontiguousarray(rhs.transpose(0, 2, 1)))
    order = batch + rows + cols
    out = out.reshape([shape[d] for d in order])
    out = np.transpose(out, [order.index(d) for d in sorted(order)])
    out = out.reshape([shape[d] if d in order else 1 for d in outer])
    return np.broadcast_to(out, shape).astype(out_dtype)


def evaluate(outputs: list[Node], feeds: Mapping[Node, np.ndarray],
             env: Mapping[str, int] | None = None) -> list[np.ndarray]:
    """Evaluate output nodes given arrays for every Input node they reach."""
    env = dict(env or {})
    order = _schedule(outputs)
    uses: dict[int, int] = {}
    for node in order:
        for r in _reads(node):
            uses[id(r)] = uses.get(id(r), 0) + 1
    keep = {id(o) for o in outputs}
    values: dict[int, np.ndarray] = {}
    for node in order:
        if node.op is Op.INPUT:
            if node not in feeds:
                raise KeyError(f"no value fed for input '{node.attrs['name']}'")
            value = np.asarray(feeds[node])
        else:
            args = [values[id(r)] for r in _reads(node)]
            shape = tuple(d.evaluate(env) for d in node.shape)
            if contracted_product(node) is not None:
                if node.inputs[0].op is Op.RESHAPE:   # a split axis: a view of each operand
                    split = tuple(d.evaluate(env) for d in node.inputs[0].shape)
                    args = [np.reshape(a, split) for a in args]
                value = _contract(*args, node.attrs["axis"], node.dtype.np)
            else:
                value = OPS[node.op].evaluate(EvalCtx(node.attrs, shape, node.dtype, env), *args)
        values[id(node)] = value
        for r in _reads(node):
            uses[id(r)] -= 1
            if uses[id(r)] == 0 and id(r) not in keep:
                del values[id(r)]
    return [values[id(o)] for o in outputs]


def run(graph: Graph, args: list[np.ndarray], sizes: Mapping[str, int] | None = None) -> list[np.ndarray]:
    """Run a graph on call arguments (numpy arrays, in the graph's input order); `sizes`: values
    of symbols no input's shape gives (a region of a graph: a decode layer's window)."""
    args = [np.asarray(a) for a in args]
    env = {**(sizes or {}), **graph.bind_symbols([a.shape for a in args], [a.dtype for a in args])}
    feeds: dict[Node, np.ndarray] = dict(zip(graph.inputs, args))
    for node in graph.weight_nodes():
        feeds[node] = graph.weights[node.attrs["name"]]
    return evaluate(graph.outputs, feeds, env)
