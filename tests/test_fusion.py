"""Fusion as a decision of the solver: which groups are legal, and that fused schedules
(chosen by the optimiser, forced by the user, or drawn at random) run correctly."""

from __future__ import annotations

import json

import pytest
from conftest import SMALL_UPMEM, Case, build, optimum, sample
from typer.testing import CliRunner

from synth.cli import app
from synth.constraints import exhaustive
from synth.constraints.fusion import candidate_groups, illegal_reason
from synth.ir.materialize import materialize
from synth.ir.nodes import Alloc, Load, Store, walk
from synth.lang import load_workload
from synth.pipeline import validate


def fused_groups(workload: str) -> list[list[str]]:
    wl = load_workload(workload, {})
    return [[wl.statements[i].name for i in g] for g in candidate_groups(wl) if len(g) > 1]


def reason(workload: str, *names: str) -> str | None:
    wl = load_workload(workload, {})
    return illegal_reason(wl, [[s.name for s in wl.statements].index(n) for n in names])


# ---------------------------------------------------------------- legality


def test_candidate_groups_of_the_builtins() -> None:
    assert fused_groups("softmax") == [["e", "s"]]
    assert fused_groups("attention") == [["p", "l"]]
    assert ["u", "p", "r", "O"] in fused_groups("fa6")
    assert fused_groups("matmul") == []  # C = 0 and C += A*B iterate different dims


def test_a_reduced_value_is_not_consumed_inside_its_own_pass() -> None:
    why = reason("softmax", "m", "e")
    assert why is not None and "e consumes m" in why and "reduces over i" in why
    why = reason("softmax", "s", "y")
    assert why is not None and "y consumes s" in why


def test_kernels_are_convex_in_the_dag() -> None:
    why = reason("softmax", "e", "y")  # s reads e and y reads s: s would sit in between
    assert why is not None and why.startswith("s depends on the group")


def test_fused_statements_share_every_loop() -> None:
    why = reason("fa6", "kt", "s")
    assert why is not None and "share every loop" in why
    assert reason("fa6", "u", "p", "r", "O") is None


def test_the_cli_refuses_an_illegal_fusion_in_the_users_terms() -> None:
    result = CliRunner().invoke(app, ["solve", "softmax", "--hw", "upmem", "--set", "N=4096",
                                      "--fix", "fuse.m_e=1"])
    assert result.exit_code == 2
    assert "statements m, e cannot be fused: e consumes m" in result.output


# ---------------------------------------------------------------- fused schedules run

FA6 = Case.of("fa6", "upmem", {"S": 16, "D": 8}, SMALL_UPMEM)
SOFTMAX = Case.of("softmax", "upmem", {"N": 64}, SMALL_UPMEM)


def test_the_optimum_fuses_fa6s_elementwise_chain_and_keeps_it_on_chip() -> None:
    built = build(FA6)
    env = dict(optimum(FA6).env or {})
    chosen = built.model.selected(env)
    fused = [k for k in chosen if len(k.statements) > 1]
    assert fused, [k.name for k in chosen]
    program = materialize(built.model, env)
    assert validate(program, built.workload).passed
    innermost = built.hw.memories[-1].name
    for spec, kernel in zip(chosen, program.kernels, strict=True):
        local = {u.tensor for u in spec.uses if u.local}
        buffers = {n.buffer.name: n.buffer for n in walk(kernel.body) if isinstance(n, Alloc)}
        for buf in buffers.values():
            if buf.tensor in local:
                assert buf.memory == innermost  # never in an outer memory
        for node in walk(kernel.body):
            if isinstance(node, Load | Store):
                moved = {node.dst, node.src}
                assert not any(buffers[b].tensor in local for b in moved if b in buffers), node
    assert any(u.local for k in fused for u in k.uses)


@pytest.mark.parametrize("case", [FA6, SOFTMAX], ids=lambda c: c.id)
def test_random_feasible_schedules_fused_or_not_validate(case: Case) -> None:
    built = build(case)
    shapes = set()
    for seed in range(8):
        env = sample(case, seed)
        assert env is not None
        shapes.add(tuple(k.name for k in built.model.selected(env)))
        assert validate(materialize(built.model, env), built.workload).passed, (seed, env)
    assert len(shapes) > 1, shapes  # the samples do vary the fusion


def test_fusion_is_decided_jointly_the_brute_force_optimum_agrees() -> None:
    """Exhaustive enumeration of every fusion cover and every tiling finds the same
    optimum as CP-SAT's joint model."""
    cset = build(SOFTMAX).model.constraints
    truth = exhaustive.solve(cset, 120.0)
    assert truth.objective == optimum(SOFTMAX).objective


def test_forcing_and_forbidding_a_fusion() -> None:
    runner = CliRunner()
    args = ["solve", "softmax", "--hw", "upmem", "--set", "N=4096", "--json"]
    fused = runner.invoke(app, [*args, "--fix", "fuse.e_s=1"])
    apart = runner.invoke(app, [*args, "--fix", "fuse.e_s=0"])
    assert fused.exit_code == 0 and apart.exit_code == 0, fused.output + apart.output
    kernels = [g["name"] for g in json.loads(fused.stdout)["groups"]]
    assert "e_s" in kernels and "e" not in kernels
    assert "e_s" not in [g["name"] for g in json.loads(apart.stdout)["groups"]]
