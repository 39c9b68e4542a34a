"""The `.syn` workload language: tokenizer, recursive-descent parser and checks.

A `.syn` file is line oriented: each non-blank line is one declaration (`size`, `in`,
`out`) or one statement `TARGET[IDX, ...] OP EXPR` (docs/language.md, the reference). Parsing and
checking happen in one pass over the lines, because every rule of the language is
"defined before use": a size before the dimension that names it, a tensor before the
access that reads it. Every error a user can make in a file is a `LocatedError` that
points at the offending token, so the CLI can show the line with a caret.

The result is a frozen `Workload` (see `synth.workload`); nothing here is needed after.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Literal

import numpy as np

from synth.errors import InputError, LocatedError, SourceLocation
from synth.limits import MAX_SIZE, check_int, to_int
from synth.workload import (
    BINARY_FUNCTIONS,
    UNARY_FUNCTIONS,
    Access,
    BinOp,
    Call,
    DType,
    Expr,
    Neg,
    Num,
    ReduceOp,
    Role,
    SizeRef,
    Statement,
    Tensor,
    Workload,
)

__all__ = [
    "MAX_EXPR_DEPTH",
    "ExprType",
    "SizeRange",
    "expr_type",
    "list_builtin_workloads",
    "is_builtin_workload",
    "read_workload",
    "load_workload",
    "parse_workload",
]

KEYWORDS = ("size", "in", "out")
# Functions of floats whose result is a float even for integer arguments.
FLOAT_FUNCTIONS = ("exp", "log", "sqrt", "rsqrt", "recip", "tanh")
_OPERATORS = "=, +=, *=, max=, min="
_INT_RANK = {DType.I8: 0, DType.I16: 1, DType.I32: 2}
MAX_EXPR_DEPTH = 100
"""The deepest expression a statement may hold: nesting of parentheses, unary minus and
calls, and the depth of the tree (a sum of n terms is n levels deep: n - 1 of `+` over
the terms). Every later stage (reference, interpreter, printers, emitters) walks
expressions recursively, one to three Python frames per level, under Python's default
recursion limit of 1,000 frames; 100 levels leave room for the frames below them."""
C_INT = (-(2**31), 2**31 - 1)
"""The range of C's `int`, in which integer expressions are computed (`synth.reference`)."""

# ---------------------------------------------------------------- tokens


@dataclass(frozen=True)
class Token:
    kind: str  # "name", "int", "float", "op" or "eol"
    text: str
    line: int
    col: int  # 1-based


_TOKEN_RE = re.compile(
    r"""
    (?P<ws>[ \t\r\f\v]+)
  | (?P<float>(?:\d+\.\d*|\.\d+)(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+)
  | (?P<int>\d+)
  | (?P<name>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<op>\+=|\*=|-=|/=|[-+*/=\[\](),:])
    """,
    re.VERBOSE | re.ASCII,  # digits are 0-9 only (see synth.limits)
)


def _tokenize(code: str, line: int, location: _LineSource) -> list[Token]:
    """Split one line (comment already removed) into tokens, ending with an `eol` token.

    `-=` and `/=` are tokens only so that a misuse reads "found '-='" instead of a
    confusing message about a lone `=`.
    """
    tokens: list[Token] = []
    pos = 0
    while pos < len(code):
        match = _TOKEN_RE.match(code, pos)
        if match is None:
            hint = ": numbers are written with the digits 0-9" if code[pos].isdigit() else ""
            raise location.error(f"unexpected character {code[pos]!r}{hint}", pos + 1)
        kind = match.lastgroup or ""
        if kind != "ws":
            tokens.append(Token(kind, match.group(), line, pos + 1))
        pos = match.end()
    tokens.append(Token("eol", "", line, len(code.rstrip()) + 1))
    return tokens


def _describe(token: Token) -> str:
    """How an error message names a token it did not expect."""
    if token.kind == "eol":
        return "end of line"
    if token.kind == "name":
        return f"name '{token.text}'"
    if token.kind in ("int", "float"):
        return f"number {token.text}"
    return f"'{token.text}'"


@dataclass(frozen=True)
class _LineSource:
    """One source line, to build locations and errors that point into it."""

    path: str
    line: int
    text: str

    def location(self, col: int) -> SourceLocation:
        return SourceLocation(self.path, self.line, col, self.text)

    def error(self, message: str, col: int) -> LocatedError:
        return LocatedError(message, self.location(col))


class _Cursor:
    """The tokens of one line and a read position, with the helpers the parser needs."""

    def __init__(self, tokens: list[Token], source: _LineSource) -> None:
        self.tokens = tokens
        self.source = source
        self.pos = 0

    def peek(self, ahead: int = 0) -> Token:
        return self.tokens[min(self.pos + ahead, len(self.tokens) - 1)]

    def next(self) -> Token:
        token = self.peek()
        self.pos = min(self.pos + 1, len(self.tokens) - 1)
        return token

    def at(self, text: str) -> bool:
        token = self.peek()
        return token.kind == "op" and token.text == text

    def error(self, message: str, token: Token) -> LocatedError:
        return self.source.error(message, token.col)

    def expected(self, what: str, token: Token | None = None) -> LocatedError:
        token = token or self.peek()
        return self.error(f"expected {what}, found {_describe(token)}", token)

    def expect_op(self, text: str, what: str | None = None) -> Token:
        if not self.at(text):
            raise self.expected(what or f"'{text}'")
        return self.next()

    def expect_name(self, what: str) -> Token:
        if self.peek().kind != "name":
            raise self.expected(what)
        return self.next()

    def expect_eol(self) -> None:
        if self.peek().kind != "eol":
            raise self.expected("end of line")


# ---------------------------------------------------------------- expression types

LiteralKind = Literal["int", "float"]
ExprType = DType | LiteralKind
"""The type of an expression node: a dtype, or the kind of literal it is made of only.

Literals (numbers and size names) do not influence an expression's dtype, so a node
built only from literals keeps its literal kind until it meets a typed operand.
"""


def _join(a: ExprType, b: ExprType) -> ExprType | None:
    """The type of a binary operation on `a` and `b`; None when a float literal meets an int.

    A float literal next to an integer operand is rejected rather than guessed: C would
    promote to double, the "literals don't influence" rule would truncate the literal.
    """
    if isinstance(a, str) and isinstance(b, str):
        return "float" if "float" in (a, b) else "int"
    if isinstance(a, str) or isinstance(b, str):
        typed = b if isinstance(a, str) else a
        literal = a if isinstance(a, str) else b
        assert isinstance(typed, DType)
        if literal == "float" and not typed.is_float:
            return None
        return typed
    if a.is_float or b.is_float:
        floats = {t for t in (a, b) if t.is_float}
        return floats.pop() if len(floats) == 1 else DType.F32
    return a if _INT_RANK[a] >= _INT_RANK[b] else b


def _call_type(fn: str, args: list[ExprType]) -> ExprType | None:
    """Math functions make floats of integers; abs, relu, max and min keep their operands' type."""
    if fn in FLOAT_FUNCTIONS:
        arg = args[0]
        if isinstance(arg, str):
            return "float"
        return arg if arg.is_float else DType.F32
    if fn in BINARY_FUNCTIONS:
        return _join(args[0], args[1])
    return args[0]


def expr_type(expr: Expr, tensors: Mapping[str, Tensor]) -> ExprType:
    """The type of `expr` under the language's rules (the parser has already checked it)."""
    if isinstance(expr, Num):
        return "float" if isinstance(expr.value, float) else "int"
    if isinstance(expr, SizeRef):
        return "int"
    if isinstance(expr, Access):
        return tensors[expr.tensor].dtype
    if isinstance(expr, Neg):
        return expr_type(expr.arg, tensors)
    if isinstance(expr, BinOp):
        joined = _join(expr_type(expr.lhs, tensors), expr_type(expr.rhs, tensors))
    else:
        joined = _call_type(expr.fn, [expr_type(arg, tensors) for arg in expr.args])
    if joined is None:
        raise ValueError(f"a float literal is combined with an integer operand in {expr}")
    return joined


def _temp_dtype(ty: ExprType, op: ReduceOp) -> DType:
    """A temporary's dtype: its expression's, with integer sums and products in i32."""
    if isinstance(ty, str):
        return DType.F32 if ty == "float" else DType.I32
    if not ty.is_float and op in (ReduceOp.ADD, ReduceOp.MUL):
        return DType.I32
    return ty


# ---------------------------------------------------------------- parser state


@dataclass
class _Def:
    """A declared or assigned tensor, with what errors need to point at it."""

    tensor: Tensor
    where: SourceLocation
    assigned: bool = False


@dataclass
class _Binding:
    """Where an index got its extent: the first tensor dimension it indexes."""

    extent: int
    dim_name: str
    what: str  # e.g. "A[m, k] (dimension 2, K)"


@dataclass
class _Use:
    """One tensor access on the right of a statement, with its tokens for error locations."""

    access: Access
    name: Token
    index_tokens: list[Token]


@dataclass
class _Builder:
    """Everything parsed so far; one method per kind of line."""

    path: str
    overrides: Mapping[str, int]
    sizes: dict[str, int] = field(default_factory=dict)
    size_where: dict[str, SourceLocation] = field(default_factory=dict)
    defs: dict[str, _Def] = field(default_factory=dict)
    statements: list[Statement] = field(default_factory=list)

    # ---------------------------------------------------------------- lines

    def line(self, cur: _Cursor) -> None:
        first = cur.peek()
        if first.kind == "name" and first.text in KEYWORDS:
            cur.next()
            if first.text == "size":
                self._size(cur)
            else:
                self._tensor_decl(cur, Role.INPUT if first.text == "in" else Role.OUTPUT)
        elif first.kind == "name":
            self._statement(cur)
        else:
            raise cur.expected("a declaration (size, in, out) or a statement")
        cur.expect_eol()

    def _check_new_name(self, cur: _Cursor, token: Token) -> None:
        """Declarations must not reuse a name, whether of a size or of a tensor."""
        name = token.text
        where = self.size_where.get(name) or (self.defs[name].where if name in self.defs else None)
        if where is not None:
            raise cur.error(f"'{name}' is already declared at line {where.line}", token)
        if name in KEYWORDS:
            raise cur.error(f"'{name}' is a keyword and cannot be used as a name", token)

    def _size(self, cur: _Cursor) -> None:
        token = cur.expect_name("a size name after 'size'")
        self._check_new_name(cur, token)
        cur.expect_op("=", "'=' after the size name")
        value_token = cur.peek()
        if value_token.kind != "int":
            raise cur.expected("a positive integer size")
        cur.next()
        value = _positive(cur, value_token, f"size '{token.text}'")
        self.sizes[token.text] = int(self.overrides.get(token.text, value))
        self.size_where[token.text] = cur.source.location(token.col)

    def _tensor_decl(self, cur: _Cursor, role: Role) -> None:
        token = cur.expect_name(f"a tensor name after '{role.value}'")
        self._check_new_name(cur, token)
        cur.expect_op(":", "':' after the tensor name")
        dtype = self._dtype(cur)
        shape, dim_names = self._dims(cur)
        tensor = Tensor(token.text, dtype, shape, dim_names, role)
        self.defs[token.text] = _Def(tensor, cur.source.location(token.col))

    def _dtype(self, cur: _Cursor) -> DType:
        valid = ", ".join(d.value for d in DType)
        token = cur.peek()
        if token.kind != "name":
            raise cur.expected(f"a dtype ({valid})")
        cur.next()
        try:
            return DType(token.text)
        except ValueError:
            message = f"unknown dtype '{token.text}'; expected one of {valid}"
            raise cur.error(message, token) from None

    def _dims(self, cur: _Cursor) -> tuple[tuple[int, ...], tuple[str, ...]]:
        """`[DIM, ...]`: each a declared size name or a positive integer literal."""
        cur.expect_op("[", "'[' after the dtype")
        shape: list[int] = []
        names: list[str] = []
        while not (cur.at("]") and not shape):
            token = cur.next()
            if token.kind == "name":
                if token.text not in self.sizes:
                    raise cur.error(f"unknown size '{token.text}'{self._sizes_hint()}", token)
                shape.append(self.sizes[token.text])
            elif token.kind == "int":
                shape.append(_positive(cur, token, "a dimension"))
            else:
                raise cur.expected("a size name or a positive integer dimension", token)
            names.append(token.text)
            if not cur.at(","):
                break
            cur.next()
        cur.expect_op("]", "',' or ']' in the dimensions")
        return tuple(shape), tuple(names)

    def _sizes_hint(self) -> str:
        if not self.sizes:
            return "; no size is declared"
        return f"; declared sizes: {', '.join(self.sizes)}"

    # ---------------------------------------------------------------- statements

    def _subscripts(self, cur: _Cursor) -> list[Token]:
        """`[IDX, ...]` of plain index names; anything else is an affine subscript."""
        cur.expect_op("[")
        indices: list[Token] = []
        if cur.at("]"):
            cur.next()
            return indices
        while True:
            token = cur.peek()
            if token.kind != "name":
                raise self._affine(cur, token)
            cur.next()
            self._check_index(cur, token, indices)
            indices.append(token)
            if cur.at(","):
                cur.next()
                continue
            if cur.at("]"):
                cur.next()
                return indices
            if cur.peek().kind == "eol":
                raise cur.expected("',' or ']'")
            raise self._affine(cur, cur.peek())

    def _affine(self, cur: _Cursor, token: Token) -> LocatedError:
        return cur.error(
            "a subscript must be a single index name; affine subscripts are not supported yet"
            f" (found {_describe(token)})", token)

    def _check_index(self, cur: _Cursor, token: Token, seen: list[Token]) -> None:
        """Index names are distinct from sizes and unique within one subscript list."""
        if token.text in self.sizes:
            raise cur.error(f"'{token.text}' is a size; it cannot be used as an index", token)
        if any(t.text == token.text for t in seen):
            raise cur.error(
                f"index '{token.text}' appears twice in one subscript; diagonal accesses are"
                " not supported", token)

    def _op(self, cur: _Cursor) -> ReduceOp:
        token = cur.peek()
        if token.kind == "op" and token.text in ("=", "+=", "*="):
            cur.next()
            return ReduceOp(token.text)
        if token.kind == "name" and token.text in ("max", "min") and cur.peek(1).text == "=":
            cur.next()
            cur.next()
            return ReduceOp(token.text + "=")
        raise cur.expected(f"an operator ({_OPERATORS})")

    def _statement(self, cur: _Cursor) -> None:
        target_tok = cur.next()
        target = target_tok.text
        index_toks = self._subscripts(cur)
        op = self._op(cur)
        existing = self._check_target(cur, target_tok, index_toks)
        parser = _ExprParser(cur, self)
        expr, ty = parser.parse()
        cur.expect_eol()
        indices = tuple(t.text for t in index_toks)
        bindings = self._bind_extents(cur, existing, index_toks, parser.uses)
        reduced = self._reduced(cur, op, indices, parser.uses)
        self._check_self_read(cur, target, indices, reduced, parser.uses)
        extents = {name: bindings[name].extent for name in indices + reduced}
        if existing is None:
            existing = self._new_temp(cur, target_tok, index_toks, bindings, _temp_dtype(ty, op))
        _check_literals(cur, parser.literals, ty, existing.tensor)
        self.statements.append(Statement(
            name=target, target=target, indices=indices, op=op, expr=expr,
            extents=extents, reduced=reduced, accumulates=existing.assigned,
            dtype=existing.tensor.dtype, location=cur.source.location(target_tok.col)))
        existing.assigned = True

    def _check_target(self, cur: _Cursor, token: Token, index_toks: list[Token]) -> _Def | None:
        """The target's definition if it exists (an out, or an assigned temporary)."""
        name = token.text
        if name in self.sizes:
            raise cur.error(f"'{name}' is a size; it cannot be assigned", token)
        if name in KEYWORDS:
            raise cur.error(f"'{name}' is a keyword and cannot be used as a name", token)
        found = self.defs.get(name)
        if found is None:
            return None
        if found.tensor.role is Role.INPUT:
            raise cur.error(f"cannot assign to input tensor '{name}'", token)
        _check_rank(cur, token, found.tensor, len(index_toks))
        return found

    def _bind_extents(
        self, cur: _Cursor, target: _Def | None, index_toks: list[Token], uses: list[_Use]
    ) -> dict[str, _Binding]:
        """Every index's extent, from the dimensions it indexes; conflicts are errors."""
        bindings: dict[str, _Binding] = {}
        sources = [(target.tensor, index_toks)] if target is not None else []
        sources += [(self.defs[u.access.tensor].tensor, u.index_tokens) for u in uses]
        for tensor, toks in sources:
            for pos, tok in enumerate(toks):
                self._bind(cur, bindings, tensor, pos, tok, toks)
        for tok in index_toks:
            if tok.text not in bindings:
                raise cur.error(
                    f"cannot infer the extent of index '{tok.text}': it does not appear on the"
                    " right and the target is a new temporary", tok)
        return bindings

    def _bind(self, cur: _Cursor, bindings: dict[str, _Binding], tensor: Tensor, pos: int,
              tok: Token, toks: list[Token]) -> None:
        extent, dim_name = tensor.shape[pos], tensor.dim_names[pos]
        what = (f"{tensor.name}[{', '.join(t.text for t in toks)}] "
                f"(dimension {pos + 1}, {dim_name})")
        old = bindings.get(tok.text)
        if old is None:
            bindings[tok.text] = _Binding(extent, dim_name, what)
        elif old.extent != extent:
            raise cur.error(
                f"index '{tok.text}' has conflicting extents: {old.extent} from {old.what}"
                f" and {extent} from {what}", tok)
        elif dim_name in self.sizes and old.dim_name not in self.sizes:
            old.dim_name = dim_name  # prefer naming a temporary's dimension by a size

    def _reduced(self, cur: _Cursor, op: ReduceOp, indices: tuple[str, ...],
                 uses: list[_Use]) -> tuple[str, ...]:
        """Indices on the right only, in order of first appearance; `=` may reduce none."""
        reduced: dict[str, Token] = {}
        for use in uses:
            for tok in use.index_tokens:
                if tok.text not in indices:
                    reduced.setdefault(tok.text, tok)
        if reduced and op is ReduceOp.ASSIGN:
            name, tok = next(iter(reduced.items()))
            raise cur.error(
                f"index '{name}' appears only on the right, so it is reduced, but '=' does not"
                f" reduce; use +=, *=, max= or min=", tok)
        return tuple(reduced)

    def _check_self_read(self, cur: _Cursor, target: str, indices: tuple[str, ...],
                         reduced: tuple[str, ...], uses: list[_Use]) -> None:
        """A statement may read its own target only pointwise, so that its meaning does not
        depend on the order in which the loop nest visits the elements."""
        for use in uses:
            if use.access.tensor == target and (use.access.indices != indices or reduced):
                raise cur.error(
                    f"'{target}' is read on the right with other subscripts or inside a"
                    f" reduction; a statement may read its target only as {target}"
                    f"[{', '.join(indices)}] without reduced indices", use.name)

    def _new_temp(self, cur: _Cursor, token: Token, index_toks: list[Token],
                  bindings: dict[str, _Binding], dtype: DType) -> _Def:
        shape = tuple(bindings[t.text].extent for t in index_toks)
        dim_names = tuple(self._dim_name(bindings[t.text]) for t in index_toks)
        tensor = Tensor(token.text, dtype, shape, dim_names, Role.TEMP)
        found = _Def(tensor, cur.source.location(token.col))
        self.defs[token.text] = found
        return found

    def _dim_name(self, binding: _Binding) -> str:
        """A temporary's dimension is named by a size: the one the index's dimensions were
        written with, else the first size of that value, else the literal extent."""
        if binding.dim_name in self.sizes:
            return binding.dim_name
        same = [name for name, value in self.sizes.items() if value == binding.extent]
        return same[0] if same else str(binding.extent)

    # ---------------------------------------------------------------- the end

    def finish(self, name: str) -> Workload:
        if not any(d.tensor.role is Role.OUTPUT for d in self.defs.values()):
            what = "no statement and no" if not self.statements else "no"
            raise InputError(
                f"{self.path}: workload '{name}' has {what} output tensor: declare one with"
                " 'out NAME : DTYPE[DIMS]' and assign it; outputs are what synth computes"
                " and checks")
        for found in self.defs.values():
            if found.tensor.role is Role.OUTPUT and not found.assigned:
                raise LocatedError(
                    f"output '{found.tensor.name}' is never assigned", found.where)
        unknown = [n for n in self.overrides if n not in self.sizes]
        if unknown:
            raise InputError(
                f"--set {unknown[0]}: no size named '{unknown[0]}' in workload '{name}'"
                f"{self._sizes_hint()}")
        return Workload(
            name=name, sizes=dict(self.sizes),
            tensors={n: d.tensor for n, d in self.defs.items()},
            statements=_name_statements(self.statements), source=self.path)


def _check_literals(cur: _Cursor, literals: list[tuple[Token, int | float]], ty: ExprType,
                    target: Tensor) -> None:
    """Literals must be values of the type they are stored as: no float literal alone
    assigned to an integer tensor (C would truncate it silently), no integer beyond an
    integer target's range (it would wrap), no float beyond a float target's range."""
    dtype = target.dtype
    first_float = next((tok for tok, value in literals if isinstance(value, float)), None)
    if not dtype.is_float and ty == "float" and first_float is not None:
        raise cur.error(f"a float literal is assigned to {dtype.value} tensor "
                        f"'{target.name}', which would truncate it; write an integer", first_float)
    info = np.finfo(dtype.numpy) if dtype.is_float else np.iinfo(dtype.numpy)
    for token, value in literals:
        is_float = isinstance(value, float)
        if is_float and dtype.is_float and not abs(value) <= float(info.max):
            raise cur.error(f"float literal {token.text} is beyond the range of {dtype.value} "
                            f"(largest {float(info.max):.6g}), the type of '{target.name}'",
                            token)
        if not is_float and not dtype.is_float and not info.min <= value <= info.max:
            raise cur.error(f"integer literal {token.text} is beyond the range of "
                            f"{dtype.value} ({info.min}..{info.max}), the type of "
                            f"'{target.name}'", token)


def _positive(cur: _Cursor, token: Token, what: str) -> int:
    """A size or dimension literal: 1..MAX_SIZE."""
    value = to_int(token.text)
    if value <= 0:
        raise cur.error(f"{what} must be positive, got {token.text}", token)
    try:
        return check_int(value, what, 1, MAX_SIZE)
    except InputError as exc:
        raise cur.error(str(exc), token) from None


def _check_rank(cur: _Cursor, token: Token, tensor: Tensor, count: int) -> None:
    rank = len(tensor.shape)
    if count != rank:
        dims = "dimension" if rank == 1 else "dimensions"
        subs = "subscript" if count == 1 else "subscripts"
        raise cur.error(
            f"'{tensor.name}' has {rank} {dims} but is indexed with {count} {subs}", token)


def _name_statements(statements: list[Statement]) -> tuple[Statement, ...]:
    """Name each statement by its target, numbered `t#1`, `t#2`, ... when a target repeats."""
    counts: dict[str, int] = {}
    for stmt in statements:
        counts[stmt.target] = counts.get(stmt.target, 0) + 1
    seen: dict[str, int] = {}
    named = []
    for stmt in statements:
        if counts[stmt.target] == 1:
            named.append(stmt)
            continue
        seen[stmt.target] = seen.get(stmt.target, 0) + 1
        named.append(dataclasses.replace(stmt, name=f"{stmt.target}#{seen[stmt.target]}"))
    return tuple(named)


# ---------------------------------------------------------------- expressions


class _ExprParser:
    """Precedence climbing for `+ -` over `* /` over unary `-`, typing each node as built.

    Names are resolved while parsing: the builder knows every size and every tensor
    defined by the lines above, which is exactly what "defined before use" allows.
    """

    def __init__(self, cur: _Cursor, builder: _Builder) -> None:
        self.cur = cur
        self.builder = builder
        self.uses: list[_Use] = []
        self.literals: list[tuple[Token, int | float]] = []
        self.nesting = 0  # parentheses, unary minus and calls around the current token
        self.depths: dict[int, int] = {}  # id(node) -> depth, for the nodes built so far

    def parse(self) -> tuple[Expr, ExprType]:
        if self.cur.peek().kind == "eol":
            raise self.cur.expected("an expression")
        return self._sum()

    def _enter(self, token: Token) -> None:
        """One more level of nesting at `token`, within `MAX_EXPR_DEPTH`."""
        self.nesting += 1
        if self.nesting > MAX_EXPR_DEPTH:
            raise self.cur.error(_TOO_DEEP, token)

    def _built(self, node: Expr, at: Token, *children: Expr) -> Expr:
        """`node`, whose depth (one more than its deepest child's) must stay within
        `MAX_EXPR_DEPTH`: a long chain of operators is as deep as nested parentheses."""
        level = 1 + max(self.depths.get(id(child), 1) for child in children)
        if level > MAX_EXPR_DEPTH:
            raise self.cur.error(_TOO_DEEP, at)
        self.depths[id(node)] = level
        return node

    def _sum(self) -> tuple[Expr, ExprType]:
        expr, ty = self._product()
        while self.cur.at("+") or self.cur.at("-"):
            op = self.cur.next()
            rhs, rty = self._product()
            expr, ty = self._built(BinOp(op.text, expr, rhs), op, expr, rhs), \
                self._joined(ty, rty, op)
        return expr, ty

    def _product(self) -> tuple[Expr, ExprType]:
        expr, ty = self._unary()
        while self.cur.at("*") or self.cur.at("/"):
            op = self.cur.next()
            rhs, rty = self._unary()
            expr, ty = self._built(BinOp(op.text, expr, rhs), op, expr, rhs), \
                self._joined(ty, rty, op)
        return expr, ty

    def _unary(self) -> tuple[Expr, ExprType]:
        if not self.cur.at("-"):
            return self._primary()
        minus = self.cur.next()
        self._enter(minus)
        arg, ty = self._unary()
        self.nesting -= 1
        if isinstance(arg, Num):
            return Num(-arg.value), ty  # fold so a negative literal is one number
        return self._built(Neg(arg), minus, arg), ty

    def _joined(self, a: ExprType, b: ExprType, at: Token) -> ExprType:
        joined = _join(a, b)
        if joined is None:
            raise self.cur.error(
                "a float literal cannot be combined with an integer operand; write an integer"
                " literal, or make the other operand a float (e.g. with recip or a float"
                " tensor)", at)
        return joined

    def _primary(self) -> tuple[Expr, ExprType]:
        token = self.cur.peek()
        if token.kind in ("int", "float"):
            self.cur.next()
            value = self._int_literal(token) if token.kind == "int" else float(token.text)
            self.literals.append((token, value))
            return Num(value), ("int" if token.kind == "int" else "float")
        if self.cur.at("("):
            self._enter(self.cur.next())
            result = self._sum()
            self.cur.expect_op(")", "')'")
            self.nesting -= 1
            return result
        if token.kind != "name":
            raise self.cur.expected("a number, a name or '('")
        self.cur.next()
        if self.cur.at("("):
            return self._call(token)
        if self.cur.at("["):
            return self._access(token)
        return self._size_ref(token)

    def _int_literal(self, token: Token) -> int:
        """An integer literal: a value of C's `int`, in which integer expressions run."""
        value = to_int(token.text)
        if value > C_INT[1]:
            raise self.cur.error(
                f"integer literal {token.text if len(token.text) <= 24 else 'here'} is beyond"
                f" C's int range ({C_INT[0]}..{C_INT[1]}), in which synth computes integer"
                " expressions", token)
        return value

    def _call(self, token: Token) -> tuple[Expr, ExprType]:
        fn = token.text
        functions = UNARY_FUNCTIONS + BINARY_FUNCTIONS
        if fn not in functions:
            raise self.cur.error(
                f"unknown function '{fn}'; expected one of {', '.join(functions)}", token)
        self._enter(self.cur.next())
        args: list[Expr] = []
        types: list[ExprType] = []
        if not self.cur.at(")"):
            while True:
                arg, ty = self._sum()
                args.append(arg)
                types.append(ty)
                if not self.cur.at(","):
                    break
                self.cur.next()
        self.cur.expect_op(")", "',' or ')' in the arguments")
        self.nesting -= 1
        arity = 1 if fn in UNARY_FUNCTIONS else 2
        if len(args) != arity:
            plural = "argument" if arity == 1 else "arguments"
            raise self.cur.error(
                f"function '{fn}' takes {arity} {plural}, got {len(args)}", token)
        ty_or_none = _call_type(fn, types)
        if ty_or_none is None:
            raise self.cur.error(
                f"'{fn}' combines a float literal with an integer operand; write an integer"
                " literal", token)
        return self._built(Call(fn, tuple(args)), token, *args), ty_or_none

    def _access(self, token: Token) -> tuple[Expr, ExprType]:
        name = token.text
        builder = self.builder
        if name in builder.sizes:
            raise self.cur.error(f"'{name}' is a size, not a tensor; write it without '[]'", token)
        index_toks = builder._subscripts(self.cur)
        found = builder.defs.get(name)
        if found is None:
            raise self.cur.error(
                f"'{name}' is used before it is defined: it is not declared and no earlier"
                " statement assigns it", token)
        if found.tensor.role is Role.OUTPUT and not found.assigned:
            raise self.cur.error(
                f"output '{name}' is read before any statement assigns it", token)
        _check_rank(self.cur, token, found.tensor, len(index_toks))
        access = Access(name, tuple(t.text for t in index_toks))
        self.uses.append(_Use(access, token, index_toks))
        return access, found.tensor.dtype

    def _size_ref(self, token: Token) -> tuple[Expr, ExprType]:
        name = token.text
        if name in self.builder.sizes:
            return SizeRef(name, self.builder.sizes[name]), "int"
        if name in self.builder.defs:
            raise self.cur.error(
                f"tensor '{name}' needs subscripts, e.g. {name}[...] (a scalar is {name}[])",
                token)
        raise self.cur.error(
            f"unknown name '{name}': expected a size, a tensor access or a function call", token)


_TOO_DEEP = (f"this expression nests more than {MAX_EXPR_DEPTH} levels deep (parentheses, "
             "unary minus and function calls each add one, and so does every operator of a "
             f"chain: a sum of n terms is n levels); split it into several statements")


# ---------------------------------------------------------------- size ranges


@dataclass(frozen=True)
class SizeRange:
    """The admissible values of a size given as a range (`--set N=LO..HI[:STEP]`):
    LO, LO+STEP, ... up to HI. `last` is the largest of them (HI itself when STEP
    divides HI - LO)."""

    lo: int
    hi: int
    step: int = 1

    def __post_init__(self) -> None:
        given = f"{self.lo}..{self.hi}:{self.step}"
        if self.lo <= 0 or self.hi <= 0:
            raise ValueError(f"size range {given}: bounds must be positive")
        if self.step <= 0:
            raise ValueError(f"size range {given}: step must be positive")
        if self.lo > self.hi:
            raise ValueError(f"size range {given}: LO > HI")

    @property
    def last(self) -> int:
        return self.lo + (self.hi - self.lo) // self.step * self.step

    @property
    def count(self) -> int:
        return (self.hi - self.lo) // self.step + 1

    def values(self) -> range:
        return range(self.lo, self.last + 1, self.step)

    def __contains__(self, value: object) -> bool:
        return (isinstance(value, int) and self.lo <= value <= self.hi
                and (value - self.lo) % self.step == 0)

    def __str__(self) -> str:
        """`1024..65536 step 1024` (the admissible values, so HI is `last`)."""
        text = f"{self.lo}..{self.last}"
        return text if self.step == 1 else f"{text} step {self.step}"


# ---------------------------------------------------------------- entry points


def _check_overrides(overrides: Mapping[str, int] | None) -> dict[str, int]:
    """`--set` values must be positive integers; their names are checked after parsing."""
    checked: dict[str, int] = {}
    for key, value in (overrides or {}).items():
        if isinstance(value, bool) or not isinstance(value, int):
            raise InputError(f"--set {key}={value!r}: a size must be an integer")
        if value <= 0:
            raise InputError(f"--set {key}={value}: size '{key}' must be positive")
        checked[key] = check_int(value, f"--set {key}", 1, MAX_SIZE)
    return checked


def parse_workload(
    text: str, path: str, name: str, overrides: Mapping[str, int] | None = None
) -> Workload:
    """Parse and check a `.syn` text; `path` is what error locations name.

    `overrides` replace size values (`--set N=4096`) before any shape is derived, so
    every tensor, extent and size reference sees the overridden value.
    """
    builder = _Builder(path, _check_overrides(overrides))
    # lines end at "\n" alone (and "\r\n"): `str.splitlines` also splits at U+2028, form
    # feeds and other separators that editors do not show as line breaks, which would
    # shift every line number after them
    for number, raw in enumerate(text.split("\n"), start=1):
        line = raw.removesuffix("\r")
        source = _LineSource(path, number, line)
        code = line.split("#", 1)[0]
        tokens = _tokenize(code, number, source)
        if tokens[0].kind == "eol":
            continue
        builder.line(_Cursor(tokens, source))
    return builder.finish(name)


def _builtin_dir() -> Traversable:
    return resources.files("synth").joinpath("workloads")


def list_builtin_workloads() -> list[str]:
    """Names of the `.syn` files shipped in `synth/workloads`, sorted."""
    return sorted(
        entry.name[: -len(".syn")]
        for entry in _builtin_dir().iterdir()
        if entry.name.endswith(".syn") and entry.is_file()
    )


def is_builtin_workload(ref: str) -> bool:
    """Whether `ref` names a built-in workload (a bare name: one with a path separator or
    a `.syn` suffix is always a path)."""
    is_pathlike = "/" in ref or "\\" in ref or ref.endswith(".syn")
    return not is_pathlike and ref in list_builtin_workloads()


def read_workload(ref: str) -> tuple[str, str, str]:
    """`(text, path, name)` of a built-in workload by name, or a `.syn` file by path:
    the text, what error locations name, and the workload's name.

    A bare name that is a built-in wins over a file of the same name in the working
    directory; anything with a path separator or a `.syn` suffix is always a path.
    """
    builtins = list_builtin_workloads()
    if is_builtin_workload(ref):
        text = _builtin_dir().joinpath(f"{ref}.syn").read_text(encoding="utf-8")
        return text, f"<builtin>/{ref}.syn", ref
    path = Path(ref)
    if not path.is_file():
        raise InputError(
            f"no workload file '{ref}' and no built-in workload of that name;"
            f" built-in workloads: {', '.join(builtins)}")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read workload file '{ref}': {exc}") from None
    return text, ref, path.stem


def load_workload(ref: str, overrides: Mapping[str, int] | None = None) -> Workload:
    """A built-in workload by name, or a `.syn` file by path (see `read_workload`)."""
    text, path, name = read_workload(ref)
    workload = parse_workload(text, path, name, overrides)
    return dataclasses.replace(workload, source=ref) if is_builtin_workload(ref) else workload
