"""Selects on negated conditions. The frontend lowers logical_not(c) to where(c, false, true), so
a mask built with `~` (or negated twice) reaches the IR as a select of a select; these rules let
extraction drop the negation instead of computing it.
"""
from ..search.dsl import holds, rewrites, terms, where

STAGE = "algebra"

a, b, c, no, yes = terms("a b c no yes")

RULES = rewrites("select", [
    # not c = where(c, false, true)
    ("where-not-swaps", "where(not c, a, b) = where(c, b, a)",
     where(where(c, no, yes), a, b), where(c, b, a), holds(no, "False"), holds(yes, "True")),
    ("where-true-false", "where(c, true, false) = c (so not(not c) = c)",
     where(c, yes, no), c, holds(yes, "True"), holds(no, "False")),
])
