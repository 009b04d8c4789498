"""`kiln bench compiled`: a compiled artifact's decode and prefill speed beside PyTorch eager on
the same model and weights, in one run, with the search's own figures from the artifact."""
from __future__ import annotations

import copy
import ctypes
import os
import platform
import statistics
import time
from collections import Counter

import numpy as np
import torch
from rich.console import Console
from rich.table import Table

from ..frontend import catalog, hf
from ..ir import DType
from ..ir.tensors import torch_dtype
from ..ir.decode import decode_args, window_length
from ..compiler.measure import MAX_REPEATS, TIMING_TARGET_S
from ..compiler.progress import spent_text
from ..runtime.backend import Evicting
from ..runtime.compiled import CompiledGraph
from ..runtime.model import CompiledModel
from .frontend import write_json


def _median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(artifact: str, spec: str, tokens: int, prompt_len: int, seed: int = 0) -> dict:
    """Kiln beside eager on the same model in the artifact's dtype, and, for a 16-bit artifact,
    beside eager in float32 too (on a CPU without 16-bit arithmetic, the eager a user would run)."""
    compiled = CompiledModel.load(artifact)
    info = compiled.info
    dtype = DType(info["cache_dtype"])
    # the loader keeps one float32 model a process: converted, a copy
    f32 = catalog.load(spec).model.eval()
    model = f32 if dtype is DType.F32 else copy.deepcopy(f32).to(torch_dtype(dtype))
    cache = hf.cache_spec(model, info["max_seq"])
    if list(cache.shape) != info["cache_shape"] or cache.layers != info["layers"]:
        raise ValueError(f"{artifact} was not compiled from {spec} (its cache layout differs)")
    rng = np.random.default_rng(seed)
    prompt = rng.integers(0, info["vocab_size"], size=(1, prompt_len), dtype=np.int64)
    steps = rng.integers(0, info["vocab_size"], size=tokens + 2)

    # other processes' load decides how long OpenMP's threads wait for cores: it goes with the figures
    load_before = os.getloadavg()[0]
    # Kiln, then eager, in separate blocks: each one's idle threads spin on the cores the other needs
    decode_graph = compiled.decode_graph(prompt_len)
    kiln_prefill = _median_time(lambda: compiled.prefill(prompt), 3)
    _, caches = compiled.prefill(prompt)
    caches = [np.require(c, requirements="CW") for c in caches]
    kiln_logits, kiln_decode = [], []
    for k, token in enumerate(steps):
        args = decode_args(decode_graph.graph, np.array([[token]]), prompt_len + k, caches)
        if k == len(steps) // 2:     # the middle step's kernels, in steps then alone (not a timed step)
            in_step = kernel_times_in_step(decode_graph, args)
            kernel_sum, logits = kernel_times(decode_graph, args)
            kiln_logits.append(logits[0])
            continue
        start = time.perf_counter()
        logits, *_ = decode_graph(*args)
        kiln_decode.append(time.perf_counter() - start)
        kiln_logits.append(logits)

    # eager's prefill computes the logits Kiln's program does (the last position's, by default)
    last_only = info.get("prefill_logits", "all") == "last"
    eager_prefill, eager_decode, eager_logits = _eager(model, cache, last_only, prompt, steps, prompt_len)
    warm = slice(2, None)
    in_f32 = {}
    if dtype is not DType.F32:
        # how far 16-bit rounding alone moves the logits: eager's own, and Kiln's, from float32's
        prefill_f32, decode_f32, f32_logits = _eager(f32, hf.cache_spec(f32, info["max_seq"]), last_only, prompt,
                                                     steps, prompt_len)
        in_f32 = {"eager_f32_decode_tokens_per_s": 1 / statistics.median(decode_f32[warm]),
                  "eager_f32_prefill_tokens_per_s": prompt_len / prefill_f32,
                  "decode_max_rel_error_vs_eager_f32": _max_rel(kiln_logits, f32_logits),
                  "eager_decode_max_rel_error_vs_eager_f32": _max_rel(eager_logits, f32_logits)}
    graphs = compiled.report.get("graphs", {})
    decode_s = statistics.median(kiln_decode[warm])
    return {
        "model": spec, "artifact": artifact, "max_seq": info["max_seq"], "prompt_tokens": prompt_len,
        "decode_tokens_timed": tokens,
        "kiln_decode_tokens_per_s": 1 / decode_s,
        **decode_launch_figures(compiled, decode_s, kernel_sum, in_step),
        "eager_decode_tokens_per_s": 1 / statistics.median(eager_decode[warm]),
        "kiln_prefill_tokens_per_s": prompt_len / kiln_prefill,
        "eager_prefill_tokens_per_s": prompt_len / eager_prefill,
        "dtype": str(model.dtype).removeprefix("torch."), **in_f32,
        "prefill_logits": info.get("prefill_logits", "all"),     # the positions both prefills compute
        "decode_max_rel_error_vs_eager": _max_rel(kiln_logits, eager_logits),
        "load_average_1min_before_and_after": [load_before, os.getloadavg()[0]],
        "search": {name: {"seconds": g["seconds"], "kernels": g["kernels"],
                          "kernel_timings": g["kernels_measured"],
                          "candidates": sum(r["progress"]["tried"] for r in g["regions"]),
                          "valid": sum(r["progress"]["valid"] for r in g["regions"]),
                          "regions": [{"region": r["label"], "measured": r["progress"]["measured"],
                                       "search_s": r["search_s"], "spent": r["progress"].get("spent", {})}
                                      for r in g["regions"]]}
                   for name, g in graphs.items()},
    }


def _eager(model, cache, last_only: bool, prompt, steps, prompt_len: int):
    """Eager's prefill seconds (a median of 3), and its decode steps' seconds and logits (as f32)
    over the given tokens."""
    prefill_step = hf.PrefillStep(model, cache, last_only).eval()
    decode_step = hf.DecodeStep(model, cache).eval()
    with torch.no_grad():
        ids = torch.from_numpy(prompt)
        prefill_s = _median_time(lambda: prefill_step(ids), 3)
        _, *torch_caches = prefill_step(ids)
        decode, outputs = [], []
        for k, token in enumerate(steps):
            start = time.perf_counter()
            logits, *torch_caches = decode_step(torch.tensor([[int(token)]]), torch.tensor(prompt_len + k),
                                                hf.torch_window(window_length(prompt_len + k)), torch_caches)
            decode.append(time.perf_counter() - start)
            outputs.append(logits.float().numpy())
    return prefill_s, decode, outputs


def _max_rel(got: list, want: list) -> float:
    """The largest error of a step's logits relative to the largest of the reference's, over the steps."""
    return max(float(np.abs(g - w).max() / np.abs(w).max()) for g, w in zip(got, want))


def kernel_times(graph: CompiledGraph, args: list) -> tuple[float, list]:
    """One decode step run region by region, each kernel first timed alone on the step's own
    values and sizes, its weights evicted first as the tuner times it (a step reads them from
    memory): the sum of those times, and the step's outputs."""
    backend, total = graph.backend, []

    def visit(executor, inputs, env):
        launch_args = executor.launch_args(dict(zip(executor.program.inputs, inputs)), env)
        for i, kernel in enumerate(executor.program.kernels):
            weights = [executor.arrays[b.name] for b in kernel.inputs
                       if executor.program.buffers[b.name].role == "weight"]
            cold = {"before": backend.evicter(weights)} if weights and isinstance(backend, Evicting) else {}
            times = backend.time(lambda: executor.launch(i, launch_args[i], env), TIMING_TARGET_S, MAX_REPEATS,
                                 **cold)
            total.append(statistics.median(times))
    outputs = graph.inspect(visit, *args)
    return sum(total), outputs


def kernel_times_in_step(graph: CompiledGraph, args: list, steps: int = 5) -> tuple[float, float] | None:
    """Decode steps as they deploy (a replayed recording; `steps` of them, all on `args`: the
    same cache writes), their regions' runners timing each kernel where it runs
    (runtime/cpu_region.py: `timing`): the median over the steps of the sum of a step's kernels'
    wall times, each taken between the others and reading its weights as a step does (cold, in a
    stream across the whole model), and the median over the same steps of a step's wall time over
    its kernels' sum (so that a spell of load on the host slows both sides of the ratio alike).
    None where a region has no runner (the GPU's graphs)."""
    if any(ex.runner is None for ex in graph.executors):
        return None
    seconds = [(ctypes.c_double * max(1, len(ex.sources)))() for ex in graph.executors]
    for executor, kept in zip(graph.executors, seconds):
        executor.runner.timing(kept)
    graph.forget_recordings()         # the next step records the timed runners, then replays them
    sums, ratios = [], []
    try:
        graph(*args)                  # the recording
        for _ in range(steps):
            start = time.perf_counter()
            graph(*args)
            wall = time.perf_counter() - start
            sums.append(sum(sum(kept) for kept in seconds))
            ratios.append(wall / sums[-1])
    finally:
        for executor in graph.executors:
            executor.runner.timing(None)
        graph.forget_recordings()
    return statistics.median(sums), statistics.median(ratios)


def decode_launch_figures(compiled: CompiledModel, step_s: float, kernel_sum: float,
                          in_step: tuple[float, float] | None = None) -> dict:
    """The decode step's measured time beside the sum of its kernels' times, each timed alone in
    this run (kernel_times), and where the backend can, as they ran in a step (kernel_times_in_step):
    those steps' wall time over that sum is the share lost between and around kernels (kernels
    timed alone read weights just flushed from the caches, which this VM serves at up to twice the
    rate of a step's stream across the model). Also the kernels and C calls a token takes (one call where
    the step replays a recording), and the kernels by kind (the op a kernel computes last)."""
    decode = compiled.graphs["decode"]
    kinds = Counter(k.label.split("[")[0] for ex in decode.executors for k in ex.program.kernels)
    calls = 1 if decode.replayed else sum(ex.runner.steps + ex.runner.library_calls if ex.runner
                                          else len(ex.program.kernels) for ex in decode.executors)
    timed_in_step = ({"kiln_decode_kernel_sum_in_step_s": in_step[0],
                      "kiln_decode_step_over_kernel_sum_in_step": in_step[1]} if in_step else {})
    return {"kiln_decode_step_s": step_s, "kiln_decode_kernel_sum_s": kernel_sum,
            "kiln_decode_step_over_kernel_sum": step_s / kernel_sum, **timed_in_step,
            "kiln_kernels_per_token": decode.kernel_count, "kiln_launches_per_token": calls,
            "kiln_decode_replayed": decode.replayed,
            "kiln_decode_kernel_kinds": dict(kinds.most_common())}


def run_compiled_bench(artifact: str, spec: str, tokens: int, prompt_len: int,
                       json_path: str | None) -> dict:
    console = Console() if Console().is_terminal else Console(width=160)
    console.print(f"machine: {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__} "
                  f"({torch.get_num_threads()} threads); prompt {prompt_len} tokens, {tokens} decode "
                  "steps timed (medians, after 2 warm-up steps)")
    with console.status(f"measuring {artifact} against {spec} in eager ..."):
        r = measure(artifact, spec, tokens, prompt_len)
    table = Table(title=f"kiln bench compiled: {spec} in {r['dtype']} on the CPU")
    for col in ("system", "decode tok/s", "prefill tok/s", "decode vs eager"):
        table.add_column(col, justify="right")
    table.add_row(f"PyTorch eager, {r['dtype']}", f"{r['eager_decode_tokens_per_s']:.1f}",
                  f"{r['eager_prefill_tokens_per_s']:.1f}", "1.00x")
    if "eager_f32_decode_tokens_per_s" in r:
        table.add_row("PyTorch eager, float32", f"{r['eager_f32_decode_tokens_per_s']:.1f}",
                      f"{r['eager_f32_prefill_tokens_per_s']:.1f}",
                      f"{r['eager_f32_decode_tokens_per_s'] / r['eager_decode_tokens_per_s']:.2f}x")
    table.add_row("Kiln (cpu)", f"{r['kiln_decode_tokens_per_s']:.1f}", f"{r['kiln_prefill_tokens_per_s']:.1f}",
                  f"{r['kiln_decode_tokens_per_s'] / r['eager_decode_tokens_per_s']:.2f}x")
    console.print(table)
    console.print(f"decode logits max relative error vs eager in {r['dtype']}: {r['decode_max_rel_error_vs_eager']:.1e}"
                  + (f" (vs eager in float32 {r['decode_max_rel_error_vs_eager_f32']:.1e}, eager in {r['dtype']} vs "
                     f"float32 {r['eager_decode_max_rel_error_vs_eager_f32']:.1e})" if "eager_f32_decode_tokens_per_s" in r
                     else "")
                  + "; load average (1 min) before and after: "
                  + ", ".join(f"{x:.2f}" for x in r["load_average_1min_before_and_after"]))
    in_step = r.get("kiln_decode_kernel_sum_in_step_s")
    console.print(f"Kiln decode step {r['kiln_decode_step_s'] * 1e3:.2f} ms end to end; the middle step's "
                  "kernels "
                  + (f"timed where they ran, in replayed steps, sum to {in_step * 1e3:.2f} ms (the median "
                     f"step), those steps taking {r['kiln_decode_step_over_kernel_sum_in_step']:.2f}x their "
                     "kernels' sum; each timed alone, its "
                     "weights flushed, " if in_step else "each timed alone sum ")
                  + f"to {r['kiln_decode_kernel_sum_s'] * 1e3:.2f} ms, "
                  f"{r['kiln_decode_step_over_kernel_sum']:.2f}x; {r['kiln_kernels_per_token']} kernels in "
                  f"{r['kiln_launches_per_token']} calls a token"
                  + (" (a replayed recording)" if r["kiln_decode_replayed"] else ""))
    console.print("decode kernels by kind: " + ", ".join(f"{kind} {n}" for kind, n in
                                                        r["kiln_decode_kernel_kinds"].items()))
    for name, s in r["search"].items():
        console.print(f"search, {name}: {s['candidates']} candidates ({s['valid']} valid), "
                      f"{s['kernel_timings']} kernel timings, {s['kernels']} kernels chosen, "
                      f"{s['seconds']:.0f} s")
        busiest = max(s["regions"], key=lambda x: x["measured"], default=None)
        if busiest and busiest["measured"]:
            console.print(f"  {busiest['region']}: {busiest['measured']} measured in {busiest['search_s']:.0f} s "
                          f"({60 * busiest['measured'] / max(busiest['search_s'], 1e-9):.0f} a minute), "
                          f"{spent_text(busiest['spent'], busiest['measured'])}")
    if json_path:
        write_json(json_path, r)
    return r
