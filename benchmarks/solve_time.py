"""Solve time of every built-in workload x hardware, and CP-SAT against the exhaustive solver.

    python benchmarks/solve_time.py [--repeats 5] [--workloads NAME ...] [--hardware NAME ...]
                                    [--csv PATH] [--markdown PATH] [--no-exhaustive]
                                    [--no-timing] [--time-limit S] [--exhaustive-time-limit S]

Part 1 (solve time), per built-in workload x hardware at the default sizes: encode once,
solve with CP-SAT `--repeats` times (median, min and max wall time; status, objective,
proven bound, independent components; whether every repeat returned the same schedule),
then materialise, verify and validate the schedule once.

Part 2 (exhaustive comparison), per small case: CP-SAT and the exhaustive enumerator on the
same model; objectives must be equal. Each case is a ladder of ever smaller sizes and
hardware ranges; of all (sizes, ranges) pairs, the one with the largest space that still
fits under the enumerator's limit (`exhaustive.MAX_POINTS`) is used, so a case is shrunk
rather than dropped. The table says which sizes and ranges were taken.

Finally the targets of the issue are printed as PASS / FAIL lines. The exit code is 0 even
when a target fails: this is a measurement tool. Only a bad command line exits non-zero.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import importlib.metadata
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from synth import pipeline
from synth.cli import format_seconds
from synth.constraints import exhaustive
from synth.constraints.cost import Model
from synth.constraints.result import SolveResult, Status
from synth.hwfile import list_builtin_hardware
from synth.ir.materialize import materialize
from synth.ir.verify import verify
from synth.lang import list_builtin_workloads

DEFAULT_HARDWARE = ("upmem", "cpu")

# Targets of the issue.
SOLVE_TARGET_S = 1.0  # median CP-SAT wall time per built-in at its default sizes
# ... except where an issue set another: issue 5, "matmul and gemm2k on aie solved to
# OPTIMAL in under 2 s" (3-level tilings of one 2048^3 contraction on 16 cores)
SOLVE_TARGETS_S = {("matmul", "aie"): 2.0, ("gemm2k", "aie"): 2.0}


def solve_target_s(workload: str, hw: str) -> float:
    return SOLVE_TARGETS_S.get((workload, hw), SOLVE_TARGET_S)

VALIDATE_TARGET_S = 10.0  # validation of each built-in at its default sizes

# Part 2: per workload, candidate sizes, the wanted ones first (see `pick_rung`).
SIZE_LADDERS: dict[str, list[dict[str, int]]] = {
    "softmax": [{"N": n} for n in (16, 8, 4, 2)],
    "va": [{"N": n} for n in (32, 16, 8)],
    "red": [{"N": n} for n in (32, 16, 8)],
    "mv": [{"M": m, "N": n} for m, n in ((8, 8), (4, 4), (2, 2))],
    "matmul": [{"M": m, "N": m, "K": m} for m in (8, 4, 2)]
    + [{"M": 2, "N": 2, "K": 1}],
    "attention": [{"S": s, "D": d}
                  for s, d in ((8, 4), (4, 4), (4, 2), (2, 2), (2, 1), (1, 4), (1, 2), (1, 1))],
    "fa6": [{"S": s, "D": d}
            for s, d in ((8, 4), (4, 4), (4, 2), (2, 2), (2, 1), (1, 4), (1, 2), (1, 1))],
}
GENERIC_SIZES = (8, 4, 2, 1)  # every size of a workload without a ladder (e.g. gemm2k)

# Part 2: per hardware, candidate --hw-set ranges, the widest (wanted) first.
HW_LADDERS: dict[str, list[list[str]]] = {
    "upmem": [
        ["rank.count=1..2", "dpu.count=1..4", "tasklet.count=1..4"],
        ["rank.count=1", "dpu.count=1..2", "tasklet.count=1..2"],
        ["rank.count=1", "dpu.count=1", "tasklet.count=1..2"],
        ["rank.count=1", "dpu.count=1", "tasklet.count=1"],
    ],
    # Pinned so that the space does not depend on the core count of the machine.
    "cpu": [["core.count=1..2"], ["core.count=1"]],
}

TableData = tuple[str, list[str], list[list[str]], str]  # title, headers, rows, note

CSV_FIELDS = ("part", "workload", "hardware", "sizes", "hw_overrides", "solver", "run",
              "measurement", "wall_s", "status", "objective_ps", "bound_ps", "components",
              "space_size", "visited", "passed", "detail")


# ---------------------------------------------------------------- records


@dataclass
class TimingCase:
    """Part 1: one built-in workload on one hardware model at its default sizes."""

    workload: str
    hardware: str
    sizes: str = ""
    encode_s: float | None = None
    runs: list[tuple[float, SolveResult]] = field(default_factory=list)  # (wall s, result)
    materialise_s: float | None = None
    validate_s: float | None = None
    validated: bool | None = None
    max_abs_err: float | None = None
    error: str | None = None

    @property
    def walls(self) -> list[float]:
        return [wall for wall, _ in self.runs]

    @property
    def median_s(self) -> float | None:
        return statistics.median(self.walls) if self.runs else None

    @property
    def statuses(self) -> Counter[Status]:
        return Counter(r.status for _, r in self.runs)

    @property
    def status_agrees(self) -> bool:
        return len(self.statuses) == 1

    @property
    def first(self) -> SolveResult | None:
        return self.runs[0][1] if self.runs else None

    @property
    def deterministic(self) -> bool:
        envs = [None if r.env is None else dict(r.env) for _, r in self.runs]
        return all(env == envs[0] for env in envs)

    @property
    def optimal(self) -> bool:
        return bool(self.runs) and self.statuses == Counter({Status.OPTIMAL: len(self.runs)})


@dataclass
class ExhaustiveCase:
    """Part 2: one small case, CP-SAT against the enumerator on the same model."""

    workload: str
    hardware: str
    wanted: str = ""  # sizes of the first rung of the ladder: what the case would be unshrunk
    sizes: str = ""
    overrides: str = ""
    shrunk_sizes: bool = False
    shrunk_ranges: bool = False  # narrower than the first rung of the hardware ladder
    space: int | None = None
    cpsat: SolveResult | None = None
    cpsat_s: float | None = None
    exh: SolveResult | None = None
    exh_s: float | None = None
    error: str | None = None

    @property
    def equal(self) -> bool:
        return (self.cpsat is not None and self.exh is not None
                and self.cpsat.status is Status.OPTIMAL and self.exh.status is Status.OPTIMAL
                and self.cpsat.objective == self.exh.objective)


# ---------------------------------------------------------------- formatting


def fmt_s(seconds: float | None) -> str:
    """A duration as the CLI prints it, or "-" when not measured."""
    return "-" if seconds is None else format_seconds(seconds)


def fmt_ps(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


def fmt_ps_as_s(value: int | None) -> str:
    return "-" if value is None else fmt_s(value * 1e-12)


def fmt_sizes(sizes: Mapping[str, int]) -> str:
    return " ".join(f"{k}={v}" for k, v in sizes.items())


def fmt_status(case: TimingCase) -> str:
    if not case.runs:
        return "-"
    if case.status_agrees:
        return next(iter(case.statuses)).value
    mixed = ", ".join(f"{s.value} ×{n}" for s, n in case.statuses.items())
    return f"MIXED: {mixed}"


def yes_no(value: bool | None) -> str:
    return "-" if value is None else ("yes" if value else "NO")


def error_text(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


UNBROKEN = re.compile(r"\s+(?!(?:s|ms|µs|ns|ps)\b)")  # a number keeps its unit in a table
VERDICT_COLUMNS = {"status", "same schedule", "valid", "equal"}  # coloured in the terminal


def verdict_style(cell: str) -> str:
    if cell.startswith(("optimal", "yes")):
        return "green"
    if cell.startswith(("NO", "MIXED", "error", "infeasible", "timeout", "feasible")):
        return "bold red"
    return ""


# ---------------------------------------------------------------- part 1


def timing_cases(workloads: Sequence[str], hardware: Sequence[str]) -> list[TimingCase]:
    return [TimingCase(w, h) for w in workloads for h in hardware]


def run_timing(case: TimingCase, repeats: int, time_limit_s: float,
               advance: Callable[[str], None]) -> None:
    label = f"{case.workload} on {case.hardware}"
    try:
        request = pipeline.Request(case.workload, case.hardware, time_limit_s=time_limit_s)
        workload = pipeline.parse(request)
        hw = pipeline.hardware(request)
        case.sizes = fmt_sizes(workload.sizes)
        start = time.perf_counter()
        model = pipeline.encode(workload, hw)
        case.encode_s = time.perf_counter() - start
        for i in range(repeats):
            advance(f"{label}: solve {i + 1}/{repeats}")
            start = time.perf_counter()
            result = pipeline.solve(model, "cpsat", time_limit_s)
            case.runs.append((time.perf_counter() - start, result))
        advance(f"{label}: validate")
        env = next((r.env for _, r in case.runs if r.env is not None), None)
        if env is None:
            return
        start = time.perf_counter()
        program = materialize(model, env)
        verify(program, workload, hw)
        case.materialise_s = time.perf_counter() - start
        validation = pipeline.validate(program, workload, request.seed)
        case.validate_s = validation.wall_s
        case.validated = validation.passed
        case.max_abs_err = validation.max_abs_err
    except Exception as exc:  # a measurement tool reports a failing case and goes on
        case.error = error_text(exc)


def bound_text(r: SolveResult | None) -> str:
    if r is None or r.bound is None:
        return "-"
    return "= objective" if r.bound == r.objective else fmt_ps(r.bound)


def timing_table(cases: Sequence[TimingCase]) -> tuple[list[str], list[list[str]]]:
    headers = ["workload", "hw", "sizes", "encode", "solve median", "solve min", "solve max",
               "status", "objective [ps]", "objective [s]", "bound [ps]", "comp."]
    rows = []
    for c in cases:
        r = c.first
        if c.error is not None and not c.runs:
            rows.append([c.workload, c.hardware, c.sizes, fmt_s(c.encode_s), "-", "-", "-",
                         f"error: {c.error}", "-", "-", "-", "-"])
            continue
        rows.append([
            c.workload, c.hardware, c.sizes, fmt_s(c.encode_s), fmt_s(c.median_s),
            fmt_s(min(c.walls, default=None)), fmt_s(max(c.walls, default=None)),
            fmt_status(c), fmt_ps(r.objective if r else None),
            fmt_ps_as_s(r.objective if r else None), bound_text(r),
            str(r.stats.get("components", "-")) if r else "-"])
    return headers, rows


def check_table(cases: Sequence[TimingCase]) -> tuple[list[str], list[list[str]]]:
    headers = ["workload", "hw", "same schedule", "materialise+verify", "validate", "valid",
               "max abs err"]
    rows = []
    for c in cases:
        if c.error is not None:
            valid = f"error: {c.error}"
        elif c.validated is None:
            valid = "- (no schedule)" if c.runs else "-"
        else:
            valid = yes_no(c.validated)
        rows.append([
            c.workload, c.hardware,
            yes_no(c.deterministic) if len(c.runs) > 1 else "n/a (1 run)",
            fmt_s(c.materialise_s), fmt_s(c.validate_s), valid,
            "-" if c.max_abs_err is None else f"{c.max_abs_err:.3g}"])
    return headers, rows


def timing_csv(case: TimingCase) -> Iterator[dict[str, Any]]:
    base = {"part": "solve_time", "workload": case.workload, "hardware": case.hardware,
            "sizes": case.sizes, "hw_overrides": ""}
    if case.encode_s is not None:
        yield {**base, "measurement": "encode", "wall_s": case.encode_s}
    for i, (wall, r) in enumerate(case.runs):
        yield {**base, "solver": "cpsat", "run": i + 1, "measurement": "solve",
               "wall_s": wall, "status": r.status.value, "objective_ps": r.objective,
               "bound_ps": r.bound, "components": r.stats.get("components"),
               "detail": f"solver wall {r.wall_s:.6f} s; "
                         f"branches {r.stats.get('branches')}, "
                         f"conflicts {r.stats.get('conflicts')}"}
    if case.materialise_s is not None:
        yield {**base, "measurement": "materialise+verify", "wall_s": case.materialise_s}
    if case.validate_s is not None:
        yield {**base, "measurement": "validate", "wall_s": case.validate_s,
               "passed": case.validated, "detail": f"max abs err {case.max_abs_err}"}
    if case.error is not None:
        yield {**base, "measurement": "error", "detail": case.error}


# ---------------------------------------------------------------- part 2


def size_ladder(workload: str) -> list[dict[str, int]]:
    if workload in SIZE_LADDERS:
        return SIZE_LADDERS[workload]
    names = list(pipeline.parse(pipeline.Request(workload, DEFAULT_HARDWARE[0])).sizes)
    return [dict.fromkeys(names, n) for n in GENERIC_SIZES]


def exhaustive_cases(workloads: Sequence[str], hardware: Sequence[str]) -> list[ExhaustiveCase]:
    return [ExhaustiveCase(w, h) for w in workloads for h in hardware]


def pick_rung(case: ExhaustiveCase) -> Model | None:
    """The model of the case's ladder with the largest space the enumerator still takes.

    Every (sizes, hardware ranges) pair of the ladders is a candidate; the largest space
    under `exhaustive.MAX_POINTS` covers the most schedules (ties: the earlier rung)."""
    sizes_ladder = size_ladder(case.workload)
    hw_ladder = HW_LADDERS.get(case.hardware, [[]])
    case.wanted = fmt_sizes(sizes_ladder[0])
    best: tuple[int, int, int, list[str], Model] | None = None  # space, i, j, ...
    last_error = "every rung exceeds the enumerator's limit"
    for i, sizes in enumerate(sizes_ladder):
        for j, overrides in enumerate(hw_ladder):
            request = pipeline.Request(case.workload, case.hardware, sizes, overrides)
            try:
                model = pipeline.encode(pipeline.parse(request), pipeline.hardware(request))
            except Exception as exc:  # a rung the workload or hardware rejects: try the next
                last_error = error_text(exc)
                continue
            space = exhaustive.space_size(model.constraints)
            if space <= exhaustive.MAX_POINTS and (best is None or space > best[0]):
                best = (space, i, j, overrides, model)
    if best is None:
        case.error = last_error
        return None
    case.space, i, j, overrides, model = best
    case.sizes = fmt_sizes(model.workload.sizes)
    case.overrides = " ".join(overrides) or "defaults"
    case.shrunk_sizes, case.shrunk_ranges = i > 0, j > 0
    return model


def run_exhaustive(case: ExhaustiveCase, time_limit_s: float, exhaustive_limit_s: float,
                   advance: Callable[[str], None]) -> None:
    label = f"{case.workload} on {case.hardware}"
    try:
        advance(f"{label}: shrink, small CP-SAT")
        model = pick_rung(case)
        if model is None:
            return
        start = time.perf_counter()
        case.cpsat = pipeline.solve(model, "cpsat", time_limit_s)
        case.cpsat_s = time.perf_counter() - start
        advance(f"{label}: exhaustive ({case.space:,} points)")
        start = time.perf_counter()
        case.exh = pipeline.solve(model, "exhaustive", exhaustive_limit_s)
        case.exh_s = time.perf_counter() - start
    except Exception as exc:  # a measurement tool reports a failing case and goes on
        case.error = error_text(exc)


def shrunk_text(case: ExhaustiveCase) -> str:
    parts = (["sizes"] if case.shrunk_sizes else []) + (["ranges"] if case.shrunk_ranges else [])
    return " + ".join(parts) or "no"


def exhaustive_table(cases: Sequence[ExhaustiveCase]) -> tuple[list[str], list[list[str]]]:
    headers = ["workload", "hw", "sizes", "hw ranges", "shrunk", "space", "CP-SAT [ps]",
               "exhaustive [ps]", "equal", "CP-SAT time", "exhaustive time", "visited"]
    rows = []
    for c in cases:
        cp, ex = c.cpsat, c.exh

        def objective(r: SolveResult | None) -> str:
            if r is None:
                return "-"
            return fmt_ps(r.objective) + ("" if r.status is Status.OPTIMAL
                                          else f" ({r.status.value})")

        equal = "error: " + c.error if c.error else yes_no(c.equal)
        rows.append([
            c.workload, c.hardware, c.sizes or "-", c.overrides or "-",
            shrunk_text(c),
            "-" if c.space is None else f"{c.space:,}", objective(cp), objective(ex), equal,
            fmt_s(c.cpsat_s), fmt_s(c.exh_s),
            "-" if ex is None else f"{ex.stats.get('visited', 0):,}"])
    return headers, rows


def exhaustive_csv(case: ExhaustiveCase) -> Iterator[dict[str, Any]]:
    base = {"part": "exhaustive", "workload": case.workload, "hardware": case.hardware,
            "sizes": case.sizes, "hw_overrides": case.overrides, "space_size": case.space,
            "measurement": "solve"}
    for solver, r, wall in (("cpsat", case.cpsat, case.cpsat_s),
                            ("exhaustive", case.exh, case.exh_s)):
        if r is None:
            continue
        yield {**base, "solver": solver, "run": 1, "wall_s": wall, "status": r.status.value,
               "objective_ps": r.objective, "bound_ps": r.bound,
               "components": r.stats.get("components"), "visited": r.stats.get("visited"),
               "passed": case.equal if solver == "exhaustive" else None,
               "detail": f"unshrunk: {case.wanted}; shrunk: {shrunk_text(case)}"}
    if case.error is not None:
        yield {**base, "measurement": "error", "detail": case.error}


# ---------------------------------------------------------------- targets


@dataclass(frozen=True)
class Target:
    name: str
    verdict: str  # PASS, FAIL or SKIP
    detail: str


def check(name: str, cases: Sequence[Any], ok: Callable[[Any], bool],
          describe: Callable[[Any], str]) -> Target:
    if not cases:
        return Target(name, "SKIP", "not measured in this run")
    bad = [c for c in cases if not ok(c)]
    if not bad:
        return Target(name, "PASS", f"{len(cases)}/{len(cases)} cases")
    return Target(name, "FAIL", f"{len(cases) - len(bad)}/{len(cases)} cases; failing: "
                  + "; ".join(describe(c) for c in bad))


def validation_text(c: TimingCase) -> str:
    if c.validate_s is None:
        return "not validated" if c.error else "not validated (no schedule)"
    return f"{fmt_s(c.validate_s)}, " + ("passed" if c.validated else
                                           f"FAILED (max abs err {c.max_abs_err:.3g})")


def targets(timing: Sequence[TimingCase], exh: Sequence[ExhaustiveCase],
            repeats: int) -> list[Target]:
    def who(c: TimingCase) -> str:
        return f"{c.workload}/{c.hardware}" + (f" ({c.error})" if c.error else "")

    def who_exh(c: ExhaustiveCase) -> str:
        if c.error:
            return f"{c.workload}/{c.hardware} ({c.error})"
        cp = c.cpsat.objective if c.cpsat else None
        ex = c.exh.objective if c.exh else None
        ex_status = c.exh.status.value if c.exh else "-"
        return f"{c.workload}/{c.hardware} (CP-SAT {cp}, exhaustive {ex} [{ex_status}])"

    solved = [c for c in timing if c.runs]
    result = [
        check("every built-in solves to OPTIMAL (all repeats)", timing,
              lambda c: c.optimal,
              lambda c: who(c) + ("" if c.error or not c.runs else f": {fmt_status(c)}")),
        check(f"median solve time (to OPTIMAL) under {SOLVE_TARGET_S:g} s ("
              + ", ".join(f"{w}/{h}: {t:g} s" for (w, h), t in SOLVE_TARGETS_S.items())
              + ")", timing,
              lambda c: c.optimal and c.median_s is not None
              and c.median_s < solve_target_s(c.workload, c.hardware),
              lambda c: f"{who(c)}: {fmt_s(c.median_s)}"
                        + ("" if c.optimal or c.error else f", {fmt_status(c)}")),
        check(f"validation at default size under {VALIDATE_TARGET_S:g} s", timing,
              lambda c: c.validate_s is not None and c.validate_s < VALIDATE_TARGET_S,
              lambda c: f"{who(c)}: {validation_text(c)}"),
        check("validation passes at default size", timing,
              lambda c: c.validated is True, lambda c: f"{who(c)}: {validation_text(c)}"),
        check("CP-SAT objective equals exhaustive on every small case", exh,
              lambda c: c.equal, who_exh),
    ]
    if repeats < 2:
        result.append(Target("same schedule on every repeat", "SKIP",
                             "needs --repeats 2 or more"))
    else:
        result.append(check("same schedule on every repeat", solved,
                            lambda c: c.deterministic, who))
    return result


# ---------------------------------------------------------------- machine and output


def machine_info() -> dict[str, str]:
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    info = {
        "cpu": model,
        "cores": f"{os.cpu_count()} logical"
                 + (f", {len(os.sched_getaffinity(0))} usable"
                    if hasattr(os, "sched_getaffinity") else ""),
        "python": platform.python_version(),
        "ortools": importlib.metadata.version("ortools"),
        "numpy": numpy.__version__,
        "os": platform.platform(),
    }
    if hasattr(os, "getloadavg"):
        info["load average at start"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    info["git"] = git_revision()
    return info


def git_revision() -> str:
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root,
                              capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=root, capture_output=True, text=True,
                               check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + (" (with uncommitted changes)" if dirty else "")


def hardware_ranges(names: Sequence[str]) -> dict[str, str]:
    out = {}
    for name in names:
        try:
            hw = pipeline.hardware(pipeline.Request("", name))
            out[name] = ", ".join(f"{lv.symbol} {lv.count_min}..{lv.count_max}"
                                  for lv in hw.levels if lv.symbol)
        except Exception as exc:  # reported, not fatal
            out[name] = error_text(exc)
    return out


def rich_table(title: str, headers: Sequence[str], rows: Sequence[Sequence[str]],
               width: int) -> Table:
    """A table that fits `width` by wrapping text at spaces: a number is never split.

    rich's own narrowing shrinks the widest column first, down to one character; here each
    column keeps at least its longest word, and the columns with the most room to spare give
    way first. If even that does not fit, rich folds the cells as usual."""
    cells = [[h, *(row[i] for row in rows)] for i, h in enumerate(headers)]
    natural = [max(len(c) for c in col) for col in cells]
    minimum = [max(len(w) for c in col for w in UNBROKEN.split(c)) for col in cells]
    widths = list(natural)
    room = width - 3 * len(headers) - 1  # padding and borders
    if sum(minimum) <= room:
        while sum(widths) > room:
            i = max(range(len(widths)), key=lambda k: widths[k] - minimum[k])
            widths[i] -= 1
    table = Table(title=title, title_justify="left", header_style="bold")
    for h, w, n in zip(headers, widths, natural, strict=True):
        table.add_column(Text(h), overflow="fold", width=w if w < n else None)
    styled = [h in VERDICT_COLUMNS for h in headers]
    for row in rows:
        table.add_row(*(Text(cell, style=verdict_style(cell) if color else "")
                        for cell, color in zip(row, styled, strict=True)))
    return table


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(cell(h) for h in headers) + " |",
             "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def write_markdown(path: Path, command: str, date: str, machine: Mapping[str, str],
                   ranges: Mapping[str, str],
                   tables: Sequence[TableData],
                   targets_title: str, verdicts: Sequence[Target]) -> None:
    parts = [f"## Solve time ({date})", "", "Command:", "", "```", command, "```", "",
             "Machine:", ""]
    parts += [f"- {key}: {value}" for key, value in machine.items()]
    parts += ["- hardware ranges at default: "
              + "; ".join(f"{k} ({v})" for k, v in ranges.items()), ""]
    for title, headers, rows, note in tables:
        parts += [f"### {title}", "", markdown_table(headers, rows), ""]
        parts += [note, ""] if note else []
    parts += [f"### {targets_title}", ""]
    parts += [f"- **{t.verdict}** {t.name}: {t.detail}" for t in verdicts]
    path.write_text("\n".join(parts) + "\n", encoding="utf-8")


def write_csv(path: Path, rows: Sequence[Mapping[str, Any]]) -> None:
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: ("" if row.get(k) is None else row.get(k)) for k in CSV_FIELDS})


# ---------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    workloads = list_builtin_workloads()
    hardware = list_builtin_hardware()
    parser = argparse.ArgumentParser(
        prog="benchmarks/solve_time.py",
        description="CP-SAT solve time per built-in workload x hardware, and CP-SAT against "
                    "the exhaustive enumerator on small sizes. Always exits 0 once it has run: "
                    "targets that fail are printed as FAIL lines.")
    parser.add_argument("--repeats", type=int, default=5,
                        help="CP-SAT solves per case; the median is reported (default 5)")
    parser.add_argument("--workloads", nargs="+", default=workloads, choices=workloads,
                        metavar="NAME", help="built-in workloads (default: all: "
                        + ", ".join(workloads) + ")")
    parser.add_argument("--hardware", nargs="+", default=list(DEFAULT_HARDWARE),
                        choices=hardware, metavar="NAME",
                        help="built-in hardware models (default: upmem cpu)")
    parser.add_argument("--csv", type=Path, metavar="PATH",
                        help="write one row per measurement (every solve, validation, ...)")
    parser.add_argument("--markdown", type=Path, metavar="PATH",
                        help="write the tables, command, machine and targets as markdown")
    parser.add_argument("--no-exhaustive", action="store_true",
                        help="skip part 2 (CP-SAT against the exhaustive enumerator)")
    parser.add_argument("--no-timing", action="store_true",
                        help="skip part 1 (solve time at default sizes)")
    parser.add_argument("--time-limit", type=float, default=30.0, metavar="S",
                        help="CP-SAT time limit per solve in seconds (default 30)")
    parser.add_argument("--exhaustive-time-limit", type=float, default=60.0, metavar="S",
                        help="time limit per exhaustive solve in seconds (default 60); "
                             "a run that hits it is not proven and fails the comparison")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    if args.time_limit <= 0 or args.exhaustive_time_limit <= 0:
        parser.error("time limits must be positive")
    for path in (args.csv, args.markdown):
        if path is not None and not path.resolve().parent.is_dir():
            parser.error(f"no directory for {path}")
    args.workloads = list(dict.fromkeys(args.workloads))
    args.hardware = list(dict.fromkeys(args.hardware))
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    console = Console(highlight=False)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = Console(highlight=False, width=200)  # a log file: keep table rows whole
    command = "python " + shlex.join(sys.argv if argv is None else [sys.argv[0], *argv])
    date = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    machine = machine_info()
    ranges = hardware_ranges(args.hardware)

    timing = [] if args.no_timing else timing_cases(args.workloads, args.hardware)
    exh = [] if args.no_exhaustive else exhaustive_cases(args.workloads, args.hardware)
    total = len(timing) * (args.repeats + 1) + len(exh) * 2

    console.print(f"[bold]synth solve-time benchmark[/] {date}")
    console.print(Text(f"command: {command}"))
    console.print(Text("machine: " + "; ".join(f"{k} {v}" for k, v in machine.items())))
    console.print(Text("hardware ranges at default: "
                       + "; ".join(f"{k} ({v})" for k, v in ranges.items())))

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console, transient=True) as progress:
        task = progress.add_task("starting", total=total)
        base = 0  # steps of the cases before this one
        done = 0  # steps of this case done so far

        def step(description: str) -> None:
            """Called before each step of a case; the step before it is then done."""
            nonlocal done
            progress.update(task, description=description, completed=base + done)
            done += 1

        for case in timing:
            done = 0
            run_timing(case, args.repeats, args.time_limit, step)
            base += args.repeats + 1  # a case that stopped early still counts all its steps
            progress.update(task, completed=base)
        for ecase in exh:
            done = 0
            run_exhaustive(ecase, args.time_limit, args.exhaustive_time_limit, step)
            base += 2
            progress.update(task, completed=base)

    tables: list[TableData] = []
    if timing:
        headers, rows = timing_table(timing)
        tables.append((f"CP-SAT solve time at default sizes ({args.repeats} repeat"
                       f"{'s' if args.repeats != 1 else ''}, time limit {args.time_limit:g} s)",
                       headers, rows, ""))
        headers, rows = check_table(timing)
        tables.append(("Determinism and validation at default sizes", headers, rows,
                       "same schedule: every repeat returned the identical assignment "
                       "(result.env); validate: reference against interpreter, seed 0."))
    if exh:
        headers, rows = exhaustive_table(exh)
        widest = "; ".join(f"{h}: {' '.join(HW_LADDERS[h][0])}"
                           for h in args.hardware if h in HW_LADDERS)
        unshrunk = "; ".join(f"{w} {fmt_sizes(size_ladder(w)[0])}"
                             for w in dict.fromkeys(c.workload for c in exh))
        note = ("Each case uses the sizes and hardware ranges of its ladder with the largest "
                "space under the enumerator's limit. shrunk: smaller than the unshrunk sizes "
                f"({unshrunk}) and/or narrower than the widest ranges ({widest}). "
                "visited: complete schedules the enumerator evaluated after pruning.")
        tables.append((f"CP-SAT against the exhaustive enumerator on small sizes "
                       f"(limit {exhaustive.MAX_POINTS:,} points)", headers, rows, note))
    for title, headers, rows, note in tables:
        console.print()
        console.print(rich_table(title, headers, rows, console.width))
        if note:
            console.print(Text(note, style="dim"))

    verdicts = targets(timing, exh, args.repeats)
    console.print()
    subset = (set(args.workloads) != set(list_builtin_workloads())
              or set(args.hardware) != set(DEFAULT_HARDWARE))
    targets_title = "Targets" + (" (on the selected subset only)" if subset else "")
    console.print(Text(targets_title, style="bold"))
    for t in verdicts:
        style = {"PASS": "bold green", "FAIL": "bold red", "SKIP": "yellow"}[t.verdict]
        line = Text(f"{t.verdict} ", style=style)
        line.append(f"{t.name}: {t.detail}")
        console.print(line)
    failed = sum(t.verdict == "FAIL" for t in verdicts)
    if failed:
        console.print(Text(f"{failed} target(s) FAIL (exit code is still 0: this is a "
                           f"measurement tool)", style="bold red"))

    if args.csv:
        rows_csv = [row for c in timing for row in timing_csv(c)]
        rows_csv += [row for c in exh for row in exhaustive_csv(c)]
        write_csv(args.csv, rows_csv)
        console.print(Text(f"wrote {args.csv} ({len(rows_csv)} rows)"))
    if args.markdown:
        write_markdown(args.markdown, command, date, machine, ranges, tables, targets_title,
                       verdicts)
        console.print(Text(f"wrote {args.markdown}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
