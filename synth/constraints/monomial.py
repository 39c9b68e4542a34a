"""Products of tile factors as powers of two: what CP-SAT propagates through exponents.

A tile factor takes values that are mostly powers of two (the divisors of a power-of-two
extent, the units of a level), and the cost model's terms are mostly monomials in them:
a loop's trip count is an extent divided by a product of factors, a tile's bytes a
product of factors times the element size. Lowered as chains of multiplication
equalities, CP-SAT learns only bounds from a product, and the lower bound of a sum of
such products is loose: proving a GEMM's 15 factors optimal on upmem took 4.6
deterministic seconds, most of it after the optimum was found. Over exponents a
monomial is linear: c * 2^s with s = sum k_v e_v, where e_v = log2 v. So each such term
becomes one linear exponent `s` and one element constraint giving its value from `s`
(exact, propagated both ways), and the tiling of a dimension (its factors' product is
the extent) is a linear equation over exponents. The same GEMM is proved in 0.3.

`Monomial` is the algebra; `cpsat.Lowering` uses it for every term that is one (a
product or exact quotient of constants and power-of-two decisions) and lowers the rest
as before.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from synth.constraints import expr as ex


@dataclass(frozen=True)
class Monomial:
    """coef * 2^(sum of k * e_v over `exponents`), e_v the base-2 logarithm of v."""

    coef: Fraction
    exponents: tuple[tuple[str, int], ...]  # (decision, k), sorted, no k of 0

    @staticmethod
    def of(coef: Fraction, exponents: dict[str, int]) -> Monomial:
        return Monomial(coef, tuple(sorted((n, k) for n, k in exponents.items() if k)))

    def times(self, other: Monomial, sign: int = 1) -> Monomial:
        """This times `other` (sign 1) or divided by it (sign -1)."""
        exponents = dict(self.exponents)
        for name, k in other.exponents:
            exponents[name] = exponents.get(name, 0) + sign * k
        coef = self.coef * other.coef if sign > 0 else self.coef / other.coef
        return Monomial.of(coef, exponents)

    def value(self, s: int) -> Fraction:
        """The monomial's value where its exponent sum is `s`."""
        return self.coef * Fraction(2) ** s


def log2(value: int) -> int | None:
    """The base-2 logarithm of a positive power of two, else None."""
    return value.bit_length() - 1 if value > 0 and not value & (value - 1) else None


class Analysis:
    """Which terms are monomials in the decisions named in `powers` (those whose every
    value is a power of two), memoised by term; every exact quotient met is recorded
    (`quotients`) so its divisibility can be required even where it cancels out of a
    larger monomial ((E / P) * P is E, but E / P must still be whole)."""

    def __init__(self, powers: set[str], fixed: dict[str, int]) -> None:
        self.powers = powers
        self.fixed = fixed  # decisions with one value
        self._memo: dict[ex.Int, Monomial | None] = {}
        self.quotients: list[Monomial] = []

    def monomial(self, term: ex.Int) -> Monomial | None:
        if term not in self._memo:
            self._memo[term] = self._analyse(term)
        return self._memo[term]

    def _analyse(self, term: ex.Int) -> Monomial | None:
        if isinstance(term, ex.Const):
            return Monomial.of(Fraction(term.value), {}) if term.value > 0 else None
        if isinstance(term, ex.Var):
            if term.name in self.powers:
                return Monomial.of(Fraction(1), {term.name: 1})
            value = self.fixed.get(term.name)
            return Monomial.of(Fraction(value), {}) if value is not None and value > 0 else None
        if isinstance(term, ex.Prod):
            product = Monomial.of(Fraction(1), {})
            for factor in term.factors:
                found = self.monomial(factor)
                if found is None:
                    return None
                product = product.times(found)
            return product
        if isinstance(term, ex.ExactDiv):
            num, den = self.monomial(term.num), self.monomial(term.den)
            if num is None or den is None:
                return None
            quotient = num.times(den, -1)
            self.quotients.append(quotient)
            return quotient
        return None
