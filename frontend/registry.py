"""The one registry of ATen lowerings: `@register_lowering(aten.x.y, ...)` beside each lowering, and
`UNSUPPORTED` for the gaps, each with its reason (the error message and `kiln ops` use both)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from ..ir import DType, Expr, Node
from ..ir import build
from ..ir.tensors import kiln_dtype
from .symbols import to_expr

aten = torch.ops.aten
Lowering = Callable[..., Any]
LOWERINGS: dict[Any, Lowering] = {}

# ATen ops Kiln refuses on purpose, and why (shown in the error and by `kiln ops`).
UNSUPPORTED: dict[Any, str] = {}


def register_lowering(*targets) -> Callable[[Lowering], Lowering]:
    def wrap(fn: Lowering) -> Lowering:
        for target in targets:
            if target in LOWERINGS:
                raise ValueError(f"{target} has two lowerings: {LOWERINGS[target].__name__}, {fn.__name__}")
            LOWERINGS[target] = fn
        return fn
    return wrap


def unsupported(target, reason: str) -> None:
    UNSUPPORTED[target] = reason


@dataclass
class LowerCtx:
    """What a lowering may know about the FX node it lowers: the output's dtype and shape."""
    fx_node: torch.fx.Node
    symbol_names: dict[str, str]

    @property
    def val(self):
        return self.fx_node.meta.get("val")

    @property
    def out_dtype(self) -> DType:
        val = self.val
        val = val[0] if isinstance(val, (tuple, list)) else val
        return kiln_dtype(val.dtype)

    @property
    def out_shape(self) -> tuple[Expr, ...]:
        val = self.val
        val = val[0] if isinstance(val, (tuple, list)) else val
        return tuple(to_expr(d, self.symbol_names) for d in val.shape)

    def scalar(self, value, like: Node | DType) -> Node:
        """A Python number as a 0-d constant, or a tensor passed through."""
        if isinstance(value, Node):
            return value
        dtype = like if isinstance(like, DType) else like.dtype
        if isinstance(value, Expr):
            return build.cast(build.scalar_of(value), dtype)
        return build.constant(value, dtype)


def all_lowerings() -> dict[Any, Lowering]:
    """Importing the lowering modules fills the registry."""
    from . import lowerings  # noqa: F401  (registers on import)
    return LOWERINGS
