"""Weights stored in another layout than the model's: a program may read a weight through a copy
whose axes are reordered (the output projection's columns grouped by head, for the `heads`
policy), made once where the program is bound to its weights, never in a call. The graph reads
the copy through views that restore the original's shape, so its values are unchanged; only the
kernels' loads become contiguous where they ran strided.

A packed weight is named `<source>@<tag>` and described by a `Packing`: the source reshaped, then
its axes permuted. Every consumer of a program's weights (the executor, the checks against the
interpreter) reads them through `PackedWeights`, so the copy is made in one place."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Mapping

import numpy as np

from ..ir import Node, Op
from ..ir.symbolic import Expr
from ..ir.build import permute, reshape


@dataclass(frozen=True)
class Packing:
    source: str                    # the model's weight
    shape: tuple[int, ...]         # the source reshaped to this (an axis split in two) ...
    perm: tuple[int, ...]          # ... then its axes in this order

    def apply(self, array: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(np.asarray(array).reshape(self.shape).transpose(self.perm))


def packed(weight: Node, tag: str, shape: tuple[int, ...], perm: tuple[int, ...]
           ) -> tuple[Node, Packing]:
    """A view of `weight` (same shape and values) read from a packed copy, and that copy's packing."""
    name = weight.attrs["name"]
    packing = Packing(name, shape, perm)
    copy = Node(Op.INPUT, name=f"{name}@{tag}", role="weight", dtype=weight.dtype,
                shape=tuple(Expr.of(shape[p]) for p in perm))
    inverse = tuple(perm.index(axis) for axis in range(len(perm)))
    return reshape(permute(copy, inverse), weight.shape), packing


class PackedWeights(Mapping):
    """A program's weights by name: the model's, and the packed copies made from them on first use."""

    def __init__(self, weights: Mapping[str, np.ndarray], packings: Mapping[str, Packing]):
        self.weights, self.packings, self._made = weights, packings, {}

    def __getitem__(self, name: str) -> np.ndarray:
        if name in self.packings:
            if name not in self._made:
                packing = self.packings[name]
                self._made[name] = packing.apply(self.weights[packing.source])
            return self._made[name]
        return self.weights[name]

    def __iter__(self) -> Iterator[str]:
        yield from self.weights
        yield from (n for n in self.packings if n not in self.weights)

    def __len__(self) -> int:
        return len(set(self.weights) | set(self.packings))
