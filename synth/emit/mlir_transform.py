"""transform.mlir: the schedule as transform-dialect ops on source.mlir (see
`TransformWriter`), kept apart from `mlir.py`, which writes schedule.mlir and source.mlir.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from synth.emit.cstyle import Code
from synth.emit.mlir import INDENT, SsaNames, distinct_accesses, memory_spaces
from synth.hardware import Hardware
from synth.ir.nodes import (
    Alloc,
    BufferDecl,
    Compute,
    Kernel,
    Loop,
    LoopKind,
    LoopVar,
    Node,
    Program,
    walk,
)
from synth.workload import Num, ReduceOp, Role, SizeRef, Statement, Workload

__all__ = ["TransformWriter", "transform_text"]


@dataclass(frozen=True)
class Level:
    """Loops of one kernel that one tiling op reproduces: directly nested loops of the
    same kind at the same level or memory that enclose the same statements."""

    loops: tuple[LoopVar, ...]
    statements: tuple[str, ...]  # whose computes they enclose, in program order
    children: tuple[Level, ...]
    kind: LoopKind

    @property
    def where(self) -> str:
        return self.loops[0].where


def levels(nodes: tuple[Node, ...], order: Sequence[str]) -> tuple[Level, ...]:
    return tuple(_level(node, order) for node in nodes if isinstance(node, Loop))


def _enclosed(nodes: tuple[Node, ...], order: Sequence[str]) -> tuple[str, ...]:
    inside = {n.statement for n in walk(nodes) if isinstance(n, Compute)}
    return tuple(s for s in order if s in inside)


def _level(loop: Loop, order: Sequence[str]) -> Level:
    statements = _enclosed(loop.body, order)
    chain, body = [loop.var], loop.body
    while True:
        inner = [n for n in body if isinstance(n, Loop)]
        if len(inner) != 1:
            break
        nested = inner[0]
        if (nested.var.kind is not loop.var.kind or nested.var.where != loop.var.where
                or _enclosed(nested.body, order) != statements
                or nested.var.dim in {v.dim for v in chain}):
            break
        chain.append(nested.var)
        body = nested.body
    return Level(tuple(chain), statements, levels(body, order), loop.var.kind)


class TransformWriter:
    """transform.mlir: the schedule as transform-dialect ops on source.mlir.

    Per kernel, each level of loops (outermost first) tiles the last of the statements it
    encloses (the consumer) by the loops' steps: `tile_using_forall` for parallel loops
    over dims the statement does not reduce, `tile_reduction_using_forall` for parallel
    loops over dims it does (partial results and their combine, as synth splits them),
    `tile_using_for` for sequential loops. The other statements inside the loops are
    fused into them with `fuse_into_containing_op`, consumers first. Two limits of
    upstream shape what happens inside sequential loops:

    - it cannot fuse a producer through an `scf.for`'s iteration argument, so where one
      statement computes the destination another accumulates into (a fill feeding a
      matmul) over dims the loop does not reduce, the level is tiled with
      `transform.structured.fuse`, which can (and which must not be used over reduced
      dims: it would fuse the destination's fill into the reduction loop);
    - `fuse_into_containing_op` aborts the process ("SmallVector unable to grow") when
      the producer is also used after the `scf.for`, so a statement whose value is read
      outside the loop stays in the enclosing loop (computed per tile of that loop:
      the same values, less locality);
    - it finds no producer to fuse when nothing inside the loop reads the statement
      (its readers stayed outside), so such a statement stays outside too (a layer norm's
      mean on cpu, an online kernel's running maximum: `mlir_online`).

    Last, each statement's innermost tile reads its operands from the memory space of
    the buffers its compute uses, and an accumulator kept across a sequential reduction
    loop lives in its memory for the whole loop (partial results of a split reduction
    stay where upstream puts them). That is `promote_tensor` (an allocation in the space
    that one-shot-bufferize honours) rather than `bufferize_to_allocation`, which takes
    only op handles, and on the `extract_slice` producing a tile allocates the whole
    tensor it slices.
    """

    def __init__(self, program: Program, workload: Workload, hw: Hardware) -> None:
        self.program, self.workload = program, workload
        self.spaces = memory_spaces(hw)
        self.names = SsaNames()
        self.code = Code(INDENT)
        self.handles: dict[str, str] = {}  # statement -> handle of its current op
        self.accumulators: dict[str, str] = {}  # statement -> its outermost reduction loop
        self.split: set[str] = set()  # statements tiled with partial results
        self.stuck: set[str] = set()  # statements left in an enclosing loop

    def render(self) -> str:
        code = self.code
        code(f"// synth's schedule of {self.workload.name} on {self.program.hardware} as "
             f"transform-dialect ops on source.mlir")
        code("module attributes {transform.with_named_sequence} {")
        code.depth += 1
        root = self.names("root")
        code(f"transform.named_sequence @__transform_main({root}: !transform.any_op "
             f"{{transform.readonly}}) {{")
        code.depth += 1
        code("// the statements' ops, by their synth.statement tags")
        for stmt in self.workload.statements:
            handle = self.names(stmt.name)
            code(f"{handle} = {self.match(stmt.name, root)}")
            self.handles[stmt.name] = handle
        for kernel in self.program.kernels:
            self.kernel(kernel)
        code("transform.yield")
        code.depth -= 1
        code("}")
        code.depth -= 1
        code("}")
        return code.text()

    @staticmethod
    def match(statement: str, within: str) -> str:
        return (f'transform.structured.match attributes {{synth.statement = "{statement}"}} '
                f"in {within} : (!transform.any_op) -> !transform.any_op")

    def kernel(self, kernel: Kernel) -> None:
        self.code()
        self.code(f"// kernel {kernel.name}: statements {', '.join(kernel.statements)}")
        for level in levels(kernel.body, kernel.statements):
            self.level(level)
        buffers = {d.name: d for d in self.program.globals}
        buffers.update({n.buffer.name: n.buffer for n in walk(kernel.body)
                        if isinstance(n, Alloc)})
        for node in walk(kernel.body):
            if isinstance(node, Compute):
                self.promote(node, buffers)

    def sizes(self, stmt: Statement, loops: Sequence[LoopVar], reduced: bool) -> list[int]:
        """Tile sizes per dim of `stmt`: the loops' steps along its dims that it reduces
        (`reduced`) or does not."""
        sizes = [0] * len(stmt.dims)
        for var in loops:
            if var.dim in stmt.dims and (var.dim in stmt.reduced) == reduced:
                sizes[stmt.dims.index(var.dim)] = var.step
        return sizes

    def level(self, level: Level) -> None:
        for group in self.consumer_groups(level.statements):
            self.tile_group(level, group)
        for child in level.children:
            self.level(child)

    def consumer_groups(self, statements: Sequence[str]) -> list[list[str]]:
        """`statements` as groups that tiling one consumer can fuse: the last statement
        and those that feed it (transitively), then the same for the rest. Statements
        that only share an input (e = exp(x); a = 2e; b = e + 1 inside one loop) need
        a loop each: upstream fuses producers into a consumer's loop, never siblings."""
        remaining, groups = list(statements), []
        while remaining:
            group = [remaining[-1]]
            for name in reversed(remaining[:-1]):
                if any(self.feeds(name, member) for member in group):
                    group.insert(0, name)
            groups.append(group)
            remaining = [name for name in remaining if name not in group]
        return groups

    def feeds(self, producer: str, consumer: str) -> bool:
        """Whether `consumer` reads, or accumulates into, what `producer` computes."""
        made, used = self.workload.statement(producer), self.workload.statement(consumer)
        return made.target in used.inputs or (used.accumulates and used.target == made.target)

    def tile_group(self, level: Level, statements: Sequence[str]) -> None:
        """Tile the group's consumer by the level's loops and fuse the rest into them."""
        stmt = self.workload.statement(statements[-1])
        loops = ", ".join(f"{v.name} ({v.dim}, step {v.step})" for v in level.loops)
        self.code(f"// {level.kind.value} {loops} at {level.where}: tile {stmt.name}"
                  + (f", fuse {', '.join(statements[:-1])}" if len(statements) > 1 else ""))
        parallel, reduced = (self.sizes(stmt, level.loops, False),
                             self.sizes(stmt, level.loops, True))
        if not any(parallel) and not any(reduced):
            self.code(f"// (these loops do not walk {stmt.name}'s dims: nothing to tile)")
        elif level.kind is LoopKind.PARALLEL:
            if any(parallel):
                self.tile_forall(stmt, parallel, statements)
            if any(reduced):
                self.tile_split(stmt, reduced, statements)
        elif self.feeds_destination(statements) and not any(reduced):
            self.tile_fused_for(stmt, parallel, statements)
        else:
            self.tile_for(stmt, [p + r for p, r in zip(parallel, reduced, strict=True)],
                          statements, reduces=any(reduced))

    def feeds_destination(self, statements: Sequence[str]) -> bool:
        """Whether one statement computes what a later one accumulates into."""
        return any(self.destination_of(s, statements) for s in statements)

    def destination_of(self, producer: str, statements: Sequence[str]) -> bool:
        """Whether a later one of `statements` accumulates into what `producer` computes."""
        stmt = self.workload.statement(producer)
        later = [self.workload.statement(s) for s in statements[statements.index(producer)
                                                                 + 1:]]
        return any(s.accumulates and s.op.reduces and s.target == stmt.target for s in later)

    def escapes(self, producer: str, statements: Sequence[str]) -> bool:
        """Whether what `producer` computes is used outside `statements`: an output, or
        read by a later statement elsewhere."""
        stmt = self.workload.statement(producer)
        if self.workload.tensors[stmt.target].role is Role.OUTPUT:
            return True
        after = self.workload.statements[self.workload.statements.index(stmt) + 1:]
        return any(s.name not in statements and (stmt.target in s.inputs
                                                 or (s.accumulates and s.target == stmt.target))
                   for s in after)

    def tiled(self, op: str, stmt: Statement, loops: int) -> list[str]:
        """Run a tiling op on `stmt`'s handle: the new handle, then one per loop."""
        tiled = self.names(f"{stmt.name}_tiled")
        made = [self.names(f"{stmt.name}_loop") for _ in range(loops)]
        types = ", ".join(["!transform.any_op"] * (1 + loops))
        self.code(f"{', '.join([tiled, *made])} = {op} : (!transform.any_op) -> ({types})")
        self.handles[stmt.name] = tiled
        return made

    def fuse(self, statements: Sequence[str], into: str, sequential: bool = False) -> None:
        """Fuse the statements before the consumer into `into`, consumers first (see
        the class docstring for what stays outside an scf.for)."""
        inside = {statements[-1]}
        for name in reversed(statements[:-1]):
            if name in self.stuck:
                continue
            if not any(self.feeds(name, member) for member in inside):
                self.code(f"// {name} stays outside: nothing in the loop reads it (its "
                          f"readers stay outside), so upstream finds no use to fuse it at")
                self.stuck.add(name)
                continue
            if sequential and self.destination_of(name, statements):
                self.code(f"// {name} stays outside: upstream cannot fuse a destination "
                          f"through scf.for's iteration argument")
                self.stuck.add(name)
                continue
            if sequential and self.escapes(name, statements):
                self.code(f"// {name} stays outside: it is used after the loop, and upstream "
                          f"fuse_into_containing_op aborts on such a producer in scf.for")
                self.stuck.add(name)
                continue
            fused, loop = self.names(f"{name}_fused"), self.names("loop")
            self.code(f"{fused}, {loop} = transform.structured.fuse_into_containing_op "
                      f"{self.handles[name]} into {into} : (!transform.any_op, "
                      f"!transform.any_op) -> (!transform.any_op, !transform.any_op)")
            self.handles[name] = fused
            inside.add(name)

    def tile_forall(self, stmt: Statement, sizes: list[int], statements: Sequence[str]
                    ) -> None:
        handle = self.handles[stmt.name]
        (loop,) = self.tiled(f"transform.structured.tile_using_forall {handle} tile_sizes "
                             f"{sizes}", stmt, 1)
        self.fuse(statements, loop)

    def tile_split(self, stmt: Statement, sizes: list[int], statements: Sequence[str]
                   ) -> None:
        """Parallel units that split a reduction: partial results, then their combine."""
        handle = self.handles[stmt.name]
        fill, split, merge, loop = (self.names(f"{stmt.name}_{part}") for part in
                                    ("partials_init", "partial", "combine", "units"))
        self.code(f"{fill}, {split}, {merge}, {loop} = transform.structured."
                  f"tile_reduction_using_forall {handle} by tile_sizes = {sizes} : "
                  f"(!transform.any_op) -> (!transform.any_op, !transform.any_op, "
                  f"!transform.any_op, !transform.any_op)")
        self.handles[stmt.name] = split
        self.split.add(stmt.name)
        self.fuse(statements, loop)

    def tile_for(self, stmt: Statement, sizes: list[int], statements: Sequence[str],
                 reduces: bool) -> None:
        handle = self.handles[stmt.name]
        loops = self.tiled(f"transform.structured.tile_using_for {handle} tile_sizes {sizes}",
                           stmt, sum(1 for s in sizes if s))
        if reduces and stmt.name not in self.accumulators:
            self.accumulators[stmt.name] = loops[0]
        self.fuse(statements, loops[-1], sequential=True)

    def tile_fused_for(self, stmt: Statement, sizes: list[int], statements: Sequence[str]
                       ) -> None:
        handle = self.handles[stmt.name]
        loops = self.tiled(f"transform.structured.fuse {handle} tile_sizes {sizes}", stmt,
                           sum(1 for s in sizes if s))
        self.code("// (fuse pulls in every producer; the statements synth keeps here are "
                  "found again inside the loop)")
        for name in statements[:-1]:
            if name in self.stuck:
                continue
            found = self.names(f"{name}_fused")
            self.code(f"{found} = {self.match(name, loops[-1])}")
            self.handles[name] = found

    def promote(self, node: Compute, buffers: Mapping[str, BufferDecl]) -> None:
        """The innermost tile's operands in the memory spaces of synth's buffers (of
        this kernel, by name)."""
        stmt = self.workload.statement(node.statement)
        handle = self.handles[stmt.name]
        fill = stmt.op is ReduceOp.ASSIGN and isinstance(stmt.expr, Num | SizeRef)
        operands: list[tuple[str, int, str]] = []  # (handle, operand index, buffer)
        if not fill:
            operands += [(handle, k, node.operands[a.tensor])
                         for k, a in enumerate(distinct_accesses(stmt))]
        if stmt.name in self.accumulators:
            # the accumulator stays in its memory across the reduction loop: scf.for's
            # operands are lower bound, upper bound, step, then the iteration arguments
            operands.append((self.accumulators[stmt.name], 3, node.out))
        elif not fill and stmt.name not in self.split:
            operands.append((handle, len(distinct_accesses(stmt)), node.out))
        for owner, index, buffer in operands:
            space = self.spaces[buffers[buffer].memory]
            if space == 0:
                continue
            value = self.names(f"{buffer}_value")
            self.code(f"// {buffer} in memory space {space}")
            self.code(f"{value} = transform.get_operand {owner}[{index}] : "
                      f"(!transform.any_op) -> !transform.any_value")
            self.code(f"{self.names(buffer)} = transform.structured.promote_tensor to {space} "
                      f"{value} : !transform.any_value")


def transform_text(program: Program, workload: Workload, hw: Hardware) -> str:
    return TransformWriter(program, workload, hw).render()
