"""Validation time of every built-in workload x hardware at the default sizes.

    python benchmarks/validate_time.py [--repeats 3] [--workloads NAME ...]
                                       [--hardware NAME ...] [--step-by-step]
                                       [--markdown PATH]

Per case: solve once with CP-SAT and materialise (as `synth solve` does, not timed), then
run the validate stage alone (`pipeline.validate`: random inputs, the NumPy reference,
the loop-nest interpreter, the comparison) `--repeats` times: the median, min and max
wall time, whether it passed and its largest absolute error. `--step-by-step` runs the
interpreter without batched reduction loops (`interpret(..., batch=False)`) for
comparison. The last line says whether every median is under the 10 s target (issue 2).

A measurement tool: it exits 0 even when a target fails; only a bad command line does
not. The timings are wall-clock times, so run it on an idle machine (the load average at
the start is printed with the machine).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shlex
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy

from synth import pipeline
from synth.ir import interpret as interpreter
from synth.lang import list_builtin_workloads

sys.path.insert(0, str(Path(__file__).resolve().parent))
from solve_time import git_revision  # noqa: E402  (the sibling benchmark script)

TARGET_S = 10.0  # issue 2: validation of each built-in at its default size


@dataclass(frozen=True)
class Row:
    workload: str
    hardware: str
    sizes: str
    times: tuple[float, ...]
    passed: bool
    max_abs_err: float

    @property
    def median(self) -> float:
        return statistics.median(self.times)


def measure(workload: str, hardware: str, repeats: int) -> Row:
    outcome = pipeline.run(pipeline.Request(workload, hardware, validate=False))
    assert outcome.program is not None, f"{workload}/{hardware}: no schedule"
    times, validation = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        validation = pipeline.validate(outcome.program, outcome.workload)
        times.append(time.perf_counter() - start)
    assert validation is not None
    sizes = " ".join(f"{k}={v}" for k, v in outcome.workload.sizes.items())
    return Row(workload, hardware, sizes, tuple(times), validation.passed,
               validation.max_abs_err)


def step_by_step() -> None:
    """Make the validate stage run every reduction loop step by step."""
    plain = interpreter.interpret

    def interpret(*args: Any, **kwargs: Any) -> Any:
        return plain(*args, **kwargs, batch=False)

    pipeline.interpret = interpret


def seconds(value: float) -> str:
    return f"{value:.3f}"


def table(rows: Sequence[Row]) -> str:
    lines = ["| workload | hw | sizes | validate median [s] | min [s] | max [s] | passed "
             "| max abs err |", "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r.workload} | {r.hardware} | {r.sizes} | {seconds(r.median)} "
              f"| {seconds(min(r.times))} | {seconds(max(r.times))} "
              f"| {'yes' if r.passed else 'NO'} | {r.max_abs_err:.3g} |" for r in rows]
    return "\n".join(lines)


def verdict(rows: Sequence[Row]) -> str:
    slow = [r for r in rows if r.median >= TARGET_S or not r.passed]
    worst = max(rows, key=lambda r: r.median)
    word = "FAIL" if slow else "PASS"
    return (f"{word} validation passes with a median under {TARGET_S:g} s: "
            f"{len(rows) - len(slow)}/{len(rows)} cases; slowest {worst.workload}/"
            f"{worst.hardware} {seconds(worst.median)} s")


def machine() -> list[str]:
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            model = next((line.split(":", 1)[1].strip() for line in f
                          if line.startswith("model name")), model)
    except OSError:
        pass
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else "?"
    info = [f"cpu: {model}", f"cores: {os.cpu_count()} logical, {usable} usable",
            f"python: {platform.python_version()}", f"numpy: {numpy.__version__}"]
    if hasattr(os, "getloadavg"):
        info.append("load average at start: "
                    + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    return info + [f"git: {git_revision()}"]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workloads", nargs="+", default=list_builtin_workloads(),
                        choices=list_builtin_workloads(), metavar="NAME")
    parser.add_argument("--hardware", nargs="+", default=["cpu", "upmem"], metavar="NAME")
    parser.add_argument("--step-by-step", action="store_true",
                        help="run reduction loops one iteration at a time")
    parser.add_argument("--markdown", type=Path, help="also write the report here")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats: expected at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.step_by_step:
        step_by_step()
    command = "python benchmarks/validate_time.py " + shlex.join(
        sys.argv[1:] if argv is None else argv)
    info = machine()
    rows = []
    for workload in args.workloads:
        for hardware in args.hardware:
            row = measure(workload, hardware, args.repeats)
            print(f"{workload:10} {hardware:6} median {seconds(row.median)} s "
                  f"(min {seconds(min(row.times))}, max {seconds(max(row.times))}) "
                  f"{'passed' if row.passed else 'FAILED'}", flush=True)
            rows.append(row)
    date = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    report = "\n".join([f"Run {date}. Command:", "", "```", command.strip(), "```", "",
                        "Machine:", "", *(f"- {line}" for line in info), "",
                        table(rows), "", verdict(rows)])
    print()
    print(report)
    if args.markdown:
        args.markdown.write_text(report + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
