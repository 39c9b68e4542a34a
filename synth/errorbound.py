"""How far a correct float evaluation of a workload may be from the exact result: the
error scale validation's tolerances are made of.

Validation compares a schedule's outputs with the reference (`synth.reference`), which
computes in float64. A schedule computes in float32 (or f16, bf16), in whatever order
its loops and combines choose, so its outputs differ from the reference by rounding
errors. How large those are depends on the computation: on how many terms a sum
accumulates and on their magnitudes, not on the result's (a sum of large terms that
cancels to nearly zero keeps an error as large as the terms'), and on how each operation
amplifies the errors of its operands (`exp` of a value known to 1e-3 is known to 0.1%).
The reference therefore evaluates, next to every value, the scale `sigma` of the error a
correct evaluation in the workload's dtypes makes, by propagating rounding errors
through the workload's statements (running error analysis, Higham, *Accuracy and
Stability of Numerical Algorithms*, 2nd ed., 2002, sections 3.3 and 3.5), and a
tolerance is `LAMBDA * sigma` (plus the reference's own rounding).

Rounding errors are treated as independent random variables with mean zero, each at most
`u |r|` for a result r (u is the dtype's unit roundoff; a variance of `(u r)^2` is an upper
bound of the uniform distribution's `(u r)^2 / 3`): the model of probabilistic rounding
error analysis (Higham and Mary, "A New Approach to Probabilistic Rounding Error
Analysis", SIAM J. Sci. Comput. 41(5), 2019; "Sharper Probabilistic Backward Error
Analysis for Basic Linear Algebra Kernels with Random Data", SIAM J. Sci. Comput. 42(5),
2020), under which the error of a sum of n terms grows like sqrt(n), not n as in the
worst case. Worst-case bounds are far too loose to validate anything: on a transformer
block they exceed the outputs themselves, since they assume every error in every
matrix product aligns, and every such product feeds the next; with them a schedule that
drops a unit's share of a sum would pass.

Per node, the error is split in two parts, because a reduction treats them differently:

- `ind`, a variance: errors that differ between the terms of the statement's reduction
  (the roundings of each term's own arithmetic, and the errors of tensors indexed by
  every reduced index). A reduction adds them in quadrature: sum_k ind_k.
- `coh`, a standard deviation: errors common to every term (those of tensors the terms
  read along fewer indices, e.g. the maximum subtracted in a softmax, and float
  literals' roundings). A reduction adds them linearly, as if they all aligned:
  (sum_k coh_k)^2.

The rules, first order in the errors (derivatives at the reference's values):

- a + b: both parts add; a * b: `b^2 ind_a + a^2 ind_b`, `|b| coh_a + |a| coh_b`; a / b:
  by the derivatives 1/b and a/b^2; f(x): by |f'(x)| (exp, log, sqrt, rsqrt, recip,
  tanh; abs and relu keep the error; max and min keep the larger). Every result is then
  rounded: `ind += (u r)^2`, with `FUNCTION_ULPS` ulps for exp, log and tanh.
- A sum of n terms t_k with value S adds to the terms' errors the roundings of its n - 1
  additions, each of a partial sum: in any order of summation over random data, the
  squares of the partial sums add up to at most about `n (sum t_k^2 + S^2)` (a partial
  sum is a random part of the terms: its square averages k/n sum t_k^2 + (k/n)^2 S^2),
  so the roundings add `u^2 n (sum t_k^2 + S^2)`: an error scale of n^1.5 u mean|t| for
  terms of one sign and n u rms(t) for terms of mixed signs (sqrt(n) u relative to such a
  sum's typical size, sqrt(n) rms(t)), where the worst case is n^2 u mean|t|.
- A product reduction adds relative errors, a maximum or minimum adds none.
- A value whose interval `v +- LAMBDA sigma` leaves a function's domain (log, sqrt,
  rsqrt or recip of a value that may cross zero) or the dtype's range gets an infinite
  sigma: nothing can be checked there, any answer is as right as the reference's.

`LAMBDA` = 8: for a normal error, a deviation past 8 sigma has probability 1.2e-15 per
element, and the variances above overestimate the uniform rounding's by a factor of 3.
What the model assumes can fail for data chosen to round the same way every time (adding
one constant that is not exact in binary millions of times); validation's inputs are
random (`reference.make_inputs`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from synth.workload import DType

__all__ = ["FUNCTION_ULPS", "LAMBDA", "Err", "Precision", "of", "precision"]

FUNCTION_ULPS = 4.0
"""Accuracy of exp, log and tanh in ulps: synth's DPU math library (`dpu_math.c`) is tested
within 4 ulps (tests/test_emit_upmem.py); glibc's and LLVM's are within 1-2."""

LAMBDA = 8.0
"""How many error scales (sigma) a tolerance allows (see the module docstring)."""

_Array = np.ndarray
_ZERO = np.zeros(())


@dataclass(frozen=True)
class Precision:
    """The arithmetic of one float dtype: its unit roundoff `u` (half an ulp of 1), its
    smallest normal number `tiny` (the most an underflowing result loses, also with
    subnormals flushed to zero), and its largest finite number."""

    u: float
    tiny: float
    largest: float


_PRECISIONS = {
    DType.F32: Precision(2.0**-24, 2.0**-126, float(np.finfo(np.float32).max)),
    DType.F16: Precision(2.0**-11, 2.0**-14, float(np.finfo(np.float16).max)),
    DType.BF16: Precision(2.0**-8, 2.0**-126, float(np.finfo(np.float32).max)),
}
FLOAT64_U = 2.0**-53
"""The unit roundoff of the reference's own float64 arithmetic."""


def of(dtype: DType) -> Precision:
    return _PRECISIONS[dtype]


def precision(dtypes: set[DType]) -> Precision:
    """The least precise of the float dtypes a statement touches (f32 when none is a
    float: integer operands of a float function are converted to float)."""
    floats = [_PRECISIONS[d] for d in dtypes if d.is_float]
    return max(floats, key=lambda p: p.u) if floats else _PRECISIONS[DType.F32]


@dataclass(frozen=True)
class Err:
    """The error of a value (arrays broadcastable to it): `ind`, the variance of the
    part that differs between a reduction's terms, `coh`, the scale of the part common to
    them (see the module docstring)."""

    ind: _Array = field(default_factory=lambda: _ZERO)
    coh: _Array = field(default_factory=lambda: _ZERO)

    def sigma(self) -> _Array:
        return np.sqrt(self.ind + self.coh * self.coh)

    def scaled(self, factor: _Array) -> Err:
        """The error of `factor * x` (a derivative: first order)."""
        return Err(self.ind * factor * factor, self.coh * np.abs(factor))

    def plus(self, other: Err) -> Err:
        return Err(self.ind + other.ind, self.coh + other.coh)


EXACT = Err()


def rounded(p: Precision, value: _Array, err: Err, ulps: float = 0.5) -> Err:
    """`err` after the result `value` is rounded, to `ulps` ulps (one ulp is at most 2u
    relative; a correctly rounded operation is half an ulp, u)."""
    step = 2 * ulps * p.u * np.abs(value) + p.tiny
    return Err(err.ind + step * step, err.coh)


def bounded(p: Precision, value: _Array, err: Err) -> Err:
    """`err`, infinite where `value +- LAMBDA sigma` may overflow the dtype."""
    reach = np.abs(value) + LAMBDA * err.sigma()
    return Err(np.where(reach <= p.largest, err.ind, np.inf), err.coh)


def inside(err: Err, margin: _Array) -> Err:
    """`err`, infinite where `LAMBDA sigma` reaches past `margin` (the distance from a
    function's argument to the edge of its domain)."""
    return Err(np.where(LAMBDA * err.sigma() < margin, err.ind, np.inf), err.coh)


# ---------------------------------------------------------------- operations


def add(p: Precision, value: _Array, a: Err, b: Err) -> Err:
    return rounded(p, value, a.plus(b))


def mul(p: Precision, a: _Array, b: _Array, value: _Array, ea: Err, eb: Err) -> Err:
    return rounded(p, value, ea.scaled(b).plus(eb.scaled(a)))


def div(p: Precision, a: _Array, b: _Array, value: _Array, ea: Err, eb: Err) -> Err:
    """`a / b`: unbounded where b may be 0 within its error."""
    with np.errstate(divide="ignore", invalid="ignore"):
        safe = np.where(b != 0, b, 1.0)
        err = ea.scaled(1 / safe).plus(eb.scaled(a / (safe * safe)))
    return bounded(p, value, rounded(p, value, inside(err, np.abs(b))))


def function(p: Precision, fn: str, x: _Array, value: _Array, e: Err) -> Err:
    """`fn(x)` = `value` with x's error `e`: scaled by the derivative, then rounded."""
    if fn in ("abs", "relu"):
        return e  # exact, and 1-Lipschitz
    with np.errstate(all="ignore"):
        positive = np.where(x > 0, x, 1.0)
        if fn == "exp":
            return bounded(p, value, rounded(p, value, e.scaled(value), FUNCTION_ULPS))
        if fn == "tanh":
            return rounded(p, value, e.scaled(1 - value * value), FUNCTION_ULPS)
        if fn == "log":
            return rounded(p, value, inside(e.scaled(1 / positive), x), FUNCTION_ULPS)
        if fn == "sqrt":
            return rounded(p, value, inside(e.scaled(0.5 / np.sqrt(positive)), x))
        if fn == "rsqrt":  # a square root, then a division: two roundings
            slope = 0.5 / (positive * np.sqrt(positive))
            return bounded(p, value, rounded(p, value, inside(e.scaled(slope), x), 1.0))
        if fn == "recip":
            safe = np.where(x != 0, x, 1.0)
            return bounded(p, value, rounded(p, value, inside(e.scaled(1 / (safe * safe)),
                                                              np.abs(x))))
    raise ValueError(f"no error model for function {fn!r}")


def converted(p: Precision, value: _Array) -> Err:
    """The error of converting integers to the float type (exact below 2^(p+1))."""
    step = p.u * np.abs(np.asarray(value, dtype=np.float64))
    return Err(step * step, _ZERO)


# ---------------------------------------------------------------- reductions


@dataclass(frozen=True)
class Terms:
    """What a reduction's error needs of its terms, per element of its target: for `+=`,
    `squares` = sum t_k^2, `ind` = sum of the terms' `ind`, `coh` = sum of their `coh`;
    for `*=`, the sums of the relative parts (`ind / t^2`, `coh / |t|`); for `max=` and
    `min=`, the largest sigma in `coh` (the others zero)."""

    squares: _Array
    ind: _Array
    coh: _Array

    def __add__(self, other: Terms) -> Terms:
        return Terms(self.squares + other.squares, self.ind + other.ind, self.coh + other.coh)


def summed(p: Precision, steps: int, value: _Array, terms: Terms, start: Err | None,
           start_value: _Array) -> Err:
    """A sum's error: its terms' errors (independent parts in quadrature, common parts
    linearly), its start's, and the roundings of its `steps` additions (docstring)."""
    squares = terms.squares + start_value * start_value
    rounding = p.u * p.u * steps * (squares + value * value) + steps * p.tiny * p.tiny
    err = Err(terms.ind + rounding, terms.coh)
    return err if start is None else err.plus(start)


def multiplied(p: Precision, steps: int, value: _Array, terms: Terms) -> Err:
    """A product's error from its terms' relative errors and `steps` roundings."""
    relative = Err(terms.ind + steps * p.u * p.u, terms.coh)
    return relative.scaled(value)
