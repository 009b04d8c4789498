"""The GEMV table (the decode issue's per-kernel check): each product of a Llama-3.2-1B decode step
(x [1, K] bf16 times a [N, K] bf16 weight: 2048->2048, 2048->512, 2048->8192, 8192->2048,
2048->128256) as Kiln schedules it, every configuration of the CUDA template timed as decode runs
kernels (a CUDA graph replaying launches over rotating copies of the weight, so that nothing comes
from the L2 cache), beside the copy bandwidth, a copy moving as many bytes and torch.mv (cuBLAS)
timed the same way. A small product's time is mostly a launch's fixed cost, which the copy of as
many bytes pays too: that is its ceiling in this launch mode.
Usage on the GPU machine: python3 scripts/gemv_table.py [N K ...]  (default: the five products; a
shape's row is printed, and the JSON in $OUT/gemv.json rewritten, as soon as it is measured, so a
call cut off by its time limit keeps the shapes it finished)"""
import json
import os
import sys

import cupy as cp
import numpy as np
import torch

from kiln.codegen.cuda_config import CudaConfig, config_space, splittable
from kiln.codegen.schedule import schedule
from kiln.ir import DType, Graph, Node, Op
from kiln.frontend.lowerings.reductions import matmul
from kiln.ir.build import permute
from kiln.ir.symbolic import shape_of
from kiln.runtime.cuda import CudaBackend
from kernel_timing import bf16_bits, from_bits, graph_seconds, torch_graph_seconds

SHAPES = ((2048, 2048), (512, 2048), (8192, 2048), (2048, 8192), (128256, 2048))   # (N, K)
ROTATIONS_BYTES = 2e9        # weight copies per graph: enough to overflow the L2 many times over


def gemv_kernel(n: int, k: int):
    """The one kernel Kiln schedules for x @ w.T as the frontend lowers it: the product and the sum
    in f32 (as torch computes a bf16 matmul)."""
    x = Node(Op.INPUT, name="x", role="input", shape=shape_of((1, k)), dtype=DType.BF16)
    w = Node(Op.INPUT, name="w", role="weight", shape=shape_of((n, k)), dtype=DType.BF16)
    graph = Graph([x], [matmul(x, permute(w, (1, 0)), DType.BF16)])
    # the product's kernel; a graph output's cast to bf16 is a kernel of its own here, where in a
    # model it is read by the next kernel
    return schedule(graph).kernels[0]


def measure(backend, rng, copy: float, n: int, k: int) -> list[dict]:
    """Every configuration of the product's kernel, torch.mv and a copy of as many bytes."""
    rows = []
    kernel = gemv_kernel(n, k)
    rotations = int(max(4, min(32, ROTATIONS_BYTES // (n * k * 2))))
    weights = [cp.asarray(bf16_bits(rng.standard_normal((n, k)) * 0.02)) for _ in range(rotations)]
    x = cp.asarray(bf16_bits(rng.standard_normal(k)))
    want = from_bits(weights[0].get()).reshape(n, k) @ from_bits(x.get())
    out = cp.empty(n, dtype=cp.uint16 if kernel.outputs[0].dtype is DType.BF16 else cp.float32)
    symbols = backend.symbol_buffer(0)
    # the kernel's buffers by size: the weight holds n * k elements, x k, the output n
    weight_name = next(b.name for b in kernel.inputs if b.size.value == n * k)
    order = [b.name for b in (*kernel.outputs, *kernel.inputs)]
    # the search's space, then the rest of the template's grid: what the space may be missing
    offered = [c for c in config_space(kernel) if isinstance(c, CudaConfig)]
    width = offered[0].vector
    grid = [CudaConfig(block, group, width, split=parts) for block in (128, 256, 512, 1024)
            for group in (4, 8, 16, 32, 64, 128, 256, block) for parts in (1, 2, 4)
            if group <= block and (parts == 1 or splittable(kernel))]
    configs = list(dict.fromkeys(offered + grid))
    sources = {c: backend.render(kernel, c) for c in configs}
    functions = backend.compile(dict(sources.values()))
    for config, (name, _) in sources.items():
        launcher = backend.launcher(functions[name], kernel, config)

        def launch(r, launcher=launcher):
            launcher([out if b == kernel.outputs[0].name else weights[r] if b == weight_name else x
                      for b in order] + [symbols], {})
        launch(0)
        got = from_bits(out.get()) if out.dtype == cp.uint16 else out.get()
        error = float(np.abs(got - want).max() / np.abs(want).max())
        seconds = graph_seconds(launch, rotations)
        rows.append({"shape": [n, k], "system": "kiln", "config": config.key(), "offered": config in offered,
                     "s": seconds,
                     "bytes_per_s": n * k * 2 / seconds, "of_copy": n * k * 2 / seconds / copy,
                     "rel_err": error})
    tw = [torch.as_tensor(w.view(cp.int16), device="cuda").view(torch.bfloat16).reshape(n, k) for w in weights]
    tx = torch.as_tensor(x.view(cp.int16), device="cuda").view(torch.bfloat16)
    touts = [torch.empty(n, dtype=torch.bfloat16, device="cuda") for _ in weights]
    seconds = torch_graph_seconds(lambda r: torch.mv(tw[r], tx, out=touts[r]), rotations)
    rows.append({"shape": [n, k], "system": "torch.mv (cuBLAS)", "config": "", "s": seconds,
                 "bytes_per_s": n * k * 2 / seconds, "of_copy": n * k * 2 / seconds / copy, "rel_err": 0.0})
    # the ceiling at this size in this launch mode: a copy moving as many bytes (half read,
    # half written) as the product reads, over rotating buffers the same way
    copy_from = [cp.ones(n * k // 4, cp.float32) for _ in weights]
    copy_to = [cp.empty_like(a) for a in copy_from]
    seconds = graph_seconds(lambda r: copy_to[r].__setitem__(slice(None), copy_from[r]), rotations)
    rows.append({"shape": [n, k], "system": "copy, as many bytes", "config": "", "s": seconds,
                 "bytes_per_s": n * k * 2 / seconds, "of_copy": n * k * 2 / seconds / copy, "rel_err": 0.0})
    return rows


def summary(rows: list[dict], n: int, k: int) -> str:
    mine = [r for r in rows if r["system"] == "kiln" and r["rel_err"] < 1e-2]
    best = min((r for r in mine if r["offered"]), key=lambda r: r["s"])
    anywhere = min(mine, key=lambda r: r["s"])
    cublas = next(r for r in rows if r["system"].startswith("torch"))
    same = next(r for r in rows if r["system"].startswith("copy"))
    return (f"  {k:>6d} -> {n:<6d} Kiln {best['s'] * 1e6:7.2f} us {best['bytes_per_s'] / 1e12:5.2f} TB/s "
            f"{best['of_copy']:6.1%} of copy, {same['s'] / best['s']:6.1%} of a copy of as many bytes "
            f"({same['s'] * 1e6:.2f} us) [{best['config']}]   cuBLAS {cublas['s'] * 1e6:7.2f} us "
            f"{cublas['of_copy']:6.1%}; the template's best anywhere {anywhere['of_copy']:6.1%} "
            f"[{anywhere['config']}] ({len(mine)} configurations)")


def main():
    numbers = [int(a) for a in sys.argv[1:]]
    shapes = list(zip(numbers[::2], numbers[1::2])) or SHAPES
    backend, rng, rows = CudaBackend(), np.random.default_rng(0), []
    copy = backend.copy_bandwidth()
    print(f"copy bandwidth {copy / 1e12:.2f} TB/s (read plus written); each row: the weight's bytes over the "
          "time of one launch in a replayed CUDA graph", flush=True)
    for n, k in shapes:
        measured = measure(backend, rng, copy, n, k)
        rows += measured
        print(summary(measured, n, k), flush=True)
        with open(os.path.join(os.environ.get("OUT", "."), "gemv.json"), "w") as f:
            json.dump({"copy_bytes_per_s": copy, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
