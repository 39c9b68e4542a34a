"""The workload as a NumPy user would write it: the baseline emitted CPU code is timed
against (`synth.emit.c_check`, `benchmarks/c_vs_numpy.py`).

Unlike `synth.reference`, which computes in float64 with C's integer semantics to be the
most accurate answer, this computes every statement in its tensors' own dtypes with
NumPy's idiomatic calls: a sum of products is one `np.einsum(..., optimize=True)` (which
hands f32 and f64 contractions to BLAS), anything else is the statement's expression
broadcast over its dimensions, then reduced over the reduced ones with the operator's
ufunc. Each statement makes a fresh array, as `x = f(...)` does in NumPy.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from synth.workload import (
    Access,
    BinOp,
    Call,
    Expr,
    Neg,
    Num,
    ReduceOp,
    SizeRef,
    Statement,
    Workload,
)

_FUNCTIONS: Mapping[str, Callable[..., np.ndarray]] = {
    "exp": np.exp, "log": np.log, "sqrt": np.sqrt, "tanh": np.tanh, "abs": np.abs,
    "rsqrt": lambda x: 1 / np.sqrt(x), "recip": lambda x: 1 / x,
    "relu": lambda x: np.maximum(x, 0), "max": np.maximum, "min": np.minimum,
}
_BINOPS: Mapping[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "+": np.add, "-": np.subtract, "*": np.multiply, "/": np.divide,
}


def evaluate(workload: Workload, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every tensor's value after running the statements in order."""
    values = {t.name: np.asarray(inputs[t.name], dtype=t.dtype.numpy)
              for t in workload.inputs}
    with np.errstate(all="ignore"):
        for stmt in workload.statements:
            values[stmt.target] = statement(workload, stmt, values)
    return values


def statement(workload: Workload, stmt: Statement, values: Mapping[str, np.ndarray]
              ) -> np.ndarray:
    dtype = workload.tensors[stmt.target].dtype.numpy
    rhs = _einsum(stmt, values, dtype)
    if rhs is None:
        rhs = _broadcast(stmt, values, dtype)
    if stmt.op is ReduceOp.ASSIGN:
        return np.broadcast_to(rhs, workload.tensors[stmt.target].shape).astype(dtype)
    if stmt.accumulates:
        return stmt.op.ufunc(values[stmt.target], rhs).astype(dtype, copy=False)
    return np.asarray(rhs, dtype=dtype)


def _einsum(stmt: Statement, values: Mapping[str, np.ndarray], dtype: np.dtype
            ) -> np.ndarray | None:
    """A `+=` of a product of accesses as one einsum; None for anything else."""
    if stmt.op is not ReduceOp.ADD:
        return None
    factors = _factors(stmt.expr)
    if factors is None or not all(isinstance(f, Access) for f in factors):
        return None
    letters = {d: chr(ord("a") + k) for k, d in enumerate(stmt.dims)}
    spec = ",".join("".join(letters[i] for i in f.indices) for f in factors
                    if isinstance(f, Access))
    spec += "->" + "".join(letters[i] for i in stmt.indices)
    operands = [values[f.tensor] for f in factors if isinstance(f, Access)]
    return np.asarray(np.einsum(spec, *operands, optimize=True), dtype=dtype)


def _factors(expr: Expr) -> list[Expr] | None:
    if isinstance(expr, BinOp) and expr.op == "*":
        lhs, rhs = _factors(expr.lhs), _factors(expr.rhs)
        return None if lhs is None or rhs is None else lhs + rhs
    return [expr] if isinstance(expr, Access) else None


def _broadcast(stmt: Statement, values: Mapping[str, np.ndarray], dtype: np.dtype
               ) -> np.ndarray:
    """The expression over the statement's dimensions, reduced over the reduced ones."""
    dims = stmt.dims

    def access(a: Access) -> np.ndarray:
        array = values[a.tensor]
        order = sorted(range(len(a.indices)), key=lambda k: dims.index(a.indices[k]))
        array = np.transpose(array, order) if order != sorted(order) else array
        shape = [stmt.extents[d] if d in a.indices else 1 for d in dims]
        return array.reshape(shape)

    rhs = _eval(stmt.expr, access, dtype)
    rhs = np.broadcast_to(rhs, [stmt.extents[d] for d in dims])
    if not stmt.reduced:
        return rhs
    axes = tuple(range(len(stmt.indices), len(dims)))
    return stmt.op.ufunc.reduce(rhs, axis=axes)


def _eval(expr: Expr, access: Callable[[Access], np.ndarray], dtype: np.dtype
          ) -> np.ndarray:
    if isinstance(expr, Num | SizeRef):
        return np.asarray(expr.value, dtype=dtype)
    if isinstance(expr, Access):
        return access(expr)
    if isinstance(expr, Neg):
        return np.negative(_eval(expr.arg, access, dtype))
    if isinstance(expr, BinOp):
        return _BINOPS[expr.op](_eval(expr.lhs, access, dtype), _eval(expr.rhs, access, dtype))
    assert isinstance(expr, Call)
    return _FUNCTIONS[expr.fn](*(_eval(a, access, dtype) for a in expr.args))
