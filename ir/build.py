"""Small constructors over `Node` that the frontend and rules build with: broadcasting as explicit
Reshape + Expand, views that vanish when they change nothing, and typed scalar constants."""
from __future__ import annotations

from typing import Sequence

from .dtypes import DType
from .errors import ShapeError
from .graph import Node
from .ops import IOTA_INDEX, Op
from .symbolic import Expr, IntLike, Shape, fmt_shape, shape_of


def constant(value: float | int | bool, dtype: DType, shape: Sequence[IntLike] = ()) -> Node:
    if dtype is DType.BOOL:
        value = bool(value)
    elif dtype.is_int:
        value = int(value)
    else:
        value = float(value)
    return broadcast_to(Node(Op.CONSTANT, value=value, dtype=dtype), shape_of(shape))


def iota(length: IntLike, dtype: DType = DType.I64, start: IntLike = 0, step: IntLike = 1) -> Node:
    """[start, start + step, ...] of `length` values; start and step may be symbolic."""
    expr = Expr.of(start) + Expr.of(step) * Expr.of(IOTA_INDEX)
    return Node(Op.IOTA, expr=expr, length=Expr.of(length), dtype=dtype)


def scalar_of(expr: IntLike, dtype: DType = DType.I64) -> Node:
    """A symbolic dimension as a 0-d tensor (e.g. the sequence length for a mean)."""
    return reshape(iota(1, dtype, start=expr, step=0), ())


def cast(x: Node, dtype: DType) -> Node:
    return x if x.dtype is dtype else Node(Op.CAST, [x], dtype=dtype)


def reshape(x: Node, shape: Sequence[IntLike]) -> Node:
    shape = shape_of(shape)
    if shape == x.shape:
        return x
    if x.op is Op.RESHAPE:  # reshape of a reshape is one reshape
        x = x.inputs[0]
    return x if shape == x.shape else Node(Op.RESHAPE, [x], shape=shape)


def expand(x: Node, shape: Sequence[IntLike]) -> Node:
    shape = shape_of(shape)
    return x if shape == x.shape else Node(Op.EXPAND, [x], shape=shape)


def permute(x: Node, perm: Sequence[int]) -> Node:
    perm = tuple(int(p) for p in perm)
    return x if perm == tuple(range(x.rank)) else Node(Op.PERMUTE, [x], perm=perm)


def slice_axis(x: Node, axis: int, start: IntLike, stop: IntLike, step: int = 1) -> Node:
    start, stop = Expr.of(start), Expr.of(stop)
    if start == 0 and stop == x.shape[axis] and step == 1:
        return x
    return Node(Op.SLICE, [x], axis=axis, start=start, stop=stop, step=int(step))


def broadcast_shapes(*shapes: Shape) -> Shape:
    rank = max(len(s) for s in shapes)
    out = []
    for i in range(rank):
        dims = {s[len(s) - rank + i] for s in shapes if len(s) - rank + i >= 0}
        dims.discard(Expr.of(1))
        if len(dims) > 1:
            raise ShapeError("cannot broadcast shapes " + ", ".join(map(fmt_shape, shapes)))
        out.append(dims.pop() if dims else Expr.of(1))
    return tuple(out)


def broadcast_to(x: Node, shape: Shape) -> Node:
    shape = shape_of(shape)
    if len(shape) < x.rank:
        raise ShapeError(f"cannot broadcast {fmt_shape(x.shape)} to the lower rank {fmt_shape(shape)}")
    x = reshape(x, (1,) * (len(shape) - x.rank) + x.shape)
    return expand(x, shape)


def broadcast(*xs: Node) -> list[Node]:
    shape = broadcast_shapes(*(x.shape for x in xs))
    return [broadcast_to(x, shape) for x in xs]


def elementwise(op: Op, *xs: Node) -> Node:
    """An elementwise primitive with NumPy-style broadcasting of its inputs."""
    return Node(op, broadcast(*xs))


def reduce(op: Op, x: Node, axes: Sequence[int], keepdim: bool = False) -> Node:
    """Reduce several axes, one primitive per axis, from the last so indices stay valid."""
    axes = sorted({a % x.rank for a in axes} if x.rank else set(), reverse=True)
    out = x
    for axis in axes:
        out = Node(op, [out], axis=axis)
    if keepdim:
        out = reshape(out, tuple(1 if i in axes else d for i, d in enumerate(x.shape)))
    return out
