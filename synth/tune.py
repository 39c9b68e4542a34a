"""`synth tune`: solve one workload under several variants of the request and compare them.

Every `--vary KEY=V1,V2,...` is an axis; the variants are the cartesian product of the
axes (the first `--vary` varies slowest). A KEY is one of

    hw:KEY   or a bare hardware key   a `--hw-set` parameter: wram.capacity=32KiB,64KiB
    fix:VAR  or a bare variable       a `--fix`: T=8,16, fix:Q.y.i=64,128
    drop:GROUP                        `on` drops the group (`--drop GROUP`), `off` keeps it
    set:NAME                          a problem size (`--set`): set:N=4096,8192
    hw                                the hardware model (`--hw`): hw=upmem,aie

The rule for a bare KEY: it is a hardware parameter when `--hw-set` accepts it for the
model, else a schedule variable when `--fix` accepts it (the names `--show-constraints`
lists); a key that is both is ambiguous and must be written `hw:KEY` or `fix:VAR`; a key
that is neither is an error naming the closest of both. Sizes and drops always need their
prefix (a size `M` and a slot symbol `M` would otherwise be easy to confuse). With
`hw=MODEL,...` the model is an axis like the others (`--hw` may then be left out, or be
one of the models): the other keys are checked against every model's names, and each
variant on its own model (a key only one model has stops the tune before it runs; a
sweep, `synth sweep`, restricts a variant to some models).

Everything a user can get wrong is checked before any solve (exit 2): the keys, every
value, and every variant's parse/hardware/encode stages (cheap: milliseconds), so a long
tune never stops half-way because of a typo in its last variant. A key may not be both
varied and a base setting (`--set`, `--hw-set`, `--fix`, `--drop`) of every variant.

Each variant is one `pipeline.run`; with `--binding` (`Request.binding` of the base
request) it also finds the groups that bind at each variant's optimum (one re-solve per
group, often most of the run time, hence opt-in as in `synth solve`). An infeasible or
timed-out variant is a row like any other. "vs best" compares a variant with the best of
the variants that have the same problem sizes (`best_costs`): a variant of another size
solves another problem. This module builds the variants and the rows' plain data; the
CLI renders them (table, `--json`, `--csv`).
"""

from __future__ import annotations

import csv
import dataclasses
import itertools
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from synth import hwfile, pipeline, report
from synth.constraints import user
from synth.constraints.result import Status
from synth.errors import InputError, SynthError
from synth.hwfile import override_keys
from synth.limits import MAX_SIZE, is_int, parse_int, to_int
from synth.pipeline import Outcome, Request

KINDS = ("hw", "fix", "drop", "set")
MODEL_KEY = "hw"  # `--vary hw=upmem,aie`: the hardware model itself (kind "model")
DROP_VALUES = {"on": True, "off": False}


@dataclass(frozen=True)
class Axis:
    """One `--vary`: what it sets (`kind`, `key`) and the values, as written."""

    label: str  # the KEY as the user wrote it (a column name)
    kind: str  # one of KINDS
    key: str  # without its prefix
    values: tuple[str, ...]


@dataclass(frozen=True)
class Variant:
    index: int  # from 1, in product order
    settings: tuple[tuple[str, str], ...]  # (axis label, value) per axis
    request: Request

    def describe(self) -> str:
        return " ".join(f"{label}={value}" for label, value in self.settings)


@dataclass(frozen=True)
class VariantResult:
    variant: Variant
    outcome: Outcome | None  # None when the run raised
    error: SynthError | None
    wall_s: float  # every stage of the run, binding re-solves included


# ---------------------------------------------------------------- parsing --vary


def split_vary(text: str) -> tuple[str, str, str, tuple[str, ...]]:
    """`drop:capacity.wram=on,off` -> (label, prefix, key, values); syntax only."""
    label, sep, raw = (part.strip() for part in text.partition("="))
    where = f"--vary {text}"
    if not sep or not label:
        raise InputError(f"{where}: expected KEY=V1,V2,... (e.g. --vary wram.capacity=32KiB,"
                         "64KiB or --vary drop:capacity.wram=on,off)")
    prefix, colon, key = (part.strip() for part in label.partition(":"))
    if not colon:
        prefix, key = "", label
    elif prefix not in KINDS:
        raise InputError(f"{where}: unknown prefix {prefix + ':'!r}; expected one of "
                         + ", ".join(f"{k}:" for k in KINDS) + " or a bare hardware key "
                         "or variable")
    values = tuple(v.strip() for v in raw.split(","))
    if not key or not all(values):
        raise InputError(f"{where}: expected a key and non-empty comma-separated values")
    repeated = sorted({v for v in values if values.count(v) > 1})
    if repeated:
        raise InputError(f"{where}: value {repeated[0]!r} given twice")
    return label, prefix, key, values


def hardware_keys(hw: str) -> list[str]:
    """The keys `--hw-set` accepts for a hardware model (the same list hwfile checks)."""
    return override_keys(hw)


@dataclass(frozen=True)
class _Names:
    """What a base request offers to vary."""

    hw_keys: list[str]
    variables: list[str]
    sizes: list[str]
    groups: list[str]


def _names(base: Request) -> _Names:
    workload, hw = pipeline.parse(base), pipeline.hardware(base)
    model = pipeline.encode(workload, hw, base.constraints, base.fixes, base.drops)
    full = pipeline.encode(workload, hw, base.constraints, base.fixes)  # before --drop
    groups = user.group_names(full.constraints)
    prefixes = {g.rsplit(".", k)[0] for g in groups for k in range(1, g.count(".") + 1)}
    droppable = [g for g in [*groups, *sorted(prefixes - set(groups))]
                 if not any(user.matches(name, g) for name in user.UNDROPPABLE)]
    return _Names(hardware_keys(base.hardware),
                  [*user.variable_names(model.constraints), *user.folded_factors(model)],
                  list(workload.sizes), droppable)


def _all_names(base: Request, models: Sequence[str]) -> _Names:
    """What the base request offers to vary on any of `models` (every name once)."""
    per = [_names(dataclasses.replace(base, hardware=m)) for m in models]

    def union(kind: str) -> list[str]:
        return list(dict.fromkeys(n for names in per for n in getattr(names, kind)))

    return _Names(union("hw_keys"), union("variables"), union("sizes"), union("groups"))


def model_axis(texts: Sequence[str]) -> tuple[str, tuple[str, ...]] | None:
    """`--vary hw=MODEL,...` among `texts` and its models (syntax only); None without."""
    for text in texts:
        _, prefix, key, values = split_vary(text)
        if prefix == "" and key == MODEL_KEY:
            return text, values
    return None


def _check_models(text: str, values: Sequence[str], base: Request) -> None:
    """Every model of `--vary hw=...` loads with the base overrides; `--hw`, when given,
    is one of them."""
    where = f"--vary {text}"
    for value in values:
        try:
            hwfile.load_hardware(value, base.hw_overrides)
        except InputError as exc:
            raise InputError(f"{where}: {exc}") from None
    if base.hardware not in values:
        raise InputError(f"{where}: the hardware model is varied and --hw {base.hardware} "
                         f"is not one of its values; leave --hw out")


def _unknown_bare(key: str, names: _Names, where: str) -> InputError:
    """A bare key that is neither a hardware key nor a variable: the closest names of
    every kind, written the way `--vary` accepts them (`set:N`, `drop:capacity.wram`)."""
    spelled = {**{k: k for k in names.hw_keys}, **{v: v for v in names.variables},
               **{s: f"set:{s}" for s in names.sizes},
               **{g: f"drop:{g}" for g in names.groups}}
    near = [spelled[name] for name in user.closest(key, spelled)]
    hint = ("did you mean " + ", ".join(near) + "?") if near else (
        "expected a hardware key (e.g. " + ", ".join(names.hw_keys[:3]) + "), a variable "
        "(e.g. " + ", ".join(names.variables[:3]) + "), set:SIZE or drop:GROUP")
    return InputError(f"{where}: unknown key {key!r}; {hint} (synth solve ... "
                      "--show-constraints lists variables and groups)")


def _resolve(text: str, prefix: str, key: str, names: _Names) -> str:
    """The kind of a `--vary` key, checked against the names the base request offers."""
    where = f"--vary {text}"
    if prefix == "" and key == MODEL_KEY:
        return "model"
    if prefix == "":
        is_hw, is_var = key in names.hw_keys, key in names.variables
        if is_hw and is_var:
            raise InputError(f"{where}: {key!r} is both a hardware parameter and a "
                             f"variable; write hw:{key} or fix:{key}")
        if not is_hw and not is_var:
            raise _unknown_bare(key, names, where)
        return "hw" if is_hw else "fix"
    valid = {"hw": names.hw_keys, "fix": names.variables, "set": names.sizes,
             "drop": names.groups}[prefix]
    kind = {"hw": "hardware parameter", "fix": "variable", "set": "size",
            "drop": "group"}[prefix]
    if prefix == "drop":
        for name, why in user.UNDROPPABLE.items():
            if user.matches(name, key):
                raise InputError(f"{where}: the group {name!r} cannot be dropped: {why}")
    if key not in valid:
        raise user.unknown(kind, key, valid, where)
    return prefix


def _check_values(text: str, kind: str, key: str, values: Sequence[str]) -> None:
    where = f"--vary {text}"
    for value in values:
        if kind == "drop" and value.lower() not in DROP_VALUES:
            raise InputError(f"{where}: {value!r}: expected on (group dropped) or off "
                             "(group kept)")
        if kind == "set" and not (is_int(value) and to_int(value) > 0):
            raise InputError(f"{where}: size {key!r} must be a positive integer (digits "
                             f"0-9), got {value!r}")
        if kind == "set":
            parse_int(value, where, 1, MAX_SIZE)
        if kind == "fix":
            parse_int(value, where)


def _check_not_base(axis: Axis, base: Request, where: str) -> None:
    """A varied key may not also be a base setting (which one would win is a trap)."""
    clash: str | None = None
    if axis.kind == "set" and axis.key in base.sizes:
        clash = f"--set {axis.key}"
    elif axis.kind == "hw":
        clash = next((f"--hw-set {o}" for o in base.hw_overrides
                      if o.partition("=")[0].strip() == axis.key), None)
    elif axis.kind == "fix":
        clash = next((f"--fix {f}" for f in base.fixes
                      if f.partition("=")[0].strip() == axis.key), None)
    elif axis.kind == "drop":
        clash = next((f"--drop {d}" for d in base.drops
                      if user.matches(axis.key, d) or user.matches(d, axis.key)), None)
    if clash is not None:
        raise InputError(f"{where}: {axis.key!r} is both varied and set for every variant "
                         f"by {clash}; remove one of them")


def parse_axes(texts: Sequence[str], base: Request) -> list[Axis]:
    """The `--vary` options as axes, every key and value checked (InputError: exit 2).
    With `--vary hw=...`, `base.hardware` is one of its models (`cli` puts the first
    there when `--hw` is left out)."""
    if not texts:
        raise InputError("synth tune needs at least one --vary KEY=V1,V2,...")
    models = model_axis(texts)
    if models is not None:
        _check_models(*models, base)
    names = _all_names(base, models[1]) if models is not None else _names(base)
    axes: list[Axis] = []
    for text in texts:
        label, prefix, key, values = split_vary(text)
        kind = _resolve(text, prefix, key, names)
        _check_values(text, kind, key, values)
        axis = Axis(label, kind, key, values)
        _check_not_base(axis, base, f"--vary {text}")
        twice = next((a for a in axes if (a.kind, a.key) == (kind, key)), None)
        if twice is not None:
            raise InputError(f"--vary {text}: {key!r} is already varied by --vary "
                             f"{twice.label}=...")
        axes.append(axis)
    return axes


# ---------------------------------------------------------------- variants


def _request(base: Request, axes: Sequence[Axis], values: Sequence[str]) -> Request:
    sizes, model = dict(base.sizes), base.hardware
    hw, fixes, drops = list(base.hw_overrides), list(base.fixes), list(base.drops)
    for axis, value in zip(axes, values, strict=True):
        if axis.kind == "model":
            model = value
        elif axis.kind == "set":
            sizes[axis.key] = to_int(value)
        elif axis.kind == "hw":
            hw.append(f"{axis.key}={value}")
        elif axis.kind == "fix":
            fixes.append(f"{axis.key}={value}")
        elif DROP_VALUES[value.lower()]:
            drops.append(axis.key)
    return dataclasses.replace(base, hardware=model, sizes=sizes, hw_overrides=tuple(hw),
                               fixes=tuple(fixes), drops=tuple(drops))


def make_variants(base: Request, axes: Sequence[Axis]) -> list[Variant]:
    """The cartesian product of the axes (the first axis varies slowest), each variant's
    request checked up to its encoding so that bad input stops the tune before it runs."""
    variants = []
    for index, values in enumerate(itertools.product(*(a.values for a in axes)), start=1):
        settings = tuple((a.label, v) for a, v in zip(axes, values, strict=True))
        variant = Variant(index, settings, _request(base, axes, values))
        try:
            request = variant.request
            pipeline.encode(pipeline.parse(request), pipeline.hardware(request),
                            request.constraints, request.fixes, request.drops)
        except InputError as exc:
            hint = (" (a setting only some of the models have: synth sweep runs a "
                    "variant on some models only, docs/sweep.md)"
                    if any(a.kind == "model" for a in axes) else "")
            raise InputError(f"variant {index} ({variant.describe()}): {exc}{hint}") from None
        variants.append(variant)
    return variants


def run_variant(variant: Variant) -> VariantResult:
    """One variant's pipeline run; a `SynthError` becomes an error row, not an abort."""
    start = time.perf_counter()
    try:
        outcome = pipeline.run(variant.request)
    except SynthError as exc:
        return VariantResult(variant, None, exc, time.perf_counter() - start)
    return VariantResult(variant, outcome, None, time.perf_counter() - start)


def run_all(variants: Sequence[Variant],
            done: Callable[[VariantResult], None] | None = None) -> list[VariantResult]:
    results = []
    for variant in variants:
        result = run_variant(variant)
        results.append(result)
        if done is not None:
            done(result)
    return results


def exit_code(results: Sequence[VariantResult]) -> int:
    """0 when every variant ran, whatever its status; else the first failure's code: a
    run that raised (e.g. 4 for a loop nest breaking an IR rule) or 4 for a validation
    that failed (only with --validate)."""
    for result in results:
        if result.error is not None:
            return result.error.exit_code
        validation = result.outcome.validation if result.outcome else None
        if validation is not None and not validation.passed:
            return 4
    return 0


# ---------------------------------------------------------------- rows


def status(result: VariantResult) -> str:
    return "error" if result.outcome is None else result.outcome.result.status.value


def cost_ps(result: VariantResult) -> int | None:
    cost = result.outcome.cost if result.outcome else None
    return sum(int(v) for v in cost.values()) if cost is not None else None


def binding_groups(result: VariantResult) -> list[str] | None:
    """The groups whose removal improves this variant's optimum; None when not solved."""
    if result.outcome is None or result.outcome.group_status is None:
        return None
    return [g.group for g in result.outcome.group_status if g.binding]


def conflict_groups(result: VariantResult) -> list[str] | None:
    """Infeasible: a minimal set of conflicting groups; else None."""
    outcome = result.outcome
    if outcome is None or outcome.result.status is not Status.INFEASIBLE:
        return None
    return [c.group for c in outcome.explanation or []]


SizesKey = tuple[tuple[str, int], ...]


def sizes_of(result: VariantResult) -> SizesKey:
    """The problem sizes a variant solved (the workload's, overrides applied), sorted."""
    if result.outcome is not None:
        return tuple(sorted(result.outcome.workload.sizes.items()))
    return tuple(sorted(result.variant.request.sizes.items()))


def best_costs(results: Sequence[VariantResult]) -> dict[SizesKey, int]:
    """The lowest cost among the variants of each set of problem sizes."""
    best: dict[SizesKey, int] = {}
    for result in results:
        cost, sizes = cost_ps(result), sizes_of(result)
        if cost is not None and (sizes not in best or cost < best[sizes]):
            best[sizes] = cost
    return best


def vs_best(result: VariantResult, best: Mapping[SizesKey, int]) -> float | None:
    """cost / (the best cost at the same sizes) - 1; None without a cost."""
    cost, least = cost_ps(result), best.get(sizes_of(result))
    if cost is None or not least:
        return None
    return cost / least - 1


def row(result: VariantResult, best: Mapping[SizesKey, int] | None = None
        ) -> dict[str, Any]:
    """One variant as JSON-ready data (times in seconds, exact costs in picoseconds);
    `vs_best` against `best` (`best_costs` of every variant), None without it."""
    outcome = result.outcome
    solver = outcome.result if outcome else None
    total = cost_ps(result)
    validation = outcome.validation if outcome else None
    return report.jsonable({
        "index": result.variant.index,
        "settings": dict(result.variant.settings),
        "sizes": dict(outcome.workload.sizes) if outcome else dict(result.variant.request.sizes),
        "status": status(result),
        "objective_ps": solver.objective if solver else None,
        "bound_ps": solver.bound if solver else None,
        "gap": report.relative_gap(solver.status, solver.objective, solver.bound)
        if solver else None,
        "cost_s": total / report.PS_PER_S if total is not None else None,
        "vs_best": vs_best(result, best) if best is not None else None,
        "solve_s": solver.wall_s if solver else None,
        "wall_s": result.wall_s,
        "binding": binding_groups(result),
        "conflict": conflict_groups(result),
        "validation": None if validation is None else validation.passed,
        "variables": ({r.name: r.value for r in report.variable_rows(outcome)}
                      if outcome and outcome.result.env is not None else None),
        "error": str(result.error) if result.error is not None else None,
    })


def hardware_names(base: Request, results: Sequence[VariantResult]) -> list[str]:
    """The hardware models of the variants (their names, once each, in order)."""
    names = [r.outcome.hardware.name if r.outcome is not None else r.variant.request.hardware
             for r in results]
    return list(dict.fromkeys(names)) or [base.hardware]


def to_json(base: Request, axes: Sequence[Axis],
            results: Sequence[VariantResult]) -> dict[str, Any]:
    """`hardware` is the model's name, or the list of them with `--vary hw=...`."""
    first = next((r.outcome for r in results if r.outcome is not None), None)
    best = best_costs(results)
    models = hardware_names(base, results)
    varied = any(a.kind == "model" for a in axes)
    return report.jsonable({
        "workload": first.workload.name if first else base.workload,
        "hardware": models if varied else models[0],
        "vary": {a.label: {"kind": a.kind, "key": a.key, "values": list(a.values)}
                 for a in axes},
        "variants": [row(r, best) for r in results],
    })


CSV_FIELDS = ("status", "objective_ps", "cost_s", "vs_best", "gap", "solve_s", "wall_s",
              "binding", "conflict", "validation", "error")


def write_csv(path: Path, axes: Sequence[Axis], results: Sequence[VariantResult]) -> None:
    """One row per variant: index, one column per axis, then `CSV_FIELDS`; lists of
    groups are joined with spaces, missing values are empty cells."""
    def cell(value: Any) -> Any:
        if value is None:
            return ""
        if isinstance(value, list):
            return " ".join(value)
        return value

    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["index", *(a.label for a in axes), *CSV_FIELDS])
        best = best_costs(results)
        for result in results:
            data = row(result, best)
            settings: Mapping[str, str] = data["settings"]
            writer.writerow([data["index"], *(settings[a.label] for a in axes),
                             *(cell(data[f]) for f in CSV_FIELDS)])
