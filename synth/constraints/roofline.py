"""CPU terms of the cost model: vector registers, dependence chains and caches that
overlap with compute (`compute.vector_tiles = true` and memories with `overlap = true`;
the `cpu` model).

What the emitted C does (`synth.emit.c`), and so what is priced here:

- The innermost memory is the vector register file. A statement that iterates the
  kernel's vector dimension (`synth.vectors.vector_dim`) and has a vector form runs in
  vector instructions when its register tile along that dimension is whole vectors
  (a multiple of the lanes); otherwise, and for the other statements, one element per
  instruction (`whole_vectors`, `point_ps`).
- A multiply feeding an accumulation is one FMA (`compute.fused_multiply_add`).
- A reduction updates each accumulator once per step, and an update waits for the
  previous one (`compute.accumulate_latency` cycles). The independent accumulators are
  the register tile's elements of the target (and, reduced along the vector dimension,
  one per lane of the tile's vectors: the emitter keeps a vector accumulator per vector
  of the tile). Fewer independent accumulators than latency x issue rate make the chain,
  not the issue rate, the bound (`chain_ps`): a 1 x 16 register tile of a GEMM runs at
  a fraction of the FMA throughput a 6 x 32 one reaches (as BLIS's micro-kernels show).
- Caches are filled by the hardware while the core computes: a kernel takes the longest
  of its compute and its overlapping transfers, not their sum (`overlapped_parts`), with
  a share of a cache's fills (its `exposed`) added to the compute side: the fills hide
  behind compute only in part (`cpu_compute.exposed_cost`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from synth.constraints import expr as ex
from synth.hardware import Compute
from synth.vectors import vectorisable
from synth.workload import BinOp, ReduceOp, Statement, Workload, op_classes


def vector_ops(stmt: Statement, compute: Compute) -> Counter[str]:
    """The operations of one point of `stmt`, with a multiply that feeds the accumulation
    fused into it (one FMA, priced as the multiply) where the hardware has FMA."""
    ops = op_classes(stmt.expr)
    if not fused(stmt, compute):
        ops[stmt.op.op_class] += 1
    return ops


def fused(stmt: Statement, compute: Compute) -> bool:
    """Whether `stmt` accumulates a product by FMA (`compute.fused_multiply_add`)."""
    return (compute.fused_multiply_add and stmt.op is ReduceOp.ADD
            and isinstance(stmt.expr, BinOp) and stmt.expr.op == "*")


def point_ps(stmt: Statement, compute: Compute, lanes: int) -> int:
    """Picoseconds per point of `stmt` at `lanes` elements per instruction."""
    return compute.point_ps(vector_ops(stmt, compute), stmt.dtype, lanes)


def lanes(stmt: Statement, vector: str | None, workload: Workload, compute: Compute) -> int:
    """Elements per instruction of `stmt` when the register tile is whole vectors: its
    dtype's lanes if it iterates the vector dimension and has a vector form, else 1."""
    dtypes = {name: t.dtype for name, t in workload.tensors.items()}
    if vector is None or vector not in stmt.dims or not vectorisable(stmt, dtypes):
        return 1
    return compute.lanes.get(stmt.dtype.value, 1)


def whole_vectors(tile: ex.Int, width: int, domains: Mapping[str, tuple[int, ...]]
                  ) -> ex.Cond | bool:
    """The register tile along the vector dimension is a whole number of vectors:
    exactly when the emitted code takes its vector path (`KernelWriter.vectorised`).
    Known before solving when every candidate of the tile agrees, as the space makes
    them (`space.whole_vector_candidates`); else a condition on the tile."""
    if width <= 1:
        return True
    if isinstance(tile, ex.Const):
        return tile.value % width == 0
    if isinstance(tile, ex.Var) and tile.name in domains:
        verdicts = {v % width == 0 for v in domains[tile.name]}
        if len(verdicts) == 1:
            return verdicts.pop()
    return ex.fold(ex.Cmp(ex.mod(tile, width), "==", ex.ZERO))


def register_bytes(compute: Compute) -> int:
    """Bytes of one vector register: the widest lanes of a 4-byte dtype."""
    return 4 * max((compute.lanes.get(d, 1) for d in ("f32", "i32")), default=1)


def accumulate_ps(stmt: Statement, compute: Compute) -> int:
    """Picoseconds one accumulator waits between updates (0: not modelled): a dependent
    FMA's latency where a multiply is fused into the update (`vector_ops`), else, for a
    sum, maximum or minimum, a dependent add's (`add_latency`, which defaults to
    `accumulate_latency`). On AMD Zen 5 an FMA waits 4 cycles, an add or a max 2: a
    maximum in one vector accumulator ran at 2.1 cycles per update (RESULTS.md, "Max as
    one instruction")."""
    dtype = stmt.dtype.value
    cycles = compute.accumulate_latency.get(dtype, 0.0)
    one_op = stmt.op in (ReduceOp.ADD, ReduceOp.MAX, ReduceOp.MIN) and not fused(stmt, compute)
    if one_op and cycles:
        cycles = compute.add_latency.get(dtype, cycles)
    return round(cycles * 1e12 / compute.clock_hz)


def overlapped_parts(compute: ex.Int, transfers: Mapping[str, ex.Int]) -> dict[str, ex.Int]:
    """The exposed time of transfers that run beside compute, part by part: each part is
    what it adds to the longest of compute and the parts before it, so the parts and
    compute sum to max(compute, every transfer), and a part the compute hides is 0."""
    out: dict[str, ex.Int] = {}
    longest = compute
    for key, term in transfers.items():
        grown = ex.maximum(longest, term)
        out[key] = ex.add(grown, ex.mul(-1, longest))
        longest = grown
    return out
