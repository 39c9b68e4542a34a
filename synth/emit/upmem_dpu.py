"""The DPU side of the UPMEM emitter: one kernel's plan as `dpu_<kernel>.c`.

`DpuWriter` renders a kernel's DPU program (`DpuProgram`: the source and what the host and
the stand-in glue need to know of it: the launch arguments, the globals, the MRAM arrays,
the tasklets and their stack). This module also holds what that rendering decides on the
way: the double buffering of a sequential loop's WRAM tiles (`PingPong`, `ping_pong`), the
math functions copied into a DPU program from `upmem_runtime/dpu_math.c`, and which shared
buffers a run of nodes reads and writes (where the tasklets need a barrier). `synth.emit.upmem`
(the entry point: `emit_upmem`, `check_upmem`, `--emit upmem`) calls it once per kernel;
`upmem_host` writes host.c from the `DpuProgram`s; the module docstring of `synth.emit.upmem`
says how the IR maps onto a DPU.
"""

from __future__ import annotations

import contextlib
import functools
import math
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from importlib import resources

from synth.emit import upmem_online
from synth.emit.cstyle import (
    Code,
    CStyle,
    EmitError,
    Names,
    Typed,
    affine_sum,
    scale,
    statement_text,
    term,
)
from synth.emit.upmem_plan import (
    DMA_ALIGN,
    KernelPlan,
    Layout,
    Target,
    is_tasklet_loop,
    partial_offset,
    tasklet_chain,
)
from synth.ir.nodes import (
    Affine,
    Alloc,
    BufferDecl,
    Combine,
    Compute,
    Fill,
    Load,
    Loop,
    LoopKind,
    LoopVar,
    Node,
    OnlineCombine,
    Rescale,
    Running,
    Store,
    walk,
)
from synth.workload import Access, Call, Expr, Num, Workload
from synth.workload import walk as expr_nodes

# ---------------------------------------------------------------- double buffering


@dataclass(frozen=True)
class PingPong:
    """How the steps of one sequential loop on a DPU double-buffer their WRAM tiles: each
    of `tiles` (allocated in a step, `buffers == 2`) alternates between its two halves on
    the parity of the loop index, and each load in `ahead` is issued one step early, into
    the half the next step works on; the first step's are issued before the loop."""

    var: LoopVar
    tiles: frozenset[str]
    ahead: tuple[Load, ...]


def ping_pong(loop: Loop, per_tasklet: bool) -> PingPong | None:
    """The double buffering of `loop`'s steps, or None if it has none.

    Only one tasklet's tiles are double buffered: those allocated inside a tasklet loop,
    or all, when the loop itself runs inside one (`per_tasklet`); tiles of nested
    sequential loops belong to those loops. A load goes ahead only when nothing in the
    loop writes its source: the next step's tile must not depend on this step's stores
    (an accumulator read back from MRAM or from a combine buffer is loaded in place)."""
    if loop.var.kind is not LoopKind.SEQUENTIAL or loop.var.extent < 2:
        return None
    step = list(_step_nodes(loop.body, per_tasklet))
    tiles = frozenset(n.buffer.name for n in step if isinstance(n, Alloc)
                      and n.buffer.memory == "wram" and n.buffer.buffers == 2)
    if not tiles:
        return None
    written = written_buffers(loop.body)
    ahead = tuple(n for n in step if isinstance(n, Load) and n.dst in tiles
                  and n.src not in written)
    return PingPong(loop.var, tiles, ahead)


def _step_nodes(nodes: tuple[Node, ...], per_tasklet: bool) -> Iterator[Node]:
    """The nodes of one step that run as one tasklet's own work: inside tasklet loops (or
    all, when `per_tasklet`), but not inside nested sequential loops."""
    for node in nodes:
        if is_tasklet_loop(node):
            assert isinstance(node, Loop)
            yield from _step_nodes(node.body, True)
        elif not isinstance(node, Loop) and per_tasklet:
            yield node


def written_buffers(nodes: tuple[Node, ...]) -> set[str]:
    """Every buffer something in `nodes` writes (at any depth)."""
    written: set[str] = set()
    for node in walk(nodes):
        if isinstance(node, Store | Load):
            written.add(node.dst)
        elif isinstance(node, Fill):
            written.add(node.buffer)
        elif isinstance(node, Combine):
            written |= {node.target, node.partials}
        elif isinstance(node, OnlineCombine):
            written |= {n for m in ((node.running, node.partials), *(
                (s.target, s.partials) for s in node.sums)) for n in m}
        elif isinstance(node, Compute):
            written.add(node.out)
    return written


# ---------------------------------------------------------------- math on a DPU

DPU_MATH = "dpu_math.c"


@functools.cache
def dpu_math() -> Mapping[str, tuple[tuple[str, ...], str]]:
    """synth's math functions for DPU programs (`upmem_runtime/dpu_math.c`): each one's
    C definition (with the comment above it) and the functions it calls."""
    text = resources.files("synth.emit").joinpath("upmem_runtime", DPU_MATH).read_text()
    lines = text.splitlines()
    functions: dict[str, tuple[tuple[str, ...], str]] = {}
    for at, line in enumerate(lines):
        head = re.match(r"static .*\b(math_\w+)\(", line)
        if not head:
            continue
        first = at
        while first > 0 and lines[first - 1].lstrip().startswith(("/*", "*")):
            first -= 1
        last = lines.index("}", at)
        comment = " ".join(lines[first:at])
        needs = re.search(r"needs: ([\w, ]+)", comment)
        functions[head.group(1)] = (
            tuple(n.strip() for n in needs.group(1).split(",")) if needs else (),
            "\n".join(lines[first:last + 1]))
    return functions


# ---------------------------------------------------------------- the DPU program


@dataclass(frozen=True)
class DpuProgram:
    """One kernel's DPU program and what the host and the stand-in need to know of it."""

    ident: str  # dpu_<ident>
    source: str
    args_type: str  # struct <args_type>: set by the host before each launch
    args_fields: Mapping[str, str]  # loop variable -> field (plus "active")
    symbols: tuple[tuple[str, str], ...]  # (C name, "wram" | "mram") of every global
    mram_names: Mapping[str, str]  # IR buffer -> C name of its MRAM array
    tasklets: int
    stack_bytes: int  # STACK_SIZE_DEFAULT: what wram.reserved leaves per tasklet


DPU_RESERVED = (
    "me", "args", "tasklet", "read_mram", "write_mram", "tile_points", "sync_tasklets",
    "mram_read", "mram_write", "barrier_wait", "mem_alloc", "mem_reset", "BARRIER_INIT",
    "NR_TASKLETS", "STACK_SIZE_DEFAULT", "symbols", "sysname_t", "barrier_t", "done",
    "from", "to", "bytes", "src", "dst", "active", "pad")


class DpuWriter(CStyle):
    """Renders dpu_<kernel>.c from a kernel's plan."""

    emitter_name = "the UPMEM emitter"

    def __init__(self, plan: KernelPlan, workload: Workload, target: Target) -> None:
        super().__init__()
        self.plan = plan
        self.workload = workload
        self.target = target
        self.names = Names(DPU_RESERVED + tuple(dpu_math()))
        self.extents = {name: var.extent for name, var in plan.loops.items()}
        self.outer = {v.name for v in plan.launch.grid + plan.launch.host_loops}
        self.outer_used: set[str] = set()
        self.wram: dict[str, tuple[BufferDecl, int]] = {}  # WRAM array -> (decl, tiles)
        self.tiles: dict[str, str] = {}  # WRAM buffer -> C name of this unit's tile
        self.mram_names = {d.name: self.names(f"buf:{d.name}", d.name)
                           for d in plan.launch.mram}
        self.region_units = 1  # tasklet units of the region being rendered
        self.tile_units: dict[str, str] = {}  # WRAM buffer -> index of this unit's tile
        # double buffering (see PingPong): the half each tile is in, in C; the loads that
        # go one step ahead, with their loop; what index expressions take a loop's value as
        self.halves: dict[str, str] = {}
        self.ahead: dict[Load, PingPong] = {}
        self.shifts: dict[str, Affine] = {}
        self.uses_tasklet = False
        self.uses_barrier = False
        self.uses_math = False
        self.uses_string = False

    @property
    def kernel(self) -> str:
        return self.plan.kernel.name

    # -- the whole file ----------------------------------------------------------

    def render(self) -> DpuProgram:
        launch = self.plan.launch
        body = Code()
        body.depth = 1
        self.device(body, launch.device, top=True)
        args_type = self.names("struct", f"{self.plan.ident}_args")
        fields = {"active": "active"} | {v.name: self.names(f"var:{v.name}", v.name)
                                         for v in launch.grid + launch.host_loops}
        mram_names = self.mram_names
        code = Code()
        self.header(code)
        self.declarations(code, args_type, fields, mram_names)
        self.main(code, body, fields)
        symbols = (("args", "wram"),) + tuple((n, "mram") for n in mram_names.values()) + \
            tuple((self.names(f"buf:{n}"), "wram") for n in self.wram)
        args_bytes = 4 * (len(fields) + len(fields) % 2)
        stack = max(DMA_ALIGN, (self.target.wram.reserved - args_bytes)
                    // self.plan.tasklets // DMA_ALIGN * DMA_ALIGN)
        return DpuProgram(self.plan.ident, code.text(), args_type, fields, symbols,
                          mram_names, self.plan.tasklets, stack)

    def header(self, code: Code) -> None:
        kernel = self.plan.kernel
        code(f"/* dpu_{self.plan.ident}.c: the DPU program of kernel {kernel.name} of "
             f"{self.workload.name}, generated by synth.")
        code(" *")
        for name in kernel.statements:
            stmt = self.workload.statement(name)
            code(f" *   {statement_text(stmt.target, stmt.indices, stmt.op, stmt.expr)}")
        code(" *")
        code(" * Each DPU computes the tile its rank and dpu loop indices (args) select; its")
        code(" * tasklets share the tile along the tasklet loops. Built with the UPMEM SDK")
        code(f" * (dpu-upmem-dpurte-clang -DNR_TASKLETS={self.plan.tasklets}), or into the "
             f"host program")
        code(" * against synth's stand-in runtime by `make check`.")
        code(" */")
        code("#include <stdint.h>")
        if self.uses_string:
            code("#include <string.h>")
        code()
        code("#include <defs.h>")
        code("#include <mram.h>")
        if self.uses_barrier:
            code("#include <barrier.h>")
        code()
        code(f"#if NR_TASKLETS < {self.plan.tasklets}")
        code(f'#error "kernel {kernel.name} runs {self.plan.tasklets} tasklets: build with '
             f'-DNR_TASKLETS={self.plan.tasklets}"')
        code("#endif")
        code()
        if self.uses_math:
            self.float_specials(code)

    def float_specials(self, code: Code) -> None:
        """INFINITY and NAN without <math.h>, which the DPU runtime does not have."""
        code.comment("No <math.h> on a DPU (its runtime has no libm): infinities and NaN "
                     "from compiler builtins, math functions from synth (math_*, below)")
        for name, value in (("INFINITY", "__builtin_inff()"), ("NAN", '__builtin_nanf("")')):
            code(f"#ifndef {name}")
            code(f"#define {name} {value}")
            code("#endif")
        code()

    def math_function(self, name: str) -> str:
        """synth's own `math_<name>` (upmem_runtime/dpu_math.c), copied into the file with
        the functions it calls: the DPU runtime has no libm."""
        self.uses_math = True
        return self.math_helper(f"math_{name}")

    def math_helper(self, name: str) -> str:
        if name not in dpu_math():
            raise EmitError(f"{self.emitter_name} has no DPU version of "
                            f"{name.removeprefix('math_')}; add it to upmem_runtime/{DPU_MATH}")
        needs, definition = dpu_math()[name]
        for need in needs:
            self.math_helper(need)
        return self.helper(name, definition)

    def declarations(self, code: Code, args_type: str, fields: Mapping[str, str],
                     mram_names: Mapping[str, str]) -> None:
        code.comment("Set by the host before each launch: whether this DPU has a tile, and "
                     "the indices of the loops around it")
        with code.block(f"struct {args_type}"):
            for var, name in fields.items():
                loop = self.plan.loops.get(var)
                note = f" /* {loop.symbol} = {loop.extent} */" if loop else ""
                code(f"uint32_t {name};{note}")
            if len(fields) % 2:
                code("uint32_t pad; /* a multiple of 8 bytes */")
        code.lines[-1] += ";"
        code(f"__host struct {args_type} args;")
        code()
        code.comment("MRAM: this DPU's tiles, rows padded to 8 bytes; the host fills and "
                     "drains them")
        for decl in self.plan.launch.mram:
            # a double-buffered tile takes two (see the WRAM note below)
            size = self.plan.layout(decl.name, self.target).size * decl.buffers
            code(f"__mram_noinit {self.ctype(decl.dtype)} {mram_names[decl.name]}[{size}]; "
                 f"/* {describe(decl)} */")
        code()
        code.comment("WRAM: one tile per tasklet (one for the tasklets sharing it)")
        if any(decl.buffers == 2 for decl, _ in self.wram.values()):
            for line in DOUBLE_BUFFERING.splitlines():
                code(line)
        for name, (decl, tiles) in self.wram.items():
            # a double-buffered tile (decl.buffers == 2) has two halves, see above
            size = self.plan.layout(name, self.target).size * decl.buffers
            code(f"static __dma_aligned {self.ctype(decl.dtype)} {self.names(f'buf:{name}')}"
                 f"[{tiles}][{size}]; /* {describe(decl)} */")
        if self.uses_barrier:
            code()
            code("BARRIER_INIT(sync_tasklets, NR_TASKLETS);")
        for definition in self.helpers.values():
            code()
            for line in definition.splitlines():
                code(line)
        code()

    def main(self, code: Code, body: Code, fields: Mapping[str, str]) -> None:
        with code.function("int main(void)"):
            if self.uses_tasklet:
                code("const uint32_t tasklet = me();")
            with code.block("if (!args.active)"):
                code(f"return 0; /* no tile of kernel {self.kernel} on this DPU */")
            for var in sorted(self.outer_used, key=list(fields).index):
                code(f"const uint32_t {fields[var]} = args.{fields[var]};")
            code.lines.extend(body.lines)
            code("return 0;")

    # -- names -------------------------------------------------------------------

    def var(self, name: str) -> str:
        """A loop variable in C; the host's loops reach the DPU through args."""
        if name in self.outer:
            self.outer_used.add(name)
        return self.names(f"var:{name}", name)

    def ident(self, name: str) -> str:
        """C name of a loop variable, or of a local the writer made (keys start with #)."""
        return self.names(name) if name.startswith("#") else self.var(name)

    def index(self, value: Affine) -> str:
        return self.affine(self.shifted(value), self.ident).code

    def shifted(self, value: Affine) -> Affine:
        """`value` with the loop variables in `shifts` replaced (a step ahead, or the
        first step)."""
        out = Affine((), value.const)
        for var, coeff in value.terms:
            out = out + (scale(self.shifts[var], coeff) if var in self.shifts
                         else term(var, coeff))
        return out

    @contextlib.contextmanager
    def shifting(self, shifts: Mapping[str, Affine], halves: Mapping[str, str]
                 ) -> Iterator[None]:
        """Render with loop variables replaced (`shifts`) and tiles in given halves."""
        saved = (dict(self.shifts), dict(self.halves))
        self.shifts.update(shifts)
        self.halves.update(halves)
        try:
            yield
        finally:
            self.shifts, self.halves = saved

    def barrier(self, code: Code) -> None:
        if self.plan.tasklets > 1:
            self.uses_barrier = True
            code("barrier_wait(&sync_tasklets);")

    # -- code that every tasklet runs ----------------------------------------------

    def device(self, code: Code, nodes: tuple[Node, ...], top: bool = False) -> None:
        """Nodes outside tasklet loops: every tasklet runs the loops, tasklet 0 alone the
        rest; a barrier separates what one tasklet wrote in a shared buffer (MRAM, or a
        combine buffer in WRAM) from what another reads or overwrites."""
        written: set[str] = set()
        read: set[str] = set()
        items = _items(nodes)
        for position, item in enumerate(items):
            if isinstance(item, Alloc):
                self.alloc(code, item.buffer, "0")
                continue
            reads, writes = shared_access(item if isinstance(item, tuple) else (item,))
            if (reads & written) or (writes & read):
                self.barrier(code)
                written.clear()
                read.clear()
            if isinstance(item, tuple):
                # the others wait for it, unless the program ends here
                last = top and position == len(items) - 1
                if self.solo(code, item, wait=not last):
                    written.clear()
                    read.clear()
                    continue
            elif isinstance(item, Loop) and is_tasklet_loop(item):
                self.region(code, item)
            elif isinstance(item, Loop):
                self.sequential(code, item)
            written |= writes
            read |= reads

    def solo(self, code: Code, nodes: tuple[Node, ...], wait: bool) -> bool:
        """Work outside any tasklet loop: tasklet 0 does it, the others wait (when `wait`).
        Whether a barrier follows."""
        if self.plan.tasklets == 1:
            self.unit(code, nodes, "0")
            return False
        self.uses_tasklet = True
        with code.block("if (tasklet == 0)", "no tasklet loop around this: one tasklet"):
            self.unit(code, nodes, "0")
        if wait:
            self.barrier(code)
        return wait

    def sequential(self, code: Code, node: Loop) -> None:
        def step() -> None:
            self.device(code, node.body)
            reads, writes = shared_access(node.body)
            if reads & writes:  # the next step reads what another tasklet wrote
                self.barrier(code)

        var = node.var
        self.steps(code, node, f"{var.symbol} = {var.extent}: steps at {var.where}", None,
                   step)

    def region(self, code: Code, loop: Loop) -> None:
        with self.tasklets(code, loop) as body:
            self.unit(code, body, "tasklet")

    @contextlib.contextmanager
    def tasklets(self, code: Code, loop: Loop) -> Iterator[tuple[Node, ...]]:
        """A region of tasklets: the guard of the tasklets with a unit, their loop indices
        from `me()`; yields the body each of them runs."""
        chain, body = tasklet_chain(loop)
        units = math.prod(v.extent for v in chain)
        self.uses_tasklet = True
        head = f"if (tasklet < {units})" if units < self.plan.tasklets else ""
        with code.block(head, ", ".join(f"{v.name} < {v.symbol} = {v.extent}" for v in chain)
                        + " tasklets"):
            stride = units
            for v in chain:
                stride //= v.extent
                at = "tasklet" if stride == 1 else f"tasklet / {stride}"
                if v is not chain[0]:
                    at += f" % {v.extent}"
                code(f"const uint32_t {self.var(v.name)} = {at};")
            self.region_units = units
            try:
                yield body
            finally:
                self.region_units = 1

    # -- double buffering ------------------------------------------------------------

    def steps(self, code: Code, loop: Loop, comment: str, unit: str | None,
              step: Callable[[], None]) -> None:
        """A sequential loop whose body `step` renders; with double-buffered tiles, the
        first step's loads go before it and each step's tiles alternate halves. `unit` is
        the tasklet unit the loop runs in (None: outside tasklet loops)."""
        plan = ping_pong(loop, per_tasklet=unit == "tasklet")
        if plan is not None and plan.ahead:
            self.first_step(code, loop, plan, unit)
        with self.for_loop(code, self.var(loop.var.name), loop.var.extent, comment), \
                self.stepping(plan):
            step()

    @contextlib.contextmanager
    def stepping(self, plan: PingPong | None) -> Iterator[None]:
        """Inside a loop's steps: its tiles in half `index & 1`, its loads going ahead."""
        if plan is None:
            yield
            return
        saved = dict(self.ahead)
        self.ahead.update(dict.fromkeys(plan.ahead, plan))
        try:
            with self.shifting({}, dict.fromkeys(plan.tiles, f"{self.var(plan.var.name)} & 1")):
                yield
        finally:
            self.ahead = saved

    def first_step(self, code: Code, loop: Loop, plan: PingPong, unit: str | None) -> None:
        """Before the loop: the loads that go ahead, for step 0, into half 0."""
        with code.block("", f"double buffering: the first tiles of {loop.var.name}, ahead "
                            f"of the loop"), \
                self.shifting({loop.var.name: Affine()}, dict.fromkeys(plan.tiles, "0")):
            self.ahead_loads(code, loop.body, plan, unit)

    def ahead_loads(self, code: Code, nodes: tuple[Node, ...], plan: PingPong,
                    unit: str | None) -> None:
        """The allocations and loads of `nodes` that go ahead, each in its tasklet region."""
        targets = {load.dst for load in plan.ahead}
        for node in nodes:
            if is_tasklet_loop(node) and unit is None:
                assert isinstance(node, Loop)
                if any(n in plan.ahead for n in walk(node.body)):
                    with self.tasklets(code, node) as body:
                        self.ahead_loads(code, body, plan, "tasklet")
            elif isinstance(node, Alloc) and unit is not None and node.buffer.name in targets:
                self.alloc(code, node.buffer, unit)
            elif isinstance(node, Load) and unit is not None and node in plan.ahead:
                self.dma(code, node.dst, node.src, read=True)

    def prefetch(self, code: Code, load: Load) -> None:
        """The load of the next step, now, into the other half of its tile. mram_read
        returns once the tile is in WRAM, so the half is ready when the next step starts
        (and the store of the step before, from that half, has finished)."""
        plan = self.ahead[load]
        var = self.var(plan.var.name)
        decl = self.plan.buffers[load.dst]
        with code.block(f"if ({var} + 1 < {plan.var.extent})",
                        f"prefetch: {load.dst} of step {plan.var.name} + 1, into the other "
                        f"half"):
            ahead = self.names(f"ahead:{decl.name}", f"{self.tiles[decl.name]}_next")
            address = self.tile_address(decl, self.tile_units[decl.name], f"({var} + 1) & 1")
            code(f"{self.ctype(decl.dtype)} *const {ahead} = {address};")
            current = self.tiles[decl.name]
            self.tiles[decl.name] = ahead
            try:
                with self.shifting({plan.var.name: term(plan.var.name) + Affine((), 1)}, {}):
                    self.dma(code, load.dst, load.src, read=True)
            finally:
                self.tiles[decl.name] = current

    def tile_address(self, decl: BufferDecl, unit: str, half: str | None) -> str:
        """This unit's tile of a WRAM buffer: its first half, or the given one (in C)."""
        array = self.names(f"buf:{decl.name}", decl.name)
        if decl.buffers == 1 or half in (None, "0"):
            return f"{array}[{unit}]"
        size = self.plan.layout(decl.name, self.target).size
        return f"&{array}[{unit}][({half}) * {size}]"

    # -- one unit's code -------------------------------------------------------------

    def unit(self, code: Code, nodes: tuple[Node, ...], unit: str) -> None:
        """The code of one tasklet unit (`unit` is its tile index)."""
        for node in nodes:
            if isinstance(node, Loop) and node.var.kind is LoopKind.SEQUENTIAL:
                self.steps(code, node, f"{node.var.symbol} = {node.var.extent}", unit,
                           functools.partial(self.unit, code, node.body, unit))
            elif isinstance(node, Alloc):
                self.alloc(code, node.buffer, unit)
            elif isinstance(node, Load) and node in self.ahead:
                self.prefetch(code, node)
            elif isinstance(node, Load) and self.plan.buffers[node.dst].shared:
                self.shared_load(code, node)
            elif isinstance(node, Load):
                self.dma(code, node.dst, node.src, read=True)
            elif isinstance(node, Store):
                self.dma(code, node.src, node.dst, read=False)
            elif isinstance(node, Compute):
                self.compute(code, node)
            elif isinstance(node, Fill):
                self.fill(code, node)
            elif isinstance(node, Combine):
                self.combine(code, node)
            elif isinstance(node, Running):
                upmem_online.running(self, code, node)
            elif isinstance(node, Rescale):
                upmem_online.rescale(self, code, node)
            elif isinstance(node, OnlineCombine):
                upmem_online.merge(self, code, node)
            else:
                raise EmitError(f"kernel {self.kernel}: cannot run {type(node).__name__} "
                                f"{_node_name(node)} inside a DPU program")

    def alloc(self, code: Code, decl: BufferDecl, unit: str) -> None:
        """A WRAM tile: an array with one tile per tasklet unit, and this unit's pointer.
        Outside tasklet loops there is one tile, shared by the tasklets (the partial
        results of an on-device combine: one per tasklet unit inside)."""
        tiles = self.region_units if unit == "tasklet" and not decl.shared else 1
        unit = "0" if decl.shared else unit  # one tile for the tasklets sharing it
        if decl.memory != "wram":
            raise EmitError(f"kernel {self.kernel}: buffer {decl.name} in {decl.memory} is "
                            f"allocated inside the DPUs' part; only WRAM tiles can be")
        if decl.partial_loops and unit == "tasklet":
            raise EmitError(f"kernel {self.kernel}: WRAM buffer {decl.name} holds partial "
                            f"results of loops inside one tasklet's work")
        known = self.wram.get(decl.name)
        if known is not None and known[0] != decl:
            raise EmitError(f"kernel {self.kernel}: two WRAM buffers named {decl.name}")
        self.wram[decl.name] = (decl, max(tiles, known[1] if known else 1))
        tile = self.names(f"tile:{decl.name}", f"{decl.tensor}_partials" if decl.partial_loops
                          else decl.tensor)
        self.tiles[decl.name] = tile
        self.tile_units[decl.name] = unit
        half = self.halves.get(decl.name)
        note = f", half {half}" if half and decl.buffers == 2 else ""
        code(f"{self.ctype(decl.dtype)} *const {tile} = {self.tile_address(decl, unit, half)}; "
             f"/* {decl.name}: {describe(decl)}{note} */")

    def fill(self, code: Code, node: Fill) -> None:
        decl = self.plan.buffers[node.buffer]
        if node.buffer not in self.tiles:
            raise EmitError(f"kernel {self.kernel}: cannot fill {node.buffer} in "
                            f"{decl.memory} on a DPU")
        size = self.plan.layout(node.buffer, self.target).size
        k = self.names("#k", "k")
        self.uses_math = self.uses_math or not math.isfinite(node.value)
        with self.for_loop(code, k, size, f"fill {node.buffer} = {node.value}"):
            code(f"{self.tiles[node.buffer]}[{k}] = {self.fill_value(node.value, decl.dtype)};")

    # -- transfers -----------------------------------------------------------------

    def shared_load(self, code: Code, node: Load) -> None:
        """A tile the region's tasklets share (`BufferDecl.shared`): once they are all done
        with its previous contents (a barrier), tasklet 0 loads it, and the others wait
        until it is there (a barrier). Every tasklet of the region runs the same loops, so
        they meet at the same barriers (the kernel's one region of tasklets: all of its
        NR_TASKLETS)."""
        if self.region_units == 1:
            self.dma(code, node.dst, node.src, read=True)
            return
        if self.region_units != self.plan.tasklets:
            raise EmitError(f"kernel {self.kernel}: {node.dst} is shared by "
                            f"{self.region_units} tasklets of {self.plan.tasklets}; the "
                            f"barriers around its load need them all")
        self.uses_barrier = True
        code(f"barrier_wait(&sync_tasklets); /* every tasklet done with {node.dst} */")
        with code.block("if (tasklet == 0)", f"one load of {node.dst} for the "
                        f"{self.region_units} tasklets sharing it"):
            self.dma(code, node.dst, node.src, read=True)
        code(f"barrier_wait(&sync_tasklets); /* {node.dst} loaded */")

    def dma(self, code: Code, wram_name: str, mram_name: str, read: bool) -> None:
        """Move a WRAM tile from or to its parent: an MRAM buffer (DMA), or a WRAM buffer
        shared by the tasklets (a copy)."""
        wram, mram = self.plan.buffers[wram_name], self.plan.buffers[mram_name]
        what = f"{'load' if read else 'store'} {wram_name} {'<-' if read else '->'} {mram_name}"
        if wram.memory != "wram" or wram_name not in self.tiles or not (
                mram.memory == "mram" or mram_name in self.tiles):
            raise EmitError(f"kernel {self.kernel}: {what}: a DPU moves data between an "
                            f"allocated WRAM tile and an MRAM buffer or another WRAM tile only")
        w, m = (self.plan.layout(n, self.target) for n in (wram_name, mram_name))
        itemsize = wram.dtype.itemsize
        diffs = [wram.origin[a] - mram.origin[a] for a in range(len(wram.shape))]
        part = partial_offset(m, mram.partial_loops)
        contiguous = len(wram.shape) <= 1 or wram.shape[1:] == mram.shape[1:]
        fn = self.mover(read) if mram.memory == "mram" else self.copier()
        code.comment(what)
        if contiguous:
            start = part + affine_sum(scale(d, s) for d, s in zip(diffs, m.strides, strict=True))
            self.check_run(start, itemsize, w.size * itemsize, what)
            ends = (f"&{self.parent_array(mram_name)}[{self.index(start)}]",
                    self.tiles[wram_name])
            code(f"{fn}({ends[0] if read else ends[1]}, {ends[1] if read else ends[0]}, "
                 f"{w.size * itemsize});")
            return
        self.rows(code, wram, mram, w, m, part, diffs, fn, read, what)

    def rows(self, code: Code, wram: BufferDecl, mram: BufferDecl, w: Layout, m: Layout,
             part: Affine, diffs: list[Affine], fn: str, read: bool, what: str) -> None:
        """A tile whose rows are not contiguous in MRAM: one run per row (a loop over each
        leading axis with more than one row)."""
        last = len(wram.shape) - 1
        axes = [a for a in range(last) if wram.shape[a] > 1]
        keys = {a: f"#row:{a}" for a in axes}
        rows = {a: self.names(k, f"row{a}" if len(axes) > 1 else "row") for a, k in keys.items()}
        start = part + scale(diffs[last], 1) + affine_sum(
            scale(diffs[a] + (term(keys[a]) if a in keys else Affine()), m.strides[a])
            for a in range(last))
        offset = affine_sum(term(keys[a], w.strides[a]) for a in axes)
        self.check_run(start, wram.dtype.itemsize, w.row * wram.dtype.itemsize, what)
        for a in axes:
            code(f"for ({self.index_type} {rows[a]} = 0; {rows[a]} < {wram.shape[a]}; {rows[a]}++)")
            code.depth += 1
        ends = (f"&{self.parent_array(mram.name)}[{self.index(start)}]",
                f"&{self.tiles[wram.name]}[{self.index(offset)}]")
        code(f"{fn}({ends[0] if read else ends[1]}, {ends[1] if read else ends[0]}, "
             f"{w.row * wram.dtype.itemsize});")
        code.depth -= len(axes)

    def parent_array(self, name: str) -> str:
        """The C array of a transfer's parent: an MRAM buffer or a shared WRAM tile."""
        return self.mram_names[name] if name in self.mram_names else self.tiles[name]

    def copier(self) -> str:
        """copy_wram(to, from, bytes): WRAM to WRAM needs no DMA (argument order as the
        DMA helpers: the source first)."""
        self.uses_string = True
        return self.helper("copy_wram", (
            "/* Between WRAM tiles: a plain copy, no DMA */\n"
            "static inline void copy_wram(const void *from, void *to, uint32_t bytes)\n"
            "{\n    memcpy(to, from, bytes);\n}"))

    def check_run(self, start: Affine, itemsize: int, size: int, what: str) -> None:
        """Refuse to emit a DMA the hardware would reject (the verifier should have)."""
        rules = self.target.wram.rules
        if (start.const * itemsize) % DMA_ALIGN or any(
                (c * itemsize) % DMA_ALIGN for _, c in start.terms):
            raise EmitError(f"kernel {self.kernel}: {what}: a run may start at element "
                            f"{start} ({itemsize}-byte elements), not {DMA_ALIGN}-byte aligned")
        if size < rules.min_bytes:
            raise EmitError(f"kernel {self.kernel}: {what}: {size}-byte runs, below the "
                            f"{rules.min_bytes}-byte minimum of a DMA")

    def mover(self, read: bool) -> str:
        """read_mram/write_mram: mram_read/mram_write in runs of at most the DMA maximum."""
        name, call = ("read_mram", "mram_read") if read else ("write_mram", "mram_write")
        mram_end = "const __mram_ptr void *from" if read else "__mram_ptr void *to"
        wram_end = "void *to" if read else "const void *from"
        head = f"static void {name}({mram_end if read else wram_end}, " \
               f"{wram_end if read else mram_end}, uint32_t bytes)"
        limit = self.target.dma_max
        if limit is None:
            return self.helper(name, f"{head}\n{{\n    {call}(from, to, bytes);\n}}")
        src = "const __mram_ptr uint8_t *src = from;" if read else "const uint8_t *src = from;"
        dst = "uint8_t *dst = to;" if read else "__mram_ptr uint8_t *dst = to;"
        return self.helper(name, "\n".join([
            f"/* {call} moves {DMA_ALIGN}..{limit} bytes per call: longer runs go in pieces */",
            head, "{", f"    {src}", f"    {dst}",
            f"    for (uint32_t done = 0; done < bytes; done += {limit})",
            f"        {call}(src + done, dst + done, bytes - done < {limit} ? bytes - done : "
            f"{limit});",
            "}"]))

    # -- combines of the tasklets' partial results -----------------------------------

    def combine(self, code: Code, node: Combine) -> None:
        """target = op(target, reduce(partials)), by one tasklet: the partial results are
        folded into the first; the target's tile is read into the second (so no more WRAM
        is needed), folded in, and the first is written back."""
        target, partials = self.plan.buffers[node.target], self.plan.buffers[node.partials]
        lay = self.plan.layout(node.partials, self.target)
        count, size = math.prod(lay.partials), lay.instance
        if node.partials not in self.tiles or target.partial_loops or count < 2 or not (
                node.target in self.mram_names or node.target in self.tiles) \
                or self.plan.layout(node.target, self.target).size != size:
            raise EmitError(f"kernel {self.kernel}: cannot combine {node.partials} into "
                            f"{node.target} on a DPU (expected partial results of the "
                            f"target's tile in WRAM)")
        real = "float" if target.dtype.is_float else "double"
        tile, k, part = self.tiles[node.partials], self.names("#k", "k"), \
            self.names("#part", "part")
        first = Typed(f"{tile}[{k}]", target.dtype.is_float)
        later = Typed(f"{tile}[{part} * {size} + {k}]", first.is_float)
        second = Typed(f"{tile}[{size} + {k}]", first.is_float)
        code.comment(f"combine {node.target} {node.op.value} the {count} partial results in "
                     f"{node.partials} (over {', '.join(partials.partial_loops)})")
        with self.for_loop(code, part, count, start=1), self.for_loop(code, k, size):
            code(f"{first.code} = "
                 f"{self.cast(self.reduce_step(node.op, first, later, real), target.dtype)};")
        self.exchange(code, node.target, f"&{tile}[{size}]", size * target.dtype.itemsize,
                      read=True)
        with self.for_loop(code, k, size):
            code(f"{first.code} = "
                 f"{self.cast(self.reduce_step(node.op, second, first, real), target.dtype)};")
        self.exchange(code, node.target, tile, size * target.dtype.itemsize, read=False)

    def exchange(self, code: Code, buffer: str, wram: str, size: int, read: bool) -> None:
        """Move a whole tile between `buffer` (MRAM or WRAM) and the WRAM at `wram`."""
        if buffer in self.mram_names:
            mram = f"&{self.mram_names[buffer]}[0]"
            fn = self.mover(read)
        else:
            mram, fn = self.tiles[buffer], self.copier()
        code(f"{fn}({mram if read else wram}, {wram if read else mram}, {size});")

    # -- computes ------------------------------------------------------------------

    def compute(self, code: Code, node: Compute) -> None:
        stmt = self.workload.statement(node.statement)
        points = ", ".join(f"{d}: {t}" for d, t in zip(node.dims, node.tile, strict=True))
        code.comment(f"{statement_text(stmt.target, stmt.indices, stmt.op, stmt.expr)}  "
                     f"[{points}]")
        depth = code.depth
        for d, origin, tile in zip(node.dims, node.origin, node.tile, strict=True):
            var = self.names(f"#dim:{d}", d)
            bound: str | int = tile
            if origin.max_value(self.extents) + tile > stmt.extents[d]:  # a ragged tile
                bound = f"{self.points_helper()}({self.index(origin)}, {tile}, " \
                        f"{stmt.extents[d]})"
            code(f"for ({self.index_type} {var} = 0; {var} < {bound}; {var}++)")
            code.depth += 1
        real = "float" if stmt.dtype.is_float else "double"
        value = self.expr(stmt.expr, lambda acc: self.element(node, acc), self.workload.tensors,
                          real)
        target = Typed(self.element(node, Access(stmt.target, stmt.indices)), stmt.dtype.is_float)
        result = self.reduce_step(stmt.op, target, value, real)
        code(f"{target.code} = {self.cast(result, stmt.dtype)};")
        code.depth = depth
        self.uses_math = self.uses_math or _uses_math(stmt.expr)

    def element(self, node: Compute, access: Access) -> str:
        """`access` of one iteration point as an element of its WRAM tile."""
        buffer = node.out if access.tensor == self.workload.statement(node.statement).target \
            else node.operands[access.tensor]
        decl = self.plan.buffers[buffer]
        if decl.dims != access.indices or buffer not in self.tiles:
            raise EmitError(f"kernel {self.kernel}: compute {node.statement} reads "
                            f"{access.tensor}[{', '.join(access.indices)}] from {buffer}, whose "
                            f"axes are {decl.dims}; the emitter needs them to match")
        lay = self.plan.layout(buffer, self.target)
        index = affine_sum(
            scale(node.origin[node.dims.index(d)] - decl.origin[a] + term(f"#dim:{d}"), stride)
            for a, (d, stride) in enumerate(zip(decl.dims, lay.strides, strict=True)))
        return f"{self.tiles[buffer]}[{self.index(index)}]"

    def points_helper(self) -> str:
        return self.helper("tile_points", (
            "/* Points of a tile that lie inside the tensor: a ragged last tile has fewer */\n"
            "static inline uint32_t tile_points(uint32_t first, uint32_t tile, "
            "uint32_t extent)\n"
            "{\n    return first >= extent ? 0 : extent - first < tile ? extent - first : "
            "tile;\n}"))


DOUBLE_BUFFERING = """\
/* Double-buffered tiles (x2) take two halves. In the sequential loop around them, step i
 * works on half i & 1 and, before computing, loads tile i + 1 into the other half (the
 * "prefetch" blocks; tile 0 is loaded before the loop). A tile whose source the loop
 * writes (an accumulator read back every step) is loaded in place instead. mram_read and
 * mram_write return when the transfer is done (one ldma/sdma instruction, which suspends
 * the calling tasklet; the SDK has no asynchronous MRAM transfer), so a half is refilled
 * only after its store has finished. Within one tasklet the prefetch therefore only
 * orders the transfers: on a DPU the DMA engine overlaps with the compute of the other
 * tasklets, which the pipeline interleaves, with or without double buffering. */"""


def _uses_math(expr: Expr) -> bool:
    """Whether C needs <math.h> for `expr`: functions, or an infinite or NaN literal."""
    return any((isinstance(n, Call) and n.fn not in ("max", "min", "relu", "recip"))
               or (isinstance(n, Num) and not math.isfinite(n.value)) for n in expr_nodes(expr))


def shared_access(nodes: tuple[Node, ...]) -> tuple[set[str], set[str]]:
    """Buffers that tasklets may share which `nodes` read and write: the parents of loads
    and stores (MRAM buffers, combine buffers), and what combines and fills touch."""
    every = tuple(walk(nodes))
    reads = {n.src for n in every if isinstance(n, Load)}
    writes = {n.dst for n in every if isinstance(n, Store)}
    for n in every:
        if isinstance(n, Combine):
            reads |= {n.partials, n.target}
            writes |= {n.partials, n.target}
        elif isinstance(n, OnlineCombine):
            merged = {n.running, n.partials, *(x for s in n.sums for x in (s.target,
                                                                              s.partials))}
            reads |= merged
            writes |= merged
        elif isinstance(n, Fill):
            writes.add(n.buffer)
    return reads, writes


def _items(nodes: tuple[Node, ...]) -> list[Node | tuple[Node, ...]]:
    """Loops and allocations one by one; the other nodes grouped in runs."""
    items: list[Node | tuple[Node, ...]] = []
    run: list[Node] = []
    for node in nodes:
        if isinstance(node, Loop | Alloc):
            if run:
                items.append(tuple(run))
                run = []
            items.append(node)
        else:
            run.append(node)
    if run:
        items.append(tuple(run))
    return items


def describe(decl: BufferDecl) -> str:
    """`f32[2x128] at x[r_i*256 + t_i*128, 0]`, as the IR printer writes a buffer."""
    shape = "x".join(str(n) for n in decl.shape)
    text = f"{decl.dtype.value}[{shape}] at {decl.tensor}[{', '.join(map(str, decl.origin))}]" \
        if decl.shape else f"{decl.dtype.value}[] {decl.tensor}"
    if decl.partial_loops:
        text += f", partials over ({', '.join(decl.partial_loops)})"
    if decl.buffers == 2:
        text += " x2"
    if decl.shared:
        text += f", shared by ({', '.join(decl.shared)})"
    return text


def _node_name(node: Node) -> str:
    for attr in ("buffer", "target", "statement", "dst"):
        value = getattr(node, attr, None)
        if value is not None:
            return value.name if isinstance(value, BufferDecl) else str(value)
    return ""
