"""`kiln bench gpu MODEL`: in one process and one run, PyTorch eager, optionally
`torch.compile(mode="max-autotune")`, and Kiln's CUDA backend run the same model with the same
weights; reports decode tokens/s (batch 1), prefill tokens/s (one prompt of `prefill` tokens),
compile times, the copy bandwidth measured in the same run and each system's share of the
bandwidth bound (the weight bytes a token must read / bandwidth: a mixture of experts' chosen
experts only); writes JSON and a PNG chart."""
from __future__ import annotations

import dataclasses
import json
import os
import statistics
import time

import numpy as np
import torch

from ..frontend import catalog, hf
from ..ir import ShapeError
from ..ir.decode import decode_args, window_length
from ..compiler.progress import spent_text


AT_POSITION_TOKENS = 32      # decode steps timed from each position asked for (after 4 of warm-up)
SHORT_PROMPT = 32            # the short prompt whose time to first token is measured
LONG_PROMPT = 2048           # ... and the long one's, where max_seq holds it


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


def _prefill_rate(run, length: int, repeats: int = 5) -> float:
    return length / _call_s(run, repeats)


def _call_s(run, repeats: int = 5, warm: int = 2) -> float:
    """The median seconds of a call after `warm` calls (Kiln records a prompt length's CUDA graph
    on its second call), the GPU's work included."""
    for _ in range(warm):
        run()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _first_call_s(run) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    run()
    torch.cuda.synchronize()
    return time.perf_counter() - start


def _copy_bandwidth() -> float:
    """Bytes per second (read plus written) of a 1 GiB device-to-device copy."""
    src = torch.empty(1 << 28, dtype=torch.float32, device="cuda")
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(20):
        dst.copy_(src)
    torch.cuda.synchronize()
    return 2 * src.numel() * 4 * 20 / (time.perf_counter() - t0)


def _log(result: dict, json_path: str | None, *keys: str) -> None:
    """Each figure as soon as it is measured, printed and saved: a later failure loses none."""
    print("  " + ", ".join(f"{k} {result[k]:.4g}" for k in keys), flush=True)
    if json_path:
        _write_json(result, json_path)


def _write_json(result: dict, path: str) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump(result, f, indent=2)
    os.replace(path + ".tmp", path)


def measure(spec: str, dtype: str, tokens: int, budget: str, max_seq: int, torch_compile: bool,
            db: str | None, lowered_path: str | None = None, prefill: int = 512,
            json_path: str | None = None, positions: tuple[int, ...] = (), artifact: str | None = None) -> dict:
    """`artifact`: time what `kiln compile` wrote there (the same model, dtype and max_seq)
    instead of compiling: a compile longer than one sitting, continued with --resume."""
    from ..compiler.driver import compile_lm
    loaded = catalog.load(spec)
    model = loaded.model.to(getattr(torch, dtype)).eval()
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    active_bytes = active_weight_bytes(model)
    cache = hf.cache_spec(model, max_seq)
    rng = np.random.default_rng(0)
    ids = rng.integers(0, model.config.vocab_size, size=tokens + 16)
    # from an empty cache, as generation starts: a first step at position 8 attends to 8 zeroed
    # slots, an input no model saw, where SmolLM2 in bf16 and fp32 disagree by 90%
    start_pos = 0
    prefill = min(prefill, max_seq - tokens - 16)
    prompt = rng.integers(0, model.config.vocab_size, size=(1, prefill))
    result = {"model": spec, "dtype": dtype, "max_seq": max_seq, "tokens": tokens, "prefill_tokens": prefill,
              "weight_bytes": weight_bytes, "active_weight_bytes": active_bytes, "gpu": torch.cuda.get_device_name()}

    result["copy_bytes_per_s"] = _copy_bandwidth()
    result["bandwidth_bound_tokens_per_s"] = _bound(result)
    _log(result, json_path, "copy_bytes_per_s", "bandwidth_bound_tokens_per_s")

    # Kiln first: its compile lowers on the CPU copy of the model
    t0 = time.perf_counter()
    if artifact is not None:
        compiled = _compiled_artifact(artifact, cache, dtype)
        result["kiln_artifact"] = {"folder": artifact, "budget_s": compiled.info.get("budget_s"),
                                   "searched_s": compiled.info.get("took_s")}
    else:
        lowered = hf.load_lowered(lowered_path, model) if lowered_path else None
        compiled = compile_lm(model, max_seq=max_seq, backend="cuda", budget=budget, db=db, progress=False,
                              lowered=lowered)
    result["kiln_compile_s"] = time.perf_counter() - t0
    result["prefill_logits"] = compiled.info.get("prefill_logits", "all")     # and eager's, torch.compile's
    _log(result, json_path, "kiln_compile_s")
    decode = compiled.decode_graph(start_pos)
    caches = compiled._zero_caches()
    kiln_logits = []

    def kiln_step(k: int) -> None:
        out = decode(*decode_args(decode.graph, np.array([[ids[k]]]), start_pos + k, caches))
        if len(kiln_logits) < 8:
            kiln_logits.append(decode.backend.to_host(out[0], decode.graph.outputs[0].dtype))
    result["kiln_decode_tokens_per_s"] = _decode_rate(kiln_step, tokens)
    for pos in positions:       # a step's cost as the context grows (attention reads the window)
        at = compiled.decode_graph(pos)
        name = next(n for n, g in compiled.graphs.items() if g is at)

        def step_at(k: int, at=at, pos=pos) -> None:
            at(*decode_args(at.graph, np.array([[ids[k % len(ids)]]]), pos + k, caches))
        rate = _decode_rate(step_at, AT_POSITION_TOKENS)
        result.setdefault("kiln_decode_tokens_per_s_at", {})[str(pos)] = rate
        inside = _kernels_inside_a_step(step_at, 0, compiled.report["graphs"][name])
        result.setdefault("kiln_decode_at", {})[str(pos)] = {"program": name, "kernels": at.kernel_count,
                                                             "in_graph": inside}
        print(f"  kiln decode at position {pos}: {rate:.1f} tok/s ({name}, {at.kernel_count} kernels)", flush=True)
    # the search's rate where its budget went: candidates a minute per region, and what each won with
    result["kiln_search"] = {
        name: [{"region": r["label"], "budget_s": r.get("budget_s"), "tried": r["progress"]["tried"],
                "measured": r["progress"]["measured"], "search_s": r["search_s"],
                "per_minute": 60 * r["progress"]["measured"] / max(r["search_s"], 1e-9),
                "spent": r["progress"].get("spent", {}),
                "winner": r["winner"], "rules": r.get("rules", [])} for r in g["regions"]]
        for name, g in compiled.report["graphs"].items()}
    result["kiln_kernels_per_token"] = decode.kernel_count
    result["kiln_decode_replays_a_graph"] = decode.replayed
    regions = compiled.report["graphs"]["decode"]["regions"]
    # what the step costs beside what its kernels cost one by one: the share lost between kernels
    result["kiln_decode_kernel_sum_s"] = sum(r["estimate_s"] * r["count"] for r in regions)
    result["kiln_decode_regions_end_to_end_s"] = sum(r["end_to_end_s"] * r["count"] for r in regions)
    _log(result, json_path, "kiln_decode_tokens_per_s", "kiln_kernels_per_token", "kiln_decode_kernel_sum_s",
         "kiln_decode_regions_end_to_end_s")
    inside = _kernels_inside_a_step(kiln_step, tokens, compiled.report["graphs"]["decode"])
    if inside:
        result["kiln_decode_in_graph"] = inside
        print(f"  in the replayed step: {inside['kernels']} kernels, busy {inside['busy_s'] * 1e6:.0f} us "
              f"of {inside['step_s'] * 1e6:.0f} us (the rest is the gaps between kernels)", flush=True)
        for row in inside["slowest"][:10]:
            print(f"    {row['seconds'] * 1e6:7.1f} us x{row['calls']:<3d} {row['label']} "
                  f"{row['bytes_per_s'] / 1e9:.0f} GB/s", flush=True)
    # a prompt length's first call runs launched, its second records a CUDA graph, later ones
    # replay it; prompts pad to 32, 64, 128, ... tokens (ir/last_position.py)
    result["kiln_prefill_first_call_s"] = _first_call_s(lambda: compiled.prefill(prompt))
    result["kiln_prefill_tokens_per_s"] = _prefill_rate(lambda: compiled.prefill(prompt), prefill)
    result["kiln_prefill_replays_a_graph"] = compiled.prefill_graph(prefill).replayed
    short = prompt[:, :SHORT_PROMPT]
    result["kiln_short_prompt_first_call_s"] = _first_call_s(lambda: compiled.prefill(short))
    result["kiln_short_prompt_s"] = _call_s(lambda: compiled.prefill(short))
    result["kiln_report"] = compiled.report
    _log(result, json_path, "kiln_prefill_first_call_s", "kiln_prefill_tokens_per_s",
         "kiln_short_prompt_first_call_s", "kiln_short_prompt_s")
    long_prompt = (rng.integers(0, model.config.vocab_size, size=(1, LONG_PROMPT))
                   if max_seq > LONG_PROMPT else None)
    if long_prompt is not None:
        result["long_prompt_tokens"] = LONG_PROMPT
        result["kiln_long_prompt_first_call_s"] = _first_call_s(lambda: compiled.prefill(long_prompt))
        result["kiln_long_prompt_s"] = _call_s(lambda: compiled.prefill(long_prompt))
        _log(result, json_path, "kiln_long_prompt_first_call_s", "kiln_long_prompt_s")
    for line in _slowest_kernels(compiled.report["graphs"].get("decode", {})):
        print("   ", line, flush=True)

    gpu_model = model.cuda()
    step = hf.DecodeStep(gpu_model, cache).eval()
    torch_caches = [c.cuda() for c in cache.zeros()]
    eager_logits = []

    def eager(k: int, fn=step) -> None:
        nonlocal torch_caches
        if fn is not step:
            # max-autotune replays CUDA graphs whose outputs the next replay overwrites: the caches
            # one step returns are the next step's inputs, so they are copied out (2 x 23 MB a token
            # for Llama-3.2-1B at max_seq 704, about 1% of a step at 4 TB/s)
            torch.compiler.cudagraph_mark_step_begin()
        # both attend over the whole static cache, transformers' static-cache recipe: one shape a
        # step (eager over a window growing each step ran 2-5x slower on the H200, each new
        # shape costing it more than the positions it skips)
        with torch.no_grad():
            logits, *torch_caches = fn(torch.tensor([[int(ids[k])]], device="cuda"),
                                       torch.tensor(start_pos + k, device="cuda"),
                                       hf.torch_window(max_seq, "cuda"), torch_caches)
        if fn is not step:
            torch_caches = [c.clone() for c in torch_caches]
        if fn is step and len(eager_logits) < 8:
            eager_logits.append(logits.float().cpu().numpy())
    result["eager_decode_tokens_per_s"] = _decode_rate(eager, tokens)
    torch_prompt = torch.tensor(prompt, device="cuda")

    # the logits Kiln's prefill computes (the last position's, by default), as a serving loop asks
    keep = {"logits_to_keep": 1} if compiled.info.get("prefill_logits", "all") == "last" else {}

    def eager_prefill(fn=gpu_model) -> None:
        with torch.no_grad():
            fn(input_ids=torch_prompt, use_cache=False, **keep)
    result["eager_prefill_tokens_per_s"] = _prefill_rate(eager_prefill, prefill)
    short_prompt = torch_prompt[:, :SHORT_PROMPT]
    with torch.no_grad():
        result["eager_short_prompt_s"] = _call_s(lambda: gpu_model(input_ids=short_prompt, use_cache=False, **keep))
    _log(result, json_path, "eager_decode_tokens_per_s", "eager_prefill_tokens_per_s", "eager_short_prompt_s")
    if long_prompt is not None:
        torch_long = torch.tensor(long_prompt, device="cuda")
        with torch.no_grad():
            result["eager_long_prompt_s"] = _call_s(lambda: gpu_model(input_ids=torch_long, use_cache=False, **keep))
        _log(result, json_path, "eager_long_prompt_s")
    result["kiln_vs_eager_rel_error"] = _rel_error(kiln_logits, eager_logits)
    if dtype != "float32":   # whose rounding the gap is: both against the same steps in fp32
        reference = _fp32_logits(gpu_model, cache, ids, start_pos, len(eager_logits))
        result["kiln_vs_fp32_rel_error"] = _rel_error(kiln_logits, reference)
        result["eager_vs_fp32_rel_error"] = _rel_error(eager_logits, reference)
        _log(result, json_path, "kiln_vs_eager_rel_error", "kiln_vs_fp32_rel_error", "eager_vs_fp32_rel_error")

    if torch_compile:
        t0 = time.perf_counter()
        compiled_step = torch.compile(step, mode="max-autotune", fullgraph=False)
        torch_caches = [c.cuda() for c in cache.zeros()]
        eager(0, compiled_step)
        result["torch_compile_s"] = time.perf_counter() - t0
        result["torch_compile_decode_tokens_per_s"] = _decode_rate(
            lambda k: eager(k, compiled_step), tokens)
        _log(result, json_path, "torch_compile_s", "torch_compile_decode_tokens_per_s")
        t0 = time.perf_counter()
        compiled_model = torch.compile(gpu_model, mode="max-autotune", fullgraph=False)
        eager_prefill(compiled_model)
        result["torch_compile_prefill_compile_s"] = time.perf_counter() - t0
        result["torch_compile_prefill_tokens_per_s"] = _prefill_rate(lambda: eager_prefill(compiled_model), prefill)
        _log(result, json_path, "torch_compile_prefill_compile_s", "torch_compile_prefill_tokens_per_s")

        def time_to_first_token(which: str, ids) -> None:
            # a program specialized to the prompt's length, as Kiln's recordings are
            # (dynamic=False: compiled again for this shape, tuned as the 512 one)
            t0 = time.perf_counter()
            specialized = torch.compile(gpu_model, mode="max-autotune", fullgraph=False, dynamic=False)
            with torch.no_grad():
                specialized(input_ids=ids, use_cache=False, **keep)
                result[f"torch_compile_{which}_prompt_compile_s"] = time.perf_counter() - t0
                result[f"torch_compile_{which}_prompt_s"] = _call_s(
                    lambda: specialized(input_ids=ids, use_cache=False, **keep))
            _log(result, json_path, f"torch_compile_{which}_prompt_compile_s", f"torch_compile_{which}_prompt_s")
        time_to_first_token("short", short_prompt)
        if long_prompt is not None:
            time_to_first_token("long", torch_long)

    bound = result["bandwidth_bound_tokens_per_s"]
    for system in ("eager", "torch_compile", "kiln"):
        key = f"{system}_decode_tokens_per_s"
        if key in result:
            result[f"{system}_share_of_bound"] = result[key] / bound
    return result


def _kernels_inside_a_step(step, first: int, report: dict, steps: int = 3) -> dict | None:
    """Each kernel's duration inside the replayed decode step, from the CUDA activity trace that
    torch's profiler (CUPTI) records for the whole process, CuPy's launches and graph replays too:
    the time kernels are busy beside the step's span, and the slowest kernels by label. None where
    the trace holds no kernel."""
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for k in range(steps):
            step(first + k)
        torch.cuda.synchronize()
    events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    if not events:
        return None
    known = {k["function"]: k for r in report.get("regions", []) for k in r.get("kernels", [])}
    per: dict[str, list[float]] = {}
    for e in events:
        per.setdefault(e.name, []).append(e.time_range.elapsed_us() / 1e6)
    span = (max(e.time_range.end for e in events) - min(e.time_range.start for e in events)) / 1e6
    rows = []
    for name, times in per.items():
        k = known.get(name, {})
        mean = sum(times) / len(times)
        rows.append({"function": name, "label": k.get("label", name[:40]), "calls": len(times) // steps,
                     "seconds": sum(times) / steps, "bytes_per_s": k.get("bytes", 0) / mean if mean else 0.0})
    rows.sort(key=lambda r: -r["seconds"])
    return {"kernels": len(events) // steps, "busy_s": sum(r["seconds"] for r in rows),
            "step_s": span / steps, "slowest": rows[:25]}


def active_weight_bytes(model: torch.nn.Module) -> int:
    """The weight bytes a decode token must read: every parameter, but the input embedding's
    table (one row; where the output head shares it, all of it) and a mixture of experts' expert
    parameters ([experts, ...]) at the share of experts a token chooses."""
    config = model.config
    experts = next((getattr(config, k) for k in ("num_experts", "num_local_experts", "n_routed_experts")
                    if getattr(config, k, None)), None)
    chosen = getattr(config, "num_experts_per_tok", None)
    embedding = model.get_input_embeddings().weight
    head = model.get_output_embeddings()
    tied = head is not None and head.weight is embedding
    total = 0
    for name, p in model.named_parameters():       # a tied weight once
        size = p.numel() * p.element_size()
        if p is embedding and not tied:
            size = p.shape[-1] * p.element_size()
        elif experts and chosen and "expert" in name and p.dim() >= 2 and p.shape[0] == experts:
            size = size * chosen // experts
        total += size
    return total


def _bound(r: dict) -> float:
    """Decode tokens/s if every weight byte a token needs were read once at the measured copy
    rate (runs saved before the active bytes were recorded: all of the weights)."""
    return r["copy_bytes_per_s"] / r.get("active_weight_bytes", r["weight_bytes"])


def _rel_error(got: list, want: list) -> float:
    """The largest relative error (2-norm) over the decode steps both have."""
    return max(float(np.linalg.norm(g.astype(np.float32) - w) / np.linalg.norm(w)) for g, w in zip(got, want))


def _fp32_logits(model, cache, ids, start_pos: int, count: int) -> list:
    """The first `count` decode steps' logits of an fp32 copy of the model, from empty caches."""
    # built afresh from the config: transformers refuses to cast a model it dequantized (gguf)
    with torch.device("cuda"):
        reference = type(model)(model.config).float()
    reference.load_state_dict({k: v.float() for k, v in model.state_dict().items()})
    spec = dataclasses.replace(cache, dtype=torch.float32)
    step, caches, out = hf.DecodeStep(reference, spec).eval(), spec.zeros("cuda"), []
    with torch.no_grad():
        for k in range(count):
            logits, *caches = step(torch.tensor([[int(ids[k])]], device="cuda"),
                                   torch.tensor(start_pos + k, device="cuda"),
                                   hf.torch_window(window_length(start_pos + k), "cuda"), caches)
            out.append(logits.float().cpu().numpy())
    del reference
    torch.cuda.empty_cache()
    return out


def _compiled_artifact(folder: str, cache, dtype: str):
    """The artifact at `folder`, refused unless compiled for the bench's cache layout and dtype."""
    from ..ir.tensors import kiln_dtype
    from ..runtime.model import CompiledModel
    compiled = CompiledModel.load(folder)
    if (compiled.info.get("cache_shape"), compiled.info.get("cache_dtype")) != \
            (list(cache.shape), kiln_dtype(cache.dtype).value):
        raise ShapeError(f"kiln: {folder} was not compiled for this bench's model, dtype {dtype} and max_seq "
                         f"(its cache {compiled.info.get('cache_shape')} {compiled.info.get('cache_dtype')}); "
                         "compile it with the same --max-seq and --dtype")
    return compiled


SYSTEMS = (("eager", "PyTorch eager"), ("torch_compile", "torch.compile max-autotune"), ("kiln", "Kiln"))


def run_gpu_bench(spec: str, dtype: str, tokens: int, budget: str, max_seq: int,
                  torch_compile: bool, json_path: str | None, db: str | None,
                  lowered_path: str | None = None, prefill: int = 512, positions: tuple[int, ...] = (),
                  artifact: str | None = None) -> dict:
    too_far = [p for p in positions if p + AT_POSITION_TOKENS + 4 > max_seq]
    if too_far:
        raise ShapeError(f"kiln: decode at position {too_far[0]} needs max_seq of at least "
                         f"{too_far[0] + AT_POSITION_TOKENS + 4} ({AT_POSITION_TOKENS} timed steps and 4 of warm-up)")
    r = measure(spec, dtype, tokens, budget, max_seq, torch_compile, db, lowered_path=lowered_path,
                prefill=prefill, json_path=json_path, positions=positions, artifact=artifact)
    print(f"{r['model']} {r['dtype']} on {r['gpu']}: {r['tokens']} decode tokens timed (median), "
          f"prefill of {r['prefill_tokens']} tokens; copy bandwidth {r['copy_bytes_per_s'] / 1e12:.2f} TB/s, "
          f"weights {r['weight_bytes'] / 1e9:.2f} GB"
          + (f" ({r['active_weight_bytes'] / 1e9:.2f} GB read a token)"
             if r.get("active_weight_bytes", r["weight_bytes"]) != r["weight_bytes"] else "")
          + f", bound {r['bandwidth_bound_tokens_per_s']:.0f} tok/s")
    print(f"  {'system':28s} {'decode tok/s':>12s} {'of bound':>9s} {'prefill tok/s':>14s}")
    for system, name in SYSTEMS:
        key = f"{system}_decode_tokens_per_s"
        if key in r:
            print(f"  {name:28s} {r[key]:12.1f} {r[f'{system}_share_of_bound'] * 100:8.1f}% "
                  f"{r.get(f'{system}_prefill_tokens_per_s', float('nan')):14.0f}")
    print(f"  kiln compile {r['kiln_compile_s']:.0f} s, {r['kiln_kernels_per_token']} kernels per token "
          f"({'one CUDA graph replay' if r['kiln_decode_replays_a_graph'] else 'launched one by one'}), "
          f"a step {1e6 / r['kiln_decode_tokens_per_s']:.0f} us beside its kernels' sum "
          f"{r['kiln_decode_kernel_sum_s'] * 1e6:.0f} us (timed one by one) and its regions' "
          f"{r['kiln_decode_regions_end_to_end_s'] * 1e6:.0f} us (each replayed alone); "
          f"logits vs eager rel. error {r['kiln_vs_eager_rel_error']:.1e}" +
          (f"; vs fp32: Kiln {r['kiln_vs_fp32_rel_error']:.1e}, eager {r['eager_vs_fp32_rel_error']:.1e}"
           if "kiln_vs_fp32_rel_error" in r else ""))
    for graph, regions in r.get("kiln_search", {}).items():
        print(f"  kiln search, {graph}: " + "; ".join(
            f"{x['region']} {x['tried']} candidates ({x['measured']} measured) in {x['search_s']:.0f} s "
            f"({x['per_minute']:.0f} a minute)"
            for x in regions))
        busiest = max(regions, key=lambda x: x["measured"], default=None)
        if busiest and busiest.get("spent"):
            print(f"    {busiest['region']}: {spent_text(busiest['spent'], busiest['measured'])}")
    if "kiln_short_prompt_s" in r:
        print(f"  kiln prefill: {r['prefill_tokens']} tokens {r['kiln_prefill_first_call_s'] * 1e3:.1f} ms on a "
              f"length's first call, {r['prefill_tokens'] / r['kiln_prefill_tokens_per_s'] * 1e3:.1f} ms later "
              f"({'CUDA graph replays' if r['kiln_prefill_replays_a_graph'] else 'launched'}); a {SHORT_PROMPT}-token "
              f"prompt {r['kiln_short_prompt_first_call_s'] * 1e3:.1f} ms first, {r['kiln_short_prompt_s'] * 1e3:.2f} ms "
              f"later, eager {r.get('eager_short_prompt_s', float('nan')) * 1e3:.2f} ms, torch.compile "
              f"{r.get('torch_compile_short_prompt_s', float('nan')) * 1e3:.2f} ms")
    if "kiln_long_prompt_s" in r:
        print(f"  kiln prefill: a {r['long_prompt_tokens']}-token prompt {r['kiln_long_prompt_first_call_s'] * 1e3:.1f} ms "
              f"first, {r['kiln_long_prompt_s'] * 1e3:.2f} ms later, eager "
              f"{r.get('eager_long_prompt_s', float('nan')) * 1e3:.2f} ms, torch.compile "
              f"{r.get('torch_compile_long_prompt_s', float('nan')) * 1e3:.2f} ms")
    if json_path:
        _write_json(r, json_path)
        print(f"wrote {json_path} and {_chart(r, json_path.removesuffix('.json') + '.png')}")
    return r


def write_chart(json_path: str) -> str:
    """The PNG chart of a bench JSON written on another machine (the GPU's may lack matplotlib)."""
    from ..ir.errors import KilnError
    try:
        with open(json_path) as f:
            r = json.load(f)
        return _chart(r, json_path.removesuffix(".json") + ".png")
    except (OSError, json.JSONDecodeError, KeyError) as err:
        raise KilnError(f"kiln: {json_path} is not a bench JSON written by `kiln bench gpu` "
                        f"({type(err).__name__}: {err})") from err


def _slowest_kernels(report: dict, count: int = 8) -> list[str]:
    """The decode kernels that take the most time per token (time x repeats of their region)."""
    rows = [(k["seconds"] * r["count"], k, r["count"]) for r in report.get("regions", [])
            for k in r.get("kernels", []) if k.get("seconds")]
    total = sum(t for t, _, _ in rows) or 1.0
    return [f"{t * 1e6:8.1f} us {t / total:5.1%}  x{n} {k['label']} [{k['config']}] "
            f"{k['bytes'] / k['seconds'] / 1e9:.0f} GB/s" for t, k, n in sorted(rows, key=lambda x: -x[0])[:count]]


def _chart(r: dict, path: str) -> str:
    """Decode and prefill tokens/s per system, side by side, the bandwidth bound drawn on decode."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return ("no chart: matplotlib is not installed here; draw it with `kiln chart "
                f"{path.removesuffix('.png')}.json` where it is (pip install 'tensorkiln[bench]')")
    systems = [(s, name) for s, name in SYSTEMS if f"{s}_decode_tokens_per_s" in r]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, what in zip(axes, ("decode", "prefill")):
        values = [r.get(f"{s}_{what}_tokens_per_s") for s, _ in systems]
        ax.bar([name for _, name in systems], [v or 0.0 for v in values],
               color=["#888888", "#4477aa", "#cc6633"][:len(systems)])
        for i, v in enumerate(values):     # a figure the run did not reach is said so, not drawn as 0
            ax.text(i, v or 0.0, "not measured" if v is None else f"{v:,.0f}", ha="center", va="bottom")
        if what == "decode":
            # a JSON from a bench cut short may lack it (written at the end before 2026-12-02)
            bound = r.get("bandwidth_bound_tokens_per_s") or _bound(r)
            ax.axhline(bound, color="black", linestyle="--", linewidth=1)
            ax.text(len(systems) - 0.5, bound, "bandwidth bound", ha="right",
                    va="bottom", fontsize=8)
        ax.set_title(f"{what} tokens/s" + (f" ({r['prefill_tokens']}-token prompt)" if what == "prefill"
                                           else " (batch 1)"))
        ax.tick_params(axis="x", labelsize=8)
    fig.suptitle(f"{r['model']} {r['dtype']} on {r['gpu']}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path
