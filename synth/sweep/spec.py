"""The axes of a sweep, read from a TOML spec file or from flags (docs/sweep.md).

A `Spec` is what the user asked, checked for its shape only: every key known, every value
of the right type, sizes positive integers, ranges well formed. Whether a workload
declares a size, a model accepts an override or a variant's constraint names real
variables is checked when the axes are expanded into points (`synth.sweep.points`),
where the workloads and models are loaded. Every error names the key (`sweep.toml:
sizes.N`) or the flag (`--set N=0`) and the reason (exit 2).

Values of sizes are integers, lists, or strings of comma-separated items, each an
integer or a range: `LO..HI` (every integer), `LO..HI:STEP` (LO, LO+STEP, ... up to HI)
or `LO..HI:xF` (LO, LO*F, LO*F*F, ... up to HI).
"""

from __future__ import annotations

import math
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from synth.constraints import user
from synth.errors import InputError
from synth.limits import MAX_SIZE, check_int, parse_int

MAX_POINTS = 100_000
"""The most points a sweep may have. A typo guard, not a capacity: a range such as
`1..1000000` (step 1 where `:x2` was meant) would otherwise enumerate a million points
before the first one runs; at the 0.1-1 s a small point takes (benchmarks/RESULTS.md),
100,000 points are already a day of one core."""

DEFAULT_TIME_LIMIT_S = 30.0  # as synth solve and synth tune
DEFAULT_VARIANT = "base"  # the one variant of a sweep that names none: the request as is

_RANGE = re.compile(r"^(?P<lo>[0-9]+)\.\.(?P<hi>[0-9]+)(?::(?P<times>x?)(?P<step>[0-9]+))?$")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class Axis:
    """One swept key and its values; `where` names it in errors (`--set N=...`,
    `sweep.toml: sizes.N`)."""

    name: str
    values: tuple[Any, ...]  # ints for sizes, strings for hardware overrides
    where: str


@dataclass(frozen=True)
class SizeGrid:
    """A workload's own sizes: the product of `axes`, or the explicit `points`."""

    where: str
    axes: tuple[Axis, ...] = ()
    points: tuple[tuple[tuple[str, int], ...], ...] | None = None

    def names(self) -> list[str]:
        if self.points is not None:
            return sorted({name for point in self.points for name, _ in point})
        return [axis.name for axis in self.axes]


@dataclass(frozen=True)
class WorkloadEntry:
    ref: str  # a built-in name or a .syn path
    where: str
    sizes: SizeGrid | None = None  # its own grid, over the sweep's [sizes] for its names


@dataclass(frozen=True)
class HardwareEntry:
    ref: str  # a built-in name or a .toml path
    where: str
    label: str | None = None  # how rows and plots name it (default: the model's name)
    hw_set: tuple[Axis, ...] = ()  # its own overrides, over the sweep's [hw_set]


@dataclass(frozen=True)
class VariantSpec:
    """A named set of constraints, fixes and drops (the groups of `synth solve`'s
    --constraint, --fix, --drop), optionally for some workloads or models only."""

    name: str
    where: str
    constraints: tuple[str, ...] = ()
    fixes: tuple[str, ...] = ()
    drops: tuple[str, ...] = ()
    workloads: tuple[str, ...] | None = None  # labels or refs; None: every workload
    hardware: tuple[str, ...] | None = None

    @property
    def settings(self) -> tuple[str, ...]:
        return (*self.constraints, *self.fixes, *self.drops)


@dataclass(frozen=True)
class Spec:
    workloads: tuple[WorkloadEntry, ...]
    hardware: tuple[HardwareEntry, ...]
    sizes: tuple[Axis, ...] = ()  # for every workload that declares the size
    hw_set: tuple[Axis, ...] = ()  # for every model that accepts the key
    variants: tuple[VariantSpec, ...] = (VariantSpec(DEFAULT_VARIANT, "every point"),)
    solvers: tuple[str, ...] = ("cpsat",)
    time_limit_s: float = DEFAULT_TIME_LIMIT_S
    validate: bool = False
    binding: bool = False
    emit: str | None = None
    baseline: tuple[str, str] | None = None  # (value, where)
    source: str = "flags"  # the spec file, or "flags"


# ---------------------------------------------------------------- values


def _range(text: str, where: str) -> list[int]:
    """`LO..HI`, `LO..HI:STEP` or `LO..HI:xF` as its values."""
    match = _RANGE.match(text)
    if match is None:
        raise InputError(f"{where}: {text!r} is not an integer or a range LO..HI, "
                         f"LO..HI:STEP or LO..HI:xFACTOR (e.g. 1024..65536:x2)")
    lo = parse_int(match["lo"], where, 1, MAX_SIZE)
    hi = parse_int(match["hi"], where, 1, MAX_SIZE)
    step = parse_int(match["step"] or "1", where, 1, MAX_SIZE)
    if lo > hi:
        raise InputError(f"{where}: {text!r} is an empty range (LO {lo} > HI {hi})")
    if match["times"]:
        if step < 2:
            raise InputError(f"{where}: {text!r}: the factor of a range LO..HI:xF must be "
                             f"at least 2")
        count = math.floor(math.log(hi / lo, step) + 1e-9) + 1
    else:
        count = (hi - lo) // step + 1
    if count > MAX_POINTS:
        raise InputError(f"{where}: {text!r} has {count:,} values, more than a sweep may "
                         f"have ({MAX_POINTS:,} points); use a larger step or :xF")
    if match["times"]:
        return [lo * step**k for k in range(count)]
    return list(range(lo, hi + 1, step))


def size_values(value: object, where: str) -> tuple[int, ...]:
    """A size's values: an integer, a string of comma-separated integers and ranges, or a
    list of either; duplicates dropped, order kept."""
    items = value if isinstance(value, list) else [value]
    if not items:
        raise InputError(f"{where}: expected at least one size")
    values: list[int] = []
    for item in items:
        if isinstance(item, bool) or not isinstance(item, int | str):
            raise InputError(f"{where}: expected a positive integer, a range such as "
                             f"\"1024..65536:x2\" or a list of them, got {item!r}")
        if isinstance(item, int):
            values.append(check_int(item, where, 1, MAX_SIZE))
            continue
        for part in item.split(","):
            part = part.strip()
            values.extend(_range(part, where) if ".." in part
                          else [parse_int(part, where, 1, MAX_SIZE)])
    return tuple(dict.fromkeys(values))


def text_values(value: object, where: str, what: str) -> tuple[str, ...]:
    """Values given as a string (comma-separated), a number, or a list of them."""
    items = value if isinstance(value, list) else [value]
    texts: list[str] = []
    for item in items:
        if isinstance(item, bool) or not isinstance(item, str | int | float):
            raise InputError(f"{where}: expected {what} as a string or a list of strings, "
                             f"got {item!r}")
        texts.extend(part.strip() for part in str(item).split(","))
    if not texts or not all(texts):
        raise InputError(f"{where}: expected non-empty {what}")
    return tuple(dict.fromkeys(texts))


def split_setting(text: str, where: str) -> tuple[str, str]:
    """`NAME=V1,V2` -> (NAME, "V1,V2")."""
    name, sep, values = (part.strip() for part in text.partition("="))
    if not sep or not name or not values:
        raise InputError(f"{where}: expected NAME=V1,V2,... (e.g. --set N=4096,65536)")
    return name, values


# ---------------------------------------------------------------- variants


def parse_variant(text: str, where: str) -> VariantSpec:
    """`NAME: ITEM; ITEM; ...` where an ITEM is a constraint (`T <= 4`), `fix VAR=INT` or
    `drop GROUP`; `NAME:` alone is the request unchanged. `NAME@HW,HW: ...` applies the
    variant on those hardware models only (their labels or references), as a spec
    file's `hardware = [...]` in a `[[variant]]`."""
    head, sep, body = (part.strip() for part in text.partition(":"))
    name, at, models = (part.strip() for part in head.partition("@"))
    hardware = tuple(m.strip() for m in models.split(",")) if at else None
    if not sep or not _NAME.match(name) or (hardware is not None and not all(hardware)):
        raise InputError(f"{where}: expected NAME: ITEM; ITEM; ... with a NAME of letters, "
                         f"digits and _, optionally NAME@HW,HW: for some models only (e.g. "
                         f"--variant 'small@upmem: T <= 4; drop capacity.wram')")
    constraints, fixes, drops = [], [], []
    for item in (part.strip() for part in body.split(";")):
        word, _, rest = item.partition(" ")
        if not item:
            continue
        if word == "fix" and rest.strip():
            fixes.append(rest.strip())
        elif word == "drop" and rest.strip():
            drops.append(rest.strip())
        else:
            constraints.append(item)
    return VariantSpec(name, where, tuple(constraints), tuple(fixes), tuple(drops),
                       hardware=hardware)


def check_variant_names(variants: Sequence[VariantSpec]) -> None:
    seen: dict[str, str] = {}
    for variant in variants:
        if variant.name in seen:
            raise InputError(f"{variant.where}: variant {variant.name!r} is already defined "
                             f"by {seen[variant.name]}")
        seen[variant.name] = variant.where


# ---------------------------------------------------------------- flags


@dataclass(frozen=True)
class Flags:
    """`synth sweep`'s command line, as given (None: not given)."""

    out: str
    spec: str | None = None
    workloads: Sequence[str] = ()
    hardware: Sequence[str] = ()
    sizes: Sequence[str] = ()
    hw_set: Sequence[str] = ()
    variants: Sequence[str] = ()
    constraints: Sequence[str] = ()
    fixes: Sequence[str] = ()
    drops: Sequence[str] = ()
    solvers: Sequence[str] = ()
    time_limit: str | None = None
    validate: bool | None = None
    binding: bool | None = None
    emit: str | None = None
    baseline: str | None = None
    workers: str | None = None
    dask: str | None = None
    force: bool = False

    def axis_flags(self) -> list[str]:
        """The flags that describe the sweep (as a spec file does), as given."""
        given = {"--workload": self.workloads, "--hw": self.hardware, "--set": self.sizes,
                 "--hw-set": self.hw_set, "--variant": self.variants,
                 "--constraint": self.constraints, "--fix": self.fixes, "--drop": self.drops,
                 "--solver": self.solvers}
        flags = [flag for flag, values in given.items() if values]
        singles = {"--time-limit": self.time_limit, "--validate": self.validate,
                   "--binding": self.binding, "--emit": self.emit,
                   "--baseline": self.baseline}
        return flags + [flag for flag, value in singles.items() if value is not None]


def _listed(texts: Sequence[str], flag: str) -> list[tuple[str, str]]:
    """Each comma-separated value of a repeatable flag, with the flag as written."""
    return [(value, f"{flag} {text}") for text in texts
            for value in text_values(text, f"{flag} {text}", "values")]


def _time_limit(text: str | float, where: str | None = None) -> float:
    """`--time-limit` (`check_time_limit`), or a spec file's `time_limit` (`where`)."""
    from synth.cli import check_time_limit

    try:
        return check_time_limit(text)
    except InputError as exc:
        if where is None:
            raise
        raise InputError(f"{where}: {str(exc).partition(': ')[2]}") from None


def from_flags(flags: Flags) -> Spec:
    """The sweep the flags describe (no spec file)."""
    if not flags.workloads or not flags.hardware:
        missing = "--workload" if not flags.workloads else "--hw"
        raise InputError(f"synth sweep needs {missing} (repeatable, comma lists), or a "
                         f"spec file: synth sweep SPEC.toml --out DIR (docs/sweep.md)")
    sizes = []
    for text in flags.sizes:
        name, values = split_setting(text, f"--set {text}")
        sizes.append(Axis(name, size_values(values, f"--set {text}"), f"--set {text}"))
    hw_set = []
    for text in flags.hw_set:
        key, values = split_setting(text, f"--hw-set {text}")
        hw_set.append(Axis(key, text_values(values, f"--hw-set {text}", "values"),
                           f"--hw-set {text}"))
    base = (tuple(flags.constraints), tuple(flags.fixes), tuple(flags.drops))
    variants = [parse_variant(text, f"--variant {text}") for text in flags.variants] or [
        VariantSpec(DEFAULT_VARIANT, "every point")]
    return Spec(
        workloads=tuple(WorkloadEntry(ref, where)
                        for ref, where in _listed(flags.workloads, "--workload")),
        hardware=tuple(HardwareEntry(ref, where)
                       for ref, where in _listed(flags.hardware, "--hw")),
        sizes=_unique_axes(sizes), hw_set=_unique_axes(hw_set),
        variants=_with_base(variants, base),
        solvers=tuple(s for s, _ in _listed(flags.solvers, "--solver")) or ("cpsat",),
        time_limit_s=_time_limit(flags.time_limit or DEFAULT_TIME_LIMIT_S),
        validate=bool(flags.validate), binding=bool(flags.binding), emit=flags.emit,
        baseline=(flags.baseline, f"--baseline {flags.baseline}") if flags.baseline else None)


def _unique_axes(axes: Sequence[Axis]) -> tuple[Axis, ...]:
    seen: dict[str, Axis] = {}
    for axis in axes:
        if axis.name in seen:
            raise InputError(f"{axis.where}: {axis.name!r} is already swept by "
                             f"{seen[axis.name].where}")
        seen[axis.name] = axis
    return tuple(axes)


def _with_base(variants: Sequence[VariantSpec],
               base: tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]
               ) -> tuple[VariantSpec, ...]:
    """Every variant with the settings every point shares (`--constraint`, `--fix`,
    `--drop`; `constraints`, `fixes`, `drops` of a spec file) added."""
    check_variant_names(variants)
    constraints, fixes, drops = base
    return tuple(VariantSpec(v.name, v.where, constraints + v.constraints, fixes + v.fixes,
                             drops + v.drops, v.workloads, v.hardware) for v in variants)


# ---------------------------------------------------------------- spec files


TOP_KEYS = ("workloads", "hardware", "sizes", "hw_set", "variant", "solvers", "constraints",
            "fixes", "drops", "time_limit", "validate", "binding", "emit", "baseline")
WORKLOAD_KEYS = ("name", "sizes")
HARDWARE_KEYS = ("model", "label", "hw_set")
VARIANT_KEYS = ("name", "constraints", "fixes", "drops", "workloads", "hardware")


@dataclass
class _File:
    """A spec file being read: its path (for errors and relative paths) and its tree."""

    path: Path
    tree: dict[str, Any] = field(default_factory=dict)

    def where(self, key: str) -> str:
        return f"{self.path}: {key}"

    def ref(self, ref: str) -> str:
        """A workload or model path, relative to the spec file's directory when it names a
        file there (a built-in name, which has neither `/` nor `.`, is kept)."""
        relative = self.path.parent / ref
        if ("/" in ref or "." in ref) and relative.exists():
            return str(relative)
        return ref


def check_keys(table: Mapping[str, Any], allowed: Sequence[str], where: str) -> None:
    for key in table:
        if key not in allowed:
            near = user.closest(key, allowed, 1)
            hint = f"did you mean {near[0]!r}?" if near else "expected one of " + ", ".join(
                allowed)
            raise InputError(f"{where}{key}: unknown key; {hint}")


def _strings(value: object, where: str, what: str) -> tuple[str, ...]:
    items = value if isinstance(value, list) else [value]
    if not all(isinstance(item, str) and item.strip() for item in items):
        raise InputError(f"{where}: expected {what} as a string or a list of strings")
    return tuple(str(item).strip() for item in items)


def _string(value: object, where: str, what: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InputError(f"{where}: expected {what} as a string, got {value!r}")
    return value.strip()


def _bool(value: object, where: str) -> bool:
    if not isinstance(value, bool):
        raise InputError(f"{where}: expected true or false, got {value!r}")
    return value


def _table(value: object, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InputError(f"{where}: expected a table, got {value!r}")
    return value


def _size_axes(table: Mapping[str, Any], where: str) -> tuple[Axis, ...]:
    axes = []
    for name, value in table.items():
        if not _NAME.match(name):
            raise InputError(f"{where}.{name}: a size name is a letter or _ followed by "
                             f"letters, digits or _")
        axes.append(Axis(name, size_values(value, f"{where}.{name}"), f"{where}.{name}"))
    return tuple(axes)


def _hw_axes(table: Mapping[str, Any], where: str) -> tuple[Axis, ...]:
    """Override axes; a dotted key may be quoted (`"wram.capacity" = ...`) or written as
    nested tables (`wram.capacity = ...`, which TOML reads as `{wram: {capacity: ...}}`)."""
    axes: list[Axis] = []
    for key, value in table.items():
        if isinstance(value, dict):
            axes.extend(Axis(f"{key}.{a.name}", a.values, a.where)
                        for a in _hw_axes(value, f"{where}.{key}"))
        else:
            axes.append(Axis(key, text_values(value, f"{where}.{key}", "values"),
                             f"{where}.{key}"))
    return tuple(axes)


def _entry(item: object, where: str, keys: Sequence[str], required: str, what: str
           ) -> tuple[str, dict[str, Any]]:
    """An entry of `workloads` or `hardware`: a string, or a table with `required`."""
    if isinstance(item, str):
        return item, {}
    table = _table(item, where)
    check_keys(table, keys, f"{where}.")
    if required not in table:
        raise InputError(f"{where}: expected {required} = \"{what.upper()}\" (a built-in "
                         f"or a file)")
    return _string(table[required], f"{where}.{required}", f"a {what}"), table


def _workload_entry(spec: _File, item: object, index: int) -> WorkloadEntry:
    where = spec.where(f"workloads[{index}]")
    name, table = _entry(item, where, WORKLOAD_KEYS, "name", "workload")
    grid = _grid(table["sizes"], f"{where}.sizes") if "sizes" in table else None
    return WorkloadEntry(spec.ref(name), where, grid)


def _grid(value: object, where: str) -> SizeGrid:
    """A workload's sizes: a table of axes (their product) or a list of tables (points)."""
    if isinstance(value, dict):
        return SizeGrid(where, axes=_size_axes(value, where))
    if not isinstance(value, list) or not value:
        raise InputError(f"{where}: expected a table of sizes ({{ M = [64, 128] }}) or a "
                         f"list of such tables, one per point")
    points = []
    for k, item in enumerate(value):
        table = _table(item, f"{where}[{k}]")
        point = []
        for axis in _size_axes(table, f"{where}[{k}]"):
            if len(axis.values) != 1:
                raise InputError(f"{axis.where}: a point of a list of sizes has one value "
                                 f"per size")
            point.append((axis.name, axis.values[0]))
        points.append(tuple(point))
    return SizeGrid(where, points=tuple(dict.fromkeys(points)))


def _hardware_entry(spec: _File, item: object, index: int) -> HardwareEntry:
    where = spec.where(f"hardware[{index}]")
    model, table = _entry(item, where, HARDWARE_KEYS, "model", "model")
    label = _string(table["label"], f"{where}.label", "a label") if "label" in table else None
    hw_set = _hw_axes(_table(table.get("hw_set", {}), f"{where}.hw_set"), f"{where}.hw_set")
    return HardwareEntry(spec.ref(model), where, label, hw_set)


def _variant(spec: _File, item: object, index: int) -> VariantSpec:
    where = spec.where(f"variant[{index}]")
    table = _table(item, where)
    check_keys(table, VARIANT_KEYS, f"{where}.")
    name = table.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise InputError(f"{where}.name: expected a name of letters, digits and _")

    def strings(key: str) -> tuple[str, ...]:
        return _strings(table[key], f"{where}.{key}", key) if key in table else ()

    return VariantSpec(name, f"{where} ({name})", strings("constraints"), strings("fixes"),
                       strings("drops"),
                       strings("workloads") if "workloads" in table else None,
                       strings("hardware") if "hardware" in table else None)


def from_file(path: str) -> Spec:
    """The sweep a TOML spec file describes (docs/sweep.md)."""
    spec = _File(Path(path))
    try:
        spec.tree = tomllib.loads(spec.path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read the spec file: {exc}") from None
    except (tomllib.TOMLDecodeError, ValueError) as exc:
        raise InputError(f"{path}: invalid TOML: {exc}") from None
    tree = spec.tree
    check_keys(tree, TOP_KEYS, f"{path}: ")
    for key, example in (("workloads", '["softmax", "mv"]'), ("hardware", '["upmem", "cpu"]')):
        if not isinstance(tree.get(key), list) or not tree[key]:
            raise InputError(f"{spec.where(key)}: expected a non-empty list (e.g. {key} = "
                             f"{example})")
    variants = [_variant(spec, item, k) for k, item in enumerate(
        _list(tree.get("variant", []), spec.where("variant")))] or [
        VariantSpec(DEFAULT_VARIANT, "every point")]
    base = tuple(_strings(tree[k], spec.where(k), k) if k in tree else ()
                 for k in ("constraints", "fixes", "drops"))
    return Spec(
        workloads=tuple(_workload_entry(spec, item, k) for k, item in
                        enumerate(tree["workloads"])),
        hardware=tuple(_hardware_entry(spec, item, k) for k, item in
                       enumerate(tree["hardware"])),
        sizes=_size_axes(_table(tree.get("sizes", {}), spec.where("sizes")),
                         spec.where("sizes")),
        hw_set=_hw_axes(_table(tree.get("hw_set", {}), spec.where("hw_set")),
                        spec.where("hw_set")),
        variants=_with_base(variants, (base[0], base[1], base[2])),
        solvers=_strings(tree.get("solvers", "cpsat"), spec.where("solvers"), "solvers"),
        time_limit_s=_time_limit(_number(tree.get("time_limit", DEFAULT_TIME_LIMIT_S),
                                         spec.where("time_limit")), spec.where("time_limit")),
        validate=_bool(tree.get("validate", False), spec.where("validate")),
        binding=_bool(tree.get("binding", False), spec.where("binding")),
        emit=_string(tree["emit"], spec.where("emit"), "a target") if "emit" in tree
        else None,
        baseline=(_string(tree["baseline"], spec.where("baseline"), "hw:NAME or solver:NAME"),
                  spec.where("baseline")) if "baseline" in tree else None,
        source=path)


def _list(value: object, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise InputError(f"{where}: expected a list of tables ([[variant]] ...)")
    return value


def _number(value: object, where: str) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InputError(f"{where}: expected a number of seconds, got {value!r}")
    return str(value)
