"""Next-token choice equals transformers' warpers; the generation loop stops, streams and checks its
input as transformers' `generate` does."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import GenerationConfig

from kiln.ir.errors import KilnError, ShapeError
from kiln.ir.generation import choose_token, generate_tokens, sampling_distribution

from .helpers import tiny_llama

VOCAB = 50


@pytest.fixture(scope="module")
def model():
    return tiny_llama(1)


def transformers_distribution(model, logits: np.ndarray, temperature, top_k, top_p) -> np.ndarray:
    """The warpers `generate` builds for these settings, in its order, then softmax (in float64, so
    that only the algorithm is compared)."""
    config = GenerationConfig(do_sample=True, temperature=temperature, top_k=top_k, top_p=top_p)
    scores = torch.from_numpy(logits)[None]
    for warper in model._get_logits_processor(config):
        scores = warper(torch.zeros((1, 1), dtype=torch.long), scores)
    return torch.softmax(scores, dim=-1)[0].numpy()


SETTINGS = [(1.0, None, None), (0.7, None, None), (1.0, 5, None), (1.0, None, 0.9), (1.3, 10, 0.8),
            (0.5, 3, 0.5), (1.0, 1, None), (2.0, None, 0.01), (1.0, 2 * VOCAB, None), (0.8, None, 1.0),
            (3.0, 20, 0.95)]


@pytest.mark.parametrize("temperature, top_k, top_p", SETTINGS)
def test_distribution_matches_transformers(model, temperature, top_k, top_p):
    rng = np.random.default_rng(0)
    for _ in range(20):
        logits = rng.normal(scale=3.0, size=VOCAB)
        expected = transformers_distribution(model, logits, temperature, top_k, top_p)
        got = sampling_distribution(logits, temperature, top_k, top_p)
        np.testing.assert_array_equal(got > 0, expected > 0)
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-6)


def test_top_k_keeps_every_tie_with_the_kth():
    logits = np.array([3.0, 1.0, 2.0, 2.0, 0.0])
    kept = sampling_distribution(logits, 1.0, 2, None) > 0
    assert kept.tolist() == [True, False, True, True, False]


def test_greedy_is_the_first_argmax():
    logits = np.array([0.0, 5.0, 5.0, 1.0], dtype=np.float32)
    assert choose_token(logits, False, 1.0, None, None, np.random.default_rng()) == 1


def test_sampling_draws_only_kept_tokens():
    logits = np.random.default_rng(1).normal(size=VOCAB)
    allowed = set(np.argsort(logits)[-3:].tolist())
    rng = np.random.default_rng(2)
    drawn = {choose_token(logits, True, 1.0, 3, None, rng) for _ in range(200)}
    assert drawn == allowed


# ---- the generation loop ---------------------------------------------------------------------

class FakeModel:
    """Logits that depend only on the position: row p of a fixed random table. Records calls."""

    def __init__(self, length: int = 32, seed: int = 0):
        self.table = np.random.default_rng(seed).normal(size=(length, VOCAB)).astype(np.float32)
        self.calls: list[tuple] = []

    def prefill(self, ids: np.ndarray) -> np.ndarray:
        assert ids.dtype == np.int64 and ids.shape[0] == 1
        self.calls.append(("prefill", ids.tolist()))
        return self.table[None, :ids.shape[1]]                      # [1, T, vocab]

    def decode(self, token: int, pos: int) -> np.ndarray:
        self.calls.append(("decode", token, pos))
        return self.table[None, pos:pos + 1]                        # [1, 1, vocab]

    def generate(self, prompt, max_new_tokens, max_seq=32, **kwargs) -> list[int]:
        return generate_tokens(self.prefill, self.decode, prompt, max_new_tokens, vocab_size=VOCAB,
                               max_seq=max_seq, **kwargs)


def test_greedy_follows_the_argmax_of_each_position():
    fake = FakeModel()
    prompt = [3, 1, 4]
    got = fake.generate(prompt, 6)
    # the token chosen from position p's logits is fed at position p + 1
    assert got == [int(np.argmax(fake.table[p])) for p in range(2, 8)]
    assert fake.calls[0] == ("prefill", [prompt])
    assert fake.calls[1:] == [("decode", tok, 3 + i) for i, tok in enumerate(got[:-1])]


def test_seeded_sampling_is_deterministic():
    settings = dict(do_sample=True, temperature=1.5, top_k=20, top_p=0.9)
    first = FakeModel().generate([1, 2], 12, seed=7, **settings)
    assert first == FakeModel().generate([1, 2], 12, seed=7, **settings)
    assert first != FakeModel().generate([1, 2], 12, seed=8, **settings)


@pytest.mark.parametrize("as_list", [False, True])
def test_stops_after_the_first_eos(as_list):
    fake = FakeModel()
    greedy = fake.generate([5], 10)
    eos = greedy[3]
    stop_at = greedy.index(eos)
    fake = FakeModel()
    got = fake.generate([5], 10, eos_token_id=[VOCAB - 1, eos] if as_list else eos)
    assert got == greedy[:stop_at + 1]
    assert len(fake.calls) == stop_at + 1  # no decode step after the eos


class RecordingStreamer:
    def __init__(self):
        self.calls: list[tuple] = []

    def put(self, value):
        self.calls.append(("put", value))

    def end(self):
        self.calls.append(("end",))


def test_streamer_gets_the_prompt_then_each_token_then_end():
    streamer = RecordingStreamer()
    got = FakeModel().generate([7, 8, 9], 4, streamer=streamer)
    prompt, *tokens, end = streamer.calls
    assert prompt[1].dtype == torch.long and prompt[1].tolist() == [[7, 8, 9]]
    assert [t[1].shape for t in tokens] == [torch.Size([1])] * 4
    assert all(t[1].dtype == torch.long for t in tokens)
    assert [t[1].item() for t in tokens] == got
    assert end == ("end",)


def test_transformers_text_streamer_accepts_both_puts():
    from transformers import TextStreamer

    class Tokenizer:
        def decode(self, ids, **kwargs):
            return "".join(chr(97 + i % 26) for i in ids)

    FakeModel().generate([1, 2], 3, streamer=TextStreamer(Tokenizer()))


@pytest.mark.parametrize("prompt, new, kwargs, error, words", [
    ([], 4, {}, KilnError, "empty"),
    ([1, 2], 0, {}, KilnError, "max_new_tokens"),
    ([1, VOCAB, -1], 4, {}, KilnError, f"token id {VOCAB} at prompt position 1"),
    ([1, -3], 4, {}, KilnError, "token id -3 at prompt position 1"),
    ([1] * 30, 4, {}, ShapeError, "need 33 cache positions (the last new token is never fed back), "
                                  "but the model's KV cache holds 32 positions: ask for at most 3 new tokens"),
    ([1] * 40, 1, {}, ShapeError, "shorten the prompt to at most 32 tokens"),
    ([1], 4, dict(do_sample=True, temperature=0.0), KilnError, "temperature"),
    ([1], 4, dict(do_sample=True, temperature=-1.0), KilnError, "temperature"),
    ([1], 4, dict(do_sample=True, top_p=0.0), KilnError, "top_p"),
    ([1], 4, dict(do_sample=True, top_p=1.5), KilnError, "top_p"),
    ([1], 4, dict(do_sample=True, top_k=0), KilnError, "top_k"),
])
def test_bad_input(prompt, new, kwargs, error, words):
    fake = FakeModel()
    with pytest.raises(error) as info:
        fake.generate(prompt, new, **kwargs)
    assert words in str(info.value)
    assert fake.calls == []  # refused before running anything


def test_prompt_and_tokens_exactly_filling_the_cache():
    assert len(FakeModel().generate([1] * 29, 4)) == 4  # 29 + 4 - 1 = 32 positions


def test_greedy_ignores_sampling_settings():
    fake = FakeModel()
    assert fake.generate([1], 3, temperature=0.0) == FakeModel().generate([1], 3)
