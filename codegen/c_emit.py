"""Kernel IR -> C (gcc, OpenMP). Every subexpression is computed once, at the outermost loop
whose variables it uses; reductions become local accumulator loops, vectorized with `omp simd`."""
from __future__ import annotations

import math

import numpy as np

from ..ir.dtypes import DType, accumulator
from ..ir.ops import ELEMENTWISE, Op, lowest
from ..ir.symbolic import Call, Expr
from .kernel import (Apply, Bind, Const, InRange, IndexValue, KernelConfig, Load, Reduce, Scalar,
                     alpha_canonical, free_vars, nodes, renamed)

# storage types; f16/bf16 are stored as their bits and computed in float
STORAGE = {DType.F32: "float", DType.F16: "uint16_t", DType.BF16: "uint16_t", DType.I32: "int32_t",
           DType.I64: "int64_t", DType.BOOL: "bool"}
COMPUTE = {**STORAGE, DType.F16: "float", DType.BF16: "float"}
_UNSIGNED = {DType.I32: "uint32_t", DType.I64: "uint64_t"}
_STAGING_LEVEL = 1000        # the loop levels of staging loops, past any kernel's own
_SCOPE_DEPTH = 100           # levels apart two staging loops' own levels are (loops nest within)
_MIN_MACRO = {DType.I32: "INT32_MIN", DType.I64: "INT64_MIN"}   # -2^63 has no literal in C

# helpers both dialects share, written once: KILN_FN is each dialect's inline function prefix
SHARED_HELPERS = r"""
KILN_FN int64_t kiln_min(int64_t a, int64_t b) { return a < b ? a : b; }
KILN_FN int64_t kiln_max(int64_t a, int64_t b) { return a > b ? a : b; }
KILN_FN int64_t kiln_floordiv(int64_t a, int64_t b) {
  return a / b - (a % b != 0 && (a < 0) != (b < 0));
}
KILN_FN int64_t kiln_mod(int64_t a, int64_t b) {
  int64_t r = a % b;
  return r != 0 && (r < 0) != (b < 0) ? r + b : r;
}
/* Cast float -> integer (ir/ops.py cast_array): toward zero, saturating, NaN to 0; a plain C cast
   of an out-of-range value is undefined */
KILN_FN int32_t kiln_f2i32(float f) {
  return f != f ? 0 : f >= 2147483648.0f ? 2147483647 : f < -2147483648.0f ? (-2147483647 - 1) : (int32_t)f;
}
KILN_FN int64_t kiln_f2i64(float f) {
  return f != f ? 0 : f >= 9223372036854775808.0f ? INT64_C(9223372036854775807)
       : f < -9223372036854775808.0f ? INT64_MIN : (int64_t)f;
}
"""

PRELUDE = r"""
#include <stdint.h>
#include <stdbool.h>
#include <math.h>
#include <string.h>
""" + SHARED_HELPERS.replace("KILN_FN", "static inline") + r"""static inline float kiln_bf16_load(uint16_t h) { uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4); return f; }
static inline uint16_t kiln_bf16_store(float f) {
  uint32_t u; memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
static inline float kiln_f16_load(uint16_t h) { _Float16 v; memcpy(&v, &h, 2); return (float)v; }
static inline uint16_t kiln_f16_store(float f) { _Float16 v = (_Float16)f; uint16_t h; memcpy(&h, &v, 2); return h; }
static inline float kiln_bf16_round(float f) { return kiln_bf16_load(kiln_bf16_store(f)); }
static inline float kiln_f16_round(float f) { return kiln_f16_load(kiln_f16_store(f)); }
static inline bool kiln_f2bool(float f) { return f != 0; }
"""

def _wrapping(sign: str, dtype: DType, a: str, b: str) -> str:
    """Integers wrap around as numpy's do: unsigned arithmetic, since signed overflow is undefined
    in C and gcc folds (x + 1 < x) to false."""
    u = _UNSIGNED[dtype]
    return f"(({STORAGE[dtype]})(({u}){a} {sign} ({u}){b}))"


def _cast(dtype: DType, operand: DType, a: str) -> str:
    """The meaning: ir/ops.py cast_array."""
    if dtype is DType.BOOL:
        return f"kiln_f2bool({a})" if operand.is_float else f"({a} != 0)"
    if dtype.is_int and operand.is_float:
        return f"kiln_f2{dtype.value}({a})"
    return f"(({COMPUTE[dtype]})({a}))"    # to f16/bf16 through f32: the caller rounds again


# C for each elementwise op of ir/ops.py: (result dtype, first data input's dtype, arguments);
# both dialects share it (tests/test_codegen_c.py checks that every elementwise op has a row)
OP_CODE = {
    Op.EXP2: lambda d, o, x: f"exp2f({x[0]})",
    Op.LOG2: lambda d, o, x: f"log2f({x[0]})",
    Op.SIN: lambda d, o, x: f"sinf({x[0]})",
    Op.SQRT: lambda d, o, x: f"sqrtf({x[0]})",
    Op.RECIP: lambda d, o, x: f"(1.0f / {x[0]})",
    Op.ADD: lambda d, o, x: (_wrapping("+", d, *x) if d.is_int else
                             f"({x[0]} || {x[1]})" if d is DType.BOOL else f"({x[0]} + {x[1]})"),
    Op.MUL: lambda d, o, x: (_wrapping("*", d, *x) if d.is_int else
                             f"({x[0]} && {x[1]})" if d is DType.BOOL else f"({x[0]} * {x[1]})"),
    # numpy's fmod gives 0 for x % 0; x % -1 is 0 too, but INT_MIN % -1 traps in C
    Op.MOD: lambda d, o, x: (f"fmodf({x[0]}, {x[1]})" if o.is_float else
                             f"({x[1]} == 0 || {x[1]} == -1 ? 0 : {x[0]} % {x[1]})"),
    Op.LESS_THAN: lambda d, o, x: f"({x[0]} < {x[1]})",
    Op.WHERE: lambda d, o, x: f"({x[0]} ? {x[1]} : {x[2]})",
    Op.CAST: lambda d, o, x: _cast(d, o, x[0]),
}


def op_code(op: Op, dtype: DType, operand: DType, args: list[str]) -> str:
    """C for one elementwise op; `operand` is the type of its (first data) input."""
    if op not in OP_CODE:
        raise NotImplementedError(f"no C for {op.value}")
    return OP_CODE[op](dtype, operand, args)


def reduction_accumulator(r: Reduce) -> tuple[str, str, str]:
    """(C type, start, combine) of a reduction's accumulator, for every emitter: `combine` formats
    {a}, the running value, and {b}, one more, into the next (a max keeps a NaN, as numpy's does)."""
    if r.op is Op.SUM_REDUCE:
        return COMPUTE[accumulator(r.dtype)], "0", "{a} + {b}"
    return (COMPUTE[r.body.dtype], literal(lowest(r.dtype.np), r.dtype),
            "(({b}) > ({a}) || ({b}) != ({b})) ? ({b}) : ({a})")


def literal(value, dtype: DType) -> str:
    if dtype is DType.BOOL:
        return "true" if value else "false"
    if dtype.is_int:
        if dtype in _MIN_MACRO and int(value) == np.iinfo(dtype.np).min:
            return _MIN_MACRO[dtype]
        return f"INT64_C({int(value)})" if dtype is DType.I64 else f"{int(value)}"
    value = float(value)
    if math.isnan(value):
        return "NAN"
    if math.isinf(value):
        return "INFINITY" if value > 0 else "(-INFINITY)"
    return f"{value!r}f" if "e" in repr(value) or "." in repr(value) else f"{value!r}.0f"


def index_code(expr: Expr) -> str:
    parts = []
    for mono, coeff in expr.terms:
        factors = [a if isinstance(a, str) else _call_code(a) for a in mono]
        if coeff != 1 or not factors:
            factors.insert(0, f"INT64_C({coeff})")
        parts.append("*".join(factors))
    return "(" + " + ".join(parts) + ")" if parts else "INT64_C(0)"


def _call_code(call: Call) -> str:
    a, b = (index_code(x) for x in call.args)
    if call.fn in ("floordiv", "mod") and not all(map(_non_negative, call.args)):
        return f"kiln_{call.fn}({a}, {b})"   # rounds down, as the IR's (Python's) // and % do
    return {"floordiv": f"({a} / {b})", "mod": f"({a} % {b})",
            "max": f"kiln_max({a}, {b})", "min": f"kiln_min({a}, {b})"}[call.fn]


def _non_negative(expr: Expr) -> bool:
    """True when expr cannot be negative: its variables (loop, reduce and bind indices, dims)
    never are, so neither is a sum of their products with non-negative coefficients."""
    return all(coeff >= 0 and all(isinstance(a, str) or _call_non_negative(a) for a in mono)
               for mono, coeff in expr.terms)


def _call_non_negative(call: Call) -> bool:
    if call.fn == "max":
        return any(map(_non_negative, call.args))
    return all(map(_non_negative, call.args))


def load_code(buffer: str, index: str, dtype: DType) -> str:
    raw = f"{buffer}[{index}]"
    if dtype is DType.BF16:
        return f"kiln_bf16_load({raw})"
    if dtype is DType.F16:
        return f"kiln_f16_load({raw})"
    return raw


def store_code(value: str, dtype: DType) -> str:
    if dtype is DType.BF16:
        return f"kiln_bf16_store({value})"
    if dtype is DType.F16:
        return f"kiln_f16_store({value})"
    return value


class _Body:
    """Statements per loop level; level 0 is before the loops, level k inside loop k."""

    def __init__(self, loops, config: KernelConfig, values: tuple[Scalar, ...] = (), symbols=()):
        self.config = config
        self.level = {v: k + 1 for k, (v, _) in enumerate(loops)}
        self.blocks: dict[int, list[str]] = {k: [] for k in range(len(loops) + 1)}
        self.memo: dict[Scalar, tuple[str, int]] = {}
        self.vars_memo: dict = {}
        self.count = 0
        self.reductions, self.binds = _reductions_and_binds(values)
        self.symbols = set(symbols)            # the kernel's (a prompt's length): open at every level
        self.active: set[Reduce] = set()       # reductions whose loops are being emitted
        self.rows: dict[Scalar, int] = {}      # rows to stage (kernel.staged_rows) -> their lengths
        self.staged: dict[Scalar, str] = {}    # a staged row (alpha_canonical) -> its array
        self.scopes = 0                        # staging loops made so far

    def level_of(self, names) -> int:
        return max((self.level.get(n, 0) for n in names), default=0)

    def temp(self, code: str, dtype: DType, level: int) -> str:
        self.count += 1
        name = f"t{self.count}"
        self.blocks[level].append(f"const {COMPUTE[dtype]} {name} = {code};")
        return name

    def emit(self, s: Scalar) -> tuple[str, int]:
        if s in self.memo:
            return self.memo[s]
        if isinstance(s, Const):
            return literal(s.value, s.dtype), 0
        if isinstance(s, IndexValue):
            return f"(({COMPUTE[s.dtype]}){index_code(s.expr)})", self.level_of(s.expr.symbols())
        if isinstance(s, InRange):
            e = index_code(s.expr)
            level = self.level_of(s.expr.symbols() | s.lo.symbols() | s.hi.symbols())
            result = (f"({index_code(s.lo)} <= {e} && {e} < {index_code(s.hi)})", level)
        elif isinstance(s, Load):
            level = self.level_of(s.index.symbols())
            code = load_code(s.buffer, index_code(s.index), s.dtype)
            result = (self.temp(code, s.dtype, level), level)
        elif isinstance(s, Apply):
            args = [self.emit(a) for a in s.args]
            level = max(l for _, l in args)
            operand = s.args[1].dtype if s.op is Op.WHERE else s.args[0].dtype
            code = op_code(s.op, s.dtype, operand, [c for c, _ in args])
            if s.dtype in (DType.BF16, DType.F16) and s.op in ELEMENTWISE:
                code = f"kiln_{s.dtype.value}_round({code})"
            result = (self.temp(code, s.dtype, level), level)
        elif isinstance(s, Bind):
            self.bind(s)
            result = self.emit(s.body)
        elif isinstance(s, Reduce):
            result = self.reduce(s)
        else:
            raise NotImplementedError(type(s).__name__)
        self.memo[s] = result
        return result

    def close_scope(self, memo: dict, level: dict, deepest: int) -> None:
        """After a loop's block: the temps and variables (a reduction's, an index bound inside)
        made in it past level `deepest` are gone."""
        self.memo = {k: v for k, v in self.memo.items() if k in memo or v[1] <= deepest}
        self.level = {**{k: v for k, v in self.level.items() if v <= deepest}, **level}

    def bind(self, s: Bind) -> None:
        if s.var not in self.level:
            value, level = self.emit(s.value)
            self.blocks[level].append(f"const int64_t {s.var} = (int64_t)({value});")
            self.level[s.var] = level

    def _unopened(self, names, bindable=()) -> bool:
        """Whether `names` hold a variable of a loop not open here (nor one in `bindable`)."""
        return any(n not in self.level and n not in bindable and n not in self.symbols for n in names)

    def siblings(self, s: Reduce) -> list[Reduce]:
        """`s` and the reductions not yet emitted that can share its loop: the same extent, at the
        same level, none inside another. Renamed to s's variable, the subexpressions their bodies
        share (the normalized row gate and up both read) are computed once per step."""
        level = self.level_of(free_vars(s, self.vars_memo))
        group = [s]
        for r in self.reductions:
            if r in self.memo or r in self.active or r.extent != s.extent or any(r == g or _inside(r, g) or _inside(g, r)
                                                             for g in group):
                continue
            names = free_vars(r, self.vars_memo)
            pending = [self.binds[n] for n in names if n in self.binds and n not in self.level]
            if self._unopened(names, self.binds) or any(self._unopened(free_vars(b.value, self.vars_memo))
                                                        for b in pending):
                continue            # it reads a variable of a loop not open here (another copy's)
            if any(_inside(b.value, x) for b in pending for x in self.reductions):
                continue
            for b in pending:           # an index it reads (rotary's chosen half), bound first
                self.bind(b)
            if self.level_of(names) == level:
                group.append(r)
        return group

    def loop_pragmas(self, group: list[Reduce], accs: list[str]) -> list[str]:
        """What the dialect puts before a reduction's loop (vectorization, unrolling)."""
        return []

    def stage(self, members: list[Reduce], var: str, level: int, width: int = 1,
              outer: list[str] | None = None) -> set[Scalar]:
        """Each staged row the members' bodies hold (renamed to `var`), computed into an array
        before the points' loop, then read from it at `var` in the loop being emitted at `level`.
        Returns the rows' subexpressions."""
        found = set()
        for body in (r.body for r in members):
            stack = [body]
            while stack:
                x = stack.pop()
                if x in found:
                    continue
                key = renamed(x, {var: "kiln_row"}) if isinstance(x, Apply) and self.rows else None
                if key not in self.rows:
                    stack.extend(x.children())
                    continue
                found.add(x)
                self.memo[x] = self.staged_read(self.staged_array(key), var, level, width, outer)
        return found

    def staging_level(self) -> int:
        """A fresh level for a staging loop, apart from every other's and from the loops nested in
        each (a staging loop inside another's gets a greater one)."""
        self.scopes += 1
        return _STAGING_LEVEL + _SCOPE_DEPTH * self.scopes

    def staged_read(self, array: str, var: str, level: int, width: int, outer) -> tuple[str, int]:
        return f"{array}[{var}]", level

    def staged_array(self, row: Scalar) -> str:
        """The array holding `row`, filled before the points' loop (what the row reads of no
        step, the norm's scale, is computed before that)."""
        same = alpha_canonical(row)        # copies that differ only in bound names share one
        if same not in self.staged:
            name = f"kiln_stage{len(self.staged)}"
            level = self.staging_level()
            lines: list[str] = []
            saved = dict(self.memo), dict(self.level)
            self.blocks[level], self.level["kiln_row"] = lines, level
            self.share(row, level)
            value, _ = self.emit(row)
            del self.blocks[level]
            self.close_scope(*saved, _STAGING_LEVEL - 1)
            self.staging(name, self.rows[row], lines, value)
            self.staged[same] = name
        return self.staged[same]

    def share(self, row: Scalar, level: int) -> None:
        """Before a staged row is emitted at `level`: what the dialect computes once for it and
        for the kernel's other reductions (the C one: sums a step of it computes)."""

    def staging(self, name: str, extent: int, lines: list[str], value: str) -> None:
        """The dialect's loop that fills a staged row's array, before the points' loop."""
        first = self.blocks[0]
        first.append(f"float {name}[{extent}];")
        first.append(f"for (int64_t kiln_row = 0; kiln_row < {extent}; kiln_row++) {{")
        first.extend("  " + line for line in lines)
        first.append(f"  {name}[kiln_row] = (float){value};")
        first.append("}")

    def reduce(self, s: Reduce) -> tuple[str, int]:
        group = self.siblings(s)
        level = self.level_of(free_vars(s, self.vars_memo))
        inner_level = level + 1
        saved_block, saved = self.blocks.get(inner_level), (dict(self.memo), dict(self.level))
        inner: list[str] = []
        self.blocks[inner_level] = inner
        self.level[s.var] = inner_level
        members = [renamed(r, {r.var: s.var}) for r in group]
        self.stage(members, s.var, inner_level)
        self.active.update(group)
        values = [self.emit(r.body)[0] for r in members]
        self.active.difference_update(group)
        self.blocks[inner_level] = saved_block if saved_block is not None else []
        self.close_scope(*saved, level)
        block = self.blocks[level]
        accs, updates = [], []
        for r, value in zip(group, values):
            self.count += 1
            acc = f"acc{self.count}"
            acc_type, init, combine = reduction_accumulator(r)
            block.append(f"{acc_type} {acc} = {init};")
            accs.append(acc)
            updates.append(f"{acc} = {combine.format(a=acc, b=f'({acc_type}){value}')};")
        block.extend(self.loop_pragmas(group, accs))
        block.append(f"for (int64_t {s.var} = 0; {s.var} < {index_code(s.extent)}; {s.var}++) {{")
        block.extend("  " + line for line in inner)
        block.extend("  " + update for update in updates)
        block.append("}")
        results = [(self.temp(f"({COMPUTE[r.dtype]}){acc}", r.dtype, level), level)
                   for r, acc in zip(group, accs)]
        for r, result in zip(group[1:], results[1:]):
            self.memo[r] = result
        return results[0]


def _reductions_and_binds(values) -> tuple[list[Reduce], dict[str, Bind]]:
    reductions: dict[Reduce, None] = {}
    binds: dict[str, Bind] = {}
    stack, seen = list(reversed(values)), set()
    while stack:
        s = stack.pop()
        if s in seen:
            continue
        seen.add(s)
        if isinstance(s, Reduce):
            reductions[s] = None
        elif isinstance(s, Bind):
            binds[s.var] = s
        stack.extend(reversed(s.children()))
    return list(reductions), binds


def _inside(outer: Scalar, inner: Scalar) -> bool:
    """Whether `inner` occurs in `outer`'s value (itself excluded)."""
    return inner in nodes(*outer.children())
