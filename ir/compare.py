"""How a computed value is compared with the reference interpreter's: equal up to float
reassociation (kernels sum in another order than numpy), exactly for integers and bools."""
from __future__ import annotations

import numpy as np

RTOL = 1e-4


def mismatch(got: np.ndarray, want: np.ndarray) -> tuple[str, str] | None:
    """None when got agrees with want; else (reason, detail) with reason "nan" (a NaN or inf
    where the reference is finite) or "wrong"."""
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        return "wrong", f"shape {got.shape}, expected {want.shape}"
    if not np.issubdtype(want.dtype, np.floating) and want.dtype.kind not in "V":
        if np.array_equal(got, want):
            return None
        return "wrong", f"{int((got != want).sum())} of {want.size} elements differ"
    got, want = got.astype(np.float64), want.astype(np.float64)
    finite = np.isfinite(want)
    if (~np.isfinite(got) & finite).any():
        return "nan", f"{int((~np.isfinite(got) & finite).sum())} non-finite values where the reference is finite"
    scale = float(np.abs(want[finite]).max()) if finite.any() else 1.0
    if np.allclose(got, want, rtol=RTOL, atol=RTOL * scale, equal_nan=True):
        return None
    err = float(np.nanmax(np.abs(got - want)[finite])) if finite.any() else float("nan")
    return "wrong", f"max abs error {err:.3g} at output scale {scale:.3g}"


def agrees(got: np.ndarray, want: np.ndarray) -> bool:
    return mismatch(got, want) is None
