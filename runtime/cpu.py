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
from ..ir.errors import CompileError, KilnError

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
        """Compile kernel functions (name -> C source; the name is the source's hash) and return
        callables by name. Functions not in the disk cache are compiled together, in one shared
        object per core (gcc's start-up dominates a small kernel's compile); each function's cache
        entry points at the object that holds it."""
        root = cache_dir()
        missing = [n for n in functions if self._object_of(root, n) is None]
        if missing:
            chunks = [missing[i::os.cpu_count() or 2] for i in range(min(len(missing), os.cpu_count() or 2))]
            with ThreadPoolExecutor(max_workers=len(chunks)) as pool:
                list(pool.map(lambda chunk: self._build_chunk(root, chunk, functions), chunks))
        out = {}
        for name in functions:
            path = self._object_of(root, name)
            lib = self._libs.get(str(path)) or ctypes.CDLL(str(path))
            self._libs[str(path)] = lib
            fn = getattr(lib, name)
            fn.restype = None
            out[name] = fn
        return out

    @staticmethod
    def _object_of(root: Path, name: str) -> Path | None:
        ref = root / f"{name}.ref"
        if not ref.exists():
            return None
        path = root / ref.read_text().strip()
        return path if path.exists() else None

    @staticmethod
    def _build_chunk(root: Path, names: list[str], functions: dict[str, str]) -> None:
        unit = PRELUDE + "\n".join(functions[n] for n in sorted(names))
        so = root / f"{hashlib.sha256(unit.encode()).hexdigest()[:24]}.so"
        if not so.exists():
            _build(unit, so)
        for name in names:
            ref = root / f"{name}.ref"
            tmp = ref.with_suffix(f".tmp{os.getpid()}")
            tmp.write_text(so.name)
            os.replace(tmp, ref)

    @staticmethod
    def allocate(nbytes: int) -> np.ndarray:
        return np.empty(max(nbytes, 1), dtype=np.uint8)

    @staticmethod
    def synchronize() -> None:
        pass

    @staticmethod
    def now() -> float:
        return time.perf_counter()
