"""The report of one `synth solve`: plain, JSON-ready data derived from an `Outcome`.

`to_json` is the machine-readable report (README.md, `--json`); the CLI's human output is
rendered from the same pieces (`variable_rows`, `placements`, `cost_parts`, ...), so the
two cannot disagree. Everything here reads the outcome and never runs a stage again.

Units: the solver and the cost model count integer picoseconds; the report gives seconds
(`*_s` keys) and keeps the exact integers where a consumer may want to compare them
(`solver.objective`, `solver.bound`, `cost.total_ps`).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from synth.constraints import expr as ex
from synth.constraints.dst import subblock_meanings
from synth.constraints.explain import group_infos
from synth.constraints.intrinsic import contraction
from synth.constraints.result import Status
from synth.constraints.space import SlotKind
from synth.ir.nodes import Alloc, BufferDecl, Kernel, Program, walk
from synth.ir.printer import loop_summary, print_program
from synth.pipeline import Outcome

PS_PER_S = 1e12
TRANSFER_PREFIX = "transfer:"


# ---------------------------------------------------------------- JSON safety


def jsonable(value: Any) -> Any:
    """`value` with every part made strictly JSON-serialisable.

    NumPy scalars become Python numbers, enums their value, tuples lists; non-finite
    floats become the strings "inf", "-inf" and "nan", because strict JSON has no such
    numbers and a consumer should still see that the error was infinite, not missing.
    """
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, np.generic):
        return jsonable(value.item())
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, enum.Enum):
        return jsonable(value.value)
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [jsonable(v) for v in value]
    return str(value)


# ---------------------------------------------------------------- variables


@dataclass(frozen=True)
class VariableRow:
    """One symbolic variable of the schedule, with what it means in the user's terms."""

    name: str
    value: int
    meaning: str


def _plural(word: str) -> str:
    return word if word.endswith("s") else word + "s"


def _count_rows(outcome: Outcome) -> list[VariableRow]:
    """The hardware counts the program allocates (R, D, T / P), outermost first."""
    if outcome.program is None:
        return []
    hw = outcome.hardware
    rows = []
    for index, level in enumerate(hw.levels):
        if level.symbol is None or level.symbol not in outcome.program.counts:
            continue
        parent = hw.levels[index - 1].name
        meaning = (f"{_plural(level.name)} per {parent}, allocated once for all kernels "
                   f"(range {level.count_min}..{level.count_max})")
        rows.append(VariableRow(level.symbol, int(outcome.program.counts[level.symbol]),
                                meaning))
    return rows


def _factor_meanings(outcome: Outcome) -> dict[str, str]:
    """Variable name -> meaning, for every factor that is a decision of the solver.

    Read from the model's factor terms rather than parsed out of the name, so kernel
    names with unusual characters (fused kernels, `C#2`) cannot confuse it."""
    model = outcome.model
    slots = model.slots
    innermost = len(slots) - 1
    env = outcome.result.env or {}
    used = {k.name for k in model.selected(env)}
    meanings: dict[str, str] = {}
    for spec in model.kernels:
        decision = model.chosen.get(spec.name)
        if isinstance(decision, ex.Var):
            names = ", ".join(s.name for s in spec.statements)
            meanings[decision.name] = (
                f"1 when statements {names} run fused as kernel {spec.name}"
                if len(spec.statements) > 1 else
                f"1 when statement {names} runs alone as kernel {spec.name}")
    for kernel, slots_combined in model.combines.items():
        for index, term in slots_combined.items():
            if isinstance(term, ex.Var) and kernel in used:
                level = slots[index].name
                meanings[term.name] = (f"1 when kernel {kernel} combines its {_plural(level)}' "
                                       f"partial results on the device (after a barrier), "
                                       f"0 on the host")
    for kernel, slots_buffered in model.buffers.items():
        for index, term in slots_buffered.items():
            if isinstance(term, ex.Var) and kernel in used:
                meanings[term.name] = (f"2 when kernel {kernel} double-buffers the tiles "
                                       f"moving into {slots[index].name} (transfers overlap "
                                       f"compute), 1 otherwise")
    for kernel, term in model.packs.items():
        if isinstance(term, ex.Var) and kernel in used:
            spec = next(k for k in model.kernels if k.name == kernel)
            names = ", ".join(s.name for s in spec.core if contraction(s) is not None)
            meanings[term.name] = (f"1 when kernel {kernel}'s contractions ({names}) run on "
                                   "the matrix intrinsic")
    for kernel, tensors in model.shares.items():
        for tensor, term in tensors.items():
            if isinstance(term, ex.Var) and kernel in used:
                meanings[term.name] = (f"1 when kernel {kernel}'s units share one {slots[-1].name} "
                                       f"tile of {tensor} (one load between barriers), "
                                       f"0: one tile per unit")
    meanings.update(subblock_meanings(env, used))
    for (kernel, dim, index), term in model.factors.terms.items():
        if not isinstance(term, ex.Var) or kernel not in used:
            continue  # a candidate kernel the schedule does not use: its factors mean nothing
        slot = slots[index]
        if slot.kind is SlotKind.SPATIAL:
            parent = outcome.hardware.levels[slot.level_index - 1].name
            text = f"{_plural(slot.name)} per {parent} used by kernel {kernel} along {dim}"
        elif index == innermost:
            text = f"compute tile: elements of {dim} per {slot.name} tile in kernel {kernel}"
        else:
            text = f"sequential steps along {dim} at {slot.name} in kernel {kernel}"
        meanings[term.name] = text
    return meanings


def _padded_rows(outcome: Outcome, env: Mapping[str, int]) -> dict[str, VariableRow]:
    """`ext.<kernel>.<dim>` variables whose chosen padded extent differs from the extent.

    A padded extent equal to the dimension's own extent says nothing; one that differs is
    a decision the user should see (it costs the padding)."""
    rows: dict[str, VariableRow] = {}
    extents = {spec.name: spec.extents for spec in outcome.model.kernels}
    used = {k.name for k in outcome.model.selected(env)}
    for (kernel, dim), term in outcome.model.factors.extents.items():
        if not isinstance(term, ex.Var) or term.name not in env or kernel not in used:
            continue
        extent = extents[kernel][dim]
        value = int(env[term.name])
        if value != extent:
            rows[term.name] = VariableRow(
                term.name, value, f"padded extent of {dim} in kernel {kernel} "
                                  f"(extent {extent}, {value - extent} padding)")
    return rows


def variable_rows(outcome: Outcome) -> list[VariableRow]:
    """Every symbolic variable: hardware counts first, then the factors in solver order."""
    rows = _count_rows(outcome)
    env = outcome.result.env
    if env is None:
        return rows
    meanings = _factor_meanings(outcome)
    padded = _padded_rows(outcome, env)
    for name, value in env.items():
        if name in meanings:
            rows.append(VariableRow(name, int(value), meanings[name]))
        elif name in padded:
            rows.append(padded[name])
    return rows


# ---------------------------------------------------------------- groups and placement


def kernel_allocs(kernel: Kernel) -> list[BufferDecl]:
    return [node.buffer for node in walk(kernel.body) if isinstance(node, Alloc)]


def groups(program: Program | None) -> list[dict[str, Any]]:
    if program is None:
        return []
    return [{"name": k.name, "statements": list(k.statements), "loops": loop_summary(k)}
            for k in program.kernels]


def placements(outcome: Outcome) -> dict[str, str]:
    """`"<kernel>/<tensor>"` -> the innermost memory that holds a tile of the tensor there.

    "Innermost" is by the hardware's memory order, not by nesting depth in the IR: a
    host-side buffer of partial results may be allocated deeper than a device buffer."""
    if outcome.program is None:
        return {}
    order = {m.name: i for i, m in enumerate(outcome.hardware.memories)}
    result: dict[str, str] = {}
    for kernel in outcome.program.kernels:
        for buf in kernel_allocs(kernel):
            key = f"{kernel.name}/{buf.tensor}"
            if key not in result or order.get(buf.memory, -1) > order.get(result[key], -1):
                result[key] = buf.memory
    return result


def buffers(program: Program | None) -> list[dict[str, Any]]:
    if program is None:
        return []
    return [{"kernel": k.name, "name": b.name, "tensor": b.tensor, "memory": b.memory,
             "shape": list(b.shape), "dtype": b.dtype.value, "partials": bool(b.partial_loops)}
            for k in program.kernels for b in kernel_allocs(k)]


# ---------------------------------------------------------------- cost


@dataclass(frozen=True)
class CostPart:
    """One part of the modelled time: `name` is `compute`, `launch`, `combine` or a
    transfer `host->mram`."""

    name: str
    is_transfer: bool
    ps: int

    @property
    def seconds(self) -> float:
        return self.ps / PS_PER_S


def cost_parts(cost: Mapping[str, int]) -> list[CostPart]:
    return [CostPart(key.removeprefix(TRANSFER_PREFIX), key.startswith(TRANSFER_PREFIX),
                     int(ps)) for key, ps in cost.items()]


def cost_json(cost: Mapping[str, int] | None) -> dict[str, Any] | None:
    if cost is None:
        return None
    parts = cost_parts(cost)
    breakdown: dict[str, Any] = {f"{p.name}_s": p.seconds for p in parts if not p.is_transfer}
    breakdown["transfer_s"] = {p.name: p.seconds for p in parts if p.is_transfer}
    total = sum(p.ps for p in parts)
    return {"total_s": total / PS_PER_S, "total_ps": total, "breakdown": breakdown}


# ---------------------------------------------------------------- solver, validation


def relative_gap(status: Status, objective: int | None, bound: int | None) -> float | None:
    """(objective - bound) / objective: 0 when proven optimal, None when unknown."""
    if status is Status.OPTIMAL:
        return 0.0
    if objective is None or bound is None:
        return None
    return max(0.0, (objective - bound) / max(abs(objective), 1))


def solver_json(outcome: Outcome) -> dict[str, Any]:
    r = outcome.result
    return {"name": r.solver, "wall_s": r.wall_s, "objective": r.objective, "bound": r.bound,
            "gap": relative_gap(r.status, r.objective, r.bound), "unit": "ps",
            "stats": dict(r.stats)}


def validation_json(outcome: Outcome) -> dict[str, Any] | None:
    v = outcome.validation
    if v is None:
        return None
    used = [o.get("tolerance_used", 0.0) for o in v.per_output.values()]
    return {"passed": v.passed, "max_abs_err": v.max_abs_err, "max_rel_err": v.max_rel_err,
            "tolerance_used": max(used, default=0.0), "wall_s": v.wall_s,
            "per_output": v.per_output, "sizes": None if v.sizes is None else dict(v.sizes)}


def infeasible_message(outcome: Outcome) -> str:
    """What the user reads when no schedule exists: the request, the minimal set of
    conflicting constraint groups with what they mean, and what to relax."""
    sizes = ", ".join(f"{k}={v}" for k, v in outcome.workload.sizes.items())
    head = (f"no schedule of workload '{outcome.workload.name}' ({sizes}) fits hardware "
            f"'{outcome.hardware.name}'")
    if not outcome.explanation:
        inner = outcome.hardware.memories[-1].name
        return (f"{head}, and no constraint group that --drop could relax was found to "
                f"cause it (or the checks that look for one ran out of time). Relax the "
                f"hardware with --hw-set (e.g. --hw-set {inner}.capacity=SIZE) or change "
                f"the problem sizes with --set NAME=INT.")
    lines = [f"{head}: no schedule meets this constraint group:"
             if len(outcome.explanation) == 1 else
             f"{head}: these constraint groups conflict (a minimal set: without any one "
             f"of them, the others can all be met):"]
    for conflict in outcome.explanation:
        lines.append(f"  {conflict.group}: {conflict.summary()}")
        if conflict.facts:
            lines.append(f"    ({conflict.facts})")
    which = "it" if len(outcome.explanation) == 1 else "one of them"
    lines.append(f"Relax {which}: the hardware with --hw-set, the problem sizes with "
                 "--set NAME=INT, or your own --constraint/--fix; --drop GROUP shows what "
                 "the request gives without a group.")
    return "\n".join(lines)


def explanation(outcome: Outcome) -> dict[str, Any] | None:
    """For an infeasible request: the conflicting groups and the message; else None."""
    if outcome.result.status is not Status.INFEASIBLE:
        return None
    groups = [{"group": c.group, "meaning": c.summary(), "meanings": list(c.violated),
               "facts": c.facts} for c in outcome.explanation or []]
    return {"groups": groups, "message": infeasible_message(outcome)}


# ---------------------------------------------------------------- constraint groups


def constraint_groups(outcome: Outcome) -> list[dict[str, Any]]:
    """Every named group of the model; `tight`, `binding` and `objective_without` are null
    unless the groups were analysed at the optimum (`Request.binding`)."""
    status = {g.group: g for g in outcome.group_status or []}
    rows = []
    for info in group_infos(outcome.model.constraints):
        at = status.get(info.group)
        rows.append({"group": info.group, "count": info.count, "meanings": list(info.meanings),
                     "tight": at.tight if at else None,
                     "binding": at.binding if at else None,
                     "objective_without": at.objective_without if at else None})
    return rows


def binding(outcome: Outcome) -> list[dict[str, Any]] | None:
    """The groups whose removal improves the objective; None when not analysed."""
    if outcome.group_status is None:
        return None
    return [{"group": g.group, "meaning": g.info.summary(),
             "objective_without": g.objective_without,
             "objective_without_s": (g.objective_without or 0) / PS_PER_S, "tight": g.tight}
            for g in outcome.group_status if g.binding]


# ---------------------------------------------------------------- verification


def verification(outcome: Outcome) -> dict[str, Any] | None:
    """The z3 proof (`proved`, `checks`, `failures`), and `sizes`: each size given as a
    range (`min`, `max`: the largest admissible value, `step`, `values`: how many,
    `solved_at`: where the tiles were chosen), empty without ranges; with ranges also
    `kinds` (the kinds of obligation stated), `note` and `smallest` (the same loop nest
    run against NumPy at the smallest sizes, null when not run)."""
    proof = outcome.proof
    if proof is None:
        return None
    data: dict[str, Any] = dict(proof.to_json())
    data.setdefault("sizes", {})
    if proof.sizes:
        solved = ", ".join(f"{k}={v}" for k, v in proof.solved.items())
        data["note"] = (f"solved at {solved} (the largest admissible sizes): the tiles are "
                        f"fixed for every admissible size, the host loops' counts adapt")
        run = outcome.smallest
        data["smallest"] = None if run is None else {
            "sizes": dict(run.sizes), "passed": run.validation.passed,
            "max_abs_err": run.validation.max_abs_err,
            "max_rel_err": run.validation.max_rel_err, "wall_s": run.validation.wall_s}
    return data


# ---------------------------------------------------------------- the report


def emitted_json(outcome: Outcome) -> dict[str, Any]:
    """`{target: {"path", "files", "checked", ...}}` for --emit, with the target's own
    keys (see each target's `json`; None where the check did not run), else `{}`."""
    return outcome.emitted.json() if outcome.emitted is not None else {}


def to_json(outcome: Outcome) -> dict[str, Any]:
    """The JSON report (README.md, `--json`), with `sizes`, `buffers`, `binding`,
    `constraint_groups`, `timings` and `loop_nest`; strictly serialisable
    (`json.dumps(..., allow_nan=False)` succeeds)."""
    program = outcome.program
    report = {
        "workload": outcome.workload.name,
        "hardware": outcome.hardware.name,
        "sizes": dict(outcome.workload.sizes),
        "status": outcome.result.status.value,
        "solver": solver_json(outcome),
        "variables": {row.name: row.value for row in variable_rows(outcome)},
        "groups": groups(program),
        "placement": placements(outcome),
        "buffers": buffers(program),
        "cost": cost_json(outcome.cost),
        "validation": validation_json(outcome),
        "verification": verification(outcome),
        "emitted": emitted_json(outcome),
        "measured": outcome.measured.json() if outcome.measured is not None else None,
        "explanation": explanation(outcome),
        "binding": binding(outcome),
        "constraint_groups": constraint_groups(outcome),
        "timings": dict(outcome.timings),
        "loop_nest": print_program(program) if program is not None else None,
    }
    result: dict[str, Any] = jsonable(report)
    return result
