"""`--emit ttlang`: the schedule as tt-lang operations for Tenstorrent (`wormhole`).

One `@ttl.operation` per kernel, on the schedule's grid (`grid=(cols, rows)`: the
kernel's parallel loops over the model's `col` and `row` levels), with one dataflow
buffer per tile of the kernel (its block shape in 32x32 tiles, `block_count` the
schedule's `buffers` decision; 2 for an accumulator read and rewritten across a loop),
a reader and a writer `@ttl.datamovement()` and one `@ttl.compute()`, all three walking
the kernel's sequential loops. The loop nest is the materialised program (`synth.ir`):

- `load X_l1 <- X` is a block copy DRAM -> buffer in the reader (reserve, copy, push) and
  a `wait` in the compute whose scope covers the rest of the loop body (pop at its end);
- `store X_l1 -> X` is a `wait` and a copy buffer -> DRAM in the writer;
- a compute is one block expression stored into its target's buffer (`reserve`, `store`,
  `push`); a later reader of that value `wait`s for it; a reduction that a loop
  accumulates reads the previous block and stores the sum (the accumulator pattern).

Vectors are laid out as (N/32, 32) matrices (a tile holds 1024 consecutive elements);
tensors are padded with zeros to whole blocks. Supported: element-wise statements
(`+ - * /`, exp, log, sqrt, rsqrt, recip, tanh, abs, a transposed operand) and matrix
products; other statements (row reductions, broadcasts, scalars) are refused with exit 2.
`ttlang_check.py` writes the driver's data and runs it under tt-lang's simulator.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from synth.constraints.cost import contraction
from synth.errors import InputError
from synth.ir.nodes import (
    Affine,
    Alloc,
    BufferDecl,
    Compute,
    Fill,
    Kernel,
    Load,
    Loop,
    LoopKind,
    Node,
    Program,
    Store,
    walk,
)
from synth.workload import Access, BinOp, Call, Expr, Neg, Num, Statement, Workload

EDGE = 32  # elements per tile edge (the model's `tile`)
_COMBINE = {"+=": "+", "*=": "*"}  # how an accumulation folds a block into its target
FUNCTIONS = ("exp", "log", "sqrt", "rsqrt", "recip", "tanh", "abs")
INDENT = "    "


class EmitError(InputError):
    """A schedule this emitter cannot express in tt-lang (exit 2)."""


@dataclass(frozen=True)
class Layout:
    """A tensor in DRAM: its padded 2-D shape in elements, and whether it is a vector."""

    rows: int
    cols: int
    vector: bool


@dataclass
class Ctx:
    """What the three functions of one operation share while they are written."""

    program: Program
    workload: Workload
    kernel: Kernel
    decls: dict[str, BufferDecl] = field(default_factory=dict)
    accumulators: set[str] = field(default_factory=set)  # buffers read and rewritten
    rmw: set[str] = field(default_factory=set)  # loaded, then accumulated into


def layouts(program: Program, workload: Workload) -> dict[str, Layout]:
    """Every tensor's padded 2-D layout: each axis the largest block end of any kernel."""
    ends: dict[str, list[int]] = {t: list(workload.tensors[t].shape)
                                  for t in workload.tensors}
    for kernel in program.kernels:
        for alloc, extents in _allocs(kernel.body, {}):
            for axis, (origin, size) in enumerate(zip(alloc.origin, alloc.shape, strict=True)):
                end = origin.max_value(extents) + size
                ends[alloc.tensor][axis] = max(ends[alloc.tensor][axis], end)
    out = {}
    for name, shape in ends.items():
        if len(shape) == 1:
            out[name] = Layout(-(-shape[0] // (EDGE * EDGE)) * EDGE, EDGE, True)
        elif len(shape) == 2:
            out[name] = Layout(-(-shape[0] // EDGE) * EDGE, -(-shape[1] // EDGE) * EDGE, False)
        else:
            raise EmitError(f"--emit ttlang: tensor {name} has {len(shape)} dimensions; "
                            "tt-lang operations here take vectors and matrices")
    return out


def _allocs(body: tuple[Node, ...], extents: dict[str, int]
            ) -> Iterator[tuple[BufferDecl, dict[str, int]]]:
    for node in body:
        if isinstance(node, Alloc):
            yield node.buffer, extents
        elif isinstance(node, Loop):
            yield from _allocs(node.body, {**extents, node.var.name: node.var.extent})


# ---------------------------------------------------------------- expressions


def block_expr(expr: Expr, stmt: Statement, blocks: Mapping[str, str]) -> str:
    """A statement's right-hand side over blocks (`blocks`: tensor -> block variable)."""
    if isinstance(expr, Access):
        if expr.indices == stmt.indices or len(expr.indices) < 2:
            return blocks[expr.tensor]
        if tuple(reversed(expr.indices)) == stmt.indices:
            return f"ttl.block.transpose({blocks[expr.tensor]})"
    elif isinstance(expr, BinOp):
        return (f"({block_expr(expr.lhs, stmt, blocks)} {expr.op} "
                f"{block_expr(expr.rhs, stmt, blocks)})")
    elif isinstance(expr, Neg):
        return f"ttl.math.neg({block_expr(expr.arg, stmt, blocks)})"
    elif isinstance(expr, Call) and expr.fn in FUNCTIONS and len(expr.args) == 1:
        return f"ttl.math.{expr.fn}({block_expr(expr.args[0], stmt, blocks)})"
    raise EmitError(f"--emit ttlang: statement {stmt.name} ({_describe(expr)}) has no "
                    "tt-lang block form here (element-wise + - * /, exp, log, sqrt, "
                    "rsqrt, recip, tanh, abs, a transposed operand, or a matrix product)")


def _describe(expr: Expr) -> str:
    return type(expr).__name__ if not isinstance(expr, Call) else f"call {expr.fn}"


def statement_expr(stmt: Statement, blocks: Mapping[str, str], shape: tuple[int, int]
                   ) -> str:
    """The block expression of an element-wise statement or a matrix product (`shape`:
    the target block's, in tiles, for a constant)."""
    if isinstance(stmt.expr, Num):
        return f"ttl.block.fill({stmt.expr.value}, shape={shape})"
    if not stmt.reduced:
        if any(len(a.indices) != len(stmt.indices) for a in _accesses(stmt.expr)):
            raise EmitError(f"--emit ttlang: statement {stmt.name} broadcasts an operand; "
                            "not emitted for tt-lang yet")
        return block_expr(stmt.expr, stmt, blocks)
    roles = contraction(stmt)
    if roles is None or not isinstance(stmt.expr, BinOp):
        raise EmitError(f"--emit ttlang: statement {stmt.name} reduces over "
                        f"{', '.join(stmt.reduced)} other than as a matrix product; not "
                        "emitted for tt-lang yet")
    m, n, k = roles
    operands = {}
    for access in (stmt.expr.lhs, stmt.expr.rhs):
        assert isinstance(access, Access)
        first = m if m in access.indices else k
        operand = blocks[access.tensor]
        flipped = access.indices[0] != first
        operands[m if m in access.indices else n] = (
            f"ttl.block.transpose({operand})" if flipped else operand)
    return f"{operands[m]} @ {operands[n]}"


def _accesses(expr: Expr) -> Iterator[Access]:
    if isinstance(expr, Access):
        yield expr
    elif isinstance(expr, BinOp):
        yield from _accesses(expr.lhs)
        yield from _accesses(expr.rhs)
    elif isinstance(expr, Neg):
        yield from _accesses(expr.arg)
    elif isinstance(expr, Call):
        for arg in expr.args:
            yield from _accesses(arg)


# ---------------------------------------------------------------- slices


def tile_slice(decl: BufferDecl, layout: Layout) -> str:
    """The block's slice of its tensor, in tiles (origins are affine in loop variables)."""
    if layout.vector:
        return f"[{_tile_range(decl.origin[0], decl.shape[0], EDGE * EDGE)}, 0:1]"
    ranges = [_tile_range(origin, size, EDGE)
              for origin, size in zip(decl.origin, decl.shape, strict=True)]
    return f"[{', '.join(ranges)}]"


def _tile_range(origin: Affine, size: int, unit: int) -> str:
    """`start:start + n` in tiles of `unit` elements (origins are whole tiles)."""
    if origin.const % unit or any(c % unit for _, c in origin.terms):
        raise EmitError(f"--emit ttlang: a block starts inside a tile ({origin}); blocks "
                        "are whole tiles on tiled models")
    start = _affine(Affine(tuple((v, c // unit) for v, c in origin.terms),
                           origin.const // unit))
    count = size // unit
    return f"{start}:{start} + {count}" if origin.terms else f"{start}:{int(start) + count}"


def block_shape(decl: BufferDecl) -> tuple[int, int]:
    if len(decl.shape) == 1:
        return decl.shape[0] // (EDGE * EDGE), 1
    if len(decl.shape) == 2:
        return decl.shape[0] // EDGE, decl.shape[1] // EDGE
    raise EmitError(f"--emit ttlang: buffer {decl.name} is {len(decl.shape)}-D; tt-lang "
                    "blocks here are vectors and matrices")


def _affine(value: Affine) -> str:
    parts = [v if c == 1 else f"{c} * {v}" for v, c in value.terms]
    if value.const or not parts:
        parts.append(str(value.const))
    return " + ".join(parts)



# ---------------------------------------------------------------- the operation


def operation_source(program: Program, workload: Workload, kernel: Kernel,
                     lay: Mapping[str, Layout], accumulator_blocks: int = 2) -> str:
    """One kernel as a tt-lang operation (`accumulator_blocks` 1 only to test that the
    simulator catches the deadlock it makes)."""
    ctx = Ctx(program, workload, kernel, {a.name: a for a, _ in _allocs(kernel.body, {})},
              rmw=read_modify_write(kernel))
    outer, body = _parallel_chain(ctx, kernel.body)
    compute = _compute(ctx, body, 2, frozenset())
    tensors = _kernel_tensors(ctx)
    cols = _count(outer, "col")
    rows = _count(outer, "row")
    lines = [f"@ttl.operation(grid=({cols}, {rows}))",
             f"def {_ident(kernel.name)}({', '.join(tensors)}):"]
    lines += [f"{INDENT}# schedule: kernel {kernel.name}, grid {cols} cols x {rows} rows"]
    for name, decl in ctx.decls.items():
        dfbs = [(name, decl.buffers)]
        if name in ctx.rmw:
            dfbs.insert(0, (f"{name}_in", decl.buffers))
        if name in ctx.accumulators:  # read and rewritten: two blocks, or it deadlocks
            dfbs.insert(0, (f"{name}_acc", accumulator_blocks))
        for dfb, count in dfbs:
            lines.append(f"{INDENT}{dfb}_dfb = ttl.make_dataflow_buffer_like("
                         f"{decl.tensor}, shape={block_shape(decl)}, block_count={count})")
    node = _node_lines(outer)
    lines += ["", f"{INDENT}@ttl.datamovement()", f"{INDENT}def read():", *node,
              *_dm(ctx, body, 2, lay, Load), "",
              f"{INDENT}@ttl.compute()", f"{INDENT}def compute():", *compute, "",
              f"{INDENT}@ttl.datamovement()", f"{INDENT}def write():", *node,
              *_dm(ctx, body, 2, lay, Store)]
    return "\n".join(lines) + "\n"


def _ident(name: str) -> str:
    return "op_" + "".join(c if c.isalnum() or c == "_" else "_" for c in name)


def _kernel_tensors(ctx: Ctx) -> list[str]:
    names = {d.tensor for d in ctx.decls.values()}
    return [t for t in ctx.workload.tensors if t in names]


def _parallel_chain(ctx: Ctx, body: tuple[Node, ...]) -> tuple[list[Loop], tuple[Node, ...]]:
    """The kernel's parallel loops (outermost first) and the body inside them."""
    rest = [n for n in body if not (isinstance(n, Fill) and n.buffer not in ctx.decls
                                    and _zero_already(ctx, n))]
    outer: list[Loop] = []
    while len(rest) == 1 and isinstance(rest[0], Loop) and \
            rest[0].var.kind is LoopKind.PARALLEL:
        outer.append(rest[0])
        rest = list(rest[0].body)
    for node in rest:
        if isinstance(node, Fill) and node.buffer not in ctx.decls:
            raise EmitError(f"--emit ttlang: kernel {ctx.kernel.name} fills {node.buffer} "
                            f"in DRAM with {node.value}; not emitted for tt-lang yet")
    if any(isinstance(n, Loop) and n.var.kind is LoopKind.PARALLEL
           for n in walk(tuple(rest))):
        raise EmitError(f"--emit ttlang: kernel {ctx.kernel.name} has parallel loops below "
                        "a sequential one; tt-lang's grid is the outermost loops")
    return outer, tuple(rest)


def _zero_already(ctx: Ctx, fill: Fill) -> bool:
    """A fill of a DRAM tensor with 0 that no earlier kernel wrote and that is no input:
    the driver's zeros (every tensor but the inputs starts as zeros in DRAM)."""
    if fill.value != 0 or fill.buffer in {t.name for t in ctx.workload.inputs}:
        return False
    for kernel in ctx.program.kernels[:ctx.program.kernels.index(ctx.kernel)]:
        if any(isinstance(n, Store) and n.dst == fill.buffer for n in walk(kernel.body)):
            return False
    return True


def read_modify_write(kernel: Kernel) -> set[str]:
    """Buffers loaded from DRAM and accumulated into: the loaded block and the result
    travel in two dataflow buffers (`X_in` from the reader, `X` to the writer)."""
    loaded = {n.dst for n in walk(kernel.body) if isinstance(n, Load)}
    return {n.out for n in walk(kernel.body) if isinstance(n, Compute) and n.out in loaded}


def _count(outer: list[Loop], level: str) -> int:
    count = 1
    for loop in outer:
        if loop.var.where == level:
            count *= loop.var.extent
    return count


def _node_lines(outer: list[Loop]) -> list[str]:
    """This node's index along each parallel loop, from its grid coordinates."""
    pad = INDENT * 2
    lines = [f"{pad}col, row = ttl.node(dims=2)"] if outer else []
    for level in ("col", "row"):
        loops = [lp for lp in outer if lp.var.where == level]
        rest = level
        for loop in reversed(loops):
            lines.append(f"{pad}{loop.var.name} = {rest} % {loop.var.extent}")
            rest = f"({rest} // {loop.var.extent})"
    return lines


def _dm(ctx: Ctx, body: tuple[Node, ...], depth: int, lay: Mapping[str, Layout],
        kind: type) -> list[str]:
    """The reader (`kind` Load) or writer (Store): the loops and the block copies."""
    pad = INDENT * depth
    lines: list[str] = []
    for node in body:
        if isinstance(node, Loop):
            inner = _dm(ctx, node.body, depth + 1, lay, kind)
            if inner:
                lines += [f"{pad}for {node.var.name} in range({node.var.extent}):", *inner]
        elif isinstance(node, Load) and kind is Load:
            decl = ctx.decls[node.dst]
            dfb = f"{node.dst}_in" if node.dst in ctx.rmw else node.dst
            lines += [f"{pad}with {dfb}_dfb.reserve() as blk:",
                      f"{pad}{INDENT}ttl.copy({decl.tensor}"
                      f"{tile_slice(decl, lay[decl.tensor])}, blk).wait()"]
        elif isinstance(node, Store) and kind is Store:
            decl = ctx.decls[node.src]
            lines += [f"{pad}with {node.src}_dfb.wait() as blk:",
                      f"{pad}{INDENT}ttl.copy(blk, {decl.tensor}"
                      f"{tile_slice(decl, lay[decl.tensor])}).wait()"]
    return lines


def _compute(ctx: Ctx, body: tuple[Node, ...], depth: int, opened: frozenset[str]
             ) -> list[str]:
    """The compute function's statements for `body`; a `wait` scope covers the rest of
    the body it opens in (`opened`: buffers whose block is in scope)."""
    pad = INDENT * depth
    lines: list[str] = []
    for index, node in enumerate(body):
        rest = body[index + 1:]
        if isinstance(node, Load):
            block = f"{node.dst}_in" if node.dst in ctx.rmw else node.dst
            return [*lines, f"{pad}with {block}_dfb.wait() as {block}:",
                    *_compute(ctx, rest, depth + 1, opened | {block})]
        if isinstance(node, Loop):
            inner = _compute(ctx, node.body, depth + 1, opened) or [f"{pad}{INDENT}pass"]
            lines += [f"{pad}for {node.var.name} in range({node.var.extent}):", *inner]
        elif isinstance(node, Fill | Compute) and _initial(ctx, node) is not None:
            buffer, value = _initial(ctx, node) or ("", 0)
            if value != 0 or not _folded(buffer, rest):
                shape = block_shape(ctx.decls[buffer])
                lines += [f"{pad}with {buffer}_acc_dfb.reserve() as acc:",
                          f"{pad}{INDENT}acc.store(ttl.block.fill({value}, shape={shape}))"]
                ctx.accumulators.add(buffer)
        elif isinstance(node, Store) and node.src in ctx.accumulators:
            lines += [f"{pad}with {node.src}_acc_dfb.wait() as done, "
                      f"{node.src}_dfb.reserve() as out:", f"{pad}{INDENT}out.store(done)"]
        elif isinstance(node, Compute):
            waits = [b for b in node.operands.values() if b not in opened]
            if waits:
                header = ", ".join(f"{_dfb(ctx, b)}.wait() as {b}" for b in waits)
                return [*lines, f"{pad}with {header}:",
                        *_compute(ctx, body[index:], depth + 1, opened | set(waits))]
            lines += _compute_node(ctx, node, pad)
            if node.out not in ctx.accumulators and _read_later(node.out, rest):
                return [*lines, f"{pad}with {node.out}_dfb.wait() as {node.out}:",
                        *_compute(ctx, rest, depth + 1, opened | {node.out})]
    return lines


def _dfb(ctx: Ctx, buffer: str) -> str:
    """The dataflow buffer a compute reads `buffer`'s final block from."""
    return f"{buffer}_acc_dfb" if buffer in ctx.accumulators else f"{buffer}_dfb"


def _read_later(buffer: str, rest: tuple[Node, ...]) -> bool:
    return any(isinstance(n, Compute) and buffer in n.operands.values() for n in walk(rest))


def _initial(ctx: Ctx, node: Fill | Compute) -> tuple[str, float | int] | None:
    """(buffer, value) when `node` sets an L1 block to a constant (a fill, or a statement
    `C[m, n] = 0` fused before its reduction); None otherwise."""
    if isinstance(node, Fill):
        return (node.buffer, node.value) if node.buffer in ctx.decls else None
    stmt = ctx.workload.statement(node.statement)
    later = [s for s in ctx.workload.statements if s.target == stmt.target and s.accumulates]
    if isinstance(stmt.expr, Num) and later:
        return node.out, stmt.expr.value
    return None


def _folded(buffer: str, rest: tuple[Node, ...]) -> bool:
    """A zero the next statement that touches its buffer accumulates into in this body:
    that statement stores its value directly, no accumulator."""
    for node in rest:
        if isinstance(node, Compute) and node.out == buffer:
            return True
        if isinstance(node, Loop) and any(isinstance(n, Compute) and n.out == buffer
                                          for n in walk(node.body)):
            return False
    return False


def _compute_node(ctx: Ctx, node: Compute, pad: str) -> list[str]:
    stmt = ctx.workload.statement(node.statement)
    expr = statement_expr(stmt, dict(node.operands), block_shape(ctx.decls[node.out]))
    out = node.out
    if out in ctx.rmw and stmt.op.value in _COMBINE:
        return [f"{pad}with {out}_dfb.reserve() as out:",
                f"{pad}{INDENT}out.store({out}_in {_COMBINE[stmt.op.value]} {expr})"]
    if out in ctx.accumulators and stmt.reduced:
        return [f"{pad}with {out}_acc_dfb.wait() as pre, {out}_acc_dfb.reserve() as acc:",
                f"{pad}{INDENT}acc.store(pre {_COMBINE.get(stmt.op.value, '+')} {expr})"]
    return [f"{pad}with {out}_dfb.reserve() as out:", f"{pad}{INDENT}out.store({expr})"]


# ---------------------------------------------------------------- the program file

TORCH_DTYPES = {"f32": "float32", "bf16": "bfloat16"}
DRIVER = """

HERE = Path(__file__).resolve().parent
device = ttnn.open_device(device_id=0)


def to_device(array, name):
    rows, cols, vector, shape = LAYOUT[name]
    padded = torch.zeros((rows, cols), dtype=torch.float32)
    data = torch.from_numpy(np.ascontiguousarray(array, dtype=np.float32))
    if vector:
        padded.view(-1)[:data.numel()] = data
    else:
        padded[:shape[0], :shape[1]] = data
    return ttnn.from_torch(padded.to(getattr(torch, DTYPES[name])),
                           dtype=getattr(ttnn, DTYPES[name]), layout=ttnn.TILE_LAYOUT,
                           device=device, memory_config=ttnn.DRAM_MEMORY_CONFIG)


def from_device(tensor, name):
    rows, cols, vector, shape = LAYOUT[name]
    data = ttnn.to_torch(tensor).float().numpy()
    if vector:
        return data.reshape(-1)[:shape[0]]
    return data[:shape[0], :shape[1]]


def main():
    tensors = {}
    for name in LAYOUT:
        source = HERE / "data" / f"input_{name}.npy"
        tensors[name] = to_device(np.load(source) if name in INPUTS else
                                  np.zeros(LAYOUT[name][3], dtype=np.float32), name)
{calls}
    for name in OUTPUTS:
        np.save(HERE / "data" / f"actual_{name}.npy", from_device(tensors[name], name))


main()
"""


def program_source(program: Program, workload: Workload, accumulator_blocks: int = 2) -> str:
    """The whole file `tt-lang-sim` runs: the operations and the driver."""
    for tensor in workload.tensors.values():
        if tensor.dtype.value not in TORCH_DTYPES:
            raise EmitError(f"--emit ttlang: tensor {tensor.name} is {tensor.dtype.value}; "
                            f"emitted tt-lang takes {', '.join(TORCH_DTYPES)}")
    lay = layouts(program, workload)
    head = [f"# generated by synth: {program.workload} on {program.hardware}, "
            f"{len(program.kernels)} tt-lang operation(s); run with tt-lang-sim program.py",
            "import json  # noqa: F401", "from pathlib import Path", "",
            "import numpy as np", "import torch", "import ttnn", "", "import ttl", ""]
    layout = {n: (v.rows, v.cols, v.vector, workload.tensors[n].shape) for n, v in lay.items()}
    head += [f"LAYOUT = {layout!r}",
             f"DTYPES = { {n: TORCH_DTYPES[t.dtype.value] for n, t in workload.tensors.items()}!r}",
             f"INPUTS = {[t.name for t in workload.inputs]!r}",
             f"OUTPUTS = {[t.name for t in workload.outputs]!r}", "", ""]
    ops = [operation_source(program, workload, k, lay, accumulator_blocks)
           for k in program.kernels]
    calls = []
    for kernel in program.kernels:
        ctx = Ctx(program, workload, kernel, {a.name: a for a, _ in _allocs(kernel.body, {})})
        args = ", ".join(f"tensors[{t!r}]" for t in _kernel_tensors(ctx))
        calls.append(f"{INDENT}{_ident(kernel.name)}({args})")
    return "\n".join(head) + "\n\n".join(ops) + DRIVER.replace("{calls}", "\n".join(calls))
