"""The workload: tensors and the statements that compute them, as plain frozen data.

A workload is what a `.syn` file describes (see `synth.lang` for the parser). Every later
stage reads it; nothing mutates it.
"""

from __future__ import annotations

import enum
import math
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import numpy as np

from synth.errors import SourceLocation


class DType(enum.Enum):
    F32 = "f32"
    F16 = "f16"
    BF16 = "bf16"
    I32 = "i32"
    I16 = "i16"
    I8 = "i8"

    @property
    def itemsize(self) -> int:
        return {"f32": 4, "f16": 2, "bf16": 2, "i32": 4, "i16": 2, "i8": 1}[self.value]

    @property
    def is_float(self) -> bool:
        return self.value in ("f32", "f16", "bf16")

    @property
    def numpy(self) -> np.dtype:
        """The NumPy dtype values of this type are computed in (bf16 is computed in f32)."""
        names = {"f32": "float32", "f16": "float16", "bf16": "float32",
                 "i32": "int32", "i16": "int16", "i8": "int8"}
        return np.dtype(names[self.value])


class ReduceOp(enum.Enum):
    """A statement's operator: plain assignment or an accumulating reduction."""

    ASSIGN = "="
    ADD = "+="
    MUL = "*="
    MAX = "max="
    MIN = "min="

    @property
    def reduces(self) -> bool:
        return self is not ReduceOp.ASSIGN

    def identity(self, dtype: DType) -> float | int:
        """The value a fresh target of this operator starts from."""
        if self is ReduceOp.ADD or self is ReduceOp.ASSIGN:
            return 0
        if self is ReduceOp.MUL:
            return 1
        if dtype.is_float:
            return -np.inf if self is ReduceOp.MAX else np.inf
        info = np.iinfo(dtype.numpy)
        return int(info.min) if self is ReduceOp.MAX else int(info.max)

    @property
    def ufunc(self) -> np.ufunc:
        """The binary NumPy ufunc that combines two partial results."""
        return {ReduceOp.ADD: np.add, ReduceOp.MUL: np.multiply, ReduceOp.MAX: np.maximum,
                ReduceOp.MIN: np.minimum}[self]

    @property
    def op_class(self) -> str:
        """The compute-cost class of one accumulation step."""
        return {ReduceOp.ADD: "add", ReduceOp.MUL: "mul", ReduceOp.MAX: "max",
                ReduceOp.MIN: "max", ReduceOp.ASSIGN: "mov"}[self]


# ---------------------------------------------------------------- expressions


@dataclass(frozen=True)
class Num:
    value: float | int


@dataclass(frozen=True)
class Access:
    tensor: str
    indices: tuple[str, ...]


@dataclass(frozen=True)
class SizeRef:
    """A size name used as a value, e.g. `x[i] / N`."""

    name: str
    value: int


@dataclass(frozen=True)
class BinOp:
    op: str  # one of + - * /
    lhs: Expr
    rhs: Expr


@dataclass(frozen=True)
class Neg:
    arg: Expr


@dataclass(frozen=True)
class Call:
    fn: str  # exp log sqrt rsqrt recip tanh abs relu max min
    args: tuple[Expr, ...]


Expr = Num | Access | SizeRef | BinOp | Neg | Call

UNARY_FUNCTIONS = ("exp", "log", "sqrt", "rsqrt", "recip", "tanh", "abs", "relu")
BINARY_FUNCTIONS = ("max", "min")
_BINOP_CLASS = {"+": "add", "-": "add", "*": "mul", "/": "div"}


def children(expr: Expr) -> tuple[Expr, ...]:
    """The operands of a node, left to right."""
    if isinstance(expr, BinOp):
        return (expr.lhs, expr.rhs)
    if isinstance(expr, Neg):
        return (expr.arg,)
    if isinstance(expr, Call):
        return expr.args
    return ()


def walk(expr: Expr) -> Iterator[Expr]:
    """Every node of an expression, parents before children, left to right.

    Iterative, so any depth works here; the parser still bounds the depth
    (`synth.lang.MAX_EXPR_DEPTH`) for the stages that recurse."""
    stack = [expr]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(reversed(children(node)))


def accesses(expr: Expr) -> list[Access]:
    return [node for node in walk(expr) if isinstance(node, Access)]


def op_classes(expr: Expr) -> Counter[str]:
    """How many operations of each cost class one evaluation of `expr` performs."""
    counts: Counter[str] = Counter()
    for node in walk(expr):
        if isinstance(node, BinOp):
            counts[_BINOP_CLASS[node.op]] += 1
        elif isinstance(node, Neg):
            counts["add"] += 1
        elif isinstance(node, Call):
            counts["max" if node.fn in ("max", "min", "relu", "abs") else node.fn] += 1
    return counts


# ---------------------------------------------------------------- tensors and statements


class Role(enum.Enum):
    INPUT = "in"
    OUTPUT = "out"
    TEMP = "temp"


@dataclass(frozen=True)
class Tensor:
    name: str
    dtype: DType
    shape: tuple[int, ...]
    dim_names: tuple[str, ...]  # how each dimension was written: a size name or a literal
    role: Role

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize  # exact: no int64 wrap-around


@dataclass(frozen=True)
class Statement:
    """`target[indices] op expr`, with every index's extent resolved."""

    name: str  # unique: the target's name, with `#k` when a target is assigned more than once
    target: str
    indices: tuple[str, ...]
    op: ReduceOp
    expr: Expr
    extents: Mapping[str, int]  # every index of the statement -> its extent
    reduced: tuple[str, ...]  # indices on the right only, in order of first appearance
    accumulates: bool  # True when an earlier statement already assigned the target
    dtype: DType  # the target's dtype
    location: SourceLocation | None = field(default=None, compare=False)

    @property
    def dims(self) -> tuple[str, ...]:
        """The statement's loop dimensions: the target's indices, then the reduced ones."""
        return self.indices + self.reduced

    @property
    def inputs(self) -> tuple[str, ...]:
        """Tensors read on the right, in order of first appearance, without repeats."""
        return tuple(dict.fromkeys(a.tensor for a in accesses(self.expr)))

    @property
    def subscripted(self) -> list[tuple[str, tuple[str, ...]]]:
        """(tensor, subscripts) of the target, then of every access on the right."""
        return [(self.target, self.indices), *((a.tensor, a.indices) for a in accesses(self.expr))]

    def inputs_indices(self, tensor: str) -> tuple[str, ...]:
        """The subscripts of the first access to `tensor` on the right."""
        return next(a.indices for a in accesses(self.expr) if a.tensor == tensor)


@dataclass(frozen=True)
class Workload:
    name: str
    sizes: Mapping[str, int]
    tensors: Mapping[str, Tensor]
    statements: tuple[Statement, ...]
    source: str = ""  # path or built-in name it came from

    def statement(self, name: str) -> Statement:
        for stmt in self.statements:
            if stmt.name == name:
                return stmt
        raise KeyError(name)

    @property
    def inputs(self) -> tuple[Tensor, ...]:
        return tuple(t for t in self.tensors.values() if t.role is Role.INPUT)

    @property
    def outputs(self) -> tuple[Tensor, ...]:
        return tuple(t for t in self.tensors.values() if t.role is Role.OUTPUT)
