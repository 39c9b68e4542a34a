"""Packed operand panels for the C emitter's contractions (as BLIS packs them).

A contraction `T[..] += X[..] * Y[..]` runs as a register-blocked micro-kernel: the
register tile of T stays in vector accumulators while the loops over the reduced
dimensions walk the operands' register tiles (`synth.emit.c`). Read straight from the
tensors, those tiles are rows far apart (a power-of-two row length puts them in the
same cache sets, and every row is another page), so the micro-kernel waits for memory.

Where the schedule places an operand's tile in the units' private cache (on `cpu`,
the per-core L2 tile of each operand), that tile is copied once, when the schedule
loads it, into a contiguous buffer laid out in the order the micro-kernel reads it:

    [blocks of the free dimensions][the reduced dimensions][offsets within a block]

where a free dimension is one the operand shares with the target and its block is the
register tile's extent along it. A register tile of the operand is then one
contiguous run of the buffer, and the next step of the reduction reads the next run.
Where the loops inside the tile walk a free dimension's blocks inside the reduction's
steps, the panels take the order of those loops instead, each loop's steps an axis, then
the register tile (`panel_parts`: [k][n / 16][n % 16] for a loop over n inside one over
k), so the register tiles read one after another are still neighbours.
Along the vector dimension the buffer is contiguous even when the tensor is not (an
operand indexed by it before its last axis is gathered from the tensor once, when
packed, instead of at every register tile). Elements of a tile past the tensor's edge
are packed as 0 (the emitted code never reads them: ragged register tiles take the
scalar path).

Every such tile with both a free and a reduced dimension, not indexed by every
dimension of the target (`synth.vectors.packable_operand`), that the kernel never
writes is packed, but one that is a single run of its tensor already (one row: every
axis but the last of extent 1), which packing would only copy. The copy walks the
tensor in its order (rows in order; the panels' order read one vector per row of a
wide tensor, a page apart), and an instance that already holds the tile at the same
origin (a loop around it that does not walk it, e.g. swiglu's x panel across the steps
along f) is not copied again: each instance
keeps the origin it holds, reset at the kernel's start. Where a loop that does not
walk the tile has loops that do inside it (loops m > n around B's panel: each step
along m meets B's panels again), the instance holds one slot per combination of those
inner loops (`revisits`), so every panel is packed once per call, as BLIS packs B's panel
once per jc/pc step, and the model's assumption (the tile's fills are cache traffic
overlapped with compute) holds. The cost model does not
price the copies yet (a copy term made CP-SAT's search far slower). `PACKING = False`
turns packing off (the tests' unpacked path). The buffers are file-scope, allocated on
the first call (one per parallel unit) and kept for the process's lifetime, so
repeated calls pay no page faults.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from synth.emit.c_check import ALIGN, padded  # panels start on a line, as tensors do
from synth.emit.cstyle import Code
from synth.hardware import Hardware
from synth.ir.nodes import Affine, Alloc, BufferDecl, Compute, Kernel, Loop, LoopKind, Node
from synth.vectors import contraction, pack_memory, packable_operand, vectorisable
from synth.workload import Access, Statement, Workload

if TYPE_CHECKING:
    from synth.emit.c import KernelWriter

PACKING = True
MAX_PACK_BYTES = 1 << 28  # all instances of one packed tile


@dataclass(frozen=True)
class Part:
    """A loop inside a packed tile that walks one of its dims: its steps are one axis of
    the panels (`Pack.parts`)."""

    var: str  # the IR loop variable
    dim: str
    extent: int
    step: int  # elements of `dim` per iteration


@dataclass(frozen=True)
class Pack:
    """A cache tile of a contraction operand, packed into panels of register tiles."""

    decl: BufferDecl
    free: tuple[str, ...]  # dims shared with the target, in the tile's order
    reduced: tuple[str, ...]  # the contraction's reduced dims, in the tile's order
    block: Mapping[str, int]  # the register tile's extent along each free dim
    parallel: tuple[tuple[str, int], ...]  # parallel loops around its allocation (IR)
    # loops around its allocation that walk it, inside one that does not: one slot (a
    # packed tile) per combination of them, so a tile met again is not packed again
    slots: tuple[tuple[str, int], ...] = ()
    # the loops inside the tile in nest order, as the panels' axes, major first, then the
    # register tile's extent along each reduced dim and the block's offsets (`reg`);
    # empty: the blocks, then the reduction, as a micro-kernel walking the reduction
    # reads them (`panel_parts`)
    parts: tuple[Part, ...] = ()
    reg: Mapping[str, int] = field(default_factory=dict)  # the register tile's extents

    @property
    def elements(self) -> int:
        return math.prod(self.decl.shape)

    @property
    def instances(self) -> int:
        return math.prod(extent for _, extent in self.parallel)

    @property
    def slot_count(self) -> int:
        return math.prod(extent for _, extent in self.slots)

    def extent(self, dim: str) -> int:
        return self.decl.shape[self.decl.dims.index(dim)]

    def blocks(self) -> list[tuple[str, int]]:
        return [(d, self.extent(d) // self.block[d]) for d in self.free]

    def flat(self, major: Mapping[str, str], inner: Mapping[str, str]) -> str:
        """The packed index (a C expression) of an element: by `Pack.parts`, each part's
        step (`major`, by loop variable), then its place in the register tile (`inner`,
        by dim: along the reduced dims, then within the blocks); without parts, its block
        along each free dim and its place along each reduced one (`major`, by dim), then
        its place in the block (`inner`)."""
        if self.parts:
            return _flat([(major[p.var], p.extent) for p in self.parts]
                         + [(inner[d], self.reg[d]) for d in self.reduced]
                         + [(inner[d], self.block[d]) for d in self.free])
        return _flat([(major[d], n) for d, n in self.blocks()]
                     + [(major[d], self.extent(d)) for d in self.reduced]
                     + [(inner[d], self.block[d]) for d in self.free])

    def index(self, start: Mapping[str, Affine], offset: Mapping[str, str],
              affine: Callable[[Affine], str]) -> str:
        """The packed element at `start[d]` + `offset[d]` from the tile's first element:
        `start` is a register tile's place in the tile (a whole number of blocks along
        the free dims), `offset` a C expression of the place within the register tile."""
        if self.parts:
            if not stepped(self.parts, start.values()):
                raise ValueError(f"{dict(start)} is not a sum of the steps of "
                                 f"{self.decl.name}'s loops")
            return self.flat({p.var: affine(Affine(((p.var, 1),), 0)) for p in self.parts},
                             offset)
        return self.flat({**{d: affine(exact_div(start[d], self.block[d])) for d in self.free},
                          **{d: _plus(affine(start[d]), offset[d]) for d in self.reduced}},
                         offset)

    def describe(self) -> str:
        """The panels' layout, major first, for a comment."""
        if self.parts:
            major = "".join(f"[{p.dim} / {p.step} % {p.extent}]" for p in self.parts)
            reg = "".join(f"[{d} % {self.reg[d]}]" for d in self.reduced)
        else:
            major = "".join(f"[{d} / {self.block[d]}]" for d in self.free) \
                + f"[{', '.join(self.reduced)}]"
            reg = ""
        return major + reg + f"[{', '.join(f'{d} % {self.block[d]}' for d in self.free)}]"


def _plus(base: str, offset: str) -> str:
    if base == "0":
        return offset
    return base if offset == "0" else f"{base} + {offset}"


def _flat(parts: Sequence[tuple[str, int]]) -> str:
    """Row-major index of (C expression, extent) parts."""
    flat = ""
    for expr, extent in parts:
        flat = expr if not flat else f"({flat}) * {extent} + {expr}"
    return flat or "0"


def exact_div(value: Affine, by: int) -> Affine:
    if by == 1:
        return value
    if value.const % by or any(c % by for _, c in value.terms):
        raise ValueError(f"{value} is not a multiple of {by}")
    return Affine(tuple((v, c // by) for v, c in value.terms), value.const // by)


def divisible(value: Affine, by: int) -> bool:
    return value.const % by == 0 and all(c % by == 0 for _, c in value.terms)


def plan_packs(kernel: Kernel, workload: Workload, hw: Hardware,
               decls: Mapping[str, BufferDecl], parents: Mapping[str, str],
               vector: str | None) -> dict[str, Pack]:
    """The cache tiles of `kernel` to pack, by buffer name (see the module's doc): the
    operands of its contractions with a vector form along `vector`, the kernel's vector
    dimension (the cost model does not price these copies: see the module's doc)."""
    memory = pack_memory(hw)
    if memory is None or not PACKING:
        return {}
    written = {workload.statement(s).target for s in kernel.statements}
    dtypes = {name: t.dtype for name, t in workload.tensors.items()}
    parallel = _parallel_around(kernel.body, ())
    around = _loops_around(kernel.body, ())
    found: dict[str, Pack] = {}
    refused: set[str] = set()
    for node, path in _computes(kernel.body, ()):
        stmt = workload.statement(node.statement)
        operands = contraction(stmt)
        if operands is None or not vectorisable(stmt, dtypes) or vector is None \
                or vector not in stmt.dims:
            continue
        for access in operands:
            if access.tensor in written:
                continue
            reg = decls[node.operands[access.tensor]]
            tile_name = _ancestor(reg.name, memory, decls, parents)
            if tile_name is None or tile_name in refused:
                continue
            outside = around.get(tile_name, ())
            pack = _pack(stmt, access, decls[tile_name], reg, parallel.get(tile_name, ()),
                         outside, path[len(outside):])
            if pack is None or (tile_name in found and found[tile_name] != pack):
                refused.add(tile_name)
                found.pop(tile_name, None)
                continue
            found[tile_name] = pack
    return found


def _pack(stmt: Statement, access: Access, tile: BufferDecl, reg: BufferDecl,
          parallel: tuple[tuple[str, int], ...], around: Sequence[Loop] = (),
          inside: Sequence[Loop] = ()) -> Pack | None:
    dims = tile.dims
    if not packable_operand(stmt, access) or reg.dims != dims or tuple(access.indices) != dims:
        return None
    if all(extent == 1 for extent in tile.shape[:-1]):
        return None  # one run of the tensor already, in the order the panels would hold it
    free = tuple(d for d in dims if d in stmt.indices)
    reduced = tuple(d for d in dims if d in stmt.reduced)
    block = {d: reg.shape[dims.index(d)] for d in free}
    for d in free:
        axis = dims.index(d)
        if tile.shape[axis] % block[d] or not divisible(reg.origin[axis] - tile.origin[axis],
                                                        block[d]):
            return None
    extents = dict(zip(dims, reg.shape, strict=True))
    parts = panel_parts(tile, extents, free, inside)
    if not stepped(parts, (r - t for r, t in zip(reg.origin, tile.origin, strict=True))):
        parts = ()  # the register tile's place is not the sum of those loops' steps
    pack = Pack(tile, free, reduced, block, parallel, (), parts, extents)
    if pack.elements * pack.instances * tile.dtype.itemsize > MAX_PACK_BYTES:
        return None
    slotted = dataclasses.replace(pack, slots=revisits(tile, around))
    if slotted.elements * slotted.instances * slotted.slot_count * tile.dtype.itemsize \
            <= MAX_PACK_BYTES:
        return slotted
    return pack


def panel_parts(tile: BufferDecl, reg: Mapping[str, int], free: tuple[str, ...],
                inside: Sequence[Loop]) -> tuple[Part, ...]:
    """The panels' axes where the loops between the tile's allocation and the
    micro-kernel (`inside`, outermost first) walk a free dim's blocks inside a step of the
    reduction: those loops in their order (each loop's steps an axis), then the register
    tile, so the register tiles read one after another are neighbours in the buffer.
    Empty otherwise (the micro-kernel's panels: blocks, then the whole reduction), or
    where the loops do not split each dim of the tile exactly into the register tile's
    extent. The f32 matmul 1024x512x2048's sample 11 walks 32 blocks of B along n inside
    each step of k: in [n / 16][k][n % 16] those register tiles were 16 KiB apart, all in
    one set of the L1, and the program ran 84.7 ms against 38.8 modelled, 43.2 in the
    loops' order (RESULTS.md, "Panels in the loops' order")."""
    walking = [lp for lp in inside if lp.var.dim in tile.dims and lp.var.extent > 1]
    innermost = {lp.var.dim: i for i, lp in enumerate(walking)}
    if not any(innermost.get(d, -1) > i for i, lp in enumerate(walking)
               if lp.var.dim not in free for d in free):
        return ()  # no block walked inside a step of the reduction
    parts = tuple(Part(lp.var.name, lp.var.dim, lp.var.extent, lp.var.step) for lp in walking)
    for axis, d in enumerate(tile.dims):
        covered = reg[d]
        for part in sorted((p for p in parts if p.dim == d), key=lambda p: p.step):
            if part.step != covered:
                return ()
            covered *= part.extent
        if covered != tile.shape[axis]:
            return ()
    return parts


def stepped(parts: Sequence[Part], starts: Iterable[Affine]) -> bool:
    """Whether each of `starts` (a register tile's place in its packed tile, per axis) is
    a sum of `parts`' loop variables times their steps (other variables: loops of one
    step), with no constant."""
    steps = {p.var: p.step for p in parts}
    return not any(start.const or any(steps.get(v, c) != c for v, c in start.terms)
                   for start in starts)


def revisits(tile: BufferDecl, around: Sequence[Loop]) -> tuple[tuple[str, int], ...]:
    """The sequential loops around a tile's allocation that walk it (their variable is in
    its origin) inside the outermost one that does not: without a slot per combination of
    them, every step of the outer loop would pack the same tiles again (the f32 matmul
    1024x512x2048's optimum, loops m > n around B's [2048 x 64] tile, packed each of B's
    8 panels 64 times: 256 MiB copied, 2.3x the kernel's time). Empty if no loop that
    does not walk the tile has a walking one inside it."""
    walking = {v for start in tile.origin for v, c in start.terms if c}
    sequential = [lp.var for lp in around
                  if lp.var.kind is LoopKind.SEQUENTIAL and lp.var.extent > 1]
    outer = next((i for i, v in enumerate(sequential) if v.name not in walking), None)
    if outer is None:
        return ()
    return tuple((v.name, v.extent) for v in sequential[outer + 1:] if v.name in walking)


def _ancestor(name: str, memory: str, decls: Mapping[str, BufferDecl],
              parents: Mapping[str, str]) -> str | None:
    """The tile in `memory` that buffer `name` is loaded from (or stored into)."""
    while name in decls:
        if decls[name].memory == memory:
            return name
        if name not in parents:
            return None
        name = parents[name]
    return None


def _computes(nodes: Sequence[Node], path: tuple[Loop, ...]
              ) -> list[tuple[Compute, tuple[Loop, ...]]]:
    """Each compute node with the loops around it, outermost first."""
    out: list[tuple[Compute, tuple[Loop, ...]]] = []
    for node in nodes:
        if isinstance(node, Compute):
            out.append((node, path))
        elif isinstance(node, Loop):
            out.extend(_computes(node.body, path + (node,)))
    return out


def _loops_around(nodes: Sequence[Node], around: tuple[Loop, ...]
                  ) -> dict[str, tuple[Loop, ...]]:
    """Buffer name -> the loops around its allocation, outermost first."""
    out: dict[str, tuple[Loop, ...]] = {}
    for node in nodes:
        if isinstance(node, Alloc):
            out[node.buffer.name] = around
        elif isinstance(node, Loop):
            out.update(_loops_around(node.body, around + (node,)))
    return out


def _parallel_around(nodes: Sequence[Node], around: tuple[tuple[str, int], ...]
                     ) -> dict[str, tuple[tuple[str, int], ...]]:
    """Buffer name -> the parallel loops (IR name, extent) around its allocation."""
    out: dict[str, tuple[tuple[str, int], ...]] = {}
    for node in nodes:
        if isinstance(node, Alloc):
            out[node.buffer.name] = around
        elif isinstance(node, Loop):
            inner = around + ((node.var.name, node.var.extent),) \
                if node.var.kind is LoopKind.PARALLEL else around
            out.update(_parallel_around(node.body, inner))
    return out


class PackWriter:
    """The C of one kernel's packed tiles: their storage, their pointers and the copies
    into them (for `synth.emit.c.KernelWriter`, whose helpers it uses)."""

    def __init__(self, kernel: KernelWriter) -> None:
        self.k = kernel

    def source(self, name: str) -> Pack | None:
        """The packed cache tile a tile is loaded from, if any."""
        while name in self.k.parents:
            name = self.k.parents[name]
            if name in self.k.packs:
                return self.k.packs[name]
        return None

    def name(self, pack: Pack) -> str:
        """The C pointer to this unit's instance of the packed tile."""
        return self.k.w.names(f"buf:{self.k.kernel.name}:{pack.decl.name}", pack.decl.name)

    def store(self, pack: Pack) -> str:
        """The file-scope buffer holding every instance of a packed tile."""
        decl = pack.decl
        kernel = self.k.kernel.name
        name = self.k.w.names(f"pack:{kernel}:{decl.name}", f"pack_{decl.name}")
        self.k.w.helper(name, f"/* {_describe(decl)} of kernel {kernel}, packed, one per "
                              f"parallel unit: allocated on the first call, kept */\n"
                              f"static {self.k.w.ctype(decl.dtype)} *{name};")
        return name

    def storage(self, code: Code) -> None:
        """At the kernel's start: allocate the packed tiles' buffers on the first call,
        and mark every instance as holding no tile yet (its origin's key, -1)."""
        for pack in self.k.packs.values():
            store = self.store(pack)
            size = pack.elements * pack.instances * pack.slot_count * pack.decl.dtype.itemsize
            with code.block(f"if (!{store})"):
                code(f"{store} = aligned_alloc({ALIGN}, {padded(size)});")
                code(f"if (!{store}) abort();")
            keys = pack.instances * pack.slot_count * len(pack.decl.dims)
            code(f"{self.k.w.index_type} {self.key(pack)}[{keys}]; /* the origin each "
                 f"instance{' and slot' if pack.slots else ''} of {pack.decl.name} "
                 f"holds */")
            with self.k.w.for_loop(code, "k_", keys):
                code(f"{self.key(pack)}[k_] = -1;")

    def key(self, pack: Pack) -> str:
        return self.k.w.names(f"packkey:{self.k.kernel.name}:{pack.decl.name}",
                              f"{pack.decl.name}_at")

    def instance(self, pack: Pack) -> str:
        """This unit's instance and slot (one per combination of the parallel loops
        around the tile's allocation, then of its slot loops), as a C expression ("" for
        one instance)."""
        instance = ""
        for var, extent in pack.parallel + pack.slots:
            name = self.k.var(var)
            instance = name if not instance else f"({instance}) * {extent} + {name}"
        return instance

    def alloc(self, code: Code, pack: Pack) -> None:
        """The pointer to this unit's instance."""
        instance = self.instance(pack)
        at = f" + ({instance}) * {pack.elements}" if instance else ""
        panels = " x ".join(f"{d} {pack.block[d]}" for d in pack.free)
        code(f"{self.k.w.ctype(pack.decl.dtype)} *restrict {self.name(pack)} = "
             f"{self.store(pack)}{at}; /* {_describe(pack.decl)}, packed in panels of "
             f"{panels} */")

    def copy_in(self, code: Code, pack: Pack) -> None:
        """Copy a cache tile from its tensor into its panels (0 past the tensor's edge):
        whole vectors where the panels' innermost dimension is the tensor's last."""
        decl = pack.decl
        code.comment(f"pack {_describe(decl)}: {pack.describe()}, unless this instance "
                     f"holds the tile at this origin already (the kernel does not write "
                     f"{decl.tensor})")
        instance = self.instance(pack)
        base = f"({instance}) * {len(decl.dims)} + " if instance else ""
        keys = [(f"{self.key(pack)}[{base}{i}]", self.k.affine(start))
                for i, start in enumerate(decl.origin)]
        with code.block(f"if ({' || '.join(f'{k} != {v}' for k, v in keys)})"):
            for k, v in keys:
                code(f"{k} = {v};")
            self.copy_loops(code, pack)

    def copy_loops(self, code: Code, pack: Pack) -> None:
        from synth.emit.c import VECTOR_TYPES  # c builds on this module

        decl = pack.decl
        full = self.k.full(decl.dims, decl.origin, decl.shape)
        last = pack.free[-1]
        contiguous = (decl.dims[-1] == last and decl.dtype in VECTOR_TYPES
                      and pack.block[last] % self.k.lanes == 0)
        if full is None:
            self.loops(code, pack, contiguous, guarded=False)
        elif contiguous:
            with code.block(f"if ({full})"):
                self.loops(code, pack, True, guarded=False)
            with code.block("else"):
                self.loops(code, pack, False, guarded=True)
        else:
            self.loops(code, pack, False, guarded=True)

    def loops(self, code: Code, pack: Pack, vector: bool, guarded: bool) -> None:
        """The copy's loops, in the tensor's order of dims (a free dim's blocks, then its
        offsets within a block), so that the reads run through the tensor in order."""
        from synth.emit.c import VECTOR_TYPES, _nested  # c builds on this module

        decl = pack.decl
        root = self.k.root_of(decl.name)
        last = pack.free[-1]
        step = self.k.lanes if vector else 1
        names = self.k.w.names
        block = {d: names(f"pb:{d}:{len(code.lines)}", f"b_{d}") for d in pack.free}
        inner = {d: names(f"pi:{d}:{len(code.lines)}", f"i_{d}") for d in pack.free}
        reduced = {d: names(f"pr:{d}:{len(code.lines)}", f"r_{d}") for d in pack.reduced}
        within = {d: f"{inner[d]} * {step}" if d == last and step > 1 else inner[d]
                  for d in pack.free}
        # in the tensor's order (a free dim's blocks, then its offsets in a block), so the
        # reads run through the tensor row by row: walking the panels' order instead read
        # one vector per row of a tensor with 11 KiB rows (swiglu's W1), a page apart,
        # and the copies took a third of the kernel
        loops: list[tuple[str, str]] = []
        offsets: dict[str, str] = {}
        if pack.parts:  # each dim's parts, outer first, then its place in the register tile
            part = {p.var: names(f"pp:{p.var}:{len(code.lines)}", f"p_{p.dim}")
                    for p in pack.parts}
            for d in decl.dims:
                mine = sorted((p for p in pack.parts if p.dim == d), key=lambda p: -p.step)
                loops += [(part[p.var], str(p.extent)) for p in mine]
                if d in pack.reduced:
                    loops.append((reduced[d], str(pack.reg[d])))
                else:
                    loops.append((inner[d], str(pack.block[d] // step if d == last
                                                else pack.block[d])))
                local = reduced[d] if d in pack.reduced else within[d]
                offsets[d] = " + ".join([f"{part[p.var]} * {p.step}" for p in mine] + [local])
            flat = pack.flat(part, {**reduced, **within})
        else:
            for d in decl.dims:
                if d in pack.reduced:
                    loops.append((reduced[d], str(pack.extent(d))))
                else:
                    loops += [(block[d], str(pack.extent(d) // pack.block[d])),
                              (inner[d], str(pack.block[d] // step if d == last
                                             else pack.block[d]))]
            offsets = {d: f"{block[d]} * {pack.block[d]} + {within[d]}" for d in pack.free}
            offsets.update(reduced)
            flat = pack.flat({**block, **reduced}, within)
        with _nested(code, loops, self.k.w.index_type):
            index = [self.k.offset(decl, i, offsets[d]) for i, d in enumerate(decl.dims)]
            source = self.k.address(root, index)
            target = f"{self.name(pack)}[{flat}]"
            if vector:
                suffix = VECTOR_TYPES[decl.dtype][0]
                code(f"vstore_{suffix}(&{target}, vload_{suffix}(&{source}));")
            elif guarded:
                edges = self.k.bounds(decl.dims, decl.origin, decl.shape)
                inside = " && ".join(f"{index[i]} < {self.k.extents[d]}"
                                     for i, d in enumerate(decl.dims) if d in edges)
                zero = self.k.w.fill_value(0, decl.dtype)
                code(f"{target} = {inside} ? {source} : {zero};")
            else:
                code(f"{target} = {source};")


def _describe(decl: BufferDecl) -> str:
    shape = "x".join(map(str, decl.shape)) or "scalar"
    return f"{decl.memory} tile of {decl.tensor} [{shape}]"
