"""torch's symbolic sizes (sympy expressions) to Kiln's `Expr`."""
from __future__ import annotations

from typing import Mapping

import sympy
import torch
from torch.utils._sympy import functions as tsf

from ..ir import Expr, UnsupportedOp

def to_expr(value, names: Mapping[str, str]) -> Expr:
    """A torch SymInt, sympy expression or int as an Expr, symbols renamed through `names`."""
    if isinstance(value, torch.SymInt):
        value = value.node.expr
    if isinstance(value, int):
        return Expr.of(value)
    return _from_sympy(sympy.sympify(value), names)


def _from_sympy(e, names: Mapping[str, str]) -> Expr:
    if e.is_Integer:
        return Expr.of(int(e))
    if e.is_Symbol:
        return Expr.of(names.get(e.name, e.name))
    args = [_from_sympy(a, names) for a in e.args]
    if isinstance(e, sympy.Add):
        out = Expr.of(0)
        for a in args:
            out = out + a
        return out
    if isinstance(e, sympy.Mul):
        out = Expr.of(1)
        for a in args:
            out = out * a
        return out
    if isinstance(e, (sympy.Pow, tsf.PowByNatural)) and args[1].is_const and args[1].value >= 0:
        out = Expr.of(1)
        for _ in range(args[1].value):
            out = out * args[0]
        return out
    if isinstance(e, tsf.FloorDiv):
        return args[0] // args[1]
    if isinstance(e, tsf.CeilDiv):
        return (args[0] + args[1] - 1) // args[1]
    if isinstance(e, (tsf.PythonMod, tsf.Mod, sympy.Mod)):
        return args[0] % args[1]
    if isinstance(e, (tsf.Max, sympy.Max)):
        out = args[0]
        for a in args[1:]:
            out = out.max(a)
        return out
    if isinstance(e, (tsf.Min, sympy.Min)):
        out = args[0]
        for a in args[1:]:
            out = out.min(a)
        return out
    raise UnsupportedOp(f"kiln: cannot express the symbolic size {e} ({type(e).__name__})")
