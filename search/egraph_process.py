"""The process the e-graph grows in: a fresh interpreter, never a fork, spoken to in JSON lines.

The parent starts `python -m kiln.search.egraph_process PARENT_PID MEMORY_BYTES` with pipes for
its stdin, stdout and stderr. The child caps its address space at MEMORY_BYTES, imports egglog
and the rules (about a second) and says `{"ready": ...}`; then it serves saturation after
saturation, one request line each, answering one `{"stage": REPORT, "dump": E-GRAPH JSON}` line
per finished stage and then `{"done": ...}` (or `{"error": TEXT}` for a Python error). One child
serves a whole compile, so its start-up is paid once; one that died or hung is replaced by the
next saturation, and so is one whose address space has grown so much (a fragmented heap) that
the next saturation would get less than half the room the first had.

While it saturates, the child's Python stack goes to its stderr if it stays silent past its
patience (faulthandler), so a hang shows where it was before the parent kills it. Its stderr
(stray prints too: its stdout is the protocol) is passed on to the caller's stderr, and its last
lines are quoted if it fails to start."""
from __future__ import annotations

import atexit
import contextlib
import dataclasses
import faulthandler
import json
import os
import queue
import resource
import signal
import subprocess
import sys
import threading
import time

from ..ir.errors import KilnError

START_TIMEOUT_S = 120.0          # a fresh interpreter's imports (seconds; minutes on a loaded machine)
SILENT = object()                # receive(): no message within the timeout


class EGraphProcess:
    """The parent's handle on one child."""

    def __init__(self, memory_bytes: int):
        self.memory_bytes, self.owner, self.retire = memory_bytes, os.getpid(), False
        self.proc = subprocess.Popen(
            [sys.executable, "-m", __name__, str(os.getpid()), str(memory_bytes)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            encoding="utf-8", errors="replace")
        self._lines: queue.Queue = queue.Queue()
        self._stderr: list[str] = []
        self._forward = threading.Event()    # before ready, stderr is kept to be quoted, not shown
        threading.Thread(target=_pump, args=(self.proc.stdout, self._lines), daemon=True).start()
        threading.Thread(target=_keep, args=(self.proc.stderr, self._stderr, self._forward),
                         daemon=True).start()
        ready = self.receive(START_TIMEOUT_S)
        if ready is None or ready is SILENT:
            why = "did not start" if ready is SILENT else "failed to start"
            raise KilnError(f"kiln: the e-graph process {why} ({self.exit_text()}); "
                            f"the last lines of its stderr:\n{self.stderr_tail()}")
        self.baseline = ready["address_space"]
        self._forward.set()

    def send(self, request: dict) -> bool:
        try:
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
            return True
        except (BrokenPipeError, OSError):
            return False

    def receive(self, timeout: float):
        """The next message; None once the child is gone, SILENT if none came within `timeout`."""
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            return SILENT
        return None if line is None else json.loads(line)

    def done(self, address_space: int) -> None:
        """A saturation ended; retire the child if the next one would get too little room."""
        self.retire = address_space - self.baseline > (self.memory_bytes - self.baseline) / 2

    def alive(self) -> bool:
        return self.proc.poll() is None

    def exit_text(self) -> str:
        """How the child ended (it is killed first if it has not)."""
        if self.alive():
            self.proc.kill()
        code = self.proc.wait()
        with contextlib.suppress(ValueError):
            if code < 0:
                return f"signal {signal.Signals(-code).name}"
        return f"exit code {code}"

    def stderr_tail(self, lines: int = 12) -> str:
        for _ in range(20):      # the stderr thread reads the last lines after the child has gone
            if not self.alive() and self._stderr and self._stderr[-1] is None:
                break
            time.sleep(0.05)
        return "".join(line for line in self._stderr[-lines - 1:] if line is not None).rstrip()

    def close(self) -> None:
        if self.alive():
            with contextlib.suppress(OSError):
                self.proc.stdin.close()       # an idle child ends at the end of its stdin
            try:
                self.proc.wait(timeout=2.0)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


_LOCK = threading.Lock()
_shared: EGraphProcess | None = None


@contextlib.contextmanager
def lease(memory_bytes: int):
    """The shared child, started where there is none fit to use (none yet, or one that died, was
    killed or retired, has another memory cap, or belongs to the process this one forked from).
    Whatever interrupts a saturation (an exception, Ctrl-C) ends the child, which may still be
    busy with it."""
    global _shared
    with _LOCK:
        child = _shared
        if child is not None and (child.owner != os.getpid() or child.memory_bytes != memory_bytes
                                  or child.retire or not child.alive()):
            if child.owner == os.getpid():
                child.close()
            child = _shared = None
        if child is None:
            child = _shared = EGraphProcess(memory_bytes)
        try:
            yield child
        except BaseException:
            child.exit_text()
            raise
        finally:
            if child.retire or not child.alive():
                child.close()
                _shared = None


@atexit.register
def _close_shared() -> None:
    if _shared is not None and _shared.owner == os.getpid():
        _shared.close()


def _pump(stream, lines: queue.Queue) -> None:
    for line in stream:
        lines.put(line)
    lines.put(None)    # end of stream: the child is gone


def _keep(stream, sink: list, forward: threading.Event) -> None:
    for line in stream:
        if forward.is_set():
            with contextlib.suppress(Exception):   # the caller's stderr may be closed or replaced
                sys.stderr.write(line)
                sys.stderr.flush()
        sink.append(line)
        del sink[:-40]
    sink.append(None)  # end of stream


# --- the child ----------------------------------------------------------------------------------
def serve(parent: int, memory_bytes: int) -> None:
    threading.Thread(target=_exit_with_parent, args=(parent,), daemon=True).start()
    # stray prints must not break the protocol, nor egglog's own writes to file descriptor 1
    protocol = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    # an abort here is expected and reported by the parent; no Python crash dump on stderr
    faulthandler.disable()
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    from .saturate import Limits   # egglog and the IR: the start-up, paid before ready

    def write(message: dict) -> None:
        protocol.write(json.dumps(message) + "\n")
        protocol.flush()

    write({"ready": True, "address_space": _address_space()})
    for line in sys.stdin:
        request = json.loads(line)
        limits = Limits(**request["limits"])
        # a hang shows its stack on stderr before the parent's patience runs out and kills it
        watchdog = lambda: faulthandler.dump_traceback_later(max(1.0, limits.patience - 2))

        def send(report, dumped: str) -> None:
            write({"stage": dataclasses.asdict(report), "dump": dumped})
            watchdog()

        watchdog()
        try:
            _saturate(request, limits, send)
            reply = {"done": True, "address_space": _address_space()}
        except Exception as err:  # egglog raises its own error types; report any, the parent decides
            reply = {"error": f"{type(err).__name__}: {err}"}
        faulthandler.cancel_dump_traceback_later()   # idle between saturations is not a hang
        write(reply)


def _saturate(request: dict, limits, send) -> None:
    from ..ir.serialize import graph_from_json
    from .rulesets import find
    from .adapter import encode
    from .saturate import _run_stages
    enc = encode(graph_from_json(request["program"]).outputs)
    if [n.op.value for n in enc.order] != request["ops"]:  # the parent reads the dump by let names
        raise RuntimeError("the program read back in the e-graph process differs from the caller's")
    stages = [(stage, [find(*ref) for ref in refs]) for stage, refs in request["stages"]]
    _run_stages(enc, stages, [find(*ref) for ref in request["analysis"]], limits, send)


def _address_space() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


def _exit_with_parent(parent: int) -> None:
    """A child stuck in egglog never reads the end of its stdin: when its parent is gone (a
    compile killed), it would spin on a core for ever. It notices within a second."""
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(1)


if __name__ == "__main__":
    serve(int(sys.argv[1]), int(sys.argv[2]))
