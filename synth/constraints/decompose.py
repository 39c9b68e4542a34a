"""Split a constraint set into independent sub-problems.

The objective is a sum; when no constraint ties the variables of two sums together (one
kernel's tiling does not constrain another's unless, say, a user constraint on a shared
count does), each group can be minimised alone and the optima add up. This is exact, and
it keeps the search of a many-kernel program the sum, not the product, of its kernels'.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from synth.constraints import expr as ex
from synth.constraints.result import SolveResult, Status
from synth.constraints.space import ConstraintSet, NamedConstraint


def components(cset: ConstraintSet) -> list[ConstraintSet]:
    """Independent parts of `cset` whose optima add up to the optimum of the whole.

    Definitions are inlined, so each part mentions decisions only."""
    cset = inline_definitions(cset)
    depends = _decision_dependencies(cset)
    parent = {name: name for name in cset.decisions}

    def find(name: str) -> str:
        while parent[name] != name:
            parent[name] = parent[parent[name]]
            name = parent[name]
        return name

    def union(names: Iterable[str]) -> None:
        roots = [find(n) for n in names]
        for other in roots[1:]:
            parent[other] = roots[0]

    def decisions_of(node: ex.Int | ex.Cond) -> set[str]:
        out: set[str] = set()
        for name in ex.variables(node):
            out |= depends.get(name, {name})
        return out

    for constraint in cset.constraints:
        union(decisions_of(constraint.cond))
    terms = cset.objective.terms if isinstance(cset.objective, ex.Sum) else (cset.objective,)
    for term in terms:
        union(decisions_of(term))

    groups: dict[str, list[str]] = {}
    for name in cset.decisions:
        groups.setdefault(find(name), []).append(name)
    parts = []
    for names in groups.values():
        members = set(names)
        parts.append(ConstraintSet(
            decisions={n: cset.decisions[n] for n in names},
            definitions={},
            constraints=tuple(c for c in cset.constraints
                              if decisions_of(c.cond) & members),
            objective=ex.add(*(t for t in terms if decisions_of(t) & members)),
            groups=cset.groups,
        ))
    # what no decision can change: constant costs, and constraints that hold or never do
    fixed = ConstraintSet({}, {}, tuple(c for c in cset.constraints
                                        if not decisions_of(c.cond)),
                          ex.add(*(t for t in terms if not decisions_of(t))),
                          groups=cset.groups)
    if fixed.constraints or fixed.objective != ex.ZERO or not parts:
        parts.append(fixed)
    return parts


def _decision_dependencies(cset: ConstraintSet) -> dict[str, set[str]]:
    """For each defined variable, the decisions it is computed from."""
    depends: dict[str, set[str]] = {}
    for name, term in cset.definitions.items():
        found: set[str] = set()
        for var in ex.variables(term):
            found |= depends.get(var, {var})
        depends[name] = found
    return depends


def inline_definitions(cset: ConstraintSet) -> ConstraintSet:
    """The same problem with every defined variable replaced by its term."""
    if not cset.definitions:
        return cset
    terms: dict[str, ex.Int] = {}
    for name, term in cset.definitions.items():
        terms[name] = ex.substitute(term, terms)  # type: ignore[assignment]
    constraints = tuple(NamedConstraint(c.group, c.meaning, ex.substitute(c.cond, terms))  # type: ignore[arg-type]
                        for c in cset.constraints)
    objective = ex.substitute(cset.objective, terms)
    return ConstraintSet(cset.decisions, {}, constraints, objective, groups=cset.groups)  # type: ignore[arg-type]


def solve_by_parts(cset: ConstraintSet, time_limit_s: float, solver: str,
                   solve_part: Callable[[ConstraintSet, float], SolveResult]) -> SolveResult:
    """Minimise `cset` one independent part at a time and add the results up: the
    objective and bound are sums, the status the weakest, integer stats are summed.
    Each part gets what is left of the time limit (at least 10 ms)."""
    start = time.perf_counter()
    parts = components(cset)
    decisions: dict[str, int] = {}
    objective = bound = 0
    proven = True
    stats: dict[str, int | float | str] = {"components": len(parts)}
    for part in parts:
        remaining = max(0.01, time_limit_s - (time.perf_counter() - start))
        result = solve_part(part, remaining)
        for key, value in result.stats.items():
            if isinstance(value, int) and isinstance(stats.get(key, 0), int):
                stats[key] = int(stats.get(key, 0)) + value
            else:
                stats.setdefault(key, value)
        if result.env is None:
            return SolveResult(solver, result.status, time.perf_counter() - start, stats=stats)
        decisions.update({n: result.env[n] for n in part.decisions})
        objective += result.objective or 0
        bound += result.bound or 0
        proven = proven and result.status is Status.OPTIMAL
    status = Status.OPTIMAL if proven else Status.FEASIBLE
    return SolveResult(solver, status, time.perf_counter() - start,
                       cset.complete(decisions), objective, bound, stats)
