"""Library choices: a kernel that is a (batched) matrix product of two strided operands can also
run as one BLAS call (PyTorch's matmul on the CPU, cuBLAS on the GPU). It is
one more configuration in the kernel's space: the tuner checks and times it beside the generated
ones and keeps whichever is faster, per kernel and shape.

`as_gemm` recognizes the product in the kernel IR: the element value is a sum over one variable of
a product of two loads (each maybe cast to a float type), every index affine in the loop
variables with constant strides. Output loops read by both operands are batch dimensions, by one
of them rows (M) or columns (N). A variable an index divides by a constant (a reduction over
(head, d) read as heads * d; GQA's shared key/value head) is split into quotient and remainder.
The operands may differ in float type (f32 softmax weights times bf16 values): each backend reads
both as the wider one."""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from ..ir.dtypes import DType
from ..ir.ops import Op
from ..ir.serialize import expr_from_json, expr_to_json
from ..ir.symbolic import Expr
from .index import substitute
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
    """A strided view of a buffer: element offset, and a stride (elements) per variable; both
    may depend on the graph's symbols (a [heads, seq, dim] layout read as [seq, heads * dim])."""
    buffer: str
    dtype: DType
    offset: Expr
    strides: dict[str, Expr]

    def to_json(self) -> dict:
        return {"buffer": self.buffer, "dtype": self.dtype.value, "offset": expr_to_json(self.offset),
                "strides": {v: expr_to_json(e) for v, e in self.strides.items()}}

    @staticmethod
    def from_json(data: dict) -> Operand:
        return Operand(data["buffer"], DType(data["dtype"]), expr_from_json(data["offset"]),
                       {k: expr_from_json(v) for k, v in data["strides"].items()})


@dataclass(frozen=True)
class Gemm:
    """out[batch, m, n] = sum_k a[batch, m, k] * b[batch, k, n]; each group of variables in
    loop order, `extents` the sizes of every variable. The reduction may be over several
    variables (a reduction index split by a division into its quotient and remainder)."""
    batch: tuple[str, ...]
    m: tuple[str, ...]
    n: tuple[str, ...]
    k: tuple[str, ...]
    extents: dict[str, Expr]
    a: Operand
    b: Operand
    out: Operand
    symbols: tuple[str, ...]         # the kernel's symbol arguments, in order

    def source(self, implementation: str) -> str:
        """The description a backend "compiles": canonical JSON, named by its hash. It names the
        backend's `implementation` too, so that a tuning database keyed by source never serves
        one implementation's timings for another."""
        return json.dumps({"library": "gemm", "implementation": implementation, "batch": self.batch,
                           "m": self.m, "n": self.n, "k": self.k,
                           "extents": {v: expr_to_json(e) for v, e in self.extents.items()},
                           "a": self.a.to_json(), "b": self.b.to_json(), "out": self.out.to_json(),
                           "symbols": self.symbols}, sort_keys=True)

    def rendered(self, implementation: str) -> tuple[str, str]:
        """(kernel name, source) as a backend renders the library call."""
        source = self.source(implementation)
        return f"{PREFIX}{hashlib.sha256(source.encode()).hexdigest()[:20]}", source

    @staticmethod
    def from_source(source: str) -> Gemm:
        d = json.loads(source)
        return Gemm(tuple(d["batch"]), tuple(d["m"]), tuple(d["n"]), tuple(d["k"]),
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
    if not kernel.output.dtype.is_float or kernel.also:
        return None
    if isinstance(value, Apply) and value.op is Op.CAST:     # the store rounds to the output type
        value = value.args[0]
    if not (isinstance(value, Reduce) and value.op is Op.SUM_REDUCE and isinstance(value.body, Apply)
            and value.body.op is Op.MUL):
        return None
    loads = [_float_load(x) for x in value.body.args]
    if None in loads:
        return None
    indices = [l.index for l in loads]
    k, extents = _split(value.var, value.extent, indices)
    # an output variable an operand divides (GQA: query head h reads key/value head h // 4)
    # becomes two too; the quotient is then a batch, the remainder rows of the one reading it
    loops, env, bounds = [], dict(k.env), dict(k.bounds)
    for v, extent in kernel.loops:
        split, split_extents = _split(v, extent, indices)
        loops += split.vars
        extents |= split_extents
        env |= split.env
        bounds |= split.bounds
    indices = [substitute(i, env, bounds) for i in indices]
    allowed = set(loops) | set(k.vars) | set(kernel.symbols)
    terms = [_affine(i, loops + list(k.vars), allowed) for i in indices]
    store = _affine(substitute(kernel.store, env, bounds), loops, allowed)
    if None in terms or store is None:
        return None
    (a_off, a_str), (b_off, b_str) = terms
    if any(v not in a_str or v not in b_str for v in k.vars):
        return None
    groups: dict[str, list[str]] = {"batch": [], "m": [], "n": []}
    for v in loops:
        role = {(True, True): "batch", (True, False): "m", (False, True): "n"}.get((v in a_str, v in b_str))
        if role is None:          # an output axis neither operand reads: a broadcast, not a GEMM
            return None
        groups[role].append(v)
    (a_load, b_load) = loads
    return Gemm(tuple(groups["batch"]), tuple(groups["m"]), tuple(groups["n"]), k.vars, extents,
                Operand(a_load.buffer, a_load.dtype, a_off, a_str),
                Operand(b_load.buffer, b_load.dtype, b_off, b_str),
                Operand(kernel.output.name, kernel.output.dtype, store[0], store[1]), kernel.symbols)


@dataclass(frozen=True)
class _Split:
    vars: tuple[str, ...]
    env: dict[str, Expr]                    # the reduction variable in terms of vars
    bounds: dict[str, tuple[int, int]]


def _split(r: str, extent: Expr, indices: list[Expr]) -> tuple[_Split, dict[str, Expr]]:
    """The variable r, or, where an index divides it by a constant c that divides its extent,
    r = c * q + m over two variables (the division and remainder then vanish)."""
    divisors = {a.args[1].value for i in indices for mono, _ in i.terms for a in mono
                if not isinstance(a, str) and a.fn in ("floordiv", "mod") and a.args[0] == Expr.of(r)
                and a.args[1].is_const}
    if len(divisors) != 1 or not extent.is_const or extent.value % next(iter(divisors)):
        return _Split((r,), {}, {}), {r: extent}
    c = divisors.pop()
    q, m = f"{r}_q", f"{r}_m"
    split = _Split((q, m), {r: Expr.of(q) * c + Expr.of(m)}, {q: (0, extent.value // c - 1), m: (0, c - 1)})
    return split, {q: Expr.of(extent.value // c), m: Expr.of(c)}


def _float_load(s: Scalar) -> Load | None:
    if isinstance(s, Apply) and s.op is Op.CAST and s.dtype.is_float:
        s = s.args[0]
    return s if isinstance(s, Load) and s.dtype.is_float else None


def _affine(index: Expr, variables: list[str], allowed: set[str]) -> tuple[Expr, dict[str, Expr]] | None:
    """index = offset + sum(stride * variable), strides and offset over the graph's symbols."""
    strides: dict[str, dict] = {}
    offset: dict = {}
    for mono, coeff in index.terms:
        names = set().union(*(a.symbols() if not isinstance(a, str) else {a} for a in mono))
        if not names <= allowed:
            return None       # a gathered value or a loop variable of another kernel
        used = [a for a in mono if isinstance(a, str) and a in variables]
        rest = tuple(a for a in mono if not (isinstance(a, str) and a in variables))
        if len(used) > 1 or any(not isinstance(a, str) and a.symbols() & set(variables) for a in rest):
            return None       # a product of variables, or a variable inside a division
        target = strides.setdefault(used[0], {}) if used else offset
        target[rest] = target.get(rest, 0) + coeff
    return Expr(offset), {v: Expr(t) for v, t in strides.items() if Expr(t) != Expr.of(0)}
