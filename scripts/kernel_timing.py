"""Timing kernels as a compiled model runs them, for the per-kernel tables (scripts/gemv_table.py,
scripts/attention_table.py): launches recorded into a CUDA graph and replayed, the median of
replays timed by CUDA events after replays enough to bring the clocks up from idle."""
import time

import cupy as cp
import numpy as np
import torch

REPLAYS = 15
WARM_UP_S = 0.3          # replays first: an idle H200 runs at 345 MHz


def graph_seconds(launch, rotations: int) -> float:
    """Seconds per launch: a CUDA graph of one launch per rotation, replayed (the median, by CUDA
    events), after replays enough to bring the clocks up from idle."""
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        launch(0)
        stream.begin_capture()
        for r in range(rotations):
            launch(r)
        graph = stream.end_capture()

    def timed() -> float:
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record(stream)
        graph.launch(stream)
        end.record(stream)
        end.synchronize()
        return cp.cuda.get_elapsed_time(start, end) / 1e3
    return _per_launch(timed, rotations)


def torch_graph_seconds(launch, rotations: int) -> float:
    """The same for launches torch makes (its own graph capture: CuPy's does not see its stream)."""
    launch(0)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for r in range(rotations):
            launch(r)

    def timed() -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3
    return _per_launch(timed, rotations)


def _per_launch(timed, rotations: int) -> float:
    begin = time.perf_counter()
    while time.perf_counter() - begin < WARM_UP_S:
        timed()
    return float(np.median([timed() for _ in range(REPLAYS)])) / rotations


def bf16_bits(a: np.ndarray) -> np.ndarray:
    return (a.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)


def from_bits(bits) -> np.ndarray:
    return (np.asarray(bits).astype(np.uint32) << 16).view(np.float32)
