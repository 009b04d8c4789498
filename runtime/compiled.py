"""A compiled graph: its regions run as the search chose them (a `Choice` per distinct region),
identical layers the same kernels on their own weights. What running an artifact needs, and
nothing of the search."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..codegen.kernel import KernelConfig
from ..codegen.policy import POLICIES
from ..codegen.schedule import Program, schedule
from ..ir import Graph, Node, ShapeError, regions as regionlib
from ..ir.graph import is_weight
from .backend import Recording
from .executor import Executor, Scratch, fixed_symbols, plan_buffers


@dataclass
class Choice:
    """The winner of one distinct region: its program (over the region's Input nodes), the
    fusion policy it is scheduled with, and each kernel's configuration."""
    outputs: list[Node]
    variant: str
    configs: list[KernelConfig]


def region_graph(graph: Graph, region: regionlib.Region, outputs: list[Node]) -> Graph:
    """A region's program over its own inputs, reading this region's weights."""
    weights = {i.attrs["name"]: graph.weights[f.attrs["name"]]
               for i, f in zip(region.inputs, region.feeds) if is_weight(i)}
    return Graph(inputs=[i for i in region.inputs if not is_weight(i)], outputs=list(outputs),
                 weights=weights, symbols=dict(graph.symbols))


def read_inputs(graph: Graph) -> list[Node]:
    read = {id(x) for node in graph.nodes() for x in node.inputs} | {id(o) for o in graph.outputs}
    return [n for n in graph.inputs if id(n) in read]


def replays(graph: Graph) -> bool:
    """Whether a backend that records launches runs `graph` as recordings, one for each value of
    the symbols the inputs it reads give (runtime/executor.py: fixed_symbols): decode has none
    (one recording; the window it attends over is a symbol the kernels read on the device), a
    prefill its prompt's length (a prompt padded to one of a few lengths: ir/last_position.py).
    Its outputs' sizes must follow from those symbols."""
    fixed = fixed_symbols(read_inputs(graph))
    return all(d.symbols() <= fixed for n in graph.outputs for d in n.shape)


def records(backend, graph: Graph) -> bool:
    """Whether `backend` runs `graph` as recordings: it records launches, the graph's sizes follow
    from its inputs (`replays`), and it records each size or the graph has one (decode)."""
    return (isinstance(backend, Recording) and replays(graph)
            and (backend.records_each_size or not fixed_symbols(read_inputs(graph))))


MAX_RECORDINGS = 8     # a prefill's padded lengths (32 ... 4,096 doubling: 8)


class CompiledGraph:
    """A graph whose regions run as the search chose them."""

    def __init__(self, graph: Graph, choices: dict[str, Choice], backend,
                 regions: list[regionlib.Region] | None = None):
        """`regions`: the graph's, where the caller has split it already."""
        self.graph, self.choices, self.backend = graph, choices, backend
        self._recordings: dict[tuple, tuple] = {}     # fixed symbols' values -> its recording
        self._ran: dict[tuple, bool] = {}    # fixed symbols' values called before -> recordable
        self._bound: dict[tuple, dict[str, int]] = {}   # call signature -> its symbols' values
        self.regions = regions if regions is not None else regionlib.split(graph)
        self.executors = []
        self._symbol_buffers: dict = {}     # shared by every region: a replay writes each once
        subs = [region_graph(graph, region, choices[region.key].outputs) for region in self.regions]
        programs: dict[str, Program] = {}   # identical regions share a program and its kernels
        for region, sub in zip(self.regions, subs):
            if region.key not in programs:
                programs[region.key] = schedule(sub, POLICIES[choices[region.key].variant])
        self.scratch = Scratch(backend, [plan_buffers(p) for p in programs.values()])
        fixed = fixed_symbols(read_inputs(graph))
        first: dict[str, Executor] = {}
        for region, sub in zip(self.regions, subs):
            choice, like = choices[region.key], first.get(region.key)
            executor = Executor(sub, programs[region.key], choice.configs, backend, like=like, deployed=True,
                                symbol_buffers=self._symbol_buffers, scratch=self.scratch, fixed=fixed)
            first.setdefault(region.key, executor)
            self.executors.append(executor)
        # asked once: a decode step is short, and the question walks every kernel (~80 us for 60
        # kernels here, on every call, before it was kept)
        self._replayable = records(backend, graph) and all(ex.replayable for ex in self.executors)
        # where each symbol is read from (an input's dimension), and the inputs no node reads:
        # what a replayed step needs of its arguments
        self._fixed = sorted(fixed)
        self._symbol_dims = {}
        for i, node in enumerate(graph.inputs):
            for axis, dim in enumerate(node.shape):
                if dim.symbol_name is not None:
                    self._symbol_dims.setdefault(dim.symbol_name, (i, axis))
        read = {id(x) for node in graph.nodes() for x in node.inputs} | {id(o) for o in graph.outputs}
        self._unread = {i for i, node in enumerate(graph.inputs) if id(node) not in read}
        # the inputs a region's program writes in place (the KV cache)
        index = {id(node): i for i, node in enumerate(graph.inputs)}
        self._written = {index[id(feed)] for region, ex in zip(self.regions, self.executors)
                         for feed, name in zip((f for i, f in zip(region.inputs, region.feeds) if not is_weight(i)),
                                               ex.program.inputs)
                         if name in set(ex.program.aliases.values()) and id(feed) in index}
        # per region, the nodes whose values it is called with (its weights are its own)
        self._feeds = [[f for i, f in zip(region.inputs, region.feeds) if not is_weight(i)]
                       for region in self.regions]

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
                                             [backend.default_config(k) for k in program.kernels])
        return cls(graph, choices, backend)

    @property
    def sources(self) -> dict[str, str]:
        """Every kernel's source, and every region runner's where the backend has them."""
        kernels = {name: src for ex in self.executors for name, src in ex.sources}
        runners = dict(ex.runner.source for ex in self.executors if ex.runner is not None)
        return {**kernels, **runners}

    @property
    def records(self) -> bool:
        """Whether calls replay recordings (CUDA graphs), from the second of each size on."""
        return self._replayable

    @property
    def replayed(self) -> bool:
        """Whether a call replayed a recording (a CUDA graph) of the graph."""
        return bool(self._recordings)

    @property
    def kernel_count(self) -> int:
        return sum(len(ex.program.kernels) for ex in self.executors)

    @property
    def peak_bytes(self) -> int:
        return sum(ex.plan.kept_bytes for ex in self.executors) + self.scratch.bytes

    def __call__(self, *args) -> list:
        """Outputs as the backend's arrays (numpy on the CPU); inputs numpy or the backend's.
        Where the backend records launches (CUDA graphs) and every region's executor can be
        recorded, a call of sizes that ran before replays a recording of them."""
        if self._replayable:
            return self._replay(args)
        return self._run([self.backend.input(a) for a in args], copy=True)

    def inspect(self, visit: Callable[[Executor, list, dict[str, int]], None], *args) -> list:
        """A call run region by region, never replayed, with `visit(executor, its inputs, the
        call's symbols)` before each region runs (diagnostics: a real step's kernels timed one by
        one on its own values)."""
        return self._run([self.backend.input(a) for a in args], copy=True, visit=visit)

    def _run(self, args: list, copy: bool, recording: bool = False, visit=None) -> list:
        """The graph's inputs are checked once, here; its regions are called with the symbols
        this binds (a region's inputs follow from the graph's), without checking theirs again:
        SmolLM2's decode spent 1-2 ms a token binding its 32 regions one by one."""
        env = self._env(args)
        values: dict[int, object] = {id(n): a for n, a in zip(self.graph.inputs, args)}
        if not recording:
            self._write_symbols(env)
        for region, feeds, executor in zip(self.regions, self._feeds, self.executors):
            inputs = [values[id(f)] for f in feeds]
            if visit is not None:
                visit(executor, inputs, env)
            # between regions, outputs stay in the producing executor's memory (it runs once a call)
            outputs = executor.run_bound(inputs, env, recording=recording, symbols_written=True)
            for node, value in zip(region.produces, outputs):
                values[id(node)] = value
        passed = {id(a) for a in args}      # inputs written in place go back as they are
        return [values[id(o)] if not copy or id(values[id(o)]) in passed else values[id(o)].copy()
                for o in self.graph.outputs]

    def _env(self, args: list) -> dict[str, int]:
        """The symbols' values of a call, its inputs checked: a call of the shapes and dtypes of
        one before passes the same checks (decode's 60 caches are checked once, not every step:
        ~0.5 ms a SmolLM2 step on the CPU)."""
        dtypes = [self.backend.logical_dtype(a, n.dtype) for a, n in zip(args, self.graph.inputs)]
        signature = (tuple(tuple(a.shape) for a in args), tuple(map(str, dtypes)))
        env = self._bound.get(signature)
        if env is None:
            env = self._bound[signature] = self.graph.bind_symbols([tuple(a.shape) for a in args], dtypes)
        return env

    def _replay(self, args) -> list:
        """Host inputs (token ids, positions) are copied into fixed device buffers, of their
        largest sizes; device inputs (the KV cache) are used where they are, so a recording holds
        for as long as the caller passes the same device arrays. A recording is made on the
        second call of its fixed symbols' values (the first runs launched: it loads the kernels
        and checks the inputs, and a prompt length seen once costs no recording); it launches
        every kernel at the other symbols' largest sizes, and before each replay the symbols'
        values are written where the kernels read them. A step's host work is kept to those
        copies: the checks (dtypes, shapes, symbol ranges) ran on the first call, and an input of
        the same kind passes them again (a decode step's host time is a share of its time)."""
        b = self.backend
        env = {}
        for symbol, (i, axis) in self._symbol_dims.items():
            env[symbol] = value = np.shape(args[i])[axis]
            lo, hi = self.graph.symbols[symbol]
            if not lo <= value <= hi:    # checked here: a replay skips the full check
                raise ShapeError(f"kiln: input {i} ('{self.graph.inputs[i].attrs['name']}') dimension "
                                 f"{axis} is {value}, outside {symbol}'s range {lo}..{hi}")
        fixed = tuple(env[name] for name in self._fixed)
        if not self._ran.get(fixed, False):       # a first call, or sizes cuBLAS takes otherwise
            outputs = self._run([b.input(a) for a in args], copy=True)
            self._ran.setdefault(fixed, all(ex.replayable_at(ex.recording_sizes(env)) for ex in self.executors))
            return outputs
        key = tuple(b.address(a) if b.resident(a, i in self._written) else (np.ndim(a), np.asarray(a).dtype.str)
                    for i, a in enumerate(args))
        recording = self._recordings.get(fixed)
        if recording is None or recording[0] != key:
            self._recordings.pop(fixed, None)      # free the old recording's buffers first
            while len(self._recordings) >= MAX_RECORDINGS:
                self._recordings.pop(next(iter(self._recordings)))
            recording = self._recordings[fixed] = (key, *self._record(args))
        _, staged, outputs, replay = recording
        self._stage(staged, args, views=False)
        self._write_symbols(env)
        replay()
        passed = {id(a) for a in staged}
        return [o if id(o) in passed else o.copy() for o in outputs]

    def forget_recordings(self) -> None:
        """The next call of each size records anew (after a runner's launches changed: a timed
        diagnostic run)."""
        self._recordings.clear()

    def _write_symbols(self, env: dict[str, int]) -> None:
        """The symbols' values where every region's kernels read them, once a call."""
        for symbols, buffer in self._symbol_buffers.items():
            if symbols:
                self.backend.write_symbols(buffer, [env[s] for s in symbols])

    def _record(self, args) -> tuple[list, list, Callable[[], None]]:
        """The staging buffers, the outputs and the replay of a recording made on `args`."""
        b = self.backend
        largest = {name: hi for name, (lo, hi) in self.graph.symbols.items()}
        staged = [a if b.resident(a, i in self._written) else
                  b.input(np.zeros(tuple(d.evaluate(largest) for d in n.shape), np.asarray(a).dtype))
                  for i, (a, n) in enumerate(zip(args, self.graph.inputs))]
        views = self._stage(staged, args)
        self._env(views)                 # checked outside the recording
        outputs: list = []
        replay = b.capture(lambda: outputs.extend(self._run(views, copy=False, recording=True)))
        return staged, outputs, replay

    def _stage(self, staged: list, args, views: bool = True) -> list:
        """Each host input written into the front of its fixed buffer; with `views`, the inputs
        as the recording is made on: device inputs as they are, host ones as views of their own
        shapes at the front of their buffers (the addresses the recording holds). An input no
        node reads (decode's window: only its length counts) is never copied."""
        out = []
        for i, (buffer, a) in enumerate(zip(staged, args)):
            if buffer is not a and (views or i not in self._unread):
                a = np.asarray(a)
                buffer = buffer if a.shape == buffer.shape else buffer.reshape(-1)[:a.size].reshape(a.shape)
                if i not in self._unread:
                    self.backend.write(buffer, a)
                a = buffer
            out.append(a)
        return out

    def host(self, *args) -> list[np.ndarray]:
        return [self.backend.to_host(out, node.dtype) for out, node in zip(self(*args), self.graph.outputs)]
