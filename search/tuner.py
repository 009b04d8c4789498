"""The tuner's loop for one region: draw candidates from the saturated e-graph (the program as
lowered's neighbours and random programs first, then bred from the fastest measured, the program as
lowered among them), have each one checked and estimated by the backend, journal every
result in the tuning database, and time the best few end to end to pick the winner.

The backend work (scheduling, compiling, checking, timing) arrives as callables, so this module
knows nothing of kernels: `evaluate(outputs, variant) -> Outcome` and
`end_to_end(outputs, variant) -> timer`, the program built once and each `timer()` the median
seconds of a few runs as deployed. A variant is an opaque name for how the backend turns
a program into kernels (its fusion policy). A resumed compile finds every finished candidate in
the journal and measures it again never."""
from __future__ import annotations

import math
import random
import statistics
import time
from concurrent.futures import ALL_COMPLETED, FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field
from typing import Callable, Sequence, TypeVar

from ..ir import KilnError, Node
from . import extract, provenance
from .budget import Deadline
from .saturate import Saturated
from .tunedb import TuneDB

T = TypeVar("T")

ORIGINAL = "original"          # the candidate key of the program as lowered (no rewrite applied)
REMEMBERED = "remembered"      # the key's prefix of an earlier compile's winner (the database's)
FINALISTS = 3                  # candidates timed end to end
# the program as lowered is also timed end to end under every fusion policy whose estimate is
# within this of its best one's: on an H100 Llama's decode layer had two within 0.4% (83.6, 84.0
# us); the first, timed whole, ran 69.7 us, and the second, timed in another compile, 65.9
LOWERED_CLOSE = 0.05
# a kernel sum leaves out what a call spends between kernels and what a kernel leaves cached for
# the next, which differ with their number: the best candidate of each count below the leading
# finalists' (one kernel a head for a whole attention, say) is timed end to end too, where its
# estimate is within this of the best; at most FEWER_KERNELS of them. The two err apart: SmolLM2's
# decode layer on the 2-core VM ran 1.26x its kernel sum end to end in 16 kernels, 0.81x in 6
FEWER_CLOSE = 0.5
FEWER_KERNELS = 3
# the finalists are timed in turn, a few runs each (a round), this many rounds, each finalist first
# in its turn; its median round counts, and it is compared with the fastest round by round
TIMING_ROUNDS = 10
# a finalist is as fast as the timing can tell apart from the fastest (by its median round) unless
# it ran more than TIE_CLOSE slower in so many of the rounds they shared that chance would make
# that many less than once in 1/SLOWER_CHANCE (a sign test); the one of fewest kernels among those
# wins (it leaves the least to what lies between kernels in a whole step). One whose median ratio
# to the fastest exceeds TIE_CLOSE without that many rounds is timed again beside the fastest, up
# to MORE_ROUNDS more rounds, until they show it slower or it is left tied. Load on a shared
# machine comes in spells: on the 2-core VM the same SmolLM2 decode artifact benched 57.7 and 82.5
# tok/s minutes apart, and when each finalist was timed ten runs at a time, three passes, one
# compile timed the same layers 362 to 565 us a pass and another its two fastest 65% slower in
# their first pass than in their next two, so that which program of 4 to 17 kernels won (all
# moving the same bytes; one process timing them 200 runs each put them within 12% of each other,
# and the same policy 12% apart in two runs) depended on which of them a spell hit. A round a few
# runs long puts each finalist beside the fastest within milliseconds, under the same spell; yet
# with the VM loaded by other work the middle half of a finalist's ratios to the fastest still
# spanned 13-26% over ten rounds (3-9% on a quiet VM, 1% on an H100)
TIE_CLOSE = 0.03
SLOWER_CHANCE = 0.05
MORE_ROUNDS = 30
BATCH = 8                      # candidates drawn per round


@dataclass(frozen=True)
class Outcome:
    status: str                        # "ok" or a rejection: wrong, nan, crash, compile, timeout
    estimate_s: float | None = None    # summed kernel times, when ok
    detail: str = ""
    # where its evaluation's time went: seconds by phase (compiler/measure.py: PHASES)
    spent: dict[str, float] = field(default_factory=dict, compare=False)

    @classmethod
    def measured(cls, estimate_s: float, kernels: int) -> Outcome:
        return cls("ok", estimate_s, f"{kernels} kernels")

    @property
    def kernels(self) -> int | None:
        """How many kernels a measured candidate launches (its detail, in the database too)."""
        count = self.detail.removesuffix(" kernels")
        return int(count) if self.status == "ok" and count.isdigit() else None


@dataclass
class Progress:
    """What a progress display shows about one region's search."""
    region: str
    tried: int = 0
    measured: int = 0                  # of those tried, measured in this run (not the database's)
    valid: int = 0
    first_valid_s: float | None = None
    best_s: float | None = None
    curve: list[tuple[float, int, float]] = field(default_factory=list)  # (elapsed s, tried, best)
    spent: dict[str, float] = field(default_factory=dict)   # the measured candidates' seconds by phase
    search_s: float | None = None      # from the search's start until its last candidate landed (finalists not)

    @property
    def gain(self) -> float | None:
        if self.first_valid_s and self.best_s:
            return self.first_valid_s / self.best_s
        return None


@dataclass
class Winner:
    key: str
    variant: str
    outputs: list[Node]
    estimate_s: float
    end_to_end_s: float
    progress: Progress
    genome: tuple | None = None        # its choice in the e-graph (None: the program as lowered)
    lowered_end_to_end_s: float | None = None   # the program as lowered under the first policy, timed alike
    finalists: list[Finalist] = field(default_factory=list)   # fastest first


@dataclass(frozen=True)
class Finalist:
    """A finalist timed whole: its median round, each round (none when the database held its
    time), and whether the timing could not tell it from the fastest (the fewest kernels among
    those win)."""
    key: str
    kernels: int | None
    end_to_end_s: float
    rounds: list[float]
    tied: bool


def _guarded(call: Callable[[], T]) -> tuple[T | None, str]:
    """call()'s value and "", or None and what went wrong: a candidate that breaks the backend is
    rejected, not fatal; a KilnError (the machine's problem: no compiler ...) stops the compile."""
    try:
        return call(), ""
    except KilnError:
        raise
    except Exception as err:
        return None, f"{type(err).__name__}: {err}"


def _outcome(evaluate: Callable[[], Outcome]) -> Outcome:
    outcome, error = _guarded(evaluate)
    return Outcome("crash", None, error) if error else outcome


class RegionTuner:
    def __init__(self, region: str, label: str, original: Sequence[Node], saturated: Saturated | None,
                 variants: Sequence[str], evaluate: Callable[[list[Node], str], Outcome],
                 end_to_end: Callable[[list[Node], str], Callable[[], float]], db: TuneDB, compile_id: str,
                 seed: int = 0, on_progress: Callable[[Progress], None] = lambda p: None,
                 prepare_finalists: Callable[[list[tuple[list[Node], str]]], None] = lambda finalists: None):
        """`prepare_finalists([(outputs, variant), ...])`: the finalists about to be timed end to
        end, all at once (the backend may tune their kernels side by side first)."""
        self.region, self.original, self.saturated = region, list(original), saturated
        self.variants, self.evaluate, self.end_to_end = list(variants), evaluate, end_to_end
        self.prepare_finalists = prepare_finalists
        self.db, self.compile_id = db, compile_id
        self.rng = random.Random(seed)
        self.progress = Progress(label)
        self.on_progress = on_progress
        self.scored: dict[tuple, float] = {}          # genome -> best estimate over variants
        self.ok: list[tuple] = []          # estimate, key, variant, outputs, genome
        self.outcomes: dict[str, Outcome] = {}     # key -> its outcome, of those in `ok`
        self.start = time.monotonic()
        self.lowered_measured = False
        # an `evaluate` that measures several candidates side by side (compiler/worker.py) takes
        # them through `submit`; the candidates in flight, with what noting each one needs
        self.width = getattr(evaluate, "width", 1) if hasattr(evaluate, "submit") else 1
        self._flying: dict[Future, tuple] = {}

    def measure_lowered(self, deadline: Deadline) -> float | None:
        """The program as lowered under the first variant, always (whatever the deadline): what the
        region costs before any search; None where it is not valid. `run` tries the other variants."""
        self.deadline = deadline
        self._try(ORIGINAL, None, self.original, self.variants[:1])
        self._land(everything=True)
        self.lowered_measured = True
        return self.progress.best_s

    def run(self, deadline: Deadline, max_candidates: int,
            remembered: Sequence[tuple[str, str, list[Node]]] = ()) -> Winner:
        """The search, then the finalists timed whole; `remembered` (key, variant, outputs): earlier
        compiles' winners of this region, checked and timed beside the finalists whatever their
        estimate, so that a longer search never ends with a slower program."""
        self.deadline, started = deadline, time.monotonic()
        if self.lowered_measured:
            self._try(ORIGINAL, None, self.original, self.variants[1:], first_always=False)
        else:
            self._try(ORIGINAL, None, self.original)
        self._land(everything=True)
        seen = {ORIGINAL}
        view = self.saturated.graph if self.saturated else None
        lowered_s = [e for e, key, *_ in self.ok if key.startswith(ORIGINAL + "/")]
        if view is not None and lowered_s:
            # the program as lowered is a parent too, scored as measured: the first round draws
            # its neighbours (one class's e-node changed: a rewrite applied at one place) beside
            # random programs, and breeding may keep returning to it
            lowered = provenance.lowered_genome(self.saturated, self.rng)
            self.scored[lowered] = min(lowered_s)
            seen.add(extract.Candidate.of(lowered).key)
        # past the deadline the draw goes on while it meets candidates the database already holds
        # (a resumed compile replays the interrupted one's draws, at no cost, up to where it stopped)
        replaying = True
        while view is not None and replaying and self._started < max_candidates:
            if len(self.scored) >= 2:
                batch = extract.genetic_candidates(view, list(self.scored.items()), BATCH, self.rng)
            elif self.scored:      # the neighbours besides a whole round of random programs
                batch = (extract.neighbours(next(iter(self.scored)), view, BATCH // 2, self.rng)
                         + extract.candidates(view, BATCH, self.rng))
            else:
                batch = extract.candidates(view, BATCH, self.rng)
            fresh = [c for c in batch if c.key not in seen]
            if not fresh:
                break                       # the space is exhausted
            for candidate in fresh:
                if self._started >= max_candidates:
                    break
                if candidate.key in seen:       # drawn twice in one round (a neighbour drawn at random too)
                    continue
                if deadline.expired and not self._recorded(candidate.key):
                    replaying = False
                    break
                seen.add(candidate.key)
                outputs = extract.decode(self.saturated.encoded, view, candidate.genome)
                self._try(candidate.key, candidate.genome, outputs)
        for key, variant, outputs in remembered:
            self._try(key, None, outputs, [variant])
        self._land(everything=True)
        self.progress.search_s = time.monotonic() - started
        return self._final({f"{key}/{variant}" for key, variant, _ in remembered})

    @property
    def _started(self) -> int:
        """Candidates tried or in flight."""
        return self.progress.tried + len(self._flying)

    def _recorded(self, key: str) -> bool:
        return any(self.db.candidate(self.compile_id, self.region, f"{key}/{variant}") is not None
                   for variant in self.variants)

    def _try(self, key: str, genome, outputs: list[Node], variants: Sequence[str] | None = None,
             first_always: bool = True) -> None:
        for k, variant in enumerate(self.variants if variants is None else variants):
            name = f"{key}/{variant}"
            record = self.db.candidate(self.compile_id, self.region, name)
            # the original's first variant always runs; what the database holds costs nothing
            if (k or not first_always) and self.deadline.expired and record is None:
                break
            job = (name, variant, outputs, genome)
            if record is not None:
                self._note(Outcome(record.status, record.estimate_s, record.detail), *job)
            elif self.width > 1:
                while len(self._flying) >= self.width:
                    self._land()
                self._flying[self.evaluate.submit(outputs, variant)] = job
            else:
                self._measured(_outcome(lambda: self.evaluate(outputs, variant)), job)

    def _land(self, everything: bool = False) -> None:
        """Note the candidates in flight that are done: at least one, or all of them."""
        while self._flying:
            done, _ = wait(self._flying, return_when=ALL_COMPLETED if everything else FIRST_COMPLETED)
            for future in done:
                self._measured(_outcome(future.result), self._flying.pop(future))
            if not everything:
                return

    def _measured(self, outcome: Outcome, job: tuple) -> None:
        name = job[0]
        self.db.record_candidate(self.compile_id, self.region, name, outcome.status,
                                 outcome.estimate_s, detail=outcome.detail)
        self.progress.measured += 1
        for phase, seconds in outcome.spent.items():
            self.progress.spent[phase] = self.progress.spent.get(phase, 0.0) + seconds
        self._note(outcome, *job)

    def _note(self, outcome: Outcome, key: str, variant: str, outputs, genome) -> None:
        p = self.progress
        p.tried += 1
        if outcome.status == "ok":
            p.valid += 1
            self.ok.append((outcome.estimate_s, key, variant, outputs, genome))
            self.outcomes[key] = outcome
            if p.first_valid_s is None:
                p.first_valid_s = outcome.estimate_s
            p.best_s = min(p.best_s or outcome.estimate_s, outcome.estimate_s)
            if genome is not None:
                self.scored[genome] = min(self.scored.get(genome, outcome.estimate_s), outcome.estimate_s)
        p.curve.append((time.monotonic() - self.start, p.tried, p.best_s or float("nan")))
        self.on_progress(p)

    def _fewer_kernels(self, ranked: list[tuple]) -> set[str]:
        """The best candidate of each kernel count below the leading finalists' fewest, within
        FEWER_CLOSE of the best estimate (at most FEWER_KERNELS, the fewest kernels first)."""
        leading = [n for row in ranked[:FINALISTS] if (n := self.outcomes[row[1]].kernels) is not None]
        best: dict[int, str] = {}
        for estimate, key, *_ in ranked:
            count = self.outcomes[key].kernels
            if estimate > ranked[0][0] * (1 + FEWER_CLOSE):
                break
            if leading and count is not None and count < min(leading):
                best.setdefault(count, key)
        return {best[count] for count in sorted(best)[:FEWER_KERNELS]}

    def _final(self, forced: set[str] = frozenset()) -> Winner:
        if not self.ok:
            raise KilnError(f"kiln: no valid candidate for region {self.progress.region}: even the "
                            "program as lowered failed its check against the reference interpreter "
                            "(the tuning database's candidates table says why)")
        ranked = sorted(self.ok, key=lambda row: row[0])
        # the program as lowered always among them, at its best estimate (and any within
        # LOWERED_CLOSE of it) and under each finalist's fusion policy: a rewrite replaces it only
        # by winning end to end (not by an estimate a few percent lower: noise, or kernels that
        # run apart faster than together), and the database holds what the rewrite gained with
        # the policy held fixed
        # ... and as lowered (its first policy), what the report's end-to-end gain is over
        as_lowered = f"{ORIGINAL}/{self.variants[0]}"
        lowered = [row for row in ranked if row[1].startswith(ORIGINAL + "/")]
        forced = (set(forced) | {as_lowered} | {f"{ORIGINAL}/{row[2]}" for row in ranked[:FINALISTS]}
                  | {row[1] for row in lowered if row[0] <= lowered[0][0] * (1 + LOWERED_CLOSE)})
        forced |= self._fewer_kernels(ranked)
        finalists = ranked[:FINALISTS] + [row for row in ranked[FINALISTS:] if row[1] in forced]
        # a burst of load on a shared machine (another process taking the cores an OpenMP region
        # waits for) made one finalist's ten runs 500x its others' (a 30 us program timed at 16
        # ms, beaten by the program as lowered): each finalist is timed in every round and its
        # median round counts. Its best would let one fast spell decide the other way: on the
        # 2-core VM a program timed 257 us whole once, 17% below every other finalist, ran about
        # 308 us a layer in the step the bench timed next
        seconds = {}
        for row in finalists:
            record = self.db.candidate(self.compile_id, self.region, row[1])
            if record and record.end_to_end_s:
                seconds[row[1]] = record.end_to_end_s
        untimed = [row for row in finalists if row[1] not in seconds]
        self.prepare_finalists([(outputs, variant) for _, _, variant, outputs, _ in untimed])
        timers, crashed = {}, {}
        for estimate, key, variant, outputs, genome in untimed:
            timers[key], crashed[key] = _guarded(lambda: self.end_to_end(outputs, variant))
        timed = {key: {} for key in timers if not crashed[key]}       # key -> {round: seconds}
        for turn in range(TIMING_ROUNDS + MORE_ROUNDS):
            live = [key for key in timed if not crashed[key]]
            if live and turn >= TIMING_ROUNDS:     # then the fastest, and those undecided beside it
                fastest = min(live, key=lambda key: statistics.median(timed[key].values()))
                live = [fastest] + [key for key in live if _verdict(timed[key], timed[fastest]) == UNDECIDED]
            if len(live) < (2 if turn >= TIMING_ROUNDS else 1):
                break
            for key in live[turn % len(live):] + live[:turn % len(live)]:
                # (out of memory on a GPU the workers share): the finalist, not the compile
                timed[key][turn], crashed[key] = _guarded(timers[key])
        timers.clear()            # each holds a built program: its memory goes before the next region's
        crashed = {key: detail for key, detail in crashed.items() if detail}
        timed = {key: rounds for key, rounds in timed.items() if key not in crashed}
        seconds |= {key: statistics.median(rounds.values()) for key, rounds in timed.items()}
        for estimate, key, *_ in untimed:
            self.db.record_candidate(self.compile_id, self.region, key, "crash" if key in crashed else "ok",
                                     estimate, end_to_end_s=seconds.get(key),
                                     detail=crashed.get(key, self.outcomes[key].detail))
        if not seconds:
            raise KilnError(f"kiln: every finalist of region {self.progress.region} crashed when timed end to "
                            f"end; the first: {next(iter(crashed.values()))}")
        tied = _tied(seconds, timed)
        estimate, key, variant, outputs, genome = min((row for row in finalists if row[1] in tied), key=lambda row: (
            self.outcomes[row[1]].kernels or float("inf"), seconds[row[1]]))
        timed = [Finalist(row[1], self.outcomes[row[1]].kernels, seconds[row[1]], list(timed.get(row[1], {}).values()),
                          row[1] in tied) for row in finalists if row[1] in seconds]
        return Winner(key, variant, outputs, estimate, seconds[key], self.progress, genome, seconds.get(as_lowered),
                      sorted(timed, key=lambda f: f.end_to_end_s))


TIED, SLOWER, UNDECIDED = "tied", "slower", "undecided"


def _verdict(mine: dict[int, float], fastest: dict[int, float]) -> str:
    """A finalist's rounds beside the fastest's (by round): SLOWER where it ran more than
    TIE_CLOSE slower in so many of their shared rounds that chance would give that many less than
    SLOWER_CHANCE of the time; else UNDECIDED where its median ratio to the fastest is above
    1 + TIE_CLOSE, TIED where not."""
    ratios = [mine[turn] / fastest[turn] for turn in mine if turn in fastest]
    n, k = len(ratios), sum(ratio > 1 + TIE_CLOSE for ratio in ratios)
    if n and sum(math.comb(n, i) for i in range(k, n + 1)) / 2 ** n < SLOWER_CHANCE:
        return SLOWER
    return UNDECIDED if n and statistics.median(ratios) > 1 + TIE_CLOSE else TIED


def _tied(seconds: dict[str, float], timed: dict[str, dict[int, float]]) -> set[str]:
    """The finalists the timing cannot tell from the fastest (by its median round): those its
    rounds do not show slower (_verdict), or, where the database held a time and no round was
    timed, within TIE_CLOSE of it by their medians."""
    fastest = min(seconds, key=seconds.get)
    return {key for key, s in seconds.items()
            if (_verdict(timed[key], timed[fastest]) != SLOWER if key in timed and fastest in timed
                else s <= seconds[fastest] * (1 + TIE_CLOSE))}
