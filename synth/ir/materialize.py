"""Turn a solved schedule into a loop nest.

For each kernel, the loops follow the hierarchy's slots outermost first (loops with one
iteration are left out). Each tensor gets a buffer in every memory below the root, loaded
at the point `synth.constraints.cost.copy_loops` prescribes (the same rule the cost model
counts transfers with) and stored back at the end of that scope when written. The
innermost memory's factor is the compute tile.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

from synth.constraints import expr as ex
from synth.constraints.combines import device_combine_memory
from synth.constraints.cost import Model, pass_loops_inside, reduced_into
from synth.constraints.space import KernelSpec, Slot, SlotKind, TensorUse
from synth.hardware import Memory
from synth.ir.nodes import (
    Affine,
    Alloc,
    BufferDecl,
    Combine,
    Compute,
    Fill,
    Kernel,
    Load,
    Loop,
    LoopKind,
    LoopVar,
    Node,
    Program,
    Store,
)
from synth.workload import ReduceOp, Statement


def materialize(model: Model, env: Mapping[str, int]) -> Program:
    """The loop nest of the schedule that `env` (a complete assignment) describes."""
    globals_ = tuple(_global_buffer(model, name) for name in model.workload.tensors)
    chosen = model.selected(env)
    kernels = tuple(KernelBuilder(model, spec, env).build() for spec in chosen)
    counts = {s.symbol: env[s.symbol] for s in model.slots if s.kind is SlotKind.SPATIAL}
    extents = {spec.name: dict(spec.extents) for spec in chosen}
    return Program(model.workload.name, model.hw.name, model.hw.root_memory.name, globals_,
                   kernels, counts, extents)


def _global_buffer(model: Model, name: str) -> BufferDecl:
    tensor = model.workload.tensors[name]
    dims = tuple(f"{name}.{k}" for k in range(len(tensor.shape)))
    return BufferDecl(name, name, model.hw.root_memory.name, dims, tensor.shape,
                      tuple(Affine() for _ in tensor.shape), tensor.dtype)


@dataclass(frozen=True)
class _Placed:
    """A buffer and the loop depth its load and store sit at."""

    depth: int
    order: float  # memory order: parents are loaded first and stored last
    decl: BufferDecl
    parent: str
    use: TensorUse
    combine: ReduceOp | None = None  # an on-device combine buffer: filled with the
    # identity, and folded into `parent` after the loops instead of stored


class KernelBuilder:
    """Builds one kernel's nest from the factor values of `env`."""

    def __init__(self, model: Model, spec: KernelSpec, env: Mapping[str, int]) -> None:
        self.model = model
        self.spec = spec
        self.slots = model.slots
        self.factor = {(d, s): ex.evaluate(model.factors.of(spec.name, d, s), env)
                       for d in spec.dims for s in range(len(self.slots))}
        self.inward = pass_loops_inside(self.slots, spec)
        self.loops = self._loops()
        self.on_device = {slot for slot, term in model.combines.get(spec.name, {}).items()
                          if ex.evaluate(term, env) == 1}
        self.buffers = {slot: ex.evaluate(term, env)
                        for slot, term in model.buffers.get(spec.name, {}).items()}
        self.innermost = model.hw.memories[-1].name
        # operands whose innermost tile the units share (`constraints.sharing`)
        self.shared = {tensor for tensor, term in model.shares.get(spec.name, {}).items()
                       if ex.evaluate(term, env) == 1}
        # targets of core reductions completed in one innermost tile: filled there
        self.initialised = {s.target: s.op.identity(s.dtype) for s in spec.core
                            if spec.initialised(s)}

    # -- loops -------------------------------------------------------------------

    def _loops(self) -> list[tuple[int, LoopVar]]:
        """(slot index, loop) for every loop with more than one iteration, in nest order."""
        loops = []
        innermost = len(self.slots) - 1
        for index, slot in enumerate(self.slots):
            if index == innermost:
                continue  # the innermost memory's factor is the compute tile
            kind = LoopKind.PARALLEL if slot.kind is SlotKind.SPATIAL else LoopKind.SEQUENTIAL
            for dim in self.spec.dims:
                extent = self.factor[(dim, index)]
                if extent > 1:
                    name = f"{slot.symbol.lower()}_{dim}"
                    symbol = f"{slot.symbol}.{self.spec.name}.{dim}"
                    loops.append((index, LoopVar(name, dim, symbol, extent,
                                                 self.tile(dim, index + 1), kind, slot.name)))
        inward = {(lp.slot, lp.dim) for lp in self.inward}  # first inside the units
        moved = [(s, v) for s, v in loops if (s, v.dim) in inward]
        rest = [(s, v) for s, v in loops if (s, v.dim) not in inward]
        last_spatial = max((i for i, s in enumerate(self.slots)
                            if s.kind is SlotKind.SPATIAL), default=-1)
        at = sum(1 for s, _ in rest if s <= last_spatial)
        return rest[:at] + moved + rest[at:]

    def tile(self, dim: str, first_slot: int) -> int:
        size = 1
        for s in range(first_slot, len(self.slots)):
            size *= self.factor[(dim, s)]
        return size

    def origin(self, dim: str, depth: int) -> Affine:
        """Offset along `dim` fixed by the first `depth` loops."""
        return Affine(tuple((v.name, v.step) for _, v in self.loops[:depth] if v.dim == dim))

    # -- buffers -----------------------------------------------------------------

    def _placements(self) -> list[_Placed]:
        placed = []
        memories = self.model.hw.memories
        innermost = len(self.slots) - 1
        for order, (slot, mem) in enumerate(self._memory_slots(), start=1):
            parent_of: dict[str, str] = {}
            for use in self.spec.uses:
                if use.local and slot != innermost:
                    continue  # a fused intermediate lives in the innermost memory only
                depth = self._copy_depth(slot, use)
                decl = self._buffer(use, mem, slot, depth)
                parent = (use.tensor if order == 1 else
                          f"{use.tensor}_{memories[order - 1].name}")
                if order == 1 and self._root_partial_loops(use):
                    parent = f"{use.tensor}_partials"
                parent_of[use.tensor] = parent
                placed.append(_Placed(depth, order, decl, parent, use))
        return placed

    def _memory_slots(self) -> list[tuple[int, Memory]]:
        root = self.model.hw.root_memory.name
        return [(i, self.model.hw.memory(s.name)) for i, s in enumerate(self.slots)
                if s.kind is SlotKind.TEMPORAL and s.name != root]

    def _copy_depth(self, slot: int, use: TensorUse) -> int:
        """How many loops enclose the copy of `use` into the memory at `slot`: the rule of
        `copy_loops` (everything up to the last parallel slot above the memory, then only
        up to the last loop that walks the tensor), applied to concrete factors."""
        last_spatial = max((i for i in range(slot) if self.slots[i].kind is SlotKind.SPATIAL),
                           default=-1)
        depth = 0
        for position, (loop_slot, var) in enumerate(self.loops, start=1):
            inward = any(lp.slot == loop_slot and lp.dim == var.dim for lp in self.inward)
            encloses = ((loop_slot <= last_spatial and not inward)
                        or (loop_slot < slot and var.dim in use.indices))
            if encloses:
                depth = position
        return depth

    def _buffer(self, use: TensorUse, mem: Memory, slot: int, depth: int) -> BufferDecl:
        tensor = self.model.workload.tensors[use.tensor]
        partials = tuple(v.name for s, v in self.loops[depth:]
                         if s > slot and self._splits_reduction(s, v, use))
        return BufferDecl(
            name=f"{use.tensor}_{mem.name}", tensor=use.tensor, memory=mem.name,
            dims=use.indices, shape=tuple(self.tile(d, slot) for d in use.indices),
            origin=tuple(self.origin(d, depth) for d in use.indices), dtype=tensor.dtype,
            partial_loops=partials,
            buffers=1 if use.local else self.buffers.get(slot, 1),
            shared=self._sharing(use, mem, slot, depth))

    def _sharing(self, use: TensorUse, mem: Memory, slot: int, depth: int
                 ) -> tuple[str, ...]:
        """The parallel loops around a shared innermost tile whose units share it: those
        of the levels between the memory's instance and its owner (UPMEM: the tasklet
        loops under a DPU's WRAM)."""
        if use.tensor not in self.shared or slot != len(self.slots) - 1:
            return ()
        hw = self.model.hw
        return tuple(v.name for _, v in self.loops[:depth] if v.kind is LoopKind.PARALLEL
                     and hw.shares_instance(mem, hw.level_index(v.where)))

    def _root_partial_loops(self, use: TensorUse) -> tuple[str, ...]:
        return tuple(v.name for s, v in self.loops if self._splits_reduction(s, v, use))

    def _splits_reduction(self, slot: int, loop: LoopVar, use: TensorUse) -> bool:
        """A parallel loop over a dimension reduced into the written tensor `use`, whose
        units hand their partial results outwards (not combined on the device)."""
        return slot not in self.on_device and self._reduces_across(loop, use)

    def _reduces_across(self, loop: LoopVar, use: TensorUse) -> bool:
        return loop.kind is LoopKind.PARALLEL and loop.dim in reduced_into(self.spec, use)

    def _device_combines(self, placed: list[_Placed]) -> list[_Placed]:
        """For each unit level that combines on the device and each tensor it reduces
        into: a buffer in the shared memory holding the parent memory's tile once per
        unit, beside the parent's tile; the units' tiles exchange with it."""
        extra: list[_Placed] = []
        for slot in sorted(self.on_device):
            mem = device_combine_memory(self.model, slot)
            for p in [p for p in placed if p.decl.memory == self.slots[
                    _parent_memory_slot(self.slots, slot)].name and p.combine is None]:
                loops = tuple(v.name for s, v in self.loops
                              if s == slot and self._reduces_across(v, p.use))
                if not loops:
                    continue
                decl = dataclasses.replace(p.decl, name=f"{p.use.tensor}_{mem}_combine",
                                           memory=mem, partial_loops=loops, buffers=1)
                extra.append(_Placed(p.depth, p.order + 0.5, decl, p.decl.name, p.use,
                                     self._reduce_op(p.use.tensor)))
        return extra

    def _reduce_op(self, tensor: str) -> ReduceOp:
        return next(s.op for s in self.spec.statements if s.target == tensor and s.op.reduces)

    # -- the nest ----------------------------------------------------------------

    def build(self) -> Kernel:
        placed = self._placements()
        combines = self._device_combines(placed)
        into = {p.parent: p.decl.name for p in combines}  # parent tile -> combine buffer
        placed = [dataclasses.replace(p, parent=into[p.parent]) if p.parent in into else p
                  for p in placed] + combines
        body = self._level(0, placed)
        return Kernel(self.spec.name, tuple(s.name for s in self.spec.statements),
                      self._prologue() + body + self._epilogue(), vector=self.spec.vector)

    def _level(self, depth: int, placed: list[_Placed]) -> tuple[Node, ...]:
        here = sorted((p for p in placed if p.depth == depth), key=lambda p: p.order)
        nodes: list[Node] = []
        for p in here:
            nodes.append(Alloc(p.decl))
            if p.combine is not None:
                nodes.append(Fill(p.decl.name, p.combine.identity(p.decl.dtype)))
            elif p.use.read and not p.use.local:
                nodes.append(Load(p.decl.name, p.parent))
            elif p.decl.memory == self.innermost and p.use.tensor in self.initialised:
                nodes.append(Fill(p.decl.name, self.initialised[p.use.tensor]))
        nodes.extend(self._around(self.spec.prologue, depth))
        if depth < len(self.loops):
            nodes.append(Loop(self.loops[depth][1], self._level(depth + 1, placed)))
        else:
            nodes.extend(self._computes(self.spec.core, depth))
        nodes.extend(self._around(self.spec.epilogue, depth))
        merge = self._online_merge(here)
        for p in reversed(here):
            if p.combine is not None and merge is not None and p.use.tensor in merge[1]:
                if p.use.tensor == merge[1][0]:  # the running maximum's: merged at once
                    nodes.append(merge[0])
            elif p.combine is not None:
                nodes.append(Combine(p.parent, p.decl.name, p.combine))
            elif p.use.written and not p.use.local:
                nodes.append(Store(p.decl.name, p.parent))
        return tuple(nodes)

    def _online_merge(self, here: list[_Placed]) -> tuple[Node, tuple[str, ...]] | None:
        """The on-device combines at one place of an online kernel's running statistics,
        as one `OnlineCombine` (`ir.online.online_merge`), with the tensors it merges
        (the running maximum first); None where there are none."""
        plan = self.spec.online
        combines = {p.use.tensor: (p.parent, p.decl.name) for p in here
                    if p.combine is not None}
        if plan is None or plan.target not in combines:
            return None
        from synth.ir.online import online_merge  # builds on this module
        return online_merge(plan, combines)

    def _computes(self, statements: tuple[Statement, ...], depth: int) -> list[Node]:
        """Each statement over one compute tile (the innermost memory's), at `depth`; in an
        online kernel, its running maximum's update with the rescale of the sums."""
        nodes = self._plain_computes(statements, depth)
        plan = self.spec.online
        if plan is None or not any(s.name == plan.statement for s in statements):
            return nodes
        from synth.ir.online import online_step  # builds on this module
        return online_step(self, nodes, plan)

    def _plain_computes(self, statements: tuple[Statement, ...], depth: int) -> list[Node]:
        return [Compute(
            statement=stmt.name, out=f"{stmt.target}_{self.innermost}",
            operands={t: f"{t}_{self.innermost}" for t in stmt.inputs},
            dims=stmt.dims, origin=tuple(self.origin(d, depth) for d in stmt.dims),
            tile=tuple(self.tile(d, len(self.slots) - 1) for d in stmt.dims))
            for stmt in statements]

    def _around(self, statements: tuple[Statement, ...], depth: int) -> list[Node]:
        """The prologue or epilogue statements that run at `depth`: where their target's
        tile in the innermost memory is allocated, outside the loops they do not
        iterate (the rule `cost.compute_cost` counts their runs with)."""
        innermost_slot = len(self.slots) - 1
        at_depth = tuple(s for s in statements if self._copy_depth(
            innermost_slot, self.spec.use(s.target)) == depth)
        return self._computes(at_depth, depth)

    def _prologue(self) -> tuple[Node, ...]:
        """Fresh targets start from the identity; split reductions get partial buffers."""
        nodes: list[Node] = []
        for stmt in self.spec.statements:
            identity = stmt.op.identity(stmt.dtype)
            local = self.spec.online is not None and self.spec.use(stmt.target).local
            if stmt.op.reduces and not stmt.accumulates and not local:  # (an online
                nodes.append(Fill(stmt.target, identity))  # kernel's scores: never read)
            partial_loops = self._root_partial_loops(TensorUse(stmt.target, stmt.indices,
                                                                True, True))
            if partial_loops:
                tensor = self.model.workload.tensors[stmt.target]
                root = self.model.hw.root_memory.name
                nodes.append(Alloc(BufferDecl(
                    f"{stmt.target}_partials", stmt.target, root, stmt.indices, tensor.shape,
                    tuple(Affine() for _ in tensor.shape), tensor.dtype, partial_loops)))
                nodes.append(Fill(f"{stmt.target}_partials", identity))
        return tuple(nodes)

    def _epilogue(self) -> tuple[Node, ...]:
        """The host's combines of the partial results of split reductions; an online
        kernel's running statistics split across units that hand them to the host (ranks,
        DPUs: `combines.host_merges`) merged by one `OnlineCombine` instead."""
        split = [s for s in self.spec.statements
                 if self._root_partial_loops(TensorUse(s.target, s.indices, True, True))]
        plan = self.spec.online
        merged: tuple[str, ...] = ()
        nodes: list[Node] = []
        if plan is not None and any(s.target == plan.target for s in split):
            from synth.ir.online import online_merge  # builds on this module
            merge, merged = online_merge(plan, {s.target: (s.target, f"{s.target}_partials")
                                                for s in split})
            nodes.append(merge)
        return tuple(nodes) + tuple(Combine(s.target, f"{s.target}_partials", s.op)
                                    for s in split if s.target not in merged)


def _parent_memory_slot(slots: tuple[Slot, ...], slot: int) -> int:
    """The temporal slot (memory) just outside `slot`."""
    return max(i for i in range(slot) if slots[i].kind is SlotKind.TEMPORAL)
