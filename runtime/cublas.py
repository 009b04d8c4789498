"""cuBLAS on the operands where they lie: a library GEMM (codegen/library.py) whose operands and
output are each a strided matrix with one unit stride becomes one column-major strided-batched
`cublasGemmStridedBatchedEx` call on the 16-bit (or f32) data, accumulated in f32. No f32 copies:
CuPy's matmul, by contrast, needs f32 copies of bf16 operands (a layer's weights, every call).
An input operand whose variables do not flatten into a matrix (attention's output [heads, seq, d]
read as [seq, heads * d] by the output projection) is first gathered, in its own type, into a
contiguous scratch the launcher holds; a bf16 operand times an f32 one (prefill's bf16 values under
f32 softmax weights) is gathered into f32, and the call runs in f32.

A product with an f32 operand has a second implementation, TF32: the tensor cores read each f32
operand rounded to a 10-bit mantissa, accumulating in f32. Prefill's attention products in a bf16
model (scores of bf16-valued queries and keys held in f32; f32 softmax weights times bf16 values)
ran 35-54 us a 512-token layer in f32 on the H200. Whether that rounding is allowed is the
tuner's check against the reference at the model's tolerance: a bf16 model's passes, an f32
model's does not.

`plan` is pure arithmetic on strides, so the layouts are tested without a GPU."""
from __future__ import annotations

import ctypes
import functools
import math
from dataclasses import dataclass

import numpy as np

from ..codegen.library import Gemm, Operand
from ..ir.dtypes import DType
from ..ir.errors import KilnError

# cudaDataType_t and cublasComputeType_t values (library_types.h, cublas_api.h)
CUDA_TYPE = {DType.F32: 0, DType.F16: 2, DType.BF16: 14}
COMPUTE_32F = 68
COMPUTE_32F_FAST_TF32 = 77
IMPLEMENTATION = "cublasGemmStridedBatchedEx"
TF32 = "tf32"          # the LibraryConfig of the TF32 implementation
GEMM_DEFAULT = -1
WORKSPACE_BYTES = 32 << 20


@dataclass(frozen=True)
class Matrix:
    """Where one column-major matrix operand lies: element offset, leading dimension, batch
    stride (elements), and whether cuBLAS reads it transposed."""
    buffer: str
    dtype: DType
    offset: int
    ld: int
    batch_stride: int
    transposed: bool = False


@dataclass(frozen=True)
class Gather:
    """An operand copied, before the call, into the contiguous row-major array of `shape` at
    the scratch `into`: element [i0, i1, ...] from `buffer` at offset + sum(i * stride)."""
    buffer: str
    dtype: DType
    offset: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    into: str
    to: DType | None = None          # the type written, where it differs (bf16 widened to f32)

    @property
    def elements(self) -> int:
        return math.prod(self.shape)

    @property
    def stored(self) -> DType:
        return self.to or self.dtype


@dataclass(frozen=True)
class BlasCall:
    """C[rows, cols] = op(A)[rows, k] @ op(B)[k, cols] for each of `batch` matrices, column-major,
    after `gathers`."""
    rows: int
    cols: int
    k: int
    batch: int
    a: Matrix
    b: Matrix
    c: Matrix
    gathers: tuple[Gather, ...] = ()


def _nested_stride(operand: Operand, group: tuple[str, ...], extent: dict[str, int],
                   env: dict[str, int]) -> int | None:
    """The stride of a group of variables read as one row-major index, when their strides nest
    (each the next one's stride times its extent); 0 for a group of unit extents; None if not."""
    stride, span = None, 1
    for v in reversed([v for v in group if extent[v] != 1]):
        s = operand.strides[v].evaluate(env) if v in operand.strides else 0
        if stride is None:
            stride = s
        elif s != stride * span:
            return None
        span *= extent[v]
    return 0 if stride is None else stride


def _layout(rows: int, cols: int, row_stride: int, col_stride: int) -> tuple[bool, int] | None:
    """(transposed, leading dimension) of a rows x cols matrix for cuBLAS: column-major as it
    is when its rows are contiguous, else its transpose when its columns are; None if neither."""
    if rows == 1 or row_stride == 1:
        ld = col_stride if cols > 1 else rows
        if ld >= max(rows, 1):
            return False, ld
    if cols == 1 or col_stride == 1:
        ld = row_stride if rows > 1 else cols
        if ld >= max(cols, 1):
            return True, ld
    return None


def plan(gemm: Gemm, env: dict[str, int]) -> BlasCall | None:
    """One cuBLAS call computing `gemm` for these symbol values (after gathering an input
    operand whose variables do not flatten), or None when the output does not flatten or the
    types do not fit cuBLAS."""
    a, b, out = gemm.a, gemm.b, gemm.out
    wide = a.dtype if a.dtype is b.dtype else DType.F32
    if {a.dtype, b.dtype} - {wide, DType.BF16} or wide not in CUDA_TYPE or out.dtype not in CUDA_TYPE or \
            (wide is DType.F32 and out.dtype is not DType.F32):
        return None
    extent = {v: e.evaluate(env) for v, e in gemm.extents.items()}
    size = {g: math.prod(extent[v] for v in getattr(gemm, g)) for g in ("batch", "m", "n", "k")}
    strides, where, gathers = {}, {}, []
    for name, operand, groups in (("a", a, ("batch", "m", "k")), ("b", b, ("batch", "k", "n")),
                                  ("out", out, ("batch", "m", "n"))):
        nested = {g: _nested_stride(operand, getattr(gemm, g), extent, env) for g in groups}
        where[name] = (operand.buffer, operand.dtype, operand.offset.evaluate(env))
        widened = name != "out" and operand.dtype is not wide
        if None in nested.values() or widened:
            if name == "out":
                return None
            variables = [v for g in groups for v in getattr(gemm, g)]
            into = f"kiln_gather_{name}"
            gathers.append(Gather(operand.buffer, operand.dtype, operand.offset.evaluate(env),
                                  tuple(extent[v] for v in variables),
                                  tuple(operand.strides[v].evaluate(env) if v in operand.strides else 0
                                        for v in variables), into, wide if widened else None))
            where[name] = (into, wide, 0)
            inner = size[groups[1]] * size[groups[2]]
            nested = {groups[0]: inner, groups[1]: size[groups[2]], groups[2]: 1}
        strides.update({(name, g): s for g, s in nested.items()})

    def matrix(name: str, row: str, col: str, transposed_ok: bool) -> Matrix | None:
        layout = _layout(size[row], size[col], strides[name, row], strides[name, col])
        if layout is None or (layout[0] and not transposed_ok):
            return None
        buffer, dtype, offset = where[name]
        return Matrix(buffer, dtype, offset, layout[1], strides[name, "batch"], layout[0])
    # C = A B when the output is column-major; else C^T = B^T A^T, whose output is
    for rows, cols, first, second in (("m", "n", ("a", "m", "k"), ("b", "k", "n")),
                                      ("n", "m", ("b", "n", "k"), ("a", "k", "m"))):
        c = matrix("out", rows, cols, False)
        left, right = matrix(*first, True), matrix(*second, True)
        if c is not None and left is not None and right is not None:
            return BlasCall(size[rows], size[cols], size["k"], size["batch"], left, right, c, tuple(gathers))
    return None


class CublasGemm:
    """A library GEMM launched as cuBLAS calls on the launch arguments' device pointers; a shape
    `plan` cannot map falls back to `fallback` (CuPy's matmul on f32 copies)."""

    def __init__(self, gemm: Gemm, cp, fallback, compute: int = COMPUTE_32F):
        self.gemm, self.cp, self.fallback, self.compute = gemm, cp, fallback, compute
        self._plans: dict[tuple, BlasCall | None] = {}

    def plan(self, env: dict[str, int]) -> BlasCall | None:
        key = tuple(sorted(env.items()))
        if key not in self._plans:
            self._plans[key] = plan(self.gemm, env)
        return self._plans[key]

    def capturable(self, env: dict[str, int]) -> bool:
        """Whether these sizes run as one cuBLAS call, which a CUDA graph can record (the
        fallback allocates f32 copies, which a recording must not)."""
        return self.plan(env) is not None

    def launcher(self, kernel):
        names = [kernel.output.name, *(b.name for b in kernel.inputs)]
        generic = self.fallback.launcher(kernel)
        one, zero = np.array(1.0, np.float32), np.array(0.0, np.float32)   # read at each call
        scratch: dict[str, object] = {}      # gathered operands, by name; never allocated in a recording
        retired: list = []      # outgrown scratch a recording made at a shorter length still writes

        def gather_into(gather: Gather, args) -> None:
            held = scratch.get(gather.into)
            if held is None or held.size < gather.elements:
                retired.extend([held] if held is not None else [])
                held = scratch[gather.into] = self.cp.empty(gather.elements, _storage(gather.stored))
            source = args[names.index(gather.buffer)]
            item = gather.dtype.np.itemsize
            view = self.cp.ndarray(gather.shape, _storage(gather.dtype), self.cp.cuda.MemoryPointer(
                source.data.mem, source.data.ptr - source.data.mem.ptr + gather.offset * item),
                tuple(s * item for s in gather.strides))
            into = held[:gather.elements].reshape(gather.shape)
            if gather.to is None:
                into[...] = view
            else:       # bf16 bits are an f32's upper half; one kernel, nothing allocated
                _widen_bf16(self.cp)(view, into)
        if not self.gemm.symbols and self.plan({}) is not None:    # fixed sizes: the scratch now
            for gather in self.plan({}).gathers:
                scratch[gather.into] = self.cp.empty(gather.elements, _storage(gather.stored))

        def launch(args, env):
            call = self.plan(env)
            if call is None:
                return generic(args, env)
            for gather in call.gathers:
                gather_into(gather, args)
            pointers = dict(zip(names, (a.data.ptr for a in args)))
            pointers.update({name: held.data.ptr for name, held in scratch.items()})
            blas = handle(self.cp)
            blas.use_stream(self.cp.cuda.get_current_stream().ptr)

            def at(m: Matrix) -> int:
                return pointers[m.buffer] + m.offset * m.dtype.np.itemsize
            blas.check(blas.lib.cublasGemmStridedBatchedEx(
                blas.handle, int(call.a.transposed), int(call.b.transposed), call.rows, call.cols, call.k,
                one.ctypes.data, at(call.a), CUDA_TYPE[call.a.dtype], call.a.ld, call.a.batch_stride,
                at(call.b), CUDA_TYPE[call.b.dtype], call.b.ld, call.b.batch_stride,
                zero.ctypes.data, at(call.c), CUDA_TYPE[call.c.dtype], call.c.ld, call.c.batch_stride,
                call.batch, self.compute, GEMM_DEFAULT), "cublasGemmStridedBatchedEx")
        return launch


@functools.cache
def _widen_bf16(cp):
    return cp.ElementwiseKernel("uint16 x", "uint32 y", "y = ((unsigned int)x) << 16", "kiln_widen_bf16")


def _storage(dtype: DType) -> np.dtype:
    """How the device holds a type's bits (bf16 as 16-bit words: CuPy has no bfloat16)."""
    return np.dtype(f"u{dtype.np.itemsize}")


class Handle:
    """Kiln's own cuBLAS handle, called through ctypes. CuPy's wrappers set their handle's stream
    before every call and refuse to while a stream is being captured, so no CUDA graph could
    record them. This one is set to a stream (with a workspace allocated once: cublasSetStream
    resets the workspace to cuBLAS's default, which may allocate) only when the stream changes,
    and before a capture begins, so a captured call makes no such call and allocates nothing."""

    _GEMM_ARGS = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                  ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_longlong,
                  ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_longlong,
                  ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_longlong,
                  ctypes.c_int, ctypes.c_int, ctypes.c_int]

    def __init__(self, cp):
        cp.cuda.device.get_cublas_handle()        # CuPy loads libcublas; use the same library
        self.lib = ctypes.CDLL(_loaded_library("libcublas.so"))
        self.lib.cublasGemmStridedBatchedEx.argtypes = self._GEMM_ARGS
        self.lib.cublasSetStream_v2.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        self.lib.cublasSetWorkspace_v2.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
        handle = ctypes.c_void_p()
        self.check(self.lib.cublasCreate_v2(ctypes.byref(handle)), "cublasCreate")
        self.handle = handle
        self.workspace = cp.empty(WORKSPACE_BYTES, dtype=cp.uint8)
        self.stream: int | None = None

    def use_stream(self, stream: int) -> None:
        if stream != self.stream:
            self.check(self.lib.cublasSetStream_v2(self.handle, stream), "cublasSetStream")
            self.check(self.lib.cublasSetWorkspace_v2(self.handle, self.workspace.data.ptr, WORKSPACE_BYTES),
                       "cublasSetWorkspace")
            self.stream = stream

    @staticmethod
    def check(status: int, what: str) -> None:
        if status != 0:
            raise KilnError(f"kiln: {what} failed with cuBLAS status {status}")


_HANDLES: dict[int, Handle] = {}


def handle(cp) -> Handle:
    """This device's handle (made on first use)."""
    device = cp.cuda.Device().id
    if device not in _HANDLES:
        _HANDLES[device] = Handle(cp)
    return _HANDLES[device]


def before_capture(cp, stream: int) -> None:
    """Point the handle, where one is in use, at the stream a CUDA graph is about to capture."""
    device = cp.cuda.Device().id
    if device in _HANDLES:
        _HANDLES[device].use_stream(stream)


def _loaded_library(name: str) -> str:
    """The path of a shared library this process has loaded (CuPy's libcublas), else `name`."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.split()[-1] if len(line.split()) >= 6 else ""
            if f"/{name}" in path:
                return path
    return name
