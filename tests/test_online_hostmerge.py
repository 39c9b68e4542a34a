"""Issue 15: an online kernel's pass split across UPMEM DPUs and ranks, the host merging
their partial running statistics (FlashDecoding's split-KV at the DPU level). Each DPU
runs the pass over its share of the keys and hands its running maximum and sums back;
an `OnlineCombine` in the kernel's epilogue, on the host, merges them, each rescaled to
the common maximum. Checked: a forced DPU split (alone, and with the tasklets splitting
too) through verifier, prover, interpreter on large scores and the emitted UPMEM C; the
host merge replaced by plain combines caught by every check; the free solve choosing
the DPU split where it pays; the emitters that write no merge keeping the pass whole."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest
from conftest import SMALL_UPMEM, Case, build, forced, solve
from test_online_split import (
    DECODE_TEXT,
    every_check_fails,
    every_check_passes,
    plain_combines,
)
from typer.testing import CliRunner

from synth.cli import app
from synth.constraints.cost import evaluate_cost
from synth.constraints.result import Status
from synth.constraints.user import user_constraints
from synth.ir.nodes import Combine, Loop, OnlineCombine, Program, walk

needs_make = pytest.mark.skipif(shutil.which("cc") is None or shutil.which("make") is None,
                                reason="needs a C compiler and make")

ATTENTION = Case.of("attention", "upmem", {"S": 64, "D": 16}, SMALL_UPMEM)
DPUS = ("online.s_m_p_l_o=1", "D.s_m_p_l_o.j=2", "T.s_m_p_l_o.j=1")
BOTH = ("online.s_m_p_l_o=1", "D.s_m_p_l_o.j=2", "R.s_m_p_l_o.j=2", "T.s_m_p_l_o.j=2")
# S = 40 padded to 64 keys: the second DPU's share is mostly padding, one of its
# tasklets' keys all padding (a partial maximum of -inf, sums of 0)
PADDED = Case.of("attention", "upmem", {"S": 40, "D": 16}, SMALL_UPMEM)


def _host_merges(program: Program) -> list[OnlineCombine]:
    """The merges in kernels' epilogues (outside every loop: on the host)."""
    return [n for k in program.kernels for n in k.body if isinstance(n, OnlineCombine)]


def _loops(program: Program, where: str) -> list[Loop]:
    return [n for k in program.kernels for n in walk(k.body)
            if isinstance(n, Loop) and n.var.where == where and n.var.dim == "j"]


@needs_make
@pytest.mark.parametrize(("case", "fixes", "units"), [
    (ATTENTION, DPUS, {"dpu": 2}), (ATTENTION, BOTH, {"rank": 2, "dpu": 2, "tasklet": 2}),
    (PADDED, (*DPUS, "Q.s_m_p_l_o.j=16"), {"dpu": 2})],
    ids=["dpus", "ranks-dpus-tasklets", "padded"])
def test_a_pass_split_across_dpus_validates_everywhere(
        tmp_path: Path, case: Case, fixes: tuple[str, ...], units: dict[str, int]) -> None:
    built, program = forced(case, *fixes)
    merges = _host_merges(program)
    assert len(merges) == 1 and {s.target for s in merges[0].sums} == {"l", "o"}
    assert merges[0].running == "m" and merges[0].partials == "m_partials"
    for where, count in units.items():
        loops = _loops(program, where)
        assert len(loops) == 1 and loops[0].var.extent == count, where
    assert not any(isinstance(n, Combine) for k in program.kernels for n in walk(k.body))
    every_check_passes(built, program, tmp_path)
    host = (tmp_path / "host.c").read_text()
    assert "partial running statistics in m_partials" in host and "expf(" in host


def test_the_host_merge_without_its_rescale_fails_every_check(tmp_path: Path) -> None:
    built, program = forced(ATTENTION, *DPUS)
    broken = plain_combines(program)
    assert not _host_merges(broken)
    every_check_fails(built, broken, tmp_path)


# decoding (4 query rows, 512 keys) on up to 8 DPUs of up to 4 tasklets whose float
# arithmetic is cheap: rows alone keep one DPU busy; split across the DPUs, the keys
# keep eight
FLOAT_DPUS = ("rank.count=1", "dpu.count=1..8", "tasklet.count=1..4",
              "compute.cycles.f32.exp=20", "compute.cycles.f32.mul=2",
              "compute.cycles.f32.add=2", "compute.cycles.f32.max=2")
DECODE = Case.of("decode", "upmem", {}, FLOAT_DPUS, text=DECODE_TEXT)


def test_the_solver_splits_the_pass_across_dpus_where_it_pays() -> None:
    """The free solve runs the online kernel with its keys split across DPUs (merged on
    the host), and that schedule costs less than the best one whose pass stays in one
    DPU."""
    built = build(DECODE)
    result = solve(built.model.constraints)
    assert result.status is Status.OPTIMAL and result.env is not None
    assert result.env["online.s_m_p_l_o"] == 1 and result.env["D.s_m_p_l_o.j"] > 1
    extra = user_constraints(built.model, ["D.s_m_p_l_o.j <= 1"], [])
    whole = solve(dataclasses.replace(built.model.constraints, constraints=(
        *built.model.constraints.constraints, *extra)))
    assert whole.objective is not None and result.objective is not None
    assert whole.objective > result.objective


def test_the_host_merge_is_priced() -> None:
    """The same schedule with the DPUs splitting the pass costs its partials' way back
    and the host's merge: more `combine` and `mram->host` than with the pass whole."""
    built = build(ATTENTION)
    costs = []
    for fixes in (DPUS, ("online.s_m_p_l_o=1", "D.s_m_p_l_o.j=1", "T.s_m_p_l_o.j=1")):
        extra = user_constraints(built.model, (), fixes)
        cset = dataclasses.replace(built.model.constraints, constraints=(
            *built.model.constraints.constraints, *extra))
        result = solve(cset)
        assert result.env is not None
        costs.append(evaluate_cost(built.model, dict(result.env)))
    split, whole = costs
    assert split["combine"] > whole["combine"] == 0
    assert split["transfer:mram->host"] > whole["transfer:mram->host"]


def test_emit_mlir_keeps_an_online_pass_in_one_dpu(tmp_path: Path) -> None:
    """The MLIR emitter writes no merge: with `--emit mlir` the DPU split is refused
    before solving, by the group online.split with its reason."""
    args = ["solve", "attention", "--hw", "upmem", "--set", "S=64", "--set", "D=16",
            "--fix", "online.s_m_p_l_o=1", "--fix", "D.s_m_p_l_o.j=2", "--emit", "mlir",
            "--out", str(tmp_path), "--no-validate",
            # few units: the refusal is the same, its explanation's checks are cheaper
            *(arg for unit in SMALL_UPMEM for arg in ("--hw-set", unit))]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1, result.output
    assert "runs in one dpu unit (--emit mlir: that emitter does not merge" in result.output


def test_a_dpu_split_solves_and_validates_from_the_command_line() -> None:
    args = ["solve", "attention", "--hw", "upmem", "--set", "S=64", "--set", "D=16",
            "--fix", "online.s_m_p_l_o=1", "--fix", "D.s_m_p_l_o.j=2", "--jobs", "1"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "online combine m max= reduce(m_partials)" in result.output
    assert "validation against NumPy: passed" in result.output
