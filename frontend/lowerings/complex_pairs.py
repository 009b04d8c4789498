"""Complex numbers as pairs of real tensors: the IR has no complex type, and the models that use
one (Llama 4's rotary: `polar`, `view_as_complex`, a complex product, `view_as_real`) only
multiply and view them. A complex value lives in the lowering as `Complex(re, im)`, two f32
nodes of its shape; `view_as_real` turns it back into the real tensor [..., 2] the model reads.

`lower_complex` takes any call that a complex value reaches: arithmetic and `view_as_real` in
COMPLEX_ARITHMETIC,
views applied to each part alike (PARTWISE, with the real lowering of the op), anything else a
clear refusal."""
from __future__ import annotations

from dataclasses import dataclass

from ...ir import DType, Node, Op, UnsupportedOp
from ...ir import build
from .. import math as m
from ..registry import LowerCtx, aten, register_lowering


@dataclass(frozen=True)
class Complex:
    re: Node
    im: Node


def _real(x) -> Node | float:
    """A real operand as f32 (a Python number stays a number)."""
    return build.cast(x, DType.F32) if isinstance(x, Node) else float(x)


def _times(x: Node, y) -> Node:
    return m.mul(x, y if isinstance(y, Node) else m.c(y, x))


def _plus(x: Node, y) -> Node:
    return m.add(x, y if isinstance(y, Node) else m.c(y, x))


def _mul(a, b) -> Complex:
    if not isinstance(a, Complex):
        a, b = b, a
    if isinstance(b, Complex):      # (a.re + i a.im)(b.re + i b.im)
        return Complex(m.sub(m.mul(a.re, b.re), m.mul(a.im, b.im)), m.add(m.mul(a.re, b.im), m.mul(a.im, b.re)))
    b = _real(b)
    return Complex(_times(a.re, b), _times(a.im, b))


def _scaled(x, factor):
    if isinstance(x, Complex):
        return _mul(x, factor)
    return _times(_real(x), factor) if isinstance(x, Node) else x * factor


def _add(a, b, alpha=1) -> Complex:
    if alpha != 1:
        b = _scaled(b, alpha)
    if not isinstance(a, Complex):
        a, b = b, a
    if isinstance(b, Complex):
        return Complex(m.add(a.re, b.re), m.add(a.im, b.im))
    return Complex(_plus(a.re, _real(b)), a.im)


def _sub(a, b, alpha=1) -> Complex:
    return _add(a, _scaled(b, -alpha))


def _as_real(z: Complex) -> Node:
    shape = (*z.re.shape, 1)
    return Node(Op.CONCAT, [build.reshape(z.re, shape), build.reshape(z.im, shape)], axis=len(shape) - 1)


COMPLEX_ARITHMETIC = {aten.mul.Tensor: _mul, aten.mul.Scalar: _mul, aten.add.Tensor: _add,
                      aten.add.Scalar: _add, aten.sub.Tensor: _sub, aten.sub.Scalar: _sub,
                      aten.view_as_real.default: _as_real}
# views and copies: the real lowering applied to each part, the other arguments alike
PARTWISE = {aten.view.default, aten.reshape.default, aten._unsafe_view.default, aten.unsqueeze.default,
            aten.squeeze.dim, aten.squeeze.dims, aten.expand.default, aten.permute.default,
            aten.slice.Tensor, aten.select.int, aten.clone.default, aten.alias.default}


class _PartCtx(LowerCtx):
    """The lowering context of a complex op seen from one of its f32 parts."""

    @property
    def out_dtype(self) -> DType:
        return DType.F32


def lower_complex(target, ctx: LowerCtx, *args, lowerings: dict, **kwargs):
    """A call that a complex value reaches (`lowerings`: the real ones, by target)."""
    if target in COMPLEX_ARITHMETIC:
        return COMPLEX_ARITHMETIC[target](*args, **kwargs)
    if target in PARTWISE and isinstance(args[0], Complex) and not any(
            isinstance(a, Complex) for a in (*args[1:], *kwargs.values())):
        part = _PartCtx(ctx.fx_node, ctx.symbol_names)
        lower = lowerings[target]
        return Complex(lower(part, args[0].re, *args[1:], **kwargs), lower(part, args[0].im, *args[1:], **kwargs))
    raise UnsupportedOp(f"kiln: a complex value reaches {target}, which has no complex lowering "
                        f"(complex values lower as pairs of real tensors through polar, view_as_complex, "
                        f"view_as_real, add, sub, mul and views)")


@register_lowering(aten.polar.default)
def lower_polar(ctx: LowerCtx, magnitude, angle):
    magnitude, angle = _real(magnitude), _real(angle)
    magnitude, angle = build.broadcast(magnitude, angle)
    return Complex(m.mul(magnitude, m.cos(angle)), m.mul(magnitude, m.unary(Op.SIN, angle)))


@register_lowering(aten.view_as_complex.default)
def lower_view_as_complex(ctx: LowerCtx, pairs: Node):
    pairs = _real(pairs)
    last = pairs.rank - 1
    re, im = (build.reshape(build.slice_axis(pairs, last, k, k + 1), pairs.shape[:-1]) for k in (0, 1))
    return Complex(re, im)


@register_lowering(aten.view_as_real.default)
def lower_view_as_real(ctx: LowerCtx, z):
    """Reached only with a real tensor (a complex one goes through lower_complex)."""
    raise UnsupportedOp("kiln: view_as_real of a real tensor")
