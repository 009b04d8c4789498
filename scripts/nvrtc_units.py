"""NVRTC's time for a decode layer's search configurations compiled as the CUDA backend compiles
them (runtime/cache.py: units, a unit per thread) beside a module per configuration, on THREADS
threads (a compile's worker has two cores). Needs no GPU: NVRTC from CuPy's install or the
nvidia-cuda-nvrtc-cu12 wheel (KILN_NVRTC names the library if neither is found).

    python3 scripts/nvrtc_units.py LOWERED [THREADS] [CONFIGS]

LOWERED: a folder `kiln lower` wrote (e.g. `kiln lower llama-3.2-1b --out lowered/llama1b`);
CONFIGS: configurations per kernel, from each kernel's first (the search times four)."""
import ctypes
import ctypes.util
import glob
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from kiln.codegen.cuda_emit import PRELUDE
from kiln.codegen.policy import POLICIES
from kiln.codegen.schedule import schedule
from kiln.frontend.hf import read_lowered
from kiln.ir import regions as regionlib
from kiln.ir.serialize import graph_from_json
from kiln.runtime.cache import units
from kiln.runtime.cuda import CudaBackend

POLICY = "inline64-bcast16-epilogue-merge"      # the layer's winner in the H100 compiles of 2026-12-05


def nvrtc() -> ctypes.CDLL:
    found = [os.environ.get("KILN_NVRTC"), _cupys_nvrtc()] + sorted(glob.glob(os.path.join(
        sys.prefix, "lib", "python3*", "site-packages", "nvidia", "cuda_nvrtc", "lib", "libnvrtc.so*")))
    found.append(ctypes.util.find_library("nvrtc"))
    for path in filter(None, found):
        return ctypes.CDLL(path)
    raise SystemExit("no libnvrtc: pip install nvidia-cuda-nvrtc-cu12, or set KILN_NVRTC")


def _cupys_nvrtc() -> str | None:
    """The NVRTC library CuPy loads (the runtime's compiler), where CuPy is installed."""
    try:
        from cupy.cuda import nvrtc as cupy_nvrtc
        cupy_nvrtc.getVersion()
    except Exception:      # no CuPy, or no NVRTC for it
        return None
    with open("/proc/self/maps") as maps:
        return next((line.split()[-1] for line in maps if "libnvrtc" in line and "builtins" not in line), None)


def compiler(lib: ctypes.CDLL):
    def compile_unit(source: str) -> None:
        prog = ctypes.c_void_p()
        assert lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"unit.cu", 0, None, None) == 0
        options = [b"--std=c++17", b"-arch=sm_90"]      # as CuPy compiles for an H100 or H200
        status = lib.nvrtcCompileProgram(prog, len(options), (ctypes.c_char_p * len(options))(*options))
        lib.nvrtcDestroyProgram(ctypes.byref(prog))
        assert status == 0, f"NVRTC failed ({status})"
    return compile_unit


def layer_sources(folder: str, configs: int) -> list[str]:
    record, small = read_lowered(folder)
    graph = graph_from_json(record["decode"], None)
    weights = dict(small)
    for node in graph.weight_nodes():      # their values do not matter to the kernels' source
        shape = tuple(d.value for d in node.shape)
        weights.setdefault(node.attrs["name"], np.broadcast_to(np.zeros((), node.dtype.np), shape))
    graph = graph_from_json(record["decode"], weights)
    layer = max(regionlib.distinct(regionlib.split(graph)).values(), key=len)[0].program(graph)
    return [CudaBackend.render(kernel, config)[1] for kernel in schedule(layer, POLICIES[POLICY]).kernels
            for config in CudaBackend.config_space(kernel)[:configs]]


def main() -> None:
    folder, threads = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 2
    sources = layer_sources(folder, int(sys.argv[3]) if len(sys.argv) > 3 else 4)
    compile_unit = compiler(nvrtc())
    compile_unit(PRELUDE)      # NVRTC's own start, once

    def seconds(modules: list[str]) -> float:
        start = time.perf_counter()
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(compile_unit, modules))
        return time.perf_counter() - start

    forms = {"a module each": [PRELUDE + s for s in sources],
             "units": [PRELUDE + "\n".join(sources[i] for i in unit)
                       for unit in units(list(range(len(sources))), threads)]}
    runs = {name: [seconds(modules) for _ in range(3)] for name, modules in forms.items()}
    for name, times in runs.items():
        print(f"{len(sources)} configurations, {len(forms[name])} modules ({name}) on {threads} threads: "
              f"median {statistics.median(times):.2f} s of {[round(t, 2) for t in times]}")
    print(f"units: {statistics.median(runs['a module each']) / statistics.median(runs['units']):.2f}x")


if __name__ == "__main__":
    main()
