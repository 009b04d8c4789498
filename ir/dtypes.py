"""Element types of the IR and their numpy counterparts (bf16 through ml_dtypes, imported when a
bf16 type is first asked for: it takes about a second to import, which `kiln --help` and an f32
artifact's load should not pay)."""
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
        return _bfloat16() if self is DType.BF16 else _PLAIN[self]

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


_PLAIN = {DType.F32: np.dtype(np.float32), DType.F16: np.dtype(np.float16), DType.I32: np.dtype(np.int32),
          DType.I64: np.dtype(np.int64), DType.BOOL: np.dtype(np.bool_)}
_FROM_PLAIN = {v: k for k, v in _PLAIN.items()}


@cache
def _bfloat16() -> np.dtype:
    import ml_dtypes
    return np.dtype(ml_dtypes.bfloat16)


def from_numpy(dtype: np.dtype) -> DType:
    dtype = np.dtype(dtype)
    if dtype in _FROM_PLAIN:
        return _FROM_PLAIN[dtype]
    if dtype.name == "bfloat16":        # ml_dtypes' (a caller holding one has imported it)
        return DType.BF16
    raise TypeError(f"kiln has no dtype for numpy {dtype}; supported: {', '.join(d.value for d in DType)}")


def accumulator(dtype: DType) -> DType:
    """The type reductions accumulate in: at least f32 for floats, i64 for integers and bools."""
    return DType.F32 if dtype.is_float else DType.I64
