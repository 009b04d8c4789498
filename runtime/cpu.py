"""The CPU backend: C kernels compiled by gcc into shared objects (cached on disk by source hash),
loaded with ctypes, launched on numpy buffers and timed with a monotonic clock."""
from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from ..codegen.c_emit import PRELUDE
from ..ir.errors import KilnError

CFLAGS = ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-fno-math-errno", "-std=gnu11"]


def cache_dir() -> Path:
    root = Path(os.environ.get("KILN_CACHE", Path.home() / ".cache" / "kiln"))
    path = root / "cpu-kernels"
    path.mkdir(parents=True, exist_ok=True)
    return path


def compiler() -> str:
    cc = os.environ.get("CC", "gcc")
    if shutil.which(cc) is None:
        raise KilnError(f"kiln: no C compiler: '{cc}' is not on PATH; the CPU backend needs gcc "
                        "(install it, or set CC to one)")
    return cc


class CompileError(KilnError):
    pass


def _build(source: str, out: Path) -> None:
    """Compile one translation unit to `out`, atomically (a temp file renamed into place)."""
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        c_file, so_file = Path(tmp) / "k.c", Path(tmp) / "k.so"
        c_file.write_text(source)
        result = subprocess.run([compiler(), *CFLAGS, str(c_file), "-o", str(so_file), "-lm"],
                                capture_output=True, text=True)
        if result.returncode != 0:
            raise CompileError(f"kiln: gcc failed on a generated kernel:\n{result.stderr[-2000:]}")
        os.replace(so_file, out)


class CpuBackend:
    name = "cpu"

    def __init__(self):
        self._libs: dict[str, ctypes.CDLL] = {}

    def compile(self, functions: dict[str, str]) -> dict[str, ctypes._CFuncPtr]:
        """Compile kernel functions (name -> C source) and return callables by name. Each
        function is its own cached shared object, so a change to one recompiles only it."""
        units = {name: PRELUDE + src for name, src in functions.items()}
        paths = {name: cache_dir() / f"{hashlib.sha256(u.encode()).hexdigest()[:24]}.so"
                 for name, u in units.items()}
        missing = [n for n, p in paths.items() if not p.exists()]
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
            list(pool.map(lambda n: _build(units[n], paths[n]), missing))
        out = {}
        for name, path in paths.items():
            lib = self._libs.get(str(path)) or ctypes.CDLL(str(path))
            self._libs[str(path)] = lib
            fn = getattr(lib, name)
            fn.restype = None
            out[name] = fn
        return out

    @staticmethod
    def allocate(nbytes: int) -> np.ndarray:
        return np.empty(max(nbytes, 1), dtype=np.uint8)

    @staticmethod
    def synchronize() -> None:
        pass

    @staticmethod
    def now() -> float:
        return time.perf_counter()
