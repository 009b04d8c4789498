"""Attention's head block, for the `heads` fusion policy: the output projection split into one
partial sum per head, so that a kernel a head (its query's projection and rotary, its attention and
its slice of the output projection) runs a decode layer's attention whole, no head's output stored.

The projection sums over the heads' outputs laid end to end (k = head·depth + d). Split there, it
is Σ_head (Σ_d out[head, d]·W[i, head·depth + d]): the inner sum, one partial per head and output
feature, is what a head's kernel computes; the outer one, over a few heads, runs inside the kernels
that read the projection (the residual add in the norm and in the next product). The split
reassociates the sum as split-K does (rewrites/split.py), within rounding; the scheduler makes the
kernels (codegen/schedule.py)."""
from __future__ import annotations

from ..ir import Graph, Node, Op
from ..ir.build import reshape
from ..ir.regions import rebuild


def split_by_heads(graph: Graph) -> tuple[Graph, set[int]]:
    """The graph with each product over heads' outputs split by head, and the ids of the partial
    sums (the nodes a head's kernel computes)."""
    partials: set[int] = set()

    def swap(node: Node) -> Node | None:
        heads = _heads(node)
        if heads is None:
            return None
        axis, product = node.attrs["axis"], node.inputs[0]
        shape = product.shape
        parts = reshape(product, (*shape[:axis], *heads, *shape[axis + 1:]))
        partial = Node(Op.SUM_REDUCE, [parts], axis=axis + 1)
        partials.add(id(partial))
        return Node(Op.SUM_REDUCE, [partial], axis=axis)

    outputs = rebuild(graph.outputs, swap)
    if not partials:
        return graph, partials
    return Graph(inputs=graph.inputs, outputs=outputs, weights=graph.weights, symbols=graph.symbols,
                 out_spec=graph.out_spec, in_spec=graph.in_spec), partials


def _heads(node: Node) -> tuple[int, int] | None:
    """(heads, depth) where `node` sums a product over an axis that one operand's reshape made of
    two, [heads, depth] (attention's output entering the output projection), else None."""
    if node.op is not Op.SUM_REDUCE or node.inputs[0].op is not Op.MUL:
        return None
    axis, product = node.attrs["axis"], node.inputs[0]
    for operand in product.inputs:
        while operand.op is Op.EXPAND:
            operand = operand.inputs[0]
        if operand.op is not Op.RESHAPE:
            continue
        before = [d for d in operand.inputs[0].shape if d != 1]
        after = [d for d in operand.shape if d != 1]
        if (len(before) == 2 and len(after) == 1 and operand.shape[axis] == after[0]
                and all(d.is_const for d in before) and before[0].value >= 2 and before[1].value >= 16
                and before[0].value * before[1].value == after[0]):
            return before[0].value, before[1].value
    return None
