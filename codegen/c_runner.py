"""A region's launch list as one C function: it calls the region's kernels in order through a
table of function pointers, on a table of addresses (buffers, and each kernel's symbol array).
One ctypes call then runs a whole region where the per-kernel path makes one per kernel (SmolLM2
decode: 680-830 a token); a recording of a whole step (runtime/cpu.py) calls the runners.

The source names no kernel and no address, only each call's parameter types and table slots, so
identical layers share one runner and the source's hash is a sound cache key. Kernels that run
outside generated C (library calls through numpy) split the launch list into steps: the runner
takes the step to run, and the caller makes the library call between two steps."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

from .c_emit import STORAGE
from .kernel import Kernel

PREFIX = "run_"


@dataclass(frozen=True)
class Call:
    """One kernel call: the kernel, its function-table slot, and the address-table slot of its
    output, of each input and of its symbol array, in its parameter order."""
    kernel: Kernel
    function: int
    buffers: tuple[int, ...]


def emit_runner(steps: list[list[Call]], seconds_slot: int | None = None) -> tuple[str, str]:
    """(function name, C source) of `void name(int64_t step, void* const* fn, void* const* buf)`,
    which makes the calls of `steps[step]`. With `seconds_slot`, a diagnostic runner of the same
    signature: it writes each call's wall time (a kernel's time as it runs in the region, between
    the others) into the `double` array at `buf[seconds_slot]`, at the call's function-table slot."""
    timed = seconds_slot is not None
    lines = ["double omp_get_wtime(void);"] if timed else []
    lines += ["void RUNNER(int64_t kiln_step, void* const* restrict kiln_fn, void* const* restrict kiln_buf) {"]
    if timed:
        lines.append(f"  double* restrict kiln_seconds = (double*)kiln_buf[{seconds_slot}];")
    lines.append("  switch (kiln_step) {")
    for k, step in enumerate(steps):
        lines.append(f"  case {k}:")
        for c in step:
            if timed:
                lines.append(f"    {{ double kiln_start = omp_get_wtime(); {_call(c)} "
                             f"kiln_seconds[{c.function}] = omp_get_wtime() - kiln_start; }}")
            else:
                lines.append(f"    {_call(c)}")
        lines.append("    break;")
    lines += ["  }", "}"]
    draft = "\n".join(lines) + "\n"
    name = f"{PREFIX}{hashlib.sha256(draft.encode()).hexdigest()[:20]}"
    return name, draft.replace("void RUNNER(", f"void {name}(", 1)


def _call(call: Call) -> str:
    """`((void (*)(types))kiln_fn[i])(kiln_buf[a], ...);`: the pointer is cast back to the
    kernel's own type (emit_c's signature), so the call is well defined. The last slot is the
    kernel's symbol array (the executor's, which a call or a replay writes the sizes into)."""
    k = call.kernel
    types = [*(f"{STORAGE[b.dtype]}*" for b in k.outputs), *(f"const {STORAGE[b.dtype]}*" for b in k.inputs),
             "const int64_t*"]
    args = ", ".join(f"kiln_buf[{slot}]" for slot in call.buffers)
    return f"((void (*)({', '.join(types)}))kiln_fn[{call.function}])({args});"


def is_runner(name: str) -> bool:
    return name.startswith(PREFIX)
