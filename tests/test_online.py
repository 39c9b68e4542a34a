"""The online-softmax rewrite (issue 15): which chains may consume a running maximum
inside its own pass (derived from the algebra, `synth.constraints.online`), the decision
`online.<kernel>` forced both ways, and online schedules that compute the reference also
where a naive exp overflows, in the interpreter and in the emitted C."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from conftest import TWO_CORES, ZEN3, Case, FakeMachine, forced, solve
from typer.testing import CliRunner

from synth.cli import app
from synth.constraints.fusion import candidate_groups, illegal_reason
from synth.constraints.result import Status
from synth.constraints.space import candidate_kernels
from synth.emit.c import emit_c
from synth.emit.c_check import check_c
from synth.hwfile import load_hardware
from synth.ir.interpret import interpret
from synth.ir.nodes import Alloc, Compute, Rescale, walk
from synth.ir.printer import print_program
from synth.ir.prove import prove
from synth.ir.verify import verify
from synth.lang import load_workload, parse_workload
from synth.pipeline import encode
from synth.reference import evaluate, evaluate_errors, make_inputs

ATTENTION = Case.of("attention", "cpu", {"S": 64, "D": 16}, TWO_CORES)
# the online kernel without QK^T, four steps of 16 keys (the rescale matters)
STEPS = ("online.m_p_l_o_O=1", "V.m_p_l_o_O.j=16")


def _reason(text: str, *names: str) -> str | None:
    wl = parse_workload(text, "t.syn", "t", {})
    return illegal_reason(wl, [[s.name for s in wl.statements].index(n) for n in names])


ROWS = "size N = 8\nsize M = 16\nin x : f32[N, M]\nout y : f32[N]\n"


# ---------------------------------------------------------------- legality


def test_attention_and_mha_have_online_kernels_with_their_rescale_coefficients() -> None:
    kernels = {k.name: k for k in candidate_kernels(load_workload("attention", {}))}
    plan = kernels["s_m_p_l_o_O"].online
    assert plan is not None and plan.dim == "j" and plan.rows == ("i",)
    assert dict(plan.rescaled) == {"l": -1.0, "o": -1.0}
    assert set(plan.inner) == {"d", "e"}
    assert kernels["p_l"].online is None
    mha = {k.name: k for k in candidate_kernels(load_workload("mha", {}))}
    found = mha["sc_m_p_l_o"].online
    assert found is not None and dict(found.rescaled) == {"l": -0.125, "o": -0.125}


def test_softmax_over_one_vector_has_no_online_kernel() -> None:
    wl = load_workload("softmax", {})
    assert [g for g in candidate_groups(wl) if len(g) > 1] == [(1, 2)]  # e, s only
    why = illegal_reason(wl, [0, 1, 2])
    assert why is not None and "e is read outside the group" in why


@pytest.mark.parametrize(("body", "needle"), [
    ("m[n] max= x[n, j]\ny[n] += x[n, j] - m[n]\n", "outside an exponential"),
    ("m[n] max= x[n, j]\ny[n] += exp(x[n, j] * m[n])\n", "not affine"),
    ("m[n] max= x[n, j]\ny[n] max= exp(x[n, j] - m[n])\n", "only a sum over j"),
    ("m[n] max= x[n, j]\ny[n] += exp(x[n, j] - m[n]) + x[n, j]\n", "cannot correct"),
    ("m[n] max= x[n, j]\ny[n] += exp(exp(x[n, j] - m[n]))\n", "cannot correct"),
])
def test_chains_a_rescale_cannot_correct_stay_illegal(body: str, needle: str) -> None:
    why = _reason(ROWS + body, "m", "y")
    assert why is not None and "cannot run online" in why and needle in why, why


def test_log_sum_exp_and_scaled_exponentials_run_online() -> None:
    lse = ROWS + ("m[n] max= x[n, j]\nl[n] += exp((x[n, j] - m[n]) * 0.5)\n"
                  "y[n] = m[n] + log(l[n]) * 2.0\n")
    assert _reason(lse, "m", "l", "y") is None
    wl = parse_workload(lse, "t.syn", "t", {})
    plan = next(k for k in candidate_kernels(wl) if k.name == "m_l_y").online
    assert plan is not None and dict(plan.rescaled) == {"l": -0.5}


def test_the_cli_says_why_an_online_group_is_illegal() -> None:
    runner = CliRunner()
    args = ["solve", "attention", "--hw", "cpu", "--set", "S=64", "--set", "D=16"]
    out = runner.invoke(app, [*args, "--fix", "online.m_p=1"])
    assert out.exit_code == 2
    assert "m, p cannot run online" in out.output and "read outside the group" in out.output
    out = runner.invoke(app, [*args, "--fix", "fuse.m_p_l_o=1"])
    assert out.exit_code == 2 and "its decision is online.m_p_l_o" in out.output


# ---------------------------------------------------------------- online schedules run


def _large(workload_name: str, sizes: dict[str, int]) -> dict[str, np.ndarray]:
    """Inputs whose scores reach hundreds: exp of them overflows float32."""
    wl = load_workload(workload_name, sizes)
    inputs = make_inputs(wl)
    inputs["Q"] = (inputs["Q"] * 12).astype(np.float32)
    inputs["K"] = (inputs["K"] * 12).astype(np.float32)
    return inputs


def test_the_online_kernel_matches_the_reference_where_exp_overflows() -> None:
    built, program = forced(ATTENTION, *STEPS)
    assert "m_p_l_o_O" in [k.name for k in program.kernels]
    assert any(isinstance(n, Rescale) for k in program.kernels for n in walk(k.body))
    verify(program, built.workload, built.hw)
    assert prove(program, built.workload, built.hw).proved
    inputs = _large("attention", {"S": 64, "D": 16})
    scores = inputs["Q"].astype(np.float64) @ inputs["K"].astype(np.float64).T
    with np.errstate(over="ignore"):
        assert np.isinf(np.exp(scores.astype(np.float32))).any()  # a naive exp overflows
    expected = evaluate(built.workload, inputs)["O"]
    for batch in (True, False):
        got = interpret(program, built.workload, inputs, batch=batch)["O"]
        assert np.isfinite(got).all()
        np.testing.assert_allclose(got, expected, rtol=2e-4, atol=2e-5)
    text = print_program(program)
    assert "running m_reg -> m_reg_prev" in text and "rescale o_reg *= exp(-1 *" in text


def test_the_emitted_c_matches_where_exp_overflows(tmp_path: Path) -> None:
    built, program = forced(ATTENTION, *STEPS)
    inputs = _large("attention", {"S": 64, "D": 16})
    expected, bounds = evaluate_errors(built.workload, inputs)
    emit_c(program, built.workload, built.hw, tmp_path, inputs, expected, bounds)
    source = (tmp_path / "kernels.c").read_text()
    assert "rescaled to the new maximum" in source
    check = check_c(tmp_path, time_runs=False)
    assert check.passed, check.log[-3000:]


# the whole attention online on cpu: blocks of 16 rows and 16 keys per step (QK^T fused)
BLOCKED = ("online.s_m_p_l_o_O=1", "V.s_m_p_l_o_O.i=16", "V.s_m_p_l_o_O.j=16")


def test_a_blocked_step_with_qk_runs_in_vectors_and_matches_where_exp_overflows(
        tmp_path: Path) -> None:
    """FlashAttention-2's step on cpu: a block of rows against a block of keys, the
    whole head dimension in the step's arrays (in L1, not registers), QK^T and PV as
    register-blocked outer products, the statistics in vectors along the keys."""
    built, program = forced(ATTENTION, *BLOCKED)
    verify(program, built.workload, built.hw)
    assert prove(program, built.workload, built.hw).proved
    computes = {n.statement: n for k in program.kernels for n in walk(k.body)
                if isinstance(n, Compute)}
    assert dict(zip(computes["s"].dims, computes["s"].tile, strict=True)) == {
        "i": 16, "j": 16, "d": 16}
    inputs = _large("attention", {"S": 64, "D": 16})
    expected, bounds = evaluate_errors(built.workload, inputs)
    emit_c(program, built.workload, built.hw, tmp_path, inputs, expected, bounds)
    source = (tmp_path / "kernels.c").read_text()
    assert "K's tile with j last (an outer product in vectors along j)" in source
    assert "an outer product in vectors along e" in source
    assert "in vectors along j (the online step's own vector dimension)" in source
    # each row block's vector of K and V loaded once for its rows, not once per FMA
    assert re.search(r"vf32 y0_ = vload_kept_f32\(", source)
    check = check_c(tmp_path, time_runs=False)
    assert check.passed, check.log[-3000:]


def test_an_online_pass_shorter_than_a_vector_on_avx2_has_a_schedule(
        on_machine: Callable[[FakeMachine], None]) -> None:
    """mha's pass over S = 6 keys on an AVX2 machine (8 lanes): the only whole vector,
    8, is longer than the pass, so the step's block keeps every candidate (a scalar
    block; `space.whole_vectors`). Keeping only the 8 left the pass no padded extent,
    and the solve crashed on an empty domain."""
    on_machine(ZEN3)
    model = encode(load_workload("mha", {"B": 2, "H": 2, "S": 6, "E": 4}),
                   load_hardware("cpu", TWO_CORES))
    assert model.hw.compute.lanes["f32"] == 8
    assert all(values for values in model.constraints.decisions.values())
    assert solve(model.constraints).status is Status.OPTIMAL


def test_the_cpu_model_blocks_the_rows_of_an_online_step() -> None:
    """The copies into a step's arrays are the core's work (`online_terms.step_copies`):
    one row per step would copy every key block once per row, so the model blocks rows;
    the step's tiles are bounded by L1, not the register file."""
    case = Case.of("attention", "cpu", {"S": 256, "D": 64}, TWO_CORES)
    built, program = forced(case, "online.s_m_p_l_o_O=1")
    step = next(n for k in program.kernels for n in walk(k.body)
                if isinstance(n, Compute) and n.statement == "s")
    tile = dict(zip(step.dims, step.tile, strict=True))
    assert tile["i"] > 1 and tile["j"] > 1 and tile["d"] == 64
    assert 4 * (tile["i"] * 64 + tile["j"] * 64) > built.hw.memories[-1].usable


def test_key_and_value_blocks_stream_through_a_cache_too_small_for_them(
        tmp_path: Path) -> None:
    """K and V (128 KiB here) do not fit a 64 KiB L2: they stream through it a step's
    block at a time (`online_terms.streamed`), so the fused online kernel still has a
    schedule; the verifier and the prover count the same blocks, and the C matches."""
    case = Case.of("attention", "cpu", {"S": 256, "D": 64}, (*TWO_CORES, "l2.capacity=64KiB"))
    built, program = forced(case, "online.s_m_p_l_o_O=1")
    views = {n.buffer.tensor: n.buffer for k in program.kernels for n in walk(k.body)
             if isinstance(n, Alloc) and n.buffer.memory == "l2"}
    assert 4 * (views["K"].shape[0] + views["V"].shape[0]) * 64 > 64 * 1024
    verify(program, built.workload, built.hw)
    assert prove(program, built.workload, built.hw).proved
    inputs = _large("attention", {"S": 256, "D": 64})
    expected, bounds = evaluate_errors(built.workload, inputs)
    emit_c(program, built.workload, built.hw, tmp_path, inputs, expected, bounds)
    check = check_c(tmp_path, time_runs=False)
    assert check.passed, check.log[-3000:]


def test_a_wrong_rescale_is_caught_by_validation() -> None:
    built, program = forced(ATTENTION, *STEPS)
    kernels = tuple(dataclasses.replace(k, body=_drop_rescales(k.body))
                    for k in program.kernels)
    broken = dataclasses.replace(program, kernels=kernels)
    inputs = _large("attention", {"S": 64, "D": 16})
    expected = evaluate(built.workload, inputs)["O"]
    got = interpret(broken, built.workload, inputs)["O"]
    assert not np.allclose(got, expected, rtol=2e-4, atol=2e-5)


def _drop_rescales(body: tuple) -> tuple:
    from synth.ir.nodes import Loop
    out = []
    for node in body:
        if isinstance(node, Loop):
            out.append(Loop(node.var, _drop_rescales(node.body)))
        elif not isinstance(node, Rescale):
            out.append(node)
    return tuple(out)


def test_forcing_and_forbidding_the_online_rewrite() -> None:
    runner = CliRunner()
    args = ["solve", "attention", "--hw", "cpu", "--set", "S=64", "--set", "D=16",
            *(a for o in TWO_CORES for a in ("--hw-set", o)), "--json"]
    online = runner.invoke(app, [*args, "--fix", "online.m_p_l_o_O=1"])
    plain = runner.invoke(app, [*args, "--fix", "online.m_p_l_o_O=0"])
    assert online.exit_code == 0 and plain.exit_code == 0, online.output + plain.output
    got, other = json.loads(online.stdout), json.loads(plain.stdout)
    assert "m_p_l_o_O" in [g["name"] for g in got["groups"]]
    assert "m_p_l_o_O" not in [g["name"] for g in other["groups"]]
    assert got["validation"]["passed"] and other["validation"]["passed"]
    assert got["variables"]["online.m_p_l_o_O"] == 1


def test_tt_lang_models_choose_the_rewrite() -> None:
    """No group keeps the online kernel off wormhole (the tt-lang emitter writes it:
    tests/test_emit_ttlang.py): the free solve runs attention online and costs less than
    with the rewrite forbidden."""
    runner = CliRunner()
    args = ["solve", "attention", "--hw", "wormhole", "--set", "S=64", "--set", "D=32",
            "--no-validate", "--json"]
    free = json.loads(runner.invoke(app, args).stdout)
    assert free["status"] == "optimal"
    assert free["variables"]["online.s_m_p_l_o_O"] == 1
    forbid = [a for n in free["variables"] if n.startswith("online.")
              for a in ("--fix", f"{n}=0")]
    plain = json.loads(runner.invoke(app, [*args, *forbid]).stdout)
    assert plain["status"] == "optimal"
    assert free["solver"]["objective"] < plain["solver"]["objective"]
    dropped = runner.invoke(app, [*args, "--drop", "online.ttlang"])
    assert dropped.exit_code == 2  # the group is gone
