"""Running a library kernel (codegen/library.py) on a backend's memory: strided views of the
operands, one matmul (PyTorch's on the CPU, cuBLAS through CuPy on the GPU), the product written
through a strided view of the output. One implementation for both backends; each supplies its
array module and how its buffers become typed arrays and 16-bit floats become f32 and back."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

from ..codegen.kernel import Kernel
from ..codegen.library import Gemm
from ..ir.dtypes import DType


@dataclass(frozen=True)
class ArrayInterop:
    xp: Any                                              # numpy or cupy
    flat: Callable[[Any, DType, int], Any]               # (launch argument, dtype, elements) -> 1-D array
    to_f32: Callable[[Any, DType], Any]                  # a typed view -> float32 values
    from_f32: Callable[[Any, DType], Any]                # float32 values -> what the buffer stores
    matmul: Callable[[Any, Any], Any] | None = None      # the product of two f32 arrays; xp's by default


class LibraryKernel:
    """A compiled library kernel: called by its backend's launcher with the launch arguments
    (output, inputs..., symbols) and the symbol values."""

    def __init__(self, gemm: Gemm, interop: ArrayInterop):
        self.gemm, self.interop = gemm, interop

    def launcher(self, kernel: Kernel):
        names = [kernel.output.name, *(b.name for b in kernel.inputs)]
        return lambda args, env: self(dict(zip(names, args)), env)

    def __call__(self, args: dict[str, Any], env: dict[str, int]) -> None:
        g, io = self.gemm, self.interop
        extent = {v: e.evaluate(env) for v, e in g.extents.items()}

        def view(operand, order):
            offset = operand.offset.evaluate(env)
            strides = [operand.strides[v].evaluate(env) if v in operand.strides else 0 for v in order]
            count = offset + 1 + sum((extent[v] - 1) * s for v, s in zip(order, strides))
            base = io.flat(args[operand.buffer], operand.dtype, count)[offset:]
            return io.xp.lib.stride_tricks.as_strided(
                base, shape=[extent[v] for v in order], strides=[s * base.itemsize for s in strides])
        batch = [extent[v] for v in g.batch]
        m, n, k = (math.prod(extent[v] for v in group) for group in (g.m, g.n, g.k))
        a = io.to_f32(view(g.a, (*g.batch, *g.m, *g.k)), g.a.dtype).reshape(*batch, m, k)
        b = io.to_f32(view(g.b, (*g.batch, *g.k, *g.n)), g.b.dtype).reshape(*batch, k, n)
        product = (io.matmul or io.xp.matmul)(a, b).reshape([extent[v] for v in (*g.batch, *g.m, *g.n)])
        view(g.out, (*g.batch, *g.m, *g.n))[...] = io.from_f32(product, g.out.dtype)
