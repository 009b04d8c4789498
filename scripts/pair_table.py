"""The pair table (codegen/pairs.py): Llama-3.2-1B's decode layer under the merge policy, each
kernel whose points read a sum at a rotary partner (the query projection; the key and value
projections with the cache writes), every configuration the search offers it timed as decode runs
kernels (a CUDA graph replaying launches over rotating copies of the weights, so that nothing
comes from the L2 cache), the pair forms beside the same forms computing both sums at every point.
A pair form's outputs must equal its unpaired form's bit for bit (the same sums in the same
order), or the row says so. Weights random, integer inputs (the position) zero.
Usage on the GPU machine: python3 scripts/pair_table.py [LOWERED]  (default lowered/llama1b;
prints a row a kernel, JSON to $OUT/pairs.json)"""
import json
import os
import sys
from dataclasses import replace

import cupy as cp
import numpy as np
import torch

from kiln.codegen.cuda_config import CudaConfig, config_space
from kiln.codegen.pairs import pairable
from kiln.codegen.policy import POLICIES
from kiln.codegen.schedule import schedule
from kiln.frontend import catalog
from kiln.frontend.hf import load_lowered
from kiln.ir import DType
from kiln.ir import regions as regionlib
from kiln.runtime.cuda import CudaBackend
from kernel_timing import bf16_bits, graph_seconds

ROTATIONS_BYTES = 2e9
WEIGHT_ELEMENTS = 1 << 20      # an input this large is a weight: rotated, so it comes from memory


def _inputs(kernel, rng):
    arrays = {}
    for b in kernel.inputs:
        n = b.size.evaluate({})
        if b.dtype in (DType.I32, DType.I64):
            arrays[b.name] = cp.zeros(n, dtype=b.dtype.np)
        elif b.dtype is DType.BF16:
            arrays[b.name] = cp.asarray(bf16_bits(rng.standard_normal(n) * 0.02))
        else:
            arrays[b.name] = cp.asarray(rng.standard_normal(n).astype(b.dtype.np))
    return arrays


def measure(backend, rng, kernel) -> list[dict]:
    weights = [b.name for b in kernel.inputs if b.size.evaluate({}) >= WEIGHT_ELEMENTS]
    weight_bytes = sum(b.size.evaluate({}) * b.dtype.itemsize for b in kernel.inputs if b.name in weights)
    rotations = int(max(4, min(32, ROTATIONS_BYTES // weight_bytes)))
    copies = [_inputs(kernel, rng) for _ in range(rotations)]
    for name in set(copies[0]) - set(weights):       # one copy of what every rotation shares
        for c in copies[1:]:
            c[name] = copies[0][name]
    outputs = {b.name: cp.zeros(b.size.evaluate({}), dtype=cp.uint16 if b.dtype is DType.BF16 else b.dtype.np)
               for b in kernel.outputs}
    symbols = backend.symbol_buffer(len(kernel.symbols))
    order = [b.name for b in (*kernel.outputs, *kernel.inputs)]
    configs = [c for c in config_space(kernel) if isinstance(c, CudaConfig)]
    sources = {c: backend.render(kernel, c) for c in configs}
    functions = backend.compile(dict(sources.values()))
    rows, results = [], {}
    for config, (name, _) in sources.items():
        launcher = backend.launcher(functions[name], kernel, config)

        def launch(r, launcher=launcher):
            launcher([outputs[b] if b in outputs else copies[r][b] for b in order] + [symbols], {})
        for o in outputs.values():
            o.fill(0xFFFF if o.dtype == cp.uint16 else 0)
        launch(0)
        results[config] = [o.get() for o in outputs.values()]
        seconds = graph_seconds(launch, rotations)
        rows.append({"kernel": kernel.label, "config": config.key(), "pair": config.pair, "s": seconds,
                     "weight_bytes": weight_bytes, "bytes_per_s": weight_bytes / seconds})
    for row, config in zip(rows, sources):
        twin = replace(config, pair=not config.pair)
        if twin in results:
            row["same_as_twin"] = all(np.array_equal(a, b) for a, b in zip(results[config], results[twin]))
    return rows


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else "lowered/llama1b"
    model = catalog.load("llama-3.2-1b").model.to(torch.bfloat16)
    graph = load_lowered(path, model).decode
    layer = regionlib.split(graph)[1].program(graph)
    program = schedule(layer, POLICIES["inline64-bcast16-epilogue-merge"])
    backend, rng, rows = CudaBackend(), np.random.default_rng(0), []
    for kernel in (k for k in program.kernels if pairable(k)):
        measured = measure(backend, rng, kernel)
        rows += measured
        best = {p: min((r for r in measured if r["pair"] == p), key=lambda r: r["s"]) for p in (True, False)}
        wrong = [r["config"] for r in measured if r.get("same_as_twin") is False]
        print(f"{kernel.label[:60]}: {best[True]['weight_bytes'] / 1e6:.1f} MB of weights; paired "
              f"{best[True]['s'] * 1e6:.2f} us ({best[True]['bytes_per_s'] / 1e12:.2f} TB/s) [{best[True]['config']}], "
              f"both sums at every point {best[False]['s'] * 1e6:.2f} us ({best[False]['bytes_per_s'] / 1e12:.2f} TB/s) "
              f"[{best[False]['config']}]; outputs differing from the twin form: {wrong or 'none'}", flush=True)
        for r in sorted(measured, key=lambda r: r["s"])[:8]:
            print(f"    {r['s'] * 1e6:7.2f} us  {r['config']}")
        with open(os.path.join(os.environ.get("OUT", "."), "pairs.json"), "w") as f:
            json.dump({"rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
