"""Views: fold chains of views, and move views across elementwise ops, so that extraction can
choose where the indexing happens (before an op, or after it, next to the consumer).

Only rules that need no shape arithmetic are here. A binary op is pulled through views only when
both operands go through the same Permute (equal shapes follow); through the same Reshape or
Expand the operands' shapes could differ, which needs a shape analysis first.
"""
from ..ir.ops import UNARY
from ..search.dsl import add, dims, expand, mul, permute, perms, reshape, rewrites, terms
from ..search.language import CONSTRUCTORS

STAGE = "views"

a, b, x = terms("a b x")
s, t = dims("s t")
(p,) = perms("p")

VIEWS = {"reshape": reshape, "expand": expand, "permute": permute}

RULES = rewrites("views", [
    ("reshape-reshape", "reshape(reshape(x, s), t) = reshape(x, t)",
     reshape(reshape(x, s), t), reshape(x, t)),
    ("expand-expand", "expand(expand(x, s), t) = expand(x, t): only size-1 axes grow, once",
     expand(expand(x, s), t), expand(x, t)),
    # elementwise unary ops commute with any view
    *[(f"{op}-through-{view}", f"{op}({view}(x)) = {view}({op}(x))",
       fn(v(x, s if view != "permute" else p)), v(fn(x), s if view != "permute" else p))
      for op, fn in ((op.value.lower(), CONSTRUCTORS[op]) for op in UNARY) for view, v in VIEWS.items()],
    ("add-through-permute", "permute(a, p) + permute(b, p) = permute(a + b, p)",
     add(permute(a, p), permute(b, p)), permute(add(a, b), p)),
    ("mul-through-permute", "permute(a, p) * permute(b, p) = permute(a * b, p)",
     mul(permute(a, p), permute(b, p)), permute(mul(a, b), p)),
])
