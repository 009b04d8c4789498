"""Element types of the IR and their numpy counterparts (bf16 through ml_dtypes, imported on
first use: it takes about a second to import, which `kiln --help` should not pay)."""
from __future__ import annotations

from enum import Enum
from functools import cache

import numpy as np


class DType(Enum):
    F32 = "f32"
    F16 = "f16"
    BF16 = "bf16"
    I32 = "i32"
    I64 = "i64"
    BOOL = "bool"

    @property
    def np(self) -> np.dtype:
        return _numpy_dtypes()[self]

    @property
    def is_float(self) -> bool:
        return self in (DType.F32, DType.F16, DType.BF16)

    @property
    def is_int(self) -> bool:
        return self in (DType.I32, DType.I64)

    @property
    def itemsize(self) -> int:
        return self.np.itemsize

    def __repr__(self) -> str:
        return self.value


@cache
def _numpy_dtypes() -> dict[DType, np.dtype]:
    import ml_dtypes
    return {
        DType.F32: np.dtype(np.float32),
        DType.F16: np.dtype(np.float16),
        DType.BF16: np.dtype(ml_dtypes.bfloat16),
        DType.I32: np.dtype(np.int32),
        DType.I64: np.dtype(np.int64),
        DType.BOOL: np.dtype(np.bool_),
    }


@cache
def _from_numpy_dtypes() -> dict[np.dtype, DType]:
    return {v: k for k, v in _numpy_dtypes().items()}


def from_numpy(dtype: np.dtype) -> DType:
    try:
        return _from_numpy_dtypes()[np.dtype(dtype)]
    except KeyError:
        raise TypeError(f"kiln has no dtype for numpy {np.dtype(dtype)}; "
                        f"supported: {', '.join(d.value for d in DType)}") from None


def accumulator(dtype: DType) -> DType:
    """The type reductions accumulate in: at least f32 for floats, i64 for integers and bools."""
    return DType.F32 if dtype.is_float else DType.I64
