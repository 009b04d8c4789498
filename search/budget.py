"""Time budgets: `--budget 1h30m` parsed to seconds, and a deadline the search loops poll. A
budget is wall time: a compile's graphs and their regions each take a share of what is left."""
from __future__ import annotations

import re
import time

from ..ir.errors import KilnError

_NUMBER = r"\d+(?:\.\d+)?"
_DURATION = re.compile(rf"(?:(?P<h>{_NUMBER})h)?(?:(?P<m>{_NUMBER})m)?(?:(?P<s>{_NUMBER})s)?")
_UNITS = {"h": 3600, "m": 60, "s": 1}
_EXAMPLES = "use e.g. 90s, 10m, 2h, 1h30m"


def parse_budget(text: str) -> float:
    """Seconds in "90s", "10m", "2h", "1h30m" or a plain number of seconds; more than zero."""
    body = text.strip().lower()
    negative = body.startswith("-")
    body = body.removeprefix("-")
    if re.fullmatch(_NUMBER, body):
        seconds = float(body)
    elif body and (match := _DURATION.fullmatch(body)):
        seconds = sum(float(match[unit] or 0) * scale for unit, scale in _UNITS.items())
    else:
        raise KilnError(f"kiln: --budget {text!r} is not a duration; {_EXAMPLES}")
    if negative or seconds <= 0:
        raise KilnError(f"kiln: --budget {text!r} must be more than zero; {_EXAMPLES}")
    return seconds


class Deadline:
    """A point `seconds` from now on the monotonic clock, so wall-clock changes cannot move it."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self._start = time.monotonic()
        self._end = self._start + seconds

    def remaining(self) -> float:
        return max(0.0, self._end - time.monotonic())

    @property
    def expired(self) -> bool:
        return time.monotonic() >= self._end

    def elapsed(self) -> float:
        """Seconds since the deadline was set."""
        return time.monotonic() - self._start

    def share(self, weight: float, of: float) -> Deadline:
        """A deadline `weight / of` of the time left now: one part of the work that remains (a
        graph, a region) taking its share of what the parts before it left, so that time one part
        overran comes out of the parts after it and the whole still ends on time."""
        return Deadline(self.remaining() * (weight / of if of > 0 else 1.0))
