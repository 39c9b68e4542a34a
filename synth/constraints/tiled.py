"""Transfers and buffers in whole tiles (models with `tile`: Tenstorrent, `synth.tiles`).

A tiled core moves and holds blocks of whole E x E tiles: one copy per block (one NoC
read or write of its tiles), and a block's bytes are its tiles' bytes, E*E elements each,
whatever of the tile the tensor uses. A matrix block of whole tiles is as many bytes as
its elements; a column statistic (`m[i]` of a matrix's rows, one value per row in column
0 of its tiles) moves and holds a whole tile per E rows: E times its elements' bytes, and
a row of tiles (`g[d]`) likewise; a scalar one tile. So per tensor the bytes are its
elements' bytes times a constant, `tile_scale` = E^2 / (the elements per tile along each
index it is tiled along, `synth.tiles.tile_units`; 1 along a batch index): the same terms
as an untiled transfer, scaled, so the solver sees no new variables. Tiles moved are what
`synth.tiles.block_tiles` counts (`dst.model_dram_tiles`, the emitted kernel and the
simulator's DRAM tile counts).

Built on `cost`'s terms; `cost.tensor_transfer_cost`, `cost.first_transfer_cost` and
`cost.buffer_bytes` call in here on a tiled model.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING

from synth.constraints import cost  # cost calls in here: its names are looked up at call time
from synth.constraints import expr as ex
from synth.constraints.space import TensorUse
from synth.hardware import Memory
from synth.ir.dataflow import IDENTITY
from synth.workload import Num, Workload

if TYPE_CHECKING:
    from synth.constraints.cost import KernelTerms


def tile_scale(kt: KernelTerms, use: TensorUse) -> Fraction:
    """Bytes a block of `use` takes in tiles over the bytes of its elements: E^2 over the
    elements per tile along each of its indices (1 along a batch index)."""
    edge = kt.hw.compute.tiling.edge
    units = kt.kernel.tile_units(edge)
    per_tile = 1
    for d in use.indices:
        per_tile *= units.get(d, 1)
    return Fraction(edge * edge, per_tile)


def _scaled(term: ex.Int, scale: Fraction) -> ex.Int:
    """`term` x `scale`, exact: every block is whole tiles (the `tile` constraints), so a
    fractional scale (a tensor tiled along three indices) divides the elements exactly."""
    scaled = ex.mul(term, scale.numerator)
    return scaled if scale.denominator == 1 else ex.exact_div(scaled, scale.denominator)


def tiled_transfer_cost(kt: KernelTerms, use: TensorUse, mem: Memory, slot: int,
                        itemsize: int) -> ex.Int:
    """Time one unit spends moving `use`'s blocks between `mem` and its parent: a copy
    per block (latency each) and the tiles' bytes. Per dimension of the tensor, (times
    moved) x (block extent) is one product of its factors, as `cost.tensor_transfer_cost`
    writes it."""
    counted, optional = cost.transfer_loops(kt, use, slot, mem.cache)
    inner = set(kt.inner(slot))
    partials = kt.partials(slot, use)
    common = ex.mul(partials, *optional,
                    *(kt.dim_product(d, counted[d] | inner) for d in use.indices[:-1]),
                    *(kt.dim_product(d, counted[d]) for d in kt.kernel.dims
                      if d not in use.indices))
    last = (kt.dim_product(use.indices[-1], counted[use.indices[-1]] | inner)
            if use.indices else ex.ONE)
    moved = _scaled(ex.mul(itemsize, last), tile_scale(kt, use))
    operations = ex.mul(partials, cost.transfer_count(kt, use, slot))
    return ex.add(ex.mul(cost._latency_ps(mem, use), operations),
                  ex.scale(moved, _per_byte(mem, use), common))


def _per_byte(mem: Memory, use: TensorUse) -> int:
    if not use.written or not mem.store_ps_per_byte:
        return mem.ps_per_byte * (int(use.read) + int(use.written))
    return mem.ps_per_byte * int(use.read) + mem.store_ps_per_byte


def block_bytes(kt: KernelTerms, use: TensorUse, slot: int, itemsize: int) -> ex.Int:
    """Bytes one block of `use` takes in the memory at `slot`: its tiles' (one per batch
    index, whole tiles along the tiled ones), per separate partial result."""
    elements = ex.mul(itemsize, *(kt.tile(d, slot) for d in use.indices))
    return ex.mul(kt.partials(slot, use), _scaled(elements, tile_scale(kt, use)))


def first_block_cost(kt: KernelTerms, use: TensorUse, mem: Memory, slot: int,
                     itemsize: int) -> ex.Int:
    """One move of `use`'s block: `tiled_transfer_cost / transfer_count`, a copy per
    partial result and the block's tiles' bytes."""
    return ex.add(ex.mul(cost._latency_ps(mem, use), kt.partials(slot, use)),
                  ex.mul(_per_byte(mem, use), block_bytes(kt, use, slot, itemsize)))


# ---------------------------------------------------------------- dataflow buffers


@dataclass(frozen=True)
class DataflowTerms:
    """The dataflow buffers of a kernel on a tiled core beyond one per tensor (what
    `synth.ir.dataflow.kernel_buffers` derives from the loop nest and the tt-lang
    emitter declares): their number and bytes as terms over the decisions."""

    count: ex.Int  # all of the kernel's buffers, one per tensor included
    extra_bytes: ex.Int  # the X_in, X_out and X_acc buffers' bytes
    fixed: tuple[str, ...]  # X_in / X_out names, for the constraints' meaning
    maybe: tuple[str, ...]  # X_acc names: present when a loop accumulates into X


def dataflow_terms(kt: KernelTerms, workload: Workload) -> DataflowTerms:
    """Per tensor of the innermost memory (`synth.ir.dataflow`): `X_in` (its block count)
    when it is loaded and computed into, `X_out` when it is stored and read by one of the
    kernel's statements, `X_acc` (two blocks) when a core statement accumulates into it
    inside a loop its block is resident across; for an online kernel, its running
    maximum's `X_cur` and `X_scale` (a block each)."""
    slot = len(kt.slots) - 1
    mem = kt.hw.memories[-1]
    kernel = kt.kernel
    targets = {s.target for s in kernel.statements}
    read = {t for s in kernel.statements for t in s.inputs}
    count: list[ex.Int] = [ex.const(len(kt.resident(slot)))]
    extra: list[ex.Int] = []
    fixed: list[str] = []
    maybe: list[str] = []
    for use in kt.resident(slot):
        block = block_bytes(kt, use, slot, cost.element_bytes(kt, workload, use, mem))
        blocks = ex.ONE if use.local else kt.buffered.get(slot, ex.ONE)
        rmw = use.read and not use.local and use.tensor in targets
        roles = [("in", rmw), ("out", use.written and not use.local and use.tensor in read)]
        for role, present in roles:
            if present:
                count.append(ex.ONE)
                extra.append(ex.mul(block, blocks))
                fixed.append(f"{use.tensor}_{role}")
        looped = accumulated(kt, use, slot, rmw, workload)
        if looped is not False:
            count.append(ex.select(looped, 1, 0))
            extra.append(ex.select(looped, ex.mul(2, block), 0))
            maybe.append(f"{use.tensor}_acc")
    plan = kernel.online
    if plan is not None:  # the online step's X_cur and X_scale (`synth.emit.ttlang_online`)
        running = kernel.use(plan.target)
        block = block_bytes(kt, running, slot, cost.element_bytes(kt, workload, running, mem))
        count.append(ex.const(2))
        extra.append(ex.mul(2, block))
        fixed += [f"{plan.target}_cur", f"{plan.target}_scale"]
    return DataflowTerms(ex.add(*count), ex.add(*extra) if extra else ex.ZERO,
                         tuple(fixed), tuple(maybe))


def accumulated(kt: KernelTerms, use: TensorUse, slot: int, rmw: bool,
                workload: Workload) -> ex.Cond | bool:
    """Whether a core statement of the kernel accumulates into `use` inside a loop that
    its block is resident across (a sequential loop over a dimension it is not indexed
    by, with no later loop walking it: `cost.copy_loops`), its block started by a load
    (`rmw`), the identity or a statement `X = 0`: the accumulator pattern."""
    kernel = kt.kernel
    if not any(s.target == use.tensor for s in kernel.core):
        return False
    constants = [s.expr.value for s in kernel.statements
                 if s.target == use.tensor and isinstance(s.expr, Num)
                 and any(o.target == use.tensor and o.accumulates for o in workload.statements)]
    reductions = [s.op.value for s in kernel.core if s.target == use.tensor and s.accumulates]
    if any(IDENTITY.get(op) != value for value in constants for op in reductions[:1]):
        return True  # `C = 1; C += ...`: the sum starts from a block that is not the identity
    starts = rmw or constants or any(kernel.initialised(s) for s in kernel.core
                                     if s.target == use.tensor)
    if not starts:
        return False
    optional = cost.copy_loops(kt.slots, kernel, slot).optional
    conds: list[ex.Cond | bool] = []
    for pos, loop in enumerate(optional):
        if loop.dim in use.indices:
            continue
        steps = ex.greater_than_one(kt.f(loop.dim, loop.slot))
        if steps is False:
            continue
        # no later loop walks the tensor: their factors' product is 1 (factors are >= 1)
        later = ex.mul(*(kt.f(lp.dim, lp.slot) for lp in optional[pos + 1:]
                         if lp.dim in use.indices))
        if later == ex.ONE:
            conds.append(steps)
        else:  # steps and later == 1
            conds.append(ex.Cmp(ex.select(steps, later, 0), "==", ex.ONE))
    return ex.any_of(conds)
