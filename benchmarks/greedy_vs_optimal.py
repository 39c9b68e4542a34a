"""The greedy baseline (seed 000's TileFirst order) against CP-SAT's optimum.

    python benchmarks/greedy_vs_optimal.py [--repeats 3] [--workloads NAME ...]
                                           [--hardware NAME ...] [--time-limit S]

For every built-in workload on `upmem` and `cpu` at the default sizes: encode once, solve
with CP-SAT and with the greedy `--repeats` times each, and print one markdown table row:
both modelled costs (the objective, in ms), their ratio greedy / CP-SAT, both median solve
times, and the hardware counts each schedule allocates (where the greedy's order shows:
it fills the innermost levels first). A summary line per hardware gives the geometric mean
of the ratios. CP-SAT's objective is a proven optimum when its status says `optimal`, so a
ratio below 1 would be a bug and is flagged. Exit code 0 unless the command line is bad.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from synth import pipeline
from synth.constraints import cpsat, greedy
from synth.constraints.cost import Model
from synth.constraints.result import SolveResult, Status
from synth.hwfile import list_builtin_hardware
from synth.lang import list_builtin_workloads

DEFAULT_HARDWARE = ("upmem", "cpu")
ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Row:
    workload: str
    hw: str
    sizes: str
    optimum: SolveResult
    greedy: SolveResult
    cpsat_s: float  # median wall time
    greedy_s: float
    counts: tuple[str, str]  # (greedy, cpsat): "R=1 D=64 T=16"
    repeatable: bool  # every repeat of each solver gave the same schedule


def timed(solve: Callable[[], SolveResult], repeats: int) -> tuple[SolveResult, float, bool]:
    results = [solve() for _ in range(repeats)]
    same = all(r.env == results[0].env for r in results)
    return results[0], statistics.median(r.wall_s for r in results), same


def counts(model: Model, result: SolveResult) -> str:
    if result.env is None:
        return "-"
    names = [n for n in model.constraints.definitions if n in result.env]
    return " ".join(f"{n}={result.env[n]}" for n in names)


def measure(workload: str, hw: str, repeats: int, time_limit_s: float) -> Row:
    request = pipeline.Request(workload, hw)
    wl = pipeline.parse(request)
    model = pipeline.encode(wl, pipeline.hardware(request))
    optimum, cpsat_s, same_opt = timed(
        lambda: cpsat.solve(model.constraints, time_limit_s), repeats)
    found, greedy_s, same_greedy = timed(
        lambda: greedy.solve(model.constraints, time_limit_s, model.slots), repeats)
    sizes = " ".join(f"{k}={v}" for k, v in wl.sizes.items())
    return Row(workload, hw, sizes, optimum, found, cpsat_s, greedy_s,
               (counts(model, found), counts(model, optimum)), same_opt and same_greedy)


def ms(ps: int | None) -> str:
    if ps is None:
        return "-"
    value = ps / 1e9
    return f"{value:,.0f}" if value >= 1000 else f"{value:.4g}"


def ratio(row: Row) -> float | None:
    if row.optimum.objective is None or row.greedy.objective is None:
        return None
    return row.greedy.objective / max(row.optimum.objective, 1)


def table(rows: Sequence[Row]) -> list[str]:
    lines = [
        "| workload | hw | sizes | cpsat objective (ms) | greedy objective (ms) "
        "| greedy / cpsat | cpsat time | greedy time | greedy counts | cpsat counts |",
        "|---|---|---|---:|---:|---:|---:|---:|---|---|",
    ]
    for row in rows:
        r = ratio(row)
        status = "" if row.optimum.status is Status.OPTIMAL else f" ({row.optimum.status.value})"
        flag = " **below 1: a bug**" if (r is not None and r < 1
                                        and row.optimum.status is Status.OPTIMAL) else ""
        greedy_status = "" if row.greedy.status is Status.FEASIBLE \
            else f" ({row.greedy.status.value})"
        lines.append(
            f"| {row.workload} | {row.hw} | {row.sizes} | {ms(row.optimum.objective)}{status} "
            f"| {ms(row.greedy.objective)}{greedy_status} "
            f"| {'-' if r is None else f'{r:.2f}x'}{flag} "
            f"| {row.cpsat_s * 1e3:.1f} ms | {row.greedy_s * 1e3:.2f} ms "
            f"| {row.counts[0]} | {row.counts[1]} |")
    return lines


def summary(rows: Sequence[Row]) -> list[str]:
    lines = []
    for hw in dict.fromkeys(r.hw for r in rows):
        ratios = [x for r in rows if r.hw == hw and (x := ratio(r)) is not None]
        if ratios:
            geo = math.exp(statistics.fmean(math.log(x) for x in ratios))
            lines.append(f"- {hw}: greedy / cpsat geometric mean {geo:.2f}x, "
                         f"min {min(ratios):.2f}x, max {max(ratios):.2f}x "
                         f"over {len(ratios)} workloads")
    slow = max(rows, key=lambda r: r.greedy_s)
    lines.append(f"- slowest greedy solve: {slow.workload}/{slow.hw} "
                 f"{slow.greedy_s * 1e3:.2f} ms (median)")
    if not all(r.repeatable for r in rows):
        lines.append("- NOT repeatable: " + ", ".join(f"{r.workload}/{r.hw}" for r in rows
                                                       if not r.repeatable))
    else:
        lines.append("- every repeat of each solver returned the same schedule")
    return lines


def revision() -> str:
    try:
        run = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                             capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT,
                               capture_output=True, text=True, check=True).stdout.strip()
        return run.stdout.strip() + (" (with uncommitted changes)" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workloads", nargs="*", default=None)
    parser.add_argument("--hardware", nargs="*", default=list(DEFAULT_HARDWARE))
    parser.add_argument("--time-limit", type=float, default=30.0)
    args = parser.parse_args(argv)
    workloads = args.workloads or list_builtin_workloads()
    unknown = ([w for w in workloads if w not in list_builtin_workloads()]
               + [h for h in args.hardware if h not in list_builtin_hardware()])
    if unknown or args.repeats < 1:
        parser.error(f"unknown names {unknown}" if unknown else "--repeats must be >= 1")
    rows = [measure(w, h, args.repeats, args.time_limit)
            for w in workloads for h in args.hardware]
    print(f"Greedy (seed 000 order) vs CP-SAT, default sizes, median of {args.repeats} "
          f"solves, time limit {args.time_limit:g} s; git {revision()}, "
          f"{os.cpu_count()} CPUs\n")
    print("\n".join(table(rows)))
    print()
    print("\n".join(summary(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
