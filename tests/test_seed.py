"""Seed 000's softmax schedule rebuilt in synth's model (`benchmarks/seed_softmax.py`), at
a small size: it is feasible, validates against NumPy, keeps the seed's structure (one
kernel per statement, the same R, D, M, T, Q in every kernel), its `synth solve` line
gives the same cost, and synth's CP-SAT optimum is no worse than it or the greedy."""

from __future__ import annotations

import functools
import json
import shlex
from typing import Any

import pytest
from conftest import benchmark_module
from typer.testing import CliRunner

from synth import pipeline
from synth.cli import app
from synth.constraints.result import Status

SIZES = {"N": 65536}
seed = benchmark_module("seed_softmax")


@functools.cache
def outcomes() -> dict[str, Any]:
    """label -> (variant, outcome) of the optimum, the greedy and the reconstruction."""
    variants = seed.variants(SIZES)[:3]
    return {v.label: (v, pipeline.run(v.request)) for v in variants}


def outcome(index: int) -> pipeline.Outcome:
    return list(outcomes().values())[index][1]


def test_seed_reconstruction_is_feasible_and_validates() -> None:
    out = outcome(2)
    assert out.result.status in (Status.OPTIMAL, Status.FEASIBLE)
    assert out.validation is not None and out.validation.passed
    assert out.proof is not None and out.proof.proved


def test_seed_reconstruction_keeps_the_seeds_structure() -> None:
    out = outcome(2)
    env = out.result.env
    assert env is not None
    assert seed.kernels_used(out) == ["m", "e", "s", "y"]  # e and s not fused
    values = seed.seed_values(SIZES)
    for symbol in seed.SYMBOLS:  # schedule_eq_constraints: one value in every kernel
        assert {env[f"{symbol}.{k}.i"] for k in seed.KERNELS} == {values[symbol]}
    for name in seed.combine_decisions(SIZES):  # tasklet partials reduced on the DPU
        assert env[name] == 1
    assert not out.model.constraints.violated(env)


def test_seed_values_are_the_seeds_greedy_order() -> None:
    """T and Q first, then D, M, R: each at the largest value that keeps every constraint
    with the ones before it raised and the ones after it at their start."""
    values = seed.seed_values(SIZES)
    model = seed.seed_model(SIZES)
    tasklets = next(lv for lv in model.hw.levels if lv.symbol == "T")
    assert values["T"] == tasklets.count_max  # the tasklets filled first
    assert values["R"] == 1  # D and M already cover N: the ranks come last and get nothing
    assert values["R"] * values["D"] * values["M"] * values["T"] * values["Q"] == SIZES["N"]


def test_optimum_is_no_worse_than_greedy_or_seed() -> None:
    optimum, greedy, reconstruction = (outcome(i).result for i in range(3))
    assert optimum.status is Status.OPTIMAL
    assert greedy.objective is not None and reconstruction.objective is not None
    assert optimum.objective is not None
    assert optimum.objective <= greedy.objective
    assert optimum.objective <= reconstruction.objective


@pytest.mark.parametrize("index", [0, 1, 2])
def test_command_line_reproduces_the_cost(index: int) -> None:
    variant, out = list(outcomes().values())[index]
    argv = shlex.split(seed.command(variant.request))
    assert argv[:2] == ["synth", "solve"]
    result = CliRunner().invoke(app, [*argv[1:], "--json", "--no-validate"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["cost"]["total_ps"] == out.result.objective
