"""How synth reads numbers, and the one range check every integer passes before a solver.

Every integer a user gives reaches the constraint solvers as a constant: a problem size
(a `.syn` file, `--set`, `--vary set:`), a `--fix` value, a `--constraint` literal, a
hardware quantity (a file or `--hw-set`, converted to bytes, hertz or picoseconds). Each
is read by `parse_int` or checked by `check_int` where it enters, so that an error names
the option or key it came from, and nothing past 64 bits (CP-SAT's integers) or past the
ranges below reaches a solver. The terms the encoding builds from these constants
(products of sizes and costs) are bounded once more where they are lowered to CP-SAT
(`synth.constraints.cpsat.Lowering`).

Numbers are ASCII: Python's `int()` and `re`'s `\\d` accept the digits of every script
(`int("٣٢")` is 32, `int("２")` is 2) and `str.isdigit()` even superscripts that `int()`
rejects (`"²".isdigit()` is True). A `.syn` file, an option or a hardware value means the
same to a reader as to synth only when its digits are 0-9, so only those are read.
"""

from __future__ import annotations

import re

from synth.errors import InputError

__all__ = ["MAX_QUANTITY", "MAX_SIZE", "MAX_TIME_LIMIT_S", "check_int", "is_int", "parse_int",
           "to_int"]

MAX_SIZE = 2**31 - 1
"""The largest problem size, tensor dimension or unit count. A size is also a value in
expressions (`x[i] / N`), which the reference and the emitted C compute in C's 32-bit
`int` (`reference._int_literal`); this also keeps factoring a size (`space.divisors`,
trial division up to its square root: at most 46,341 steps) fast."""

MAX_QUANTITY = 2**53
"""The largest magnitude of any other integer given to a solver: bytes, hertz,
picoseconds, picoseconds per byte, cycles, `--fix` values and `--constraint` literals.
Integers up to 2^53 are exact in float64, which the cost model's conversions (cycles x
1e12 / clock) and JSON readers use; products of several of them are checked again
against CP-SAT's 64-bit range where the encoding is lowered."""

MAX_TIME_LIMIT_S = (2**32 - 1) / 1000
"""The longest `--time-limit`: z3 takes its timeout as an unsigned 32-bit number of
milliseconds (about 49.7 days)."""

_ASCII_INT = re.compile(r"[+-]?[0-9]+")
_LONGEST = 40  # digits: longer integers are out of every range above


def is_int(text: str) -> bool:
    """Whether `text` (stripped) is an optionally signed integer in ASCII digits."""
    return _ASCII_INT.fullmatch(text.strip()) is not None


def check_int(value: int, what: str, low: int, high: int) -> int:
    """`value` if `low <= value <= high`, else an `InputError` that names `what` (the
    option or key the value came from) and the admissible range."""
    if not low <= value <= high:
        raise InputError(f"{what}: {_short(value)} is out of range: expected "
                         f"{_short(low)}..{_short(high)}")
    return value


def parse_int(text: str, what: str, low: int = -MAX_QUANTITY, high: int = MAX_QUANTITY
              ) -> int:
    """An integer written in ASCII digits, within `low..high`; else an `InputError`
    naming `what`."""
    if not is_int(text):
        raise InputError(f"{what}: expected an integer written with the digits 0-9, "
                         f"got {_clip(text.strip())!r}")
    return check_int(to_int(text), what, low, high)


def to_int(text: str) -> int:
    """An ASCII integer (see `is_int`) as an int; one too long to be in any range here
    becomes a number of the same sign and length class rather than being converted
    (Python refuses to convert strings of more than 4,300 digits)."""
    text = text.strip()
    digits = text.lstrip("+-").lstrip("0")
    if len(digits) > _LONGEST:
        return (-1 if text.startswith("-") else 1) * 10 ** (len(digits) - 1)
    return int(text)


def _short(value: int) -> str:
    """An integer as written, a limit by its name (2^53), or a long one by its length (a
    400-digit size should not fill the terminal)."""
    named = {MAX_SIZE: "2^31-1", MAX_QUANTITY: "2^53", -MAX_QUANTITY: "-2^53"}
    if value in named:
        return named[value]
    text = str(value)
    if len(text) <= 24:
        return text
    return f"{'-' if value < 0 else ''}a {len(text.lstrip('-'))}-digit number"


def _clip(text: str, limit: int = 40) -> str:
    return text if len(text) <= limit else text[:limit] + "..."
