"""A small language of integer expressions and conditions over named variables.

This is the one description of the schedule space: the cost model and every constraint
are built once as these terms; the CP-SAT backend lowers them to a model, the exhaustive
enumerator and the plain-Python cost model evaluate them. Because every consumer reads
the same terms, the solver's objective and the Python cost of a decoded schedule cannot
drift apart.

Terms are frozen dataclasses, so equal sub-terms are equal values and backends can share
the work of lowering them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

_Node = TypeVar("_Node")


_CACHED = ("_hash", "_vars")  # what a term computes once and keeps, not pickled


def _hash_once(cls: type[_Node]) -> type[_Node]:
    """Make a frozen dataclass compute its hash once. Terms are deep trees used as dict
    keys (shared lowering, caches of parts across fusion covers), and the generated hash
    walks the whole tree on every lookup. The cached hash is not pickled: string hashes
    differ between processes. (`variable_set` keeps its answer on the node the same way.)"""
    compute = cls.__hash__

    def __hash__(self: Any) -> int:
        try:
            return self._hash
        except AttributeError:
            value = compute(self)
            object.__setattr__(self, "_hash", value)
            return value

    def __getstate__(self: Any) -> dict[str, object]:
        return {k: v for k, v in self.__dict__.items() if k not in _CACHED}

    cls.__hash__ = __hash__  # type: ignore[method-assign]
    cls.__getstate__ = __getstate__  # type: ignore[method-assign]
    return cls


# ---------------------------------------------------------------- integer terms


@dataclass(frozen=True)
class Const:
    value: int


@dataclass(frozen=True)
class Var:
    name: str


@_hash_once
@dataclass(frozen=True)
class Sum:
    terms: tuple[Int, ...]


@_hash_once
@dataclass(frozen=True)
class Prod:
    factors: tuple[Int, ...]


@_hash_once
@dataclass(frozen=True)
class Max:
    args: tuple[Int, ...]


@_hash_once
@dataclass(frozen=True)
class CeilDiv:
    """ceil(num / den) for num >= 0 and den >= 1."""

    num: Int
    den: Int


@_hash_once
@dataclass(frozen=True)
class ExactDiv:
    """num / den where den divides num (a constraint elsewhere ensures it)."""

    num: Int
    den: Int


@_hash_once
@dataclass(frozen=True)
class Mod:
    """num mod den, for num >= 0 and a constant den >= 1."""

    num: Int
    den: int


@_hash_once
@dataclass(frozen=True)
class Select:
    """`then` when `cond` holds, else `other`."""

    cond: Cond
    then: Int
    other: Int


Int = Const | Var | Sum | Prod | Max | CeilDiv | ExactDiv | Mod | Select

# ---------------------------------------------------------------- conditions


@_hash_once
@dataclass(frozen=True)
class Cmp:
    """lhs OP rhs, OP one of <=, ==, >=, <, >."""

    lhs: Int
    op: str
    rhs: Int


@_hash_once
@dataclass(frozen=True)
class AnyOf:
    conds: tuple[Cond, ...]


Cond = Cmp | AnyOf

_CMP = {
    "<=": lambda a, b: a <= b,
    ">=": lambda a, b: a >= b,
    "==": lambda a, b: a == b,
    "<": lambda a, b: a < b,
    ">": lambda a, b: a > b,
}

# ---------------------------------------------------------------- builders (fold constants)

ZERO = Const(0)
ONE = Const(1)


def const(value: int) -> Const:
    return Const(int(value))


def as_int(value: Int | int) -> Int:
    return Const(value) if isinstance(value, int) else value


def add(*terms: Int | int) -> Int:
    flat: list[Int] = []
    total = 0
    for term in map(as_int, terms):
        if isinstance(term, Const):
            total += term.value
        elif isinstance(term, Sum):
            flat.extend(term.terms)
        else:
            flat.append(term)
    if total:
        flat.append(Const(total))
    if not flat:
        return ZERO
    return flat[0] if len(flat) == 1 else Sum(tuple(flat))


def mul(*factors: Int | int) -> Int:
    """The product, flat, with its constant factors multiplied into one, first."""
    flat: list[Int] = []
    coeff = 1
    for factor in map(as_int, factors):
        for inner in factor.factors if isinstance(factor, Prod) else (factor,):
            if isinstance(inner, Const):
                coeff *= inner.value
            else:
                flat.append(inner)
    if coeff == 0:
        return ZERO
    if coeff != 1:
        flat.insert(0, Const(coeff))
    if not flat:
        return ONE
    return flat[0] if len(flat) == 1 else Prod(tuple(flat))


def scale(total: Int, *factors: Int | int) -> Int:
    """`total * factors`, multiplied into each term when `total` is a sum: bounds of the
    distributed form stay tight, since each product sees every factor it multiplies."""
    if isinstance(total, Sum):
        return add(*(mul(t, *factors) for t in total.terms))
    return mul(total, *factors)


def maximum(*args: Int | int) -> Int:
    items = list(dict.fromkeys(map(as_int, args)))
    consts = [a.value for a in items if isinstance(a, Const)]
    rest: list[Int] = [a for a in items if not isinstance(a, Const)]
    if consts:
        rest.append(Const(max(consts)))
    return rest[0] if len(rest) == 1 else Max(tuple(rest))


def ceil_div(num: Int | int, den: Int | int) -> Int:
    num, den = as_int(num), as_int(den)
    if isinstance(den, Const) and _divisible(num, den.value):
        return _divide(num, den.value)  # e.g. ceil(4*x / 4) = x: no division to model
    if isinstance(num, Const) and isinstance(den, Const):
        return Const(-(-num.value // den.value))
    return CeilDiv(num, den)


def exact_div(num: Int | int, den: Int | int) -> Int:
    num, den = as_int(num), as_int(den)
    if isinstance(den, Const) and _divisible(num, den.value):
        return _divide(num, den.value)
    if isinstance(num, Const) and isinstance(den, Const):
        return Const(num.value // den.value)
    return ExactDiv(num, den)


def mod(num: Int | int, den: int) -> Int:
    num = as_int(num)
    if _divisible(num, den):
        return ZERO  # e.g. 4*x mod 4: 4-byte elements are always 4-byte aligned
    if isinstance(num, Const):
        return Const(num.value % den)
    return Mod(num, den)


def _divisible(term: Int, den: int) -> bool:
    """Whether `term` is a multiple of `den` for every integer value of its variables
    (seen from its coefficients: a constant, or a product or sum of such multiples)."""
    if den == 1:
        return True
    if isinstance(term, Const):
        return den != 0 and term.value % den == 0
    if isinstance(term, Prod):
        return any(isinstance(f, Const) and _divisible(f, den) for f in term.factors)
    if isinstance(term, Sum):
        return all(_divisible(t, den) for t in term.terms)
    return False


def _divide(term: Int, den: int) -> Int:
    """`term / den` for a `term` that `_divisible` says `den` divides."""
    if den == 1:
        return term
    if isinstance(term, Const):
        return Const(term.value // den)
    if isinstance(term, Prod):
        i = next(i for i, f in enumerate(term.factors)
                 if isinstance(f, Const) and _divisible(f, den))
        return mul(_divide(term.factors[i], den), *term.factors[:i], *term.factors[i + 1:])
    assert isinstance(term, Sum)
    return add(*(_divide(t, den) for t in term.terms))


def round_up_waste(num: Int, multiple: int) -> Int:
    """How much `num` grows when rounded up to a multiple of `multiple`."""
    return mod(add(multiple, mul(-1, mod(num, multiple))), multiple)


def select(cond: Cond | bool, then: Int | int, other: Int | int) -> Int:
    """`then` where `cond` holds, else `other`; a condition decided by its constants
    (`fold`) picks its branch here."""
    if not isinstance(cond, bool):
        cond = fold(cond)
        if cond in (TRUE, FALSE):
            cond = cond == TRUE
    if isinstance(cond, bool):
        return as_int(then if cond else other)
    then, other = as_int(then), as_int(other)
    return then if then == other else Select(cond, then, other)


def greater_than_one(term: Int) -> Cond | bool:
    """`term > 1`, folded to a bool when `term` is constant."""
    if isinstance(term, Const):
        return term.value > 1
    return Cmp(term, ">", ONE)


def any_of(conds: Iterable[Cond | bool]) -> Cond | bool:
    items: list[Cond] = []
    for cond in conds:
        if cond is True:
            return True
        if cond is not False:
            items.append(cond)
    if not items:
        return False
    return items[0] if len(items) == 1 else AnyOf(tuple(items))


# ---------------------------------------------------------------- evaluation


def evaluate(term: Int, env: Mapping[str, int]) -> int:
    """The value of `term` when every variable takes its value in `env`."""
    if isinstance(term, Const):
        return term.value
    if isinstance(term, Var):
        return env[term.name]
    if isinstance(term, Sum):
        return sum(evaluate(t, env) for t in term.terms)
    if isinstance(term, Prod):
        return math.prod(evaluate(f, env) for f in term.factors)
    if isinstance(term, Max):
        return max(evaluate(a, env) for a in term.args)
    if isinstance(term, CeilDiv):
        return -(-evaluate(term.num, env) // evaluate(term.den, env))
    if isinstance(term, ExactDiv):
        return evaluate(term.num, env) // evaluate(term.den, env)
    if isinstance(term, Mod):
        return evaluate(term.num, env) % term.den
    return evaluate(term.then if holds(term.cond, env) else term.other, env)


def holds(cond: Cond, env: Mapping[str, int]) -> bool:
    if isinstance(cond, AnyOf):
        return any(holds(c, env) for c in cond.conds)
    return bool(_CMP[cond.op](evaluate(cond.lhs, env), evaluate(cond.rhs, env)))


def children(node: Int | Cond) -> tuple[Int | Cond, ...]:
    if isinstance(node, Sum):
        return node.terms
    if isinstance(node, Prod):
        return node.factors
    if isinstance(node, Max):
        return node.args
    if isinstance(node, CeilDiv | ExactDiv):
        return (node.num, node.den)
    if isinstance(node, Mod):
        return (node.num,)
    if isinstance(node, Select):
        return (node.cond, node.then, node.other)
    if isinstance(node, Cmp):
        return (node.lhs, node.rhs)
    if isinstance(node, AnyOf):
        return node.conds
    return ()


def variables(node: Int | Cond) -> Iterator[str]:
    """Names of the variables a term mentions (with repeats)."""
    if isinstance(node, Var):
        yield node.name
    for child in children(node):
        yield from variables(child)


def variable_set(node: Int | Cond) -> frozenset[str]:
    """The names of the variables a term mentions, computed once per node and kept on it
    (a term is immutable): the terms of one model share most of their subterms, and the
    fusion covers, parts and lowerings ask again for the same ones."""
    if isinstance(node, Var):
        return frozenset((node.name,))
    if isinstance(node, Const):
        return _NONE
    try:
        return node._vars  # type: ignore[union-attr]
    except AttributeError:
        found = frozenset().union(*(variable_set(c) for c in children(node)))
        object.__setattr__(node, "_vars", found)
        return found


_NONE: frozenset[str] = frozenset()


def substitute(node: Int | Cond, terms: Mapping[str, Int],
               memo: dict[int, tuple[object, Int | Cond]] | None = None,
               keep: bool = False) -> Int | Cond:
    """`node` with each variable named in `terms` replaced by its term, rebuilt by the
    constructors above (which fold constants). `memo` (keyed by node identity) rewrites
    a subterm shared by many terms once; with `keep`, subterms that mention none of
    `terms` (`variable_set`) are kept as they are, without a visit."""
    if memo is None:
        memo = {}
    seen = memo.get(id(node))
    if seen is not None and seen[0] is node:
        return seen[1]
    if keep and terms.keys().isdisjoint(variable_set(node)):
        return node
    result = _substitute(node, terms, memo, keep)
    memo[id(node)] = (node, result)
    return result


def _substitute(node: Int | Cond, terms: Mapping[str, Int],
                memo: dict[int, tuple[object, Int | Cond]], keep: bool) -> Int | Cond:
    if isinstance(node, Var):
        return terms.get(node.name, node)
    if isinstance(node, Const):
        return node
    if isinstance(node, Sum):
        return add(*(substitute(t, terms, memo, keep) for t in node.terms))  # type: ignore[arg-type]
    if isinstance(node, Prod):
        return mul(*(substitute(f, terms, memo, keep) for f in node.factors))  # type: ignore[arg-type]
    if isinstance(node, Max):
        return maximum(*(substitute(a, terms, memo, keep) for a in node.args))  # type: ignore[arg-type]
    if isinstance(node, CeilDiv):
        return ceil_div(substitute(node.num, terms, memo, keep),  # type: ignore[arg-type]
                        substitute(node.den, terms, memo, keep))  # type: ignore[arg-type]
    if isinstance(node, ExactDiv):
        return exact_div(substitute(node.num, terms, memo, keep),  # type: ignore[arg-type]
                         substitute(node.den, terms, memo, keep))  # type: ignore[arg-type]
    if isinstance(node, Mod):
        return mod(substitute(node.num, terms, memo, keep), node.den)  # type: ignore[arg-type]
    if isinstance(node, Select):
        cond = substitute(node.cond, terms, memo, keep)
        then = substitute(node.then, terms, memo, keep)
        other = substitute(node.other, terms, memo, keep)
        if cond in (TRUE, FALSE):
            return then if cond == TRUE else other
        return select(cond, then, other)  # type: ignore[arg-type]
    if isinstance(node, Cmp):
        return fold(Cmp(substitute(node.lhs, terms, memo, keep), node.op,  # type: ignore[arg-type]
                        substitute(node.rhs, terms, memo, keep)))  # type: ignore[arg-type]
    return fold(AnyOf(tuple(substitute(c, terms, memo, keep) for c in node.conds)))  # type: ignore[misc]


TRUE = Cmp(ZERO, "==", ZERO)  # the canonical forms of a condition known to hold ...
FALSE = Cmp(ONE, "==", ZERO)  # ... or known to fail


def fold(cond: Cond) -> Cond:
    """`cond` with constant comparisons decided: TRUE, FALSE, or a smaller condition."""
    if isinstance(cond, Cmp):
        if isinstance(cond.lhs, Const) and isinstance(cond.rhs, Const):
            return TRUE if holds(cond, {}) else FALSE
        if cond.lhs == cond.rhs:  # the same term on both sides
            return TRUE if cond.op in ("==", "<=", ">=") else FALSE
        return cond
    conds = [fold(c) for c in cond.conds]
    if TRUE in conds:
        return TRUE
    kept = tuple(c for c in conds if c != FALSE)
    if not kept:
        return FALSE
    return kept[0] if len(kept) == 1 else AnyOf(kept)


@dataclass(frozen=True)
class Group:
    """The factors one loop dimension is split into. Their product covers the extent
    (at least `extent`, less than twice it: padding is less than one tile), which bounds
    any product of some of them from both sides."""

    name: str
    extent: int
    factors: tuple[Int, ...]
    # for each factor, (level, most units) when it splits the dimension across a level's
    # units; the factors of all dimensions at one level share that level's units
    levels: tuple[tuple[str, int] | None, ...] = ()
    ext: Int | None = None  # the padded extent: the product of all the factors


BoundsMemo = dict["Int", tuple[int, int]]


def bounds(term: Int, domains: Mapping[str, tuple[int, int]],
           groups: Mapping[Int, Group] | None = None,
           memo: BoundsMemo | None = None) -> tuple[int, int]:
    """Interval bounds of a term whose variables are all non-negative.

    `groups` (factor term -> its dimension's group) tightens products: without it, a
    product of many factors gets bounds far beyond 64-bit integers above and useless (1)
    below, and a solver cannot prove anything with those. `memo` (kept by a caller
    whose `domains` and `groups` do not change) bounds a subterm that many terms share,
    or that is built again equal (products are lowered pairwise), once.
    """
    if memo is None:
        return _bounds(term, domains, groups or {}, {})
    return _bounds(term, domains, groups or {}, memo)


def _bounds(term: Int, domains: Mapping[str, tuple[int, int]], groups: Mapping[Int, Group],
            memo: BoundsMemo) -> tuple[int, int]:
    found = memo.get(term)
    if found is None:
        found = memo[term] = _bounds_of(term, domains, groups, memo)
    return found


def _bounds_of(term: Int, domains: Mapping[str, tuple[int, int]], groups: Mapping[Int, Group],
               memo: BoundsMemo) -> tuple[int, int]:
    if isinstance(term, Const):
        return term.value, term.value
    if isinstance(term, Var):
        return domains[term.name]
    if isinstance(term, Sum):
        parts = [_bounds(t, domains, groups, memo) for t in term.terms]
        return sum(p[0] for p in parts), sum(p[1] for p in parts)
    if isinstance(term, Prod):
        return _product_bounds(term, domains, groups, memo)
    if isinstance(term, Max):
        parts = [_bounds(a, domains, groups, memo) for a in term.args]
        return max(p[0] for p in parts), max(p[1] for p in parts)
    if isinstance(term, Mod):
        return 0, term.den - 1
    if isinstance(term, CeilDiv | ExactDiv):
        (nlo, nhi) = _bounds(term.num, domains, groups, memo)
        (dlo, dhi) = _bounds(term.den, domains, groups, memo)
        return -(-nlo // max(dhi, 1)), nhi // max(dlo, 1) if isinstance(term, ExactDiv) \
            else -(-nhi // max(dlo, 1))
    (tlo, thi) = _bounds(term.then, domains, groups, memo)
    (olo, ohi) = _bounds(term.other, domains, groups, memo)
    return min(tlo, olo), max(thi, ohi)


def _product_bounds(term: Prod, domains: Mapping[str, tuple[int, int]],
                    groups: Mapping[Int, Group], memo: BoundsMemo) -> tuple[int, int]:
    parts = [_bounds(f, domains, groups, memo) for f in term.factors]
    if any(lo < 0 for lo, _ in parts):
        corners = [math.prod(c) for c in _corners(parts)]
        return min(corners), max(corners)
    lo, hi = 1, 1
    by_group: dict[str, tuple[Group, list[tuple[Int, int, int, bool]]]] = {}
    for factor, (flo, fhi) in zip(term.factors, parts, strict=True):
        quotient = _complement(factor, groups)
        if quotient is not None:  # ext / (some factors): the group's other factors
            owner, others = quotient
            members = by_group.setdefault(owner.name, (owner, []))[1]
            members.extend((f, 1, 1, True) for f in others)
            members.append((factor, flo, fhi, False))
            continue
        group, certain = _group_of(factor, groups)
        if group is None:
            lo, hi = lo * flo, hi * fhi
        else:
            by_group.setdefault(group.name, (group, []))[1].append(
                (_base(factor), flo, fhi, certain))
    groups_lo = 1
    spread: list[int] = []  # the most missing factors can make up, per group
    level_units: dict[str, list[int]] = {}  # level -> missing spatial factors' maxima
    for group, members in by_group.values():
        glo = math.prod(m[1] for m in members)
        ghi = math.prod(m[2] for m in members)
        bases = [m[0] for m in members]
        if len(set(bases)) == len(bases):  # each factor once: the group's bounds apply
            ghi = min(ghi, 2 * group.extent - 1)
            present = {m[0] for m in members if m[3]}
            missing = across = 1  # the most missing sequential / spatial factors reach
            for factor, level in zip(group.factors, group.levels or
                                     (None,) * len(group.factors), strict=True):
                if factor in present:
                    continue
                fhi = (domains[factor.name][1] if isinstance(factor, Var)
                       else bounds(factor, domains)[1])
                if level is None:
                    missing *= fhi
                else:
                    across *= fhi
                    level_units.setdefault(level[0], [level[1]]).append(fhi)
            glo = max(glo, -(-group.extent // max(missing * across, 1)))
            spread.append(missing)
        groups_lo *= glo
        hi *= ghi
    # jointly: all dimensions' extents, over what the missing factors can reach, with the
    # units of each level shared by every dimension split across it
    extents = math.prod(g.extent for g, _ in by_group.values())
    reach = math.prod(spread) * math.prod(min(u[0], math.prod(u[1:]))
                                          for u in level_units.values())
    joint = -(-extents // max(reach, 1)) if len(spread) == len(by_group) else 1
    lo *= max(groups_lo, joint)
    return min(lo, hi), hi


def _complement(factor: Int, groups: Mapping[Int, Group]
                ) -> tuple[Group, list[Int]] | None:
    """For `ext / (factors of one dimension)`, that dimension's group and its other factors
    (whose product the quotient is)."""
    if not isinstance(factor, ExactDiv):
        return None
    den = factor.den.factors if isinstance(factor.den, Prod) else (factor.den,)
    group = groups.get(den[0])
    if group is None or factor.num != group.ext:
        return None
    for other in den[1:]:  # every factor of the one dimension
        found = groups.get(other)
        if found is None or found.name != group.name:
            return None
    return group, [f for f in group.factors if f not in den]


def _base(factor: Int) -> Int:
    return factor.then if isinstance(factor, Select) else factor


def _group_of(factor: Int, groups: Mapping[Int, Group]) -> tuple[Group | None, bool]:
    """The factor's group, and whether the factor surely takes its value (a `Select`
    between a factor and 1 may be 1)."""
    if factor in groups:
        return groups[factor], True
    if isinstance(factor, Select) and factor.other == ONE and factor.then in groups:
        return groups[factor.then], False
    return None, False


def _corners(parts: list[tuple[int, int]]) -> Iterator[tuple[int, ...]]:
    if not parts:
        yield ()
        return
    lo, hi = parts[0]
    for rest in _corners(parts[1:]):
        yield (lo, *rest)
        if hi != lo:
            yield (hi, *rest)


def render(node: Int | Cond) -> str:
    """Readable text of a term, e.g. `T.y.i * Q.y.i <= 16`."""
    if isinstance(node, Const):
        return str(node.value)
    if isinstance(node, Var):
        return node.name
    if isinstance(node, Sum):
        return "(" + " + ".join(render(t) for t in node.terms) + ")"
    if isinstance(node, Prod):
        return "*".join(render(f) for f in node.factors)
    if isinstance(node, Max):
        return "max(" + ", ".join(render(a) for a in node.args) + ")"
    if isinstance(node, CeilDiv):
        return f"ceil({render(node.num)} / {render(node.den)})"
    if isinstance(node, ExactDiv):
        return f"({render(node.num)} / {render(node.den)})"
    if isinstance(node, Mod):
        return f"({render(node.num)} mod {node.den})"
    if isinstance(node, Select):
        return f"({render(node.then)} if {render(node.cond)} else {render(node.other)})"
    if isinstance(node, Cmp):
        return f"{render(node.lhs)} {node.op} {render(node.rhs)}"
    return " or ".join(render(c) for c in node.conds)
