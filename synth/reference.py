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

`evaluate_errors` also computes, next to every float value, the scale of the error a
correct evaluation in the workload's dtypes makes (`synth.errorbound`: it grows with how
many terms each sum accumulates and with their magnitudes), and `compare` allows an
output `errorbound.LAMBDA` such scales (`tolerance`). Integers must match exactly.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from typing import NamedTuple

import numpy as np

from synth import errorbound as eb
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

__all__ = ["CHUNK_ELEMENTS", "Comparison", "compare", "evaluate", "evaluate_errors",
           "make_inputs", "tolerance"]

CHUNK_ELEMENTS = 1 << 25
"""The most elements one broadcast block holds (32M: 256 MB per float64 intermediate)."""

_Array = np.ndarray
_FLOAT = np.float64
_INT = np.int32

# ---------------------------------------------------------------- inputs


def make_inputs(workload: Workload, seed: int = 0) -> dict[str, np.ndarray]:
    """Deterministic random values for every input, drawn in declaration order.

    Floats are uniform in [-1, 1); integers are in [1, 3], small and nonzero so that
    products and sums stay far from overflow at the built-in sizes and `/` is safe.
    A workload whose validation cannot fit this machine's memory is bad input.
    """
    check_memory(workload)
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


WORKING_COPIES = 3
"""Float64 arrays per tensor element that validating holds at once: the reference's value,
its error scale and the interpreter's (temporaries are dropped no earlier)."""


def check_memory(workload: Workload) -> None:
    """Validating needs its tensors in float64, `WORKING_COPIES` times: more than this
    machine's physical memory is bad input (exit 2), not a crash deep in NumPy."""
    needed = WORKING_COPIES * 8 * sum(math.prod(t.shape) for t in workload.tensors.values())
    try:
        physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not a POSIX system: let NumPy decide
        return
    if needed > physical:
        raise InputError(f"validating workload '{workload.name}' needs about "
                         f"{needed / 2**30:.3g} GiB (its tensors in float64, "
                         f"{WORKING_COPIES} copies), more than this machine's "
                         f"{physical / 2**30:.3g} GiB; rerun with --no-validate or with "
                         f"smaller sizes (--set)")


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
    return _evaluate(workload, inputs, None)


def evaluate_errors(workload: Workload, inputs: Mapping[str, np.ndarray]
                    ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Every tensor's value (as `evaluate`) and, for every float tensor a statement
    assigns, the scale of the error a correct evaluation in the workload's dtypes makes
    of it, in any order of its reductions (`synth.errorbound`: float64 arrays of the
    tensor's shape; inputs are exact). `compare` takes an output's."""
    sigmas: dict[str, np.ndarray] = {}
    return _evaluate(workload, inputs, sigmas), sigmas


def _evaluate(workload: Workload, inputs: Mapping[str, np.ndarray],
              sigmas: dict[str, _Array] | None) -> dict[str, np.ndarray]:
    values = _checked_inputs(workload, inputs)
    with np.errstate(all="ignore"):  # wrap-around, inf and nan are the defined semantics
        for stmt in workload.statements:
            tensor = workload.tensors[stmt.target]
            new = _run(tensor, stmt, values)
            if sigmas is not None:
                sigma = _sigma(workload, tensor, stmt, values, sigmas, new)
                if sigma is not None:
                    sigmas[stmt.target] = sigma
            values[stmt.target] = new
    return values


def rhs_of(stmt: Statement, values: Mapping[str, _Array]) -> _Array:
    """The right-hand side reduced over the statement's reduced indices, over its target."""
    rhs = _product_rhs(stmt, values)
    return _broadcast_rhs(stmt, values) if rhs is None else rhs


def _run(tensor: Tensor, stmt: Statement, values: Mapping[str, _Array]) -> _Array:
    """`target = op(start, reduce_op over the reduced indices of expr)`, stored in its dtype."""
    rhs = rhs_of(stmt, values)
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
    spec, shape = _einsum_spec(stmt, accesses)
    if is_float:
        result = np.einsum(spec, *[a.astype(_FLOAT) for a in arrays], optimize=True) * scale
    else:
        result = _exact_int_einsum(spec, arrays, int(scale), stmt)
    return np.asarray(result).reshape(shape)


def _einsum_spec(stmt: Statement, accesses: list[Access]) -> tuple[str, list[int]]:
    """The `np.einsum` subscripts of a sum of products of `accesses` over the target's
    indices, and the shape of the result over the target (1 for unused indices)."""
    alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
    letters = {index: alphabet[n] for n, index in enumerate(stmt.dims)}
    present = {i for a in accesses for i in a.indices}
    out = [i for i in stmt.indices if i in present]
    spec = ",".join("".join(letters[i] for i in a.indices) for a in accesses)
    spec += "->" + "".join(letters[i] for i in out)
    return spec, [stmt.extents[i] if i in present else 1 for i in stmt.indices]


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
    """Reads accesses as arrays laid out along the statement's dimensions (1 where unused),
    and their errors (`sigmas`: none for exact tensors, see `synth.errorbound`)."""

    def __init__(self, stmt: Statement, values: Mapping[str, _Array], rows: slice | None,
                 sigmas: Mapping[str, _Array] | None = None):
        self.dims = stmt.dims
        self.reduced = stmt.reduced
        self.values = values
        self.rows = rows
        self.sigmas = sigmas or {}

    def access(self, access: Access) -> _Array:
        array = self._laid_out(access, np.asarray(self.values[access.tensor]))
        return array.astype(_FLOAT) if _is_float(array) else _wrap32(array)

    def error(self, access: Access) -> eb.Err:
        """The access's error: independent between a reduction's terms when it is indexed
        by every reduced index, else common to them (see `synth.errorbound`)."""
        found = self.sigmas.get(access.tensor)
        if found is None:
            return eb.EXACT
        sigma = self._laid_out(access, found)
        if all(i in access.indices for i in self.reduced):
            return eb.Err(sigma * sigma, _ZERO)
        return eb.Err(_ZERO, sigma)

    def _laid_out(self, access: Access, array: _Array) -> _Array:
        if self.rows is not None and self.dims[0] in access.indices:
            selector = [slice(None)] * array.ndim
            selector[access.indices.index(self.dims[0])] = self.rows
            array = array[tuple(selector)]
        order = sorted(range(len(access.indices)), key=lambda k: self.dims.index(access.indices[k]))
        array = array.transpose(order)
        used = set(access.indices)
        shape = [array.shape[sorted(used, key=self.dims.index).index(d)] if d in used else 1
                 for d in self.dims]
        return array.reshape(shape)


# ---------------------------------------------------------------- error scales


_ZERO = np.zeros(())
_Rhs = eb.Err | eb.Terms  # an assignment's error, or what a reduction's is made of


def _sigma(workload: Workload, tensor: Tensor, stmt: Statement,
           values: Mapping[str, _Array], sigmas: Mapping[str, _Array],
           new: _Array) -> _Array | None:
    """The error scale (sigma, see `synth.errorbound`) of the target's `new` value; None
    for an integer target (integers are exact). `values` and `sigmas` are from before."""
    if not tensor.dtype.is_float:
        return None
    p = eb.precision({workload.tensors[t].dtype for t in (stmt.target, *stmt.inputs)})
    value = np.asarray(new, dtype=_FLOAT)
    terms = _product_terms(stmt, values, sigmas, p)
    rhs = _broadcast_terms(stmt, values, sigmas, p) if terms is None else terms
    err = rhs if isinstance(rhs, eb.Err) else _reduced_err(stmt, p, rhs, value, values, sigmas)
    target = eb.of(tensor.dtype)
    err = eb.bounded(target, value, eb.rounded(target, value, err))
    sigma = np.broadcast_to(err.sigma(), tensor.shape)
    return np.where(np.isnan(sigma), np.inf, sigma)  # NaN: nothing is known there


def _reduced_err(stmt: Statement, p: eb.Precision, terms: eb.Terms, value: _Array,
                 values: Mapping[str, _Array], sigmas: Mapping[str, _Array]) -> eb.Err:
    """A reduction's error from its terms and its start: the target's value before it
    when it accumulates (with that value's error), else the exact identity."""
    count = math.prod(stmt.extents[i] for i in stmt.reduced)
    steps = count - 1 + int(stmt.accumulates)  # the additions (multiplications) it makes
    start = np.asarray(values[stmt.target], dtype=_FLOAT) if stmt.accumulates else _ZERO
    start_sigma = sigmas.get(stmt.target, _ZERO) if stmt.accumulates else _ZERO
    if stmt.op is ReduceOp.ADD:
        return eb.summed(p, steps, value, terms, eb.Err(start_sigma ** 2), start)
    if stmt.op is ReduceOp.MUL:
        with np.errstate(all="ignore"):
            relative = start_sigma / np.abs(start) if stmt.accumulates else _ZERO
        return eb.multiplied(p, steps, value, eb.Terms(
            terms.squares, terms.ind + relative ** 2, terms.coh))
    return eb.Err(_ZERO, np.maximum(terms.coh, start_sigma))  # max= and min= are exact


def _spans(stmt: Statement, access: Access) -> bool:
    """Whether an access is indexed by every reduced index: its errors then differ
    between the reduction's terms (else they are common to several)."""
    return all(i in access.indices for i in stmt.reduced)


def _product_terms(stmt: Statement, values: Mapping[str, _Array],
                   sigmas: Mapping[str, _Array], p: eb.Precision) -> eb.Terms | None:
    """A float `+=` of a product of factors: its terms' sums by `np.einsum` (as
    `_product_rhs`); None when the statement is not one."""
    factors = _product_factors(stmt.expr)
    if stmt.op is not ReduceOp.ADD or factors is None:
        return None
    accesses = [f for f in factors if isinstance(f, Access)]
    arrays = [np.asarray(values[a.tensor], dtype=_FLOAT) for a in accesses]
    constants = [f.value for f in factors if isinstance(f, Num | SizeRef)]
    if not accesses or not (any(isinstance(c, float) for c in constants)
                            or any(_is_float(np.asarray(values[a.tensor])) for a in accesses)):
        return None
    spec, shape = _einsum_spec(stmt, accesses)
    scale = float(math.prod(constants))
    squares = np.einsum(spec, *[a * a for a in arrays], optimize=True) * scale * scale
    # each term's own roundings: its len(factors) - 1 multiplications, the literal's
    ind = (len(factors) - 1) ** 2 * p.u * p.u * squares
    literal = p.u if any(isinstance(c, float) for c in constants) else 0.0
    coh = literal * np.einsum(spec, *[np.abs(a) for a in arrays], optimize=True) * abs(scale)
    for k, access in enumerate(accesses):
        sigma = sigmas.get(access.tensor)
        if sigma is None:
            continue
        if _spans(stmt, access):  # sum_k (sigma * the other factors)^2
            others = [sigma * sigma if j == k else a * a for j, a in enumerate(arrays)]
            ind = ind + np.einsum(spec, *others, optimize=True) * scale * scale
        else:  # common to the terms: sum_k sigma * |the other factors|
            others = [sigma if j == k else np.abs(a) for j, a in enumerate(arrays)]
            coh = coh + np.einsum(spec, *others, optimize=True) * abs(scale)
    return eb.Terms(*(np.asarray(x).reshape(shape) for x in (squares, ind, coh)))


def _broadcast_terms(stmt: Statement, values: Mapping[str, _Array],
                     sigmas: Mapping[str, _Array], p: eb.Precision) -> _Rhs:
    """As `_broadcast_rhs`, block by block: an assignment's error, or a reduction's sums."""
    dims = stmt.dims
    total = math.prod(stmt.extents[d] for d in dims)
    if not dims or total <= CHUNK_ELEMENTS:
        return _block_terms(stmt, values, sigmas, p, None)
    first = dims[0]
    rows = max(1, CHUNK_ELEMENTS // (total // stmt.extents[first]))
    parts = [_block_terms(stmt, values, sigmas, p, slice(lo, lo + rows))
             for lo in range(0, stmt.extents[first], rows)]
    if first in stmt.indices:  # blocks of the target: side by side
        if isinstance(parts[0], eb.Err):
            errs = [e for e in parts if isinstance(e, eb.Err)]
            return eb.Err(*(np.concatenate([np.asarray(getattr(e, f)) for e in errs], axis=0)
                            for f in ("ind", "coh")))
        sums = [t for t in parts if isinstance(t, eb.Terms)]
        return eb.Terms(*(np.concatenate([getattr(t, f) for t in sums], axis=0)
                          for f in ("squares", "ind", "coh")))
    sums = [t for t in parts if isinstance(t, eb.Terms)]  # blocks of the reduction: combined
    if stmt.op in (ReduceOp.MAX, ReduceOp.MIN):
        return eb.Terms(_ZERO, _ZERO, np.maximum.reduce([t.coh for t in sums]))
    total_terms = sums[0]
    for part in sums[1:]:
        total_terms = total_terms + part
    return total_terms


def _block_terms(stmt: Statement, values: Mapping[str, _Array], sigmas: Mapping[str, _Array],
                 p: eb.Precision, rows: slice | None) -> _Rhs:
    """`_block`'s error: an assignment's per element of the block, or the sums over its
    reduced indices that a reduction's error is made of (`errorbound.Terms`)."""
    dims = stmt.dims
    shape = [stmt.extents[d] for d in dims]
    if rows is not None:
        shape[0] = len(range(*rows.indices(shape[0])))
    value, err = _eval_err(stmt.expr, _Env(stmt, values, rows, sigmas), p)
    if not _is_float(value):
        err = eb.converted(p, value)  # integer terms, accumulated in floats
    value = np.broadcast_to(np.asarray(value, dtype=_FLOAT), shape)
    ind, coh = np.broadcast_to(err.ind, shape), np.broadcast_to(err.coh, shape)
    axes = tuple(range(len(stmt.indices), len(dims)))
    if not axes and not stmt.accumulates:
        return eb.Err(np.array(ind), np.array(coh))
    # a reduction, or `+=` (`*=`, ...) element by element: a reduction of one term per
    # element, which adds the target's value before it (and its error) to that term
    if stmt.op is ReduceOp.ADD:
        return eb.Terms(np.sum(value * value, axis=axes), np.sum(ind, axis=axes),
                        np.sum(coh, axis=axes))
    if stmt.op is ReduceOp.MUL:  # relative errors
        with np.errstate(all="ignore"):
            relative = np.sum(ind / (value * value), axis=axes)
            return eb.Terms(np.zeros_like(relative), relative,
                            np.sum(coh / np.abs(value), axis=axes))
    largest = np.max(np.sqrt(ind + coh * coh), axis=axes)
    return eb.Terms(np.zeros_like(largest), np.zeros_like(largest), largest)


def _eval_err(expr: Expr, env: _Env, p: eb.Precision) -> tuple[_Array, eb.Err]:
    """`_eval`'s value of one node, and the error a correct evaluation in precision `p`
    makes of it (`synth.errorbound`). Integers are exact."""
    if isinstance(expr, Num) and isinstance(expr.value, float):
        value = np.asarray(expr.value, dtype=_FLOAT)
        return value, eb.Err(_ZERO, p.u * np.abs(value))  # one rounding, the same everywhere
    if isinstance(expr, Num | SizeRef):
        return _eval(expr, env), eb.EXACT
    if isinstance(expr, Access):
        return env.access(expr), env.error(expr)
    if isinstance(expr, Neg):
        value, err = _eval_err(expr.arg, env, p)
        return np.negative(value), err
    if isinstance(expr, BinOp):
        (a, ea), (b, eb_) = _eval_err(expr.lhs, env, p), _eval_err(expr.rhs, env, p)
        value = _binop(expr.op, a, b)
        if not _is_float(value):
            return value, eb.EXACT
        ea, eb_ = _as_float(p, a, ea), _as_float(p, b, eb_)
        if expr.op in ("+", "-"):
            return value, eb.add(p, value, ea, eb_)
        if expr.op == "*":
            return value, eb.mul(p, a, b, value, ea, eb_)
        return value, eb.div(p, np.asarray(a, dtype=_FLOAT), np.asarray(b, dtype=_FLOAT),
                              value, ea, eb_)
    args = [_eval_err(arg, env, p) for arg in expr.args]
    value = _call(expr.fn, [a for a, _ in args])
    if not _is_float(value):
        return value, eb.EXACT
    errs = [_as_float(p, a, e) for a, e in args]
    if expr.fn in ("max", "min"):
        return value, eb.Err(np.maximum(errs[0].ind, errs[1].ind),
                             np.maximum(errs[0].coh, errs[1].coh))
    return value, eb.function(p, expr.fn, np.asarray(args[0][0], dtype=_FLOAT), value, errs[0])


def _as_float(p: eb.Precision, value: _Array, err: eb.Err) -> eb.Err:
    """An operand's error once it is a float: an integer is rounded when converted."""
    return err if _is_float(value) else eb.converted(p, value)


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


class Comparison(NamedTuple):
    """How an output compares with the reference."""

    passed: bool
    max_abs_err: float  # over the checked elements
    max_rel_err: float  # |actual - expected| / max(|expected|, tolerance)
    used: float  # the largest |actual - expected| / tolerance: 1.0 is the limit
    unchecked: int  # elements whose bound is infinite (any answer is as right there)


def tolerance(expected: np.ndarray, sigma: np.ndarray | None, dtype: DType) -> np.ndarray:
    """How far an output of `dtype` may be from the reference `expected`, elementwise:
    `LAMBDA` error scales (`sigma` from `evaluate_errors`, see `synth.errorbound`; None:
    no arithmetic error, e.g. a copy), plus the reference's own error: its rounding to
    `dtype` (at most u |expected|, and the underflow step), and its float64 arithmetic
    (the same propagation at u = 2^-53: sigma x 2^-53 / u)."""
    p = eb.of(dtype)
    magnitude = np.abs(np.asarray(expected, dtype=_FLOAT))
    magnitude = np.where(np.isfinite(magnitude), magnitude, 0.0)  # specials: exactly
    scale = np.zeros_like(magnitude) if sigma is None else np.asarray(sigma, dtype=_FLOAT)
    with np.errstate(all="ignore"):
        return eb.LAMBDA * scale * (1 + eb.FLOAT64_U / p.u) + p.u * magnitude + p.tiny


def compare(expected: np.ndarray, actual: np.ndarray, dtype: DType,
            sigma: np.ndarray | None = None) -> Comparison:
    """Whether `actual` matches the reference `expected`, with the largest errors.

    Integers must match exactly. Floats pass when, elementwise, `|actual - expected|`
    is within `tolerance(expected, bound, dtype)`: the error bound `evaluate_errors`
    computed for the output, which grows with how many terms each element accumulates
    and with their magnitudes (`synth.errorbound`), plus the reference's own rounding.
    Where the bound is infinite the element is not checked (counted in `unchecked`).
    Elsewhere NaN must match NaN and infinities must match exactly. A shape mismatch
    fails with infinite errors.
    """
    exp_arr, act_arr = np.asarray(expected), np.asarray(actual)
    if exp_arr.shape != act_arr.shape:
        return Comparison(False, math.inf, math.inf, math.inf, 0)
    if exp_arr.size == 0:
        return Comparison(True, 0.0, 0.0, 0.0, 0)
    if not dtype.is_float:
        diff = np.abs(exp_arr.astype(np.int64) - act_arr.astype(np.int64)).astype(_FLOAT)
        rel = diff / np.maximum(np.abs(exp_arr.astype(_FLOAT)), 1.0)
        worst = float(diff.max())
        return Comparison(worst == 0, worst, float(rel.max()), math.inf if worst else 0.0, 0)
    tol = tolerance(exp_arr, sigma, dtype).reshape(exp_arr.shape)
    return _compare_floats(exp_arr.astype(_FLOAT), act_arr.astype(_FLOAT), tol)


def _compare_floats(e: _Array, a: _Array, tol: _Array) -> Comparison:
    checked = np.isfinite(tol)
    finite = np.isfinite(e) & np.isfinite(a) & checked
    special = checked & ~(np.isfinite(e) & np.isfinite(a))
    specials_match = bool(np.all((np.isnan(e) & np.isnan(a)) | (e == a) | ~special))
    unchecked = int(tol.size - np.count_nonzero(checked))
    if not specials_match:
        return Comparison(False, math.inf, math.inf, math.inf, unchecked)
    diff, allowed = np.abs(a[finite] - e[finite]), tol[finite]
    if diff.size == 0:
        return Comparison(True, 0.0, 0.0, 0.0, unchecked)
    used = diff / allowed
    rel = diff / np.maximum(np.abs(e[finite]), allowed)
    return Comparison(bool(np.all(diff <= allowed)), float(diff.max()), float(rel.max()),
                      float(used.max()), unchecked)
