"""Text in and out of a compiled model for `kiln generate`, without transformers: the artifact's
tokenizer.json read by the `tokenizers` library (the library transformers' fast tokenizers
wrap), and a streamer printing the new tokens' text as it comes. Importing transformers (and the
torch it imports) took about 2 s of the 6 s from `kiln generate` to SmolLM2's first token on the
CPU; `CompiledModel.tokenizer` stays transformers' own for the Python API."""
from __future__ import annotations

import json
import sys
from pathlib import Path


class Tokenizer:
    """Encodes with the special tokens the tokenizer's post-processor adds (as transformers'
    fast tokenizer does) and decodes without them."""

    def __init__(self, folder: Path):
        from tokenizers import Tokenizer as Fast
        self._fast = Fast.from_file(str(folder / "tokenizer.json"))
        config_path = folder / "tokenizer_config.json"
        config = json.loads(config_path.read_text()) if config_path.is_file() else {}
        eos = config.get("eos_token")
        eos = eos.get("content") if isinstance(eos, dict) else eos
        self.eos_token_id = self._fast.token_to_id(eos) if eos else None

    @staticmethod
    def available(folder: Path) -> bool:
        return (folder / "tokenizer.json").is_file()

    def encode(self, text: str) -> list[int]:
        return self._fast.encode(text).ids

    def decode(self, ids: list[int]) -> str:
        return self._fast.decode(ids, skip_special_tokens=True)


class TextStream:
    """transformers' streamer calls (put(prompt), put(token) for each new token, end()), printing
    the text as it comes, the prompt's first (as transformers' TextStreamer does): each put decodes
    the tokens so far and prints what was not printed yet, holding back a character still
    incomplete (a multi-byte one split across tokens decodes as U+FFFD until its last byte)."""

    def __init__(self, tokenizer: Tokenizer, out=None):
        self.tokenizer, self.out = tokenizer, out or sys.stdout
        self._ids, self._printed = [], 0

    def put(self, ids) -> None:
        self._ids.extend(int(t) for t in (ids.reshape(-1) if hasattr(ids, "reshape") else ids))
        text = self.tokenizer.decode(self._ids)
        if not text.endswith("\ufffd"):
            self._write(text)

    def end(self) -> None:
        self._write(self.tokenizer.decode(self._ids))
        self.out.write("\n")
        self.out.flush()

    def _write(self, text: str) -> None:
        self.out.write(text[self._printed:])
        self.out.flush()
        self._printed = len(text)
