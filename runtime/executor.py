"""Runs a scheduled program: a static buffer plan (temporaries share memory when their lifetimes
do not overlap), kernels launched in order, symbols bound per call, and inputs written in place
where the program says so (the KV cache)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..codegen.kernel import KernelConfig
from ..codegen.library import is_library
from ..codegen.packing import PackedWeights
from ..codegen.schedule import Program
from ..ir.graph import Graph
from .backend import Evicting


def fixed_symbols(inputs: list) -> frozenset[str]:
    """The symbols a recording (a CUDA graph) holds fixed: those the shapes of the inputs a
    program reads give (a prompt's length: every product's rows). The others vary from replay to
    replay of one recording (decode's window, a padded prompt's real length: graph inputs whose
    length alone counts, which no region reads); kernels read them on the device, and a recording
    launches at their largest."""
    return frozenset(d.symbol_name for n in inputs for d in n.shape if d.symbol_name is not None)


@dataclass
class BufferPlan:
    """Temporaries mapped to slots of one arena; sizes are bytes at the symbols' largest values.
    `kept`: the slots holding an output, which the program's caller reads after it ran."""
    slot_of: dict[str, int]
    slot_bytes: list[int]
    kept: frozenset[int] = frozenset()

    @property
    def peak_bytes(self) -> int:
        return sum(self.slot_bytes)

    @property
    def kept_bytes(self) -> int:
        return sum(self.slot_bytes[s] for s in self.kept)

    @property
    def scratch_bytes(self) -> list[int]:
        """The sizes of the other slots, in order: memory free again once the program ran."""
        return [n for s, n in enumerate(self.slot_bytes) if s not in self.kept]


class Scratch:
    """Memory the regions of one compiled graph share for their temporaries. Regions run one
    after another, and what one leaves for the next (its outputs) is kept apart, so the graph
    needs its largest region's temporaries rather than their sum: Llama-3.2-1B's prefill at
    4,096 tokens holds 2 GiB score matrices in each of its 16 layers, and with an arena per
    region did not fit the 141 GB of an H200."""

    def __init__(self, backend, plans: list[BufferPlan]):
        self.buffers = [backend.allocate(n) for n in self.sizes(plans)]

    @staticmethod
    def sizes(plans: list[BufferPlan]) -> list[int]:
        """Buffer j holds every plan's j-th scratch slot: the largest of them."""
        sizes: list[int] = []
        for plan in plans:
            for j, n in enumerate(plan.scratch_bytes):
                if j == len(sizes):
                    sizes.append(n)
                sizes[j] = max(sizes[j], n)
        return sizes

    @property
    def bytes(self) -> int:
        return sum(int(b.nbytes) for b in self.buffers)


def plan_buffers(program: Program, reuse: bool = True) -> BufferPlan:
    """Greedy slot assignment by first definition; `reuse=False` gives every temporary its own
    slot (the tuner re-runs single kernels and needs every input still in place)."""
    biggest = {name: hi for name, (lo, hi) in program.symbols.items()}
    temps = [name for name, b in program.buffers.items()
             if b.role == "temp" and name not in program.aliases]
    last_use: dict[str, int] = {}
    first_def: dict[str, int] = {}
    for k, kernel in enumerate(program.kernels):
        for out in kernel.outputs:
            first_def.setdefault(out.name, k)
        for b in kernel.inputs:
            last_use[b.name] = k
    end = len(program.kernels)
    for name in program.outputs:
        last_use[name] = end
    slot_of, slot_bytes, slot_free_at = {}, [], []
    for name in sorted(temps, key=lambda n: first_def.get(n, 0)):
        b = program.buffers[name]
        size = max(1, b.size.evaluate(biggest)) * b.dtype.itemsize
        start = first_def.get(name, 0)
        free = [s for s in range(len(slot_bytes))
                if reuse and slot_free_at[s] < start and slot_bytes[s] >= size]
        if free:
            slot = min(free, key=lambda s: slot_bytes[s])
        else:
            slot = len(slot_bytes)
            slot_bytes.append(size)
            slot_free_at.append(0)
        slot_of[name] = slot
        slot_free_at[slot] = last_use.get(name, start)
    kept = frozenset(slot_of[name] for name in program.outputs if name in slot_of)
    return BufferPlan(slot_of, slot_bytes, kept)


class Executor:
    """A compiled program bound to its weights on a backend, ready to call.

    The backend (runtime/cpu.py, runtime/cuda.py) renders and compiles kernels, owns the memory
    and launches; the executor holds the buffer plan and the launch list. Inputs and outputs are
    the backend's arrays (numpy on the CPU); numpy inputs are accepted everywhere."""

    def __init__(self, graph: Graph, program: Program, configs: list[KernelConfig], backend,
                 weights: dict[str, np.ndarray] | None = None, reuse: bool = True,
                 like: Executor | None = None, deployed: bool = False,
                 symbol_buffers: dict[tuple[str, ...], object] | None = None,
                 sizes: dict[str, int] | None = None, scratch: Scratch | None = None,
                 fixed: frozenset[str] | None = None):
        """`like`: an executor of the same program (an identical layer) whose compiled kernels
        this one shares; only the weights differ. `deployed`: a call runs the kernels as the
        backend deploys them, where it has a mode of its own (the CPU: one C call per region,
        runtime/cpu_region.py); launch, launch_args and trace stay kernel by kernel.
        `symbol_buffers`: the buffers kernels read their symbols from, one per tuple of symbols,
        shared with the other regions of a compiled graph (a recorded step writes each once).
        `sizes`: values of symbols a call's input shapes do not give (a region measured alone:
        a decode layer's window comes from the graph's input, not the layer's). `scratch`: the
        memory for temporaries this executor shares with the other regions of a compiled graph
        (sized from this program's plan among theirs); its outputs get memory of their own.
        `fixed`: the symbols a recording holds, those of the whole graph where this program is
        one of its regions (fixed_symbols; by default its own inputs')."""
        self.graph, self.program, self.backend = graph, program, backend
        self.configs, self.sizes = list(configs), dict(sizes or {})
        if like is not None:
            self.sources, self.functions = like.sources, like.functions
        else:
            self.sources = [backend.render(k, c) for k, c in zip(program.kernels, configs)]
            functions = backend.compile(dict(self.sources))
            self.functions = [functions[name] for name, _ in self.sources]
        self.plan = plan_buffers(program, reuse)
        self._views: dict[tuple[str, tuple[int, ...]], object] = {}   # (buffer, shape) -> its view
        shared = iter(scratch.buffers if scratch is not None else ())
        arena = [backend.allocate(n) if scratch is None or s in self.plan.kept else next(shared)
                 for s, n in enumerate(self.plan.slot_bytes)]
        weights = PackedWeights(graph.weights if weights is None else weights, program.packings)
        self.weights = weights
        self.arrays = {}
        for name, b in program.buffers.items():
            if b.role == "weight":
                host = np.asarray(weights[b.source], dtype=b.dtype.np)
                # the model's array itself is uploaded once for every executor that reads it; a
                # converted or packed copy is this executor's alone
                shared = host is weights[b.source] and b.source not in program.packings
                self.arrays[name] = backend.upload_weight(host) if shared else backend.upload(host)
            elif name in self.plan.slot_of:
                self.arrays[name] = arena[self.plan.slot_of[name]]
        # per kernel: its buffers (a fixed address, or the name of a call input) and its symbols
        self.symbol_buffers = {} if symbol_buffers is None else symbol_buffers
        for kernel in program.kernels:
            if kernel.symbols not in self.symbol_buffers:
                self.symbol_buffers[kernel.symbols] = backend.symbol_buffer(len(kernel.symbols))
        # a recording launches each kernel at the varying symbols' largest sizes; the kernel reads
        # the sizes of the call from its symbol buffer and covers only those points
        self.largest = {name: hi for name, (lo, hi) in graph.symbols.items()}
        self.fixed = fixed_symbols(graph.inputs) if fixed is None else fixed
        self._args = []
        for kernel in program.kernels:
            symbols = self.symbol_buffers[kernel.symbols]
            args = []
            for name in (*(b.name for b in kernel.outputs), *(b.name for b in kernel.inputs)):
                name = program.aliases.get(name, name)
                args.append(name if name not in self.arrays else backend.arg(self.arrays[name]))
            args.append(backend.arg(symbols))
            self._args.append(args)
        self._dynamic = [i for i, args in enumerate(self._args) if any(isinstance(a, str) for a in args)]
        self._launchers = [backend.launcher(fn, k, c)
                           for fn, k, c in zip(self.functions, program.kernels, self.configs)]
        self.runner = None
        if deployed and isinstance(backend, Evicting):
            self.runner = backend.region_runner(self, like.runner if like is not None else None)

    @property
    def replayable(self) -> bool:
        """Whether a recording of one call (a CUDA graph) replays it for later calls of the same
        fixed symbols: every kernel one the backend can record: a generated kernel always (it
        reads its symbols from device memory), a library call where it reads no symbol that
        varies between replays (its sizes and addresses are in the call) and runs as one call (a
        cuBLAS call does; CuPy's allocating matmul fallback does not)."""
        return self.replayable_at(self.largest)

    def replayable_at(self, env: dict[str, int]) -> bool:
        """replayable, for a recording at the sizes of `env` (where cuBLAS takes a product can
        depend on its sizes)."""
        return all(
            not (set(kernel.symbols) - self.fixed and is_library(name)) and self.backend.capturable(fn, env)
            for kernel, (name, _), fn in zip(self.program.kernels, self.sources, self.functions))

    def recording_sizes(self, env: dict[str, int]) -> dict[str, int]:
        """The sizes a recording launches at: the fixed symbols' of the call, the largest of the
        others."""
        return {**self.largest, **{name: env[name] for name in self.fixed}}

    def write_symbols(self, env: dict[str, int]) -> None:
        """The symbols' values into the buffers kernels read them from (each tuple once)."""
        for symbols, buffer in self.symbol_buffers.items():
            if symbols:
                self.backend.write_symbols(buffer, [env[s] for s in symbols])

    def record(self, args) -> Callable[[], None]:
        """A recording (CUDA graph) of one call on `args`; returns the function that replays it."""
        inputs, env = self.bind(args)
        self.write_symbols(env)
        return self.backend.capture(lambda: self._run(inputs, env, copy=False, recording=True))

    def __call__(self, *args, copy: bool = True) -> list:
        """Run on inputs in the graph's input order. Inputs the program updates in place (the KV
        cache) are written through and returned as they are; other outputs are fresh arrays, or
        with `copy=False` views of this executor's memory, valid until it runs again."""
        inputs, env = self.bind(args)
        return self._run(inputs, env, copy)

    def run_bound(self, args: list, env: dict[str, int], copy: bool = False, recording: bool = False,
                  symbols_written: bool = False) -> list:
        """A call on inputs already the backend's arrays and checked, with the symbols' values
        (a compiled graph checks its inputs once for all its regions). `recording`: launched
        at the recording's sizes, the symbol buffers left as the caller wrote them. `symbols_written`:
        the caller wrote env's values into the shared symbol buffers once for all its regions (on
        the GPU a write from host memory waits for the work queued before it: one a region kept
        the host from queuing ahead, and a prefill's kernels waited on its launches)."""
        return self._run(dict(zip(self.program.inputs, args)), env, copy, recording, symbols_written)

    def _run(self, inputs: dict, env: dict[str, int], copy: bool, recording: bool = False,
             symbols_written: bool = False) -> list:
        if not (recording or symbols_written):
            self.write_symbols(env)
        if self.runner is not None:
            self.runner(inputs, env)
        else:
            sizes = self.recording_sizes(env) if recording else env
            for launch, kernel_args in zip(self._launchers, self._call_args(inputs)):
                launch(kernel_args, sizes)
        return [self.result(name, inputs, env, copy) for name in self.program.outputs]

    def launch(self, index: int, kernel_args: list, env: dict[str, int]) -> None:
        """Run kernel `index` alone in its own configuration (`kernel_args` from launch_args)."""
        self._launchers[index](kernel_args, env)

    def launch_one(self, index: int, inputs: dict, env: dict[str, int]) -> None:
        """Run kernel `index` alone on one call's inputs (a deployed runner's library calls, which
        take their sizes from `env`)."""
        self._launchers[index](self._bound_args(index, inputs), env)

    def kernel_addresses(self, index: int) -> list:
        """Kernel `index`'s arguments (outputs, inputs, its symbol array): a fixed address as the
        backend's argument, or the name of the call input it reads."""
        return self._args[index]

    def trace(self, *args) -> dict[str, np.ndarray]:
        """Run kernel by kernel and return every buffer a kernel wrote, by name, on the host."""
        inputs, env = self.bind(args)
        written = {}
        for launch, kernel_args, kernel in zip(self._launchers, self.launch_args(inputs, env),
                                               self.program.kernels):
            launch(kernel_args, env)
            for out in kernel.outputs:
                written[out.name] = self.backend.to_host(self.result(out.name, inputs, env), out.dtype)
        return written

    def host_outputs(self, *args) -> list[np.ndarray]:
        """Run and bring every output to the host as numpy (bf16 through ml_dtypes)."""
        return [self.backend.to_host(out, self.program.buffers[name].dtype)
                for name, out in zip(self.program.outputs, self(*args))]

    def bind(self, args) -> tuple[dict, dict[str, int]]:
        args = [self.backend.input(a) for a in args]
        dtypes = [self.backend.logical_dtype(a, n.dtype) for a, n in zip(args, self.graph.inputs)]
        env = self.sizes | self.graph.bind_symbols([tuple(a.shape) for a in args], dtypes)
        return dict(zip(self.program.inputs, args)), env

    def launch_args(self, inputs: dict, env: dict[str, int]) -> list[list]:
        """Each kernel's arguments for one call, its symbols written (fixed addresses are built once)."""
        self.write_symbols(env)
        return self._call_args(inputs)

    def _call_args(self, inputs: dict) -> list[list]:
        out = list(self._args)
        for i in self._dynamic:
            out[i] = self._bound_args(i, inputs)
        return out

    def _bound_args(self, index: int, inputs: dict) -> list:
        return [self.backend.arg(inputs[a]) if isinstance(a, str) else a for a in self._args[index]]

    def result(self, name: str, inputs: dict, env: dict[str, int], copy: bool = True):
        """A buffer as an array of its node's shape: an input updated in place is returned as is;
        a temporary is copied out of the arena (or viewed in it)."""
        b = self.program.buffers[name]
        if name in self.program.aliases or b.role == "input":
            return inputs[self.program.aliases.get(name, name)]
        shape = tuple(d.evaluate(env) for d in b.shape)
        view = self._views.get((name, shape))
        if view is None:     # made once per size: a decode step asks for every region's outputs
            count = int(np.prod(shape, dtype=np.int64))
            # a slot can be larger than this buffer, by a size its dtype does not divide
            raw = self.arrays[name][:count * b.dtype.itemsize]
            view = self._views[(name, shape)] = self.backend.typed(raw, b.dtype).reshape(shape)
        return view.copy() if copy else view
