"""The human output of `synth solve`, `--show-constraints` and `synth list`: tables and
lines built from an `Outcome` (`synth.report` builds the JSON from the same helpers).

Imported by `synth.cli` only when a command runs, so that `synth --help` does not load
the solvers, NumPy or rich.
"""

from __future__ import annotations

import json
import math
import sys
import tomllib
from collections.abc import Mapping
from importlib import resources
from typing import Any

from rich import box
from rich.table import Table

from synth import pipeline, report, shrink
from synth.calibrate import Calibration
from synth.cli import EXIT_OK, format_seconds, make_console
from synth.constraints import user
from synth.constraints.cost import Model
from synth.constraints.explain import GroupStatus, group_infos
from synth.constraints.result import WHY_NO_SCHEDULE, Status
from synth.errors import SynthError
from synth.hwfile import list_builtin_hardware, load_hardware
from synth.ir.printer import print_program
from synth.lang import list_builtin_workloads, load_workload
from synth.measure import Measured
from synth.pipeline import Outcome, Request

DOCS = {"the .syn workload language": "docs/language.md",
        "the hardware model format (TOML)": "docs/hardware.md"}
"""Where the reference pages are, relative to the repository (README's links)."""


def format_error(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def header_line(outcome: Outcome, total_s: float) -> str:
    """The first line: the request, the status, the objective (and bound), the solve's
    time and the whole run's (`total_s`: since synth started, every stage included)."""
    r = outcome.result
    sizes = " ".join(f"{k}={v}" for k, v in outcome.workload.sizes.items())
    parts = [f"{outcome.workload.name} ({sizes}) on {outcome.hardware.name}: "
             f"{r.status.value}"]
    if r.objective is not None:
        parts.append(f"objective {format_seconds(r.objective / report.PS_PER_S)}")
    if r.status is not Status.OPTIMAL and r.bound is not None:
        gap = report.relative_gap(r.status, r.objective, r.bound)
        bound = f"bound {format_seconds(r.bound / report.PS_PER_S)}"
        parts.append(bound + (f" (gap {gap:.1%})" if gap is not None else ""))
    parts.append(f"solve time {format_seconds(r.wall_s)} ({r.solver})")
    parts.append(f"total time {format_seconds(total_s)}")
    return ", ".join(parts)


def variables_table(outcome: Outcome) -> Table:
    table = Table(title="Symbolic variables", box=box.SIMPLE_HEAD, title_justify="left")
    table.add_column("name", no_wrap=True)
    table.add_column("value", justify="right", no_wrap=True)
    table.add_column("meaning")
    for row in report.variable_rows(outcome):
        table.add_row(row.name, str(row.value), row.meaning)
    return table


def kernels_table(outcome: Outcome) -> Table:
    table = Table(title="Kernels (fusion groups)", box=box.SIMPLE_HEAD, title_justify="left")
    table.add_column("kernel", no_wrap=True)
    table.add_column("statements")
    table.add_column("loops (outermost first)")
    for group in report.groups(outcome.program):
        table.add_row(group["name"], ", ".join(group["statements"]),
                      ", ".join(group["loops"]) or "(none)")
    return table


def placement_table(outcome: Outcome) -> Table:
    """Per kernel and tensor: the innermost memory, and the tile held in each memory."""
    table = Table(title="Placement", box=box.SIMPLE_HEAD, title_justify="left")
    table.add_column("kernel/tensor", no_wrap=True)
    table.add_column("innermost", no_wrap=True)
    table.add_column("tiles")
    tiles: dict[str, list[str]] = {}
    for buf in report.buffers(outcome.program):
        shape = "x".join(str(n) for n in buf["shape"])
        partial = " partials" if buf["partials"] else ""
        tiles.setdefault(f"{buf['kernel']}/{buf['tensor']}", []).append(
            f"{buf['memory']} {buf['dtype']}[{shape}]{partial}")
    for key, memory in report.placements(outcome).items():
        table.add_row(key, memory, ", ".join(tiles.get(key, [])))
    return table


def cost_table(outcome: Outcome) -> Table:
    table = Table(title="Modelled cost", box=box.SIMPLE_HEAD, title_justify="left")
    table.add_column("part", no_wrap=True)
    table.add_column("time", justify="right", no_wrap=True)
    table.add_column("share", justify="right", no_wrap=True)
    parts = report.cost_parts(outcome.cost or {})
    total = sum(p.ps for p in parts)
    for part in parts:
        label = f"transfer {part.name}" if part.is_transfer else part.name
        share = f"{part.ps / total:.1%}" if total else "-"
        table.add_row(label, format_seconds(part.seconds), share)
    table.add_section()
    table.add_row("total", format_seconds(total / report.PS_PER_S), "100.0%" if total else "-")
    return table


def _binding_cell(status: GroupStatus | None, objective: int | None) -> str:
    if status is None or status.group in user.UNDROPPABLE:
        return "-"  # not droppable, so not re-solved
    if status.binding is None:
        return "?" if status.status_without is not None else "-"
    if not status.binding or status.objective_without is None:
        return "no"
    without = format_seconds(status.objective_without / report.PS_PER_S)
    change = f" ({status.objective_without / objective - 1:+.1%})" if objective else ""
    return f"yes: {without}{change}"


def groups_table(outcome: Outcome) -> Table:
    """The named constraint groups at the optimum: tight (an inequality holds with
    equality) and binding (the objective improves without the group)."""
    table = Table(title="Constraint groups at the optimum", box=box.SIMPLE_HEAD,
                  title_justify="left")
    rows = [(status.group, str(status.info.count), "yes" if status.tight else "no",
             _binding_cell(status, outcome.result.objective), status.info.meanings[0])
            for status in outcome.group_status or []]
    table.add_column("group", no_wrap=True)
    table.add_column("n", justify="right", no_wrap=True)
    table.add_column("tight", no_wrap=True)
    table.add_column("binding: objective without", no_wrap=True)
    table.add_column("meaning (first of the group)")
    for row in rows:
        table.add_row(*row)
    return table


def proof_lines(outcome: Outcome) -> str:
    """The z3 proof of bounds and capacities, or the refuted obligations with their
    counterexamples."""
    proof = outcome.proof
    if proof is None:
        return "symbolic verification (z3): not run"
    took = format_seconds(outcome.timings.get("prove", 0.0))
    solved = ", ".join(f"{name}={value}" for name, value in proof.solved.items())
    note = (f"\n  solved at {solved}, the largest admissible "
            f"{'value' if len(proof.solved) == 1 else 'values'}: the tiles stay fixed "
            f"across the range, only the host loops' counts adapt" if proof.sizes else "")
    if proof.proved and not proof.sizes:
        return (f"symbolic verification (z3): proved {proof.checks} obligations (every access "
                f"in bounds, every memory within capacity) ({took})")
    if proof.proved:
        return f"symbolic verification (z3): {proof} ({took}){note}"
    return f"symbolic verification (z3): {proof}{note}"


def smallest_line(outcome: Outcome) -> str | None:
    """With a size range: the same loop nest run against NumPy at the smallest sizes."""
    run = outcome.smallest
    if run is None:
        return None
    v = run.validation
    at = ", ".join(f"{k}={n}" for k, n in run.sizes.items())
    verdict = "passed" if v.passed else "FAILED"
    return (f"validation against NumPy at {at} (the smallest admissible, same tiles): "
            f"{verdict}, max abs err {format_error(v.max_abs_err)}, max rel err "
            f"{format_error(v.max_rel_err)}{bound_note(v.per_output)} "
            f"({format_seconds(v.wall_s)})")


def validation_line(outcome: Outcome) -> str:
    v = outcome.validation
    if v is None:
        return "validation: skipped (--no-validate)"
    verdict = "passed" if v.passed else "FAILED"
    failing = [name for name, o in v.per_output.items() if not o.get("passed", True)]
    where = f" (outputs {', '.join(failing)})" if failing else ""
    at = ""
    if v.sizes is not None:
        changed = ", ".join(f"{k}={n}" for k, n in v.sizes.items()
                            if n != outcome.workload.sizes.get(k))
        full = shrink.points(outcome.workload)
        at = (f" at {changed} (the same schedule with fewer loop steps: the workload has "
              f"{_count(full)} iteration points, over the {_count(shrink.MAX_POINTS)} run "
              f"in full)")
    return (f"validation against NumPy{at}: {verdict}{where}, max abs err "
            f"{format_error(v.max_abs_err)}, max rel err {format_error(v.max_rel_err)}"
            f"{bound_note(v.per_output)} ({format_seconds(v.wall_s)})")


def _count(n: int) -> str:
    """4.5e11."""
    mantissa, _, exponent = f"{n:.2g}".partition("e")
    return f"{mantissa}e{int(exponent)}" if exponent else mantissa


def bound_note(per_output: Mapping[str, Mapping[str, Any]]) -> str:
    """How much of the float32 error bound the outputs used (`synth.errorbound`), and how
    many elements could not be checked (an infinite bound)."""
    used = [o["tolerance_used"] for o in per_output.values()
            if 0 < o.get("tolerance_used", 0) < math.inf]
    unchecked = sum(o.get("unchecked", 0) for o in per_output.values())
    note = f", {max(used):.0%} of the error bound" if used else ""
    if unchecked:
        note += f", {unchecked} elements unchecked (their error bound is infinite)"
    return note


def no_schedule_message(outcome: Outcome, time_limit_s: float) -> str | None:
    status = outcome.result.status
    if status is Status.INFEASIBLE:
        return report.infeasible_message(outcome)
    if status is Status.TIMEOUT and "failure" in outcome.result.stats:
        return str(outcome.result.stats["failure"])  # a heuristic's dead end, not the clock
    if status is Status.TIMEOUT:
        return timeout_message(outcome.result.wall_s, time_limit_s, outcome.result.stats)
    return None


STOPPED_EARLY = 0.9
"""A solve that ends before this share of its time limit stopped for another reason."""
BARE_TIMEOUTS = frozenset({"timeout", "canceled"})
"""z3's reasons for an unknown answer that only say the time ran out."""


def timeout_message(spent_s: float, time_limit_s: float, stats: Mapping[str, Any]) -> str:
    """No schedule and no proof that none exists: the time actually spent, and whether the
    solver used its time limit or gave up before it (with its reason when it gave one)."""
    spent = format_seconds(spent_s)
    reason = next((stats[key] for key in WHY_NO_SCHEDULE if stats.get(key)), None)
    if spent_s >= STOPPED_EARLY * time_limit_s:
        # z3's "timeout" or "canceled" say no more than the line does; its other reasons do
        why = f" ({reason})" if reason and reason not in BARE_TIMEOUTS else ""
        return (f"no schedule found in {spent} (time limit {time_limit_s:g} s){why}; raise "
                f"--time-limit or make the problem smaller with --set NAME=INT")
    why = f" ({reason})" if reason else ""
    return (f"no schedule found: the solver gave up after {spent}, before its time limit "
            f"of {time_limit_s:g} s{why}; try another --solver or make the problem "
            f"smaller with --set NAME=INT")


def print_human(outcome: Outcome, request: Request, total_s: float) -> None:
    console = make_console()
    console.print(header_line(outcome, total_s), markup=False, soft_wrap=True)
    message = no_schedule_message(outcome, request.time_limit_s)
    if message is not None or outcome.program is None:
        console.print(message or "no schedule", markup=False, soft_wrap=True)
        return
    for table in (variables_table(outcome), kernels_table(outcome), placement_table(outcome)):
        console.print()
        console.print(table)
    console.print()
    console.print("Loop nest", markup=False)
    # soft_wrap: long lines stay whole (no rewrapping) so the nest keeps its indentation
    console.print(print_program(outcome.program), markup=False, soft_wrap=True)
    console.print()
    console.print(cost_table(outcome))
    if outcome.group_status is not None:
        console.print(groups_table(outcome))
    console.print(proof_lines(outcome), markup=False, soft_wrap=True)
    console.print(validation_line(outcome), markup=False, soft_wrap=True)
    smallest = smallest_line(outcome)
    if smallest is not None:
        console.print(smallest, markup=False, soft_wrap=True)
    if outcome.emitted is not None:
        console.print(outcome.emitted.lines(), markup=False, soft_wrap=True)
    if outcome.measured is not None:
        console.print()
        console.print(measured_table(outcome.measured))
        console.print(measured_line(outcome.measured), markup=False, soft_wrap=True)


def measured_table(measured: Measured) -> Table:
    """--measure: each schedule's modelled and measured time, best modelled first."""
    table = Table(title=f"Measured: the {len(measured.schedules)} best schedules under the "
                        f"model, as C on this machine", box=box.SIMPLE_HEAD,
                  title_justify="left")
    for title in ("rank", "schedule", "modelled", "measured", "vs fastest", "check"):
        table.add_column(title, justify="left" if title in ("schedule", "check") else "right",
                         no_wrap=True)
    ran = [s.measured_s for s in measured.schedules if s.measured_s is not None]
    fastest = min(ran) if ran else None
    for s in measured.schedules:
        mark = " (chosen)" if s.rank == measured.chosen else ""
        versus = ("-" if s.measured_s is None or not fastest
                  else f"{s.measured_s / fastest:.2f}x")
        table.add_row(str(s.rank), s.source + mark, format_seconds(s.modelled_s),
                      format_seconds(s.measured_s) if s.measured_s is not None else "-",
                      versus, "passed" if s.passed else "FAILED")
    return table


def measured_line(measured: Measured) -> str:
    rho = spearman_text(measured)
    line = (f"Spearman (modelled vs measured, {len(measured.schedules)} schedules): {rho}; ")
    if measured.chosen is None:
        line += "no schedule ran; the model's optimum is kept"
    elif measured.chosen == 1:
        line += "the best schedule under the model is also the fastest measured"
    else:
        best = measured.schedule(measured.chosen)
        top = measured.schedule(1)
        faster = ("" if top.measured_s is None or best.measured_s is None else
                  f", {top.measured_s / best.measured_s:.2f}x faster than rank 1")
        line += f"the result is rank {measured.chosen}, the fastest measured{faster}"
    failed = [str(s.rank) for s in measured.schedules if not s.passed]
    if failed:
        line += f"; FAILED the check: rank {', '.join(failed)}"
    busy = " (wall-clock times: the machine was busy)" if measured.load >= 0.5 else ""
    return line + f"; {measured.seconds:.1f} s, load average {measured.load:.2f}{busy}"


def spearman_text(measured: Measured) -> str:
    """The rank correlation, or why there is none: fewer than two schedules ran, or
    every one was priced the same (the next best often tie with the optimum: the
    transformer's 8 on Zen 3) or ran in the same time."""
    if measured.spearman is not None:
        return f"{measured.spearman:.2f}"
    ran = [s for s in measured.schedules if s.measured_s is not None]
    if len(ran) < 2:
        return "n/a (fewer than two ran)"
    if len({s.modelled_ps for s in ran}) == 1:
        return "n/a (the model prices them all the same)"
    return "n/a (they all ran in the same time)"


def print_json(outcome: Outcome, total_s: float) -> None:
    """Exactly one JSON object on stdout; strict JSON (no NaN/Infinity literals).
    `wall_s` is the whole run's time (`timings` has each stage's)."""
    data = {**report.to_json(outcome), "wall_s": total_s}
    sys.stdout.write(json.dumps(data, indent=2, allow_nan=False) + "\n")



# ---------------------------------------------------------------- --show-constraints


def show_constraints_of(request: Request, as_json: bool) -> int:
    """`--show-constraints`: the model's named groups (after --constraint, --fix and
    --drop), the variables and the hardware parameters expressions may use; no solve."""
    workload = pipeline.parse(request)
    dependence = pipeline.dependence(request, workload) if request.ranges else None
    model: Model = pipeline.encode(workload, pipeline.hardware(request), request.constraints,
                                   request.fixes, request.drops, dependence=dependence)
    cset = model.constraints
    infos = group_infos(cset)
    variables = {name: (list(cset.decisions[name]) if name in cset.decisions else "defined")
                 for name in user.variable_names(cset)}
    params = user.hardware_parameters(model.hw)
    if as_json:
        data = {"workload": model.workload.name, "hardware": model.hw.name,
                "constraint_groups": [{"group": i.group, "count": i.count,
                                       "meanings": list(i.meanings)} for i in infos],
                "variables": variables, "hardware_parameters": params}
        sys.stdout.write(json.dumps(report.jsonable(data), indent=2) + "\n")
        return EXIT_OK
    console = make_console()
    table = Table(title=f"Constraint groups of {model.workload.name} on {model.hw.name}",
                  box=box.SIMPLE_HEAD, title_justify="left")
    table.add_column("group", no_wrap=True)
    table.add_column("n", justify="right", no_wrap=True)
    table.add_column("meaning")
    for info in infos:
        note = " (redundant; never dropped)" if info.group == "implied" else \
            " (cannot be dropped)" if info.group in user.UNDROPPABLE else ""
        table.add_row(info.group, str(info.count), info.summary(3) + note)
    console.print(table)
    console.print("Variables for --constraint and --fix: " + ", ".join(variables),
                  markup=False, soft_wrap=True)
    console.print("Hardware parameters for --constraint: "
                  + ", ".join(f"{k}={v}" for k, v in params.items()),
                  markup=False, soft_wrap=True)
    return EXIT_OK



# ---------------------------------------------------------------- synth list


def workload_summary(name: str) -> str:
    """A one-phrase description of a built-in workload from its leading comment block.

    Built-ins open with `# name: phrase (source): details...`; the phrase before the
    first ': ' is what a listing needs, the rest stays in the file."""
    text = (resources.files("synth") / "workloads" / f"{name}.syn").read_text(encoding="utf-8")
    lines: list[str] = []
    for raw in text.splitlines():
        stripped = raw.strip()
        if not stripped.startswith("#") or stripped == "#":
            break
        lines.append(stripped.lstrip("#").strip())
    summary = " ".join(lines).removeprefix(f"{name}:").strip()
    head, sep, _ = summary.partition(": ")
    return head if sep else summary.partition(". ")[0]


def workloads_table() -> Table:
    table = Table(title="Built-in workloads", box=box.SIMPLE_HEAD, title_justify="left")
    table.add_column("name", no_wrap=True)
    table.add_column("sizes")
    table.add_column("stmts", justify="right", no_wrap=True)
    table.add_column("description")
    for name in list_builtin_workloads():
        try:
            wl = load_workload(name)
            sizes = " ".join(f"{k}={v}" for k, v in wl.sizes.items())
            count = str(len(wl.statements))
        except SynthError as exc:  # a broken built-in should not hide the others
            sizes, count = f"error: {exc}", "-"
        table.add_row(name, sizes, count, workload_summary(name))
    return table


def hardware_description(name: str) -> str:
    """The model's `description`, read from its TOML (the Hardware data does not keep it)."""
    path = resources.files("synth") / "hardware" / f"{name}.toml"
    tree = tomllib.loads(path.read_text(encoding="utf-8"))
    return str(tree.get("description", ""))


def hardware_table() -> Table:
    table = Table(title="Built-in hardware models", box=box.SIMPLE_HEAD, title_justify="left")
    table.add_column("name", no_wrap=True)
    table.add_column("counts", no_wrap=True)
    table.add_column("memories", no_wrap=True)
    table.add_column("description")
    for name in list_builtin_hardware():
        try:
            hw = load_hardware(name)
            counts = ", ".join(f"{lv.symbol} {lv.count_min}..{lv.count_max}"
                               for lv in hw.levels if lv.symbol is not None)
            memories = " > ".join(m.name for m in hw.memories)
        except SynthError as exc:
            counts, memories = f"error: {exc}", "-"
        table.add_row(name, counts, memories, hardware_description(name))
    return table




def print_list() -> None:
    """`synth list`: the built-ins, and where the formats of one's own are described."""
    console = make_console()
    console.print(workloads_table())
    console.print(hardware_table())
    console.print("Write your own: " + "; ".join(f"{what}: {path}" for what, path in
                                                  DOCS.items())
                  + " (in synth's source tree).", markup=False, soft_wrap=True)


# ---------------------------------------------------------------- synth calibrate


def print_calibration(cal: Calibration, out: str) -> None:
    """`synth calibrate`: what was measured, and where the model went."""
    from synth.calibrate import LEVELS

    console = make_console()
    table = Table(title=f"Calibrated on {cal.cpu} ({cal.when}, load average "
                        f"{cal.load[0]:.2f}, {cal.seconds:.1f} s, best of {cal.passes} "
                        f"pass(es))",
                  box=box.SIMPLE_HEAD, title_justify="left")
    table.add_column("measured", no_wrap=True)
    table.add_column("value", justify="right", no_wrap=True)
    rows = [("clock", f"{cal.clock_hz / 1e9:.3f} GHz"),
            ("vector width", f"{cal.vector_bytes} B ({cal.vector_bytes // 4} f32 lanes)"),
            *((f"f32 {op}", f"{cycles:.2f} cycles/vector") for op, cycles in
              cal.cycles.items()),
            *((f"f32 {op} latency", f"{cycles:.2f} cycles") for op, cycles in
              cal.latency_cycles.items()),
            (f"fold of {cal.vector_bytes // 4} f32 lanes after exps",
             f"{cal.fold_cycles:.2f} cycles"),
            ("f32 gather (lanes on separate L1 lines)", f"{cal.gather_cycles:.2f} cycles/vector"),
            ("f32 gathers back to back", f"{cal.grouped_gather_cycles:.2f} cycles/vector"),
            ("f32 broadcasting load (from L1)", f"{cal.broadcast_cycles:.2f} cycles"),
            ("GEMM tile loop (8 broadcasts, 1 load, 8 FMAs)",
             f"{cal.microkernel_cycles:.2f} cycles"),
            *((f"{level} read", f"{cal.bandwidth[level]:.2f} B/cycle, "
               f"{cal.latency[level]:.0f} cycles latency") for level in LEVELS),
            ("L3 one core keeps", "all it has" if cal.l3_kept is None
             else f"{cal.l3_kept >> 20} MiB"),
            ("OpenMP region", f"{cal.region_s * 1e9:.0f} ns start+join"),
            ("OpenMP barrier", f"{cal.barrier_s * 1e9:.0f} ns"),
            ("usable cores", f"{cal.usable_cores} of {cal.cpus}")]
    for name, value in rows:
        table.add_row(name, value)
    console.print(table)
    for note in cal.notes:
        console.print(f"warning: {note}", markup=False, soft_wrap=True)
    console.print(f"wrote {out}: use it with --hw {out}", markup=False, soft_wrap=True)
