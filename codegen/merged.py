"""Kernels merged after or during scheduling: equal-point kernels joined into one launch, and the
limits a kernel holding its readers' reductions must keep."""
from __future__ import annotations

from ..ir.symbolic import sym
from .index import substitute
from .kernel import (alpha_canonical, bound_names, inner_vars, Kernel, renamed, row_reductions, split_reductions,
                     Write)

# the most reductions one merged kernel holds (a GEMV with its norm, softmax's max, sum and
# P.V with the fully-masked guard) and the most kernels one reduction merges into (Q, K and V)
MERGED_PER_KERNEL = 4
MERGED_READERS = 3
# the longest sum a merge may repeat at each step of a reduction around it (heads' partials)
SHORT_SUM = 64


def combined(kernels: list[Kernel], aliases: dict[str, str]) -> list[Kernel]:
    """Each kernel joined, once, to the first later one of the same points where neither needs
    what the other writes: the pair runs as one kernel at the place of the one that can move to
    the other's past every kernel between them (nothing between writes what it reads, reads or
    writes what it writes)."""
    def names(buffers) -> set[str]:
        return {aliases.get(b.name, b.name) for b in buffers}

    def touches(kernel: Kernel, reads: set[str], writes: set[str]) -> bool:
        """Whether `kernel` cannot be crossed by one that reads `reads` and writes `writes`."""
        return bool(names(kernel.outputs) & (reads | writes) or names(kernel.inputs) & writes)

    out, i = list(kernels), 0
    while i < len(out):
        first = out[i]
        for j in range(i + 1, len(out)):
            later = out[j]
            if first.also or later.also or not _same_points(first, later) or touches(
                    later, names(first.inputs), names(first.outputs)):
                continue
            between = out[i + 1:j]
            up = not any(touches(k, names(later.inputs), names(later.outputs)) for k in between)
            down = not any(touches(k, names(first.inputs), names(first.outputs)) for k in between)
            if up or down:
                joined = _joined(first, later)
                del out[j]
                out[i] = joined
                if not up:                      # at the later one's place
                    out.insert(j - 1, out.pop(i))
                break
        i += 1
    return out


def _same_points(a: Kernel, b: Kernel) -> bool:
    return [e for _, e in a.loops] == [e for _, e in b.loops]


def _joined(a: Kernel, b: Kernel) -> Kernel:
    """One kernel over a's loops writing a's output and b's: b's loop variables renamed to a's,
    its reduction and bind variables given names of their own."""
    names = {vb: va for (va, _), (vb, _) in zip(a.loops, b.loops)}
    for var in inner_vars(b.value):
        names[var] = f"{var}b"
    # a reduction both compute (the norm's sum of squares that Q and K both read) runs once;
    # the reductions inside it may differ in their names alone (heads' partials summed in both)
    once_a = {alpha_canonical(r): r for r in split_reductions(a.value)[0]}
    for reduce in split_reductions(b.value)[0]:
        twin = once_a.get(alpha_canonical(renamed(reduce, names)))
        if twin is not None:
            names.update(bound_names(twin, reduce))
    value, store = renamed(b.value, names), substitute(b.store, {k: sym(v) for k, v in names.items()})
    inputs = {x.name: x for x in (*a.inputs, *b.inputs)}
    bounds = dict.fromkeys(sorted({*a.bounds, *b.bounds}))
    return Kernel(a.output, tuple(inputs.values()), a.loops, a.store, a.value,
                  tuple(sorted({*a.symbols, *b.symbols})), tuple(bounds), f"{a.label}+{b.label}",
                  also=(Write(b.output, store, value),))


def rows_well(kernel: Kernel) -> bool:
    per_row = row_reductions(kernel)
    return per_row is not None and len(per_row) <= MERGED_PER_KERNEL


def merged_well(kernel: Kernel, splittable: bool = False) -> bool:
    """Whether a kernel's reductions each run once per point, and few; `splittable`: and one
    only where one runs over a length known only at run time."""
    once, repeated = split_reductions(kernel.value)
    if splittable and len(once) > 1 and any(not r.extent.is_const for r in once):
        return False
    return not repeated and len(once) <= MERGED_PER_KERNEL


def sums_partials_well(kernel: Kernel) -> bool:
    """merged_well, but a short sum (the heads' partials, a few loads) may run at each step of a
    reduction around it: a sum of squares over the residual the partials complete."""
    once, repeated = split_reductions(*(w.value for w in kernel.writes))
    short = [r for r in (*once, *repeated) if r.extent.is_const and r.extent.value <= SHORT_SUM]
    return all(r in short for r in repeated) and len(set(once) - set(short)) <= MERGED_PER_KERNEL
