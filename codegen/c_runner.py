"""A region's launch list as one C function (the CPU's analogue of a CUDA graph): it calls the
region's kernels in order through a table of function pointers, on a table of buffer addresses,
with the graph's symbols read from one int64 array. One ctypes call then runs a whole region
where the per-kernel path makes one per kernel (SmolLM2 decode: 680-830 a token).

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
    """One kernel call: the kernel, its function-table slot, and the buffer-table slot of its
    output and of each input, in its parameter order."""
    kernel: Kernel
    function: int
    buffers: tuple[int, ...]


def emit_runner(steps: list[list[Call]], symbols: tuple[str, ...]) -> tuple[str, str]:
    """(function name, C source) of `void name(int64_t step, void* const* fn, void* const* buf,
    const int64_t* sym)`, which makes the calls of `steps[step]`; `sym[i]` is `symbols[i]`."""
    lines = ["void RUNNER(int64_t kiln_step, void* const* restrict kiln_fn, void* const* restrict kiln_buf,",
             "            const int64_t* restrict kiln_sym) {"]
    # each kernel reads its own symbols, in its own order, from an array of its own
    orders = sorted({c.kernel.symbols for step in steps for c in step if c.kernel.symbols})
    array_of = {order: f"kiln_sym{i}" for i, order in enumerate(orders)}
    for order, array in array_of.items():
        values = ", ".join(f"kiln_sym[{symbols.index(s)}]" for s in order)
        lines.append(f"  const int64_t {array}[{len(order)}] = {{{values}}};")
    lines.append("  switch (kiln_step) {")
    for k, step in enumerate(steps):
        lines.append(f"  case {k}:")
        lines += [f"    {_call(c, array_of.get(c.kernel.symbols, 'kiln_sym'))}" for c in step]
        lines.append("    break;")
    lines += ["  }", "}"]
    draft = "\n".join(lines) + "\n"
    name = f"{PREFIX}{hashlib.sha256(draft.encode()).hexdigest()[:20]}"
    return name, draft.replace("void RUNNER(", f"void {name}(", 1)


def _call(call: Call, symbols: str) -> str:
    """`((void (*)(types))kiln_fn[i])(kiln_buf[a], ..., symbols);`: the pointer is cast back to
    the kernel's own type (emit_c's signature), so the call is well defined."""
    k = call.kernel
    types = [*(f"{STORAGE[b.dtype]}*" for b in k.outputs), *(f"const {STORAGE[b.dtype]}*" for b in k.inputs),
             "const int64_t*"]
    args = [f"kiln_buf[{slot}]" for slot in call.buffers] + [symbols]
    return f"((void (*)({', '.join(types)}))kiln_fn[{call.function}])({', '.join(args)});"


def is_runner(name: str) -> bool:
    return name.startswith(PREFIX)
