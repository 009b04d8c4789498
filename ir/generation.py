"""Choosing the next token with transformers' semantics, in numpy, and the one generation loop
around a caller's prefill and decode steps: a compiled model's (runtime/model.py) and the
reference interpreter's (frontend/hf.py).

Sampling follows `GenerationMixin._get_logits_processor` (transformers 5.24): temperature, then
top-k, then top-p, each as its warper does it; the survivors' softmax, in float64, is sampled.
Unlike transformers, nothing here defaults from a model's generation_config: the caller decides.
"""
from __future__ import annotations

from typing import Callable

import sys

import numpy as np

from .errors import KilnError, ShapeError

PrefillStep = Callable[[np.ndarray], np.ndarray]  # ids [1, T] int64 -> logits [1, T, vocab]
DecodeStep = Callable[[int, int], np.ndarray]     # (token, position) -> logits [1, 1, vocab]


def check_sampling(temperature: float, top_k: int | None, top_p: float | None) -> None:
    if not temperature > 0:  # NaN fails too
        raise KilnError(f"kiln: temperature must be > 0 when sampling, got {temperature} "
                        "(for greedy decoding, do not sample)")
    if top_k is not None and top_k < 1:
        raise KilnError(f"kiln: top_k must be at least 1, got {top_k}")
    if top_p is not None and not 0 < top_p <= 1:
        raise KilnError(f"kiln: top_p must be in (0, 1], got {top_p}")


def sampling_distribution(logits: np.ndarray, temperature: float, top_k: int | None,
                          top_p: float | None) -> np.ndarray:
    """The probabilities sampling draws from: [vocab] float64, zero for every filtered token."""
    scores = np.asarray(logits, dtype=np.float64) / temperature
    if top_k is not None:
        # TopKLogitsWarper: drop scores below the k-th largest, so ties with it all stay
        k = min(top_k, scores.size)
        kth = np.partition(scores, -k)[-k]
        scores = np.where(scores < kth, -np.inf, scores)
    if top_p is not None and top_p < 1:  # transformers adds no top-p warper at 1.0
        # TopPLogitsWarper: in ascending order, drop tokens whose cumulative probability is
        # <= 1 - top_p; the most likely token always stays
        ascending = np.argsort(scores, kind="stable")
        cumulative = np.cumsum(_softmax(scores[ascending]))
        drop = cumulative <= 1 - top_p
        drop[-1] = False
        scores[ascending[drop]] = -np.inf
    return _softmax(scores)


def _softmax(scores: np.ndarray) -> np.ndarray:
    e = np.exp(scores - scores.max())
    return e / e.sum()


def choose_token(logits: np.ndarray, do_sample: bool, temperature: float, top_k: int | None,
                 top_p: float | None, rng: np.random.Generator) -> int:
    """The next token from logits [vocab]: argmax (the first on ties, as torch.argmax) or a draw."""
    if not do_sample:
        return int(np.argmax(logits))
    check_sampling(temperature, top_k, top_p)
    probs = sampling_distribution(logits, temperature, top_k, top_p)
    return int(rng.choice(probs.size, p=probs))


def generate_tokens(step_prefill: PrefillStep, step_decode: DecodeStep, input_ids: list[int],
                    max_new_tokens: int, *, vocab_size: int, max_seq: int, do_sample: bool = False,
                    temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
                    seed: int | None = None, eos_token_id: int | list[int] | None = None,
                    streamer=None) -> list[int]:
    """The new tokens only, stopping after the first end-of-sequence token (which is included, as
    transformers does). `streamer` gets transformers' calls: put(prompt [1, T]), put(token [1])
    for each new token, end()."""
    _check_prompt(input_ids, max_new_tokens, vocab_size, max_seq)
    if do_sample:
        check_sampling(temperature, top_k, top_p)
    stop = {eos_token_id} if isinstance(eos_token_id, int) else set(eos_token_id or ())
    rng = np.random.default_rng(seed)
    if streamer is not None:
        streamer.put(_streamed([input_ids]))
    logits = step_prefill(np.array([input_ids], dtype=np.int64))[0, -1]             # [vocab]
    pos, new = len(input_ids), []
    while True:
        token = choose_token(logits, do_sample, temperature, top_k, top_p, rng)
        new.append(token)
        if streamer is not None:
            streamer.put(_streamed([token]))
        if token in stop or len(new) == max_new_tokens:
            break
        logits = step_decode(token, pos)[0, -1]                                      # [vocab]
        pos += 1
    if streamer is not None:
        streamer.end()
    return new


def _streamed(ids: list) -> object:
    """Token ids as a streamer takes them: a LongTensor, as transformers' streamers expect, where
    torch is loaded (a transformers streamer loads it), else an int64 array (Kiln's own)."""
    torch = sys.modules.get("torch")
    return torch.tensor(ids, dtype=torch.long) if torch is not None else np.array(ids, dtype=np.int64)


def _check_prompt(input_ids: list[int], max_new_tokens: int, vocab_size: int, max_seq: int) -> None:
    if not input_ids:
        raise KilnError("kiln: the prompt is empty; generation needs at least one token")
    if max_new_tokens < 1:
        raise KilnError(f"kiln: max_new_tokens must be at least 1, got {max_new_tokens}")
    for position, token in enumerate(input_ids):
        if not 0 <= token < vocab_size:
            raise KilnError(f"kiln: token id {token} at prompt position {position} is outside the "
                            f"vocabulary [0, {vocab_size})")
    # the last new token is returned, never fed back, so it takes no cache position
    needed = len(input_ids) + max_new_tokens - 1
    if needed > max_seq:
        room = max_seq - len(input_ids) + 1
        fix = (f"ask for at most {room} new tokens" if len(input_ids) <= max_seq
               else f"shorten the prompt to at most {max_seq} tokens")
        raise ShapeError(f"kiln: a prompt of {len(input_ids)} tokens and {max_new_tokens} new tokens "
                         f"need {needed} cache positions (the last new token is never fed back), but "
                         f"the model's KV cache holds {max_seq} positions: {fix}, or compile with a larger --max-seq")
