"""Compiling one graph: split it into regions at layer boundaries, and for each structurally
distinct region saturate it, search its candidates (checked, measured, journaled) within its share
of the budget, and keep the winner with each kernel's fastest configuration. The compiled graph
runs region by region; identical layers run the same kernels on their own weights."""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..codegen.kernel import KernelConfig
from ..codegen.library import is_library
from ..codegen.schedule import schedule
from ..ir import Graph, Node, evaluate
from ..ir.graph import is_weight
from ..rewrites.registry import library
from ..search import regions as regionlib
from ..search.budget import Deadline
from ..search.saturate import Limits, StageReport, saturate
from ..search.tuner import Progress, RegionTuner
from ..search.tunedb import TuneDB
from .executor import Executor
from .measure import POLICIES, Measurer, Region
from .worker import IsolatedEvaluate


@dataclass
class Choice:
    """The winner of one distinct region: its program (over the region's Input nodes), the
    fusion policy it is scheduled with, and each kernel's configuration."""
    outputs: list[Node]
    variant: str
    configs: list[KernelConfig]


@dataclass
class RegionReport:
    key: str
    label: str
    count: int
    nodes: int
    stages: list[StageReport]
    progress: Progress
    winner: str
    variant: str
    estimate_s: float
    end_to_end_s: float
    saturate_s: float
    search_s: float
    kernels: list[dict] = field(default_factory=list)   # the winner's, with times and traffic


@dataclass
class GraphReport:
    regions: list[RegionReport] = field(default_factory=list)
    kernels_measured: int = 0
    worker_restarts: int = 0      # workers lost to a crashing or hanging candidate
    seconds: float = 0.0


def region_graph(graph: Graph, region: regionlib.Region, outputs: list[Node]) -> Graph:
    """A region's program over its own inputs, reading this region's weights."""
    weights = {i.attrs["name"]: graph.weights[f.attrs["name"]]
               for i, f in zip(region.inputs, region.feeds) if is_weight(i)}
    return Graph(inputs=[i for i in region.inputs if not is_weight(i)], outputs=list(outputs),
                 weights=weights, symbols=dict(graph.symbols))


class CompiledGraph:
    """A graph whose regions run as the search chose them."""

    def __init__(self, graph: Graph, choices: dict[str, Choice], backend):
        self.graph, self.choices, self.backend = graph, choices, backend
        self._recording = None
        self.regions = regionlib.split(graph)
        self.executors = []
        first: dict[str, Executor] = {}     # identical regions share a program and its kernels
        for region in self.regions:
            choice = choices[region.key]
            sub = region_graph(graph, region, choice.outputs)
            like = first.get(region.key)
            program = like.program if like else schedule(sub, POLICIES[choice.variant])
            executor = Executor(sub, program, choice.configs, backend, like=like)
            first.setdefault(region.key, executor)
            self.executors.append(executor)

    @classmethod
    def untuned(cls, graph: Graph, backend) -> CompiledGraph:
        """Every region as lowered, with the first fusion policy and default configurations: no
        search (diagnostics, and tests of the machinery around the kernels)."""
        variant = next(iter(POLICIES))
        choices = {}
        for region in regionlib.split(graph):
            if region.key not in choices:
                program = schedule(region_graph(graph, region, region.outputs), POLICIES[variant])
                choices[region.key] = Choice(region.outputs, variant,
                                             [backend.default_config()] * len(program.kernels))
        return cls(graph, choices, backend)

    @property
    def sources(self) -> dict[str, str]:
        return {name: src for ex in self.executors for name, src in ex.sources}

    @property
    def kernel_count(self) -> int:
        return sum(len(ex.program.kernels) for ex in self.executors)

    @property
    def peak_bytes(self) -> int:
        return sum(ex.plan.peak_bytes for ex in self.executors)

    def __call__(self, *args) -> list:
        """Outputs as the backend's arrays (numpy on the CPU); inputs numpy or the backend's.
        Where the backend records launches (CUDA graphs) and every input size is fixed (decode),
        a call replays the recording."""
        if self._replayable:
            return self._replay(args)
        return self._run([self.backend.input(a) for a in args], copy=True)

    @property
    def _replayable(self) -> bool:
        """A recording holds while no symbol changes: every input size fixed, no symbol a kernel
        reads (writing one would copy from the host inside the recording); and no library call
        (CuPy allocates its temporaries, which a recording must not)."""
        return (hasattr(self.backend, "capture") and
                all(d.is_const for n in self.graph.inputs for d in n.shape) and
                not any(k.symbols for ex in self.executors for k in ex.program.kernels) and
                not any(is_library(name) for name in self.sources))

    def _run(self, args: list, copy: bool) -> list:
        dtypes = [self.backend.logical_dtype(a, n.dtype) for a, n in zip(args, self.graph.inputs)]
        self.graph.bind_symbols([tuple(a.shape) for a in args], dtypes)
        values: dict[int, object] = {id(n): a for n, a in zip(self.graph.inputs, args)}
        for region, executor in zip(self.regions, self.executors):
            feeds = [values[id(f)] for i, f in zip(region.inputs, region.feeds) if not is_weight(i)]
            # between regions, outputs stay in the producing executor's memory (it runs once a call)
            for node, value in zip(region.produces, executor(*feeds, copy=copy)):
                values[id(node)] = value
        return [values[id(o)] for o in self.graph.outputs]

    def _replay(self, args) -> list:
        """Host inputs (token ids, positions) are copied into fixed device buffers; device inputs
        (the KV cache) are used where they are, so a recording holds for as long as the caller
        passes the same device arrays."""
        b = self.backend
        key = tuple(b.address(a) if b.is_device(a) else (np.shape(a), np.asarray(a).dtype.str) for a in args)
        if self._recording is None or self._recording[0] != key:
            self._recording = None      # free the old recording's buffers first
            staged = [a if b.is_device(a) else b.input(np.asarray(a)) for a in args]
            self._run(staged, copy=False)     # loads every kernel; checks inputs outside the recording
            outputs: list = []
            replay = b.capture(lambda: outputs.extend(self._run(staged, copy=False)))
            self._recording = (key, staged, outputs, replay)
        _, staged, outputs, replay = self._recording
        for buffer, a in zip(staged, args):
            if buffer is not a:
                b.write(buffer, np.asarray(a))
        replay()
        passed = {id(a) for a in staged}
        return [o if id(o) in passed else o.copy() for o in outputs]

    def host(self, *args) -> list[np.ndarray]:
        return [self.backend.to_host(out, node.dtype) for out, node in zip(self(*args), self.graph.outputs)]


def compile_graph(graph: Graph, backend, args: list[np.ndarray], seconds: float, db: TuneDB,
                  fingerprint: str, compile_id: str | None = None, seed: int = 0,
                  max_candidates: int = 100_000, isolate: bool = True,
                  on_progress: Callable[[Progress, float], None] = lambda p, left: None,
                  ) -> tuple[CompiledGraph, GraphReport]:
    """Search every distinct region of `graph` within `seconds` in all; `args` are call inputs
    whose reference run supplies each region's inputs (real activations). `isolate`: measure
    candidates in a worker process (runtime/worker.py), so a crashing kernel costs only itself."""
    start = time.monotonic()
    compile_id = compile_id or uuid.uuid4().hex
    parts = regionlib.split(graph)
    groups = regionlib.distinct(parts)
    reps = [group[0] for group in groups.values()]
    inflows, env = regionlib.sample_inflows(graph, reps, args)
    total_work = sum(g[0].size * len(g) for g in groups.values())
    rules = list(library().values())
    report, choices = GraphReport(), {}
    # candidates run their kernels for the first time in a worker process (one for all regions);
    # the winner's kernels, checked there, run here
    isolated = IsolatedEvaluate(backend.name, db.path, fingerprint) if isolate else None
    try:
        for (key, group), feeds in zip(groups.items(), inflows):
            # half the budget is shared equally (a small region can hold the heaviest kernel, the
            # vocabulary projection), half by work (IR nodes times repeats)
            _search_region(graph, key, group, feeds, env, backend, db, fingerprint, compile_id, seed,
                           max_candidates, rules, isolated, report, choices, on_progress,
                           seconds * (0.5 / len(groups) + 0.5 * group[0].size * len(group) / total_work))
    finally:
        if isolated:
            report.kernels_measured += isolated.kernels_measured
            report.worker_restarts += isolated.restarts
            isolated.close()
    report.seconds = time.monotonic() - start
    return CompiledGraph(graph, choices, backend), report


def _search_region(graph, key, group, feeds, env, backend, db, fingerprint, compile_id, seed, max_candidates,
                   rules, isolated, report, choices, on_progress, seconds) -> None:
    """Saturate, search and tune one distinct region within `seconds`; records its choice and report."""
    rep = group[0]
    deadline = Deadline(seconds)
    t0 = time.monotonic()
    saturated = saturate(rep.outputs, rules, Limits(max_seconds=max(1.0, deadline.remaining() / 4)))
    saturate_s = time.monotonic() - t0
    inputs = [i for i in rep.inputs if not is_weight(i)]
    sub = region_graph(graph, rep, rep.outputs)
    region = Region(inputs, sub.weights, dict(graph.symbols), [feeds[i] for i in inputs],
                    evaluate(rep.outputs, feeds, env))
    measurer = Measurer(backend, db, fingerprint, region, deadline=deadline)
    if isolated:
        isolated.load(region, deadline)
    label = rep.label if len(group) == 1 else f"{rep.label} (x{len(group)})"
    tuner = RegionTuner(key, label, rep.outputs, saturated, list(POLICIES),
                        isolated or measurer.evaluate, measurer.end_to_end, db, compile_id, seed,
                        lambda p, d=deadline: on_progress(p, d.remaining()))
    winner = tuner.run(deadline, max_candidates)
    _, program, configs = measurer.build(winner.outputs, winner.variant)
    choices[key] = Choice(winner.outputs, winner.variant, configs)
    report.kernels_measured += measurer.kernels_measured
    report.regions.append(RegionReport(
        key, label, len(group), rep.size, saturated.stages, winner.progress, winner.key,
        winner.variant, winner.estimate_s, winner.end_to_end_s, saturate_s,
        time.monotonic() - t0 - saturate_s, measurer.kernel_report(program, configs)))
