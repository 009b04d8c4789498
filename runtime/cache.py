"""Where compiled kernels are kept (KILN_CACHE, else ~/.cache/kiln), and turns on one kernel's
compile among processes: a compile's workers measure candidates that share a new kernel, and
tune finalists side by side, so that two would otherwise compile one source at once where the
second could read the first's result from the disk cache."""
from __future__ import annotations

import fcntl
import os
import zlib
from contextlib import contextmanager
from pathlib import Path

TURN_FILES = 256     # lock files kernels' names hash to: two kernels share one rarely, never wrongly


def cache_root() -> Path:
    return Path(os.environ.get("KILN_CACHE", Path.home() / ".cache" / "kiln"))


@contextmanager
def compile_turn(name: str):
    """Held while this process compiles kernel `name`: another process compiling it meanwhile
    waits, then finds it compiled (a crashed holder's lock is released with its process)."""
    folder = cache_root() / "compile-turns"
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / str(zlib.crc32(name.encode()) % TURN_FILES), "a") as turn:
        fcntl.flock(turn, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(turn, fcntl.LOCK_UN)
