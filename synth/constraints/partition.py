"""Fusion at scale: each candidate kernel solved once, then a set partition over them.

Enumerating fusion covers (`decompose.fusion_covers`) is exact and fast while covers are
few, but their number grows exponentially with the statements: a 22-statement
transformer block has tens of thousands, a chain of n element-wise statements about
2^(n-1). Without user constraints that tie kernels together, the problem is separable:
every constraint and every cost term mentions the factors of one candidate kernel and at
most its own 0/1 fusion decision `fuse.k` (the unit counts R, D, T are each the most any
chosen kernel uses, and nothing else reads them). Then

    optimum = min over covers C of  base + sum over k in C of opt(k)

where `opt(k)` is candidate k's own optimum with `fuse.k = 1` and `base` the optimum of
the kernels that are the only candidate for their statements. So each candidate is
solved once (its optimum, or bounds when the time runs out), and the cover is chosen by a
set-partitioning model in CP-SAT: one 0/1 variable per candidate, one "exactly one"
constraint per statement, objective sum w_k x_k. `decompose.solve_by_parts` solves that
model as independent components: candidates that share no statement (through a chain of
others) never meet in one model, so the statement graph splits where no candidate
crosses it.

Proofs: when every candidate is solved to optimality (or proven infeasible) and the
partition model too, the result is OPTIMAL and equal to the enumeration's. Otherwise the
schedule is the partition over the candidates' best schedules (upper weights) and the
bound is the partition's optimum over the candidates' proven lower bounds (lower
weights): status FEASIBLE with that gap.

Complexity: c candidates (at most `fusion.MAX_FUSED` statements each; for a chain of n
statements c <= 6n) solved once each instead of once per cover; the partition model has
c booleans and one constraint per shared statement, which CP-SAT solves in milliseconds
at these sizes (set partitioning is NP-hard in general, but these instances are
intervals of a DAG and their LP relaxation is almost always integral).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Collection
from concurrent.futures import FIRST_COMPLETED, Future, wait
from concurrent.futures.process import BrokenProcessPool
from typing import TYPE_CHECKING

from synth.constraints import expr as ex
from synth.constraints.result import SolveResult, Status
from synth.constraints.space import ConstraintSet, NamedConstraint, is_fusion_decision

if TYPE_CHECKING:
    from synth.deadline import Deadline

SolveFixed = Callable[[ConstraintSet, float, int | None], SolveResult]
# `SolveFixed` run in another process: a future of its result
Submit = Callable[[ConstraintSet, float, int | None], "Future[SolveResult]"]
# `SolveFixed` as far as it is cheap: its result, or None when it is not (it needs a worker)
TryHere = Callable[[ConstraintSet, float, int | None], "SolveResult | None"]
# Candidates with at least this many decisions are solved by worker processes (`--jobs`),
# smaller ones where they are needed, unless they turn out hard there (`Elsewhere`): on
# upmem's transformer block the candidates under 15 decisions take at most 0.11 s
# (shipping one to a worker costs about as much), those of 15 or more up to 5.6 s; a
# chain's 285 candidates (10 decisions or fewer) were 2.4x slower in workers than alone.
# On aie the block's GEMMs have 14 decisions and take 2-5 s: the number of decisions
# alone does not tell a hard candidate.
WORKER_DECISIONS = 15


@dataclasses.dataclass(frozen=True)
class Elsewhere:
    """Worker processes for the candidates: `start` solves one there (a future of its
    result); `try_here` solves a small one here as long as that is cheap, and gives up
    (None) when it is not, so that a hard small candidate runs beside the others too.
    Both give the result `solve_fixed` would. `warm` gets the workers ready without
    waiting for them (called when some candidate is sure to go there)."""

    start: Submit
    try_here: TryHere
    warm: Callable[[], None] = lambda: None
# of the time limit, kept for the partition models when the candidates take it all: at
# least this much, or this share of the limit
RESERVE_S, RESERVE_SHARE = 0.2, 0.1
# seconds kept, on top, for each statement's first schedule that `_Candidates.rescue`
# would have to find at the deadline (one cheap first attempt: a few hundredths)
RESCUE_S = 0.1
POLL_S = 0.1  # how often the candidates' loop looks at the clock while workers run


@dataclasses.dataclass(frozen=True)
class Split:
    """A separable problem by candidate kernel."""

    owned: dict[str, ConstraintSet]  # fusion decision -> its kernel's problem at fuse = 1
    base: ConstraintSet  # what no fusion decision switches (single-candidate kernels)
    choice: tuple[NamedConstraint, ...]  # constraints over fusion decisions alone
    choice_terms: tuple[ex.Int, ...]  # cost terms over fusion decisions alone
    names: tuple[str, ...]  # the fusion decisions


def split(cset: ConstraintSet) -> Split | None:
    """`cset` split by candidate kernel, or None when it is not separable (a constraint
    or cost term that ties two kernels' factors or two fusion decisions together, such
    as a user constraint on a unit count)."""
    names = frozenset(n for n in cset.decisions if is_fusion_decision(n))
    if not names:
        return None
    flat = _inline(cset)
    terms = flat.objective.terms if isinstance(flat.objective, ex.Sum) else (flat.objective,)
    parent: dict[str, str] = {}

    def find(name: str) -> str:
        parent.setdefault(name, name)
        while parent[name] != name:
            parent[name] = parent[parent[name]]
            name = parent[name]
        return name

    entries: list[tuple[NamedConstraint | ex.Int, str | None, str]] = []
    choice: list[NamedConstraint] = []
    choice_terms: list[ex.Int] = []
    items: list[NamedConstraint | ex.Int] = [*flat.constraints, *terms]
    for item in items:
        node = item.cond if isinstance(item, NamedConstraint) else item
        found = ex.variable_set(node)
        switches, rest = found & names, found - names
        if not rest:
            if isinstance(item, NamedConstraint):
                choice.append(item)
            elif switches:
                choice_terms.append(item)
            else:
                entries.append((item, None, ""))  # a constant cost
            continue
        if len(switches) > 1:
            return None
        first, *others = sorted(rest)
        for other in others:
            parent[find(other)] = find(first)
        entries.append((item, next(iter(switches), None), first))
    owner: dict[str, str | None] = {}
    for _, switch, anchor in entries:
        if not anchor:
            continue
        root = find(anchor)
        if owner.setdefault(root, switch) != switch:
            return None  # one group of factors, switched by two decisions (or always on)
    grouped: dict[str | None, tuple[list[NamedConstraint], list[ex.Int]]] = {
        key: ([], []) for key in (None, *sorted(names))}
    for item, switch, _ in entries:
        slot = grouped[switch][0 if isinstance(item, NamedConstraint) else 1]
        slot.append(item)  # type: ignore[arg-type]
    decisions: dict[str | None, dict[str, tuple[int, ...]]] = {k: {} for k in grouped}
    for name, values in cset.decisions.items():
        if name not in names and name in parent:
            decisions[owner.get(find(name))][name] = values
    owned = {}
    for name in sorted(names):
        constraints, costs = grouped[name]
        owned[name] = _switched_on(name, decisions[name], constraints, costs, cset)
    base_constraints, base_costs = grouped[None]
    base = ConstraintSet(decisions[None], {}, tuple(base_constraints),
                         ex.add(*base_costs), groups=cset.groups)
    return Split(owned, base, tuple(choice), tuple(choice_terms), tuple(sorted(names)))


def _inline(cset: ConstraintSet) -> ConstraintSet:
    from synth.constraints.decompose import inline_definitions  # a cycle otherwise
    return inline_definitions(cset)


def _switched_on(name: str, decisions: dict[str, tuple[int, ...]],
                 constraints: list[NamedConstraint], costs: list[ex.Int],
                 cset: ConstraintSet) -> ConstraintSet:
    """Candidate `name`'s own problem with its fusion decision set to 1."""
    on = {name: ex.ONE}
    memo: dict[int, tuple[object, ex.Int | ex.Cond]] = {}
    conds = [dataclasses.replace(c, cond=ex.substitute(c.cond, on, memo))  # type: ignore[arg-type]
             for c in constraints]
    conds = [c for c in conds if c.cond != ex.TRUE]
    objective = ex.add(*(ex.substitute(t, on, memo) for t in costs))  # type: ignore[arg-type]
    return ConstraintSet(decisions, {}, tuple(conds), objective, groups=cset.groups)


def solve(cset: ConstraintSet, deadline: Deadline, solver: str, solve_fixed: SolveFixed,
          cutoff: int | None = None, elsewhere: Elsewhere | None = None,
          jobs: int = 1) -> SolveResult | None:
    """The optimum of `cset` by candidates and a set partition (see the module's
    docstring), or None when `cset` is not separable (the caller enumerates covers).
    Candidates are solved smallest first (singletons form a cover, so a schedule exists
    early); at the deadline the others keep the lower bound 0 and are left out of the
    schedule. With `cutoff`, INFEASIBLE means proven: none costs at most that. With
    `elsewhere` (`solve_fixed` in other processes), up to `jobs` candidates are solved at
    once (`_Candidates`); the result is the same as without."""
    parts = split(cset)
    if parts is None:
        return None
    stats: dict[str, int | float | str] = {"candidates": len(parts.owned)}
    reserve = max(RESERVE_S, RESERVE_SHARE * deadline.seconds)
    candidates = _Candidates(parts, deadline, reserve)
    if elsewhere is None or jobs < 2:
        base = solve_fixed(parts.base, max(0.01, deadline.left()), None)
        if base.env is not None:
            candidates.solve_here(solve_fixed)
    else:  # the base while the workers solve candidates
        base = candidates.solve_in_parallel(elsewhere, jobs, solve_fixed)
    if base.env is None:
        status = Status.INFEASIBLE if base.status is Status.INFEASIBLE else Status.TIMEOUT
        return SolveResult(solver, status, deadline.elapsed(), stats=stats)
    candidates.rescue(solve_fixed)
    results = candidates.results
    stats["candidates_solved"] = len(results)
    stats["candidates_dominated"] = candidates.dominated
    upper = _choose(parts, results, True, max(0.01, deadline.left() / 2), solve_fixed)
    if upper.env is None:
        status = (Status.INFEASIBLE if upper.status is Status.INFEASIBLE
                  and len(results) == len(parts.owned) and _all_proven(results)
                  else Status.TIMEOUT)
        return SolveResult(solver, status, deadline.elapsed(), stats=stats)
    proven = (base.status is Status.OPTIMAL and upper.status is Status.OPTIMAL
              and len(results) == len(parts.owned) and _all_proven(results))
    decisions = {n: values[0] for n, values in cset.decisions.items()}
    decisions.update({n: base.env[n] for n in parts.base.decisions})
    for name in parts.names:
        decisions[name] = upper.env[name]
        if upper.env[name] == 1:
            env = results[name].env
            assert env is not None
            decisions.update({n: env[n] for n in parts.owned[name].decisions})
    env = cset.complete(decisions)
    if cset.violated(env):
        return None  # not separable after all: enumerate covers instead
    objective = ex.evaluate(cset.objective, env)
    if proven:
        bound = objective
    else:
        lower = _choose(parts, results, False, max(0.01, deadline.left()), solve_fixed)
        low = max(0, lower.bound or 0) if lower.env is not None else 0
        bound = min(objective, max(0, base.bound or 0) + low)
    stats["cover_kernels"] = sum(upper.env[n] for n in parts.names)
    if cutoff is not None and objective > cutoff:
        if bound > cutoff:
            return SolveResult(solver, Status.INFEASIBLE, deadline.elapsed(),
                               stats={**stats, "pruned": 1})
        return SolveResult(solver, Status.TIMEOUT, deadline.elapsed(), stats=stats)
    return SolveResult(solver, Status.OPTIMAL if proven else Status.FEASIBLE,
                       deadline.elapsed(), env, objective, bound, stats)


class _Candidates:
    """Each candidate solved once, with the cutoff `_dominating` gives it. That cutoff
    depends on the results of the candidates that run a strict subset of its statements
    and on nothing else, and those are solved first (fewer statements first, `_order`):
    so the candidates can be solved in any order that keeps that, or side by side in
    other processes, and each gets the same cutoff and gives the same result. Candidates
    that are the same problem over other names with the same cutoff (a transformer's q,
    k and v projections) are solved once."""

    def __init__(self, parts: Split, deadline: Deadline, reserve: float) -> None:
        from synth.constraints.decompose import part_shape  # a cycle otherwise
        self.parts, self.deadline, self.reserve = parts, deadline, reserve
        self.covered = _statements(parts)
        self.order = _order(parts, self.covered)
        self.singles = [name for name in self.order if len(self.covered[name]) == 1]
        self.shapes = {name: part_shape(parts.owned[name]) for name in parts.names}
        self.results: dict[str, SolveResult] = {}
        self.dominated = 0
        # candidates a constraint other than the cover names (`--fix fuse.sm_mu=1`, a
        # user's condition): a cheaper partition of their statements may not be allowed
        self.constrained = {name for c in parts.choice if c.group != "fusion.cover"
                            for name in ex.variables(c.cond)}

    def solve_here(self, solve_fixed: SolveFixed) -> None:
        solved: dict[object, SolveResult] = {}  # by problem and cutoff, canonical names
        for name in self.order:
            if self.out_of_time():
                break
            cutoff = self.cutoff(name)
            key = (self.shapes[name].problem, cutoff)
            if key not in solved:
                result = solve_fixed(self.parts.owned[name], self.time_left(), cutoff)
                solved[key] = self.shapes[name].canonical(result)
            self.record(name, cutoff, self.shapes[name].own(solved[key]))

    def rescue(self, solve_fixed: SolveFixed, running: Collection[str] = ()) -> None:
        """Where the deadline stops the candidates before every statement has a
        schedule: each statement none covers gets its one-statement candidate's first
        schedule (no cutoff, an even share of what is left but half the reserve; the
        first attempt at each part finds one in a few hundredths of a second), so that
        the answer is a schedule with its gap (FEASIBLE), not none (a transformer block
        on upmem with --time-limit 8 at load 2 had solved 18 of its 22 statements). Not
        those of the candidates `running` (their solves stop at the deadline with one).
        `out_of_time` stops the candidates early enough for this."""
        missing = self._missing(running)
        solved: dict[object, SolveResult] = {}
        for index, name in enumerate(missing):
            left = self.deadline.left() - self.reserve / 2  # the rest: the partitions
            if left <= 0:
                break
            key = self.shapes[name].problem
            if key not in solved:
                share = max(0.01, left / (len(missing) - index))
                solved[key] = self.shapes[name].canonical(
                    solve_fixed(self.parts.owned[name], share, None))
            self.record(name, None, self.shapes[name].own(solved[key]))

    def _missing(self, running: Collection[str] = ()) -> list[str]:
        """The one-statement candidates of the statements that no result with a schedule
        covers, nor a candidate `running`, and that can still get one."""
        done: set[int] = set()
        for name, result in self.results.items():
            if result.env is not None:
                done |= self.covered[name]
        for name in running:
            done |= self.covered[name]
        return [name for name in self.singles if not self.covered[name] <= done
                and (name not in self.results or self.results[name].status not in (
                    Status.INFEASIBLE, Status.OPTIMAL))]

    def solve_in_parallel(self, elsewhere: Elsewhere, jobs: int,
                          solve_fixed: SolveFixed) -> SolveResult:
        """`jobs` worker processes solve the large candidates (`WORKER_DECISIONS`) and
        the small ones that are not cheap (`Elsewhere.try_here`), this one the other
        small ones meanwhile, and the base (`Split.base`: its result does not depend on
        when it is solved) the first time it would otherwise wait. Each candidate starts
        once every candidate that runs a strict subset of its statements has its result,
        in `order`; a large one waits for a free worker. A worker that would idle starts
        a waiting candidate early (`_early`). A candidate whose worker failed (the process
        died) is solved here. The base's result; no candidate starts after it is found to
        have no schedule."""
        waiting = list(self.order)
        if any(self.large(name) for name in waiting):
            elsewhere.warm()
        below = {name: {other for other in self.parts.names
                        if self.covered[other] < self.covered[name]} for name in waiting}
        running: dict[object, tuple[Future[SolveResult], list[tuple[str, int | None]]]] = {}
        solved: dict[object, SolveResult] = {}  # by problem and cutoff, canonical names

        def collect(done: object) -> None:
            future, names = running.pop(done)
            first, cutoff = names[0]
            try:
                result = future.result()
            except BrokenProcessPool:  # its worker died: solve it here
                result = solve_fixed(self.parts.owned[first], self.time_left(), cutoff)
            solved[done] = self.shapes[first].canonical(result)
            for name, cutoff in names:
                self.record(name, cutoff, self.shapes[name].own(solved[done]))

        early: dict[str, tuple[Future[SolveResult], int]] = {}  # name -> (its solve, cutoff)

        def busy() -> list[Future[SolveResult]]:
            return [future for future, _ in running.values()] + [
                future for future, _ in early.values() if not future.done()]

        base: SolveResult | None = None
        while waiting or running:
            for done in [key for key, (future, _) in running.items() if future.done()]:
                collect(done)
            started = [name for _, names in running.values() for name, _ in names]
            if self.out_of_time(started) and waiting:  # a schedule for each statement
                self.rescue(solve_fixed, started)  # then none is missing: on to the reserve
            if self.out_of_time(started) or (base is not None and base.env is None):
                waiting.clear()
            ready = next((n for n in waiting if not below[n] - self.results.keys()
                          and (n not in early or early[n][0].done())
                          and (len(busy()) < jobs or not self.large(n))), None)
            if ready is None:  # each candidate left needs one still running, or a worker
                ahead = self._early(waiting, early) if len(busy()) < jobs else None
                if ahead is not None:
                    name, loose = ahead
                    early[name] = (self._start(elsewhere.start, solve_fixed, name, loose),
                                   loose)
                elif busy() and base is None:  # (within the candidates' time: `rescue`)
                    base = solve_fixed(self.parts.base, self.time_left(), None)
                elif busy():  # (and look at the clock now and then: `out_of_time`)
                    wait(busy(), timeout=POLL_S, return_when=FIRST_COMPLETED)
                continue
            waiting.remove(ready)
            cutoff = self.cutoff(ready)
            key = (self.shapes[ready].problem, cutoff)
            refuted = _refuted(early.pop(ready)[0]) if ready in early else None
            if refuted is not None:  # no schedule under a looser cutoff: none under this
                self.record(ready, cutoff, refuted)
            elif key in solved:
                self.record(ready, cutoff, self.shapes[ready].own(solved[key]))
            elif key in running:  # the same problem is being solved: wait for it
                running[key][1].append((ready, cutoff))
            else:
                found = None if self.large(ready) else elsewhere.try_here(
                    self.parts.owned[ready], self.time_left(), cutoff)
                if found is None:
                    running[key] = (self._start(elsewhere.start, solve_fixed, ready, cutoff),
                                    [(ready, cutoff)])
                else:
                    solved[key] = self.shapes[ready].canonical(found)
                    self.record(ready, cutoff, found)
        if base is None:
            base = solve_fixed(self.parts.base, max(0.01, self.deadline.left()), None)
        return base

    def _early(self, waiting: list[str], early: Collection[str]) -> tuple[str, int] | None:
        """A candidate to start before the candidates that run a strict subset of its
        statements are all done, and the cutoff the results so far give it (None: no
        candidate's statements can be covered yet). That cutoff is at least the one it
        will have, so an INFEASIBLE answer holds then too and is kept (any other is
        dropped, and the candidate solved again when it is ready): the schedule is the
        one without workers. In a transformer
        block the last refutations wait for one another (upmem: hn_gt_up, then
        r2_hn_gt_up, 5.6 s) while a worker idles."""
        for name in waiting:
            loose = None if name in early else self.cutoff(name)
            if loose is not None:
                return name, loose
        return None

    def large(self, name: str) -> bool:
        return len(self.parts.owned[name].decisions) >= WORKER_DECISIONS

    def _start(self, submit: Submit, solve_fixed: SolveFixed, name: str,
               cutoff: int | None) -> Future[SolveResult]:
        owned, left = self.parts.owned[name], self.time_left()
        try:
            return submit(owned, left, cutoff)
        except BrokenProcessPool:  # a worker died before: solve it here
            future: Future[SolveResult] = Future()
            future.set_result(solve_fixed(owned, left, cutoff))
            return future

    def cutoff(self, name: str) -> int | None:
        if name in self.constrained:
            return None
        cheaper = _dominating(name, self.covered, self.results)
        return None if cheaper is None else cheaper - 1

    def record(self, name: str, cutoff: int | None, result: SolveResult) -> None:
        if cutoff is not None and result.status is Status.INFEASIBLE:
            self.dominated += 1  # (or infeasible:) left out either way
        self.results[name] = result

    def out_of_time(self, running: Collection[str] = ()) -> bool:
        """Time to stop starting candidates: the reserve is left, and `RESCUE_S` for each
        problem `rescue` would have to solve then."""
        if not self.results:
            return False
        left = self.deadline.left() - self.reserve
        if left > RESCUE_S * len(self.singles):
            return False  # (without counting what is missing)
        problems = {self.shapes[name].problem for name in self._missing(running)}
        return left <= RESCUE_S * len(problems)

    def time_left(self) -> float:
        return max(0.01, self.deadline.left() - self.reserve)


def _refuted(future: Future[SolveResult]) -> SolveResult | None:
    """The INFEASIBLE answer of a finished early solve (None: any other, or its worker
    died)."""
    try:
        result = future.result()
    except BrokenProcessPool:
        return None
    return result if result.status is Status.INFEASIBLE else None


def _order(parts: Split, covered: dict[str, frozenset[int]]) -> list[str]:
    """Candidates by the number of statements they run (singletons first: they form a
    cover together, and a candidate's cutoff needs the results of those running fewer),
    then by the statements they share with others, then by name (deterministic)."""
    shared = {name: 0 for name in parts.names}
    for constraint in parts.choice:
        for name in ex.variables(constraint.cond):
            if name in shared:
                shared[name] += 1
    return sorted(parts.names, key=lambda n: (len(covered[n]), shared[n],
                                              len(parts.owned[n].decisions), n))


def _statements(parts: Split) -> dict[str, frozenset[int]]:
    """The statements (as indices of their `fusion.cover` constraints) each candidate
    runs; a candidate that is the only one for some statement runs no other."""
    found: dict[str, set[int]] = {name: set() for name in parts.names}
    for index, constraint in enumerate(parts.choice):
        if constraint.group != "fusion.cover":
            continue
        for name in ex.variables(constraint.cond):
            if name in found:
                found[name].add(index)
    return {name: frozenset(statements) for name, statements in found.items()}


def _dominating(name: str, covered: dict[str, frozenset[int]],
                results: dict[str, SolveResult]) -> int | None:
    """The least cost of running candidate `name`'s statements with candidates already
    solved that run only some of them (None: no such partition). Any cover that uses
    `name` can use these instead, so `name` matters only if it costs less: it is solved
    with that cutoff, and INFEASIBLE then proves it dominated. A dynamic programme over
    the subsets of its statements (at most `fusion.MAX_FUSED`)."""
    mine = covered[name]
    if len(mine) < 2:
        return None
    pieces = [(covered[other], r.objective) for other, r in results.items()
              if r.env is not None and r.objective is not None and covered[other]
              and covered[other] < mine]
    order = sorted(mine)
    bit = {s: 1 << k for k, s in enumerate(order)}
    masks = [(sum(bit[s] for s in stmts), cost) for stmts, cost in pieces]
    full = (1 << len(order)) - 1
    best: dict[int, int] = {0: 0}
    for mask in range(1, full + 1):
        low = mask & -mask  # the lowest statement left must be in the next piece
        options = [best[mask ^ piece] + cost for piece, cost in masks
                   if piece & low and piece & mask == piece and (mask ^ piece) in best]
        if options:
            best[mask] = min(options)
    return best.get(full)


def _all_proven(results: dict[str, SolveResult]) -> bool:
    return all(r.status in (Status.OPTIMAL, Status.INFEASIBLE) for r in results.values())


def _choose(parts: Split, results: dict[str, SolveResult], upper: bool, limit_s: float,
            solve_fixed: SolveFixed) -> SolveResult:
    """The set partition: each candidate at its best schedule's cost (`upper`, those
    without one left out) or at its proven lower bound (candidates not solved: their
    `ConstraintSet.floor`)."""
    weights: list[ex.Int] = []
    excluded: list[NamedConstraint] = []
    for name in parts.names:
        result = results.get(name)
        if result is not None and result.status is Status.INFEASIBLE:
            value = None
        elif upper:
            value = result.objective if result is not None and result.env is not None else None
        else:
            value = max(0, result.bound or 0) if result is not None else (
                parts.owned[name].floor())
        if value is None:
            excluded.append(NamedConstraint("fusion.candidate", f"{name}: no schedule",
                                            ex.Cmp(ex.Var(name), "==", ex.ZERO)))
        elif value:
            weights.append(ex.mul(value, ex.Var(name)))
    model = ConstraintSet({n: (0, 1) for n in parts.names}, {},
                          (*parts.choice, *excluded),
                          ex.add(*parts.choice_terms, *weights))
    return _set_partition(model, limit_s)


def _set_partition(model: ConstraintSet, limit_s: float) -> SolveResult:
    """Minimise the partition model, one independent component at a time (candidates
    that share no statement are apart), with CP-SAT's LP relaxation on: the tiling
    models run without it (`cpsat.new_solver`), but a set partition without it is a
    blind search (a 50-statement chain: 220,000 branches and no proof in 12 s; with it,
    proved at the root)."""
    from synth.constraints import cpsat, decompose  # cpsat imports this module

    def solve_part(part: ConstraintSet, left: float, cutoff: int | None) -> SolveResult:
        lowering = cpsat.Lowering(part)
        for constraint in part.constraints:
            lowering.require(constraint.cond)
        objective = lowering.linear(part.objective)
        if cutoff is not None:
            lowering.model.add(objective <= cutoff)
        lowering.model.minimize(objective)
        solver = cpsat.new_solver(left, 1)
        solver.parameters.linearization_level = 2
        start = time.perf_counter()
        code = solver.solve(lowering.model)
        return cpsat.result_of(solver, code, lowering, time.perf_counter() - start)

    return decompose.solve_by_parts(model, limit_s, "cpsat", solve_part)
