"""Sound verdicts (issue 12, item 3): synth never reports infeasible when a schedule
exists. The regression case is 4-D attention scores on upmem, which CP-SAT 9.15 proved
infeasible at the root (see `cpsat.new_solver`); every INFEASIBLE is now confirmed
without presolve, and an explanation is a non-empty set of groups that is itself
infeasible.

Limits: every solve here finishes in a few seconds, far from its 60 s limit."""

from __future__ import annotations

import dataclasses

import pytest
from conftest import solve
from ortools.sat.python import cp_model

from synth import pipeline
from synth.constraints import cpsat, explain
from synth.constraints.result import SolveResult, Status

SCORES = """\
size B = 2
size H = 12
size S = 512
size E = 64
in  Q : f32[B, H, S, E]
in  K : f32[B, H, S, E]
out s : f32[B, H, S, S]
s[b, h, i, j] += Q[b, h, i, e] * K[b, h, j, e]
"""
LIMIT_S = 60.0


def defect_model() -> cp_model.CpModel:
    """The smallest model found (by deleting constraints of the scores part) that CP-SAT
    9.15 with its default parameters calls INFEASIBLE: k = a = b = 1 satisfies it."""
    model = cp_model.CpModel()
    a = model.new_int_var(1, 2, "a")
    b = model.new_int_var(1, 16, "b")
    k = model.new_int_var(1, 1155368016, "k")
    x = model.new_int_var(3154284, 2323938423461689, "x")
    y = model.new_int_var(3154284, 4647876846923378, "y")
    z = model.new_int_var(3154284, 74366029550774048, "z")
    model.add(x == 1142857 + 2011427 * k)
    model.add_multiplication_equality(y, [x, a])
    model.add_multiplication_equality(z, [y, b])
    return model


def test_the_minimal_defect_model_is_feasible_with_synths_settings() -> None:
    solver = cpsat.new_solver(LIMIT_S, workers=1)
    assert solver.solve(defect_model()) in (cp_model.OPTIMAL, cp_model.FEASIBLE)


@pytest.fixture(scope="module")
def scores(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("sound") / "scores4d.syn"
    path.write_text(SCORES)
    return str(path)


def encoded(path: str, **kw: object) -> pipeline.Model:
    request = pipeline.Request(path, "upmem", validate=False, **kw)  # type: ignore[arg-type]
    return pipeline.encode(pipeline.parse(request), pipeline.hardware(request),
                           request.constraints, request.fixes, request.drops)


def test_4d_attention_scores_on_upmem_solve_to_optimal(scores: str) -> None:
    result = solve(encoded(scores).constraints)
    assert result.status is Status.OPTIMAL and result.env is not None
    assert not encoded(scores).constraints.violated(result.env)


def test_dropping_groups_never_makes_the_scores_infeasible(scores: str) -> None:
    model = encoded(scores, drops=("capacity", "transfer", "count"))
    result = solve(model.constraints)
    optimum = solve(encoded(scores).constraints)
    assert result.status is Status.OPTIMAL
    assert result.objective is not None and optimum.objective is not None
    assert result.objective <= optimum.objective  # fewer constraints: never worse


def test_a_wrong_infeasible_is_replaced_by_the_schedule_found_without_presolve(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A presolve that wrongly says INFEASIBLE is overruled by the confirmation."""
    request = pipeline.Request("softmax", "upmem", {"N": 4096}, validate=False)
    model = pipeline.encode(pipeline.parse(request), pipeline.hardware(request),
                            request.constraints)
    real = cpsat._solve

    def wrong(*args: object, presolve: bool) -> SolveResult:
        result = real(*args, presolve=presolve)  # type: ignore[arg-type]
        return result if not presolve else SolveResult("cpsat", Status.INFEASIBLE, 0.0)

    monkeypatch.setattr(cpsat, "_solve", wrong)
    result = solve(model.constraints)
    assert result.status is Status.OPTIMAL and result.stats["presolve_disagreed"] == 1


def test_a_real_infeasible_is_confirmed() -> None:
    request = pipeline.Request("softmax", "upmem", {"N": 4096},
                               hw_overrides=("wram.capacity=2056",), validate=False)
    model = pipeline.encode(pipeline.parse(request), pipeline.hardware(request),
                            request.constraints)
    result = solve(model.constraints)
    assert result.status is Status.INFEASIBLE
    assert result.stats["confirmed_without_presolve"] == 1


def test_an_unconfirmed_infeasible_is_no_verdict() -> None:
    verdict = SolveResult("cpsat", Status.INFEASIBLE, 1.0)
    again = cpsat.confirm_infeasible(verdict, SolveResult("cpsat", Status.TIMEOUT, 2.0))
    assert again.status is Status.TIMEOUT and "without presolve" in str(again.stats["unknown"])
    assert again.wall_s == 3.0


def test_the_explanation_is_non_empty_and_infeasible_without_presolve() -> None:
    request = pipeline.Request("softmax", "upmem", {"N": 4096},
                               constraints=("T >= 11", "T <= 4"), validate=False)
    model = pipeline.encode(pipeline.parse(request), pipeline.hardware(request),
                            request.constraints)
    core = explain.minimal_core(model.constraints)
    assert core
    checker = explain.Feasibility(model.constraints)
    assert checker.check(list(core), presolve=False)[0] is Status.INFEASIBLE


def test_a_core_that_presolve_got_wrong_is_searched_again_without_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Checks with presolve that wrongly call every proper subset infeasible shrink the
    core to one group that can hold; the confirmation catches it and the search runs
    again without presolve, giving the true minimal conflict."""
    request = pipeline.Request("softmax", "upmem", {"N": 4096},
                               constraints=("T >= 11", "T <= 4"), validate=False)
    model = pipeline.encode(pipeline.parse(request), pipeline.hardware(request),
                            request.constraints)
    real = explain.Feasibility.check

    def check(self: explain.Feasibility, groups: list[str], time_limit_s: float = 10.0,
              presolve: bool = True) -> tuple[Status, list[str], dict[str, int]]:
        if presolve and groups:
            return Status.INFEASIBLE, [groups[-1]], {}
        return real(self, groups, time_limit_s, presolve)

    monkeypatch.setattr(explain.Feasibility, "check", check)
    assert set(explain.minimal_core(model.constraints)) == {"user.1", "user.2"}


def test_infeasible_output_names_the_groups() -> None:
    request = pipeline.Request("softmax", "upmem", {"N": 4096},
                               constraints=("T >= 11", "T <= 4"), validate=False)
    outcome = pipeline.run(dataclasses.replace(request))
    assert outcome.result.status is Status.INFEASIBLE
    assert {c.group for c in outcome.explanation or []} == {"user.1", "user.2"}
