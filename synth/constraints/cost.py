"""The cost model and the constraints of the schedule space, built once as terms.

Every number here is an integer in picoseconds or bytes. The same terms are lowered into
CP-SAT and evaluated in plain Python (`evaluate_cost`), so the solver optimises exactly
the cost that is reported for a decoded schedule.

The model, per kernel:
- compute: iteration points per innermost unit (padding included) x the statement's cost
  per point, stretched when units share a pipeline that needs more of them (UPMEM: 11);
- transfers: for each memory below the root and each tensor the kernel touches, the
  number of times its tile moves (see `copy_loops`) x (latency per DMA operation +
  bytes x cost per byte), serialised over the units that share one transfer engine;
- combine: when a reduced dimension is split across units, the partial results are
  combined on the host;
- launch: a fixed cost per start of the kernel (per iteration of the root loop);
- double buffering (`buffers.<kernel>.<memory>` = 2): the moving tiles in that memory
  take twice the bytes, and its transfers overlap with compute (see `overlapped_transfer`).

Families that build on this module are imported where used: the combines of split
reductions (`combines`), the CPU's compute terms (`cpu_compute`), starting a kernel
(`launch`), transfers that block or push (`transfers`), the online rewrite's terms.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from synth.constraints import expr as ex
from synth.constraints import roofline, tiled
from synth.constraints.acyclic import acyclic_constraints
from synth.constraints.dst import tiled_constraints
from synth.constraints.fusion import kernel_order
from synth.constraints.online import online_decision
from synth.constraints.space import (
    ConstraintSet,
    Factors,
    KernelSpec,
    NamedConstraint,
    Slot,
    SlotKind,
    TensorUse,
    build_factors,
    fusion_decision,
    hierarchy_slots,
)
from synth.deadline import Deadline
from synth.hardware import Hardware, Memory
from synth.workload import Statement, Workload, op_classes


@dataclass(frozen=True)
class Loop:
    """One sequential loop of a kernel's nest: a dimension at a temporal slot."""

    slot: int
    dim: str


@dataclass(frozen=True)
class CopyLoops:
    """The sequential loops around the copy of one tensor into one memory.

    `fixed` loops always enclose the copy (they are outside a parallel loop the copy must
    sit inside). Each `optional` loop encloses it only if the copy cannot be hoisted above
    it: that is, if this loop or a later optional one walks the tensor (indexes it with a
    factor > 1). Hoisting is what keeps an accumulator resident across a reduction loop.
    """

    fixed: tuple[Loop, ...]
    optional: tuple[Loop, ...]


def copy_loops(slots: Sequence[Slot], kernel: KernelSpec, mem_slot: int) -> CopyLoops:
    last_spatial = max((i for i in range(mem_slot) if slots[i].kind is SlotKind.SPATIAL),
                       default=-1)
    inward = [lp for lp in pass_loops_inside(slots, kernel) if lp.slot < mem_slot]
    loops = [Loop(i, d) for i in range(mem_slot) if slots[i].kind is SlotKind.TEMPORAL
             for d in kernel.dims if Loop(i, d) not in inward]
    return CopyLoops(tuple(lp for lp in loops if lp.slot < last_spatial),
                     (*inward, *(lp for lp in loops if lp.slot > last_spatial)))


def pass_loops_inside(slots: Sequence[Slot], kernel: KernelSpec) -> tuple[Loop, ...]:
    """Where the innermost parallel level has no sequential loop of its own (UPMEM: the
    tasklets' tiles are WRAM's, the innermost memory), an online kernel's sequential loop
    over its pass dimension at the memory just above it (MRAM) runs inside the units,
    first of their loops: each unit steps through its rows' pass (its share of it where
    the units split the pass, `online_terms.split_constraints`: the loop's blocks are
    then the units' whole block, their shares interleaved) keeping their running
    statistics across the steps (FlashAttention's steps inside one tasklet; the
    memory's tile holds the whole pass, each step a block of it). Outside the units, the
    innermost memory's tiles would be made anew at every step, and the sums the epilogue
    completes could not run over it (`fusion.complete`). Empty for other kernels and
    models (a CPU steps inside each core at L2 and L1). The nest order is
    `ir.materialize.KernelBuilder._loops`'."""
    plan = kernel.online
    last_spatial = max((i for i, s in enumerate(slots) if s.kind is SlotKind.SPATIAL),
                       default=-1)
    if (plan is None or last_spatial != len(slots) - 2 or last_spatial < 1
            or slots[last_spatial - 1].kind is SlotKind.SPATIAL):
        return ()
    return (Loop(last_spatial - 1, plan.dim),)


# ---------------------------------------------------------------- per-kernel terms


@dataclass(frozen=True)
class KernelTerms:
    """Shorthands over one kernel's factors."""

    kernel: KernelSpec
    factors: Factors
    hw: Hardware
    # spatial slot -> 0/1: partial results split across its units are combined on the
    # device (through a memory they share, after a barrier) rather than on the host
    combined: Mapping[int, ex.Int] = field(default_factory=dict)
    # temporal slot -> 1 or 2: tiles moving into its memory are single or double buffered
    buffered: Mapping[int, ex.Int] = field(default_factory=dict)
    # 0/1: the kernel's contractions run on the matrix intrinsic, operands packed (None:
    # no intrinsic applies)
    packed: ex.Int | None = None
    # tensor -> 0/1: its innermost tile is one per memory instance, shared by the units
    # of the levels in between (`sharing`: UPMEM tasklets sharing a WRAM block)
    shared: Mapping[str, ex.Int] = field(default_factory=dict)

    @property
    def slots(self) -> tuple[Slot, ...]:
        return self.factors.slots

    def split_units(self, slot: int, dims: Sequence[str]) -> ex.Int:
        """Units of spatial `slot` that hand on separate partial results of a reduction
        over `dims`: none beyond one when they combine them on the device."""
        units = self.units(slot, dims)
        on_device = self.combined.get(slot)
        return units if on_device is None else ex.select(_is_one(on_device), 1, units)

    def f(self, dim: str, slot: int) -> ex.Int:
        return self.factors.of(self.kernel.name, dim, slot)

    def dim_product(self, dim: str, slots: Iterable[int]) -> ex.Int:
        """The product of `dim`'s factors at `slots`, in its shortest form.

        All of a dimension's factors multiply to its padded extent, so a product of most
        of them is written as the extent over the few that are missing. This is what lets
        the solver bound a cost: `ext / units` is near its value from the start, while a
        product of five independent factors could be anything."""
        chosen = set(slots)
        rest = set(range(len(self.slots))) - chosen
        ext = self.factors.extents[(self.kernel.name, dim)]
        if _root_slot(self) in chosen or len(rest) < len(chosen):
            return ex.exact_div(ext, ex.mul(*(self.f(dim, s) for s in sorted(rest))))
        return ex.mul(*(self.f(dim, s) for s in sorted(chosen)))

    def inner(self, slot: int) -> range:
        return range(slot, len(self.slots))

    def tile(self, dim: str, slot: int) -> ex.Int:
        """The extent of `dim` covered from slot `slot` inward."""
        return self.dim_product(dim, self.inner(slot))

    def temporal(self) -> list[int]:
        return [i for i, s in enumerate(self.slots) if s.kind is SlotKind.TEMPORAL]

    def units(self, slot: int, dims: Sequence[str] | None = None) -> ex.Int:
        """How many units of a spatial slot the kernel uses (over `dims`, default all)."""
        return ex.mul(*(self.f(d, slot) for d in (dims if dims is not None else
                                                   self.kernel.dims)))

    def spatial_between(self, outer_level: int, inner_level: int) -> list[int]:
        """Spatial slots of levels strictly below `outer_level`, down to `inner_level`."""
        return [i for i, s in enumerate(self.slots) if s.kind is SlotKind.SPATIAL
                and outer_level < s.level_index <= inner_level]

    def spatial_inside(self, slot: int) -> list[int]:
        return [i for i in range(slot + 1, len(self.slots))
                if self.slots[i].kind is SlotKind.SPATIAL]

    def partials(self, slot: int, use: TensorUse) -> ex.Int:
        """Separate partial results of a written tile at memory slot `slot`: one per unit
        below it that holds its own share of a dimension reduced into the tensor."""
        if not use.written:
            return ex.ONE
        reduced = reduced_into(self.kernel, use)
        return ex.mul(*(self.split_units(s, reduced) for s in self.spatial_inside(slot)))

    def resident(self, slot: int) -> list[TensorUse]:
        """The tensors with a tile in the memory at `slot`: all but the kernel's local
        intermediates, which live in the innermost memory only."""
        innermost = len(self.slots) - 1
        return [u for u in self.kernel.uses if not u.local or slot == innermost]

    def moving(self) -> list[TensorUse]:
        """The tensors that move between memories (local intermediates never do)."""
        return [u for u in self.kernel.uses if not u.local]

    def sequential_points(self) -> ex.Int:
        """Iteration points one innermost unit runs (padding included)."""
        return ex.mul(*(self.dim_product(d, self.temporal()) for d in self.kernel.dims))


@dataclass(frozen=True)
class Run:
    """The contiguous run a tile of one tensor is moved in: its innermost axis."""

    elements: ex.Int
    padded_bytes: ex.Int  # rounded up to the memory's transfer multiple
    waste_bytes: ex.Int  # padded_bytes - elements * itemsize
    chunks: ex.Int  # transfer operations per run (runs beyond the maximum are split)


def run_terms(kt: KernelTerms, use: TensorUse, mem: Memory, slot: int, itemsize: int) -> Run:
    rules = mem.rules
    elements = kt.tile(use.indices[-1], slot) if use.indices else ex.ONE
    raw = ex.mul(elements, itemsize)
    padded = ex.mul(rules.multiple, ex.ceil_div(raw, rules.multiple))
    waste = ex.round_up_waste(raw, rules.multiple)
    chunks = ex.ceil_div(padded, rules.max_bytes) if rules.max_bytes else ex.ONE
    return Run(elements, padded, waste, chunks)


def buffer_bytes(kt: KernelTerms, use: TensorUse, mem: Memory, slot: int,
                 itemsize: int) -> ex.Int:
    """Bytes one tile of `use` takes in the memory at `slot` (rows padded; tiled: tiles')."""
    if kt.hw.compute.tiling.edge:
        return tiled.block_bytes(kt, use, slot, itemsize)
    rows = [kt.tile(d, slot) for d in use.indices[:-1]]
    run = run_terms(kt, use, mem, slot, itemsize)
    return ex.mul(kt.partials(slot, use), run.padded_bytes, *rows)


def transfer_loops(kt: KernelTerms, use: TensorUse, slot: int, cached: bool = False,
                   once: bool = False, kept: tuple[int, ex.Cond] | None = None
                   ) -> tuple[dict[str, set[int]], list[ex.Int]]:
    """The loops around the copy of `use` into the memory at `slot`, per dimension.

    Returns the slots whose factors always count, per dim, and the factors that count
    only when the copy cannot be hoisted above them (see `copy_loops`). For a dimension
    the tensor is indexed by, every loop counts: a loop that walks the tensor changes its
    tile, and one with a single iteration multiplies by 1 either way. In a cache
    (`cached`) every loop is optional: the tile stays across a loop outside the units that
    does not walk it, though the loop nest makes it anew there. `once`: no loop that does
    not walk the tensor counts (each distinct tile once: `transfers.packed_fills`).
    `kept` (`kept_in_cache`): from the parent's slot inward, no loop that does not walk
    the tensor counts where the condition holds (the cache keeps the parent's tile)."""
    loops = copy_loops(kt.slots, kt.kernel, slot)
    if cached:
        loops = CopyLoops((), loops.fixed + loops.optional)
    counted: dict[str, set[int]] = {d: set() for d in kt.kernel.dims}
    optional: list[ex.Int] = []
    for lp in loops.fixed:
        counted[lp.dim].add(lp.slot)
    for pos, loop in enumerate(loops.optional):
        if loop.dim in use.indices:
            counted[loop.dim].add(loop.slot)
            continue
        if once:
            continue
        walks_later = ex.any_of(ex.greater_than_one(kt.f(lp.dim, lp.slot))
                                for lp in loops.optional[pos:] if lp.dim in use.indices)
        again = ex.select(walks_later, kt.f(loop.dim, loop.slot), 1)
        if kept is not None and loop.slot >= kept[0]:
            again = ex.select(kept[1], 1, again)  # kept: met again inside the parent's tile
        optional.append(again)
    return counted, optional


def kept_in_cache(kt: KernelTerms, use: TensorUse, mem: Memory, slot: int, itemsize: int
                  ) -> tuple[int, ex.Cond] | None:
    """For a cache that `keeps` (`cpu`: each core's L2): the slot of its parent's loops
    and whether the parent's tile of `use` takes at most half of it (the rest for the
    kernel's other tensors). The cache then keeps every tile of it the loops inside the
    parent's tile meet, so a loop there that does not walk the tensor moves none again,
    though a loop inside it walks the tensor (`transfer_loops`). (matmul 16x4096x4096
    with k outermost read an 8 x 4096 slice of B, 128 KiB, in 8 x 1024 L2 tiles again for
    each of 8 row blocks: priced as 8 reads of it from the L3, 30.6 ms, it ran 14.8;
    on the L1 the same rule priced matmul-512's schedules worse: RESULTS.md, "A cache
    keeps its parent's tile".) None where this does not apply."""
    if not (mem.cache and mem.keeps) or not use.indices:
        return None
    parent = _parent_slot(kt, slot)
    size = ex.mul(itemsize, *(kt.tile(d, parent) for d in use.indices))
    return parent, ex.Cmp(size, "<=", ex.const(mem.usable // 2))


def transfer_count(kt: KernelTerms, use: TensorUse, slot: int) -> ex.Int:
    """How many times one unit moves this tensor's tile into (or out of) memory `slot`."""
    counted, optional = transfer_loops(kt, use, slot)
    return ex.mul(*(kt.dim_product(d, s) for d, s in counted.items()), *optional)


# ---------------------------------------------------------------- the builder


@dataclass(frozen=True)
class Model:
    """The schedule space of one workload on one hardware model.

    `kernels` are the candidate kernels (legal fusion groups); `chosen` maps each to the
    0/1 term saying whether the schedule uses it (a `fuse.<kernel>` decision, or the
    constant 1 when a kernel is the only one that can run its statements)."""

    workload: Workload
    hw: Hardware
    kernels: tuple[KernelSpec, ...]
    factors: Factors
    constraints: ConstraintSet
    chosen: Mapping[str, ex.Int] = field(default_factory=dict)
    # kernel -> spatial slot -> 0/1 term: its units combine partial results on the device
    combines: Mapping[str, Mapping[int, ex.Int]] = field(default_factory=dict)
    # kernel -> temporal slot -> 1/2 term: tiles moving into its memory are double buffered
    buffers: Mapping[str, Mapping[int, ex.Int]] = field(default_factory=dict)
    # kernel -> 0/1 term: its contractions run on the matrix intrinsic (`intrinsic`)
    packs: Mapping[str, ex.Int] = field(default_factory=dict)
    # kernel -> tensor -> 0/1 term: its innermost tile is shared by the units (`sharing`)
    shares: Mapping[str, Mapping[str, ex.Int]] = field(default_factory=dict)

    @property
    def slots(self) -> tuple[Slot, ...]:
        return self.factors.slots

    def selected(self, env: Mapping[str, int]) -> tuple[KernelSpec, ...]:
        """The kernels the assignment `env` uses, in an order that respects dependences."""
        used = [k for k in self.kernels
                if ex.evaluate(self.chosen.get(k.name, ex.ONE), env) == 1]
        order = kernel_order(self.workload, [[self.workload.statements.index(s)
                                              for s in k.statements] for k in used])
        return tuple(used[i] for i in order)


def build_model(workload: Workload, hw: Hardware, kernels: Sequence[KernelSpec],
                extra: Sequence[NamedConstraint] = (),
                named: Mapping[str, Collection[int]] | None = None,
                deadline: Deadline | None = None,
                ranged: Mapping[tuple[str, str], str] | None = None) -> Model:
    """The schedule space of `kernels` (the candidates) on `hw`; `named` adds unit counts
    a request names to the spatial factors' candidates (`space.build_factors`). Past
    `deadline` while listing the rings of `fusion.acyclic`: `SolveTimeout` (exit 3).
    `ranged` ((statement, dimension) -> size, with size ranges): the root loops over those
    dimensions are parametric in the size (`parametric_constraints`); empty or None adds
    nothing."""
    from synth.constraints.combines import combine_symmetry, with_combine_choices
    from synth.constraints.intrinsic import intrinsic_constraints, with_pack_choice
    from synth.constraints.sharing import share_constraints, with_share_choices
    slots = hierarchy_slots(hw)
    factors = build_factors(kernels, hw, slots, named)
    domains = dict(factors.domains)
    chosen, cover = fusion_choices(workload, kernels, domains)
    cover += acyclic_constraints(workload, kernels, chosen, deadline)
    terms = [with_share_choices(with_pack_choice(with_buffer_choices(
        with_combine_choices(KernelTerms(k, factors, hw), domains), domains), domains),
        domains) for k in kernels]
    constraints: list[NamedConstraint] = list(cover)
    for kt in terms:
        own = (tiling_constraints(kt) + capacity_constraints(kt, workload)
               + transfer_rule_constraints(kt, workload) + completion_constraints(kt)
               + single_writer_constraints(kt) + intrinsic_constraints(kt)
               + implied_compute_bounds(kt) + tiled_constraints(kt, workload, domains)
               + blocking_bounds(kt, workload) + combine_symmetry(kt) + _online(kt)
               + share_constraints(kt)
               + (parametric_constraints(kt, workload, ranged) if ranged else []))
        constraints += [when_chosen(chosen[kt.kernel.name], c) for c in own]
    definitions, count_constraints = unit_counts(terms, hw, chosen)
    constraints += count_constraints
    breakdown: dict[str, ex.Int] = {}
    objective: list[ex.Int] = []
    for kt in terms:
        parts = kernel_cost(kt, workload)
        for part, term in parts.items():
            paid = ex.select(_is_one(chosen[kt.kernel.name]), term, 0)
            breakdown[part] = ex.add(breakdown.get(part, ex.ZERO), paid)
        objective.append(ex.select(_is_one(chosen[kt.kernel.name]),
                                   kernel_objective(kt, workload, parts), 0))
    cset = ConstraintSet(decisions=domains, definitions=definitions,
                         constraints=tuple(constraints) + tuple(extra),
                         objective=ex.add(*objective), breakdown=breakdown,
                         groups=factors.groups)
    return Model(workload, hw, tuple(kernels), factors, cset, chosen,
                 {kt.kernel.name: kt.combined for kt in terms},
                 {kt.kernel.name: kt.buffered for kt in terms},
                 {kt.kernel.name: kt.packed for kt in terms if kt.packed is not None},
                 {kt.kernel.name: kt.shared for kt in terms if kt.shared})


# ---------------------------------------------------------------- fusion


def fusion_choices(workload: Workload, kernels: Sequence[KernelSpec],
                   domains: dict[str, tuple[int, ...]]
                   ) -> tuple[dict[str, ex.Int], list[NamedConstraint]]:
    """A 0/1 decision per candidate kernel that shares a statement with another candidate
    (added to `domains`), and the constraints that every statement runs exactly once."""
    covering: dict[str, list[KernelSpec]] = {s.name: [] for s in workload.statements}
    for kernel in kernels:
        for stmt in kernel.statements:
            covering[stmt.name].append(kernel)
    chosen: dict[str, ex.Int] = {}
    for kernel in kernels:
        if all(len(covering[s.name]) == 1 for s in kernel.statements):
            chosen[kernel.name] = ex.ONE
        else:
            name = (online_decision(kernel.name) if kernel.online is not None
                    else fusion_decision(kernel.name))
            domains[name] = (0, 1)
            chosen[kernel.name] = ex.Var(name)
    cover = [NamedConstraint(
        "fusion.cover", f"statement {stmt}: runs in exactly one of the kernels "
        f"{', '.join(k.name for k in options)}",
        ex.Cmp(ex.add(*(chosen[k.name] for k in options)), "==", ex.ONE))
        for stmt, options in covering.items() if len(options) > 1]
    return chosen, cover


def buffers_decision(kernel: str, memory: str) -> str:
    """`buffers.s.wram` is 2 when kernel s double-buffers the tiles moving into WRAM."""
    return f"buffers.{kernel}.{memory}"


def with_buffer_choices(kt: KernelTerms, domains: dict[str, tuple[int, ...]]
                        ) -> KernelTerms:
    """A 1/2 decision (added to `domains`) for the innermost memory, the one compute
    reads its tiles from, when its tiles may be double buffered. Not when its parent is
    the root: copies out of the root memory happen between launches (the root loop is
    the launch loop), so nothing runs that they could overlap with (unless the units
    stream from the root memory themselves, `hw.streams`). Not when no
    sequential loop around its copies can take more than one step (one load cannot be
    overlapped). Intermediate memories get none: their transfers would overlap the same
    compute, and the z3 backend does not finish on models with several overlapped
    memories per kernel. (Whether the loops do take several steps is up to the factors:
    where they do not, 2 only costs bytes and the first tile's move, so is not chosen.)"""
    buffered: dict[int, ex.Int] = {}
    root = _root_slot(kt)
    for slot, mem in _memory_slots(kt)[-1:]:
        loops = copy_loops(kt.slots, kt.kernel, slot)
        steps = [kt.f(lp.dim, lp.slot) for lp in loops.fixed + loops.optional]
        if mem.overlap:  # the hardware overlaps its transfers already (caches)
            continue
        if ((_parent_slot(kt, slot) == root and not kt.hw.streams) or not kt.moving()
                or mem.blocking or all(s == ex.ONE for s in steps)):
            continue
        name = buffers_decision(kt.kernel.name, mem.name)
        domains[name] = (1, 2)
        buffered[slot] = ex.Var(name)
    return dataclasses.replace(kt, buffered=buffered)


def _online(kt: KernelTerms) -> list[NamedConstraint]:
    from synth.constraints.online_terms import online_constraints  # builds on this module
    return online_constraints(kt)


def when_chosen(used: ex.Int, constraint: NamedConstraint) -> NamedConstraint:
    """The constraint of a candidate kernel binds only when the kernel is chosen:
    used == 0 or the condition (the one direction needed: an unused kernel is free)."""
    if used == ex.ONE:
        return constraint
    return dataclasses.replace(constraint, cond=ex.AnyOf((ex.Cmp(used, "==", ex.ZERO),
                                                          constraint.cond)))


def _is_one(used: ex.Int) -> ex.Cond | bool:
    return True if used == ex.ONE else ex.Cmp(used, "==", ex.ONE)


# ---------------------------------------------------------------- constraint families


def tiling_constraints(kt: KernelTerms) -> list[NamedConstraint]:
    """A dimension's tiles divide its padded extent, so its factors multiply to it."""
    out = []
    root = _root_slot(kt)
    for dim in kt.kernel.dims:
        inner = ex.mul(*(kt.f(dim, s) for s in range(len(kt.slots)) if s != root))
        ext = kt.factors.extents[(kt.kernel.name, dim)]
        if (isinstance(inner, ex.Const) and isinstance(ext, ex.Const)
                and ext.value % inner.value == 0):
            continue
        out.append(NamedConstraint(
            "tiling", f"kernel {kt.kernel.name}: tiles of {dim} divide its padded extent",
            ex.Cmp(ex.mul(kt.f(dim, root), inner), "==", ext)))
    return out


def parametric_group(kernel: str, dim: str) -> str:
    return f"parametric.{kernel}.{dim}"


def parametric_constraints(kt: KernelTerms, workload: Workload,
                           ranged: Mapping[tuple[str, str], str]) -> list[NamedConstraint]:
    """With size ranges (`--set N=LO..HI[:STEP]`, solved at the largest admissible N):
    the root memory's loop over a dimension that is a ranged size, where there is one
    (its factor G > 1: `ir.materialize` leaves out loops of one iteration), runs
    ceil(N / step) times, `step` being the tile inside it (the product of the factors of
    the slots after the root's: the step `ir.materialize` gives the loop). Its count is
    then a function of N alone, and the same nest serves every admissible size with only
    that count adapting: the `parametric` obligation of `ir.prove`
    (`_Prover._loop_extent`, `instantiate`). `ranged` maps (statement, dimension) to the
    size it is (`ir.prove.Dependence.statements`); a kernel dimension is ranged when it
    is in one of its statements (`ir.prove.kernel_dims`).

    G = ceil(N / step) is N <= G x step < N + step. G x step is the tile of the root slot
    (`span`): the padded extent over the units of the slots before it. Where there are
    none (the root slot first), it is the padded extent, at least N by its domain, so
    only the upper bound is stated: less than one step of padding. Where units split the
    dimension outside the root loop (`streams`: AIE's columns and cores), each unit's
    span must reach N too, which a padded extent under twice N allows only when those
    units are one; or G is 1 (no root loop: nothing adapts, the tiles cover the padded
    extent at every size). Nothing is added without ranges."""
    out = []
    root = _root_slot(kt)
    dims = {dim: size for stmt in kt.kernel.statements for dim in stmt.dims
            if (size := ranged.get((stmt.name, dim))) is not None}
    for dim, size in dims.items():
        n = workload.sizes[size]
        count = kt.f(dim, root)
        step = ex.mul(*(kt.f(dim, s) for s in range(root + 1, len(kt.slots))))
        outside = ex.mul(*(kt.f(dim, s) for s in range(root)))
        span = kt.tile(dim, root)
        where = f"kernel {kt.kernel.name}: the {kt.slots[root].name} loop over {dim} runs"
        # count <= ceil(N / step); and count >= ceil(N / step), or no root loop
        conds: list[tuple[ex.Cond, str]] = [(
            ex.Cmp(span, "<", ex.add(n, step)),
            f"{where} at most ceil({size} / step) times at {size}={n} (less than a step "
            f"of padding)")]
        if outside != ex.ONE:
            conds.append((
                ex.AnyOf((ex.Cmp(count, "==", ex.ONE), ex.Cmp(span, ">=", ex.const(n)))),
                f"{where} ceil({size} / step) times at {size}={n}, or once (units over "
                f"{dim} outside it would leave it short)"))
        out += [NamedConstraint(parametric_group(kt.kernel.name, dim), meaning, folded)
                for cond, meaning in conds if (folded := ex.fold(cond)) != ex.TRUE]
    return out


def capacity_constraints(kt: KernelTerms, workload: Workload) -> list[NamedConstraint]:
    """Per memory instance, the kernel's live tiles fit the usable capacity."""
    from synth.constraints.combines import device_combine_capacity
    out = []
    for slot, mem in _memory_slots(kt):
        instance = kt.hw.level_index(mem.instance_level)
        copies = ex.mul(*(kt.units(s) for s in kt.spatial_between(instance,
                                                                   kt.slots[slot].level_index)))
        buffers = kt.buffered.get(slot, ex.ONE)  # moving tiles are double buffered
        tiles = [(use, ex.mul(_resident_bytes(kt, workload, use, mem, slot),
                              ex.ONE if use.local else buffers))
                 for use in kt.resident(slot)]
        if slot == len(kt.slots) - 1:  # tiles shared by the units: one per instance
            from synth.constraints.sharing import shared_bytes  # builds on this module
            split = [shared_bytes(kt, use, nbytes) for use, nbytes in tiles]
        else:
            split = [(nbytes, ex.ZERO) for _, nbytes in tiles]
        used = ex.add(*(own for own, _ in split))
        shared = [*device_combine_capacity(kt, workload, mem),  # one per instance
                  *(once for _, once in split)]
        usable = mem.usable
        if slot == len(kt.slots) - 1 and kt.hw.compute.tiling.edge:  # a tiled core's
            used = ex.add(used, tiled.dataflow_terms(kt, workload).extra_bytes)  # 2nd DFBs
        if slot == len(kt.slots) - 1 and kt.kernel.online is not None:
            from synth.constraints.online_terms import footprint, step_capacity
            used = ex.add(used, footprint(kt, element_bytes(kt, workload, kt.kernel.use(
                kt.kernel.online.target), mem)))
            usable = step_capacity(kt, mem)  # a CPU's online step: arrays in L1
        out.append(NamedConstraint(
            f"capacity.{mem.name}",
            f"kernel {kt.kernel.name}: tiles in one {mem.name} fit {usable} bytes",
            ex.Cmp(ex.add(ex.mul(copies, used), *shared), "<=", ex.const(usable))))
    return out


def _resident_bytes(kt: KernelTerms, workload: Workload, use: TensorUse, mem: Memory,
                    slot: int) -> ex.Int:
    itemsize = element_bytes(kt, workload, use, mem)
    if kt.kernel.online is not None:
        from synth.constraints.online_terms import stream_bytes, streamed
        if streamed(kt, use, slot):  # an online step's operand streaming through a cache
            return stream_bytes(kt, use, mem, itemsize)
    return buffer_bytes(kt, use, mem, slot, itemsize)


def transfer_rule_constraints(kt: KernelTerms, workload: Workload) -> list[NamedConstraint]:
    """Each transfer's contiguous run is at least the minimum size and starts aligned."""
    out = []
    for slot, mem in _memory_slots(kt):
        rules = mem.rules
        for use in kt.moving():
            itemsize = workload.tensors[use.tensor].dtype.itemsize
            run = ex.mul(kt.tile(use.indices[-1], slot), itemsize) if use.indices \
                else ex.const(itemsize)
            padded = ex.mul(rules.multiple, ex.ceil_div(run, rules.multiple))
            where = f"kernel {kt.kernel.name}: {use.tensor} into {mem.name}"
            if rules.min_bytes > rules.multiple:
                out.append(NamedConstraint(
                    f"transfer.{mem.name}", f"{where}: a run is at least {rules.min_bytes} B",
                    ex.Cmp(padded, ">=", ex.const(rules.min_bytes))))
            if rules.align > 1 and use.indices:
                whole_row = ex.Cmp(kt.tile(use.indices[-1], slot), "==",
                                   _parent_row(kt, use.indices[-1], slot))
                aligned = ex.fold(ex.Cmp(ex.mul(rules.align, ex.ceil_div(run, rules.align)),
                                         "==", run))
                if aligned == ex.TRUE:  # whole elements are aligned already (i32, 4 B)
                    continue
                out.append(NamedConstraint(
                    f"transfer.{mem.name}",
                    f"{where}: runs start {rules.align}-byte aligned",
                    ex.AnyOf((aligned, whole_row))))
    return out


def completion_constraints(kt: KernelTerms) -> list[NamedConstraint]:
    """A core reduction whose target another statement of the kernel initialises or
    reads (`C = 0` fused before `C += A * B`, or an epilogue) happens entirely inside
    one tile of the target in the innermost memory: no loop over a reduced dimension
    encloses that tile (else the fill would run again mid-reduction, or the epilogue
    would read a partial sum), and no unit holds a share of one (partials)."""
    out = []
    innermost = len(kt.slots) - 1
    for stmt, use in kt.kernel.completed():
        users = ", ".join(s.name for s in kt.kernel.prologue + kt.kernel.epilogue
                          if s.target == stmt.target or stmt.target in s.inputs)
        out.append(NamedConstraint(
            "fusion.complete",
            f"kernel {kt.kernel.name}: {stmt.name} reduces over "
            f"{', '.join(stmt.reduced)} inside one {kt.slots[innermost].name} tile of "
            f"{stmt.target} ({users} needs it whole)",
            ex.Cmp(loops_around_tile(kt, use, stmt.reduced), "==", ex.ONE)))
    return out


def single_writer_constraints(kt: KernelTerms) -> list[NamedConstraint]:
    """A prologue or epilogue statement whose result leaves the kernel writes each of
    its elements once: no loop over a dimension it does not iterate encloses its target's
    tile, neither across units (they would all store the same elements) nor in time (it
    would store them again each step)."""
    out = []
    completed = {stmt.target for stmt, _ in kt.kernel.completed()}  # fusion.complete's
    for stmt in kt.kernel.prologue + kt.kernel.epilogue:
        use = kt.kernel.use(stmt.target)
        others = [d for d in kt.kernel.dims if d not in stmt.dims]
        if use.local or not others or stmt.target in completed:
            continue
        out.append(NamedConstraint(
            "fusion.writes",
            f"kernel {kt.kernel.name}: {stmt.name} writes each element of {stmt.target} once "
            f"(no loop over {', '.join(others)}, which it does not iterate, around it)",
            ex.Cmp(loops_around_tile(kt, use, others), "==", ex.ONE)))
    return out


def loops_around_tile(kt: KernelTerms, use: TensorUse, dims: Sequence[str]) -> ex.Int:
    """Iterations of the loops over `dims` around `use`'s tile in the innermost memory,
    temporal (as `transfer_loops` counts them) and spatial (units sharing the tile): 1
    when the tile sees the whole of those dimensions at once, in one unit."""
    innermost = len(kt.slots) - 1
    spatial = [i for i, s in enumerate(kt.slots) if s.kind is SlotKind.SPATIAL]
    counted, optional = transfer_loops(kt, use, innermost)
    return ex.mul(*optional, *(kt.dim_product(d, counted[d]) for d in dims),
                  *(kt.f(d, i) for d in dims for i in spatial))


def unit_counts(terms: Sequence[KernelTerms], hw: Hardware, chosen: Mapping[str, ex.Int]
                ) -> tuple[dict[str, ex.Int], list[NamedConstraint]]:
    """Each symbolic count (R, D, T, ...) is the most units any kernel uses at its level:
    the runtime allocates them once for the whole program. The limit is stated per
    kernel, so kernels that nothing else ties together stay independent sub-problems."""
    definitions: dict[str, ex.Int] = {}
    constraints = []
    slots = terms[0].slots if terms else ()
    for slot_index, slot in enumerate(slots):
        if slot.kind is not SlotKind.SPATIAL:
            continue
        level = hw.levels[slot.level_index]
        usages = [kt.units(slot_index) for kt in terms]
        definitions[slot.symbol] = ex.maximum(level.count_min, *(
            ex.select(_is_one(chosen[kt.kernel.name]), used, level.count_min)
            for kt, used in zip(terms, usages, strict=True)))
        for kt, used in zip(terms, usages, strict=True):
            if not isinstance(used, ex.Const) or used.value > level.count_max:
                constraints.append(when_chosen(chosen[kt.kernel.name], NamedConstraint(
                    f"count.{level.name}",
                    f"kernel {kt.kernel.name}: at most {level.symbol} <= {level.count_max} "
                    f"{level.name} units", ex.Cmp(used, "<=", ex.const(level.count_max)))))
    return definitions, constraints


# ---------------------------------------------------------------- cost


def kernel_cost(kt: KernelTerms, workload: Workload) -> dict[str, ex.Int]:
    """The parts of one kernel's modelled time, keyed like the JSON breakdown."""
    from synth.constraints.combines import combine_cost, device_combine_cost
    from synth.constraints.cpu_compute import exposed_cost, vector_compute_cost
    from synth.constraints.intrinsic import pack_cost
    from synth.constraints.launch import launch_cost
    compute = (vector_compute_cost(kt, workload) if kt.hw.compute.vector_tiles
               else compute_cost(kt))
    parts: dict[str, ex.Int] = {
        "compute": compute,
        "launch": launch_cost(kt),
        "combine": combine_cost(kt, workload),
        "device_combine": device_combine_cost(kt, workload),
        "pack": pack_cost(kt),
    }
    overlapping: dict[str, ex.Int] = {}
    for slot, mem in _memory_slots(kt):
        parent = kt.hw.parent(mem)
        if mem.push is not None:
            from synth.constraints.transfers import push_costs  # builds on this module
            parts.update(push_costs(kt, workload, mem, slot))
            continue
        transfer = transfer_cost(kt, workload, mem, slot)
        buffers = kt.buffered.get(slot)
        if buffers is not None:
            transfer = ex.select(ex.Cmp(buffers, "==", ex.const(2)), overlapped_transfer(
                transfer, compute, first_transfer_cost(kt, workload, mem, slot)), transfer)
        elif _blocking(kt, slot):
            from synth.constraints.transfers import blocking_time  # builds on this module
            transfer = ex.add(blocking_time(kt, workload, compute), ex.mul(-1, compute),
                              _shared_cost(kt, workload))
        else:
            transfer = ex.add(transfer, _shared_cost(kt, workload, slot))
        key = f"transfer:{parent.name}->{mem.name}"
        if in_max(mem):
            overlapping[key] = transfer
        elif not mem.overlap:
            parts[key] = transfer
    exposed = exposed_cost(kt, workload)  # in line with compute (`cpu_compute`)
    hidden = roofline.overlapped_parts(ex.add(compute, *exposed.values()), overlapping)
    for key, term in exposed.items():  # a cache's share beside its hidden rest: one part
        parts[key] = ex.add(term, hidden.pop(key)) if key in hidden else term
    parts.update(hidden)
    return parts


def in_max(mem: Memory) -> bool:
    """Whether `mem`'s transfers are a term of the kernel's max(compute, transfers): an
    overlapping memory, unless the core moves it itself (the registers: `exposed` on a
    memory that is not a cache prices their share in line with compute, and no more)."""
    return mem.overlap and (mem.cache or not mem.exposed)


def kernel_objective(kt: KernelTerms, workload: Workload, parts: Mapping[str, ex.Int]
                     ) -> ex.Int:
    """The sum of the kernel's cost `parts`, written so the solver bounds it well: with
    one double-buffered memory, compute + its exposed transfer is
    max(transfer, compute) + first (the compute cancels), which is what this writes."""
    from synth.constraints.cpu_compute import exposed_cost
    blocking = [slot for slot, _ in _memory_slots(kt) if _blocking(kt, slot)]
    if blocking:  # compute + its exposed transfers is the blocking time: compute cancels
        from synth.constraints.transfers import blocking_time  # builds on this module
        mem = kt.hw.memory(kt.slots[blocking[0]].name)
        parent = kt.hw.parent(mem)
        key = f"transfer:{parent.name}->{mem.name}"
        return ex.add(*(term for part, term in parts.items() if part not in ("compute", key)),
                      blocking_time(kt, workload, parts["compute"]),
                      _shared_cost(kt, workload))
    overlapping = {f"transfer:{kt.hw.parent(mem).name}->"
                   f"{mem.name}": transfer_cost(kt, workload, mem, slot)
                   for slot, mem in _memory_slots(kt) if in_max(mem)}
    if overlapping:  # the parts telescope to max(compute, transfers): said so directly
        exposed = exposed_cost(kt, workload)
        return ex.add(ex.maximum(ex.add(parts["compute"], *exposed.values()),
                                 *overlapping.values()),
                      *(term for part, term in parts.items()
                        if part != "compute" and part not in overlapping
                        and part not in exposed))
    if len(kt.buffered) != 1:
        return ex.add(*parts.values())
    [(slot, buffers)] = kt.buffered.items()
    mem = kt.hw.memory(kt.slots[slot].name)
    parent = kt.hw.parent(mem)
    key = f"transfer:{parent.name}->{mem.name}"
    compute = parts["compute"]
    transfer = transfer_cost(kt, workload, mem, slot)
    first = first_transfer_cost(kt, workload, mem, slot)
    both = ex.select(ex.Cmp(buffers, "==", ex.const(2)),
                     ex.add(ex.maximum(transfer, compute), first), ex.add(compute, transfer))
    return ex.add(*(term for part, term in parts.items() if part not in ("compute", key)),
                  both)


def _shared_cost(kt: KernelTerms, workload: Workload, slot: int | None = None) -> ex.Int:
    """The moves of the tiles the units share (`sharing.shared_cost`), in the innermost
    memory's transfer part (`slot`: only when it is the innermost)."""
    if not kt.shared or (slot is not None and slot != len(kt.slots) - 1):
        return ex.ZERO
    from synth.constraints.sharing import shared_cost  # builds on this module
    return shared_cost(kt, workload)


def _blocking(kt: KernelTerms, slot: int) -> bool:
    """The innermost memory, when its units wait for their own transfers (UPMEM WRAM)."""
    return slot == len(kt.slots) - 1 and kt.hw.memory(kt.slots[slot].name).blocking


def overlapped_transfer(transfer: ex.Int, compute: ex.Int, first: ex.Int) -> ex.Int:
    """The exposed time of a double-buffered memory's transfers:

        max(transfer, compute) - compute + first

    While one buffer is computed on, the other is filled (and the previous result
    drained), so transfers hide behind compute except for what exceeds it. The first
    tile's load (and the last tile's store) cannot overlap with anything: `first` is the
    cost of moving one tile of every tensor once, i.e. for each tensor its transfer time
    divided by `transfer_count` (see `first_transfer_cost`). Never negative:
    max(transfer, compute) >= compute. The objective writes the kernel's compute plus
    this as max(transfer, compute) + first (`kernel_objective`), which bounds better."""
    return ex.add(ex.maximum(transfer, compute), ex.mul(-1, compute), first)


def first_transfer_cost(kt: KernelTerms, workload: Workload, mem: Memory, slot: int
                        ) -> ex.Int:
    """One move of each tensor's tile between `mem` and its parent, serialised like
    `transfer_cost`: exactly `tensor_transfer_cost / transfer_count` per tensor, written
    without the division (latency per operation of one tile + its padded bytes)."""
    from synth.constraints.combines import exchanged_on_device
    shared = kt.hw.level_index(mem.shared_by)
    serial = ex.mul(*(kt.units(s) for s in kt.spatial_between(shared,
                                                              kt.slots[slot].level_index)))
    total: list[ex.Int] = []
    for use in kt.moving():
        itemsize = workload.tensors[use.tensor].dtype.itemsize
        if kt.hw.compute.tiling.edge:
            total.append(tiled.first_block_cost(kt, use, mem, slot, itemsize))
            continue
        run = run_terms(kt, use, mem, slot, itemsize)
        rows = ex.mul(kt.partials(slot, use), *(kt.tile(d, slot) for d in use.indices[:-1]))
        packed = pack_runs(kt, use, mem, slot)
        runs = ex.ZERO if packed is None else ex.mul(mem.run_latency_ps, rows, packed)
        once = ex.add(ex.mul(_latency_ps(mem, use), rows, run.chunks),
                      ex.mul(mem.ps_per_byte * (int(use.read) + int(use.written)),
                             buffer_bytes(kt, use, mem, slot, itemsize)), runs)
        total.append(ex.select(exchanged_on_device(kt, use, slot), 0, once))
    return ex.scale(ex.add(*total), serial)


def compute_cost(kt: KernelTerms) -> ex.Int:
    """Points per innermost unit x cost per point, stretched where units share a pipeline
    that needs `issue_share` of them to issue every cycle (UPMEM: 11 tasklets).

    Core statements run at every point of the kernel's loops; a prologue or epilogue
    statement runs once per tile of its target in the innermost memory, over that tile
    (again for every loop around the tile that it does not iterate)."""
    from synth.constraints.intrinsic import (  # builds on this module
        packable,
        packed_point_ps,
        statement_point_ps,
    )
    point: ex.Int = ex.const(_point_ps(kt))
    packed = kt.packed if packable(kt) else None
    if packed is not None:
        point = ex.select(_is_one(packed), packed_point_ps(kt), point)
    core = _stretched(kt, ex.mul(point, kt.sequential_points()))
    if kt.kernel.online is not None:  # each statement over its own points
        from synth.constraints.online_terms import core_compute  # builds on this module
        core = _stretched(kt, core_compute(kt, statement_point_ps(kt, False)))
        if packed is not None:
            core = ex.select(_is_one(packed), _stretched(kt, core_compute(
                kt, statement_point_ps(kt, True))), core)
    around = [_stretched(kt, ex.mul(kt.hw.compute.point_ps(statement_ops(s), s.dtype),
                                    around_points(kt, s)))
              for s in kt.kernel.prologue + kt.kernel.epilogue]
    return ex.add(core, *around)


def _stretched(kt: KernelTerms, work: ex.Int) -> ex.Int:
    """`work` (one innermost unit's) x max(issue_share, units) for each shared pipeline,
    written as the max of the two products (x * max(a, u) = max(x * a, x * u), x >= 0).
    The same value, but each product's bounds see its factors: `work * units` is the
    points of all the units sharing the pipeline, which the bounds pair with the units
    there are (transformer/upmem's GEMMs: at least the optimum's compute). With the max
    as one factor, the bounds took the fewest points per unit (the most units) and the
    least stretch (the fewest units) at once: 11/16 of it."""
    options = [work]
    for i in _shared_pipelines(kt):
        share = kt.hw.levels[kt.slots[i].level_index].issue_share
        options = [ex.scale(o, f) for o in options for f in (share, kt.units(i))]
    return ex.maximum(*options)


def around_points(kt: KernelTerms, stmt: Statement) -> ex.Int:
    """Points one innermost unit computes of a prologue or epilogue statement: its
    target's tile in the innermost memory, once per time that tile is (re)made (the
    loops around it, as `transfer_loops` counts them). Written per dimension as one
    product of its factors, like `tensor_transfer_cost`, so the bounds stay tight."""
    return tile_points(kt, kt.kernel.use(stmt.target), stmt.dims)


def tile_points(kt: KernelTerms, use: TensorUse, dims: Sequence[str]) -> ex.Int:
    """Elements over `dims` of `use`'s tile in the innermost memory, times the number of
    times one unit makes that tile (its copies, as `transfer_loops` counts them)."""
    innermost = len(kt.slots) - 1
    counted, optional = transfer_loops(kt, use, innermost)
    return ex.mul(*optional, *(kt.dim_product(d, counted[d] | {innermost}) if d in dims
                               else kt.dim_product(d, counted[d]) for d in kt.kernel.dims))


def blocking_bounds(kt: KernelTerms, workload: Workload) -> list[NamedConstraint]:
    from synth.constraints import transfers  # builds on this module
    return transfers.blocking_bounds(kt, workload)


def implied_compute_bounds(kt: KernelTerms) -> list[NamedConstraint]:
    """Redundant: a shared pipeline issues at most one instruction per cycle, so compute
    takes at least the points of all units sharing it. True of every schedule (it follows
    from the max in `compute_cost`), but stated in a form whose bound the solver sees
    (the product form pairs the most units with the least stretch)."""
    out: list[NamedConstraint] = []
    if kt.kernel.online is not None:  # its points are per statement (`core_compute`)
        from synth.constraints.online_terms import implied_bounds  # builds on this module
        return implied_bounds(kt, _shared_pipelines(kt), compute_cost(kt))
    for i in _shared_pipelines(kt):
        all_units = ex.mul(*(kt.dim_product(d, [*kt.temporal(), i]) for d in kt.kernel.dims))
        out.append(NamedConstraint(
            "implied", f"kernel {kt.kernel.name}: compute takes the points of all "
            f"{kt.slots[i].name} units sharing a pipeline",
            ex.Cmp(compute_cost(kt), ">=", ex.mul(_least_point_ps(kt), all_units))))
    return out


def _shared_pipelines(kt: KernelTerms) -> list[int]:
    return [i for i, slot in enumerate(kt.slots) if slot.kind is SlotKind.SPATIAL
            and kt.hw.levels[slot.level_index].issue_share > 1]


def _point_ps(kt: KernelTerms) -> int:
    """Cost of one point of the kernel's core statements."""
    return sum(kt.hw.compute.point_ps(statement_ops(s), s.dtype) for s in kt.kernel.core)


def _least_point_ps(kt: KernelTerms) -> int:
    """The cheapest a point can be, packed or not (for bounds true of every schedule)."""
    from synth.constraints.intrinsic import packable, packed_point_ps  # builds on this module
    return min(_point_ps(kt), packed_point_ps(kt)) if packable(kt) else _point_ps(kt)


def statement_ops(stmt: Statement) -> Counter[str]:
    ops = op_classes(stmt.expr)
    ops[stmt.op.op_class] += 1
    return ops


def transfer_cost(kt: KernelTerms, workload: Workload, mem: Memory, slot: int) -> ex.Int:
    from synth.constraints.combines import exchanged_on_device
    if warm(workload, mem):
        return ex.ZERO
    shared = kt.hw.level_index(mem.shared_by)
    serial = ex.mul(*(kt.units(s) for s in kt.spatial_between(shared,
                                                              kt.slots[slot].level_index)))
    total = [ex.select(exchanged_on_device(kt, use, slot), 0, _moves(kt, workload, use, mem,
                                                                      slot))
             for use in kt.moving()]
    return ex.scale(ex.add(*total), serial)


def _moves(kt: KernelTerms, workload: Workload, use: TensorUse, mem: Memory, slot: int
           ) -> ex.Int:
    itemsize = element_bytes(kt, workload, use, mem, moving=True)
    if kt.kernel.online is not None:
        from synth.constraints.online_terms import stream_cost, streamed
        if streamed(kt, use, slot):  # an online step's operand streaming through a cache
            return stream_cost(kt, workload, use, mem, itemsize)
    elif gathered(kt, use, mem):  # the ISA's gathers into the registers
        return ex.add(tensor_transfer_cost(kt, use, mem, slot, itemsize),
                      gather_starts(kt, workload, use, mem, slot))
    elif kt.hw.compute.vector_tiles:
        from synth.constraints.transfers import packed_moves, resident_moves  # builds on this
        packed = packed_moves(kt, use, mem, slot, itemsize)
        if packed is None:
            packed = resident_moves(kt, workload, use, mem, slot, itemsize)
        if packed is not None:
            return packed
    if kt.kernel.online is None and mem.ways:
        from synth.constraints.transfers import aliased_moves  # builds on this module
        return aliased_moves(kt, workload, use, mem, slot, itemsize)
    return tensor_transfer_cost(kt, use, mem, slot, itemsize)


def element_bytes(kt: KernelTerms, workload: Workload, use: TensorUse, mem: Memory,
                  moving: bool = False) -> int:
    """Bytes an element of `use` takes staying in `mem` (or, `moving`, moving into it): its
    dtype's, except in vector registers (`compute.vector_tiles`, the innermost memory),
    where a tensor without the kernel's vector dimension takes a whole register per
    element, each loaded and broadcast on its own, and one indexed by the vector
    dimension elsewhere than last is stored in vectors along it but gathered into them
    element by element, a load each (the emitter's copy). Moving into the registers, a
    broadcast or gathered element costs the bytes the registers move in its instruction's
    time where the model says it (`broadcast_cycles`, `gather_cycles`: `loaded_bytes`)."""
    itemsize = workload.tensors[use.tensor].dtype.itemsize
    if (not kt.hw.compute.vector_tiles or mem.name != kt.hw.memories[-1].name
            or not use.indices):
        return itemsize
    if kt.kernel.online is not None:  # the step's plain C arrays (`online_terms`)
        return itemsize
    vector = kt.kernel.vector
    register = max(itemsize, roofline.register_bytes(kt.hw.compute))
    compute, dtype = kt.hw.compute, workload.tensors[use.tensor].dtype.value
    if vector not in use.indices:
        if not moving:
            return register
        return loaded_bytes(kt, use, mem, register, compute.broadcast_cycles.get(dtype),
                            overlaps=True)
    if moving and use.indices[-1] != vector:
        from synth.constraints.transfers import packed_operand  # builds on this module
        if packed_operand(kt, use):
            return itemsize
        gather = compute.grouped_gather_cycles.get(dtype, compute.gather_cycles.get(dtype))
        lanes = compute.lanes.get(dtype, 1)
        return loaded_bytes(kt, use, mem, register, None if gather is None else gather / lanes,
                            overlaps=False)
    return itemsize


def gathered(kt: KernelTerms, use: TensorUse, mem: Memory) -> bool:
    """Whether the emitted code fills `use`'s tiles in `mem` with the ISA's gather: `mem`
    is the vector registers and the kernel's vector dimension indexes the tensor before
    its last axis (not a packed operand, which loads whole vectors)."""
    if (not kt.hw.compute.vector_tiles or mem.name != kt.hw.memories[-1].name
            or kt.kernel.online is not None or not use.indices or use.written):
        return False
    vector = kt.kernel.vector
    if vector not in use.indices[:-1]:
        return False
    from synth.constraints.transfers import packed_operand  # builds on this module
    return not packed_operand(kt, use)


def gather_starts(kt: KernelTerms, workload: Workload, use: TensorUse, mem: Memory,
                  slot: int) -> ex.Int:
    """The time a register tile the emitted code gathers (`gathered`: the caller checks)
    pays once per fill on top of its
    gathers' own (`compute.grouped_gather_cycles` each): a gather between other
    instructions takes `compute.gather_cycles`, several back to back (a register tile of
    several vectors, which the emitter gathers one after the other) less each. On AMD Zen
    5 (RESULTS.md, "Gathers alone and in runs"): 20.5 cycles a gather alone, 13.5 in runs
    of 2 to 8. Priced whole, not at an exposed share: a gather is microcoded, and the
    core's FMAs do not run beside it (a [1 x 16] tile with one gather and one FMA per
    step ran 20 cycles a step; its FMA's chain alone takes 4)."""
    compute, dtype = kt.hw.compute, workload.tensors[use.tensor].dtype.value
    alone = compute.gather_cycles.get(dtype)
    grouped = compute.grouped_gather_cycles.get(dtype, alone)
    if alone is None or grouped is None or alone <= grouped:
        return ex.ZERO
    fills = ex.mul(kt.partials(slot, use), transfer_count(kt, use, slot))
    return ex.mul(round((alone - grouped) * 1e12 / compute.clock_hz), fills)


def loaded_bytes(kt: KernelTerms, use: TensorUse, mem: Memory, register: int,
                 cycles: float | None, overlaps: bool) -> int:
    """Bytes an element of `use` costs at `mem`'s rate (the registers) where the emitted
    code loads it by a broadcast (an operand without the vector dimension, one element
    into every lane) or by the ISA's gather (a vector's lanes from as many rows): the
    bytes `mem` moves in `cycles`, the instruction's per element
    (`compute.broadcast_cycles`, or `compute.gather_cycles` over the lanes); `register`
    (a whole register per element) where the model does not say (None), or where the
    kernel writes the tensor so (lane by lane). On AMD Zen 5 (RESULTS.md, "Max as one
    instruction") a broadcast takes half a cycle (two load ports), where a register's 64
    bytes at the registers' 63 B/cycle priced one: a GEMM's [8 x 16] register tiles, 8
    broadcasts and a load per 8 FMAs, ran 0.69 cycles per FMA and were priced 1.3; a
    gather of 16 f32 lanes from separate L1 lines takes 20-24 cycles, 1.5 a lane."""
    # a broadcast is a load like others, which compute hides but for the exposed share: at
    # the model's own rate; a gather, microcoded, stalls the core for its whole time: at the
    # rate `mem` is priced at (the exposed share's, where it is one)
    rate = kt.hw.memory(mem.name).ps_per_byte if overlaps else mem.ps_per_byte
    if cycles is None or use.written or rate <= 0:
        return register
    return max(1, round(cycles * 1e12 / kt.hw.compute.clock_hz / rate))


def warm(workload: Workload, mem: Memory) -> bool:
    """Whether every tensor of the workload stays in `mem` (a `warm` cache) between runs."""
    total = sum(t.dtype.itemsize * math.prod(t.shape) for t in workload.tensors.values())
    return mem.warm and total <= mem.usable


def tensor_transfer_cost(kt: KernelTerms, use: TensorUse, mem: Memory, slot: int,
                         itemsize: int, once: bool = False) -> ex.Int:
    """Time one unit spends moving `use`'s tiles between `mem` and its parent (`once`:
    each distinct tile once, see `transfer_loops`).

    Per dimension of the tensor, (times moved) x (tile extent) is one product of that
    dimension's factors, which `dim_product` writes compactly (tiled: `tiled`)."""
    if kt.hw.compute.tiling.edge:
        return tiled.tiled_transfer_cost(kt, use, mem, slot, itemsize)
    kept = None if once else kept_in_cache(kt, use, mem, slot, itemsize)
    counted, optional = transfer_loops(kt, use, slot, mem.cache, once, kept)
    inner = set(kt.inner(slot))
    partials = kt.partials(slot, use)
    last = use.indices[-1] if use.indices else None
    common = ex.mul(partials, *optional,
                    *(kt.dim_product(d, counted[d] | inner) for d in use.indices[:-1]),
                    *(kt.dim_product(d, counted[d]) for d in kt.kernel.dims
                      if d not in use.indices))
    run = run_terms(kt, use, mem, slot, itemsize)
    moves_last = kt.dim_product(last, counted[last]) if last else ex.ONE
    if last:  # bytes: the run's elements, plus the padding of each run
        moved = ex.add(ex.mul(itemsize, kt.dim_product(last, counted[last] | inner)),
                       ex.mul(moves_last, run.waste_bytes))
    else:
        moved = run.padded_bytes
    operations = ex.mul(common, moves_last, run.chunks)
    directions = int(use.read) + int(use.written)
    per_byte = (mem.ps_per_byte * directions if not use.written or not mem.store_ps_per_byte
                else mem.ps_per_byte * int(use.read) + mem.store_ps_per_byte)
    packed = pack_runs(kt, use, mem, slot)
    runs = ex.ZERO if packed is None else ex.mul(mem.run_latency_ps, common, moves_last, packed)
    return ex.add(ex.mul(_latency_ps(mem, use), operations),
                  ex.scale(moved, per_byte, common), runs)


def pack_runs(kt: KernelTerms, use: TensorUse, mem: Memory, slot: int) -> ex.Int | None:
    """The runs a row of `use`'s tile at `slot` (in `mem`) is read in from the parent,
    where each costs `mem.run_latency_ps`: the C emitter packs the tensor (a contraction
    operand, `transfers.packed_operand`) into the pack memory inside (`vectors.
    pack_memory`, cpu: each core's L2), reading its tile there row by row, so a row here
    is read in as many runs as it holds pack tiles along the tensor's last axis (one
    where a pack tile spans the row). None where runs are not priced: no run latency, a
    tensor the kernel reads in place (its runs are the inner loops' walk as the
    prefetchers follow it: mv's matrix, read from DRAM by L1 tiles 16 to 128 columns
    wide, ran 1.9-3.6 ms priced alike; RESULTS.md, "Weights past the L3"), or no pack
    memory inside `slot`."""
    if not mem.run_latency_ps or not use.indices or use.written:
        return None
    from synth.constraints.transfers import packed_operand  # builds on this module
    from synth.vectors import pack_memory

    packer = pack_memory(kt.hw)
    inner = [i for i, m in _memory_slots(kt) if i > slot and m.name == packer]
    if not inner or not packed_operand(kt, use):
        return None
    return kt.dim_product(use.indices[-1], range(slot, inner[0]))


def _latency_ps(mem: Memory, use: TensorUse) -> int:
    """The fixed costs of moving `use`'s tile once each way it moves: in (read) at the
    memory's `latency`, out (written) at its write latency."""
    return mem.latency_ps * int(use.read) + mem.store_latency_ps * int(use.written)


def reduced_into(kernel: KernelSpec, use: TensorUse) -> list[str]:
    """The dimensions the kernel's statements reduce into a written tensor (which it
    does not carry)."""
    dims = [d for s in kernel.statements if s.target == use.tensor for d in s.reduced]
    return [d for d in dict.fromkeys(dims) if d not in use.indices] if use.written else []


# ---------------------------------------------------------------- helpers


def _root_slot(kt: KernelTerms) -> int:
    return next(i for i, s in enumerate(kt.slots) if s.name == kt.hw.root_memory.name)


def _memory_slots(kt: KernelTerms) -> list[tuple[int, Memory]]:
    """(slot index, memory) for every memory below the root."""
    return [(i, kt.hw.memory(s.name)) for i, s in enumerate(kt.slots)
            if s.kind is SlotKind.TEMPORAL and s.name != kt.hw.root_memory.name]


def _parent_slot(kt: KernelTerms, slot: int) -> int:
    return max(i for i in range(slot) if kt.slots[i].kind is SlotKind.TEMPORAL)


def _parent_row(kt: KernelTerms, dim: str, slot: int) -> ex.Int:
    """How much of `dim` the buffer a tile at `slot` is copied from holds: its parent
    memory's tile, or the whole (padded) dimension when that is the root memory, which
    holds whole tensors (with `streams`, its slot comes after the spatial ones, so its
    tile is one unit's share, not the buffer)."""
    parent = _parent_slot(kt, slot)
    if kt.slots[parent].name == kt.hw.root_memory.name:
        return kt.tile(dim, 0)
    return kt.tile(dim, parent)


def evaluate_cost(model: Model, env: dict[str, int]) -> dict[str, int]:
    """The cost breakdown of a complete assignment, in plain Python."""
    return {part: ex.evaluate(term, env) for part, term in model.constraints.breakdown.items()}
