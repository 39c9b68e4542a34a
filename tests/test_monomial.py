"""Monomials lowered over exponents (`monomial`, `cpsat.Lowering`): the same values, the
same feasible schedules and the same optima as the products they replace."""

from __future__ import annotations

import random
from fractions import Fraction

import numpy as np
import pytest
from conftest import WORK_S, Case, build

from synth.constraints import cpsat, decompose, monomial, tables
from synth.constraints import expr as ex
from synth.constraints.result import Status
from synth.constraints.space import ConstraintSet, NamedConstraint

CASES = [
    Case.of("matmul", "upmem", {"M": 64, "N": 32, "K": 128}),
    Case.of("attention", "cpu", {"S": 64, "D": 16}),
    Case.of("matmul", "aie", {"M": 64, "N": 64, "K": 64}),
    Case.of("swiglu", "upmem", {"S": 16, "D": 32, "F": 44}),  # F: 4 x 11, padded
]


def parts(case: Case) -> list[ConstraintSet]:
    """The parts with decisions of the case's first fusion cover."""
    cover = decompose.fusion_covers(build(case).model.constraints)[0]
    return [p for p in decompose.components(cover) if len(p.decisions) > 1]


def samples(part: ConstraintSet, rng: random.Random, count: int) -> list[dict[str, int]]:
    """The optimum, then assignments that change one dimension's factors (to one of its
    valid tilings) or one other decision from it: near the optimum most are feasible,
    and those that are not break a capacity, a count or an alignment."""
    best = cpsat._solve_part(part, 600.0, cpsat.Effort(work_limit_s=WORK_S)).env
    assert best is not None
    found = [dict(best)]
    dimensions = tables.dimension_variables(part)
    for _ in range(count):
        env = dict(best)
        names = rng.choice(dimensions)
        rows = tables.valid_rows(part, names, [])
        if rows is not None and rows.count and rng.random() < 0.8:
            pick = rng.randrange(rows.count)
            env.update({n: int(rows.env[n][pick]) for n in names})
        else:
            name = rng.choice(list(part.decisions))
            env[name] = rng.choice(part.decisions[name])
        found.append({n: env[n] for n in part.decisions})
    return found


@pytest.mark.parametrize("case", CASES, ids=str)
def test_a_fixed_schedule_is_feasible_and_costs_what_the_terms_say(case: Case) -> None:
    rng = random.Random(7)
    checked = feasible = 0
    for part in parts(case):
        for env in samples(part, rng, 12):
            lowering = cpsat.Lowering(part)
            for constraint in part.constraints:
                lowering.require(constraint.cond)
            objective = lowering.linear(part.objective)
            for name, value in env.items():
                lowering.model.add(lowering.vars[name] == value)
            solver = cpsat._configured(600.0, 1, 10.0)
            code = solver.solve(lowering.model)
            violated = part.violated(env)
            checked += 1
            if violated:
                assert code == cpsat.cp_model.INFEASIBLE, (env, violated[0].meaning)
            else:
                feasible += 1
                assert code == cpsat.cp_model.OPTIMAL, env
                assert solver.value(objective) == ex.evaluate(part.objective,
                                                              part.complete(env))
    assert checked and feasible  # both kinds of schedule were met
    if case.workload == "matmul":
        assert any(cpsat.Lowering(p).monomials.powers for p in parts(case))


@pytest.mark.parametrize("case", CASES, ids=str)
def test_the_optimum_is_the_same_without_monomials(case: Case,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    effort = cpsat.Effort(work_limit_s=WORK_S)
    # no first phase as products: every part is solved by the lowering over exponents
    monkeypatch.setattr(cpsat, "FIRST_WORK_S", 0.0)
    for part in parts(case):
        with_them = cpsat._solve_part(part, 1800.0, effort)
        with monkeypatch.context() as patch:
            patch.setattr(monomial.Analysis, "_analyse", lambda self, term: None)
            without = cpsat._solve_part(part, 1800.0, effort)
        assert with_them.status is without.status is Status.OPTIMAL
        assert with_them.objective == without.objective


def test_an_exact_quotient_that_cancels_still_divides() -> None:
    """(E / P) * P is the monomial E, but E / P is recorded, so P must divide E: with
    P over 1..64 and E = 16, minimising 64 / P gives P = 16, not 64."""
    p = ex.Var("p")
    tiling = ex.mul(ex.exact_div(ex.const(16), p), p)
    analysis = monomial.Analysis({"p"}, {})
    assert analysis.monomial(tiling) == monomial.Monomial.of(Fraction(16), {})
    assert analysis.quotients == [monomial.Monomial.of(Fraction(16), {"p": -1})]
    part = ConstraintSet({"p": (1, 2, 4, 8, 16, 32, 64)}, {},
                         (NamedConstraint("tiling", "16 / p is whole",
                                          ex.Cmp(tiling, "==", ex.const(16))),),
                         ex.exact_div(ex.const(64), p))
    result = cpsat._solve_part(part, 60.0, cpsat.Effort(work_limit_s=WORK_S))
    assert result.status is Status.OPTIMAL and result.env is not None
    assert result.env["p"] == 16 and result.objective == 4


def test_monomial_values_and_logarithms() -> None:
    m = monomial.Monomial.of(Fraction(3, 4), {"a": 2, "b": -1})
    assert m.value(3) == Fraction(6) and m.value(1) == Fraction(3, 2)
    assert [monomial.log2(v) for v in (1, 2, 64, 3, 0, -4)] == [0, 1, 6, None, None, None]
    assert np.array_equal(np.array([m.value(s).denominator == 1 for s in range(5)]),
                          np.array([False, False, True, True, True]))


def test_a_part_the_products_did_not_settle_starts_over_exponents_next_time(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The first solve of a part records it as hard when the lowering as products does
    not settle it; solving the same part again (another cover, another cutoff) lowers
    it over exponents only, and finds the same optimum."""
    monkeypatch.setattr(cpsat, "FIRST_WORK_S", 0.0)  # no part is settled as products
    lowered: list[bool] = []
    real = cpsat._lowered

    def spy(cset: ConstraintSet, cutoff: int | None, memo: object, monomials: bool
            ) -> cpsat.Lowering:
        lowered.append(monomials)
        return real(cset, cutoff, memo, monomials)  # type: ignore[arg-type]

    monkeypatch.setattr(cpsat, "_lowered", spy)
    part = max(parts(CASES[0]), key=lambda p: len(p.decisions))
    effort = cpsat.Effort(work_limit_s=WORK_S)
    hard: set[frozenset[str]] = set()
    first = cpsat._solve_part(part, 600.0, effort, hard=hard)
    assert lowered == [False, True] and hard == {frozenset(part.decisions)}
    lowered.clear()
    again = cpsat._solve_part(part, 600.0, effort, cutoff=first.objective, hard=hard)
    assert lowered == [True]
    assert first.status is again.status is Status.OPTIMAL
    assert again.objective == first.objective
