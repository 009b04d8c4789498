"""Every ATen op Kiln lowers, checked on PyTorch's own OpInfo samples.

For each OpInfo in CASES, the first few sample inputs of each listed dtype are wrapped in a tiny
module, lowered as `kiln.lower` does (torch.export + the core-ATen decompositions), run by the numpy
reference interpreter and compared with eager PyTorch at the dtype's default tolerance. The OpInfos
in UNDECOMPOSED are also lowered from the graph before decomposition, which keeps ops (tril,
transpose, logsumexp...) the decompositions rewrite away. A sample that cannot apply is skipped with
its reason, never dropped. `test_every_lowering_is_exercised` then checks that each registered
lowering target was reached by some sample, or is listed in NOT_IN_OPINFO with the reason and the
test that covers it instead (mostly `test_outside_opinfo`, one small module per target).

The samples of one (OpInfo, dtype) are lowered together as one graph: decomposing costs ~0.2 s of
fixed overhead per program, most of this file's time. Whatever fails in that batch is rerun sample
by sample, so each failure or skip names its own sample.
"""
from __future__ import annotations

import itertools
import warnings
from functools import cache
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.utils import _pytree as pytree

import kiln
from kiln.frontend.lower import export, lower_exported
from kiln.frontend.registry import UNSUPPORTED, all_lowerings
from kiln.ir.tensors import kiln_dtype, torch_dtype
from kiln.ir import ExportError, UnsupportedOp

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from torch.testing._internal.common_methods_invocations import op_db

aten = torch.ops.aten
F32, I64, BOOL, BF16 = torch.float32, torch.int64, torch.bool, torch.bfloat16
# samples per (OpInfo, dtype): the first ones are the plain shapes; later ones mostly vary
# broadcasting and arguments. Fewer for the extra dtypes, which re-check promotion and rounding.
SAMPLES = {F32: 6}
EXTRA_SAMPLES = 3
# graph nodes lower.py handles itself (getitem, symbolic arithmetic, asserts)
_NOT_LOWERINGS = ("<built-in function", "aten._assert_", "aten.sym_")

# OpInfo name -> the dtypes checked besides float32 (checked wherever the OpInfo has it), grouped
# by the lowering file they exercise.
CASES: dict[str, tuple[torch.dtype, ...]] = {
    # --- pointwise arithmetic -----------------------------------------------------------------
    "add": (I64, BOOL, BF16), "sub": (I64, BF16), "mul": (I64, BOOL, BF16), "rsub": (I64,),
    "__radd__": (), "__rsub__": (I64,), "__rmul__": (), "__rdiv__": (I64,), "__rmod__": (I64,),
    "__rpow__": (I64,),
    "div.no_rounding_mode": (I64, BF16), "div.floor_rounding": (I64,), "div.trunc_rounding": (I64,),
    "true_divide": (I64,), "floor_divide": (I64,),
    "remainder": (I64, BF16), "fmod": (I64,), "pow": (I64, BF16), "float_power": (), "square": (I64,),
    "neg": (I64,), "abs": (I64, BF16), "sign": (I64, BOOL), "sgn": (I64,), "reciprocal": (I64,),
    "maximum": (I64, BOOL), "minimum": (I64,), "max.binary": (I64,), "min.binary": (I64,),
    "clamp": (I64, BF16), "clamp_min": (I64,), "clamp_max": (I64,),
    "floor": (I64,), "ceil": (I64,), "trunc": (I64,), "round": (I64,), "frac": (BF16,),
    "lerp": (BF16,), "addcmul": (I64,), "addcdiv": (), "xlogy": (I64,), "heaviside": (I64,),
    "nan_to_num": (I64,), "deg2rad": (), "rad2deg": (),
    # --- transcendental -----------------------------------------------------------------------
    "exp": (I64, BF16), "exp2": (I64,), "expm1": (BF16,), "log": (I64, BF16), "log2": (I64,),
    "log10": (), "log1p": (I64,), "sqrt": (I64, BF16), "rsqrt": (BF16,), "sin": (I64, BF16),
    "cos": (BF16,), "tan": (), "asin": (), "acos": (), "atan": (BF16,), "atan2": (I64,), "sinh": (),
    "cosh": (), "asinh": (), "acosh": (), "atanh": (), "tanh": (BF16,), "sigmoid": (I64, BF16),
    "erf": (BF16,), "erfinv": (), "sinc": (), "logit": (), "logaddexp": (BF16,), "logaddexp2": (), "special.ndtr": (),
    "special.entr": (), "special.xlog1py": (),
    # --- comparisons and logic ----------------------------------------------------------------
    "eq": (I64, BOOL), "ne": (I64, BOOL), "lt": (I64, BOOL), "le": (I64,), "gt": (I64,), "ge": (I64,),
    "isclose": (I64,), "isnan": (), "isfinite": (), "isposinf": (), "isneginf": (), "isreal": (),
    "logical_and": (I64, BOOL), "logical_or": (BOOL,), "logical_xor": (BOOL,),
    "logical_not": (I64, BOOL), "bitwise_and": (BOOL, I64), "bitwise_or": (BOOL, I64),
    "bitwise_xor": (BOOL,), "bitwise_not": (BOOL, I64),
    "where": (I64, BOOL, BF16), "masked_fill": (I64, BOOL),
    # --- activations --------------------------------------------------------------------------
    "nn.functional.relu": (I64, BF16), "nn.functional.relu6": (), "nn.functional.leaky_relu": (),
    "nn.functional.gelu": (BF16,), "nn.functional.silu": (BF16,), "nn.functional.mish": (),
    "nn.functional.hardswish": (), "nn.functional.hardsigmoid": (), "nn.functional.hardtanh": (I64,),
    "nn.functional.hardshrink": (), "nn.functional.softshrink": (), "nn.functional.softplus": (),
    "nn.functional.softsign": (), "nn.functional.tanhshrink": (), "nn.functional.threshold": (I64,),
    "nn.functional.celu": (), "nn.functional.elu": (BF16,), "nn.functional.selu": (),
    "nn.functional.logsigmoid": (), "nn.functional.glu": (), "nn.functional.prelu": (),
    # --- reductions ---------------------------------------------------------------------------
    "sum": (I64, BOOL, BF16), "mean": (BF16,), "nansum": (), "nanmean": (), "prod": (I64,),
    "amax": (I64, BOOL), "amin": (I64, BOOL), "aminmax": (I64,), "topk": (),
    "max.reduction_no_dim": (I64,), "max.reduction_with_dim": (I64, BOOL),
    "min.reduction_no_dim": (I64,), "min.reduction_with_dim": (I64,),
    "argmax": (I64,), "argmin": (I64,), "any": (I64, BOOL), "all": (I64, BOOL), "count_nonzero": (),
    "var": (), "var.unbiased": (), "std": (), "var_mean": (), "std_mean": (),
    "logsumexp": (BF16,), "cumsum": (I64, BF16), "cumprod": (I64,), "softmax": (BF16,),
    "log_softmax": (BF16,),
    "softmax.with_dtype": (), "nn.functional.softmin": (), "torch.ops.aten._safe_softmax.default": (),
    "norm": (), "linalg.vector_norm": (BF16,), "nn.functional.normalize": (),
    "nn.functional.cosine_similarity": (), "nn.functional.pairwise_distance": (),
    # --- normalization ------------------------------------------------------------------------
    "nn.functional.layer_norm": (BF16,), "native_layer_norm": (BF16,),
    "nn.functional.rms_norm": (BF16,),
    "nn.functional.batch_norm": (BF16,), "native_batch_norm": (), "nn.functional.instance_norm": (),
    "nn.functional.group_norm": (BF16,), "native_group_norm": (BF16,),
    # --- matmul -------------------------------------------------------------------------------
    "mm": (I64, BF16), "bmm": (BF16,), "addmm": (BF16,), "baddbmm": (), "matmul": (I64, BF16),
    "mv": (), "dot": (), "vdot": (), "inner": (), "outer": (I64,), "tensordot": (), "einsum": (),
    "nn.functional.linear": (BF16,), "nn.functional.scaled_dot_product_attention": (BF16,),
    # --- views and movement -------------------------------------------------------------------
    "view": (), "reshape": (), "view_as": (), "flatten": (), "unflatten": (), "ravel": (),
    "permute": (), "transpose": (), "t": (), "movedim": (), "mT": (), "unsqueeze": (), "squeeze": (),
    "squeeze.multiple": (), "expand": (), "expand_as": (), "broadcast_to": (), "broadcast_tensors": (),
    "narrow": (), "select": (), "slice": (), "__getitem__": (), "split": (), "split_with_sizes": (),
    "chunk": (), "tensor_split": (), "unbind": (), "hsplit": (), "cat": (I64, BOOL), "stack": (),
    "hstack": (), "vstack": (), "column_stack": (), "repeat": (), "tile": (), "flip": (I64,),
    "fliplr": (), "flipud": (), "rot90": (), "diagonal": (), "diag": (), "trace": (), "diff": (),
    "roll": (I64,), "tril": (I64, BOOL), "triu": (),
    "diag_embed": (), "block_diag": (), "nn.functional.pad.constant": (I64,),
    "nn.functional.pad.reflect": (), "nn.functional.pad.replicate": (), "nn.functional.pad.circular": (),
    "constant_pad_nd": (), "nn.functional.pixel_shuffle": (), "nn.functional.pixel_unshuffle": (),
    "nn.functional.channel_shuffle": (), "nn.functional.unfold": (),
    # --- indexing -----------------------------------------------------------------------------
    "index_select": (I64, BF16), "gather": (I64,), "take_along_dim": (), "take": (),
    "nn.functional.embedding": (BF16,), "index_put": (I64,), "index_add": (I64,), "index_copy": (),
    "index_fill": (), "scatter": (I64,), "scatter_add": (I64,), "scatter_reduce.sum": (I64,),
    "scatter_reduce.prod": (), "scatter_reduce.mean": (I64,), "scatter_reduce.amax": (),
    "scatter_reduce.amin": (I64,), "select_scatter": (), "slice_scatter": (), "nn.functional.one_hot": (),
    # --- creation -----------------------------------------------------------------------------
    "full_like": (I64,), "zeros_like": (I64,), "ones_like": (BOOL,), "new_full": (), "new_zeros": (),
    "new_ones": (), "new_empty": (), "linspace.tensor_overload": (),
    # --- losses (composites of the above) -----------------------------------------------------
    "nn.functional.cross_entropy": (), "nn.functional.nll_loss": (), "nn.functional.mse_loss": (),
    "nn.functional.l1_loss": (), "nn.functional.smooth_l1_loss": (), "nn.functional.huber_loss": (),
    "nn.functional.binary_cross_entropy": (), "nn.functional.binary_cross_entropy_with_logits": (),
    "nn.functional.kl_div": (), "nn.functional.cosine_embedding_loss": (),
    "nn.functional.hinge_embedding_loss": (),
    # --- convolution, pooling, resampling -----------------------------------------------------
    "nn.functional.conv1d": (), "nn.functional.conv2d": (BF16,), "nn.functional.conv3d": (),
    "nn.functional.conv_transpose1d": (), "nn.functional.conv_transpose2d": (),
    "nn.functional.avg_pool1d": (), "nn.functional.avg_pool2d": (BF16,), "nn.functional.avg_pool3d": (),
    "nn.functional.max_pool1d": (), "nn.functional.max_pool2d": (BF16,), "nn.functional.max_pool3d": (),
    "nn.functional.adaptive_avg_pool1d": (), "nn.functional.adaptive_avg_pool2d": (),
    "nn.functional.adaptive_avg_pool3d": (), "nn.functional.local_response_norm": (),
    "nn.functional.interpolate.nearest": (), "nn.functional.interpolate.nearest-exact": (),
    "nn.functional.upsample_nearest": (), "nn.functional.interpolate.linear": (),
    "nn.functional.interpolate.bilinear": (BF16,), "nn.functional.upsample_bilinear": (),
    "nn.functional.interpolate.trilinear": (), "nn.functional.interpolate.area": (),
}

# OpInfos also checked on the program as torch.export gives it, before the core-ATen
# decompositions: what those rewrite away (tril, transpose, logsumexp, index_add, the *_copy views,
# the 1-d and 3-d resamplings...) still has a lowering for programs lowered undecomposed.
UNDECOMPOSED: dict[str, tuple[torch.dtype, ...]] = {
    "all": (BOOL,), "sum": (), "var": (), "logsumexp": (), "baddbmm": (), "floor_divide": (I64,),
    "rsub": (), "tril": (), "triu": (), "t": (), "transpose": (), "reshape": (), "squeeze": (),
    "split": (), "unbind": (), "unbind_copy": (), "expand_copy": (), "permute_copy": (), "view_copy": (),
    "__getitem__": (), "index_add": (), "index_copy": (), "select_scatter": (), "zeros_like": (),
    "ones_like": (), "empty_like": (), "new_full": (), "new_ones": (), "new_zeros": (), "new_empty": (),
    "nn.functional.interpolate.nearest": (), "nn.functional.interpolate.nearest-exact": (),
    "nn.functional.interpolate.linear": (), "nn.functional.interpolate.trilinear": (),
    "diagonal_copy": (),
}

# Lowerings that no OpInfo sample reaches, with the reason and where they are covered instead.
_OUTSIDE = "covered by test_outside_opinfo"
_COMPLEX = "covered by test_complex_values_lower_as_pairs_of_reals"
NOT_IN_OPINFO: dict[Any, str] = {
    aten._unsafe_view.default: "torch 2.13's export no longer emits it (older releases did after a "
                               "matmul); it shares view's lowering, which every reshape here reaches",
    aten.arange.default: f"OpInfo's arange samples take no tensor; {_OUTSIDE}",
    aten.arange.start: f"OpInfo's arange samples take no tensor; {_OUTSIDE}",
    aten.ones.default: f"no tensor input; {_OUTSIDE}",
    aten.zeros.default: f"no tensor input; {_OUTSIDE}",
    aten.empty_strided.default: f"no tensor input; {_OUTSIDE}",
    aten.new_empty_strided.default: f"its OpInfo samples fill it in place (zero_), which Kiln does not "
                                    f"lower; {_OUTSIDE}",
    aten.pow.Scalar: f"OpInfo's pow samples have a tensor base; {_OUTSIDE}",
    aten.bitwise_and.Scalar: f"OpInfo's bitwise samples pair tensors; {_OUTSIDE}",
    aten.bitwise_or.Scalar: f"OpInfo's bitwise samples pair tensors; {_OUTSIDE}",
    aten.bitwise_xor.Scalar: f"OpInfo's bitwise samples pair tensors; {_OUTSIDE}",
    aten.where.Scalar: f"OpInfo's where samples pass tensors; {_OUTSIDE}",
    aten.where.ScalarOther: f"OpInfo's where samples pass tensors; {_OUTSIDE}",
    aten.where.ScalarSelf: f"OpInfo's where samples pass tensors; {_OUTSIDE}",
    aten.rsub.Scalar: f"OpInfo's rsub samples subtract tensors; {_OUTSIDE}",
    aten.scatter.value: f"beyond the first samples of OpInfo's scatter; {_OUTSIDE}",
    aten.scatter.value_reduce: f"beyond the first samples of OpInfo's scatter; {_OUTSIDE}",
    aten._native_batch_norm_legit.no_stats: f"OpInfo's batch/instance norm samples pass running "
                                            f"statistics; {_OUTSIDE}",
    aten.concat.default: f"an alias of cat that only undecomposed programs keep; {_OUTSIDE}",
    aten.contiguous.default: f"only undecomposed programs keep it; {_OUTSIDE}",
    aten.detach.default: f"only undecomposed programs keep it; {_OUTSIDE}",
    aten.select_copy.int: f"only undecomposed programs keep it; {_OUTSIDE}",
    aten.slice_copy.Tensor: f"only undecomposed programs keep it; {_OUTSIDE}",
    aten.split_copy.Tensor: f"only undecomposed programs keep it; {_OUTSIDE}",
    aten.split_with_sizes_copy.default: f"only undecomposed programs keep it; {_OUTSIDE}",
    aten.upsample_nearest3d.vec: f"beyond the first samples of OpInfo's interpolate; {_OUTSIDE}",
    aten._upsample_nearest_exact2d.vec: f"beyond the first samples of OpInfo's interpolate; {_OUTSIDE}",
    aten._upsample_nearest_exact3d.vec: f"beyond the first samples of OpInfo's interpolate; {_OUTSIDE}",
    aten.polar.default: f"complex results: {_COMPLEX}",
    aten.view_as_complex.default: f"complex results: {_COMPLEX}",
    aten.view_as_real.default: f"complex operands: {_COMPLEX}",
}

# A module reaching each lowering NOT_IN_OPINFO sends to test_outside_opinfo, and the graph to lower it
# from: "core" (decomposed, as kiln.lower does) or "undecomposed" (what the decompositions remove).
_ROWS, _SCORES, _IMAGE = (3, 5), (2, 3, 4, 5), (2, 3, 4, 5)
OUTSIDE_OPINFO: dict[Any, tuple[str, Any, tuple]] = {
    aten.arange.default: ("undecomposed", lambda x: x + torch.arange(5), (_ROWS,)),
    aten.arange.start: ("undecomposed", lambda x: x + torch.arange(1, 6), (_ROWS,)),
    aten.ones.default: ("undecomposed", lambda x: x + torch.ones(5), (_ROWS,)),
    aten.zeros.default: ("undecomposed", lambda x: x + torch.zeros(5), (_ROWS,)),
    aten.empty_strided.default: ("undecomposed", lambda x: torch.empty_strided((3, 5), (5, 1)), (_ROWS,)),
    aten.new_empty_strided.default: ("undecomposed", lambda x: x.new_empty_strided((5,), (1,)), (_ROWS,)),
    aten.pow.Scalar: ("core", lambda x: torch.pow(2.5, x), (_ROWS,)),
    aten.bitwise_and.Scalar: ("core", lambda x: (x > 0) & True, (_ROWS,)),
    aten.bitwise_or.Scalar: ("core", lambda x: (x > 0) | False, (_ROWS,)),
    aten.bitwise_xor.Scalar: ("core", lambda x: (x > 0) ^ True, (_ROWS,)),
    aten.where.Scalar: ("undecomposed", lambda x: torch.where(x > 0, 1.0, -1.0), (_ROWS,)),
    aten.where.ScalarOther: ("undecomposed", lambda x: torch.where(x > 0, x, 2.0), (_ROWS,)),
    aten.where.ScalarSelf: ("undecomposed", lambda x: torch.where(x > 0, 2.0, x), (_ROWS,)),
    aten.rsub.Scalar: ("undecomposed", lambda x: torch.rsub(x, 2), (_ROWS,)),
    aten.scatter.value: ("core", lambda x: x.scatter(1, (x.abs() * 3).long() % 3, 2.0), (_SCORES,)),
    aten.scatter.value_reduce: ("core", lambda x: x.scatter(1, (x.abs() * 3).long() % 3, 2.0, reduce="add"),
                                (_SCORES,)),
    aten._native_batch_norm_legit.no_stats: ("core", lambda x: F.batch_norm(x, None, None, training=True),
                                             (_IMAGE,)),
    aten.concat.default: ("undecomposed", lambda x: torch.concat([x, x], 1), (_ROWS,)),
    aten.contiguous.default: ("undecomposed", lambda x: x.t().contiguous(), (_ROWS,)),
    aten.detach.default: ("undecomposed", lambda x: x.detach() + 1, (_ROWS,)),
    aten.select_copy.int: ("undecomposed", lambda x: torch.select_copy(x, 1, 2), (_ROWS,)),
    aten.slice_copy.Tensor: ("undecomposed", lambda x: torch.slice_copy(x, 1, 1, 4), (_ROWS,)),
    aten.split_copy.Tensor: ("undecomposed", lambda x: torch.split_copy(x, 2, 1), (_ROWS,)),
    aten.split_with_sizes_copy.default: ("undecomposed", lambda x: torch.split_with_sizes_copy(x, [1, 4], 1),
                                         (_ROWS,)),
    aten.upsample_nearest3d.vec: ("undecomposed", lambda x: F.interpolate(x[None], scale_factor=1.5),
                                  (_IMAGE,)),
    aten._upsample_nearest_exact2d.vec: ("undecomposed", lambda x: F.interpolate(
        x, scale_factor=1.7, mode="nearest-exact"), (_IMAGE,)),
    aten._upsample_nearest_exact3d.vec: ("undecomposed", lambda x: F.interpolate(
        x[None], size=(3, 7, 4), mode="nearest-exact"), (_IMAGE,)),
}

_OPINFOS = {(o.name + (f".{o.variant_test_name}" if o.variant_test_name else "")): o for o in op_db}
_MODES = {"core": CASES, "undecomposed": UNDECOMPOSED}


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@cache
def _samples(name: str, dtype: torch.dtype) -> list:
    """The first samples of an OpInfo, generated once with a fixed seed."""
    torch.manual_seed(0)
    limit = SAMPLES.get(dtype, EXTRA_SAMPLES)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return list(itertools.islice(_OPINFOS[name].sample_inputs("cpu", dtype), limit))


def _params():
    for mode, cases in _MODES.items():
        for name, extra in cases.items():
            supported = _OPINFOS[name].supported_dtypes("cpu")
            assert all(d in supported for d in extra), f"{name} lacks a dtype of {extra}; fix {mode}"
            for dtype in ((F32,) if F32 in supported else ()) + extra:
                for index in range(len(_samples(name, dtype))):
                    label = f"{name}-{'' if mode == 'core' else mode + '-'}{_dtype_name(dtype)}-{index}"
                    yield pytest.param(name, mode, dtype, index, id=label)


_FED = object()  # marks where a sample's tensor goes (None is a real argument value)


class _Call(torch.nn.Module):
    """op(sample) with the sample's tensors as the module's inputs; everything else is baked in."""

    def __init__(self, op, leaves: list, spec):
        super().__init__()
        self.op, self.spec = op, spec
        self.constants = [_FED if isinstance(v, torch.Tensor) else v for v in leaves]

    def forward(self, *tensors):
        feed = iter(tensors)
        leaves = [next(feed) if c is _FED else c for c in self.constants]
        inp, args, kwargs = pytree.tree_unflatten(leaves, self.spec)
        return self.op(inp, *args, **kwargs)


class _Batch(torch.nn.Module):
    """Several samples' calls in one module, so that one export serves them all."""

    def __init__(self, calls: list[tuple[_Call, int]]):
        super().__init__()
        self.calls = calls

    def forward(self, *tensors):
        outs, start = [], 0
        for call, count in self.calls:
            outs.append(call(*tensors[start:start + count]))
            start += count
        return tuple(outs)


def _inputs(name: str, dtype: torch.dtype, index: int) -> tuple[_Call, list[torch.Tensor]] | str:
    """The sample as a module and its tensor inputs, or the reason it cannot apply."""
    sample = _samples(name, dtype)[index]
    leaves, spec = pytree.tree_flatten((sample.input, sample.args, sample.kwargs))
    tensors = [v for v in leaves if isinstance(v, torch.Tensor)]
    if not tensors:
        return "the sample has no tensor argument (nothing to feed the graph)"
    if any(t.dtype in (torch.float64, torch.complex64, torch.complex128) for t in tensors):
        return "the sample passes an f64 or complex tensor, which Kiln does not keep"
    return _Call(_OPINFOS[name].op, leaves, spec), tensors


def _export(module: torch.nn.Module, tensors: list[torch.Tensor], mode: str):
    """kiln's export (torch.export + core-ATen decompositions), or torch.export alone."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if mode == "core":
            return export(module, tuple(tensors))
        try:
            return torch.export.export(module, tuple(tensors))
        except Exception as err:  # as kiln's export does: every failure means "cannot export"
            raise ExportError(f"{type(err).__name__}: {str(err).strip()}") from err


def _targets(ep) -> set[str]:
    return {str(n.target) for n in ep.graph.nodes if n.op == "call_function"}


def _unclaimed(ep) -> list[str]:
    lowerings = {str(t) for t in all_lowerings()}
    return sorted(t for t in _targets(ep) if t not in lowerings and not t.startswith(_NOT_LOWERINGS))


# graph targets the samples of each (OpInfo, mode, dtype) reached, for the coverage test
_REACHED: dict[tuple[str, str, torch.dtype], set[str]] = {}


@cache
def _batched(name: str, mode: str, dtype: torch.dtype) -> dict[int, Any]:
    """Kiln's outputs for the samples of (name, dtype) lowered together as one graph; empty when
    the batch cannot go through whole, and then each sample runs alone and reports its own reason."""
    ready = {}
    for index in range(len(_samples(name, dtype))):
        prepared = _inputs(name, dtype, index)
        if not isinstance(prepared, str):
            ready[index] = prepared
    if len(ready) < 2:
        return {}
    tensors = [t for _, ts in ready.values() for t in ts]
    try:
        ep = _export(_Batch([(call, len(ts)) for call, ts in ready.values()]), tensors, mode)
        if _unclaimed(ep):
            return {}
        outs = kiln.interpret(lower_exported(ep), *tensors)
    except Exception:  # whatever went wrong, the sample that causes it reports it, run alone
        return {}
    _REACHED.setdefault((name, mode, dtype), set()).update(_targets(ep))
    return dict(zip(ready, outs))


def _alone(name: str, mode: str, dtype: torch.dtype, module: _Call, tensors: list[torch.Tensor]):
    """Kiln's output for one sample lowered by itself; pytest.skip when the sample cannot apply."""
    try:
        ep = _export(module, tensors, mode)
    except ExportError as err:
        pytest.skip(f"torch.export rejects the sample: {str(err).splitlines()[0]}")
    _REACHED.setdefault((name, mode, dtype), set()).update(_targets(ep))
    missing = _unclaimed(ep)
    if missing:
        reasons = [f"{t} ({UNSUPPORTED.get(_target(t), 'no lowering')})" for t in missing]
        pytest.skip(f"the {mode} graph uses ops Kiln does not lower: " + ", ".join(reasons))
    try:
        graph = lower_exported(ep)
    except UnsupportedOp as err:
        pytest.skip(f"Kiln refuses the sample on purpose: {err}")
    return kiln.interpret(graph, *tensors)


def _target(name: str):
    packet, _, overload = name.removeprefix("aten.").partition(".")
    return getattr(getattr(aten, packet, None), overload or "default", None)


# ops whose values are unspecified (uninitialized memory): only shape and dtype are compared
_UNSPECIFIED = {"new_empty", "new_empty_strided", "empty_like", "empty"}


def _compare(name: str, module: _Call, tensors: list[torch.Tensor], actual, expected) -> None:
    expected_leaves, actual_leaves = pytree.tree_leaves(expected), pytree.tree_leaves(actual)
    if not all(isinstance(e, torch.Tensor) for e in expected_leaves):
        pytest.skip("the op returns a non-tensor value")
    assert len(actual_leaves) == len(expected_leaves)
    for i, (a, e) in enumerate(zip(actual_leaves, expected_leaves)):
        # Kiln computes f64 in f32 and narrow ints in i32 (frontend/symbols.py): compare in its dtype
        e = e.to(torch_dtype(kiln_dtype(e.dtype)))
        if name in _UNSPECIFIED:
            assert (a.shape, a.dtype) == (e.shape, e.dtype)
            continue
        try:
            torch.testing.assert_close(a, e, equal_nan=True)
        except AssertionError:
            if a.dtype is not BF16:
                raise
            # some eager bf16 kernels round inside (log_softmax sums in bf16); Kiln computes in f32
            # and rounds once, so it may match the op evaluated in f64 instead (as test_decomp does)
            wide = [t.double() if t.dtype is BF16 else t.clone() for t in tensors]
            reference = pytree.tree_leaves(module(*wide))[i]
            torch.testing.assert_close(a, reference.to(BF16), equal_nan=True)


@pytest.mark.parametrize("name, mode, dtype, index", list(_params()))
def test_opinfo_sample(name, mode, dtype, index):
    prepared = _inputs(name, dtype, index)
    if isinstance(prepared, str):
        pytest.skip(prepared)
    module, tensors = prepared
    batch = _batched(name, mode, dtype)
    actual = batch[index] if index in batch else _alone(name, mode, dtype, module, tensors)
    # eager on copies: some ops update an argument in place (batch norm's running statistics)
    _compare(name, module, tensors, actual, module(*[t.clone() for t in tensors]))


def _reach(name: str, mode: str, dtype: torch.dtype) -> None:
    """Record what the samples' graphs reach, for a coverage run that skipped their tests."""
    if _batched(name, mode, dtype):
        return
    for index in range(len(_samples(name, dtype))):
        prepared = _inputs(name, dtype, index)
        if not isinstance(prepared, str):
            try:
                _REACHED.setdefault((name, mode, dtype), set()).update(_targets(_export(*prepared, mode)))
            except ExportError:
                pass


class _Lambda(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *tensors):
        return self.fn(*tensors)


@pytest.mark.parametrize("target", list(OUTSIDE_OPINFO), ids=str)
def test_outside_opinfo(target):
    mode, fn, shapes = OUTSIDE_OPINFO[target]
    torch.manual_seed(0)
    module, tensors = _Lambda(fn), [torch.randn(shape) for shape in shapes]
    ep = _export(module, tensors, mode)
    assert str(target) in _targets(ep), f"the module no longer reaches {target}: fix OUTSIDE_OPINFO"
    actual = kiln.interpret(lower_exported(ep), *tensors)
    _compare("empty" if "empty" in str(target) else str(target), module, tensors, actual, module(*tensors))


def test_every_lowering_is_exercised():
    """Each registered target is reached by an OpInfo sample or explains itself in NOT_IN_OPINFO."""
    for key in {tuple(p.values[:3]) for p in _params()} - set(_REACHED):
        _reach(*key)
    reached = set().union(*_REACHED.values())
    claimed = {str(t): t for t in all_lowerings()}
    missing = sorted(name for name, t in claimed.items() if name not in reached and t not in NOT_IN_OPINFO)
    assert not missing, f"no OpInfo sample reaches these (add a case or a NOT_IN_OPINFO reason): {missing}"
    stale = sorted(str(t) for t in NOT_IN_OPINFO if str(t) in reached)
    assert not stale, f"NOT_IN_OPINFO lists targets that OpInfo samples do reach: {stale}"
    untested = sorted(str(t) for t, why in NOT_IN_OPINFO.items()
                      if _OUTSIDE in why and t not in OUTSIDE_OPINFO)
    assert not untested, f"NOT_IN_OPINFO sends these to test_outside_opinfo, which lacks them: {untested}"


def test_bitwise_ops_on_an_integer_and_a_mask_equal_eager():
    """An integer with a bool mask (CPM-Ant builds its attention mask as int | bool & bool) or a
    0/1 constant lowers exactly, negative values included; two general integers are refused."""
    class Mixed(torch.nn.Module):
        def forward(self, x, mask):
            return ((x | mask) + 3 * (x & mask) + 5 * (x ^ mask) + 7 * (mask.long() & x) + ~x
                    + 11 * (x & 1) + 13 * (x ^ True) + (x | 0))
    torch.manual_seed(1)
    x, mask = torch.randint(-1000, 1000, (5, 9)), torch.rand(5, 9) > 0.5
    got = kiln.interpret(kiln.lower(Mixed(), (x, mask)), x, mask)
    assert torch.equal(pytree.tree_leaves(got)[0], Mixed()(x, mask))
    with pytest.raises(UnsupportedOp, match="two integers"):
        kiln.lower(_Lambda(lambda a, b: a & b), (x, x + 3))


def test_complex_values_lower_as_pairs_of_reals():
    """Llama 4's rotary in complex numbers (polar, view_as_complex, a product, view_as_real),
    with a complex sum, difference and views between: equal to eager on random values; an op
    with no complex lowering is named."""
    class Rotary(torch.nn.Module):
        def forward(self, x, angle):
            turn = torch.polar(torch.ones_like(angle), angle) * 0.5            # [seq, pairs]
            z = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2))        # [seq, heads, pairs]
            rotated = z * turn[:, None, :] + 2.0 * z - z[:, :1] * turn.unsqueeze(1)
            return torch.view_as_real(rotated * 3.0 - 1.5).flatten(2)
    torch.manual_seed(2)
    x, angle = torch.randn(5, 3, 8), torch.rand(5, 4) * 100
    got = kiln.interpret(kiln.lower(Rotary(), (x, angle)), x, angle)
    torch.testing.assert_close(pytree.tree_leaves(got)[0], Rotary()(x, angle), rtol=1e-5, atol=1e-5)
    with pytest.raises(UnsupportedOp, match="complex value reaches aten.exp"):
        kiln.lower(_Lambda(lambda a: torch.view_as_real(torch.exp(torch.view_as_complex(a)))), (x.reshape(5, 12, 2),))
