"""`kiln bench gpu MODEL`: in one process and one run, PyTorch eager, optionally
`torch.compile(mode="max-autotune")`, and Kiln's CUDA backend decode the same model with the same
weights; reports decode tokens/s (batch 1), compile times, the copy bandwidth measured in the same
run and each system's share of the bandwidth bound (weight bytes read per token / bandwidth)."""
from __future__ import annotations

import json
import statistics
import time

import numpy as np
import torch

from ..frontend import catalog, hf


def _decode_rate(step, tokens: int, warmup: int = 4) -> float:
    """Tokens per second of `step(k)` over `tokens` steps after warm-up (synchronized)."""
    for k in range(warmup):
        step(k)
    torch.cuda.synchronize()
    times = []
    for k in range(tokens):
        start = time.perf_counter()
        step(warmup + k)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return 1 / statistics.median(times)


def measure(spec: str, dtype: str, tokens: int, budget: str, max_seq: int, torch_compile: bool,
            db: str | None, lowered_path: str | None = None) -> dict:
    from .driver import compile_lm
    loaded = catalog.load(spec)
    model = loaded.model.to(getattr(torch, dtype)).eval()
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    cache = hf.cache_spec(model, max_seq)
    rng = np.random.default_rng(0)
    ids = rng.integers(0, model.config.vocab_size, size=tokens + 16)
    start_pos = 8
    result = {"model": spec, "dtype": dtype, "max_seq": max_seq, "tokens": tokens,
              "weight_bytes": weight_bytes, "gpu": torch.cuda.get_device_name()}

    # Kiln first: its compile lowers on the CPU copy of the model
    t0 = time.perf_counter()
    lowered = hf.load_lowered(lowered_path, model) if lowered_path else None
    compiled = compile_lm(model, max_seq=max_seq, backend="cuda", budget=budget, db=db, progress=False,
                          lowered=lowered)
    result["kiln_compile_s"] = time.perf_counter() - t0
    decode = compiled.graphs["decode"]
    caches = compiled._zero_caches()
    kiln_logits = []

    def kiln_step(k: int) -> None:
        out = decode(np.array([[ids[k]]]), np.array(start_pos + k), *caches)
        if len(kiln_logits) < 8:
            kiln_logits.append(decode.backend.to_host(out[0], decode.graph.outputs[0].dtype))
    result["kiln_decode_tokens_per_s"] = _decode_rate(kiln_step, tokens)
    result["kiln_kernels_per_token"] = decode.kernel_count

    gpu_model = model.cuda()
    step = hf.DecodeStep(gpu_model, cache).eval()
    torch_caches = [c.cuda() for c in cache.zeros()]
    eager_logits = []

    def eager(k: int, fn=step) -> None:
        nonlocal torch_caches
        with torch.no_grad():
            logits, *torch_caches = fn(torch.tensor([[int(ids[k])]], device="cuda"),
                                       torch.tensor(start_pos + k, device="cuda"), torch_caches)
        if fn is step and len(eager_logits) < 8:
            eager_logits.append(logits.float().cpu().numpy())
    result["eager_decode_tokens_per_s"] = _decode_rate(eager, tokens)
    n = min(len(kiln_logits), len(eager_logits))
    result["kiln_vs_eager_rel_error"] = max(
        float(np.linalg.norm(kiln_logits[i].astype(np.float32) - eager_logits[i]) /
              np.linalg.norm(eager_logits[i])) for i in range(n))

    if torch_compile:
        t0 = time.perf_counter()
        compiled_step = torch.compile(step, mode="max-autotune", fullgraph=False)
        torch_caches = [c.cuda() for c in cache.zeros()]
        eager(0, compiled_step)
        result["torch_compile_s"] = time.perf_counter() - t0
        result["torch_compile_decode_tokens_per_s"] = _decode_rate(
            lambda k: eager(k, compiled_step), tokens)

    src = torch.empty(1 << 28, dtype=torch.float32, device="cuda")
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(20):
        dst.copy_(src)
    torch.cuda.synchronize()
    result["copy_bytes_per_s"] = 2 * src.numel() * 4 * 20 / (time.perf_counter() - t0)
    bound = result["copy_bytes_per_s"] / weight_bytes
    result["bandwidth_bound_tokens_per_s"] = bound
    for system in ("eager", "torch_compile", "kiln"):
        key = f"{system}_decode_tokens_per_s"
        if key in result:
            result[f"{system}_share_of_bound"] = result[key] / bound
    return result


def run_gpu_bench(spec: str, dtype: str, tokens: int, budget: str, max_seq: int,
                  torch_compile: bool, json_path: str | None, db: str | None,
                  lowered_path: str | None = None) -> dict:
    r = measure(spec, dtype, tokens, budget, max_seq, torch_compile, db, lowered_path)
    print(f"{r['model']} {r['dtype']} on {r['gpu']}: {r['tokens']} decode tokens timed (median), "
          f"copy bandwidth {r['copy_bytes_per_s'] / 1e12:.2f} TB/s, weights {r['weight_bytes'] / 1e9:.2f} GB, "
          f"bound {r['bandwidth_bound_tokens_per_s']:.0f} tok/s")
    for system in ("eager", "torch_compile", "kiln"):
        key = f"{system}_decode_tokens_per_s"
        if key in r:
            print(f"  {system:14s} {r[key]:8.1f} tok/s  {r[f'{system}_share_of_bound'] * 100:5.1f}% of bound")
    print(f"  kiln compile {r['kiln_compile_s']:.0f} s, {r['kiln_kernels_per_token']} kernels per token, "
          f"logits vs eager rel. error {r['kiln_vs_eager_rel_error']:.1e}")
    if json_path:
        with open(json_path, "w") as f:
            json.dump(r, f, indent=2)
    return r
