"""The attention table (the prefill issue's per-kernel check): Llama-3.2-1B's attention as Kiln
fuses it (32 query heads over 8 key/value heads, 64 wide, bf16; the causal mask the model computes,
an f32 tensor of 0 and bf16's lowest value), every tiling of the fused kernel timed as prefill runs
kernels (launches replayed in a CUDA graph), beside PyTorch's scaled_dot_product_attention on the
same tensors: causal (flash attention, what Hugging Face calls for an unpadded prompt) and given
the mask (what it calls for a padded one). The same kernel is timed with the mask's hidden places
at -inf too. FLOP rates count the causal half: 2 * 2 * heads * depth * length * (length + 1) / 2.
Usage on the GPU machine: python3 scripts/attention_table.py [LOWERED]  (default
lowered/llama1b-4096, `kiln lower llama-3.2-1b --max-seq 4096 --dtype bfloat16`; prints the table,
JSON to $OUT/attention.json; ATTENTION_LENGTHS=512,2048 the prompt lengths)"""
import json
import os
import sys

import cupy as cp
import numpy as np
import torch
import torch.nn.functional as F

from kiln.codegen.attention import as_attention
from kiln.codegen.cuda_attention import attention_space
from kiln.codegen.policy import POLICIES
from kiln.codegen.schedule import schedule
from kiln.frontend.hf import read_lowered
from kiln.ir.graph import Graph, is_weight
from kiln.ir.last_position import last_position
from kiln.ir.regions import split
from kiln.ir.serialize import graph_from_json
from kiln.runtime.cuda import CudaBackend
from kernel_timing import bf16_bits, from_bits, graph_seconds, torch_graph_seconds

LENGTHS = tuple(int(n) for n in os.environ.get("ATTENTION_LENGTHS", "512,2048").split(","))
HEADS, KV_HEADS, DEPTH = 32, 8, 64
LAUNCHES = 20             # per recorded graph
POLICY = "inline12-bcast1-rows-attention"


def llama_attention_kernel(lowered: str):
    """The fused attention kernel of the first layer of the lowered model's prefill, as the
    compiler schedules it."""
    graph = graph_from_json(read_lowered(lowered)[0]["prefill"])
    graph.weights = {n.attrs["name"]: np.empty(0) for n in graph.weight_nodes()}
    layer = next(r for r in split(last_position(graph, at_length=True)) if r.label.startswith("layer"))
    program = Graph(inputs=[i for i in layer.inputs if not is_weight(i)], outputs=list(layer.outputs),
                    weights={}, symbols=dict(graph.symbols))
    return next(k for k in schedule(program, POLICIES[POLICY]).kernels if as_attention(k))


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    """‖got − want‖ / ‖want‖ (NaN when anything is NaN)."""
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def main():
    lowered = sys.argv[1] if len(sys.argv) > 1 else "lowered/llama1b-4096"
    kernel = llama_attention_kernel(lowered)
    attention = as_attention(kernel)
    q_name, k_name, v_name = attention.q.load.buffer, attention.k.load.buffer, attention.v.buffer
    backend, rows = CudaBackend(), []
    configs = attention_space(kernel)
    sources = {c: backend.render(kernel, c) for c in configs}
    functions = backend.compile(dict(sources.values()))
    gen = torch.Generator().manual_seed(0)
    for n in LENGTHS:
        flops = 4 * HEADS * DEPTH * n * (n + 1) / 2
        q, k, v = (torch.randn(1, h, n, DEPTH, generator=gen).to(torch.bfloat16)
                   for h in (HEADS, KV_HEADS, KV_HEADS))
        hidden = torch.ones(n, n, dtype=torch.bool).triu(1)
        lowest = torch.finfo(torch.bfloat16).min
        # the kernel's layouts: q [heads, n, depth], k [kv heads, n, depth] (as the model permutes
        # them), v [n, kv heads * depth] and the output [n, heads * depth] (as the projections write)
        feeds = {q_name: q[0], k_name: k[0], v_name: v[0].transpose(0, 1).reshape(n, -1)}
        device = {name: cp.asarray(bf16_bits(t.float().numpy())) for name, t in feeds.items()}
        out = cp.empty(n * HEADS * DEPTH, dtype=cp.uint16)
        symbols = backend.symbol_buffer(len(kernel.symbols))
        backend.write_symbols(symbols, [n])
        want = F.scaled_dot_product_attention(q.float(), k.float().repeat_interleave(4, 1),
                                              v.float().repeat_interleave(4, 1), is_causal=True)
        want = want[0].transpose(0, 1).reshape(n, -1).numpy()
        # the causal mask is computed in the kernel from the positions (as the model's, bf16's lowest)
        args = [out] + [device[b.name] for b in kernel.inputs] + [symbols]
        for config, (name, _) in sources.items():
            launcher = backend.launcher(functions[name], kernel, config)
            out.fill(0xFFFF)          # NaN: an element the kernel leaves unwritten fails the check
            launcher(args, {"seq": n})
            got = from_bits(out.get()).reshape(n, -1)
            error = relative_error(got, want)
            seconds = graph_seconds(lambda r: [launcher(args, {"seq": n}) for _ in range(LAUNCHES)],
                                    1) / LAUNCHES
            rows.append({"length": n, "system": "kiln", "mask": "computed", "config": config.key(),
                         "s": seconds, "flops_per_s": flops / seconds, "rel_err": error})
        # keys and values repeated per query head beforehand, as Hugging Face's repeat_kv does
        tq, tk, tv = (t.cuda() for t in (q, k.repeat_interleave(4, 1), v.repeat_interleave(4, 1)))
        tmask = torch.zeros(n, n, device="cuda", dtype=torch.bfloat16).masked_fill(hidden.cuda(), lowest)
        for label, call in (("causal (flash)", lambda: F.scaled_dot_product_attention(
                                tq, tk, tv, is_causal=True)),
                            ("mask given", lambda: F.scaled_dot_product_attention(
                                tq, tk, tv, attn_mask=tmask))):
            got = call()[0].transpose(0, 1).reshape(n, -1).float().cpu().numpy()
            seconds = torch_graph_seconds(lambda r: [call() for _ in range(LAUNCHES)], 1) / LAUNCHES
            rows.append({"length": n, "system": "torch sdpa", "mask": label, "config": "", "s": seconds,
                         "flops_per_s": flops / seconds,
                         "rel_err": relative_error(got, want)})
    for r in rows:
        print(f"  {r['length']:5d} {r['system']:10s} {r['mask']:26s} {r['config']:20s} {r['s'] * 1e6:8.2f} us "
              f"{r['flops_per_s'] / 1e12:6.1f} TFLOP/s  rel err {r['rel_err']:.1e}")
    with open(os.path.join(os.environ.get("OUT", "."), "attention.json"), "w") as f:
        json.dump({"kernel": kernel.label, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
