"""Comparisons whose result is known without the operands' values: constant folding through the
`const_value` analysis, so identity rules see the false mask they give. The frontend's eq, isnan
and isinf compare with the infinities: a safe softmax tests its scores for -inf in every layer.

Each holds for every value, NaN included (any comparison with NaN is false).
"""
from ..search.dsl import String, const_value, facts, holds, less_than, set_, terms

STAGE = "analysis"

c, x = terms("c x")
false = String("False")

RULES = facts("compare", [
    ("less-than-self", "x < x is false", [less_than(x, x)], [set_(const_value(less_than(x, x))).to(false)]),
    ("less-than-minus-inf", "x < -inf is false: nothing is below -inf",
     [holds(c, "-inf"), less_than(x, c)], [set_(const_value(less_than(x, c))).to(false)]),
    ("inf-less-than", "inf < x is false: nothing is above inf",
     [holds(c, "inf"), less_than(c, x)], [set_(const_value(less_than(c, x))).to(false)]),
])
