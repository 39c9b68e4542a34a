"""The overhead of `synth sweep`: the issue's 200-point sweep with local workers and on Dask.

    python benchmarks/sweep_overhead.py [--workers 2] [--repeats 1] [--modes workers,dask]
                                        [--markdown PATH] [--keep DIR]

The sweep (written as a spec file, `SPEC` below) is issue 16's: every built-in workload
(13: the script stops if `synth list` has another) at 5 sizes, on the three models
`upmem`, `cpu` and `aie`: 13 x 5 x 3 = 195 points. The sizes are each workload's
smallest sensible ones that still grow (one size varies, 5 values; the transformer
block, mha and swiglu at D = 256, H = 4, F = 704, whose upmem point still takes ~20 s).
It runs as `synth sweep SPEC --out DIR --force` in its own process, once with
`--workers N` and once with `--dask local --workers N`, `--repeats` times each
(alternating), and each run's wall time (the whole command: start, every point, tables,
plots, page) is compared with its points' solve times, read from its `results.jsonl`:

    target (issue 16): wall <= 1.3 * (sum of solve times) / N + 0.3 s * points

The table also gives the overhead per point, (wall - sum of solve times / N) / points,
and the same against the points' whole run times (`wall_s`: parse, encode, solve,
materialise, verify, prove), which is what the workers really spend per point.

A measurement tool: it exits 0 even when a target fails. Timings are wall-clock and the
solve times are measured while N workers share the machine: run it on an idle machine
(the load average at the start and at the end of each run is printed).
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

POWERS = "1024..262144:x4"  # 1Ki, 4Ki, 16Ki, 64Ki, 256Ki
SPEC = f"""
# benchmarks/sweep_overhead.py: every built-in x 5 sizes x upmem, cpu, aie (195 points)
workloads = [
    {{ name = "attention", sizes = [{{ S = 16, D = 16 }}, {{ S = 32, D = 16 }},
                                  {{ S = 64, D = 16 }}, {{ S = 64, D = 32 }},
                                  {{ S = 128, D = 32 }}] }},
    {{ name = "fa6", sizes = [{{ S = 32, D = 32 }}, {{ S = 64, D = 32 }}, {{ S = 96, D = 32 }},
                            {{ S = 128, D = 32 }}, {{ S = 128, D = 64 }}] }},
    {{ name = "gemm2k", sizes = [{{ M = 16, N = 32, K = 16 }}, {{ M = 32, N = 64, K = 32 }},
                               {{ M = 64, N = 64, K = 32 }}, {{ M = 64, N = 128, K = 64 }},
                               {{ M = 128, N = 64, K = 128 }}] }},
    {{ name = "layernorm", sizes = {{ S = "64..1024:x2", D = 1024 }} }},
    {{ name = "matmul", sizes = [{{ M = 16, N = 16, K = 16 }}, {{ M = 32, N = 32, K = 32 }},
                               {{ M = 64, N = 64, K = 64 }}, {{ M = 96, N = 96, K = 96 }},
                               {{ M = 128, N = 128, K = 128 }}] }},
    {{ name = "mha", sizes = {{ B = 1, H = 4, S = "32..512:x2", E = 64 }} }},
    {{ name = "mv", sizes = [{{ M = 64, N = 64 }}, {{ M = 128, N = 128 }}, {{ M = 256, N = 256 }},
                           {{ M = 512, N = 512 }}, {{ M = 1024, N = 1024 }}] }},
    {{ name = "red", sizes = {{ N = "{POWERS}" }} }},
    {{ name = "rmsnorm", sizes = {{ S = "64..1024:x2", D = 1024 }} }},
    {{ name = "softmax", sizes = {{ N = "{POWERS}" }} }},
    {{ name = "swiglu", sizes = {{ S = "32..512:x2", D = 256, F = 704 }} }},
    {{ name = "transformer", sizes = {{ S = "32..512:x2", D = 256, H = 4, E = 64, F = 704 }} }},
    {{ name = "va", sizes = {{ N = "{POWERS}" }} }},
]
hardware = ["upmem", "cpu", "aie"]
time_limit = 60
"""
SIZES_PER_WORKLOAD = 5
MODELS = ("upmem", "cpu", "aie")
MODES = {"workers": [], "dask": ["--dask", "local"]}


def check_spec(spec: Path) -> int:
    """The spec is the issue's sweep: every built-in, 5 sizes each, the three models;
    its number of points."""
    from synth.lang import list_builtin_workloads
    from synth.sweep import points
    from synth.sweep import spec as sweep_spec

    expanded = points.expand(sweep_spec.from_file(str(spec)))
    workloads = sorted({p.workload for p in expanded})
    if workloads != sorted(list_builtin_workloads()):
        raise SystemExit(f"the benchmark sweeps {workloads}, the built-ins are "
                         f"{sorted(list_builtin_workloads())}: update SPEC")
    per = {w: len({p.sizes for p in expanded if p.workload == w}) for w in workloads}
    wrong = {w: n for w, n in per.items() if n != SIZES_PER_WORKLOAD}
    models = tuple(dict.fromkeys(p.hardware for p in expanded))
    if wrong or models != MODELS:
        raise SystemExit(f"sizes per workload {wrong}, models {models}: update SPEC")
    return len(expanded)


@dataclass(frozen=True)
class Run:
    mode: str  # "workers" or "dask"
    wall_s: float
    points: int
    solve_s: float  # the sum of the points' solve times
    point_wall_s: float  # the sum of the points' whole run times
    statuses: dict[str, int]
    load: tuple[str, str]  # the 1-minute load average before and after

    def bound(self, workers: int) -> float:
        return FACTOR * self.solve_s / workers + PER_POINT_S * self.points

    def overhead(self, total: float, workers: int) -> float:
        return (self.wall_s - total / workers) / self.points

    def flags(self, workers: int) -> str:
        return " ".join([f"--workers {workers}", *MODES[self.mode]])


def load_average() -> str:
    return f"{os.getloadavg()[0]:.2f}"


def run_sweep(spec: Path, out: Path, mode: str, workers: int) -> Run:
    command = [sys.executable, "-m", "synth.cli", "sweep", str(spec), "--out", str(out),
               "--force", "--workers", str(workers), *MODES[mode]]
    before = load_average()
    start = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{shlex.join(command)} exited {done.returncode}: {done.stdout}"
                         f"{done.stderr[-3000:]}")
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    statuses: dict[str, int] = {}
    for row in rows:
        statuses[row["status"]] = statuses.get(row["status"], 0) + 1
    return Run(mode, wall, len(rows), sum(r["solve_s"] or 0 for r in rows),
               sum(r["wall_s"] for r in rows), statuses, (before, load_average()))


def table(runs: Sequence[Run], workers: int) -> list[str]:
    lines = ["| flags | points | statuses | load before/after | wall [s] | sum of solve [s] "
             f"| target: {FACTOR} x solve / {workers} + {PER_POINT_S} s x points [s] | "
             "overhead per point vs solve [s] | sum of point runs [s] | overhead per point "
             "vs runs [s] | target |",
             "|---|---:|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for run in runs:
        statuses = ", ".join(f"{n} {s}" for s, n in sorted(run.statuses.items()))
        verdict = "PASS" if run.wall_s <= run.bound(workers) else "FAIL"
        lines.append(
            f"| `{run.flags(workers)}` | {run.points} | {statuses} | {run.load[0]} / "
            f"{run.load[1]} | {run.wall_s:.1f} | {run.solve_s:.1f} | "
            f"{run.bound(workers):.1f} | {run.overhead(run.solve_s, workers):.3f} | "
            f"{run.point_wall_s:.1f} | {run.overhead(run.point_wall_s, workers):.3f} | "
            f"{verdict} |")
    return lines


def medians(runs: Sequence[Run]) -> list[Run]:
    """Per mode, the run of median wall time."""
    out = []
    for mode in dict.fromkeys(r.mode for r in runs):
        mine = sorted((r for r in runs if r.mode == mode), key=lambda r: r.wall_s)
        out.append(mine[(len(mine) - 1) // 2])
    return out


def per_workload(out: Path) -> list[str]:
    """The kept sweep's solve times per workload and model (where the time goes)."""
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    lines = ["| workload | " + " | ".join(f"{m} solve [s]" for m in MODELS) + " |",
             "|---|" + "---:|" * len(MODELS)]
    for workload in workloads:
        cells = [sum(r["solve_s"] or 0 for r in rows
                     if r["workload"] == workload and r["hardware"] == model)
                 for model in MODELS]
        lines.append(f"| {workload} | " + " | ".join(f"{c:.1f}" for c in cells) + " |")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--modes", default="workers,dask",
                        help="comma list of: workers (--workers N), dask (--dask local)")
    parser.add_argument("--markdown", type=Path)
    parser.add_argument("--keep", type=Path, help="write the sweeps' directories here")
    args = parser.parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",")]
    if not modes or any(m not in MODES for m in modes):
        parser.error(f"--modes: expected a comma list of {', '.join(MODES)}")
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    runs = []
    with tempfile.TemporaryDirectory(prefix="sweep-bench-") as tmp:
        root = args.keep or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        spec = root / "sweep.toml"
        spec.write_text(SPEC, encoding="utf-8")
        total = check_spec(spec)
        print(f"{total} points per run; load average {load}", flush=True)
        for repeat in range(args.repeats):
            for mode in modes:
                out = root / f"out-{mode}"
                run = run_sweep(spec, out, mode, args.workers)
                print(f"repeat {repeat + 1}, {run.flags(args.workers)}: {run.wall_s:.1f} s, "
                      f"{run.points} points, solve {run.solve_s:.1f} s, load "
                      f"{run.load[0]} -> {run.load[1]}", flush=True)
                runs.append(run)
        where = per_workload(root / f"out-{modes[0]}")
    chosen = medians(runs)
    command = (f"python benchmarks/sweep_overhead.py --workers {args.workers} "
               f"--repeats {args.repeats}" + (f" --modes {args.modes}"
                                              if args.modes != "workers,dask" else ""))
    lines = [f"Command: `{command}`", "",
             f"Machine: {platform.processor() or platform.machine()}, "
             f"{os.cpu_count()} logical cores, load average at start {load}, "
             f"python {platform.python_version()}, git {git_revision()}", "",
             f"Median of {args.repeats} run(s) per mode (wall times of each run: "
             + "; ".join(f"{m}: " + ", ".join(f"{r.wall_s:.1f}" for r in runs
                                                if r.mode == m)
                         for m in modes) + " s)", "",
             *table(chosen, args.workers), "",
             f"Solve times per workload and model (the last `{modes[0]}` run):", "",
             *where]
    text = "\n".join(lines)
    print(text)
    if args.markdown:
        args.markdown.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
