"""Values of a hardware model's keys, independent of where they sit in the file.

`synth.hwfile` reads a model's tables and key paths; this module turns the scalar values it
finds there into integers: quantities with units (sizes in bytes, frequencies in hertz, times
in picoseconds, bandwidths in picoseconds per byte, '77cycles' at the model's clock), counts and
count ranges, and the values that come from the running machine (`count = "1..auto"`,
`lanes = "auto"`, `detect = "L2"`: CPU count, SIMD width from /proc/cpuinfo, cache sizes and
ways from sysfs). The parsers know nothing of key paths: they raise `UnitError`, which
`hwfile` turns into an `InputError` that names the key.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence
from fractions import Fraction
from pathlib import Path

from synth.limits import MAX_QUANTITY, MAX_SIZE, to_int

# The directory that stands for `/` where the machine is read: `SYNTH_FSROOT`, as hwloc's
# HWLOC_FSROOT, describes another machine (a copy of its /proc/cpuinfo and sysfs cache
# tree); the test suite sets it so that every test, and every process a test starts, sees
# the same CPU on any machine (tests/conftest.py).
FSROOT = Path(os.environ.get("SYNTH_FSROOT") or "/")


def machine_files(root: Path) -> tuple[Path, Path]:
    """Where Linux describes the machine, under `root` (standing for `/`): the CPU's
    flags (/proc/cpuinfo) and the first CPU's caches (sysfs)."""
    return root / "proc" / "cpuinfo", root / "sys" / "devices" / "system" / "cpu" / "cpu0" / \
        "cache"


# Where the caches and the flags are read (`detect_cache_size`, `vector_isa`). Module
# attributes (not default arguments) so tests can point them at a fake tree.
CPUINFO, CACHE_DIR = machine_files(FSROOT)

# `detect = ...` values: the cache level and the sysfs `type` values that count as a match.
DETECT_KINDS: dict[str, tuple[int, frozenset[str]]] = {
    "L1d": (1, frozenset({"Data"})),
    "L2": (2, frozenset({"Unified", "Data"})),
    "L3": (3, frozenset({"Unified", "Data"})),
}

_SIZE_UNITS: dict[str, int] = {
    "": 1, "B": 1,
    "KB": 10**3, "kB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
    "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40,
}
_FREQUENCY_UNITS: dict[str, int] = {"Hz": 1, "kHz": 10**3, "KHz": 10**3, "MHz": 10**6,
                                    "GHz": 10**9}
_TIME_UNITS_PS: dict[str, int] = {"ps": 1, "ns": 10**3, "us": 10**6, "µs": 10**6,
                                  "ms": 10**9, "s": 10**12}
_CYCLE_UNITS = ("cycle", "cycles")
_PS_PER_S = 10**12

# A non-negative decimal number followed by an optional unit; digits are 0-9 only (see
# synth.limits); longer digit strings than these are past any range anyway, and Fraction
# would otherwise build numbers of millions of digits (1e999999).
_QUANTITY = re.compile(r"^\s*(\d{1,40}(?:\.\d{1,40})?(?:[eE][+-]?\d{1,4})?)\s*([A-Za-zµ]*)\s*$",
                       re.ASCII)
_COUNT_RANGE = re.compile(r"^\s*(\d+)\s*\.\.\s*(\d+|auto)\s*$", re.ASCII)
COUNT = re.compile(r"^\s*\d+\s*$", re.ASCII)
NUMBER = re.compile(r"\d{1,40}(?:\.\d{1,40})?(?:[eE][+-]?\d{1,4})?", re.ASCII)


class UnitError(ValueError):
    """A value that is not a quantity of the expected kind; the message says what was expected.

    The unit parsers know nothing of key paths, so they raise this and the schema code turns it
    into an `InputError` that names the key.
    """


# ----------------------------------------------------------------------------------------
# Units: one small function per kind.


def _quantity(value: object, units: Mapping[str, int] | Sequence[str], expected: str
              ) -> tuple[Fraction, str]:
    """Split `value` into an exact number and a unit from `units`.

    Exact fractions, not floats, so that '6.68GB/s' and '77cycles' round once, at the end.
    """
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return Fraction(value), ""
    match = _QUANTITY.match(value) if isinstance(value, str) else None
    if match is None or match.group(2) not in units:
        raise UnitError(f"expected {expected}, got {value!r}")
    return Fraction(match.group(1)), match.group(2)


def parse_size(value: object) -> int:
    """Bytes from `8`, `'8B'`, `'64KiB'`, `'16GiB'` or `'1KB'` (SI: 1000 bytes).

    A bare number is bytes. Fractional sizes are accepted only when they come to whole bytes
    ('1.5KiB' is 1536), because buffers are allocated in bytes.
    """
    expected = "a size like '64KiB'"
    number, unit = _quantity(value, _SIZE_UNITS, expected)
    size = number * _SIZE_UNITS[unit]
    if size.denominator != 1:
        raise UnitError(f"expected {expected} (a whole number of bytes), got {value!r}")
    return _at_most(int(size), "bytes", value)


def parse_frequency(value: object) -> int:
    """Hertz from `'350MHz'`, `'2.5GHz'` or `'1000Hz'`; must be positive.

    A unit is required: a bare `350` is almost certainly meant as MHz, and silently reading it
    as 350 Hz would make every cycle cost a million times too much.
    """
    expected = "a frequency like '350MHz'"
    if not isinstance(value, str):
        raise UnitError(f"expected {expected}, got {value!r}")
    number, unit = _quantity(value, _FREQUENCY_UNITS, expected)
    hertz = round(number * _FREQUENCY_UNITS[unit])
    if hertz <= 0:
        raise UnitError(f"expected a positive frequency like '350MHz', got {value!r}")
    return _at_most(hertz, "Hz", value)


def parse_time(value: object, clock_hz: int) -> int:
    """Integer picoseconds from `'20us'`, `'5ns'`, `'1ms'`, `'100ps'`, `0` or `'77cycles'`.

    Cycles are cycles of the model's `[compute]` clock (`clock_hz`): the DMA latency of a
    DPU is published in its own cycles, and converting here keeps the file close to the source.
    A bare number must be zero, since any other unitless time is ambiguous.
    """
    expected = "a time like '20us', '5ns' or '77cycles'"
    number, unit = _quantity(value, (*_TIME_UNITS_PS, *_CYCLE_UNITS, ""), expected)
    if unit == "":
        if number != 0:
            raise UnitError(f"expected {expected} (a bare number must be 0), got {value!r}")
        return 0
    if unit in _CYCLE_UNITS:
        return _at_most(round(number * _PS_PER_S / clock_hz), "ps", value)
    return _at_most(round(number * _TIME_UNITS_PS[unit]), "ps", value)


def parse_bandwidth(value: object, clock_hz: int) -> int:
    """Integer picoseconds per byte from `'6.68GB/s'`, `'700MB/s'` or `'2B/cycle'`.

    Per-cycle bandwidths use the `[compute]` clock. The result is at least 1 so that moving
    bytes is never free in the integer cost model (a zero would let the solver ignore traffic).
    """
    expected = "a bandwidth like '6.68GB/s' or '2B/cycle'"
    if not isinstance(value, str) or value.count("/") != 1:
        raise UnitError(f"expected {expected}, got {value!r}")
    amount, per = (part.strip() for part in value.split("/"))
    try:
        number, unit = _quantity(amount, _SIZE_UNITS, expected)
    except UnitError:
        raise UnitError(f"expected {expected}, got {value!r}") from None
    bytes_per = number * _SIZE_UNITS[unit]
    if per == "s":
        bytes_per_s = bytes_per
    elif per in _CYCLE_UNITS:
        bytes_per_s = bytes_per * clock_hz
    else:
        raise UnitError(f"expected {expected}, got {value!r}")
    if bytes_per_s <= 0:
        raise UnitError(f"expected a positive bandwidth like '6.68GB/s', got {value!r}")
    return _at_most(max(1, round(_PS_PER_S / bytes_per_s)), "ps per byte", value)


def _at_most(number: int, unit: str, value: object) -> int:
    """`number` (converted from `value`) when it is within `MAX_QUANTITY`."""
    if number > MAX_QUANTITY:
        raise UnitError(f"{value!r} is {number:.3g} {unit}, past the largest quantity synth "
                        f"models (2^53 {unit})")
    return number


def auto_count() -> int:
    """The number of CPUs of the running machine: what `count = "1..auto"` resolves to."""
    return os.cpu_count() or 1


def parse_count(value: object) -> tuple[int, int]:
    """`(min, max)` from a fixed count `4` (or `'4'`) or a range `'1..16'` / `'1..auto'`.

    `auto` is `os.cpu_count()`, so the `cpu` model's core count follows the machine it runs on.
    """
    expected = "a count like 4 or '1..16'"
    if isinstance(value, int) and not isinstance(value, bool):
        low = high = value
    elif isinstance(value, str) and COUNT.match(value):
        low = high = to_int(value)
    elif isinstance(value, str) and (match := _COUNT_RANGE.match(value)):
        low = to_int(match.group(1))
        high = auto_count() if match.group(2) == "auto" else to_int(match.group(2))
    else:
        raise UnitError(f"expected {expected}, got {value!r}")
    if low < 1:
        raise UnitError(f"a count must be at least 1, got {value!r}")
    if high > MAX_SIZE:
        raise UnitError(f"a count must be at most 2^31-1, got {value!r}")
    if low > high:
        auto = " ('auto' is this machine's CPU count)" if "auto" in str(value) else ""
        raise UnitError(f"the range's minimum {low} exceeds its maximum {high}{auto}, "
                        f"got {value!r}")
    return low, high


def _parse_sysfs_size(text: str) -> int:
    """Bytes from a sysfs cache size such as '32K' or '32768K' (binary multiples)."""
    text = text.strip()
    multiplier = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:].upper(), 1)
    digits = text[:-1] if multiplier > 1 else text
    return int(digits) * multiplier


# (flag, vector registers, bytes per vector register), widest first
_VECTOR_ISAS = (("avx512f", 32, 64), ("avx", 16, 32))
_BASELINE_ISA = (16, 16)  # x86-64's SSE2 (and a safe guess elsewhere): 16 x 16 bytes


def vector_isa(cpuinfo: Path | None = None) -> tuple[int, int]:
    """(vector registers, bytes per register) of the running machine's widest SIMD ISA, read
    from /proc/cpuinfo's flags: AVX-512 32 x 64 B, AVX/AVX2 16 x 32 B, else 16 x 16 B."""
    try:
        text = (CPUINFO if cpuinfo is None else cpuinfo).read_text()
    except OSError:
        return _BASELINE_ISA
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines()
                  if line.startswith("flags")), [])
    return next(((regs, width) for flag, regs, width in _VECTOR_ISAS if flag in flags),
                _BASELINE_ISA)


def auto_lanes() -> dict[str, int]:
    """`lanes = "auto"`: the SIMD lanes of the dtypes synth's C emitter vectorises (f32 and
    i32, 4 bytes each) at this machine's vector width; other dtypes run scalar (1)."""
    width = vector_isa()[1]
    return {"f32": width // 4, "i32": width // 4}


def detect_cache_size(kind: str, cache_dir: Path | None = None) -> int | None:
    """The size in bytes of this machine's `kind` cache ('L1d', 'L2' or 'L3'), or None.

    Read from Linux sysfs (`index*/{level,type,size}` of cpu0). None when it cannot be read
    (another OS, a container without /sys), so the caller falls back to the file's capacity:
    detection improves the model, it must never make loading fail.
    """
    return _detect_cache(kind, "size", _parse_sysfs_size, cache_dir)


def detect_cache_ways(kind: str, cache_dir: Path | None = None) -> int | None:
    """The associativity of this machine's `kind` cache (sysfs `ways_of_associativity`), or
    None when it cannot be read (or is 0: fully associative or unknown)."""
    return _detect_cache(kind, "ways_of_associativity", lambda t: int(t) or None, cache_dir)


def _detect_cache(kind: str, field: str, parse: Callable[[str], int | None],
                  cache_dir: Path | None) -> int | None:
    level, types = DETECT_KINDS[kind]
    root = CACHE_DIR if cache_dir is None else cache_dir
    try:
        for index in sorted(root.glob("index*")):
            if (int((index / "level").read_text()) == level
                    and (index / "type").read_text().strip() in types):
                return parse((index / field).read_text().strip())
    except (OSError, ValueError):
        return None
    return None
