"""The UPMEM emitter's view of a program before any C is written: the target (ranks,
DPUs and memories the program uses), where a buffer's elements lie (`Layout`), and each
kernel's plan (`plan_kernel`): the host's part with the one launch in place, the launch
being the part that runs on the DPUs (its rank and DPU loops, MRAM buffers and host
transfers). `synth.emit.upmem` writes the DPU programs from it, `synth.emit.upmem_host`
the host's."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from synth.emit.cstyle import EmitError, Names, term
from synth.hardware import Hardware, Memory
from synth.ir.nodes import (
    Affine,
    Alloc,
    BufferDecl,
    Combine,
    Fill,
    Kernel,
    Load,
    Loop,
    LoopKind,
    LoopVar,
    Node,
    OnlineCombine,
    Program,
    Store,
    walk,
)

DMA_ALIGN = 8  # bytes: both ends of every MRAM<->WRAM or host<->MRAM transfer
LEVELS = ("host", "rank", "dpu", "tasklet")
MEMORIES = ("host", "mram", "wram")


# ---------------------------------------------------------------- the target


@dataclass(frozen=True)
class Target:
    """The UPMEM facts the emitter uses, from the hardware model and the program."""

    hw: Hardware
    ranks: int  # R: ranks the program allocates
    dpus_per_rank: int  # D
    mram: Memory
    wram: Memory

    @staticmethod
    def of(program: Program, hw: Hardware) -> Target:
        levels = tuple(lvl.name for lvl in hw.levels)
        memories = tuple(m.name for m in hw.memories)
        if levels != LEVELS or memories != MEMORIES:
            raise EmitError(f"the UPMEM emitter needs levels {' > '.join(LEVELS)} and "
                            f"memories {' > '.join(MEMORIES)}; hardware {hw.name} has "
                            f"levels {' > '.join(levels)} and memories {' > '.join(memories)}")
        return Target(hw, _count(program, hw, "rank"), _count(program, hw, "dpu"),
                      hw.memory("mram"), hw.memory("wram"))

    @property
    def dma_max(self) -> int | None:
        return self.wram.rules.max_bytes

    def row_multiple(self, memory: str) -> int:
        """Rows of a buffer are padded to this many bytes: the memory's transfer multiple,
        and at least what DMA alignment needs."""
        if memory == "host":
            return 1
        return math.lcm(self.hw.memory(memory).rules.multiple, DMA_ALIGN)


def _count(program: Program, hw: Hardware, level: str) -> int:
    symbol = hw.level(level).symbol
    if symbol is None or symbol not in program.counts:
        raise EmitError(f"program {program.workload}: no count for level {level}")
    return program.counts[symbol]


# ---------------------------------------------------------------- buffer layout


@dataclass(frozen=True)
class Layout:
    """Where a buffer's elements lie: one instance per partial result (outermost), each
    rows of `row` elements (the innermost axis padded to the row multiple)."""

    partials: tuple[int, ...]  # extent of each partial axis
    shape: tuple[int, ...]
    row: int

    @property
    def strides(self) -> tuple[int, ...]:
        """Elements between neighbours along each axis of the tile."""
        strides, step = [], 1
        for axis in reversed(range(len(self.shape))):
            strides.append(step)
            step *= self.row if axis == len(self.shape) - 1 else self.shape[axis]
        return tuple(reversed(strides))

    @property
    def instance(self) -> int:
        return math.prod(self.shape[:-1]) * self.row

    @property
    def size(self) -> int:
        return math.prod(self.partials) * self.instance


def partial_offset(lay: Layout, loops: Iterable[str]) -> Affine:
    """Where the partial result for the current values of `loops` starts in a buffer."""
    offset, stride = Affine(), lay.instance
    for loop, extent in reversed(list(zip(loops, lay.partials, strict=True))):
        offset = offset + term(loop, stride)
        stride *= extent
    return offset


def layout(decl: BufferDecl, target: Target, loops: Mapping[str, LoopVar]) -> Layout:
    itemsize = decl.dtype.itemsize
    multiple = target.row_multiple(decl.memory)
    width = (decl.shape[-1] if decl.shape else 1) * itemsize
    row = -(-width // multiple) * multiple // itemsize
    return Layout(tuple(loops[p].extent for p in decl.partial_loops), decl.shape, row)


# ---------------------------------------------------------------- the plan of a kernel


@dataclass(frozen=True)
class Launch:
    """The part of a kernel that runs on the DPUs, started once per iteration of the host
    loops around it."""

    grid: tuple[LoopVar, ...]  # rank and dpu loops, outermost first
    host_loops: tuple[LoopVar, ...]  # host loops around the launch, outermost first
    mram: tuple[BufferDecl, ...]
    loads: tuple[Load, ...]  # host -> MRAM, before the launch
    stores: tuple[Store, ...]  # MRAM -> host, after it
    device: tuple[Node, ...]  # what the DPU program runs

    def level_units(self, level: str) -> int:
        return math.prod(v.extent for v in self.grid if v.where == level)


@dataclass(frozen=True)
class HostLoop:
    var: LoopVar
    body: tuple[HostNode, ...]


HostNode = Node | HostLoop | Launch


@dataclass(frozen=True)
class KernelPlan:
    kernel: Kernel
    ident: str  # the kernel's C name: dpu_<ident>.c, run_<ident>
    body: tuple[HostNode, ...]  # the host's part, the launch in place
    launch: Launch
    loops: Mapping[str, LoopVar]  # every loop of the kernel, by name
    buffers: Mapping[str, BufferDecl]  # every buffer it can name (globals included)
    tasklets: int  # NR_TASKLETS: the most tasklet units it uses at once

    def layout(self, name: str, target: Target) -> Layout:
        return layout(self.buffers[name], target, self.loops)


def plan_program(program: Program, target: Target) -> list[KernelPlan]:
    names = Names(("host", "standin", "check", "clean", "all"))
    return [plan_kernel(k, program, target, names(k.name)) for k in program.kernels]


def plan_kernel(kernel: Kernel, program: Program, target: Target, ident: str) -> KernelPlan:
    loops = {n.var.name: n.var for n in walk(kernel.body) if isinstance(n, Loop)}
    buffers = {d.name: d for d in program.globals}
    buffers.update({n.buffer.name: n.buffer for n in walk(kernel.body) if isinstance(n, Alloc)})
    splitter = _Splitter(kernel, buffers)
    body = splitter.host_body(kernel.body, ())
    if len(splitter.launches) != 1:
        raise EmitError(f"kernel {kernel.name}: expected one part that runs on the DPUs, got "
                        f"{len(splitter.launches)}")
    launch = splitter.launches[0]
    for level, count in (("rank", target.ranks), ("dpu", target.dpus_per_rank)):
        if launch.level_units(level) > count:
            raise EmitError(f"kernel {kernel.name}: its {level} loops need "
                            f"{launch.level_units(level)} units, the program allocates {count}")
    return KernelPlan(kernel, ident, body, launch, loops, buffers,
                      max(_tasklet_regions(launch.device), default=1))


def _is_grid(var: LoopVar) -> bool:
    return var.kind is LoopKind.PARALLEL and var.where in ("rank", "dpu")


def is_tasklet_loop(node: Node) -> bool:
    return (isinstance(node, Loop) and node.var.kind is LoopKind.PARALLEL
            and node.var.where == "tasklet")


def tasklet_chain(loop: Loop) -> tuple[list[LoopVar], tuple[Node, ...]]:
    """Directly nested tasklet loops (one region of tasklets) and their innermost body."""
    chain, body = [loop.var], loop.body
    while len(body) == 1 and is_tasklet_loop(body[0]):
        inner = body[0]
        assert isinstance(inner, Loop)
        chain.append(inner.var)
        body = inner.body
    return chain, body


def _tasklet_regions(nodes: tuple[Node, ...]) -> list[int]:
    """Tasklet units of every region (outermost tasklet loop chain) in `nodes`."""
    units = []
    for node in nodes:
        if is_tasklet_loop(node):
            assert isinstance(node, Loop)
            chain, _ = tasklet_chain(node)
            units.append(math.prod(v.extent for v in chain))
        elif isinstance(node, Loop):
            units.extend(_tasklet_regions(node.body))
    return units


class _Splitter:
    """Splits a kernel's nest into the host's part and the launch (the DPUs' part)."""

    def __init__(self, kernel: Kernel, buffers: Mapping[str, BufferDecl]) -> None:
        self.kernel = kernel
        self.buffers = buffers
        self.launches: list[Launch] = []

    def memory(self, buffer: str) -> str:
        if buffer not in self.buffers:
            raise EmitError(f"kernel {self.kernel.name}: no buffer named {buffer}")
        return self.buffers[buffer].memory

    def on_host(self, node: Node) -> bool:
        if isinstance(node, Loop):
            return node.var.where == "host"
        if isinstance(node, Alloc):
            return node.buffer.memory == "host"
        if isinstance(node, Fill):
            return self.memory(node.buffer) == "host"
        if isinstance(node, Combine):  # of partial results: on the host, or across tasklets
            return self.memory(node.target) == "host"
        if isinstance(node, OnlineCombine):  # the same, of running statistics
            return self.memory(node.running) == "host"
        return False

    def host_body(self, nodes: tuple[Node, ...], around: tuple[LoopVar, ...]
                  ) -> tuple[HostNode, ...]:
        out: list[HostNode] = []
        run: list[Node] = []  # consecutive nodes that run on the DPUs

        def flush() -> None:
            if run:
                self.launches.append(self.launch(tuple(run), around))
                out.append(self.launches[-1])
                run.clear()

        for node in nodes:
            if not self.on_host(node):
                run.append(node)
                continue
            flush()
            if isinstance(node, Loop):
                out.append(HostLoop(node.var, self.host_body(node.body, around + (node.var,))))
            else:
                out.append(node)
        flush()
        return tuple(out)

    def launch(self, nodes: tuple[Node, ...], around: tuple[LoopVar, ...]) -> Launch:
        grid: list[LoopVar] = []
        while len(nodes) == 1 and isinstance(nodes[0], Loop) and _is_grid(nodes[0].var):
            grid.append(nodes[0].var)
            nodes = nodes[0].body
        for node in walk(nodes):
            if isinstance(node, Loop) and node.var.where in ("rank", "dpu", "host"):
                raise EmitError(f"kernel {self.kernel.name}: the {node.var.where} loop "
                                f"{node.var.name} is not directly around the DPUs' part")
        mram = tuple(n.buffer for n in nodes if isinstance(n, Alloc) and n.buffer.memory == "mram")
        names = {d.name for d in mram}
        loads = [n for n in nodes if isinstance(n, Load) and n.dst in names]
        stores = [n for n in nodes if isinstance(n, Store) and n.src in names]
        device = tuple(n for n in nodes if n not in loads and n not in stores
                       and not (isinstance(n, Alloc) and n.buffer.name in names))
        self._check_order(nodes, loads, stores, device)
        return Launch(tuple(grid), around, mram, tuple(loads), tuple(stores), device)

    def _check_order(self, nodes: tuple[Node, ...], loads: list[Load], stores: list[Store],
                     device: tuple[Node, ...]) -> None:
        """Host transfers can only happen before and after a launch."""
        positions = [i for i, n in enumerate(nodes) if any(n is d for d in device)]
        first, last = (positions[0], positions[-1]) if positions else (len(nodes), -1)
        for i, node in enumerate(nodes):
            if (node in loads and i > first) or (node in stores and i < last):
                raise EmitError(f"kernel {self.kernel.name}: {node} sits between DPU "
                                f"statements; the host can only move data around a launch")
