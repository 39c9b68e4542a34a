"""`--emit c` in the emitter table (see `synth.emit.targets`): `synth.emit.c` writes the
files, `synth.emit.c_check` builds, checks and times them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from synth.emit.c import CFLAGS, HEADER, emit_c
from synth.emit.c_check import CCheck, check_c
from synth.emit.cstyle import EmitError
from synth.hardware import Hardware
from synth.ir.nodes import Program
from synth.workload import Workload


class CTarget:
    """`--emit c` (see `synth.emit.targets`): for models whose units are this machine's
    cores (one level of parallel units below the root, run as OpenMP threads)."""

    name = "c"

    def require(self, hw: Hardware, validate: bool) -> None:
        if len(hw.levels) != 2 or hw.streams:
            levels = " > ".join(lvl.name for lvl in hw.levels)
            raise EmitError(f"--emit c runs a schedule on this machine's cores: it needs a "
                            f"hardware model with one level of units below the root (the "
                            f"cores, as in `cpu`); {hw.name} has levels {levels}")

    def emit(self, program: Program, workload: Workload, hw: Hardware, out_dir: Path,
             inputs: Mapping[str, np.ndarray], expected: Mapping[str, np.ndarray],
             bounds: Mapping[str, np.ndarray]) -> tuple[Path, ...]:
        return emit_c(program, workload, hw, out_dir, inputs, expected, bounds).files

    def check(self, out_dir: Path) -> CCheck:
        return check_c(out_dir)

    def json(self, check: object) -> dict[str, object]:
        """`passed`, `max_abs_err`, `max_rel_err`, `run_s`, `numpy_s`,
        `speedup_vs_numpy`, `threads`, `seconds`, `log`."""
        found = check if isinstance(check, CCheck) else None
        keys = ("passed", "max_abs_err", "max_rel_err", "run_s", "numpy_s",
                "speedup_vs_numpy", "threads", "seconds")
        data: dict[str, object] = {key: getattr(found, key) if found else None for key in keys}
        data["log"] = found.log[-4000:] if found else None
        return data

    def lines(self, path: str, files: Sequence[str], check: object) -> str:
        head = f"emitted C to {path}: kernels.c, {HEADER}, Makefile"
        if not isinstance(check, CCheck):
            return head + " (not checked: --no-validate)"
        if not check.built:
            return "\n".join([head, "build FAILED:", *check.log.strip().splitlines()[-15:]])
        verdict = "passed" if check.passed else "FAILED"
        lines = [head, f"C check (cc {' '.join(CFLAGS[:4])}, reference data): {verdict}, "
                       f"max abs err {check.max_abs_err:.3g} ({check.seconds:.2f} s)"]
        if check.run_s is not None and check.numpy_s is not None:
            lines.append(f"measured: {_time(check.run_s)} per run on {check.threads} "
                         f"thread(s), NumPy {_time(check.numpy_s)}: "
                         f"{check.speedup_vs_numpy:.2f}x NumPy's speed")
        if not check.passed:
            lines += check.log.strip().splitlines()[-15:]
        return "\n".join(lines)


def _time(seconds: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.4g} {unit}"
    return f"{seconds / 1e-9:.4g} ns"


TARGET = CTarget()
