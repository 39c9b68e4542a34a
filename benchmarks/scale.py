"""Issue 12's scale targets: the transformer block and a 50-statement element-wise chain.

    python benchmarks/scale.py [--repeats 3] [--hardware cpu upmem aie] [--time-limit 60]
                               [--chain-time-limit 10] [--no-validate] [--jobs N ...]

Each case runs `synth solve ... --json` in a child process `--repeats` times (the first
also validates unless --no-validate; the others pass --no-validate) and reports the median
solve time, the median whole-run time, the status, the proven gap and the validation.
Targets (issue 12): transformer at its default size solved (optimal, or gap <= 1%) in
under 10 s median on cpu, upmem and aie, validated; the 50-statement chain under 10 s
(and with --time-limit 10, the whole run under 15 s). `--jobs 1 2` runs every case with
`synth solve --jobs 1` and `--jobs 2` (candidates in worker processes), side by side per
case; without it, synth's default (the usable cores). The load average is printed beside
the timings: the machine may be shared. Exit code 0 even when a target fails (a
measurement tool); a bad command line exits 2.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

TARGET_S = 10.0
CHAIN_WALL_S = 15.0


def chain(n: int, size: int = 1048576) -> str:
    """`n` element-wise statements in a chain, f32 over `size` elements."""
    lines = [f"# chain of {n} element-wise statements", f"size N = {size}",
             "in x : f32[N]", "out y : f32[N]"]
    previous = "x"
    for k in range(1, n):
        lines.append(f"t{k}[i] = {previous}[i] * 0.5 + 0.25")
        previous = f"t{k}"
    lines.append(f"y[i] = {previous}[i] * 0.5 + 0.25")
    return "\n".join(lines) + "\n"


def run(args: list[str]) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-c", "from synth.cli import main; main()", *args,
                           "--json"],
                          capture_output=True, text=True, check=False)
    try:
        data: dict[str, Any] = json.loads(proc.stdout)
    except json.JSONDecodeError:
        return {"status": f"exit {proc.returncode}", "error": proc.stderr.strip()[-300:]}
    data["exit"] = proc.returncode
    return data


def case(label: str, args: list[str], repeats: int, validate: bool) -> dict[str, Any]:
    runs = []
    for k in range(repeats):
        extra = [] if validate and k == 0 else ["--no-validate"]
        runs.append(run([*args, *extra]))
    first = runs[0]
    solver = first.get("solver") or {}
    solves = [r["timings"]["solve"] for r in runs if "timings" in r and "solve" in r["timings"]]
    walls = [r["wall_s"] for r in runs if "wall_s" in r]
    validation = first.get("validation")
    return {
        "case": label, "status": first.get("status"), "gap": solver.get("gap"),
        "objective_ps": solver.get("objective"),
        "solve_median_s": statistics.median(solves) if solves else None,
        "solve_all_s": solves, "wall_median_s": statistics.median(walls) if walls else None,
        "validated": None if not validation else validation.get("passed"),
        "stats": solver.get("stats"), "load": os.getloadavg()[0],
        "error": first.get("error"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--hardware", nargs="+", default=["cpu", "upmem", "aie"])
    parser.add_argument("--time-limit", type=float, default=60.0)
    parser.add_argument("--chain-time-limit", type=float, default=10.0)
    parser.add_argument("--no-validate", action="store_true")
    parser.add_argument("--cases", nargs="+", default=["transformer", "chain50"],
                        choices=["transformer", "chain50"])
    parser.add_argument("--jobs", nargs="+", type=int, default=None,
                        help="synth solve --jobs values to run each case with")
    args = parser.parse_args(argv)
    jobs: list[int | None] = list(args.jobs) if args.jobs else [None]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "chain50.syn"
        path.write_text(chain(50), encoding="utf-8")
        for hw in args.hardware:
            for name, source, limit in (("transformer", "transformer", args.time_limit),
                                        ("chain50", str(path), args.chain_time_limit)):
                if name not in args.cases:
                    continue
                for n in jobs:
                    label = f"{name}/{hw}" + ("" if n is None else f" --jobs {n}")
                    extra = [] if n is None else ["--jobs", str(n)]
                    rows.append(case(label, ["solve", source, "--hw", hw, "--time-limit",
                                             str(limit), *extra],
                                     args.repeats, not args.no_validate))
                    print(json.dumps(rows[-1]), flush=True)
    print()
    print("| case | status | gap | solve median (s) | solves (s) | run median (s) | "
          "validated | load |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        solves = ", ".join(f"{s:.2f}" for s in r["solve_all_s"])
        median = r["solve_median_s"]
        wall = r["wall_median_s"]
        print(f"| {r['case']} | {r['status']} | {r['gap']} | "
              f"{'-' if median is None else f'{median:.2f}'} | {solves} | "
              f"{'-' if wall is None else f'{wall:.2f}'} | {r['validated']} | "
              f"{r['load']:.1f} |")
    print()
    for r in rows:
        median = r["solve_median_s"]
        ok = (median is not None and median < TARGET_S and r["status"] in ("optimal", "feasible")
              and (r["gap"] or 0) <= 0.01 and r["validated"] is not False)
        if r["case"].startswith("chain50"):
            ok = ok and r["wall_median_s"] is not None and r["wall_median_s"] < CHAIN_WALL_S
        print(f"{'PASS' if ok else 'FAIL'} {r['case']}: solve {median} s (target < "
              f"{TARGET_S:g} s), status {r['status']}, gap {r['gap']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
