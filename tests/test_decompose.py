"""Solving by fusion covers and parts: the shortcuts (shared rewrites, cached parts,
lower bounds of pruned parts, cutoffs) must give the same answers as doing it the long
way, and must actually skip the work they claim to skip."""

from __future__ import annotations

import dataclasses

import pytest
from conftest import Case, build
from hypothesis import given
from hypothesis import strategies as st

from synth.constraints import cpsat, decompose
from synth.constraints import expr as ex
from synth.constraints.result import SolveResult, Status
from synth.constraints.space import ConstraintSet, NamedConstraint, is_fusion_decision
from synth.deadline import Deadline

FA6 = Case.of("fa6", "upmem", {"S": 16, "D": 8})


def naive_covers(cset: ConstraintSet) -> list[tuple[tuple[ex.Cond, ...], ex.Int]]:
    """Each cover's constraints and objective, substituted term by term from scratch."""
    names = [n for n in cset.decisions if is_fusion_decision(n)]
    flat = decompose.inline_definitions(cset)
    out = []
    for values in decompose._exact_covers(cset, names):
        chosen = {n: ex.const(v) for n, v in zip(names, values, strict=True)}
        conds = tuple(ex.substitute(c.cond, chosen) for c in flat.constraints)
        if ex.FALSE in conds:
            continue
        out.append((tuple(c for c in conds if c != ex.TRUE),
                    ex.substitute(flat.objective, chosen)))
    return out  # type: ignore[return-value]


def test_shared_rewrites_give_the_covers_a_fresh_substitution_gives() -> None:
    cset = build(FA6).model.constraints
    covers = decompose.fusion_covers(cset)
    expected = naive_covers(cset)
    assert len(covers) == len(expected) > 1
    for cover, (conds, objective) in zip(covers, expected, strict=True):
        assert tuple(c.cond for c in cover.constraints) == conds
        assert cover.objective == objective


def test_a_part_pruned_once_is_pruned_again_for_any_smaller_cutoff_without_solving() -> None:
    x = ex.Var("x")
    part = ConstraintSet({"x": (1, 2, 3, 4)}, {},
                         (NamedConstraint("g", "x at least 3", ex.Cmp(x, ">=", ex.const(3))),),
                         ex.mul(10, x))
    calls: list[int | None] = []

    def solve_part(cset: ConstraintSet, limit: float, cutoff: int | None) -> SolveResult:
        calls.append(cutoff)
        return cpsat._solve_part(cset, limit, cpsat.Effort(), cutoff)

    cache = decompose.PartCache()
    first = decompose.solve_by_parts(part, 5.0, "cpsat", solve_part, cache, cutoff=25)
    assert first.status is Status.INFEASIBLE and calls == [25]  # optimum 30 > 25
    again = decompose.solve_by_parts(part, 5.0, "cpsat", solve_part, cache, cutoff=20)
    assert again.status is Status.INFEASIBLE and calls == [25]  # known: > 25 >= 20
    solved = decompose.solve_by_parts(part, 5.0, "cpsat", solve_part, cache, cutoff=40)
    assert solved.status is Status.OPTIMAL and solved.objective == 30 and calls == [25, 40]
    decompose.solve_by_parts(part, 5.0, "cpsat", solve_part, cache)
    assert calls == [25, 40]  # solved once, then taken from the cache


def test_a_part_gets_what_the_cutoff_leaves_after_the_others_lower_bounds() -> None:
    x, y = ex.Var("x"), ex.Var("y")
    two = ConstraintSet({"x": (1, 2), "y": (1, 2, 3)}, {}, (), ex.add(ex.mul(7, x), ex.mul(5, y)))
    cache = decompose.PartCache()
    seen: dict[str, int | None] = {}

    def solve_part(cset: ConstraintSet, limit: float, cutoff: int | None) -> SolveResult:
        [name] = cset.decisions
        seen[name] = cutoff
        return cpsat._solve_part(cset, limit, cpsat.Effort(), cutoff)

    result = decompose.solve_by_parts(two, 5.0, "cpsat", solve_part, cache, cutoff=100)
    assert result.objective == 12
    # the first part solved gets what the other's floor leaves (its objective over its
    # domain: x costs 7 at least, y 5); the second what the first's optimum left (the
    # same here: neither has a constraint)
    assert seen == {"x": 100 - 5, "y": 100 - 7}


def test_a_part_whose_floor_is_past_its_cutoff_is_not_solved() -> None:
    """`ConstraintSet.floor` bounds a part's objective from its domains alone: never above
    the optimum, and a part it puts past the cutoff is pruned without a solve."""
    cset = build(FA6).model.constraints
    cover = decompose.fusion_covers(cset)[0]
    calls: list[int | None] = []

    def solve_part(part: ConstraintSet, limit: float, cutoff: int | None) -> SolveResult:
        calls.append(cutoff)
        return cpsat._solve_part(part, limit, cpsat.Effort(), cutoff)

    parts = decompose.components(cover)
    for part in parts:
        best = cpsat._solve_part(part, 60.0, cpsat.Effort())
        assert best.objective is not None and 0 <= part.floor() <= best.objective
    low = cover.floor()
    assert low == sum(part.floor() for part in parts) > 0
    pruned = decompose.solve_by_parts(cover, 5.0, "cpsat", solve_part, decompose.PartCache(),
                                      cutoff=low - 1)
    assert pruned.status is Status.INFEASIBLE and calls == []


def test_cpsat_cutoff_on_a_whole_problem() -> None:
    cset = build(FA6).model.constraints
    best = cpsat.solve(cset)
    assert best.status is Status.OPTIMAL and best.objective is not None
    at = cpsat.solve(cset, cutoff=best.objective)  # the optimum itself is allowed
    # (another schedule of the same cost may come first: ties are broken by the search)
    assert at.status is Status.OPTIMAL and at.objective == best.objective
    assert at.env is not None and cset.violated(at.env) == []
    assert ex.evaluate(cset.objective, at.env) == best.objective
    assert cpsat.solve(cset, cutoff=best.objective - 1).status is Status.INFEASIBLE


values = st.integers(min_value=-50, max_value=50)


@given(c=st.integers(1, 12), d=st.integers(1, 6), x=values, y=values)
def test_simplified_divisions_equal_the_arithmetic(c: int, d: int, x: int, y: int) -> None:
    term = ex.add(ex.mul(c * d, ex.Var("x")), ex.mul(d, ex.Var("y")))
    env = {"x": x, "y": y}
    value = c * d * x + d * y
    assert ex.evaluate(ex.ceil_div(term, d), env) == -(-value // d)
    assert ex.evaluate(ex.exact_div(term, d), env) == value // d
    assert ex.evaluate(ex.mod(term, d), env) == value % d
    # a multiple of d needs no division node at all
    assert not isinstance(ex.ceil_div(term, d), ex.CeilDiv)
    assert ex.mod(term, d) == ex.ZERO


def test_only_exact_multiples_are_divided_out() -> None:
    x = ex.Var("x")
    assert ex.ceil_div(ex.mul(4, x), 4) == x
    assert ex.ceil_div(ex.mul(12, x), 4) == ex.mul(3, x)
    assert isinstance(ex.ceil_div(ex.mul(6, x), 4), ex.CeilDiv)  # 6x/4 is not whole
    assert isinstance(ex.mod(ex.add(ex.mul(4, x), 1), 4), ex.Mod)
    assert ex.fold(ex.Cmp(ex.mul(4, x), "==", ex.mul(4, x))) == ex.TRUE
    assert ex.fold(ex.Cmp(x, "<", x)) == ex.FALSE


def test_a_term_hashes_once_and_survives_a_copy() -> None:
    term = ex.add(ex.Var("x"), ex.mul(3, ex.Var("y")))
    assert hash(term) == hash(dataclasses.replace(term)) == hash(term)
    copied = dataclasses.replace(term)
    assert copied == term and "_hash" not in copied.__getstate__()


def twin_parts() -> ConstraintSet:
    """Two independent parts, the same problem over different names (as a
    transformer's q, k and v projections are), and a third that differs."""
    conds = []
    terms: list[ex.Int] = []
    for name, least in (("q", 7), ("k", 7), ("v", 9)):
        a, b = ex.Var(f"{name}.a"), ex.Var(f"{name}.b")
        conds.append(NamedConstraint("g", f"{name}: a*b", ex.Cmp(ex.mul(a, b), ">=",
                                                                ex.const(least))))
        terms.append(ex.add(ex.mul(3, a, b), ex.mul(-2, b), ex.mul(5, a)))
    decisions = {f"{n}.{v}": tuple(range(1, 9)) for n in "qkv" for v in "ab"}
    return ConstraintSet(decisions, {}, tuple(conds), ex.add(*terms))


def test_a_problem_over_other_names_is_solved_once() -> None:
    cset = twin_parts()
    solved: list[ConstraintSet] = []

    def solve_part(part: ConstraintSet, limit: float, cutoff: int | None) -> SolveResult:
        solved.append(part)
        return cpsat._solve_part(part, limit, cpsat.Effort(), cutoff)

    result = decompose.solve_by_parts(cset, 60.0, "cpsat", solve_part)
    assert len(solved) == 2  # q (or k) and v
    assert result.status is Status.OPTIMAL and result.env is not None
    assert (result.env["q.a"], result.env["q.b"]) == (result.env["k.a"], result.env["k.b"])
    def least(bound: int) -> int:
        return min(3 * a * b - 2 * b + 5 * a for a in range(1, 9) for b in range(1, 9)
                   if a * b >= bound)

    assert result.objective == 2 * least(7) + least(9)
    assert not cset.violated(result.env)


def test_parts_that_differ_only_in_a_constant_are_not_shared() -> None:
    parts = {next(iter(p.decisions)).split(".")[0]: decompose.part_shape(p)
             for p in decompose.components(twin_parts())}
    assert parts["q"].problem == parts["k"].problem != parts["v"].problem
    assert parts["q"].names == ("q.a", "q.b") and parts["k"].names == ("k.a", "k.b")


def test_pinned_fusion_decisions_start_the_covers_search() -> None:
    """A set whose fusion decisions are pinned (`--fix fuse.K=1`, `--measure`'s pieces)
    has the covers that agree with them, found without walking the others (a transformer
    block has about 200,000: walking them ran 160 s past a 30 s limit); kernels pinned
    to 1 that clash have none."""
    cset = build(FA6).model.constraints
    names = [n for n in cset.decisions if is_fusion_decision(n)]
    every = decompose._exact_covers(cset, names)
    pick = every[len(every) // 2]

    def pinned(values: dict[str, int]) -> ConstraintSet:
        fixes = tuple(NamedConstraint("user.fix", f"{n} = {v}",
                                      ex.Cmp(ex.Var(n), "==", ex.const(v)))
                      for n, v in values.items())
        return dataclasses.replace(cset, constraints=(*cset.constraints, *fixes))

    assert decompose._exact_covers(pinned(dict(zip(names, pick, strict=True))), names) == [pick]
    ones = [n for n, v in zip(names, pick, strict=True) if v == 1]
    some = pinned({ones[0]: 1})
    assert decompose._exact_covers(some, names) == [
        v for v in every if v[names.index(ones[0])] == 1]
    assert len(decompose.fusion_covers(some)) == len(decompose._exact_covers(some, names))
    clash = next(n for n in names if n != ones[0] and
                 all(v[names.index(n)] + v[names.index(ones[0])] < 2 for v in every))
    assert decompose._exact_covers(pinned({ones[0]: 1, clash: 1}), names) == []


def test_the_covers_stop_at_the_deadline_though_none_is_allowed_yet(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the deadline the covers' rewriting stops after one tried, allowed or not (it
    went on through every cover while none was allowed). Here the enumeration, which
    stops at the deadline itself, finished before it."""
    cset = build(FA6).model.constraints
    every = decompose._exact_covers
    monkeypatch.setattr(decompose, "_exact_covers",
                        lambda cset, names, limit=None, deadline=None: every(cset, names))
    names = [n for n in cset.decisions if is_fusion_decision(n)]
    first = dict(zip(names, decompose._exact_covers(cset, names)[0], strict=True))
    other = ex.AnyOf(tuple(ex.Cmp(ex.Var(n), op, ex.const(v))
                           for n, v in first.items() for op in ("<", ">")))
    unlike = dataclasses.replace(cset, constraints=(
        *cset.constraints, NamedConstraint("g", "not the first cover", other)))
    assert len(decompose.fusion_covers(unlike)) == len(decompose.fusion_covers(cset)) - 1
    assert decompose.fusion_covers(unlike, Deadline(0.0)) == []
    assert len(decompose.fusion_covers(cset, Deadline(0.0))) == 1
