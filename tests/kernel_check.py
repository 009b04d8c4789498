"""Checking compiled kernels against the reference interpreter: each kernel on its own inputs
(the buffers it read, as the kernels before it computed them), each output of a plain call
against the trace, and the whole graph against `run`, within tolerances that admit what two
correct float implementations differ by and nothing else."""
from __future__ import annotations

import dataclasses
from unittest import mock

import numpy as np

from kiln.codegen.attention import AttentionConfig, as_attention
from kiln.codegen.kernel import KernelConfig, config_space
from kiln.codegen.policy import FusionPolicy
from kiln.codegen.schedule import Program, schedule
from kiln.ir import DType, Graph, Node, Op, evaluate, run
from kiln.ir.dtypes import accumulator
from kiln.ir.ops import OPS, OpSpec
from kiln.ir.printer import format_graph
from kiln.runtime.cpu import CpuBackend
from kiln.runtime.executor import Executor

POLICIES = (FusionPolicy(), FusionPolicy(inline_limit=0, broadcast_limit=0),
            FusionPolicy(inline_limit=10**6, broadcast_limit=10**6, epilogues=True),
            FusionPolicy(epilogues=True), FusionPolicy(rows=True), FusionPolicy(rows=True, attention=True),
            FusionPolicy(64, 16, epilogues=True, merges=True, rows=True),
            FusionPolicy(64, 16, epilogues=True, merges=True))
# a few units in the last place: libm and numpy round transcendentals and sums differently
RTOL = {DType.F32: 1e-4, DType.F16: 2.0 ** -8, DType.BF16: 2.0 ** -6}


def differs(got: np.ndarray, want: np.ndarray, dtype: DType, scale: float = 0.0) -> np.ndarray:
    """Where got is not want: ints and bools exactly; floats NaN where NaN, infinities exact,
    finite values within RTOL of themselves plus RTOL of the larger of the output's scale and
    `scale` (a sum's operands: its rounding error scales with them)."""
    if not dtype.is_float:
        return got != want
    g, w = got.astype(np.float64), want.astype(np.float64)
    finite = np.isfinite(g) & np.isfinite(w)
    scale = max(scale, float(np.abs(w[np.isfinite(w)]).max(initial=0.0)))
    with np.errstate(invalid="ignore"):
        close = np.abs(g - w) <= RTOL[dtype] * (np.abs(w) + scale)
        same = (g == w) | (np.isnan(g) & np.isnan(w))
    return np.where(finite, ~close, ~same)


def mismatch(got: np.ndarray, want: np.ndarray, dtype: DType, scale: float = 0.0,
             bad: np.ndarray | None = None) -> str:
    """Why got is not want, '' when it is (`bad`: where it is not, when the caller knows)."""
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"got {got.dtype}{list(got.shape)}, expected {want.dtype}{list(want.shape)}"
    bad = differs(got, want, dtype, scale) if bad is None else bad
    if not bad.any():
        return ""
    at = tuple(int(i) for i in np.argwhere(bad)[0])
    return (f"{int(bad.sum())} of {bad.size} elements differ, first at {at}: "
            f"{got[at]!r}, expected {want[at]!r}")


def kernel_input(root: Node, buffer_of: dict[int, str]) -> tuple[Node, dict[Node, str]]:
    """root with each other node that has a buffer replaced by an Input (what the kernel
    computing root reads), and the buffer each of those Inputs stands for."""
    new: dict[int, Node] = {}
    reads: dict[Node, str] = {}

    def rebuild(n: Node) -> Node:
        if id(n) not in new:
            if n is not root and id(n) in buffer_of:
                new[id(n)] = Node(Op.INPUT, name=f"buffer {buffer_of[id(n)]}", role="input",
                                  shape=n.shape, dtype=n.dtype)
                reads[new[id(n)]] = buffer_of[id(n)]
            else:
                new[id(n)] = n.replace(inputs=[rebuild(i) for i in n.inputs]) if n.inputs else n
        return new[id(n)]
    return rebuild(root), reads


def references(root: Node, feeds: dict[Node, np.ndarray], env: dict[str, int]
               ) -> tuple[list[np.ndarray], float]:
    """What root may equal, and the scale of a sum's terms. A sum may also equal the plain numpy
    sum of its terms: the interpreter computes a sum of products as a matrix product, whose
    fused multiply-adds neither round bf16 products to bf16 nor overflow on a product beyond
    f32's range (inf - inf among the terms, a finite sum in the matrix product)."""
    with np.errstate(all="ignore"):
        if root.op is not Op.SUM_REDUCE:
            return evaluate([root], feeds, env), 0.0
        want, terms = evaluate([root, root.inputs[0]], feeds, env)
        plain = terms.astype(accumulator(root.dtype).np).sum(root.attrs["axis"])
    finite = terms[np.isfinite(terms)] if root.dtype.is_float else terms[:0]
    return [want, plain.astype(root.dtype.np)], float(np.abs(finite).max(initial=0.0))


def _rounded_once(op: Op) -> OpSpec:
    fn = {Op.EXP2: np.exp2, Op.LOG2: np.log2, Op.SIN: np.sin}[op]

    def evaluate(ctx, x: np.ndarray) -> np.ndarray:
        with np.errstate(all="ignore"):
            return fn(x.astype(np.float64)).astype(np.float32).astype(ctx.dtype.np)
    return dataclasses.replace(OPS[op], evaluate=evaluate)


# numpy's float32 exp2, log2 and sin are an ulp off in one value of five; glibc's are almost
# always the double-precision value rounded once. Where a kernel differs from the interpreter,
# it may agree with the interpreter computing these in double precision instead (a comparison
# of log2(exp2(x)) with x, say, can go either way).
ROUNDED_ONCE = {op: _rounded_once(op) for op in (Op.EXP2, Op.LOG2, Op.SIN)}


def kernel_problems(program: Program, values: dict[str, np.ndarray], env: dict[str, int]
                    ) -> list[str]:
    """Each kernel's output (in `values`, with the inputs and weights) against the interpreter
    run on the buffers that kernel read."""
    buffer_of = {id(n): name for name, n in program.nodes.items()}
    problems = []
    for name, kernel in ((out.name, k) for k in program.kernels for out in k.outputs):
        root, reads = kernel_input(program.nodes[name], buffer_of)
        feeds = {n: values[buffer] for n, buffer in reads.items()}
        got = values[name]
        (want, *others), scale = references(root, feeds, env)
        bad = None
        if got.shape == want.shape and got.dtype == want.dtype:
            bad = differs(got, want, root.dtype, scale)
            for other in others:
                bad &= differs(got, other, root.dtype, scale)
            if bad.any():
                with mock.patch.dict(OPS, ROUNDED_ONCE):
                    for other in references(root, feeds, env)[0]:
                        bad &= differs(got, other, root.dtype, scale)
        why = mismatch(got, want, root.dtype, scale, bad)
        if why:
            problems.append(f"kernel {name} ({kernel.label}): {why}")
    return problems


def run_problems(ex: Executor, args: list[np.ndarray], whole: bool = True) -> list[str]:
    """Every kernel (traced) against the interpreter on its own inputs; every output of a plain
    call equal to the traced kernel's; and, where `whole`, every output against the interpreter
    run on the graph (float errors compound through a graph, sin(1 / exp2(x)) for one, so
    random programs ask for that only on inputs of small exact values)."""
    graph, program = ex.graph, ex.program
    env = graph.bind_symbols([a.shape for a in args], [a.dtype for a in args])
    traced = ex.trace(*[a.copy() for a in args])
    values = {**traced, **dict(zip(program.inputs, args)),
              **{b: ex.weights[w] for b, w in program.weights.items()}}
    problems = kernel_problems(program, values, env)
    got = ex.host_outputs(*[a.copy() for a in args])
    for i, (g, name) in enumerate(zip(got, program.outputs)):
        if name in traced and g.tobytes() != traced[name].tobytes():
            problems.append(f"output {i}: a plain call and a trace differ")
    if whole:
        with np.errstate(all="ignore"):
            want = run(graph, [a.copy() for a in args])
        for i, (g, w, node) in enumerate(zip(got, want, graph.outputs)):
            bad = None
            if g.shape == w.shape and g.dtype == w.dtype:
                bad = differs(g, w, node.dtype)
                if bad.any():
                    with mock.patch.dict(OPS, ROUNDED_ONCE), np.errstate(all="ignore"):
                        bad &= differs(g, run(graph, [a.copy() for a in args])[i], node.dtype)
            why = mismatch(g, w, node.dtype, bad=bad)
            if why:
                problems.append(f"output {i}: {why}")
    return problems


def report(ex: Executor, args: list[np.ndarray], problems: list[str]) -> str:
    """The problems, the graph, the inputs' shapes, the configs and the kernels at fault."""
    named = [src for (_, src), k in zip(ex.sources, ex.program.kernels)
             if any(p.startswith(f"kernel {k.output.name} ") for p in problems)]
    shapes = ", ".join(f"{a.dtype}{list(a.shape)}" for a in args)
    return "\n".join([*problems[:5], format_graph(ex.graph, max_lines=60),
                      f"on {shapes} with configs {ex.configs}",
                      *(named or [src for _, src in ex.sources][:6])])


def config_sets(program: Program, rng: np.random.Generator) -> list[list[KernelConfig]]:
    """Every kernel at the default config; each at a random one of its space; each at the last
    (its last loop outermost, the most loops parallel, a reduction unrolled without simd). Fused
    attention's kernels run as fused attention in all three."""
    spaces = [[AttentionConfig()] if as_attention(k) else config_space(k) for k in program.kernels]
    return [[CpuBackend.default_config(k) for k in program.kernels],
            [s[int(rng.integers(len(s)))] for s in spaces],
            [s[-1] for s in spaces]]


def check(graph: Graph, *arg_sets: list[np.ndarray], policies=POLICIES, sets=(0, 1, 2),
          backend=CpuBackend) -> None:
    """Under each policy and each of the config sets (`config_sets` indices), every kernel and
    every output equal to the interpreter's."""
    rng = np.random.default_rng(1)
    for policy in policies:
        program = schedule(graph, policy)
        for k, configs in enumerate(config_sets(program, rng)):
            if k in sets:
                ex = Executor(graph, program, configs, backend())
                for args in arg_sets:
                    problems = run_problems(ex, args)
                    assert not problems, report(ex, args, problems)
