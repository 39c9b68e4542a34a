"""Exact domains for the terms over one loop dimension's factors (a CP-SAT strengthening).

A dimension's factors (its extent, and its split across levels: R, D, M, T, Q, ...) are
linked by the tiling constraint, and few assignments of them are valid (tens to a few
thousand). Lowered as multiplication equalities, CP-SAT only propagates bounds through
them: a product of three factors learns little when one is fixed, and the proofs that a
schedule is optimal become search (a 3-D reduction on upmem took over 30 s for 500,000
branches). Listing the valid assignments as one table constraint, with a column for every
auxiliary term over that dimension alone (its partial products, quotients, ceilings and
conditions), gives each of those terms exactly its possible values and makes them
consistent with each other: the same proof takes a few hundred branches.

`cpsat.Lowering` adds it, in a part's second lowering, for the dimensions whose factors
are not all powers of two; the others' products are linear over exponents there
(`monomial`), which propagates better than a table.

The table is redundant: every row satisfies the constraints over the dimension alone and
every column equals its term, so the model's solutions are unchanged. Rows and columns
are computed with NumPy over all candidate assignments at once.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from synth.constraints import expr as ex
from synth.constraints.space import ConstraintSet

ROW_LIMIT = 200_000  # candidate assignments tried per dimension at most; past it, no table
# valid assignments per table at most: CP-SAT's table propagation and presolve grow with
# rows x columns, and past a few thousand rows the table costs more than it saves (red on
# upmem: one table of 18,410 rows x 85 columns, 21 s; without it 0.05 s)
TABLE_LIMIT = 4_000
SAFE = 2.0**62  # a product past this is undefined (it may have left int64)

Array = np.ndarray


@dataclass
class Rows:
    """The valid assignments of one dimension's decisions: one array per variable."""

    names: tuple[str, ...]
    env: dict[str, Array]

    @property
    def count(self) -> int:
        return len(next(iter(self.env.values()))) if self.env else 0


def dimension_variables(cset: ConstraintSet) -> list[tuple[str, ...]]:
    """The decisions of each dimension (its group's factors and padded extent), in the
    order of `cset.decisions`; groups that share a variable are merged."""
    merged: list[set[str]] = []
    for group in {g.name: g for g in cset.groups.values()}.values():
        names: set[str] = set()
        for term in (*group.factors, *((group.ext,) if group.ext is not None else ())):
            names.update(n for n in ex.variables(term) if n in cset.decisions)
        for overlapping in [m for m in merged if m & names]:
            names |= overlapping
            merged.remove(overlapping)
        if names:
            merged.append(names)
    order = {name: k for k, name in enumerate(cset.decisions)}
    return [tuple(sorted(m, key=order.__getitem__)) for m in merged]


def valid_rows(cset: ConstraintSet, names: Sequence[str],
               conditions: Iterable[ex.Cond]) -> Rows | None:
    """Every assignment of `names` (each from its candidate values) under which all of
    `conditions` hold; None when there are more than ROW_LIMIT candidates to try."""
    domains = [np.asarray(cset.decisions[n], dtype=np.int64) for n in names]
    if math.prod(len(d) for d in domains) > ROW_LIMIT:
        return None
    grids = np.meshgrid(*domains, indexing="ij")
    env = {n: g.ravel() for n, g in zip(names, grids, strict=True)}
    evaluator = Evaluator(env)
    keep = np.ones(len(env[names[0]]), dtype=bool)
    for cond in conditions:
        holds, defined = evaluator.condition(cond)
        keep &= holds & defined
    return Rows(tuple(names), {n: a[keep] for n, a in env.items()})


class Evaluator:
    """Terms evaluated over arrays of assignments: each gives its values and where they
    are defined (no division by zero, exact divisions exact, no int64 overflow)."""

    def __init__(self, env: dict[str, Array]) -> None:
        self.env = env
        self.size = len(next(iter(env.values())))
        self._memo: dict[ex.Int | ex.Cond, tuple[Array, Array]] = {}

    def column(self, node: ex.Int | ex.Cond) -> tuple[Array, Array]:
        """(values, defined) of a term, or of a condition as 0/1."""
        if isinstance(node, ex.Cmp | ex.AnyOf):
            holds, defined = self.condition(node)
            return holds.astype(np.int64), defined
        return self.term(node)

    def condition(self, cond: ex.Cond) -> tuple[Array, Array]:
        found = self._memo.get(cond)
        if found is None:
            found = self._memo[cond] = self._condition(cond)
        return found

    def term(self, term: ex.Int) -> tuple[Array, Array]:
        found = self._memo.get(term)
        if found is None:
            found = self._memo[term] = self._term(term)
        return found

    def _condition(self, cond: ex.Cond) -> tuple[Array, Array]:
        if isinstance(cond, ex.AnyOf):
            parts = [self.condition(c) for c in cond.conds]
            return (np.logical_or.reduce([h & d for h, d in parts]),
                    np.logical_and.reduce([d for _, d in parts]))
        (lhs, ldef), (rhs, rdef) = self.term(cond.lhs), self.term(cond.rhs)
        return _COMPARE[cond.op](lhs, rhs), ldef & rdef

    def _term(self, term: ex.Int) -> tuple[Array, Array]:
        everywhere = np.ones(self.size, dtype=bool)
        if isinstance(term, ex.Const):
            return np.full(self.size, term.value, dtype=np.int64), everywhere
        if isinstance(term, ex.Var):
            return self.env[term.name], everywhere
        if isinstance(term, ex.Sum | ex.Prod | ex.Max):
            parts = [self.term(t) for t in _operands(term)]
            combine = _COMBINE[type(term)]
            values, defined = parts[0][0], np.logical_and.reduce([d for _, d in parts])
            for other, _ in parts[1:]:
                if combine is np.multiply:  # where the product leaves int64, undefined
                    with np.errstate(over="ignore", invalid="ignore"):
                        defined = defined & (np.abs(values.astype(np.float64)) *
                                             np.abs(other.astype(np.float64)) < SAFE)
                values = combine(values, other)
            return values, defined
        if isinstance(term, ex.Mod):
            num, defined = self.term(term.num)
            return num % term.den, defined
        if isinstance(term, ex.Select):
            holds, cdef = self.condition(term.cond)
            (then, tdef), (other, odef) = self.term(term.then), self.term(term.other)
            return np.where(holds, then, other), cdef & np.where(holds, tdef, odef)
        assert isinstance(term, ex.CeilDiv | ex.ExactDiv)
        (num, ndef), (den, ddef) = self.term(term.num), self.term(term.den)
        safe = np.where(den == 0, 1, den)
        defined = ndef & ddef & (den != 0)
        if isinstance(term, ex.ExactDiv):
            return num // safe, defined & (num % safe == 0)
        return -(-num // safe), defined


def _operands(term: ex.Sum | ex.Prod | ex.Max) -> tuple[ex.Int, ...]:
    if isinstance(term, ex.Sum):
        return term.terms
    if isinstance(term, ex.Prod):
        return term.factors
    return term.args


_COMBINE = {ex.Sum: np.add, ex.Prod: np.multiply, ex.Max: np.maximum}
_COMPARE = {"<=": np.less_equal, ">=": np.greater_equal, "<": np.less, ">": np.greater,
            "==": np.equal, "!=": np.not_equal}


