"""Partner points: a kernel whose point at index d of its last loop reads a sum at d and the same
sum at a partner index the point computes from d alone (rotary's rotate_half: d ± depth/2, an
involution pairing the first half of the loop with the second), so each point computes two sums
and each sum is computed at two points: every weight row of the projection is read twice. A
GPU thread group can instead take both points of a pair: the two sums once, then both outputs
(Llama-3.2-1B's query projection with its rotary took 9.9 us on an H100 for 8.4 MB of weights,
reading them twice, where the 2048 -> 2048 GEMV alone streams them in about 4.6).

`paired` rewrites such a kernel's writes for that: the last loop runs over the first half (the
representatives), and each write gains a copy for the partner point, whose two sums are the
representative's two, swapped. The C emitter reaches the same end its own way (c_kernel's
partner rows). Only a partner index a bind computes is found (rotate_half's, as models lower it);
one written into the loads' indices (a flip) is not."""
from __future__ import annotations

from dataclasses import replace

from ..ir.ops import Op
from ..ir.symbolic import Expr, sym
from .index import substitute
from .kernel import (Apply, Bind, Const, InRange, IndexValue, Kernel, Reduce, Scalar, Write,
                     alpha_canonical, free_vars, nodes, rebuilt, renamed)

_ROW = "kiln_row"      # the sum's index, in the form two copies of it compare equal


class _Unknown(Exception):
    """An index computation `_integer` does not follow."""


def _integer(s: Scalar, env: dict[str, int]) -> int:
    """The value of an integer index computation (a bind's) at `env`: what rotary's partner
    index is built of (indices, range tests, selections, casts)."""
    if isinstance(s, IndexValue):
        return s.expr.evaluate(env)
    if isinstance(s, Const):
        return int(s.value)
    if isinstance(s, InRange):
        return int(s.lo.evaluate(env) <= s.expr.evaluate(env) < s.hi.evaluate(env))
    if isinstance(s, Apply) and s.op is Op.WHERE:
        chosen = s.args[1] if _integer(s.args[0], env) else s.args[2]
        return _integer(chosen, env)
    if isinstance(s, Apply) and s.op is Op.CAST:
        return _integer(s.args[0], env)
    raise _Unknown(type(s).__name__)


def _pairs_halves(bind: Bind, var: str, size: int) -> bool:
    """Whether the bind's index, as a function of `var` over [0, size), pairs each point of the
    first half with one of the second and back (an involution swapping the halves)."""
    half = size // 2
    try:
        image = [_integer(bind.value, {var: d}) for d in range(size)]
    except (_Unknown, KeyError):
        return False
    return all(half <= image[d] < size and image[image[d]] == d for d in range(half))


def _partner(kernel: Kernel) -> tuple[str, int, Bind, str] | None:
    """(the last loop's variable, its extent, the bind computing a point's partner index, the
    sum's canonical form) where the kernel's points read a sum at both; None elsewhere."""
    if not kernel.loops:
        return None
    var, extent = kernel.loops[-1]
    if not extent.is_const or extent.value < 2 or extent.value % 2:
        return None
    values, memo = [w.value for w in kernel.writes], {}
    own = {alpha_canonical(renamed(x, {var: _ROW}))
           for x in nodes(*values) if isinstance(x, Reduce) and var in free_vars(x, memo)}
    for bind in (b for b in nodes(*values) if isinstance(b, Bind)):
        if free_vars(bind.value, memo) != {var} or not _pairs_halves(bind, var, extent.value):
            continue
        for x in nodes(bind.body):
            if not isinstance(x, Reduce):
                continue
            names = free_vars(x, memo)
            row = alpha_canonical(renamed(x, {bind.var: _ROW}))
            if bind.var in names and var not in names and row in own:
                return var, extent.value, bind, row
    return None


def pairable(kernel: Kernel) -> bool:
    return _partner(kernel) is not None


def paired(kernel: Kernel) -> tuple[Kernel, tuple[Write, ...]]:
    """The kernel over the first half of its last loop, and its writes: each original, then its
    copy at the partner point `<var>_mate`, which reads the representative's two sums swapped
    (the partner's own sum is the representative's partner sum and the other way round), so an
    emitter that memoizes sums computes two a point, not four."""
    found = _partner(kernel)
    if found is None:
        raise ValueError("the kernel's points read no sum at a partner index")
    var, size, bind, row = found
    mate = f"{var}_mate"
    memo: dict = {}
    own = next(x for x in nodes(*(w.value for w in kernel.writes)) if isinstance(x, Reduce)
               and var in free_vars(x, memo) and alpha_canonical(renamed(x, {var: _ROW})) == row)
    partner = next(x for x in nodes(bind.body) if isinstance(x, Reduce) and bind.var in free_vars(x, memo)
                   and alpha_canonical(renamed(x, {bind.var: _ROW})) == row)
    mates_partner = renamed(bind.value, {var: mate})
    writes = list(kernel.writes)
    for write in kernel.writes:
        copy = renamed(write.value, {var: mate})
        partner_vars = {b.var for b in nodes(copy) if isinstance(b, Bind) and b.value == mates_partner}

        def swapped(s: Scalar) -> Scalar:
            if not isinstance(s, Reduce):
                return s
            names = free_vars(s, memo)
            if mate in names and alpha_canonical(renamed(s, {mate: _ROW})) == row:
                return partner
            for name in partner_vars & names:
                if alpha_canonical(renamed(s, {name: _ROW})) == row:
                    return own
            return s
        copy = rebuilt(copy, swapped)
        writes.append(Write(write.output, substitute(write.store, {var: sym(mate)}),
                            Bind(mate, bind.value, copy, copy.dtype)))
    loops = (*kernel.loops[:-1], (var, Expr.of(size // 2)))
    return replace(kernel, loops=loops), tuple(writes)
