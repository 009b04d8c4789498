"""The CPU's library products split among threads or not, A/B in one process: a compiled
artifact's prefill timed with each in turn (rounds alternate, medians of each round's calls).
Both run with whatever OpenMP spin bound `import kiln` could set (runtime/openmp.py; run it with
GOMP_SPINCOUNT=300000 for libgomp's default).
Usage: python scripts/cpu_blas_split.py ARTIFACT [PROMPT_TOKENS] [JSON]  (prints; JSON to the file)"""
import json
import os
import statistics
import sys
import time

import numpy as np

import kiln
from kiln.runtime import cpu, openmp

ROUNDS, CALLS = 8, 5


def main():
    artifact = sys.argv[1]
    tokens = int(sys.argv[2]) if len(sys.argv) > 2 else 64
    model = kiln.load(artifact)
    prompt = np.random.default_rng(0).integers(0, model.info["vocab_size"], size=(1, tokens))
    modes = {"one BLAS call": lambda a, b: np.matmul(a, b), "columns split": cpu._matmul_on_every_core}
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
    result = {"artifact": artifact, "prompt_tokens": tokens, "brief_spin": openmp.BRIEF_SPIN,
              "gomp_spincount": os.environ.get("GOMP_SPINCOUNT"), "load_average_1min": os.getloadavg()[0],
              "prefill_s": rounds, "median_s": {k: statistics.median(v) for k, v in rounds.items()},
              "command": "python scripts/cpu_blas_split.py " + " ".join(sys.argv[1:])}
    for name, seconds in result["median_s"].items():
        print(f"{name:14s} prefill of {tokens} tokens {seconds * 1e3:7.1f} ms ({tokens / seconds:.0f} tok/s); "
              f"rounds {', '.join(f'{s * 1e3:.0f}' for s in rounds[name])} ms")
    if len(sys.argv) > 3:
        with open(sys.argv[3], "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
