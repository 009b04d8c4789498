"""Library kernels: matrix products recognized in the kernel IR and run as one BLAS call, checked
kernel by kernel against the reference interpreter on random shapes (odd sizes, batches,
transposed operands, bf16, symbolic sizes)."""
from __future__ import annotations

import numpy as np
import pytest

from kiln.codegen.kernel import KernelConfig
from kiln.codegen.library import LibraryConfig, as_gemm
from kiln.codegen.policy import FusionPolicy
from kiln.codegen.schedule import schedule
from kiln.ir import DType, Graph, Node, Op
from kiln.ir.build import cast, elementwise, expand, permute, reduce, reshape
from kiln.ir.symbolic import shape_of, sym
from kiln.runtime.cpu import CpuBackend
from kiln.runtime.executor import Executor
from tests.kernel_check import run_problems


def inp(name, shape, dtype=DType.F32, role="input"):
    return Node(Op.INPUT, name=name, role=role, shape=shape_of(shape), dtype=dtype)


def matmul(a: Node, b: Node) -> Node:
    """a[..., m, k] @ b[..., k, n] as the frontend lowers it: broadcast multiply, then a sum."""
    *batch, m, k = a.shape
    n = b.shape[-1]
    full = (*batch, m, k, n)
    prod = elementwise(Op.MUL, expand(reshape(a, (*batch, m, k, 1)), full),
                       expand(reshape(b, (*batch, 1, k, n)), full))
    return reduce(Op.SUM_REDUCE, prod, [-2])


def cases():
    rng = np.random.default_rng(0)

    def weight(name, shape, dtype=DType.F32):
        return inp(name, shape, dtype, "weight"), {name: rng.standard_normal(shape).astype(dtype.np)}
    x = inp("x", (5, 33))
    w, values = weight("w", (7, 33))
    yield "linear", [x], matmul(x, permute(w, (1, 0))), values           # x @ w.T, a Linear
    q, k = inp("q", (3, 4, 16)), inp("k", (3, 9, 16))
    yield "batched-transposed", [q, k], matmul(q, permute(k, (0, 2, 1))), {}   # attention scores
    xb = inp("xb", (1, 40), DType.BF16)
    wb, values = weight("wb", (40, 24), DType.BF16)
    yield "bf16", [xb], matmul(xb, wb), values
    xs = inp("xs", (sym("t"), 12))
    ws, values = weight("ws", (12, 10))
    heads = inp("heads", (3, sym("t"), 8))                                # attention output, per head
    merged = reshape(permute(heads, (1, 0, 2)), (sym("t"), 24))
    wo, wo_values = weight("wo", (5, 24))
    yield "split-reduction", [heads], matmul(merged, permute(wo, (1, 0))), wo_values
    yield "symbolic", [xs], elementwise(Op.ADD, matmul(xs, ws), reduce(Op.SUM_REDUCE, xs, [1], keepdim=True)), \
        values
    # prefill's P.V: f32 softmax weights per query head times bf16 values per key/value head,
    # each shared by two query heads (GQA's expand and reshape: value head h // 2)
    p, v = inp("p", (4, sym("t"), sym("t"))), inp("v", (2, sym("t"), 8), DType.BF16)
    shared = reshape(expand(reshape(v, (2, 1, sym("t"), 8)), (2, 2, sym("t"), 8)), (4, sym("t"), 8))
    yield "gqa-mixed", [p, v], matmul(p, cast(shared, DType.F32)), {}


def policy(name: str) -> FusionPolicy:
    """Every elementwise value stored, so that each product reads plain loads; GQA's widened
    values inlined (stored, they would be a copy per query head, the product no longer shared)."""
    return FusionPolicy(12, 1) if name == "gqa-mixed" else FusionPolicy(4, 0)


@pytest.mark.parametrize("case", list(cases()), ids=lambda c: c[0])
def test_gemm_kernels_run_as_a_library_call_and_equal_the_reference(case):
    name, inputs, out, weights = case
    graph = Graph(inputs, [out], weights=weights, symbols={"t": (1, 16)})
    program = schedule(graph, policy(name))
    backend = CpuBackend()
    gemms = [k for k in program.kernels if as_gemm(k)]
    assert gemms, "the matrix product was not recognized"
    assert all(LibraryConfig() in backend.config_space(k) for k in gemms)
    if name == "split-reduction":    # k = 8 * head + d: the division by 8 became two variables
        assert [len(as_gemm(k).k) for k in gemms] == [2]
    if name == "gqa-mixed":          # head = 2 * kv + h: kv a batch, h rows of the weights only
        (gemm,) = [as_gemm(k) for k in gemms]
        assert (len(gemm.batch), len(gemm.m)) == (1, 2) and (gemm.a.dtype, gemm.b.dtype) == (DType.F32, DType.BF16)
    configs = [LibraryConfig() if as_gemm(k) else KernelConfig() for k in program.kernels]
    executor = Executor(graph, program, configs, backend)
    rng = np.random.default_rng(1)
    for _ in range(2):
        env = {"t": int(rng.integers(1, 17))}
        args = [(rng.standard_normal(tuple(d.evaluate(env) for d in i.shape)) * 2).astype(i.dtype.np)
                for i in inputs]
        problems = run_problems(executor, args)
        assert not problems, problems


def test_a_widened_bf16_activation_is_stored_narrow_so_its_product_is_bf16_by_bf16():
    """The frontend's bf16 Linear: the activation (f32 math) rounded to bf16 and widened back,
    times the widened weight. The schedule stores the bf16 value, not its f32 copy (half the
    bytes), so both operands of the product are bf16 and one cuBLAS call can take it; the
    program still equals the reference."""
    x = inp("x", (5, 32))
    rng = np.random.default_rng(4)
    w, weights = inp("w", (32, 24), DType.BF16, "weight"), {"w": rng.standard_normal((32, 24)).astype(DType.BF16.np)}
    activation = cast(cast(elementwise(Op.MUL, x, x), DType.BF16), DType.F32)
    graph = Graph([x], [matmul(activation, cast(w, DType.F32))], weights=weights)
    program = schedule(graph)
    (gemm,) = [as_gemm(k) for k in program.kernels if as_gemm(k)]
    assert (gemm.a.dtype, gemm.b.dtype) == (DType.BF16, DType.BF16)
    configs = [LibraryConfig() if as_gemm(k) else KernelConfig() for k in program.kernels]
    executor = Executor(graph, program, configs, CpuBackend())
    x_value = rng.standard_normal((5, 32)).astype(np.float32)
    assert not run_problems(executor, [x_value])


def test_a_product_with_more_than_a_multiply_inside_is_not_a_gemm():
    x, w = inp("x", (4, 8)), inp("w", (8, 3), role="weight")
    scaled = elementwise(Op.MUL, x, elementwise(Op.SQRT, x))       # x * sqrt(x), fused into the sum
    graph = Graph([x], [matmul(scaled, w)], weights={"w": np.ones((8, 3), np.float32)})
    program = schedule(graph, FusionPolicy(32, 3))
    assert not any(as_gemm(k) for k in program.kernels)



def _emulate_cublas(call, buffers: dict[str, np.ndarray]) -> None:
    """What cublasGemmStridedBatchedEx computes, column-major as its documentation defines it,
    on flat host arrays, after the gathers: the check of the layouts `plan` derives, without a GPU."""
    for g in call.gathers:
        index = g.offset + sum(np.arange(n).reshape((-1,) + (1,) * (len(g.shape) - 1 - axis)) * stride
                               for axis, (n, stride) in enumerate(zip(g.shape, g.strides)))
        buffers[g.into] = np.broadcast_to(buffers[g.buffer][index], g.shape).reshape(-1).copy()

    def operand(m, rows, cols, batch):
        stored = (cols, rows) if m.transposed else (rows, cols)
        assert m.ld >= max(1, stored[0]), "cuBLAS rejects a leading dimension below the row count"
        i, j = np.meshgrid(np.arange(stored[0]), np.arange(stored[1]), indexing="ij")
        x = buffers[m.buffer][m.offset + batch * m.batch_stride + i + j * m.ld]
        return x.T if m.transposed else x
    for batch in range(call.batch):
        product = operand(call.a, call.rows, call.k, batch) @ operand(call.b, call.k, call.cols, batch)
        c = call.c
        assert not c.transposed and c.ld >= max(1, call.rows)
        i, j = np.meshgrid(np.arange(call.rows), np.arange(call.cols), indexing="ij")
        buffers[c.buffer][c.offset + batch * c.batch_stride + i + j * c.ld] = product


@pytest.mark.parametrize("case", list(cases()), ids=lambda c: c[0])
def test_cublas_call_layouts_compute_the_same_product_as_the_strided_views(case):
    """Each library GEMM's cuBLAS plan (transposes, leading dimensions, batch strides, the
    output written transposed) equals the generic strided-view product on random buffers."""
    from kiln.runtime.cublas import plan
    from kiln.runtime.library import ArrayInterop, LibraryKernel
    name, inputs, out, weights = case
    graph = Graph(inputs, [out], weights=weights, symbols={"t": (1, 16)})
    gemms = [as_gemm(k) for k in schedule(graph, policy(name)).kernels if as_gemm(k)]
    interop = ArrayInterop(np, lambda a, dtype, count: a, lambda a, dtype: a, lambda a, dtype: a)
    rng = np.random.default_rng(3)
    for gemm in gemms:
        for t in (1, 7, 16):
            env = {"t": t}
            call = plan(gemm, env)
            assert call is not None, f"{name}: no cuBLAS layout at t={t}"
            # k = (head, d) with head's stride t * 8 flattens only at t = 1: else it is gathered;
            # bf16 values under f32 weights are always gathered, widened to f32
            assert len(call.gathers) == (name == "split-reduction" and t > 1 or name == "gqa-mixed"), name
            assert all((g.to is DType.F32) == (name == "gqa-mixed") for g in call.gathers)
            names = {gemm.a.buffer, gemm.b.buffer, gemm.out.buffer}
            inputs_ = {n: rng.standard_normal(4096).astype(np.float32) for n in names}
            want = {n: v.copy() for n, v in inputs_.items()}
            LibraryKernel(gemm, interop)(want, env)
            _emulate_cublas(call, inputs_)
            np.testing.assert_allclose(inputs_[gemm.out.buffer], want[gemm.out.buffer], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("ratio", [10.0, 2.0])
def test_a_library_call_far_faster_than_the_default_ends_the_kernels_tuning(tmp_path, ratio):
    """With the default's and the library call's times planted in a real tuning database: where
    the library call took a tenth of the default's time, no other generated configuration is
    compiled or timed; at half, every one is (configurations that render one program, as two
    thread counts where the loops cannot collapse, are timed as one)."""
    from kiln.codegen.policy import POLICIES
    from kiln.compiler.measure import Measurer, kernel_space
    from kiln.search.tunedb import TuneDB
    from tests.test_worker import VARIANT, _region
    region, outputs = _region(plain=True)
    backend, db = CpuBackend(), TuneDB(tmp_path / "tune.sqlite")
    measurer = Measurer(backend, db, "test", region)
    (kernel,) = [k for k in schedule(region.graph(outputs), POLICIES[VARIANT]).kernels if as_gemm(k)]
    rows = [(c, *backend.render(kernel, c)) for c in kernel_space(backend, kernel, False)[:measurer.max_configs]]
    (default, *others), library = rows, next(r for r in rows if isinstance(r[0], LibraryConfig))
    db.record_kernel("test", default[1], default[0].key(), {}, 1e-3, 3)
    db.record_kernel("test", library[1], library[0].key(), {}, 1e-3 / ratio, 3)
    measurer.build(outputs, VARIANT)
    programs: dict[str, list] = {}
    for c, name, _ in others:
        if c != library[0] and name != default[1]:
            programs.setdefault(name, []).append(db.kernel_time("test", name, c.key(), {}))
    timed = [any(t is not None for t in times) for times in programs.values()]
    assert len(timed) >= 3 and all(t != (ratio > 4) for t in timed)


def test_the_cpu_library_product_equals_numpys():
    """The CPU's library product (PyTorch's matmul, runtime/cpu.py) on the operands where they lie:
    batched, transposed and broadcast (a stride of 0) views give numpy's product."""
    from kiln.runtime import cpu
    rng = np.random.default_rng(0)
    a = rng.standard_normal((3, 37, 50)).astype(np.float32)
    shared = rng.standard_normal((50, 9)).astype(np.float32)
    for b in [rng.standard_normal((3, n, 50)).astype(np.float32).transpose(0, 2, 1) for n in (7, 130, 1000)] + [
            np.lib.stride_tricks.as_strided(shared, shape=(3, 50, 9), strides=(0, *shared.strides))]:
        got = cpu._HOST.matmul(a, b)
        assert got.shape == (3, 37, b.shape[-1])
        np.testing.assert_allclose(got, np.matmul(a, b), rtol=1e-5, atol=1e-5)
