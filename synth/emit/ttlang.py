"""`--emit ttlang`: the schedule as tt-lang operations for Tenstorrent (`wormhole`).

One `@ttl.operation` per kernel, on the schedule's grid (`grid=(cols, rows)`: the
kernel's parallel loops over the model's `col` and `row` levels), with one dataflow
buffer per tile of the kernel (its block shape in 32x32 tiles, `block_count` the
schedule's `buffers` decision) and the second ones its loop nest needs (`X_in`, `X_out`,
and `X_acc` with 2 blocks for an accumulator read and rewritten across a loop: the list
is `synth.ir.dataflow.kernel_buffers`, which the cost model counts too),
a reader and a writer `@ttl.datamovement()` and one `@ttl.compute()`, all three walking
the kernel's sequential loops. The loop nest is the materialised program (`synth.ir`):

- `load X_l1 <- X` is a block copy DRAM -> buffer in the reader (reserve, copy, push) and
  a `wait` in the compute whose scope covers the rest of the loop body (pop at its end);
- `store X_l1 -> X` is a `wait` and a copy buffer -> DRAM in the writer;
- a compute is one block expression stored into its target's buffer (`reserve`, `store`,
  `push`); a later reader of that value `wait`s for it; a reduction that a loop
  accumulates reads the previous block and stores the sum (the accumulator pattern).

Vectors are laid out as (N/32, 32) matrices (a tile holds 1024 consecutive elements),
or, when a kernel indexes them by a matrix's row, as a column of tiles with the value in
column 0 (where tt-lang's row reductions leave it), or by a matrix's column (a scale
g[d] of every row), as a row of tiles with the value in row 0; a scalar is one tile, its value at
(0, 0). Tensors of rank 3 and 4 (batch and heads: `mha`) are 2-D views: their leading
indices stack the (padded) matrices along the rows, a [B, H, S, E] tensor is
(B*H*S) x E and a row statistic [B, H, S] a column of B*H*S rows, and batch indices
between a tensor's tiled ones stack its matrices along the columns (the transformer's
Wq[d, h, e] is D x (H*E), a block one head's columns); the model's `tile`
constraint gives a block one leading index, so the leading dimensions are loops over the
grid or over blocks per core, and a block's statement is the 2-D one (`unbatched`).
Tensors are padded with zeros to whole blocks. Supported: element-wise
statements (`+ - * /`, constants, exp, log, sqrt, rsqrt, recip, tanh, abs, max, min; an
operand transposed, a row statistic or a scalar broadcast), matrix products, and row or
whole-vector sums and maxima (`ttl.math.reduce_sum/reduce_max`); other statements,
integer tensors (the simulator has no integer dtype) and reductions over padding are
refused with exit 2.
`ttlang_check.py` writes the driver's data and runs it under tt-lang's simulator.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from synth.constraints.intrinsic import contraction
from synth.emit.ttlang_online import online_step
from synth.errors import InputError
from synth.ir.dataflow import folded, initial, kernel_buffers, roles
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
    Running,
    Store,
    walk,
)
from synth.tiles import is_statistic, lines_of_tiles, named_tile_units, over_one_index
from synth.workload import (
    Access,
    BinOp,
    Call,
    Expr,
    Neg,
    Num,
    SizeRef,
    Statement,
    Workload,
)

_T = TypeVar("_T")
EDGE = 32  # elements per tile edge (the model's `tile`)
# how an accumulation folds a block into its target, and its identity
_COMBINE = {"+=": "({} + {})", "*=": "({} * {})", "max=": "ttl.math.max({}, {})",
            "min=": "ttl.math.min({}, {})"}
REDUCE = {"+=": "reduce_sum", "max=": "reduce_max"}  # row reductions tt-lang has
FUNCTIONS = ("exp", "log", "sqrt", "rsqrt", "recip", "tanh", "abs")
INDENT = "    "


class EmitError(InputError):
    """A schedule this emitter cannot express in tt-lang (exit 2)."""


@dataclass(frozen=True)
class Layout:
    """A tensor in DRAM: its padded 2-D shape in elements; a vector is either flat
    (`vector`: 1024 consecutive elements per tile) or a column (`column`: a row statistic
    of a matrix, one element per row in column 0 of its tiles, as tt-lang's row
    reductions leave it). A tensor of rank 3 or more (or a batched row statistic) has
    leading dimensions (`lead`: batch, heads): its 2-D view stacks the (padded) matrices
    of every leading index along the rows, (prod(lead) * rows) x cols, in C order; batch
    indices between its row and column index (`mid`) stack its matrices along the
    columns (a weight Wq[d, h, e] is D x (H*E), each head's columns side by side)."""

    rows: int  # per leading index
    cols: int
    vector: bool
    column: bool = False
    lead: tuple[int, ...] = ()
    row: bool = False  # a vector of a matrix's columns: one tile row, values in row 0
    # batch indices between the row and the column index (the transformer's Wq[d, h, e]):
    # their (padded) matrices side by side along the columns, rows x (prod(mid) * cols)
    mid: tuple[int, ...] = ()

    @property
    def height(self) -> int:
        """Rows of the 2-D view."""
        return math.prod(self.lead) * self.rows

    @property
    def width(self) -> int:
        """Columns of the 2-D view."""
        return math.prod(self.mid) * self.cols

    def batch(self, indices: tuple[_T, ...]) -> tuple[_T, ...]:
        """The batch entries among a tensor's `indices` (or extents, per axis): the
        leading ones and those between the row and the column index (one per block)."""
        lead = len(self.lead)
        return indices[:lead] + indices[lead + 1:lead + 1 + len(self.mid)]


@dataclass
class Ctx:
    """What the three functions of one operation share while they are written."""

    program: Program
    workload: Workload
    kernel: Kernel
    decls: dict[str, BufferDecl] = field(default_factory=dict)
    lay: Mapping[str, Layout] = field(default_factory=dict)
    accumulators: set[str] = field(default_factory=set)  # buffers read and rewritten
    rmw: set[str] = field(default_factory=set)  # loaded, then accumulated into
    forward: set[str] = field(default_factory=set)  # computed, read by compute and stored


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
    lines = lines_of_tiles(workload)
    columns, rows = _vector_kinds(program, workload, lines)
    row_axes = _row_axes(program, columns, lines)
    for name, shape in ends.items():
        if not shape:  # a scalar: one tile, the value at (0, 0) (a full reduction's place)
            out[name] = Layout(EDGE, EDGE, False, False)
        elif len(shape) == 1 and name in rows and name not in columns:  # a scale g[d]
            out[name] = Layout(EDGE, _pad(shape[0], EDGE), False, row=True)
        elif name in columns:
            out[name] = Layout(_pad(shape[-1], EDGE), EDGE, False, True, tuple(shape[:-1]))
        elif len(shape) == 1:
            out[name] = Layout(_pad(shape[0], EDGE * EDGE) // EDGE, EDGE, True)
        else:
            axis = row_axes.get(name, len(shape) - 2)
            out[name] = Layout(_pad(shape[axis], EDGE), _pad(shape[-1], EDGE), False, False,
                               tuple(shape[:axis]), mid=tuple(shape[axis + 1:-1]))
    return out


def _pad(extent: int, unit: int) -> int:
    return -(-extent // unit) * unit


def _row_axes(program: Program, columns: set[str], lines: frozenset[str]) -> dict[str, int]:
    """Per tensor of rank 2 or more that is not a column of tiles, the axis of its row
    index: its tiled indices (`synth.tiles.tile_units` over each kernel's tensors) are
    two, the second its last index, and the same in every kernel; the others are batch
    indices, one per block. A column's leading indices are all batch indices."""
    out: dict[str, int] = {}
    where: dict[str, str] = {}
    for kernel in program.kernels:
        decls = [a for a, _ in _allocs(kernel.body, {})]
        units = named_tile_units([(a.tensor, a.dims) for a in decls], EDGE, lines)
        for a in decls:
            named = f"tensor {a.tensor}[{', '.join(a.dims)}] in kernel {kernel.name}"
            tiled = [axis for axis, d in enumerate(a.dims) if d in units]
            if a.tensor in columns:
                if tiled[:-1] or tiled[-1:] != [len(a.dims) - 1]:
                    raise EmitError(f"--emit ttlang: {named}: a column of tiles whose "
                                    "leading indices are not all batch indices; not emitted")
                continue
            if len(a.dims) < 2:
                continue
            if len(tiled) != 2 or tiled[1] != len(a.dims) - 1:
                shown = ", ".join(a.dims[axis] for axis in tiled) or "none"
                raise EmitError(f"--emit ttlang: {named} is tiled along {shown}; tt-lang "
                                "views here take two tiled indices, the second the last "
                                "(the others batch indices, one per block)")
            if out.get(a.tensor, tiled[0]) != tiled[0]:
                raise EmitError(f"--emit ttlang: {named} is tiled along other indices than "
                                f"in kernel {where[a.tensor]}; one DRAM layout per tensor")
            out[a.tensor], where[a.tensor] = tiled[0], kernel.name
    return out


def _vector_kinds(program: Program, workload: Workload, lines: frozenset[str]
                  ) -> tuple[set[str], set[str]]:
    """(columns, rows): a vector a statement indexes by the first tiled index of its 2-D
    space (its target's indices, and the reduced one of a row reduction: `r[s]` of
    `xn[s, d] = x[s, d] * r[s]`, `m[i] max= x[i, j]`) is a column of tiles, by the last
    (`g[d]`) a row of tiles, broadcast down a block's rows; a statement of vectors alone
    (`h[d] = g[d] + 1`) lays them out alike; batched row statistics
    (`synth.tiles.is_statistic`) are columns. A vector no statement places so is a column
    when its kernel indexes a matrix's row by it, a row when only a matrix's last index;
    a vector that statements use both ways is exit 2."""
    placed: dict[str, tuple[str, str]] = {}  # vector -> (column or row, statement)
    kernels = []
    for kernel in program.kernels:
        decls = [a for a, _ in _allocs(kernel.body, {})]
        units = named_tile_units([(a.tensor, a.dims) for a in decls], EDGE, lines)
        kernels.append((decls, units))
        for name in dict.fromkeys(n.statement for n in walk(kernel.body)
                                  if isinstance(n, Compute)):
            stmt = workload.statement(name)
            space = [d for d in (stmt.dims if stmt.reduced else stmt.indices) if d in units]
            for tensor, ix in stmt.subscripted:
                if len(ix) == 1 and len(space) == 2 and ix[0] in space:
                    _place(placed, tensor, "column" if ix[0] == space[0] else "row", name)
    _spread_kinds(placed, workload)
    columns, rows = set(), set()
    for decls, units in kernels:
        subscripts = [a.dims for a in decls]
        stats = [a.dims for a in decls if is_statistic(a.dims, subscripts)
                 or (len(a.dims) >= 2 and a.tensor in lines)]
        matrices = [[d for d in ix if d in units] for ix in subscripts
                    if len(ix) >= 2 and ix not in stats]
        last = {ix[-1] for ix in matrices if ix} - {ix[-2] for ix in matrices
                                                    if len(ix) > 1} - {ix[-1] for ix in stats}
        for a in decls:
            if a.tensor in placed:
                continue
            if len(a.dims) == 1 and a.dims[0] in last:
                rows.add(a.tensor)
            elif a.dims in stats or (len(a.dims) == 1 and units.get(a.dims[0]) == EDGE):
                columns.add(a.tensor)
    columns |= {t for t, (kind, _) in placed.items() if kind == "column"}
    rows |= {t for t, (kind, _) in placed.items() if kind == "row"}
    return columns - {t for t, (kind, _) in placed.items() if kind == "row"}, rows


def _place(placed: dict[str, tuple[str, str]], tensor: str, kind: str, statement: str) -> bool:
    """Record `tensor` as a `kind` of tiles by `statement`; whether it is new."""
    if tensor not in placed:
        placed[tensor] = (kind, statement)
        return True
    if placed[tensor][0] != kind:
        raise EmitError(f"--emit ttlang: vector {tensor} is a {kind} of tiles in statement "
                        f"{statement} and a {placed[tensor][0]} in statement "
                        f"{placed[tensor][1]}; one DRAM layout per tensor")
    return False


def _spread_kinds(placed: dict[str, tuple[str, str]], workload: Workload) -> None:
    """A statement of vectors over one index (`synth.tiles.over_one_index`): the layout
    one of them is placed in, the others take."""
    changed = True
    while changed:
        changed = False
        for stmt in workload.statements:
            named = stmt.subscripted
            if not over_one_index([ix for _, ix in named]):
                continue
            for kind in {placed[t][0] for t, _ in named if t in placed}:
                for tensor, _ in named:
                    changed |= _place(placed, tensor, kind, stmt.name)


def _allocs(body: tuple[Node, ...], extents: dict[str, int]
            ) -> Iterator[tuple[BufferDecl, dict[str, int]]]:
    for node in body:
        if isinstance(node, Alloc):
            yield node.buffer, extents
        elif isinstance(node, Loop):
            yield from _allocs(node.body, {**extents, node.var.name: node.var.extent})


# ---------------------------------------------------------------- expressions


def block_expr(expr: Expr, stmt: Statement, blocks: Mapping[str, str],
               space: tuple[tuple[str, ...], tuple[int, int]]) -> str:
    """A statement's right-hand side over blocks (`blocks`: tensor -> block variable) in
    the iteration `space` (its indices and block shape in tiles): an operand indexed the
    other way round is transposed, a row statistic (a column vector indexed by the
    first index) broadcast along the rows' columns."""
    order, shape = space
    if isinstance(expr, Access):
        block = blocks[expr.tensor]
        if expr.indices == order:
            return block
        if len(order) == 2 and tuple(reversed(expr.indices)) == order:
            return f"ttl.block.transpose({block})"
        if len(order) == 2 and expr.indices == order[:1]:
            return f"ttl.block.broadcast({block}, dims=[1], shape={shape})"
        if len(order) == 2 and expr.indices == order[1:]:  # a row vector down the rows
            return f"ttl.block.broadcast({block}, dims=[0], shape={shape})"
        if not expr.indices:  # a scalar over the whole block
            return f"ttl.block.broadcast({block}, dims=[0, 1], shape={shape})"
    elif isinstance(expr, BinOp):
        return (f"({block_expr(expr.lhs, stmt, blocks, space)} {expr.op} "
                f"{block_expr(expr.rhs, stmt, blocks, space)})")
    elif isinstance(expr, Neg):
        return f"ttl.math.neg({block_expr(expr.arg, stmt, blocks, space)})"
    elif isinstance(expr, Call) and expr.fn in FUNCTIONS and len(expr.args) == 1:
        return f"ttl.math.{expr.fn}({block_expr(expr.args[0], stmt, blocks, space)})"
    elif isinstance(expr, Call) and expr.fn in ("max", "min") and len(expr.args) == 2:
        args = ", ".join(block_expr(a, stmt, blocks, space) for a in expr.args)
        return f"ttl.math.{expr.fn}({args})"
    elif isinstance(expr, Num | SizeRef):  # a constant operand: a block of it
        return f"ttl.block.fill({literal(expr.value)}, shape={shape})"
    raise EmitError(f"--emit ttlang: statement {stmt.name} ({_describe(expr)}) has no "
                    "tt-lang block form here (element-wise + - * /, exp, log, sqrt, "
                    "rsqrt, recip, tanh, abs, a transposed operand, or a matrix product)")


def literal(value: float | int) -> str:
    """A Python literal of a constant (infinities as float('inf'))."""
    return repr(value) if math.isfinite(value) else f"float('{value}')"


def _describe(expr: Expr) -> str:
    return type(expr).__name__ if not isinstance(expr, Call) else f"call {expr.fn}"


def statement_expr(stmt: Statement, blocks: Mapping[str, str], shape: tuple[int, int],
                   space_shape: tuple[int, int] | None = None) -> str:
    """The block expression of an element-wise statement, a row reduction or a matrix
    product (`shape`: the target block's, in tiles; `space_shape`: the block of a row
    reduction's operand)."""
    if isinstance(stmt.expr, Num):
        return f"ttl.block.fill({literal(stmt.expr.value)}, shape={shape})"
    if not stmt.reduced:
        return block_expr(stmt.expr, stmt, blocks, (stmt.indices, shape))
    if len(stmt.indices) <= 1 and len(stmt.reduced) == 1 and stmt.op.value in REDUCE \
            and contraction(stmt) is None and space_shape is not None:
        inner = block_expr(stmt.expr, stmt, blocks, (stmt.dims, space_shape))
        dims = "[1]" if stmt.indices else "[0, 1]"  # a row, or everything
        return f"ttl.math.{REDUCE[stmt.op.value]}({inner}, dims={dims}, shape={shape})"
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


# ---------------------------------------------------------------- slices


def tile_slice(decl: BufferDecl, layout: Layout) -> str:
    """The block's slice of its tensor's 2-D view, in tiles (origins are affine in loop
    variables): a block of a tensor with leading dimensions holds one leading index, its
    rows offset by that index's matrix in the view."""
    if not decl.shape:
        return "[0:1, 0:1]"
    if layout.vector:
        return f"[{_tile_range(decl.origin[0], decl.shape[0], EDGE * EDGE)}, 0:1]"
    if layout.row:
        return f"[0:1, {_tile_range(decl.origin[0], decl.shape[0], EDGE)}]"
    row = view_row(decl, layout)
    if layout.column:
        return f"[{_tile_range(row, decl.shape[-1], EDGE)}, 0:1]"
    return (f"[{_tile_range(row, decl.shape[len(layout.lead)], EDGE)}, "
            f"{_tile_range(view_col(decl, layout), decl.shape[-1], EDGE)}]")


def view_row(decl: BufferDecl, layout: Layout) -> Affine:
    """The first row of `decl`'s block in its tensor's 2-D view, in elements: each leading
    index times the rows of the matrices after it, plus the row within the matrix."""
    lead = len(layout.lead)
    if any(size != 1 for size in layout.batch(decl.shape)):
        raise EmitError(f"--emit ttlang: buffer {decl.name} holds {layout.batch(decl.shape)} "
                        f"of {decl.tensor}'s leading (batch) dimensions; a tt-lang block here "
                        "holds one (the model's `tile` constraint)")
    row = decl.origin[lead]
    for axis, origin in enumerate(decl.origin[:lead]):
        stride = math.prod(layout.lead[axis + 1:]) * layout.rows
        row = row + Affine(tuple((v, c * stride) for v, c in origin.terms),
                           origin.const * stride)
    return row


def view_col(decl: BufferDecl, layout: Layout) -> Affine:
    """The first column of `decl`'s block in its tensor's 2-D view, in elements: each batch
    index between the row and the column index (`Layout.mid`) times the columns of the
    matrices after it, plus the column within the matrix."""
    col = decl.origin[-1]
    first = len(layout.lead) + 1
    for axis, origin in enumerate(decl.origin[first:first + len(layout.mid)]):
        stride = math.prod(layout.mid[axis + 1:]) * layout.cols
        col = col + Affine(tuple((v, c * stride) for v, c in origin.terms),
                           origin.const * stride)
    return col


def _tile_range(origin: Affine, size: int, unit: int) -> str:
    """`start:start + n` in tiles of `unit` elements (origins are whole tiles)."""
    if origin.const % unit or any(c % unit for _, c in origin.terms):
        raise EmitError(f"--emit ttlang: a block starts inside a tile ({origin}); blocks "
                        "are whole tiles on tiled models")
    start = _affine(Affine(tuple((v, c // unit) for v, c in origin.terms),
                           origin.const // unit))
    count = size // unit
    return f"{start}:{start} + {count}" if origin.terms else f"{start}:{int(start) + count}"


def block_shape(decl: BufferDecl, layout: Layout) -> tuple[int, int]:
    """The block's shape in tiles (rows, cols) of its tensor's 2-D view."""
    if not decl.shape:
        return 1, 1
    if layout.row:
        return 1, -(-decl.shape[0] // EDGE)
    if layout.vector or layout.column:
        return -(-decl.shape[-1] // (EDGE if layout.column else EDGE * EDGE)), 1
    return decl.shape[len(layout.lead)] // EDGE, decl.shape[-1] // EDGE


def block_tile_count(decl: BufferDecl, layout: Layout) -> int:
    """Tiles one copy of the block moves (what the simulator counts)."""
    rows, cols = block_shape(decl, layout)
    return rows * cols * math.prod(layout.batch(decl.shape))


def unbatched(stmt: Statement, lay: Mapping[str, Layout]) -> Statement:
    """The statement without the leading (batch, head) indices of its tensors: a block
    holds one of each (`view_row`), so its compute is the 2-D statement."""
    uses = stmt.subscripted
    batch = {d for t, ix in uses for d in lay[t].batch(ix)}
    if not batch:
        return stmt
    clash = sorted(batch & {d for t, ix in uses for d in ix if d not in lay[t].batch(ix)})
    if clash:
        raise EmitError(f"--emit ttlang: statement {stmt.name} indexes a leading (batch) "
                        f"dimension of one tensor by {clash[0]}, which another tensor is "
                        "tiled along; not emitted for tt-lang")

    def strip(expr: Expr) -> Expr:
        if isinstance(expr, Access):
            return Access(expr.tensor, tuple(d for d in expr.indices if d not in batch))
        if isinstance(expr, BinOp):
            return BinOp(expr.op, strip(expr.lhs), strip(expr.rhs))
        if isinstance(expr, Neg):
            return Neg(strip(expr.arg))
        if isinstance(expr, Call):
            return Call(expr.fn, tuple(strip(a) for a in expr.args))
        return expr
    return dataclasses.replace(
        stmt, indices=tuple(d for d in stmt.indices if d not in batch), expr=strip(stmt.expr),
        reduced=tuple(d for d in stmt.reduced if d not in batch))


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
    found = roles(kernel, workload)
    ctx = Ctx(program, workload, kernel, {a.name: a for a, _ in _allocs(kernel.body, {})},
              lay, set(found.accumulators), set(found.rmw), set(found.forward))
    outer, body = _parallel_chain(ctx, kernel.body)
    compute = _compute(ctx, body, 2, frozenset())
    tensors = _kernel_tensors(ctx)
    cols = _count(outer, "col")
    rows = _count(outer, "row")
    lines = [f"@ttl.operation(grid=({cols}, {rows}))",
             f"def {op_name(kernel.name)}({', '.join(tensors)}):"]
    lines += [f"{INDENT}# schedule: kernel {kernel.name}, grid {cols} cols x {rows} rows"]
    for name in tensors:
        view = lay[name]
        if view.lead or view.mid:
            shape = ctx.workload.tensors[name].shape
            stacked = (f"rows {'x'.join(map(str, view.lead))} x {view.rows}" if view.lead
                       else f"columns {'x'.join(map(str, view.mid))} x {view.cols}")
            lines.append(f"{INDENT}# {name}{list(shape)} viewed as {view.height} x "
                         f"{view.width} (one block per leading index: {stacked})")
    for dfb in kernel_buffers(kernel, workload, accumulator_blocks):  # `synth.ir.dataflow`
        lines.append(f"{INDENT}{dfb.name}_dfb = ttl.make_dataflow_buffer_like("
                     f"{ctx.decls[dfb.buffer].tensor}, shape={_shape(ctx, dfb.buffer)}, "
                     f"block_count={dfb.blocks})")
    node = _node_lines(outer)
    lines += ["", f"{INDENT}@ttl.datamovement()", f"{INDENT}def read():", *node,
              *_dm(ctx, body, 2, lay, Load), "",
              f"{INDENT}@ttl.compute()", f"{INDENT}def compute():", *compute, "",
              f"{INDENT}@ttl.datamovement()", f"{INDENT}def write():", *node,
              *_dm(ctx, body, 2, lay, Store)]
    return "\n".join(lines) + "\n"


def op_name(name: str) -> str:
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
    """A fill of a DRAM tensor before any kernel wrote it: the driver starts the tensor
    with that value (`initial_values`)."""
    return initial_values(ctx.program, ctx.workload).get(fill.buffer) == fill.value


def initial_values(program: Program, workload: Workload) -> dict[str, float]:
    """DRAM tensors that a kernel fills (a reduction's identity) before any kernel writes
    them, and no inputs: the driver creates them with that value."""
    out: dict[str, float] = {}
    written = {t.name for t in workload.inputs}
    for kernel in program.kernels:
        for node in walk(kernel.body):
            if isinstance(node, Fill) and node.buffer in workload.tensors \
                    and node.buffer not in written:
                out.setdefault(node.buffer, float(node.value))
            if isinstance(node, Store):
                written.add(node.dst)
    return out


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
            dfb = f"{node.src}_out" if node.src in ctx.forward else node.src
            lines += [f"{pad}with {dfb}_dfb.wait() as blk:",
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
            lines.append(f"{pad}with {block}_dfb.wait() as {block}:")
            if node.dst in ctx.rmw and node.dst in ctx.accumulators:
                lines += [f"{pad}{INDENT}with {node.dst}_acc_dfb.reserve() as acc:",
                          f"{pad}{INDENT * 2}acc.store({block})"]
            return [*lines, *_compute(ctx, rest, depth + 1, opened | {block})]
        if isinstance(node, Running):  # the online rewrite's step (`ttlang_online`)
            return [*lines, *online_step(ctx, node, rest, depth, opened)]
        if isinstance(node, Loop):
            inner = _compute(ctx, node.body, depth + 1, opened) or [f"{pad}{INDENT}pass"]
            lines += [f"{pad}for {node.var.name} in range({node.var.extent}):", *inner]
        elif isinstance(node, Fill | Compute) and _starts(ctx, node, rest):
            buffer, value = _initial(ctx, node) or ("", 0)
            if buffer in ctx.accumulators:  # else folded into the reduction after it
                shape = _shape(ctx, buffer)
                lines += [f"{pad}with {buffer}_acc_dfb.reserve() as acc:",
                          f"{pad}{INDENT}acc.store(ttl.block.fill({literal(value)}, "
                          f"shape={shape}))"]
        elif isinstance(node, Store) and node.src in ctx.forward:
            if node.src not in opened:
                return [*lines, f"{pad}with {_dfb(ctx, node.src)}.wait() as {node.src}:",
                        *_compute(ctx, body[index:], depth + 1, opened | {node.src})]
            lines += [f"{pad}with {node.src}_out_dfb.reserve() as out:",
                      f"{pad}{INDENT}out.store({node.src})"]
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


def _shape(ctx: Ctx, buffer: str) -> tuple[int, int]:
    decl = ctx.decls[buffer]
    return block_shape(decl, ctx.lay[decl.tensor])


def _dfb(ctx: Ctx, buffer: str) -> str:
    """The dataflow buffer a compute reads `buffer`'s final block from."""
    return f"{buffer}_acc_dfb" if buffer in ctx.accumulators else f"{buffer}_dfb"


def _read_later(buffer: str, rest: tuple[Node, ...]) -> bool:
    return any(isinstance(n, Compute) and buffer in n.operands.values() for n in walk(rest))


def _initial(ctx: Ctx, node: Fill | Compute) -> tuple[str, float | int] | None:
    return initial(ctx.workload, frozenset(ctx.decls), node)


def _starts(ctx: Ctx, node: Fill | Compute, rest: tuple[Node, ...]) -> bool:
    """`node` sets a block to a constant that starts an accumulator
    (`synth.ir.dataflow.accumulators`) or that the reduction after it folds in; a
    statement `C = 0` whose kernel computes nothing more into C is a plain compute."""
    start = _initial(ctx, node)
    return start is not None and (start[0] in ctx.accumulators
                                  or folded(ctx.workload, start[0], start[1], rest))


def node_expression(ctx: Ctx, node: Compute) -> tuple[Statement, str]:
    """The compute's statement (unbatched) and its block expression."""
    stmt = unbatched(ctx.workload.statement(node.statement), ctx.lay)
    space = None
    if stmt.reduced and len(stmt.indices) == 1:  # a row reduction: the operand's block
        sizes = dict(zip(node.dims, node.tile, strict=True))
        space = (sizes[stmt.indices[0]] // EDGE, sizes[stmt.reduced[0]] // EDGE)
    elif stmt.reduced and not stmt.indices:  # a vector reduced to a scalar
        [operand] = [ctx.decls[b] for b in node.operands.values()][:1]
        space = _shape(ctx, operand.name)
    return stmt, statement_expr(stmt, dict(node.operands), _shape(ctx, node.out), space)


def _compute_node(ctx: Ctx, node: Compute, pad: str) -> list[str]:
    stmt, expr = node_expression(ctx, node)
    out = node.out
    if out in ctx.accumulators and stmt.reduced:
        return [f"{pad}with {out}_acc_dfb.wait() as pre, {out}_acc_dfb.reserve() as acc:",
                f"{pad}{INDENT}acc.store({_COMBINE[stmt.op.value].format('pre', expr)})"]
    if out in ctx.rmw and stmt.op.value in _COMBINE:
        return [f"{pad}with {out}_dfb.reserve() as out:",
                f"{pad}{INDENT}out.store({_COMBINE[stmt.op.value].format(out + '_in', expr)})"]
    return [f"{pad}with {out}_dfb.reserve() as out:", f"{pad}{INDENT}out.store({expr})"]


# ---------------------------------------------------------------- the program file

TORCH_DTYPES = {"f32": "float32", "bf16": "bfloat16"}  # the simulator has no int32
DRIVER = """

HERE = Path(__file__).resolve().parent
device = ttnn.open_device(device_id=0)


def to_device(array, name):
    rows, cols, vector, column, shape, lead, row, mid = LAYOUT[name]
    padded = torch.full((*lead, rows, *mid, cols), INIT.get(name, 0.0), dtype=torch.float32)
    data = torch.from_numpy(np.ascontiguousarray(array, dtype=np.float32))
    within = tuple(slice(0, n) for n in shape)  # the tensor in its padded matrices
    if vector:
        padded.view(-1)[:data.numel()] = data
    elif column:
        padded[within + (0,)] = data
    elif row:
        padded[0, :shape[0]] = data
    elif not shape:
        padded[0, 0] = data
    else:
        padded[within] = data
    # the 2-D view: leading indices stacked along the rows, middle ones along the columns
    padded = padded.reshape(-1, math.prod(mid) * cols)
    return ttnn.from_torch(padded.to(getattr(torch, DTYPES[name])),
                           dtype=getattr(ttnn, DTYPES[name]), layout=ttnn.TILE_LAYOUT,
                           device=device, memory_config=ttnn.DRAM_MEMORY_CONFIG)


def from_device(tensor, name):
    rows, cols, vector, column, shape, lead, row, mid = LAYOUT[name]
    data = ttnn.to_torch(tensor).float().numpy()
    if vector:
        return data.reshape(-1)[:shape[0]]
    if row:
        return data[0, :shape[0]]
    if not shape:
        return data[0, 0]
    data = data.reshape(*lead, rows, *mid, cols)
    within = tuple(slice(0, n) for n in shape)
    return data[within + (0,)] if column else data[within]


def main():
    tensors = {}
    for name in LAYOUT:
        source = HERE / "data" / f"input_{name}.npy"
        tensors[name] = to_device(np.load(source) if name in INPUTS else
                                  np.full(LAYOUT[name][4], INIT.get(name, 0.0),
                                          dtype=np.float32), name)
{calls}
    for name in OUTPUTS:
        np.save(HERE / "data" / f"actual_{name}.npy", from_device(tensors[name], name))


main()
"""


def check_padding(workload: Workload, lay: Mapping[str, Layout]) -> None:
    """Blocks read the zeros that pad a tensor to whole blocks: harmless element-wise and
    in matrix products, wrong in a sum of exponentials or a maximum, so a reduction may not
    read a tensor whose matrices (or vector) are padded."""
    for stmt in workload.statements:
        if not stmt.reduced or contraction(stmt) is not None:
            continue
        for name in stmt.inputs:
            layout, shape = lay[name], workload.tensors[name].shape
            # per leading index: a padded leading index is a matrix of its own, never
            # reduced with the others
            size = layout.rows if layout.column else layout.cols if layout.row \
                else layout.rows * layout.cols
            if shape and size > math.prod(shape) // math.prod(layout.batch(shape)):
                raise EmitError(f"--emit ttlang: statement {stmt.name} reduces {name}, "
                                f"which is padded to whole blocks ({shape} -> "
                                f"{layout.rows}x{layout.cols}); not emitted for tt-lang "
                                "yet: choose sizes that are whole blocks")


def _init_source(program: Program, workload: Workload) -> str:
    values = initial_values(program, workload)
    return "{" + ", ".join(f"{k!r}: {literal(v)}" for k, v in values.items()) + "}"


def program_source(program: Program, workload: Workload, accumulator_blocks: int = 2) -> str:
    """The whole file `tt-lang-sim` runs: the operations and the driver."""
    for tensor in workload.tensors.values():
        if tensor.dtype.value not in TORCH_DTYPES:
            raise EmitError(f"--emit ttlang: tensor {tensor.name} is {tensor.dtype.value}; "
                            f"emitted tt-lang takes {', '.join(TORCH_DTYPES)}: tt-lang's "
                            "simulator (tt-lang-sim 1.1.6) has no integer dtype (its ttnn "
                            "offers float32, bfloat16, float16, bfloat8_b; no ttnn.int32)")
    lay = layouts(program, workload)
    check_padding(workload, lay)
    head = [f"# generated by synth: {program.workload} on {program.hardware}, "
            f"{len(program.kernels)} tt-lang operation(s); run with tt-lang-sim program.py",
            "import json  # noqa: F401", "import math", "from pathlib import Path", "",
            "import numpy as np", "import torch", "import ttnn", "", "import ttl", ""]
    layout = {n: (v.rows, v.cols, v.vector, v.column, workload.tensors[n].shape, v.lead,
                  v.row, v.mid) for n, v in lay.items()}
    head += [f"LAYOUT = {layout!r}",
             f"DTYPES = { {n: TORCH_DTYPES[t.dtype.value] for n, t in workload.tensors.items()}!r}",
             f"INPUTS = {[t.name for t in workload.inputs]!r}",
             f"INIT = {_init_source(program, workload)}  # DRAM tensors a kernel fills",
             f"OUTPUTS = {[t.name for t in workload.outputs]!r}", "", ""]
    ops = [operation_source(program, workload, k, lay, accumulator_blocks)
           for k in program.kernels]
    calls = []
    for kernel in program.kernels:
        ctx = Ctx(program, workload, kernel, {a.name: a for a, _ in _allocs(kernel.body, {})})
        args = ", ".join(f"tensors[{t!r}]" for t in _kernel_tensors(ctx))
        calls.append(f"{INDENT}{op_name(kernel.name)}({args})")
    return "\n".join(head) + "\n\n".join(ops) + DRIVER.replace("{calls}", "\n".join(calls))
