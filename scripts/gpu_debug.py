"""Diagnostics for the CUDA backend on the GPU machine: per-kernel check of a lowered program
against the reference interpreter (the first kernel that disagrees, with its source), and how
long NVRTC compiles take. Usage: python3 scripts/gpu_debug.py lowered/tiny2_f32 [more ...]"""
import sys
import time

import numpy as np

from kiln.codegen.schedule import schedule
from kiln.frontend import catalog
from kiln.frontend.hf import load_lowered
from kiln.ir import evaluate
from kiln.ir.decode import CACHES_START, decode_args
from kiln.ir.compare import mismatch
from kiln.runtime.cuda import CudaBackend
from kiln.runtime.executor import Executor
from tests.test_cuda import TINY_CASES, tiny_model

backend = CudaBackend()
for path in sys.argv[1:]:
    tag = path.rsplit("/", 1)[-1]
    if tag in TINY_CASES:
        model = tiny_model(tag)
    else:
        import torch
        model = catalog.load("llama-3.2-1b").model.to(torch.bfloat16)
    lm = load_lowered(path, model)
    g = lm.decode
    rng = np.random.default_rng(0)
    args = decode_args(g, np.array([[3]]), 5, [
        (rng.standard_normal(tuple(int(d.value) for d in n.shape)) * 0.5).astype(n.dtype.np)
        for n in g.inputs[CACHES_START:]])
    program = schedule(g)
    t = time.perf_counter()
    ex = Executor(g, program, [backend.default_config(k) for k in program.kernels], backend, reuse=False)
    print(f"{tag}: {len(program.kernels)} kernels, NVRTC compile {time.perf_counter() - t:.1f} s", flush=True)
    traced = ex.trace(*[a.copy() for a in args])
    feeds = dict(zip(g.inputs, args))
    feeds.update({n: g.weights[n.attrs["name"]] for n in g.weight_nodes()})
    names = [k.output.name for k in program.kernels]
    env = g.bind_symbols([np.shape(a) for a in args], [np.asarray(a).dtype for a in args])
    want = evaluate([program.nodes[n] for n in names], feeds, env)
    bad = 0
    for kernel, name, w in zip(program.kernels, names, want):
        problem = mismatch(traced[name], w)
        if problem:
            bad += 1
            if bad == 1:
                print("FIRST BAD", kernel.label, problem, "\n", backend.render(kernel, backend.default_config(kernel))[1])
                print("inputs:", [(b.name, b.dtype, str(b.size)) for b in kernel.inputs])
    print(f"{tag}: {bad} of {len(names)} kernels disagree", flush=True)
    t = time.perf_counter()
    for _ in range(20):
        ex(*args)
    backend.synchronize()
    print(f"{tag}: {(time.perf_counter() - t) / 20 * 1e3:.2f} ms per decode step (no graph)", flush=True)
