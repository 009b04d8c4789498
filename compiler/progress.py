"""What a compile shows while it works. Its stages (lowering, each graph's search, saving) are
lines with the time since the compile started; each region's search (candidates tried and valid,
the best time so far, its gain over the first valid candidate, the time left of the region's
share of the budget) is a live bar on a terminal, and elsewhere (a log file, CI) a plain line
when the region starts, every PLAIN_EVERY_S seconds while it runs, and when it ends."""
from __future__ import annotations

import time

from ..search.tuner import Progress

PLAIN_EVERY_S = 10.0


def _stats(p: Progress, left: float) -> str:
    best = f"{p.best_s * 1e6:,.0f} us" if p.best_s else "-"
    gain = f"{p.gain:.2f}x" if p.gain else "-"
    known = f", {p.tried - p.measured} from the database" if p.measured < p.tried else ""
    return f"tried {p.tried} (valid {p.valid}{known}), best {best}, gain {gain}, {left:,.0f} s left"


def spent_text(spent: dict[str, float], measured: int) -> str:
    """Where a region's measured candidates spent their time: seconds a candidate, then each
    phase's share (compiler/measure.py: PHASES, and a worker's round trip), largest first."""
    total = sum(spent.values())
    if not measured or not total:
        return "no candidate measured"
    return f"{total / measured:.2f} s a candidate: " + ", ".join(
        f"{phase} {seconds / total:.0%}" for phase, seconds in sorted(spent.items(), key=lambda kv: -kv[1]))


class CompileDisplay:
    """A context manager; `show=False` shows nothing."""

    def __init__(self, show: bool):
        self.show, self.start = show, time.monotonic()
        self._bar = None
        self._tasks: dict[str, int] = {}
        # plain lines: region -> [when last shown, the stats shown then, its latest stats]
        self._regions: dict[str, list] = {}
        self._current: str | None = None

    def __enter__(self) -> CompileDisplay:
        if self.show:
            from rich.console import Console
            if Console().is_terminal:
                from rich.progress import BarColumn, Progress as Bar, TextColumn, TimeElapsedColumn
                self._bar = Bar(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[stats]}"),
                                TimeElapsedColumn(), transient=False)
                self._bar.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._finish_region()
        if self._bar is not None:
            self._bar.__exit__(*exc)

    def stage(self, text: str) -> None:
        """A stage begins: one line, above the bars on a terminal."""
        if not self.show:
            return
        self._finish_region()
        if self._bar is not None:
            self._bar.console.print(self._stamped(text), highlight=False)
        else:
            print(self._stamped(text), flush=True)

    def region(self, graph: str, p: Progress, left: float) -> None:
        """A region's search moved on (a candidate was measured)."""
        if not self.show:
            return
        name, stats = f"{graph}: {p.region}", _stats(p, left)
        if self._bar is not None:
            if name not in self._tasks:
                self._tasks[name] = self._bar.add_task(name, total=None, stats="")
            self._bar.update(self._tasks[name], stats=stats)
            return
        if name != self._current:
            self._finish_region()
            self._current = name
        state = self._regions.setdefault(name, [float("-inf"), None, stats])
        state[2] = stats
        if time.monotonic() - state[0] >= PLAIN_EVERY_S:
            self._show_region(name)

    def _stamped(self, text: str) -> str:
        return f"[{time.monotonic() - self.start:5.0f} s] {text}"

    def _show_region(self, name: str) -> None:
        state = self._regions[name]
        print(self._stamped(f"  {name}: {state[2]}"), flush=True)
        state[0], state[1] = time.monotonic(), state[2]

    def _finish_region(self) -> None:
        """The last state of the region whose search just ended, where it was not shown."""
        if self._current is not None:
            if self._regions[self._current][1] != self._regions[self._current][2]:
                self._show_region(self._current)
            self._current = None
