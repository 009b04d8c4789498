"""The backend half of the tuner: turn a candidate program into kernels, check it against the
reference, and time each distinct kernel in each configuration once (the tuning database
remembers every measurement, so a resumed or repeated compile re-measures nothing)."""
from __future__ import annotations

import dataclasses
import statistics
import time
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..codegen.index import interval
from ..codegen.kernel import Kernel, KernelConfig, arithmetic_ops, traffic_bytes
from ..codegen.cuda_gemm import MmaConfig
from ..codegen.library import LibraryConfig
from ..codegen.policy import POLICIES
from ..codegen.schedule import Program, schedule
from ..ir import Graph, Node
from ..ir.compare import mismatch, tolerance
from ..ir.errors import CompileError
from ..runtime.backend import Evicting, Recording
from ..runtime.executor import Executor, plan_buffers
from ..search.budget import Deadline
from ..search.tunedb import TuneDB, symbols_key
from ..search.tuner import Outcome

TIMING_TARGET_S = 0.002      # per kernel and configuration: repeat until this much time is spent
MAX_REPEATS = 50
LIBRARY_PRUNE = 4            # a library call or tensor-core product this much faster than the default ends a kernel's tuning
# what a product's default (generated code on CUDA cores) is beside, always measured: the library
# call and the tensor-core template (codegen/cuda_gemm.py)
PRODUCT_CONFIGS = (LibraryConfig, MmaConfig)
HOT_SHARE = 0.1              # past the deadline, a kernel with this share of its region's time is still tuned
# a search candidate's kernel under this share of its region's time (by its default's or library
# call's time) keeps that configuration: of SmolLM2's 19-kernel decode layer, 11 take 0.2-1.1%
# (a norm's reciprocal, softmax's pieces), where compiling and timing three more configurations
# each would cost more than they could save. A finalist's kernels are all tuned.
SEARCH_SHARE = 0.02
# a finalist's kernel configurations are each timed in this many passes, apart in time, and the
# best counts: a burst of load on a shared machine timed SmolLM2's query projection split over
# two threads at 586 us (its first and only pass), so the one-thread form (82 us) won and cost the
# decode step 1.4 ms at every later compile that read the database
KERNEL_TIMING_PASSES = 2
# the most of the device's memory a candidate's temporaries may take: the compile's workers (eight
# on a 16-core GPU host) share the device, and a prefill candidate that materializes a broadcast
# product asked an H200 for 23.6 GB at once, leaving other workers' candidates out of memory
CANDIDATE_MEMORY_SHARE = 1 / 8


# where a candidate's evaluation spends its time (a worker's parent adds the round trip): its
# program scheduled; built (its executor: buffers, weights, compiled kernels loaded); its outputs
# and each configuration's computed for checking (on the device) and compared with what they
# must be (on the host, the device let go); the configurations' sources rendered; compiled (the
# kernels' default configurations, then the others measured); the configurations timed; the rest
# (the tuning database's look-ups, arguments bound) and, where workers take turns on the device,
# the wait for its turn
PHASES = ("schedule", "build", "check", "compare", "render", "compile", "time", "device wait", "bookkeeping")


def kernel_space(backend, kernel: Kernel, recorded: bool, fixed: frozenset[str] = frozenset()) -> list:
    """The configurations the tuner tries for `kernel`. A library call that reads a symbol other
    than the `fixed` ones (runtime/executor.py: fixed_symbols) would hold the sizes of the call it
    was recorded in: in a graph that replays a recording, such a kernel keeps to generated code,
    which reads its sizes on the device."""
    return [c for c in backend.config_space(kernel)
            if not (recorded and set(kernel.symbols) - fixed and isinstance(c, LibraryConfig))]


def kin(kernel: Kernel) -> str:
    """Kernels of one shape, whatever else each fuses, whose configurations rank alike: the op and
    output shape (its label), the output's type, and its largest input's (a GEMV's weight)."""
    bounds = {name: (lo, hi) for name, lo, hi in kernel.bounds}
    largest = max(kernel.inputs, key=lambda b: (interval(b.size, bounds) or (0, 0))[1], default=None)
    return f"{kernel.label}:{kernel.output.dtype.value}" + (f":{largest.dtype.value}[{largest.size}]" if largest else "")


def kin_order(configs: list, ratios: dict[str, dict[str, float]], limit: int) -> list:
    """A search candidate's configurations of one kernel (`configs` in the backend's order), at
    most `limit`: those always measured; the configurations faster than the default on the kin's
    kernels (`ratios`: per kernel, per configuration key, its time over the default's; by their
    mean), fastest first, but one place kept for a configuration no kernel of the kin has tried,
    where one is left, so that the candidates of a search, sharing kins, try every configuration
    between them; then the others untried. Not those the kin ran slower than the default: once a
    kin has tried everything, a kernel of it costs a candidate only the configurations that won."""
    means = {}
    for kernel in ratios.values():
        for key, ratio in kernel.items():
            means.setdefault(key, []).append(ratio)
    means = {key: sum(r) / len(r) for key, r in means.items()}
    always = _always(configs)
    rest = [c for c in configs if all(c is not a for a in always)]
    untried = [c for c in rest if c.key() not in means]
    faster = sorted((c for c in rest if c.key() in means and means[c.key()] < 1.0), key=lambda c: means[c.key()])
    order = always + faster[:max(0, limit - len(always) - (1 if untried else 0))] + untried
    return list({id(c): c for c in order}.values())[:max(limit, len(always))]


@dataclass
class Region:
    """What a region's candidates are measured with: its inputs, weights and symbols, values for
    its inputs, and the reference outputs those give. `sizes`: the symbols' values in that call,
    which a region's inputs need not show (a decode layer reads the window the graph's input
    sets, through no input of its own)."""
    inputs: list[Node]
    weights: dict[str, np.ndarray]
    symbols: dict[str, tuple[int, int]]
    args: list[np.ndarray]
    want: list[np.ndarray]
    sizes: dict[str, int] = field(default_factory=dict)
    recorded: bool = False        # its graph runs as recordings on this backend (runtime/compiled.py: records)
    fixed: frozenset[str] = frozenset()   # the symbols a recording holds (runtime/executor.py)

    def graph(self, outputs: list[Node]) -> Graph:
        return Graph(inputs=self.inputs, outputs=list(outputs), weights=self.weights,
                     symbols=self.symbols)


def _always(configs: list) -> list:
    """A kernel's default configuration, its library calls and its first tensor-core tiling."""
    mma = next((c for c in configs if isinstance(c, MmaConfig)), None)
    return [c for c in configs if c is configs[0] or c is mma or isinstance(c, LibraryConfig)]


def _always_measured(rows: list) -> list:
    always = _always([r[0] for r in rows])
    return [r for r in rows if any(r[0] is c for c in always)]


class _KernelRecords:
    """The tuning database's records of the kernels one tuning weighs, read in two queries and kept
    current by the tuning's own writes, which go through to the database, where each
    configuration's record was looked up six times or so, one query each. Another worker
    measuring the same new kernel meanwhile costs a second measurement, never a wrong one."""

    def __init__(self, db: TuneDB, fingerprint: str, names):
        self.db, self.fingerprint = db, fingerprint
        self._times, self._failed = db.kernel_records(fingerprint, names)

    def time(self, name: str, config: str, symbols: dict) -> float | None:
        return self._times.get((name, config, symbols_key(symbols)), (None, 0))[0]

    def passes(self, name: str, config: str, symbols: dict) -> int:
        return self._times.get((name, config, symbols_key(symbols)), (None, 0))[1]

    def failed(self, name: str, config: str, symbols: dict) -> bool:
        return (name, config, symbols_key(symbols)) in self._failed

    def record(self, name: str, config: str, symbols: dict, median_s: float, samples: int) -> None:
        self.db.record_kernel(self.fingerprint, name, config, symbols, median_s, samples)
        self._times[(name, config, symbols_key(symbols))] = (median_s, 1)
        self._failed.discard((name, config, symbols_key(symbols)))

    def confirm(self, name: str, config: str, symbols: dict, median_s: float, samples: int) -> None:
        self.db.confirm_kernel(self.fingerprint, name, config, symbols, median_s, samples)
        best, passes = self._times[(name, config, symbols_key(symbols))]
        self._times[(name, config, symbols_key(symbols))] = (min(best, median_s), passes + 1)

    def fail(self, name: str, config: str, symbols: dict, reason: str, detail: str) -> None:
        self.db.record_kernel_failure(self.fingerprint, name, config, symbols, reason, detail)
        self._times.pop((name, config, symbols_key(symbols)), None)
        self._failed.add((name, config, symbols_key(symbols)))


class Measurer:
    def __init__(self, backend, db: TuneDB, fingerprint: str, region: Region, max_configs: int | None = None,
                 search_configs: int = 4, deadline: Deadline | None = None,
                 on_trial: Callable[[str, str, dict], None] = lambda name, config, symbols: None,
                 device: AbstractContextManager | None = None):
        """`on_trial(kernel name, config key, symbols)` is called before a kernel configuration's
        first launch (a worker process notes it, to blame it if the process dies). `device`: held
        while kernels run (built, checked, timed), where workers take turns on the device;
        scheduling, rendering and compiling run outside it."""
        self.backend, self.db, self.fingerprint = backend, db, fingerprint
        self.region, self.deadline = region, deadline
        # a candidate in the search has its kernels' first `search_configs` configurations timed
        # (the default first; on a SmolLM2-sized layer the best of the first four was within 9% of
        # the best of all for 90% of kernels), a finalist the first `max_configs` (the backend's)
        self.max_configs = max_configs or backend.finalist_configs
        self.search_configs = search_configs
        self.on_trial = on_trial
        # a bf16 model's f32 intermediates carry bf16's error: check everything at its tolerance
        self.rtol = tolerance([n.dtype.np for n in region.inputs] +
                              [w.dtype for w in region.weights.values()])
        self.kernels_measured = 0
        self._recorded = isinstance(backend, Recording) and region.recorded
        self.spent: dict[str, float] = {}        # the current evaluation's seconds by phase
        self.device = device

    @contextmanager
    def _phase(self, name: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.spent[name] = self.spent.get(name, 0.0) + time.perf_counter() - start

    @contextmanager
    def _on_device(self):
        """The device to this measurer alone (the wait for it accounted), where it is shared."""
        if self.device is None:
            yield
            return
        with self._phase("device wait"):
            self.device.__enter__()
        try:
            yield
        finally:
            self.device.__exit__(None, None, None)

    # --- the tuner's callables ----------------------------------------------------------------
    def evaluate(self, outputs: list[Node], variant: str, finalist: bool = False) -> Outcome:
        start, self.spent = time.perf_counter(), {}
        self.backend.trim()
        outcome = self._evaluate(outputs, variant, finalist)
        self.spent["bookkeeping"] = max(0.0, time.perf_counter() - start - sum(self.spent.values()))
        return dataclasses.replace(outcome, spent=dict(self.spent))

    def _evaluate(self, outputs: list[Node], variant: str, finalist: bool) -> Outcome:
        graph = self.region.graph(outputs)
        with self._phase("schedule"):
            program = schedule(graph, POLICIES[variant])
        # measured with every temporary in a slot of its own (reuse=False, below)
        needed, limit = sum(plan_buffers(program, reuse=False).slot_bytes), self.backend.memory_bytes() * CANDIDATE_MEMORY_SHARE
        if needed > limit:
            return Outcome("memory", None, f"its temporaries take {needed / 1e9:.2f} GB, more than the {limit / 1e9:.2f} "
                                           f"GB ({CANDIDATE_MEMORY_SHARE:.3g} of the device's memory) a candidate may take")
        defaults = [self.backend.default_config(k) for k in program.kernels]
        try:
            with self._phase("compile"):
                # compiled before the device is taken: the executor finds its functions compiled
                self.backend.compile(dict(self.backend.render(k, c) for k, c in zip(program.kernels, defaults)))
            with self._on_device(), self._phase("build"):
                executor = Executor(graph, program, defaults, self.backend, reuse=False, sizes=self.region.sizes)
        except CompileError as err:
            return Outcome("compile", None, str(err)[-500:])
        with self._on_device(), self._phase("check"):
            args = self._fresh_args()
            got = executor.host_outputs(*args)
        with self._phase("compare"):
            bad = next(((k, b) for k, (g, w) in enumerate(zip(got, self.region.want))
                        if (b := mismatch(g, w, self.rtol))), None)
        if bad:
            return Outcome(bad[1][0], None, f"output {bad[0]}: {bad[1][1]}")
        configs, estimate = self._tune_kernels(executor, args, self.max_configs if finalist else self.search_configs,
                                               share=0.0 if finalist else SEARCH_SHARE)
        return Outcome.measured(estimate, len(program.kernels))

    def end_to_end(self, outputs: list[Node], variant: str, repeats: int = 3) -> Callable[[], float]:
        """A timer of the region in the launch mode a compiled graph deploys (a CUDA graph's
        replay at fixed sizes; on the CPU one C call for the region's kernels), so that finalists
        are ranked by what the user gets, not by launches a compiled graph never pays. Built once;
        each call times `repeats` runs and returns their median seconds, so that the tuner can
        time its finalists in turn, a few runs each, and compare them run beside run."""
        graph, program, configs = self.build(outputs, variant)
        executor = Executor(graph, program, configs, self.backend, deployed=True, sizes=self.region.sizes,
                            fixed=self.region.fixed)
        args = self._fresh_args()
        executor(*args)
        # a compiled graph leaves a region's outputs in its memory for the next region
        weights = [a for n, a in executor.arrays.items() if program.buffers[n].role == "weight"]
        run, cold = self._as_deployed(executor, args), self._cold(weights)

        # a recording holds the addresses of the executor's memory and of the arguments, not the
        # arrays: they live as long as the timer (a target of 0 s stops at the 3 runs every timing makes)
        def timer(kept=(executor, args)) -> float:
            return statistics.median(self.backend.time(run, float("inf"), repeats, **cold))
        return timer

    def _as_deployed(self, executor: Executor, args: list) -> Callable[[], object]:
        """One run of the region in the launch mode a user gets: a CUDA graph's replay where the
        backend records launches and the region's outputs have fixed sizes (decode), else its
        deployed call (on the CPU, one C call for the region's kernels)."""
        if self._recorded and executor.replayable:
            return executor.record(args)
        return lambda: executor(*args, copy=False)

    def build(self, outputs: list[Node], variant: str) -> tuple[Graph, Program, list[KernelConfig]]:
        """The program and each kernel's fastest configuration (from the database; anything not
        yet measured is measured now)."""
        self.backend.trim()
        graph = self.region.graph(outputs)
        program = schedule(graph, POLICIES[variant])
        executor = Executor(graph, program, [self.backend.default_config(k) for k in program.kernels], self.backend,
                            reuse=False, sizes=self.region.sizes)
        args = self._fresh_args()
        executor(*args)
        configs, _ = self._tune_kernels(executor, args, self.max_configs, confirm=True)
        return graph, program, configs

    def kernel_report(self, program: Program, configs: list[KernelConfig]) -> list[dict]:
        """Per kernel of a chosen program: what it computes, its configuration, its measured time
        and the bytes and operations it must at least move and do, at the tuning sizes."""
        args = self.region.args
        env = self.region.sizes | self.region.graph([]).bind_symbols(
            [np.shape(a) for a in args], [np.asarray(a).dtype for a in args])
        rows = []
        for kernel, config in zip(program.kernels, configs):
            name, _ = self.backend.render(kernel, config)
            symbols = {s: env[s] for s in kernel.symbols}
            rows.append({"label": kernel.label, "function": name, "config": config.key(),
                         "seconds": self.db.kernel_time(self.fingerprint, name, config.key(), symbols),
                         "bytes": traffic_bytes(kernel, env), "ops": arithmetic_ops(kernel, env)})
        return rows

    def _cold(self, weights: list) -> dict:
        """The timing option that evicts `weights` before each timed call, where the backend
        can (the CPU: a decode step reads each weight once, from memory, never from the cache a
        repeated call warms; CUDA's timing overwrites its L2 cache before every call anyway)."""
        if not weights or not isinstance(self.backend, Evicting):
            return {}
        return {"before": self.backend.evicter(weights)}

    # --- kernels ------------------------------------------------------------------------------
    def _fresh_args(self) -> list:
        """Copies on the backend: a program may update an input in place (the KV cache), and
        one set serves a whole check-then-time sequence."""
        return [self.backend.input(np.array(a, copy=True)) for a in self.region.args]

    def _tune_kernels(self, executor: Executor, args, limit: int, confirm: bool = False,
                      share: float = 0.0) -> tuple[list[KernelConfig], float]:
        """Per kernel, the fastest configuration that computes what the default one computed
        (the default's outputs were just checked against the reference through the whole
        program). Returns the configurations and the sum of their times. The default and the
        library call go first; where the library call is LIBRARY_PRUNE times faster than the
        default, the kernel's other generated configurations are not compiled: a 512-token
        prefill layer's products spent most of a candidate's time compiling and timing
        generated GEMMs cuBLAS beat tenfold. `confirm`: every configuration measured is timed
        until it has KERNEL_TIMING_PASSES passes (a finalist's, whose choice the user keeps).
        `share`: a kernel under this share of the region's time after the first measurements
        keeps its configuration (HOT_SHARE past the deadline)."""
        inputs, env = executor.bind(args)
        launch_args = executor.launch_args(inputs, env)
        kernels = executor.program.kernels
        kins = [kin(k) for k in kernels]
        ratios = self.db.kin_ratios(self.fingerprint, kins) if limit < self.max_configs else {}
        options = []
        for kernel, kernel_kin in zip(kernels, kins):
            symbols = {s: env[s] for s in kernel.symbols}
            with self._phase("render"):
                space = kernel_space(self.backend, kernel, self._recorded, self.region.fixed)
                if kernel_kin in ratios:
                    # with those this very kernel was measured in before, which cost nothing now
                    own = ratios[kernel_kin].get(self.backend.render(kernel, space[0])[0], {})
                    chosen = kin_order(space, ratios[kernel_kin], limit)
                    space = chosen + [c for c in space if c.key() in own and all(c is not k for k in chosen)]
                else:
                    space = space[:limit]
                rows = [(c, *self.backend.render(kernel, c)) for c in space]
            options.append((symbols, rows))
        self._records = _KernelRecords(self.db, self.fingerprint, [n for _, rows in options for _, n, _ in rows])
        # past the deadline only the default (what the winner needs to run), a library call and
        # the first tensor-core tiling are measured: what they save on a large product (the
        # vocabulary head: 56 ms generated, 0.4 ms in cuBLAS on the H200) must not depend on the
        # budget; the choice still takes anything measured before
        first = [_always_measured(rows) for _, rows in options]
        measured = self._measure_rows(executor, inputs, env, launch_args, options, first)
        rest = [[] if self._library_wins(symbols, rows) else rows for symbols, rows in options]
        if self.deadline is not None and self.deadline.expired:
            # past it, the kernels that carry the region's time still have their configurations
            # measured: a 60-second budget over a 4,096-position decode left its MLP GEMV at its
            # default, 1.58 TB/s beside 3.30 TB/s tuned (the kernels' other configurations are
            # a few compiles, the program's time the user's for good)
            share = max(share, HOT_SHARE)
        if share > 0:
            times = [seconds for seconds, _ in self._fastest(kernels, options)]
            rest = [rows if seconds >= share * sum(times) else []
                    for rows, seconds in zip(rest, times)]
        measured |= self._measure_rows(executor, inputs, env, launch_args, options, rest)
        self._record_kin_ratios([(kins[i], options[i]) for i in sorted(measured)])
        if confirm:
            self._confirm_rows(executor, launch_args, env, options)
        chosen = self._fastest(kernels, options)
        return [config for _, config in chosen], sum(seconds for seconds, _ in chosen)

    def _record_kin_ratios(self, kernels: list[tuple[str, tuple]]) -> None:
        """Each kernel's (its kin, its option) measured configurations' times over its default's."""
        for kernel_kin, (symbols, rows) in kernels:
            default = self._records.time(rows[0][1], rows[0][0].key(), symbols)
            ratios = {c.key(): t / default for c, name, _ in rows[1:]
                      if default and (t := self._records.time(name, c.key(), symbols)) is not None}
            if ratios:
                self.db.record_kin_ratios(self.fingerprint, kernel_kin, rows[0][1], ratios)

    def _fastest(self, kernels, options) -> list[tuple[float, KernelConfig]]:
        """Per kernel, its fastest configuration measured and its time (the default and 0 s
        where none is)."""
        chosen = []
        for kernel, (symbols, rows) in zip(kernels, options):
            timed = [(self._records.time(name, c.key(), symbols), c)
                     for c, name, _ in rows]
            chosen.append(min(((t, c) for t, c in timed if t is not None),
                              key=lambda tc: tc[0], default=(0.0, self.backend.default_config(kernel))))
        return chosen

    def _library_wins(self, symbols: dict, rows: list) -> bool:
        """Whether a kernel's library call or tensor-core product was timed LIBRARY_PRUNE times
        faster than its default."""
        def timed(c, name) -> float | None:
            return self._records.time(name, c.key(), symbols)
        library = min(filter(None, (timed(c, n) for c, n, _ in rows if isinstance(c, PRODUCT_CONFIGS))), default=None)
        default = timed(*rows[0][:2])
        return library is not None and default is not None and library * LIBRARY_PRUNE < default

    def _measure_rows(self, executor: Executor, inputs, env, launch_args, options, chosen_rows) -> set[int]:
        """Check and time, per kernel, the configurations of `chosen_rows` not measured before
        (compiled together); returns the indices of the kernels that had any. The device is held for one configuration's launches at a time, and
        the host compares its outputs with the default's after letting it go: with eight workers
        on a 16-core host, holding it through host work made the device, not the workers, bound
        the search's rate."""
        kernels = executor.program.kernels
        pending = {}
        for i, ((symbols, _), rows) in enumerate(zip(options, chosen_rows)):
            for c, name, src in rows:
                if (self._records.time(name, c.key(), symbols) is None
                        and not self._records.failed(name, c.key(), symbols)):
                    pending.setdefault(name, (i, c, src))
        if not pending:
            return set()
        with self._phase("compile"):
            functions = self.backend.compile({n: src for n, (_, _, src) in pending.items()})
        defaults = {}      # per kernel: its default's outputs, on the device and on the host
        for name, (i, config, _) in pending.items():
            kernel, symbols = kernels[i], options[i][0]
            with self._on_device():
                if i not in defaults:
                    with self._phase("check"):
                        saved = [executor.result(out.name, inputs, env, copy=False).copy() for out in kernel.outputs]
                        defaults[i] = saved, [self.backend.to_host(a, out.dtype) for a, out in zip(saved, kernel.outputs)]
                got, times = self._launch(kernel, executor, inputs, env, launch_args[i], functions[name], name,
                                          config, symbols, defaults[i][0])
            with self._phase("compare"):
                bad = next(filter(None, (mismatch(g, want, self.rtol) for g, want in zip(got, defaults[i][1]))), None)
            if bad:
                self._records.fail(name, config.key(), symbols, bad[0], bad[1])
            else:
                self._records.record(name, config.key(), symbols, statistics.median(times), len(times))
                self.kernels_measured += 1
        return {i for i, _, _ in pending.values()}

    def _confirm_rows(self, executor: Executor, launch_args, env, options) -> None:
        """Time again each measured configuration with fewer than KERNEL_TIMING_PASSES passes
        (checked when first measured: its output is what the default's was), a pass over all
        kernels at a time."""
        kernels = executor.program.kernels
        for _ in range(KERNEL_TIMING_PASSES - 1):
            pending = {}        # configurations of one source are timed apart (their launches differ)
            for i, (symbols, rows) in enumerate(options):
                for c, name, src in rows:
                    if 0 < self._records.passes(name, c.key(), symbols) < KERNEL_TIMING_PASSES:
                        pending.setdefault((name, c.key()), (i, c, src))
            if not pending:
                return
            with self._phase("compile"):
                functions = self.backend.compile({n: src for (n, _), (_, _, src) in pending.items()})
            with self._on_device():
                for (name, _), (i, config, _) in pending.items():
                    launch = self.backend.launcher(functions[name], kernels[i], config)
                    times = self._time(kernels[i], executor, launch, launch_args[i], env)
                    self._records.confirm(name, config.key(), options[i][0], statistics.median(times),
                                          len(times))

    def _time(self, kernel: Kernel, executor: Executor, launch, args, env) -> list[float]:
        weights = [executor.arrays[b.name] for b in kernel.inputs
                   if executor.program.buffers[b.name].role == "weight"]
        with self._phase("time"):
            return self.backend.time(lambda: launch(args, env), TIMING_TARGET_S, MAX_REPEATS, **self._cold(weights))

    def _launch(self, kernel: Kernel, executor: Executor, inputs, env, args, fn, name: str,
                config: KernelConfig, symbols: dict, saved: list) -> tuple[list[np.ndarray], list[float]]:
        """A configuration's outputs (on the host, from its first launch, into poisoned buffers)
        and its times; then the default's outputs (`saved`) back in place, since the kernels
        measured next read them and this configuration may have computed something else."""
        outputs = [executor.result(out.name, inputs, env, copy=False) for out in kernel.outputs]
        for out in kernel.outputs:
            if out.name not in executor.program.aliases:
                self.backend.poison(executor.arrays[out.name], out.dtype)  # a kernel must write
        launch = self.backend.launcher(fn, kernel, config)
        self.on_trial(name, config.key(), symbols)
        with self._phase("check"):
            launch(args, env)
            # a copy where the host holds the buffer itself (the CPU): the default's values go back into it
            got = [h.copy() if (h := self.backend.to_host(a, out.dtype)) is a else h
                   for a, out in zip(outputs, kernel.outputs)]
        times = self._time(kernel, executor, launch, args, env)
        with self._phase("check"):
            for a, default in zip(outputs, saved):
                a[...] = default
        return got, times
