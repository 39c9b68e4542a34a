"""Checking `--emit ttlang`: run `program.py` under tt-lang's functional simulator
(`tt-lang-sim`, the `tt` extra) in a child process with a trace, count its DRAM tile
traffic with `tt-lang-sim-stats`, and compare every output with the reference.

A crash, a deadlock the simulator reports, a timeout, an output outside the reference's
error bounds, DRAM traffic different from the schedule's, or dataflow buffers (per
operation: how many, and their bytes, tiles x tile bytes x block_count, as `program.py`
declares them) other than the schedule's or past the core's limits is a failed check. The
1.1.6 wheel's `sim/diagnostics.py` loads a file the wheel does not ship, so a kernel error
would surface as a FileNotFoundError that hides the simulator's message: `python -m
synth.emit.ttlang_check --run program.py ...` runs the simulator with plain printers in
place of its formatted diagnostics.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from synth.errors import InputError

TRACE = "trace.jsonl"
MODEL = "model.json"  # the schedule's DRAM tiles and the outputs' dtypes, written at emit
L1_BYTES = 1432 * 1024  # the dataflow-buffer budget the simulator is told (the model's l1)
INSTALL = "pip install torch==2.13.0 tt-lang-sim==1.1.6 (or pip install -e '.[tt]')"


@dataclass(frozen=True)
class TtlangCheck:
    ran: bool  # the simulator ran the program to its end
    passed: bool  # ran, every output matched, traffic equal to the schedule's
    pcc: float | None  # the smallest Pearson correlation of an output with the reference
    max_abs_err: float | None
    dram_tiles_read: int | None  # counted by tt-lang-sim-stats
    dram_tiles_written: int | None
    model_tiles_read: int  # what the schedule moves
    model_tiles_written: int
    seconds: float
    log: str
    # per operation: [buffers, bytes] declared in program.py, [buffers, bytes] the
    # schedule holds (the cost model's count.buffers and capacity terms)
    buffers: Mapping[str, tuple[list[int], list[int]]] = field(default_factory=dict)


def require_simulator() -> None:
    """Checking needs the simulator: exit 2 with how to install it, before solving."""
    if importlib.util.find_spec("ttl") is None or importlib.util.find_spec("sim_stats") is None:
        raise InputError(f"--emit ttlang: checking needs tt-lang's simulator: {INSTALL}; "
                         "or pass --no-validate")


def check_ttlang(out_dir: str | Path, timeout_s: float = 600.0) -> TtlangCheck:
    """Simulate, count, compare."""
    out = Path(out_dir)
    start = time.perf_counter()
    model = json.loads((out / MODEL).read_text(encoding="utf-8"))
    reads, writes = model["tiles_read"], model["tiles_written"]
    buffers, fits, notes = compare_buffers(
        declared_buffers((out / "program.py").read_text(encoding="utf-8"),
                         model["tile_bytes"]), model)
    ok, log = run_simulator(out, timeout_s)
    if not ok:
        return TtlangCheck(False, False, None, None, None, None, reads, writes,
                           time.perf_counter() - start, "\n".join([log, *notes]), buffers)
    traffic = dram_traffic(out / TRACE)
    pcc, err, lines, matched = compare_outputs(out, model["outputs"])
    same = traffic == (reads, writes)
    lines.append(f"DRAM tiles read/written: simulator {traffic[0]}/{traffic[1]}, schedule "
                 f"{reads}/{writes}: {'equal' if same else 'DIFFERENT'}")
    return TtlangCheck(True, matched and same and fits, pcc, err, traffic[0], traffic[1],
                       reads, writes, time.perf_counter() - start,
                       log + "\n".join([*lines, *notes]), buffers)


DECLARATION = re.compile(r"(\w+)_dfb = ttl\.make_dataflow_buffer_like\((\w+), "
                         r"shape=\((\d+), (\d+)\), block_count=(\d+)\)")


def declared_buffers(source: str, tile_bytes: Mapping[str, int]) -> dict[str, list[int]]:
    """Per operation of `program.py` (`def op_...` after `@ttl.operation`), its dataflow
    buffers and their bytes: tiles of the block x the tensor's tile bytes x block_count
    (what the simulator allocates in L1)."""
    out: dict[str, list[int]] = {}
    operation = None
    for line in source.splitlines():
        found = re.match(r"def (op_\w+)\(", line)
        if found:
            operation = found.group(1)
            out[operation] = [0, 0]
        declared = DECLARATION.search(line)
        if declared and operation is not None:
            _, tensor, rows, cols, blocks = declared.groups()
            out[operation][0] += 1
            out[operation][1] += int(rows) * int(cols) * int(blocks) * tile_bytes[tensor]
    return out


def compare_buffers(declared: Mapping[str, list[int]], model: Mapping[str, Any]
                    ) -> tuple[dict[str, tuple[list[int], list[int]]], bool, list[str]]:
    """The declared buffers against the schedule's (equal) and the core's limits."""
    schedule = {op: list(numbers) for op, numbers in model["buffers"].items()}
    limit, l1 = model["max_buffers"], model["l1_bytes"]
    both = {op: (declared.get(op, [0, 0]), schedule.get(op, [0, 0]))
            for op in {**schedule, **declared}}
    notes, fits = [], True
    for op, (mine, theirs) in sorted(both.items()):
        equal = mine == theirs
        within = mine[0] <= limit and mine[1] <= l1
        fits = fits and equal and within
        if not equal or not within:
            notes.append(f"dataflow buffers of {op}: program.py declares {mine[0]} "
                         f"({mine[1]} bytes), the schedule holds {theirs[0]} ({theirs[1]} "
                         f"bytes), a core has {limit} ({l1} bytes): "
                         f"{'DIFFERENT' if not equal else 'PAST THE LIMIT'}")
    if fits:
        notes.append(f"dataflow buffers: as the schedule's in every operation (at most "
                     f"{max((m[0] for m, _ in both.values()), default=0)} of {limit}, "
                     f"{max((m[1] for m, _ in both.values()), default=0)} of {l1} bytes)")
    return both, fits, notes


def run_simulator(out: Path, timeout_s: float) -> tuple[bool, str]:
    """`program.py` under the simulator in a child process (its own session, killed
    whole on timeout); ok when it exits 0 having written every output."""
    args = [sys.executable, "-m", "synth.emit.ttlang_check", "--run", "program.py",
            "--trace", TRACE, "--max-l1", str(L1_BYTES)]
    proc = subprocess.Popen(args, cwd=out, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        text, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        text, _ = proc.communicate()
        return False, f"the simulation timed out after {timeout_s:g} s\n{text[-4000:]}"
    if proc.returncode != 0:
        how = (f"killed by signal {-proc.returncode}" if proc.returncode < 0
               else f"exit {proc.returncode}")
        return False, f"the simulator failed ({how})\n{text[-4000:]}"
    return True, text[-2000:]


def dram_traffic(trace: Path) -> tuple[int, int]:
    """DRAM tiles read and written, from `tt-lang-sim-stats`' tensor table (TOTAL row:
    ... DRAM R, DRAM W, Tiles R, Tiles W)."""
    proc = subprocess.run([sys.executable, "-m", "sim_stats", str(trace)], capture_output=True,
                          text=True, timeout=600, check=False)
    for line in proc.stdout.splitlines():
        if line.startswith("TOTAL"):
            numbers = [int(n) for n in re.findall(r"\d+", line)]
            if len(numbers) >= 8:
                return numbers[4], numbers[5]
    return (-1, -1)  # no table: no copies recorded


def compare_outputs(out: Path, outputs: Mapping[str, str]
                    ) -> tuple[float | None, float | None, list[str], bool]:
    """Each output against the reference within its error bound (`synth.reference`)."""
    from synth.reference import compare
    from synth.workload import DType
    pccs, errs, lines, matched = [], [], [], True
    for name, dtype in outputs.items():
        expected = np.load(out / "data" / f"expected_{name}.npy")
        actual = np.load(out / "data" / f"actual_{name}.npy")
        bound = np.load(out / "data" / f"bound_{name}.npy")
        result = compare(expected, actual, DType(dtype), bound)
        pcc = pearson(expected, actual)
        pccs.append(pcc)
        errs.append(result[1])
        matched = matched and bool(result[0])
        lines.append(f"{name}: {'matches' if result[0] else 'DIFFERS from'} the reference "
                     f"(max abs err {result[1]:.3g}, PCC {pcc:.6f})")
    return (min(pccs) if pccs else None), (max(errs) if errs else None), lines, matched


def pearson(expected: np.ndarray, actual: np.ndarray) -> float:
    e, a = np.ravel(expected).astype(np.float64), np.ravel(actual).astype(np.float64)
    keep = np.isfinite(e) & np.isfinite(a)
    if keep.sum() < 2 or np.std(e[keep]) == 0 or np.std(a[keep]) == 0:
        return 1.0 if np.array_equal(e, a) else 0.0
    value = float(np.corrcoef(e[keep], a[keep])[0, 1])
    return value if math.isfinite(value) else 0.0


# ---------------------------------------------------------------- the child


def _plain_error(name: str, message: str, source_file: str, source_line: int,
                 source_col: int = 1) -> None:
    print(f"\nerror in {name}: {message} ({source_file}:{source_line})")


def _plain_warning(message: str, source_file: str, source_line: int, nodes_label: str,
                   flush: bool = True) -> None:
    print(f"warning ({nodes_label}): {message} ({source_file}:{source_line})", flush=flush)


def _simulate(argv: list[str]) -> None:
    """Run tt-lang-sim with plain diagnostics (see the module docstring)."""
    import ttl.sim.diagnostics as diagnostics
    from ttl.sim import ttlang_sim
    patched: dict[str, Any] = {"print_diagnostic_error": _plain_error,
                               "print_diagnostic_warning": _plain_warning}
    for module in ("diagnostics", "greenlet_scheduler", "program", "analysis", "debug_print",
                   "dfb"):
        loaded = importlib.import_module(f"ttl.sim.{module}")
        for attribute, replacement in patched.items():
            if hasattr(loaded, attribute):
                setattr(loaded, attribute, replacement)
    assert diagnostics.print_diagnostic_error is _plain_error
    sys.argv = ["tt-lang-sim", *argv]
    ttlang_sim.main()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--run"]:
        _simulate(sys.argv[2:])
    else:
        print(json.dumps(check_ttlang(sys.argv[1]).__dict__))
