"""Generated C kernels equal the reference interpreter (compared as tests/kernel_check.py says).

Random programs from the soundness fuzzer's generator are scheduled under several fusion policies,
rendered at default and random launch configs and run on odd sizes (1, 3, 7, 13): every kernel is
checked on its own inputs, the whole graph on inputs of small exact values. Targeted tests cover
each view, Gather, SliceUpdate, Iota, Cast, Mod, MaxReduce, empty and unit reductions, f16 and i64
arithmetic, and a tiny Llama.

Kernels compile into a temporary cache (every session builds what it checks); the random programs'
kernels in one batch, one shared object per core.
"""
from __future__ import annotations

import ctypes
import math
import os
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import pytest

from kiln.codegen.kernel import KernelConfig
from kiln.codegen.policy import FusionPolicy
from kiln.codegen.schedule import Program, schedule
from kiln.ir import DType, Graph, Node, Op, build, run
from kiln.ir.decode import CACHES_START, decode_args
from kiln.ir.ops import IOTA_INDEX
from kiln.ir.symbolic import Expr, shape_of, sym
from kiln.rewrites import fuzz_programs
from kiln.runtime.cpu import CpuBackend
from kiln.runtime.executor import Executor, plan_buffers

from .kernel_check import POLICIES, check, config_sets, mismatch, report, run_problems

SYMBOLS = {"n": (2, 13), "m": (1, 13)}      # the generator's symbols, up to the odd size 13
SIZES = (1, 2, 3, 5, 7, 13)
PROGRAMS, CHUNKS, SEED = 160, 8, 2026


@pytest.fixture(scope="module", autouse=True)
def kernel_cache(tmp_path_factory):
    """CpuBackend compiles into a fresh cache of this session's, not the user's."""
    saved = os.environ.get("KILN_CACHE")
    os.environ["KILN_CACHE"] = str(tmp_path_factory.mktemp("kiln-cache"))
    yield
    if saved is None:
        del os.environ["KILN_CACHE"]
    else:
        os.environ["KILN_CACHE"] = saved


@pytest.fixture(scope="module", autouse=True)
def all_cores():
    """Parallel loops run on one OpenMP thread in this module, except within `with all_cores()`:
    a parallel region after a millisecond of numpy work costs 2 to 15 ms on a two-core virtual
    machine (its idle worker must be woken), and these tests launch thousands. The kernels link
    to the libgomp already loaded (torch's, once torch is imported): one library, one setting."""
    omp = ctypes.CDLL("libgomp.so.1")
    cores = omp.omp_get_max_threads()

    @contextmanager
    def on_all_cores():
        omp.omp_set_num_threads(cores)
        try:
            yield
        finally:
            omp.omp_set_num_threads(1)
    omp.omp_set_num_threads(1)
    yield on_all_cores
    omp.omp_set_num_threads(cores)


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(0)


def misaligned_slots(program: Program) -> bool:
    """Whether the buffer plan puts a temporary in a slot whose byte size its dtype does not
    divide (the executor must view only the bytes the temporary needs)."""
    plan = plan_buffers(program)
    return any(plan.slot_bytes[slot] % program.buffers[name].dtype.itemsize
               for name, slot in plan.slot_of.items())


# --- random programs --------------------------------------------------------------------------
@dataclass
class Case:
    graph: Graph
    program: Program
    configs: list[KernelConfig]
    draws: list[tuple[int, fuzz_programs.Draw]]      # (kind of values, draw)

    def executor(self, backend: CpuBackend) -> Executor:
        return Executor(self.graph, self.program, self.configs, backend)

    def args(self, draw: fuzz_programs.Draw) -> list[np.ndarray]:
        """The draw's arrays in the graph's input order (a symbol's length input holds zeros)."""
        names = [n.attrs["name"] for n in self.graph.inputs]
        return [draw.feeds[name] if name in draw.feeds else
                np.zeros(draw.env[name.removeprefix("len_")], np.float32) for name in names]


def as_graph(program: fuzz_programs.Program) -> Graph:
    """The program as a graph whose inputs bind every symbol (a symbol that only an Expand or an
    Iota uses gets an unused input of that length)."""
    inputs = program.inputs
    bound = {d.symbol_name for n in inputs for d in n.shape}
    inputs += [Node(Op.INPUT, name=f"len_{s}", role="input", shape=(sym(s),), dtype=DType.F32)
               for s in SYMBOLS if s not in bound]
    return Graph(inputs, program.outputs, symbols=dict(SYMBOLS))


def random_cases(programs: int = PROGRAMS, seed: int = SEED) -> tuple[list[Case], CpuBackend]:
    """Random programs, each under one policy at default and at random configs and under another
    at random configs, each run on small exact values and on values of every magnitude (kinds 0,
    and 1 or 2, of `draw_inputs`); and a backend that has compiled all of their kernels."""
    rng = np.random.default_rng(seed)
    cases = []
    for i in range(programs):
        source = fuzz_programs.random_program(rng)
        graph = as_graph(source)
        first, second = (schedule(graph, POLICIES[i % len(POLICIES)]),
                         schedule(graph, POLICIES[(i + 1) % len(POLICIES)]))
        for j, (program, default) in enumerate([(first, True), (first, False), (second, False)]):
            configs = config_sets(program, rng)[0 if default else 1]
            draws = []
            for kind in (0, 1 + (i + j) % 2):
                env = {s: int(rng.choice([v for v in SIZES if lo <= v <= hi]))
                       for s, (lo, hi) in SYMBOLS.items()}
                draws.append((kind, fuzz_programs.draw_inputs(source, rng, kind, env)))
            cases.append(Case(graph, program, configs, draws))
    backend = CpuBackend()
    backend.compile(dict(backend.render(k, config) for c in cases
                         for k, config in zip(c.program.kernels, c.configs)))
    return cases, backend


@pytest.fixture(scope="module")
def fuzzed() -> tuple[list[Case], CpuBackend]:
    return random_cases()


@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_random_programs_equal_the_interpreter(fuzzed, chunk):
    cases, backend = fuzzed
    failures = []
    for case in cases[chunk::CHUNKS]:
        ex = case.executor(backend)
        for kind, draw in case.draws:
            args = case.args(draw)
            problems = run_problems(ex, args, whole=kind == 0)
            if problems:
                failures.append(f"{draw.env}\n" + report(ex, args, problems))
    assert not failures, f"{len(failures)} failing runs; the first:\n" + failures[0]


def test_parallel_kernels(fuzzed, tiny_lm, all_cores):
    """A sample of the random programs and a Llama prefill with parallel loops on all cores."""
    cases, backend = fuzzed
    with all_cores():
        for case in cases[::20]:
            ex = case.executor(backend)
            for kind, draw in case.draws:
                args = case.args(draw)
                problems = run_problems(ex, args, whole=kind == 0)
                assert not problems, report(ex, args, problems)
        check(tiny_lm.prefill, [np.arange(11).reshape(1, 11)], policies=POLICIES[:1], sets=(0,))


# --- targeted tests ---------------------------------------------------------------------------
DIMS = {"n": (1, 13), "m": (1, 13)}
N, M = sym("n"), sym("m")


def inp(name: str, shape, dtype: DType = DType.F32) -> Node:
    return Node(Op.INPUT, name=name, role="input", shape=shape_of(shape), dtype=dtype)


def graph(inputs: list[Node], outputs: list[Node], symbols=DIMS) -> Graph:
    return Graph(inputs, outputs, symbols=dict(symbols))


def values(rng: np.random.Generator, shape, dtype: DType = DType.F32) -> np.ndarray:
    if dtype is DType.BOOL:
        return rng.random(shape) < 0.5
    if dtype.is_int:
        return rng.integers(-50, 51, shape).astype(dtype.np)
    return (rng.standard_normal(shape) * 4).astype(dtype.np)


def permute(x: Node, *perm: int) -> Node:
    return Node(Op.PERMUTE, [x], perm=perm)


def reshape(x: Node, *shape) -> Node:   # unlike build.reshape, never folds a reshape of a reshape
    return Node(Op.RESHAPE, [x], shape=shape_of(shape))


def slice_(x: Node, axis: int, start, stop, step: int = 1) -> Node:
    return Node(Op.SLICE, [x], axis=axis, start=Expr.of(start), stop=Expr.of(stop), step=step)


def pad(x: Node, axis: int, before, after, value) -> Node:
    return Node(Op.PAD, [x], axis=axis, before=Expr.of(before), after=Expr.of(after), value=value)


def test_permute(rng):
    x, y = inp("x", (2, 3, N)), inp("y", (2, N, 3, M))
    p = permute(x, 2, 0, 1)
    outputs = [p, permute(p, 1, 2, 0), Node(Op.EXP2, [permute(y, 3, 1, 0, 2)]),
               Node(Op.SUM_REDUCE, [permute(y, 2, 3, 0, 1)], axis=3)]
    check(graph([x, y], outputs), *([values(rng, (2, 3, n)), values(rng, (2, n, 3, m))]
                                    for n, m in [(7, 3), (1, 13), (13, 1)]))


def test_reshape_splits_and_merges_symbolic_axes(rng):
    a, b, c = inp("a", (N, 6)), inp("b", (N, M, 4)), inp("c", (2, N, 3))
    outputs = [permute(reshape(a, N, 2, 3), 2, 0, 1),           # a split, read out of order
               reshape(b, N * M, 4), reshape(b, N, M * 4),      # merges
               reshape(permute(a, 1, 0), 2, N * 3),             # a split of a transposed view
               reshape(c, 3, N * 2),                            # groups that do not line up
               reshape(permute(b, 1, 0, 2), M * N * 4),         # a merge of a transposed view
               reshape(reshape(c, 1, N * 6, 1), N * 2, 3),      # through unit axes
               Node(Op.SIN, [reshape(Node(Op.SUM_REDUCE, [b], axis=2), N * M)])]
    check(graph([a, b, c], outputs),
          *([values(rng, (n, 6)), values(rng, (n, m, 4)), values(rng, (2, n, 3))]
            for n, m in [(7, 3), (1, 1), (13, 5), (2, 13)]))


def test_expand(rng):
    x, y, z = inp("x", (1, 3)), inp("y", (N, 1, 1)), inp("z", (N, M, 4))
    grown = Node(Op.EXPAND, [Node(Op.EXP2, [y])], shape=shape_of((N, M, 4)))
    outputs = [Node(Op.EXPAND, [x], shape=shape_of((N, 3))), Node(Op.MUL, [grown, z]),
               Node(Op.SUM_REDUCE, [grown], axis=1)]
    check(graph([x, y, z], outputs),
          *([values(rng, (1, 3)), values(rng, (n, 1, 1)), values(rng, (n, m, 4))]
            for n, m in [(7, 3), (1, 13)]))


def test_slice_with_steps(rng):
    x = inp("x", (N, 10))
    every_other_row = slice_(x, 0, 0, N, step=2)
    outputs = [slice_(x, 1, 1, 10, step=3), every_other_row,
               slice_(every_other_row, 1, 2, 9, step=2), slice_(x, 0, N - 1, N)]
    check(graph([x], outputs), *([values(rng, (n, 10))] for n in (1, 2, 7, 13)))


def test_pad(rng):
    x, k = inp("x", (N, 3)), inp("k", (N, M), DType.I32)
    outputs = [pad(x, 0, 2, 3, -math.inf), pad(Node(Op.SQRT, [x]), 1, M, 1, 1.0), pad(k, 1, 0, 2, -1),
               Node(Op.MAX_REDUCE, [pad(x, 1, 1, 0, 0.5)], axis=1)]
    check(graph([x, k], outputs), *([values(rng, (n, 3)), values(rng, (n, m), DType.I32)]
                                    for n, m in [(7, 3), (1, 1), (13, 2)]))


def test_concat_of_three_parts(rng):
    a, b, c = inp("a", (N, 2)), inp("b", (M, 2)), inp("c", (3, 2))
    p, q = inp("p", (2, N), DType.BOOL), inp("q", (2, M), DType.BOOL)
    outputs = [Node(Op.CONCAT, [a, b, c], axis=0),
               Node(Op.CONCAT, [permute(c, 1, 0), permute(a, 1, 0), permute(b, 1, 0)], axis=1),
               Node(Op.CONCAT, [p, q, p], axis=1),
               Node(Op.SUM_REDUCE, [Node(Op.CONCAT, [a, c, b], axis=0)], axis=0)]
    check(graph([a, b, c, p, q], outputs),
          *([values(rng, (n, 2)), values(rng, (m, 2)), values(rng, (3, 2)),
             values(rng, (2, n), DType.BOOL), values(rng, (2, m), DType.BOOL)]
            for n, m in [(7, 3), (1, 1), (13, 5)]))


def test_concat_and_pad_of_empty_parts(rng):
    """A part of length 0 contributes nothing. (Its kernel still loads the part at the clamped
    index, -1, before the select discards it: a read before the buffer, harmless here.)"""
    a, b = inp("a", ("k", 2)), inp("b", (3, 2))
    outputs = [Node(Op.CONCAT, [a, b], axis=0), Node(Op.CONCAT, [b, a, b], axis=0),
               pad(a, 0, 1, 2, 5.0)]
    check(graph([a, b], outputs, {"k": (0, 4)}),
          *([values(rng, (k, 2)), values(rng, (3, 2))] for k in (0, 2)), policies=POLICIES[:1])


def test_gather(rng):
    table, rows, cols = inp("table", (11, M)), inp("rows", (N,), DType.I64), inp("cols", (2, 3), DType.I32)
    outputs = [Node(Op.GATHER, [table, rows], axis=0), Node(Op.GATHER, [table, cols], axis=1),
               Node(Op.GATHER, [Node(Op.EXP2, [table]), rows], axis=0)]
    check(graph([table, rows, cols], outputs),
          *([values(rng, (11, m)), rng.integers(0, 11, n), rng.integers(0, m, (2, 3)).astype(np.int32)]
            for n, m in [(7, 3), (1, 1), (13, 13)]))


def test_gather_clamps_ids_out_of_range(rng):
    """The interpreter refuses an id outside the table; a kernel clamps it into range instead
    (memory stays safe with a bad token id) and must not crash."""
    table, ids = inp("table", (11, 4)), inp("ids", (N,), DType.I64)
    g = graph([table, ids], [Node(Op.GATHER, [table, ids], axis=0)])
    args = [values(rng, (11, 4)), np.array([-5, 0, 10, 11, 100, -2**62, 2**40, 3], np.int64)]
    with pytest.raises(IndexError):
        run(g, args)
    for policy in POLICIES:
        program = schedule(g, policy)
        for configs in config_sets(program, rng):
            got, = Executor(g, program, configs, CpuBackend())(*args)
            np.testing.assert_array_equal(got, np.take(args[0], args[1], axis=0, mode="clip"))


def slice_update_graph(cache_also: str = "") -> Graph:
    """cache[:, pos:pos + n] = new; `cache_also`: "read" by another op, or "returned" as is."""
    cache, new, pos = inp("cache", (2, 16, 4)), inp("new", (2, N, 4)), inp("pos", (), DType.I64)
    also = {"": [], "read": [Node(Op.ADD, [cache, cache])], "returned": [cache]}[cache_also]
    return graph([cache, new, pos], [Node(Op.SLICE_UPDATE, [cache, new, pos], axis=1), *also],
                 {"n": (1, 16)})


def default_executor(g: Graph) -> Executor:
    program = schedule(g)
    return Executor(g, program, [KernelConfig()] * len(program.kernels), CpuBackend())


def slice_update_args(rng, n: int, at: int) -> list[np.ndarray]:
    return [values(rng, (2, 16, 4)), values(rng, (2, n, 4)), np.array(at, np.int64)]


def test_slice_update_writes_an_input_in_place(rng):
    g = slice_update_graph()
    assert schedule(g).aliases, "a cache that nothing else reads is updated in place"
    check(g, *(slice_update_args(rng, n, at) for n, at in [(1, 0), (1, 15), (3, 7), (16, 0), (7, 9)]))
    args = slice_update_args(rng, 3, 5)
    want = args[0].copy()
    want[:, 5:8] = args[1]
    got, = default_executor(g)(*args)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(args[0], want)        # written through to the caller's array


@pytest.mark.parametrize("cache_also", ["read", "returned"])
def test_slice_update_copies_an_input_used_again(rng, cache_also):
    g = slice_update_graph(cache_also)
    assert not schedule(g).aliases
    check(g, *(slice_update_args(rng, n, at) for n, at in [(3, 5), (1, 15), (16, 0)]))
    args = slice_update_args(rng, 3, 5)
    before = args[0].copy()
    default_executor(g)(*args)
    np.testing.assert_array_equal(args[0], before)


def test_slice_update_clamps_a_start_out_of_range(rng):
    """The interpreter refuses a slice that does not fit; a kernel clamps its start instead."""
    for cache_also in ("", "read"):
        g = slice_update_graph(cache_also)
        for at, clamped in [(-3, 0), (14, 13), (2**40, 13)]:
            args = slice_update_args(rng, 3, at)
            with pytest.raises(IndexError):
                run(g, [a.copy() for a in args])
            want = args[0].copy()
            want[:, clamped:clamped + 3] = args[1]
            np.testing.assert_array_equal(default_executor(g)(*args)[0], want)


def test_iota(rng):
    """Iotas of symbolic expressions, floor division and modulo of negative values included
    (the IR's // and % round down, as Python's do; C's round toward zero)."""
    i = sym(IOTA_INDEX)
    exprs = [M + 2 * i, 5 - 3 * i, (3 * i + M) // 2, (i - 5) // 3, (i - 5) % 3, (N - 2 * i) % 4,
             (2 * i - N) // 4, (i - 7) // -2]
    outputs = [Node(Op.IOTA, expr=e, length=N, dtype=d) for e in exprs for d in (DType.I32, DType.I64)]
    x = inp("x", (N, M))
    column = reshape(build.cast(build.iota(N, DType.I64, start=M, step=-2), DType.F32), N, 1)
    outputs += [Node(Op.MUL, [x, Node(Op.EXPAND, [column], shape=(N, M))]), build.scalar_of(N * M)]
    check(graph([x], outputs), *([values(rng, (n, m))] for n, m in [(9, 3), (1, 1), (13, 7)]),
          policies=POLICIES[:1])


def test_mod_matches_fmod_including_division_by_zero():
    """Mod is C's (and numpy's fmod's) truncated remainder. numpy gives 0 for an integer x % 0
    and the kernel guards the division to match; INT_MIN % -1, which traps in C, is 0 too."""
    ints = [7, -7, 7, -7, 0, 5, -5, 2**31 - 1, -2**31, -2**31, -2**31, 13]
    int_divisors = [3, 3, -3, -3, 5, 0, 0, 0, -1, 1, 0, 2**31 - 1]
    floats = [7.5, -7.5, 7.5, 0.0, -0.0, 5.0, math.inf, -math.inf, 1.0, math.nan, 3.0, 1e30]
    float_divisors = [2.0, 2.0, -2.0, 3.0, 3.0, 0.0, 2.0, 1.0, math.inf, 2.0, math.nan, 7.0]
    for dtype in (DType.I32, DType.I64, DType.F32, DType.F16, DType.BF16):
        xs, ys = (floats, float_divisors) if dtype.is_float else (ints, int_divisors)
        x, y = inp("x", (N,), dtype), inp("y", (N,), dtype)
        g = graph([x, y], [Node(Op.MOD, [x, y]), Node(Op.MOD, [x, build.constant(-1, dtype, (N,))]),
                           Node(Op.MOD, [x, build.constant(0, dtype, (N,))])])
        with np.errstate(all="ignore"):
            args = [np.array(xs).astype(dtype.np), np.array(ys).astype(dtype.np)]
            if dtype.is_int:
                assert (run(g, args)[0][np.array(ys) == 0] == 0).all()
        check(g, args, policies=POLICIES[:1])


@pytest.mark.parametrize("dtype", [DType.F16, DType.I32, DType.I64], ids=repr)
def test_arithmetic_in_dtypes_the_generator_lacks(rng, dtype):
    """f16 and i64 (the random programs draw f32, bf16, i32 and bool), and integers that wrap
    around on overflow as numpy's do (signed overflow is undefined in C)."""
    x, y = inp("x", (N, 5), dtype), inp("y", (N, 5), dtype)
    outputs = [Node(op, [x, y]) for op in (Op.ADD, Op.MUL, Op.MOD, Op.LESS_THAN)]
    outputs += [Node(Op.LESS_THAN, [x, Node(Op.ADD, [x, y])]),   # x < x + y: gcc may assume y > 0
                Node(Op.WHERE, [Node(Op.LESS_THAN, [y, x]), x, y]), Node(Op.SUM_REDUCE, [x], axis=1),
                Node(Op.MAX_REDUCE, [Node(Op.MUL, [x, x])], axis=0)]
    if dtype.is_float:
        outputs += [Node(op, [x]) for op in (Op.EXP2, Op.LOG2, Op.SIN, Op.SQRT, Op.RECIP)]
        draw = lambda n: (rng.standard_normal((n, 5)) * 10.0 ** rng.uniform(-2, 4, (n, 5)))
    else:
        top = np.iinfo(dtype.np).max
        draw = lambda n: np.where(rng.random((n, 5)) < 0.5, rng.integers(-top, top, (n, 5)),
                                  rng.integers(-9, 10, (n, 5)))
    with np.errstate(over="ignore"):
        check(graph([x, y], outputs), *([draw(n).astype(dtype.np), draw(n).astype(dtype.np)]
                                        for n in (1, 7)), policies=POLICIES[:1], sets=(0, 1))


def test_max_reduce_propagates_nan_and_keeps_negative_infinity():
    rows = [[math.nan, 1.0, 2.0], [1.0, math.nan, -math.inf], [-math.inf] * 3, [3.0, 2.0, math.nan],
            [-0.0, 0.0, -1.0], [-5.0, -7.0, -6.0], [-math.inf, -1e30, -math.inf]]
    int_rows = [[-5, -7, -6], [-2**31, -2**31, -2**31], [3, -2**31, 2**31 - 1], [0, -1, -2]]
    for dtype, data in [(DType.F32, rows), (DType.F16, rows), (DType.BF16, rows),
                        (DType.I32, int_rows), (DType.I64, int_rows + [[-2**63, -2**63, -2**62]]),
                        (DType.BOOL, [[False] * 3, [False, True, False], [True] * 3])]:
        x = inp("x", (N, 3), dtype)
        g = graph([x], [Node(Op.MAX_REDUCE, [x], axis=1), Node(Op.MAX_REDUCE, [x], axis=0)])
        with np.errstate(over="ignore"):    # -1e30 is -inf in f16
            check(g, [np.array(data).astype(dtype.np)], policies=POLICIES[:1])


@pytest.mark.parametrize("dtype", [DType.F32, DType.BF16, DType.I32, DType.I64, DType.BOOL], ids=repr)
def test_reductions_over_axes_of_size_zero_and_one(rng, dtype):
    """An empty sum is 0 and an empty max the dtype's lowest value (-inf for floats), as the
    interpreter defines them; an axis of one is that element; a reduction to a scalar has no
    loops left."""
    x, one = inp("x", (3, "k", 2), dtype), inp("one", (1,), dtype)
    empty = slice_(x, 2, 1, 1)
    outputs = [Node(op, [t], axis=axis) for op in (Op.SUM_REDUCE, Op.MAX_REDUCE)
               for t, axis in [(x, 1), (empty, 2), (one, 0)]]
    outputs.append(Node(Op.SUM_REDUCE, [Node(Op.SUM_REDUCE, [x], axis=2)], axis=1))
    check(graph([x, one], outputs, {"k": (0, 4)}),
          *([values(rng, (3, k, 2), dtype), values(rng, (1,), dtype)] for k in (0, 1, 3)))


def test_a_freed_slot_is_reused_by_a_wider_dtype():
    """5 bools, then an i32 in the freed slot: the executor views only the bytes it needs."""
    x = inp("x", (5,))
    negative = Node(Op.LESS_THAN, [x, build.constant(0.0, DType.F32, (5,))])
    g = graph([x], [Node(Op.SUM_REDUCE, [build.cast(negative, DType.I32)], axis=0),
                    Node(Op.MAX_REDUCE, [negative], axis=0), build.iota(1, DType.I32, start=7)])
    assert misaligned_slots(schedule(g, POLICIES[1]))
    check(g, [np.array([1, -2, 3, -4, 5], np.float32)], policies=POLICIES[1:2])


# --- a tiny Llama -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_lm():
    from kiln.frontend.hf import lower_causal_lm
    from tests.helpers import tiny_llama
    return lower_causal_lm(tiny_llama(2), 16)


def test_tiny_llama_prefill(tiny_lm, rng):
    args = [[rng.integers(0, 64, (1, t))] for t in (2, 7, 13, 16)]
    check(tiny_lm.prefill, *args, policies=POLICIES[:1], sets=(0, 1))
    check(tiny_lm.prefill, *args, policies=POLICIES[1:2], sets=(2,))


def test_tiny_llama_decode_updates_the_cache_in_place(tiny_lm, rng):
    g = tiny_lm.decode
    caches = [c.shape for c in tiny_lm.cache.zeros()]

    def args(pos: int) -> list[np.ndarray]:
        return decode_args(g, rng.integers(0, 64, (1, 1)), pos,
                           [rng.standard_normal(s).astype(np.float32) for s in caches])
    program = schedule(g)
    assert len(program.aliases) == len(caches)
    check(g, args(0), args(5), args(15), policies=POLICIES[:1], sets=(0, 1))
    check(g, args(0), args(15), policies=POLICIES[1:2], sets=(2,))
    given = args(9)
    want = run(g, [a.copy() for a in given])
    got = default_executor(g)(*given)
    for k in range(len(caches)):
        assert got[1 + k] is given[CACHES_START + k]          # the caller's cache, written through
        assert not mismatch(given[CACHES_START + k], want[1 + k], DType.F32)


def test_epilogues_put_reductions_into_the_kernels_that_read_them(tiny_lm, rng):
    """The epilogue policy runs a reduction inside its one reader's kernel (the norm's sum of
    squares with its reciprocal square root, the V projection with the cache write, the down
    projection with the residual add): fewer kernels, each still equal to the interpreter."""
    plain, fused = FusionPolicy(), FusionPolicy(epilogues=True)
    g = tiny_lm.decode
    caches = [c.shape for c in tiny_lm.cache.zeros()]
    before, after = schedule(g, plain), schedule(g, fused)
    assert len(after.kernels) < len(before.kernels)
    # each reduction still runs once, in a kernel that holds it alone at its points
    from kiln.codegen.cuda_config import point_reductions
    from kiln.codegen.kernel import Reduce
    reductions = sum(isinstance(k.value, Reduce) for k in before.kernels)
    assert [len(point_reductions(k)) for k in after.kernels].count(1) == reductions
    assert all(len(point_reductions(k)) <= 1 for k in after.kernels)
    assert {k.output.name for k in after.kernels} >= set(after.aliases)   # cache writes stay in place

    def args(pos: int) -> list[np.ndarray]:
        return decode_args(g, rng.integers(0, 64, (1, 1)), pos,
                           [rng.standard_normal(s).astype(np.float32) for s in caches])
    check(g, args(0), args(7), args(15), policies=[fused], sets=(0, 1, 2))
    check(tiny_lm.prefill, [rng.integers(0, 64, (1, 5))], [rng.integers(0, 64, (1, 16))],
          policies=[fused], sets=(0, 1))


def test_merged_reductions_run_once_per_point_in_fewer_kernels(tiny_lm, rng):
    """Merging puts the norm's sum of squares into the projections that read it and softmax's max
    and sum into the P.V product, and launches the K and V cache writes as one kernel: fewer
    kernels than epilogues alone, several reductions in one kernel, none repeated inside another's
    loop, each kernel's every output still equal to the interpreter."""
    from kiln.codegen.kernel import split_reductions
    g = tiny_lm.decode
    caches = [c.shape for c in tiny_lm.cache.zeros()]
    epilogues, merged = schedule(g, FusionPolicy(64, 16, epilogues=True)), schedule(g, POLICIES[-1])
    assert len(merged.kernels) < len(epilogues.kernels)
    split = [split_reductions(k.value) for k in merged.kernels]
    assert max(len(once) for once, _ in split) >= 3 and not any(repeated for _, repeated in split)
    assert any(k.also for k in merged.kernels)            # the K and V cache writes as one kernel

    def args(pos: int) -> list[np.ndarray]:
        return decode_args(g, rng.integers(0, 64, (1, 1)), pos,
                           [rng.standard_normal(s).astype(np.float32) for s in caches])
    check(g, args(0), args(9), args(15), policies=POLICIES[-1:], sets=(0, 1, 2))


def test_softmax_merged_into_pv_computes_each_probability_once_per_head_and_position(tiny_lm):
    """In C, softmax's probabilities vary with the head and the position, not with P.V's output
    column: they are computed into an array in the head's loop, and the columns' reduction reads
    it (the test above checks the values against the interpreter)."""
    from kiln.codegen.c_kernel import emit_c
    from kiln.codegen.kernel import KernelConfig
    merged = schedule(tiny_lm.decode, POLICIES[-1])
    pv = next(k for k in merged.kernels if "exp2f" in emit_c(k, KernelConfig(), "k")
              and k.label.startswith("SumReduce") and len(k.loops) >= 2)
    source = emit_c(pv, KernelConfig(), "k")
    fill, columns = source.split("for (int64_t i2 = 0;")[0], source.split("for (int64_t i2 = 0;")[1]
    assert "kiln_row" in fill and fill.count("exp2f") >= 1
    assert "exp2f" not in columns and "kiln_row" in columns


def test_merged_with_rows_softmax_is_a_row_kernel_and_pv_one_splittable_loop(tiny_lm, rng):
    """Merging with rows keeps P.V over decode's window one reduction (a split can share a long
    context among blocks): softmax's max and sum merge into its probabilities, a row kernel, one
    kernel more per layer than the merge alone, every output equal to the interpreter."""
    from kiln.codegen.cuda_config import splittable
    from kiln.codegen.kernel import row_reductions, split_reductions
    g = tiny_lm.decode
    merged, with_rows = schedule(g, POLICIES[-1]), schedule(g, POLICIES[-2])
    assert POLICIES[-2].rows and POLICIES[-2].merges
    window = [k for k in with_rows.kernels if any(not r.extent.is_const for r in split_reductions(k.value)[0])]
    # more than one reduction over the window only in a row kernel: softmax's statistics
    assert window and all(len(split_reductions(k.value)[0]) == 1 or row_reductions(k) for k in window)
    pv = [k for k in window if all(e.is_const for _, e in k.loops)]        # [heads, 1, d]
    assert pv and all(splittable(k) for k in pv)
    assert any(len(row_reductions(k) or ()) >= 2 for k in with_rows.kernels)     # softmax by rows
    assert len(merged.kernels) < len(with_rows.kernels) <= len(merged.kernels) + len(pv)
    caches = [c.shape for c in tiny_lm.cache.zeros()]

    def args(pos: int) -> list[np.ndarray]:
        return decode_args(g, rng.integers(0, 64, (1, 1)), pos,
                           [rng.standard_normal(s).astype(np.float32) for s in caches])
    check(g, args(0), args(9), args(15), policies=POLICIES[-2:-1], sets=(0, 1, 2))


def test_the_once_policy_leaves_out_merges_that_read_a_weight_twice(tiny_lm, rng):
    """The rotary's partner row: the query projection merged into its rotary computes, at each
    point, its own row's product and its partner's, so every row of the weight is read twice, by
    two points (twice the bytes of a memory-bound GEMV). Without rereads those products are
    stored first: no kernel reads more of a weight's selected rows than the weight holds, and
    every output still equals the interpreter."""
    from kiln.codegen.kernel import load_counts
    g = tiny_lm.decode
    merged = FusionPolicy(64, 16, epilogues=True, merges=True)
    once = FusionPolicy(64, 16, epilogues=True, merges=True, rereads=False)

    def reread(program) -> list[str]:
        env = {name: hi for name, (_, hi) in program.symbols.items()}
        return [k.label for k in program.kernels for name, n in load_counts(k, env, point_rows=True).items()
                if program.buffers[name].role == "weight" and n > program.buffers[name].size.evaluate(env)]
    twice, stored = schedule(g, merged), schedule(g, once)
    assert reread(twice) and not reread(stored)
    assert len(stored.kernels) > len(twice.kernels)
    caches = [c.shape for c in tiny_lm.cache.zeros()]

    def args(pos: int) -> list[np.ndarray]:
        return decode_args(g, rng.integers(0, 64, (1, 1)), pos,
                           [rng.standard_normal(s).astype(np.float32) for s in caches])
    check(g, args(0), args(9), args(15), policies=[once], sets=(0, 1, 2))


@pytest.mark.parametrize("policy", [FusionPolicy(rows=True, attention=True),
                                    FusionPolicy(64, 16, epilogues=True, merges=True, rows=True, attention=True)],
                         ids=lambda p: p.key())
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_decode_attention_is_one_fused_kernel_a_layer_equal_to_the_interpreter(rng, policy, dtype):
    """In decode each head has one query: the attention merge takes the scores, softmax and P.V
    of a bf16 model (where q, k and v are rounded, the boundary), or an f32 one (bounded by the
    query's projection and the caches' updates), into one fused kernel a layer (one pass over the
    window, no scores stored), which C runs a head at a time, equal to the interpreter as the
    window grows. 4 query heads over 2: a head's keys are its pair's (with one KV head, its
    queries are the heads' rows)."""
    import torch
    from kiln.codegen.attention import as_attention
    from kiln.frontend.hf import lower_causal_lm
    from tests.helpers import tiny_llama
    lm = lower_causal_lm(tiny_llama(2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2)
                         .to(getattr(torch, dtype)), 16)
    g = lm.decode
    program = schedule(g, policy)
    fused = [as_attention(k) for k in program.kernels if as_attention(k)]
    from kiln.ir.decode import CACHES_START
    caches = [(tuple(d.value for d in n.shape), n.dtype.np) for n in g.inputs[CACHES_START:]]
    assert fused and all(a.query is None and a.batch for a in fused)
    assert len(fused) == len(caches) // 2            # a key cache and a value cache a layer
    without = schedule(g, FusionPolicy(policy.inline_limit, policy.broadcast_limit, policy.epilogues,
                                       policy.merges, policy.rows))
    assert len(program.kernels) < len(without.kernels)
    # as a compile schedules it: a layer alone, its mask an input the prologue computed (an f32
    # layer's scores, read by softmax's kernels and P.V, were a boundary there until 2026-12-05)
    from kiln.ir import regions as regionlib
    from kiln.runtime.compiled import region_graph
    layer = next(r for r in regionlib.split(g) if r.label.startswith("layer"))
    layer_program = schedule(region_graph(g, layer, layer.outputs), policy)
    assert len([k for k in layer_program.kernels if as_attention(k)]) == 1

    def args(pos: int) -> list[np.ndarray]:
        return decode_args(g, rng.integers(0, 64, (1, 1)), pos,
                           [rng.standard_normal(s).astype(dtype) for s, dtype in caches])
    check(g, args(0), args(9), args(15), policies=[policy], sets=(0, 1, 2))


def test_traffic_of_a_gather_counts_the_rows_it_picks_not_the_table():
    from kiln.codegen.kernel import traffic_bytes
    table = Node(Op.INPUT, name="table", role="weight", shape=shape_of((1000, 16)), dtype=DType.F32)
    ids = inp("ids", (3,), DType.I64)
    g = Graph([ids], [Node(Op.GATHER, [table, ids], axis=0)], weights={"table": np.zeros((1000, 16), np.float32)})
    (kernel,) = schedule(g, POLICIES[0]).kernels
    # 3 rows of 16 f32 written, the same 3 rows read, 3 int64 indices read
    assert traffic_bytes(kernel, {}) == 3 * 16 * 4 + 3 * 16 * 4 + 3 * 8


def test_every_elementwise_op_of_the_table_has_its_c():
    """The emitters' per-op code is a table keyed by the op table's ops: an op added to ir/ops.py
    without its C fails here, not in the first model that uses it."""
    from kiln.codegen.c_emit import OP_CODE
    from kiln.ir.ops import ELEMENTWISE
    assert set(OP_CODE) == set(ELEMENTWISE)


def test_the_kernel_ir_walk_visits_each_node_once_after_its_children():
    from kiln.codegen.kernel import Apply, Load, Reduce, nodes, rebuilt, renamed
    x = Load("b0", sym("i") * 4 + sym("k"), DType.F32)
    product = Apply(Op.MUL, (x, x), DType.F32)
    total = Reduce(Op.SUM_REDUCE, "k", Expr.of(4), product, DType.F32)
    value = Apply(Op.ADD, (total, product), DType.F32)
    order = nodes(value)
    assert order == [x, product, total, value]              # shared subtrees once, children first
    assert nodes(value, enter=lambda s: not isinstance(s, Reduce)) == [total, x, product, value]
    assert rebuilt(value, lambda s: s) is value               # nothing changed: the same tree
    moved = renamed(value, {"i": "j", "k": "m"})
    assert moved.args[0].var == "m" and moved.args[0].body.args[0].index == sym("j") * 4 + sym("m")
    assert moved.args[1].args[0].index == sym("j") * 4 + sym("m")     # free here: renamed too
