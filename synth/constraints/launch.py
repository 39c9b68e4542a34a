"""Starting a kernel: a fixed launch cost per start, per unit where the hardware says so
(UPMEM: per DPU), and the fork and join of a parallel region (an OpenMP region on a CPU)
per iteration of the sequential loops outside the units. Builds on
`synth.constraints.cost`."""

from __future__ import annotations

from synth.constraints import expr as ex
from synth.constraints.cost import KernelTerms, _root_slot
from synth.constraints.space import SlotKind


def launch_cost(kt: KernelTerms) -> ex.Int:
    """A fixed cost per start of the kernel: once per iteration of the loops outside its
    units (the root memory's, and those of other memories at the root's level: on a CPU
    each of their iterations starts a parallel region), or once when the units stream
    from the root memory themselves (`hw.streams`). A start may cost more per unit it
    runs on (`launch_once`)."""
    forks = fork_cost(kt)
    once = launch_once(kt)
    if kt.hw.streams:
        return ex.add(once, forks)
    return ex.add(ex.mul(once, *(kt.f(d, _root_slot(kt)) for d in kt.kernel.dims)), forks)


def fork_cost(kt: KernelTerms) -> ex.Int:
    """Starting and joining the units of a level with a `fork` cost (an OpenMP parallel
    region): once per iteration of the sequential loops outside them, when the kernel
    uses more than one (the emitted code runs a single unit without a region)."""
    total: list[ex.Int] = []
    for index, slot in enumerate(kt.slots):
        level = kt.hw.levels[slot.level_index]
        if slot.kind is not SlotKind.SPATIAL or not level.fork_ps:
            continue
        outside = [i for i in kt.temporal() if i < index]
        starts = ex.mul(level.fork_ps, *(kt.dim_product(d, outside) for d in kt.kernel.dims))
        total.append(ex.select(ex.greater_than_one(kt.units(index)), starts, 0))
    return ex.add(*total)


def launch_once(kt: KernelTerms) -> ex.Int:
    """One start of the kernel: the fixed cost, plus `launch_per_unit` per unit of its
    level the kernel runs on (UPMEM: per DPU launched, R x D)."""
    if kt.hw.launch_level is None or not kt.hw.launch_per_unit_ps:
        return ex.const(kt.hw.launch_ps)
    launched = ex.mul(*(kt.units(s) for s in kt.spatial_between(
        0, kt.hw.level_index(kt.hw.launch_level))))
    return ex.add(kt.hw.launch_ps, ex.mul(kt.hw.launch_per_unit_ps, launched))
