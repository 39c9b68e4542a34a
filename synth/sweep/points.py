"""A sweep's points: the axes of a `Spec` expanded, and every one checked before any runs.

The points are the product, in this order (the last varies fastest), of the workloads,
the hardware configurations (each model with each combination of its overrides), the
constraint variants, the solvers and each workload's sizes. A size of the sweep's
`[sizes]` (or `--set`) applies to the workloads that declare it; an override of its
`[hw_set]` (or `--hw-set`) to the models that accept the key; a workload's or model's own
grid replaces the sweep's for the names it gives.

Checked here, before the first point runs (exit 2, naming the key or flag): every
workload and model loads, at every size and with every override; every swept size is
declared by some workload and every override accepted by some model; every variant's
constraints, fixes and drops are valid on each workload and model it applies to (one
encoding per pair, at the workload's first sizes); the solvers, the emitter, the baseline.

Each point has a key (`Point.key`): a digest of what decides its result, namely the
workload's text and sizes, the hardware model's text, its overrides and the model as
loaded on this machine (the `cpu` model reads its cache sizes and core count here), the
variant's settings, the solver, the options, and synth's version with a digest of its
source files (a changed solver is another synth). A result stored under the key is
the point's result (`synth.sweep.store`).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import itertools
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from synth.constraints import user
from synth.errors import InputError
from synth.hwfile import load_hardware, override_keys, read_model
from synth.lang import parse_workload, read_workload
from synth.pipeline import EMITTERS, SOLVERS, Request, check_emit, encode
from synth.sweep.spec import MAX_POINTS, Axis, HardwareEntry, Spec, VariantSpec, WorkloadEntry

KEY_LENGTH = 32  # hex digits of a point's key: 128 bits, no collision in any sweep


@dataclass(frozen=True)
class Options:
    """What every point of a sweep runs with (part of each point's key)."""

    time_limit_s: float
    validate: bool
    binding: bool
    emit: str | None


@dataclass(frozen=True)
class Point:
    index: int  # from 1, in the sweep's order
    workload: str  # the workload's label (its name, unless two workloads share it)
    workload_ref: str
    workload_text: str
    sizes: tuple[tuple[str, int], ...]  # every size of the workload, in its order
    hardware: str  # the model's label
    config: str  # the model's label with its overrides: `upmem wram.capacity=32KiB`
    hardware_ref: str
    hardware_text: str
    hw_set: tuple[str, ...]  # KEY=VALUE
    variant: str
    constraints: tuple[str, ...]
    fixes: tuple[str, ...]
    drops: tuple[str, ...]
    solver: str
    options: Options
    key: str = ""

    def request(self, workload_ref: str, hardware_ref: str, out_dir: str | None) -> Request:
        """The point as a `synth solve` request, reading the workload and the model from
        the given references (the point's own, or copies of their texts: `task`)."""
        return Request(workload_ref, hardware_ref, dict(self.sizes), self.hw_set, self.solver,
                       self.options.time_limit_s, validate=self.options.validate,
                       constraints=self.constraints, fixes=self.fixes, drops=self.drops,
                       binding=self.options.binding, emit=self.options.emit,
                       out_dir=out_dir)

    def describe(self) -> str:
        sizes = ",".join(f"{k}={v}" for k, v in self.sizes)
        return f"{self.workload} {sizes} on {self.config} ({self.variant}, {self.solver})"

    def to_json(self) -> dict[str, Any]:
        """What a row says about the point (the texts stay out)."""
        return {"index": self.index, "key": self.key, "workload": self.workload,
                "workload_ref": self.workload_ref, "sizes": dict(self.sizes),
                "hardware": self.hardware, "config": self.config,
                "hardware_ref": self.hardware_ref, "hw_set": list(self.hw_set),
                "variant": self.variant, "constraints": list(self.constraints),
                "fixes": list(self.fixes), "drops": list(self.drops), "solver": self.solver}


@dataclass(frozen=True)
class Baseline:
    """What the ratio plot divides by: a hardware configuration or a solver."""

    kind: str  # "hw" or "solver"
    name: str  # a configuration's label or a solver's name


# ---------------------------------------------------------------- synth's version


PRESENTATION = ("render.py", "sweep/plots.py", "sweep/html.py")
"""Sources that only draw results (tables, plots, the page): not part of the digest, so
that a change to a plot does not make every stored point stale."""


@functools.cache
def source_digest() -> str:
    """A digest of synth's source files (code, built-in models and workloads), but the
    `PRESENTATION` ones."""
    root = Path(__file__).resolve().parent.parent
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        name = path.relative_to(root).as_posix()
        if (path.suffix in (".py", ".toml", ".syn", ".c", ".h") and path.is_file()
                and name not in PRESENTATION):
            digest.update(str(path.relative_to(root)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


def synth_version() -> str:
    """synth's version and its sources' digest: `0.1.0+1a2b3c4d5e6f`."""
    from synth.cli import version

    return f"{version()}+{source_digest()[:12]}"


# ---------------------------------------------------------------- workloads


@dataclass(frozen=True)
class _Workload:
    entry: WorkloadEntry
    label: str
    text: str
    path: str  # what parse errors name
    name: str
    sizes: tuple[tuple[str, int], ...]  # declared, with their defaults
    combos: tuple[tuple[tuple[str, int], ...], ...]  # every point's sizes (all of them)


def _size_combos(entry: WorkloadEntry, declared: Mapping[str, int],
                 sizes: Sequence[Axis]) -> list[dict[str, int]]:
    """The sizes set at each of the workload's points: its own grid over the sweep's
    axes for the names the grid gives; the sweep's axes for the names it declares."""
    grid = entry.sizes
    own = set(grid.names()) if grid is not None else set()
    unknown = sorted(own - set(declared))
    if grid is not None and unknown:
        raise unknown_name("size", unknown[0], declared, f"{grid.where} ({entry.ref} "
                           f"declares {', '.join(declared) or 'no size'})")
    shared = [a for a in sizes if a.name in declared and a.name not in own]
    axes = shared + (list(grid.axes) if grid is not None and grid.points is None else [])
    points = list(grid.points) if grid is not None and grid.points is not None else [()]
    count = math.prod(len(a.values) for a in axes) * len(points)
    if count > MAX_POINTS:
        raise InputError(f"{entry.where}: {count:,} size combinations, more than a sweep "
                         f"may have ({MAX_POINTS:,} points)")
    return [{**dict(point), **{a.name: v for a, v in zip(axes, values, strict=True)}}
            for point in points for values in itertools.product(*(a.values for a in axes))]


def _load_workload(entry: WorkloadEntry, sizes: Sequence[Axis]) -> _Workload:
    try:
        text, path, name = read_workload(entry.ref)
        default = parse_workload(text, path, name)
    except InputError as exc:
        raise InputError(f"{entry.where}: {exc}") from None
    combos = []
    for setting in _size_combos(entry, default.sizes, sizes):
        try:
            workload = parse_workload(text, path, name, setting)
        except InputError as exc:
            at = ", ".join(f"{k}={v}" for k, v in setting.items())
            raise InputError(f"{entry.where}: {entry.ref} at {at}: {exc}") from None
        combos.append(tuple(workload.sizes.items()))
    return _Workload(entry, name, text, path, name, tuple(default.sizes.items()),
                     tuple(combos))


def load_workloads(spec: Spec) -> list[_Workload]:
    workloads = [_load_workload(entry, spec.sizes) for entry in spec.workloads]
    for axis in spec.sizes:
        if not any(axis.name in dict(w.sizes) for w in workloads):
            declared = "; ".join(f"{w.label}: {', '.join(dict(w.sizes)) or '-'}"
                                 for w in workloads)
            raise InputError(f"{axis.where}: no workload of the sweep declares the size "
                             f"{axis.name!r} ({declared})")
    labels = _labels([w.label for w in workloads], [w.entry.ref for w in workloads],
                     [w.entry.where for w in workloads], "workload")
    return [dataclasses.replace(w, label=label) for w, label in zip(workloads, labels,
                                                                    strict=True)]


def _labels(names: Sequence[str], refs: Sequence[str], wheres: Sequence[str],
            what: str) -> list[str]:
    """Each entry's name, or its reference where two entries share a name; an entry
    given twice is an error."""
    labels = [name if names.count(name) == 1 else ref for name, ref in zip(names, refs,
                                                                          strict=True)]
    for k, label in enumerate(labels):
        if label in labels[:k]:
            raise InputError(f"{wheres[k]}: {what} {label!r} is already in the sweep "
                             f"({wheres[labels.index(label)]})")
    return labels


# ---------------------------------------------------------------- hardware


@dataclass(frozen=True)
class _Config:
    entry: HardwareEntry
    model: str  # the model's label
    label: str  # with the overrides
    text: str
    overrides: tuple[str, ...]
    loaded: str  # the model as loaded here (repr, without its file path): part of the key


def _override_axes(entry: HardwareEntry, shared: Sequence[Axis]) -> list[Axis]:
    keys = override_keys(entry.ref)
    for axis in entry.hw_set:
        if axis.name not in keys:
            raise unknown_name("hardware key", axis.name, keys, axis.where)
    own = {a.name for a in entry.hw_set}
    return [a for a in shared if a.name in keys and a.name not in own] + list(entry.hw_set)


def _load_configs(entry: HardwareEntry, shared: Sequence[Axis]) -> list[_Config]:
    try:
        text = read_model(entry.ref)[0]
        model = entry.label or load_hardware(entry.ref).name
    except InputError as exc:
        raise InputError(f"{entry.where}: {exc}") from None
    axes = _override_axes(entry, shared)
    configs = []
    for values in itertools.product(*(a.values for a in axes)):
        overrides = tuple(f"{a.name}={v}" for a, v in zip(axes, values, strict=True))
        try:
            hw = load_hardware(entry.ref, overrides)
        except InputError as exc:
            raise InputError(f"{entry.where}: {exc}") from None  # exc names the override
        label = " ".join([model, *overrides])
        configs.append(_Config(entry, model, label, text, overrides,
                               repr(dataclasses.replace(hw, source=""))))
    return configs


def load_configs(spec: Spec) -> list[_Config]:
    for axis in spec.hw_set:
        accepting = [e for e in spec.hardware if axis.name in override_keys(e.ref)]
        if not accepting:
            keys = sorted({k for e in spec.hardware for k in override_keys(e.ref)})
            raise unknown_name("hardware key", axis.name, keys, axis.where)
    per_entry = [_load_configs(entry, spec.hw_set) for entry in spec.hardware]
    models = _labels([c[0].model for c in per_entry], [e.ref for e in spec.hardware],
                     [e.where for e in spec.hardware], "hardware model")
    return [dataclasses.replace(c, model=model, label=" ".join([model, *c.overrides]))
            for configs, model in zip(per_entry, models, strict=True) for c in configs]


# ---------------------------------------------------------------- variants


def _applies(variant: VariantSpec, workload: _Workload, config: _Config) -> bool:
    return ((variant.workloads is None
             or bool({workload.label, workload.entry.ref} & set(variant.workloads)))
            and (variant.hardware is None
                 or bool({config.model, config.entry.ref} & set(variant.hardware))))


def check_variants(variants: Sequence[VariantSpec], workloads: Sequence[_Workload],
                   configs: Sequence[_Config]) -> None:
    """Every filter names a workload or model of the sweep, and every variant's settings
    encode on each workload and model it applies to (at the workload's first sizes)."""
    names = {"workloads": {n for w in workloads for n in (w.label, w.entry.ref)},
             "hardware": {n for c in configs for n in (c.model, c.entry.ref)}}
    for variant in variants:
        for what, given in (("workloads", variant.workloads), ("hardware", variant.hardware)):
            for name in given or ():
                if name not in names[what]:
                    raise unknown_name(what.rstrip("s"), name, names[what],
                                       f"{variant.where} {what}")
        if not variant.settings:
            continue
        first = {c.model: c for c in reversed(configs)}  # each model's first configuration
        for workload, config in itertools.product(workloads, first.values()):
            if _applies(variant, workload, config):
                _check_encoding(variant, workload, config)


def _check_encoding(variant: VariantSpec, workload: _Workload, config: _Config) -> None:
    try:
        encode(parse_workload(workload.text, workload.path, workload.name,
                              dict(workload.combos[0])),
               load_hardware(config.entry.ref, config.overrides), variant.constraints,
               variant.fixes, variant.drops)
    except InputError as exc:
        raise InputError(f"{variant.where}, on {workload.label} and {config.model}: "
                         f"{exc}") from None


# ---------------------------------------------------------------- the points


def _where(spec: Spec, key: str, flag: str) -> str:
    """Where a setting of the sweep was given: its flag, or its key in the spec file."""
    return flag if spec.source == "flags" else f"{spec.source}: {key}"


def _check_options(spec: Spec) -> None:
    for solver in spec.solvers:
        if solver not in SOLVERS:
            raise unknown_name("solver", solver, SOLVERS,
                               _where(spec, "solvers", f"--solver {solver}"))
    if spec.emit is not None:
        where = _where(spec, "emit", "--emit")
        if spec.emit not in EMITTERS:
            raise InputError(f"{where} {spec.emit}: unknown target; expected one of "
                             f"{', '.join(EMITTERS)}")
        check_emit(Request("", "", emit=spec.emit, out_dir=".", validate=spec.validate))


def _key(workload: _Workload, sizes: tuple[tuple[str, int], ...], config: _Config,
         variant: VariantSpec, solver: str, options: Options) -> str:
    data = {"synth": synth_version(), "workload": [workload.entry.ref, workload.text],
            "sizes": sorted(sizes),
            "hardware": [config.entry.ref, config.text, list(config.overrides), config.loaded],
            "variant": [list(variant.constraints), list(variant.fixes), list(variant.drops)],
            "solver": solver, "options": dataclasses.asdict(options)}
    text = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:KEY_LENGTH]


def expand(spec: Spec) -> list[Point]:
    """Every point of the sweep, in order, each with its key (InputError: exit 2)."""
    _check_options(spec)
    workloads, configs = load_workloads(spec), load_configs(spec)
    check_variants(spec.variants, workloads, configs)
    options = Options(spec.time_limit_s, spec.validate, spec.binding, spec.emit)
    combos = [(w, c, v) for w in workloads for c in configs for v in spec.variants
              if _applies(v, w, c)]
    count = sum(len(w.combos) for w, _, _ in combos) * len(spec.solvers)
    where = "the sweep" if spec.source == "flags" else f"{spec.source}: the sweep"
    if count > MAX_POINTS:
        raise InputError(f"{where} has {count:,} points, more than {MAX_POINTS:,}; "
                         f"split it")
    if count == 0:
        raise InputError(f"{where} has no points (every variant is restricted to "
                         f"workloads or models it does not have)")
    points: list[Point] = []
    for (workload, config, variant), solver in itertools.product(combos, spec.solvers):
        for sizes in workload.combos:
            points.append(Point(
                len(points) + 1, workload.label, workload.entry.ref, workload.text, sizes,
                config.model, config.label, config.entry.ref, config.text, config.overrides,
                variant.name, variant.constraints, variant.fixes, variant.drops, solver,
                options, _key(workload, sizes, config, variant, solver, options)))
    return points


def baseline(spec: Spec, points: Sequence[Point]) -> Baseline | None:
    """What the ratio plot compares with: `baseline` as given (`hw:NAME`, `solver:NAME`
    or a bare NAME), else the first solver when the sweep has several, else the first
    hardware configuration when it has several, else nothing."""
    configs = list(dict.fromkeys(p.config for p in points))
    models: dict[str, list[str]] = {}
    for point in points:
        if point.config not in models.setdefault(point.hardware, []):
            models[point.hardware].append(point.config)
    solvers = list(spec.solvers)
    if spec.baseline is None:
        return (Baseline("solver", solvers[0]) if len(solvers) > 1 else
                Baseline("hw", configs[0]) if len(configs) > 1 else None)
    value, where = spec.baseline
    kind, sep, name = value.partition(":")
    if not sep:
        kind, name = ("solver" if value in solvers else "hw"), value
    if kind == "solver":
        if name not in solvers:
            raise unknown_name("solver of the sweep", name, solvers, where)
        return Baseline("solver", name)
    if kind != "hw":
        raise InputError(f"{where}: expected hw:NAME or solver:NAME, got {value!r}")
    if name in configs:
        return Baseline("hw", name)
    if len(models.get(name, [])) == 1:
        return Baseline("hw", models[name][0])
    if name in models:
        raise InputError(f"{where}: the sweep has {len(models[name])} configurations of "
                         f"{name} ({'; '.join(models[name])}); name one of them")
    raise unknown_name("hardware model of the sweep", name, [*configs, *models], where)


def unknown_name(kind: str, name: str, valid: Iterable[str], where: str) -> InputError:
    """An unknown name, with the closest valid ones (or the valid ones, when few)."""
    options = sorted(set(valid))
    near = user.closest(name, options)
    hint = ("did you mean " + ", ".join(near) + "?" if near else
            f"expected one of {', '.join(options[:8])}" + (", ..." if len(options) > 8
                                                           else ""))
    return InputError(f"{where}: unknown {kind} {name!r}; {hint}")
