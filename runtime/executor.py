"""Runs a scheduled program: a static buffer plan (temporaries share memory when their lifetimes
do not overlap), kernels launched in order, symbols bound per call, and inputs written in place
where the program says so (the KV cache)."""
from __future__ import annotations

import ctypes
from dataclasses import dataclass

import numpy as np

from ..codegen.c_emit import emit_c
from ..codegen.kernel import KernelConfig, source_hash
from ..codegen.schedule import Program
from ..ir.graph import Graph


def kernel_name(source_key: str) -> str:
    return f"k_{source_key}"


def render(program: Program, configs: list[KernelConfig]) -> list[tuple[str, str]]:
    """(function name, C source) per kernel; the name is the hash of the source it renders."""
    out = []
    for kernel, config in zip(program.kernels, configs):
        draft = emit_c(kernel, config, "KERNEL")
        name = kernel_name(source_hash(draft))
        out.append((name, draft.replace("void KERNEL(", f"void {name}(", 1)))
    return out


@dataclass
class BufferPlan:
    """Temporaries mapped to slots of one arena; sizes are bytes at the symbols' largest values."""
    slot_of: dict[str, int]
    slot_bytes: list[int]

    @property
    def peak_bytes(self) -> int:
        return sum(self.slot_bytes)


def plan_buffers(program: Program) -> BufferPlan:
    biggest = {name: hi for name, (lo, hi) in program.symbols.items()}
    temps = [name for name, b in program.buffers.items()
             if b.role == "temp" and name not in program.aliases]
    last_use: dict[str, int] = {}
    first_def: dict[str, int] = {}
    for k, kernel in enumerate(program.kernels):
        first_def.setdefault(kernel.output.name, k)
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
        free = [s for s in range(len(slot_bytes)) if slot_free_at[s] < start and slot_bytes[s] >= size]
        if free:
            slot = min(free, key=lambda s: slot_bytes[s])
        else:
            slot = len(slot_bytes)
            slot_bytes.append(size)
            slot_free_at.append(0)
        slot_of[name] = slot
        slot_free_at[slot] = last_use.get(name, start)
    return BufferPlan(slot_of, slot_bytes)


class Executor:
    """A compiled program bound to its weights, ready to call with numpy inputs."""

    def __init__(self, graph: Graph, program: Program, configs: list[KernelConfig], backend,
                 weights: dict[str, np.ndarray] | None = None):
        self.graph, self.program, self.backend = graph, program, backend
        self.sources = render(program, configs)
        functions = backend.compile(dict(self.sources))
        self.plan = plan_buffers(program)
        arena = [backend.allocate(n) for n in self.plan.slot_bytes]
        weights = graph.weights if weights is None else weights
        self.arrays: dict[str, np.ndarray] = {}
        for name, b in program.buffers.items():
            if b.role == "weight":
                self.arrays[name] = np.ascontiguousarray(weights[b.source], dtype=b.dtype.np)
            elif name in self.plan.slot_of:
                self.arrays[name] = arena[self.plan.slot_of[name]]
        self.launches = [(functions[fn], k) for (fn, _), k in zip(self.sources, program.kernels)]

    def _array(self, name: str, inputs: dict[str, np.ndarray]) -> np.ndarray:
        name = self.program.aliases.get(name, name)
        return inputs[name] if name in inputs else self.arrays[name]

    def __call__(self, *args: np.ndarray) -> list[np.ndarray]:
        """Run on numpy inputs (in the graph's input order). Inputs the program updates in place
        (the KV cache) are written through and returned as they are; other outputs are copies."""
        inputs, env = self._bind(args)
        for launch in self._launches(inputs, env):
            launch()
        return [self._result(name, inputs, env) for name in self.program.outputs]

    def trace(self, *args: np.ndarray) -> dict[str, np.ndarray]:
        """Run kernel by kernel and return a copy of every buffer a kernel wrote, by name (how
        each kernel is checked against the reference on its own)."""
        inputs, env = self._bind(args)
        written = {}
        for launch, kernel in zip(self._launches(inputs, env), self.program.kernels):
            launch()
            written[kernel.output.name] = self._result(kernel.output.name, inputs, env).copy()
        return written

    def _bind(self, args) -> tuple[dict[str, np.ndarray], dict[str, int]]:
        args = [np.asarray(a, order="C") for a in args]
        env = self.graph.bind_symbols([a.shape for a in args], [a.dtype for a in args])
        return dict(zip(self.program.inputs, args)), env

    def _launches(self, inputs: dict[str, np.ndarray], env: dict[str, int]):
        ptr = ctypes.c_void_p
        for fn, kernel in self.launches:
            symbols = np.array([env[s] for s in kernel.symbols] or [0], dtype=np.int64)
            args = (ptr(self._array(kernel.output.name, inputs).ctypes.data),
                    *(ptr(self._array(b.name, inputs).ctypes.data) for b in kernel.inputs),
                    ptr(symbols.ctypes.data))
            yield lambda fn=fn, args=args, keep=symbols: fn(*args)

    def _result(self, name: str, inputs: dict[str, np.ndarray], env: dict[str, int]) -> np.ndarray:
        b = self.program.buffers[name]
        if name in self.program.aliases or b.role == "input":
            return inputs[self.program.aliases.get(name, name)]
        shape = tuple(d.evaluate(env) for d in b.shape)
        count = int(np.prod(shape, dtype=np.int64))
        return self._array(name, inputs).view(b.dtype.np)[:count].reshape(shape).copy()
