"""The C emitter's parallel structure: a kernel runs as one OpenMP parallel region whose
parallel loops share their iterations out (`omp for`), not a region per step of the
sequential loops around them; fills of tensors nothing reads are not written. Each
emitted program is checked against the reference (no timing here: that is
`benchmarks/c_vs_numpy.py`)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from conftest import Built, Case, build, forced, solve
from test_emit_c import assert_passes, emit_and_check

from synth.constraints.user import user_constraints
from synth.emit.c_check import check_c
from synth.emit.c_parallel import unread_tensors
from synth.ir.materialize import materialize
from synth.ir.nodes import Program


def fixed(case: Case, *fixes: str) -> tuple[Built, Program]:
    """`case` solved with every `--fix` text of `fixes`, materialised."""
    built = build(case)
    extra = user_constraints(built.model, (), fixes)
    cset = dataclasses.replace(built.model.constraints,
                               constraints=built.model.constraints.constraints + tuple(extra))
    result = solve(cset)
    assert result.env is not None, result.status
    return built, materialize(dataclasses.replace(built.model, constraints=cset), result.env)


def kernel_source(out: Path, kernel: str) -> str:
    source = (out / "kernels.c").read_text()
    match = re.search(rf"^static void kernel_{kernel}\(.*?^}}", source, re.S | re.M)
    assert match, source
    return match.group(0)


def test_a_split_reduction_runs_in_one_region_per_call(tmp_path: Path) -> None:
    """red over 2 cores in 4 sequential steps: one region (fork and join once), the
    steps' parallel loop an `omp for`, the partial results combined inside it."""
    case = Case.of("red", "cpu", {"N": 8192})
    built, program = fixed(case, "S.s.i=4", "P.s.i=2")
    check = emit_and_check(program, built.workload, tmp_path)
    assert_passes(check)
    assert check.threads == 2
    body = kernel_source(tmp_path, "s")
    assert body.count("#pragma omp parallel") == 1
    assert "#pragma omp parallel num_threads(2)\n" in body
    assert body.count("#pragma omp for") == 4  # two fills, the cores' loop, the combine
    # the partial results are allocated before the region (one buffer for all threads)
    assert body.index("aligned_alloc") < body.index("#pragma omp parallel")


def test_a_gemm_in_several_l3_steps_forks_once(tmp_path: Path) -> None:
    case = Case.of("matmul", "cpu", {"M": 96, "N": 64, "K": 40})
    built, program = fixed(case, "S.C#1_C#2.m=3", "P.C#1_C#2.n=2")
    assert_passes(emit_and_check(program, built.workload, tmp_path))
    source = (tmp_path / "kernels.c").read_text()
    assert source.count("#pragma omp parallel") == 1
    assert "#pragma omp for schedule(static)" in source


def test_fused_intermediates_in_registers_are_not_filled(tmp_path: Path) -> None:
    """swiglu's fused a_b_h keeps a and b in registers: their tensors are never read, so
    the kernel does not zero them (it did, 2 x S x F floats per call)."""
    case = Case.of("swiglu", "cpu", {"S": 16, "D": 24, "F": 40})
    built, program = forced(case, "fuse.a_b_h=1")
    assert unread_tensors(program, built.workload) == {"a", "b"}
    check = emit_and_check(program, built.workload, tmp_path)
    assert_passes(check)
    body = kernel_source(tmp_path, "a_b_h")
    assert not re.search(r"\b[ab]\[k_\] =", body)
    assert "is never read" in body


def test_one_threads_work_runs_every_unit_on_the_calling_thread(tmp_path: Path) -> None:
    """`check_c(one_thread=True)` (benchmarks/c_vs_numpy.py --one-thread): the region of
    2 units under OMP_THREAD_LIMIT=1 runs both units' iterations on one thread and still
    matches the reference; both sides are timed (thread CPU time)."""
    case = Case.of("red", "cpu", {"N": 8192})
    built, program = fixed(case, "S.s.i=4", "P.s.i=2")
    assert_passes(emit_and_check(program, built.workload, tmp_path))
    check = check_c(tmp_path, one_thread=True)
    assert_passes(check)
    assert check.threads == 1
    assert check.run_s is not None and check.run_s > 0
    assert check.numpy_s is not None and check.numpy_s > 0
