"""`--emit c`: the C that synth writes for the `cpu` model builds, runs and matches the
reference, for every built-in, for random schedules and for random workloads; under
AddressSanitizer and UBSan too; and the check catches wrong or out-of-bounds code.

Sizes are reduced (the check compiles and runs in well under a second each); the
measured speed against NumPy is a benchmark (`benchmarks/c_vs_numpy.py`), not a test."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pytest
from conftest import Case, build, optimal_program, sample
from hypothesis import HealthCheck, given, settings
from strategies import workloads

from synth import numpy_eval
from synth.emit.c import emit_c
from synth.emit.c_check import ALIGN, CCheck, aligned, c_tensors, check_c
from synth.emit.c_target import TARGET
from synth.hwfile import load_hardware
from synth.ir.materialize import materialize
from synth.ir.nodes import Program
from synth.lang import load_workload
from synth.reference import evaluate, evaluate_errors, make_inputs
from synth.workload import Workload

SMALL = {
    "softmax": {"N": 4096},
    "va": {"N": 10000},
    "red": {"N": 7000},
    "mv": {"M": 63, "N": 100},
    "matmul": {"M": 96, "N": 64, "K": 40},
    "gemm2k": {"M": 64, "N": 48, "K": 32},
    "attention": {"S": 48, "D": 16},
    "fa6": {"S": 64, "D": 32},
}

SANITIZE = ("-O1 -g -march=native -fopenmp -fno-math-errno -fwrapv -std=gnu11 -fPIC -shared "
            "-fsanitize=address,undefined -fno-sanitize-recover=undefined "
            "-fno-omit-frame-pointer")


def emit_and_check(program: Program, workload: Workload, out: Path) -> CCheck:
    inputs = make_inputs(workload, 0)
    expected, bounds = evaluate_errors(workload, inputs)
    emit_c(program, workload, load_hardware("cpu"), out, inputs, expected, bounds)
    return check_c(out, time_runs=False)


def assert_passes(check: CCheck) -> None:
    assert check.built, check.log
    assert check.passed, check.log


@pytest.mark.parametrize("name", sorted(SMALL))
def test_every_builtin_runs_and_matches_the_reference(name: str, tmp_path: Path) -> None:
    case = Case.of(name, "cpu", SMALL[name])
    program = optimal_program(case)
    check = emit_and_check(program, build(case).workload, tmp_path)
    assert_passes(check)
    # the kernels run on the schedule's cores: OpenMP threads = the largest unit count
    assert check.threads == max(program.counts.values())


@pytest.mark.parametrize("name", ["softmax", "attention", "matmul", "mv"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_schedules_run_and_match(name: str, seed: int, tmp_path: Path) -> None:
    """Not only the optimum: any legal schedule (the sampler's) gives correct C."""
    case = Case.of(name, "cpu", SMALL[name])
    env = sample(case, seed)
    assert env is not None
    program = materialize(build(case).model, env)
    assert_passes(emit_and_check(program, build(case).workload, tmp_path))


@settings(max_examples=12, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(generated=workloads(max_statements=3))
def test_random_workloads_run_and_match(generated: object, tmp_path: Path) -> None:
    text = generated.text  # type: ignore[attr-defined]
    case = Case.of("random", "cpu", text=text)
    program = optimal_program(case)
    check = emit_and_check(program, build(case).workload, tmp_path / str(abs(hash(text))))
    assert check.built and check.passed, f"{text}\n{check.log}"


def sanitized(out: Path, monkeypatch: pytest.MonkeyPatch) -> CCheck:
    """The check with the library built under ASan and UBSan (loaded into the check's
    Python by preloading the sanitizer runtimes)."""
    runtimes = [subprocess.run(["cc", f"-print-file-name={lib}"], capture_output=True,
                               text=True, check=True).stdout.strip()
                for lib in ("libasan.so", "libubsan.so")]
    if not all(os.path.isabs(r) for r in runtimes):
        pytest.skip("the C compiler has no sanitizer runtimes")
    monkeypatch.setenv("CFLAGS", SANITIZE)
    monkeypatch.setenv("LD_PRELOAD", " ".join(runtimes))
    monkeypatch.setenv("ASAN_OPTIONS", "detect_leaks=0")
    (out / "libsynth.so").unlink(missing_ok=True)
    return check_c(out, time_runs=False)


@pytest.mark.parametrize("name, sizes", [("attention", {"S": 40, "D": 12}),
                                         ("mv", {"M": 37, "N": 53}),
                                         ("softmax", {"N": 1000})])
def test_sanitizers_find_nothing(name: str, sizes: Mapping[str, int], tmp_path: Path,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Odd sizes (ragged tiles, scalar tails) under ASan and UBSan."""
    emitted(name, sizes, tmp_path)
    check = sanitized(tmp_path, monkeypatch)
    assert "-fsanitize=address" in check.log
    assert_passes(check)


def break_source(out: Path, pattern: str, replacement: str) -> None:
    source = (out / "kernels.c").read_text()
    broken, n = re.subn(pattern, replacement, source, count=1)
    assert n == 1, f"no {pattern!r} in kernels.c"
    (out / "kernels.c").write_text(broken)
    (out / "libsynth.so").unlink(missing_ok=True)


def emitted(name: str, sizes: Mapping[str, int], out: Path) -> None:
    case = Case.of(name, "cpu", sizes)
    workload = build(case).workload
    inputs = make_inputs(workload, 0)
    expected, bounds = evaluate_errors(workload, inputs)
    emit_c(optimal_program(case), workload, load_hardware("cpu"), out, inputs, expected, bounds)


def test_the_check_catches_a_wrong_result(tmp_path: Path) -> None:
    emitted("va", {"N": 4096}, tmp_path)
    break_source(tmp_path, r"(\w+_reg\[\w+\]) \+ ", r"\1 - ")  # c = a - b
    check = check_c(tmp_path, time_runs=False)
    assert check.built and not check.passed
    assert "DIFFERS" in check.log


def test_the_sanitizers_catch_an_out_of_bounds_access(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    emitted("va", {"N": 4096}, tmp_path)
    # every load of a one element further: the last reads past a[N-1]
    break_source(tmp_path, r"(vload(?:_kept)?_i32\(&a\[)", r"\g<1>1 + ")
    check = sanitized(tmp_path, monkeypatch)
    assert not check.passed
    assert "AddressSanitizer" in check.log or "runtime error" in check.log, check.log


def test_a_crash_is_a_failed_check_not_a_dead_synth(tmp_path: Path) -> None:
    emitted("va", {"N": 4096}, tmp_path)
    break_source(tmp_path, r"(void synth_run\(void \*\*tensors\)\s*\{)",
                 r"\g<1> *(volatile int *)0 = 1;")
    check = check_c(tmp_path, time_runs=False)
    assert check.built and not check.passed
    assert "signal" in check.log


def test_numpy_baseline_computes_the_reference() -> None:
    """What the emitted code is timed against computes the same thing as the reference
    (numpy_eval is idiomatic NumPy: einsum, whole-array ops; the reference is exact)."""
    for name, sizes in SMALL.items():
        workload = build(Case.of(name, "cpu", sizes)).workload
        inputs = make_inputs(workload, 0)
        ours, reference = numpy_eval.evaluate(workload, inputs), evaluate(workload, inputs)
        for tensor in workload.outputs:
            np.testing.assert_allclose(ours[tensor.name], reference[tensor.name],
                                       rtol=2e-3, atol=1e-3, err_msg=name)


def test_emit_c_needs_a_model_of_this_machines_cores(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "synth.cli", "solve", "va", "--hw", "upmem", "--emit", "c",
         "--out", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert "--emit c" in result.stderr and "upmem" in result.stderr
    assert not any(tmp_path.iterdir())  # refused before solving, nothing written


def test_json_reports_the_check_and_the_timing(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "synth.cli", "solve", "va", "--hw", "cpu", "--set", "N=65536",
         "--emit", "c", "--out", str(tmp_path), "--json"],
        capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)["emitted"]["c"]
    assert data["checked"] and data["passed"]
    assert {"path", "files", "max_abs_err", "max_rel_err", "run_s", "numpy_s",
            "speedup_vs_numpy", "threads"} <= set(data)
    assert data["run_s"] > 0 and data["numpy_s"] > 0
    assert data["speedup_vs_numpy"] == pytest.approx(data["numpy_s"] / data["run_s"])
    assert "kernels.c" in data["files"]
    assert TARGET.name == "c"


def test_same_input_same_source(tmp_path: Path) -> None:
    """Determinism: the same schedule gives byte-identical C."""
    for out in (tmp_path / "a", tmp_path / "b"):
        emitted("attention", SMALL["attention"], out)
    assert ((tmp_path / "a" / "kernels.c").read_text()
            == (tmp_path / "b" / "kernels.c").read_text())


def test_tensors_handed_to_the_c_start_on_a_cache_line() -> None:
    """The emitted C's vectors are a whole number of vectors from a tensor's start, so
    on a tensor off a line every load and store straddles two lines (fa6's QK^T ran 1.6x
    slower so). The check and the benchmarks hand it aligned copies of the same values,
    and zeros for the tensors that are not inputs."""
    off = np.arange(1 << 16, dtype=np.float32)[1:].reshape(5, 13107)  # 4 bytes past a line
    assert off.ctypes.data % ALIGN != 0
    copy = aligned(off)
    assert copy.ctypes.data % ALIGN == 0 and copy.flags.c_contiguous
    assert np.array_equal(copy, off) and copy.shape == off.shape
    workload = load_workload("softmax", {"N": 4097})
    inputs = {name: np.concatenate([array[:1], array])[1:]  # one element past a line
              for name, array in make_inputs(workload).items()}
    assert all(array.ctypes.data % ALIGN != 0 for array in inputs.values())
    tensors = c_tensors(workload, inputs)
    assert list(tensors) == list(workload.tensors)
    assert all(t.ctypes.data % ALIGN == 0 for t in tensors.values())
    assert all(np.array_equal(tensors[name], inputs[name]) for name in inputs)
    assert all(not tensors[t.name].any() for t in workload.outputs)


def test_vectors_several_points_read_stay_in_registers(tmp_path: Path) -> None:
    """A register tile of an operand that several points of a compute read (a GEMM's
    rows of A or columns of B under a register tile of several columns or rows) is
    loaded with `vload_kept`, so GCC does not fold its load into every FMA that reads it
    (matmul-512's [2 x 32] register tiles ran 1.69 ms so, 1.27 kept: RESULTS.md, "Operand
    vectors kept in registers"). The accumulator's tiles, and an elementwise kernel's
    vectors (each read once), are plain loads."""
    emitted("matmul", {"M": 64, "N": 64, "K": 64}, tmp_path / "mm")
    source = (tmp_path / "mm" / "kernels.c").read_text()
    kept = re.findall(r"= vload_kept_i32\(&(\w+?)(?:_\w+)?\[", source)
    assert kept and set(kept) <= {"A", "B"}
    assert not re.search(r"vload_kept_i32\(&C", source)
    assert check_c(tmp_path / "mm", time_runs=False).passed
    emitted("va", {"N": 4096}, tmp_path / "va")
    source = (tmp_path / "va" / "kernels.c").read_text()
    assert "vload_i32(" in source and "vload_kept" not in source
