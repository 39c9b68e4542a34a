"""A TileFirst-like greedy baseline: fill each symbolic variable up to its bound, in order.

Seed 000 scheduled its softmax on UPMEM by greedy fusion and then a greedy solver over the
symbolic variables in a fixed order, first `[T, Q]`, then `[D, M, R]`, each "filled up to
its bound subject to the constraints", without looking at the cost. This backend does the
same over a `ConstraintSet`, so the baseline is reported like any other solve and can be
compared with the CP-SAT optimum (`benchmarks/greedy_vs_optimal.py`).

Decisions are recognised by the one naming rule of `space`: `symbol.kernel.dim` is a
factor (`space.var_name`), `ext.kernel.dim` a dimension's padded extent, `fuse.kernel` a
fusion choice (0/1). Any other decision keeps its smallest candidate.

1. Greedy fusion (`greedy_fusion`): every `fuse.*` starts at 0; candidates are tried in
   `fusion_order` (default: the most statements first, as `default_fusion_order` counts
   them; ties in decision order) and set to 1 when no constraint over fusion decisions
   alone that held breaks (coverage: a statement already covered is not covered twice).
   When steps 3-4 then find no schedule and the constraint they fail names a fused
   kernel (a fused fill whose reduction cannot stay in one tile, say), that candidate is
   left out and everything runs again, as an engineer would unfuse it.
   The kernels' own constraints are the factors' business. Factors of kernels left at 0
   stay at 1.
2. The order (`variable_order`): the hierarchy's levels innermost first; within a level
   its spatial slot's symbol, then its memories' temporal symbols, the innermost memory
   first (UPMEM: [T, Q], then [D, M], then [R]; CPU: [P, Q, L], then [S]; the root
   memory's factor is `ext / the others`, not a decision); within a symbol, the
   ConstraintSet's decision order. The seed fixes no order between two memories of one
   level; innermost first extends its "compute tile before the tiles of outer memories"
   ([T, Q] before [D, M]). The other way round (L before Q on the CPU) fills L2 with
   L1-sized loops and leaves the L1 tile at 1 element: 6-42x the optimum at the default
   sizes instead of 1.0-1.4x.
3. The start: the smallest assignment (every factor 1, every `ext` its smallest padded
   extent). When it breaks a rule (UPMEM: a 4-byte f32 run is not 8-byte aligned), no
   single raise can satisfy every constraint, so repair passes come first (`_repair`, at
   most `MAX_REPAIRS`, stopping at a fixed point): in the same order, each factor takes
   the smallest candidate that leaves the fewest constraints violated, nearest to holding
   (`_gap`). This finds a small feasible point (UPMEM: Q = 2) from which step 4 fills up
   as the seed did (T = 16 first); without it T could never rise above 1.
4. The fill (`_raise`), one pass: each factor is raised to the largest candidate with
   which every constraint holds, the others at their current values. Its dimension's
   `ext` moves with it: the smallest padded extent that works (the factors multiply to
   it exactly). The cost is never looked at.

The result is FEASIBLE, never OPTIMAL, with no bound (nothing is proven). When the greedy
ends with a violated constraint it reports TIMEOUT (no schedule found, nothing proven:
`Status` has no "unknown"), with the reason in `stats["failure"]`; only a violated
constraint over no decision at all proves the set INFEASIBLE.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from synth.constraints import expr as ex
from synth.constraints.result import SolveResult, Status
from synth.constraints.space import ConstraintSet, Slot, SlotKind, is_fusion_decision

SOLVER = "greedy"
MAX_REPAIRS = 3  # passes that look for a feasible starting point
EXT = "ext."


# ---------------------------------------------------------------- the order


def symbol_order(slots: Sequence[Slot]) -> tuple[tuple[str, ...], ...]:
    """The factors' symbols grouped by level, innermost level first: each level's spatial
    symbol, then its memories' temporal symbols (innermost memory first). The root memory
    (the first slot: `space.hierarchy_slots` lists the root level's memories first, the
    root memory before the others) is left out: its factor is not a decision."""
    groups: list[tuple[str, ...]] = []
    for level in sorted({s.level_index for s in slots}, reverse=True):
        here = [s for s in slots[1:] if s.level_index == level]
        spatial = [s.symbol for s in here if s.kind is SlotKind.SPATIAL]
        temporal = [s.symbol for s in reversed(here) if s.kind is SlotKind.TEMPORAL]
        if spatial or temporal:
            groups.append(tuple(spatial + temporal))
    return tuple(groups)


def variable_order(cs: ConstraintSet, slots: Sequence[Slot]) -> list[str]:
    """The factor decisions of `cs` in the order the greedy raises them."""
    by_symbol: dict[str, list[str]] = {}
    for name in cs.decisions:
        parsed = _factor(name, slots)
        if parsed is not None:
            by_symbol.setdefault(parsed[0], []).append(name)
    return [name for group in symbol_order(slots) for symbol in group
            for name in by_symbol.get(symbol, [])]


def _factor(name: str, slots: Sequence[Slot]) -> tuple[str, str, str] | None:
    """(symbol, kernel, dim) of a factor decision `symbol.kernel.dim`, else None."""
    symbol, _, rest = name.partition(".")
    kernel, _, dim = rest.rpartition(".")
    if not kernel or symbol not in {s.symbol for s in slots}:
        return None
    return symbol, kernel, dim


# ---------------------------------------------------------------- evaluation


class _State:
    """The current assignment, and which constraints and definitions each decision can
    change (through the definitions), so that a step re-checks only those."""

    def __init__(self, cs: ConstraintSet, decisions: dict[str, int]) -> None:
        self.cs = cs
        self.env = cs.complete(decisions)
        self.evaluations = 0
        depends: dict[str, set[str]] = {}  # defined variable -> decisions it reads
        for name, term in cs.definitions.items():
            depends[name] = {d for v in ex.variables(term) for d in depends.get(v, {v})}
        self._definitions: dict[str, list[str]] = {n: [] for n in cs.decisions}
        for name, found in depends.items():
            for decision in found & set(cs.decisions):
                self._definitions[decision].append(name)
        self._constraints: dict[str, list[int]] = {n: [] for n in cs.decisions}
        self.reads: list[set[str]] = []
        for index, constraint in enumerate(cs.constraints):
            found = {d for v in ex.variables(constraint.cond) for d in depends.get(v, {v})}
            self.reads.append(found)
            for decision in found & set(cs.decisions):
                self._constraints[decision].append(index)
        tiling = [i for i, c in enumerate(cs.constraints) if c.group == "tiling"]
        self._first = set(tiling)  # cheap and the most often broken: checked first

    def affected(self, names: Iterable[str]) -> list[int]:
        found = sorted({i for n in names for i in self._constraints[n]})
        return [i for i in found if i in self._first] + [i for i in found
                                                           if i not in self._first]

    def assign(self, values: Mapping[str, int]) -> None:
        self.env.update(values)
        for name in dict.fromkeys(d for n in values for d in self._definitions[n]):
            self.env[name] = ex.evaluate(self.cs.definitions[name], self.env)

    def violations(self, indices: Sequence[int], stop_at: int | None = None) -> int:
        """How many of the constraints `indices` fail now (counting stops at `stop_at`)."""
        count = 0
        for index in indices:
            self.evaluations += 1
            if not _holds(self.cs.constraints[index].cond, self.env):
                count += 1
                if stop_at is not None and count >= stop_at:
                    break
        return count

    def shortfall(self, indices: Sequence[int]) -> tuple[int, float]:
        """How many of the constraints `indices` fail now, and how far from holding they
        are in all (the sum of their `_gap`s)."""
        count, total = 0, 0.0
        for index in indices:
            self.evaluations += 1
            gap = _gap(self.cs.constraints[index].cond, self.env)
            if gap > 0:
                count, total = count + 1, total + gap
        return count, total

    def violated(self) -> list[int]:
        return [i for i in range(len(self.cs.constraints))
                if not _holds(self.cs.constraints[i].cond, self.env)]


def _holds(cond: ex.Cond, env: Mapping[str, int]) -> bool:
    """As `ConstraintSet.violated`: a condition that divides by zero does not hold."""
    try:
        return ex.holds(cond, env)
    except ZeroDivisionError:
        return False


def _gap(cond: ex.Cond, env: Mapping[str, int]) -> float:
    """0 when `cond` holds, else how far its sides are apart relative to their size (in
    (0, 1]; a disjunction is as near as its nearest part). Only the repair uses it, to
    tell a step that brings a constraint nearer from one that does not (R*D >= 512: D at
    64 is nearer than D at 1, so that R can finish it)."""
    try:
        if isinstance(cond, ex.AnyOf):
            return min(_gap(c, env) for c in cond.conds)
        if ex.holds(cond, env):
            return 0.0
        lhs, rhs = ex.evaluate(cond.lhs, env), ex.evaluate(cond.rhs, env)
    except ZeroDivisionError:
        return 1.0
    return max(abs(lhs - rhs), 1) / max(abs(lhs), abs(rhs), 1)


# ---------------------------------------------------------------- greedy fusion


def fusion_decisions(cs: ConstraintSet) -> list[str]:
    return [n for n in cs.decisions if is_fusion_decision(n)]  # fuse.* and online.*


def default_fusion_order(cs: ConstraintSet) -> list[str]:
    """`fuse.*` decisions, the most statements first, ties in decision order.

    A candidate's statements are counted from the ConstraintSet: the constraints over
    fusion decisions alone (one per statement that several candidates can run: it runs in
    exactly one of them) that mention it. Every statement of a fused candidate has such a
    constraint, since it can also run alone."""
    fuse = fusion_decisions(cs)
    statements = dict.fromkeys(fuse, 0)
    for constraint in cs.constraints:
        read = set(ex.variables(constraint.cond))
        if read and read <= statements.keys():
            for name in read:
                statements[name] += 1
    return sorted(fuse, key=lambda n: -statements[n])


def greedy_fusion(state: _State, order: Sequence[str]) -> None:
    """Set each candidate to 1 when no constraint over fusion decisions alone that held
    breaks, in `order`; it stays 0 otherwise."""
    fuse = set(fusion_decisions(state.cs))
    structural = [i for i, reads in enumerate(state.reads) if reads and reads <= fuse]
    for name in order:
        before = {i for i in structural if i in state.affected([name])}
        held = [i for i in before if _holds(state.cs.constraints[i].cond, state.env)]
        state.assign({name: 1})
        if state.violations(held, stop_at=1):
            state.assign({name: 0})


# ---------------------------------------------------------------- factors


@dataclass(frozen=True)
class _Step:
    """One factor and the padded extent of its dimension (None when that is constant)."""

    name: str
    ext: str | None

    def assignment(self, value: int, ext: int) -> dict[str, int]:
        return {self.name: value} | ({self.ext: ext} if self.ext else {})


def _candidates(cs: ConstraintSet, step: _Step, descending: bool
                ) -> Iterable[tuple[int, int]]:
    """(value, ext) pairs: values in the given order, extents smallest first."""
    values = cs.decisions[step.name]
    for value in reversed(values) if descending else values:
        for ext in cs.decisions[step.ext] if step.ext else (0,):
            yield value, ext


def _raise(state: _State, step: _Step) -> None:
    """The largest value (with the smallest extent) with which every constraint holds;
    the assignment is feasible, so the current value is one."""
    indices = state.affected([step.name] + ([step.ext] if step.ext else []))
    for value, ext in _candidates(state.cs, step, descending=True):
        state.assign(step.assignment(value, ext))
        if not state.violations(indices, stop_at=1):
            return
    raise AssertionError(f"{step.name}: the current value no longer holds")


def _repair(state: _State, step: _Step) -> None:
    """The value that leaves the fewest constraints violated, then the nearest to holding
    (`_gap`), then the smallest (with the smallest extent)."""
    indices = state.affected([step.name] + ([step.ext] if step.ext else []))
    best: tuple[tuple[int, float], dict[str, int]] | None = None
    for value, ext in _candidates(state.cs, step, descending=False):
        state.assign(step.assignment(value, ext))
        score = state.shortfall(indices)
        if best is None or score < best[0]:
            best = (score, step.assignment(value, ext))
            if score[0] == 0:
                break
    assert best is not None
    state.assign(best[1])


def _steps(cs: ConstraintSet, slots: Sequence[Slot], unused: set[str]) -> list[_Step]:
    """The factors to raise, in order, each with its dimension's extent decision; none of
    a kernel greedy fusion left out."""
    steps = []
    for name in variable_order(cs, slots):
        parsed = _factor(name, slots)
        assert parsed is not None
        _, kernel, dim = parsed
        if kernel not in unused:
            ext = f"{EXT}{kernel}.{dim}"
            steps.append(_Step(name, ext if ext in cs.decisions else None))
    return steps


def _pass(state: _State, steps: Sequence[_Step], step_fn: Callable[[_State, _Step], None],
          deadline: float) -> bool:
    """One step per factor, in order; False when the deadline cut it short."""
    for step in steps:
        if time.perf_counter() > deadline:
            return False
        step_fn(state, step)
    return True


# ---------------------------------------------------------------- the backend


def solve(cs: ConstraintSet, time_limit_s: float, slots: Sequence[Slot],
          fusion_order: Sequence[str] | None = None) -> SolveResult:
    """The greedy schedule of `cs` (see the module docstring); deterministic.

    `fusion_order`: `fuse.*` names in the order greedy fusion tries them (names that are
    not decisions of `cs` are skipped; candidates left out stay 0)."""
    start = time.perf_counter()
    fuse = fusion_decisions(cs)
    order = ([n for n in fusion_order if n in fuse] if fusion_order is not None
             else default_fusion_order(cs))
    result = _fill(cs, slots, order, start + time_limit_s)
    while result.status is Status.TIMEOUT and result.env is None:
        # the fill failed inside a fused kernel: fuse less (that kernel left out), again
        failed = [n for n in order if f"kernel {n.partition('.')[2]}:" in
                  str(result.stats.get("failure", ""))]
        if not failed or time.perf_counter() > start + time_limit_s:
            break
        order = [n for n in order if n not in failed]
        result = _fill(cs, slots, order, start + time_limit_s)
    return dataclasses.replace(result, wall_s=time.perf_counter() - start)


def _fill(cs: ConstraintSet, slots: Sequence[Slot], order: Sequence[str], deadline: float
          ) -> SolveResult:
    """Greedy fusion in `order`, then the repair passes and the fill (steps 1-4)."""
    start = time.perf_counter()
    time_limit_s = deadline - start
    decisions = {n: values[0] for n, values in cs.decisions.items()}
    fuse = fusion_decisions(cs)
    for name in fuse:
        decisions[name] = 0
    state = _State(cs, decisions)
    greedy_fusion(state, order)
    unused = {n.partition(".")[2] for n in fuse if state.env[n] == 0}
    steps = _steps(cs, slots, unused)
    repairs, finished = 0, True
    constant = [i for i in state.violated() if not state.reads[i]]
    while not constant and state.violated() and repairs < MAX_REPAIRS and finished:
        before = dict(state.env)
        repairs += 1
        finished = _pass(state, steps, _repair, start + time_limit_s)
        if state.env == before:
            break  # a fixed point: more passes change nothing
    if finished and not state.violated():
        finished = _pass(state, steps, _raise, start + time_limit_s)
    stats: dict[str, int | float | str] = {"repair_passes": repairs, "steps": len(steps),
                                           "evaluations": state.evaluations}
    violated = state.violated()
    if not violated:
        env = cs.complete({n: state.env[n] for n in cs.decisions})
        objective = ex.evaluate(cs.objective, env)
        return SolveResult(SOLVER, Status.FEASIBLE, time.perf_counter() - start, env,
                           objective, None, stats)
    wall = time.perf_counter() - start
    if constant:  # a constraint no decision can change: infeasible, proven
        stats["failure"] = f"{cs.constraints[constant[0]].meaning} never holds"
        return SolveResult(SOLVER, Status.INFEASIBLE, wall, stats=stats)
    first = cs.constraints[violated[0]]
    stats["failure"] = (("" if finished else "out of time; ")
                        + f"the greedy found no schedule ({len(violated)} constraint(s) "
                        f"violated, e.g. {first.group}: {first.meaning}); this proves "
                        "nothing about the problem")
    return SolveResult(SOLVER, Status.TIMEOUT, wall, stats=stats)
