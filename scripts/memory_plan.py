"""The device memory a compiled graph's temporaries take, per region arenas against the one
scratch the regions share (runtime/executor.py: Scratch), from graphs `kiln lower` saved:
    python scripts/memory_plan.py lowered/llama1b-4096 prefill
Weights are stand-ins (zeros, never touched): only the shapes matter."""
import json
import sys

import ml_dtypes  # noqa: F401  (bf16 weights)
import numpy as np

from kiln.codegen.policy import POLICIES
from kiln.codegen.schedule import schedule
from kiln.ir.serialize import graph_from_json
from kiln.runtime.executor import Scratch, plan_buffers
from kiln.ir import regions as regionlib

path, which = sys.argv[1], sys.argv[2]
with open(path + ".json") as f:
    graph = graph_from_json(json.load(f)[which])
graph.weights = {n.attrs["name"]: np.zeros(tuple(int(d.value) for d in n.shape), n.dtype.np)
                 for n in graph.weight_nodes()}
plans, per_region = {}, []
for region in regionlib.split(graph):
    if region.key not in plans:
        plans[region.key] = plan_buffers(schedule(region.program(graph), POLICIES[next(iter(POLICIES))]))
    per_region.append(plans[region.key])
scratch = Scratch.sizes(list(plans.values()))
print(f"{path} {which}, symbols at their largest {dict(graph.symbols)}: {len(per_region)} regions; "
      f"an arena per region {sum(p.peak_bytes for p in per_region) / 1e9:.1f} GB; shared: outputs "
      f"{sum(p.kept_bytes for p in per_region) / 1e9:.2f} GB + scratch {sum(scratch) / 1e9:.1f} GB")
