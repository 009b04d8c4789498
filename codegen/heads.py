"""Attention's head block, for the `heads` fusion policy: the output projection split into one
partial sum per head, so that a kernel a head (its query's projection and rotary, its attention and
its slice of the output projection) runs a decode layer's attention whole, no head's output stored.

The projection sums over the heads' outputs laid end to end (k = head·depth + d). Split there, it
is Σ_head (Σ_d out[head, d]·W[i, head·depth + d]): the inner sum, one partial per head and output
feature, is what a head's kernel computes; the outer one, over a few heads, runs inside the kernels
that read the projection (the residual add in the norm and in the next product). The split
reassociates the sum as split-K does (rewrites/split.py), within rounding; the scheduler makes the
kernels (codegen/schedule.py).

A head's slice of the projection's weight, W[i, head·depth + d] for every i, is a run of `depth`
values a row: strided loads, which a CPU's prefetchers follow badly (SmolLM2's slices, 64 floats
every 2,304 bytes, streamed 1.8-2.2x slower than whole rows on the 2-core VM:
scripts/strided_slices.c). So the split reads such a weight from a head-major copy
(codegen/packing.py), each head's slice contiguous."""
from __future__ import annotations

from ..ir import Graph, Node, Op
from ..ir.build import reshape
from ..ir.graph import is_weight
from ..ir.regions import rebuild
from .packing import Packing, PackedWeights, packed


def split_by_heads(graph: Graph) -> tuple[Graph, set[int], dict[str, Packing]]:
    """The graph with each product over heads' outputs split by head, the ids of the partial
    sums (the nodes a head's kernel computes), and the packed copies of weights it reads, by name."""
    views: dict[int, Node] = {}            # a weight -> the same values read from a head-major copy
    packings: dict[str, Packing] = {}
    for node in graph.nodes():
        heads = _heads(node)
        found = heads and _weight_axis(node.inputs[0], node.attrs["axis"])
        if found and id(found[0]) not in views and found[1] > 0:
            weight, axis = found
            shape = tuple(d.value for d in weight.shape)
            split = (*shape[:axis], *heads, *shape[axis + 1:])
            views[id(weight)], packing = packed(weight, "heads", split,
                                                (axis, *(a for a in range(len(split)) if a != axis)))
            packings[f"{packing.source}@heads"] = packing
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

    outputs = rebuild(rebuild(graph.outputs, lambda n: views.get(id(n))), swap)
    if not partials:
        return graph, partials, {}
    return Graph(inputs=graph.inputs, outputs=outputs, weights=PackedWeights(graph.weights, packings),
                 symbols=graph.symbols, out_spec=graph.out_spec, in_spec=graph.in_spec), partials, packings


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


def _weight_axis(product: Node, axis: int) -> tuple[Node, int] | None:
    """The weight of constant shape an operand of `product` reads through views alone, and the
    weight's axis that `axis` of the product runs along; None where no operand is such a view."""
    for operand in product.inputs:
        at = axis
        while operand.op in (Op.EXPAND, Op.PERMUTE, Op.RESHAPE) and at is not None:
            if operand.op is Op.EXPAND and operand.inputs[0].shape[at] != operand.shape[at]:
                at = None                          # broadcast along the sum: no weight's axis
            elif operand.op is Op.PERMUTE:
                at = operand.attrs["perm"][at]
            elif operand.op is Op.RESHAPE:
                at = _unit_reshaped(operand.inputs[0].shape, operand.shape, at)
            operand = operand.inputs[0]
        if at is not None and is_weight(operand) and all(d.is_const for d in operand.shape):
            return operand, at
    return None


def _unit_reshaped(before, after, axis: int) -> int | None:
    """Where `axis` of `after` was in `before`, for a reshape that only adds or drops axes of
    one; else None."""
    kept = [a for a, d in enumerate(before) if d != 1]
    if [before[a] for a in kept] != [d for d in after if d != 1] or after[axis] == 1:
        return None
    return kept[sum(1 for d in after[:axis] if d != 1)]
