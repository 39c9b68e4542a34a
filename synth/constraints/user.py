"""User control of the named constraint groups: `--constraint`, `--fix` and `--drop`.

`--constraint EXPR` is one comparison of two integer expressions:

    EXPR   := SUM OP SUM          OP one of  <=  >=  ==  <  >
    SUM    := TERM (('+' | '-') TERM)*
    TERM   := UNARY ('*' UNARY)*
    UNARY  := '-' UNARY | ATOM
    ATOM   := INTEGER | NAME | '(' SUM ')'

A NAME is a variable of the schedule space (the counts `R`, `D`, `T`, `P`, factors such as
`Q.y.i`, padded extents `ext.y.i`; names may contain `.` and `#`) or a hardware parameter
(`wram.capacity`, `wram.reserved`, `wram.usable`, `wram.transfer.min|max|multiple|align`,
`tasklet.count.min|max`), which stands for its value in the hardware model. Each
constraint becomes the group `user.<k>` (k counts from 1 in the order given); each
`--fix VAR=INT` the group `user.fix.VAR`.

`--drop GROUP` removes a group, or every group under a prefix (`--drop capacity` drops
`capacity.mram` and `capacity.wram`; `--drop user` drops all user groups). `implied`
(redundant bounds, true of every schedule) and `tiling` (what defines the factors: the
root factor of a dimension is its padded extent over the others) cannot be dropped.

Unknown names, groups or malformed expressions raise `InputError` (exit 2) naming the
closest valid names.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from collections.abc import Iterable, Mapping, Sequence

from synth.constraints import expr as ex
from synth.constraints.cost import Model
from synth.constraints.fusion import illegal_reason
from synth.constraints.online import ONLINE_PREFIX, is_candidate
from synth.constraints.space import (
    FUSION_PREFIX,
    ConstraintSet,
    NamedConstraint,
    is_fusion_decision,
    var_name,
)
from synth.errors import InputError
from synth.hardware import Hardware
from synth.lang import MAX_EXPR_DEPTH
from synth.limits import MAX_QUANTITY, check_int, is_int, parse_int, to_int
from synth.workload import Statement

UNDROPPABLE = {
    "implied": "its constraints are redundant bounds, true of every schedule",
    "tiling": "it defines the factors (a dimension's outer factor is its padded extent "
              "over the others, exactly: ragged tiles are not modelled)",
    "fusion.cover": "it makes every statement run exactly once (to force or forbid a "
                    "fusion, use --fix fuse.KERNEL=1 or =0)",
    "fusion.acyclic": "without it fused kernels could need each other's results first, "
                      "and no order would run them (to forbid a fusion, use --fix "
                      "fuse.KERNEL=0)",
    "fusion.complete": "without it a fused fill or epilogue would see a partial "
                       "reduction (to forbid that fusion, use --fix fuse.KERNEL=0)",
    "fusion.writes": "without it several units would store the same elements of a fused "
                     "prologue or epilogue (to forbid that fusion, use --fix fuse.KERNEL=0)",
}
COMPARISONS = ("<=", ">=", "==", "<", ">")
_TOKEN = re.compile(r"\s*(?:(?P<int>\d+)|(?P<name>[A-Za-z_][A-Za-z0-9_.#]*)"
                    r"|(?P<op><=|>=|==|[-+*()<>]))", re.ASCII)


def closest(name: str, valid: Iterable[str], n: int = 5) -> list[str]:
    return difflib.get_close_matches(name, sorted(set(valid)), n=n, cutoff=0.5)


def unknown(kind: str, name: str, valid: Iterable[str], where: str) -> InputError:
    """An error for an unknown name, with the closest valid ones (or some examples)."""
    options = sorted(set(valid))
    near = closest(name, options)
    if near:
        hint = "did you mean " + ", ".join(near) + "?"
    else:
        sample = ", ".join(options[:8]) + (", ..." if len(options) > 8 else "")
        hint = f"valid {kind}s: {sample}"
    return InputError(f"{where}: unknown {kind} {name!r}; {hint} "
                      f"(synth solve ... --show-constraints lists them)")


# ---------------------------------------------------------------- names


def hardware_parameters(hw: Hardware) -> dict[str, int]:
    """Hardware parameters usable in `--constraint`, with their values."""
    params: dict[str, int] = {}
    for mem in hw.memories:
        params[f"{mem.name}.capacity"] = mem.capacity
        params[f"{mem.name}.reserved"] = mem.reserved
        params[f"{mem.name}.usable"] = mem.usable
        rules = mem.rules
        params[f"{mem.name}.transfer.min"] = rules.min_bytes
        params[f"{mem.name}.transfer.multiple"] = rules.multiple
        params[f"{mem.name}.transfer.align"] = rules.align
        if rules.max_bytes is not None:
            params[f"{mem.name}.transfer.max"] = rules.max_bytes
    for level in hw.levels:
        if level.symbol is not None:
            params[f"{level.name}.count.min"] = level.count_min
            params[f"{level.name}.count.max"] = level.count_max
    return params


def variable_names(cset: ConstraintSet) -> list[str]:
    """Variables a user may name: the decisions and the definitions (hardware counts)."""
    return [*cset.definitions, *cset.decisions]


# ---------------------------------------------------------------- --constraint


class _Parser:
    def __init__(self, text: str, names: Mapping[str, ex.Int], where: str) -> None:
        self.text = text
        self.names = names
        self.where = where
        self.tokens: list[tuple[str, str, int]] = []  # (kind, text, column)
        pos = 0
        while pos < len(text):
            if text[pos:].strip() == "":
                break
            match = _TOKEN.match(text, pos)
            if match is None:
                column = pos + len(text[pos:]) - len(text[pos:].lstrip()) + 1
                raise self.error(f"unexpected character {text[column - 1]!r}", column)
            kind = match.lastgroup or ""
            self.tokens.append((kind, match.group(kind), match.start(kind) + 1))
            pos = match.end()
        self.index = 0
        self.nesting = 0  # parentheses and unary minus around the current token

    def _enter(self) -> None:
        """One more level of nesting (recursion), within the workload language's limit."""
        self.nesting += 1
        if self.nesting > MAX_EXPR_DEPTH:
            raise self.error(f"the expression nests more than {MAX_EXPR_DEPTH} levels deep "
                             "(parentheses and unary minus)")

    def error(self, message: str, column: int | None = None) -> InputError:
        col = column if column is not None else (
            self.tokens[self.index][2] if self.index < len(self.tokens) else len(self.text) + 1)
        return InputError(f"{self.where}: {message} at column {col}\n  {self.text}\n  "
                          + " " * (col - 1) + "^")

    def peek(self) -> str | None:
        return self.tokens[self.index][1] if self.index < len(self.tokens) else None

    def take(self) -> tuple[str, str, int]:
        token = self.tokens[self.index]
        self.index += 1
        return token

    def condition(self) -> ex.Cmp:
        lhs = self.sum()
        op = self.peek()
        if op not in COMPARISONS:
            raise self.error("expected one comparison (<=, >=, ==, <, >)")
        self.take()
        rhs = self.sum()
        if self.peek() is not None:
            raise self.error("expected the end of the constraint (one comparison only)"
                             if self.peek() in COMPARISONS else "unexpected token")
        return ex.Cmp(lhs, op, rhs)

    def sum(self) -> ex.Int:
        total = self.product()
        while self.peek() in ("+", "-"):
            sign = self.take()[1]
            term = self.product()
            total = ex.add(total, term if sign == "+" else ex.mul(-1, term))
        return total

    def product(self) -> ex.Int:
        result = self.unary()
        while self.peek() == "*":
            self.take()
            result = ex.mul(result, self.unary())
        return result

    def unary(self) -> ex.Int:
        if self.peek() == "-":
            self.take()
            self._enter()
            term = ex.mul(-1, self.unary())
            self.nesting -= 1
            return term
        return self.atom()

    def atom(self) -> ex.Int:
        if self.index >= len(self.tokens):
            raise self.error("expected a number, a name or '('")
        kind, text, column = self.take()
        if kind == "int":
            try:
                return ex.const(check_int(to_int(text), "a literal", 0, MAX_QUANTITY))
            except InputError as exc:
                raise self.error(str(exc), column) from None
        if kind == "name":
            if text not in self.names:
                raise unknown("name", text, self.names, self.where)
            return self.names[text]
        if text == "(":
            self._enter()
            inner = self.sum()
            if self.peek() != ")":
                raise self.error("expected ')'")
            self.take()
            self.nesting -= 1
            return inner
        raise self.error(f"expected a number, a name or '(', got {text!r}", column)


def _names(cset: ConstraintSet, hw: Hardware,
           constants: Mapping[str, int]) -> dict[str, ex.Int]:
    """Every name an expression may use, and the term it stands for."""
    names: dict[str, ex.Int] = {k: ex.const(v) for k, v in hardware_parameters(hw).items()}
    names.update({k: ex.const(v) for k, v in constants.items()})
    names.update({k: ex.Var(k) for k in variable_names(cset)})
    return names


def parse_constraint(text: str, index: int, cset: ConstraintSet, hw: Hardware,
                     constants: Mapping[str, int] | None = None) -> NamedConstraint:
    """`--constraint "T >= 11"` as the group `user.<index>`.

    `constants` names variables the model folded to a constant (a factor with one
    candidate value); they may be used like any other variable."""
    where = f"--constraint {text!r}"
    cond = _Parser(text, _names(cset, hw, constants or {}), where).condition()
    return NamedConstraint(f"user.{index}", text.strip(), cond)


def parse_fix(text: str, cset: ConstraintSet,
              constants: Mapping[str, int] | None = None,
              pinned: Mapping[str, str] | None = None) -> NamedConstraint:
    """`--fix T=16` as the group `user.fix.T`: the variable equals the value. `pinned`:
    why a factor the space fixed has its one value (`space.Factors.pinned`), said when
    the fix asks for another."""
    name, sep, value = (part.strip() for part in text.partition("="))
    where = f"--fix {text}"
    if not sep or not is_int(value) or not name:
        raise InputError(f"{where}: expected VAR=INT (digits 0-9), e.g. --fix T=16")
    number = parse_int(value, where)
    valid = [*variable_names(cset), *(constants or {})]
    if name not in valid:
        raise unknown("variable", name, valid, where)
    meaning = f"{name} = {number}"
    candidates = cset.decisions.get(name) or (
        (constants[name],) if constants and name in constants else None)
    if candidates is not None and number not in candidates:
        shown = ", ".join(map(str, candidates[:12])) + (", ..." if len(candidates) > 12 else "")
        meaning += f" (not one of its candidate values: {shown})"
        if pinned and name in pinned:
            meaning += f": {pinned[name]}"
    term: ex.Int = ex.const(constants[name]) if constants and name in constants \
        else ex.Var(name)
    return NamedConstraint(f"user.fix.{name}", meaning, ex.Cmp(term, "==", ex.const(number)))


def _check_fusion_fix(model: Model, text: str) -> bool:
    """`--fix fuse.m_e=1` for a fusion that is not a candidate: say why, in the
    workload's terms (which statement consumes what inside which pass). True for
    `--fix fuse.y=1` where kernel y is the only one that can run its statements: always
    so, nothing to constrain."""
    name, _, value = text.partition("=")
    name = name.strip()
    if not is_fusion_decision(name) or name in model.constraints.decisions:
        return False
    online = name.startswith(ONLINE_PREFIX)
    kernel = name.removeprefix(ONLINE_PREFIX if online else FUSION_PREFIX)
    where = f"--fix {text}"
    for spec in model.kernels:
        if spec.name == kernel and (spec.online is not None) != online:
            right = "online." if spec.online is not None else "fuse."
            raise InputError(f"{where}: kernel {kernel} runs "
                             f"{'only' if right == 'online.' else 'without'} the online "
                             f"rewrite: its decision is {right}{kernel}")
        if spec.name == kernel:
            if parse_int(value.strip(), where) == 1:
                return True
            raise InputError(f"{where}: kernel {kernel} is the only kernel that can run "
                             f"{', '.join(s.name for s in spec.statements)}: it is always "
                             f"used ({name} is 1)")
    members = _statements_named(model.workload.statements, kernel)
    if members:
        reason = illegal_reason(model.workload, members) or "not a candidate kernel"
        if online and not is_candidate([model.workload.statements[i] for i in members]):
            reason = ("no statement of the group consumes a maximum inside its own pass, "
                      "so there is nothing to run online")
        names = ", ".join(model.workload.statements[i].name for i in members)
        raise InputError(f"{where}: statements {names} cannot be fused: {reason}")
    return False


def _statements_named(statements: Sequence[Statement], kernel: str) -> list[int] | None:
    """The statements whose names, joined by `_`, spell `kernel` (as `kernel_name` does)."""
    if not kernel:
        return []
    for index, stmt in enumerate(statements):
        if kernel == stmt.name or kernel.startswith(stmt.name + "_"):
            rest = _statements_named(statements, kernel[len(stmt.name) + 1:])
            if rest is not None and index not in rest:
                return [index, *rest]
    return None


def folded_factors(model: Model) -> dict[str, int]:
    """Factors the model folded to a constant (one candidate value), by variable name."""
    out: dict[str, int] = {}
    for (kernel, dim, index), term in model.factors.terms.items():
        if isinstance(term, ex.Const):
            out[var_name(model.slots[index].symbol, kernel, dim)] = term.value
    return out


def user_constraints(model: Model, constraints: Sequence[str],
                     fixes: Sequence[str]) -> list[NamedConstraint]:
    """The groups `user.<k>` and `user.fix.<VAR>` of a model's `--constraint`s and `--fix`es."""
    cset, hw, constants = model.constraints, model.hw, folded_factors(model)
    out = [parse_constraint(text, k, cset, hw, constants)
           for k, text in enumerate(constraints, start=1)]
    fixed: set[str] = set()
    for text in fixes:
        name = text.partition("=")[0].strip()
        if name in fixed:
            raise InputError(f"--fix {text}: {name} is fixed twice")
        fixed.add(name)
        if not _check_fusion_fix(model, text):  # (else a kernel always used, fixed as used)
            out.append(parse_fix(text, cset, constants, model.factors.pinned))
    return out


def named_counts(model: Model, constraints: Sequence[NamedConstraint]) -> dict[str, set[int]]:
    """Unit counts that `constraints` name, per level: every integer of a constraint that
    mentions a level's count (`T`) or one of its spatial factors (`T.y.i`), within the
    level's range. `--fix T=11` names 11 tasklets, `--fix D=60` 60 DPUs; the space then
    offers those counts (`space.build_factors`)."""
    spatial = {level.symbol: level for level in model.hw.levels[1:] if level.symbol}
    found: dict[str, set[int]] = {}
    for constraint in constraints:
        names = set(ex.variables(constraint.cond))
        symbols = {n.partition(".")[0] for n in names
                   if n in spatial or (n.partition(".")[0] in spatial
                                       and n in model.constraints.decisions)}
        values = _literals(constraint.cond)
        for symbol in symbols:
            level = spatial[symbol]
            found.setdefault(level.name, set()).update(
                v for v in values if level.count_min <= v <= level.count_max)
    return {name: values for name, values in found.items() if values}


def _literals(node: ex.Int | ex.Cond) -> set[int]:
    if isinstance(node, ex.Const):
        return {abs(node.value)}
    return {v for child in ex.children(node) for v in _literals(child)}


# ---------------------------------------------------------------- --drop


def group_names(cset: ConstraintSet) -> list[str]:
    """The groups of `cset` in first-appearance order."""
    return list(dict.fromkeys(c.group for c in cset.constraints))


def matches(group: str, pattern: str) -> bool:
    """`pattern` names `group` itself or a prefix of it (`capacity` -> `capacity.wram`)."""
    return group == pattern or group.startswith(pattern + ".")


def drop_groups(cset: ConstraintSet, drops: Sequence[str]) -> ConstraintSet:
    """`cset` without the constraints of the groups `drops` name (see module docstring)."""
    if not drops:
        return cset
    groups = group_names(cset)
    prefixes = {g.rsplit(".", k)[0] for g in groups for k in range(1, g.count(".") + 1)}
    for pattern in drops:
        where = f"--drop {pattern}"
        for name, why in UNDROPPABLE.items():
            if matches(name, pattern):
                raise InputError(f"{where}: the group {name!r} cannot be dropped: {why}")
        if not any(matches(g, pattern) for g in groups):
            raise unknown("group", pattern, [*groups, *prefixes], where)
    kept = tuple(c for c in cset.constraints
                 if not any(matches(c.group, p) for p in drops))
    return dataclasses.replace(cset, constraints=kept)
