"""Combining partial results of a reduction split across units: on the host
(`combine_cost`), or on the device where the units share a memory below the root
(`combine.<kernel>.<level>` decisions: a barrier, then one unit folds every unit's
partial tile into the parent memory's tile). Builds on `synth.constraints.cost`."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence

from synth.constraints import expr as ex
from synth.constraints.cost import (
    KernelTerms,
    Model,
    _is_one,
    _parent_slot,
    reduced_into,
    transfer_count,
)
from synth.constraints.space import NamedConstraint, SlotKind, TensorUse
from synth.hardware import Hardware, Memory
from synth.workload import Workload


def combine_decision(kernel: str, level: str) -> str:
    """`combine.s.tasklet` is 1 when kernel s combines its tasklets' partials on device."""
    return f"combine.{kernel}.{level}"


def with_combine_choices(kt: KernelTerms, domains: dict[str, tuple[int, ...]]
                         ) -> KernelTerms:
    """A 0/1 decision (added to `domains`) for each spatial slot where the kernel may
    combine partial results on the device instead of on the host."""
    combined: dict[int, ex.Int] = {}
    for slot in device_combine_slots(kt):
        name = combine_decision(kt.kernel.name, kt.slots[slot].name)
        domains[name] = (0, 1)
        combined[slot] = ex.Var(name)
    return dataclasses.replace(kt, combined=combined)


def combine_cost(kt: KernelTerms, workload: Workload) -> ex.Int:
    """Combining partial results on the host: one op per partial per output element (and
    an online kernel's rescale of its partial running statistics, `host_merge_cost`)."""
    total: list[ex.Int] = []
    spatial = [i for i, s in enumerate(kt.slots) if s.kind is SlotKind.SPATIAL]
    for stmt in kt.kernel.statements:
        if not stmt.reduced:
            continue
        partials = ex.mul(*(kt.split_units(s, stmt.reduced) for s in spatial))
        tensor = workload.tensors[stmt.target]
        per_elem = kt.hw.host.point_ps(Counter({stmt.op.op_class: 1}), stmt.dtype)
        elements = 1
        for n in tensor.shape:
            elements *= n
        total.append(ex.select(ex.greater_than_one(partials),
                               ex.mul(per_elem, elements, partials), 0))
    if kt.kernel.online is not None:  # its running statistics' partials rescaled too
        from synth.constraints.online_terms import host_merge_cost  # builds on this module
        total.append(host_merge_cost(kt, workload))
    return ex.add(*total)


def shared_memory(hw: Hardware, level_index: int) -> Memory | None:
    """The innermost memory below the root that the units of a level share (UPMEM:
    tasklets share their DPU's WRAM), or None: where their partial results can meet."""
    shared = [m for m in hw.memories[1:] if hw.shares_instance(m, level_index)]
    return shared[-1] if shared else None


def host_merges(hw: Hardware, level_index: int) -> bool:
    """Whether the units of a level below the root hand their partial results to the host
    over its parallel pushes (a memory below the root moved by `push`, owned by units of
    this level or of one inside it: UPMEM's MRAM, so ranks and DPUs) and share no memory
    below the root: the host then merges them (for an online kernel's running statistics,
    `ir.nodes.OnlineCombine` on the host, which `--emit upmem` writes)."""
    pushed = [m for m in hw.memories[1:] if m.push is not None]
    return (level_index > 0 and shared_memory(hw, level_index) is None
            and any(level_index <= hw.level_index(m.level) for m in pushed))


def device_combine_slots(kt: KernelTerms) -> dict[int, Memory]:
    """Spatial slots whose units share a memory below the root, with that memory:
    partial results split across these units can meet there, after a barrier, instead of
    travelling to the host."""
    if not kt.kernel.reduced:
        return {}
    out: dict[int, Memory] = {}
    root = kt.hw.root_memory.name
    for index, slot in enumerate(kt.slots):
        memory = shared_memory(kt.hw, slot.level_index)
        # and a memory tile above the units to fold into: not when they stream the
        # root's, nor when the memory just outside them is the root, which holds whole
        # tensors, not tiles (aie without `streams`: a column's cores under DDR; mv
        # combined them there with no tile to fold into, and four cores wrote one
        # partial tile: benchmarks/RESULTS.md, "Fuzz seed 67")
        outside = [s for s in kt.slots[:index] if s.kind is SlotKind.TEMPORAL]
        above = bool(outside) and outside[-1].name != root
        if slot.kind is SlotKind.SPATIAL and memory is not None and above:
            out[index] = memory
    return out


def device_combine_memory(model: Model, slot: int) -> str:
    """The memory an on-device combine at spatial `slot` goes through."""
    memory = shared_memory(model.hw, model.slots[slot].level_index)
    assert memory is not None, "a combine decision exists only where units share a memory"
    return memory.name


def combines_on_device(kt: KernelTerms, slot: int, dims: Sequence[str]) -> ex.Cond | bool:
    """Whether the units of spatial `slot` combine partials of a reduction over `dims` on
    the device: chosen so, and more than one of them holds a share of `dims` (one unit
    alone has nothing to combine, and the loop nest then has no combine)."""
    on_device = kt.combined.get(slot)
    if on_device is None or not dims:
        return False
    several = ex.select(ex.greater_than_one(kt.units(slot, dims)), 1, 0)
    return _is_one(ex.select(_is_one(on_device), several, 0))


def exchanged_on_device(kt: KernelTerms, use: TensorUse, slot: int) -> ex.Cond | bool:
    """Whether `use`'s tile at memory `slot` does not move with each unit's own transfers:
    it is exchanged with an on-device combine buffer (in the same memory) instead of
    moving from its parent (it holds partials of a reduction whose units, between the
    parent and this memory, combine on device), or it is one tile shared by the units
    of the memory's instance, moved once per instance (`sharing.shared_cost`)."""
    from synth.constraints.sharing import shared_tile  # builds on cost, as this does
    reduced = reduced_into(kt.kernel, use)
    parent = _parent_slot(kt, slot)
    return ex.any_of([*(combines_on_device(kt, s, reduced) for s in kt.combined
                        if parent < s < slot), shared_tile(kt, use, slot)])


def device_combine_cost(kt: KernelTerms, workload: Workload) -> ex.Int:
    """Per combined slot and reduced tensor: each time the parent memory's tile is done,
    a barrier, then one unit alone (at 1/issue_share of the pipeline) folds every unit's
    partial tile into it."""
    total: list[ex.Int] = []
    for slot in kt.combined:
        level = kt.hw.levels[kt.slots[slot].level_index]
        parent = _parent_slot(kt, slot)
        for stmt in kt.kernel.statements:
            use = next(u for u in kt.kernel.uses if u.tensor == stmt.target)
            reduced = reduced_into(kt.kernel, use)
            if not stmt.op.reduces or not reduced:
                continue
            units = kt.units(slot, reduced)
            elements = ex.mul(*(kt.tile(d, parent) for d in use.indices))
            op_ps = kt.hw.compute.point_ps(Counter({stmt.op.op_class: 1}), stmt.dtype)
            once = ex.add(barrier_cost(kt, slot),
                          ex.mul(level.issue_share * op_ps, units, elements))
            times = transfer_count(kt, use, parent) if parent > 0 else ex.ONE
            total.append(ex.select(combines_on_device(kt, slot, reduced),
                                   ex.mul(once, times), 0))
    if kt.kernel.online is not None:  # its running statistics' partials rescaled too
        from synth.constraints.online_terms import merge_cost  # builds on this module
        total.append(merge_cost(kt))
    return ex.add(*total)


def barrier_cost(kt: KernelTerms, slot: int) -> ex.Int:
    """One barrier of the units of spatial `slot`: the level's fixed cost plus its cost
    per unit meeting (UPMEM tasklets: measured 0.37 us at 1, 8.1 us at 16)."""
    level = kt.hw.levels[kt.slots[slot].level_index]
    return ex.add(level.barrier_ps, ex.mul(level.barrier_per_unit_ps, kt.units(slot)))


def device_combine_capacity(kt: KernelTerms, workload: Workload, mem: Memory
                            ) -> list[ex.Int]:
    """Bytes of the combine buffers in `mem`: the parent memory's tile of each reduced
    tensor, once per unit that contributes a partial."""
    out: list[ex.Int] = []
    for slot in kt.combined:
        if device_combine_slots(kt).get(slot) != mem:
            continue
        parent = _parent_slot(kt, slot)
        for use in kt.moving():
            reduced = reduced_into(kt.kernel, use)
            if not reduced:
                continue
            itemsize = workload.tensors[use.tensor].dtype.itemsize
            rows = [kt.tile(d, parent) for d in use.indices[:-1]]
            run = ex.mul(kt.tile(use.indices[-1], parent), itemsize) if use.indices \
                else ex.const(itemsize)
            padded = ex.mul(mem.rules.multiple, ex.ceil_div(run, mem.rules.multiple))
            out.append(ex.select(combines_on_device(kt, slot, reduced),
                                 ex.mul(kt.units(slot, reduced), padded, *rows), 0))
    return out


def combine_symmetry(kt: KernelTerms) -> list[NamedConstraint]:
    """Redundant: a combine on the device is chosen only where several units hold shares
    of a reduced dimension (one unit alone has nothing to combine, and both values of
    the decision are then the same schedule, which the solver would prove twice)."""
    out = []
    for slot, on_device in kt.combined.items():
        several = ex.greater_than_one(kt.units(slot, kt.kernel.reduced))
        if isinstance(several, bool):
            continue
        out.append(NamedConstraint(
            "implied", f"kernel {kt.kernel.name}: combines on the device only what several "
            f"{kt.slots[slot].name} units share", ex.AnyOf((ex.Cmp(on_device, "==", ex.ZERO),
                                                           several))))
    return out
