"""OpenMP's idle threads, bounded before libgomp loads. A generated kernel's OpenMP threads spin
after its parallel region (libgomp's default: 300,000 spins, milliseconds) waiting for the next
one. Between two kernels of a step that costs nothing; but a library call (numpy's BLAS) that
follows splits its work among threads of its own (runtime/cpu.py), and a spinning OpenMP thread
takes the core one of them needs: SmolLM2's 64-token prefill on this 2-core VM ran 268 ms with
one BLAS thread, 342 ms split over two beside the spinners, 213 ms with the spin bounded
(GOMP_SPINCOUNT=10000; scripts/cpu_blas_split.py), decode unchanged (about 20 ms a step either
way). libgomp reads its
environment once, when it loads (with torch, or with the first compiled kernel): `import kiln`
sets the bound where nothing has loaded it yet, and says whether the bound holds."""
from __future__ import annotations

import os

SPIN_COUNT = 10_000


def _libgomp_loaded() -> bool | None:
    """Whether this process has libgomp mapped (None where /proc cannot say)."""
    try:
        with open("/proc/self/maps") as maps:
            return "libgomp" in maps.read()
    except OSError:
        return None


def _bounded() -> bool:
    if os.environ.get("OMP_WAIT_POLICY", "").lower() == "passive":
        return True                 # idle threads sleep at once
    given = os.environ.get("GOMP_SPINCOUNT")
    if given is not None:
        return given.isdigit() and int(given) <= SPIN_COUNT
    if os.environ.get("OMP_WAIT_POLICY", "").lower() == "active" or _libgomp_loaded() is not False:
        return False                # spinning as the user asked, or already loaded with the default
    os.environ["GOMP_SPINCOUNT"] = str(SPIN_COUNT)
    return True


BRIEF_SPIN = _bounded()       # whether OpenMP's idle threads in this process spin briefly
