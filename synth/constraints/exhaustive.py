"""Enumerate every schedule of a (small) space: the ground truth for optimality tests.

It walks the same decisions with the same constraints and the same cost terms as the
CP-SAT backend, but by brute force, checking each constraint as soon as every variable
it mentions is fixed. It deliberately does not split the problem into independent parts,
so that it checks the solver's decomposition too.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

from synth.constraints import expr as ex
from synth.constraints.decompose import inline_definitions
from synth.constraints.result import SolveResult, Status
from synth.constraints.space import ConstraintSet
from synth.errors import InputError

MAX_POINTS = 2_000_000  # candidate assignments; beyond this, refuse rather than hang


def space_size(cset: ConstraintSet) -> int:
    return math.prod(len(v) for v in cset.decisions.values())


def solve(cset: ConstraintSet, time_limit_s: float = 60.0,
          max_points: int = MAX_POINTS) -> SolveResult:
    size = space_size(cset)
    if size > max_points:
        raise InputError(
            f"the exhaustive solver refuses a space of {size:,} candidate schedules "
            f"(limit {max_points:,}); use smaller sizes (--set) or hardware ranges "
            f"(--hw-set), or --solver cpsat")
    start = time.perf_counter()
    flat = inline_definitions(cset)
    names = list(flat.decisions)
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
        return _result(best, Status.FEASIBLE if best else Status.TIMEOUT, cset, start,
                       visited)
    return _result(best, Status.OPTIMAL if best else Status.INFEASIBLE, cset, start, visited)


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


def _result(best: tuple[int, dict[str, int]] | None, status: Status, cset: ConstraintSet,
            start: float, visited: int) -> SolveResult:
    wall = time.perf_counter() - start
    stats = {"visited": visited}
    if best is None:
        return SolveResult("exhaustive", status, wall, stats=stats)
    value, decisions = best
    bound = value if status is Status.OPTIMAL else None
    return SolveResult("exhaustive", status, wall, cset.complete(decisions), value, bound,
                       stats)
