"""SmolLM2's decode layer under fusion policies on the CPU, side by side in one process: each
policy's program as lowered, checked against the reference interpreter on the layer's real
activations (a reference run of the whole decode graph at position POS), then timed whole (a call
as an executor makes it, outputs left in its arena) and kernel by kernel, with the layer's weights dropped from every cache
level before each timed call as the search times them (EVICT=0: warm, the weights left cached).
Usage: python scripts/layer_policies.py POLICY... (keys of codegen/policy.py's POLICIES; POS, the
decode position, 200 by default; REPEATS, 200); prints a table a policy."""
import os
import sys
import time

import numpy as np

from kiln.codegen.policy import POLICIES
from kiln.codegen.schedule import schedule
from kiln.frontend import hf
from kiln.ir import evaluate, regions as regionlib
from kiln.ir.decode import decode_args
from kiln.runtime.cpu import CpuBackend
from kiln.runtime.executor import Executor

POS = int(os.environ.get("POS", "200"))
REPEATS = int(os.environ.get("REPEATS", "200"))
EVICT = os.environ.get("EVICT", "1") == "1"


def _median_us(run, before) -> float:
    times = []
    for _ in range(REPEATS):
        before()
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return float(np.median(times)) * 1e6


def main(policies: list[str]) -> None:
    unknown = [p for p in policies if p not in POLICIES]
    if unknown or not policies:
        sys.exit(f"layer_policies: name policies among: {', '.join(POLICIES)}" + (
            f" (not {', '.join(unknown)})" if unknown else ""))
    model, _ = hf.load_smollm2()
    lowered = hf.lower_causal_lm(model, max_seq=256)
    graph, rng = lowered.decode, np.random.default_rng(0)
    caches = [rng.standard_normal(c.shape).astype(np.float32) * 0.5 for c in lowered.cache.zeros()]
    args = decode_args(graph, rng.integers(0, 1000, (1, 1)), POS, caches)
    regions = regionlib.split(graph)
    feeds, env = regionlib.sample_inflows(graph, regions, args)
    layer = regions[1].program(graph)
    leaves = {**feeds[1], **{w: layer.weights[w.attrs["name"]] for w in layer.weight_nodes()}}
    want = evaluate(layer.outputs, leaves, env)
    inputs = [feeds[1][i] for i in layer.inputs]
    backend = CpuBackend()
    print(f"SmolLM2 decode layer at position {POS}, weights {'evicted' if EVICT else 'cached'}, "
          f"medians of {REPEATS}")
    for key in policies:
        program = schedule(layer, POLICIES[key])
        ex = Executor(layer, program, [CpuBackend.default_config(k) for k in program.kernels], backend)
        got = ex(*[a.copy() for a in inputs])
        error = max(float(np.abs(np.asarray(g) - w).max()) for g, w in zip(got, want))
        weights = [ex.arrays[n] for n, b in program.buffers.items() if b.role == "weight"]
        evict = backend.evicter(weights) if EVICT else (lambda: None)
        own = [a.copy() for a in inputs]          # the caches update in place, the same each call
        whole = _median_us(lambda: ex(*own, copy=False), evict)
        print(f"{key}: {len(program.kernels)} kernels, {whole:.0f} us, largest error {error:.1e}")
        bound, sizes = ex.bind([a.copy() for a in inputs])
        kernel_args = ex.launch_args(bound, sizes)
        for i, kernel in enumerate(program.kernels):
            alone = _median_us(lambda i=i: ex.launch(i, kernel_args[i], sizes), evict)
            print(f"  {alone:7.1f} us  {kernel.label[:72]}")


if __name__ == "__main__":
    main(sys.argv[1:])
