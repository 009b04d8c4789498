"""Does batched timing (runtime/cuda.py: CudaBackend.time, one wait a batch) agree with timing each
call alone (wait, evict, time one call), and what host time does each take? Three kernels (an
elementwise add, a cuBLAS GEMV, a 64 MB copy), the host idle and then busy (BUSY processes
spinning, as eight compiling workers keep a 16-core host). Prints a JSON line per kernel and load.

    python3 scripts/timing_bias.py [BUSY]"""
import json
import multiprocessing
import statistics
import sys
import time

import cupy as cp

from kiln.runtime.cuda import CudaBackend


def one_at_a_time(backend, fn, target_s=0.002, most=50):
    evict = backend._l2_evicter()
    fn()
    times = []
    while len(times) < 3 or (sum(times) < target_s and len(times) < most):
        cp.cuda.Device().synchronize()
        evict()
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, end) / 1e3)
    return times


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
            for method, timer in (("batched", backend.time), ("one at a time", lambda f, t, m: one_at_a_time(backend, f, t, m))):
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
