"""Kernel IR -> one C function (gcc, OpenMP): the loop nest, with rows computed once into arrays
where a step of a loop would recompute them (normalized inputs, softmax's scores and
probabilities, P.V's row, rotary's projections). The C dialect's scalars are codegen/c_emit.py's."""
from __future__ import annotations

from ..ir.dtypes import DType
from ..ir.ops import Op
from ..ir.symbolic import Expr
from .c_emit import COMPUTE, STORAGE, _STAGING_LEVEL, _Body, _reductions_and_binds, index_code, store_code
from .index import interval, stride
from .kernel import (Apply, Bind, Const, IndexValue, Kernel, KernelConfig, Load, Reduce, Scalar,
                     alpha_canonical, free_vars, inner_vars, nodes, renamed, staged_rows)


def _weighted_sum(row: Scalar, step: str) -> tuple[Reduce, Scalar, Scalar] | None:
    """(the sum, weight, term) where a row is an f32 Σ_j weight(j)·term(j, step), the weight not
    reading the row's step (1 for a plain sum: heads' partial projections added up); else None."""
    if not (isinstance(row, Reduce) and row.op is Op.SUM_REDUCE and row.dtype is DType.F32):
        return None
    if not (isinstance(row.body, Apply) and row.body.op is Op.MUL and row.body.dtype is DType.F32):
        return row, Const(1.0, DType.F32), row.body
    memo: dict = {}
    steps = [step in free_vars(a, memo) for a in row.body.args]
    if steps.count(True) != 1:
        return None
    term = row.body.args[steps.index(True)]
    return row, row.body.args[steps.index(False)], term


AXPY_ROW = 1024       # the longest row of points a kernel sums as one (a C array on the stack)


def _row_by_axpy(value: Scalar, var: str, extent: Expr) -> bool:
    """Whether a kernel's points along its last loop are better summed as one row: a weighted sum
    whose terms it reads contiguously along that loop (P.V's value rows, a product's row-major
    right operand), where a sum a point would stride through them."""
    weighted = _weighted_sum(value, var)
    return (weighted is not None and extent.is_const and extent.value <= AXPY_ROW
            and _contiguous(weighted[2], var))


def _contiguous(term: Scalar, var: str) -> bool:
    """Whether every load of `term` that moves with `var` reads contiguously along it."""
    memo: dict = {}
    loads = [x for x in nodes(term) if isinstance(x, Load) and var in free_vars(x, memo)]
    return bool(loads) and all(stride(x.index, var) == 1 for x in loads)


def _within(index: Scalar, bounds, extent: int) -> bool:
    """Whether an integer value (an index a bind computes) lies in [0, extent) over `bounds`."""
    def span(s: Scalar) -> tuple[int, int] | None:
        if isinstance(s, IndexValue):
            return interval(s.expr, bounds)
        if isinstance(s, Apply) and s.op is Op.CAST and s.args[0].dtype in (DType.I32, DType.I64):
            return span(s.args[0])
        if isinstance(s, Apply) and s.op is Op.WHERE:
            a, b = span(s.args[1]), span(s.args[2])
            return a and b and (min(a[0], b[0]), max(a[1], b[1]))
        return None
    found = span(index) if index.dtype in (DType.I32, DType.I64) else None
    return found is not None and 0 <= found[0] and found[1] < extent


class _CBody(_Body):
    def __init__(self, *args):
        super().__init__(*args)
        self.outer_rows: dict[tuple[Scalar, int], str] = {}   # (row, level) -> its array

    def stage(self, members: list[Reduce], var: str, level: int, width: int = 1,
              outer: list[str] | None = None) -> set[Scalar]:
        """Besides the rows every point reads alike, a row that varies only with loops outside the
        reduction's own (softmax's normalized probabilities for P.V vary with the head, not with
        the output column) is computed into an array once per step of the outermost loop it
        needs, not once per point inside it: a C array of the reduction's length (a VLA where
        that length is a symbol, the live window), declared in that loop's body. So is a sum a step
        of the reduction computes (a score, a query's dot product with a key): softmax's max, its
        sum and the weights of P.V each read the same scores, and would each recompute them."""
        found = super().stage(members, var, level, width, outer)
        # a reduction nested in a member's body (a sum split in two) is not open where a row is
        # computed: a value reading its variable is no row of `var`'s
        nested = {n for r in members for n in inner_vars(r.body)}
        for body in (r.body for r in members):
            found |= self._rows_of(body, var, level - 1, level, members[0].extent, nested, found)
        return found

    def share(self, row: Scalar, level: int) -> None:
        """A sum a step of a staged row computes (the heads' partial projections added up, which
        the norm's sum of squares reads too) is a row of its own, computed once."""
        self._rows_of(row, "kiln_row", 0, level, Expr.of(self.rows[row]), set(), set())

    def _rows_of(self, body: Scalar, var: str, reduction_level: int, level: int, extent: Expr,
                 nested: set[str], found: set[Scalar]) -> set[Scalar]:
        """Stages the rows along `var` that `body` holds (as `stage` says), each read at `level`."""
        rows: set[Scalar] = set()
        stack = [body]
        while stack:
            x = stack.pop()
            if x in found or x in rows or x in self.memo:
                continue
            names = free_vars(x, self.vars_memo)
            if var not in names:
                continue
            around = names - {var}
            at = self.level_of(around)
            if (isinstance(x, (Apply, Reduce)) and x.dtype.is_float
                    and (at < reduction_level or (at == reduction_level and isinstance(x, Reduce)))
                    and not around & nested
                    and not (x.op is Op.CAST and isinstance(x.args[0], Load))   # a load converted
                    and not any(n in self.binds and n not in self.level for n in around)):
                rows.add(x)
                self.memo[x] = (f"{self._outer_row(x, var, at, extent)}[{var}]", level)
                continue
            stack.extend(x.children())
        return rows

    def _outer_row(self, row: Scalar, var: str, at: int, extent: Expr) -> str:
        key = (alpha_canonical(renamed(row, {var: "kiln_row"})), at)
        if key not in self.outer_rows:
            # a row's own reductions (softmax's max and sum) may stage rows of their own while
            # it is emitted: each gets its own level and variable
            self.count += 1
            name, step = f"kiln_row{self.count}", f"kiln_r{self.count}"
            row = renamed(row, {var: step})
            # the row's own reductions and binds (renamed: copies of the kernel's) may share loops
            reductions, binds = _reductions_and_binds((row,))
            known = set(self.reductions)
            self.reductions += [r for r in reductions if r not in known]
            self.binds.update(binds)
            weighted = _weighted_sum(row, step)
            if weighted and not _contiguous(weighted[2], step):
                weighted = None     # a dot product a step (a score: q against a key row)
            # the row is computed in the block at `at`: the loops inside it (the reduction whose
            # body asked for the row among them) and what was computed in them are not open there
            closed = {n: v for n, v in self.level.items() if v > at}, {x: v for x, v in self.memo.items() if v[1] > at}
            for n in closed[0]:
                del self.level[n]
            for x in closed[1]:
                del self.memo[x]
            lines = (self._axpy_row(name, step, extent, *weighted, at) if weighted
                     else self._row(name, step, extent, row, at))
            self.level.update(closed[0])
            self.memo.update(closed[1])
            self.blocks[at].extend(lines)
            self.outer_rows[key] = name
        return self.outer_rows[key]

    def _row(self, name: str, step: str, extent: Expr, row: Scalar, at: int) -> list[str]:
        """row[step] = value, a step at a time."""
        fake, saved = self.staging_level(), (dict(self.memo), dict(self.level))
        lines: list[str] = []
        self.blocks[fake], self.level[step] = lines, fake
        self._partners(row, step, extent, at)
        value, _ = self.emit(row)
        del self.blocks[fake]
        self.close_scope(*saved, _STAGING_LEVEL - 1)
        length = index_code(extent)
        return [f"{COMPUTE[row.dtype]} {name}[{length}];",
                f"for (int64_t {step} = 0; {step} < {length}; {step}++) {{",
                *("  " + line for line in lines), f"  {name}[{step}] = {value};", "}"]

    def _partners(self, row: Scalar, step: str, extent: Expr, at: int) -> None:
        """Where a row reads, beside a sum a step computes, the same sum at an index bound from the
        step (rotary: a query's feature d and its partner d ± depth/2), both are read from one row
        of those sums computed first (at `at`, a sum a feature), not two sums a step."""
        if not extent.is_const:
            return
        sums: dict[Scalar, Reduce] = {}
        for x in nodes(row):
            if isinstance(x, Reduce) and step in free_vars(x, self.vars_memo):
                sums.setdefault(alpha_canonical(renamed(x, {step: "kiln_row"})), x)
        steps = {step: (0, extent.value - 1)}
        for bind in (x for x in nodes(row) if isinstance(x, Bind)):
            if free_vars(bind.value, self.vars_memo) != {step} or not _within(bind.value, steps, extent.value):
                continue
            for x in nodes(bind.body):
                names = free_vars(x, self.vars_memo) if isinstance(x, Reduce) else ()
                partner = bind.var in names and step not in names and sums.get(
                    alpha_canonical(renamed(x, {bind.var: "kiln_row"})))
                if partner:
                    array = self._outer_row(partner, step, at, extent)
                    self.memo[partner] = (f"{array}[{step}]", self.level[step])
                    self.memo[x] = (f"{array}[{bind.var}]", self.level[step])

    def _axpy_row(self, name: str, step: str, extent: Expr, total: Reduce, weight: Scalar,
                  term: Scalar, at: int) -> list[str]:
        """row[step] = Σ_j weight(j)·term(j, step), the sum's loop outside the row's: a step of it
        adds a weight times a row of terms to the whole row (P.V's probabilities times a value row,
        read contiguously where a sum a step would stride through the values)."""
        outer, inner = self.staging_level(), self.staging_level()
        saved = dict(self.memo), dict(self.level)
        key_lines: list[str] = []
        step_lines: list[str] = []
        self.blocks[outer], self.level[total.var] = key_lines, outer
        self.blocks[inner], self.level[step] = step_lines, inner
        self._rows_of(weight, total.var, at, outer, total.extent, set(), set())   # P.V's scores
        w, _ = self.emit(weight)
        t, _ = self.emit(term)
        del self.blocks[outer], self.blocks[inner]
        self.close_scope(*saved, _STAGING_LEVEL - 1)
        length = index_code(extent)
        return [f"float {name}[{length}];",
                f"for (int64_t {step} = 0; {step} < {length}; {step}++) {name}[{step}] = 0.0f;",
                f"for (int64_t {total.var} = 0; {total.var} < {index_code(total.extent)}; {total.var}++) {{",
                *("  " + line for line in key_lines),
                *("  " + line for line in self.row_pragmas()),
                f"  for (int64_t {step} = 0; {step} < {length}; {step}++) {{",
                *("    " + line for line in step_lines),
                f"    {name}[{step}] += {w} * {t};", "  }", "}"]

    def row_pragmas(self) -> list[str]:
        """What goes before an axpy row's loop: vectorized or unrolled as the configuration says."""
        if self.config.simd:
            return ["#pragma omp simd"]
        return [f"#pragma GCC unroll {self.config.unroll}"] if self.config.unroll > 1 else []

    def loop_pragmas(self, group: list[Reduce], accs: list[str]) -> list[str]:
        if all(r.op is Op.SUM_REDUCE for r in group) and self.config.simd:
            return [f"#pragma omp simd reduction(+:{', '.join(accs)})"]
        # gcc wants each of these pragmas directly before the loop, so simd takes precedence
        return [f"#pragma GCC unroll {self.config.unroll}"] if self.config.unroll > 1 else []


def emit_c(kernel: Kernel, config: KernelConfig, name: str) -> str:
    """One C function `void name(out, in..., const int64_t* sym)` for the kernel."""
    loops = ordered_loops(kernel, config)
    body = _CBody(loops, config, tuple(w.value for w in kernel.writes), kernel.symbols)
    body.rows = staged_rows(kernel)
    n = len(loops)
    for write in kernel.writes:
        if n >= 2 and _row_by_axpy(write.value, *loops[-1]):
            # the points of the last loop as one row of sums, a term row added a step of the sum
            var, extent = loops[-1]
            value = f"{body._outer_row(write.value, var, n - 1, extent)}[{var}]"
        else:
            value, _ = body.emit(write.value)
        if body.level_of(write.store.symbols()) < n:
            raise ValueError("a kernel's store must depend on its innermost loop")
        body.blocks[n].append(f"{write.output.name}[{index_code(write.store)}] = "
                              f"{store_code(value, write.output.dtype)};")
    params = [f"{STORAGE[b.dtype]}* restrict {b.name}" for b in kernel.outputs]
    params += [f"const {STORAGE[b.dtype]}* restrict {b.name}" for b in kernel.inputs]
    params.append("const int64_t* restrict kiln_sym")
    lines = [f"void {name}({', '.join(params)}) {{"]
    lines += [f"  const int64_t {s} = kiln_sym[{i}];" for i, s in enumerate(kernel.symbols)]
    lines += ["  " + line for line in body.blocks[0]]
    parallel = _collapse(body, config.parallel, n)
    indent = "  "
    for k, (var, extent) in enumerate(loops):
        if k == 0 and parallel:
            collapse = f" collapse({parallel})" if parallel > 1 else ""
            lines.append(f"{indent}#pragma omp parallel for{collapse} schedule(static)")
        lines.append(f"{indent}for (int64_t {var} = 0; {var} < {index_code(extent)}; {var}++) {{")
        indent += "  "
        lines += [indent + line for line in body.blocks[k + 1]]
    for k in range(n, 0, -1):
        indent = indent[:-2]
        lines.append(indent + "}")
    lines.append("}")
    return "\n".join(lines) + "\n"


def ordered_loops(kernel: Kernel, config: KernelConfig):
    """The output loops with the one the config names moved outermost (a GEMM reads each weight
    row once when its output-feature loop is outside the token loop)."""
    loops = list(kernel.loops)
    if 0 < config.outer < len(loops):
        loops.insert(0, loops.pop(config.outer))
    return loops


def _collapse(body: _Body, wanted: int, loops: int) -> int:
    """Loops collapsed into one parallel loop must be perfectly nested: no statements between."""
    depth = 0
    while depth < min(wanted, loops):
        depth += 1
        if body.blocks[depth] and depth < min(wanted, loops):
            break
    return depth
