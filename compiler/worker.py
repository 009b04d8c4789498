"""Candidates checked and timed in a worker process, so that a kernel which crashes (a segfault,
an illegal address that poisons the CUDA context) or hangs takes down only the worker: the
kernel configuration being measured at the time is recorded as failed so that no later candidate
tries it again, and a fresh worker takes over. Where that configuration was one the search tried
on its own (not the default every candidate is first checked with), the candidate itself is not
to blame: the fresh worker takes it again, without that configuration. Otherwise the candidate is
recorded as "crash" or "timeout".

A hang is noticed twice over: a candidate gets at least `timeout_s` in all, and one kernel
configuration's check and timing at most `trial_timeout_s` (GPU kernels take microseconds: a
configuration that runs for many seconds is stuck, not slow).

Several workers measure candidates side by side where the backend allows (a GPU: each compiles on
host cores of its own), taking turns on the device to check and time.

Parent and worker speak JSON lines over the worker's stdin and stdout: a candidate gets its
outcome; `{"region": FOLDER}` switches the worker to the next region and gets `{"ready": true}`.
A region travels as an artifact folder (graph JSON and safetensors, never pickle), its weights
as another, written once and read again only when the worker no longer keeps them; measurements
go straight from the worker into the tuning database, which is what the parent reads them from.

Run as `python -m kiln.compiler.worker FOLDER PARENT_PID TRIAL_FILE DEVICE_LOCK CORES` (the parent
does this; "-" for no lock, or for every core)."""
from __future__ import annotations

import fcntl
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from ..ir import Graph
from ..ir.errors import KilnError
from ..ir.serialize import graph_from_json, graph_to_json
from ..ir.artifact import read_artifact, write_artifact
from ..search.budget import Deadline
from ..runtime.hardware import usable_cores
from ..search.tuner import Outcome
from .measure import Measurer, Region

SPEC = "worker.json"
TRIAL_PREFIX = "trial-"         # then the worker's number: the kernel configuration it measures now
DEVICE_LOCK = "device.lock"     # held by the worker that checks or times on the device
MAX_WIDTH = 8                   # worker processes at most, by default
START_TIMEOUT_S = 300.0         # imports, a CUDA context, the region's tensors
MIN_TIMEOUT_S = 120.0           # a candidate's first compile and check can take this long on a GPU
TIMEOUT_FACTOR = 5              # ... and never less than this many times the slowest one so far
TRIAL_TIMEOUT_S = 30.0          # one kernel configuration's check and timing
RETRIES = 3                     # fresh workers a candidate gets while its faults are not its own
WEIGHT_SETS = 4                 # the sets of weights a worker keeps read (a graph's regions')


WORKER_PREFIX = "kiln-worker-"    # then the compiling process's id: whose folder it is


def _remove_orphans() -> None:
    """Worker folders whose compiling process is gone (killed, so it never cleaned up)."""
    for folder in Path(tempfile.gettempdir()).glob(f"{WORKER_PREFIX}*-*"):
        owner = folder.name[len(WORKER_PREFIX):].split("-")[0]
        if owner.isdigit() and not _alive(int(owner)):
            shutil.rmtree(folder, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:      # another user's process: alive
        return True
    return True


class IsolatedEvaluate:
    """`evaluate(outputs, variant) -> Outcome` for the tuner, run in worker processes: `width` of
    them measure candidates side by side (`submit`), each compiling on its own cores, and take
    turns on the device (a lock file) to check and time, so that no timing shares the device
    with another worker's kernels."""

    def __init__(self, backend_name: str, db_path: Path, fingerprint: str, region: Region | None = None,
                 deadline: Deadline | None = None, timeout_s: float = MIN_TIMEOUT_S,
                 trial_timeout_s: float = TRIAL_TIMEOUT_S, width: int | None = None):
        """`timeout_s`: the least time a candidate gets before its worker is taken for hung;
        `trial_timeout_s`: the most one kernel configuration's check and timing may take;
        `width`: worker processes (default_width by default). The workers serve region after
        region (`load`): their start-up (imports, a CUDA context) is paid once, not per region."""
        self.backend_name, self.db_path, self.fingerprint = backend_name, db_path, fingerprint
        self.min_timeout_s, self.trial_timeout_s = timeout_s, trial_timeout_s
        self.width = default_width(backend_name) if width is None else max(1, width)
        _remove_orphans()
        self.root = Path(tempfile.mkdtemp(prefix=f"{WORKER_PREFIX}{os.getpid()}-"))
        # one worker needs no turns; the file itself is only ever locked, never written
        self.device_lock = self.root / DEVICE_LOCK if self.width > 1 else None
        self.folder: Path | None = None
        self.deadline = deadline
        self.kernels_measured = 0
        self.restarts = 0
        self._count = threading.Lock()
        self._closing = False
        self._regions = 0
        # each distinct set of weights is written once (regions of several graphs share a layer's,
        # and a region is loaded for its program as lowered, then again for its search), kept
        # alive with its folder: a region's folder names it
        self._weight_folders: dict[tuple, tuple[Path, list]] = {}
        self._processes = [_Process(self, k) for k in range(self.width)]
        # the worker free longest is taken last: one candidate at a time (a region's program as
        # lowered, a finalist) keeps to one started worker, and the others start only when
        # candidates are in flight side by side
        self._idle: queue.LifoQueue = queue.LifoQueue()
        for process in reversed(self._processes):
            self._idle.put(process)
        self._threads = ThreadPoolExecutor(max_workers=self.width, thread_name_prefix="kiln-worker")
        if region is not None:
            self.load(region, deadline)

    def load(self, region: Region, deadline: Deadline | None = None) -> None:
        """Measure the next candidates on `region` (written as an artifact folder the workers read;
        none may be measuring a candidate now)."""
        previous = self.folder
        self._regions += 1
        self.folder = self.root / f"region{self._regions}"
        key = tuple(sorted((name, id(array)) for name, array in region.weights.items()))
        if key not in self._weight_folders:
            weights = self.root / f"weights{len(self._weight_folders) + 1}"
            write_artifact(weights, {}, dict(region.weights))
            self._weight_folders[key] = weights, list(region.weights.values())
        tensors = {**{f"arg/{i}": a for i, a in enumerate(region.args)},
                   **{f"want/{i}": w for i, w in enumerate(region.want)}}
        spec = {"backend": self.backend_name, "db": str(self.db_path), "fingerprint": self.fingerprint,
                "weights": str(self._weight_folders[key][0]),
                "region": graph_to_json(region.graph(region.inputs)),
                "args": len(region.args), "want": len(region.want), "sizes": region.sizes,
                "recorded": region.recorded, "fixed": sorted(region.fixed)}
        write_artifact(self.folder, {SPEC: json.dumps(spec)}, tensors)
        self.deadline = deadline
        list(self._threads.map(lambda process: process.switch(self.folder), self._processes))
        if previous is not None:
            shutil.rmtree(previous, ignore_errors=True)

    def __call__(self, outputs, variant: str, finalist: bool = False) -> Outcome:
        return self.submit(outputs, variant, finalist).result()

    def submit(self, outputs, variant: str, finalist: bool = False) -> Future:
        """The candidate's outcome, from the next worker free (a KilnError, the machine's
        problem, comes out of the future's result)."""
        program = graph_to_json(Graph(inputs=[], outputs=list(outputs), weights={}, symbols={}))
        return self._threads.submit(self._evaluate, program, variant, finalist)

    def _evaluate(self, program: dict, variant: str, finalist: bool) -> Outcome:
        process = self._idle.get()
        try:
            for _ in range(RETRIES):
                outcome, retry = process.attempt(program, variant, finalist)
                if not retry:
                    break
            return outcome
        finally:
            self._idle.put(process)

    def _counted(self, measured: int = 0, restarts: int = 0) -> None:
        with self._count:
            self.kernels_measured += measured
            self.restarts += restarts

    def close(self) -> None:
        """Stop every worker (a candidate still in flight is never answered, nor retried)."""
        self._closing = True
        self._threads.shutdown(wait=False, cancel_futures=True)
        for process in self._processes:
            process.close()
        self._threads.shutdown(wait=True)
        shutil.rmtree(self.root, ignore_errors=True)


def default_width(backend_name: str) -> int:
    """Worker processes a compile runs by default. On the CPU one: compiling beside a timing
    takes the cores the timed kernel's threads need. On a GPU, compiles (NVRTC, on the host's
    cores) and scheduling run side by side while one worker at a time holds the device: half
    the host's cores, at most MAX_WIDTH (each worker holds a CUDA context and its region's weights)."""
    if backend_name == "cpu":
        return 1
    return max(1, min(MAX_WIDTH, usable_cores() // 2))


def check_width(backend_name: str, width: int | None) -> None:
    """Refuse workers side by side where they would time each other: on the CPU a kernel is
    timed on every core, which a second worker's compiles would take."""
    if backend_name == "cpu" and width is not None and width > 1:
        raise KilnError(f"kiln: --workers {width} needs a GPU backend: the CPU backend times each kernel "
                        "on every core, and a second worker's compiles would be timed with it; use "
                        "--workers 1 (the default on the CPU)")


def _cores_of(backend_name: str, width: int, index: int) -> list[int] | None:
    """The cores worker `index` of `width` runs on beside a GPU: its own share, so that its
    compiles and its timing's launches never share a core with another worker's (None: all of them,
    as on the CPU, whose kernels are timed on every core)."""
    if backend_name == "cpu" or width < 2 or not hasattr(os, "sched_getaffinity"):
        return None
    cores = sorted(os.sched_getaffinity(0))
    share = len(cores) // width
    return cores[index * share:(index + 1) * share] if share else None


class _Process:
    """One worker process, started when first needed; it measures one candidate at a time."""

    def __init__(self, owner: IsolatedEvaluate, index: int):
        self.owner, self.index = owner, index
        self.trial_path = owner.root / f"{TRIAL_PREFIX}{index}.json"
        self._proc: subprocess.Popen | None = None
        self._lines: queue.Queue = queue.Queue()
        self._stderr: list[str] = []      # the worker's last lines, for a crash's detail
        self._slowest = 0.0

    def switch(self, folder: Path) -> None:
        """The next region: a running worker reads it now (a fresh one will when it starts)."""
        self._slowest = 0.0
        if self._proc is not None and self._proc.poll() is None:
            self._proc.stdin.write(json.dumps({"region": str(folder)}) + "\n")
            self._proc.stdin.flush()
            self._await_ready()

    def attempt(self, program: dict, variant: str, finalist: bool) -> tuple[Outcome, bool]:
        """The candidate's outcome, and whether to take it again (a fault that was not its own)."""
        owner = self.owner
        left = owner.deadline.remaining() if owner.deadline is not None else None
        request = json.dumps({"program": program, "variant": variant, "seconds_left": left, "finalist": finalist})
        self._ensure_started()
        self.trial_path.unlink(missing_ok=True)
        start = time.monotonic()
        try:
            self._proc.stdin.write(request + "\n")
            self._proc.stdin.flush()
        except (BrokenPipeError, OSError):
            return self._lost("crash", "the worker process exited before taking the candidate")
        timeout = max(owner.min_timeout_s, TIMEOUT_FACTOR * self._slowest)
        while True:
            try:
                line = self._lines.get(timeout=1.0)
                break
            except queue.Empty:
                stuck = self._trial_seconds()
                if stuck is not None and stuck > owner.trial_timeout_s:
                    return self._lost("timeout", f"one kernel configuration ran {stuck:.0f} s")
                if time.monotonic() - start > timeout:
                    return self._lost("timeout", f"no answer within {timeout:.0f} s")
        if line is None:
            return self._lost("crash", self._exit_text())
        self._slowest = max(self._slowest, time.monotonic() - start)
        reply = json.loads(line)
        if "error" in reply:
            raise KilnError(reply["error"])
        owner._counted(measured=reply["kernels_measured"])
        # the rest of the wall time is the round trip: the request and reply, the program read back
        spent = reply["spent"] | {"round trip": max(0.0, time.monotonic() - start - sum(reply["spent"].values()))}
        return Outcome(reply["status"], reply["estimate_s"], reply["detail"], spent), False

    def close(self) -> None:
        proc = self._proc        # a thread in `attempt` may be clearing it as it sees the exit
        if proc is not None:
            proc.kill()
            proc.wait()

    def _trial_seconds(self) -> float | None:
        """How long the kernel configuration being measured has run, if one is."""
        try:
            return time.time() - self.trial_path.stat().st_mtime
        except FileNotFoundError:
            return None

    def _ensure_started(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            return
        if self.owner._closing:
            raise KilnError("kiln: the measuring workers were stopped")
        owner = self.owner
        cores = _cores_of(owner.backend_name, owner.width, self.index)
        self._proc = subprocess.Popen(
            [sys.executable, "-m", f"{__package__}.worker", str(owner.folder), str(os.getpid()),
             str(self.trial_path), str(owner.device_lock or "-"), ",".join(map(str, cores or [])) or "-"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self._lines, self._stderr = queue.Queue(), []
        threading.Thread(target=_pump, args=(self._proc.stdout, self._lines), daemon=True).start()
        threading.Thread(target=_keep, args=(self._proc.stderr, self._stderr), daemon=True).start()
        self._await_ready()

    def _await_ready(self) -> None:
        """Start-up (imports, the backend, the region's tensors) is not a candidate's time."""
        try:
            ready = self._lines.get(timeout=START_TIMEOUT_S)
        except queue.Empty:
            ready = None
        if ready is None:
            raise KilnError(f"kiln: the measuring worker process did not start: {self._exit_text()}")

    def _lost(self, status: str, detail: str) -> tuple[Outcome, bool]:
        """The worker died or hung: blame the kernel configuration it was measuring, if any,
        and start afresh; the candidate is taken again where that configuration was not the
        default one."""
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.wait()
        self._proc = None
        self.owner._counted(restarts=1)
        retry = False
        if self.trial_path.exists():
            from ..search.tunedb import TuneDB
            trial = json.loads(self.trial_path.read_text())
            db = TuneDB(self.owner.db_path)
            db.record_kernel_failure(self.owner.fingerprint, trial["name"], trial["config"], trial["symbols"],
                                     status, detail)
            db.close()
            detail += f"; while measuring kernel {trial['name']} in configuration {trial['config']}"
            retry = not trial["default"]
        return Outcome(status, None, detail), retry

    def _exit_text(self) -> str:
        if self._proc.poll() is None:
            self._proc.kill()
        code = self._proc.wait()
        how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
        tail = "".join(self._stderr)[-400:].strip()
        return f"the worker process died ({how})" + (f": {tail}" if tail else "")


def _pump(stream, lines: queue.Queue) -> None:
    for line in stream:
        lines.put(line)
    lines.put(None)    # end of stream: the worker is gone


def _keep(stream, sink: list[str]) -> None:
    for line in stream:
        sink.append(line)
        del sink[:-20]


# --- the worker -------------------------------------------------------------------------------
def serve(folder: Path, parent: int, trial: Path, device_lock: Path | None = None,
          cores: list[int] | None = None) -> None:
    from ..search.tunedb import TuneDB
    from ..runtime.model import make_backend
    if cores:
        os.sched_setaffinity(0, cores)     # before any thread or library sizes itself by them
    threading.Thread(target=_exit_with_parent, args=(parent,), daemon=True).start()
    protocol, sys.stdout = sys.stdout, sys.stderr     # stray prints must not break the protocol
    device = _DeviceTurn(device_lock) if device_lock is not None else None
    backend, measurer, db = None, None, None
    weight_sets: dict[str, dict] = {}        # the last few sets of weights read, by folder
    requests = iter(sys.stdin)
    while True:
        _, open_file, tensors = read_artifact(folder)
        spec = json.loads(open_file(SPEC))
        if backend is None:
            backend, db = make_backend(spec["backend"]), TuneDB(spec["db"])
        weights = weight_sets.pop(spec["weights"], None) or read_artifact(Path(spec["weights"]))[2]
        weight_sets[spec["weights"]] = weights
        while len(weight_sets) > WEIGHT_SETS:
            weight_sets.pop(next(iter(weight_sets)))
        default = backend.default_config().key()
        measurer = _measurer(backend, db, spec, tensors, weights, trial, default, device)
        protocol.write(json.dumps({"ready": True}) + "\n")
        protocol.flush()
        folder = _answer(requests, measurer, trial, protocol)
        if folder is None:
            return


def _exit_with_parent(parent: int) -> None:
    """A worker stuck in a kernel never reads the end of its stdin: when its parent is gone (a
    compile killed), it would spin on a core or the GPU for ever. It notices within a second."""
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(1)


def _measurer(backend, db, spec: dict, tensors: dict, weights: dict, trial: Path, default: str,
              device) -> Measurer:
    graph = graph_from_json(spec["region"])
    region = Region(graph.inputs, weights, graph.symbols, [tensors[f"arg/{i}"] for i in range(spec["args"])],
                    [tensors[f"want/{i}"] for i in range(spec["want"])], spec["sizes"], spec["recorded"],
                    frozenset(spec["fixed"]))
    return Measurer(backend, db, spec["fingerprint"], region, device=device,
                    on_trial=lambda name, config, symbols: _write_trial(trial, name, config, symbols,
                                                                       config == default))


def _answer(requests, measurer: Measurer, trial: Path, protocol) -> Path | None:
    """Evaluate candidates until the parent names another region (returned) or closes stdin."""
    for line in requests:
        request = json.loads(line)
        if "region" in request:
            return Path(request["region"])
        left = request["seconds_left"]
        measurer.deadline = Deadline(left) if left is not None else None
        before = measurer.kernels_measured
        try:
            outcome = measurer.evaluate(graph_from_json(request["program"]).outputs, request["variant"],
                                        request.get("finalist", False))
        except KilnError as err:     # the machine's problem: the parent stops the compile
            outcome = err
        except Exception as err:     # the candidate's problem: rejected, as the tuner would
            outcome = Outcome("crash", None, f"{type(err).__name__}: {err}")
        reply = {"error": str(outcome)} if isinstance(outcome, KilnError) else {
            "status": outcome.status, "estimate_s": outcome.estimate_s, "detail": outcome.detail,
            "spent": outcome.spent, "kernels_measured": measurer.kernels_measured - before}
        trial.unlink(missing_ok=True)
        protocol.write(json.dumps(reply) + "\n")
        protocol.flush()
    return None


def _write_trial(path: Path, name: str, config: str, symbols: dict, default: bool) -> None:
    path.write_text(json.dumps({"name": name, "config": config, "symbols": symbols, "default": default}))


class _DeviceTurn:
    """The device to this worker alone while held: an exclusive lock on a file the parent names
    (released by the kernel when the process dies, so a crash never leaves it held)."""

    def __init__(self, path: Path):
        self._file = open(path, "a")

    def __enter__(self):
        fcntl.flock(self._file, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc) -> None:
        fcntl.flock(self._file, fcntl.LOCK_UN)


if __name__ == "__main__":
    lock, cores = sys.argv[4:6]
    serve(Path(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]), None if lock == "-" else Path(lock),
          None if cores == "-" else [int(c) for c in cores.split(",")])
