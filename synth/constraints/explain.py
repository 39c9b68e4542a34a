"""Named constraint groups at work: why a request is infeasible, what shapes its optimum.

`explain` names a minimal set of groups that conflict. The constraint set is lowered once
with one enforcement literal per group (`implied` constraints are redundant, so they are
left out: they can never be the reason for a conflict); CP-SAT solves it under all
literals as assumptions and reports a first core
(`sufficient_assumptions_for_infeasibility`), which deletion then shrinks: each group of
the core is left out in turn and kept only if the rest becomes satisfiable. The result is
minimal: without any one of its groups, the remaining groups of the set can be satisfied
together.

One difference from the solver's own lowering: there, `ext / factors` (the outer factor
of a dimension) is an exact division, which makes a dimension's factors divide its
extent by construction. Here it is a floor division, as in the Python evaluation of the
terms (`expr.evaluate`), so that divisibility lives only in the `tiling` group and a
conflict that needs it names it. With `tiling` enforced the two lowerings agree.

`binding` re-solves the optimum without each group the user may drop (`user.UNDROPPABLE`
excepted): a group is binding when the objective improves without it. Each group is also
reported `tight` when one of its inequalities holds with equality at the optimum.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ortools.sat.python import cp_model

from synth.constraints import cpsat
from synth.constraints import expr as ex
from synth.constraints.decompose import PartCache
from synth.constraints.result import Status
from synth.constraints.space import ConstraintSet
from synth.constraints.user import UNDROPPABLE, group_names
from synth.deadline import Deadline
from synth.hardware import Hardware, TransferRules

ALWAYS = "implied"  # redundant: always enforced by the solver, never blamed
# every statement runs once, in kernels some order can run: enforced outright, never blamed
STRUCTURAL = ("fusion.cover", "fusion.acyclic")
CHECK_LIMIT_S = 10.0  # per feasibility check of `explain`
VIOLATED_LIMIT_S = 1.0  # per search for the constraints of a group that fail
LEAST_CHECK_S = 0.5  # a check's time past the deadline: an explanation needs one
RESOLVE_LIMIT_S = 10.0  # per re-solve of `binding`


@dataclass(frozen=True)
class GroupInfo:
    """A group of a constraint set: how many constraints, and what they mean."""

    group: str
    count: int
    meanings: tuple[str, ...]  # the distinct meanings, in order

    def summary(self, limit: int = 3) -> str:
        """At most `limit` meanings in one line."""
        shown = "; ".join(self.meanings[:limit])
        rest = len(self.meanings) - limit
        return shown + (f"; and {rest} more" if rest > 0 else "")


def group_infos(cset: ConstraintSet) -> list[GroupInfo]:
    infos = []
    for name in group_names(cset):
        members = [c for c in cset.constraints if c.group == name]
        infos.append(GroupInfo(name, len(members),
                               tuple(dict.fromkeys(c.meaning for c in members))))
    return infos


# ---------------------------------------------------------------- infeasibility


@dataclass(frozen=True)
class Conflict:
    """One group of a minimal conflicting set."""

    info: GroupInfo
    violated: tuple[str, ...]  # meanings of its constraints the other groups make fail
    facts: str | None  # the hardware numbers behind the group, in words

    @property
    def group(self) -> str:
        return self.info.group

    def summary(self, limit: int = 3) -> str:
        return GroupInfo(self.group, self.info.count, self.violated).summary(limit)


def floor_divisions(node: Any) -> Any:
    """`node` with each `ExactDiv(n, d)` written as floor(n / d) = ceil((n - d + 1) / d),
    so that it no longer forces `d` to divide `n` (and its bounds, from `expr.bounds`,
    stay valid when it does not)."""
    if isinstance(node, ex.ExactDiv | ex.CeilDiv):
        num, den = floor_divisions(node.num), _positive(floor_divisions(node.den))
        if isinstance(num, ex.Const) and isinstance(den, ex.Const):
            return ex.const(num.value // den.value if isinstance(node, ex.ExactDiv)
                            else -(-num.value // den.value))
        if isinstance(node, ex.CeilDiv):
            return ex.CeilDiv(num, den)
        return ex.CeilDiv(ex.add(num, ex.mul(-1, den), 1), den)
    if isinstance(node, ex.Const | ex.Var):
        return node
    if isinstance(node, ex.Mod):
        return ex.Mod(floor_divisions(node.num), node.den)
    if isinstance(node, ex.Cmp):
        return ex.Cmp(floor_divisions(node.lhs), node.op, floor_divisions(node.rhs))
    fields = {f.name: getattr(node, f.name) for f in dataclasses.fields(node)}
    return type(node)(**{name: tuple(floor_divisions(v) for v in value)
                         if isinstance(value, tuple) else floor_divisions(value)
                         for name, value in fields.items()})


def _positive(den: Any) -> Any:
    """A divisor that a floor division inside it may have made 0 (a tile larger than its
    extent, in a kernel the checked groups leave free), kept at least 1 for CP-SAT."""
    return den if isinstance(den, ex.Const) else ex.maximum(den, ex.ONE)


class Feasibility:
    """One CP-SAT model of `cset`'s constraints, each group under its own literal."""

    def __init__(self, cset: ConstraintSet, deadline: Deadline | None = None) -> None:
        """`deadline`: each check gets at most what is left before it (and at least
        `LEAST_CHECK_S`, so that an explanation asked for at the limit still has one)."""
        self.cset, self.deadline = cset, deadline
        # without the groups' bounds: they assume exact tilings, which only `tiling` makes
        self.lowering = cpsat.Lowering(ConstraintSet(
            cset.decisions, {k: floor_divisions(t) for k, t in cset.definitions.items()},
            (), floor_divisions(cset.objective)))
        self.literals: dict[str, cp_model.IntVar] = {}
        for constraint in cset.constraints:
            if constraint.group == ALWAYS:
                continue
            if constraint.group in STRUCTURAL:
                self.lowering.require(floor_divisions(constraint.cond))
                continue
            if constraint.group not in self.literals:
                self.literals[constraint.group] = self.lowering.model.new_bool_var(
                    constraint.group)
            self.lowering.require(floor_divisions(constraint.cond),
                                  self.literals[constraint.group])
        self._by_index = {lit.index: name for name, lit in self.literals.items()}

    def check(self, groups: Sequence[str], time_limit_s: float = CHECK_LIMIT_S
              ) -> tuple[Status, list[str], dict[str, int]]:
        """Whether `groups` can hold together: when not, a subset that cannot; when they
        can, the values of the decisions that satisfy them."""
        solver, code = self._solve([self.literals[g] for g in groups], time_limit_s)
        if code == "INFEASIBLE":
            core = [self._by_index[i] for i in solver.sufficient_assumptions_for_infeasibility()]
            return Status.INFEASIBLE, [g for g in groups if g in core] or list(groups), {}
        if code in ("OPTIMAL", "FEASIBLE"):
            values = {n: solver.value(self.lowering.vars[n]) for n in self.cset.decisions}
            return Status.FEASIBLE, [], values
        return Status.TIMEOUT, [], {}

    def violated(self, group: str, others: Sequence[str]) -> tuple[str, ...]:
        """Meanings of the constraints of `group` that fail when `others` hold: those that
        fail in every such assignment, or else the fewest found to fail together in one."""
        members = [c for c in self.cset.constraints if c.group == group]
        if len(members) == 1:
            return (members[0].meaning,)
        never = [c.meaning for c in members if self._never(floor_divisions(c.cond))]
        if never:  # cheap first: fails whatever the values (its terms' bounds say so)
            return tuple(dict.fromkeys(never))
        holds = {c: self.lowering.bool_of(floor_divisions(c.cond)) for c in members}
        literals = [self.literals[g] for g in others]
        # one assignment where `others` hold first: a constraint that holds in it (its
        # boolean is reified) can hold with them, so its own check below would not find
        # it infeasible, and is not run (the same answer; on fa6 on wormhole 20 of the 21
        # members of capacity.dst hold there, 0.5 s of CP-SAT each)
        solver, code = self._solve(literals, VIOLATED_LIMIT_S)
        can_hold = ({c for c, b in holds.items() if solver.value(b)}
                    if code in ("OPTIMAL", "FEASIBLE") else set())
        always = [c.meaning for c, b in holds.items() if c not in can_hold
                  and not self.expired()
                  and self._status([*literals, b], VIOLATED_LIMIT_S) is Status.INFEASIBLE]
        if always:
            return tuple(dict.fromkeys(always))
        if self.expired():
            return ()
        model = self.lowering.model
        model.maximize(sum(holds.values()))
        solver, code = self._solve(literals, VIOLATED_LIMIT_S)
        model.clear_objective()
        if code not in ("OPTIMAL", "FEASIBLE"):
            return ()
        env = self.cset.complete({n: solver.value(self.lowering.vars[n])
                                  for n in self.cset.decisions})
        broken = [c.meaning for c in members if not _holds(floor_divisions(c.cond), env)]
        return tuple(dict.fromkeys(broken))

    def _never(self, cond: ex.Cond) -> bool:
        """`cond` holds for no values of its terms within their bounds: it fails in every
        assignment, which needs no CP-SAT check (one takes 0.5-0.7 s on fa6/upmem)."""
        if isinstance(cond, ex.AnyOf):
            return all(self._never(part) for part in cond.conds)
        if not isinstance(cond, ex.Cmp):
            return False
        lhs, rhs = (ex.bounds(t, self.lowering.bounds, self.cset.groups)
                    for t in (cond.lhs, cond.rhs))
        return {"<=": lhs[0] > rhs[1], "<": lhs[0] >= rhs[1], ">=": lhs[1] < rhs[0],
                ">": lhs[1] <= rhs[0], "==": lhs[1] < rhs[0] or lhs[0] > rhs[1]}[cond.op]

    def expired(self) -> bool:
        return self.deadline is not None and self.deadline.expired()

    def _solve(self, literals: Sequence[cp_model.IntVar], time_limit_s: float
               ) -> tuple[cp_model.CpSolver, str]:
        """Without CP-SAT's presolve, as the solver runs (`cpsat._solve_part`): with it,
        the check of no groups at all on va/upmem took 8.7 s (0.02 s without), past the
        user's time limit, and it once proved feasible models infeasible."""
        model = self.lowering.model
        model.clear_assumptions()
        model.add_assumptions(literals)
        if self.deadline is not None:
            time_limit_s = min(time_limit_s, max(LEAST_CHECK_S, self.deadline.left()))
        solver = cpsat.new_solver(time_limit_s, workers=1)
        solver.parameters.linearization_level = 1  # the default: these are feasibility checks
        solver.parameters.cp_model_presolve = False
        code = solver.solve(model)
        return solver, solver.status_name(code)

    def _status(self, literals: Sequence[cp_model.IntVar], time_limit_s: float) -> Status:
        code = self._solve(literals, time_limit_s)[1]
        return {"INFEASIBLE": Status.INFEASIBLE, "OPTIMAL": Status.FEASIBLE,
                "FEASIBLE": Status.FEASIBLE}.get(code, Status.TIMEOUT)


def _holds(cond: ex.Cond, env: Mapping[str, int]) -> bool:
    try:
        return ex.holds(cond, env)
    except ZeroDivisionError:
        return False


def minimal_core(cset: ConstraintSet, deadline: Deadline | None = None
                 ) -> dict[str, tuple[str, ...]]:
    """A minimal set of groups that cannot hold together, each with the meanings of its
    constraints that fail when all the others hold; {} when every group can hold (or
    when the checks ran out of time). The set returned is never empty. Past `deadline`
    the set is one that cannot hold together, not yet shrunk to a minimal one, and the
    meanings are left out (the caller shows the group's)."""
    checker = Feasibility(cset, deadline)
    status, core, _ = checker.check(list(checker.literals))
    if status is not Status.INFEASIBLE:
        return {}
    core = _shrink(checker, core)
    if not core:  # infeasible with no group at all: no group is to blame
        return {}
    return {g: checker.violated(g, [o for o in core if o != g]) for g in core}


def _shrink(checker: Feasibility, core: list[str]) -> list[str]:
    """`core` (groups that cannot hold together) less every group whose removal leaves
    a set that still cannot: minimal by deletion."""
    for group in list(core):
        if group not in core:
            continue
        if checker.expired():
            break
        trial = [g for g in core if g != group]
        status, smaller, _ = checker.check(trial)
        if status is Status.INFEASIBLE:
            core = smaller  # a subset of trial: other groups may go at once
    return core


def explain(cset: ConstraintSet, hw: Hardware, deadline: Deadline | None = None
            ) -> list[Conflict]:
    infos = {info.group: info for info in group_infos(cset)}
    return [Conflict(infos[g], violated or infos[g].meanings, facts(g, hw))
            for g, violated in minimal_core(cset, deadline).items()]


def _bytes(n: int) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} B"


def facts(group: str, hw: Hardware) -> str | None:
    """The hardware parameters behind a built-in group, in words."""
    family, _, name = group.partition(".")
    if family == "tiling":
        return ("the factors of each loop dimension multiply exactly to its padded extent "
                "(the extent, or it rounded up to a multiple of a product of the "
                "candidate factors: powers of two, divisors, unit counts)")
    if family == "capacity" and name in {m.name for m in hw.memories}:
        mem = hw.memory(name)
        text = (f"{name}: {_bytes(mem.capacity)} per {mem.instance_level}, {_bytes(mem.reserved)} "
                f"of it reserved, so {mem.usable} B usable (--hw-set {name}.capacity=SIZE)")
        smallest = max(mem.rules.multiple, mem.rules.min_bytes)
        if smallest > 1:
            text += (f"; every buffer there takes at least {smallest} B, since DMA transfers "
                     f"into {name} are {_transfer_rules(mem.rules)}")
        return text
    if family == "transfer" and name in {m.name for m in hw.memories}:
        mem = hw.memory(name)
        return f"DMA transfers into {name} are {_transfer_rules(mem.rules)}"
    if family == "parametric":
        return ("with a size range (--set N=LO..HI) the schedule is solved at the largest "
                "admissible N, and each root-memory loop over a dimension that is N runs "
                "ceil(N / step) times there, so that only its count adapts to other values "
                "of N (the proof's parametric obligation)")
    if family == "count":
        for level in hw.levels:
            if level.name == name:
                return (f"{level.symbol} = {level.count_min}..{level.count_max} "
                        f"{level.name} units (--hw-set {level.name}.count=LO..HI)")
    return None


def _transfer_rules(rules: TransferRules) -> str:
    parts = [f"at least {rules.min_bytes} B (the DMA minimum size)"]
    if rules.max_bytes:
        parts.append(f"at most {rules.max_bytes} B per operation")
    if rules.multiple > 1:
        parts.append(f"padded to multiples of {rules.multiple} B")
    if rules.align > 1:
        parts.append(f"both ends {rules.align}-byte aligned")
    return ", ".join(parts)


# ---------------------------------------------------------------- the optimum


@dataclass(frozen=True)
class GroupStatus:
    """A group at the optimum: tight, and binding (None when not checked or unknown)."""

    info: GroupInfo
    tight: bool
    binding: bool | None
    objective_without: int | None  # the objective with the group dropped (best found)
    status_without: Status | None

    @property
    def group(self) -> str:
        return self.info.group


def tight(cset: ConstraintSet, group: str, env: Mapping[str, int]) -> bool:
    """Whether some inequality of `group` holds with equality at `env`."""
    return any(_tight(c.cond, env) for c in cset.constraints if c.group == group)


def _tight(cond: ex.Cond, env: Mapping[str, int]) -> bool:
    if isinstance(cond, ex.AnyOf):
        return any(_tight(c, env) for c in cond.conds)
    if cond.op == "==":
        return False
    try:
        gap = ex.evaluate(cond.lhs, env) - ex.evaluate(cond.rhs, env)
    except ZeroDivisionError:
        return False
    return gap == 0 if cond.op in ("<=", ">=") else abs(gap) == 1


def droppable(group: str) -> bool:
    return group != ALWAYS and group not in STRUCTURAL and group not in UNDROPPABLE


def binding(cset: ConstraintSet, env: Mapping[str, int], objective: int,
            time_limit_s: float = RESOLVE_LIMIT_S, resolve: bool = True,
            deadline: Deadline | None = None) -> list[GroupStatus]:
    """Every group of `cset` at the solution `env` (of value `objective`), re-solved
    without each droppable group when `resolve` (meaningful when `env` is optimal).
    Each re-solve gets at most what is left before `deadline`; past it, the groups not
    re-solved have no verdict."""
    out = []
    parts = PartCache()  # a part without the dropped group's constraints recurs
    for info in group_infos(cset):
        is_tight = tight(cset, info.group, env)
        expired = deadline is not None and deadline.expired()
        if not droppable(info.group) or not resolve or expired:
            out.append(GroupStatus(info, is_tight, None, None, None))
            continue
        limit = time_limit_s if deadline is None else min(time_limit_s, deadline.left())
        without = dataclasses.replace(cset, constraints=tuple(
            c for c in cset.constraints if c.group != info.group))
        # Dropping constraints never makes the optimum worse, so only a better schedule
        # is of interest: asked for one, the solver proves "none" much faster than it
        # re-finds the optimum (INFEASIBLE here means the objective without is the same).
        result = cpsat.solve(without, limit, cutoff=objective - 1, cache=parts)
        value, status = result.objective, result.status
        verdict: bool | None = None
        if value is not None and value < objective:
            verdict = True
        elif status in (Status.OPTIMAL, Status.INFEASIBLE):
            verdict, value, status = False, objective, Status.OPTIMAL
        out.append(GroupStatus(info, is_tight, verdict, value, status))
    return out
