"""Fused attention (codegen/attention.py): the scheduler's attention merge makes softmax(QKᵀ)V of a
lowered model one kernel, recognized and run as one online-softmax pass over the keys; the C pass
here, the tensor-core one compiled by nvcc here and checked on the GPU in test_cuda.py."""
from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest
import torch

from kiln.codegen.attention import KEY, AttentionConfig, as_attention
from kiln.codegen.kernel import IndexValue, Load, nodes
from kiln.codegen.cuda_attention import attention_space, emit_cuda_attention
from kiln.codegen.cuda_emit import PRELUDE
from kiln.codegen.policy import POLICIES
from kiln.codegen.schedule import schedule
from kiln.frontend.hf import lower_causal_lm
from kiln.frontend.lower import lower
from kiln.ir.tensors import to_numpy
from kiln.ir import DType, evaluate, run
from kiln.ir.compare import mismatch, tolerance
from kiln.ir.last_position import last_position, prompt_args
from kiln.runtime.cpu import CpuBackend
from kiln.runtime.executor import Executor

from .helpers import tiny_llama

ATTENTION = "inline12-bcast1-rows-attention"


class Sdpa(torch.nn.Module):
    def __init__(self, causal: bool, scale: float | None, gqa: bool):
        super().__init__()
        self.causal, self.scale, self.gqa = causal, scale, gqa

    def forward(self, q, k, v, mask=None):
        return torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=self.causal, scale=self.scale, enable_gqa=self.gqa)


def sdpa_case(seed: int):
    """A random attention: bf16 or f16; 1-2 key/value heads shared by 1-4 query heads each; head
    dimension 16, 32 or 64; 2-90 queries against 1-90 keys; no mask, causal, a boolean mask or an
    additive one; the default scale or another."""
    rng = np.random.default_rng(seed)
    dtype = (torch.bfloat16, torch.float16)[seed % 2]
    kind = ("none", "causal", "bool", "float")[seed // 2 % 4]
    kv = int(rng.choice([1, 2]))
    heads, depth = kv * int(rng.choice([1, 2, 4])), int(rng.choice([16, 32, 64]))
    queries, keys = int(rng.integers(2, 91)), int(rng.integers(1, 91))
    if kind == "causal":
        keys = queries
    gen = torch.Generator().manual_seed(seed)
    args = tuple(torch.randn(1, h, n, depth, generator=gen).to(dtype)
                 for h, n in ((heads, queries), (kv, keys), (kv, keys)))
    if kind == "bool":
        args += (torch.rand(queries, keys, generator=gen) > 0.3,)
    if kind == "float":
        args += (torch.randn(queries, keys, generator=gen).to(dtype),)
    scale = float(rng.uniform(0.05, 0.5)) if seed % 3 == 0 else None
    return Sdpa(kind == "causal", scale, heads != kv), args


@pytest.fixture(scope="module")
def heads64():
    """A bf16 Llama of two layers with 64-wide heads, 4 query heads sharing 2 key/value heads."""
    model = tiny_llama(2, seed=5, hidden_size=256, num_attention_heads=4, num_key_value_heads=2)
    return lower_causal_lm(model.to(torch.bfloat16), 96)


def test_the_attention_policy_runs_each_layers_attention_as_one_kernel(heads64):
    program = schedule(heads64.prefill, POLICIES[ATTENTION])
    fused = [k for k in program.kernels if as_attention(k)]
    assert len(fused) == 2
    plain = schedule(heads64.prefill, POLICIES["inline12-bcast1-rows"])
    assert len(program.kernels) < len(plain.kernels)
    for kernel in fused:
        a = as_attention(kernel)
        assert (a.depth, a.dtype, a.cast) == (64, DType.BF16, DType.BF16)
        assert a.q.scale * a.k.scale == pytest.approx(64 ** -0.5)
        assert a.guards                         # sdpa's fully-masked-row guard, kept
        assert a.masked_part is not None        # the mask, added to the scores: tiles can be skipped
        # the causal mask computed from the query's and the key's positions, never read
        assert not [s for s in nodes(a.masked_part) if isinstance(s, Load)]
        assert {str(s.expr) for s in nodes(a.masked_part) if isinstance(s, IndexValue)} == {KEY, a.query}
        # it reads 16-bit queries, keys and values, and writes [position, head, d]
        assert len(kernel.inputs) == 3
        assert {a.q.load.buffer, a.k.load.buffer, a.v.buffer} == {b.name for b in kernel.inputs}
        assert [str(e) for _, e in kernel.loops] == ["seq", "4", "64"]
    # no buffer holds scores, probabilities or the mask any more: nothing [.., seq, seq]
    assert not any([str(d) for d in b.shape[-2:]] == ["seq", "seq"] for b in program.buffers.values())


@pytest.mark.parametrize("length,pad", [(5, False), (70, True)])
def test_fused_attention_in_c_equals_the_interpreter(heads64, length, pad):
    """Every kernel of the prefill under the attention policy, the fused one as the C pass, against
    the interpreter's value of the node it holds; padded, the padding's rows are fully masked (the
    guard's zeros)."""
    graph = last_position(heads64.prefill, at_length=True)
    program = schedule(graph, POLICIES[ATTENTION])
    args = prompt_args(graph, np.random.default_rng(length).integers(0, 64, (1, length)), pad=pad)
    feeds = {**dict(zip(graph.inputs, args)), **{n: graph.weights[n.attrs["name"]] for n in graph.weight_nodes()}}
    names = [k.output.name for k in program.kernels]
    env = graph.bind_symbols([np.shape(a) for a in args], [np.asarray(a).dtype for a in args])
    want = dict(zip(names, evaluate([program.nodes[n] for n in names], feeds, env)))
    backend = CpuBackend()
    configs = [backend.default_config(k) for k in program.kernels]
    # the last layer computes its last position's row only: one query a head, decode's form
    fused = [as_attention(k) for k in program.kernels if as_attention(k)]
    assert sum(isinstance(c, AttentionConfig) for c in configs) == len(fused) == 2
    assert fused[0].query is not None and fused[1].query is None
    assert args[0].shape[1] > length or not pad
    got = Executor(graph, program, configs, backend, reuse=False).trace(*[np.copy(a) for a in args])
    rtol = tolerance([np.dtype(DType.BF16.np)])
    for kernel, name in zip(program.kernels, names):
        assert np.isfinite(got[name]).all() or not as_attention(kernel)
        assert not mismatch(got[name], want[name], rtol), kernel.label


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed here")
def test_bf16_and_f16_attention_compile_in_one_unit_each_with_its_own_helpers(heads64, tmp_path):
    """The runtime compiles several kernels to a unit (runtime/cache.py: units): the attention
    helpers that depend on the element type are named after it, so that a unit holding both
    compiles, and each kernel gets its own type's."""
    model = tiny_llama(2, seed=5, hidden_size=256, num_attention_heads=4, num_key_value_heads=2)
    f16 = lower_causal_lm(model.to(torch.float16), 96)
    sources = []
    for i, lowered in enumerate((heads64, f16)):
        kernel = next(k for k in schedule(lowered.prefill, POLICIES[ATTENTION]).kernels if as_attention(k))
        sources.append(emit_cuda_attention(as_attention(kernel), attention_space(kernel)[0], f"attention{i}"))
    ptx = _nvcc_ptx("\n".join(sources), tmp_path)
    for dtype in ("bf16", "f16"):
        assert f"mma.sync.aligned.m16n8k16.row.col.f32.{dtype}.{dtype}.f32" in ptx
        assert f"cvt.rn.{dtype}x2.f32" in ptx


def test_a_float32_model_keeps_its_prefill_attention_as_lowered():
    """The tensor-core pass takes 16-bit operands: an f32 model's prefill attention is not merged
    (its decode's is: test_codegen_c.py)."""
    model = tiny_llama(1, seed=2, hidden_size=128, num_attention_heads=4, num_key_value_heads=2)
    graph = lower_causal_lm(model, 32).prefill
    program = schedule(graph, POLICIES[ATTENTION])
    assert not any(as_attention(k) for k in program.kernels)
    assert len(program.kernels) == len(schedule(graph, POLICIES["inline12-bcast1-rows"]).kernels)


def _nvcc_ptx(source: str, folder) -> str:
    unit = folder / "attention.cu"
    unit.write_text(PRELUDE + source)
    result = subprocess.run(["nvcc", "-arch=sm_90", "--ptx", str(unit), "-o", str(folder / "a.ptx")],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    return (folder / "a.ptx").read_text()


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed here")
def test_every_tiling_of_fused_attention_compiles_to_tensor_core_code(heads64, tmp_path):
    program = schedule(heads64.prefill, POLICIES[ATTENTION])
    kernel = next(k for k in program.kernels if as_attention(k))
    for config in attention_space(kernel):
        ptx = _nvcc_ptx(emit_cuda_attention(as_attention(kernel), config, "attention"), tmp_path)
        assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in ptx
        assert "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16" in ptx


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed here")
@pytest.mark.parametrize("seed", range(8))
def test_fused_attention_of_each_type_and_mask_compiles(seed, tmp_path):
    """The random attentions' first eight cover bf16 and f16 under each kind of mask."""
    kernel = schedule(lower(*sdpa_case(seed)), POLICIES[ATTENTION]).kernels[-1]
    attention = as_attention(kernel)
    ptx = _nvcc_ptx(emit_cuda_attention(attention, attention_space(kernel)[0], "attention"), tmp_path)
    assert f"mma.sync.aligned.m16n8k16.row.col.f32.{attention.dtype.value}.{attention.dtype.value}.f32" in ptx


@pytest.mark.parametrize("seed", range(16))
def test_fused_attention_of_random_sdpa_equals_the_interpreter_and_pytorch(seed):
    """Fuzzing the recognizer and the pass: every random scaled_dot_product_attention with more
    than one query is one fused kernel, and its C pass equals the interpreter within the 16-bit
    type's tolerance, and PyTorch's eager attention within 2e-2."""
    assert_fused_c_pass_is_right(*sdpa_case(seed))


def assert_fused_c_pass_is_right(module, args):
    graph = lower(module, args)
    program = schedule(graph, POLICIES[ATTENTION])
    assert as_attention(program.kernels[-1])
    inputs = [to_numpy(a) for a in args]
    backend = CpuBackend()
    configs = [backend.default_config(k) for k in program.kernels]
    got = Executor(graph, program, configs, backend).host_outputs(*inputs)[0]
    assert not mismatch(got, run(graph, inputs)[0], tolerance([inputs[0].dtype]))
    np.testing.assert_allclose(np.asarray(got, np.float32), module(*args).float().numpy(),
                               rtol=2e-2, atol=2e-2)


def far_mask_case(loud: bool):
    """160 queries against 160 keys under a finite causal mask (hidden places -1000 here, bf16's
    lowest in a Llama): the tensor-core pass skips the tiles that cannot matter. Loud: one late
    key's product with every query is so large that it outweighs its -1000 for earlier queries,
    and dominates their output: a tile that looks hidden by its mask alone is not."""
    gen = torch.Generator().manual_seed(11)
    q, k, v = (torch.randn(1, 2, 160, 64, generator=gen) for _ in range(3))
    if loud:
        q, k[:, :, 150] = q.abs(), 400.0
    mask = torch.zeros(160, 160).masked_fill(torch.ones(160, 160, dtype=torch.bool).triu(1), -1000.0)
    return Sdpa(False, None, False), tuple(t.to(torch.bfloat16) for t in (q, k, v, mask))


@pytest.mark.parametrize("loud", [False, True], ids=["quiet", "loud"])
def test_fused_attention_under_a_finite_mask_equals_the_interpreter_and_pytorch(loud):
    module, args = far_mask_case(loud)
    if loud:   # the trap is set: the late key carries the early rows
        out = module(*args).float()
        assert torch.allclose(out[0, :, :100], args[2][0, :, 150:151].float().expand(2, 100, 64), atol=2e-2)
    assert_fused_c_pass_is_right(module, args)


class NormalizedAfter(torch.nn.Module):
    """Attention normalized after the product, as flash attention orders it (and as the rule
    softmax-normalize-after-pv rewrites the lowered softmax): (Σ_j e_j v_j) / Σ_j e_j."""

    def forward(self, q, k, v, mask):
        s = (q.float() @ k.float().transpose(-1, -2)) * 0.125 + mask
        e = torch.exp(s - s.amax(-1, keepdim=True))
        return ((e @ v.float()) / e.sum(-1, keepdim=True)).to(q.dtype)


def normalized_after_case():
    gen = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(1, 2, 40, 64, generator=gen).to(torch.bfloat16) for _ in range(3))
    return NormalizedAfter(), (q, k, v, torch.triu(torch.full((40, 40), float("-inf")), 1))


def test_attention_normalized_after_the_product_is_one_fused_kernel_too():
    assert_fused_c_pass_is_right(*normalized_after_case())
