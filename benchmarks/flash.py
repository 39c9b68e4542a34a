"""Issue 15: attention with the online-softmax rewrite chosen freely against forbidden.

    python benchmarks/flash.py [--sizes 512 1024 2048 4096] [--head-dim 64]
                               [--hardware cpu upmem aie wormhole blackhole]
                               [--time-limit 60] [--emit-c-at 2048 [--fix VAR=INT ...]
                               [--hw-set KEY=VALUE ...] [--cores 1] [--runs 7]]
                               [--json PATH]

For each hardware model and sequence length S, `synth solve attention --set S=.. --set
D=..` runs twice in a child process (without validation: the model's verdict is what is
compared): with the rewrite free, and with it forbidden (`--fix online.<kernel>=0` for
every online candidate kernel). The table gives both modelled costs, their ratio
(forbidden / free: above 1 where the rewrite pays), which kernels the free schedule
runs online, and the solve times. With `--emit-c-at S`, the schedule on `cpu` at that
length (free, or with `--fix`es) is also emitted as C, checked against the reference and
timed side by side with NumPy's attention in one child process, `--cores` threads each
(OpenMP and OpenBLAS): a warm-up and `--runs` calls of the C, then the same of NumPy
(not alternated: see `measure_child`), medians of the wall clock and
of the calling thread's CPU time (one thread's work when the C runs one: the load of a
shared machine does not count), the load average beside them. Exit code 0 even when a
run fails (a measurement tool); a bad command line exits 2.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
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


def emitted_c(size: int, head: int, time_limit: float, fixes: list[str], cores: int,
              runs: int, hw_set: list[str]) -> dict[str, Any]:
    """The schedule on cpu at S=`size` (free, or with `fixes`), emitted as C, checked
    against the reference and timed side by side with NumPy's attention in one child
    process with `cores` threads each (OpenMP and OpenBLAS)."""
    env = dict(os.environ, OPENBLAS_NUM_THREADS=str(cores), OMP_NUM_THREADS=str(cores))
    args = [sys.executable, __file__, "--measure-child", json.dumps(
        {"S": size, "D": head, "time_limit": time_limit, "fixes": fixes, "cores": cores,
         "runs": runs, "hw_set": hw_set})]
    proc = subprocess.run(args, capture_output=True, text=True, env=env)
    try:
        return dict(json.loads(proc.stdout.strip().splitlines()[-1]))
    except (json.JSONDecodeError, IndexError):
        return {"S": size, "D": head, "error": (proc.stdout + proc.stderr)[-2000:]}


def measure_child(spec: dict[str, Any]) -> dict[str, Any]:
    """In the child: solve, materialise, emit, build, check, then `runs` calls of the
    emitted C and `runs` of NumPy's attention (`synth.numpy_eval`), each timed
    by the wall clock and by this thread's CPU time (the work of one thread when the C
    runs one: a shared machine's load does not count), medians."""
    import ctypes
    import statistics
    import time
    from pathlib import Path

    from synth import numpy_eval
    from synth.constraints import cpsat
    from synth.emit.c import LIBRARY, emit_c
    from synth.emit.c_check import _compare, build, c_tensors
    from synth.ir.materialize import materialize
    from synth.pipeline import encode
    from synth.reference import compare, evaluate_errors, make_inputs

    workload = load_workload("attention", {"S": spec["S"], "D": spec["D"]})
    hw = load_hardware("cpu", (f"core.count=1..{spec['cores']}", *spec["hw_set"]))
    model = encode(workload, hw, fixes=spec["fixes"])
    start = time.perf_counter()
    result = cpsat.solve(model.constraints, spec["time_limit"])
    solve_s = time.perf_counter() - start
    if result.env is None:
        return {**spec, "status": str(result.status), "error": "no schedule"}
    env = result.env
    program = materialize(model, env)
    inputs = make_inputs(workload)
    expected, bounds = evaluate_errors(workload, inputs)
    with tempfile.TemporaryDirectory() as out:
        emit_c(program, workload, hw, out, inputs, expected, bounds)
        built, log = build(Path(out))
        if not built:
            return {**spec, "error": log[-2000:]}
        tensors = c_tensors(workload, inputs)
        lib = ctypes.CDLL(str(Path(out, LIBRARY).resolve()))
        pointers = (ctypes.c_void_p * len(tensors))(*(a.ctypes.data for a in tensors.values()))
        lib.synth_run(pointers)
        errors, _ = _compare(workload, tensors, Path(out), compare)
        times: dict[str, list[float]] = {k: [] for k in ("c_wall", "c_cpu", "np_wall", "np_cpu")}
        # each side's rounds in a block of its own, after a warm-up: alternating them,
        # OpenBLAS's threads still spin after a NumPy call while the C's OpenMP threads
        # wait at their barriers for the same 2 cores (the model's S=2048 schedule: 8.1-9.0
        # ms alone, 25-53 ms alternated with NumPy, on a quiet machine)
        for name, call in (("c", lambda: lib.synth_run(pointers)),
                           ("np", lambda: numpy_eval.evaluate(workload, inputs))):
            call()
            for _ in range(spec["runs"]):
                wall, cpu = time.perf_counter(), time.thread_time()
                call()
                times[f"{name}_cpu"].append(time.thread_time() - cpu)
                times[f"{name}_wall"].append(time.perf_counter() - wall)
        threads = int(lib.synth_threads())
    median = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    kernels = {k.name for k in program.kernels}
    tiles = {k: v for k, v in env.items() if v != 1 and k.count(".") == 2
             and k.split(".")[1] in kernels and k.split(".")[0] != "ext"}
    return {**spec, "status": str(result.status), "objective_ms": (
        result.objective / 1e9 if result.objective is not None else None),
        "solve_s": solve_s, "online": chosen_online({"variables": dict(env)}),
        "tiles": tiles, "passed": all(ok for ok, _, _ in errors.values()),
        "threads": threads, **{f"{k}_ms": v for k, v in median.items()},
        "load": os.getloadavg()[0]}


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
    parser.add_argument("--fix", action="append", default=[],
                        help="with --emit-c-at: a --fix of the emitted schedule")
    parser.add_argument("--hw-set", action="append", default=[],
                        help="with --emit-c-at: a --hw-set of the cpu model")
    parser.add_argument("--cores", type=int, default=1,
                        help="with --emit-c-at: threads of the C and of NumPy's BLAS")
    parser.add_argument("--runs", type=int, default=7, help="with --emit-c-at: rounds")
    parser.add_argument("--json", default=None, help="also write the rows to this file")
    parser.add_argument("--measure-child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.measure_child:
        print(json.dumps(measure_child(json.loads(args.measure_child))))
        return 0
    rows = []
    for hw in args.hardware:
        for size in args.sizes:
            rows.append(point(hw, size, args.head_dim, args.time_limit))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    print(table(rows))
    report: dict[str, Any] = {"rows": rows}
    if args.emit_c_at:
        report["c"] = emitted_c(args.emit_c_at, args.head_dim, args.time_limit, args.fix,
                                args.cores, args.runs, args.hw_set)
        c = report["c"]
        print(f"\n{json.dumps(c)}")
        if "c_cpu_ms" in c:
            print(f"\ncpu, S={c['S']} D={c['D']}, {c['threads']} thread(s), online kernels "
                  f"{c['online'] or '-'}, tiles {c['tiles']}, check passed {c['passed']}: "
                  f"C {c['c_wall_ms']:.2f} ms wall / {c['c_cpu_ms']:.2f} ms thread CPU, "
                  f"NumPy {c['np_wall_ms']:.2f} / {c['np_cpu_ms']:.2f} ms: "
                  f"{c['np_wall_ms'] / c['c_wall_ms']:.2f}x / "
                  f"{c['np_cpu_ms'] / c['c_cpu_ms']:.2f}x NumPy's speed "
                  f"(medians of {c['runs']}, load {c['load']:.1f})")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(report, out, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
