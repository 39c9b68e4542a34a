"""One clock for a whole run: `--time-limit` bounds every stage, not only the search.

`pipeline.run` makes one `Deadline` from the request's time limit and passes it through
the stages that can take long (encoding, fusion candidates, solving, binding). Each
stage asks how much time is left, gives its solver calls at most that, and checks
`expired()` between units of work (a candidate kernel, a fusion cover, a group of the
binding analysis): at the limit it stops with the best schedule found so far (status
feasible, with its proven gap) or, when there is none, a timeout (exit 3).
"""

from __future__ import annotations

import time


class Deadline:
    """A point in time `seconds` from its creation (monotonic clock)."""

    def __init__(self, seconds: float) -> None:
        self.start = time.perf_counter()
        self.seconds = seconds
        self.at = self.start + seconds

    def left(self) -> float:
        """Seconds until the deadline (negative past it)."""
        return self.at - time.perf_counter()

    def expired(self) -> bool:
        return self.left() <= 0

    def elapsed(self) -> float:
        """Seconds since the deadline was set."""
        return time.perf_counter() - self.start
