"""Cast, one meaning everywhere (ir/ops.py `cast_array`): the reference against PyTorch's own
casts on edge values, where PyTorch defines them, and against the meaning written out where it
does not (a float beyond an integer type's range, NaN); the C kernels against the reference on
the same values, every pair of dtypes and back (the CUDA kernels: tests/test_cuda.py)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from kiln.ir import DType, Graph, Node, Op
from kiln.ir.ops import cast_array
from kiln.ir.symbolic import shape_of, sym

from .kernel_check import POLICIES, check

TORCH = {DType.F32: torch.float32, DType.F16: torch.float16, DType.BF16: torch.bfloat16,
         DType.I32: torch.int32, DType.I64: torch.int64, DType.BOOL: torch.bool}

EDGE_VALUES = {   # by the source's kind
    "float": [0.0, -0.0, 0.5, -0.5, 1.5, -2.5, 2.5, 3.75, 1 + 2**-8, 1 + 3 * 2**-8, 1e-8, 65504.0,
              -100000.0, 2.0**30, 1234.5678, -7.0, 255.5, math.nan, math.inf, -math.inf, 65520.0,
              1e38, -1e38, 3e-39, 1e-45, 2.0**31, -2.0**31, 2.0**31 - 128, 2.0**63, -2.0**63, 1e19],
    "int": [0, 1, -1, 7, -7, 255, 256, 2**31 - 1, -2**31, 2**24 + 1, 2**24 + 2**16 + 1, 65519,
            65520, 70000, -70000, 2**40 + 1, -2**62, 2**62 + 2**40 + 1, 2**63 - 1, -2**63],
    "bool": [True, False, True],
}


def edge_values(source: DType) -> np.ndarray:
    kind = "float" if source.is_float else "int" if source.is_int else "bool"
    info = np.iinfo(source.np) if source.is_int else None
    with np.errstate(all="ignore"):
        return np.array([v for v in EDGE_VALUES[kind] if info is None or info.min <= v <= info.max]
                        ).astype(np.float64 if source.is_float else source.np)


def source_array(source: DType) -> np.ndarray:
    values = edge_values(source)
    return cast_array(values.astype(np.float32), source) if source.is_float else values


def torch_defines(x: np.ndarray, target: DType) -> np.ndarray:
    """Where PyTorch's cast has a meaning: everywhere but a float to an integer type beyond its
    range or NaN (undefined in C: its CPU kernels give INT_MIN there, CUDA saturates)."""
    if not (target.is_int and x.dtype.kind not in "iub"):
        return np.ones(x.shape, bool)
    info, f = np.iinfo(target.np), x.astype(np.float64)
    return np.isfinite(f) & (np.trunc(f) >= info.min) & (np.trunc(f) < float(info.max) + 1)


def same(got: np.ndarray, want: np.ndarray) -> bool:
    """Equal element for element, NaN where NaN (their bits may differ)."""
    g, w = got.astype(np.float64), want.astype(np.float64)
    return got.dtype == want.dtype and bool(np.all((g == w) | (np.isnan(g) & np.isnan(w))))


@pytest.mark.parametrize("source", list(DType), ids=repr)
def test_the_reference_casts_as_pytorch_does_where_pytorch_defines_the_cast(source):
    x = source_array(source)
    for target in DType:
        ours = cast_array(x, target)
        theirs = torch.from_numpy(x.view(np.int16) if source is DType.BF16 else x)
        if source is DType.BF16:
            theirs = theirs.view(torch.bfloat16)
        theirs = theirs.to(TORCH[target])
        theirs = (theirs.view(torch.int16).numpy().view(target.np) if target is DType.BF16
                  else theirs.numpy())
        defined = torch_defines(x, target)
        assert defined.sum() >= 3, "too few values to compare"
        assert same(ours[defined], theirs[defined]), (source, target, x[defined], ours[defined],
                                                      theirs[defined])


def test_int_to_bf16_rounds_through_f32_as_pytorch_does():
    """2^24 + 2^16 + 1 rounds to 2^24 + 2^16 in f32, a tie in bf16 that goes to even: 2^24. One
    rounding would give 2^24 + 2^17; PyTorch (and so Kiln) rounds twice."""
    x = np.array([2**24 + 2**16 + 1], np.int64)
    assert float(torch.from_numpy(x).to(torch.bfloat16)[0]) == 2.0**24
    assert float(cast_array(x, DType.BF16)[0]) == 2.0**24
    assert float(cast_array(x.astype(np.int32), DType.BF16)[0]) == 2.0**24


@pytest.mark.parametrize("target", [DType.I32, DType.I64], ids=repr)
def test_a_float_beyond_an_integer_range_saturates_and_nan_gives_zero(target):
    info = np.iinfo(target.np)
    x = np.array([math.nan, math.inf, -math.inf, 1e30, -1e30, 2.0**63, -2.0**63, 3.99, -3.99])
    for source in (DType.F32, DType.F16, DType.BF16):
        got = cast_array(cast_array(x.astype(np.float32), source), target)
        want = [0, info.max, info.min, info.max, info.min, info.max, info.min, 3, -3]
        assert got.tolist() == want, source
    # an integer's bf16 image can lie beyond its range: 2^31 - 1 goes to 2^31
    back = cast_array(cast_array(np.array([2**31 - 1], np.int32), DType.BF16), DType.I32)
    assert back.tolist() == [2**31 - 1]


N, M = sym("n"), sym("m")


def cast_graph(source: DType) -> tuple[Graph, list[np.ndarray]]:
    """Casts from `source` to every dtype and back, the values cast at the kernel's size (n)
    and a second input (m) cast only to floats and bools."""
    def inp(name, dim):
        return Node(Op.INPUT, name=name, role="input", shape=shape_of((dim,)), dtype=source)
    x, y = inp("x", N), inp("y", M)
    targets = [t for t in DType if t is not source]
    outputs = [Node(Op.CAST, [x], dtype=t) for t in targets]
    outputs += [Node(Op.CAST, [Node(Op.CAST, [x], dtype=t)], dtype=source) for t in targets]
    outputs += [Node(Op.CAST, [y], dtype=t) for t in targets if not t.is_int]
    every = source_array(source)
    return Graph([x, y], outputs, symbols={"n": (1, 64), "m": (1, 64)}), [every, every[::-1].copy()]


@pytest.mark.parametrize("source", list(DType), ids=repr)
def test_c_kernels_cast_as_the_reference_does(source):
    graph, args = cast_graph(source)
    check(graph, args, policies=POLICIES[:1])
