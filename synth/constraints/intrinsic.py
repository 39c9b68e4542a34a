"""Matrix intrinsics (`[compute.intrinsic]`): the decision `pack.<kernel>` and its
constraint family `intrinsic`, for a kernel whose contractions may run on the hardware's
matrix instruction (see docs/architecture.md, "Matrix intrinsics")."""

from __future__ import annotations

import dataclasses

from synth.constraints import expr as ex
from synth.constraints.cost import KernelTerms, _is_one, statement_ops, tile_points
from synth.constraints.space import NamedConstraint
from synth.hardware import Intrinsic
from synth.workload import Access, BinOp, ReduceOp, Statement


def pack_decision(kernel: str) -> str:
    """`pack.C#2` is 1 when kernel C#2's contractions run on the matrix intrinsic."""
    return f"pack.{kernel}"


def contraction(stmt: Statement) -> tuple[str, str, str] | None:
    """(m, n, k) when `stmt` is `C[.., m, n] += A[.., m, k] * B[.., k, n]` (operands either
    way round, either index order), the form a matrix intrinsic computes, batched over
    the target's leading indices (`..`: each in one operand or both, as a head's scores
    `sc[b, h, i, j] += Q[b, h, i, e] * K[b, h, j, e]` or a projection into heads
    `q[h, s, e] += x[s, d] * Wq[d, h, e]`, one product per head); else None."""
    expr = stmt.expr
    if (stmt.op is not ReduceOp.ADD or len(stmt.reduced) != 1 or len(stmt.indices) < 2
            or not isinstance(expr, BinOp) or expr.op != "*"
            or not isinstance(expr.lhs, Access) or not isinstance(expr.rhs, Access)
            or len(set(stmt.indices)) != len(stmt.indices)):
        return None
    *leading, m, n = stmt.indices
    k = stmt.reduced[0]
    batch = frozenset(leading)
    lhs, rhs = (frozenset(a.indices) for a in (expr.lhs, expr.rhs))
    if (any(len(set(a.indices)) != len(a.indices) for a in (expr.lhs, expr.rhs))
            or not batch <= lhs | rhs):
        return None
    operands = {lhs - batch, rhs - batch}
    return (m, n, k) if operands == {frozenset((m, k)), frozenset((k, n))} else None


def packable(kt: KernelTerms) -> tuple[tuple[Statement, Intrinsic], ...]:
    """Each core contraction of the kernel with the intrinsic for its dtype: all of them
    (an online kernel's two, s = Q K^T and o += p V, included), or none when one has no
    intrinsic for its dtype. One decision (`pack.<kernel>`) covers them all: the emitters
    write every contraction of a kernel alike (tt-lang: each a block product `a @ b`;
    MLIR: a linalg op whatever the decision, see `with_pack_choice`), and on a tiled core
    every matmul runs on the matrix engine anyway (`dst.tiled_constraints`), so a choice
    per contraction would only add decisions that cannot differ."""
    found = [s for s in kt.kernel.core if contraction(s) is not None]
    intrinsics = kt.hw.compute.intrinsics
    if not found or any(s.dtype.value not in intrinsics for s in found):
        return ()
    return tuple((s, intrinsics[s.dtype.value]) for s in found)


def with_pack_choice(kt: KernelTerms, domains: dict[str, tuple[int, ...]]) -> KernelTerms:
    """A 0/1 decision (added to `domains`) when the kernel's contractions may run on the
    hardware's matrix intrinsic: packed, the compute tile of each one's m, n and k is a
    multiple of the intrinsic's block and each of its points costs the intrinsic's share;
    its operand tiles are laid out in blocks each time they move into the innermost
    memory (`pack_cost`). The decision prices; the MLIR emitter writes the same linalg
    ops either way (transform.mlir has no pack: the layout is left to the AIE lowering),
    tt-lang writes every contraction as a block product."""
    if not packable(kt):
        return kt
    name = pack_decision(kt.kernel.name)
    domains[name] = (0, 1)
    return dataclasses.replace(kt, packed=ex.Var(name))


def intrinsic_constraints(kt: KernelTerms) -> list[NamedConstraint]:
    """Packed, the compute tile of each contraction's m, n and k is a multiple of the
    intrinsic's block (once per dimension and block, however many contractions share it)."""
    found = packable(kt)
    if not found or kt.packed is None:
        return []
    innermost = len(kt.slots) - 1
    out: dict[tuple[str, int], NamedConstraint] = {}
    for stmt, intrinsic in found:
        roles = contraction(stmt)
        assert roles is not None
        shape = f"{intrinsic.m}x{intrinsic.n}x{intrinsic.k}"
        for dim, block in zip(roles, (intrinsic.m, intrinsic.n, intrinsic.k), strict=True):
            if (dim, block) in out:
                continue
            fits = ex.Cmp(ex.mod(kt.tile(dim, innermost), block), "==", ex.ZERO)
            out[(dim, block)] = NamedConstraint(
                "intrinsic", f"kernel {kt.kernel.name}: packed, the compute tile of {dim} is "
                f"a multiple of {block} (contraction {stmt.name}, {shape} intrinsic)",
                ex.AnyOf((ex.Cmp(kt.packed, "==", ex.ZERO), fits)))
    return list(out.values())


def pack_cost(kt: KernelTerms) -> ex.Int:
    """Packed: each operand tile of a contraction is laid out in blocks when it moves into
    the innermost memory (and the result laid back when it moves out), per element, at
    the intrinsic of the contraction that first uses the tensor (local tensors, such as
    an online kernel's p, never move)."""
    found = packable(kt)
    if not found or kt.packed is None:
        return ex.ZERO
    per_tensor: dict[str, Intrinsic] = {}
    for stmt, intrinsic in found:
        for t in (stmt.target, *stmt.inputs):
            per_tensor.setdefault(t, intrinsic)
    moves = [ex.scale(tile_points(kt, kt.kernel.use(t), kt.kernel.use(t).indices),
                      (int(kt.kernel.use(t).read) + int(kt.kernel.use(t).written))
                      * intrinsic.pack_ps(kt.hw.compute.clock_hz))
             for t, intrinsic in per_tensor.items() if not kt.kernel.use(t).local]
    return ex.select(_is_one(kt.packed), ex.add(*moves), 0)


def statement_point_ps(kt: KernelTerms, packed: bool) -> dict[str, ex.Int]:
    """Cost of one point of each core statement (by name), its contraction on the
    intrinsic when `packed`."""
    on_intrinsic = {s.name: i for s, i in packable(kt)} if packed else {}
    return {s.name: ex.const(on_intrinsic[s.name].point_ps(kt.hw.compute.clock_hz)
                             if s.name in on_intrinsic
                             else kt.hw.compute.point_ps(statement_ops(s), s.dtype))
            for s in kt.kernel.core}


def packed_point_ps(kt: KernelTerms) -> int:
    """Cost of one point with each contraction on the intrinsic."""
    return sum(ex.evaluate(ps, {}) for ps in statement_point_ps(kt, True).values())
