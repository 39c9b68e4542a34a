"""synth's emitted C against NumPy (issue 11, item 5).

    python benchmarks/c_vs_numpy.py [--workloads NAME ...] [--hw cpu] [--no-blas]
                                    [--gemm-size 1024] [--json]

For every built-in workload at its default size on `cpu` (or `--hw`, e.g. a calibrated
model): the optimum, emitted as C, built, checked against the reference and timed by
`synth.emit.c_check` (median of at least 5 runs after a warm-up, the compiled computation
only), beside NumPy evaluating the same workload (`synth.numpy_eval`) timed the same way;
the ratio is NumPy's time over synth's (above 1: synth is faster). Then an f32 GEMM
(`benchmarks/workloads/matmul_f32.syn` at `--gemm-size`^3, default 1024) the same way,
and also against NumPy's BLAS (`np.matmul` on the same f32 inputs, timed the same way).
Targets (issue 11; printed as PASS/FAIL): softmax, the row normalisation, attention and
fa6 at least 2x NumPy; the f32 GEMM at least 0.6x NumPy's BLAS; no built-in slower than
NumPy. Exit 0 unless the command line is bad or a check fails (1).

Timings are wall-clock: run it on a quiet machine (the load average is printed).
`--one-thread` measures one thread's worth of work instead, on a machine that is not
quiet: the emitted code with every parallel region on one thread (`OMP_THREAD_LIMIT=1`)
against NumPy on one BLAS thread, both as the calling thread's CPU time, median of 7
calls (`synth.emit.c_check`, `one_thread`); the 2x targets then read as 1x per thread.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from synth import pipeline
from synth.calibrate import cpu_name
from synth.constraints import cpsat
from synth.emit.c import emit_c
from synth.emit.c_check import ONE_THREAD_ENV, ONE_THREAD_RUNS, check_c, median_time
from synth.hwfile import load_hardware
from synth.ir.materialize import materialize
from synth.lang import list_builtin_workloads, load_workload
from synth.measure import reference_data

HERE = Path(__file__).resolve().parent
GEMM = HERE / "workloads" / "matmul_f32.syn"
AT_LEAST_2X = ("softmax", "layernorm", "rownorm", "attention", "fa6")
BLAS_TARGET = 0.6


@dataclass(frozen=True)
class Row:
    name: str
    sizes: str
    passed: bool
    synth_s: float | None
    numpy_s: float | None
    blas_s: float | None = None

    @property
    def vs_numpy(self) -> float | None:
        if self.synth_s is None or self.numpy_s is None or self.synth_s <= 0:
            return None
        return self.numpy_s / self.synth_s

    @property
    def vs_blas(self) -> float | None:
        if self.synth_s is None or self.blas_s is None or self.synth_s <= 0:
            return None
        return self.blas_s / self.synth_s


def blas_one_thread(n: int) -> float:
    """np.matmul of two n x n f32 matrices on one BLAS thread, its thread CPU time
    (median of ONE_THREAD_RUNS after a warm-up), in a child whose BLAS starts with one
    thread (the variable is read when NumPy loads its BLAS)."""
    code = ("import time, statistics, numpy as np\n"
            f"a = np.random.default_rng(0).random(({n}, {n}), dtype=np.float32)\n"
            "b = a.T.copy(); a @ b\nts = []\n"
            f"for _ in range({ONE_THREAD_RUNS}):\n"
            "    t = time.thread_time(); a @ b; ts.append(time.thread_time() - t)\n"
            "print(statistics.median(ts))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env=os.environ | ONE_THREAD_ENV)
    return float(out.stdout.strip().splitlines()[-1])


def measure(name: str, workload_ref: str, sizes: dict[str, int], hw_ref: str,
            time_limit_s: float, blas: bool, one_thread: bool = False) -> Row:
    workload = load_workload(workload_ref, sizes)
    hw = load_hardware(hw_ref)
    model = pipeline.encode(workload, hw)
    result = cpsat.solve(model.constraints, time_limit_s)
    shown = " ".join(f"{k}={v}" for k, v in workload.sizes.items())
    if result.env is None:
        print(f"  {name}: no schedule ({result.status.value})", file=sys.stderr)
        return Row(name, shown, False, None, None)
    program = materialize(model, result.env)
    inputs, expected, bounds = reference_data(workload)
    with tempfile.TemporaryDirectory(prefix="c-vs-numpy-") as tmp:
        emit_c(program, workload, hw, Path(tmp), inputs, expected, bounds)
        check = check_c(tmp, one_thread=one_thread)
    blas_s = None
    if blas and check.passed and one_thread:
        blas_s = blas_one_thread(workload.sizes["M"])
    elif blas and check.passed:
        a, b = (np.ascontiguousarray(inputs[t.name], dtype=np.float32)
                for t in workload.inputs)
        blas_s = median_time(lambda: np.matmul(a, b))
    row = Row(name, shown, check.passed, check.run_s, check.numpy_s, blas_s)
    print(f"  {name}: synth {_ms(row.synth_s)}, NumPy {_ms(row.numpy_s)}"
          + (f", BLAS {_ms(blas_s)}" if blas_s is not None else "")
          + ("" if check.passed else " (check FAILED)"), file=sys.stderr, flush=True)
    return row


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.3f} ms"


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def print_table(rows: list[Row], one_thread: bool = False) -> None:
    """The table and the targets' verdicts; on one thread the 2x targets (2 cores against
    NumPy's mostly single-threaded element-wise code) are 1x per thread."""
    print("| workload | sizes | synth C (ms) | NumPy (ms) | NumPy / synth | "
          "np.matmul BLAS (ms) | BLAS / synth |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r.name} | {r.sizes} | {_ms(r.synth_s).removesuffix(' ms')} | "
              f"{_ms(r.numpy_s).removesuffix(' ms')} | {_ratio(r.vs_numpy)} | "
              f"{_ms(r.blas_s).removesuffix(' ms')} | {_ratio(r.vs_blas)} |")
    print()
    for r in rows:
        if r.blas_s is not None:
            ok = r.vs_blas is not None and r.vs_blas >= BLAS_TARGET
            print(f"{'PASS' if ok else 'FAIL'}: {r.name}: at least {BLAS_TARGET}x NumPy's BLAS")
        elif r.name in AT_LEAST_2X and not one_thread:
            ok = r.vs_numpy is not None and r.vs_numpy >= 2
            print(f"{'PASS' if ok else 'FAIL'}: {r.name}: at least 2x NumPy")
        ok = r.vs_numpy is not None and r.vs_numpy >= 1
        print(f"{'PASS' if ok else 'FAIL'}: {r.name}: not slower than NumPy")


def main(argv: list[str] | None = None) -> int:
    builtins = list_builtin_workloads()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="*", choices=builtins, default=builtins,
                        metavar="NAME", help="built-ins to run (default all)")
    parser.add_argument("--hw", default="cpu", help="hardware model (default cpu)")
    parser.add_argument("--gemm-size", type=int, default=1024,
                        help="the f32 GEMM's M = N = K (default 1024)")
    parser.add_argument("--no-blas", action="store_true", help="skip the f32 GEMM")
    parser.add_argument("--time-limit", type=float, default=60.0,
                        help="solver time limit per workload, seconds (default 60)")
    parser.add_argument("--one-thread", action="store_true",
                        help="one thread's work as thread CPU time (both sides on one "
                             "thread), for a machine that is not quiet")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object instead of the table")
    args = parser.parse_args(argv)
    load = os.getloadavg()
    about = {"cpu": cpu_name(), "cpus": os.cpu_count(),
             "load_average": [round(x, 2) for x in load],
             "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    about["timing"] = ("one thread, thread CPU time" if args.one_thread
                       else "wall clock, the schedule's threads")
    print(f"C vs NumPy on {args.hw}: {about}", file=sys.stderr)
    rows = [measure(name, name, {}, args.hw, args.time_limit, False, args.one_thread)
            for name in args.workloads]
    if not args.no_blas:
        n = args.gemm_size
        rows.append(measure(f"f32 GEMM {n}^3", str(GEMM), {"M": n, "N": n, "K": n},
                            args.hw, args.time_limit, True, args.one_thread))
    after = [round(x, 2) for x in os.getloadavg()]
    if args.json:
        print(json.dumps({"hardware": args.hw, "machine": about, "load_average_after": after,
                          "rows": [r.__dict__ | {"vs_numpy": r.vs_numpy,
                                                 "vs_blas": r.vs_blas} for r in rows]},
                         indent=2))
    else:
        print(f"machine: {about}; load average after: {after}\n")
        print_table(rows, args.one_thread)
    return 0 if all(r.passed for r in rows) else 1



if __name__ == "__main__":
    raise SystemExit(main())
