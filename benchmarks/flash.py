"""Issue 15: attention with the online-softmax rewrite chosen freely against forbidden.

    python benchmarks/flash.py [--sizes 512 1024 2048 4096] [--head-dim 64]
                               [--hardware cpu upmem aie wormhole blackhole]
                               [--time-limit 60] [--emit-c-at 2048] [--json PATH]

For each hardware model and sequence length S, `synth solve attention --set S=.. --set
D=..` runs twice in a child process (without validation: the model's verdict is what is
compared): with the rewrite free, and with it forbidden (`--fix online.<kernel>=0` for
every online candidate kernel). On the tiled models (wormhole, blackhole) the group
`online.ttlang` (tt-lang cannot emit the rewrite yet) is dropped: the table shows what
the cost model would choose there. The table gives both modelled costs, their ratio
(forbidden / free: above 1 where the rewrite pays), which kernels the free schedule
runs online, and the solve times. With `--emit-c-at S`, the free schedule on `cpu` at
that length is also emitted as C, checked against the reference and timed against
NumPy's attention (the load average beside it: the machine may be shared). Exit code 0
even when a run fails (a measurement tool); a bad command line exits 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from typing import Any

from scale import run  # benchmarks/ is the script's directory

from synth.constraints.space import candidate_kernels
from synth.hwfile import load_hardware
from synth.lang import load_workload

HARDWARE = ("cpu", "upmem", "aie", "wormhole", "blackhole")


def online_kernels(workload: str, sizes: dict[str, int]) -> list[str]:
    """The candidate kernels of `workload` that run only with the online rewrite."""
    return [k.name for k in candidate_kernels(load_workload(workload, sizes))
            if k.online is not None]


def solve(args: list[str]) -> dict[str, Any]:
    """`synth solve ARGS --json` in its own process (scale.run), the report plus "exit"."""
    return run(["solve", *args])


def _objective(run: dict[str, Any]) -> int | None:
    value = (run.get("solver") or {}).get("objective")
    return int(value) if value is not None else None


def chosen_online(run: dict[str, Any]) -> list[str]:
    variables = run.get("variables") or {}
    return sorted(name.removeprefix("online.") for name, value in variables.items()
                  if name.startswith("online.") and value == 1)


def point(hw: str, size: int, head: int, time_limit: float) -> dict[str, Any]:
    sizes = {"S": size, "D": head}
    base = ["attention", "--hw", hw, "--set", f"S={size}", "--set", f"D={head}",
            "--time-limit", str(time_limit), "--no-validate"]
    if load_hardware(hw).compute.tiling.edge:  # tt-lang's models: what the model would pay
        base += ["--drop", "online.ttlang"]
    free = solve(base)
    forbid = [a for name in online_kernels("attention", sizes)
              for a in ("--fix", f"online.{name}=0")]
    forbidden = solve([*base, *forbid])
    cost_free, cost_forbidden = _objective(free), _objective(forbidden)
    return {
        "hardware": hw, "S": size, "D": head,
        "status_free": free.get("status"), "status_forbidden": forbidden.get("status"),
        "cost_free_ps": cost_free, "cost_forbidden_ps": cost_forbidden,
        "ratio": (cost_forbidden / cost_free if cost_free and cost_forbidden else None),
        "online": chosen_online(free),
        "solve_free_s": (free.get("timings") or {}).get("solve"),
        "solve_forbidden_s": (forbidden.get("timings") or {}).get("solve"),
        "load": os.getloadavg()[0],
        "error": free.get("error") or forbidden.get("error"),
    }


def emitted_c(size: int, head: int, time_limit: float) -> dict[str, Any]:
    """The free schedule on cpu at S=`size`, emitted as C, checked and timed."""
    with tempfile.TemporaryDirectory() as out:
        run = solve(["attention", "--hw", "cpu", "--set", f"S={size}", "--set",
                     f"D={head}", "--time-limit", str(time_limit), "--emit", "c",
                     "--out", out])
    c = (run.get("emitted") or {}).get("c") or {}
    return {"S": size, "D": head, "status": run.get("status"), "online": chosen_online(run),
            "passed": c.get("passed"), "run_s": c.get("run_s"), "numpy_s": c.get("numpy_s"),
            "speedup_vs_numpy": c.get("speedup_vs_numpy"), "threads": c.get("threads"),
            "load": os.getloadavg()[0], "error": run.get("error")}


def _ms(ps: int | None) -> str:
    return "-" if ps is None else f"{ps / 1e9:.3f}"


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| hardware | S | free (ms) | forbidden (ms) | ratio | online kernels | "
             "solve free / forbidden (s) | load |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.2f}x"
        solves = "/".join("-" if r[k] is None else f"{r[k]:.2f}"
                          for k in ("solve_free_s", "solve_forbidden_s"))
        status = "" if r["status_free"] == "optimal" else f" ({r['status_free']})"
        lines.append(f"| {r['hardware']} | {r['S']} | {_ms(r['cost_free_ps'])}{status} | "
                     f"{_ms(r['cost_forbidden_ps'])} | {ratio} | "
                     f"{', '.join(r['online']) or '-'} | {solves} | {r['load']:.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[512, 1024, 2048, 4096])
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--hardware", nargs="+", default=list(HARDWARE))
    parser.add_argument("--time-limit", type=float, default=60.0)
    parser.add_argument("--emit-c-at", type=int, default=None)
    parser.add_argument("--json", default=None, help="also write the rows to this file")
    args = parser.parse_args(argv)
    rows = []
    for hw in args.hardware:
        for size in args.sizes:
            rows.append(point(hw, size, args.head_dim, args.time_limit))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    print(table(rows))
    report: dict[str, Any] = {"rows": rows}
    if args.emit_c_at:
        report["c"] = emitted_c(args.emit_c_at, args.head_dim, args.time_limit)
        c = report["c"]
        speed = c["speedup_vs_numpy"]
        print(f"\ncpu, S={c['S']} D={c['D']}: online kernels {c['online'] or '-'}, C check "
              f"{c['passed']}, {c['run_s']} s per run vs NumPy {c['numpy_s']} s: "
              f"{'-' if speed is None else f'{speed:.2f}x'} NumPy's speed "
              f"(load {c['load']:.1f})")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(report, out, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
