"""`kiln bench frontend`: export and lowering time, IR size, and the reference interpreter's time
per token, beside PyTorch eager running the same decode step on the same weights in the same run."""
from __future__ import annotations

import json
import os
import platform
import statistics
import time

import numpy as np
import torch
from rich.console import Console
from rich.table import Table

from ..frontend import catalog, hf
from ..ir import decode

PROMPT_TOKENS = 32


def _timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def measure(spec: str, tokens: int, max_seq: int = 256) -> dict:
    loaded, load_s = _timed(lambda: catalog.load(spec))
    model = loaded.model
    lowered, lower_s = _timed(lambda: hf.lower_causal_lm(model, max_seq=max_seq))
    vocab = lowered.vocab_size
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, vocab, size=(1, PROMPT_TOKENS), dtype=np.int64)

    (logits, caches), prefill_s = _timed(lambda: hf.prefill(lowered, prompt))
    steps = [(rng.integers(0, vocab, size=(1, 1), dtype=np.int64), PROMPT_TOKENS + i) for i in range(tokens)]
    # the interpreter's steps, then eager's, in two blocks: interleaved, each one's idle BLAS or
    # OpenMP threads spin on the cores the other needs and both read several times slower
    torch_caches = [torch.from_numpy(np.ascontiguousarray(c)) for c in caches]
    interp_logits, decode_s = [], []
    for token, pos in steps:
        (logits, caches), dt = _timed(lambda: hf.decode_one(lowered, token, pos, caches))
        interp_logits.append(logits)
        decode_s.append(dt)
    step = hf.DecodeStep(model, lowered.cache).eval()
    eager_s, rel = [], 0.0
    with torch.no_grad():
        for (token, pos), logits in zip(steps, interp_logits):
            (reference, *torch_caches), et = _timed(
                lambda: step(torch.from_numpy(token), torch.tensor(pos),
                             hf.torch_window(decode.window_length(pos)), torch_caches))
            eager_s.append(et)
            reference = reference.numpy()
            rel = max(rel, float(np.abs(logits - reference).max() / np.abs(reference).max()))
    params = sum(p.numel() for p in model.parameters())
    return {
        "model": loaded.name, "parameters": params, "load_s": load_s,
        "export_and_lower_s": lower_s,
        "prefill_nodes": len(lowered.prefill.nodes()), "decode_nodes": len(lowered.decode.nodes()),
        "interpreter_prefill_tokens_per_s": PROMPT_TOKENS / prefill_s,
        "interpreter_decode_s_per_token": statistics.median(decode_s),
        "eager_decode_s_per_token": statistics.median(eager_s),
        "decode_max_rel_error_vs_eager": rel,
        "decode_tokens_timed": tokens,
    }


def run_frontend_bench(specs: list[str], tokens: int, json_path: str | None) -> list[dict]:
    console = Console()
    if not console.is_terminal:  # logs and pipes get the whole table, not an 80-column squeeze
        console = Console(width=160)
    console.print(f"machine: {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
                  f"numpy {np.__version__}; prompt {PROMPT_TOKENS} tokens, {tokens} decode steps timed "
                  "(medians)")
    rows = []
    for spec in specs:
        with console.status(f"measuring {spec} ..."):
            rows.append(measure(spec, tokens))
    table = Table(title="kiln bench frontend")
    for col in ("model", "params", "export+lower", "IR nodes (prefill / decode)",
                "interp prefill", "interp decode", "eager decode", "interp / eager", "max rel err"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(
            r["model"], f"{r['parameters'] / 1e6:.0f}M", f"{r['export_and_lower_s']:.1f} s",
            f"{r['prefill_nodes']:,} / {r['decode_nodes']:,}",
            f"{r['interpreter_prefill_tokens_per_s']:.1f} tok/s",
            f"{r['interpreter_decode_s_per_token'] * 1e3:.0f} ms/tok",
            f"{r['eager_decode_s_per_token'] * 1e3:.0f} ms/tok",
            f"{r['interpreter_decode_s_per_token'] / r['eager_decode_s_per_token']:.1f}x",
            f"{r['decode_max_rel_error_vs_eager']:.1e}")
    console.print(table)
    if json_path:
        write_json(json_path, rows)
    return rows


def write_json(path: str, data) -> None:
    """Write through a temporary file and rename: a reader never sees half a file."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=2)
    os.replace(tmp, path)
