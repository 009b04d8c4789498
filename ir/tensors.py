"""The IR's types and arrays as torch's: the dtype map and conversions between torch tensors and
numpy arrays (bf16 through ml_dtypes). Imported only where torch is at hand (the frontend, a
compiled model called with tensors); `kiln.ir` itself never imports torch."""
from __future__ import annotations

import numpy as np
import torch

from .dtypes import DType
from .errors import UnsupportedOp

_DTYPES = {
    torch.float32: DType.F32, torch.float16: DType.F16, torch.bfloat16: DType.BF16,
    torch.int32: DType.I32, torch.int64: DType.I64, torch.bool: DType.BOOL,
}
_TORCH = {v: k for k, v in _DTYPES.items()}
# types Kiln computes in when torch hands it one it lacks
_NARROWED = {torch.float64: DType.F32, torch.int8: DType.I32, torch.int16: DType.I32,
             torch.uint8: DType.I32}


def kiln_dtype(dtype: torch.dtype) -> DType:
    if dtype in _DTYPES:
        return _DTYPES[dtype]
    if dtype in _NARROWED:
        return _NARROWED[dtype]
    raise UnsupportedOp(f"kiln: tensors of {dtype} are not supported "
                        f"(supported: {', '.join(str(d) for d in _DTYPES)})")


def torch_dtype(dtype: DType) -> torch.dtype:
    return _TORCH[dtype]



def to_numpy(tensor: torch.Tensor, dtype: DType | None = None) -> np.ndarray:
    """A CPU numpy view of a tensor; bf16 through ml_dtypes, f64 and narrow ints converted."""
    tensor = tensor.detach().cpu()
    dtype = dtype or kiln_dtype(tensor.dtype)
    tensor = tensor.to(torch_dtype(dtype))
    if dtype is DType.BF16:
        return tensor.contiguous().view(torch.int16).numpy().view(DType.BF16.np)
    return tensor.numpy()


def from_numpy(array: np.ndarray) -> torch.Tensor:
    # np.ascontiguousarray would turn a 0-d result into shape (1,); np.require keeps the rank
    array = np.require(array, requirements="C")
    if array.dtype == DType.BF16.np:
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)
