"""codegen/pairs.py: a thread group takes a point and its rotary partner, so the query
projection and the key projection with its cache write read each weight row once. Without a GPU
the source runs on the CPU through tests/cuda_on_cpu.py's shim; with one, test_cuda.py's
every-configuration test runs these configurations against the interpreter."""
from __future__ import annotations

import shutil
from dataclasses import replace

import numpy as np
import pytest

from kiln.codegen.c_emit import STORAGE
from kiln.codegen.cuda_config import config_space
from kiln.codegen.cuda_emit import emit_cuda
from kiln.codegen.pairs import pairable, paired
from kiln.codegen.policy import POLICIES
from kiln.codegen.schedule import schedule
from kiln.ir import DType, evaluate
from kiln.ir.compare import mismatch, tolerance
from kiln.ir.decode import CACHES_START, decode_args
from tests.test_cuda import tiny_case

torch = pytest.importorskip("torch")

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed here")


@pytest.fixture(scope="module")
def decode_case():
    """The tiny bf16 Llama's decode step under the merge policy (rotary merged into the query
    projection and into the key projection's cache write), on random caches at position 5."""
    _, lm = tiny_case("tiny1_bf16")
    graph = lm.decode
    program = schedule(graph, POLICIES["inline64-bcast16-epilogue-merge"])
    rng = np.random.default_rng(3)
    caches = [(rng.standard_normal(tuple(int(d.value) for d in n.shape)) * 0.5).astype(n.dtype.np)
              for n in graph.inputs[CACHES_START:]]
    args = decode_args(graph, np.array([[11]]), 5, caches)
    return graph, program, args


def _pairable_kernels(program):
    return [k for k in program.kernels if pairable(k)]


def test_the_rotary_projections_pair_and_nothing_else_does(decode_case):
    """The query projection and the key and value projection with the cache writes read a sum at
    a partner point; no other kernel does. Paired, each runs over half its last loop, each write
    gains its partner's copy, and the pair forms come first among the configurations."""
    _, program, _ = decode_case
    kernels = _pairable_kernels(program)
    assert len(kernels) == len({k.label for k in kernels}) >= 2
    assert any(len(k.writes) == 2 for k in kernels)        # the K and V cache writes, one kernel
    for kernel in kernels:
        half, writes = paired(kernel)
        assert half.loops[-1][1].value * 2 == kernel.loops[-1][1].value
        assert len(writes) == 2 * len(kernel.writes)
        configs = config_space(kernel)
        assert configs[0].pair and any(not c.pair for c in configs)
    for kernel in program.kernels:
        if kernel not in kernels:
            assert not any(getattr(c, "pair", False) for c in config_space(kernel))
            with pytest.raises(ValueError, match="partner"):
                paired(kernel)


def test_a_pair_reads_each_of_its_rows_once(decode_case):
    """A pair form loads, a step of its one loop, the rows the unpaired form loads (the input,
    a point's projection row and its partner's) and for a kernel that also projects values
    without a rotary (the V cache write) the partner's value row besides: no row twice."""
    _, program, _ = decode_case
    for kernel in _pairable_kernels(program):
        config = next(c for c in config_space(kernel) if c.pair and c.vector > 1)
        source, unpaired = (emit_cuda(kernel, replace(config, pair=p), "k") for p in (True, False))
        assert source.count("for (int64_t kiln_base") == unpaired.count("for (int64_t kiln_base")
        loads = [text.count("kiln_bf16x8(") + text.count("kiln_bf16x8_stream(") for text in (source, unpaired)]
        assert loads[0] == loads[1] + len(kernel.writes) - 1


def _run_on_cpu(kernel, config, arrays, outputs, symbols, tmp_path, name):
    from tests.cuda_on_cpu import build, launch
    types = [f"{STORAGE[b.dtype]}*" for b in (*kernel.outputs, *kernel.inputs)] + ["const int64_t*"]
    library = build(emit_cuda(kernel, config, name), name, types, tmp_path)
    points = int(np.prod([e.value for _, e in kernel.loops])) // (2 if config.pair else 1)
    launch(library, [*outputs, *arrays, symbols], -(-points * config.group // config.block), config.block)


def _bits(value, dtype: DType) -> np.ndarray:
    value = np.ascontiguousarray(np.asarray(value).astype(dtype.np)).reshape(-1)
    return value.view(np.uint16) if dtype is DType.BF16 else value


@needs_gxx
@pytest.mark.parametrize("form", ["block128-group128-vector8-pair", "block256-group32-vector8-stage-pair"])
def test_paired_rotary_projections_run_on_the_cpu_as_unpaired_ones_do(decode_case, tmp_path, form):
    """Each pairable kernel, its pair form and the same form unpaired run on the same inputs (the
    interpreter's values at a decode step) into outputs filled with NaN: the same bits come out,
    written at the same places; the query projection's equal the interpreter's value."""
    graph, program, args = decode_case
    env = graph.bind_symbols([np.shape(a) for a in args], [np.asarray(a).dtype for a in args])
    feeds = {**dict(zip(graph.inputs, args)), **{n: graph.weights[n.attrs["name"]] for n in graph.weight_nodes()}}
    for kernel in _pairable_kernels(program):
        config = next(c for c in config_space(kernel) if c.key() == form)
        values = evaluate([program.nodes[b.name] for b in kernel.inputs], feeds, env)
        arrays = [_bits(v, b.dtype) for v, b in zip(values, kernel.inputs)]
        symbols = np.array([env[s] for s in kernel.symbols] or [0], np.int64)
        results = []
        for pair in (True, False):
            outputs = [np.full(b.size.evaluate(env), np.nan, np.float32).astype(b.dtype.np) for b in kernel.outputs]
            outputs = [_bits(o, b.dtype).copy() for o, b in zip(outputs, kernel.outputs)]
            _run_on_cpu(kernel, replace(config, pair=pair), arrays, outputs, symbols, tmp_path,
                        f"k{'pair' if pair else 'plain'}{abs(hash(kernel.label)) % 10 ** 6}")
            results.append(outputs)
        for got, want in zip(*results):
            assert np.array_equal(got, want)
        if len(kernel.writes) == 1:
            (want,) = evaluate([program.nodes[kernel.output.name]], feeds, env)
            got = results[0][0]
            if kernel.output.dtype is DType.BF16:
                got = (got.astype(np.uint32) << 16).view(np.float32)
            problem = mismatch(got.reshape(np.shape(want)), np.asarray(want, np.float32),
                               tolerance([np.dtype(kernel.output.dtype.np)]))
            assert not problem, problem


class _Rotated(torch.nn.Module):
    """A projection plus its rows moved: rotate_half's way (the halves swapped, one negated: an
    involution pairing them) or rolled by one (not an involution)."""
    def __init__(self, how: str):
        super().__init__()
        self.how = how
        self.w, self.c, self.s = (torch.nn.Parameter(torch.randn(*shape)) for shape in ((64, 32), (64,), (64,)))

    def forward(self, x):
        y = x @ self.w.T
        moved = torch.roll(y, 1, -1) if self.how == "roll" else torch.cat([-y[..., 32:], y[..., :32]], -1)
        return y * self.c + moved * self.s


def _rotated_kernel(how: str):
    from kiln.frontend.lower import lower
    graph = lower(_Rotated(how), (torch.randn(1, 32),))
    program = schedule(graph, POLICIES["inline64-bcast16-epilogue-merge"])
    (kernel,) = program.kernels
    return graph, program, kernel


def test_rows_rolled_by_one_do_not_pair():
    """A point reading the sum of the row before its own reads a partner, but the partner of
    that partner is not the point: there is no pair to take."""
    _, _, kernel = _rotated_kernel("roll")
    assert not pairable(kernel)
    assert not any(c.pair for c in config_space(kernel))


@needs_gxx
def test_a_rotate_half_of_a_small_projection_runs_paired_on_the_cpu_as_the_interpreter_does(tmp_path):
    """Every pair form of the kernel, on the CPU shim, against the interpreter's output."""
    graph, program, kernel = _rotated_kernel("half")
    assert pairable(kernel)
    x = np.random.default_rng(5).standard_normal((1, 32)).astype(np.float32)
    feeds = {graph.inputs[0]: x, **{n: graph.weights[n.attrs["name"]] for n in graph.weight_nodes()}}
    (want,) = evaluate(graph.outputs, feeds, {})
    values = evaluate([program.nodes[b.name] for b in kernel.inputs], feeds, {})
    arrays = [np.ascontiguousarray(v, np.float32).reshape(-1) for v in values]
    for config in (c for c in config_space(kernel) if c.pair):
        out = np.full(64, np.nan, np.float32)
        _run_on_cpu(kernel, config, arrays, [out], np.zeros(1, np.int64), tmp_path, f"half{config.key().replace('-', '_')}")
        problem = mismatch(out.reshape(np.shape(want)), np.asarray(want, np.float32), tolerance([np.dtype(np.float32)]))
        assert not problem, (config.key(), problem)
