"""Convolution, pooling and resampling over the trailing spatial axes of [N, C, *spatial] tensors.

Windows are gathered unfold-style: one strided Slice of the padded input per kernel tap, stacked on
a new axis. A convolution is then one contraction (a matmul) over channels x taps, and a pooling
one reduction over the taps. Sizes are static: the taps are unrolled at lowering time.
"""
from __future__ import annotations

import itertools

import numpy as np

from ...ir import DType, Expr, Node, Op, UnsupportedOp
from ...ir import build
from ...ir.ops import IOTA_INDEX
from ...ir.symbolic import prod
from .. import math as m
from ..registry import LowerCtx, aten, register_lowering, unsupported
from .pointwise import opmath
from .reductions import arg_best, matmul, sum_
from .views import flip, pad_axis


def _ints(values, n: int, default=None) -> list[int]:
    """An int[n] argument as n ints: ATen accepts one value for all axes, or none for the default."""
    values = list(values) if isinstance(values, (list, tuple)) else [values]
    if not values:
        values = list(default)
    return values * n if len(values) == 1 else values


def _static(dims, what: str) -> list[int]:
    if not all(d.is_const for d in dims):
        raise UnsupportedOp(f"kiln: {what} over symbolic spatial sizes ({', '.join(map(str, dims))}) "
                            "is unrolled per tap and needs static sizes")
    return [d.value for d in dims]


def windows(x: Node, kernel, stride, padding, dilation, out_size, value: float) -> Node:
    """x [..., *S] -> [..., K, *O]: for each of the K kernel taps (row-major), the input element that
    tap reads at every output position. Padding holds value, also past the end where ceil_mode
    lets a window run over."""
    first = x.rank - len(kernel)
    sizes = _static(x.shape[first:], "a sliding window")
    out_size = _static([Expr.of(o) for o in out_size], "a sliding window")
    for i, (k, s, p, d, o) in enumerate(zip(kernel, stride, padding, dilation, out_size)):
        reach = (o - 1) * s + (k - 1) * d + 1                 # padded extent the windows read
        x = pad_axis(x, first + i, p, max(reach - p - sizes[i], 0), value)
    taps = []
    for tap in itertools.product(*(range(k) for k in kernel)):
        t = x
        for i, (j, s, d, o) in enumerate(zip(tap, stride, dilation, out_size)):
            t = build.slice_axis(t, first + i, j * d, j * d + (o - 1) * s + 1, s)
        taps.append(build.reshape(t, t.shape[:first] + (Expr.of(1),) + t.shape[first:]))
    return taps[0] if len(taps) == 1 else Node(Op.CONCAT, taps, axis=first)


# --- convolution ------------------------------------------------------------------------------
@register_lowering(aten.convolution.default)
def lower_convolution(ctx: LowerCtx, x, weight, bias, stride, padding, dilation, transposed,
                      output_padding, groups):
    work = opmath(ctx.out_dtype)
    x, weight = build.cast(x, work), build.cast(weight, work)
    n = weight.rank - 2
    stride, padding, dilation = _ints(stride, n), _ints(padding, n), _ints(dilation, n)
    if transposed:
        x, weight = _as_direct(x, weight, stride, padding, dilation, _ints(output_padding, n), groups)
        stride, padding = [1] * n, [0] * n
    kernel = _static(weight.shape[2:], "a convolution")
    out = tuple(ctx.out_shape[2:])
    batch, per_group = x.shape[:-n - 1], weight.shape[1] * prod(weight.shape[2:])   # C/G * K
    taps = windows(x, kernel, stride, padding, dilation, out, 0.0)                 # [.., C, K, *O]
    cols = build.reshape(taps, batch + (Expr.of(groups), per_group, prod(out)))   # [.., G, C/G*K, L]
    filters = build.reshape(weight, (Expr.of(groups), weight.shape[0] // groups, per_group))
    y = matmul(filters, cols, work)                                                # [.., G, O/G, L]
    y = build.reshape(y, batch + (weight.shape[0],) + out)
    if bias is not None:
        y = m.add(y, build.reshape(build.cast(bias, work), (weight.shape[0],) + (Expr.of(1),) * n))
    return build.cast(y, ctx.out_dtype)


def _as_direct(x: Node, weight: Node, stride, padding, dilation, output_padding, groups):
    """A transposed convolution as a direct one: the input spread out by stride (zeros between),
    padded by dilation * (k - 1) - padding, and the kernel flipped with in/out channels swapped."""
    n = weight.rank - 2
    kernel = _static(weight.shape[2:], "a transposed convolution")
    first = x.rank - n
    for i in range(n):
        axis, size = first + i, x.shape[first + i]
        if stride[i] > 1:  # [.., S, 1] padded to [.., S, s], merged, and the trailing zeros cut
            x = build.reshape(x, x.shape[:axis + 1] + (Expr.of(1),) + x.shape[axis + 1:])
            x = pad_axis(x, axis + 1, 0, stride[i] - 1)
            x = build.reshape(x, x.shape[:axis] + (size * stride[i],) + x.shape[axis + 2:])
            x = build.slice_axis(x, axis, 0, (size - 1) * stride[i] + 1)
        edge = dilation[i] * (kernel[i] - 1) - padding[i]
        x = pad_axis(x, axis, edge, edge + output_padding[i])
    cin, cout = weight.shape[0], weight.shape[1]
    w = flip(weight, range(2, weight.rank))
    w = build.reshape(w, (Expr.of(groups), cin // groups, cout) + weight.shape[2:])
    w = build.permute(w, [0, 2, 1] + list(range(3, w.rank)))
    return x, build.reshape(w, (cout * groups, cin // groups) + weight.shape[2:])


# --- pooling ----------------------------------------------------------------------------------
def _avg_pool(spatial: int):
    def lower(ctx: LowerCtx, x, kernel_size, stride=(), padding=0, ceil_mode=False,
              count_include_pad=True, divisor_override=None):
        kernel = _ints(kernel_size, spatial)
        stride, padding = _ints(stride, spatial, kernel), _ints(padding, spatial)
        out = tuple(ctx.out_shape[-spatial:])
        ones = [1] * spatial
        work = opmath(x.dtype)
        taps = windows(build.cast(x, work), kernel, stride, padding, ones, out, 0.0)
        total = sum_(taps, [x.rank - spatial])
        if divisor_override:
            return build.cast(m.div(total, m.c(divisor_override, total)), ctx.out_dtype)
        # the divisor counts the window's positions inside the input, or inside input + padding
        # (never the run-over ceil_mode adds): windows of a mask of the counted positions
        inside = build.constant(1, work, x.shape[-spatial:])
        if count_include_pad:
            for i, p in enumerate(padding):
                inside = pad_axis(inside, i, p, p, 1.0)
            padding = [0] * spatial
        counts = sum_(windows(inside, kernel, stride, padding, ones, out, 0.0), [0])
        return build.cast(m.div(total, counts), ctx.out_dtype)
    lower.__name__ = f"lower_avg_pool{spatial}d"
    return lower


register_lowering(aten.avg_pool2d.default)(_avg_pool(2))
register_lowering(aten.avg_pool3d.default)(_avg_pool(3))


def _max_pool(spatial: int):
    def lower(ctx: LowerCtx, x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
        """(max, flat index of the max in the input's spatial plane), the first one on ties."""
        kernel = _ints(kernel_size, spatial)
        stride, padding = _ints(stride, spatial, kernel), _ints(padding, spatial)
        dilation, out = _ints(dilation, spatial), tuple(ctx.out_shape[-spatial:])
        low = -np.inf if x.dtype.is_float else float(np.iinfo(x.dtype.np).min)
        taps = windows(x, kernel, stride, padding, dilation, out, low)          # [.., K, *O]
        axis = x.rank - spatial
        values, best = arg_best(taps, axis, keepdim=True, largest=True)
        plane = build.reshape(build.iota(prod(x.shape[-spatial:])), x.shape[-spatial:])
        where_read = windows(plane, kernel, stride, padding, dilation, out, -1.0)  # [K, *O]
        taps_per_window = int(np.prod(kernel))
        tap = build.reshape(build.iota(taps_per_window), (taps_per_window,) + (Expr.of(1),) * spatial)
        chosen = m.where(m.eq(tap, best), where_read, m.c(-1, where_read))
        return build.reshape(values, ctx.out_shape), Node(Op.MAX_REDUCE, [chosen], axis=axis)
    lower.__name__ = f"lower_max_pool{spatial}d"
    return lower


register_lowering(aten.max_pool2d_with_indices.default)(_max_pool(2))
register_lowering(aten.max_pool3d_with_indices.default)(_max_pool(3))


def _adaptive_avg_pool(ctx: LowerCtx, x, output_size):
    """Output cell o averages input [floor(o * S / O), ceil((o + 1) * S / O)): per axis a matmul
    with that [S, O] averaging matrix, built from Iotas."""
    work = opmath(x.dtype)
    y = build.cast(x, work)
    spatial = len(output_size)
    for i, o in enumerate(output_size):
        axis = y.rank - spatial + i
        size, o = y.shape[axis], Expr.of(o)
        index = Expr.of(IOTA_INDEX)
        start = Node(Op.IOTA, expr=index * size // o, length=o, dtype=DType.I64)
        stop = Node(Op.IOTA, expr=((index + 1) * size + o - 1) // o, length=o, dtype=DType.I64)
        s = build.reshape(build.iota(size), (size, 1))
        inside = m.logical_and(m.le(build.reshape(start, (1, o)), s), m.lt(s, build.reshape(stop, (1, o))))
        weights = m.div(build.cast(inside, work), build.cast(build.reshape(m.sub(stop, start), (1, o)), work))
        moved = build.permute(y, [a for a in range(y.rank) if a != axis] + [axis])
        y = matmul(build.reshape(moved, moved.shape[:-1] + (Expr.of(1), size)), weights, work)
        back = list(range(moved.rank - 1))
        back.insert(axis, moved.rank - 1)
        y = build.permute(build.reshape(y, moved.shape[:-1] + (o,)), back)
    return build.cast(y, ctx.out_dtype)


register_lowering(aten._adaptive_avg_pool2d.default, aten._adaptive_avg_pool3d.default)(_adaptive_avg_pool)


# --- resampling -------------------------------------------------------------------------------
def _source_scale(size: int, out: int, scale_factor, align_corners: bool = False) -> np.float32:
    """torch's float32 ratio from output to input coordinates (UpSample.h)."""
    if align_corners:
        return np.float32((size - 1) / (out - 1) if out > 1 else 0.0)
    if scale_factor:
        return np.float32(1.0 / scale_factor)
    return np.float32(size) / np.float32(out)


def _nearest(exact: bool):
    def lower(ctx: LowerCtx, x, output_size, scale_factors):
        """Each output index reads input min(floor(o * scale), S - 1) (nearest-exact: o + 0.5)."""
        out = _static(ctx.out_shape[2:], "nearest upsampling")
        scales = scale_factors or [None] * len(out)
        for i, (o, factor) in enumerate(zip(out, scales)):
            axis = 2 + i
            size = x.shape[axis].value
            position = build.cast(build.iota(o), DType.F32)
            if exact:
                position = m.add(position, m.c(0.5, position))
            src = m.floor(m.mul(position, m.c(_source_scale(size, o, factor), position)))
            index = m.minimum(build.cast(src, DType.I64), build.constant(size - 1, DType.I64))
            x = Node(Op.GATHER, [x, index], axis=axis)
        return x
    lower.__name__ = f"lower_upsample_nearest{'_exact' if exact else ''}"
    return lower


register_lowering(aten.upsample_nearest1d.vec, aten.upsample_nearest2d.vec,
                  aten.upsample_nearest3d.vec)(_nearest(exact=False))
register_lowering(aten._upsample_nearest_exact1d.vec, aten._upsample_nearest_exact2d.vec,
                  aten._upsample_nearest_exact3d.vec)(_nearest(exact=True))


@register_lowering(aten.upsample_bilinear2d.vec, aten.upsample_linear1d.vec, aten.upsample_trilinear3d.vec)
def lower_upsample_linear(ctx: LowerCtx, x, output_size, align_corners, scale_factors):
    """Separable: along each axis, the two nearest inputs blended by the distance (torch's
    area_pixel_compute_source_index, in f32), the last axis first as torch's kernel nests it."""
    work = opmath(x.dtype)
    y = build.cast(x, work)
    out = _static(ctx.out_shape[2:], "linear upsampling")
    scales = scale_factors or [None] * len(out)
    for i in reversed(range(len(out))):
        axis, o, size = 2 + i, out[i], x.shape[2 + i].value
        scale = m.c(_source_scale(size, o, scales[i], align_corners), y)
        position = build.cast(build.iota(o), work)
        if align_corners:
            src = m.mul(position, scale)
        else:
            src = m.maximum(m.sub(m.mul(m.add(position, m.c(0.5, y)), scale), m.c(0.5, y)), m.c(0, y))
        low = m.trunc(src)
        i0 = build.cast(low, DType.I64)
        i1 = m.minimum(m.add(i0, m.c(1, i0)), build.constant(size - 1, DType.I64))
        shape = tuple(Expr.of(o) if a == axis else Expr.of(1) for a in range(y.rank))
        far = build.reshape(m.sub(src, low), shape)
        near = m.sub(m.c(1, far), far)
        low_side, high_side = Node(Op.GATHER, [y, i0], axis=axis), Node(Op.GATHER, [y, i1], axis=axis)
        y = m.add(m.mul(low_side, near), m.mul(high_side, far))
    return build.cast(y, ctx.out_dtype)


unsupported(aten._upsample_bilinear2d_aa.default, "antialiased resampling has no lowering yet")
unsupported(aten.upsample_bicubic2d.vec, "bicubic resampling has no lowering yet")
unsupported(aten.adaptive_max_pool2d.default, "adaptive max pooling has no lowering yet (avg has)")
unsupported(aten.grid_sampler_2d.default, "grid sampling gathers at data-dependent coordinates")
