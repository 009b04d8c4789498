"""Where compiled kernels are kept (KILN_CACHE, else ~/.cache/kiln); kernels compiled together,
several to a unit, each found again by a reference file that names its unit; and turns on one
unit's compile among processes: a compile's workers measure candidates that share new kernels,
and tune finalists side by side, so that two would otherwise compile one source at once where
the second could read the first's result from the disk cache."""
from __future__ import annotations

import fcntl
import hashlib
import os
import threading
import zlib
from contextlib import contextmanager
from pathlib import Path

TURN_FILES = 256     # lock files units' names hash to: two kernels share one rarely, never wrongly


def cache_root() -> Path:
    return Path(os.environ.get("KILN_CACHE", Path.home() / ".cache" / "kiln"))


def units(names: list[str], count: int) -> list[list[str]]:
    """`names` dealt into at most `count` units (compiled in parallel, one per core): a compiler's
    start and a unit's common prelude are paid once a unit, not once a kernel. gcc's start
    dominates a small C kernel's compile; NVRTC took a Llama decode layer's 28 search
    configurations in 1.21 s as two units on two threads, 1.38 s as a module each
    (scripts/nvrtc_units.py)."""
    return [names[i::count] for i in range(min(len(names), count))]


def unit_name(source: str, suffix: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()[:24] + suffix


def unit_of(folder: Path, name: str) -> Path | None:
    """The unit in `folder` that holds function `name`, where one was compiled and is still there."""
    ref = folder / f"{name}.ref"
    if not ref.exists():
        return None
    path = folder / ref.read_text().strip()
    return path if path.exists() else None


def point_at(folder: Path, names: list[str], unit: Path) -> None:
    """Each of `names` found in `unit` from now on (each reference written atomically)."""
    for name in names:
        write_atomic(folder / f"{name}.ref", unit.name)


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_suffix(f".tmp{os.getpid()}-{threading.get_ident()}")   # threads of one process too
    tmp.write_text(text)
    os.replace(tmp, path)


@contextmanager
def compile_turn(name: str):
    """Held while this process compiles unit `name`: another process compiling it meanwhile
    waits, then finds it compiled (a crashed holder's lock is released with its process)."""
    folder = cache_root() / "compile-turns"
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / str(zlib.crc32(name.encode()) % TURN_FILES), "a") as turn:
        fcntl.flock(turn, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(turn, fcntl.LOCK_UN)
