"""Time the MLIR emitter and its check per built-in at a reduced size (median of 3).

    python benchmarks/mlir_emit.py [--workloads ...] [--hardware ...] [--repeats 3]

For each built-in on each hardware model: solve once, then `--repeats` times write the
three MLIR files (`emit`) and run the check (`check`: a child process that verifies
schedule.mlir, applies transform.mlir to source.mlir, lowers both to LLVM, JIT-compiles
and runs them on the validation inputs and compares with the reference). The target is
under 30 s per built-in for emission plus check; every check must pass.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from synth.emit.mlir import emit_mlir
from synth.emit.mlir_check import check_mlir
from synth.hwfile import list_builtin_hardware
from synth.lang import list_builtin_workloads
from synth.pipeline import Request, run
from synth.reference import evaluate, make_inputs

SIZES = {  # the sizes tests/test_emit_mlir.py checks at
    "attention": {"S": 8, "D": 4},
    "fa6": {"S": 16, "D": 8},
    "gemm2k": {"M": 16, "N": 16, "K": 16},
    "matmul": {"M": 16, "N": 8, "K": 16},
    "mv": {"M": 32, "N": 48},
    "red": {"N": 1000},
    "softmax": {"N": 999},
    "va": {"N": 1000},
}
TARGET_S = 30.0


def measure(workload: str, hw: str, repeats: int) -> tuple[str, list[float], list[float],
                                                            bool, int]:
    """(sizes, emit times, check times, every check passed, lines of schedule.mlir)."""
    outcome = run(Request(workload, hw, SIZES.get(workload, {}), validate=False))
    if outcome.program is None:
        raise SystemExit(f"{workload} on {hw}: no schedule ({outcome.result.status.value})")
    inputs = make_inputs(outcome.workload, 0)
    expected = evaluate(outcome.workload, inputs)
    emits, checks, passed = [], [], True
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(repeats):
            start = time.perf_counter()
            emission = emit_mlir(outcome.program, outcome.workload, outcome.hardware, tmp,
                                 inputs, expected)
            emits.append(time.perf_counter() - start)
            start = time.perf_counter()
            passed = check_mlir(emission.out_dir).passed and passed
            checks.append(time.perf_counter() - start)
        lines = len((Path(tmp) / "schedule.mlir").read_text().splitlines())
    sizes = " ".join(f"{k}={v}" for k, v in outcome.workload.sizes.items())
    return sizes, emits, checks, passed, lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="*", default=list_builtin_workloads())
    parser.add_argument("--hardware", nargs="*", default=list_builtin_hardware())
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    table = Table("workload", "hw", "sizes", "schedule.mlir lines", "emit", "check",
                  "total", "passed")
    worst, failures = 0.0, 0
    for workload in args.workloads:
        for hw in args.hardware:
            sizes, emits, checks, passed, lines = measure(workload, hw, args.repeats)
            emit, check = statistics.median(emits), statistics.median(checks)
            worst, failures = max(worst, emit + check), failures + (not passed)
            table.add_row(workload, hw, sizes, str(lines), f"{emit:.3f} s", f"{check:.2f} s",
                          f"{emit + check:.2f} s", "yes" if passed else "NO")
    Console(width=140).print(table)
    print(f"{'PASS' if failures == 0 else 'FAIL'} every check passed ({failures} failed)")
    print(f"{'PASS' if worst < TARGET_S else 'FAIL'} emission + check under {TARGET_S:g} s "
          f"per built-in (slowest {worst:.2f} s)")


if __name__ == "__main__":
    main()
