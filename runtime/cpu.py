"""The CPU backend: C kernels compiled by gcc into shared objects (cached on disk by source hash),
loaded with ctypes, launched on numpy buffers and timed with a monotonic clock."""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

import numpy as np

from ..codegen.attention import AttentionConfig, as_attention, emit_c_attention
from ..codegen.c_emit import PRELUDE
from ..codegen.c_kernel import emit_c
from ..codegen.kernel import Kernel, KernelConfig, config_space, source_hash
from ..codegen.library import Gemm, LibraryConfig, as_gemm, is_library, with_library
from ..ir.dtypes import DType
from ..ir.errors import CompileError, KilnError
from .cache import cache_root, point_at, unit_name, unit_of, units
from .cpu_region import RegionRunner
from .hardware import usable_cores
from .library import ArrayInterop, LibraryKernel

# -ffp-contract=off: each operation rounded as the reference interpreter rounds it (gcc would fuse
# x * x - m into one FMA, whose unrounded product makes softmax's exp2(x² - max x²) differ from 1
# for the largest element by up to exp2(±ulp/2) of a large x²).
# -fno-loop-unroll-and-jam: gcc jammed P.V's loop over keys into its row's loop, so that softmax's
# exp2 ran once per value element, not once per key (SmolLM2's heads kernel, scores staged: 2.2x
# slower; no other kernel of its decode layer compiles otherwise)
CFLAGS = ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-fno-math-errno", "-ffp-contract=off",
          "-fno-loop-unroll-and-jam", "-std=gnu11"]


COPY_SOURCE = """
void kiln_copy_bandwidth(float* restrict dst, const float* restrict src, int64_t n) {
  #pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; i++) dst[i] = src[i];
}
"""


# drops [p, p + n) from every cache level (a no-op where the target has no clflush)
EVICT_SOURCE = """
void EVICT(const char* p, int64_t n) {
#if defined(__x86_64__) || defined(__i386__)
  for (const char* line = (const char*)((uintptr_t)p & ~(uintptr_t)63); line < p + n; line += 64)
    __builtin_ia32_clflush(line);
  __builtin_ia32_mfence();
#endif
}
"""


# a recording's replay: each entry four pointers, a runner's (or a callback's) address, the step,
# the function table and the address table (runtime/cpu_region.py)
REPLAY_SOURCE = """
void REPLAY(int64_t n, void* const* calls) {
  for (int64_t i = 0; i < n; i++)
    ((void (*)(int64_t, void* const*, void* const*))calls[4 * i])(
        (int64_t)(intptr_t)calls[4 * i + 1], (void* const*)calls[4 * i + 2], (void* const*)calls[4 * i + 3]);
}
"""

_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p)


class CpuRecording:
    """The calls a run made while the backend recorded: region runners' steps, each on the copy
    of its address table that call filled, and library calls as callbacks into Python."""

    def __init__(self):
        self.entries: list[int | None] = []
        self.kept: list = []            # what the entries' addresses point into
        self.error: BaseException | None = None

    def call(self, function, step: int, functions, addresses) -> None:
        self.entries += [ctypes.cast(function, ctypes.c_void_p).value, step,
                         ctypes.addressof(functions), ctypes.addressof(addresses)]
        self.kept += [functions, addresses]

    def callback(self, body: Callable[[], None]) -> None:
        def run(step, functions, addresses):
            try:
                body()
            except BaseException as err:     # ctypes would print it and carry on
                self.error = self.error or err
        callback = _CALLBACK(run)
        self.entries += [ctypes.cast(callback, ctypes.c_void_p).value, 0, None, None]
        self.kept.append(callback)


def cache_dir() -> Path:
    """Compiled kernels by source hash, in a folder of their compiler and flags (objects built with
    other flags compute otherwise)."""
    root = cache_root()
    build = hashlib.sha256(" ".join([compiler(), *CFLAGS]).encode()).hexdigest()[:12]
    path = root / f"cpu-kernels-{build}"
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
    source_suffix = ".c"                # an artifact's kernel files
    finalist_configs = 12               # each a gcc compile
    timing = "weights evicted before each timed call"     # see evicter()
    # a recording holds one size: it saves a decode step the host's work between its regions
    # (SmolLM2's 32 region calls: 2-3 ms of a 22-25 ms step), where padding prompts to a few
    # lengths for recordings of prefill would cost compute
    records_each_size = False

    def __init__(self):
        self._libs: dict[str, ctypes.CDLL] = {}
        self._evict = self._replay = None
        self.recording: CpuRecording | None = None      # set while capture() runs its body
        _single_threaded_blas()

    def compile(self, functions: dict[str, str]) -> dict[str, ctypes._CFuncPtr]:
        """Compile kernel functions (name -> C source; the name is the source's hash) and return
        callables by name. Functions not in the disk cache are compiled together, in one shared
        object per core (runtime/cache.py: units)."""
        out = {n: LibraryKernel(Gemm.from_source(src), _HOST) for n, src in functions.items() if is_library(n)}
        if out:
            _torch()        # imported now, where a program calls it: not inside its first run
        functions = {n: src for n, src in functions.items() if n not in out}
        root = cache_dir()
        missing = [n for n in functions if unit_of(root, n) is None]
        if missing:
            chunks = units(missing, usable_cores())
            with ThreadPoolExecutor(max_workers=len(chunks)) as pool:
                list(pool.map(lambda chunk: self._build_unit(root, chunk, functions), chunks))
        for name in functions:
            path = unit_of(root, name)
            lib = self._libs.get(str(path)) or ctypes.CDLL(str(path))
            self._libs[str(path)] = lib
            fn = getattr(lib, name)
            fn.restype = None
            out[name] = fn
        return out

    @staticmethod
    def _build_unit(root: Path, names: list[str], functions: dict[str, str]) -> None:
        unit = PRELUDE + "\n".join(functions[n] for n in sorted(names))
        so = root / unit_name(unit, ".so")
        if not so.exists():
            _build(unit, so)
        point_at(root, names, so)

    def copy_bandwidth(self, nbytes: int = 256 << 20) -> float:
        """Bytes per second (read plus written) of a copy on all cores: the memory ceiling that
        reports hold each kernel's traffic against."""
        copy = self.compile({"kiln_copy_bandwidth": COPY_SOURCE})["kiln_copy_bandwidth"]
        src, dst = np.ones(nbytes // 4, np.float32), np.empty(nbytes // 4, np.float32)
        args = (ctypes.c_void_p(dst.ctypes.data), ctypes.c_void_p(src.ctypes.data), ctypes.c_int64(src.size))
        copy(*args)
        times = []
        for _ in range(5):
            start = time.perf_counter()
            copy(*args)
            times.append(time.perf_counter() - start)
        return 2 * nbytes / sorted(times)[len(times) // 2]

    # --- the executor's interface (runtime/executor.py) ----------------------------------------
    @staticmethod
    @functools.lru_cache(maxsize=4096)   # a search meets the same kernels in candidate after candidate
    def render(kernel: Kernel, config: KernelConfig | LibraryConfig) -> tuple[str, str]:
        """(function name, C source); the name is the hash of the source, so equal kernels share
        one compiled function and one tuning record. A library configuration's source is the
        call's description."""
        if isinstance(config, LibraryConfig):
            return as_gemm(kernel).rendered("torch-matmul")
        if isinstance(config, AttentionConfig):
            draft = emit_c_attention(as_attention(kernel), config, "KERNEL")
        else:
            draft = emit_c(kernel, config, "KERNEL")
        name = f"k_{source_hash(draft)}"
        return name, draft.replace("void KERNEL(", f"void {name}(", 1)

    @staticmethod
    def config_space(kernel: Kernel) -> list[KernelConfig | LibraryConfig | AttentionConfig]:
        # fused attention's tiles are the GPU's: one pass per query row here
        if as_attention(kernel):
            return [AttentionConfig()]
        return with_library(config_space(kernel), kernel)

    @staticmethod
    def default_config(kernel: Kernel | None = None) -> KernelConfig | AttentionConfig:
        """The configuration a kernel is first checked with: fused attention's for a kernel it
        takes (the loop nest would compute each score once per output element)."""
        return AttentionConfig() if kernel is not None and as_attention(kernel) else KernelConfig()

    @staticmethod
    def config_from_json(data: dict) -> KernelConfig | LibraryConfig | AttentionConfig:
        if "attention" in data:
            return AttentionConfig.from_json(data)
        return LibraryConfig(data["library"]) if "library" in data else KernelConfig.from_json(data)

    @staticmethod
    def allocate(nbytes: int) -> np.ndarray:
        return np.empty(max(nbytes, 1), dtype=np.uint8)

    @staticmethod
    def memory_bytes() -> int:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")

    @staticmethod
    def trim() -> None:
        """numpy gives freed memory back itself."""

    @staticmethod
    def upload(array: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(array)

    def upload_weight(self, array: np.ndarray) -> np.ndarray:
        return self.upload(array)        # a contiguous host array is used where it is

    @staticmethod
    def input(array) -> np.ndarray:
        # np.ascontiguousarray would turn a 0-d array into shape (1,)
        return np.asarray(array, order="C")

    @staticmethod
    def to_host(array, dtype: DType) -> np.ndarray:
        return array

    @staticmethod
    def logical_dtype(array: np.ndarray, expected: DType) -> np.dtype:
        return array.dtype

    @staticmethod
    def typed(buffer: np.ndarray, dtype: DType) -> np.ndarray:
        return buffer.view(dtype.np)

    @staticmethod
    def arg(array: np.ndarray) -> ctypes.c_void_p:
        return ctypes.c_void_p(array.ctypes.data)

    @staticmethod
    def symbol_buffer(count: int) -> np.ndarray:
        return np.zeros(max(1, count), dtype=np.int64)

    @staticmethod
    def write_symbols(buffer: np.ndarray, values: list[int]) -> None:
        buffer[:len(values)] = values

    def region_runner(self, executor, like: RegionRunner | None = None) -> RegionRunner:
        """The deployed launch mode: the executor's kernels as one C call (runtime/cpu_region.py)."""
        return RegionRunner(executor, self, like)

    def launcher(self, fn, kernel: Kernel, config: KernelConfig | LibraryConfig):
        launch = fn.launcher(kernel) if isinstance(fn, LibraryKernel) else lambda args, env: fn(*args)

        def run(args, env):
            if self.recording is not None:
                raise KilnError("kiln: a CPU recording holds region runners' calls; this executor "
                                "launches kernel by kernel (build it with deployed=True)")
            launch(args, env)
        return run

    # --- recordings: a step's region calls replayed by one C call -----------------------------
    def capture(self, body: Callable[[], None]) -> Callable[[], None]:
        """Record the calls `body`'s region runners make (nothing runs); returns the replay, one
        C call that makes them in order."""
        if self._replay is None:
            name = f"kiln_replay_{source_hash(REPLAY_SOURCE)}"
            self._replay = self.compile({name: REPLAY_SOURCE.replace("REPLAY", name)})[name]
        self.recording = record = CpuRecording()
        try:
            body()
        finally:
            self.recording = None
        table = (ctypes.c_void_p * max(1, len(record.entries)))(*record.entries)
        calls, replay = ctypes.c_int64(len(record.entries) // 4), self._replay

        def run(kept=(record, table)):
            replay(calls, table)
            if record.error is not None:
                error, record.error = record.error, None
                raise error
        return run

    @staticmethod
    def capturable(fn, env: dict[str, int]) -> bool:
        return True       # a library call is recorded as a callback

    @staticmethod
    def resident(array, written: bool) -> bool:
        """Host memory is the kernels' memory: an input the graph writes in place (the KV cache)
        is used where the caller keeps it; the others are copied into fixed buffers."""
        return written

    @staticmethod
    def address(array: np.ndarray) -> int:
        return array.ctypes.data

    @staticmethod
    def write(buffer: np.ndarray, array: np.ndarray) -> None:
        np.copyto(buffer, array)

    @staticmethod
    def poison(buffer: np.ndarray, dtype: DType) -> None:
        """Fill with a value no kernel computes by accident (NaN, or all bits set)."""
        buffer[:] = 0xFF if not dtype.is_float else 0
        if dtype.is_float:
            buffer.view(dtype.np)[:] = np.nan

    @staticmethod
    def time(fn, target_s: float, most: int, before=None) -> list[float]:
        """Seconds per call of fn: at least 3 calls, more until target_s is spent (most calls);
        `before` runs ahead of each call, untimed."""
        times = []
        while len(times) < 3 or (sum(times) < target_s and len(times) < most):
            if before is not None:
                before()
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return times

    def evicter(self, arrays: list[np.ndarray]):
        """A function that drops `arrays` from every cache level. The tuner runs it before each
        timed call on the weights a kernel (or region) reads: a decode step reads each weight
        once, from memory, while a kernel timed again and again finds a layer's weights (16 MB in
        SmolLM2) in the L3 cache, twice as fast as they ever come in a step. CUDA's timing
        overwrites the L2 cache for the same reason."""
        if self._evict is None:
            name = f"kiln_evict_{source_hash(EVICT_SOURCE)}"
            self._evict = self.compile({name: EVICT_SOURCE.replace("EVICT", name)})[name]
        evict = self._evict
        spans = [(ctypes.c_void_p(a.ctypes.data), ctypes.c_int64(a.nbytes)) for a in arrays]

        def run(kept=arrays):         # the arrays stay alive while their addresses are used
            for pointer, nbytes in spans:
                evict(pointer, nbytes)
        return run


def _host_array(pointer: ctypes.c_void_p, dtype: DType, count: int) -> np.ndarray:
    raw = (ctypes.c_uint8 * (count * dtype.itemsize)).from_address(pointer.value)
    return np.frombuffer(raw, dtype=np.uint8).view(dtype.np)


@functools.cache
def _torch():
    """PyTorch, imported only where a program has a library product (1.3 s on this VM): running
    an artifact without one never loads it."""
    import torch
    return torch


def _torch_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a @ b by PyTorch's CPU matmul (MKL) on PyTorch's threads, the operands read where they lie.
    Those threads are the generated kernels' own OpenMP pool (one libgomp a process, whichever
    loaded it), so no pool spins while the other works: SmolLM2's 64-token prefill on this 2-core
    VM took 142.5 ms beside 259.0 ms with numpy's BLAS (OpenBLAS) split among threads of Kiln's
    own, 183.1 where OpenMP's idle spin was bounded (scripts/cpu_library_ab.py). MKL also reads
    a transposed weight faster (95 GFLOP/s on one core beside OpenBLAS's 78)."""
    torch = _torch()
    return torch.matmul(torch.from_numpy(a), torch.from_numpy(b)).numpy()


# numpy computes bf16 and f16 through f32 copies (ml_dtypes and numpy convert)
_HOST = ArrayInterop(np, _host_array, lambda a, dtype: a.astype(np.float32, copy=False),
                     lambda a, dtype: a.astype(dtype.np, copy=False), _torch_matmul)


def _single_threaded_blas() -> None:
    """numpy's BLAS (OpenBLAS, the reference interpreter's products) on one thread, for the whole
    process: OpenBLAS's threads keep spinning after a call and take the cores the OpenMP kernels
    timed or run next need (SmolLM2's prefill on 2 cores ran 4x slower end to end than its
    kernels timed one by one while library products were numpy's)."""
    from threadpoolctl import threadpool_limits
    threadpool_limits(limits=1, user_api="blas")
