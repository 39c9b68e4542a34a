"""The `synth` command line: `synth solve`, `synth tune`, `synth sweep` (`synth.sweep`),
`synth calibrate` (`synth.calibrate`) and `synth list` (README.md, "The command line").

The CLI only parses arguments, runs `synth.pipeline.run` and renders the outcome
(`synth.render`); the report's content comes from `synth.report`, so the human output
and `--json` agree. Everything heavy (the solvers, NumPy, rich, the pipeline) is
imported inside the commands, so that `synth --help` and `synth --version` start fast.

Output goes to stdout; when stdout is not a terminal, lines are not wrapped and carry no
trailing spaces (`make_console`), and a reader that goes away (`| head -1`, a broken
pipe) ends the run quietly with the exit code it had (`delivered`). A live status of the
running stage goes to stderr when stderr is a terminal (`synth.progress`).

Exit codes are part of the interface and decided in one place (`outcome_exit_code` and
`guarded`): 0 solved (and validated unless --no-validate), 1 infeasible, 2 bad input,
3 no solution within the time limit, 4 validation failed or a broken loop nest (IRError),
70 an internal error (a bug: rerun with SYNTH_DEBUG=1 for the traceback).
"""

from __future__ import annotations

import errno
import io
import json
import math
import os
import re
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, TextIO

import typer

from synth.errors import InputError, SynthError
from synth.limits import MAX_SIZE, MAX_TIME_LIMIT_S, check_int, is_int, parse_int, to_int

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from synth import tune
    from synth.lang import SizeRange
    from synth.pipeline import Outcome, Request

STARTED = time.perf_counter()  # the run's start, for the total time the output states

# The names of synth.pipeline's SOLVERS and EMITTERS, without importing the pipeline
# (tests/test_cli.py checks that they agree).
SOLVERS = ("cpsat", "z3", "exhaustive", "greedy")
EMITTERS = ("upmem", "mlir", "c", "ttlang")

EXIT_OK = 0
EXIT_INFEASIBLE = 1
EXIT_TIMEOUT = 3
EXIT_VALIDATION = 4
EXIT_INTERNAL = 70  # EX_SOFTWARE of sysexits.h: a bug in synth, not in the input

DEBUG_ENV = "SYNTH_DEBUG"

app = typer.Typer(
    name="synth",
    help="Synthesise the best schedule of a tensor workload on a hardware model.\n\n"
         "Workloads are .syn files (docs/language.md), hardware models TOML files "
         "(docs/hardware.md); `synth list` shows the built-in ones.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def version() -> str:
    """synth's installed version (the package metadata), else the source tree's."""
    from importlib import metadata

    try:
        return metadata.version("synth")
    except metadata.PackageNotFoundError:
        from synth import __version__
        return __version__


def _print_version(value: bool) -> None:
    if value:
        print(f"synth {version()}")
        raise typer.Exit(0)


@app.callback()
def root(
    show_version: Annotated[bool, typer.Option(
        "--version", callback=_print_version, is_eager=True,
        help="Print synth's version and exit.")] = False,
) -> None:
    """The options before any command."""


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
    from synth.lang import SizeRange

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
    from synth.lang import SizeRange

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


_SECONDS = re.compile(r"[0-9]+(\.[0-9]*)?([eE][+-]?[0-9]+)?|\.[0-9]+([eE][+-]?[0-9]+)?")


def check_time_limit(text: str | float) -> float:
    """`--time-limit SEC`: a positive number in ASCII digits (Python's `float()` reads
    `٣٢` as 32), at most `MAX_TIME_LIMIT_S`."""
    given = str(text).strip()
    seconds = float(given) if _SECONDS.fullmatch(given) else math.nan
    if not 0 < seconds <= MAX_TIME_LIMIT_S:  # also rejects NaN and infinity
        raise InputError(f"--time-limit {given}: expected a positive number of seconds "
                         f"(digits 0-9), at most {MAX_TIME_LIMIT_S:.0f}")
    return seconds


def parse_jobs(text: str | None) -> int:
    """`--jobs N`: solver processes, 1..1024 (not given: the usable cores)."""
    if text is None:
        from synth import processes
        return processes.usable_cores()
    return parse_int(text, "--jobs N (solver processes)", 1, 1024)


def parse_measure(text: str | None) -> int:
    """`--measure K`: a number of schedules, 1..64 (0: not asked)."""
    if text is None:
        return 0
    return parse_int(text, "--measure K (schedules to time)", 1, 64)


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
    except BrokenPipeError:  # a reader gone before anything decided the code (delivered)
        _silence_stdout()
        return EXIT_OK
    except Exception as exc:
        if debugging():
            raise
        print(f"internal error: {type(exc).__name__}: {exc}", file=sys.stderr)
        print(f"this is a bug in synth; rerun with {DEBUG_ENV}=1 for the traceback",
              file=sys.stderr)
        return EXIT_INTERNAL


def delivered(code: int, show: Callable[[], None]) -> int:
    """Print the output with `show` and return the run's exit `code`: a reader that goes
    away (`synth ... | head -1`: a broken pipe) does not change what the code says."""
    try:
        show()
        sys.stdout.flush()
    except BrokenPipeError:
        _silence_stdout()
    return code


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so that flushing it at exit does not fail again (the
    recipe of the Python documentation, "Note on SIGPIPE")."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, io.UnsupportedOperation):
        pass  # a stdout without a file descriptor (a test's capture) needs nothing


def outcome_exit_code(outcome: Outcome) -> int:
    from synth.constraints.result import Status

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
    if outcome.measured is not None and not outcome.measured.passed:
        return EXIT_VALIDATION  # a schedule --measure ran did not build, or ran wrong
    return EXIT_OK


# ---------------------------------------------------------------- human output


UNWRAPPED_WIDTH = 10_000
"""The width rich lays output out in when stdout is not a terminal: wide enough that no
table row or message wraps (a reader of piped output, a file or a script, sees each row
on one line)."""


def make_console() -> Console:
    """A console on the current stdout, built per call (test runners swap stdout).

    On a terminal, rich's own: its width, colours unless NO_COLOR is set. Otherwise
    (a pipe, a file) no colours, no wrapping (`UNWRAPPED_WIDTH`, unless COLUMNS says
    otherwise) and no trailing spaces (rich pads table cells to their column's width).
    Highlighting is off so numbers in messages are not coloured at random."""
    from rich.console import Console

    if sys.stdout.isatty():
        console = Console(highlight=False)
    else:
        width = None if os.environ.get("COLUMNS") else UNWRAPPED_WIDTH
        console = Console(file=Unpadded(sys.stdout), width=width,  # type: ignore[arg-type]
                          highlight=False)
    console.on_broken_pipe = _broken_pipe  # type: ignore[method-assign]
    return console


def _broken_pipe() -> None:
    """Rich's own handling of a broken pipe exits 1, the code for "infeasible"; let the
    caller (`delivered`) decide instead."""
    raise BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE))


class Unpadded(io.TextIOBase):
    """A text stream that writes each line to `stream` without its trailing spaces."""

    def __init__(self, stream: TextIO) -> None:
        super().__init__()
        self.stream = stream
        self.pending = ""  # the current line, until its newline

    def write(self, text: str) -> int:
        lines = (self.pending + text).split("\n")
        self.pending = lines.pop()
        if lines:
            self.stream.write("".join(line.rstrip(" ") + "\n" for line in lines))
        return len(text)

    def flush(self) -> None:
        self.stream.flush()

    def isatty(self) -> bool:
        return False

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.stream, "encoding", None) or "utf-8"


def format_seconds(seconds: float) -> str:
    """A duration with a unit that keeps 3-4 significant digits readable."""
    if seconds == 0:
        return "0 s"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6), ("ns", 1e-9)):
        if abs(seconds) >= scale:
            return f"{seconds / scale:.4g} {unit}"
    return f"{seconds / 1e-12:.4g} ps"


# ---------------------------------------------------------------- commands


def solve_request(request: Request, as_json: bool) -> int:
    from synth import progress, render
    from synth.pipeline import run

    with progress.Status(sys.stderr):
        outcome = run(request)
    total = time.perf_counter() - STARTED
    return delivered(outcome_exit_code(outcome),
                     (lambda: render.print_json(outcome, total)) if as_json
                     else (lambda: render.print_human(outcome, request, total)))


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
    time_limit: Annotated[str, typer.Option(
        "--time-limit", metavar="SEC", help="Solver time limit in seconds.")] = "30",
    jobs: Annotated[str | None, typer.Option(
        "--jobs", metavar="N",
        help="Processes that solve candidate kernels side by side on large workloads "
             "(default: usable cores; the schedule does not depend on it).")] = None,
    as_json: Annotated[bool, typer.Option(
        "--json", help="Print one JSON report object to stdout and nothing else.")] = False,
    no_validate: Annotated[bool, typer.Option(
        "--no-validate", help="Skip running the loop nest against NumPy.")] = False,
    binding: Annotated[bool, typer.Option(
        "--binding/--no-binding",
        help="Also find the constraint groups that bind at the optimum: one re-solve per "
             "group, often most of the run time on large workloads (off by default).")
    ] = False,
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
    measure: Annotated[str | None, typer.Option(
        "--measure", metavar="K",
        help="Emit the K best distinct schedules under the model as C, check and time each "
             "on this machine (cpu-like models), report modelled against measured, and "
             "keep the fastest measured.")] = None,
) -> None:
    """Find the best schedule of WORKLOAD on the hardware model, print it and check it.

    Exit codes: 0 solved, 1 infeasible, 2 bad input, 3 time limit, 4 validation failed.
    """
    def action() -> int:
        fixed, ranges = parse_size_options(sizes or [])
        solver_name, limit = check_solver(solver), check_time_limit(time_limit)
        from synth.pipeline import Request, check_emit

        request = Request(workload, hw, fixed, tuple(hw_set or []), solver_name, limit,
                          validate=not no_validate, constraints=tuple(constraint or []),
                          fixes=tuple(fix or []), drops=tuple(drop or []),
                          binding=binding, ranges=ranges, emit=emit, out_dir=out,
                          measure=parse_measure(measure), jobs=parse_jobs(jobs))
        if show_constraints:
            from synth import render
            return render.show_constraints_of(request, as_json)
        check_emit(request)  # before solving: a typo should not cost a solve
        return solve_request(request, as_json)

    raise typer.Exit(guarded(action))


# ---------------------------------------------------------------- synth tune


def tune_table(base: Request, axes: Sequence[tune.Axis],
               results: Sequence[tune.VariantResult]) -> Table:
    """One row per variant: its settings, status, modelled cost (and how far from the
    best variant of the same sizes), solve time, and with --binding the binding groups
    (infeasible: the conflicting ones, with or without --binding)."""
    from rich import box
    from rich.table import Table

    from synth import report, tune

    first = next((r.outcome for r in results if r.outcome is not None), None)
    name = first.workload.name if first else base.workload
    hw = ", ".join(tune.hardware_names(base, results))
    table = Table(title=f"Variants of {name} on {hw}", box=box.SIMPLE_HEAD,
                  title_justify="left", collapse_padding=True, pad_edge=False)
    table.add_column("#", justify="right", no_wrap=True)
    for axis in axes:
        table.add_column(axis.label, justify="right", overflow="fold")
    for title in ("status", "cost", "vs best", "solve"):
        table.add_column(title, justify="left" if title == "status" else "right",
                         no_wrap=True)
    validating = any(r.outcome is not None and r.outcome.validation is not None
                     for r in results)
    if validating:
        table.add_column("valid", no_wrap=True)
    table.add_column("binding groups" if base.binding else "groups", overflow="fold")
    best = tune.best_costs(results)
    for result in results:
        outcome = result.outcome
        cost, versus = tune.cost_ps(result), tune.vs_best(result, best)
        cells = [str(result.variant.index), *(value for _, value in result.variant.settings),
                 tune.status(result),
                 format_seconds(cost / report.PS_PER_S) if cost is not None else "-",
                 f"{versus:+.1%}" if versus is not None else "-",
                 format_seconds(outcome.result.wall_s) if outcome else "-"]
        if validating:
            validation = outcome.validation if outcome else None
            cells.append("-" if validation is None else "yes" if validation.passed else "NO")
        cells.append(_groups_cell(result))
        table.add_row(*cells)
    return table


def _groups_cell(result: tune.VariantResult) -> str:
    """A variant's error, its conflicting groups (infeasible) or its binding groups
    (with --binding); "-" when there is nothing to say."""
    from synth import tune

    binding, conflict = tune.binding_groups(result), tune.conflict_groups(result)
    if result.error is not None:
        return f"error: {result.error}"
    if conflict is not None:
        return "conflict: " + (", ".join(conflict) or "(every candidate)")
    if binding is not None:
        return ", ".join(binding) or "none"
    return "-"


def run_tune(base: Request, vary: Sequence[str], as_json: bool, csv_path: Path | None) -> int:
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    from synth import tune

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
        text = json.dumps(data, indent=2, allow_nan=False) + "\n"
        return delivered(tune.exit_code(results), lambda: print(text, end=""))
    return delivered(tune.exit_code(results),
                     lambda: make_console().print(tune_table(base, axes, results)))


@app.command("tune")
def tune_command(
    workload: Annotated[str, typer.Argument(
        metavar="WORKLOAD", help="A built-in workload name (see `synth list`) or a .syn file.")],
    hw: Annotated[str | None, typer.Option(
        "--hw", help="A built-in hardware model name or a .toml file (may be left out "
                     "with --vary hw=...).")] = None,
    vary: Annotated[list[str] | None, typer.Option(
        "--vary", metavar="KEY=V1,V2,...",
        help="Solve once per value (repeatable; variants are the product of all --vary). "
             "KEY: a hardware key (wram.capacity, hw:KEY) or a variable (T, fix:VAR) "
             "fixed to each value; drop:GROUP with on (dropped) / off (kept); set:NAME, "
             "a problem size; hw, the hardware model (hw=upmem,aie).")] = None,
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
    time_limit: Annotated[str, typer.Option(
        "--time-limit", metavar="SEC", help="Solver time limit per variant, in seconds.")
    ] = "30",
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
    binding: Annotated[bool, typer.Option(
        "--binding/--no-binding",
        help="Also find the constraint groups that bind at each variant's optimum: one "
             "re-solve per group (off by default, as in synth solve).")] = False,
) -> None:
    """Solve WORKLOAD once per variant of the request and compare the variants.

    Exit codes: 0 every variant ran (whatever its status), 2 bad input (checked before
    any solve); with --validate, 4 when a variant's validation failed.
    """
    def action() -> int:
        sized = parse_size_settings(sizes or [])
        solver_name, limit = check_solver(solver), check_time_limit(time_limit)
        from synth import tune
        from synth.pipeline import Request

        models = tune.model_axis(vary or [])
        if hw is None and models is None:
            raise InputError("synth tune needs --hw HW (a built-in model or a .toml file), "
                             "or --vary hw=HW1,HW2,... to compare models")
        model = hw if hw is not None else models[1][0] if models is not None else ""
        base = Request(workload, model, sized, tuple(hw_set or []), solver_name, limit,
                       validate=validate, constraints=tuple(constraint or []),
                       fixes=tuple(fix or []), drops=tuple(drop or []), binding=binding)
        return run_tune(base, vary or [], as_json, csv_path)

    raise typer.Exit(guarded(action))


@app.command("sweep")
def sweep_command(
    spec: Annotated[str | None, typer.Argument(
        metavar="[SPEC.toml]", help="A sweep spec file (docs/sweep.md); or give the sweep "
                                    "by flags.")] = None,
    out: Annotated[str, typer.Option(
        "--out", metavar="DIR", help="Where results, plots and index.html go; finished "
                                     "points are stored there and skipped by a rerun.")
    ] = "",
    workload: Annotated[list[str] | None, typer.Option(
        "--workload", metavar="W[,W...]", help="Workloads (built-in names or .syn files).")
    ] = None,
    hw: Annotated[list[str] | None, typer.Option(
        "--hw", metavar="HW[,HW...]", help="Hardware models (built-in names or .toml).")
    ] = None,
    sizes: Annotated[list[str] | None, typer.Option(
        "--set", metavar="NAME=V1,V2,...",
        help="Sizes, for the workloads that declare NAME; a value may be a range "
             "LO..HI[:STEP] or LO..HI:xFACTOR.")] = None,
    hw_set: Annotated[list[str] | None, typer.Option(
        "--hw-set", metavar="KEY=V1,V2,...",
        help="Hardware overrides, for the models that accept KEY.")] = None,
    variant: Annotated[list[str] | None, typer.Option(
        "--variant", metavar="'NAME[@HW,...]: ITEM; ...'",
        help="A constraint variant (on the models after @ only, when given); ITEM: a "
             "constraint (T <= 4), fix VAR=INT or drop GROUP.")] = None,
    constraint: Annotated[list[str] | None, typer.Option(
        "--constraint", metavar="EXPR", help="A constraint for every point.")] = None,
    fix: Annotated[list[str] | None, typer.Option(
        "--fix", metavar="VAR=INT", help="A fixed variable for every point.")] = None,
    drop: Annotated[list[str] | None, typer.Option(
        "--drop", metavar="GROUP", help="A group dropped at every point.")] = None,
    solver: Annotated[list[str] | None, typer.Option(
        "--solver", metavar="S[,S...]", help=f"Solvers: {' | '.join(SOLVERS)}.")] = None,
    time_limit: Annotated[str | None, typer.Option(
        "--time-limit", metavar="SEC", help="Solver time limit per point (default 30).")
    ] = None,
    validate: Annotated[bool | None, typer.Option(
        "--validate/--no-validate", help="Run each loop nest against NumPy (off by "
                                         "default).")] = None,
    binding: Annotated[bool | None, typer.Option(
        "--binding/--no-binding", help="Find each optimum's binding groups.")] = None,
    emit: Annotated[str | None, typer.Option(
        "--emit", metavar="TARGET", help="Emit each schedule (into DIR/emit/KEY) and, with "
                                         "--validate, check it.")] = None,
    baseline: Annotated[str | None, typer.Option(
        "--baseline", metavar="hw:NAME|solver:NAME", help="What the ratio plot divides "
                                                          "by.")] = None,
    workers: Annotated[str | None, typer.Option(
        "--workers", metavar="N", help="Local worker processes (default: usable cores).")
    ] = None,
    dask: Annotated[str | None, typer.Option(
        "--dask", metavar="ADDRESS|local", help="Run on the Dask cluster whose scheduler "
                                                "is at ADDRESS (tcp://HOST:PORT), or on a "
                                                "new local one.")] = None,
    force: Annotated[bool, typer.Option(
        "--force", help="Run every point again, stored or not.")] = False,
) -> None:
    """Solve every point of workloads x sizes x hardware x overrides x variants x solvers;
    write results.csv, results.jsonl, plots and index.html into --out DIR.

    Exit codes: 0 every point ran (whatever its status), 2 bad input (checked before any
    point runs, an unreachable --dask scheduler too), else the first failed point's code;
    130 interrupted, 69 the Dask scheduler lost (rerun to resume either).
    """
    def action() -> int:
        from synth.sweep import command
        from synth.sweep import spec as sweep_spec

        if not out:
            raise InputError("synth sweep needs --out DIR, where its results go")
        return command.main(sweep_spec.Flags(
            out, spec, workload or [], hw or [], sizes or [], hw_set or [], variant or [],
            constraint or [], fix or [], drop or [], solver or [], time_limit, validate,
            binding, emit, baseline, workers, dask, force))

    raise typer.Exit(guarded(action))


@app.command("calibrate")
def calibrate_command(
    out: Annotated[str, typer.Option(
        "--out", metavar="FILE.toml", help="Where to write the calibrated hardware model.")
    ] = "",
    hw: Annotated[str, typer.Option(
        "--hw", help="The model to calibrate (its units must be this machine's cores).")
    ] = "cpu",
) -> None:
    """Measure this machine (arithmetic and vector math throughput, cache and DRAM
    bandwidth and latency, OpenMP overheads, usable cores) with C micro-benchmarks and
    write the --hw model with the measured numbers as FILE.toml (under a minute).

    Exit codes: 0 written, 2 bad input (an unknown model, one that is not this machine's
    cores, an --out that cannot be written) or no C compiler.
    """
    def action() -> int:
        if not out:
            raise InputError("synth calibrate needs --out FILE.toml, where the model goes")
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        from synth import calibrate, render

        calibrate.check_request(hw, out)  # before measuring anything
        console = Console(stderr=True)
        with Progress(TextColumn("calibrating: {task.description}"), BarColumn(),
                      MofNCompleteColumn(), console=console, transient=True,
                      disable=not console.is_terminal) as bar:
            settings = calibrate.DEFAULT
            counts = {"done": 0, "total": calibrate.steps(settings.min_passes)}
            task = bar.add_task("starting", total=counts["total"])

            def step(what: str) -> None:
                if counts["done"] == counts["total"]:  # another pass: the numbers still move
                    counts["total"] += calibrate.PASS_STEPS
                counts["done"] += 1
                bar.update(task, completed=counts["done"], total=counts["total"],
                           description=what)

            cal = calibrate.calibrate(hw, out, settings, step)
        return delivered(EXIT_OK, lambda: render.print_calibration(cal, out))

    raise typer.Exit(guarded(action))


@app.command("list")
def list_builtins() -> None:
    """List the built-in workloads and hardware models."""
    def action() -> int:
        from synth import render
        return delivered(EXIT_OK, render.print_list)

    raise typer.Exit(guarded(action))


def main() -> None:
    """The `synth` console script."""
    app()


if __name__ == "__main__":
    main()
