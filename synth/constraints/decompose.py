"""Split a constraint set into independent sub-problems.

The objective is a sum; when no constraint ties the variables of two sums together (one
kernel's tiling does not constrain another's unless, say, a user constraint on a shared
count does), each group can be minimised alone and the optima add up. This is exact, and
it keeps the search of a many-kernel program the sum, not the product, of its kernels'.
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Callable, Iterable

from synth import progress
from synth.constraints import expr as ex
from synth.constraints import partition
from synth.constraints.result import WHY_NO_SCHEDULE, SolveResult, Status
from synth.constraints.space import ConstraintSet, NamedConstraint, is_fusion_decision
from synth.deadline import Deadline

COVER = "fusion.cover"  # the group of the constraints that each statement runs once
# Up to this many fusion covers, each is solved (`solve_by_covers`: exact, and fast with
# cutoffs); beyond, each candidate kernel once and a set partition (`partition`)
MAX_COVERS = 64


def components(cset: ConstraintSet) -> list[ConstraintSet]:
    """Independent parts of `cset` whose optima add up to the optimum of the whole.

    Definitions are inlined, so each part mentions decisions only."""
    cset = inline_definitions(cset)
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

    def decisions_of(node: ex.Int | ex.Cond) -> frozenset[str]:
        return ex.variable_set(node)  # definitions are inlined: decisions only

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


def part_key(part: ConstraintSet) -> object:
    """What identifies a part's problem (the same in every fusion cover that has it)."""
    return (tuple(sorted(part.decisions.items())), part.constraints, part.objective)


@dataclasses.dataclass(frozen=True)
class Shape:
    """A part's problem up to the names of its decisions: the q, k and v projections of
    a transformer are one problem over three sets of names, solved once. `problem` is
    the part with its decisions renamed `#0`, `#1`, ... in order of first appearance;
    `names` are the part's own decisions in that order."""

    problem: object
    names: tuple[str, ...]

    def canonical(self, result: SolveResult) -> SolveResult:
        """`result` of this part, over the canonical names."""
        if result.env is None:
            return result
        env = {f"#{i}": result.env[name] for i, name in enumerate(self.names)}
        return dataclasses.replace(result, env=env)

    def own(self, result: SolveResult) -> SolveResult:
        """A result over the canonical names, over this part's names."""
        if result.env is None:
            return result
        env = {name: result.env[f"#{i}"] for i, name in enumerate(self.names)}
        return dataclasses.replace(result, env=env)


def part_shape(part: ConstraintSet) -> Shape:
    """`part`'s `Shape` (definitions must be inlined, as `components` leaves them)."""
    order: dict[str, None] = {}
    seen: set[int] = set()

    def visit(node: ex.Int | ex.Cond) -> None:
        if id(node) in seen:
            return
        seen.add(id(node))
        if isinstance(node, ex.Var):
            order.setdefault(node.name)
        for child in ex.children(node):
            visit(child)

    for constraint in part.constraints:
        visit(constraint.cond)
    visit(part.objective)
    names = [n for n in order if n in part.decisions]
    names += sorted(set(part.decisions) - set(names))
    renamed = {name: ex.Var(f"#{i}") for i, name in enumerate(names)}
    memo: dict[int, tuple[object, ex.Int | ex.Cond]] = {}
    problem = (tuple(part.decisions[n] for n in names),
               tuple((c.group, ex.substitute(c.cond, renamed, memo)) for c in part.constraints),
               ex.substitute(part.objective, renamed, memo))
    return Shape(problem, tuple(names))


def inline_definitions(cset: ConstraintSet) -> ConstraintSet:
    """The same problem with every defined variable replaced by its term."""
    if not cset.definitions:
        return cset
    terms: dict[str, ex.Int] = {}
    for name, term in cset.definitions.items():
        terms[name] = ex.substitute(term, terms)  # type: ignore[assignment]
    memo: dict[int, tuple[object, ex.Int | ex.Cond]] = {}
    constraints = tuple(NamedConstraint(c.group, c.meaning,
                                        ex.substitute(c.cond, terms, memo, keep=True))  # type: ignore[arg-type]
                        for c in cset.constraints)
    objective = ex.substitute(cset.objective, terms, memo, keep=True)
    return ConstraintSet(cset.decisions, {}, constraints, objective, groups=cset.groups)  # type: ignore[arg-type]


@dataclasses.dataclass
class PartCache:
    """What is known of the parts that recur across fusion covers (a kernel that is in
    several): optima found, and for parts a cutoff pruned, a value their optimum is known
    to exceed. Both give a lower bound of the part's optimum without solving it again."""

    solved: dict[object, SolveResult] = dataclasses.field(default_factory=dict)
    above: dict[object, int] = dataclasses.field(default_factory=dict)
    # `expr.bounds` of the covers' terms: their variables keep the problem's domains
    bounds: ex.BoundsMemo = dataclasses.field(default_factory=dict)

    # `part_shape` by `part_key`: the same part recurs in many covers
    shapes: dict[object, Shape] = dataclasses.field(default_factory=dict)
    # the decisions of parts a solver's cheap first attempt did not settle: the same
    # part again (another cover, another cutoff) skips it (`cpsat._solve_part`)
    hard: set[frozenset[str]] = dataclasses.field(default_factory=set)
    # `ConstraintSet.floor` of the parts not solved yet, by key
    floors: dict[object, int] = dataclasses.field(default_factory=dict)

    def shape(self, part: ConstraintSet) -> Shape:
        key = part_key(part)
        if key not in self.shapes:
            self.shapes[key] = part_shape(part)
        return self.shapes[key]

    def least(self, key: object, part: ConstraintSet) -> int | None:
        """A lower bound of the optimum of `part`, whose key is `key` (None: the part is
        infeasible): its bound once solved, else the most of what a cutoff showed and
        `ConstraintSet.floor`. The floor tightens the cutoffs of the other parts of a
        cover and skips a part that cannot meet its own (CP-SAT's deterministic time:
        mha/cpu 2.2 -> 0.6 s, mha/upmem 3.0 -> 2.3, swiglu/aie 14.9 -> 16.1; as the
        order of the covers or a filter of them it cost more than it saved)."""
        if key in self.solved:
            result = self.solved[key]
            if result.status is Status.INFEASIBLE:
                return None
            return result.bound if result.bound is not None else 0
        if key not in self.floors:
            self.floors[key] = part.floor(self.bounds)
        return max(self.floors[key], self.above[key] + 1 if key in self.above else 0)

    def exceeds(self, key: object, value: int) -> None:
        """Record that the optimum of part `key` is more than `value`."""
        self.above[key] = max(value, self.above.get(key, value))


def solve_by_parts(cset: ConstraintSet, time_limit_s: float, solver: str,
                   solve_part: Callable[[ConstraintSet, float, int | None], SolveResult],
                   cache: PartCache | None = None,
                   cutoff: int | None = None) -> SolveResult:
    """Minimise `cset` one independent part at a time and add the results up: the
    objective and bound are sums, the status the weakest, integer stats are summed.
    Each part gets what is left of the time limit (at least 10 ms).

    With `cutoff`, only a total of at most `cutoff` is of interest (another fusion cover
    already does better). Costs are never negative, so each part is asked for at most
    what the cutoff leaves after the parts solved so far and the lower bounds the cache
    knows of the others; solved parts and small ones go first. A part that cannot meet
    its share makes the whole INFEASIBLE (pruned, proven: not better)."""
    start = time.perf_counter()
    cache = PartCache() if cache is None else cache
    parts = components(cset)
    shapes = {id(part): cache.shape(part) for part in parts}
    keys = {id(part): shapes[id(part)].problem for part in parts}
    parts.sort(key=lambda p: (keys[id(p)] not in cache.solved, len(p.decisions)))
    least = {id(part): cache.least(keys[id(part)], part) for part in parts}
    decisions: dict[str, int] = {}
    objective = bound = 0
    proven = True
    stats: dict[str, int | float | str] = {"components": len(parts)}

    def pruned() -> SolveResult:
        return SolveResult(solver, Status.INFEASIBLE, time.perf_counter() - start,
                           stats={**stats, "pruned": 1})  # maybe only not better

    if any(low is None for low in least.values()):
        return SolveResult(solver, Status.INFEASIBLE, time.perf_counter() - start, stats=stats)
    rest = sum(low or 0 for low in least.values())  # lower bound of the parts not yet done
    for part in parts:
        remaining = max(0.01, time_limit_s - (time.perf_counter() - start))
        problem = keys[id(part)]
        rest -= least[id(part)] or 0
        left = None if cutoff is None else cutoff - objective - rest
        if left is not None and left < (least[id(part)] or 0):
            return pruned()
        if problem in cache.solved:
            # the same part in another fusion cover, or the same problem over other names
            result = shapes[id(part)].own(cache.solved[problem])
        else:
            result = solve_part(part, remaining, left)
            if result.status is Status.INFEASIBLE and left is not None:
                cache.exceeds(problem, left)
                return pruned()
            if result.status is not Status.TIMEOUT:
                cache.solved[problem] = shapes[id(part)].canonical(result)
        if left is not None and result.objective is not None and result.objective > left:
            return pruned()
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


# ---------------------------------------------------------------- fusion covers


def _cover_order(cover: ConstraintSet) -> int:
    """The fewest kernels first, online ones alike: an online kernel's part is proved in
    hundredths of a second and its cover's total is the cutoff that prunes the unfused
    kernels' hard parts (attention at S = 4096 on cpu: 12.6 s with the online covers
    last, as they were, 1.0 s first; upmem 7.4 -> 5.5 s, aie 1.25 -> 0.8 s; attention
    upmem S = 64 and mha unchanged or faster)."""
    return sum(v == (1,) and is_fusion_decision(n) for n, v in cover.decisions.items())


def fusion_covers(cset: ConstraintSet, deadline: Deadline | None = None
                  ) -> list[ConstraintSet]:
    """`cset` once per assignment of its fusion decisions that the constraints on them
    alone allow (each statement in exactly one kernel), with those decisions substituted:
    the kernels left out then have no constraints and no cost, and their factors drop
    out of the enumeration (they take their smallest values). Past `deadline`, the
    covers found so far (none when the constraints forbade those tried)."""
    names = [n for n in cset.decisions if is_fusion_decision(n)]
    if not names:
        return [cset]
    flat = inline_definitions(cset)
    rewrite = _FusionRewriter(frozenset(names))
    covers: list[ConstraintSet] = []
    for tried, values in enumerate(_exact_covers(cset, names, deadline=deadline)):
        if deadline is not None and tried and deadline.expired():
            break  # (with none allowed so far: the solve is a TIMEOUT)
        cover = _with_fusion(cset, flat, rewrite, dict(zip(names, values, strict=True)))
        if cover is not None:
            covers.append(cover)
    return covers


def with_fusion(cset: ConstraintSet, chosen: dict[str, int]) -> ConstraintSet | None:
    """`cset` with its fusion decisions set to `chosen` (every one of them), as
    `fusion_covers` gives each cover; None when another constraint forbids that cover."""
    return _with_fusion(cset, inline_definitions(cset), _FusionRewriter(frozenset(chosen)),
                        chosen)


def _with_fusion(cset: ConstraintSet, flat: ConstraintSet, rewrite: _FusionRewriter,
                 chosen: dict[str, int]) -> ConstraintSet | None:
    constraints = tuple(rewrite.constraint(c, chosen) for c in flat.constraints)
    if any(c.cond == ex.FALSE for c in constraints):
        return None
    constraints = tuple(c for c in constraints if c.cond != ex.TRUE)
    terms = flat.objective.terms if isinstance(flat.objective, ex.Sum) else (flat.objective,)
    objective = ex.add(*(rewrite.term(t, chosen) for t in terms))
    mentioned = {v for c in constraints for v in ex.variable_set(c.cond)}
    mentioned |= ex.variable_set(objective)
    decisions = {n: d for n, d in cset.decisions.items() if n in mentioned}
    decisions |= {n: (v,) for n, v in chosen.items()}
    return ConstraintSet(decisions, {}, constraints, objective, groups=cset.groups)


def random_cover(cset: ConstraintSet, names: list[str], rng: random.Random
                 ) -> dict[str, int] | None:
    """Values of the fusion decisions `names` that pick exactly one kernel for every
    statement, drawn at random: `_exact_covers`' backtracking with each statement's
    kernels tried in a random order, stopping at the first cover (None: there is none)."""
    options = [sorted(frozenset(ex.variables(c.cond)) & set(names)) for c in cset.constraints
               if c.group == COVER]

    def extend(picked: frozenset[str], excluded: frozenset[str]) -> frozenset[str] | None:
        open_ = next((o for o in options if not set(o) & picked), None)
        if open_ is None:
            return picked
        choices = [n for n in open_ if n not in excluded]
        rng.shuffle(choices)
        for name in choices:
            clash = frozenset().union(*(set(o) for o in options if name in o)) - {name}
            if not clash & picked:
                found = extend(picked | {name}, excluded | clash)
                if found is not None:
                    return found
        return None

    picked = extend(frozenset(), frozenset())
    return None if picked is None else {n: int(n in picked) for n in names}


class _FusionRewriter:
    """Substitutes fusion decisions into constraints and cost terms, each rewrite done
    once per values of the decisions the term mentions: most terms belong to one kernel
    and mention only its decision, so of the covers' many rewrites of a term, two
    differ. The covers then also share the rewritten terms themselves (and the work
    later done on them by identity, such as `expr.variable_set` and `expr.bounds`)."""

    def __init__(self, names: frozenset[str]) -> None:
        self.names = names
        Key = tuple[int, tuple[tuple[str, int], ...]]  # node, values of its fusion decisions
        self._terms: dict[Key, ex.Int] = {}
        self._constraints: dict[Key, NamedConstraint] = {}

    def _key(self, node: ex.Int | ex.Cond, chosen: dict[str, int]
             ) -> tuple[int, tuple[tuple[str, int], ...]]:
        mentioned = sorted(ex.variable_set(node) & self.names)
        return id(node), tuple((n, chosen[n]) for n in mentioned)

    def term(self, term: ex.Int, chosen: dict[str, int]) -> ex.Int:
        key = self._key(term, chosen)
        if key not in self._terms:
            values = {n: ex.const(v) for n, v in key[1]}
            self._terms[key] = ex.substitute(term, values, keep=True)  # type: ignore[assignment]
        return self._terms[key]

    def constraint(self, constraint: NamedConstraint, chosen: dict[str, int]
                   ) -> NamedConstraint:
        key = self._key(constraint.cond, chosen)
        if key not in self._constraints:
            values = {n: ex.const(v) for n, v in key[1]}
            cond = ex.substitute(constraint.cond, values, keep=True)
            self._constraints[key] = dataclasses.replace(constraint, cond=cond)  # type: ignore[arg-type]
        return self._constraints[key]


def _exact_covers(cset: ConstraintSet, names: list[str], limit: int | None = None,
                  deadline: Deadline | None = None) -> list[tuple[int, ...]]:
    """The values of the fusion decisions `names` that pick exactly one kernel for every
    statement (each `fusion.cover` constraint says: exactly one of these is 1), found by
    backtracking over the statements: a 6-statement chain has 21 candidate kernels but
    only 32 covers, so enumerating all 2^21 assignments is out of the question. Their
    number still grows exponentially: the search stops after `limit` + 1 covers, or at
    `deadline` (with at least one)."""
    options = [frozenset(ex.variables(c.cond)) & set(names) for c in cset.constraints
               if c.group == COVER]
    found: list[tuple[int, ...]] = []

    def extend(picked: frozenset[str], excluded: frozenset[str]) -> None:
        if (limit is not None and len(found) > limit) or (
                deadline is not None and found and deadline.expired()):
            return
        open_ = next((o for o in options if not o & picked), None)
        if open_ is None:
            found.append(tuple(int(n in picked) for n in names))
            return
        for name in sorted(open_ - excluded):
            clash = frozenset().union(*(o for o in options if name in o)) - {name}
            if not clash & picked:
                extend(picked | {name}, excluded | clash)

    start = _pinned_start(cset, names, options)
    if start is not None:
        extend(*start)
    return found


def _pinned_start(cset: ConstraintSet, names: list[str], options: list[frozenset[str]]
                  ) -> tuple[frozenset[str], frozenset[str]] | None:
    """Where the covers' backtracking starts: the kernels a constraint `fuse.K == 1`
    picks (and the kernels they clash with excluded, with those `== 0`), so that a set
    whose fusion is pinned (`--fix`, `measure`'s pieces) has its few covers found
    without walking all the others (a transformer block has about 200,000). None when
    the pinned kernels clash: no cover."""
    pinned: dict[str, int] = {}
    for constraint in cset.constraints:
        cond = constraint.cond
        if (isinstance(cond, ex.Cmp) and cond.op == "==" and isinstance(cond.lhs, ex.Var)
                and isinstance(cond.rhs, ex.Const) and cond.lhs.name in names
                and pinned.setdefault(cond.lhs.name, cond.rhs.value) != cond.rhs.value):
            return None  # pinned to two values
    picked = frozenset(n for n, v in pinned.items() if v == 1)
    clash = frozenset().union(*(o for o in options if o & picked)) - picked
    if any(len(o & picked) > 1 for o in options):
        return None  # two pinned kernels run one statement
    return picked, clash | frozenset(n for n, v in pinned.items() if v != 1)


def solve_by_covers(cset: ConstraintSet, time_limit_s: float, solver: str,
                    solve_fixed: Callable[[ConstraintSet, float, int | None], SolveResult],
                    cutoff: int | None = None, partitioned: bool = False,
                    elsewhere: partition.Elsewhere | None = None, jobs: int = 1
                    ) -> SolveResult:
    """Minimise `cset` once per fusion cover (`fusion_covers`) and keep the best: a case
    split on the 0/1 fusion decisions for backends that search the tiling of each cover
    better alone. Covers with fewer kernels (more fusion) go first, and each later one is
    asked only for a total below the best so far (`solve_fixed`'s cutoff; INFEASIBLE then
    means "not better"). Optimal when every cover was solved to optimality or proven
    infeasible (or not better); the bound is the least of the feasible covers' bounds.
    With `cutoff`, only totals of at most `cutoff` are of interest from the start
    (INFEASIBLE: there is none).

    With `partitioned` (a backend that can solve the set-partitioning model, CP-SAT), a
    problem with more than `MAX_COVERS` covers is solved by `partition.solve` instead
    (each candidate kernel once), unless it is not separable. At the time limit the
    cover loop stops with the best cover so far (FEASIBLE, bound 0: the covers not
    tried may be better). `elsewhere` and `jobs`: see `partition.solve`."""
    start = time.perf_counter()
    deadline = Deadline(time_limit_s)
    names = [n for n in cset.decisions if is_fusion_decision(n)]
    if partitioned and names and len(_exact_covers(cset, names, MAX_COVERS, deadline)
                                     ) > MAX_COVERS:
        found = partition.solve(cset, deadline, solver, solve_fixed, cutoff, elsewhere,
                                jobs)
        if found is not None:
            if found.objective is not None:
                progress.best(found.objective)
            return found
    covers = fusion_covers(cset, deadline)
    if len(covers) == 1 and covers[0] is cset:
        return solve_fixed(cset, time_limit_s, cutoff)
    covers.sort(key=_cover_order)
    best: SolveResult | None = None
    best_cover = cset
    proven, bound = True, None
    stats: dict[str, int | float | str] = {"covers": len(covers)}
    for tried, cover in enumerate(covers):
        if deadline.expired() and best is not None:
            proven, bound = False, 0  # the covers not tried may do better
            stats["covers_tried"] = tried
            break
        remaining = max(0.01, time_limit_s - (time.perf_counter() - start))
        if best is not None and best.objective is not None:
            cutoff = best.objective - 1
        result = solve_fixed(cover, remaining, cutoff)
        proven = proven and result.status in (Status.OPTIMAL, Status.INFEASIBLE)
        for why in WHY_NO_SCHEDULE:  # the first part's reason, for the timeout message
            if why in result.stats:
                stats.setdefault(why, result.stats[why])
        if result.status is not Status.INFEASIBLE:
            low = result.bound if result.bound is not None else 0
            bound = low if bound is None else min(bound, low)
        if result.env is not None and result.objective is not None and (
                best is None or best.objective is None or result.objective < best.objective):
            best, best_cover = result, cover
            progress.best(result.objective)  # the live status (a no-op off a terminal)
    wall = time.perf_counter() - start
    if best is None or best.env is None:
        return SolveResult(solver, Status.INFEASIBLE if proven else Status.TIMEOUT, wall,
                           stats=stats)
    decisions = {name: values[0] for name, values in cset.decisions.items()}
    decisions.update({name: best.env[name] for name in best_cover.decisions})
    return SolveResult(solver, Status.OPTIMAL if proven else Status.FEASIBLE, wall,
                       cset.complete(decisions), best.objective, bound,
                       {**best.stats, **stats})
