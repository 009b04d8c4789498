"""Would batched timing (calls enqueued together, one wait a batch) agree with the backend's
timing of one call at a time (runtime/cuda.py: CudaBackend.time), and what host time would it
save? Three kernels (an elementwise add, a cuBLAS GEMV, a 64 MB copy), the host idle and then
busy (BUSY processes spinning, as eight compiling workers keep a 16-core host). Prints a JSON
line per kernel and load.

    python3 scripts/timing_bias.py [BUSY]"""
import json
import math
import multiprocessing
import statistics
import sys
import time

import cupy as cp

from kiln.runtime.cuda import CudaBackend


def batched(backend, fn, target_s=0.002, most=50):
    """Three calls, then as many more as target_s asks, each batch enqueued whole."""
    fn()
    times = _batch(backend, fn, 3)
    more = min(most - 3, math.ceil(min((target_s - sum(times)) / max(statistics.median(times), 1e-7), most)))
    return times + (_batch(backend, fn, more) if more > 0 else [])


def _batch(backend, fn, count):
    events = [(cp.cuda.Event(), cp.cuda.Event()) for _ in range(count)]
    for start, end in events:
        backend.evict_l2()
        start.record()
        fn()
        end.record()
    events[-1][1].synchronize()
    return [cp.cuda.get_elapsed_time(start, end) / 1e3 for start, end in events]


def spin(stop):
    while not stop.is_set():
        pass


def main(busy: int) -> None:
    backend = CudaBackend()
    a, b = cp.ones(2048, cp.float32), cp.ones(2048, cp.float32)
    w, x = cp.ones((8192, 2048), cp.float32), cp.ones((2048, 1), cp.float32)
    src = cp.ones(16 << 20, cp.float32)
    dst = cp.empty_like(src)
    kernels = {"add 2048": lambda: cp.add(a, b, out=a), "gemv 2048x8192 f32": lambda: cp.matmul(w, x),
               "copy 64 MB": lambda: dst.__setitem__(slice(None), src)}
    for load in (0, busy):
        stop = multiprocessing.Event()
        spinners = [multiprocessing.Process(target=spin, args=(stop,)) for _ in range(load)]
        for p in spinners:
            p.start()
        for label, fn in kernels.items():
            row = {"kernel": label, "busy processes": load}
            for method, timer in (("batched", lambda f, t, m: batched(backend, f, t, m)), ("one at a time", backend.time)):
                medians, host = [], []
                for _ in range(20):
                    begin = time.perf_counter()
                    medians.append(statistics.median(timer(fn, 0.002, 50)))
                    host.append(time.perf_counter() - begin)
                row[method] = {"median_us": statistics.median(medians) * 1e6, "host_ms": statistics.median(host) * 1e3}
            print(json.dumps(row), flush=True)
        stop.set()
        for p in spinners:
            p.join()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 14)
