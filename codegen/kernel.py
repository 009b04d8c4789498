"""The kernel IR both emitters render: a loop nest over an output buffer whose element value is a
scalar expression tree. Loads carry flat index expressions (views are already resolved into
them); a Reduce is a loop inside the expression; a Bind names a loaded integer (a gather index, a
slice start) so index expressions can use it. Emitters hoist every subexpression to the
outermost loop whose variables it uses, so one template covers elementwise chains, reductions
with prologue and epilogue, GEMV and GEMM. `nodes` (each node once, after its children) and
`rebuilt` (bottom-up, through a visit) are the walks analyses and rewrites of it share; a walk
that carries context down the tree (the reductions around a node, how often it runs) recurses
itself."""
from __future__ import annotations

import hashlib
import weakref
from math import prod
from dataclasses import dataclass, field, fields
from typing import Any, Callable

import numpy as np

from ..ir.dtypes import DType
from ..ir.ops import Op
from ..ir.symbolic import Expr, sym
from .index import substitute


class _Interned(type):
    """Scalars are hash-consed: constructing one equal to a live one returns that one. Equal trees
    are then the same object, so comparing two is an identity check at each level, where a
    structural comparison of equal but distinct trees walks both whole (walks that keep a set of
    the nodes seen compared deep trees over and over: a MoE layer's attention trial took 70 s)."""
    _live: weakref.WeakValueDictionary = weakref.WeakValueDictionary()   # by (class, fields)
    _compared: dict[type, tuple[str, ...]] = {}

    def __call__(cls, *args, **kwargs):
        made = super().__call__(*args, **kwargs)
        names = _Interned._compared.get(cls)
        if names is None:
            names = _Interned._compared[cls] = tuple(f.name for f in fields(cls) if f.compare)
        key = (cls, *(_exactly(getattr(made, name)) for name in names))
        return _Interned._live.setdefault(key, made)


def _exactly(value):
    """A number as itself, not as what it equals: 1, 1.0 and True, or 0.0 and -0.0, stay apart."""
    return (type(value), repr(value)) if isinstance(value, (int, float, complex, np.generic)) else value


class Scalar(metaclass=_Interned):
    """A node of a kernel's expression tree; structural equality (hash cached: trees are shared,
    and equal ones are one object)."""
    __slots__ = ()
    dtype: DType

    def children(self) -> tuple[Scalar, ...]:
        return ()

    def with_children(self, children: tuple[Scalar, ...]) -> Scalar:
        """This node over other children (a leaf has none)."""
        return self


def _scalar(cls):
    cls = dataclass(frozen=True, eq=True, slots=True, weakref_slot=True)(cls)
    plain_hash = cls.__hash__

    def cached_hash(self):
        h = object.__getattribute__(self, "_h")
        if h == 0:          # not computed yet (its field's default; a hash of 0 is stored as 1)
            h = plain_hash(self) or 1
            object.__setattr__(self, "_h", h)
        return h
    cls.__hash__ = cached_hash
    return cls


@_scalar
class Load(Scalar):
    buffer: str
    index: Expr
    dtype: DType
    _h: int = field(default=0, compare=False, repr=False)


@_scalar
class Const(Scalar):
    value: Any
    dtype: DType
    _h: int = field(default=0, compare=False, repr=False)


@_scalar
class IndexValue(Scalar):
    """An integer index expression used as a value (an Iota)."""
    expr: Expr
    dtype: DType
    _h: int = field(default=0, compare=False, repr=False)


@_scalar
class InRange(Scalar):
    """lo <= expr < hi, as a bool (the masks of pad, concat and slice update)."""
    expr: Expr
    lo: Expr
    hi: Expr
    dtype: DType = DType.BOOL
    _h: int = field(default=0, compare=False, repr=False)


@_scalar
class Apply(Scalar):
    op: Op
    args: tuple[Scalar, ...]
    dtype: DType
    _h: int = field(default=0, compare=False, repr=False)

    def children(self):
        return self.args

    def with_children(self, children):
        return Apply(self.op, children, self.dtype)


@_scalar
class Reduce(Scalar):
    op: Op                      # SUM_REDUCE or MAX_REDUCE
    var: str
    extent: Expr
    body: Scalar
    dtype: DType
    _h: int = field(default=0, compare=False, repr=False)

    def children(self):
        return (self.body,)

    def with_children(self, children):
        return Reduce(self.op, self.var, self.extent, children[0], self.dtype)


@_scalar
class Bind(Scalar):
    """body, with `var` in its index expressions standing for the integer value."""
    var: str
    value: Scalar
    body: Scalar
    dtype: DType
    _h: int = field(default=0, compare=False, repr=False)

    def children(self):
        return (self.value, self.body)

    def with_children(self, children):
        return Bind(self.var, children[0], children[1], self.dtype)


def nodes(*values: Scalar, enter: Callable[[Scalar], bool] | None = None) -> list[Scalar]:
    """Each distinct node of the values' trees once, every node after its children (iterative:
    trees are deep); `enter(s)` false keeps the walk out of s's children. The walk the analyses
    and rewrites of kernel IR share."""
    order: list[Scalar] = []
    done: set[Scalar] = set()
    stack: list[tuple[Scalar, bool]] = [(v, False) for v in reversed(values)]
    while stack:
        s, expanded = stack.pop()
        if expanded:
            order.append(s)
        elif s not in done:
            done.add(s)
            stack.append((s, True))
            if enter is None or enter(s):
                stack.extend((c, False) for c in reversed(s.children()) if c not in done)
    return order


def rebuilt(value: Scalar, visit: Callable[[Scalar], Scalar]) -> Scalar:
    """value rebuilt bottom-up: each node over its children's rebuilt forms, then through visit."""
    memo: dict[Scalar, Scalar] = {}
    for s in nodes(value):
        children = tuple(memo[c] for c in s.children())
        same = all(new is old for new, old in zip(children, s.children()))
        memo[s] = visit(s if same else s.with_children(children))
    return memo[value]


def free_vars(s: Scalar, memo: dict) -> frozenset[str]:
    """Names a scalar's value depends on (loop, reduce and bind variables, graph symbols)."""
    if s in memo:
        return memo[s]
    if isinstance(s, Load):
        out = frozenset(s.index.symbols())
    elif isinstance(s, IndexValue):
        out = frozenset(s.expr.symbols())
    elif isinstance(s, InRange):
        out = frozenset(s.expr.symbols() | s.lo.symbols() | s.hi.symbols())
    elif isinstance(s, Reduce):
        out = (free_vars(s.body, memo) - {s.var}) | s.extent.symbols()
    elif isinstance(s, Bind):
        out = free_vars(s.value, memo) | (free_vars(s.body, memo) - {s.var})
    else:
        out = frozenset().union(*(free_vars(c, memo) for c in s.children()))
    memo[s] = out
    return out


def split_reductions(*values: Scalar) -> tuple[list[Reduce], list[Reduce]]:
    """Values' reductions as (computed once per output point, computed once per step of the loop
    of a reduction around them): the second kind repeats its whole loop at every step."""
    memo: dict = {}
    once: dict[Reduce, None] = {}
    repeated: dict[Reduce, None] = {}
    seen: set = set()

    def walk(s: Scalar, around: frozenset) -> None:
        if (s, around) in seen:
            return
        seen.add((s, around))
        if isinstance(s, Reduce):
            (repeated if free_vars(s, memo) & around else once)[s] = None
            walk(s.body, around | {s.var})
        elif isinstance(s, Bind) and around:
            walk(s.value, around)
            walk(s.body, around | {s.var})
        else:
            for c in s.children():
                walk(c, around)
    for value in values:
        walk(value, frozenset())
    return list(once), list(repeated)


def row_reductions(kernel: Kernel) -> list[Reduce] | None:
    """The reductions a kernel computes once per row (reading no variable of its last loop, nor of
    a reduction around them); None when it has others, or fewer than two loops. A backend may
    run a kernel with some a block per row: the row's reductions once, shared, then its points."""
    once, repeated = split_reductions(*(w.value for w in kernel.writes))
    if repeated or len(kernel.loops) < 2:
        return None
    last, memo = kernel.loops[-1][0], {}
    return None if any(last in free_vars(r, memo) for r in once) else once


@dataclass(frozen=True)
class BufferArg:
    name: str
    dtype: DType
    size: Expr                  # elements


def inner_vars(value: Scalar) -> set[str]:
    """The reduction and bind variables a value introduces."""
    return {s.var for s in nodes(value) if isinstance(s, (Reduce, Bind))}


def renamed(value: Scalar, names: dict[str, str]) -> Scalar:
    """value with variables renamed everywhere: in indices, extents, reductions and binds. A bind
    whose value reads a renamed variable is renamed too (after the first it reads): two copies of
    an index bound per step (rotary's partner row) never share a name in one kernel."""
    memo: dict = {}
    moved = {}
    for s in nodes(value):
        if isinstance(s, Bind) and s.var not in names and (used := free_vars(s.value, memo) & names.keys()):
            moved[s.var] = f"{s.var}_{names[min(used)]}"
    names = {**names, **moved}
    env = {k: sym(v) for k, v in names.items()}

    def rename(s: Scalar) -> Scalar:
        if isinstance(s, Load):
            return Load(s.buffer, substitute(s.index, env), s.dtype)
        if isinstance(s, IndexValue):
            return IndexValue(substitute(s.expr, env), s.dtype)
        if isinstance(s, InRange):
            return InRange(substitute(s.expr, env), substitute(s.lo, env), substitute(s.hi, env))
        if isinstance(s, Reduce):
            return Reduce(s.op, names.get(s.var, s.var), substitute(s.extent, env), s.body, s.dtype)
        if isinstance(s, Bind):
            return Bind(names.get(s.var, s.var), s.value, s.body, s.dtype)
        return s
    return rebuilt(value, rename)


def alpha_canonical(value: Scalar) -> Scalar:
    """value with each reduction's and bind's variable named by how many enclose it: copies of one
    value that differ only in those names (each copy of the score has its own) become equal."""
    memo: dict = {}

    def go(s: Scalar, depth: int) -> Scalar:
        if (s, depth) not in memo:
            name = f"kiln_v{depth}"
            if isinstance(s, Reduce):
                out = Reduce(s.op, name, s.extent, go(renamed(s.body, {s.var: name}), depth + 1), s.dtype)
            elif isinstance(s, Bind):
                out = Bind(name, go(s.value, depth), go(renamed(s.body, {s.var: name}), depth + 1), s.dtype)
            elif s.children():
                out = s.with_children(tuple(go(c, depth) for c in s.children()))
            else:
                out = s
            memo[s, depth] = out
        return memo[s, depth]
    return go(value, 0)


def bound_names(a: Scalar, b: Scalar) -> dict[str, str]:
    """For two values equal up to the names they bind (equal `alpha_canonical`), each variable b
    binds mapped to the one a binds in its place."""
    names, stack = {}, [(a, b)]
    while stack:
        x, y = stack.pop()
        if isinstance(x, (Reduce, Bind)):
            names[y.var] = x.var
        stack.extend(zip(x.children(), y.children()))
    return names


@dataclass(frozen=True)
class Write:
    """output[store] = value at a point of a kernel's loops."""
    output: BufferArg
    store: Expr
    value: Scalar


@dataclass(frozen=True)
class Kernel:
    """output[store] = value for every point of the loop nest (variables in order, extents), and
    each further write of `also` at the same points (independent kernels of equal points launched
    as one: the K and V cache writes)."""
    output: BufferArg
    inputs: tuple[BufferArg, ...]
    loops: tuple[tuple[str, Expr], ...]
    store: Expr
    value: Scalar
    symbols: tuple[str, ...]                       # graph symbols passed as int64 arguments
    bounds: tuple[tuple[str, int, int], ...]       # ranges of the graph symbols
    label: str = ""                                # what it computes, for reports
    also: tuple[Write, ...] = ()

    @property
    def writes(self) -> tuple[Write, ...]:
        return (Write(self.output, self.store, self.value), *self.also)

    @property
    def outputs(self) -> tuple[BufferArg, ...]:
        """The buffers it writes, in the order of its parameters (before its inputs)."""
        return tuple(w.output for w in self.writes)

    @property
    def reduce_extent(self) -> Expr | None:
        return self.value.extent if isinstance(self.value, Reduce) and not self.also else None


@dataclass(frozen=True)
class KernelConfig:
    """The launch choices the loop-nest template exposes: which output loop runs outermost, how
    many outer loops are split among threads (0: one thread), whether reduction loops are
    vectorized (OpenMP simd on CPU), and how far they are unrolled."""
    outer: int = 0
    parallel: int = 1
    simd: bool = True
    unroll: int = 1

    def key(self) -> str:
        return f"outer{self.outer}-par{self.parallel}-simd{int(self.simd)}-unroll{self.unroll}"

    def to_json(self) -> dict:
        return {"outer": self.outer, "parallel": self.parallel, "simd": self.simd, "unroll": self.unroll}

    @staticmethod
    def from_json(data: dict) -> KernelConfig:
        return KernelConfig(int(data["outer"]), int(data["parallel"]), bool(data["simd"]),
                            int(data["unroll"]))


def config_space(kernel: Kernel) -> list[KernelConfig]:
    """Every configuration worth timing for a kernel, the default first."""
    loops = len(kernel.loops)
    reduces = any(_has_reduce(w.value) for w in kernel.writes)
    space = [KernelConfig()]
    for outer in range(max(1, loops)):
        for parallel in sorted({0, min(1, loops), min(2, loops)}):
            for simd in ((True, False) if reduces else (True,)):
                for unroll in ((1, 4) if reduces and not simd else (1,)):   # simd wins over unroll
                    c = KernelConfig(outer, parallel, simd, unroll)
                    if c not in space:
                        space.append(c)
    return space


def _has_reduce(s: Scalar) -> bool:
    return any(isinstance(x, Reduce) for x in nodes(s))


def source_hash(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()[:20]


STAGE_BYTES = 32 * 1024      # staged rows' floats: within the 48 KB of shared memory a CUDA block may hold


def staged_rows(kernel: Kernel) -> dict[Scalar, int]:
    """The rows worth staging, with their lengths: in a reduction computed once per point, of known
    extent, inside the points' loop, each largest subexpression that reads the reduction's
    variable and nothing else of the loops (every point reads the same row: a norm-merged GEMV's
    normalized input), with arithmetic in it, while their floats fit in STAGE_BYTES. An emitter
    computes them once, before the points' loop, instead of once per point. A row's variable is
    renamed kiln_row."""
    memo: dict = {}
    found: dict[Scalar, int] = {}
    for reduce in split_reductions(*(w.value for w in kernel.writes))[0]:
        if not reduce.extent.is_const or not free_vars(reduce, memo) - set(kernel.symbols):
            continue          # a row of unknown length, or a reduction before the points' loop
        stack = [reduce.body]
        while stack:
            x = stack.pop()
            names = free_vars(x, memo) - set(kernel.symbols)
            if names == {reduce.var} and isinstance(x, Apply) and x.dtype.is_float:
                key = renamed(x, {reduce.var: "kiln_row"})
                if key not in found and sum(found.values(), reduce.extent.value) * 4 <= STAGE_BYTES:
                    found[key] = reduce.extent.value
                continue
            if reduce.var in names:
                stack.extend(x.children())
    return found


def load_counts(kernel: Kernel, env: dict[str, int], point_rows: bool = False) -> dict[str, int]:
    """The elements each buffer's loads execute over all the kernel's points (a load inside a
    reduction once a step). `point_rows`: the rows of a product's operand the points select, a
    load in a reduction counted once for each value of the loop variables its index depends on
    (directly or through values bound from them), not once a point: a GEMM reads its weight once
    however many rows of activations it multiplies, a norm's scale no times."""
    extents = {var: extent.evaluate(env) for var, extent in kernel.loops}
    points = prod(extents.values())
    loads: dict[str, int] = {}
    seen: set[tuple] = set()
    memo: dict = {}

    def walk(s: Scalar, steps: int, reducing: bool, origin: tuple) -> None:
        if (id(s), steps, reducing, origin) in seen:
            return
        seen.add((id(s), steps, reducing, origin))
        sources = dict(origin)         # a variable -> the loop variables its value depends on
        if isinstance(s, Load):
            if not point_rows:
                loads[s.buffer] = loads.get(s.buffer, 0) + points * steps
            elif reducing:
                selected = frozenset().union(*(sources.get(v, frozenset()) for v in s.index.symbols()))
                if selected:
                    loads[s.buffer] = loads.get(s.buffer, 0) + prod(extents[v] for v in selected) * steps
        if isinstance(s, Reduce):
            walk(s.body, steps * s.extent.evaluate(env), True, origin)
        elif isinstance(s, Bind):
            walk(s.value, steps, reducing, origin)
            bound = frozenset().union(*(sources.get(v, frozenset()) for v in free_vars(s.value, memo)))
            walk(s.body, steps, reducing, tuple(sorted({**sources, s.var: bound}.items())))
        else:
            for c in s.children():
                walk(c, steps, reducing, origin)
    for write in kernel.writes:
        walk(write.value, 1, False, tuple(sorted((var, frozenset({var})) for var in extents)))
    return loads


def traffic_bytes(kernel: Kernel, env: dict[str, int]) -> int:
    """The fewest bytes a kernel moves: its output once, and each input once, or only as many
    elements as its loads execute where that is fewer (a gather reads the rows it picks, not the
    table). Reports divide time by it for achieved bandwidth; the search never ranks by it."""
    loads = load_counts(kernel, env)
    out = sum(b.size.evaluate(env) * b.dtype.itemsize for b in kernel.outputs)
    return out + sum(min(b.size.evaluate(env), loads.get(b.name, 0)) * b.dtype.itemsize
                     for b in kernel.inputs)


def arithmetic_ops(kernel: Kernel, env: dict[str, int]) -> int:
    """Arithmetic operations a kernel performs (selects, casts and loads excluded)."""
    def count(s: Scalar, seen: set) -> int:
        if id(s) in seen:
            return 0
        seen.add(id(s))
        if isinstance(s, Reduce):
            return s.extent.evaluate(env) * (1 + count(s.body, set()))
        own = 1 if isinstance(s, Apply) and s.op not in (Op.WHERE, Op.CAST) else 0
        return own + sum(count(c, seen) for c in s.children())
    points = 1
    for _, extent in kernel.loops:
        points *= extent.evaluate(env)
    return points * sum(count(w.value, set()) for w in kernel.writes)
