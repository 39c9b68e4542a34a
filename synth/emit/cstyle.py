"""A C-style renderer that the C-like targets share (after tinygrad's renderer/cstyle.py).

The base class renders what every C dialect has in common: identifiers, types and
literals, the workload's expressions (C semantics as `synth.reference` defines them),
affine indices, blocks and loops. A target subclasses it, overrides the settings that
differ (the index type, the float type its math runs in) and adds its own declarations.

Expressions follow the reference: integers are computed in C's `int` with wrap-around
(the build passes -fwrapv), `/` on integers truncates and gives 0 for a zero divisor (a
helper, since C leaves it undefined), a float anywhere makes the expression float, and
the math functions always work in floating point. A statement whose target is float
computes in `float` (expf, ...), an integer statement's float parts in `double`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass

from synth.errors import SynthError
from synth.ir.nodes import Affine
from synth.workload import Access, BinOp, Call, DType, Expr, Neg, Num, ReduceOp, SizeRef, Tensor


class EmitError(SynthError):
    """The loop nest has something this emitter cannot express (exit code 2)."""


C_KEYWORDS = frozenset((  # and other names a generated C file must not take
    "auto", "break", "case", "char", "const", "continue", "default", "do", "double", "else",
    "enum", "extern", "float", "for", "goto", "if", "inline", "int", "long", "register",
    "restrict", "return", "short", "signed", "sizeof", "static", "struct", "switch", "typedef",
    "union", "unsigned", "void", "volatile", "while", "_Bool", "_Complex", "_Alignas",
    "_Alignof", "_Atomic", "_Generic", "_Noreturn", "_Static_assert", "_Thread_local", "bool",
    "true", "false", "NULL", "main", "errno",
    # what the emitted files call: libc and libm, and the helpers CStyle defines
    "memcpy", "malloc", "free", "exit", "printf", "fprintf", "stderr", "stdout", "FILE",
    "exp", "expf", "log", "logf", "sqrt", "sqrtf", "tanh", "tanhf", "fabs", "fabsf", "fmax",
    "isnan", "isfinite", "INFINITY", "NAN", "size_t", "uint8_t", "uint16_t", "uint32_t",
    "int8_t", "int16_t", "int32_t", "max_float", "min_float", "max_double", "min_double",
    "max_int", "min_int", "div_int", "abs_int"))

# Precedence of what an expression's outermost operator binds: higher binds tighter.
ATOM, UNARY, MUL, ADD = 100, 90, 80, 70


# ---------------------------------------------------------------- text


class Code:
    """Lines of C with the current indentation."""

    def __init__(self, indent: str = "    ") -> None:
        self.lines: list[str] = []
        self.depth = 0
        self.indent = indent

    def __call__(self, text: str = "") -> None:
        self.lines.append(self.indent * self.depth + text if text else "")

    def comment(self, text: str) -> None:
        self(f"/* {text} */")

    @contextmanager
    def block(self, head: str, comment: str | None = None) -> Iterator[None]:
        """`head {`, the body one level deeper, `}` (an empty head opens a bare block)."""
        self(f"{head} {{".lstrip() + (f" /* {comment} */" if comment else ""))
        self.depth += 1
        yield
        self.depth -= 1
        self("}")

    @contextmanager
    def function(self, head: str) -> Iterator[None]:
        """A function definition: the brace on a line of its own."""
        self(head)
        with self.block(""):
            yield

    def extend(self, other: Code) -> None:
        self.lines.extend(self.indent * self.depth + line if line else "" for line in other.lines)

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def identifier(text: str) -> str:
    """`text` as a C identifier: other characters become `_` (`C#1` -> `C_1`)."""
    name = re.sub(r"\W", "_", text)
    return name if name and not name[0].isdigit() else f"v{name}"


class Names:
    """Unique C identifiers for the IR's names: each key gets one, as close to the name
    wanted as the names already taken (keywords, the target's own) allow."""

    def __init__(self, reserved: Iterable[str] = ()) -> None:
        self.taken = set(C_KEYWORDS) | set(reserved)
        self.given: dict[str, str] = {}

    def __call__(self, key: str, wanted: str | None = None) -> str:
        if key not in self.given:
            base = identifier(wanted if wanted is not None else key)
            name, n = base, 1
            while name in self.taken:
                name, n = f"{base}_{n}", n + 1
            self.taken.add(name)
            self.given[key] = name
        return self.given[key]


# ---------------------------------------------------------------- the workload's text


def syn_text(expr: Expr, prec: int = 0) -> str:
    """An expression as the `.syn` language writes it (for comments), parenthesised only
    where the grouping needs it."""
    if isinstance(expr, Num):
        return repr(expr.value)
    if isinstance(expr, SizeRef):
        return expr.name
    if isinstance(expr, Access):
        return f"{expr.tensor}[{', '.join(expr.indices)}]"
    if isinstance(expr, Neg):
        return f"-{syn_text(expr.arg, UNARY)}"
    if isinstance(expr, BinOp):
        own = MUL if expr.op in "*/" else ADD
        text = f"{syn_text(expr.lhs, own)} {expr.op} {syn_text(expr.rhs, own + 1)}"
        return f"({text})" if own < prec else text
    return f"{expr.fn}({', '.join(syn_text(a) for a in expr.args)})"


def statement_text(target: str, indices: tuple[str, ...], op: ReduceOp, expr: Expr) -> str:
    return f"{target}[{', '.join(indices)}] {op.value} {syn_text(expr)}"


# ---------------------------------------------------------------- rendering


@dataclass(frozen=True)
class Typed:
    """A rendered expression: its C text, whether it is floating point, its precedence."""

    code: str
    is_float: bool
    prec: int = ATOM


def _wrap(value: Typed, prec: int) -> str:
    return value.code if value.prec >= prec else f"({value.code})"


class CStyle:
    """What C-like targets share. Subclasses override the settings below."""

    emitter_name = "this C emitter"  # for messages
    index_type = "uint32_t"  # loop counters and offsets
    ctypes: Mapping[DType, str] = {DType.F32: "float", DType.I32: "int32_t",
                                   DType.I16: "int16_t", DType.I8: "int8_t"}

    def __init__(self) -> None:
        self.helpers: dict[str, str] = {}  # C definitions this file needs, by name

    # -- types and literals ------------------------------------------------------

    def ctype(self, dtype: DType) -> str:
        if dtype not in self.ctypes:
            supported = ", ".join(d.value for d in self.ctypes)
            raise EmitError(f"{self.emitter_name} cannot emit {dtype.value} tensors yet "
                            f"(supported: {supported})")
        return self.ctypes[dtype]

    def literal(self, value: float | int, real: str = "float") -> Typed:
        """A number in C; floats get an `f` suffix when math runs in `float`."""
        if isinstance(value, int):  # bool included
            return Typed(str(value), False, ATOM if value >= 0 else UNARY)
        if math.isnan(value):
            return Typed("NAN", True)
        if math.isinf(value):
            return Typed("INFINITY" if value > 0 else "-INFINITY", True,
                         ATOM if value > 0 else UNARY)
        text = repr(float(value)) + ("f" if real == "float" else "")
        return Typed(text, True, ATOM if value >= 0 else UNARY)

    def fill_value(self, value: float | int, dtype: DType) -> str:
        """A fill value (an operator's identity) in the tensor's type."""
        if dtype.is_float:
            return self.literal(float(value)).code
        if value < -(2**31 - 1):  # INT32_MIN cannot be written as one literal
            return f"({int(value) + 1} - 1)"
        return str(int(value))

    # -- helpers -----------------------------------------------------------------

    def helper(self, name: str, definition: str) -> str:
        """Use a helper function: its definition goes once into the file."""
        self.helpers.setdefault(name, definition)
        return name

    def select(self, fn: str, ctype: str) -> str:
        """max_float(a, b) and friends: NumPy's maximum and minimum for non-NaN values."""
        compare = ">" if fn == "max" else "<"
        return self.helper(f"{fn}_{ctype}", f"static inline {ctype} {fn}_{ctype}({ctype} a, "
                                            f"{ctype} b) {{ return a {compare} b ? a : b; }}")

    def int_div(self) -> str:
        return self.helper("div_int", (
            "/* C division truncates toward zero like synth's reference; x / 0 is 0 there "
            "(undefined in C) */\n"
            "static inline int div_int(int a, int b) "
            "{ return b == 0 ? 0 : b == -1 ? -a : a / b; }"))

    def int_abs(self) -> str:
        return self.helper("abs_int", "static inline int abs_int(int a) "
                                      "{ return a < 0 ? -a : a; }")

    def math_function(self, name: str) -> str:
        """The C function to call for the libm function `name` (`expf`, `sqrt`, ...):
        libm's own here. A target whose C library has no libm returns its own helper."""
        return name

    # -- expressions -------------------------------------------------------------

    def expr(self, expr: Expr, access: Callable[[Access], str],
             tensors: Mapping[str, Tensor], real: str) -> Typed:
        """`expr` in C; `access` renders a tensor element, `real` is the float type."""
        if isinstance(expr, Num):
            return self.literal(expr.value, real)
        if isinstance(expr, SizeRef):
            return self.literal(expr.value, real)
        if isinstance(expr, Access):
            return Typed(access(expr), tensors[expr.tensor].dtype.is_float)
        if isinstance(expr, Neg):
            arg = self.expr(expr.arg, access, tensors, real)
            inner = _wrap(arg, UNARY + 1) if not arg.code.startswith("-") else f"({arg.code})"
            return Typed(f"-{inner}", arg.is_float, UNARY)
        if isinstance(expr, BinOp):
            return self._binop(expr, access, tensors, real)
        return self._call(expr, [self.expr(a, access, tensors, real) for a in expr.args], real)

    def _binop(self, expr: BinOp, access: Callable[[Access], str],
               tensors: Mapping[str, Tensor], real: str) -> Typed:
        lhs = self.expr(expr.lhs, access, tensors, real)
        rhs = self.expr(expr.rhs, access, tensors, real)
        is_float = lhs.is_float or rhs.is_float
        if expr.op == "/" and not is_float:
            return Typed(f"{self.int_div()}({lhs.code}, {rhs.code})", False)
        prec = MUL if expr.op in "*/" else ADD
        # the tree's grouping is kept: a right operand of the same precedence keeps its
        # parentheses (float arithmetic is not associative)
        return Typed(f"{_wrap(lhs, prec)} {expr.op} {_wrap(rhs, prec + 1)}", is_float, prec)

    def _call(self, call: Call, args: list[Typed], real: str) -> Typed:
        fn = call.fn
        suffix = "f" if real == "float" else ""
        if fn in ("max", "min"):
            is_float = args[0].is_float or args[1].is_float
            name = self.select(fn, real if is_float else "int")
            return Typed(f"{name}({args[0].code}, {args[1].code})", is_float)
        arg = args[0]
        if fn == "relu":
            zero = self.literal(0.0, real).code if arg.is_float else "0"
            name = self.select("max", real if arg.is_float else "int")
            return Typed(f"{name}({arg.code}, {zero})", arg.is_float)
        if fn == "abs":
            if arg.is_float:
                return Typed(f"{self.math_function(f'fabs{suffix}')}({arg.code})", True)
            return Typed(f"{self.int_abs()}({arg.code})", False)
        one = self.literal(1.0, real).code
        if fn == "recip":
            return Typed(f"{one} / {_wrap(arg, MUL + 1)}", True, MUL)
        if fn == "rsqrt":
            return Typed(f"{one} / {self.math_function(f'sqrt{suffix}')}({arg.code})", True,
                         MUL)
        if fn in ("exp", "log", "sqrt", "tanh"):
            return Typed(f"{self.math_function(f'{fn}{suffix}')}({arg.code})", True)
        raise EmitError(f"{self.emitter_name} cannot emit the function {fn!r}")

    def cast(self, value: Typed, dtype: DType) -> str:
        """`value` stored into a `dtype` element: explicit where C would narrow (integer
        targets narrower than int wrap, floats truncate toward zero into integers)."""
        if dtype.is_float or (not value.is_float and dtype is DType.I32):
            return value.code
        return f"({self.ctype(dtype)})" + _wrap(value, UNARY)

    def reduce_step(self, op: ReduceOp, acc: Typed, value: Typed, real: str) -> Typed:
        """`acc op= value` as an expression (the accumulator's new value)."""
        is_float = acc.is_float or value.is_float
        if op is ReduceOp.ASSIGN:
            return value
        if op in (ReduceOp.MAX, ReduceOp.MIN):
            name = self.select("max" if op is ReduceOp.MAX else "min",
                               real if is_float else "int")
            return Typed(f"{name}({acc.code}, {value.code})", is_float)
        symbol = "+" if op is ReduceOp.ADD else "*"
        prec = ADD if symbol == "+" else MUL
        return Typed(f"{_wrap(acc, prec)} {symbol} {_wrap(value, prec + 1)}", is_float, prec)

    # -- indices -----------------------------------------------------------------

    def affine(self, value: Affine, name: Callable[[str], str] = str) -> Typed:
        """sum(coeff * var) + const, e.g. `r_i * 131072 + t_i * 128` (larger steps first,
        which is outer loops first)."""
        terms = sorted(value.terms, key=lambda t: -abs(t[1]))
        parts = [name(v) if c == 1 else f"{name(v)} * {c}" for v, c in terms if c > 0]
        negative = [name(v) if c == -1 else f"{name(v)} * {-c}" for v, c in terms if c < 0]
        text = " + ".join(parts)
        for part in negative:
            text = f"{text} - {part}" if text else f"-{part}"
        if value.const or not text:
            if text:
                text += f" + {value.const}" if value.const > 0 else f" - {-value.const}"
            else:
                text = str(value.const)
        if len(value.terms) + bool(value.const) > 1:
            return Typed(text, False, ADD)
        if not value.terms:
            return Typed(text, False, ATOM if value.const >= 0 else UNARY)
        coeff = value.terms[0][1]
        return Typed(text, False, ATOM if coeff == 1 else MUL if coeff > 0 else UNARY)

    def for_loop(self, code: Code, var: str, count: str | int, comment: str | None = None,
                 start: int = 0) -> AbstractContextManager[None]:
        """`for (index_type var = start; var < count; var++) {`."""
        return code.block(f"for ({self.index_type} {var} = {start}; {var} < {count}; {var}++)",
                          comment)


def scale(value: Affine, factor: int) -> Affine:
    return Affine(tuple((v, c * factor) for v, c in value.terms if c * factor),
                  value.const * factor)


def term(var: str, coeff: int = 1) -> Affine:
    return Affine(((var, coeff),)) if coeff else Affine()


def affine_sum(values: Iterable[Affine]) -> Affine:
    total = Affine()
    for value in values:
        total = total + value
    return total
