"""Enumerate every schedule of a (small) space: the ground truth for optimality tests.

It walks the same decisions with the same constraints and the same cost terms as the
CP-SAT backend, but by brute force, checking each constraint as soon as every variable
it mentions is fixed. By default it enumerates each independent part of the problem
alone (`decompose.components`: exact, since the objective is a sum of their objectives),
so that multi-kernel programs fit; `joint=True` enumerates the whole product instead,
which tests use to check the decomposition itself.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

from synth.constraints import expr as ex
from synth.constraints.decompose import (
    components,
    fusion_covers,
    inline_definitions,
    part_key,
    solve_by_covers,
)
from synth.constraints.result import SolveResult, Status
from synth.constraints.space import ConstraintSet
from synth.errors import InputError

MAX_POINTS = 2_000_000  # candidate assignments; beyond this, refuse rather than hang


def space_size(cset: ConstraintSet, joint: bool = False) -> int:
    """Candidate assignments the enumerator visits at most."""
    if joint:
        return math.prod(len(v) for v in cset.decisions.values())
    distinct = {part_key(part): part for fixed in fusion_covers(cset)
                for part in components(fixed)}  # a part in several covers is enumerated once
    return sum(math.prod(len(v) for v in part.decisions.values())
               for part in distinct.values())


def solve(cset: ConstraintSet, time_limit_s: float = 60.0, max_points: int = MAX_POINTS,
          joint: bool = False) -> SolveResult:
    """The optimum by enumeration: of each fusion cover, each independent part alone
    (or, `joint`, of the whole product at once)."""
    size = space_size(cset, joint)
    if size > max_points:
        raise InputError(
            f"the exhaustive solver refuses a space of {size:,} candidate schedules "
            f"(limit {max_points:,}); use smaller sizes (--set) or hardware ranges "
            f"(--hw-set), or --solver cpsat")
    solved: dict[object, tuple[Status, tuple[int, dict[str, int]] | None, int]] = {}
    if joint:
        return _solve_parts(cset, [cset], time_limit_s, time.perf_counter(), solved)
    return solve_by_covers(cset, time_limit_s, "exhaustive", lambda fixed, limit, _cutoff: (
        _solve_parts(fixed, components(fixed), limit, time.perf_counter(), solved)))


def _solve_parts(cset: ConstraintSet, parts: Sequence[ConstraintSet], time_limit_s: float,
                 start: float,
                 solved: dict[object, tuple[Status, tuple[int, dict[str, int]] | None, int]]
                 ) -> SolveResult:
    """Enumerate each part (once, when it recurs across fusion covers: `solved`), add the
    optima up, and complete the assignment of `cset` (decisions no part mentions take
    their smallest value)."""
    decisions = {name: values[0] for name, values in cset.decisions.items()}
    objective, visited, proven = 0, 0, True
    for part in parts:
        remaining = time_limit_s - (time.perf_counter() - start)
        key = part_key(part)
        if key not in solved or solved[key][0] is Status.TIMEOUT:
            solved[key] = _enumerate(inline_definitions(part), remaining)
        status, best, part_visited = solved[key]
        visited += part_visited
        if best is None:  # infeasible, or out of time before any schedule
            return SolveResult("exhaustive", status, time.perf_counter() - start,
                               stats={"visited": visited})
        objective += best[0]
        decisions.update({n: best[1][n] for n in part.decisions})
        proven = proven and status is Status.OPTIMAL
    status = Status.OPTIMAL if proven else Status.FEASIBLE
    return SolveResult("exhaustive", status, time.perf_counter() - start,
                       cset.complete(decisions), objective, objective if proven else None,
                       {"visited": visited})


def _enumerate(flat: ConstraintSet, time_limit_s: float
               ) -> tuple[Status, tuple[int, dict[str, int]] | None, int]:
    """The best assignment of one part: (status, (objective, decisions), visited)."""
    start = time.perf_counter()
    names = list(flat.decisions)
    if not names:  # nothing to choose: the constants hold or they do not
        if flat.violated({}):
            return Status.INFEASIBLE, None, 0
        return Status.OPTIMAL, (ex.evaluate(flat.objective, {}), {}), 1
    checks = _checks_by_depth(flat, names)
    best: tuple[int, dict[str, int]] | None = None
    env: dict[str, int] = {}
    visited = 0

    def walk(depth: int) -> None:
        nonlocal best, visited
        if time.perf_counter() - start > time_limit_s:
            raise _OutOfTime
        if depth == len(names):
            visited += 1
            value = ex.evaluate(flat.objective, env)
            if best is None or value < best[0]:
                best = (value, dict(env))
            return
        for value in flat.decisions[names[depth]]:
            env[names[depth]] = value
            if all(ex.holds(cond, env) for cond in checks[depth]):
                walk(depth + 1)
        del env[names[depth]]

    try:
        walk(0)
    except _OutOfTime:
        return (Status.FEASIBLE if best else Status.TIMEOUT), best, visited
    return (Status.OPTIMAL if best else Status.INFEASIBLE), best, visited


class _OutOfTime(Exception):
    pass


def _checks_by_depth(cset: ConstraintSet, names: Sequence[str]) -> list[list[ex.Cond]]:
    """Each constraint, at the depth where its last variable gets a value."""
    position = {name: i for i, name in enumerate(names)}
    checks: list[list[ex.Cond]] = [[] for _ in names]
    constant: list[ex.Cond] = []
    for constraint in cset.constraints:
        used = [position[v] for v in ex.variables(constraint.cond)]
        (checks[max(used)] if used else constant).append(constraint.cond)
    if constant and checks:
        checks[0].extend(constant)
    return checks
