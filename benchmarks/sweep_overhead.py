"""The overhead of `synth sweep`: a 200-point sweep with local workers and on Dask.

    python benchmarks/sweep_overhead.py [--workers 2] [--repeats 1] [--markdown PATH]

The sweep (written as a spec file, `SPEC` below): every built-in workload at 5 sizes
that solve fast, on 5 hardware configurations (`upmem` and `cpu` with and without an
override, and `aie`): 8 x 5 x 5 = 200 points. It runs as `synth sweep SPEC --out DIR
--force` in its own process, once with `--workers N` and once with `--dask local
--workers N`, `--repeats` times each (alternating), and each run's wall time (the whole
command: start, 200 points, tables, plots, page) is compared with its points' solve
times, read from its `results.jsonl`:

    target (issue 16): wall <= 1.3 * (sum of solve times) / N + 0.3 s * points

The table also gives the overhead per point, (wall - sum of solve times / N) / points,
and the same against the points' whole run times (`wall_s`: parse, encode, solve,
materialise, verify, prove), which is what the workers really spend per point.

A measurement tool: it exits 0 even when a target fails. Timings are wall-clock and the
solve times are measured while N workers share the machine: run it on an idle machine
(the load average at the start is printed).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from solve_time import git_revision  # noqa: E402  (the sibling benchmark script)

ROOT = Path(__file__).resolve().parent.parent
FACTOR = 1.3  # issue 16: within 1.3x of the solve times divided by the workers
PER_POINT_S = 0.3  # issue 16: plus under 0.3 s of overhead per point

POWERS = "[1024, 4096, 16384, 65536, 262144]"
SPEC = f"""
# benchmarks/sweep_overhead.py: built-ins x 5 sizes x 5 hardware configurations
workloads = [
    {{ name = "softmax", sizes = {{ N = {POWERS} }} }},
    {{ name = "va", sizes = {{ N = {POWERS} }} }},
    {{ name = "red", sizes = {{ N = {POWERS} }} }},
    {{ name = "mv", sizes = [{{ M = 64, N = 64 }}, {{ M = 128, N = 128 }}, {{ M = 256, N = 256 }},
                           {{ M = 512, N = 512 }}, {{ M = 1024, N = 1024 }}] }},
    {{ name = "matmul", sizes = [{{ M = 16, N = 16, K = 16 }}, {{ M = 32, N = 32, K = 32 }},
                               {{ M = 64, N = 64, K = 64 }}, {{ M = 96, N = 96, K = 96 }},
                               {{ M = 128, N = 128, K = 128 }}] }},
    {{ name = "gemm2k", sizes = [{{ M = 16, N = 32, K = 16 }}, {{ M = 32, N = 64, K = 32 }},
                               {{ M = 64, N = 64, K = 32 }}, {{ M = 64, N = 128, K = 64 }},
                               {{ M = 128, N = 64, K = 128 }}] }},
    {{ name = "attention", sizes = [{{ S = 16, D = 16 }}, {{ S = 32, D = 16 }},
                                  {{ S = 64, D = 16 }}, {{ S = 64, D = 32 }},
                                  {{ S = 128, D = 32 }}] }},
    {{ name = "fa6", sizes = [{{ S = 32, D = 32 }}, {{ S = 64, D = 32 }}, {{ S = 96, D = 32 }},
                            {{ S = 128, D = 32 }}, {{ S = 128, D = 64 }}] }},
]
hardware = [
    {{ model = "upmem", hw_set = {{ "rank.count" = ["1..8", "1"] }} }},
    {{ model = "cpu", hw_set = {{ "core.count" = ["1..2", "1"] }} }},
    "aie",
]
time_limit = 30
"""


@dataclass(frozen=True)
class Run:
    mode: str  # "workers" or "dask local"
    wall_s: float
    points: int
    solve_s: float  # the sum of the points' solve times
    point_wall_s: float  # the sum of the points' whole run times
    statuses: dict[str, int]

    def bound(self, workers: int) -> float:
        return FACTOR * self.solve_s / workers + PER_POINT_S * self.points

    def overhead(self, total: float, workers: int) -> float:
        return (self.wall_s - total / workers) / self.points


def run_sweep(spec: Path, out: Path, mode: str, workers: int) -> Run:
    extra = ["--dask", "local"] if mode == "dask local" else []
    command = [sys.executable, "-m", "synth.cli", "sweep", str(spec), "--out", str(out),
               "--force", "--workers", str(workers), *extra]
    start = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{shlex.join(command)} exited {done.returncode}: {done.stderr}")
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    statuses: dict[str, int] = {}
    for row in rows:
        statuses[row["status"]] = statuses.get(row["status"], 0) + 1
    return Run(mode, wall, len(rows), sum(r["solve_s"] or 0 for r in rows),
               sum(r["wall_s"] for r in rows), statuses)


def table(runs: Sequence[Run], workers: int) -> list[str]:
    lines = ["| mode | points | statuses | wall [s] | sum of solve [s] | target: 1.3 x "
             "solve / N + 0.3 s x points [s] | overhead per point vs solve [s] | sum of "
             "point runs [s] | overhead per point vs runs [s] | target |",
             "|---|---:|---|---:|---:|---:|---:|---:|---:|---|"]
    for run in runs:
        statuses = ", ".join(f"{n} {s}" for s, n in sorted(run.statuses.items()))
        verdict = "PASS" if run.wall_s <= run.bound(workers) else "FAIL"
        lines.append(
            f"| {run.mode} | {run.points} | {statuses} | {run.wall_s:.1f} | "
            f"{run.solve_s:.1f} | {run.bound(workers):.1f} | "
            f"{run.overhead(run.solve_s, workers):.3f} | {run.point_wall_s:.1f} | "
            f"{run.overhead(run.point_wall_s, workers):.3f} | {verdict} |")
    return lines


def medians(runs: Sequence[Run]) -> list[Run]:
    """Per mode, the run of median wall time."""
    out = []
    for mode in dict.fromkeys(r.mode for r in runs):
        mine = sorted((r for r in runs if r.mode == mode), key=lambda r: r.wall_s)
        out.append(mine[(len(mine) - 1) // 2])
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args(argv)
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    runs = []
    with tempfile.TemporaryDirectory(prefix="sweep-bench-") as tmp:
        spec = Path(tmp) / "sweep.toml"
        spec.write_text(SPEC, encoding="utf-8")
        for repeat in range(args.repeats):
            for mode in ("workers", "dask local"):
                out = Path(tmp) / f"out-{mode.replace(' ', '-')}"
                run = run_sweep(spec, out, mode, args.workers)
                print(f"repeat {repeat + 1}, {mode}: {run.wall_s:.1f} s, "
                      f"{run.points} points", flush=True)
                runs.append(run)
    chosen = medians(runs)
    lines = [f"Command: `python benchmarks/sweep_overhead.py --workers {args.workers} "
             f"--repeats {args.repeats}`", "",
             f"Machine: {platform.processor() or platform.machine()}, "
             f"{os.cpu_count()} logical cores, load average at start {load}, "
             f"python {platform.python_version()}, git {git_revision()}", "",
             f"Median of {args.repeats} run(s) per mode (wall times of each run: "
             + "; ".join(f"{m}: " + ", ".join(f"{r.wall_s:.1f}" for r in runs
                                                if r.mode == m)
                         for m in ("workers", "dask local")) + " s)", "",
             *table(chosen, args.workers)]
    text = "\n".join(lines)
    print(text)
    if args.markdown:
        args.markdown.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
