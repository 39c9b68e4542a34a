"""Validation at scale (`synth.shrink`): a workload past `MAX_POINTS` iteration points is
validated on a smaller instance, the same schedule with fewer loop steps. The limits are
lowered here so that small workloads take that path."""

from __future__ import annotations

import json
from typing import Any

import pytest
from typer.testing import CliRunner

from synth import pipeline, shrink
from synth.cli import app
from synth.constraints import cpsat
from synth.constraints import expr as ex
from synth.constraints.space import SlotKind
from synth.hwfile import load_hardware
from synth.ir.materialize import materialize
from synth.ir.verify import verify
from synth.lang import load_workload

BUILTINS = ("attention", "fa6", "gemm2k", "layernorm", "matmul", "mha", "mv", "red",
            "rmsnorm", "softmax", "swiglu", "transformer", "va")


def test_every_built_in_is_validated_at_its_own_sizes() -> None:
    """The limit sits above every built-in at its default sizes (gemm2k, the largest, has
    8.6e9 points), so their validation is unchanged."""
    counts = {name: shrink.points(load_workload(name)) for name in BUILTINS}
    assert max(counts.values()) == counts["gemm2k"] == 2048**3 + 2048**2
    assert max(counts.values()) <= shrink.MAX_POINTS


@pytest.mark.parametrize(("workload", "hardware"), [
    ("matmul", "cpu"), ("softmax", "cpu"), ("mha", "cpu"), ("swiglu", "cpu"),
    ("fa6", "aie"), ("matmul", "upmem"), ("red", "upmem"), ("gemm2k", "wormhole")])
def test_the_smaller_instance_keeps_the_schedule(monkeypatch: pytest.MonkeyPatch,
                                                 workload: str, hardware: str) -> None:
    """Forced to shrink: the sizes are smaller, the rescaled decisions are a schedule of
    the model at those sizes (no constraint broken), with the same fusion and compute
    tiles (the innermost slot); a dimension's units shrink only once its sequential
    loops are down to one step, and a dimension spread over units stays spread; and the
    smaller program verifies and matches NumPy."""
    monkeypatch.setattr(shrink, "MAX_POINTS", 0)
    monkeypatch.setattr(shrink, "SHRUNK_POINTS", 10**5)
    hw = load_hardware(hardware)
    model = pipeline.encode(load_workload(workload), hw)
    result = cpsat.solve(model.constraints, 600.0, work_limit_s=60.0)
    assert result.env is not None
    steps = [w.sizes for w in shrink.plan(model, result.env,
                                          lambda at: load_workload(workload, at))]
    assert all(a[n] >= b[n] for a, b in zip([model.workload.sizes, *steps], steps,
                                             strict=False) for n in a)
    found = shrink.smaller_schedule(model, result.env, lambda at: load_workload(workload, at),
                                    lambda at: pipeline.encode(at, hw))
    assert found is not None
    sizes, small, env = found
    assert sizes in steps and sizes != model.workload.sizes
    assert small.constraints.violated(env) == []
    assert [k.name for k in small.selected(env)] == [k.name for k in
                                                     model.selected(result.env)]
    innermost = len(model.slots) - 1
    for kernel in model.selected(result.env):
        for dim in kernel.dims:
            old = [ex.evaluate(model.factors.of(kernel.name, dim, i), result.env)
                   for i in range(len(model.slots))]
            new = [ex.evaluate(small.factors.of(kernel.name, dim, i), env)
                   for i in range(len(model.slots))]
            assert new[innermost] == old[innermost], (kernel.name, dim)
            spread = [i for i, slot in enumerate(model.slots) if slot.kind is SlotKind.SPATIAL]
            sequential = [i for i, slot in enumerate(model.slots)
                          if slot.kind is SlotKind.TEMPORAL and i != innermost]
            assert all(new[i] > 1 for i in spread if old[i] > 1), (kernel.name, dim)
            if any(new[i] != old[i] for i in spread):  # units are taken last
                assert all(new[i] == 1 for i in sequential), (kernel.name, dim)
    program = materialize(small, env)
    verify(program, small.workload, hw)
    assert pipeline.validate(program, small.workload).passed


def test_a_tile_of_the_hardware_is_never_cut(monkeypatch: pytest.MonkeyPatch) -> None:
    """On wormhole (32 x 32 tiles) a size shrinks to whole tiles only, however small the
    target: gemm2k's M, N and K stay multiples of 32."""
    monkeypatch.setattr(shrink, "MAX_POINTS", 0)
    monkeypatch.setattr(shrink, "SHRUNK_POINTS", 1)
    model = pipeline.encode(load_workload("gemm2k"), load_hardware("wormhole"))
    result = cpsat.solve(model.constraints, 600.0, work_limit_s=60.0)
    assert result.env is not None
    steps = [w.sizes for w in shrink.plan(model, result.env,
                                          lambda at: load_workload("gemm2k", at))]
    assert steps
    assert all(v % 32 == 0 for sizes in steps for v in sizes.values()), steps


def test_solve_reports_the_smaller_sizes(monkeypatch: pytest.MonkeyPatch) -> None:
    """`synth solve` on a workload past the limit: the validation line names the sizes
    it ran at and why, the JSON gives them, and the exit code is the validation's."""
    monkeypatch.setattr(shrink, "MAX_POINTS", 10**6)
    monkeypatch.setattr(shrink, "SHRUNK_POINTS", 10**5)
    args = ["solve", "matmul", "--hw", "cpu", "--set", "M=128", "--set", "N=128",
            "--set", "K=128"]
    human = CliRunner().invoke(app, args)
    assert human.exit_code == 0, human.output
    assert ("(the same schedule with fewer loop steps: the workload has 2.1e6 iteration "
            "points, over the 1e6 run in full): passed") in human.output
    run = CliRunner().invoke(app, [*args, "--json"])
    validation = json.loads(run.output)["validation"]
    assert validation["passed"] is True
    shrunk = validation["sizes"]
    assert shrunk["M"] * shrunk["N"] * shrunk["K"] <= 10**5 < 128**3
    line = next(s for s in human.output.splitlines() if s.startswith("validation"))
    assert line.startswith("validation against NumPy at " + ", ".join(
        f"{k}={v}" for k, v in shrunk.items() if v != 128))


def test_a_wrong_result_at_the_smaller_sizes_is_exit_4(monkeypatch: pytest.MonkeyPatch
                                                       ) -> None:
    """The smaller instance is compared with NumPy like the whole one: an interpreter
    that is off by one fails it, exit 4, and the line names the sizes it ran at."""
    monkeypatch.setattr(shrink, "MAX_POINTS", 10**6)
    monkeypatch.setattr(shrink, "SHRUNK_POINTS", 10**5)
    real = pipeline.interpret

    def off_by_one(program: Any, workload: Any, inputs: Any) -> dict[str, Any]:
        assert shrink.points(workload) <= 10**5  # only the smaller instance runs
        return {name: value + 1 for name, value in real(program, workload, inputs).items()}

    monkeypatch.setattr(pipeline, "interpret", off_by_one)
    run = CliRunner().invoke(app, ["solve", "matmul", "--hw", "cpu", "--set", "M=128",
                                   "--set", "N=128", "--set", "K=128"])
    assert run.exit_code == 4, run.output
    line = next(s for s in run.output.splitlines() if s.startswith("validation"))
    assert "fewer loop steps" in line and ": FAILED" in line
