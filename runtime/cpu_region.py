"""Running an executor's kernels as one C call (codegen/c_runner.py), the CPU backend's deployed
launch mode: the tables of function and argument addresses are filled when the executor is built
(weights, the arena and the symbol arrays never move), and a call only writes the addresses of its
inputs before one ctypes call per step. A library kernel (PyTorch's matmul) runs between two steps,
through its own launcher. While the backend records (runtime/cpu.py), a call is recorded instead:
each step with a copy of the address table as it was, each library call as a callback."""
from __future__ import annotations

import ctypes
import time

from ..codegen.c_runner import Call, emit_runner
from ..codegen.library import is_library


class RegionRunner:
    def __init__(self, executor, backend, like: RegionRunner | None = None):
        """`like`: the runner of an identical executor (same program and kernels), whose compiled
        runner this one shares; its tables are this executor's own."""
        program = executor.program
        self._executor, self._backend = executor, backend
        slot_of: dict[object, int] = {}        # a fixed address, or the name of a call input
        steps: list[list[Call]] = [[]]
        self._plan: list[tuple[bool, int]] = []     # (a runner step?, step or kernel index)
        for i, (name, _) in enumerate(executor.sources):
            if is_library(name):
                self._plan.append((False, i))
                steps.append([])
                continue
            slots = tuple(slot_of.setdefault(a if isinstance(a, str) else a.value, len(slot_of))
                          for a in executor.kernel_addresses(i))
            if not steps[-1]:
                self._plan.append((True, len(steps) - 1))
            steps[-1].append(Call(program.kernels[i], i, slots))
        if like is not None:
            self.source, self._function = like.source, like._plain
        else:
            self.source = emit_runner(steps)
            self._function = backend.compile(dict([self.source]))[self.source[0]]
        self._steps, self._plain, self._timed = steps, self._function, None
        # the tables the runner reads; ctypes arrays, so a call passes them without conversion
        self._functions = (ctypes.c_void_p * max(1, len(executor.functions)))(
            *(ctypes.cast(fn, ctypes.c_void_p).value if not is_library(name) else None
              for fn, (name, _) in zip(executor.functions, executor.sources)))
        # one slot past the addresses: a timed run's array of seconds (`timing`)
        self._seconds_slot = len(slot_of)
        self._buffers = (ctypes.c_void_p * (len(slot_of) + 1))(
            *(None if isinstance(key, str) else key for key in slot_of), None)
        self._seconds = None
        self._inputs = [(slot, key) for key, slot in slot_of.items() if isinstance(key, str)]
        self._step_args = [ctypes.c_int64(k) for k in range(len(steps))]

    def __call__(self, inputs: dict, env: dict[str, int]) -> None:
        for slot, name in self._inputs:
            self._buffers[slot] = inputs[name].ctypes.data
        record = self._backend.recording
        for is_step, index in self._plan:
            if record is None and is_step:
                self._function(self._step_args[index], self._functions, self._buffers)
            elif record is None:
                self._library_call(index, inputs, env)
            elif is_step:     # the table as this call filled it: a later call may refill this one
                record.call(self._function, index, self._functions, type(self._buffers)(*self._buffers))
            else:
                record.callback(lambda index=index, inputs=dict(inputs), env=dict(env):
                                self._library_call(index, inputs, env))

    def timing(self, seconds) -> None:
        """Until called again with None, every run (and every recording made meanwhile) writes
        each kernel's wall time, taken where it runs between the others, into `seconds` (a ctypes
        array of doubles, one per kernel): a diagnostic runner, compiled on first use."""
        if seconds is not None and self._timed is None:
            name, source = emit_runner(self._steps, self._seconds_slot)
            self._timed = self._backend.compile({name: source})[name]
        self._seconds = seconds
        self._function = self._plain if seconds is None else self._timed
        self._buffers[self._seconds_slot] = None if seconds is None else ctypes.addressof(seconds)

    def _library_call(self, index: int, inputs: dict, env: dict[str, int]) -> None:
        if self._seconds is None:
            self._executor.launch_one(index, inputs, env)
            return
        start = time.perf_counter()
        self._executor.launch_one(index, inputs, env)
        self._seconds[index] = time.perf_counter() - start

    @property
    def steps(self) -> int:
        """C calls per run (1 where no library kernel splits the region)."""
        return sum(1 for is_step, _ in self._plan if is_step)

    @property
    def library_calls(self) -> int:
        return len(self._plan) - self.steps
