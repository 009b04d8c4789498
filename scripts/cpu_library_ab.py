"""The CPU's library products three ways, A/B/C in one process: a compiled artifact's prefill timed
with each in turn (rounds alternate, medians of each round's calls). PyTorch's matmul (MKL) on
PyTorch's threads is what Kiln runs (runtime/cpu.py); numpy's BLAS (OpenBLAS, one thread for the
process) in one call, or with the product's columns split among threads of the script's own (what
Kiln ran before 2026-12-05), are the others.
Usage: python scripts/cpu_library_ab.py ARTIFACT [PROMPT_TOKENS] [JSON]  (prints; JSON to the file)"""
import json
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

import kiln
from kiln.runtime import cpu
from kiln.runtime.hardware import usable_cores

ROUNDS, CALLS = 8, 5
_POOL = ThreadPoolExecutor(max_workers=usable_cores())


def _numpy_split(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    n = b.shape[-1]
    parts = max(1, min(usable_cores(), n // 64))
    out = np.empty(np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (a.shape[-2], n), np.float32)
    edges = [n * i // parts for i in range(parts + 1)]
    list(_POOL.map(lambda i: np.matmul(a, b[..., edges[i]:edges[i + 1]], out=out[..., edges[i]:edges[i + 1]]),
                   range(parts)))
    return out


def main():
    artifact = sys.argv[1]
    tokens = int(sys.argv[2]) if len(sys.argv) > 2 else 64
    model = kiln.load(artifact)
    prompt = np.random.default_rng(0).integers(0, model.info["vocab_size"], size=(1, tokens))
    modes = {"PyTorch's matmul": cpu._HOST.matmul, "numpy one call": np.matmul,
             "numpy split": _numpy_split}
    rounds = {name: [] for name in modes}
    for _ in range(ROUNDS):
        for name, matmul in modes.items():
            object.__setattr__(cpu._HOST, "matmul", matmul)
            model.prefill(prompt)
            times = []
            for _ in range(CALLS):
                start = time.perf_counter()
                model.prefill(prompt)
                times.append(time.perf_counter() - start)
            rounds[name].append(statistics.median(times))
    result = {"artifact": artifact, "prompt_tokens": tokens, "load_average_1min": os.getloadavg()[0],
              "prefill_s": rounds, "median_s": {k: statistics.median(v) for k, v in rounds.items()},
              "command": "python scripts/cpu_library_ab.py " + " ".join(sys.argv[1:])}
    for name, seconds in result["median_s"].items():
        print(f"{name:16s} prefill of {tokens} tokens {seconds * 1e3:7.1f} ms ({tokens / seconds:.0f} tok/s); "
              f"rounds {', '.join(f'{s * 1e3:.0f}' for s in rounds[name])} ms")
    if len(sys.argv) > 3:
        with open(sys.argv[3], "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
