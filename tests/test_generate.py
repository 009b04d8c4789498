"""Greedy generation through the reference interpreter equals transformers' `generate`."""
from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import kiln
from kiln.frontend import hf

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,"]
NEW_TOKENS = 16


def transformers_greedy(model, prompt: list[int], max_new_tokens: int, eos_token_id=None) -> list[int]:
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=max_new_tokens, eos_token_id=eos_token_id,
                             pad_token_id=eos_token_id if eos_token_id is not None else 0)
    return out[0, len(prompt):].tolist()


@pytest.mark.slow
@pytest.mark.parametrize("prompt", PROMPTS)
def test_smollm2_greedy_matches_transformers(prompt, smollm2, smollm2_lowered):
    model, tokenizer = smollm2
    ids = tokenizer(prompt).input_ids
    eos = model.generation_config.eos_token_id
    expected = transformers_greedy(model, ids, NEW_TOKENS, eos)
    assert len(expected) == NEW_TOKENS, "pick a prompt whose continuation does not end early"
    got = hf.reference_generate(smollm2_lowered, ids, NEW_TOKENS, eos_token_id=eos)
    assert got == expected, f"{tokenizer.decode(got)!r} != {tokenizer.decode(expected)!r}"


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128,
                                         num_hidden_layers=2, num_attention_heads=4,
                                         num_key_value_heads=2, max_position_embeddings=64)).eval()
    return model, hf.lower_causal_lm(model, 16)


@pytest.mark.parametrize("prompt", [[7], [3, 141, 59, 26, 5]])
def test_tiny_llama_greedy_matches_transformers(tiny, prompt):
    model, lm = tiny
    assert hf.reference_generate(lm, prompt, 8) == transformers_greedy(model, prompt, 8)


def test_generation_stops_after_eos(tiny):
    model, lm = tiny
    prompt = [11, 12, 13]
    eos = transformers_greedy(model, prompt, 3)[-1]
    got = hf.reference_generate(lm, prompt, 8, eos_token_id=[eos])
    assert got[-1] == eos and eos not in got[:-1]
    assert got == transformers_greedy(model, prompt, 8, eos_token_id=eos)


def test_generation_refuses_to_overflow_the_cache(tiny):
    _, lm = tiny
    with pytest.raises(kiln.ShapeError, match="holds 16 positions"):
        hf.reference_generate(lm, [1, 2, 3, 4], 14)
    assert len(hf.reference_generate(lm, [1, 2, 3, 4], 13)) <= 13
