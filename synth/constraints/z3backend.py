"""Lower a ConstraintSet to z3 and minimise its objective to proven optimality.

Why not the obvious encoding. Every decision is an integer with a handful of candidate
values, and the cost is a sum of products of them (and of quotients of the padded extents
by them). Written as z3 `Int`s with `*`, that is non-linear integer arithmetic, which z3
cannot decide well: matmul 64x32x128 on the CPU does not finish in a minute.

The encoding here: every term is a *one-hot* over its possible values. A decision is a
set of booleans, exactly one true, one per candidate value. Each term built from other
terms gets the set of values it can take (computed from its children's sets, cut by the
interval bounds `expr.bounds` gives, as CP-SAT's auxiliary variables are) and a boolean
per value, tied to its children by clauses:

- a term of one child (a constant coefficient or offset, `mod c`, a ceiling by a
  constant) needs no new booleans: the child's booleans, relabelled with new values;
- a term of two children (a product, a quotient, a sum, a max, made pairwise exactly as
  the CP-SAT lowering does) has one clause per pair of children's values,
  `a = x and b = y -> t = x*y`, and a pair that has no value (a quotient that does not
  divide: `aux * den == num` in CP-SAT) is forbidden;
- `Select` and conditions are boolean combinations of those booleans: a condition is the
  disjunction of the values of `lhs - rhs` that satisfy it.

So everything multiplicative becomes propositional logic that unit propagation handles
well, and the value sets stay small because the factors of a loop dimension are divisors
and powers of two whose products are bounded by the extent. Only the sums that are
compared (capacities, the objective) are arithmetic: each one-hot term they add gets one
`Int`, equal to the value of its true boolean, and linked both ways by *order* atoms
(`t < v -> not (t = v)`), so that when the objective bound pushes `t` down, z3's bound
propagation switches off the values above it at once. That is linear integer
arithmetic over booleans, z3's home ground.

Minimising: a first `check` finds some schedule; then the objective is bounded by one
less than the best value found, until `unsat` proves the best optimal (each bound is
asserted for good, so what z3 learnt is kept). The lower bound starts at the sum of each
objective term's smallest value and rises whenever a bound is refuted, so a run out of
time reports a feasible schedule with a proven bound. The model is written as SMT-LIB
text and parsed once (building ten thousand clauses through the Python API costs more
than solving them). Independent parts (`decompose.components`) are solved one by one,
as CP-SAT does. Seeds are fixed: the same input gives the same schedule.

The one-hot of a term is capped at `MAX_VALUES` values; a term with more possible values
than that is not encodable this way and the part is reported as a `TIMEOUT` with the
reason in `stats["unsupported"]` (the largest one-hot of the built-in workloads at their
default sizes has 4,610 values).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

import z3

from synth.constraints import expr as ex
from synth.constraints.decompose import PartCache, solve_by_covers, solve_by_parts
from synth.constraints.result import SolveResult, Status
from synth.constraints.space import ConstraintSet

SEED = 0
MAX_VALUES = 20_000  # possible values of one term's one-hot; beyond, refuse (see above)
# z3 reads the lowered SMT-LIB text at about 13-14 MB a second (31 MB in 2.3 s, 52 MB in
# 3.7 s on the development machine) and its time limit does not cover that: a text that
# would take past the time limit to read is not read (a TIMEOUT now, not seconds late)
SMT_READ_BYTES_PER_S = 12_000_000

OneHot = tuple[tuple[str, int], ...]  # (literal, value) pairs, values distinct: one true
TRUE, FALSE = "true", "false"


class Unsupported(Exception):
    """A term has too many possible values for a one-hot, or the encoding ran past the
    time limit."""


def _num(n: int) -> str:
    return str(n) if n >= 0 else f"(- {-n})"


def _neg(lit: str) -> str:
    if lit == TRUE:
        return FALSE
    if lit == FALSE:
        return TRUE
    return lit[5:-1] if lit.startswith("(not ") else f"(not {lit})"


_OPS: dict[type, Callable[[int, int], int]] = {
    ex.Sum: lambda a, b: a + b,
    ex.Prod: lambda a, b: a * b,
    ex.Max: max,
}


class Lowering:
    """The SMT-LIB text of one ConstraintSet whose definitions are inlined."""

    def __init__(self, cset: ConstraintSet, deadline: float = math.inf) -> None:
        """`deadline` (a `time.perf_counter()` value): the encoding of a large one-hot
        stops there, so that the time limit bounds it as it bounds the search."""
        self.cset = cset
        self.deadline = deadline
        self.lines: list[str] = []
        self.count = 0
        self.clauses = 0
        self.domains = {name: (v[0], v[-1]) for name, v in cset.decisions.items()}
        self._hot: dict[ex.Int, OneHot] = {}
        self._lits: dict[ex.Cond, str] = {}
        self._ints: dict[ex.Int, str] = {}
        self.decisions: dict[str, OneHot] = {}
        for name, values in cset.decisions.items():
            hot = self._fresh(values)
            self.decisions[name] = hot
            self._hot[ex.Var(name)] = hot

    # -- booleans ---------------------------------------------------------------

    def _bool(self) -> str:
        self.count += 1
        name = f"b{self.count}"
        self.lines.append(f"(declare-const {name} Bool)")
        return name

    def _define(self, lits: Sequence[str], conj: bool = False) -> str:
        """A literal equal to the disjunction (conjunction) of `lits`."""
        lits = list(dict.fromkeys(lits))
        unit, absorbing = (TRUE, FALSE) if conj else (FALSE, TRUE)
        if absorbing in lits:
            return absorbing
        lits = [x for x in lits if x != unit]
        if not lits:
            return unit
        if len(lits) == 1:
            return lits[0]
        name = self._bool()
        self.lines.append(f"(assert (= {name} ({'and' if conj else 'or'} {' '.join(lits)})))")
        return name

    def _clause(self, lits: Sequence[str]) -> None:
        if TRUE in lits:
            return
        lits = [x for x in lits if x != FALSE]
        self.clauses += 1
        self.lines.append(f"(assert (or {' '.join(lits)}))" if lits else "(assert false)")

    def _fresh(self, values: Sequence[int]) -> OneHot:
        """A new one-hot over `values` (exactly one boolean true)."""
        if len(values) == 1:
            return ((TRUE, values[0]),)
        names = [self._bool() for _ in values]
        self.lines.append(f"(assert ((_ at-most 1) {' '.join(names)}))")
        self._clause(names)
        return tuple(zip(names, values, strict=True))

    def _relabel(self, hot: OneHot, fn: Callable[[int], int]) -> OneHot:
        """The one-hot of fn(child): the child's booleans, merged where values meet."""
        by_value: dict[int, list[str]] = {}
        for lit, value in hot:
            by_value.setdefault(fn(value), []).append(lit)
        return tuple((self._define(lits), v) for v, lits in sorted(by_value.items()))

    def _combine(self, term: ex.Int, a: OneHot, b: OneHot,
                 fn: Callable[[int, int], int | None]) -> OneHot:
        """The one-hot of fn(a, b); pairs where fn gives None, or a value outside the
        term's interval bounds, are forbidden."""
        lo, hi = ex.bounds(term, self.domains, self.cset.groups)
        by_value: dict[int, list[tuple[str, str]]] = {}
        for la, va in a:
            if time.perf_counter() > self.deadline:
                raise Unsupported("encoding it ran past the time limit")
            for lb, vb in b:
                value = fn(va, vb)
                if value is None or not lo <= value <= hi:
                    self._clause([_neg(la), _neg(lb)])
                else:
                    by_value.setdefault(value, []).append((la, lb))
        if len(by_value) > MAX_VALUES:
            raise Unsupported(f"{ex.render(term)} takes {len(by_value):,} values")
        if not by_value:
            self._clause([])
            return ((TRUE, 0),)
        values = sorted(by_value)
        out = self._fresh(values)
        if len(out) > 1:
            for (lit, _), value in zip(out, values, strict=True):
                pairs = by_value[value]
                for la, lb in pairs:  # a = x and b = y -> t = fn(x, y)
                    self._clause([_neg(la), _neg(lb), lit])
                # t = v -> a takes one of the values that give v (and so does b)
                self._clause([_neg(lit), *dict.fromkeys(la for la, _ in pairs)])
                self._clause([_neg(lit), *dict.fromkeys(lb for _, lb in pairs)])
        return out

    # -- terms ------------------------------------------------------------------

    def onehot(self, term: ex.Int) -> OneHot:
        if term not in self._hot:
            self._hot[term] = self._onehot(term)
        return self._hot[term]

    def _onehot(self, term: ex.Int) -> OneHot:
        if isinstance(term, ex.Const):
            return ((TRUE, term.value),)
        if isinstance(term, ex.Var):
            raise KeyError(f"{term.name} is neither a decision nor inlined")
        if isinstance(term, ex.Sum | ex.Prod | ex.Max):
            items = (term.terms if isinstance(term, ex.Sum) else
                     term.factors if isinstance(term, ex.Prod) else term.args)
            op = _OPS[type(term)]
            consts = [i.value for i in items if isinstance(i, ex.Const)]
            rest = [i for i in items if not isinstance(i, ex.Const)]
            if len(rest) == 1:
                hot = self.onehot(rest[0])
            else:  # pairwise, so each intermediate term has tight bounds (as in CP-SAT)
                head = rest[0] if len(rest) == 2 else type(term)(tuple(rest[:-1]))
                whole = type(term)(tuple(rest))
                hot = self._combine(whole, self.onehot(head), self.onehot(rest[-1]), op)
            if consts:
                k = consts[0]
                for c in consts[1:]:
                    k = op(k, c)
                hot = self._relabel(hot, lambda v: op(v, k))
            return hot
        if isinstance(term, ex.Mod):
            den = term.den
            return self._relabel(self.onehot(term.num), lambda v: v % den)
        if isinstance(term, ex.CeilDiv):
            if isinstance(term.den, ex.Const):
                d = term.den.value
                return self._relabel(self.onehot(term.num), lambda v: -(-v // d))
            return self._combine(term, self.onehot(term.num), self.onehot(term.den),
                                 lambda n, d: -(-n // d) if d > 0 else None)
        if isinstance(term, ex.ExactDiv):
            return self._combine(term, self.onehot(term.num), self.onehot(term.den),
                                 lambda n, d: n // d if d > 0 and n % d == 0 else None)
        chosen = self.lit(term.cond)
        by_value: dict[int, list[str]] = {}
        for lit, value in self.onehot(term.then):
            by_value.setdefault(value, []).append(self._define([chosen, lit], conj=True))
        for lit, value in self.onehot(term.other):
            by_value.setdefault(value, []).append(
                self._define([_neg(chosen), lit], conj=True))
        return tuple((self._define(lits), v) for v, lits in sorted(by_value.items()))

    def lit(self, cond: ex.Cond) -> str:
        """A literal true exactly when `cond` holds."""
        if cond not in self._lits:
            if isinstance(cond, ex.AnyOf):
                self._lits[cond] = self._define([self.lit(c) for c in cond.conds])
            else:
                test = ex._CMP[cond.op]
                diff = self.onehot(ex.add(cond.lhs, ex.mul(-1, cond.rhs)))
                self._lits[cond] = self._define([lit for lit, v in diff if test(v, 0)])
        return self._lits[cond]

    # -- linear sums ------------------------------------------------------------

    def int_of(self, term: ex.Int) -> str:
        """An Int equal to the value of `term`'s one-hot, with order atoms."""
        if term not in self._ints:
            hot = self.onehot(term)
            self.count += 1
            name = f"t{self.count}"
            values = [v for _, v in hot]
            self.lines.append(f"(declare-const {name} Int)")
            self.lines.append(f"(assert (<= {_num(min(values))} {name} {_num(max(values))}))")
            for lit, value in hot:
                if lit == TRUE:
                    continue
                self.lines.append(f"(assert (=> {lit} (= {name} {_num(value)})))")
                self.lines.append(f"(assert (=> (< {name} {_num(value)}) (not {lit})))")
                self.lines.append(f"(assert (=> (> {name} {_num(value)}) (not {lit})))")
            self._ints[term] = name
        return self._ints[term]

    def linear(self, term: ex.Int) -> tuple[dict[ex.Int, int], int]:
        """`term` as sum(coefficient * non-linear term) + constant."""
        coeffs: dict[ex.Int, int] = {}
        constant = 0

        def walk(t: ex.Int, c: int) -> None:
            nonlocal constant
            if isinstance(t, ex.Const):
                constant += c * t.value
            elif isinstance(t, ex.Sum):
                for item in t.terms:
                    walk(item, c)
            elif isinstance(t, ex.Prod) and isinstance(t.factors[0], ex.Const):
                walk(ex.mul(*t.factors[1:]), c * t.factors[0].value)
            else:
                coeffs[t] = coeffs.get(t, 0) + c

        walk(term, 1)
        return {t: c for t, c in coeffs.items() if c}, constant

    def smt_sum(self, coeffs: dict[ex.Int, int]) -> str:
        parts = [f"(* {_num(c)} {self.arith(t)})" for t, c in coeffs.items()]
        return "0" if not parts else parts[0] if len(parts) == 1 else f"(+ {' '.join(parts)})"

    def arith(self, term: ex.Int) -> str:
        """An integer expression equal to `term`: its one-hot's Int, except for a max
        (the exposed time of double-buffered transfers, `max(transfer, compute)`) and a
        choice between terms holding one, which stay arithmetic (`ite`): the one-hot of a
        max of two costs would pair every value of one with every value of the other."""
        if isinstance(term, ex.Max) and _over_sums(term):
            out = self.linear_expr(term.args[0])
            for arg in term.args[1:]:
                other = self.linear_expr(arg)
                out = f"(ite (>= {out} {other}) {out} {other})"
            return out
        if isinstance(term, ex.Select) and _over_sums(term):
            return (f"(ite {self.lit(term.cond)} {self.linear_expr(term.then)} "
                    f"{self.linear_expr(term.other)})")
        return self.int_of(term)

    def linear_expr(self, term: ex.Int) -> str:
        coeffs, constant = self.linear(term)
        return f"(+ {self.smt_sum(coeffs)} {_num(constant)})"

    def bounds_of(self, term: ex.Int) -> tuple[int, int]:
        """Interval bounds of `term` (`arith` terms: from their parts)."""
        if isinstance(term, ex.Max | ex.Select) and _over_sums(term):
            parts = [self.linear_bounds(t) for t in (
                term.args if isinstance(term, ex.Max) else (term.then, term.other))]
            if isinstance(term, ex.Max):
                return max(lo for lo, _ in parts), max(hi for _, hi in parts)
            return min(lo for lo, _ in parts), max(hi for _, hi in parts)
        values = [v for _, v in self.onehot(term)]
        return min(values), max(values)

    def linear_bounds(self, term: ex.Int) -> tuple[int, int]:
        coeffs, constant = self.linear(term)
        lo = hi = constant
        for t, c in coeffs.items():
            tlo, thi = self.bounds_of(t)
            lo += min(c * tlo, c * thi)
            hi += max(c * tlo, c * thi)
        return lo, hi

    def require(self, cond: ex.Cond) -> None:
        if isinstance(cond, ex.AnyOf):
            self._clause([self.lit(c) for c in cond.conds])
            return
        coeffs, constant = self.linear(ex.add(cond.lhs, ex.mul(-1, cond.rhs)))
        if not coeffs:
            if not ex._CMP[cond.op](constant, 0):
                self._clause([])
            return
        op = "=" if cond.op == "==" else cond.op
        self.lines.append(f"(assert ({op} {self.smt_sum(coeffs)} {_num(-constant)}))")

    def objective(self) -> tuple[int, int]:
        """Declare `obj` equal to the objective; its interval bounds."""
        coeffs, constant = self.linear(self.cset.objective)
        lo, hi = self.linear_bounds(self.cset.objective)
        self.lines.append("(declare-const obj Int)")
        self.lines.append(f"(assert (= obj (+ {self.smt_sum(coeffs)} {_num(constant)})))")
        self.lines.append(f"(assert (<= {_num(lo)} obj {_num(hi)}))")
        return lo, hi


def _over_sums(term: ex.Int) -> bool:
    """Whether `term` is a max, or a choice one of whose branches is (or adds) one:
    lowered as arithmetic where a compared sum holds it, see `Lowering.arith`."""
    if isinstance(term, ex.Max):
        return True
    if isinstance(term, ex.Select):
        return any(_over_sums(t) or isinstance(t, ex.Sum) and any(_over_sums(i) for i in t.terms)
                   for t in (term.then, term.other))
    return False


# ---------------------------------------------------------------- solving


def solve(cset: ConstraintSet, time_limit_s: float = 30.0, rlimit: int | None = None
          ) -> SolveResult:
    """Minimise the objective of `cset`: status, solution and proven bound.

    Independent parts are solved one by one (see `decompose`). `rlimit` bounds each of
    z3's checks by its deterministic resource count (z3's `rlimit`, the same on any
    machine), so that whether a check finishes does not depend on the machine's speed
    (the tests use it with a generous time limit); a check past it ends as one past the
    time limit does (TIMEOUT, or FEASIBLE with the best schedule found)."""
    z3.set_param("smt.random_seed", SEED)
    z3.set_param("sat.random_seed", SEED)
    solved = PartCache()  # parts that recur across fusion covers
    return solve_by_covers(cset, time_limit_s, "z3", lambda fixed, limit, cutoff: (
        solve_by_parts(fixed, limit, "z3",
                       lambda part, left, most: _solve_part(part, left, most, rlimit),
                       solved, cutoff)))


def _solve_part(cset: ConstraintSet, time_limit_s: float, cutoff: int | None = None,
                rlimit: int | None = None) -> SolveResult:
    """The optimum of one part; with `cutoff`, INFEASIBLE when none is at most that."""
    start = time.perf_counter()
    if not cset.decisions:  # nothing to decide: every constraint is about constants
        value = ex.evaluate(cset.objective, {})
        if cset.violated({}) or (cutoff is not None and value > cutoff):
            return SolveResult("z3", Status.INFEASIBLE, 0.0)
        return SolveResult("z3", Status.OPTIMAL, 0.0, {}, value, value)
    lowering = Lowering(cset, start + time_limit_s)
    try:
        for constraint in cset.constraints:
            lowering.require(constraint.cond)
        lo, _ = lowering.objective()
    except Unsupported as err:
        return SolveResult("z3", Status.TIMEOUT, time.perf_counter() - start,
                           stats={"unsupported": str(err)})
    # a fresh context per part: z3's global context keeps terms between solves, and the
    # search (hence which of several equally good schedules comes back) depends on them
    text = "\n".join(lowering.lines)
    stats: dict[str, int | float | str] = {
        "booleans": lowering.count, "clauses": lowering.clauses, "checks": 0}
    if len(text) / SMT_READ_BYTES_PER_S > time_limit_s - (time.perf_counter() - start):
        stats["unknown"] = (f"reading its {len(text) / 1e6:.1f} MB encoding would run past "
                            "the time limit")
        return SolveResult("z3", Status.TIMEOUT, time.perf_counter() - start, stats=stats)
    ctx = z3.Context()
    solver = z3.Solver(ctx=ctx)
    solver.set("random_seed", SEED)
    if rlimit is not None:
        solver.set("rlimit", rlimit)
    solver.from_string(text)
    obj = z3.Int("obj", ctx)
    if cutoff is not None:  # another fusion cover already does better than this
        solver.add(obj <= cutoff)
    literals = {name: [(z3.Bool(lit, ctx) if lit != TRUE else z3.BoolVal(True, ctx), v)
                       for lit, v in hot] for name, hot in lowering.decisions.items()}

    def check() -> z3.CheckSatResult:
        remaining = time_limit_s - (time.perf_counter() - start)
        solver.set("timeout", max(1, int(remaining * 1000)))
        stats["checks"] = int(stats["checks"]) + 1
        return solver.check() if remaining > 0 else z3.unknown

    def decode() -> tuple[dict[str, int], int]:
        model = solver.model()
        env = {name: next(v for lit, v in pairs
                          if z3.is_true(model.eval(lit, model_completion=True)))
               for name, pairs in literals.items()}
        value = ex.evaluate(cset.objective, env)
        if model.eval(obj).as_long() != value or cset.violated(env):
            raise RuntimeError("z3 lowering disagrees with the constraint set")
        return env, value

    found = check()
    if found == z3.unsat:
        return SolveResult("z3", Status.INFEASIBLE, time.perf_counter() - start, stats=stats)
    if found != z3.sat:
        stats["unknown"] = solver.reason_unknown() or "timeout"  # z3's word for it
        return SolveResult("z3", Status.TIMEOUT, time.perf_counter() - start, stats=stats)
    env, best = decode()
    while lo < best:
        solver.add(obj <= best - 1)
        found = check()
        if found == z3.sat:
            env, best = decode()
        elif found == z3.unsat:
            lo = best
        else:
            break
    status = Status.OPTIMAL if lo >= best else Status.FEASIBLE
    return SolveResult("z3", status, time.perf_counter() - start, cset.complete(env), best,
                       min(lo, best), stats)
