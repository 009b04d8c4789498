"""The CUDA backend: kernels rendered to CUDA C, compiled by NVRTC through CuPy (its kernel cache
keeps them on disk), launched on CuPy device memory, timed with CUDA events. f16 and bf16
tensors live on the device as their 16-bit patterns."""
from __future__ import annotations

import functools
import json
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..codegen.attention import AttentionConfig, as_attention
from ..codegen.cuda_attention import attention_space, emit_cuda_attention
from ..codegen.cuda_decode_attention import WARPS as DECODE_WARPS
from ..codegen.cuda_decode_attention import DecodeAttentionConfig, emit_cuda_decode_attention
from ..codegen.cuda_decode_attention import split_scratch as decode_scratch
from ..codegen.cuda_config import CudaConfig, config_space, points_per_thread, split_scratch
from ..codegen.cuda_emit import PRELUDE, emit_cuda
from ..codegen.cuda_gemm import MmaConfig, as_tensor_gemm, emit_cuda_gemm, mma_space
from ..codegen.kernel import Kernel, source_hash
from ..codegen.library import Gemm, LibraryConfig, as_gemm, is_library, with_library
from ..ir.dtypes import DType
from ..ir.errors import CompileError, KilnError
from .cublas import (COMPUTE_32F, COMPUTE_32F_FAST_TF32, IMPLEMENTATION, TF32, CublasGemm, before_capture,
                     plan)
from .cache import cache_root, compile_turn, point_at, unit_name, unit_of, units, write_atomic
from .hardware import usable_cores
from .library import ArrayInterop, LibraryKernel

_MAX_BLOCKS = 65535 * 8      # the grid-stride loop covers the rest
_THREADS_PER_SM = 2048       # the most threads an SM holds at once (sm_80 and sm_90)
# a kernel whose points vary (decode's window) is launched with at most this many times the
# blocks the GPU holds at once: a CUDA graph records it at the largest size, and the blocks past
# the live points still launch, to exit (max_seq 4,096 at position 64 on the H200: the scores
# kernel took 10.9 us a layer, 2.1 us recorded at max_seq 704)
_VARYING_WAVES = 2
_TRIM_BELOW = 0.5             # of the device's memory free: below it, a process gives back its pool


def cupy_or_error():
    try:
        import cupy
        cupy.cuda.runtime.getDeviceCount()
    except Exception as err:   # no package, no driver, no device: all mean "no CUDA here"
        raise KilnError(f"kiln: the cuda backend needs CuPy and an NVIDIA GPU ({type(err).__name__}: "
                        f"{err}); install tensorkiln[cuda] on a GPU machine, or use --backend cpu") from None
    return cupy


def storage(dtype: DType) -> np.dtype:
    """How a tensor of dtype is held on the device (CuPy has no bfloat16)."""
    return np.dtype(np.uint16) if dtype is DType.BF16 else dtype.np


class CudaBackend:
    name = "cuda"
    source_suffix = ".cu"
    # each an NVRTC compile (a few to a module) and microseconds of timing: a GEMV's streaming form
    # (codegen/cuda_config.py) came third and left the grid's last two (a block of 512 a row, which
    # won 8192->2048 on an H100, and groups of 64, which won it on the H200) past the twelfth
    finalist_configs = 14
    records_each_size = True

    def __init__(self):
        self.cp = cupy_or_error()
        self._functions: dict[str, object] = {}
        # recordings replay on a stream of their own; a blocking stream, so that it stays ordered
        # with the default stream everything else runs on
        self._stream = self.cp.cuda.Stream(non_blocking=False)
        self._l2_flush = None          # a buffer twice the L2 size, read between timed calls
        self._weights: dict[int, tuple[np.ndarray, object]] = {}   # id of a host weight: it, on the device
        self._sms = self.cp.cuda.Device().attributes["MultiProcessorCount"]
        self._interop = ArrayInterop(self.cp, lambda a, dtype, count: a.ravel().view(storage(dtype)),
                                     self._to_f32, self._from_f32)

    # --- compiling ----------------------------------------------------------------------------
    @staticmethod
    @functools.lru_cache(maxsize=4096)   # a search meets the same kernels in candidate after candidate
    def render(kernel: Kernel, config: CudaConfig | LibraryConfig) -> tuple[str, str]:
        if isinstance(config, LibraryConfig):      # cuBLAS (runtime/cublas.py)
            return as_gemm(kernel).rendered(IMPLEMENTATION + ("-" + TF32 if config.library == TF32 else ""))
        if isinstance(config, AttentionConfig):
            draft = emit_cuda_attention(as_attention(kernel), config, "KERNEL")
        elif isinstance(config, DecodeAttentionConfig):
            draft = emit_cuda_decode_attention(as_attention(kernel), config, "KERNEL")
        elif isinstance(config, MmaConfig):
            draft = emit_cuda_gemm(as_tensor_gemm(kernel), config, "KERNEL")
        else:
            draft = emit_cuda(kernel, config, "KERNEL")
        name = f"k_{source_hash(draft)}"
        return name, draft.replace(" KERNEL(", f" {name}(", 1)

    @staticmethod
    def config_space(kernel: Kernel) -> list[CudaConfig | LibraryConfig]:
        """The template's configurations, and the cuBLAS call where one can take the product: at
        fixed sizes only where `plan` maps it to one call (the fallback, CuPy's matmul on f32
        copies, is slow and allocates, so it would keep decode from replaying a CUDA graph). Fused
        attention's tilings only, for a kernel it takes. A product (with or without an epilogue)
        on tensor cores next (codegen/cuda_gemm.py), so that a short budget times it too."""
        if as_attention(kernel):
            return attention_space(kernel)
        space = with_library(config_space(kernel), kernel)
        at = 2 if LibraryConfig() in space else 1
        space = space[:at] + mma_space(kernel) + space[at:]
        gemm = as_gemm(kernel)
        # fixed sizes: no symbol at all (a last-position product has fixed extents but reads its
        # row at an offset the prompt length gives)
        if gemm is not None and not gemm.symbols and plan(gemm, {}) is None:
            space = [c for c in space if not isinstance(c, LibraryConfig)]
        elif gemm is not None and DType.F32 in (gemm.a.dtype, gemm.b.dtype):
            at = space.index(LibraryConfig()) + 1
            space = space[:at] + [LibraryConfig(TF32)] + space[at:]
        return space

    @staticmethod
    def default_config(kernel: Kernel | None = None) -> CudaConfig | AttentionConfig:
        """The configuration a kernel is first checked with: fused attention's for a kernel it
        takes (the loop nest would compute each score once per output element)."""
        return attention_space(kernel)[0] if kernel is not None and as_attention(kernel) else CudaConfig()

    @staticmethod
    def config_from_json(data: dict) -> CudaConfig | LibraryConfig | AttentionConfig:
        if "attention" in data:
            return AttentionConfig.from_json(data)
        if "decode_attention" in data:
            return DecodeAttentionConfig.from_json(data)
        if "mma" in data:
            return MmaConfig.from_json(data)
        return LibraryConfig(data["library"]) if "library" in data else CudaConfig.from_json(data)

    def compile(self, functions: dict[str, str]) -> dict[str, object]:
        """Functions not compiled yet in this process, compiled by NVRTC several to a module, one
        module per core (runtime/cache.py: units), in parallel threads (NVRTC runs without the
        GIL). A module's source is kept beside a reference for each function in it, so that a
        later compile of the same function (the next candidate, another worker, the final build,
        a loaded artifact) asks CuPy for that module again, which its disk cache serves."""
        for name in [n for n in functions if is_library(n) and n not in self._functions]:
            gemm = Gemm.from_source(functions[name])
            tf32 = json.loads(functions[name])["implementation"].endswith(TF32)
            self._functions[name] = CublasGemm(gemm, self.cp, LibraryKernel(gemm, self._interop),
                                               COMPUTE_32F_FAST_TF32 if tf32 else COMPUTE_32F)
        missing = sorted(n for n in functions if n not in self._functions)
        if missing:
            folder = cache_root() / "cuda-units"
            folder.mkdir(parents=True, exist_ok=True)
            compiled, new = {}, []
            for name in missing:
                unit = unit_of(folder, name)
                if unit is None:
                    new.append(name)
                else:
                    compiled.setdefault(unit, []).append(name)
            jobs = [(unit.read_text(), names) for unit, names in compiled.items()]
            jobs += [(PRELUDE + "\n".join(functions[n] for n in names), names)
                     for names in units(new, usable_cores())]
            with ThreadPoolExecutor(max_workers=min(len(jobs), usable_cores())) as pool:
                for found in pool.map(lambda job: self._compile_unit(folder, *job, functions), jobs):
                    self._functions.update(found)
        return {n: self._functions[n] for n in functions}

    def _compile_unit(self, folder, source: str, names: list[str], functions: dict[str, str]) -> dict[str, object]:
        unit = folder / unit_name(source, ".cu")
        try:
            with compile_turn(unit.name):    # another worker compiling it meanwhile: its result from CuPy's disk cache
                module = self.cp.RawModule(code=source, options=("--std=c++17",))
                found = {name: module.get_function(name) for name in names}
        except self.cp.cuda.compiler.CompileException as err:
            if len(names) == 1:
                raise CompileError(f"kiln: NVRTC failed on kernel {names[0]}:\n{str(err)[-2000:]}") from None
            found, failed = {}, None
            for name in names:     # each alone: the error names the kernel, and the others are compiled
                try:
                    found |= self._compile_unit(folder, PRELUDE + functions[name], [name], functions)
                except CompileError as alone:
                    failed = failed or alone
            if failed:
                raise failed from None
        else:
            if not unit.exists():
                write_atomic(unit, source)
            point_at(folder, names, unit)
        return found

    # --- memory -------------------------------------------------------------------------------
    def allocate(self, nbytes: int):
        return self.cp.empty(max(nbytes, 1), dtype=self.cp.uint8)

    def memory_bytes(self) -> int:
        return self.cp.cuda.runtime.memGetInfo()[1]

    def trim(self) -> None:
        """CuPy's pool keeps every freed block for the next allocation: a worker that measured a
        prefill candidate with 24 GB of intermediates kept them, and on an H200 eight workers'
        pools left the parent's next 23 MB allocation out of memory (a 5-minute Llama compile
        stopped). Checked before each candidate; memGetInfo costs microseconds."""
        free, total = self.cp.cuda.runtime.memGetInfo()
        if free < _TRIM_BELOW * total:
            self.cp.get_default_memory_pool().free_all_blocks()

    def upload(self, array: np.ndarray):
        array = np.asarray(array, order="C")
        if array.dtype == DType.BF16.np:
            array = array.view(np.uint16)
        return self.cp.asarray(array)

    def upload_weight(self, array: np.ndarray):
        """A weight on the device once per host array: a model's graphs (decode, decode_long, the
        prefill buckets) and every candidate measured for a region read the same weights, which
        would otherwise take the GPU's memory once for each. The host array is held, so that its
        id names it for as long as the copy lives."""
        held = self._weights.get(id(array))
        if held is None or held[0] is not array:
            held = self._weights[id(array)] = (array, self.upload(array))
        return held[1]

    def input(self, array):
        return array if isinstance(array, self.cp.ndarray) else self.upload(array)

    def logical_dtype(self, array, expected: DType) -> np.dtype:
        return expected.np if array.dtype == storage(expected) else array.dtype

    def typed(self, buffer, dtype: DType):
        return buffer.view(storage(dtype))

    def _to_f32(self, values, dtype: DType):
        """bf16 is stored as its upper 16 bits: shift them back into place."""
        if dtype is DType.BF16:
            return (values.astype(self.cp.uint32) << 16).view(self.cp.float32)
        return values.astype(self.cp.float32, copy=False)

    def _from_f32(self, values, dtype: DType):
        if dtype is DType.BF16:    # round to nearest even, as kiln_bf16_store does
            bits = self.cp.ascontiguousarray(values, dtype=self.cp.float32).view(self.cp.uint32)
            return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(self.cp.uint16)
        return values.astype(storage(dtype), copy=False)

    def resident(self, array, written: bool) -> bool:
        return isinstance(array, self.cp.ndarray)

    @staticmethod
    def address(array) -> int:
        return array.data.ptr

    def write(self, buffer, array: np.ndarray) -> None:
        """Host values into an existing device array of the same shape and dtype."""
        array = np.asarray(array, order="C")
        buffer.set(array.view(np.uint16) if array.dtype == DType.BF16.np else array)

    def to_host(self, array, dtype: DType) -> np.ndarray:
        host = self.cp.asnumpy(array)
        return host.view(DType.BF16.np) if dtype is DType.BF16 else host

    @staticmethod
    def arg(array):
        return array

    def symbol_buffer(self, count: int):
        return self.cp.zeros(max(1, count), dtype=self.cp.int64)

    @staticmethod
    def write_symbols(buffer, values: list[int]) -> None:
        buffer.set(np.asarray(values, dtype=np.int64))     # one copy; the buffer holds exactly these

    def poison(self, buffer, dtype: DType) -> None:
        """NaN bit patterns for floats (bf16 0x7fc0, f16 0x7e00), all bits set otherwise."""
        if dtype is DType.F32:
            buffer.view(self.cp.float32)[:] = np.nan
        elif dtype in (DType.BF16, DType.F16):
            buffer.view(self.cp.uint16)[:] = 0x7FC0 if dtype is DType.BF16 else 0x7E00
        else:
            buffer[:] = 0xFF

    # --- launching and timing -----------------------------------------------------------------
    def launcher(self, fn, kernel: Kernel, config: CudaConfig | LibraryConfig):
        if isinstance(fn, CublasGemm):
            return fn.launcher(kernel)
        if isinstance(config, AttentionConfig):
            return _attention_launcher(fn, as_attention(kernel), config)
        if isinstance(config, DecodeAttentionConfig):
            return self._decode_attention_launcher(fn, as_attention(kernel), config)
        if isinstance(config, MmaConfig):
            return _mma_launcher(fn, as_tensor_gemm(kernel), config)
        # a row configuration's groups take rows (every loop but the last), any other's points
        extents = [e for _, e in (kernel.loops[:-1] if config.row else kernel.loops)]
        fixed = all(e.is_const for e in extents)
        # a pair configuration's group takes two points (codegen/pairs.py)
        parts, per_thread = config.split, points_per_thread(kernel, config) * (2 if config.pair else 1)

        # a staged configuration's blocks each fill their rows first: no more of them than the
        # GPU holds at once, each taking its share of the points, so the rows are computed once
        # per resident block rather than once per few points
        resident = self._sms * (_THREADS_PER_SM // config.block)
        most = (resident if config.stage else _MAX_BLOCKS // parts if fixed
                else min(_MAX_BLOCKS, resident * _VARYING_WAVES))

        def blocks(env) -> int:
            points = 1
            for e in extents:
                points *= e.value if fixed else e.evaluate(env)
            runs = min(most, -(-points * config.group // (config.block * per_thread)))
            return max(1, runs) * parts
        grid = (blocks({}),) if fixed else None
        block = (config.block,)
        # a split configuration's partials and arrival counters, allocated once here (never
        # inside a recording), the counters zeroed: each launch leaves them zero again
        scratch_bytes, counters = split_scratch(kernel, config)
        extra = (self.cp.empty(scratch_bytes, dtype=self.cp.uint8),
                 self.cp.zeros(counters, dtype=self.cp.uint32)) if parts > 1 else ()

        def launch(args, env):
            fn(grid or (blocks(env),), block, (*args, *extra))
        return launch

    def _decode_attention_launcher(self, fn, attention, config: DecodeAttentionConfig):
        """A block per part of each batch point's keys (codegen/cuda_decode_attention.py), a
        split's partials and arrival counters allocated once here, the counters zeroed."""
        loops = dict(attention.kernel.loops)
        batch = [loops[v] for v in attention.batch]
        scratch_bytes, counters = decode_scratch(attention, config)
        extra = (self.cp.empty(scratch_bytes, dtype=self.cp.uint8),
                 self.cp.zeros(counters, dtype=self.cp.uint32)) if config.split > 1 else ()

        def launch(args, env):
            points = 1
            for extent in batch:
                points *= extent.evaluate(env)
            fn((points * config.split,), (DECODE_WARPS * 32,), (*args, *extra))
        return launch

    @staticmethod
    def capturable(fn, env: dict[str, int]) -> bool:
        """Whether a CUDA graph can record `fn` at the sizes of `env`."""
        return not isinstance(fn, CublasGemm) or fn.capturable(env)

    def capture(self, body):
        """Record the kernels `body` launches into a CUDA graph (nothing runs yet); returns a
        function that replays them. `body` must not allocate or copy from the host."""
        with self._stream:
            before_capture(self.cp, self._stream.ptr)
            self._stream.begin_capture()
            try:
                body()
            finally:
                graph = self._stream.end_capture()
        return lambda: graph.launch(self._stream)

    def synchronize(self) -> None:
        self.cp.cuda.get_current_stream().synchronize()

    def time(self, fn, target_s: float, most: int) -> list[float]:
        """Seconds per call from CUDA events around each call, after one warm-up call. Before
        each call a buffer twice the L2 cache is read through it, so that weights smaller than it
        (a layer's) are timed from memory, as one decode step reads them. One call at a time:
        calls enqueued in a batch and waited for once saved 17% of a timing's host time on an
        H100 and timed every kernel 0.6-0.9 us slower (scripts/timing_bias.py)."""
        fn()
        times = []
        while len(times) < 3 or (sum(times) < target_s and len(times) < most):
            self.evict_l2()
            start, end = self.cp.cuda.Event(), self.cp.cuda.Event()
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(self.cp.cuda.get_elapsed_time(start, end) / 1e3)
        return times

    def evict_l2(self) -> None:
        """Read a buffer twice the L2's size: read, not written, since a fill would leave the L2
        full of dirty lines, whose write-back the timed kernel would pay (a decode step finds the
        weights it reads clean)."""
        if self._l2_flush is None:
            l2 = self.cp.cuda.Device().attributes.get("L2CacheSize", 64 << 20)
            self._l2_flush = self.cp.empty(2 * l2, dtype=self.cp.uint8)
        self._l2_flush.max()

    def copy_bandwidth(self, nbytes: int = 1 << 30) -> float:
        """Bytes per second (read plus written) of a device-to-device copy."""
        src = self.cp.ones(nbytes // 4, self.cp.float32)
        dst = self.cp.empty_like(src)
        times = self.time(lambda: dst.__setitem__(slice(None), src), 0.05, 20)
        return 2 * nbytes / sorted(times)[len(times) // 2]


def _mma_launcher(fn, gemm, config: MmaConfig):
    """A block per `config.rows` × `config.cols` tile of the output (codegen/cuda_gemm.py)."""
    def launch(args, env):
        tiles_m = -(-gemm.extent_m.evaluate(env) // config.rows)
        if tiles_m > 65535:
            raise KilnError(f"kiln: a tensor-core product of {tiles_m} row tiles: more than a grid holds")
        fn((max(1, -(-gemm.extent_n.evaluate(env) // config.cols)), max(1, tiles_m)), (config.threads,), args)
    return launch


def _attention_launcher(fn, attention, config: AttentionConfig):
    """A block per `config.rows` query rows of each batch point (codegen/cuda_attention.py)."""
    loops = dict(attention.kernel.loops)
    rows = loops[attention.query]
    batch = [loops[v] for v in attention.batch]

    def launch(args, env):
        points = 1
        for extent in batch:
            points *= extent.evaluate(env)
        if points > 65535:
            raise KilnError(f"kiln: fused attention over {points} heads: more than a grid holds")
        fn((max(1, -(-rows.evaluate(env) // config.rows)), points), (config.rows * 2,), args)
    return launch
