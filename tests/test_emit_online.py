"""The online rewrite (issue 15) in the MLIR and UPMEM emitters: online kernels emitted,
run the way each emitter's check runs code (upstream MLIR's ExecutionEngine; the UPMEM C
built and run on the host), and compared with NumPy, also on inputs whose scores reach
hundreds, where a naive exp overflows float32; a program with its rescales dropped fails
the same checks (so they would catch an emitter that left the rescale out)."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import SMALL_UPMEM, TWO_CORES, Case, build, forced
from typer.testing import CliRunner

from synth.cli import app
from synth.emit.mlir import emit_mlir
from synth.emit.mlir_check import MlirCheck, check_mlir
from synth.emit.upmem import CheckResult, check_upmem, emit_upmem
from synth.ir.interpret import interpret
from synth.ir.nodes import (
    Affine,
    Alloc,
    Compute,
    Fill,
    Load,
    Loop,
    LoopKind,
    LoopVar,
    Node,
    Program,
    Rescale,
    Running,
    Store,
    walk,
)
from synth.ir.online import is_online
from synth.ir.prove import prove
from synth.ir.verify import verify
from synth.reference import evaluate_errors, make_inputs
from synth.workload import Workload

ATTENTION = Case.of("attention", "cpu", {"S": 64, "D": 16}, TWO_CORES)
# the online kernel without QK^T, four steps of 16 keys (the rescale matters)
STEPS = ("online.m_p_l_o_O=1", "V.m_p_l_o_O.j=16")
# the whole attention online: blocks of 16 rows and 16 keys per step (QK^T fused)
BLOCKED = ("online.s_m_p_l_o_O=1", "V.s_m_p_l_o_O.i=16", "V.s_m_p_l_o_O.j=16")
MHA = Case.of("mha", "cpu", {"B": 1, "H": 2, "S": 32, "E": 8}, TWO_CORES)
# log-sum-exp over the rows of x: a softmax's statistics, online with a coefficient 0.5
LSE_TEXT = """size N = 8
size M = 64
in x : f32[N, M]
out y : f32[N]
m[n] max= x[n, j]
l[n] += exp((x[n, j] - m[n]) * 0.5)
y[n] = m[n] + log(l[n]) * 2.0
"""
LSE = Case.of("lse", "cpu", {}, TWO_CORES, text=LSE_TEXT)
needs_make = pytest.mark.skipif(shutil.which("cc") is None or shutil.which("make") is None,
                                reason="needs a C compiler and make")


def large(workload: Workload) -> dict[str, np.ndarray]:
    """Inputs whose exponents reach hundreds: a naive exp of them overflows float32."""
    inputs = make_inputs(workload)
    scale = {"Q": 12.0, "K": 12.0, "x": 300.0}
    for name, factor in scale.items():
        if name in inputs:
            inputs[name] = (inputs[name] * factor).astype(np.float32)
    return inputs


def without_rescales(program: Program) -> Program:
    """`program` with every rescale dropped: what an emitter that forgot it would run."""
    def drop(body: tuple[Node, ...]) -> tuple[Node, ...]:
        return tuple(Loop(n.var, drop(n.body)) if isinstance(n, Loop) else n
                     for n in body if not isinstance(n, Rescale))
    return dataclasses.replace(program, kernels=tuple(
        dataclasses.replace(k, body=drop(k.body)) for k in program.kernels))


def test_large_inputs_overflow_a_naive_exp() -> None:
    inputs = large(build(ATTENTION).workload)
    scores = inputs["Q"].astype(np.float64) @ inputs["K"].astype(np.float64).T
    lse = large(build(LSE).workload)
    with np.errstate(over="ignore"):
        assert np.isinf(np.exp(scores.astype(np.float32))).any()
        assert np.isinf(np.exp(lse["x"] * np.float32(0.5))).any()


# ---------------------------------------------------------------- MLIR


def _mlir(tmp_path: Path, case: Case, fixes: tuple[str, ...], broken: bool = False
          ) -> tuple[Path, MlirCheck]:
    built, program = forced(case, *fixes)
    assert any(is_online(k) for k in program.kernels)
    if broken:
        program = without_rescales(program)
    inputs = large(built.workload)
    expected, bounds = evaluate_errors(built.workload, inputs)
    assert all(np.isfinite(v).all() for v in expected.values())
    emit_mlir(program, built.workload, built.hw, tmp_path, inputs, expected, bounds)
    return tmp_path, check_mlir(tmp_path)


@pytest.mark.parametrize(("case", "fixes"), [
    (ATTENTION, STEPS), (ATTENTION, BLOCKED), (MHA, ("online.sc_m_p_l_o_O=1",)),
    (LSE, ("online.m_l_y=1", "V.m_l_y.j=16")),
], ids=["attention-steps", "attention-blocked", "mha", "log-sum-exp"])
def test_online_mlir_runs_and_matches_where_exp_overflows(
        tmp_path: Path, case: Case, fixes: tuple[str, ...]) -> None:
    out, check = _mlir(tmp_path, case, fixes)
    assert check.passed, check.log[-3000:]
    schedule = (out / "schedule.mlir").read_text()
    assert "// rescale" in schedule and "math.exp" in schedule
    assert "arith.cmpf une" in schedule


def test_online_mlir_without_its_rescales_fails_the_check(tmp_path: Path) -> None:
    _, check = _mlir(tmp_path, ATTENTION, STEPS, broken=True)
    assert not check.passed
    assert "schedule.mlir: O DIFFERS from the reference" in check.log


def test_solve_emits_online_mlir_and_reports_the_check(tmp_path: Path) -> None:
    args = ["solve", "attention", "--hw", "cpu", "--set", "S=32", "--set", "D=8",
            *(a for o in TWO_CORES for a in ("--hw-set", o)), "--fix", "online.m_p_l_o_O=1",
            "--emit", "mlir", "--out", str(tmp_path), "--json"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["variables"]["online.m_p_l_o_O"] == 1
    emitted = data["emitted"]["mlir"]
    assert emitted["checked"] and emitted["passed"], emitted["log"]
    assert "// rescale" in (tmp_path / "schedule.mlir").read_text()


# ---------------------------------------------------------------- UPMEM


def stepped(program: Program, kernel: str, dim: str, steps: int) -> Program:
    """`program` with the online step of `kernel` split into `steps` sequential steps
    over its pass dimension `dim` inside the tasklet (the tiles along `dim` allocated and
    loaded per step, the running statistics kept across them), as the solver's nests step
    at MRAM (`test_the_solver_steps_the_online_pass_inside_each_tasklet`), for any
    kernel and number of steps."""
    def split(body: tuple[Node, ...]) -> tuple[Node, ...]:
        if not any(isinstance(n, Running) for n in body):
            return tuple(Loop(n.var, split(n.body)) if isinstance(n, Loop) else n
                         for n in body)
        previous = {n.previous for n in body if isinstance(n, Running)}
        along = {n.buffer.name: n.buffer for n in body if isinstance(n, Alloc)
                 and dim in n.buffer.dims}
        size = next(n.tile[n.dims.index(dim)] for n in body if isinstance(n, Compute)
                    and dim in n.dims)
        assert size % steps == 0
        chunk = size // steps
        var = LoopVar(f"w_{dim}", dim, f"W.{kernel}.{dim}", steps, chunk,
                      LoopKind.SEQUENTIAL, "mram")
        shift = Affine(((var.name, chunk),))

        def inside(n: Node) -> bool:
            return ((isinstance(n, Alloc) and (n.buffer.name in along
                                               or n.buffer.name in previous))
                    or (isinstance(n, Load) and n.dst in along)
                    or (isinstance(n, Fill) and n.buffer in along)
                    or (isinstance(n, Store) and n.src in along)
                    or isinstance(n, Running | Rescale)
                    or (isinstance(n, Compute) and dim in n.dims))

        def moved(n: Node) -> Node:
            if isinstance(n, Alloc) and n.buffer.name in along:
                d = n.buffer
                axis = d.dims.index(dim)
                return Alloc(dataclasses.replace(
                    d, shape=tuple(chunk if a == axis else s for a, s in enumerate(d.shape)),
                    origin=tuple(o + shift if a == axis else o
                                 for a, o in enumerate(d.origin))))
            if isinstance(n, Compute):
                axis = n.dims.index(dim)
                return dataclasses.replace(
                    n, tile=tuple(chunk if a == axis else t for a, t in enumerate(n.tile)),
                    origin=tuple(o + shift if a == axis else o
                                 for a, o in enumerate(n.origin)))
            return n

        last = max(k for k, n in enumerate(body) if inside(n))
        before = tuple(n for n in body[:last] if not inside(n))
        step = tuple(moved(n) for n in body if inside(n))
        return (*before, Loop(var, step), *body[last + 1:])

    return dataclasses.replace(program, kernels=tuple(
        dataclasses.replace(k, body=split(k.body)) if k.name == kernel else k
        for k in program.kernels))


def _upmem(tmp_path: Path, case: Case, fixes: tuple[str, ...], steps: int = 1,
           broken: bool = False) -> tuple[Path, CheckResult]:
    built, program = forced(case, *fixes)
    kernel = next(k.name for k in program.kernels if is_online(k))
    if steps > 1:
        program = stepped(program, kernel, "j", steps)
        verify(program, built.workload, built.hw)
    if broken:
        program = without_rescales(program)
    inputs = large(built.workload)
    expected, bounds = evaluate_errors(built.workload, inputs)
    emit_upmem(program, built.workload, built.hw, tmp_path, inputs, expected, bounds)
    return tmp_path, check_upmem(tmp_path)


UP_ATTENTION = Case.of("attention", "upmem", {"S": 64, "D": 16}, SMALL_UPMEM)
UP_MHA = Case.of("mha", "upmem", {"B": 1, "H": 2, "S": 32, "E": 8}, SMALL_UPMEM)
UP_LSE = Case.of("lse", "upmem", {}, SMALL_UPMEM, text=LSE_TEXT)


@needs_make
@pytest.mark.parametrize(("case", "fixes", "steps"), [
    (UP_ATTENTION, ("online.m_p_l_o_O=1",), 1),
    (UP_ATTENTION, ("online.m_p_l_o_O=1",), 4),
    (UP_ATTENTION, ("online.s_m_p_l_o_O=1",), 4),
    (UP_MHA, ("online.sc_m_p_l_o_O=1",), 2),
    (UP_LSE, ("online.m_l_y=1",), 4),
], ids=["attention", "attention-4-steps", "attention-qk-4-steps", "mha-2-steps",
        "log-sum-exp-4-steps"])
def test_online_upmem_runs_and_matches_where_exp_overflows(
        tmp_path: Path, case: Case, fixes: tuple[str, ...], steps: int) -> None:
    out, check = _upmem(tmp_path, case, fixes, steps)
    assert check.passed, check.log[-3000:]
    assert "every output matches the reference" in check.log
    dpu = "\n".join(p.read_text() for p in out.glob("dpu_*.c"))
    assert "rescaled to the new maximum" in dpu
    assert "math_expf(-" in dpu  # the factor, by synth's exp (no libm on a DPU)


@needs_make
def test_online_upmem_without_its_rescales_fails_the_check(tmp_path: Path) -> None:
    _, check = _upmem(tmp_path, UP_ATTENTION, ("online.m_p_l_o_O=1",), steps=4,
                      broken=True)
    assert not check.passed
    assert "the outputs differ from the reference" in check.log


def test_a_stepped_online_nest_on_upmem_lowers_to_mlir_too(tmp_path: Path) -> None:
    built, program = forced(UP_ATTENTION, "online.m_p_l_o_O=1")
    program = stepped(program, "m_p_l_o_O", "j", 4)
    inputs = large(built.workload)
    expected, bounds = evaluate_errors(built.workload, inputs)
    emit_mlir(program, built.workload, built.hw, tmp_path, inputs, expected, bounds)
    check = check_mlir(tmp_path)
    assert check.passed, check.log[-3000:]


@needs_make
def test_solve_emits_online_upmem_and_reports_the_check(tmp_path: Path) -> None:
    args = ["solve", "attention", "--hw", "upmem", "--set", "S=64", "--set", "D=16",
            "--fix", "online.s_m_p_l_o_O=1", "--emit", "upmem", "--out", str(tmp_path),
            "--json"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["variables"]["online.s_m_p_l_o_O"] == 1
    emitted = data["emitted"]["upmem"]
    assert emitted["checked"] and emitted["passed"], emitted["log"]
    assert "rescaled to the new maximum" in (tmp_path / "dpu_s_m_p_l_o_O.c").read_text()


# attention online on upmem with a WRAM too small for the keys and values of a whole row's
# pass (K and V: 64 x 16 f32 each, 4 KiB): only steps over j inside a tasklet fit
UP_SMALL_WRAM = Case.of("attention", "upmem", {"S": 64, "D": 16},
                        (*SMALL_UPMEM, "wram.capacity=12KiB"))


@needs_make
def test_the_solver_steps_the_online_pass_inside_each_tasklet(tmp_path: Path) -> None:
    built, program = forced(UP_SMALL_WRAM, "online.s_m_p_l_o_O=1", "T=4")
    kernel = next(k for k in program.kernels if is_online(k))
    tasklets = [n for n in walk(kernel.body) if isinstance(n, Loop)
                and n.var.kind is LoopKind.PARALLEL and n.var.where == "tasklet"]
    assert len(tasklets) == 1 and tasklets[0].var.extent == 4
    steps = [n for n in walk(tasklets[0].body) if isinstance(n, Loop) and n.var.dim == "j"]
    assert len(steps) == 1 and steps[0].var.kind is LoopKind.SEQUENTIAL
    assert steps[0].var.extent > 1  # several steps over the pass, each a block of keys
    inside = list(walk(steps[0].body))
    assert any(isinstance(n, Running) for n in inside)
    assert any(isinstance(n, Rescale) for n in inside)
    kept = {n.buffer.name for n in walk(tasklets[0].body) if isinstance(n, Alloc)} - {
        n.buffer.name for n in inside if isinstance(n, Alloc)}
    assert {"m_wram", "l_wram", "o_wram"} <= kept  # running statistics across the steps
    verify(program, built.workload, built.hw)
    assert prove(program, built.workload, built.hw).proved
    inputs = large(built.workload)
    expected, bounds = evaluate_errors(built.workload, inputs)
    got = interpret(program, built.workload, inputs)["O"]
    np.testing.assert_allclose(got, expected["O"], rtol=2e-4, atol=2e-5)
    emit_upmem(program, built.workload, built.hw, tmp_path, inputs, expected, bounds)
    check = check_upmem(tmp_path)
    assert check.passed, check.log[-3000:]
    assert "rescaled to the new maximum" in (tmp_path / f"dpu_{kernel.name}.c").read_text()


def test_online_attention_at_s512_fits_upmem_with_steps() -> None:
    """At S = 512, D = 64 the keys and values of a whole pass (256 KiB) do not fit a
    DPU's WRAM: the online kernel fits only by stepping through them (before the steps
    were offered, `--fix online.s_m_p_l_o_O=1` was infeasible here: capacity.wram and
    fusion.complete)."""
    case = Case.of("attention", "upmem", {"S": 512, "D": 64}, SMALL_UPMEM)
    built, program = forced(case, "online.s_m_p_l_o_O=1")
    kernel = next(k for k in program.kernels if is_online(k))
    steps = [n for n in walk(kernel.body) if isinstance(n, Loop) and n.var.dim == "j"]
    assert steps and steps[0].var.kind is LoopKind.SEQUENTIAL and steps[0].var.extent > 1
    verify(program, built.workload, built.hw)
