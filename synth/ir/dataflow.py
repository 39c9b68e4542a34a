"""The dataflow buffers a tiled core (Tenstorrent) needs to run one kernel's loop nest.

A dataflow buffer connects one producer to one consumer (the reader, the compute or the
writer of a tt-lang operation). Per buffer of the innermost memory (one per tensor the
kernel touches), the kernel holds:

- `X`: the block itself (its `buffers` blocks: 2 when double buffered), from the reader
  to the compute for an operand, from the compute to the writer for a result, from the
  compute to itself for an intermediate;
- `X_in`, when X is loaded and then written (read-modify-write: a reduction into a
  target read from DRAM): the loaded block arrives in `X_in`, the result leaves in `X`;
- `X_out`, when X is computed, read by a later statement and stored (forwarded): the
  compute's readers take `X`, the writer `X_out`, since a buffer has one consumer;
- `X_acc`, two blocks, when a loop inside X's scope accumulates into it (a reduction
  split in steps): each step waits for the previous block and reserves the next, which
  one block deadlocks (the simulator shows it);
- `X_cur` and `X_scale` (one block each, X's shape), when X is the running maximum of
  the online rewrite: this step's maximum for its readers, and the rescale factor
  exp(c (X - X_prev)); the IR's previous tile X_prev is the block waited from `X_acc`
  and has no buffer of its own (`synth.emit.ttlang_online`).

`kernel_buffers` lists them from the IR (what `synth.emit.ttlang` declares); the cost
model counts the same (`synth.constraints.tiled.dataflow_terms`) in `capacity.<l1>` and
`count.buffers`, and `synth.ir.verify` checks the IR against the hardware with them.
Bytes are whole tiles: E*E elements per tile (`synth.tiles.block_tiles`).
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass

from synth.ir.nodes import (
    Alloc,
    BufferDecl,
    Compute,
    Fill,
    Kernel,
    Load,
    Loop,
    Node,
    Running,
    Store,
    walk,
)
from synth.tiles import block_tiles, lines_of_tiles, named_tile_units
from synth.workload import Num, Workload

ACCUMULATOR_BLOCKS = 2  # an accumulator read and rewritten across a loop


@dataclass(frozen=True)
class Dfb:
    """One dataflow buffer: `name` (the emitted `<name>_dfb`), the IR buffer whose block
    it holds, its role ("" the block, "in", "out" or "acc") and its block count."""

    name: str
    buffer: str
    role: str
    blocks: int


@dataclass(frozen=True)
class Roles:
    """Which of a kernel's buffers need a second (or third) dataflow buffer."""

    rmw: frozenset[str]  # loaded, then written: X_in
    forward: frozenset[str]  # computed, read by compute and stored: X_out
    accumulators: frozenset[str]  # accumulated across a loop in their scope: X_acc


def read_modify_write(kernel: Kernel) -> set[str]:
    """Buffers loaded from DRAM and computed into: the loaded block and the result
    travel in two dataflow buffers (`X_in` from the reader, `X` to the writer)."""
    loaded = {n.dst for n in walk(kernel.body) if isinstance(n, Load)}
    return {n.out for n in walk(kernel.body) if isinstance(n, Compute) and n.out in loaded}


def forwarded(kernel: Kernel) -> set[str]:
    """Buffers a compute writes, a later compute reads and the writer stores: the compute
    forwards the block to the writer through a second dataflow buffer (`X_out`), since a
    dataflow buffer has one consumer."""
    stored = {n.src for n in walk(kernel.body) if isinstance(n, Store)}
    read = {b for n in walk(kernel.body) if isinstance(n, Compute) for b in n.operands.values()}
    return stored & read


def accumulators(kernel: Kernel, workload: Workload, rmw: set[str] | frozenset[str]
                 ) -> set[str]:
    """Buffers whose block starts (loaded, filled with a constant, or set by a statement
    `C = 0`) before a loop that computes into it, or before a reduction that does not
    start from that constant (`folded`): the accumulator pattern. A block set to a
    constant that nothing in the kernel computes into after is a plain result."""
    decls = {n.buffer.name for n in walk(kernel.body) if isinstance(n, Alloc)}
    out: set[str] = set()

    def visit(body: tuple[Node, ...]) -> None:
        for index, node in enumerate(body):
            rest = body[index + 1:]
            if isinstance(node, Loop):
                visit(node.body)
            elif isinstance(node, Load) and node.dst in rmw and accumulated_in_loop(
                    node.dst, rest):
                out.add(node.dst)
            elif isinstance(node, Fill | Compute):
                start = initial(workload, decls, node)
                if start is not None and not folded(workload, start[0], start[1], rest) \
                        and any(isinstance(n, Compute) and n.out == start[0]
                                for n in walk(rest)):
                    out.add(start[0])

    visit(kernel.body)
    return out


def accumulated_in_loop(buffer: str, rest: tuple[Node, ...]) -> bool:
    """A loop after the block's start computes into it (a reduction split in steps)."""
    return any(isinstance(n, Loop) and any(isinstance(c, Compute) and c.out == buffer
                                           for c in walk(n.body)) for n in rest)


def initial(workload: Workload, decls: set[str] | frozenset[str], node: Fill | Compute
            ) -> tuple[str, float | int] | None:
    """(buffer, value) when `node` sets a block of the innermost memory to a constant (a
    fill, or a statement `C[m, n] = 0` fused before its reduction); None otherwise."""
    if isinstance(node, Fill):
        return (node.buffer, node.value) if node.buffer in decls else None
    stmt = workload.statement(node.statement)
    later = [s for s in workload.statements if s.target == stmt.target and s.accumulates]
    if isinstance(stmt.expr, Num) and later:
        return node.out, stmt.expr.value
    return None


IDENTITY = {"+=": 0, "*=": 1, "max=": -math.inf, "min=": math.inf}


def folded(workload: Workload, buffer: str, value: float | int, rest: tuple[Node, ...]
           ) -> bool:
    """An identity (0 for +=, -inf for max=) that the next statement touching its buffer
    in this body reduces into: that statement stores its value directly, no accumulator."""
    for node in rest:
        if isinstance(node, Compute) and node.out == buffer:
            op = workload.statement(node.statement).op.value
            return IDENTITY.get(op) == value
        if isinstance(node, Loop) and any(isinstance(n, Compute) and n.out == buffer
                                          for n in walk(node.body)):
            return False
    return False


def roles(kernel: Kernel, workload: Workload) -> Roles:
    rmw = read_modify_write(kernel)
    return Roles(frozenset(rmw), frozenset(forwarded(kernel)),
                 frozenset(accumulators(kernel, workload, rmw)))


def kernel_decls(kernel: Kernel) -> dict[str, BufferDecl]:
    """The kernel's buffers (the innermost memory's on a tiled model), by name."""
    return {n.buffer.name: n.buffer for n in walk(kernel.body) if isinstance(n, Alloc)}


def kernel_buffers(kernel: Kernel, workload: Workload,
                   accumulator_blocks: int = ACCUMULATOR_BLOCKS) -> list[Dfb]:
    """Every dataflow buffer of the kernel, in the order the emitter declares them."""
    found = roles(kernel, workload)
    steps = {n.running: n.previous for n in walk(kernel.body) if isinstance(n, Running)}
    out = []
    for name, decl in kernel_decls(kernel).items():
        if name in steps.values():  # the previous maximum: the block waited from X_acc
            continue
        dfbs = [Dfb(name, name, "", decl.buffers)]
        if name in steps:  # the online step: the new maximum and the rescale factor
            dfbs += [Dfb(f"{name}_cur", name, "cur", 1),
                     Dfb(f"{name}_scale", steps[name], "scale", 1)]
        if name in found.rmw:
            dfbs.insert(0, Dfb(f"{name}_in", name, "in", decl.buffers))
        if name in found.forward:
            dfbs.append(Dfb(f"{name}_out", name, "out", decl.buffers))
        if name in found.accumulators:
            dfbs.insert(0, Dfb(f"{name}_acc", name, "acc", accumulator_blocks))
        out += dfbs
    return out


def block_bytes(kernel: Kernel, decl: BufferDecl, edge: int, lines: Collection[str]) -> int:
    """Bytes one block of `decl` takes: its whole tiles (`synth.tiles.block_tiles`, the
    kernel's tiled indices; `lines`: `synth.tiles.lines_of_tiles`), E*E elements each."""
    units = named_tile_units([(d.tensor, d.dims) for d in kernel_decls(kernel).values()], edge,
                             lines)
    tiles = block_tiles(decl.dims, dict(zip(decl.dims, decl.shape, strict=True)), units)
    return tiles * edge * edge * decl.dtype.itemsize


def kernel_usage(kernel: Kernel, workload: Workload, edge: int) -> tuple[int, int]:
    """(dataflow buffers, their bytes) the kernel holds on one core."""
    decls = kernel_decls(kernel)
    dfbs = kernel_buffers(kernel, workload)
    lines = lines_of_tiles(workload)
    return len(dfbs), sum(d.blocks * block_bytes(kernel, decls[d.buffer], edge, lines)
                          for d in dfbs)
