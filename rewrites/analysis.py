"""Analyses: facts about e-classes that optimizing rules match on. Run to saturation before each
iteration of a stage; they add no e-nodes."""
from ..search.dsl import const_value, constant, dims, expand, facts, holds, reshape, set_, strings, terms

STAGE = "analysis"

(x,) = terms("x")
value, dtype = strings("value dtype")
(shape,) = dims("shape")

RULES = facts("analysis", [
    ("const-value", "a Constant holds its value everywhere",
     [constant(value, dtype)], [set_(const_value(constant(value, dtype))).to(value)]),
    ("const-through-reshape", "reshaping a constant tensor keeps its value",
     [holds(x, value), reshape(x, shape)], [set_(const_value(reshape(x, shape))).to(value)]),
    ("const-through-expand", "broadcasting a constant tensor keeps its value",
     [holds(x, value), expand(x, shape)], [set_(const_value(expand(x, shape))).to(value)]),
])
