"""What the executor, a compiled graph and the measurer ask of a backend, written down: the CPU's
(`runtime/cpu.py`, C kernels) and CUDA's (`runtime/cuda.py`, NVRTC and cuBLAS) implement
`Backend`; a backend whose launches can be recorded and replayed (CUDA graphs; on the CPU a
step's region calls, replayed by one C call) implements `Recording` too, and one that times kernels with their weights evicted from the cache (the CPU)
`Evicting`. Code that needs a capability asks `isinstance(backend, Recording)`; tests check each
backend class against these (tests/test_backend.py)."""
from __future__ import annotations

from typing import Callable, Protocol, runtime_checkable

import numpy as np

from ..codegen.kernel import Kernel
from ..ir.dtypes import DType


@runtime_checkable
class Backend(Protocol):
    source_suffix: str          # a rendered kernel's file suffix in an artifact (".c", ".cu")
    finalist_configs: int       # a finalist's kernels have this many of their configurations timed

    # --- kernels: render a kernel in a configuration, compile sources, launch ------------------
    @staticmethod
    def render(kernel: Kernel, config) -> tuple[str, str]:
        """(function name, source); the name is a hash of the source."""

    @staticmethod
    def config_space(kernel: Kernel) -> list:
        """The configurations the tuner may try for `kernel`, the default first."""

    @staticmethod
    def default_config(kernel=None):
        """The configuration `kernel` is first checked with (any kernel's, without one)."""

    @staticmethod
    def config_from_json(data: dict): ...

    def compile(self, functions: dict[str, str]) -> dict[str, object]:
        """Function name -> source, compiled (cached across processes) -> name -> callable."""

    def launcher(self, fn, kernel: Kernel, config) -> Callable[[list, dict[str, int]], None]:
        """A callable running `fn` on its arguments at the symbols' sizes."""

    # --- memory -------------------------------------------------------------------------------
    def allocate(self, nbytes: int): ...

    def memory_bytes(self) -> int:
        """The device's memory (on the CPU, the machine's)."""

    def trim(self) -> None:
        """Give back memory kept for reuse when the device runs short: the compile's processes
        (each worker, the parent) share one GPU, and a pool one holds is memory the others lack."""

    def upload(self, array: np.ndarray): ...

    def upload_weight(self, array: np.ndarray):
        """A weight's copy, made once for every executor that reads the same host array."""

    def input(self, array):
        """A call input as this backend's array (numpy or the backend's own)."""

    def to_host(self, array, dtype: DType) -> np.ndarray: ...

    def logical_dtype(self, array, expected: DType) -> np.dtype:
        """The dtype an input holds (bf16 is stored as 16-bit words)."""

    @staticmethod
    def arg(array):
        """An array as a kernel argument."""

    def typed(self, buffer, dtype: DType):
        """Raw bytes viewed as `dtype`."""

    def symbol_buffer(self, count: int):
        """Where kernels read `count` symbols' values."""

    @staticmethod
    def write_symbols(buffer, values: list[int]) -> None: ...

    def poison(self, buffer, dtype: DType) -> None:
        """Fill with values no kernel computes, so that one that writes nothing is caught."""

    # --- timing -------------------------------------------------------------------------------
    def time(self, fn, target_s: float, most: int) -> list[float]:
        """Seconds per call of `fn`, repeated until `target_s` or `most` calls."""

    def copy_bandwidth(self, nbytes: int = ...) -> float: ...


@runtime_checkable
class Recording(Protocol):
    """A backend whose launches a recording holds and replays (a CUDA graph; the CPU's region
    calls)."""

    def capture(self, body: Callable[[], None]) -> Callable[[], None]:
        """Record what `body` launches (nothing runs); returns the replay."""

    @staticmethod
    def capturable(fn, env: dict[str, int]) -> bool:
        """Whether a recording can hold `fn` at these sizes."""

    records_each_size: bool     # a prefill padded to a few lengths replays a recording of each

    def resident(self, array, written: bool) -> bool:
        """Whether a recording reads `array` where it is (its address part of the recording's
        key) rather than from a fixed buffer the call's values are copied into; `written`: the
        graph updates the input in place."""

    @staticmethod
    def address(array) -> int: ...

    def write(self, buffer, array: np.ndarray) -> None:
        """Host values into a device buffer, in the stream's order."""


@runtime_checkable
class Evicting(Protocol):
    """A backend that times kernels with their weights out of the cache, and runs a region's
    kernels as one call (the CPU's C region runner)."""

    timing: str

    def evicter(self, arrays: list[np.ndarray]) -> Callable[[], None]: ...

    def region_runner(self, executor, like=None): ...
