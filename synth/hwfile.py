"""Read hardware models from TOML files into `synth.hardware.Hardware`.

A model is a built-in name (a file `synth/hardware/<name>.toml` shipped in the package) or a
path to a TOML file. The format is documented key by key in docs/hardware.md. Reading is
three steps, each a plain function of plain data:

1. parse the TOML text into a tree of dicts and lists;
2. apply `--hw-set KEY=VALUE` overrides to that tree, so an overridden value goes through
   exactly the same validation as one written in the file;
3. validate the tree and convert it: units become integers (bytes, hertz, picoseconds,
   picoseconds per byte; the unit parsers and the machine detection are in `synth.hwunits`)
   so the solver and the Python cost model compute identical numbers.

Every error is an `InputError` whose message names the model and the key path, e.g.
``hardware upmem: memory 'wram': capacity: expected a size like '64KiB', got '64 furlongs'``,
so a user can find the line to fix without reading this module.
"""

from __future__ import annotations

import copy
import difflib
import re
import tomllib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

from synth.errors import InputError
from synth.hardware import (
    OP_CLASSES,
    Compute,
    Hardware,
    Intrinsic,
    Level,
    Memory,
    Push,
    PushDirection,
    TransferRules,
)
from synth.hwunits import (
    COUNT,
    DETECT_KINDS,
    NUMBER,
    UnitError,
    auto_lanes,
    detect_cache_size,
    detect_cache_ways,
    parse_bandwidth,
    parse_count,
    parse_frequency,
    parse_size,
    parse_time,
    vector_isa,
)
from synth.limits import MAX_QUANTITY, MAX_SIZE, to_int
from synth.tiles import parse_tiling
from synth.workload import DType

# Names and symbols become parts of variable names and of C and MLIR identifiers.
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*", re.ASCII)
RESERVED_SYMBOLS = ("fuse", "combine", "buffers", "pack", "ext", "online", "user", "sub",
                    "share")
"""Prefixes of the names the encoding gives its own variables (`fuse.K`, `combine.K.LEVEL`,
`buffers.K.MEMORY`, `pack.K`, `ext.K.DIM`, `share.K.TENSOR`; `online` is kept for
online-normalisation decisions, `user` names the user's constraint groups): a level or
memory symbol, which prefixes variables too (`T.K.DIM`), may not be one of them
(tests/test_hwfile.py checks that every prefix the encoding uses is listed here)."""

# The keys of each table of the format. Kept here, next to the code that reads them, so an
# unknown key can be reported with the closest valid one.
_TOP_KEYS = ("name", "description", "launch", "launch_per_unit", "streams", "level", "memory",
             "compute", "host")
_TOP_REQUIRED = ("name", "launch", "level", "memory", "compute", "host")
_LEVEL_KEYS = ("name", "symbol", "count", "issue_share", "barrier", "fork", "barrier_per_unit")
# what --hw-set may change on a level
_LEVEL_FIELDS = ("symbol", "count", "issue_share", "barrier", "fork", "barrier_per_unit")
_MEMORY_KEYS = ("name", "level", "instance_level", "capacity", "reserved", "symbol", "latency",
                "bandwidth", "shared_by", "transfer", "detect", "overlap", "cache",
                "warm", "store_bandwidth", "write_latency", "blocking", "issue", "push",
                "exposed", "ways", "aliased_read", "aliased_write", "run_latency", "keeps")
_MEMORY_FIELDS = tuple(k for k in _MEMORY_KEYS if k not in ("name", "transfer", "push"))
# about the parent: not on the root memory
_PARENT_KEYS = ("latency", "bandwidth", "transfer", "store_bandwidth", "write_latency",
                "blocking", "issue", "push", "exposed", "aliased_read", "aliased_write",
                "run_latency")
_PUSH_KEYS = ("level", "cap", "in", "out")
_PUSH_DIRECTION_KEYS = ("one", "full", "latency", "per_unit")
_LAUNCH_PER_UNIT_KEYS = ("level", "time")
_TRANSFER_KEYS = ("min", "max", "multiple", "align")
_COMPUTE_KEYS = ("clock", "cycles", "lanes", "intrinsic", "tile", "dst", "vector_tiles",
                 "accumulate_latency", "add_latency", "accumulate_window", "fused_multiply_add",
                 "divider_lanes", "shuffle_cycles", "gather_cycles", "grouped_gather_cycles",
                 "broadcast_cycles")
_INTRINSIC_KEYS = ("shape", "cycles", "pack")
_COMPUTE_REQUIRED = ("clock", "cycles")
_DTYPES = tuple(d.value for d in DType)

Scalar = int | float | str
_T = TypeVar("_T")


# ----------------------------------------------------------------------------------------
# Locating and reading files.


def _builtin_dir() -> Any:
    """The package directory of built-in models (a Traversable; works from wheels too)."""
    return resources.files("synth") / "hardware"


def list_builtin_hardware() -> list[str]:
    """Names of the built-in hardware models, sorted."""
    return sorted(entry.name[: -len(".toml")] for entry in _builtin_dir().iterdir()
                  if entry.name.endswith(".toml"))


def read_model(ref: str) -> tuple[str, str, str]:
    """`(text, label, source)` for a built-in name or a file path.

    Built-in names win over same-named files in the working directory, so `--hw upmem` means
    the same model everywhere.
    """
    builtins = list_builtin_hardware()
    if ref in builtins:
        resource = _builtin_dir() / f"{ref}.toml"
        return resource.read_text(encoding="utf-8"), ref, str(resource)
    path = Path(ref)
    if not path.is_file():
        raise InputError(f"unknown hardware {ref!r}: not a built-in model "
                         f"({', '.join(builtins)}) and not a file")
    try:
        return path.read_text(encoding="utf-8"), ref, str(path)
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"hardware {ref}: cannot read the file: {exc}") from exc


# ----------------------------------------------------------------------------------------
# Error context.


@dataclass(frozen=True)
class _Where:
    """The key path being validated, so every error message can name it."""

    label: str
    path: tuple[str, ...] = ()

    def at(self, *parts: str) -> _Where:
        return _Where(self.label, self.path + parts)

    def error(self, message: str) -> InputError:
        return InputError(": ".join((f"hardware {self.label}", *self.path, message)))


def _suggest(word: str, choices: Iterable[str], count: int = 1) -> str:
    """' (did you mean ...?)' for the closest choices, or a list of all of them."""
    choices = list(choices)
    close = difflib.get_close_matches(word, choices, n=count, cutoff=0.6)
    if close:
        return f" (did you mean {' or '.join(repr(c) for c in close)}?)"
    return f" (expected one of: {', '.join(choices)})"


def _check_keys(table: Mapping[str, Any], allowed: Sequence[str], required: Sequence[str],
                where: _Where) -> None:
    """Reject unknown keys (with the closest valid one) and missing required keys.

    Unknown keys are errors rather than ignored because a misspelt key would otherwise
    silently fall back to a default and produce a plausible but wrong model.
    """
    for key in table:
        if key not in allowed:
            raise where.error(f"unknown key {key!r}{_suggest(key, allowed)}")
    for key in required:
        if key not in table:
            raise where.error(f"missing required key {key!r}")


def _table(value: object, where: _Where) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise where.error(f"expected a table, got {value!r}")
    return value


def _tables(value: object, where: _Where, what: str) -> list[dict[str, Any]]:
    """A non-empty array of tables (`[[level]]`, `[[memory]]`)."""
    if not isinstance(value, list) or not value:
        raise where.error(f"expected one or more [[{what}]] tables")
    for item in value:
        _table(item, where)
    return value


def _string(value: object, where: _Where) -> str:
    if not isinstance(value, str) or not value:
        raise where.error(f"expected a non-empty string, got {value!r}")
    return value


def _integer(value: object, where: _Where, minimum: int, maximum: int = MAX_SIZE) -> int:
    if (isinstance(value, bool) or not isinstance(value, int)
            or not minimum <= value <= maximum):
        raise where.error(f"expected an integer in {minimum}..{maximum}, got {value!r}")
    return value


def _cycles(value: object, where: _Where) -> float:
    """A number of cycles: finite, >= 0 and at most `MAX_QUANTITY`."""
    if (isinstance(value, bool) or not isinstance(value, int | float)
            or not 0 <= value <= MAX_QUANTITY):  # also rejects NaN and infinities
        raise where.error(f"expected a number of cycles in 0..2^53, got {value!r}")
    return float(value)


def _unit(parse: Callable[[object], _T], value: object, where: _Where) -> _T:
    """Run a unit parser, turning its `UnitError` into an error that names the key."""
    try:
        return parse(value)
    except UnitError as exc:
        raise where.error(str(exc)) from None


def _entry_where(where: _Where, kind: str, entry: Mapping[str, Any], index: int) -> _Where:
    """`level 'rank'`, or `level #2` when the entry has no usable name."""
    name = entry.get("name")
    return where.at(f"{kind} {name!r}" if isinstance(name, str) else f"{kind} #{index + 1}")


# ----------------------------------------------------------------------------------------
# Overrides (`--hw-set KEY=VALUE`).


def parse_override(text: str) -> tuple[str, Scalar]:
    """Split `KEY=VALUE` and read VALUE as a TOML-ish scalar.

    Integers stay ints and decimals become floats (cycle costs); anything else is a string,
    with optional surrounding quotes removed, whose units are parsed during validation.
    """
    key, sep, raw = text.partition("=")
    key, raw = key.strip(), raw.strip()
    if not sep or not key or not raw:
        raise InputError(f"--hw-set expects KEY=VALUE (e.g. wram.capacity=32KiB), got {text!r}")
    if raw in ("true", "false"):  # a flag (compute.vector_tiles=false)
        return key, raw == "true"
    if re.fullmatch(r"[+-]?\d+", raw, re.ASCII):
        return key, to_int(raw)
    if re.fullmatch(r"[+-]?(\d+\.\d*|\.\d+)([eE][+-]?\d+)?", raw, re.ASCII):
        return key, float(raw)
    if len(raw) >= 2 and raw[0] == raw[-1] and raw[0] in "\"'":
        return key, raw[1:-1]
    return key, raw


def _named_entries(tree: Mapping[str, Any], kind: str) -> list[tuple[int, str]]:
    """`(index, name)` of the well-formed entries of `[[kind]]`; the rest fail validation."""
    entries = tree.get(kind)
    if not isinstance(entries, list):
        return []
    return [(i, e["name"]) for i, e in enumerate(entries)
            if isinstance(e, dict) and isinstance(e.get("name"), str)]


def override_keys(ref: str) -> list[str]:
    """The keys `--hw-set` accepts for the hardware model `ref` (built-in name or path);
    empty when the file is not valid TOML (loading it reports why)."""
    text, _, _ = read_model(ref)
    try:
        tree = tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        return []
    return list(_override_keys(tree))


def _override_keys(tree: Mapping[str, Any]) -> dict[str, list[tuple[str | int, ...]]]:
    """Every key `--hw-set` accepts for this model, mapped to its path(s) in the TOML tree.

    Built from the format, not from the keys the file happens to use, so optional keys
    (`mram.transfer.max`, `l2.detect`) can be set too. The root level has no count or symbol
    and so offers no keys. A list of paths because a level and a memory may share a name.
    """
    keys: dict[str, list[tuple[str | int, ...]]] = {}

    def add(key: str, path: tuple[str | int, ...]) -> None:
        keys.setdefault(key, []).append(path)

    add("launch", ("launch",))
    add("host.launch", ("launch",))  # starting kernels is the host's job
    for field in _LAUNCH_PER_UNIT_KEYS:
        add(f"launch_per_unit.{field}", ("launch_per_unit", field))
    for table in ("compute", "host"):
        add(f"{table}.clock", (table, "clock"))
        for dtype in _DTYPES:
            for op in OP_CLASSES:
                add(f"{table}.cycles.{dtype}.{op}", (table, "cycles", dtype, op))
            add(f"{table}.lanes.{dtype}", (table, "lanes", dtype))
            add(f"{table}.accumulate_latency.{dtype}", (table, "accumulate_latency", dtype))
            add(f"{table}.add_latency.{dtype}", (table, "add_latency", dtype))
            add(f"{table}.divider_lanes.{dtype}", (table, "divider_lanes", dtype))
            add(f"{table}.shuffle_cycles.{dtype}", (table, "shuffle_cycles", dtype))
            add(f"{table}.gather_cycles.{dtype}", (table, "gather_cycles", dtype))
            add(f"{table}.grouped_gather_cycles.{dtype}",
                (table, "grouped_gather_cycles", dtype))
            add(f"{table}.broadcast_cycles.{dtype}", (table, "broadcast_cycles", dtype))
        for flag in ("vector_tiles", "fused_multiply_add", "accumulate_window"):
            add(f"{table}.{flag}", (table, flag))
    add("compute.dst.sync", ("compute", "dst", "sync"))  # tiles.SYNC_MODES
    for index, name in _named_entries(tree, "level"):
        if index == 0:
            continue  # the root level has one unit: no count or symbol to change
        for field in _LEVEL_FIELDS:
            add(f"{name}.{field}", ("level", index, field))
    for index, name in _named_entries(tree, "memory"):
        for field in _MEMORY_FIELDS:
            add(f"{name}.{field}", ("memory", index, field))
        for field in _TRANSFER_KEYS:
            add(f"{name}.transfer.{field}", ("memory", index, "transfer", field))
        for field in ("level", "cap"):
            add(f"{name}.push.{field}", ("memory", index, "push", field))
        for direction in ("in", "out"):
            for field in _PUSH_DIRECTION_KEYS:
                add(f"{name}.push.{direction}.{field}",
                    ("memory", index, "push", direction, field))
    return keys


def _override_help(tree: Mapping[str, Any]) -> str:
    """The shape of valid `--hw-set` keys for this model, for when no key is close."""
    levels = ", ".join(name for index, name in _named_entries(tree, "level") if index)
    memories = ", ".join(name for _, name in _named_entries(tree, "memory"))
    memory_fields = "|".join((*_MEMORY_FIELDS, *(f"transfer.{f}" for f in _TRANSFER_KEYS)))
    return (f"keys are NAME.FIELD: a level ({levels}) with {'|'.join(_LEVEL_FIELDS)}; "
            f"a memory ({memories}) with {memory_fields}; compute or host with "
            "clock|cycles.DTYPE.OP|lanes.DTYPE; or launch")


def _unknown_override(key: str, keys: Iterable[str], tree: Mapping[str, Any],
                      where: _Where) -> InputError:
    close = difflib.get_close_matches(key, sorted(keys), n=3, cutoff=0.6)
    hint = f"closest valid keys: {', '.join(close)}" if close else _override_help(tree)
    return where.error(f"--hw-set: unknown key {key!r} ({hint})")


def _set_path(tree: dict[str, Any], path: tuple[str | int, ...], value: Scalar,
              where: _Where, key: str) -> None:
    """Store `value` at `path`, creating missing tables (e.g. a `transfer` the file omits)."""
    node: Any = tree
    for step in path[:-1]:
        if isinstance(step, int):
            node = node[step]
            continue
        child = node.setdefault(step, {})
        if not isinstance(child, dict | list):  # a list: `[[memory]]`, indexed next
            raise where.error(f"--hw-set {key}: {step!r} is not a table in this file")
        node = child
    node[path[-1]] = value
    if path[0] == "memory" and path[-1] == "capacity":
        node.pop("detect", None)  # a capacity given on the command line beats detection
    if path[0] == "memory" and path[-1] == "ways" and isinstance(value, int):
        node[path[-1]] = str(value)  # so do ways (`_ways`: text is not detected)


def _apply_overrides(tree: dict[str, Any], overrides: Sequence[str], where: _Where) -> None:
    """Apply `--hw-set KEY=VALUE` strings to a parsed TOML tree, in order, in place."""
    keys = _override_keys(tree)
    for text in overrides:
        key, value = parse_override(text)
        paths = keys.get(key)
        if paths is None:
            raise _unknown_override(key, keys, tree, where)
        if len(paths) > 1:
            raise where.error(f"--hw-set: key {key!r} is ambiguous: a level and a memory "
                              f"share the name {key.split('.')[0]!r}")
        if paths[0][1:2] == ("cycles",) and isinstance(value, str) and NUMBER.fullmatch(value):
            value = float(value)  # `1e15` cycles: a number (sizes keep `1e3` as text)
        _set_path(tree, paths[0], value, where, key)


# ----------------------------------------------------------------------------------------
# Validation and conversion.


def _cycles_table(value: object, where: _Where) -> dict[str, float]:
    """One dtype's op-class -> cycles table; every class of `OP_CLASSES` is required."""
    table = _table(value, where)
    for key in table:
        if key not in OP_CLASSES:
            raise where.error(f"unknown op class {key!r}{_suggest(key, OP_CLASSES)}")
    for op in OP_CLASSES:
        if op not in table:
            raise where.error(f"missing op class {op!r} (every class in hardware.OP_CLASSES "
                              f"is required: {', '.join(OP_CLASSES)})")
    return {op: _cycles(table[op], where.at(op)) for op in OP_CLASSES}


def _compute(value: object, where: _Where) -> Compute:
    """A `[compute]` or `[host]` table: a clock and per-dtype cycle tables.

    Not every dtype must be priced (a model may not support one); `Compute.point_ps` reports
    a missing dtype when a workload needs it. Unknown dtype names are errors.
    """
    table = _table(value, where)
    _check_keys(table, _COMPUTE_KEYS, _COMPUTE_REQUIRED, where)
    clock_hz = _unit(parse_frequency, table["clock"], where.at("clock"))
    by_dtype = _table(table["cycles"], where.at("cycles"))
    if not by_dtype:
        raise where.at("cycles").error(f"expected at least one dtype table "
                                       f"({', '.join(_DTYPES)})")
    cycles: dict[str, dict[str, float]] = {}
    for dtype, ops in by_dtype.items():
        if dtype not in _DTYPES:
            raise where.at("cycles").error(f"unknown dtype {dtype!r}{_suggest(dtype, _DTYPES)}")
        cycles[dtype] = _cycles_table(ops, where.at("cycles", dtype))
    return Compute(clock_hz=clock_hz, cycles=cycles,
                   lanes=_lanes(table.get("lanes", {}), where.at("lanes")),
                   vector_tiles=_flag(table.get("vector_tiles", False),
                                      where.at("vector_tiles")),
                   fused_multiply_add=_flag(table.get("fused_multiply_add", False),
                                            where.at("fused_multiply_add")),
                   accumulate_latency=_latencies(table.get("accumulate_latency", {}),
                                                 where.at("accumulate_latency")),
                   add_latency=_latencies(table.get("add_latency", {}), where.at("add_latency")),
                   accumulate_window=_integer(table.get("accumulate_window", 0),
                                              where.at("accumulate_window"), 0),
                   divider_lanes=_divider_lanes(table.get("divider_lanes", {}),
                                                where.at("divider_lanes")),
                   shuffle_cycles=_latencies(table.get("shuffle_cycles", {}),
                                             where.at("shuffle_cycles")),
                   gather_cycles=_latencies(table.get("gather_cycles", {}),
                                            where.at("gather_cycles")),
                   grouped_gather_cycles=_latencies(table.get("grouped_gather_cycles", {}),
                                                    where.at("grouped_gather_cycles")),
                   broadcast_cycles=_latencies(table.get("broadcast_cycles", {}),
                                               where.at("broadcast_cycles")),
                   intrinsics=_intrinsics(table.get("intrinsic", {}), where.at("intrinsic")),
                   tiling=parse_tiling(table, _DTYPES, where))


def _intrinsics(value: object, where: _Where) -> dict[str, Intrinsic]:
    """`intrinsic = { i8 = { shape = "4x8x8", cycles = 1, pack = 0.25 } }`: per dtype, the
    matrix instruction's m x n x k block, cycles per instruction, and cycles per element
    to lay an operand tile out in blocks."""
    out: dict[str, Intrinsic] = {}
    for dtype, entry in _table(value, where).items():
        at = where.at(dtype)
        if dtype not in _DTYPES:
            raise where.error(f"unknown dtype {dtype!r}{_suggest(dtype, _DTYPES)}")
        table = _table(entry, at)
        _check_keys(table, _INTRINSIC_KEYS, _INTRINSIC_KEYS, at)
        shape = table["shape"]
        parts = shape.split("x") if isinstance(shape, str) else []
        if len(parts) != 3 or not all(COUNT.match(p) and 0 < to_int(p) <= MAX_SIZE
                                      for p in parts):
            raise at.at("shape").error(f'expected "MxNxK" with integers in 1..2^31-1 (digits '
                                       f'0-9), got {shape!r}')
        numbers = {key: _cycles(table[key], at.at(key)) for key in ("cycles", "pack")}
        m, n, k = (to_int(p) for p in parts)
        out[dtype] = Intrinsic(m, n, k, numbers["cycles"], numbers["pack"])
    return out


def _flag(value: object, where: _Where) -> bool:
    if not isinstance(value, bool):
        raise where.error(f"expected true or false, got {value!r}")
    return value


def _latencies(value: object, where: _Where) -> dict[str, float]:
    """`accumulate_latency = { f32 = 4 }`: cycles before a vector accumulator can take its
    next update (the latency of a dependent FMA; `add_latency`: of an add, max or min),
    per dtype. `shuffle_cycles`, `gather_cycles`, `grouped_gather_cycles` and
    `broadcast_cycles` are read the same way."""
    out: dict[str, float] = {}
    for dtype, cycles in _table(value, where).items():
        if dtype not in _DTYPES:
            raise where.error(f"unknown dtype {dtype!r}{_suggest(dtype, _DTYPES)}")
        out[dtype] = _cycles(cycles, where.at(dtype))
    return out


def _divider_lanes(value: object, where: _Where) -> dict[str, int]:
    """`divider_lanes = { f32 = 4 }`: elements the divider (div, sqrt, rsqrt, recip)
    handles at once, per dtype (`Compute.divider_lanes`)."""
    out: dict[str, int] = {}
    for dtype, lanes in _table(value, where).items():
        if dtype not in _DTYPES:
            raise where.error(f"unknown dtype {dtype!r}{_suggest(dtype, _DTYPES)}")
        out[dtype] = _integer(lanes, where.at(dtype), 1)
    return out


def _lanes(value: object, where: _Where) -> dict[str, int]:
    """SIMD lanes per dtype: elements one vector instruction handles (default 1); "auto":
    this machine's (`auto_lanes`)."""
    if value == "auto":
        return auto_lanes()
    lanes: dict[str, int] = {}
    for dtype, count in _table(value, where).items():
        if dtype not in _DTYPES:
            raise where.error(f"unknown dtype {dtype!r}{_suggest(dtype, _DTYPES)}")
        lanes[dtype] = _integer(count, where.at(dtype), 1)
    return lanes


def _level(entry: dict[str, Any], is_root: bool, where: _Where, clock_hz: int) -> Level:
    """One `[[level]]`. The root (the first) has exactly one unit, so no symbol or count."""
    required = ("name",) if is_root else ("name", "symbol", "count")
    _check_keys(entry, _LEVEL_KEYS, required, where)
    name = _string(entry["name"], where.at("name"))
    if is_root:
        for key in _LEVEL_FIELDS:
            if key in entry:
                raise where.at(key).error("the root level (the first [[level]]) has exactly "
                                          f"one unit and takes no {key!r}")
        return Level(name=name, symbol=None, count_min=1, count_max=1)
    low, high = _unit(parse_count, entry["count"], where.at("count"))
    issue_share = _integer(entry.get("issue_share", 1), where.at("issue_share"), 1)
    barrier, per_unit = (_unit(lambda v: parse_time(v, clock_hz), entry.get(key, 0),
                               where.at(key)) for key in ("barrier", "barrier_per_unit"))
    fork = _unit(lambda v: parse_time(v, clock_hz), entry.get("fork", 0), where.at("fork"))
    return Level(name=name, symbol=_string(entry["symbol"], where.at("symbol")),
                 count_min=low, count_max=high, issue_share=issue_share, barrier_ps=barrier,
                 fork_ps=fork, barrier_per_unit_ps=per_unit)


def _levels(value: object, where: _Where, clock_hz: int) -> tuple[Level, ...]:
    entries = _tables(value, where.at("level"), "level")
    levels: list[Level] = []
    for index, entry in enumerate(entries):
        entry_where = _entry_where(where, "level", entry, index)
        level = _level(entry, index == 0, entry_where, clock_hz)
        if any(other.name == level.name for other in levels):
            raise entry_where.at("name").error(f"duplicate level name {level.name!r}")
        levels.append(level)
    return tuple(levels)


def _level_ref(value: object, names: Sequence[str], where: _Where) -> int:
    """The index of the level `value` names (outermost is 0)."""
    name = _string(value, where)
    if name not in names:
        raise where.error(f"unknown level {name!r}{_suggest(name, names)}")
    return names.index(name)


def _transfer(value: object, where: _Where) -> TransferRules:
    """`transfer = { min, max, multiple, align }`, sizes; defaults 1B / none / 1B / 1B."""
    table = _table(value, where)
    _check_keys(table, _TRANSFER_KEYS, (), where)
    sizes = {key: _unit(parse_size, table[key], where.at(key)) for key in table}
    for key in ("min", "multiple", "align"):
        if sizes.get(key, 1) < 1:
            raise where.at(key).error(f"must be at least 1 byte, got {table[key]!r}")
    align = sizes.get("align", 1)
    if align & (align - 1):
        # addresses are aligned to powers of two; tiles are placed at multiples of their
        # size, which meet any power-of-two alignment up to it (the encoding's rule)
        raise where.at("align").error(f"expected a power of two (1B, 2B, 4B, 8B, ...), "
                                      f"got {table['align']!r}")
    rules = TransferRules(min_bytes=sizes.get("min", 1), max_bytes=sizes.get("max"),
                          multiple=sizes.get("multiple", 1), align=sizes.get("align", 1))
    if rules.max_bytes is not None:
        if rules.max_bytes < rules.min_bytes:
            raise where.at("max").error(f"max ({rules.max_bytes} B) is below min "
                                        f"({rules.min_bytes} B)")
        if rules.max_bytes % rules.multiple:
            # Chunks of a split transfer are padded to `multiple`; they must still fit `max`.
            raise where.at("max").error(f"max ({rules.max_bytes} B) is not a multiple of "
                                        f"multiple ({rules.multiple} B)")
    return rules


def _capacity(entry: Mapping[str, Any], where: _Where) -> int:
    """The capacity in bytes: detected from this machine when `detect` is set and readable."""
    written = _unit(parse_size, entry["capacity"], where.at("capacity"))
    if "detect" not in entry:
        return written
    kind = entry["detect"]
    if kind == "registers":  # the vector register file: registers x bytes per register
        registers, width = vector_isa()
        return registers * width
    if kind not in DETECT_KINDS:
        raise where.at("detect").error(f"expected one of {', '.join(DETECT_KINDS)} or "
                                       f"registers, got {kind!r}")
    detected = detect_cache_size(kind)
    return written if detected is None else detected


def _memory(entry: dict[str, Any], is_root: bool, levels: Sequence[Level], clock_hz: int,
            where: _Where) -> Memory:
    """One `[[memory]]`: placement in the hierarchy, capacity, and the cost of filling it."""
    required: tuple[str, ...] = ("name", "level", "capacity", "symbol")
    if not is_root and "push" not in entry:  # pushes bring their own costs
        required += ("latency", "bandwidth")
    _check_keys(entry, _MEMORY_KEYS, required, where)
    if is_root:
        for key in _PARENT_KEYS:
            if key in entry:
                raise where.at(key).error("the root memory (the first [[memory]]) has no "
                                          f"parent memory to transfer from; remove {key!r}")
    names = [level.name for level in levels]
    level = _level_ref(entry["level"], names, where.at("level"))
    instance = _level_ref(entry.get("instance_level", names[level]), names,
                          where.at("instance_level"))
    if instance > level:
        raise where.at("instance_level").error(
            f"{names[instance]!r} is inside the memory's level {names[level]!r}; an instance "
            "must be shared by the units of its level or more, so name that level or an outer one")
    shared_by = _level_ref(entry.get("shared_by", names[instance]), names, where.at("shared_by"))
    if shared_by > level:
        raise where.at("shared_by").error(
            f"{names[shared_by]!r} is inside the memory's level {names[level]!r}; name that "
            "level or an outer one")
    capacity = _capacity(entry, where)
    # Sizes are never negative. A reservation that leaves nothing usable (or less) is not
    # bad input: it is a what-if a user may ask (--hw-set wram.capacity=4), and the
    # capacity constraints then say, as an explained conflict, that no tile fits.
    reserved = _unit(parse_size, entry.get("reserved", 0), where.at("reserved"))
    return Memory(
        name=_string(entry["name"], where.at("name")),
        level=names[level],
        instance_level=names[instance],
        capacity=capacity,
        reserved=reserved,
        symbol=_string(entry["symbol"], where.at("symbol")),
        rules=_transfer(entry.get("transfer", {}), where.at("transfer")),
        latency_ps=0 if "latency" not in entry else _unit(
            lambda v: parse_time(v, clock_hz), entry["latency"], where.at("latency")),
        ps_per_byte=0 if "bandwidth" not in entry else _unit(
            lambda v: parse_bandwidth(v, clock_hz), entry["bandwidth"], where.at("bandwidth")),
        shared_by=names[shared_by],
        overlap=_flag(entry.get("overlap", False), where.at("overlap")),
        cache=_flag(entry.get("cache", False), where.at("cache")),
        warm=_flag(entry.get("warm", False), where.at("warm")),
        keeps=_flag(entry.get("keeps", False), where.at("keeps")),
        store_ps_per_byte=(_unit(lambda v: parse_bandwidth(v, clock_hz),
                                 entry["store_bandwidth"], where.at("store_bandwidth"))
                           if "store_bandwidth" in entry else 0),
        write_latency_ps=None if "write_latency" not in entry else _unit(
            lambda v: parse_time(v, clock_hz), entry["write_latency"], where.at("write_latency")),
        blocking=_boolean(entry.get("blocking", False), where.at("blocking")),
        issue_ps=_unit(lambda v: parse_time(v, clock_hz), entry.get("issue", 0), where.at("issue")),
        push=None if "push" not in entry else _push(entry["push"], names, level, clock_hz,
                                                    where.at("push")),
        exposed=_share(entry.get("exposed", 0), where.at("exposed")),
        ways=_ways(entry, where),
        aliased_read_ps=_unit(lambda v: parse_time(v, clock_hz), entry.get("aliased_read", 0),
                              where.at("aliased_read")),
        aliased_write_ps=_unit(lambda v: parse_time(v, clock_hz),
                               entry.get("aliased_write", 0), where.at("aliased_write")),
        run_latency_ps=_unit(lambda v: parse_time(v, clock_hz), entry.get("run_latency", 0),
                             where.at("run_latency")),
    )


def _ways(entry: Mapping[str, Any], where: _Where) -> int:
    """`ways`, the cache's associativity (0: not modelled): detected from this machine with
    the capacity where `detect` names a cache and sysfs says, else as written."""
    if "ways" not in entry:
        return 0
    value = entry["ways"]
    if isinstance(value, str) and COUNT.match(value):  # from --hw-set: beats detection
        return _integer(int(value), where.at("ways"), 0, 1 << 16)
    written = _integer(value, where.at("ways"), 0, 1 << 16)
    kind = entry.get("detect")
    detected = detect_cache_ways(kind) if kind in DETECT_KINDS else None
    return written if detected is None else detected


def _share(value: object, where: _Where) -> float:
    """A share in 0..1 (a number, or its text from --hw-set)."""
    if isinstance(value, str) and NUMBER.fullmatch(value):
        value = float(value)
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise where.error(f"expected a number in 0..1, got {value!r}")
    return float(value)


def _boolean(value: object, where: _Where) -> bool:
    if value in ("true", "false"):  # from --hw-set
        return value == "true"
    if not isinstance(value, bool):
        raise where.error(f"expected true or false, got {value!r}")
    return value


def _push(value: object, names: Sequence[str], level: int, clock_hz: int,
          where: _Where) -> Push:
    """`push = { level, cap, in = {...}, out = {...} }`: transfers from the root memory as
    parallel pushes, one per tensor per unit of `level` (see `hardware.Push`)."""
    table = _table(value, where)
    _check_keys(table, _PUSH_KEYS, ("level", "in", "out"), where)
    unit = _level_ref(table["level"], names, where.at("level"))
    if not 0 < unit <= level:
        raise where.at("level").error(
            f"expected a level below the root and at or outside the memory's level "
            f"{names[level]!r}, got {names[unit]!r}")
    cap = 0 if "cap" not in table else _unit(lambda v: parse_bandwidth(v, clock_hz),
                                             table["cap"], where.at("cap"))
    into, out = (_push_direction(table[key], clock_hz, where.at(key)) for key in ("in", "out"))
    return Push(level=names[unit], into=into, out=out, cap_ps_per_byte=cap)


def _push_direction(value: object, clock_hz: int, where: _Where) -> PushDirection:
    """`{ one, full, latency, per_unit }`: one instance's bandwidth, the group's (default:
    one's), a fixed cost per push and a cost per instance reached (default 0)."""
    table = _table(value, where)
    _check_keys(table, _PUSH_DIRECTION_KEYS, ("one",), where)
    rates = {key: _unit(lambda v: parse_bandwidth(v, clock_hz), table[key], where.at(key))
             for key in ("one", "full") if key in table}
    one, full = rates["one"], rates.get("full", rates["one"])
    if full > one:
        raise where.at("full").error(f"expected a bandwidth at least one's "
                                     f"({table['one']!r}): a group of instances is never "
                                     f"slower than one, got {table['full']!r}")
    times = {key: _unit(lambda v: parse_time(v, clock_hz), table.get(key, 0), where.at(key))
             for key in ("latency", "per_unit")}
    return PushDirection(one_ps_per_byte=one, full_ps_per_byte=full,
                         latency_ps=times["latency"], per_unit_ps=times["per_unit"])


def _memories(value: object, levels: Sequence[Level], clock_hz: int, where: _Where
              ) -> tuple[Memory, ...]:
    """All `[[memory]]` tables, outermost first; the first is at the root and holds tensors."""
    entries = _tables(value, where.at("memory"), "memory")
    memories: list[Memory] = []
    for index, entry in enumerate(entries):
        entry_where = _entry_where(where, "memory", entry, index)
        memory = _memory(entry, index == 0, levels, clock_hz, entry_where)
        if memory.push is not None and index != 1:
            raise entry_where.at("push").error("pushes move tiles from the root memory: "
                                               "only the memory after it takes 'push'")
        if any(other.name == memory.name for other in memories):
            raise entry_where.at("name").error(f"duplicate memory name {memory.name!r}")
        _check_memory_order(memory, memories, levels, entry_where)
        memories.append(memory)
    return tuple(memories)


def _check_memory_order(memory: Memory, outer: Sequence[Memory], levels: Sequence[Level],
                        where: _Where) -> None:
    """The first memory is at the root; the levels of later ones never move outwards.

    Each memory's parent is the one listed before it, so the list must read outermost first.
    """
    names = [level.name for level in levels]
    if not outer:
        if memory.level != names[0]:
            raise where.at("level").error(
                f"the first memory holds whole tensors and must be at the root level "
                f"{names[0]!r}, got {memory.level!r}")
        return
    previous = outer[-1]
    if names.index(memory.level) < names.index(previous.level):
        raise where.at("level").error(
            f"memories are listed outermost first, but level {memory.level!r} is outside "
            f"level {previous.level!r} of the previous memory {previous.name!r}")


def _check_symbols(levels: Sequence[Level], memories: Sequence[Memory], where: _Where) -> None:
    """Names and symbols become parts of variable names, loops and C/MLIR identifiers:
    ASCII identifiers; symbols also unique across the model and not one of the prefixes
    the encoding's own variables use (`RESERVED_SYMBOLS`)."""
    for kind, items in (("level", levels), ("memory", memories)):
        for item in items:
            if not _IDENTIFIER.fullmatch(item.name):
                raise where.at(f"{kind} {item.name!r}", "name").error(
                    f"{item.name!r} is not a name made of ASCII letters, digits and '_' "
                    "(not starting with a digit)")
    owners: dict[str, str] = {}
    named = [(f"level {lvl.name!r}", lvl.symbol) for lvl in levels if lvl.symbol is not None]
    named += [(f"memory {mem.name!r}", mem.symbol) for mem in memories]
    for owner, symbol in named:
        if not _IDENTIFIER.fullmatch(symbol):
            raise where.at(owner, "symbol").error(
                f"{symbol!r} is not a valid identifier (ASCII letters, digits and '_', not "
                "starting with a digit)")
        if symbol in RESERVED_SYMBOLS:
            raise where.at(owner, "symbol").error(
                f"{symbol!r} is reserved: the solver's own variables are named {symbol}.* "
                f"(reserved: {', '.join(RESERVED_SYMBOLS)})")
        if symbol in owners:
            raise where.at(owner, "symbol").error(
                f"{symbol!r} is already the symbol of {owners[symbol]}")
        owners[symbol] = owner


def _build_hardware(tree: Mapping[str, Any], where: _Where, source: str = "") -> Hardware:
    """Validate a parsed (and overridden) TOML tree and convert it to `Hardware`."""
    _check_keys(tree, _TOP_KEYS, _TOP_REQUIRED, where)
    name = _string(tree["name"], where.at("name"))
    if "description" in tree and not isinstance(tree["description"], str):
        raise where.at("description").error(f"expected a string, got {tree['description']!r}")
    compute = _compute(tree["compute"], where.at("compute"))
    levels = _levels(tree["level"], where, compute.clock_hz)
    memories = _memories(tree["memory"], levels, compute.clock_hz, where)
    _check_symbols(levels, memories, where)
    streams = _streams(tree.get("streams", False), memories, where.at("streams"))
    if streams and any(m.push is not None for m in memories):
        raise where.at("streams").error("pushes (a memory's `push`) run between launches; "
                                        "with streams = true nothing does")
    launch_level, per_unit = _launch_per_unit(tree.get("launch_per_unit"), levels,
                                              compute.clock_hz, where.at("launch_per_unit"))
    return Hardware(
        name=name,
        levels=levels,
        memories=memories,
        compute=compute,
        host=_compute(tree["host"], where.at("host")),
        launch_ps=_unit(lambda v: parse_time(v, compute.clock_hz), tree["launch"],
                        where.at("launch")),
        source=source,
        streams=streams,
        launch_per_unit_ps=per_unit,
        launch_level=launch_level,
    )


def _launch_per_unit(value: object, levels: Sequence[Level], clock_hz: int, where: _Where
                     ) -> tuple[str | None, int]:
    """`launch_per_unit = { level, time }`: a launch costs `time` more per unit of `level`
    it runs on (UPMEM: per DPU launched)."""
    if value is None:
        return None, 0
    table = _table(value, where)
    _check_keys(table, _LAUNCH_PER_UNIT_KEYS, _LAUNCH_PER_UNIT_KEYS, where)
    names = [level.name for level in levels]
    index = _level_ref(table["level"], names, where.at("level"))
    if index == 0:
        raise where.at("level").error("expected a level below the root (the root has one unit)")
    return names[index], _unit(lambda v: parse_time(v, clock_hz), table["time"], where.at("time"))


def _streams(value: object, memories: Sequence[Memory], where: _Where) -> bool:
    """`streams = true`: the units fetch their own tiles from the root memory within one
    launch (DMA engines that walk DDR themselves), so the root memory's loops run inside
    the spatial levels. Only when every other memory sits below the root level: a memory
    at the root level would have to be filled before the loops that fill it."""
    if not isinstance(value, bool):
        raise where.error(f"expected true or false, got {value!r}")
    at_root = [m.name for m in memories[1:] if m.level == memories[0].level]
    if value and at_root:
        raise where.error(f"expected every memory but the root below the root level, got "
                          f"{', '.join(at_root)} at level {memories[0].level}")
    return value


def load_hardware(ref: str, overrides: Sequence[str] = ()) -> Hardware:
    """Load a hardware model by built-in name or file path, with `--hw-set` overrides applied.

    Raises `InputError` (exit code 2) for an unknown model, unreadable or malformed TOML, an
    unknown override key, or any schema violation; the message names the offending key.
    """
    text, label, source = read_model(ref)
    where = _Where(label)
    tree = _parse_toml(text, where)
    try:
        return _build_hardware(_overridden(tree, overrides, where), where, source)
    except InputError as exc:
        if not overrides:
            raise
        raise _blame(tree, overrides, where, exc) from None


def _parse_toml(text: str, where: _Where) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise where.error(f"invalid TOML: {exc}") from None
    except ValueError as exc:  # an integer of more than 4,300 digits
        raise where.error(f"invalid TOML: {exc}") from None


def _overridden(tree: Mapping[str, Any], overrides: Sequence[str], where: _Where
                ) -> dict[str, Any]:
    """A copy of `tree` with `--hw-set` overrides applied (the parsed file is kept as read,
    so that an error can be traced to the file or to one override)."""
    patched = copy.deepcopy(dict(tree))
    _apply_overrides(patched, overrides, where)
    return patched


def _blame(tree: Mapping[str, Any], overrides: Sequence[str], where: _Where,
           exc: InputError) -> InputError:
    """The error of a model with overrides, naming the `--hw-set KEY=VALUE` that caused it:
    the first one whose addition breaks a model that was valid before it; an error of the
    file itself stays the file's."""
    if str(exc).startswith(f"hardware {where.label}: --hw-set"):
        return exc  # already names the override (an unknown or ambiguous key)
    for count in range(len(overrides) + 1):
        try:
            _build_hardware(_overridden(tree, overrides[:count], where), where)
        except InputError as first:
            if count == 0:
                return first
            return InputError(f"--hw-set {overrides[count - 1].strip()}: {first}")
    return exc
