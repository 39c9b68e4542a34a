"""`--emit mlir` in the emitter table (see `synth.emit.targets`): `synth.emit.mlir` writes
the files, `synth.emit.mlir_check` checks them with upstream MLIR in a child process."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from synth.emit.mlir import emit_mlir
from synth.emit.mlir_check import MlirCheck, check_mlir, require_bindings
from synth.hardware import Hardware
from synth.ir.nodes import Program
from synth.workload import Workload

CHECK_KEYS = ("verified", "transform_applied", "executed", "passed", "max_abs_err")


class MlirTarget:
    name = "mlir"

    def require(self, hw: Hardware, validate: bool) -> None:
        if validate:
            require_bindings()  # checking needs torch-mlir: say so before solving

    def emit(self, program: Program, workload: Workload, hw: Hardware, out_dir: Path,
             inputs: Mapping[str, np.ndarray], expected: Mapping[str, np.ndarray],
             bounds: Mapping[str, np.ndarray]) -> tuple[Path, ...]:
        return emit_mlir(program, workload, hw, out_dir, inputs, expected, bounds).files

    def check(self, out_dir: Path) -> MlirCheck:
        return check_mlir(out_dir)

    def json(self, check: object) -> dict[str, object]:
        """`verified`, `transform_applied`, `executed`, `passed`, `max_abs_err`,
        `seconds`, `log`."""
        found = check if isinstance(check, MlirCheck) else None
        data: dict[str, object] = {key: getattr(found, key) if found else None
                                   for key in CHECK_KEYS}
        data["seconds"] = found.seconds if found else None
        data["log"] = found.log[-4000:] if found else None
        return data

    def lines(self, path: str, files: Sequence[str], check: object) -> str:
        """The MLIR files, and how far upstream MLIR got with them: verified, transformed,
        run against the reference (MLIR's diagnostics when a step failed)."""
        sources = [f for f in files if f.endswith(".mlir")]
        head = f"emitted MLIR to {path}: {', '.join(sources)}"
        if not isinstance(check, MlirCheck):
            return head + " (not checked: --no-validate)"
        steps = [f"schedule.mlir {'verified' if check.verified else 'does NOT verify'}",
                 f"transform.mlir {'applied' if check.transform_applied else 'NOT applied'}",
                 f"both {'ran' if check.executed else 'did NOT run'}"]
        error = ("" if check.max_abs_err is None
                 else f", max abs err {check.max_abs_err:.3g}")
        verdict = "passed" if check.passed else "FAILED"
        lines = [head, f"MLIR check (upstream MLIR via torch-mlir, reference data): "
                       f"{verdict}: {', '.join(steps)}{error} ({check.seconds:.2f} s)"]
        if not check.passed:
            lines += check.log.strip().splitlines()[-25:]
        return "\n".join(lines)


TARGET = MlirTarget()
