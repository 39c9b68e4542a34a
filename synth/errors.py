"""The error types synth raises, each tied to one documented exit code.

Every error a user can cause is one of these; the CLI turns it into a message and
the exit code below, never a traceback.
"""

from __future__ import annotations

from dataclasses import dataclass


class SynthError(Exception):
    """Base class: an error with a message meant for the user."""

    exit_code = 2


class InputError(SynthError):
    """Bad input: a malformed workload, an unknown hardware key, a bad argument (exit 2)."""

    exit_code = 2


EXCERPT_WIDTH = 100
"""The most characters of a source line an error shows (a terminal's width, about)."""


@dataclass(frozen=True)
class SourceLocation:
    """Where in a text file something is: 1-based line and column."""

    path: str
    line: int
    col: int
    text: str  # the whole source line, for the caret display

    def render(self) -> str:
        return f"{self.path}:{self.line}:{self.col}\n{self.excerpt()}"

    def excerpt(self) -> str:
        """The line and a caret under the column; a long line is cut to `EXCERPT_WIDTH`
        characters around the column, marked with `...`."""
        text, col = self.text, self.col
        if len(text) > EXCERPT_WIDTH:
            start = max(0, min(col - 1 - EXCERPT_WIDTH // 2, len(text) - EXCERPT_WIDTH))
            shown = text[start:start + EXCERPT_WIDTH]
            prefix = "..." if start > 0 else ""
            suffix = "..." if start + EXCERPT_WIDTH < len(text) else ""
            text, col = prefix + shown + suffix, col - start + len(prefix)
        return f"  {text}\n  {' ' * (col - 1)}^"


class LocatedError(InputError):
    """An input error at a place in a file: `file:line:col: message`, the line, a caret."""

    def __init__(self, message: str, location: SourceLocation) -> None:
        self.message = message
        self.location = location
        loc = location
        super().__init__(f"{loc.path}:{loc.line}:{loc.col}: {message}\n{loc.excerpt()}")


class InfeasibleError(SynthError):
    """No schedule satisfies the constraints (exit 1)."""

    exit_code = 1


class SolveTimeout(SynthError):
    """The solver found no solution within the time limit (exit 3)."""

    exit_code = 3


class ValidationError(SynthError):
    """A schedule ran but its result differs from the reference (exit 4)."""

    exit_code = 4


class IRError(SynthError):
    """A loop nest that breaks an IR rule (verifier or interpreter); exit 4 at the CLI."""

    exit_code = 4
