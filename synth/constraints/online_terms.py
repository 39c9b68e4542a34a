"""The online rewrite's terms in the one cost model (see `synth.constraints.online`).

A kernel that runs online (`KernelSpec.online`) has its own constraint group `online`:
the inner dimensions of its pass are whole in every compute tile (at each step the
running maximum of a row sees the whole row of scores), and the pass is not split across
units (running statistics are not combined). Its price: each statement of the pass runs
over its own points only (not over the kernel's full product of dimensions), and at each
step over the pass dimension every row pays the rescale: the previous maximum kept, one
subtract, multiply and exp for the factor, and one multiply per element of each sum it
corrects (`rescale_cost`); the previous maximum is a tile of the rows in the innermost
memory (`footprint`). Its saving is not a term: the scores and exponentials of the pass
are local to the kernel, so they are never stored or moved.
"""

from __future__ import annotations

from collections import Counter

from synth.constraints import expr as ex
from synth.constraints.cost import KernelTerms
from synth.constraints.space import NamedConstraint, SlotKind
from synth.workload import Statement


def online_constraints(kt: KernelTerms) -> list[NamedConstraint]:
    """The group `online` of an online kernel (nothing for the others)."""
    plan = kt.kernel.online
    if plan is None:
        return []
    out = []
    innermost = len(kt.slots) - 1
    name, where = kt.kernel.name, kt.slots[innermost].name
    for dim in plan.inner:
        ext = kt.factors.extents[(name, dim)]
        out.append(NamedConstraint(
            "online", f"kernel {name}: {dim} whole in every {where} tile (each step of the "
            f"running maximum {plan.target} sees whole rows)",
            ex.Cmp(kt.f(dim, innermost), "==", ext)))
    for slot, kind in enumerate(kt.slots):
        factor = kt.f(plan.dim, slot)
        if kind.kind is SlotKind.SPATIAL and factor != ex.ONE:
            out.append(NamedConstraint(
                "online", f"kernel {name}: the pass over {plan.dim} runs in one {kind.name} "
                f"unit (running statistics are not combined across units)",
                ex.Cmp(factor, "==", ex.ONE)))
    return out


def statement_points(kt: KernelTerms, stmt: Statement) -> ex.Int:
    """Points of `stmt` one innermost unit runs: its own dimensions only."""
    return ex.mul(*(kt.dim_product(d, kt.temporal()) for d in stmt.dims))


def row_steps(kt: KernelTerms) -> ex.Int:
    """Rows times steps over the pass dimension one innermost unit runs: how many times
    a row's running maximum moves."""
    plan = kt.kernel.online
    assert plan is not None
    innermost = len(kt.slots) - 1
    steps = [s for s in kt.temporal() if s != innermost]
    return ex.mul(*(kt.dim_product(r, kt.temporal()) for r in plan.rows),
                  kt.dim_product(plan.dim, steps))


def rescale_ops(kt: KernelTerms) -> Counter[str]:
    """Operations per row per step: keep the previous maximum, the factor
    exp(c (m_new - m_old)) (a subtract, a multiply, an exp), and one multiply per element
    of each corrected sum in that row."""
    plan = kt.kernel.online
    assert plan is not None
    elements = 0
    for target in plan.rescaled:
        stmt = next(s for s in kt.kernel.statements if s.target == target)
        extents = [kt.kernel.extents[d] for d in stmt.indices if d in plan.inner]
        elements += ex.evaluate(ex.mul(*(ex.const(n) for n in extents)), {})
    return Counter({"mov": 1, "add": 1, "exp": 1, "mul": 1 + elements})


def rescale_cost(kt: KernelTerms) -> ex.Int:
    plan = kt.kernel.online
    assert plan is not None
    stmt = next(s for s in kt.kernel.statements if s.name == plan.statement)
    return ex.mul(kt.hw.compute.point_ps(rescale_ops(kt), stmt.dtype), row_steps(kt))


def core_compute(kt: KernelTerms, point_ps: dict[str, ex.Int]) -> ex.Int:
    """The pass's compute: each core statement at its cost per point (`point_ps`, by
    statement name) over its own points, and the rescale."""
    return ex.add(*(ex.mul(point_ps[s.name], statement_points(kt, s))
                    for s in kt.kernel.core), rescale_cost(kt))


def footprint(kt: KernelTerms, itemsize: int) -> ex.Int:
    """Bytes of the previous maximum kept beside the running one in the innermost
    memory (the rows of one compute tile)."""
    plan = kt.kernel.online
    if plan is None:
        return ex.ZERO
    innermost = len(kt.slots) - 1
    return ex.mul(itemsize, *(kt.tile(r, innermost) for r in plan.rows))
