"""Random small IR programs for the soundness fuzzer, and random inputs to run them on.

A program grows from one to three inputs by random steps drawn from the op table's families
(elementwise, comparisons and selects, reductions, casts, views, iotas, gathers, slice updates,
matmuls as Mul of broadcasts + SumReduce, and idioms as the frontend lowers them: RMSNorm, softmax
then the PV product). The steps are biased toward what rewrite rules match:
constants such as 0, 1, -1 broadcast by views, an operand used twice (`x * x`, `where(c, x, x)`),
a step repeated on its own result (`-(-x)`, `permute(permute(x))`), a constant on either side of
a comparison, and reductions of what reduction rules take apart. Shapes mix constant and
symbolic dims; each input draw binds the symbols anew.
"""
from __future__ import annotations

import itertools
import math
import re
import warnings
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..ir import DType, Graph, KilnTypeError, Node, Op, ShapeError, build, evaluate, toposort
from ..ir.ops import UNARY
from ..ir.printer import format_graph
from ..ir.symbolic import Expr, fmt_shape, prod, sym

SYMBOLS = {"n": (2, 5), "m": (1, 4)}   # symbol -> inclusive range of the values draws bind
DTYPES = {DType.F32: 0.5, DType.BF16: 0.1, DType.I32: 0.25, DType.BOOL: 0.15}
CONSTANTS = {  # values rules are about: identities first, then others an unsound rule may trip on
    "float": (0.0, 1.0, -1.0, 2.0, 0.5, -0.0, 3.0, -math.inf),
    "int": (0, 1, -1, 2, 3),
    "bool": (False, True),
}
IDENTITIES = {"float": (0.0, 1.0, -1.0), "int": (0, 1, -1), "bool": (False, True)}
PAD_VALUES = {"float": (0.0, -math.inf, 1.0), "int": (0, -1), "bool": (False,)}
INVERSE = {Op.EXP2: Op.LOG2, Op.LOG2: Op.EXP2, Op.RECIP: Op.RECIP, Op.SQRT: Op.RECIP, Op.SIN: Op.SIN}
LOG2E = 1.4426950408889634   # the frontend's exp(x) is exp2(x * log2 e)
_BUILD_ERRORS = (ShapeError, KilnTypeError, ValueError, IndexError, KeyError)


def _family(dtype: DType) -> str:
    return "float" if dtype.is_float else "int" if dtype.is_int else "bool"


@dataclass
class Program:
    outputs: list[Node]
    bounds: dict[str, Expr] = field(default_factory=dict)   # index inputs: name -> exclusive bound

    @property
    def inputs(self) -> list[Node]:
        return [n for n in toposort(self.outputs) if n.op is Op.INPUT]

    @property
    def size(self) -> int:
        return len(toposort(self.outputs))

    def restricted(self, outputs: list[Node]) -> Program:
        """The part of this program below `outputs` (used to shrink a counterexample)."""
        names = {n.attrs["name"] for n in toposort(outputs) if n.op is Op.INPUT}
        return Program(outputs, {k: v for k, v in self.bounds.items() if k in names})

    def cut(self, node: Node, draws: list[Draw]) -> tuple[Program, list[Draw]]:
        """This program with `node` replaced by a fresh input that holds node's value in each draw
        (so a counterexample shrinks without changing what its rule sees)."""
        taken = {n.attrs["name"] for n in self.inputs}
        name = next(f"t{k}" for k in range(len(taken) + 1) if f"t{k}" not in taken)
        fresh = Node(Op.INPUT, name=name, role="input", shape=node.shape, dtype=node.dtype)
        new: dict[int, Node] = {id(node): fresh}
        for n in toposort(self.outputs):
            if id(n) not in new:
                new[id(n)] = n.replace(inputs=[new[id(i)] for i in n.inputs]) if n.inputs else n
        feeds = [{i: d.feeds[i.attrs["name"]] for i in toposort([node]) if i.op is Op.INPUT} for d in draws]
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")  # a cast of NaN to an integer, say: values, not errors
            values = [evaluate([node], f, d.env)[0] for f, d in zip(feeds, draws)]
        part = self.restricted([new[id(o)] for o in self.outputs])
        return part, [Draw(d.env, {**d.feeds, name: v}) for d, v in zip(draws, values)]

    @property
    def symbols(self) -> list[str]:
        return sorted(set().union(*(d.symbols() for n in toposort(self.outputs) for d in n.shape)))

    def text(self) -> str:
        return format_graph(Graph(self.inputs, self.outputs, symbols={s: SYMBOLS[s] for s in self.symbols}))


@dataclass
class Draw:
    env: dict[str, int]                 # symbol values
    feeds: dict[str, np.ndarray]        # input name -> value


def held_constants(rules) -> dict[str, tuple]:
    """The constants rules test for with `holds(t, "2.0")`, by family, so that programs hold them.
    Read from the rules' egglog text; a best-effort hint (a rule whose constant is missed still
    fires on the generator's own constants, or is reported as never fired)."""
    found: dict[str, set] = {"float": set(), "int": set(), "bool": set()}
    for rule in rules:
        for text in _HELD.findall(repr(rule.egg)):
            if text in ("True", "False"):
                found["bool"].add(text == "True")
            elif text.lstrip("-").isdigit():
                found["int"].add(int(text))
            else:
                try:
                    found["float"].add(float(text))
                except ValueError:
                    pass
    return {family: tuple(sorted(values, key=repr)) for family, values in found.items() if values}


_HELD = re.compile(r'const_value\(\w+\)\)\.to\(String\("([^"]*)"\)\)')


class _Builder:
    def __init__(self, rng: np.random.Generator, hints: dict[str, tuple]):
        self.rng, self.hints = rng, hints
        self.pool: list[Node] = []
        self.bounds: dict[str, Expr] = {}
        self.inputs = 0

    # --- choices ----------------------------------------------------------------------------
    def choice(self, items):
        return items[int(self.rng.integers(len(items)))]

    def coin(self, p: float) -> bool:
        return bool(self.rng.random() < p)

    def pick(self, ok: Callable[[Node], bool] = lambda n: True) -> Node:
        """A term of the pool, recent ones more likely (so steps chain into deeper terms)."""
        found = [n for n in self.pool if ok(n)]
        if not found:
            raise ShapeError("no term fits")
        weights = np.arange(1, len(found) + 1, dtype=float) ** 2
        return found[int(self.rng.choice(len(found), p=weights / weights.sum()))]

    def partner(self, x: Node, same: float = 0.3) -> Node:
        """A second operand for x: x itself, a constant broadcast to x's shape, or a pool term."""
        r = self.rng.random()
        if r < same:
            return x
        if r < same + 0.45:
            return self.constant(CONSTANTS, x)
        return self.pick(lambda n: n.shape == x.shape and n.dtype is x.dtype)

    def constant(self, table: dict[str, tuple], like: Node) -> Node:
        """A constant from table, or (half the time) one the rules under test ask for, broadcast
        to like's shape and dtype."""
        family = _family(like.dtype)
        values = self.hints[family] if family in self.hints and self.coin(0.5) else table[family]
        return build.constant(self.choice(values), like.dtype, like.shape)

    def dim(self) -> Expr:
        return Expr.of(self.choice([1, 2, 3, 4])) if self.coin(0.7) else sym(self.choice(["n", "m"]))

    def new_input(self, shape, dtype: DType, bound: Expr | None = None) -> Node:
        name = f"{'i' if bound is not None else 'x'}{self.inputs}"
        self.inputs += 1
        if bound is not None:
            self.bounds[name] = bound
        return Node(Op.INPUT, name=name, role="input", shape=tuple(map(Expr.of, shape)), dtype=dtype)

    # --- steps: each returns (node, again) where again(t) repeats the step on t --------------
    def unary(self):
        """One or two unary ops; two are often an inverse pair such as exp2(log2 x)."""
        ops = [self.choice(UNARY)]
        if self.coin(0.5):
            inverse = INVERSE.get(ops[0])     # an op without one pairs with any
            ops.append(inverse if inverse is not None and self.coin(0.5) else self.choice(UNARY))
        x = self.pick(lambda n: n.dtype.is_float)
        for op in ops:
            x = Node(op, [x])
        return x, lambda t: Node(ops[-1], [t])

    def binary(self):
        op = self.choice([Op.ADD, Op.MUL, Op.ADD, Op.MUL, Op.MOD])
        x = self.pick(lambda n: op is not Op.MOD or n.dtype is not DType.BOOL)
        y = self.partner(x)
        if self.coin(0.3):
            return Node(op, [y, x]), lambda t: Node(op, [y, t])
        return Node(op, [x, y]), lambda t: Node(op, [t, y])

    def identity(self):
        """x + c or x * c with c one of 0, 1, -1: what algebraic identities match."""
        op = self.choice([Op.ADD, Op.MUL])
        x = self.pick()
        c = self.constant(IDENTITIES, x)
        if self.coin(0.3):
            return Node(op, [c, x]), lambda t: Node(op, [c, t])
        return Node(op, [x, c]), lambda t: Node(op, [t, c])

    def compare(self):
        return self.comparison(self.pick(), same=0.1), None

    def comparison(self, x: Node, same: float) -> Node:
        """x < y or y < x, with y a partner of x (so a constant on either side)."""
        y = self.partner(x, same=same)
        return Node(Op.LESS_THAN, [y, x] if self.coin(0.3) else [x, y])

    def where(self):
        a = self.pick(lambda n: n.dtype is not DType.BOOL or self.coin(0.3))
        cond = self.condition(a)
        b = self.partner(a, same=0.3)
        if self.coin(0.3):
            return Node(Op.WHERE, [cond, b, a]), lambda t: Node(Op.WHERE, [cond, b, t])
        return Node(Op.WHERE, [cond, a, b]), lambda t: Node(Op.WHERE, [cond, t, b])

    def condition(self, a: Node) -> Node:
        """A bool of a's shape: a pool term, a comparison of a, or the negation of either."""
        same = [n for n in self.pool if n.dtype is DType.BOOL and n.shape == a.shape]
        if same and self.coin(0.5):
            cond = self.pick(lambda n: n.dtype is DType.BOOL and n.shape == a.shape)
        else:
            cond = self.comparison(a, same=0.0)
        return _not(cond) if self.coin(0.25) else cond

    def negate(self):
        c = self.condition(self.pick())
        return _not(c), _not

    def reduce(self):
        """A reduction of a pool term over a random axis, or of a fresh step that reduction rules
        match: a unary op (max moves across monotone ones), an add or a product (sums distribute,
        constant factors come out), or a view with a size-1 axis, reduced over that axis."""
        op = self.choice([Op.SUM_REDUCE, Op.MAX_REDUCE])
        fresh = self.choice(["pool", "unary", "binary", "unit"])
        if fresh == "unary":
            x = Node(self.choice(UNARY), [self.pick(lambda n: n.rank >= 1 and n.dtype.is_float)])
        elif fresh == "binary":
            x = self.binary()[0]
        else:
            x = self.pick(lambda n: n.rank >= 1)
        axis = int(self.rng.integers(x.rank))
        if fresh == "unit":
            axis = int(self.rng.integers(x.rank + 1))
            x = Node(Op.RESHAPE, [x], shape=x.shape[:axis] + (Expr.of(1),) + x.shape[axis:])
            if self.coin(0.5):  # broadcast along the other size-1 axes, if any
                grown = tuple(self.dim() if d == 1 and i != axis else d for i, d in enumerate(x.shape))
                x = Node(Op.EXPAND, [x], shape=grown)
        return Node(op, [x], axis=axis), lambda t: Node(op, [t], axis=min(axis, t.rank - 1))

    def cast(self):
        x = self.pick()
        dtype = self.choice([d for d in DTYPES if d is not x.dtype])
        return Node(Op.CAST, [x], dtype=dtype), lambda t: Node(Op.CAST, [t], dtype=self.choice(list(DTYPES)))

    def permute(self):
        x = self.pick(lambda n: n.rank >= 2)
        perm = tuple(int(p) for p in self.rng.permutation(x.rank))
        if perm == tuple(range(x.rank)):
            perm = perm[1:] + perm[:1]
        return Node(Op.PERMUTE, [x], perm=perm), lambda t: Node(Op.PERMUTE, [t], perm=perm)

    def permuted_pair(self):
        """Two operands permuted alike, then added or multiplied (as a transposed product's
        operands meet)."""
        x = self.pick(lambda n: n.rank >= 2)
        y = self.partner(x, same=0.1)
        perm = tuple(int(p) for p in self.rng.permutation(x.rank))
        op = self.choice([Op.ADD, Op.MUL])
        return Node(op, [Node(Op.PERMUTE, [x], perm=perm), Node(Op.PERMUTE, [y], perm=perm)]), None

    def reshape(self):
        x = self.pick()
        shape = list(x.shape)
        kind = self.choice(["flatten", "unit", "drop", "merge"])
        if kind == "flatten":
            shape = [prod(shape)]
        elif kind == "unit" or not shape:
            shape.insert(int(self.rng.integers(len(shape) + 1)), Expr.of(1))
        elif kind == "drop" and Expr.of(1) in shape:
            shape.remove(Expr.of(1))
        elif len(shape) >= 2:
            i = int(self.rng.integers(len(shape) - 1))
            shape[i:i + 2] = [shape[i] * shape[i + 1]]
        if tuple(shape) == x.shape:
            raise ShapeError("no change")
        back = x.shape
        return Node(Op.RESHAPE, [x], shape=tuple(shape)), lambda t: Node(Op.RESHAPE, [t], shape=back)

    def expand(self):
        x = self.pick()
        if Expr.of(1) not in x.shape or self.coin(0.5):
            at = int(self.rng.integers(x.rank + 1))
            x = Node(Op.RESHAPE, [x], shape=x.shape[:at] + (Expr.of(1),) + x.shape[at:])
        shape = tuple(self.dim() if d == 1 and self.coin(0.8) else d for d in x.shape)
        if shape == x.shape:
            raise ShapeError("no change")
        return Node(Op.EXPAND, [x], shape=shape), None

    def viewed_unary(self):
        """A unary op on a fresh view: the pattern view rules move the op across."""
        view, _ = self.choice([self.permute, self.reshape, self.expand])()
        if not view.dtype.is_float:
            raise ShapeError("no float view")
        return Node(self.choice(UNARY), [view]), None

    def expand_twice(self):
        """Two Expands in a row, each growing one of two fresh unit axes."""
        x = self.pick()
        x = Node(Op.RESHAPE, [x], shape=(Expr.of(1), Expr.of(1)) + x.shape)
        once = Node(Op.EXPAND, [x], shape=(self.dim(), Expr.of(1)) + x.shape[2:])
        return Node(Op.EXPAND, [once], shape=(once.shape[0], self.dim()) + x.shape[2:]), None

    def slice(self):
        x = self.pick(lambda n: n.rank >= 1)
        axis = int(self.rng.integers(x.rank))
        start, drop, step = self.choice([0, 0, 1]), self.choice([0, 0, 1]), self.choice([1, 1, 2])

        def make(t: Node) -> Node:
            stop = t.shape[axis] - drop
            if _least(stop - start) < 1:  # empty or reversed for some binding of the symbols
                raise ShapeError("empty slice")
            return Node(Op.SLICE, [t], axis=axis, start=Expr.of(start), stop=stop, step=step)
        return make(x), make

    def pad(self):
        x = self.pick(lambda n: n.rank >= 1)
        axis = int(self.rng.integers(x.rank))
        value = self.choice(PAD_VALUES[_family(x.dtype)])
        before, after = Expr.of(self.choice([0, 1, 2])), Expr.of(self.choice([0, 1]))
        make = lambda t: Node(Op.PAD, [t], axis=axis, before=before, after=after, value=value)
        return make(x), make

    def concat(self):
        x = self.pick(lambda n: n.rank >= 1)
        y = self.pick(lambda n: n.shape == x.shape and n.dtype is x.dtype) if self.coin(0.6) else x
        axis = int(self.rng.integers(x.rank))
        return Node(Op.CONCAT, [x, y], axis=axis), lambda t: Node(Op.CONCAT, [t, y], axis=axis)

    def iota(self):
        length = self.choice([d for n in self.pool for d in n.shape] or [Expr.of(3)])
        node = build.iota(length, self.choice([DType.I32, DType.I64]), start=self.choice([0, 1, sym("n")]),
                          step=self.choice([1, 2]))
        return node, None

    def matmul(self):
        """[a, k] x [k, j] as the IR writes it: Mul of two broadcasts, then SumReduce over k. Now
        and then a long axis (64: every split factor divides it), a batch axis in front, or the
        reduction over j instead of k."""
        if self.coin(0.6):
            x = self.pick(lambda n: n.rank == 2 and n.dtype.is_float)
            (a, k), j = x.shape, self.dim()
            w = self.new_input((k, j), x.dtype)
            lhs = Node(Op.EXPAND, [Node(Op.RESHAPE, [x], shape=(a, k, Expr.of(1)))], shape=(a, k, j))
            rhs = Node(Op.EXPAND, [Node(Op.RESHAPE, [w], shape=(Expr.of(1), k, j))], shape=(a, k, j))
            return Node(Op.SUM_REDUCE, [Node(Op.MUL, [lhs, rhs])], axis=1), None
        batch = (self.dim(),) if self.coin(0.5) else ()
        over_j = self.coin(0.5)
        a, k, j = self.dim(), Expr.of(64) if not over_j else self.dim(), Expr.of(64) if over_j else self.dim()
        dtype = self.choice([DType.F32, DType.BF16])
        x, w = self.new_input((*batch, a, k), dtype), self.new_input((*batch, k, j), dtype)
        one, full = (Expr.of(1),), (*batch, a, k, j)
        lhs = Node(Op.EXPAND, [Node(Op.RESHAPE, [x], shape=(*batch, a, k, *one))], shape=full)
        rhs = Node(Op.EXPAND, [Node(Op.RESHAPE, [w], shape=(*batch, *one, k, j))], shape=full)
        return Node(Op.SUM_REDUCE, [Node(Op.MUL, [lhs, rhs])], axis=len(full) - (1 if over_j else 2)), None

    def matrix_chain(self):
        """Three matrices as two products, (A·B)·X or A·(B·X), X sometimes a column (whose
        broadcast the frontend leaves out)."""
        m, k, n = self.dim(), self.dim(), self.dim()
        p = Expr.of(1) if self.coin(0.5) else self.dim()
        dtype = self.choice([DType.F32, DType.BF16])
        a, b, x = (self.new_input(shape, dtype) for shape in ((m, k), (k, n), (n, p)))
        if self.coin(0.5):
            return _product(_product(a, b), x), None
        return _product(a, _product(b, x)), None

    def rms_norm(self):
        """RMSNorm over the last of 64 features as the frontend lowers it, x * 1/sqrt(sum(x * x) * c
        + eps) with c (the mean's 1/n) an input, as in a region; 64 is split by every factor."""
        dtype = self.choice([DType.F32, DType.BF16])
        shape = (self.dim(), sym("n") if self.coin(0.5) else self.dim(), Expr.of(64))
        x, row = self.new_input(shape, dtype), shape[:-1] + (Expr.of(1),)
        sums = Node(Op.RESHAPE, [Node(Op.SUM_REDUCE, [Node(Op.MUL, [x, x])], axis=2)], shape=row)
        mean = Node(Op.MUL, [sums, self.new_input(row, dtype)])
        eps = build.constant(self.choice([1e-5, 1e-6, 0.0]), dtype, row)
        norm = Node(Op.RECIP, [Node(Op.SQRT, [Node(Op.ADD, [mean, eps])])])
        return Node(Op.MUL, [x, Node(Op.EXPAND, [norm], shape=shape)]), None

    def softmax_pv(self):
        """Attention's softmax over the last axis as the frontend lowers it (exp2 of the scores
        minus their max, times log2 e; each row over its sum), sometimes with the safe softmax's
        zero for flagged rows (those with no score above -inf, whose sums are NaN, or any), then
        the product with values: p [.., k] reshaped to [.., k, 1], broadcast to [.., k, d] against
        v, summed over k. Scores are often masked with -inf, so whole rows can be."""
        x = self.pick(lambda n: n.rank in (2, 3) and n.dtype in (DType.F32, DType.BF16))
        shape, dtype, last = x.shape, x.dtype, x.rank - 1
        row = shape[:-1] + (Expr.of(1),)
        minus_inf = build.constant(-math.inf, dtype, shape)
        if self.coin(0.5):
            x = Node(Op.WHERE, [self.comparison(x, same=0.0), minus_inf, x])
        top = Node(Op.RESHAPE, [Node(Op.MAX_REDUCE, [x], axis=last)], shape=row)
        shifted = Node(Op.ADD, [x, Node(Op.EXPAND, [Node(Op.MUL, [top, build.constant(-1.0, dtype, row)])],
                                        shape=shape)])
        e = Node(Op.EXP2, [Node(Op.MUL, [shifted, build.constant(LOG2E, dtype, shape)])])
        total = Node(Op.RECIP, [Node(Op.RESHAPE, [Node(Op.SUM_REDUCE, [e], axis=last)], shape=row)])
        p = Node(Op.MUL, [e, Node(Op.EXPAND, [total], shape=shape)])
        if self.coin(0.5):
            above = Node(Op.LESS_THAN, [minus_inf, x]) if self.coin(0.5) else self.comparison(x, same=0.0)
            flag = Node(Op.MAX_REDUCE, [above], axis=last)
            keep = _not(Node(Op.RESHAPE, [flag], shape=row))
            p = Node(Op.WHERE, [Node(Op.EXPAND, [keep], shape=shape), build.constant(0.0, dtype, shape), p])
        wide = shape + (self.dim(),)
        v = self.new_input(shape[:-2] + (Expr.of(1),) + wide[-2:], dtype)
        lhs = Node(Op.EXPAND, [Node(Op.RESHAPE, [p], shape=shape + (Expr.of(1),))], shape=wide)
        return Node(Op.SUM_REDUCE, [Node(Op.MUL, [lhs, Node(Op.EXPAND, [v], shape=wide)])], axis=last), None

    def gather(self):
        table = self.pick(lambda n: n.rank >= 1)
        axis = int(self.rng.integers(table.rank))
        shape = self.choice([(), (2,), (3,)])
        index = self.new_input(shape, self.choice([DType.I32, DType.I64]), bound=table.shape[axis])
        return Node(Op.GATHER, [table, index], axis=axis), None

    def slice_update(self):
        dst = self.pick(lambda n: any(d.is_const and d.value >= 2 for d in n.shape))
        axis = self.choice([i for i, d in enumerate(dst.shape) if d.is_const and d.value >= 2])
        size = dst.shape[axis].value
        take = int(self.rng.integers(1, size + 1))
        src = self.pick(lambda n: n.shape == dst.shape and n.dtype is dst.dtype)
        if take < size:
            src = Node(Op.SLICE, [src], axis=axis, start=Expr.of(0), stop=Expr.of(take), step=1)
        start = self.new_input((), DType.I32, bound=Expr.of(size - take + 1))
        return Node(Op.SLICE_UPDATE, [dst, src, start], axis=axis), None


def _product(a: Node, b: Node) -> Node:
    """a [m, k] times b [k, n] as the frontend lowers it: no broadcast to a shape already held."""
    (m, k), n = a.shape, b.shape[1]
    left, right = Node(Op.RESHAPE, [a], shape=(m, k, Expr.of(1))), Node(Op.RESHAPE, [b], shape=(Expr.of(1), k, n))
    full = (m, k, n)
    if left.shape != full:
        left = Node(Op.EXPAND, [left], shape=full)
    if right.shape != full:
        right = Node(Op.EXPAND, [right], shape=full)
    return Node(Op.SUM_REDUCE, [Node(Op.MUL, [left, right])], axis=1)


def _not(c: Node) -> Node:
    """not c, as the frontend lowers logical_not: where(c, false, true)."""
    return Node(Op.WHERE, [c, *(build.constant(v, DType.BOOL, c.shape) for v in (False, True))])


def _least(expr: Expr) -> int:
    """The smallest value expr takes over the symbols' ranges."""
    names = sorted(expr.symbols())
    points = itertools.product(*(range(SYMBOLS[s][0], SYMBOLS[s][1] + 1) for s in names))
    return min(expr.evaluate(dict(zip(names, point))) for point in points)


STEPS = {  # step -> weight
    "binary": 5, "identity": 4, "where": 2.5, "unary": 2, "compare": 1, "negate": 1, "reduce": 4,
    "cast": 1, "permute": 1.5, "reshape": 1.5, "expand": 1.5, "slice": 1, "pad": 1, "concat": 1,
    "iota": 0.5, "matmul": 1.2, "gather": 0.5, "slice_update": 0.5, "viewed_unary": 1.5,
    "expand_twice": 0.5, "rms_norm": 0.4, "softmax_pv": 0.6,
    "matrix_chain": 0.3, "permuted_pair": 0.3,
}
_NAMES, _WEIGHTS = list(STEPS), np.array(list(STEPS.values())) / sum(STEPS.values())


def random_program(rng: np.random.Generator, hints: dict[str, tuple] | None = None,
                   steps: int | None = None) -> Program:
    """A random program of a few steps; its outputs are the terms nothing else uses. `hints` adds
    constants (by family: float, int, bool) to those the steps draw."""
    while True:
        b = _Builder(rng, hints or {})
        dtype = list(DTYPES)[int(rng.choice(len(DTYPES), p=np.array(list(DTYPES.values()))))]
        rank = b.choice([1, 2, 2, 3])
        shape = [sym("n") if i == 0 and b.coin(0.5) else b.dim() for i in range(rank)]
        b.pool = [b.new_input(shape, dtype) for _ in range(b.choice([1, 2, 2, 3]))]
        again = None
        for _ in range(steps or int(rng.integers(3, 9))):
            if again is not None and b.coin(0.45):
                node, again = _try(lambda: (again(b.pool[-1]), again))
            else:
                node, again = _try(getattr(b, _NAMES[int(rng.choice(len(_NAMES), p=_WEIGHTS))]))
            if node is not None:
                b.pool.append(node)
        used = {id(i) for n in b.pool for i in n.inputs}
        outputs = [n for n in b.pool if id(n) not in used and n.op is not Op.INPUT]
        if outputs:
            return Program(outputs, b.bounds)


def _try(step):
    try:
        return step()
    except _BUILD_ERRORS:
        return None, None


# --- input draws ------------------------------------------------------------------------------
_SPECIAL_FLOATS = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e30, -1e30, 1e-30, 65504.0])
_SPECIAL_INTS = np.array([0, -1, 2**31 - 1, -2**31, 2**20, -7])


def draw_inputs(program: Program, rng: np.random.Generator, kind: int,
                env: dict[str, int] | None = None) -> Draw:
    """Inputs for one run. kind 0: small exact values (halves, many zeros); kind 1: mixed signs and
    magnitudes; kind 2: also infinities, NaN, signed zeros and values near the dtype's limits.
    The symbols take random values in their ranges, unless `env` gives them."""
    env = env or {s: int(rng.integers(lo, hi + 1)) for s, (lo, hi) in SYMBOLS.items()}
    feeds = {}
    for node in program.inputs:
        name, dtype = node.attrs["name"], node.dtype
        shape = tuple(d.evaluate(env) for d in node.shape)
        if name in program.bounds:
            value = rng.integers(0, max(program.bounds[name].evaluate(env), 1), size=shape)
        elif dtype is DType.BOOL:
            value = rng.random(shape) < 0.5
        elif dtype.is_int:
            value = rng.integers(-4, 5, size=shape) if kind == 0 else rng.integers(-1000, 1001, size=shape)
            if kind == 2:
                value = np.where(rng.random(shape) < 0.3, rng.choice(_SPECIAL_INTS, size=shape), value)
        else:
            if kind == 0:
                value = rng.integers(-8, 9, size=shape) / 2.0
            else:
                value = rng.standard_normal(shape) * 10.0 ** rng.uniform(-3, 3, size=shape)
                value = np.where(rng.random(shape) < 0.15, 0.0, value)
            if kind == 2:
                value = np.where(rng.random(shape) < 0.25, rng.choice(_SPECIAL_FLOATS, size=shape), value)
        feeds[name] = np.asarray(value).astype(dtype.np)
    return Draw(env, feeds)


def describe(draw: Draw, program: Program) -> str:
    """The symbol values and input arrays of one draw, for a counterexample."""
    lines = ["  " + ", ".join(f"{s} = {draw.env[s]}" for s in program.symbols)] if program.symbols else []
    for node in program.inputs:
        value = draw.feeds[node.attrs["name"]]
        text = np.array2string(value, precision=5, threshold=24, separator=", ").replace("\n", " ")
        lines.append(f"  {node.attrs['name']}: {node.dtype!r}{fmt_shape(node.shape)} = {text}")
    return "\n".join(lines)
