"""Lower a ConstraintSet to CP-SAT and solve it to proven optimality.

Every term becomes at most one auxiliary variable (shared when the same term appears
twice), with bounds from interval arithmetic. Products become multiplication
equalities, ceilings division equalities, and each reified condition is written in both
directions so the boolean means exactly the condition. A part not proved quickly is
lowered again with its monomials in power-of-two decisions over exponents (`monomial`:
a linear exponent sum and one element constraint per monomial) and tables for the
dimensions that are not (`tables`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import math
import time
from collections.abc import Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any

import numpy as np
from ortools.sat.python import cp_model

from synth import processes
from synth.constraints import expr as ex
from synth.constraints import monomial, tables
from synth.constraints.decompose import PartCache, solve_by_covers, solve_by_parts
from synth.constraints.partition import Elsewhere
from synth.constraints.result import SolveResult, Status
from synth.constraints.space import ConstraintSet
from synth.errors import InputError

SEED = 0  # fixed, so the same input gives the same schedule
# Auxiliary variables are bounded by interval arithmetic; where that bound is looser than
# a share of this, it is cut so that the objective, a sum of such terms times their
# coefficients, stays within CP-SAT's 64-bit integers. Each of n objective terms gets
# 2^62 / (n + 8): over a day in picoseconds for any built-in. No schedule worth finding
# has a single cost term that large.
OBJECTIVE_RANGE = 2**62

Linear = cp_model.LinearExprT


class Lowering:
    """One CP-SAT model for one ConstraintSet."""

    def __init__(self, cset: ConstraintSet, bounds_memo: ex.BoundsMemo | None = None,
                 monomials: bool = True) -> None:
        """`bounds_memo` may be shared by lowerings whose variables have the same domains
        (the parts of one problem's fusion covers). With `monomials`, terms that are
        monomials in power-of-two decisions are lowered over exponents (`monomial`)."""
        self.cset = cset
        self.model = cp_model.CpModel()
        self.vars: dict[str, cp_model.IntVar] = {}
        self.bounds: dict[str, tuple[int, int]] = {}
        self._aux: dict[tuple[ex.Int, int], cp_model.IntVar] = {}
        terms = cset.objective.terms if isinstance(cset.objective, ex.Sum) else (1,)
        self.max_value = OBJECTIVE_RANGE // (len(terms) + 8)
        self._bools: dict[ex.Cond, cp_model.IntVar] = {}
        # bounds of shared subterms, computed once: `self.bounds` only grows, and a term
        # only mentions variables declared before it
        self._bounds_memo: ex.BoundsMemo = {} if bounds_memo is None else bounds_memo
        self._declare_decisions()
        # terms that are monomials in power-of-two decisions, over exponents (`monomial`)
        self._exponents: dict[str, cp_model.IntVar] = {}
        if monomials:
            self._declare_exponents()
        fixed = {n: v[0] for n, v in cset.decisions.items() if len(v) == 1}
        self.monomials = monomial.Analysis(set(self._exponents), fixed)
        self._quotients = 0  # of `monomials.quotients`, those whose divisibility is required
        self._by_monomial: dict[tuple[monomial.Monomial, int], cp_model.IntVar] = {}
        self._declare_definitions()

    # -- variables --------------------------------------------------------------

    def _declare_decisions(self) -> None:
        for name, values in self.cset.decisions.items():
            domain = cp_model.Domain.from_values(list(values))
            self.vars[name] = self.model.new_int_var_from_domain(domain, name)
            self.bounds[name] = (values[0], values[-1])

    def _declare_exponents(self) -> None:
        """e = log2 v for each decision v whose every value is a power of two (one
        element constraint each: exact both ways)."""
        for name, values in self.cset.decisions.items():
            logs = [monomial.log2(v) for v in values]
            if len(values) < 2 or any(k is None for k in logs):
                continue
            exponent = self.model.new_int_var_from_domain(
                cp_model.Domain.from_values(logs), f"log2({name})")
            powers = [2**k if k in logs else 0 for k in range(max(logs) + 1)]  # type: ignore[type-var, operator]
            self.model.add_element(exponent, powers, self.vars[name])
            self._exponents[name] = exponent

    def _declare_definitions(self) -> None:
        for name, term in self.cset.definitions.items():
            lo, hi = self._capped(term, self.max_value)
            var = self.model.new_int_var(lo, hi, name)
            self.model.add(var == self.linear(term))
            self.vars[name] = var
            self.bounds[name] = (lo, hi)

    def _new_aux(self, term: ex.Int, cap: int) -> cp_model.IntVar:
        return self.model.new_int_var(*self._capped(term, cap), "")

    def _capped(self, term: ex.Int, cap: int) -> tuple[int, int]:
        """The bounds of `term` within -cap..cap (see OBJECTIVE_RANGE): every variable and
        product CP-SAT sees stays within 64 bits. A term whose every value is past the
        cap cannot be modelled, and is bad input (sizes or costs too large)."""
        lo, hi = ex.bounds(term, self.bounds, self.cset.groups, self._bounds_memo)
        if lo > cap or hi < -cap:
            raise too_large(term, lo if lo > cap else hi, cap)
        return max(lo, -cap), min(hi, cap)

    # -- integer terms ----------------------------------------------------------

    def linear(self, term: ex.Int) -> Linear:
        """A linear expression equal to `term` (auxiliary variables for non-linear parts)."""
        if isinstance(term, ex.Const):
            if abs(term.value) > self.max_value:
                raise too_large(term, term.value, self.max_value)
            return term.value
        if isinstance(term, ex.Var):
            return self.vars[term.name]
        if isinstance(term, ex.Sum):
            return sum((self.linear(t) for t in term.terms), 0)
        if isinstance(term, ex.Prod):
            chosen = [f for f in term.factors if isinstance(f, ex.Select)]
            if (len(chosen) == 1 and isinstance(chosen[0].other, ex.Const)
                    and not self._exponents):  # the lowering as products
                return self.linear(_by_branch(term, chosen[0]))
            coeff, rest = _split_coefficient(term)
            cap = self.max_value // max(abs(coeff), 1)
            if not cap:
                raise too_large(term, coeff, self.max_value)
            if len(rest) == 1 and isinstance(rest[0], ex.Var):
                name = rest[0].name
                if max(map(abs, self.bounds[name])) <= cap:
                    return coeff * self.vars[name]
                aux = self._new_aux(rest[0], cap)  # the variable, within the cap
                self.model.add(aux == self.vars[name])
                return coeff * aux
            return coeff * self.var_of(rest[0] if len(rest) == 1 else ex.Prod(tuple(rest)), cap)
        return self.var_of(term)

    def var_of(self, term: ex.Int, cap: int | None = None) -> cp_model.IntVar:
        """A variable equal to `term` (at most `cap`), created once per term and cap."""
        cap = self.max_value if cap is None else cap
        if isinstance(term, ex.Var):
            return self.vars[term.name]
        key = (term, cap)
        if key not in self._aux and self._exponents:  # the lowering over exponents
            found = self.monomials.monomial(term)
            self._require_divisible()
            if found is not None and found.exponents:
                self._aux[key] = self._monomial_var(term, found, cap)
                return self._aux[key]
        if key not in self._aux:
            aux = self._new_aux(term, cap)
            self._constrain(aux, term)
            self._aux[key] = aux
        return self._aux[key]

    def _exponent_sum(self, found: monomial.Monomial) -> tuple[Linear, int, int]:
        """The linear exponent s of `found` (its value is coef * 2^s) and s's bounds."""
        lo = hi = 0
        for name, k in found.exponents:
            domain = list(self._exponents[name].proto.domain)
            lo += min(k * domain[0], k * domain[-1])
            hi += max(k * domain[0], k * domain[-1])
        total = cp_model.LinearExpr.weighted_sum(
            [self._exponents[name] for name, _ in found.exponents],
            [k for _, k in found.exponents])
        return total, lo, hi

    def _monomial_var(self, term: ex.Int, found: monomial.Monomial, cap: int) -> cp_model.IntVar:
        """A variable equal to `term`, a monomial: its exponent sum is linear in the
        decisions' exponents, its value one element of the table of coef * 2^s (the
        values that are whole and within the cap)."""
        key = (found, cap)
        if key in self._by_monomial:
            return self._by_monomial[key]
        total, lo, hi = self._exponent_sum(found)
        values = [found.value(s) for s in range(lo, hi + 1)]
        whole = [i for i, v in enumerate(values) if v.denominator == 1]
        if not whole:  # never whole: the divisibility fails, no schedule
            self.model.add_bool_or([])
            return self.model.new_constant(0)
        allowed = [i for i in whole if values[i] <= cap]
        if not allowed:
            raise too_large(term, int(values[whole[0]]), cap)
        index = self.model.new_int_var_from_domain(cp_model.Domain.from_values(allowed), "")
        self.model.add(index == total - lo)
        table = [0] * len(values)
        for i in allowed:
            table[i] = int(values[i])
        var = self.model.new_int_var(table[allowed[0]], table[allowed[-1]], "")
        self.model.add_element(index, table, var)
        self._by_monomial[key] = var
        return var

    def _require_divisible(self) -> None:
        """Each exact quotient met so far divides: its exponent sum at least the least
        one at which coef * 2^s is whole (the divisibility the multiplication equality
        of a lowered `ExactDiv` would state, kept where the quotient cancels out of a
        larger monomial)."""
        quotients = self.monomials.quotients
        while self._quotients < len(quotients):
            found = quotients[self._quotients]
            self._quotients += 1
            total, lo, hi = self._exponent_sum(found)
            whole = [s for s in range(lo, hi + 1) if found.value(s).denominator == 1]
            if not whole:
                self.model.add_bool_or([])  # never whole: no schedule
            elif whole[0] > lo:
                self.model.add(total >= whole[0])

    def _constrain(self, aux: cp_model.IntVar, term: ex.Int) -> None:
        model = self.model
        if isinstance(term, ex.Prod):
            coeff, rest = _split_coefficient(term)
            if coeff != 1 or len(rest) == 1:
                model.add(aux == self.linear(term))
            else:
                # pairwise, so each intermediate product has tight bounds
                head = self.var_of(rest[0]) if len(rest) == 2 else self.var_of(
                    ex.Prod(tuple(rest[:-1])))
                self._multiply(aux, head, self.var_of(rest[-1]))
        elif isinstance(term, ex.Max):
            model.add_max_equality(aux, [self.linear(a) for a in term.args])
        elif isinstance(term, ex.CeilDiv):
            num = self.var_of(ex.add(term.num, term.den, -1))
            model.add_division_equality(aux, num, self.var_of(term.den))
        elif isinstance(term, ex.Mod):
            model.add_modulo_equality(aux, self.var_of(term.num), term.den)
        elif isinstance(term, ex.ExactDiv):
            # aux * den == num: also makes den divide num
            model.add_multiplication_equality(self.var_of(term.num), [aux, self.var_of(term.den)])
        elif isinstance(term, ex.Select):
            chosen = self.bool_of(term.cond)
            model.add(aux == self.linear(term.then)).only_enforce_if(chosen)
            model.add(aux == self.linear(term.other)).only_enforce_if(chosen.negated())
        else:
            model.add(aux == self.linear(term))

    def _multiply(self, aux: cp_model.IntVar, a: cp_model.IntVar, b: cp_model.IntVar) -> None:
        """aux == a * b. A factor of two consecutive values (lo or lo + 1: a two-valued
        decision, a select between neighbours) is a boolean in disguise: the product is
        linear under each value, written as two enforced equalities. CP-SAT's presolve
        does this itself; without presolve its product propagator on such a factor ran
        3.7 million integer propagations in 1,227 branches (fa6/cpu, 6 s for 0.5
        deterministic s)."""
        for two, other in ((a, b), (b, a)):
            domain = list(two.proto.domain)
            if len(domain) == 2 and domain[1] - domain[0] == 1:
                lo = domain[0]
                high = self.model.new_bool_var("")
                # high -> two == lo + 1;  not high -> two == lo
                self.model.add(two == lo + 1).only_enforce_if(high)
                self.model.add(two == lo).only_enforce_if(high.negated())
                self.model.add(aux == (lo + 1) * other).only_enforce_if(high)
                self.model.add(aux == lo * other).only_enforce_if(high.negated())
                return
        self.model.add_multiplication_equality(aux, [a, b])

    # -- redundant tables -------------------------------------------------------

    def add_dimension_tables(self) -> None:
        """For each dimension with a factor that is not lowered over exponents (one of
        its values is not a power of two: a padded or prime extent, 60 DPUs), one table
        of its valid factor assignments with a column for every auxiliary term and
        condition over it alone (see `tables`). Call it after every constraint and the
        objective are lowered: the columns are the terms they created."""
        for names in tables.dimension_variables(self.cset):
            inside = set(names)
            if inside <= self._exponents.keys():
                continue  # its products are linear over exponents (`monomial`)

            def over_dimension(node: ex.Int | ex.Cond) -> bool:
                found = ex.variable_set(node)
                return bool(found) and found <= inside  # noqa: B023 (used at once)

            rows = tables.valid_rows(self.cset, names, [
                c.cond for c in self.cset.constraints if over_dimension(c.cond)])
            if rows is None:
                continue
            columns: list[tuple[ex.Int | ex.Cond, cp_model.IntVar]] = [
                (term, var) for (term, _), var in self._aux.items() if over_dimension(term)]
            columns += [(cond, var) for cond, var in self._bools.items() if over_dimension(cond)]
            evaluator = tables.Evaluator(rows.env)
            keep = np.ones(rows.count, dtype=bool)
            values = [rows.env[n] for n in names]
            for term, var in columns:
                column, defined = evaluator.column(term)
                domain = list(var.proto.domain)
                keep &= defined & (column >= domain[0]) & (column <= domain[-1])
                values.append(column)
            if np.count_nonzero(keep) > tables.TABLE_LIMIT:
                continue
            table: list[list[int]] = np.stack(values, axis=1)[keep].tolist()
            self.model.add_allowed_assignments(
                [self.vars[n] for n in names] + [var for _, var in columns], table)

    # -- conditions -------------------------------------------------------------

    def bool_of(self, cond: ex.Cond) -> cp_model.IntVar:
        """A boolean variable that is true exactly when `cond` holds."""
        if cond in self._bools:
            return self._bools[cond]
        b = self.model.new_bool_var("")
        if isinstance(cond, ex.AnyOf):
            parts = [self.bool_of(c) for c in cond.conds]
            # b -> some part holds;  each part -> b
            self.model.add_bool_or(parts).only_enforce_if(b)
            for part in parts:
                self.model.add_implication(part, b)
        else:
            # b -> lhs OP rhs;  not b -> the negation
            self.model.add(_compare(self.linear(cond.lhs), cond.op,
                                    self.linear(cond.rhs))).only_enforce_if(b)
            self.model.add(_compare(self.linear(cond.lhs), _NEGATION[cond.op],
                                    self.linear(cond.rhs))).only_enforce_if(b.negated())
        self._bools[cond] = b
        return b

    def require(self, cond: ex.Cond, enforce: cp_model.IntVar | None = None) -> None:
        """Add `cond` as a hard constraint (only under `enforce` when given)."""
        if isinstance(cond, ex.AnyOf):
            ct = self.model.add_bool_or([self.bool_of(c) for c in cond.conds])
        else:
            ct = self.model.add(_compare(self.linear(cond.lhs), cond.op, self.linear(cond.rhs)))
        if enforce is not None:
            ct.only_enforce_if(enforce)


_NEGATION = {"<=": ">", ">=": "<", "<": ">=", ">": "<=", "==": "!="}


def too_large(term: ex.Int, value: int, cap: int) -> InputError:
    """Bad input: a term the encoding built is past what CP-SAT's 64-bit integers hold."""
    text = ex.render(term)
    text = text if len(text) <= 160 else text[:160] + "..."
    return InputError(f"the problem is too large to model with 64-bit integers: the term "
                      f"{text} reaches {value:.3g}, past {cap:.3g} (2^62 shared by the "
                      f"objective's terms); make the sizes or the hardware's costs smaller")


def _compare(lhs: Linear, op: str, rhs: Linear) -> Any:  # a CP-SAT constraint expression
    if op == "<=":
        return lhs <= rhs
    if op == ">=":
        return lhs >= rhs
    if op == "<":
        return lhs < rhs
    if op == ">":
        return lhs > rhs
    if op == "==":
        return lhs == rhs
    return lhs != rhs


def _split_coefficient(term: ex.Prod) -> tuple[int, list[ex.Int]]:
    coeff = 1
    rest: list[ex.Int] = []
    for f in term.factors:
        if isinstance(f, ex.Const):
            coeff *= f.value
        else:
            rest.append(f)
    return coeff, rest


# ---------------------------------------------------------------- solving


def solve(cset: ConstraintSet, time_limit_s: float = 30.0, workers: int = 1,
          cutoff: int | None = None, cache: PartCache | None = None,
          work_limit_s: float | None = None, jobs: int = 1) -> SolveResult:
    """Minimise the objective of `cset`: status, solution and proven bound; with
    `cutoff`, INFEASIBLE when no schedule costs at most that. `cache` may be shared by
    solves of sets with the same decisions (e.g. the same model less some constraints):
    the parts they have in common are solved once.

    Each fusion cover is solved on its own and the best kept, and within a cover the
    independent parts one by one (see `decompose`); a part that recurs across covers (a
    kernel that is in several) is solved once. One model over all covers leaves CP-SAT
    to search fusion and tiling together, and with prologue and epilogue candidates that
    took over 30 s on attention/upmem where the covers take about a second. One worker
    and a fixed seed make the result deterministic.

    `work_limit_s` bounds each CP-SAT call by deterministic time too (CP-SAT's own
    measure of work, about a second of a fast core per unit): with one worker, a verdict
    reached within it does not depend on the machine's speed (tests use it).

    `jobs` > 1: a problem with many fusion candidates (`partition`) solves up to `jobs`
    candidate kernels at once in worker processes; the result is the same as with one
    (each candidate's cutoff depends only on candidates solved before it starts)."""
    return _solve(cset, time_limit_s, Effort(workers, work_limit_s), cutoff, cache, jobs)


@dataclasses.dataclass(frozen=True)
class Effort:
    """How each CP-SAT call runs besides its wall-clock limit: its workers, and a bound
    on its deterministic time (None: none)."""

    workers: int = 1
    work_limit_s: float | None = None
    # only the cheap first attempt at each part (`FIRST_WORK_S`): a part it does not
    # settle raises `_Unsettled` (`_try_here`)
    first_only: bool = False


class _Unsettled(Exception):
    """A part the cheap first attempt did not settle, with `Effort.first_only`."""


def _solve(cset: ConstraintSet, time_limit_s: float, effort: Effort, cutoff: int | None,
           cache: PartCache | None, jobs: int) -> SolveResult:
    solved = PartCache() if cache is None else cache  # parts that recur across covers
    with _without_cycle_collection(), _Workers(jobs) as workers:
        return solve_by_covers(cset, time_limit_s, "cpsat", lambda cover, limit, most: (
            _solve_cover(cover, limit, most, effort, solved)), cutoff, partitioned=True,
            elsewhere=workers.elsewhere(effort, solved), jobs=jobs)


def _solve_cover(cover: ConstraintSet, time_limit_s: float, cutoff: int | None,
                 effort: Effort, solved: PartCache) -> SolveResult:
    """A set whose fusion is fixed (a cover, or one candidate kernel): part by part."""
    return solve_by_parts(cover, time_limit_s, "cpsat", lambda part, left, share: (
        _solve_part(part, left, effort, share, solved.bounds, solved.hard)), solved, cutoff)


def _try_here(cover: ConstraintSet, time_limit_s: float, cutoff: int | None,
              effort: Effort, solved: PartCache) -> SolveResult | None:
    """`_solve_cover` while each part is settled by its cheap first attempt: then its
    result is the one `_solve_cover` gives, else None (the cover is hard: a worker solves
    it from the start, which gives that result too)."""
    try:
        return _solve_cover(cover, time_limit_s, cutoff,
                            dataclasses.replace(effort, first_only=True), solved)
    except _Unsettled:
        return None


def _solve_elsewhere(cover: ConstraintSet, time_limit_s: float, cutoff: int | None,
                     effort: Effort) -> SolveResult:
    """`_solve_cover` in a worker process, with a cache of its own."""
    with _without_cycle_collection():
        return _solve_cover(cover, time_limit_s, cutoff, effort, PartCache())


class _Workers:
    """Worker processes for `partition`'s candidates, started at the first one submitted
    (most problems never submit any) and stopped at the end of the solve."""

    def __init__(self, jobs: int) -> None:
        self.jobs = jobs
        self.pool: ProcessPoolExecutor | None = None

    def __enter__(self) -> _Workers:
        return self

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        if self.pool is not None:
            if kind is None:
                self.pool.shutdown(wait=True)
            else:  # interrupted, or failed: do not wait for the workers' solves
                processes.stop(self.pool)

    def elsewhere(self, effort: Effort, solved: PartCache) -> Elsewhere | None:
        if self.jobs < 2:
            return None

        def start(cover: ConstraintSet, time_limit_s: float, cutoff: int | None
                  ) -> Future[SolveResult]:
            if self.pool is None:
                self.pool = processes.process_pool(self.jobs, __name__)
            return self.pool.submit(_solve_elsewhere, cover, time_limit_s, cutoff, effort)

        def try_here(cover: ConstraintSet, time_limit_s: float, cutoff: int | None
                     ) -> SolveResult | None:
            return _try_here(cover, time_limit_s, cutoff, effort, solved)

        def warm() -> None:
            processes.warm(__name__)

        return Elsewhere(start, try_here, warm)


@contextlib.contextmanager
def _without_cycle_collection() -> Iterator[None]:
    """Pause Python's cycle collector while solving: lowering allocates hundreds of
    thousands of small acyclic objects (terms, tuples), which reference counting frees,
    and the collector's passes over the caller's heap were 9% of fa6/upmem's solve time
    inside the benchmark. Whatever cycles arise are collected when it resumes."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _solve_part(cset: ConstraintSet, time_limit_s: float, effort: Effort,
                cutoff: int | None = None, bounds_memo: ex.BoundsMemo | None = None,
                hard: set[frozenset[str]] | None = None) -> SolveResult:
    """The optimum of one part; with `cutoff`, INFEASIBLE when none is at most that.
    `bounds_memo` is shared by the parts of one problem (see `Lowering`). `hard`: the
    decisions of parts the lowering as products did not settle within `FIRST_WORK_S`
    (recorded here); the same part solved again, with another cutoff, starts over
    exponents.

    Without CP-SAT's presolve (`_configured`): on these models it costs more than it
    saves. It computes exact domains of long linear sums of small-range factors with
    large coefficients, which on attention/wormhole's online kernels ran past 150 s and
    12 GB before the first branch (no time limit stops it); without it that part is
    proved in 0.01 s. Measured over the built-ins on cpu and upmem (process CPU time,
    benchmarks/RESULTS.md): swiglu/cpu 12.2 -> 3.1 s, the transformer/cpu 26.6 -> 11.1,
    mv/upmem 1.2 -> 0.4; fa6/cpu 0.4 -> 1.2 s is the one that needs presolve. It also
    made some feasible models INFEASIBLE (see `new_solver`), which every INFEASIBLE
    verdict then had to be solved again to confirm."""
    if all(len(values) == 1 for values in cset.decisions.values()):
        # nothing to decide (constants, or a fusion cover's fixed decisions): evaluate
        env = {name: values[0] for name, values in cset.decisions.items()}
        value = ex.evaluate(cset.objective, env) if not cset.violated(env) else None
        if value is None or (cutoff is not None and value > cutoff):
            return SolveResult("cpsat", Status.INFEASIBLE, 0.0)
        return SolveResult("cpsat", Status.OPTIMAL, 0.0, env, value, value)
    start = time.perf_counter()
    decided = frozenset(cset.decisions)
    first: SolveResult | None = None
    used = 0.0  # deterministic time of the first attempt
    if hard is None or decided not in hard:
        # cheap first: most parts are proved within a fraction of a second as products
        lowering = _lowered(cset, cutoff, bounds_memo, monomials=False)
        first_work = FIRST_WORK_S if effort.work_limit_s is None else min(
            FIRST_WORK_S, effort.work_limit_s)
        solver = _configured(time_limit_s, effort.workers, first_work)
        code = solver.solve(lowering.model)
        first = result_of(solver, code, lowering, time.perf_counter() - start)
        if first.status in (Status.OPTIMAL, Status.INFEASIBLE):
            return first
        used = solver.deterministic_time
        if hard is not None:
            hard.add(decided)
    if effort.first_only:
        raise _Unsettled
    # a hard part: again over exponents (see `monomial`), from the best schedule so far
    lowering = _lowered(cset, cutoff, bounds_memo, monomials=True)
    if first is not None and first.env is not None:
        for name in cset.decisions:
            lowering.model.add_hint(lowering.vars[name], first.env[name])
    lowering.add_dimension_tables()
    work_left = None if effort.work_limit_s is None else max(effort.work_limit_s - used, 0.0)
    elapsed = time.perf_counter() - start
    solver = _configured(max(time_limit_s - elapsed, 0.0), effort.workers, work_left)
    code = solver.solve(lowering.model)
    second = result_of(solver, code, lowering, time.perf_counter() - start)
    if first is None:
        return second
    stats = {key: _count(first, key) + _count(second, key) for key in ("branches", "conflicts")}
    if second.env is None and first.env is not None:  # out of time before a schedule
        return dataclasses.replace(first, wall_s=second.wall_s, stats=stats)
    return dataclasses.replace(second, stats=stats)


def _lowered(cset: ConstraintSet, cutoff: int | None, bounds_memo: ex.BoundsMemo | None,
             monomials: bool) -> Lowering:
    """`cset` as a CP-SAT model minimising its objective (at most `cutoff`)."""
    lowering = Lowering(cset, bounds_memo, monomials)
    for constraint in cset.constraints:
        lowering.require(constraint.cond)
    objective = lowering.linear(cset.objective)
    if cutoff is not None:  # another fusion cover already does better than this
        lowering.model.add(objective <= cutoff)
    lowering.model.minimize(objective)
    return lowering


def _by_branch(term: ex.Prod, chosen: ex.Select) -> ex.Int:
    """`term`, a product with one factor `c if cond else k` (k a constant), as
    `term[c] if cond else term[k]`: the same value, but each branch is one product, whose
    factors are bounded together (`expr.bounds` pairs the factors of a dimension) where
    the select as a factor cut the product into the select and the product of the others,
    bounded apart. aie's transfer terms are of this kind (`x if an outer loop runs else
    1`). Only in the lowering as products (`_solve_part`'s first attempt), which it
    settles more often: CP-SAT deterministic time of the 39 built-in x cpu/upmem/aie
    cases 57.3 -> 52.8 s (transformer/aie 22.9 -> 19.4, identical objectives). Over
    exponents it made the refutation in matmul/aie 0.58 -> 1.11 s, and with two such
    factors (four branches) it was slower too (benchmarks/RESULTS.md)."""
    others = [factor for factor in term.factors if factor is not chosen]
    return ex.select(chosen.cond, ex.mul(*others, chosen.then), ex.mul(*others, chosen.other))


def _count(result: SolveResult, key: str) -> int:
    value = result.stats.get(key, 0)
    return value if isinstance(value, int) else 0


# Deterministic seconds CP-SAT gets on a part as products before it is lowered again
# over exponents (`monomial`) with tables for the dimensions that are not (`tables`):
# most parts are proved within it, and on those the second lowering costs more than it
# saves, while a GEMM on upmem takes 2.6 as products and 0.3 over exponents. Whole
# solves (process CPU s; RESULTS.md "How long a part runs as products first"): 0.1 was
# chosen over 0.5 / 0.15 / 0.08 / 0.03 while layernorm/cpu and fa6/cpu needed up to
# 0.1 as products (at 0.03: 4-5x slower); since the cpu model's chains are a select
# they do not, and 16 cases (upmem / cpu / aie totals) at 0.1: 38.8 / 11.3 / 24.9,
# 0.05: 34.7 / 10.3 / 21.4.
FIRST_WORK_S = 0.05


def _configured(time_limit_s: float, workers: int, work_limit_s: float | None
                ) -> cp_model.CpSolver:
    solver = new_solver(time_limit_s, workers)
    if work_limit_s is not None:
        solver.parameters.max_deterministic_time = work_limit_s
    solver.parameters.cp_model_presolve = False  # see `_solve_part`
    return solver


def new_solver(time_limit_s: float, workers: int) -> cp_model.CpSolver:
    """A CP-SAT solver with synth's settings (fixed seed, and the workaround below)."""
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = time_limit_s
    solver.parameters.random_seed = SEED
    solver.parameters.num_workers = workers
    # Without the LP relaxation: bounds of the products (see expr.bounds) already give
    # propagation what it needs, and on these models the LP costs more than it prunes
    # (measured: 3-5x faster proofs on 3-D kernels; benchmarks/RESULTS.md).
    solver.parameters.linearization_level = 0
    # CP-SAT 9.15's inclusion presolve (dominated linear constraints, set packing) wrongly
    # proves some fusion-cover models infeasible: gemm2k on cpu, with fill + matmul fused
    # or not, is INFEASIBLE with it and OPTIMAL without presolve or with this at 0, and
    # each cover alone (--fix fuse.C#1_C#2=0 or =1) is OPTIMAL either way.
    solver.parameters.presolve_inclusion_work_limit = 0
    # Clause inprocessing (vivification, subsumption between restarts) does not pay on
    # these small models: the proofs that a fusion cover is not better are search-bound,
    # and without it they take about half the branches (measured on the 24 built-in x
    # hardware cases: gemm2k/aie 2.14 -> 1.90 s, no case over 1 s becomes slower than
    # 1 s; benchmarks/RESULTS.md).
    solver.parameters.use_sat_inprocessing = False
    # CP-SAT 9.15's presolve can loop for tens of seconds (deterministic time 0, so no
    # limit stops it) on a part given an objective cutoff, after probing tightened its
    # bounds: fa6/upmem at S=16, D=8 has a part that is OPTIMAL in 0.01 s without the
    # cutoff and runs 30 s with it. Without probing the same proof takes 0.01 s.
    solver.parameters.cp_model_probing_level = 0
    # CP-SAT 9.15 proves some feasible models infeasible at the root (no branch) when it
    # detects "greater than at least one of" precedences among the enforced linear
    # constraints that presolve makes of a product with a two-valued factor. Minimal
    # reproducer (tests/test_sound.py): k in 1..1155368016, a in 1..2, b in 1..16,
    # x == 1142857 + 2011427*k, y == x*a, z == y*b: INFEASIBLE, yet k = a = b = 1 is a
    # solution (and it is OPTIMAL without presolve, or with this detection off). It made
    # 4-D attention scores (B=2, H=12, S=512, E=64) infeasible on upmem (issue 12).
    solver.parameters.auto_detect_greater_than_at_least_one_of = False
    return solver


def result_of(solver: cp_model.CpSolver, code: cp_model.CpSolverStatus, lowering: Lowering,
            wall: float) -> SolveResult:
    stats = {"branches": solver.num_branches, "conflicts": solver.num_conflicts}
    if code in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        decisions = {n: solver.value(lowering.vars[n]) for n in lowering.cset.decisions}
        env = lowering.cset.complete(decisions)
        status = Status.OPTIMAL if code == cp_model.OPTIMAL else Status.FEASIBLE
        # the objective exactly, from the terms: CP-SAT reports it as a float
        objective = ex.evaluate(lowering.cset.objective, env)
        bound = objective if status is Status.OPTIMAL else math.ceil(
            solver.best_objective_bound - 1e-6 * abs(solver.best_objective_bound))
        return SolveResult("cpsat", status, wall, env, objective, bound, stats)
    if code == cp_model.INFEASIBLE:
        return SolveResult("cpsat", Status.INFEASIBLE, wall, stats=stats)
    if code == cp_model.UNKNOWN:
        return SolveResult("cpsat", Status.TIMEOUT, wall, stats=stats)
    reason = lowering.model.validate()
    if "int64" in reason:  # each term fits (`too_large`), their domains' sum does not
        raise InputError(f"the problem is too large to model with 64-bit integers: CP-SAT "
                         f"says \"{reason.strip()}\"; make the sizes or the hardware's costs "
                         "smaller")
    raise RuntimeError(f"CP-SAT rejected the model: {reason}")
