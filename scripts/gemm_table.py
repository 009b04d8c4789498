"""The GEMM table (the prefill issue's per-kernel check of the tensor-core template): each product of
a Llama-3.2-1B prefill layer (x [M, K] bf16 times a [N, K] bf16 weight) at prompts of 32, 512 and
2,048 tokens, as Kiln schedules it alone and with the residual add as its epilogue (one kernel:
h = r + bf16(x wᵀ)), every tensor-core tiling (codegen/cuda_gemm.py) and Kiln's cuBLAS call timed
as prefill runs kernels (launches replayed in a CUDA graph, weights rotated past the L2 cache),
beside torch.matmul (cuBLAS), and for the epilogue torch's matmul then add.
Usage on the GPU machine: python3 scripts/gemm_table.py  (prints the table; JSON to $OUT/gemm.json);
GEMM_CASE="M N K CONFIG" times that product alone, without its epilogue, in that tiling (the one
launch ncu profiles: the `ncu` step of scripts/gpu_session.sh with NCU_TABLE=gemm)."""
import json
import os

import cupy as cp
import numpy as np
import torch

from kiln.codegen.cuda_gemm import MMA_SPACE, as_tensor_gemm
from kiln.codegen.library import LibraryConfig
from kiln.codegen.policy import POLICIES
from kiln.codegen.schedule import schedule
from kiln.frontend.lowerings.reductions import matmul
from kiln.ir import DType, Graph, Node, Op
from kiln.ir.build import permute
from kiln.ir.symbolic import shape_of
from kiln.runtime.cuda import CudaBackend
from kernel_timing import bf16_bits, from_bits, graph_seconds, torch_graph_seconds

LENGTHS = (32, 512, 2048)
SHAPES = ((2048, 2048), (8192, 2048), (2048, 8192))       # (N, K)
CASE = os.environ.get("GEMM_CASE", "").split()
if CASE:
    LENGTHS, SHAPES = (int(CASE[0]),), ((int(CASE[1]), int(CASE[2])),)
ROTATION_BYTES = 256e6       # weight copies per graph: more than the L2 holds


def product_kernel(m: int, n: int, k: int, residual: bool):
    """The one kernel Kiln schedules for x wᵀ (with `residual`, r + x wᵀ, the add its epilogue)."""
    x = Node(Op.INPUT, name="x", role="input", shape=shape_of((m, k)), dtype=DType.BF16)
    w = Node(Op.INPUT, name="w", role="weight", shape=shape_of((n, k)), dtype=DType.BF16)
    inputs, out = [x], matmul(x, permute(w, (1, 0)), DType.BF16)
    if residual:
        r = Node(Op.INPUT, name="r", role="input", shape=shape_of((m, n)), dtype=DType.BF16)
        inputs, out = [x, r], Node(Op.ADD, [r, out])
    program = schedule(Graph(inputs, [out]), POLICIES["inline12-bcast1-epilogue"])
    kernels = program.kernels
    assert len(kernels) == 1 and as_tensor_gemm(kernels[0]), [k.label for k in kernels]
    # each buffer the kernel reads, by the name of the input or weight it holds
    return kernels[0], {b.name: program.buffers[b.name].source for b in kernels[0].inputs}


def main():
    backend, rng, rows = CudaBackend(), np.random.default_rng(0), []
    for m in LENGTHS:
        for n, k in SHAPES:
            rotations = int(max(1, min(8, ROTATION_BYTES // (n * k * 2))))
            weights = [cp.asarray(bf16_bits(rng.standard_normal((n, k)) * 0.02)) for _ in range(rotations)]
            x = cp.asarray(bf16_bits(rng.standard_normal((m, k))))
            r = cp.asarray(bf16_bits(rng.standard_normal((m, n))))
            product = from_bits(x.get()).reshape(m, k) @ from_bits(weights[0].get()).reshape(n, k).T
            flops = 2 * m * n * k
            for residual in (False,) if CASE else (False, True):
                kernel, sources_of = product_kernel(m, n, k, residual)
                want = product + (from_bits(r.get()).reshape(m, n) if residual else 0)
                out = cp.empty(m * n, dtype=cp.uint16)
                configs = list(MMA_SPACE) + ([LibraryConfig()] if not residual else [])
                if CASE:
                    configs = [c for c in configs if c.key() == CASE[3]]
                sources = {c: backend.render(kernel, c) for c in configs}
                functions = backend.compile(dict(sources.values()))
                symbols = backend.symbol_buffer(0)
                for config, (name, _) in sources.items():
                    launcher = backend.launcher(functions[name], kernel, config)

                    def launch(i, launcher=launcher):
                        feeds = {"x": x, "r": r, "w": weights[i]}
                        args = [out] + [feeds[sources_of[b.name]] for b in kernel.inputs] + [symbols]
                        launcher(args, {})
                    out.fill(0xFFFF)       # NaN: an element left unwritten fails the check
                    launch(0)
                    got = from_bits(out.get()).reshape(m, n)
                    error = float(np.linalg.norm(got - want) / np.linalg.norm(want))
                    seconds = graph_seconds(launch, rotations)
                    rows.append({"m": m, "n": n, "k": k, "epilogue": residual, "system": "kiln",
                                 "config": config.key(), "s": seconds, "flops_per_s": flops / seconds,
                                 "rel_err": error})
                tw = [torch.as_tensor(w.view(cp.int16), device="cuda").view(torch.bfloat16).reshape(n, k)
                      for w in weights]
                tx = torch.as_tensor(x.view(cp.int16), device="cuda").view(torch.bfloat16).reshape(m, k)
                tr = torch.as_tensor(r.view(cp.int16), device="cuda").view(torch.bfloat16).reshape(m, n)
                call = (lambda i: tr + tx @ tw[i].T) if residual else (lambda i: tx @ tw[i].T)
                seconds = torch_graph_seconds(call, rotations)
                rows.append({"m": m, "n": n, "k": k, "epilogue": residual,
                             "system": "torch" + (" matmul + add" if residual else " matmul"), "config": "",
                             "s": seconds, "flops_per_s": flops / seconds, "rel_err": 0.0})
            del weights
    for row in rows:
        print(f"  {row['m']:5d} x {row['n']:5d} x {row['k']:5d} {'+ residual' if row['epilogue'] else '          '} "
              f"{row['system']:20s} {row['config']:22s} {row['s'] * 1e6:8.2f} us {row['flops_per_s'] / 1e12:6.1f} "
              f"TFLOP/s  rel err {row['rel_err']:.1e}")
    with open(os.path.join(os.environ.get("OUT", "."), "gemm.json"), "w") as f:
        json.dump({"rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
