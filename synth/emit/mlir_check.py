"""Check emitted MLIR with upstream MLIR (the bindings torch-mlir ships): verify
schedule.mlir, apply transform.mlir to source.mlir with the transform interpreter, lower
both to LLVM, run them with the ExecutionEngine on the validation inputs and compare their
outputs with the reference under `synth.reference.compare`'s tolerances.

The emitter writes the inputs and the reference outputs beside the MLIR files
(`check/`, see `write_check_data`), so the check reads only the directory:
`python -m synth.emit.mlir_check DIR` runs it and prints what it found. `check_mlir` runs
exactly that in a child process, because a broken program (or an upstream bug: some
transform ops abort on inputs they do not support) can crash the process it runs in; the
child reports each step as it passes, so a crash still says how far it got.
torch-mlir is imported only in the child, so synth works without it
(`--emit mlir --no-validate` writes the files all the same).

Lowering for this CPU: `scf.forall` runs as `scf.for` (its units are independent by
construction, so any order is one of its executions), and memory spaces are dropped
(every memory is host memory here; upstream's LLVM lowering would otherwise make each
space an LLVM address space that `free` does not take). The transformed source is
bufferized with one-shot-bufferize; its copies become `linalg.copy` before lowering,
because the `memref.copy` of strided views calls a runtime library the bindings do not
ship.
"""

from __future__ import annotations

import ctypes
import dataclasses
import importlib.util
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from synth.errors import SynthError
from synth.reference import compare
from synth.workload import DType, Workload

__all__ = ["MlirCheck", "MlirUnavailable", "check_mlir", "require_bindings", "run_check",
           "write_check_data"]

INSTALL_HINT = "pip install 'synth[mlir]' (torch-mlir==20261001)"
DATA = "check"  # the directory of the check's data, inside the output directory
STEP = "step: "  # how the child reports a step it passed
RESULT = "result: "  # and its verdict

BUFFERIZE = ("builtin.module(canonicalize, cse, one-shot-bufferize{"
             "bufferize-function-boundaries function-boundary-type-conversion=identity-layout-map "
             "allow-return-allocs-from-loops}, buffer-results-to-out-params{"
             "modify-public-functions}, canonicalize, buffer-deallocation-pipeline, "
             "convert-bufferization-to-memref)")
TO_LLVM = ("builtin.module(scf-forall-to-for, func.func(convert-linalg-to-loops), "
           "convert-math-to-llvm, convert-math-to-libm, expand-strided-metadata, lower-affine, "
           "convert-scf-to-cf, finalize-memref-to-llvm, convert-arith-to-llvm, "
           "convert-cf-to-llvm, convert-func-to-llvm, reconcile-unrealized-casts)")
MEMREF_COPY = re.compile(r"memref\.copy (%[\w.$-]+), (%[\w.$-]+) : (.+) to (.+)$", re.M)


class MlirUnavailable(SynthError):
    """The MLIR checker needs the torch-mlir bindings (exit code 2)."""

    exit_code = 2


@dataclass(frozen=True)
class MlirCheck:
    """How far the emitted MLIR got: each step passed, and the outputs' largest error."""

    verified: bool  # schedule.mlir parsed and verified
    transform_applied: bool  # transform.mlir ran on source.mlir
    executed: bool  # both ran on the inputs
    passed: bool  # and both matched the reference
    max_abs_err: float | None
    seconds: float
    log: str  # what went wrong (MLIR's diagnostics), and the per-output errors


@dataclass
class _Steps:
    verified: bool = False
    transform_applied: bool = False
    executed: bool = False
    errors: list[float] = field(default_factory=list)
    log: list[str] = field(default_factory=list)
    passed: bool = True
    announce: Callable[[str], None] = lambda step: None

    def reached(self, step: str) -> None:
        setattr(self, step, True)
        self.announce(step)


# ---------------------------------------------------------------- the data


def write_check_data(out_dir: Path, workload: Workload, entry: str,
                     inputs: Mapping[str, np.ndarray], expected: Mapping[str, np.ndarray],
                     bounds: Mapping[str, np.ndarray] | None = None) -> list[Path]:
    """The inputs, the reference outputs (with their error bounds, `bound_<name>.npy`,
    when given: see `synth.reference.evaluate_bounds`) and how to call @entry, under
    `out_dir/check`."""
    data = out_dir / DATA
    data.mkdir(parents=True, exist_ok=True)
    written = []
    for kind, tensors, values in (("input", workload.inputs, inputs),
                                  ("expected", workload.outputs, expected)):
        for tensor in tensors:
            path = data / f"{kind}_{tensor.name}.npy"
            np.save(path, np.asarray(values[tensor.name], dtype=tensor.dtype.numpy))
            written.append(path)
    for tensor in workload.outputs:
        if bounds is not None and tensor.name in bounds:
            path = data / f"bound_{tensor.name}.npy"
            np.save(path, np.asarray(bounds[tensor.name], dtype=np.float64))
            written.append(path)
    manifest = {"entry": entry,
                "inputs": [{"name": t.name, "dtype": t.dtype.value} for t in workload.inputs],
                "outputs": [{"name": t.name, "dtype": t.dtype.value} for t in workload.outputs]}
    (data / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return [*written, data / "manifest.json"]


# ---------------------------------------------------------------- the check, in a child


def require_bindings() -> None:
    """Raise MlirUnavailable unless torch-mlir is installed (without importing it)."""
    if importlib.util.find_spec("torch_mlir") is None:
        raise MlirUnavailable(f"checking emitted MLIR needs the upstream MLIR bindings of "
                              f"torch-mlir: {INSTALL_HINT}, or pass --no-validate to only "
                              f"write the files")


def check_mlir(out_dir: str | Path, timeout_s: float = 600.0) -> MlirCheck:
    """Run `python -m synth.emit.mlir_check out_dir` and read its verdict; a crash or a
    timeout is a failed check with what the child printed."""
    require_bindings()
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "synth.emit.mlir_check", str(out_dir)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        err += f"\nthe MLIR check timed out after {timeout_s:g} s"
    for line in out.splitlines():
        if line.startswith(RESULT):
            return MlirCheck(**json.loads(line[len(RESULT):]))
    steps = {line[len(STEP):] for line in out.splitlines() if line.startswith(STEP)}
    how = (f"killed by signal {-proc.returncode}" if proc.returncode < 0
           else f"exit code {proc.returncode}")
    log = f"the MLIR check crashed ({how}):\n{err.strip()[-4000:]}"
    return MlirCheck("verified" in steps, "transform_applied" in steps, False, False, None,
                     time.perf_counter() - start, log)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m synth.emit.mlir_check DIR", file=sys.stderr)
        return 2
    result = run_check(Path(argv[0]), lambda step: print(f"{STEP}{step}", flush=True))
    print(result.log)
    print(RESULT + json.dumps(dataclasses.asdict(result)), flush=True)
    return 0 if result.passed else 1


@dataclass(frozen=True)
class Bindings:
    """The parts of upstream MLIR's Python bindings (as torch-mlir ships them) used here."""

    ir: Any
    passmanager: Any
    execution_engine: Any
    runtime: Any
    interpreter: Any


def _mlir() -> Bindings:
    try:
        from torch_mlir import execution_engine, ir, passmanager, runtime
        from torch_mlir.dialects.transform import interpreter
    except ImportError as err:
        raise MlirUnavailable(f"checking emitted MLIR needs the upstream MLIR bindings of "
                              f"torch-mlir ({err}): {INSTALL_HINT}") from None
    return Bindings(ir, passmanager, execution_engine, runtime, interpreter)


def run_check(out_dir: Path, announce: Callable[[str], None] = lambda step: None
              ) -> MlirCheck:
    """Verify, transform, lower and run the files in `out_dir` in this process (each
    step passed is `announce`d). Passes only when every step works and every output of
    both runs matches the reference."""
    mlir = _mlir()
    start = time.perf_counter()
    manifest = json.loads((out_dir / DATA / "manifest.json").read_text())
    steps = _Steps(announce=announce)
    with mlir.ir.Context(), mlir.ir.Location.unknown():
        schedule = _step(steps, "schedule.mlir does not verify",
                         lambda: _parse(mlir, out_dir / "schedule.mlir"))
        if schedule is not None:
            steps.reached("verified")
        source = _step(steps, "transform.mlir does not apply to source.mlir",
                       lambda: _transformed(mlir, out_dir))
        if source is not None:
            steps.reached("transform_applied")
        runs = [("schedule.mlir", schedule, _lower_schedule),
                ("source.mlir after transform.mlir", source, _lower_source)]
        ran = 0
        for what, module, lower in runs:
            if module is None:
                continue
            outputs = _step(steps, f"{what} does not lower or run",
                            _runner(mlir, module, lower, out_dir, manifest))
            if outputs is not None:
                ran += 1
                _compare(steps, what, out_dir, manifest, outputs)
        if ran == len(runs):
            steps.reached("executed")
    passed = steps.verified and steps.transform_applied and steps.executed and steps.passed
    return MlirCheck(steps.verified, steps.transform_applied, steps.executed, passed,
                     max(steps.errors) if steps.errors else None,
                     time.perf_counter() - start, "\n".join(steps.log))


def _runner(mlir: Bindings, module: Any, lower: Callable[[Any, Any], Any], out_dir: Path,
            manifest: Mapping[str, Any]) -> Callable[[], dict[str, np.ndarray]]:
    return lambda: _run(mlir, lower(mlir, module), out_dir, manifest)


def _step(steps: _Steps, what: str, action: Callable[[], Any]) -> Any:
    """Run one step; MLIR's diagnostics go into the log when it fails."""
    try:
        return action()
    except Exception as err:  # the bindings raise MLIRError, ValueError, RuntimeError
        steps.log.append(f"{what}:\n{err}")
        return None


def _parse(mlir: Bindings, path: Path) -> Any:
    module = mlir.ir.Module.parse(path.read_text())
    if not module.operation.verify():
        raise ValueError(f"{path.name}: verification failed")
    return module


def _transformed(mlir: Bindings, out: Path) -> Any:
    source = _parse(mlir, out / "source.mlir")
    script = _parse(mlir, out / "transform.mlir")
    main = next((op for op in script.body.operations if "sym_name" in op.attributes
                 and str(op.attributes["sym_name"]) == '"__transform_main"'), None)
    if main is None:
        raise ValueError("transform.mlir: expected a named sequence @__transform_main")
    mlir.interpreter.apply_named_sequence(source.operation, main, script)
    if not source.operation.verify():
        raise ValueError("the transformed source.mlir does not verify")
    return source


# ---------------------------------------------------------------- lowering


def _lower_schedule(mlir: Bindings, module: Any) -> Any:
    module = mlir.ir.Module.parse(str(module))  # a copy: the checked module stays intact
    return _to_llvm(mlir, module)


def _lower_source(mlir: Bindings, module: Any) -> Any:
    mlir.passmanager.PassManager.parse(BUFFERIZE).run(module.operation)
    copies = MEMREF_COPY.sub(r"linalg.copy ins(\1 : \3) outs(\2 : \4)", str(module))
    return _to_llvm(mlir, mlir.ir.Module.parse(copies))


def _to_llvm(mlir: Bindings, module: Any) -> Any:
    _default_space(mlir, module)
    if not module.operation.verify():
        raise ValueError("the module does not verify with memory spaces dropped")
    mlir.passmanager.PassManager.parse(TO_LLVM).run(module.operation)
    return module


def _default_space(mlir: Bindings, module: Any) -> None:
    """Every memref of the module in the default memory space (this CPU's memory)."""
    ir = mlir.ir

    def plain(value: Any) -> None:
        memref = value.type.maybe_downcast()
        if isinstance(memref, ir.MemRefType) and memref.memory_space is not None:
            value.set_type(ir.MemRefType.get(memref.shape, memref.element_type,
                                             memref.layout, None))

    def visit(op: Any) -> Any:
        for result in op.results:
            plain(result)
        for region in op.regions:
            for block in region.blocks:
                for argument in block.arguments:
                    plain(argument)
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)


# ---------------------------------------------------------------- running


def _poison(dtype: np.dtype) -> float | int:
    """What outputs start as, so that an element nothing writes cannot pass."""
    return math.nan if dtype.kind == "f" else int(np.iinfo(dtype).min) + 7


def _load(out_dir: Path, kind: str, name: str) -> np.ndarray:
    return np.load(out_dir / DATA / f"{kind}_{name}.npy")


def _run(mlir: Bindings, module: Any, out_dir: Path, manifest: Mapping[str, Any]
         ) -> dict[str, np.ndarray]:
    """Call @entry(inputs..., outputs...) and return the outputs."""
    engine = mlir.execution_engine.ExecutionEngine(module, opt_level=2)
    arrays = [np.ascontiguousarray(_load(out_dir, "input", t["name"]))
              for t in manifest["inputs"]]
    outputs = {}
    for tensor in manifest["outputs"]:
        like = _load(out_dir, "expected", tensor["name"])
        outputs[tensor["name"]] = np.full(like.shape, _poison(like.dtype), dtype=like.dtype)
    arrays += list(outputs.values())
    descriptors = [ctypes.pointer(ctypes.pointer(
        mlir.runtime.get_ranked_memref_descriptor(a))) for a in arrays]
    engine.invoke(manifest["entry"], *descriptors)
    return outputs


def _compare(steps: _Steps, what: str, out_dir: Path, manifest: Mapping[str, Any],
             outputs: Mapping[str, np.ndarray]) -> None:
    for tensor in manifest["outputs"]:
        name = tensor["name"]
        bound = out_dir / DATA / f"bound_{name}.npy"
        passed, abs_err, rel_err, _, _ = compare(
            _load(out_dir, "expected", name), outputs[name], DType(tensor["dtype"]),
            np.load(bound) if bound.exists() else None)
        steps.errors.append(abs_err)
        verdict = "matches the reference" if passed else "DIFFERS from the reference"
        steps.log.append(f"{what}: {name} {verdict} (max abs err {abs_err:.3g}, "
                         f"max rel err {rel_err:.3g})")
        steps.passed = steps.passed and passed


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
