"""The UPMEM emitter: a solved loop nest as C for the UPMEM SDK, and a way to check it.

`emit_upmem(program, workload, hw, out_dir, inputs, expected)` writes into `out_dir`:

- `host.c`: the host program (UPMEM SDK host API). It allocates R x D DPUs once; per
  kernel it loads `dpu_<kernel>`, packs each DPU's tiles and moves them into MRAM with
  parallel transfers (a broadcast when every DPU gets the same tile), launches, moves the
  results back, and combines partial results of split reductions. It reads its inputs
  from `data/input_<tensor>.bin`, writes `data/output_<tensor>.bin` and compares them with
  `data/expected_<tensor>.bin`, exiting 1 on a mismatch.
- `dpu_<kernel>.c`: one DPU program per kernel (UPMEM SDK DPU API).
- `Makefile`: `make` builds both with the SDK; `make check` builds them with plain `cc`
  against the stand-in runtime (`upmem_runtime/`, copied from synth, plus one glue file
  `standin_dpu_<kernel>.c` per kernel) and runs the program.

`check_upmem(out_dir)` runs `make check` and says whether it passed.
The DPU programs are written by `upmem_dpu`, host.c by `upmem_host`, the Makefile, the
stand-in glue and the data files by `upmem_files`, from the kernels `upmem_plan` splits.

How the IR maps onto UPMEM (levels host > rank > dpu > tasklet, memories host > mram >
wram): in each kernel, the part from the rank and dpu loops inward runs on the DPUs and
is one launch; the host loops around it repeat the launch. DPU d of the set runs the
unit (rank d / D, dpu d % D) of those loops, passed in `args`; DPUs beyond the kernel's
units get `args.active = 0` and return at once. MRAM buffers are `__mram_noinit` arrays
filled and drained by the host. Inside the DPU, tasklet loops become `me()`, sequential
MRAM loops run in every tasklet, WRAM tiles are `__dma_aligned` arrays with one tile per
tasklet, and transfers are `mram_read`/`mram_write` in runs of at most 2048 bytes. Work
outside tasklet loops (filling a combine buffer, combining the tasklets' partial results
on the DPU) is done by tasklet 0, and a barrier separates writes to a buffer the tasklets
share (MRAM, a combine buffer) from reads by another tasklet.

Double buffering (`BufferDecl.buffers == 2`, see `PingPong`): a WRAM tile allocated in the
steps of a sequential loop takes two halves and step i works on half i & 1. Its load is
issued one step ahead: step i loads tile i + 1 into the other half before computing on
tile i (tile 0 is loaded before the loop), unless something in the loop writes the
load's source (an accumulator read back from MRAM is loaded in place). `mram_read` blocks
the calling tasklet (one `ldma` instruction), so within a tasklet this only orders the
transfers; on the hardware the DMA overlaps with the other tasklets' compute, with or
without double buffering (see `upmem_runtime/SDK_NOTES.md`). The DPU runtime has no libm:
math functions come from `upmem_runtime/dpu_math.c`, copied into the DPU programs. The
online rewrite's running maximum and rescales (`Running`, `Rescale`) are loops over a
tasklet's own WRAM tiles, written by `upmem_online`.

Every buffer is laid out as the cost model counts it: partial results first, then rows
whose innermost axis is padded to 8 bytes, so every DMA run starts 8-byte aligned. Tiles
are copied whole between MRAM and WRAM; elements outside the tensor (a ragged last tile)
are skipped where it matters: computes stop at the tensor's edge, and the host copies
only elements inside the tensor.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from synth.emit.cstyle import EmitError
from synth.emit.upmem_dpu import DpuWriter
from synth.emit.upmem_files import (
    copy_runtime,
    glue,
    makefile,
    remove_stale,
    write_data,
    write_tolerances,
)
from synth.emit.upmem_host import HostWriter
from synth.emit.upmem_plan import LEVELS, MEMORIES, Target, plan_program
from synth.hardware import Hardware
from synth.ir.nodes import Program
from synth.reference import evaluate_errors
from synth.workload import Workload

__all__ = ["CheckResult", "Emission", "EmitError", "check_upmem", "emit_upmem"]



# ---------------------------------------------------------------- public API


@dataclass(frozen=True)
class CheckResult:
    passed: bool
    log: str  # what `make check` printed (build and run)
    seconds: float


@dataclass(frozen=True)
class Emission:
    out_dir: Path
    files: tuple[Path, ...]  # every file written
    kernels: tuple[str, ...]  # C names of the kernels: dpu_<name>.c


def emit_upmem(program: Program, workload: Workload, hw: Hardware, out_dir: str | Path,
               inputs: Mapping[str, np.ndarray], expected: Mapping[str, np.ndarray],
               bounds: Mapping[str, np.ndarray] | None = None) -> Emission:
    """Write the host program, the DPU programs, the Makefile, the stand-in runtime and
    the data files into `out_dir` (created if needed). `bounds` are the outputs' error
    scales (`synth.reference.evaluate_errors`, computed here when not given), from which
    the tolerances of the program's check are made. Raises EmitError for a loop nest
    this emitter cannot express."""
    target = Target.of(program, hw)
    plans = plan_program(program, target)
    dpus = [DpuWriter(plan, workload, target).render() for plan in plans]
    host = HostWriter(program, workload, target).render(plans, dpus)
    out = Path(out_dir)
    (out / "data").mkdir(parents=True, exist_ok=True)
    remove_stale(out)
    files = {out / "host.c": host, out / "Makefile": makefile(program, workload, target, dpus)}
    for dpu in dpus:
        files[out / f"dpu_{dpu.ident}.c"] = dpu.source
        files[out / f"standin_dpu_{dpu.ident}.c"] = glue(dpu)
    for path, text in files.items():
        path.write_text(text)
    written = list(files) + copy_runtime(out / "upmem_runtime")
    written += write_data(out / "data", workload, inputs, expected)
    if bounds is None:
        bounds = evaluate_errors(workload, inputs)[1]
    written += write_tolerances(out / "data", workload, expected, bounds)
    return Emission(out, tuple(written), tuple(d.ident for d in dpus))


def check_upmem(out_dir: str | Path, timeout_s: float = 600.0) -> CheckResult:
    """Run `make check` in `out_dir`: build against the stand-in runtime and run. Passes
    only when the build succeeds and every output matches the reference."""
    start = time.perf_counter()
    jobs = str(max(1, min(os.cpu_count() or 1, 8)))
    try:
        proc = subprocess.Popen(["make", "--no-print-directory", f"-j{jobs}", "check"],
                                cwd=out_dir, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
    except OSError as err:
        return CheckResult(False, f"cannot run make: {err}", time.perf_counter() - start)
    try:
        log, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # make and the program it started
        log, _ = proc.communicate()
        log += f"\nmake check: timed out after {timeout_s:g} s\n"
        return CheckResult(False, log, time.perf_counter() - start)
    return CheckResult(proc.returncode == 0, log, time.perf_counter() - start)


# ---------------------------------------------------------------- the --emit table entry


class UpmemTarget:
    """`--emit upmem` (see `synth.emit.targets`)."""

    name = "upmem"

    def require(self, hw: Hardware, validate: bool) -> None:
        levels = tuple(lvl.name for lvl in hw.levels)
        memories = tuple(m.name for m in hw.memories)
        if levels != LEVELS or memories != MEMORIES:
            raise EmitError(f"--emit upmem needs a hardware model with levels "
                            f"{' > '.join(LEVELS)} and memories {' > '.join(MEMORIES)}; "
                            f"{hw.name} has levels {' > '.join(levels)} and memories "
                            f"{' > '.join(memories)}")

    def emit(self, program: Program, workload: Workload, hw: Hardware, out_dir: Path,
             inputs: Mapping[str, np.ndarray], expected: Mapping[str, np.ndarray],
             bounds: Mapping[str, np.ndarray]) -> tuple[Path, ...]:
        return emit_upmem(program, workload, hw, out_dir, inputs, expected, bounds).files

    def check(self, out_dir: Path) -> CheckResult:
        return check_upmem(out_dir)

    def json(self, check: object) -> dict[str, object]:
        """`passed`, `seconds`, `log` (the end of what `make check` printed)."""
        found = check if isinstance(check, CheckResult) else None
        return {"passed": found.passed if found else None,
                "seconds": found.seconds if found else None,
                "log": found.log[-4000:] if found else None}

    def lines(self, path: str, files: Sequence[str], check: object) -> str:
        """Where the source went, and how `make check` went (the end of its log when it
        failed)."""
        sources = [f for f in files if f.endswith(".c") and "/" not in f
                   and not f.startswith("standin_")]
        head = f"emitted upmem C to {path}: {', '.join(sources)}, Makefile"
        if not isinstance(check, CheckResult):
            return head + " (not checked: --no-validate)"
        verdict = "passed" if check.passed else "FAILED"
        lines = [head, f"make check (stand-in runtime, reference data): {verdict} "
                       f"({check.seconds:.2f} s)"]
        if not check.passed:
            lines += check.log.strip().splitlines()[-15:]
        return "\n".join(lines)


TARGET = UpmemTarget()
