"""How a computed value is compared with the reference interpreter's: equal up to float
reassociation (kernels sum in another order than numpy), exactly for integers and bools."""
from __future__ import annotations

import numpy as np

import ml_dtypes

# relative to the output's scale: f32 reassociation; bf16 and f16 results rounded from differently
# ordered f32 sums differ by an ulp or two, and errors compound through a layer
RTOL = {np.dtype(np.float32): 1e-4, np.dtype(np.float16): 4e-3, np.dtype(ml_dtypes.bfloat16): 2e-2}


def tolerance(dtypes) -> float:
    """The relative tolerance for values computed through these dtypes: the loosest of them (an
    f32 result of a bf16 computation carries bf16's error)."""
    return max((RTOL.get(np.dtype(d), 1e-4) for d in dtypes), default=1e-4)


def mismatch(got: np.ndarray, want: np.ndarray, rtol: float | None = None) -> tuple[str, str] | None:
    """None when got agrees with want; else (reason, detail) with reason "nan" (a NaN or inf
    where the reference is finite) or "wrong". `rtol` defaults to want's dtype's."""
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        return "wrong", f"shape {got.shape}, expected {want.shape}"
    if not np.issubdtype(want.dtype, np.floating) and want.dtype.kind not in "V":
        if np.array_equal(got, want):
            return None
        return "wrong", f"{int((got != want).sum())} of {want.size} elements differ"
    rtol = rtol if rtol is not None else RTOL.get(want.dtype, 1e-4)
    wide = want.astype(np.float64 if want.dtype == np.float64 else np.float32)    # every value exact
    finite = np.isfinite(wide)
    scale = float(np.max(np.abs(wide), where=finite, initial=0.0)) if finite.any() else 1.0
    if got.dtype == want.dtype:
        # an element with the reference's very bits agrees: only the others are weighed (a
        # configuration's KV cache differs from the default's at the one position written)
        bits = np.dtype(f"u{want.dtype.itemsize}")
        differ = got.view(bits) != want.view(bits)
        got, want, finite = got[differ], want[differ], finite[differ]
    got, want = got.astype(np.float64), want.astype(np.float64)
    if (~np.isfinite(got) & finite).any():
        return "nan", f"{int((~np.isfinite(got) & finite).sum())} non-finite values where the reference is finite"
    if np.allclose(got, want, rtol=rtol, atol=rtol * scale, equal_nan=True):
        return None
    err = float(np.nanmax(np.abs(got - want)[finite])) if finite.any() else float("nan")
    return "wrong", f"max abs error {err:.3g} at output scale {scale:.3g}"


def agrees(got: np.ndarray, want: np.ndarray) -> bool:
    return mismatch(got, want) is None
