"""`kiln generate`'s text path without transformers: the artifact's tokenizer.json through the
`tokenizers` library encodes as transformers' tokenizer does and streams the same text as its
TextStreamer, on SmolLM2's real tokenizer."""
from __future__ import annotations

import io
import sys

import numpy as np

from kiln.runtime.text import TextStream, Tokenizer

PROMPTS = ["The capital of France is", "  leading spaces\tand a tab", "naïve café — 東京 🚀 done",
           "<|im_start|>user\nHi<|im_end|>"]


def _saved(tokenizer, tmp_path):
    tokenizer.save_pretrained(tmp_path)
    assert Tokenizer.available(tmp_path)
    return Tokenizer(tmp_path)


def test_ids_and_end_of_sequence_equal_transformers(smollm2, tmp_path):
    _, hf_tokenizer = smollm2
    tokenizer = _saved(hf_tokenizer, tmp_path)
    for prompt in PROMPTS:
        assert tokenizer.encode(prompt) == hf_tokenizer(prompt)["input_ids"], prompt
    assert tokenizer.eos_token_id == hf_tokenizer.eos_token_id is not None


def test_the_stream_prints_what_transformers_text_streamer_prints(smollm2, tmp_path, capsys):
    """The same put/end calls (the prompt, then one token at a time, a multi-byte character split
    across tokens among them) print the same text."""
    from transformers import TextStreamer
    _, hf_tokenizer = smollm2
    tokenizer = _saved(hf_tokenizer, tmp_path)
    prompt = hf_tokenizer(PROMPTS[0])["input_ids"]
    new = hf_tokenizer(" is Paris, 東京 is 🚀 far.<|im_end|>")["input_ids"]
    theirs = TextStreamer(hf_tokenizer, skip_special_tokens=True)
    mine = TextStream(tokenizer, out=io.StringIO())
    import torch
    for streamer in (theirs, mine):
        streamer.put(torch.tensor([prompt]))
        for token in new:
            streamer.put(torch.tensor([token]))
        streamer.end()
    assert mine.out.getvalue() == capsys.readouterr().out


def test_the_stream_holds_back_an_incomplete_character(smollm2, tmp_path):
    _, hf_tokenizer = smollm2
    tokenizer = _saved(hf_tokenizer, tmp_path)
    rocket = hf_tokenizer("🚀")["input_ids"]
    assert len(rocket) > 1                      # one character, several byte tokens
    stream = TextStream(tokenizer, out=io.StringIO())
    stream.put(np.array([rocket[:1]]))
    assert stream.out.getvalue() == ""          # not U+FFFD
    stream.put(np.array(rocket[1:]))
    stream.end()
    assert stream.out.getvalue() == "🚀\n"


def test_kiln_generate_streams_without_transformers_and_imports_torch_only_for_a_library_product(smollm2, tmp_path):
    """`kiln generate` on an artifact carrying SmolLM2's tokenizer (a tiny random model of its
    vocabulary) prints the prompt and the new text, and imports neither transformers nor, unless
    a product runs as a library call (PyTorch's matmul), torch (`python -X importtime` lists
    every module a process imports)."""
    import subprocess
    import kiln
    from tests.helpers import tiny_llama
    _, hf_tokenizer = smollm2
    model = tiny_llama(1, vocab_size=hf_tokenizer.vocab_size)
    kiln.compile_lm(model, max_seq=32, budget="5s", db=tmp_path / "tune.sqlite", out=tmp_path / "art",
                    tokenizer=hf_tokenizer, progress=False)
    run = subprocess.run([sys.executable, "-X", "importtime", "-m", "kiln.cli", "generate", str(tmp_path / "art"),
                          "--prompt", "The capital of France is", "--max-new-tokens", "4"],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.startswith("The capital of France is") and len(run.stdout) > len("The capital of France is")
    imported = {line.rsplit("|", 1)[-1].strip() for line in run.stderr.splitlines() if line.startswith("import time:")}
    library = any(f.name.startswith("lib_") for f in (tmp_path / "art" / "kernels").iterdir())
    assert "kiln.runtime.text" in imported and "transformers" not in imported
    assert ("torch" in imported) == library
