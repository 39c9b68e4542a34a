"""Per kernel: the cpu model's time against the emitted C's, each kernel timed alone.

    python benchmarks/kernel_times.py WORKLOAD [--set N=V ...] [--fix VAR=INT ...]
                                      [--hw cpu] [--time-limit 120] [--runs 7]
                                      [--out DIR] [--json]

Solves WORKLOAD (without validation), emits the schedule as C into DIR (a temporary
directory by default), and builds beside `kernels.c` a library that includes it and
exports each kernel alone (`synth_kernel(k, tensors)`). After one run of every kernel in
order (a warm-up that also leaves each kernel's inputs as it finds them in a real run),
each kernel is called `--runs` times in a row; the table gives per kernel the model's
time (`kernel_objective` evaluated at the solution), the median wall time and the median
process CPU time divided by the kernel's threads (the time one thread works: a busy
shared machine inflates the wall time, not this), and measured / modelled. The load
average is printed beside. A measurement tool: exit 0 even when the C fails to build.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from synth import pipeline
from synth.constraints import combines, cost, intrinsic
from synth.constraints.expr import evaluate
from synth.emit.c_check import c_tensors
from synth.emit.cstyle import identifier

HARNESS = """#include "kernels.c"
#include <time.h>
typedef void (*synth_kernel_fn)(%(params)s);
static synth_kernel_fn synth_kernels_[] = {%(names)s};
int synth_kernel_count(void) { return %(count)d; }
void synth_kernel(int k, void **t) { synth_kernels_[k](%(args)s); }
"""


def modelled(outcome: pipeline.Outcome) -> dict[str, float]:
    """Each selected kernel's modelled time in seconds (its term of the objective)."""
    model, env = outcome.model, dict(outcome.result.env or {})
    domains = dict(model.factors.domains)
    times: dict[str, float] = {}
    for kernel in model.selected(env):
        kt = intrinsic.with_pack_choice(cost.with_buffer_choices(combines.with_combine_choices(
            cost.KernelTerms(kernel, model.factors, model.hw), domains), domains), domains)
        parts = cost.kernel_cost(kt, model.workload)
        # keyed as the emitted C names the kernel (`kernel_C_1_C_2` for C#1_C#2)
        times[identifier(kernel.name)] = evaluate(
            cost.kernel_objective(kt, model.workload, parts), env) * 1e-12
    return times


def harness(out: Path) -> list[str]:
    """Write harness.c beside kernels.c and build libharness.so; the kernels' names."""
    source = (out / "kernels.c").read_text()
    found = re.findall(r"^static void (kernel_\w+)\(([^)]*)\)", source, re.M)
    names = [name for name, _ in found]
    params = found[0][1]
    count = params.count(",") + 1
    types = re.findall(r"(\w+) \*restrict", params)
    args = ", ".join(f"({t} *)t[{i}]" for i, t in enumerate(types))
    (out / "harness.c").write_text(HARNESS % {
        "params": params, "names": ", ".join(names), "count": len(names), "args": args})
    assert len(types) == count
    flags = re.search(r"CFLAGS \?= (.*)", (out / "Makefile").read_text())
    assert flags is not None
    subprocess.run(["cc", *flags.group(1).split(), "-o", str(out / "libharness.so"),
                    str(out / "harness.c"), "-lm"], check=True, cwd=out)
    return [n.removeprefix("kernel_") for n in names]


def measure(out: Path, names: list[str], runs: int, threads: int) -> dict[str, dict[str, float]]:
    import pickle
    workload = pickle.loads((out / "data" / "workload.pkl").read_bytes())
    tensors = _tensors(workload, out)
    lib = ctypes.CDLL(str((out / "libharness.so").resolve()))
    pointers = (ctypes.c_void_p * len(tensors))(*(a.ctypes.data for a in tensors))
    for k in range(len(names)):  # warm-up, in order
        lib.synth_kernel(k, pointers)
    result: dict[str, dict[str, float]] = {}
    for k, name in enumerate(names):
        walls, cpus = [], []
        for _ in range(runs):
            w, c = time.perf_counter(), time.process_time()
            lib.synth_kernel(k, pointers)
            cpus.append(time.process_time() - c)
            walls.append(time.perf_counter() - w)
        result[name] = {"wall_s": statistics.median(walls),
                        "cpu_s": statistics.median(cpus) / threads}
    return result


def _tensors(workload: Any, out: Path) -> list[np.ndarray]:
    inputs = {t.name: np.load(out / "data" / f"input_{t.name}.npy") for t in workload.inputs}
    return list(c_tensors(workload, inputs).values())


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workload", nargs="?")
    parser.add_argument("--measure-child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--set", action="append", default=[])
    parser.add_argument("--fix", action="append", default=[])
    parser.add_argument("--hw", default="cpu")
    parser.add_argument("--time-limit", type=float, default=120.0)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--out", default=None)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--one-thread", action="store_true",
                        help="run every parallel region on one thread (OMP_THREAD_LIMIT=1) "
                        "and report its CPU time / the kernel's threads: the time per unit "
                        "when the units run alike, robust to a shared machine's load")
    args = parser.parse_args(argv)
    if args.measure_child:  # in a fresh process: no solver or BLAS threads around
        child = Path(args.measure_child)
        names = json.loads((child / "kernels.json").read_text())
        print(json.dumps(measure(child, names, args.runs, 1)))
        return 0
    if not args.workload:
        parser.error("a workload is required")
    out = Path(args.out or tempfile.mkdtemp(prefix="kernel_times_"))
    sizes = {k: int(v) for k, v in (s.split("=", 1) for s in args.set)}
    request = pipeline.Request(args.workload, args.hw, sizes, time_limit_s=args.time_limit,
                               validate=False, fixes=tuple(args.fix), emit="c",
                               out_dir=str(out))
    outcome = pipeline.run(request)
    model_s = modelled(outcome)
    names = harness(out)
    threads = int(re.search(r"synth_threads\(void\)\s*{\s*return (\d+);",
                            (out / "kernels.c").read_text()).group(1))  # type: ignore[union-attr]
    (out / "kernels.json").write_text(json.dumps(names))
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS=str(threads))
    if args.one_thread:
        env.update(OMP_THREAD_LIMIT="1", OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, __file__, "--measure-child", str(out),
                            "--runs", str(args.runs)], capture_output=True, text=True,
                           env=env, check=True)
    measured = {n: {"wall_s": v["wall_s"], "cpu_s": v["cpu_s"] / threads}
                for n, v in json.loads(done.stdout).items()}
    load = os.getloadavg()
    rows = [{"kernel": n, "model_ms": model_s.get(n, 0.0) * 1e3,
             "wall_ms": measured[n]["wall_s"] * 1e3, "cpu_ms": measured[n]["cpu_s"] * 1e3}
            for n in names]
    if args.json:
        print(json.dumps({"rows": rows, "load": load, "out": str(out)}, indent=1))
        return 0
    print(f"{args.workload} {' '.join(args.set)} {' '.join(args.fix)} on {args.hw}, "
          f"{threads} threads, median of {args.runs}; load average {load[0]:.2f}; C in {out}")
    print(f"{'kernel':<16} {'model ms':>9} {'wall ms':>9} {'cpu/thr ms':>10} {'wall/model':>10}")
    for r in rows:
        ratio = r["wall_ms"] / r["model_ms"] if r["model_ms"] else float("nan")
        print(f"{r['kernel']:<16} {r['model_ms']:9.3f} {r['wall_ms']:9.3f} {r['cpu_ms']:10.3f} "
              f"{ratio:10.2f}")
    total = {k: sum(r[k] for r in rows) for k in ("model_ms", "wall_ms", "cpu_ms")}
    ratio = total["wall_ms"] / total["model_ms"] if total["model_ms"] else float("nan")
    print(f"{'total':<16} {total['model_ms']:9.3f} {total['wall_ms']:9.3f} "
          f"{total['cpu_ms']:10.3f} {ratio:10.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
