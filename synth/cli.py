"""The `synth` command line: `synth solve`, `synth tune` and `synth list` (DESIGN.md section 8).

The CLI only parses arguments, runs `synth.pipeline.run` and renders the outcome; the
report's content comes from `synth.report`, so the human output and `--json` agree.

Exit codes are part of the interface and decided in one place (`outcome_exit_code` and
`guarded`): 0 solved (and validated unless --no-validate), 1 infeasible, 2 bad input,
3 no solution within the time limit, 4 validation failed or a broken loop nest (IRError),
70 an internal error (a bug: rerun with SYNTH_DEBUG=1 for the traceback).
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
import tomllib
from collections.abc import Callable, Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Annotated, Any

import typer
from rich import box
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from synth import pipeline, report, tune
from synth.constraints import user
from synth.constraints.cost import Model
from synth.constraints.explain import GroupStatus, group_infos
from synth.constraints.result import Status
from synth.emit.mlir_check import MlirCheck
from synth.errors import InputError, SynthError
from synth.hwfile import list_builtin_hardware, load_hardware
from synth.ir.printer import print_program
from synth.lang import SizeRange, list_builtin_workloads, load_workload
from synth.limits import MAX_SIZE, MAX_TIME_LIMIT_S, check_int, is_int, parse_int, to_int
from synth.pipeline import EMITTERS, SOLVERS, Emitted, Outcome, Request, check_emit, run

EXIT_OK = 0
EXIT_INFEASIBLE = 1
EXIT_TIMEOUT = 3
EXIT_VALIDATION = 4
EXIT_INTERNAL = 70  # EX_SOFTWARE of sysexits.h: a bug in synth, not in the input

DEBUG_ENV = "SYNTH_DEBUG"

app = typer.Typer(
    name="synth",
    help="Synthesise the best schedule of a tensor workload on a hardware model.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


# ---------------------------------------------------------------- argument parsing


_SIZE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def parse_size_setting(text: str) -> tuple[str, int]:
    """`N=4096` -> ("N", 4096). Checked here, before any work, so that a typo is reported
    as the argument the user wrote rather than as a later, vaguer failure."""
    name, sep, value = text.partition("=")
    name, value = name.strip(), value.strip()
    if not sep or not _SIZE_NAME.match(name):
        raise InputError(f"--set {text}: expected NAME=INT, e.g. --set N=4096")
    if not is_int(value) or to_int(value) <= 0:
        raise InputError(f"--set {text}: size '{name}' must be a positive integer (digits "
                         f"0-9), got {value!r}")
    return name, parse_int(value, f"--set {name}", 1, MAX_SIZE)


_RANGE = re.compile(r"^(?P<lo>[^.:]*)\.\.(?P<hi>[^.:]*)(?::(?P<step>.*))?$")
_INT = re.compile(r"^-?[0-9]+$")
RANGE_EXAMPLE = "N=1024..65536:1024"


def parse_size_option(text: str) -> tuple[str, int | SizeRange]:
    """`N=4096` -> ("N", 4096); `N=1024..65536:1024` -> ("N", SizeRange(1024, 65536,
    1024)): the admissible values LO, LO+STEP, ... up to HI (STEP defaults to 1)."""
    name, sep, value = text.partition("=")
    name, value = name.strip(), value.strip()
    if ".." not in value:
        return parse_size_setting(text)
    if not sep or not _SIZE_NAME.match(name):
        raise InputError(f"--set {text}: expected NAME=INT or NAME=LO..HI[:STEP], e.g. "
                         f"--set {RANGE_EXAMPLE}")
    match = _RANGE.match(value)
    parts = [match.group(k) for k in ("lo", "hi", "step")] if match else []
    if not parts or any(p is not None and not _INT.match(p.strip()) for p in parts):
        raise InputError(f"--set {text}: expected a range LO..HI or LO..HI:STEP of "
                         f"integers, e.g. --set {RANGE_EXAMPLE}")
    lo, hi = to_int(parts[0]), to_int(parts[1])
    step = to_int(parts[2]) if parts[2] is not None else 1
    for what, bound in (("LO", lo), ("HI", hi)):
        if bound <= 0:
            raise InputError(f"--set {text}: size '{name}' must be positive, got {what} "
                             f"{bound}")
    if step <= 0:
        raise InputError(f"--set {text}: STEP must be a positive integer, got {step}")
    if lo > hi:
        raise InputError(f"--set {text}: empty range, LO {lo} > HI {hi}")
    check_int(hi, f"--set {name} (HI)", 1, MAX_SIZE)
    return name, SizeRange(lo, hi, check_int(step, f"--set {name} (STEP)", 1, MAX_SIZE))


def parse_size_options(texts: Sequence[str]) -> tuple[dict[str, int], dict[str, SizeRange]]:
    """`synth solve --set`: plain sizes, and sizes given as ranges."""
    sizes: dict[str, int] = {}
    ranges: dict[str, SizeRange] = {}
    given: dict[str, str] = {}
    for text in texts:
        name, value = parse_size_option(text)
        if name in given:
            raise InputError(f"--set {name} given twice ({given[name]} and {text.strip()})")
        given[name] = text.strip()
        if isinstance(value, SizeRange):
            ranges[name] = value
        else:
            sizes[name] = value
    return sizes, ranges


def parse_size_settings(texts: Sequence[str]) -> dict[str, int]:
    """`synth tune --set`: plain sizes only (a tune reports no proof, so a range would
    go unchecked there)."""
    sizes: dict[str, int] = {}
    for text in texts:
        if ".." in text.partition("=")[2]:
            name = text.partition("=")[0].strip()
            raise InputError(f"--set {text}: a size range is for synth solve, whose z3 "
                             f"proof covers every admissible value; synth tune takes "
                             f"NAME=INT (vary a size with --vary set:{name}=V1,V2,...)")
        name, value = parse_size_setting(text)
        if name in sizes:
            raise InputError(f"--set {name} given twice ({name}={sizes[name]} and "
                             f"{name}={value})")
        sizes[name] = value
    return sizes


def check_solver(solver: str) -> str:
    if solver not in SOLVERS:
        raise InputError(f"unknown solver {solver!r}; expected one of {', '.join(SOLVERS)}")
    return solver


def check_time_limit(seconds: float) -> float:
    if not 0 < seconds <= MAX_TIME_LIMIT_S:  # also rejects NaN and infinity
        raise InputError(f"--time-limit {seconds}: expected a positive number of seconds, "
                         f"at most {MAX_TIME_LIMIT_S:.0f}")
    return seconds


# ---------------------------------------------------------------- errors and exit codes


def debugging() -> bool:
    return os.environ.get(DEBUG_ENV, "") not in ("", "0")


def guarded(action: Callable[[], int]) -> int:
    """Run `action`, turning every exception into a message on stderr and an exit code.

    A `SynthError` is the user's problem and carries its own exit code; anything else is
    synth's bug, reported in one line with a hint, and re-raised under SYNTH_DEBUG=1 so a
    developer gets the traceback."""
    try:
        return action()
    except SynthError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except Exception as exc:
        if debugging():
            raise
        print(f"internal error: {type(exc).__name__}: {exc}", file=sys.stderr)
        print(f"this is a bug in synth; rerun with {DEBUG_ENV}=1 for the traceback",
              file=sys.stderr)
        return EXIT_INTERNAL


def outcome_exit_code(outcome: Outcome) -> int:
    status = outcome.result.status
    if status is Status.INFEASIBLE:
        return EXIT_INFEASIBLE
    if status is Status.TIMEOUT:
        return EXIT_TIMEOUT
    if outcome.validation is not None and not outcome.validation.passed:
        return EXIT_VALIDATION
    if outcome.proof is not None and not outcome.proof.proved:
        return EXIT_VALIDATION  # a schedule synth made that is not safe: a bug, reported
    if outcome.smallest is not None and not outcome.smallest.validation.passed:
        return EXIT_VALIDATION  # the same nest, run at the smallest sizes of a range
    emitted = outcome.emitted
    if emitted is not None and emitted.check is not None and not emitted.check.passed:
        return EXIT_VALIDATION  # the emitted program did not build, or ran wrong
    return EXIT_OK


# ---------------------------------------------------------------- human output


def make_console() -> Console:
    """A console on the current stdout, built per call (test runners swap stdout).

    Rich drops colour and styles by itself when stdout is not a terminal or NO_COLOR is
    set; highlighting is off so numbers in messages are not coloured at random."""
    return Console(highlight=False)


def format_seconds(seconds: float) -> str:
    """A duration with a unit that keeps 3-4 significant digits readable."""
    if seconds == 0:
        return "0 s"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6), ("ns", 1e-9)):
        if abs(seconds) >= scale:
            return f"{seconds / scale:.4g} {unit}"
    return f"{seconds / 1e-12:.4g} ps"


def format_error(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def header_line(outcome: Outcome) -> str:
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
            f"{format_error(v.max_rel_err)} ({format_seconds(v.wall_s)})")


def validation_line(outcome: Outcome) -> str:
    v = outcome.validation
    if v is None:
        return "validation: skipped (--no-validate)"
    verdict = "passed" if v.passed else "FAILED"
    failing = [name for name, o in v.per_output.items() if not o.get("passed", True)]
    where = f" (outputs {', '.join(failing)})" if failing else ""
    return (f"validation against NumPy: {verdict}{where}, max abs err "
            f"{format_error(v.max_abs_err)}, max rel err {format_error(v.max_rel_err)}"
            f"{bound_note(v.per_output)} ({format_seconds(v.wall_s)})")


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
        return (f"no schedule found within the time limit of {time_limit_s:g} s; "
                f"raise --time-limit or make the problem smaller with --set NAME=INT")
    return None


def print_human(outcome: Outcome, request: Request) -> None:
    console = make_console()
    console.print(header_line(outcome), markup=False, soft_wrap=True)
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
        console.print(emitted_lines(outcome.emitted), markup=False, soft_wrap=True)


def emitted_lines(emitted: Emitted) -> str:
    """Where the source went, and how its build-and-run check against the reference went
    (the end of the log when it failed)."""
    if emitted.target == "mlir":
        return mlir_lines(emitted)
    sources = [f for f in emitted.files if f.endswith(".c") and "/" not in f
               and not f.startswith("standin_")]
    head = f"emitted {emitted.target} C to {emitted.path}: {', '.join(sources)}, Makefile"
    check = emitted.check
    if check is None:
        return head + " (not checked: --no-validate)"
    verdict = "passed" if check.passed else "FAILED"
    lines = [head, f"make check (stand-in runtime, reference data): {verdict} "
                   f"({check.seconds:.2f} s)"]
    if not check.passed:
        lines += check.log.strip().splitlines()[-15:]
    return "\n".join(lines)


def mlir_lines(emitted: Emitted) -> str:
    """The MLIR files, and how far upstream MLIR got with them: verified, transformed,
    run against the reference (MLIR's diagnostics when a step failed)."""
    sources = [f for f in emitted.files if f.endswith(".mlir")]
    head = f"emitted MLIR to {emitted.path}: {', '.join(sources)}"
    check = emitted.check
    if not isinstance(check, MlirCheck):
        return head + " (not checked: --no-validate)"
    steps = [f"schedule.mlir {'verified' if check.verified else 'does NOT verify'}",
             f"transform.mlir {'applied' if check.transform_applied else 'NOT applied'}",
             f"both {'ran' if check.executed else 'did NOT run'}"]
    error = ("" if check.max_abs_err is None
             else f", max abs err {format_error(check.max_abs_err)}")
    verdict = "passed" if check.passed else "FAILED"
    lines = [head, f"MLIR check (upstream MLIR via torch-mlir, reference data): {verdict}: "
                   f"{', '.join(steps)}{error} ({check.seconds:.2f} s)"]
    if not check.passed:
        lines += check.log.strip().splitlines()[-25:]
    return "\n".join(lines)


def print_json(outcome: Outcome) -> None:
    """Exactly one JSON object on stdout; strict JSON (no NaN/Infinity literals)."""
    sys.stdout.write(json.dumps(report.to_json(outcome), indent=2, allow_nan=False) + "\n")


# ---------------------------------------------------------------- commands


def show_constraints_of(request: Request, as_json: bool) -> int:
    """`--show-constraints`: the model's named groups (after --constraint, --fix and
    --drop), the variables and the hardware parameters expressions may use; no solve."""
    model: Model = pipeline.encode(pipeline.parse(request), pipeline.hardware(request),
                                   request.constraints, request.fixes, request.drops)
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


def solve_request(request: Request, as_json: bool) -> int:
    outcome = run(request)
    if as_json:
        print_json(outcome)
    else:
        print_human(outcome, request)
    return outcome_exit_code(outcome)


@app.command()
def solve(
    workload: Annotated[str, typer.Argument(
        metavar="WORKLOAD", help="A built-in workload name (see `synth list`) or a .syn file.")],
    hw: Annotated[str, typer.Option(
        "--hw", help="A built-in hardware model name or a .toml file.")],
    sizes: Annotated[list[str] | None, typer.Option(
        "--set", metavar="NAME=INT|LO..HI[:STEP]",
        help="Override a problem size (repeatable). A range LO..HI[:STEP] solves at its "
             "largest value and proves the schedule for every value.")] = None,
    hw_set: Annotated[list[str] | None, typer.Option(
        "--hw-set", metavar="KEY=VALUE",
        help="Override a hardware parameter, e.g. wram.capacity=32KiB (repeatable).")] = None,
    solver: Annotated[str, typer.Option(
        help=f"Solver backend: {' | '.join(SOLVERS)}.")] = "cpsat",
    time_limit: Annotated[float, typer.Option(
        "--time-limit", metavar="SEC", help="Solver time limit in seconds.")] = 30.0,
    as_json: Annotated[bool, typer.Option(
        "--json", help="Print one JSON report object to stdout and nothing else.")] = False,
    no_validate: Annotated[bool, typer.Option(
        "--no-validate", help="Skip running the loop nest against NumPy.")] = False,
    no_binding: Annotated[bool, typer.Option(
        "--no-binding",
        help="Skip finding the binding constraint groups (one re-solve per group; most "
             "of the run time on large workloads).")] = False,
    constraint: Annotated[list[str] | None, typer.Option(
        "--constraint", metavar="EXPR",
        help='Add a constraint over variables and hardware parameters, e.g. "T >= 11" or '
             '"R*D <= 256" (repeatable; groups user.1, user.2, ...).')] = None,
    fix: Annotated[list[str] | None, typer.Option(
        "--fix", metavar="VAR=INT",
        help="Fix a variable, e.g. T=16 (repeatable; group user.fix.VAR).")] = None,
    drop: Annotated[list[str] | None, typer.Option(
        "--drop", metavar="GROUP",
        help="Drop a constraint group, or all groups under a prefix (capacity drops "
             "capacity.*), for what-if studies (repeatable).")] = None,
    show_constraints: Annotated[bool, typer.Option(
        "--show-constraints",
        help="List the constraint groups, variables and hardware parameters, then exit "
             "without solving.")] = False,
    emit: Annotated[str | None, typer.Option(
        "--emit", metavar="TARGET",
        help=f"Write the schedule as a program for TARGET ({', '.join(EMITTERS)}) into "
             f"--out DIR, then build and run it against the reference (unless "
             f"--no-validate).")] = None,
    out: Annotated[str | None, typer.Option(
        "--out", metavar="DIR", help="Directory for --emit.")] = None,
) -> None:
    """Find the best schedule of WORKLOAD on the hardware model, print it and check it.

    Exit codes: 0 solved, 1 infeasible, 2 bad input, 3 time limit, 4 validation failed.
    """
    def action() -> int:
        fixed, ranges = parse_size_options(sizes or [])
        request = Request(workload, hw, fixed, tuple(hw_set or []),
                          check_solver(solver), check_time_limit(time_limit),
                          validate=not no_validate, constraints=tuple(constraint or []),
                          fixes=tuple(fix or []), drops=tuple(drop or []),
                          binding=not no_binding, ranges=ranges, emit=emit, out_dir=out)
        if show_constraints:
            return show_constraints_of(request, as_json)
        check_emit(request)  # before solving: a typo should not cost a solve
        return solve_request(request, as_json)

    raise typer.Exit(guarded(action))


# ---------------------------------------------------------------- synth tune


def tune_table(base: Request, axes: Sequence[tune.Axis],
               results: Sequence[tune.VariantResult]) -> Table:
    """One row per variant: its settings, status, modelled cost (and how far from the
    best variant), solve time, and the binding groups (infeasible: the conflicting ones)."""
    first = next((r.outcome for r in results if r.outcome is not None), None)
    name = first.workload.name if first else base.workload
    hw = first.hardware.name if first else base.hardware
    table = Table(title=f"Variants of {name} on {hw}", box=box.SIMPLE_HEAD,
                  title_justify="left", collapse_padding=True, pad_edge=False)
    table.add_column("#", justify="right", no_wrap=True)
    for axis in axes:
        table.add_column(axis.label, justify="right", overflow="fold")
    table.add_column("status", no_wrap=True)
    table.add_column("cost", justify="right", no_wrap=True)
    table.add_column("vs best", justify="right", no_wrap=True)
    table.add_column("solve", justify="right", no_wrap=True)
    validating = any(r.outcome is not None and r.outcome.validation is not None
                     for r in results)
    if validating:
        table.add_column("valid", no_wrap=True)
    table.add_column("binding groups", overflow="fold")
    best = tune.best_cost(results)
    for result in results:
        outcome = result.outcome
        cost = tune.cost_ps(result)
        cells = [str(result.variant.index), *(value for _, value in result.variant.settings),
                 tune.status(result),
                 format_seconds(cost / report.PS_PER_S) if cost is not None else "-",
                 f"{cost / best - 1:+.1%}" if cost is not None and best else "-",
                 format_seconds(outcome.result.wall_s) if outcome else "-"]
        if validating:
            validation = outcome.validation if outcome else None
            cells.append("-" if validation is None else "yes" if validation.passed else "NO")
        binding, conflict = tune.binding_groups(result), tune.conflict_groups(result)
        if result.error is not None:
            cells.append(f"error: {result.error}")
        elif conflict is not None:
            cells.append("conflict: " + (", ".join(conflict) or "(every candidate)"))
        elif binding is not None:
            cells.append(", ".join(binding) or "none")
        else:
            cells.append("-")
        table.add_row(*cells)
    return table


def run_tune(base: Request, vary: Sequence[str], as_json: bool, csv_path: Path | None) -> int:
    axes = tune.parse_axes(vary, base)
    variants = tune.make_variants(base, axes)  # bad input stops here, before any solve
    # the bar goes where it cannot corrupt the output: stdout for the table, stderr for
    # --json; and only to a terminal (Progress is transient: the table replaces it)
    console = Console(stderr=True) if as_json else make_console()
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console, transient=True,
                  disable=not console.is_terminal) as progress:
        task = progress.add_task("tuning", total=len(variants))

        def done(result: tune.VariantResult) -> None:
            progress.update(task, advance=1, description=f"tuning ({result.variant.describe()}"
                            f": {tune.status(result)})")

        results = tune.run_all(variants, done)
    if csv_path is not None:
        tune.write_csv(csv_path, axes, results)
    if as_json:
        data = tune.to_json(base, axes, results)
        sys.stdout.write(json.dumps(data, indent=2, allow_nan=False) + "\n")
    else:
        make_console().print(tune_table(base, axes, results))
    return tune.exit_code(results)


@app.command("tune")
def tune_command(
    workload: Annotated[str, typer.Argument(
        metavar="WORKLOAD", help="A built-in workload name (see `synth list`) or a .syn file.")],
    hw: Annotated[str, typer.Option(
        "--hw", help="A built-in hardware model name or a .toml file.")],
    vary: Annotated[list[str] | None, typer.Option(
        "--vary", metavar="KEY=V1,V2,...",
        help="Solve once per value (repeatable; variants are the product of all --vary). "
             "KEY: a hardware key (wram.capacity, hw:KEY) or a variable (T, fix:VAR) "
             "fixed to each value; drop:GROUP with on (dropped) / off (kept); set:NAME, "
             "a problem size.")] = None,
    sizes: Annotated[list[str] | None, typer.Option(
        "--set", metavar="NAME=INT", help="Override a problem size for every variant.")] = None,
    hw_set: Annotated[list[str] | None, typer.Option(
        "--hw-set", metavar="KEY=VALUE",
        help="Override a hardware parameter for every variant.")] = None,
    constraint: Annotated[list[str] | None, typer.Option(
        "--constraint", metavar="EXPR", help="Add a constraint to every variant.")] = None,
    fix: Annotated[list[str] | None, typer.Option(
        "--fix", metavar="VAR=INT", help="Fix a variable in every variant.")] = None,
    drop: Annotated[list[str] | None, typer.Option(
        "--drop", metavar="GROUP", help="Drop a constraint group in every variant.")] = None,
    solver: Annotated[str, typer.Option(
        help=f"Solver backend: {' | '.join(SOLVERS)}.")] = "cpsat",
    time_limit: Annotated[float, typer.Option(
        "--time-limit", metavar="SEC", help="Solver time limit per variant, in seconds.")
    ] = 30.0,
    validate: Annotated[bool, typer.Option(
        "--validate/--no-validate",
        help="Run each variant's loop nest against NumPy (off by default: it costs more "
             "than the solve at large sizes, and the verifier still checks every "
             "schedule).")] = False,
    as_json: Annotated[bool, typer.Option(
        "--json", help="Print one JSON object {workload, hardware, vary, variants} to "
                       "stdout and nothing else.")] = False,
    csv_path: Annotated[Path | None, typer.Option(
        "--csv", metavar="PATH", help="Also write one CSV row per variant to PATH.")] = None,
) -> None:
    """Solve WORKLOAD once per variant of the request and compare the variants.

    Exit codes: 0 every variant ran (whatever its status), 2 bad input (checked before
    any solve); with --validate, 4 when a variant's validation failed.
    """
    def action() -> int:
        base = Request(workload, hw, parse_size_settings(sizes or []), tuple(hw_set or []),
                       check_solver(solver), check_time_limit(time_limit),
                       validate=validate, constraints=tuple(constraint or []),
                       fixes=tuple(fix or []), drops=tuple(drop or []), binding=True)
        return run_tune(base, vary or [], as_json, csv_path)

    raise typer.Exit(guarded(action))


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


@app.command("list")
def list_builtins() -> None:
    """List the built-in workloads and hardware models."""
    def action() -> int:
        console = make_console()
        console.print(workloads_table())
        console.print(hardware_table())
        return EXIT_OK

    raise typer.Exit(guarded(action))


def main() -> None:
    """The `synth` console script."""
    app()


if __name__ == "__main__":
    main()
