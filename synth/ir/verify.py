"""Whole-program checks of a loop nest against its workload and hardware.

Independent of the solver's encoding: it re-derives footprints and transfer sizes from
the IR itself, so a bug in the constraints shows up here as a rejected loop nest.

- scoping: every buffer a node names is allocated around it (or global);
- dataflow: every tile a compute reads was loaded or computed before, and every
  accumulator was loaded or filled;
- bounds: a child tile lies inside its parent's tile for every value of the loops;
- capacity: per memory instance, live tiles fit the usable bytes; on a tiled model
  (Tenstorrent) in the cost model's units: the innermost memory holds the kernel's
  dataflow buffers (`synth.ir.dataflow`: one per tile and the second ones its nest
  needs), whole tiles x tile bytes x block count each, at most `dst.MAX_BUFFERS` of them;
- transfer rules: each transfer's contiguous run meets the memory's minimum and alignment.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from synth.constraints.dst import MAX_BUFFERS
from synth.constraints.roofline import register_bytes
from synth.errors import IRError
from synth.hardware import Hardware, Memory
from synth.ir import online
from synth.ir.dataflow import block_bytes, kernel_buffers
from synth.ir.nodes import (
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
    OnlineCombine,
    Program,
    Rescale,
    Running,
    Store,
)
from synth.ir.online import check_step
from synth.tiles import lines_of_tiles
from synth.vectors import vector_dim
from synth.workload import Workload


def verify(program: Program, workload: Workload, hw: Hardware) -> None:
    """Raise IRError naming the first rule the program breaks."""
    globals_ = {b.name: b for b in program.globals}
    holding = {t.name for t in workload.inputs}  # globals that hold data so far
    for kernel in program.kernels:
        holding = KernelCheck(kernel, workload, hw, globals_, holding).run()
    for tensor in workload.outputs:
        if tensor.name not in holding:
            raise IRError(f"program: expected output {tensor.name} written by a kernel, "
                          f"got no kernel writing it")


@dataclass
class _Scope:
    buffers: dict[str, BufferDecl]
    loops: list[LoopVar]
    written: set[str] = field(default_factory=set)  # buffers holding data at this point


class KernelCheck:
    def __init__(self, kernel: Kernel, workload: Workload, hw: Hardware,
                 globals_: Mapping[str, BufferDecl], holding: set[str]) -> None:
        self.kernel = kernel
        self.workload = workload
        self.hw = hw
        self.globals = dict(globals_)
        self.holding = set(holding)
        self.usage: dict[str, int] = {}  # memory -> bytes per instance over the kernel
        self.partials: set[str] = set()  # partial-result buffers still to be combined
        self.plain = online.step_in_cache(kernel, hw)  # an online step's C arrays
        self.statistics = online.statistics(kernel)  # merged only by an online combine
        # a tiled core: blocks of each buffer over its dataflow buffers (X, X_in, ...)
        self.blocks: Counter[str] = Counter()
        self.lines = lines_of_tiles(workload) if hw.compute.tiling.edge else frozenset()
        if hw.compute.tiling.edge:
            for dfb in kernel_buffers(kernel, workload):
                self.blocks[dfb.buffer] += dfb.blocks

    def run(self) -> set[str]:
        """Check the kernel; the globals holding data after it."""
        scope = _Scope(dict(self.globals), [], set(self.holding))
        self._block(self.kernel.body, scope)
        dfbs = len(kernel_buffers(self.kernel, self.workload)) if self.blocks else 0
        if dfbs > MAX_BUFFERS:
            raise IRError(f"kernel {self.kernel.name}: expected at most {MAX_BUFFERS} "
                          f"dataflow buffers on a core, got {dfbs}")
        for memory, used in self.usage.items():
            usable = online.usable(self.kernel, self.hw, memory)
            if used > usable:
                raise IRError(f"kernel {self.kernel.name}: expected tiles in one {memory} "
                              f"to fit {usable} bytes, got {used}")
        if self.partials:
            raise IRError(f"kernel {self.kernel.name}: expected partial results "
                          f"{', '.join(sorted(self.partials))} combined, got no combine")
        return scope.written & set(self.globals)

    def _block(self, nodes: tuple[Node, ...], scope: _Scope) -> None:
        for node in nodes:
            if isinstance(node, Loop):
                node.verify()
                inner = _Scope(dict(scope.buffers), scope.loops + [node.var],
                               set(scope.written))
                self._block(node.body, inner)
                scope.written |= inner.written & set(scope.buffers)
            else:
                self._statement(node, scope)

    def _statement(self, node: Node, scope: _Scope) -> None:
        if isinstance(node, Alloc):
            node.verify()
            self._shared(node.buffer, scope)
            scope.buffers[node.buffer.name] = node.buffer
            scope.written.discard(node.buffer.name)  # a fresh allocation holds nothing
            self._account(node.buffer, scope)
            if node.buffer.memory == self.hw.root_memory.name and node.buffer.partial_loops:
                self.partials.add(node.buffer.name)
        elif isinstance(node, Load):
            child, parent = self._buf(node.dst, scope), self._buf(node.src, scope)
            what = f"load {node.dst} <- {node.src}"
            self._transfer(child, parent, scope, what)
            if node.src not in scope.written:
                raise IRError(f"{what}: expected {node.src} to hold data (loaded, computed, "
                              f"filled or stored before), got nothing written to it")
            scope.written.add(node.dst)
        elif isinstance(node, Store):
            self._written_by_units(node.src, scope, f"store {node.src} -> {node.dst}")
            child, parent = self._buf(node.src, scope), self._buf(node.dst, scope)
            self._transfer(child, parent, scope, f"store {node.src} -> {node.dst}")
            if node.src not in scope.written:
                raise IRError(f"store {node.src}: expected a tile computed or loaded before, "
                              f"got one nothing wrote")
            scope.written.add(node.dst)
        elif isinstance(node, Fill):
            self._buf(node.buffer, scope)
            self._written_by_units(node.buffer, scope, f"fill {node.buffer}")
            scope.written.add(node.buffer)
        elif isinstance(node, Compute):
            self._compute(node, scope)
        elif isinstance(node, Combine):
            for name in (node.target, node.partials):
                if name not in scope.written:
                    raise IRError(f"combine {node.partials}: expected {name} written before, "
                                  f"got nothing")
            tensor = self._buf(node.partials, scope).tensor
            if tensor in self.statistics:
                raise IRError(f"combine {node.partials}: expected the running statistic "
                              f"{tensor}'s partials merged by an online combine (rescaled "
                              f"to their common maximum), got a plain {node.op.value}")
            self.partials.discard(node.partials)
            scope.written.add(node.target)
        elif isinstance(node, OnlineCombine):
            online.check_merge(node, scope.buffers)
            merged = [(node.running, node.partials),
                      *((m.target, m.partials) for m in node.sums)]
            for name in (n for pair in merged for n in pair):
                if name not in scope.written:
                    raise IRError(f"online combine {node.partials}: expected {name} "
                                  f"written before, got nothing")
            missing = self.statistics - {scope.buffers[t].tensor for t, _ in merged}
            if missing:
                raise IRError(f"online combine {node.partials}: expected every running "
                              f"statistic merged, got none of {', '.join(sorted(missing))}")
            for target, partials in merged:
                self.partials.discard(partials)
                scope.written.add(target)
        elif isinstance(node, Running | Rescale):
            check_step(node, scope.buffers)
            self._written_by_units(node.previous if isinstance(node, Running)
                                   else node.target, scope, f"running {node.running}")
            if node.running not in scope.written:
                raise IRError(f"running {node.running}: expected the running maximum "
                              f"loaded or filled before, got nothing written to it")
            scope.written.add(node.previous)

    def _shared(self, buf: BufferDecl, scope: _Scope) -> None:
        """A tile shared by units (`BufferDecl.shared`): each sharing loop is a parallel
        loop around it whose units share the memory's instance (tasklets of a DPU's WRAM;
        its origin not over them: `BufferDecl.verify`)."""
        if not buf.shared:
            return
        mem = self.hw.memory(buf.memory)
        loops = {v.name: v for v in scope.loops}
        for name in buf.shared:
            var = loops.get(name)
            if var is None or var.kind is not LoopKind.PARALLEL or not (
                    self.hw.shares_instance(mem, self.hw.level_index(var.where))):
                raise IRError(f"buffer {buf.name}: expected the units sharing it ({name}) "
                              f"a parallel loop around it whose units share one "
                              f"{mem.name}, got {var.where if var else 'no such loop'}")

    def _written_by_units(self, name: str, scope: _Scope, what: str) -> None:
        """A shared tile is read only: loaded once for all its units, never written by
        them (their writes would race, and each unit's would be lost to the others)."""
        buf = scope.buffers.get(name)
        if buf is not None and buf.shared:
            raise IRError(f"{what}: expected a tile of its own unit, got {name}, shared by "
                          f"({', '.join(buf.shared)}) and read only")

    def _buf(self, name: str, scope: _Scope) -> BufferDecl:
        if name not in scope.buffers:
            raise IRError(f"kernel {self.kernel.name}: expected buffer {name} allocated "
                          f"around its use, got no such buffer in scope")
        return scope.buffers[name]

    def _compute(self, node: Compute, scope: _Scope) -> None:
        node.verify()
        stmt = self.workload.statement(node.statement)
        for tensor, buffer in node.operands.items():
            self._buf(buffer, scope)
            if buffer not in scope.written:
                raise IRError(f"compute {node.statement}: expected {buffer} ({tensor}) loaded "
                              f"or computed before it is read, got no such write")
        self._buf(node.out, scope)
        self._written_by_units(node.out, scope, f"compute {node.statement}")
        if stmt.op.reduces and node.out not in scope.written:
            raise IRError(f"compute {node.statement}: expected accumulator {node.out} loaded "
                          f"or filled before, got none")
        scope.written.add(node.out)

    # -- bounds and rules --------------------------------------------------------

    def _transfer(self, child: BufferDecl, parent: BufferDecl, scope: _Scope,
                  what: str) -> None:
        extents = {v.name: v.extent for v in scope.loops}
        tensor_shape = self.workload.tensors[child.tensor].shape
        for axis, size in enumerate(child.shape):
            offset = child.origin[axis] - parent.origin[axis]
            lo, hi = offset.min_value(extents), offset.max_value(extents)
            # at the root, a ragged tile may run past the tensor: the excess is masked
            at_root = parent.memory == self.hw.root_memory.name
            limit = tensor_shape[axis] if at_root else parent.shape[axis]
            if lo < 0 or (not at_root and hi + size > limit):
                raise IRError(f"{what}: expected the tile inside {parent.name} along axis "
                              f"{axis} (0..{limit - 1}), got offsets {lo}..{hi} of a "
                              f"{size}-element tile")
        mem = self.hw.memory(child.memory)
        self._rules(child, parent, mem, what)

    def _rules(self, child: BufferDecl, parent: BufferDecl, mem: Memory, what: str) -> None:
        rules = mem.rules
        itemsize = child.dtype.itemsize
        run = (child.shape[-1] if child.shape else 1) * itemsize
        padded = -(-run // rules.multiple) * rules.multiple
        if padded < rules.min_bytes:
            raise IRError(f"{what}: expected transfers of at least {rules.min_bytes} bytes "
                          f"into {mem.name}, got {padded}")
        # a tile covering its parent's whole row (padded or not) starts every run at a row
        whole_row = not child.shape or child.shape[-1] >= parent.shape[-1]
        if rules.align > 1 and run % rules.align and not whole_row:
            raise IRError(f"{what}: expected {rules.align}-byte aligned runs into "
                          f"{mem.name}, got {run}-byte runs")

    def _account(self, buf: BufferDecl, scope: _Scope) -> None:
        if buf.memory == self.hw.root_memory.name:
            return
        copies = instance_copies(buf, scope.loops, self.hw,
                                 lambda loop: _extent_of(self.kernel, loop))
        edge = self.hw.compute.tiling.edge
        if edge and buf.memory == self.hw.memories[-1].name:  # whole tiles, per DFB
            self.usage[buf.memory] = self.usage.get(buf.memory, 0) + copies * \
                self.blocks[buf.name] * block_bytes(self.kernel, buf, edge, self.lines)
            return
        self.usage[buf.memory] = self.usage.get(buf.memory, 0) + copies * \
            buffer_bytes(online.counted(self.kernel, self.hw, buf) if self.plain else buf,
                         self.hw.memory(buf.memory), buf.dtype.itemsize if self.plain
                         else element_bytes(buf, self.hw, kernel_vector(self.kernel,
                                                                        self.workload)))


def instance_copies(buf: BufferDecl, loops: Sequence[LoopVar], hw: Hardware,
                    extent: Callable[[str], int]) -> int:
    """Tiles of `buf` one memory instance holds: one per unit of the parallel loops
    around it that lie inside the memory's instance level (tasklets sharing a DPU's
    WRAM each have theirs, but for a tile they share: `BufferDecl.shared`), times its
    partial results."""
    instance = hw.level_index(hw.memory(buf.memory).instance_level)
    copies = 1
    for var in loops:
        if (var.kind is LoopKind.PARALLEL and hw.level_index(var.where) > instance
                and var.name not in buf.shared):  # a shared tile: one for its units
            copies *= var.extent
    for name in buf.partial_loops:
        copies *= extent(name)
    return copies


def kernel_vector(kernel: Kernel, workload: Workload) -> str | None:
    """The dimension the kernel's register tiles are vectors along (as the C emitter and
    the cost model take it)."""
    if kernel.vector is not None:
        return kernel.vector
    return vector_dim([workload.statement(name) for name in kernel.statements])


def element_bytes(buf: BufferDecl, hw: Hardware, vector: str | None) -> int:
    """Bytes an element of `buf` takes: its dtype's, but a whole register in the vector
    registers (`compute.vector_tiles`) for a tile without the vector dimension
    (each element is broadcast on its own; `cost.element_bytes`)."""
    itemsize = buf.dtype.itemsize
    innermost = hw.memories[-1]
    if (not hw.compute.vector_tiles or buf.memory != innermost.name or not buf.dims
            or vector in buf.dims):
        return itemsize
    return max(itemsize, register_bytes(hw.compute))


def buffer_bytes(buf: BufferDecl, mem: Memory, element: int | None = None) -> int:
    """Bytes of one tile (twice that when double buffered): rows padded to the memory's
    transfer multiple; `element` bytes per element (default: the dtype's)."""
    run = (buf.shape[-1] if buf.shape else 1) * (element or buf.dtype.itemsize)
    padded = -(-run // mem.rules.multiple) * mem.rules.multiple
    rows = 1
    for n in buf.shape[:-1]:
        rows *= n
    return rows * padded * buf.buffers


def _extent_of(kernel: Kernel, loop: str) -> int:
    def find(nodes: tuple[Node, ...]) -> int | None:
        for node in nodes:
            if isinstance(node, Loop):
                if node.var.name == loop:
                    return node.var.extent
                found = find(node.body)
                if found is not None:
                    return found
        return None

    extent = find(kernel.body)
    if extent is None:
        raise IRError(f"kernel {kernel.name}: expected a loop {loop}, got none")
    return extent
