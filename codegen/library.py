"""Library choices: a kernel that is a (batched) matrix product of two strided operands can also
run as one BLAS call (OpenBLAS through numpy on the CPU, cuBLAS through CuPy on the GPU). It is
one more configuration in the kernel's space: the tuner checks and times it beside the generated
ones and keeps whichever is faster, per kernel and shape.

`as_gemm` recognizes the product in the kernel IR: the element value is a sum over one variable of
a product of two loads (each maybe cast to a float type), every index affine in the loop
variables with constant strides. Output loops read by both operands are batch dimensions, by one
of them rows (M) or columns (N)."""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from ..ir.dtypes import DType
from ..ir.ops import Op
from ..ir.serialize import expr_from_json, expr_to_json
from ..ir.symbolic import Expr
from .kernel import Apply, Kernel, Load, Reduce, Scalar


PREFIX = "lib_"


@dataclass(frozen=True)
class LibraryConfig:
    """Run the kernel as a library call instead of generated code."""
    library: str = "gemm"

    def key(self) -> str:
        return f"library-{self.library}"

    def to_json(self) -> dict:
        return {"library": self.library}


@dataclass(frozen=True)
class Operand:
    """A strided view of a buffer: element offset, and a stride (elements) per variable."""
    buffer: str
    dtype: DType
    offset: Expr
    strides: dict[str, int]

    def to_json(self) -> dict:
        return {"buffer": self.buffer, "dtype": self.dtype.value, "offset": expr_to_json(self.offset),
                "strides": self.strides}

    @staticmethod
    def from_json(data: dict) -> Operand:
        return Operand(data["buffer"], DType(data["dtype"]), expr_from_json(data["offset"]),
                       {k: int(v) for k, v in data["strides"].items()})


@dataclass(frozen=True)
class Gemm:
    """out[batch, m, n] = sum_k a[batch, m, k] * b[batch, k, n]; each group of variables in
    loop order, `extents` the sizes of every variable, k included."""
    batch: tuple[str, ...]
    m: tuple[str, ...]
    n: tuple[str, ...]
    k: str
    extents: dict[str, Expr]
    a: Operand
    b: Operand
    out: Operand
    symbols: tuple[str, ...]         # the kernel's symbol arguments, in order

    def source(self) -> str:
        """The description a backend "compiles": canonical JSON, named by its hash."""
        return json.dumps({"library": "gemm", "batch": self.batch, "m": self.m, "n": self.n, "k": self.k,
                           "extents": {v: expr_to_json(e) for v, e in self.extents.items()},
                           "a": self.a.to_json(), "b": self.b.to_json(), "out": self.out.to_json(),
                           "symbols": self.symbols}, sort_keys=True)

    def name(self) -> str:
        return f"{PREFIX}{hashlib.sha256(self.source().encode()).hexdigest()[:20]}"

    @staticmethod
    def from_source(source: str) -> Gemm:
        d = json.loads(source)
        return Gemm(tuple(d["batch"]), tuple(d["m"]), tuple(d["n"]), d["k"],
                    {v: expr_from_json(e) for v, e in d["extents"].items()},
                    Operand.from_json(d["a"]), Operand.from_json(d["b"]), Operand.from_json(d["out"]),
                    tuple(d["symbols"]))


def is_library(name: str) -> bool:
    """Whether a rendered kernel name is a library call's (its source is a `Gemm` description)."""
    return name.startswith(PREFIX)


def with_library(space: list, kernel: Kernel) -> list:
    """A kernel's configuration space with the library call second, after the default (the
    tuner may time only the first few)."""
    return space[:1] + [LibraryConfig()] + space[1:] if as_gemm(kernel) else space


def as_gemm(kernel: Kernel) -> Gemm | None:
    value = kernel.value
    if not kernel.output.dtype.is_float:
        return None
    if isinstance(value, Apply) and value.op is Op.CAST:     # the store rounds to the output type
        value = value.args[0]
    if not (isinstance(value, Reduce) and value.op is Op.SUM_REDUCE and isinstance(value.body, Apply)
            and value.body.op is Op.MUL):
        return None
    loads = [_float_load(x) for x in value.body.args]
    if None in loads:
        return None
    loops = [v for v, _ in kernel.loops]
    allowed = set(loops) | {value.var} | set(kernel.symbols)
    terms = [_affine(l.index, loops + [value.var], allowed) for l in loads]
    store = _affine(kernel.store, loops, allowed)
    if None in terms or store is None:
        return None
    (a_off, a_str), (b_off, b_str) = terms
    k = value.var
    if not a_str.get(k) or not b_str.get(k):
        return None
    groups: dict[str, list[str]] = {"batch": [], "m": [], "n": []}
    for v in loops:
        role = {(True, True): "batch", (True, False): "m", (False, True): "n"}.get(
            (bool(a_str.get(v)), bool(b_str.get(v))))
        if role is None:          # an output axis neither operand reads: a broadcast, not a GEMM
            return None
        groups[role].append(v)
    extents = {v: e for v, e in kernel.loops} | {k: value.extent}
    (a_load, b_load) = loads
    return Gemm(tuple(groups["batch"]), tuple(groups["m"]), tuple(groups["n"]), k, extents,
                Operand(a_load.buffer, a_load.dtype, a_off, a_str),
                Operand(b_load.buffer, b_load.dtype, b_off, b_str),
                Operand(kernel.output.name, kernel.output.dtype, store[0], store[1]), kernel.symbols)


def _float_load(s: Scalar) -> Load | None:
    if isinstance(s, Apply) and s.op is Op.CAST and s.dtype.is_float:
        s = s.args[0]
    return s if isinstance(s, Load) and s.dtype.is_float else None


def _affine(index: Expr, variables: list[str], allowed: set[str]) -> tuple[Expr, dict[str, int]] | None:
    """index = offset + sum(stride * variable), strides constant, the offset over symbols only."""
    strides: dict[str, int] = {}
    offset: dict = {}
    for mono, coeff in index.terms:
        names = set().union(*(a.symbols() if not isinstance(a, str) else {a} for a in mono))
        if not names <= allowed:
            return None       # a gathered value or a loop variable of another kernel
        used = [a for a in mono if isinstance(a, str) and a in variables]
        if not used:
            if names & set(variables):
                return None   # a variable inside a call (a floor division): not a stride
            offset[mono] = coeff
        elif len(mono) == 1:
            strides[used[0]] = strides.get(used[0], 0) + coeff
        else:
            return None       # a stride that depends on a symbol, or a product of variables
    return Expr(offset), {v: c for v, c in strides.items() if c}
