"""The reference: a direct NumPy evaluation of a workload's statements, and the comparison.

Validation trusts this module, so it reads only the workload (each statement's AST) and
never a schedule: whatever the solver, IR or emitters do, the answer here is computed
independently. It must also be fast enough to validate every built-in at its default
size, hence two evaluation paths:

- a sum of products (`+=` over a product of accesses) goes to `np.einsum`, which uses
  BLAS; integer products are computed in floating point where that is provably exact
  (every partial sum below 2^24 for f32 or 2^53 for f64) and exactly in int64 otherwise;
- everything else is evaluated broadcast over the statement's dimensions, in chunks
  along the first dimension so that no intermediate exceeds `CHUNK_ELEMENTS`.

Arithmetic follows C: integer expressions are computed in 32 bits (C's `int`, which
i8 and i16 promote to) with wrap-around, `/` on integers truncates toward zero (and
gives 0 on division by zero, where C is undefined), and results are stored by a
wrapping cast to the target's width. Float expressions are computed in float64, the
most accurate answer to compare the targets' f32/f16 arithmetic against.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import numpy as np

from synth.errors import InputError
from synth.workload import (
    Access,
    BinOp,
    DType,
    Expr,
    Neg,
    Num,
    ReduceOp,
    SizeRef,
    Statement,
    Tensor,
    Workload,
)

__all__ = ["CHUNK_ELEMENTS", "TOLERANCES", "compare", "evaluate", "make_inputs"]

CHUNK_ELEMENTS = 1 << 25
"""The most elements one broadcast block holds (32M: 256 MB per float64 intermediate)."""

TOLERANCES: dict[DType, tuple[float, float]] = {
    DType.F32: (1e-4, 1e-5),
    DType.F16: (1e-2, 1e-3),
    DType.BF16: (5e-2, 1e-2),
}
"""(rtol, atol) per float dtype; see `compare`."""

_Array = np.ndarray
_FLOAT = np.float64
_INT = np.int32

# ---------------------------------------------------------------- inputs


def make_inputs(workload: Workload, seed: int = 0) -> dict[str, np.ndarray]:
    """Deterministic random values for every input, drawn in declaration order.

    Floats are uniform in [-1, 1); integers are in [1, 3], small and nonzero so that
    products and sums stay far from overflow at the built-in sizes and `/` is safe.
    """
    rng = np.random.default_rng(seed)
    values: dict[str, np.ndarray] = {}
    for tensor in workload.inputs:
        if tensor.dtype.is_float:
            drawn = rng.uniform(-1.0, 1.0, size=tensor.shape).astype(tensor.dtype.numpy)
            below_one = np.nextafter(tensor.dtype.numpy.type(1), tensor.dtype.numpy.type(0))
            values[tensor.name] = np.asarray(np.minimum(drawn, below_one))  # rounding: 1.0
        else:
            drawn = rng.integers(1, 4, size=tensor.shape, dtype=np.int64)
            values[tensor.name] = np.asarray(drawn.astype(tensor.dtype.numpy))
    return values


def _checked_inputs(workload: Workload, inputs: Mapping[str, np.ndarray]) -> dict[str, _Array]:
    """The inputs as arrays of their declared dtype; a missing or misshapen one is an error."""
    values: dict[str, _Array] = {}
    for tensor in workload.inputs:
        if tensor.name not in inputs:
            raise InputError(f"no value given for input '{tensor.name}'")
        array = np.asarray(inputs[tensor.name])
        if array.shape != tensor.shape:
            raise InputError(
                f"input '{tensor.name}' has shape {array.shape}, expected {tensor.shape}")
        values[tensor.name] = _store(array, tensor.dtype)
    return values


# ---------------------------------------------------------------- evaluation


def evaluate(workload: Workload, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every tensor's value (inputs, temporaries, outputs) after running the statements in order."""
    values = _checked_inputs(workload, inputs)
    with np.errstate(all="ignore"):  # wrap-around, inf and nan are the defined semantics
        for stmt in workload.statements:
            values[stmt.target] = _run(workload.tensors[stmt.target], stmt, values)
    return values


def _run(tensor: Tensor, stmt: Statement, values: Mapping[str, _Array]) -> _Array:
    """`target = op(start, reduce_op over the reduced indices of expr)`, stored in its dtype."""
    rhs = _product_rhs(stmt, values)
    if rhs is None:
        rhs = _broadcast_rhs(stmt, values)
    if stmt.op is ReduceOp.ASSIGN:
        return _store(np.broadcast_to(rhs, tensor.shape), tensor.dtype)
    if stmt.accumulates:
        start = np.asarray(values[stmt.target])
    else:
        start = np.full(tensor.shape, stmt.op.identity(tensor.dtype), dtype=tensor.dtype.numpy)
    wide = _FLOAT if tensor.dtype.is_float or _is_float(rhs) else np.int64
    combined = stmt.op.ufunc(start.astype(wide), np.asarray(rhs).astype(wide))
    return _store(combined, tensor.dtype)


def _store(array: _Array, dtype: DType) -> _Array:
    """Cast to a tensor's dtype as C stores: integers wrap (through int64), floats truncate."""
    array = np.asarray(array)
    if not dtype.is_float and _is_float(array):
        array = np.trunc(array).astype(np.int64)
    return array.astype(dtype.numpy)  # always a fresh array, never a view of the inputs


def _is_float(array: _Array | np.generic | float) -> bool:
    return bool(np.issubdtype(np.asarray(array).dtype, np.floating))


# ---------------------------------------------------------------- sums of products


def _product_factors(expr: Expr) -> list[Expr] | None:
    """The factors of a product of accesses and constants, or None if `expr` is not one."""
    if isinstance(expr, BinOp) and expr.op == "*":
        lhs, rhs = _product_factors(expr.lhs), _product_factors(expr.rhs)
        return None if lhs is None or rhs is None else lhs + rhs
    if isinstance(expr, Access | Num | SizeRef):
        return [expr]
    return None


def _product_rhs(stmt: Statement, values: Mapping[str, _Array]) -> _Array | None:
    """A `+=` of a product of accesses via `np.einsum`; None when the statement is not one."""
    factors = _product_factors(stmt.expr)
    if stmt.op is not ReduceOp.ADD or factors is None:
        return None
    accesses = [f for f in factors if isinstance(f, Access)]
    if not accesses:
        return None
    arrays = [np.asarray(values[a.tensor]) for a in accesses]
    scale = math.prod(f.value for f in factors if isinstance(f, Num | SizeRef))
    is_float = any(_is_float(a) for a in arrays) or isinstance(scale, float)
    letters = _letters(stmt)
    present = {i for a in accesses for i in a.indices}
    out = [i for i in stmt.indices if i in present]
    spec = ",".join("".join(letters[i] for i in a.indices) for a in accesses)
    spec += "->" + "".join(letters[i] for i in out)
    if is_float:
        result = np.einsum(spec, *[a.astype(_FLOAT) for a in arrays], optimize=True) * scale
    else:
        result = _exact_int_einsum(spec, arrays, int(scale), stmt)
    shape = [stmt.extents[i] if i in present else 1 for i in stmt.indices]
    return np.asarray(result).reshape(shape)


def _letters(stmt: Statement) -> dict[str, str]:
    alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
    return {index: alphabet[n] for n, index in enumerate(stmt.dims)}


def _exact_int_einsum(spec: str, arrays: list[_Array], scale: int, stmt: Statement) -> _Array:
    """An integer sum of products, computed in the cheapest float type that is exact.

    Every partial sum (and every intermediate einsum forms) is bounded by the product of
    the factors' largest magnitudes (at least 1 each) times the reduced extents; below
    2^24 float32 is exact, below 2^53 float64 is; otherwise int64 (exact modulo 2^64,
    which is all a wrapping 32-bit result needs).
    """
    ints = [_wrap32(a) for a in arrays]
    bound = max(1, abs(scale)) * math.prod(stmt.extents[i] for i in stmt.reduced)
    for array in ints:
        bound *= max(1, int(np.abs(array.astype(np.int64)).max(initial=0)))
    if bound < 2**24:
        result = np.einsum(spec, *[a.astype(np.float32) for a in ints], optimize=True)
    elif bound < 2**53:
        result = np.einsum(spec, *[a.astype(np.float64) for a in ints], optimize=True)
    else:
        return np.einsum(spec, *[a.astype(np.int64) for a in ints], optimize=True) * scale
    return np.asarray(result).astype(np.int64) * scale


# ---------------------------------------------------------------- broadcast evaluation


def _broadcast_rhs(stmt: Statement, values: Mapping[str, _Array]) -> _Array:
    """The reduced right-hand side over the target's indices, evaluated block by block.

    Blocks split the statement's first dimension: slices of a target index are
    concatenated, partial results of a reduced index are combined with the statement's
    operator (which is associative, so the split does not change the result's meaning).
    """
    dims = stmt.dims
    total = math.prod(stmt.extents[d] for d in dims)
    if not dims or total <= CHUNK_ELEMENTS:
        return _block(stmt, values, None)
    first = dims[0]
    rows = max(1, CHUNK_ELEMENTS // (total // stmt.extents[first]))
    parts = [_block(stmt, values, slice(lo, lo + rows))
             for lo in range(0, stmt.extents[first], rows)]
    if first in stmt.indices:
        return np.concatenate(parts, axis=0)
    return _combine_parts(stmt.op, parts)


def _combine_parts(op: ReduceOp, parts: list[_Array]) -> _Array:
    result = parts[0]
    for part in parts[1:]:
        result = op.ufunc(result, part)
    return result


def _block(stmt: Statement, values: Mapping[str, _Array], rows: slice | None) -> _Array:
    """Evaluate `expr` broadcast over the dimensions (the first one sliced to `rows`), reduce.

    The result has the block's full target shape: target indices the expression does
    not use are broadcast, so blocks can be concatenated.
    """
    dims = stmt.dims
    shape = [stmt.extents[d] for d in dims]
    if rows is not None:
        shape[0] = len(range(*rows.indices(shape[0])))
    env = _Env(stmt, values, rows)
    full = np.broadcast_to(_eval(stmt.expr, env), shape)
    axes = tuple(range(len(stmt.indices), len(dims)))
    if not axes:
        return np.array(full)
    if not _is_float(full):
        full = full.astype(np.int64)  # sums and products wrap consistently in int64
    return _REDUCE[stmt.op](full, axis=axes)


_REDUCE: dict[ReduceOp, Callable[..., _Array]] = {
    ReduceOp.ADD: lambda a, axis: np.asarray(np.sum(a, axis=axis)),
    ReduceOp.MUL: lambda a, axis: np.asarray(np.prod(a, axis=axis)),
    ReduceOp.MAX: lambda a, axis: np.asarray(np.max(a, axis=axis)),
    ReduceOp.MIN: lambda a, axis: np.asarray(np.min(a, axis=axis)),
}


class _Env:
    """Reads accesses as arrays laid out along the statement's dimensions (1 where unused)."""

    def __init__(self, stmt: Statement, values: Mapping[str, _Array], rows: slice | None):
        self.dims = stmt.dims
        self.values = values
        self.rows = rows

    def access(self, access: Access) -> _Array:
        array = np.asarray(self.values[access.tensor])
        if self.rows is not None and self.dims[0] in access.indices:
            selector = [slice(None)] * array.ndim
            selector[access.indices.index(self.dims[0])] = self.rows
            array = array[tuple(selector)]
        order = sorted(range(len(access.indices)), key=lambda k: self.dims.index(access.indices[k]))
        array = array.transpose(order)
        used = set(access.indices)
        shape = [array.shape[sorted(used, key=self.dims.index).index(d)] if d in used else 1
                 for d in self.dims]
        array = array.reshape(shape)
        return array.astype(_FLOAT) if _is_float(array) else _wrap32(array)


class _Given:
    """Reads accesses through a caller's function (the IR interpreter's tile buffers)."""

    def __init__(self, fetch: Callable[[Access], _Array]) -> None:
        self.fetch = fetch

    def access(self, access: Access) -> _Array:
        array = np.asarray(self.fetch(access))
        return array.astype(_FLOAT) if _is_float(array) else _wrap32(array)


def elementwise(expr: Expr, fetch: Callable[[Access], _Array]) -> _Array:
    """`expr` evaluated with the reference's arithmetic (C-like integers, float64), each
    access read through `fetch` already shaped for broadcasting. The interpreter uses it so
    that a schedule and the reference differ only in how they tile, never in arithmetic."""
    return _eval(expr, _Given(fetch))


def _wrap32(array: _Array) -> _Array:
    """C's integer promotion: any integer array as int32, wrapping."""
    return np.asarray(array).astype(np.int64).astype(_INT)


def _int_literal(value: int) -> _Array:
    return np.asarray((value + 2**31) % 2**32 - 2**31, dtype=_INT)


def _eval(expr: Expr, env: _Env | _Given) -> _Array:
    """One node: integers as int32 (C's `int`), floats as float64, promoted like C."""
    if isinstance(expr, Num):
        value = expr.value
        return np.asarray(value, dtype=_FLOAT) if isinstance(value, float) else _int_literal(value)
    if isinstance(expr, SizeRef):
        return _int_literal(expr.value)
    if isinstance(expr, Access):
        return env.access(expr)
    if isinstance(expr, Neg):
        return np.negative(_eval(expr.arg, env))
    if isinstance(expr, BinOp):
        return _binop(expr.op, _eval(expr.lhs, env), _eval(expr.rhs, env))
    return _call(expr.fn, [_eval(arg, env) for arg in expr.args])


def _promote(a: _Array, b: _Array) -> tuple[_Array, _Array]:
    if _is_float(a) or _is_float(b):
        return np.asarray(a, dtype=_FLOAT), np.asarray(b, dtype=_FLOAT)
    return a, b


def _binop(op: str, a: _Array, b: _Array) -> _Array:
    a, b = _promote(a, b)
    if op == "+":
        return np.add(a, b)
    if op == "-":
        return np.subtract(a, b)
    if op == "*":
        return np.multiply(a, b)
    if _is_float(a):
        return np.divide(a, b)
    return _trunc_div(a, b)


def _trunc_div(a: _Array, b: _Array) -> _Array:
    """C integer division: truncate toward zero; x / 0 is 0 here (undefined in C)."""
    a64, b64 = np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64)
    safe = np.where(b64 == 0, 1, b64)
    quotient = np.abs(a64) // np.abs(safe)
    quotient = np.where((a64 < 0) != (safe < 0), -quotient, quotient)
    return np.where(b64 == 0, 0, quotient).astype(_INT)


def _call(fn: str, args: list[_Array]) -> _Array:
    if fn in ("max", "min"):
        a, b = _promote(args[0], args[1])
        return np.maximum(a, b) if fn == "max" else np.minimum(a, b)
    arg = args[0]
    if fn == "abs":
        return np.abs(arg)
    if fn == "relu":
        return np.maximum(arg, np.zeros((), dtype=arg.dtype))
    x = np.asarray(arg, dtype=_FLOAT)  # the math functions make floats of integers
    if fn == "exp":
        return np.exp(x)
    if fn == "log":
        return np.log(x)
    if fn == "sqrt":
        return np.sqrt(x)
    if fn == "rsqrt":
        return 1.0 / np.sqrt(x)
    if fn == "recip":
        return 1.0 / x
    if fn == "tanh":
        return np.tanh(x)
    raise ValueError(f"unknown function {fn!r}")


# ---------------------------------------------------------------- comparison


def compare(expected: np.ndarray, actual: np.ndarray, dtype: DType) -> tuple[bool, float, float]:
    """Whether `actual` matches the reference `expected`, with the largest errors.

    Integers must match exactly. Floats pass when, elementwise,
    `|actual - expected| <= atol * scale + rtol * |expected|`, with `scale` the largest
    finite `|expected|` in the tensor (1 if it is all zeros) and (rtol, atol) from
    `TOLERANCES`: f32 (1e-4, 1e-5), f16 (1e-2, 1e-3), bf16 (5e-2, 1e-2). Scaling atol by
    the tensor's magnitude accepts the cancellation error of a reordered reduction in
    elements near zero without making the check vacuous for small-valued tensors (softmax
    outputs are ~1e-6). NaN must match NaN and infinities must match exactly.
    The relative error divides by `max(|expected|, atol * scale)`, so zeros do not blow it up.
    A shape mismatch fails with infinite errors.
    """
    exp_arr, act_arr = np.asarray(expected), np.asarray(actual)
    if exp_arr.shape != act_arr.shape:
        return False, math.inf, math.inf
    if exp_arr.size == 0:
        return True, 0.0, 0.0
    if not dtype.is_float:
        diff = np.abs(exp_arr.astype(np.int64) - act_arr.astype(np.int64)).astype(_FLOAT)
        rel = diff / np.maximum(np.abs(exp_arr.astype(_FLOAT)), 1.0)
        return bool(diff.max() == 0), float(diff.max()), float(rel.max())
    return _compare_floats(exp_arr.astype(_FLOAT), act_arr.astype(_FLOAT), dtype)


def _compare_floats(e: _Array, a: _Array, dtype: DType) -> tuple[bool, float, float]:
    rtol, atol = TOLERANCES[dtype]
    finite = np.isfinite(e) & np.isfinite(a)
    specials_match = bool(np.all(finite | (np.isnan(e) & np.isnan(a)) | (e == a)))
    finite_e = np.abs(e[np.isfinite(e)])
    scale = float(finite_e.max()) if finite_e.size and finite_e.max() > 0 else 1.0
    diff = np.abs(a[finite] - e[finite])
    if diff.size == 0:
        return specials_match, 0.0 if specials_match else math.inf, 0.0
    floor = atol * scale
    passed = specials_match and bool(np.all(diff <= floor + rtol * np.abs(e[finite])))
    rel = diff / np.maximum(np.abs(e[finite]), floor)
    max_abs, max_rel = float(diff.max()), float(rel.max())
    if not specials_match:
        max_abs, max_rel = math.inf, math.inf
    return passed, max_abs, max_rel
