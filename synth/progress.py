"""A live status line on stderr while `synth solve` runs: the stage, how long it has
run, and during the solve the best objective found so far.

The pipeline says which stage starts (`stage`), the solver which schedule is the best so
far (`best`); both are cheap no-ops unless a `Status` is active, which the CLI opens
only when stderr is a terminal (a pipe or a log file gets nothing: no carriage returns
in captured output). The line appears once a stage has run `SHOW_AFTER_S`, so quick runs
print nothing, and is erased when the run ends, before the output is printed.
"""

from __future__ import annotations

import threading
import time
from types import TracebackType
from typing import TextIO

__all__ = ["REFRESH_S", "SHOW_AFTER_S", "Status", "best", "stage"]

SHOW_AFTER_S = 0.5
"""A stage shorter than this shows no status (half a second: a delay people notice)."""

REFRESH_S = 0.1
"""How often the line is redrawn (ten times a second: the elapsed time's last digit)."""

PS_PER_S = 10**12

_CLEAR = "\r\x1b[2K"  # back to the line's start, erase it (VT100; every terminal today)

_active: Status | None = None


def stage(name: str) -> None:
    """A stage of the run starts (`parse`, `solve`, `validate`, ...)."""
    if _active is not None:
        _active.stage(name)


def best(objective_ps: int) -> None:
    """The solver found a schedule of this objective (picoseconds), the best so far."""
    if _active is not None:
        _active.best(objective_ps)


class Status:
    """The status line, while the `with` block runs; nothing when `stream` is not a
    terminal (or `enabled` is False)."""

    def __init__(self, stream: TextIO, enabled: bool | None = None) -> None:
        self.stream = stream
        self.enabled = stream.isatty() if enabled is None else enabled
        self.name = ""
        self.started = time.perf_counter()
        self.best_ps: int | None = None
        self.shown = False
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, name="synth-status", daemon=True)

    def __enter__(self) -> Status:
        global _active
        if self.enabled:
            _active = self
            self.thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        global _active
        if not self.enabled:
            return
        _active = None
        self.done.set()
        self.thread.join()
        with self.lock:
            if self.shown:
                self._write(_CLEAR)

    def stage(self, name: str) -> None:
        with self.lock:
            self.name, self.started, self.best_ps = name, time.perf_counter(), None

    def best(self, objective_ps: int) -> None:
        with self.lock:
            self.best_ps = objective_ps

    def line(self) -> str:
        """What the status says now."""
        from synth.cli import format_seconds

        elapsed = time.perf_counter() - self.started
        text = f"synth: {self.name or 'starting'} {elapsed:.1f} s"
        if self.best_ps is not None:
            text += f", best schedule so far {format_seconds(self.best_ps / PS_PER_S)}"
        return text

    def _run(self) -> None:
        while not self.done.wait(REFRESH_S):
            with self.lock:
                if time.perf_counter() - self.started < SHOW_AFTER_S:
                    continue
                self._write(_CLEAR + self.line())
                self.shown = True

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):  # a terminal closed under us: stop drawing
            self.done.set()
