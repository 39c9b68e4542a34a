"""Tiles shared by the units of one memory instance (`share.<kernel>.<tensor>`).

Where the innermost memory belongs to units of one level but each instance serves the
units of an outer one (UPMEM: WRAM tiles are a tasklet's, the WRAM is the DPU's), an
operand tile that is the same for every unit of the levels in between (its index does
not depend on their loops: no factor of its dimensions above 1 there) can be held once
per instance instead of once per unit: FlashAttention written by hand on UPMEM keeps one
block of keys and values in WRAM for all the tasklets of a DPU, each tasklet its own rows.

Such a tile is loaded by one unit while the others wait: a barrier of the units (all
done with the previous tile), the load, a barrier (the tile is there). So, per instance,
it moves once each time it changes (not once per unit), at one unit's issue rate and the
memory's latency and bandwidth, and the barriers and the load are not hidden by the
other units' work (they all wait); its bytes count once per instance in the memory's
capacity. The decision is per tensor and kernel: `share.<kernel>.<tensor>` = 1 forces
the factors of the tensor's dimensions at those levels to 1 (group `share`), and is
chosen only where the units are several (`implied`). Only read-only operands qualify:
a tile the units write would need their writes ordered too.

Built on `synth.constraints.cost`; the materialiser marks the buffer
(`ir.nodes.BufferDecl.shared`), the verifier and prover count it once per instance, the
interpreter holds and loads it once for the sharing units, and `--emit upmem` writes one
WRAM array with the load between barriers. Only the innermost memory, where it is neither
a cache nor double buffered (the price assumes transfers that do not overlap).
"""

from __future__ import annotations

import dataclasses

from synth.constraints import expr as ex
from synth.constraints.cost import (
    KernelTerms,
    _is_one,
    tensor_transfer_cost,
    transfer_count,
    transfer_loops,
)
from synth.constraints.space import NamedConstraint, TensorUse
from synth.workload import Workload

SHARE_PREFIX = "share."


def share_decision(kernel: str, tensor: str) -> str:
    """`share.s_m_p_l_o.K` is 1 when kernel s_m_p_l_o's units share one tile of K."""
    return f"{SHARE_PREFIX}{kernel}.{tensor}"


def sharing_slots(kt: KernelTerms) -> list[int]:
    """The spatial slots whose units share an instance of the innermost memory (UPMEM:
    the tasklets, under the DPU's WRAM); empty where each unit has its own."""
    innermost = len(kt.slots) - 1
    mem = kt.hw.memory(kt.slots[innermost].name)
    instance = kt.hw.level_index(mem.instance_level)
    return kt.spatial_between(instance, kt.hw.level_index(mem.level))


def shareable(kt: KernelTerms) -> list[TensorUse]:
    """The kernel's operands that may be shared: read only, moving (not local), and with
    a dimension of the kernel they are not indexed by that the sharing units may split
    (otherwise sharing would leave those units nothing to split)."""
    slots = sharing_slots(kt)
    mem = kt.hw.memory(kt.slots[len(kt.slots) - 1].name)
    if (not slots or kt.hw.compute.tiling.edge or kt.hw.compute.vector_tiles
            or kt.buffered or mem.overlap):  # (priced where transfers do not overlap)
        return []
    out = []
    for use in kt.kernel.uses:
        if use.written or use.local or not use.indices:
            continue
        free = [d for d in kt.kernel.dims if d not in use.indices
                and any(kt.f(d, s) != ex.ONE for s in slots)]
        if free:
            out.append(use)
    return out


def with_share_choices(kt: KernelTerms, domains: dict[str, tuple[int, ...]]
                       ) -> KernelTerms:
    """A 0/1 decision (added to `domains`) per shareable operand of the kernel."""
    shared: dict[str, ex.Int] = {}
    for use in shareable(kt):
        name = share_decision(kt.kernel.name, use.tensor)
        domains[name] = (0, 1)
        shared[use.tensor] = ex.Var(name)
    return dataclasses.replace(kt, shared=shared)


def shared_tile(kt: KernelTerms, use: TensorUse, slot: int) -> ex.Cond | bool:
    """Whether `use`'s tile in the memory at `slot` is one per instance (shared)."""
    term = kt.shared.get(use.tensor)
    if term is None or slot != len(kt.slots) - 1:
        return False
    return _is_one(term)


def share_constraints(kt: KernelTerms) -> list[NamedConstraint]:
    """Group `share`: a shared tile is the same for every sharing unit, so none of them
    splits a dimension the tensor is indexed by; `implied`: sharing is chosen only where
    the units are several (one unit alone gains nothing, and pays the barriers)."""
    out = []
    slots = sharing_slots(kt)
    for tensor, term in kt.shared.items():
        use = kt.kernel.use(tensor)
        off = ex.Cmp(term, "==", ex.ZERO)
        for dim in use.indices:
            for slot in slots:
                factor = kt.f(dim, slot)
                if factor == ex.ONE:
                    continue
                out.append(NamedConstraint(
                    "share", f"kernel {kt.kernel.name}: a {tensor} tile shared by the "
                    f"{kt.slots[slot].name} units is theirs alike (no split of {dim} "
                    f"across them)", ex.AnyOf((off, ex.Cmp(factor, "==", ex.ONE)))))
        several = ex.greater_than_one(ex.mul(*(kt.units(s) for s in slots)))
        if not isinstance(several, bool):
            out.append(NamedConstraint(
                "implied", f"kernel {kt.kernel.name}: {tensor} is shared only by several "
                "units", ex.AnyOf((off, several))))
    return out


def shared_bytes(kt: KernelTerms, use: TensorUse, tile: ex.Int) -> tuple[ex.Int, ex.Int]:
    """`tile` (one tile's bytes in the innermost memory) split into what counts once per
    unit and what counts once per instance, by the sharing decision of `use`."""
    term = kt.shared.get(use.tensor)
    if term is None:
        return tile, ex.ZERO
    return (ex.select(_is_one(term), 0, tile), ex.select(_is_one(term), tile, 0))


def shared_cost(kt: KernelTerms, workload: Workload) -> ex.Int:
    """Per instance, every move of each shared tile: one unit issues it alone (the
    memory's `issue` per operation at the level's issue share) and waits its latency and
    bytes, between two barriers of the sharing units; nothing hides it (the others wait
    at the barrier)."""
    if not kt.shared:
        return ex.ZERO
    innermost = len(kt.slots) - 1
    mem = kt.hw.memory(kt.slots[innermost].name)
    share = kt.hw.levels[kt.hw.level_index(mem.level)].issue_share
    alone = dataclasses.replace(mem, latency_ps=mem.latency_ps + mem.issue_ps * share)
    total = []
    for tensor, term in kt.shared.items():
        use = kt.kernel.use(tensor)
        itemsize = workload.tensors[tensor].dtype.itemsize
        parts = [tensor_transfer_cost(kt, use, alone, innermost, itemsize),
                 *(ex.mul(2, b) for b in _barriers(kt, use))]
        # a select per part: each takes fewer values (the z3 backend's one-hot)
        total += [ex.select(_is_one(term), part, 0) for part in parts]
    return ex.add(*total)


def _barriers(kt: KernelTerms, use: TensorUse) -> list[ex.Int]:
    """One barrier of the units sharing `use`'s tile each time it moves: the level's
    fixed cost per move, and its cost per unit meeting per move (`combines.barrier_cost`).
    Units times moves is written per dimension as one product of its factors, as
    `tensor_transfer_cost` writes moves times tile (the units over the dimensions the
    tensor is not indexed by: its own are 1 there when it is shared), which keeps the
    term's values few and its bounds tight."""
    innermost = len(kt.slots) - 1
    counted, optional = transfer_loops(kt, use, innermost)
    out: list[ex.Int] = []
    for slot in sharing_slots(kt):
        level = kt.hw.levels[kt.slots[slot].level_index]
        met = ex.mul(*optional, *(kt.dim_product(d, counted[d] | {slot})
                                  if d not in use.indices else kt.dim_product(d, counted[d])
                                  for d in kt.kernel.dims))
        out += [ex.mul(level.barrier_ps, transfer_count(kt, use, innermost)),
                ex.mul(level.barrier_per_unit_ps, met)]
    return out
