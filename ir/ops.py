"""The op table: the single source of truth for every primitive's arity, attributes, dtype rule,
shape rule and numpy meaning. The interpreter, the fuzzer and the emitters all read `OPS`."""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np

from .dtypes import DType, accumulator
from .errors import KilnTypeError, ShapeError
from .symbolic import Expr, Shape, fmt_shape, prod

IOTA_INDEX = "_i"  # the index variable of an Iota's expression


class Kind(Enum):
    SOURCE = "source"        # no tensor inputs
    UNARY = "unary"          # elementwise, one input
    BINARY = "binary"        # elementwise, two inputs of one shape and dtype
    TERNARY = "ternary"      # elementwise select
    REDUCE = "reduce"        # removes one axis
    VIEW = "view"            # indexing only: no arithmetic, no copy in generated code
    INDEX = "index"          # data-dependent indexing (gather, slice update)
    CAST = "cast"


class Op(Enum):
    EXP2 = "Exp2"
    LOG2 = "Log2"
    SIN = "Sin"
    SQRT = "Sqrt"
    RECIP = "Recip"
    ADD = "Add"
    MUL = "Mul"
    MOD = "Mod"
    LESS_THAN = "LessThan"
    WHERE = "Where"
    SUM_REDUCE = "SumReduce"
    MAX_REDUCE = "MaxReduce"
    IOTA = "Iota"
    CAST = "Cast"
    GATHER = "Gather"
    SLICE_UPDATE = "SliceUpdate"
    CONSTANT = "Constant"
    INPUT = "Input"
    PERMUTE = "Permute"
    RESHAPE = "Reshape"
    EXPAND = "Expand"
    SLICE = "Slice"
    PAD = "Pad"
    CONCAT = "Concat"

    def __repr__(self) -> str:
        return self.value


class EvalCtx(NamedTuple):
    """What an op's numpy function may read besides its inputs."""
    attrs: dict[str, Any]
    shape: tuple[int, ...]       # the output shape, symbols substituted
    dtype: DType
    env: dict[str, int]          # symbol values

    def dim(self, expr: Expr) -> int:
        return expr.evaluate(self.env)


@dataclass(frozen=True)
class OpSpec:
    op: Op
    kind: Kind
    arity: int | None                                   # None: any number of inputs (Concat)
    attrs: tuple[str, ...]
    dtype_rule: Callable[[Sequence[DType], dict], DType]
    shape_rule: Callable[[Sequence[Shape], dict], Shape]
    evaluate: Callable[..., np.ndarray]                  # (ctx, *inputs) -> array

    @property
    def egg_name(self) -> str:
        return self.op.value


# --- dtype rules ------------------------------------------------------------------------------
def _same_dtype(op: Op, dtypes: Sequence[DType]) -> DType:
    if len(set(dtypes)) != 1:
        raise KilnTypeError(f"{op.value} needs inputs of one dtype, got {', '.join(map(repr, dtypes))}")
    return dtypes[0]


def _float_only(op: Op):
    def rule(dtypes, attrs):
        if not dtypes[0].is_float:
            raise KilnTypeError(f"{op.value} needs a float input, got {dtypes[0]!r}")
        return dtypes[0]
    return rule


def _numeric_same(op: Op):
    def rule(dtypes, attrs):
        dtype = _same_dtype(op, dtypes)
        if op is Op.MOD and dtype is DType.BOOL:
            raise KilnTypeError("Mod is not defined on bool")
        return dtype
    return rule


def _less_than_dtype(dtypes, attrs):
    _same_dtype(Op.LESS_THAN, dtypes)
    return DType.BOOL


def _where_dtype(dtypes, attrs):
    if dtypes[0] is not DType.BOOL:
        raise KilnTypeError(f"Where needs a bool condition, got {dtypes[0]!r}")
    return _same_dtype(Op.WHERE, dtypes[1:])


def _first_dtype(dtypes, attrs):
    return dtypes[0]


def _attr_dtype(dtypes, attrs):
    return attrs["dtype"]


def _gather_dtype(dtypes, attrs):
    if not dtypes[1].is_int:
        raise KilnTypeError(f"Gather needs integer indices, got {dtypes[1]!r}")
    return dtypes[0]


def _slice_update_dtype(dtypes, attrs):
    if not dtypes[2].is_int:
        raise KilnTypeError(f"SliceUpdate needs an integer start, got {dtypes[2]!r}")
    return _same_dtype(Op.SLICE_UPDATE, dtypes[:2])


def _concat_dtype(dtypes, attrs):
    return _same_dtype(Op.CONCAT, dtypes)


# --- shape rules ------------------------------------------------------------------------------
def _check_axis(op: Op, shape: Shape, axis: int) -> None:
    if not 0 <= axis < len(shape):
        raise ShapeError(f"{op.value}: axis {axis} out of range for shape {fmt_shape(shape)}")


def _same_shape(op: Op):
    def rule(shapes, attrs):
        if any(s != shapes[0] for s in shapes[1:]):
            raise ShapeError(f"{op.value} needs inputs of one shape (broadcast with Expand first), "
                             f"got {' and '.join(map(fmt_shape, shapes))}")
        return shapes[0]
    return rule


def _reduce_shape(op: Op):
    def rule(shapes, attrs):
        _check_axis(op, shapes[0], attrs["axis"])
        return shapes[0][:attrs["axis"]] + shapes[0][attrs["axis"] + 1:]
    return rule


def _scalar_shape(shapes, attrs):
    return ()


def _input_shape(shapes, attrs):
    return attrs["shape"]


def _iota_shape(shapes, attrs):
    return (attrs["length"],)


def _gather_shape(shapes, attrs):
    table, idx = shapes
    _check_axis(Op.GATHER, table, attrs["axis"])
    return table[:attrs["axis"]] + idx + table[attrs["axis"] + 1:]


def _slice_update_shape(shapes, attrs):
    dst, src, start = shapes
    axis = attrs["axis"]
    _check_axis(Op.SLICE_UPDATE, dst, axis)
    if start != () or len(src) != len(dst) or any(
            a != b for i, (a, b) in enumerate(zip(dst, src)) if i != axis):
        raise ShapeError(f"SliceUpdate: cannot write {fmt_shape(src)} into {fmt_shape(dst)} "
                         f"along axis {axis} at a start of shape {fmt_shape(start)}")
    return dst


def _permute_shape(shapes, attrs):
    perm = attrs["perm"]
    if sorted(perm) != list(range(len(shapes[0]))):
        raise ShapeError(f"Permute: {perm} is not a permutation of the axes of {fmt_shape(shapes[0])}")
    return tuple(shapes[0][p] for p in perm)


def _reshape_shape(shapes, attrs):
    if prod(shapes[0]) != prod(attrs["shape"]):
        raise ShapeError(f"Reshape: cannot view {fmt_shape(shapes[0])} as {fmt_shape(attrs['shape'])}")
    return attrs["shape"]


def _expand_shape(shapes, attrs):
    src, dst = shapes[0], attrs["shape"]
    if len(src) != len(dst) or any(a != b and a != 1 for a, b in zip(src, dst)):
        raise ShapeError(f"Expand: cannot broadcast {fmt_shape(src)} to {fmt_shape(dst)} "
                         "(only size-1 axes grow; reshape first to add axes)")
    return dst


def _slice_shape(shapes, attrs):
    axis, start, stop, step = attrs["axis"], attrs["start"], attrs["stop"], attrs["step"]
    _check_axis(Op.SLICE, shapes[0], axis)
    if step < 1:
        raise ShapeError(f"Slice: step must be positive, got {step}")
    length = (stop - start + (step - 1)) // step
    return shapes[0][:axis] + (length,) + shapes[0][axis + 1:]


def _pad_shape(shapes, attrs):
    axis = attrs["axis"]
    _check_axis(Op.PAD, shapes[0], axis)
    return shapes[0][:axis] + (attrs["before"] + shapes[0][axis] + attrs["after"],) + shapes[0][axis + 1:]


def _concat_shape(shapes, attrs):
    axis = attrs["axis"]
    first = shapes[0]
    _check_axis(Op.CONCAT, first, axis)
    for s in shapes[1:]:
        if len(s) != len(first) or any(a != b for i, (a, b) in enumerate(zip(first, s)) if i != axis):
            raise ShapeError(f"Concat along axis {axis}: {fmt_shape(first)} and {fmt_shape(s)} differ")
    total = first[axis]
    for s in shapes[1:]:
        total = total + s[axis]
    return first[:axis] + (total,) + first[axis + 1:]


# --- numpy semantics --------------------------------------------------------------------------
_LOW_FLOATS = ("float16", "bfloat16")     # by name: bf16's numpy type loads only when used


def cast_array(x: np.ndarray, dtype: DType) -> np.ndarray:
    """What Cast means, for every pair of dtypes; the emitters implement the same (numpy's and
    ml_dtypes' own casts differ between versions and leave out-of-range values undefined):
    - to bool: x != 0 (NaN is true);
    - float to integer: toward zero; beyond the type's range it saturates to its min or max, and
      NaN gives 0 (PyTorch leaves both undefined: its CPU kernels give INT_MIN, CUDA saturates);
    - to f16 and bf16: rounded to nearest even from f32, integers first rounded to f32, as
      PyTorch's casts do (so 2^24 + 2^16 + 1 goes to 2^24, a tie after the first rounding);
      NaN stays NaN and what overflows becomes an infinity;
    - to f32: rounded to nearest even once; between integers and from bool: exact, or wrapped
      modulo 2^32 from i64 to i32."""
    target = dtype.np
    if x.dtype == target:
        return x
    if dtype is DType.BOOL:
        return np.not_equal(x, 0)
    if dtype.is_int and x.dtype.kind not in "iub":      # from a float (bf16's kind is "V")
        return _float_to_int(x.astype(np.float64), target)
    if dtype in (DType.F16, DType.BF16) and x.dtype != np.float32:
        x = x.astype(np.float32)                        # exact from f16/bf16 and bool
    if dtype is DType.BF16:
        return _f32_to_bf16(x)
    with np.errstate(over="ignore"):                    # to an infinity, as defined
        return x.astype(target)


def _float_to_int(f: np.ndarray, target: np.dtype) -> np.ndarray:
    info = np.iinfo(target)
    low, high = float(info.min), float(info.max) + 1     # both exact: -2^(b-1) and 2^(b-1)
    with np.errstate(invalid="ignore"):
        above, below = f >= high, f < low
        inside = np.where(above | below | np.isnan(f), 0.0, f)
    return np.where(above, info.max, np.where(below, info.min, np.trunc(inside).astype(target))
                    ).astype(target)


def _f32_to_bf16(x: np.ndarray) -> np.ndarray:
    """Round to nearest even on the bits (as the emitters' kiln_bf16_store); NaN stays quiet NaN."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    nan = (u & 0x7FFFFFFF) > 0x7F800000       # the rounding below wraps only for NaN's bits
    bits = np.where(nan, (u >> 16) | 0x40, (u + 0x7FFF + ((u >> 16) & 1)) >> 16)
    return bits.astype(np.uint16).view(DType.BF16.np).reshape(np.shape(x))


def _elementwise(fn: Callable[..., np.ndarray]):
    """Low-precision floats compute in f32 and round once, as PyTorch's CPU kernels do."""
    def evaluate(ctx: EvalCtx, *args: np.ndarray) -> np.ndarray:
        args = tuple(a.astype(np.float32) if a.dtype.name in _LOW_FLOATS else a for a in args)
        with np.errstate(all="ignore"):
            return cast_array(np.asarray(fn(*args)), ctx.dtype)
    return evaluate


def lowest(dtype: np.dtype):
    """MaxReduce's identity: what an empty axis reduces to, as a kernel's initial value would."""
    if dtype == np.bool_:
        return False
    return np.iinfo(dtype).min if np.issubdtype(dtype, np.integer) else -np.inf


def _reduce(fn: Callable[..., np.ndarray]):
    def evaluate(ctx: EvalCtx, x: np.ndarray) -> np.ndarray:
        acc = accumulator(ctx.dtype).np if fn is np.sum else x.dtype
        axis = ctx.attrs["axis"]
        extra = {"initial": lowest(x.dtype)} if fn is np.max and x.shape[axis] == 0 else {}
        return np.asarray(fn(x.astype(acc, copy=False), axis=axis, **extra)).astype(ctx.dtype.np)
    return evaluate


def _iota(ctx: EvalCtx) -> np.ndarray:
    index = np.arange(ctx.shape[0], dtype=np.int64)
    values = ctx.attrs["expr"].evaluate({**ctx.env, IOTA_INDEX: index})
    return np.broadcast_to(np.asarray(values, dtype=np.int64), ctx.shape).astype(ctx.dtype.np)


def _input(ctx: EvalCtx) -> np.ndarray:
    raise RuntimeError("Input nodes are bound by the interpreter, never evaluated")


def _slice_update(ctx: EvalCtx, dst: np.ndarray, src: np.ndarray, start: np.ndarray) -> np.ndarray:
    axis, begin = ctx.attrs["axis"], int(start)
    if not 0 <= begin <= dst.shape[axis] - src.shape[axis]:
        raise IndexError(f"SliceUpdate: a slice of {src.shape[axis]} at {begin} does not fit "
                         f"an axis of {dst.shape[axis]}")
    out = dst.copy()
    index = [slice(None)] * dst.ndim
    index[axis] = slice(begin, begin + src.shape[axis])
    out[tuple(index)] = src
    return out


def _slice(ctx: EvalCtx, x: np.ndarray) -> np.ndarray:
    a = ctx.attrs
    index = [slice(None)] * x.ndim
    index[a["axis"]] = slice(ctx.dim(a["start"]), ctx.dim(a["stop"]), a["step"])
    return x[tuple(index)]


def _pad(ctx: EvalCtx, x: np.ndarray) -> np.ndarray:
    a = ctx.attrs
    widths = [(0, 0)] * x.ndim
    widths[a["axis"]] = (ctx.dim(a["before"]), ctx.dim(a["after"]))
    return np.pad(x, widths, constant_values=np.asarray(a["value"]).astype(x.dtype))


def _spec(op, kind, arity, attrs, dtype_rule, shape_rule, evaluate) -> OpSpec:
    return OpSpec(op, kind, arity, attrs, dtype_rule, shape_rule, evaluate)


_U, _B = Kind.UNARY, Kind.BINARY
OPS: dict[Op, OpSpec] = {s.op: s for s in [
    _spec(Op.EXP2, _U, 1, (), _float_only(Op.EXP2), _same_shape(Op.EXP2), _elementwise(np.exp2)),
    _spec(Op.LOG2, _U, 1, (), _float_only(Op.LOG2), _same_shape(Op.LOG2), _elementwise(np.log2)),
    _spec(Op.SIN, _U, 1, (), _float_only(Op.SIN), _same_shape(Op.SIN), _elementwise(np.sin)),
    _spec(Op.SQRT, _U, 1, (), _float_only(Op.SQRT), _same_shape(Op.SQRT), _elementwise(np.sqrt)),
    _spec(Op.RECIP, _U, 1, (), _float_only(Op.RECIP), _same_shape(Op.RECIP),
          _elementwise(np.reciprocal)),
    # on bool, Add is "or" and Mul is "and" (numpy's meaning)
    _spec(Op.ADD, _B, 2, (), _numeric_same(Op.ADD), _same_shape(Op.ADD), _elementwise(np.add)),
    _spec(Op.MUL, _B, 2, (), _numeric_same(Op.MUL), _same_shape(Op.MUL), _elementwise(np.multiply)),
    # truncated remainder, the sign of the dividend: C's fmod and %
    _spec(Op.MOD, _B, 2, (), _numeric_same(Op.MOD), _same_shape(Op.MOD), _elementwise(np.fmod)),
    _spec(Op.LESS_THAN, _B, 2, (), _less_than_dtype, _same_shape(Op.LESS_THAN),
          _elementwise(np.less)),
    _spec(Op.WHERE, Kind.TERNARY, 3, (), _where_dtype, _same_shape(Op.WHERE), _elementwise(np.where)),
    _spec(Op.SUM_REDUCE, Kind.REDUCE, 1, ("axis",), _numeric_same(Op.SUM_REDUCE),
          _reduce_shape(Op.SUM_REDUCE), _reduce(np.sum)),
    _spec(Op.MAX_REDUCE, Kind.REDUCE, 1, ("axis",), _first_dtype, _reduce_shape(Op.MAX_REDUCE),
          _reduce(np.max)),
    # value[i] = expr with IOTA_INDEX bound to i (and the graph's symbols to theirs)
    _spec(Op.IOTA, Kind.SOURCE, 0, ("expr", "length", "dtype"), _attr_dtype, _iota_shape, _iota),
    _spec(Op.CAST, Kind.CAST, 1, ("dtype",), _attr_dtype, _same_shape(Op.CAST),
          lambda ctx, x: cast_array(x, ctx.dtype)),
    # np.take: out[..., j..., ...] = table[..., idx[j...], ...] along axis
    _spec(Op.GATHER, Kind.INDEX, 2, ("axis",), _gather_dtype, _gather_shape,
          lambda ctx, t, i: np.take(t, i, axis=ctx.attrs["axis"])),
    # dst with src written at [start, start + len) along axis; start is a scalar integer tensor
    _spec(Op.SLICE_UPDATE, Kind.INDEX, 3, ("axis",), _slice_update_dtype, _slice_update_shape,
          _slice_update),
    _spec(Op.CONSTANT, Kind.SOURCE, 0, ("value", "dtype"), _attr_dtype, _scalar_shape,
          lambda ctx: np.asarray(ctx.attrs["value"]).astype(ctx.dtype.np)),
    # role: "input" (an argument of each call) or "weight" (a named tensor of the graph)
    _spec(Op.INPUT, Kind.SOURCE, 0, ("name", "role", "shape", "dtype"), _attr_dtype, _input_shape,
          _input),
    _spec(Op.PERMUTE, Kind.VIEW, 1, ("perm",), _first_dtype, _permute_shape,
          lambda ctx, x: np.transpose(x, ctx.attrs["perm"])),
    _spec(Op.RESHAPE, Kind.VIEW, 1, ("shape",), _first_dtype, _reshape_shape,
          lambda ctx, x: x.reshape(ctx.shape)),
    _spec(Op.EXPAND, Kind.VIEW, 1, ("shape",), _first_dtype, _expand_shape,
          lambda ctx, x: np.broadcast_to(x, ctx.shape)),
    _spec(Op.SLICE, Kind.VIEW, 1, ("axis", "start", "stop", "step"), _first_dtype, _slice_shape,
          _slice),
    _spec(Op.PAD, Kind.VIEW, 1, ("axis", "before", "after", "value"), _first_dtype, _pad_shape, _pad),
    _spec(Op.CONCAT, Kind.VIEW, None, ("axis",), _concat_dtype, _concat_shape,
          lambda ctx, *xs: np.concatenate(xs, axis=ctx.attrs["axis"])),
]}

# in the table's order (a fuzzer's draws stay reproducible)
UNARY = tuple(op for op, s in OPS.items() if s.kind is Kind.UNARY)
BINARY = tuple(op for op, s in OPS.items() if s.kind is Kind.BINARY)
ELEMENTWISE = frozenset((*UNARY, *BINARY, Op.WHERE, Op.CAST))
REDUCE = frozenset(op for op, s in OPS.items() if s.kind is Kind.REDUCE)
VIEWS = frozenset(op for op, s in OPS.items() if s.kind is Kind.VIEW)
