"""The C emitter's code for the online rewrite (`synth.ir.online`): kept apart from
`c.py` so that the two change independently.

The running maximum and the rescale are scalar loops over the innermost tiles (one
previous maximum per row; the rescale multiplies each element of a sum's tile by its
row's factor, computed once per row, 1 where the maximum did not move, so a row that
has seen only padding stays as it is).

The statements of an online kernel's step that the kernel's vector dimension does not
reach (attention's scores, maximum, exponentials and row sum: the kernel is vectorised
along e, the head dimension of O) run here in vectors along a dimension of their own
(`online.step_vector`, the rule the cost model prices): dot products along d for the
scores, along j for the rest, over the step's plain row-major arrays.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from synth.constraints.online import step_vector, transposed_operand
from synth.emit.cstyle import Typed
from synth.ir.nodes import Affine, Compute, Loop, Rescale, Running, walk
from synth.ir.online import is_online
from synth.vectors import contraction, vectorisable
from synth.workload import Access, Statement

if TYPE_CHECKING:
    from synth.emit.c import KernelWriter, Local
    from synth.emit.cstyle import Code


def running(kw: KernelWriter, code: Code, node: Running) -> None:
    """previous = running, element by element."""
    _folded(kw, code, node.running)
    run, prev = kw.locals[node.running], kw.locals[node.previous]
    code.comment(f"the running maximum {run.decl.name} before {node.statement}'s update")
    with kw.tile_loops(code, run.decl.dims, run.decl.shape) as at:
        code(f"{prev.scalar(at)} = {run.scalar(at)};")


def rescale(kw: KernelWriter, code: Code, node: Rescale) -> None:
    """target *= exp(coeff * (running - previous)) per row."""
    for name in (node.target, node.running):
        _folded(kw, code, name)
    target = kw.locals[node.target]
    run, prev = kw.locals[node.running], kw.locals[node.previous]
    exp = kw.w.math_function("expf")
    coeff = kw.w.literal(float(node.coeff), "float").code
    code.comment(f"{target.decl.name} rescaled to the new maximum {run.decl.name}")
    shape = dict(zip(target.decl.dims, target.decl.shape, strict=True))
    factors = _vector_factors(kw, code, node, coeff)
    with kw.tile_loops(code, run.decl.dims, [shape[d] for d in run.decl.dims]) as rows:
        now, before = run.scalar(rows), prev.scalar(rows)
        with code.block(f"if ({now} != {before})"):
            if factors is None:
                code(f"float f_ = {exp}(({coeff}) * ({now} - {before}));")
            else:
                code(f"float f_ = {factors}[{rows[run.decl.dims[0]]}];")
            rest = [d for d in target.decl.dims if d not in rows]
            if target.vector is not None:  # whole vectors along it
                extents = [shape[d] // kw.lanes if d == target.vector else shape[d]
                           for d in rest]
                with kw.tile_loops(code, rest, extents) as at:
                    code(f"{target.name}[{target.slot({**rows, **at})}] *= f_;")
            else:
                with kw.tile_loops(code, rest, [shape[d] for d in rest]) as at:
                    code(f"{target.scalar({**rows, **at})} *= f_;")


def _vector_factors(kw: KernelWriter, code: Code, node: Rescale, coeff: str) -> str | None:
    """The rows' factors exp(c (m - m_prev)) computed in vectors into an array (its
    name), where the running maximum is one whole-vector row dimension of plain f32
    arrays; else None (a scalar exp per row that moved)."""
    run, prev = kw.locals[node.running], kw.locals[node.previous]
    lanes = kw.lanes
    if (len(run.decl.dims) != 1 or run.decl.shape[0] % lanes or not run.decl.dtype.is_float
            or run.decl.dtype.itemsize != 4
            or any(t.vector is not None or t.splat for t in (run, prev))):
        return None
    dim, rows = run.decl.dims[0], run.decl.shape[0]
    name = kw.w.names(f"f:{kw.kernel.name}:{node.target}:{len(code.lines)}", "factor")
    code(f"float {name}[{rows}];")
    with kw.tile_loops(code, [dim], [rows // lanes]) as at:
        start = {dim: f"{at[dim]} * {lanes}"}
        code(f"{{ vf32 n_ = vload_f32(&{run.scalar(start)}), "
             f"b_ = vload_f32(&{prev.scalar(start)}); "
             f"vstore_f32(&{name}[{at[dim]} * {lanes}], vexp_f32(vsplat_f32({coeff}) * "
             f"(n_ - b_))); }}")
    return name


def _folded(kw: KernelWriter, code: Code, buffer: str) -> None:
    """Vector partial results of `buffer` folded first (the running maximum's)."""
    if buffer in kw.pending:
        kw.fold(code, buffer)


def compute(kw: KernelWriter, code: Code, node: Compute, stmt: Statement) -> bool:
    """`node` in vectors along its step dimension (`online.step_vector`), when it is a
    statement of an online kernel's step over whole tiles whose arrays are plain; False
    when the C emitter's own code runs it (the kernel's vector dimension reaches it, a
    ragged edge tile, no dimension qualifies)."""
    if not is_online(kw.kernel):
        return False
    product = _outer(kw, node, stmt)
    if product is not None:
        outer_product(kw, code, node, stmt, *product)
        return True
    along = _step_dim(kw, node, stmt)
    if along is None:
        return False
    suffix = "f32" if stmt.dtype.is_float else "i32"
    tile = dict(zip(node.dims, node.tile, strict=True))
    target = kw.locals[node.out]
    chunks = tile[along] // kw.lanes
    outer = [d for d in stmt.indices if d != along]
    inner = [d for d in stmt.reduced if d != along]

    def access(at: dict[str, str]) -> Callable[[Access], tuple[str, bool]]:
        def one(a: Access) -> tuple[str, bool]:
            local = kw.locals[node.operands[a.tensor]]
            index = {d: at[d] for d in a.indices}
            if along in a.indices:  # its last index: contiguous
                index[along] = f"{at[along]} * {kw.lanes}"
                return f"vload_{suffix}(&{local.scalar(index)})", True
            return local.scalar(index), False
        return one

    code.comment(f"in vectors along {along} (the online step's own vector dimension)")
    with kw.tile_loops(code, outer, [tile[d] for d in outer]) as at:
        if along in stmt.indices:  # the target's last index: vector stores
            with kw.tile_loops(code, [along], [chunks]) as chunk:
                here = {**at, **chunk}
                slot = {**{d: here[d] for d in stmt.indices},
                        along: f"{here[along]} * {kw.lanes}"}
                mine = f"&{target.scalar(slot)}"
                start = "" if stmt.op.reduces else f"vsplat_{suffix}(0)"  # assigned
                code(f"v{suffix} a_ = {start or f'vload_{suffix}({mine})'};")
                with kw.tile_loops(code, inner, [tile[d] for d in inner]) as red:
                    value = kw.w.vector_expr(stmt.expr, access({**here, **red}), suffix)
                    code(f"a_ = {kw.w.vector_step(stmt.op, 'a_', value, suffix)};")
                code(f"vstore_{suffix}({mine}, a_);")
            return True
        identity = kw.w.fill_value(stmt.op.identity(stmt.dtype), stmt.dtype)
        code(f"v{suffix} a_ = vsplat_{suffix}({identity});")
        with kw.tile_loops(code, [*inner, along], [*(tile[d] for d in inner), chunks]) as red:
            value = kw.w.vector_expr(stmt.expr, access({**at, **red}), suffix)
            code(f"a_ = {kw.w.vector_step(stmt.op, 'a_', value, suffix)};")
        mine = target.scalar({d: at[d] for d in stmt.indices})
        real = "float" if stmt.dtype.is_float else "int"
        # the lanes folded in log2(lanes) rounds: each combines the vector with itself
        # rotated by half the lanes still apart (a shuffle and one operation)
        apart = kw.lanes // 2
        while apart:
            rotate = ", ".join(str((k + apart) % kw.lanes) for k in range(kw.lanes))
            rotated = f"__builtin_shuffle(a_, (vi32){{{rotate}}})"
            code(f"a_ = {kw.w.vector_step(stmt.op, 'a_', rotated, suffix)};")
            apart //= 2
        folded = Typed("a_[0]", stmt.dtype.is_float)
        step = kw.w.reduce_step(stmt.op, Typed(mine, stmt.dtype.is_float), folded, real)
        code(f"{mine} = {kw.w.cast(step, stmt.dtype)};")
    return True



ACCUMULATORS = 24  # vector registers a micro-kernel keeps its accumulators in (of 32)


def _whole(kw: KernelWriter, dims: Sequence[str], origin: Sequence[Affine],
           tile: Sequence[int]) -> bool:
    """Whether every tile of these (a compute's or a buffer's) lies inside the tensors:
    the C emitter's `full` over all the kernel's loops, so that it says the same at a
    load as at the computes further in."""
    loops = {n.var.name: n.var.extent for n in walk(kw.kernel.body) if isinstance(n, Loop)}
    return all(start.max_value(loops) + size <= kw.extents[dim]
               for dim, start, size in zip(dims, origin, tile, strict=True))


def _local(kw: KernelWriter, buffer: str) -> Local:
    """The innermost tile `buffer` as the C emitter lays it out (also before its
    allocation is written: `streams` asks at the loads)."""
    return kw.locals.get(buffer) or kw.local(kw.decls[buffer])


def _step_dim(kw: KernelWriter, node: Compute, stmt: Statement) -> str | None:
    """The step vector dimension `node` runs along here (whole tiles, plain arrays)."""
    dtypes = {n: t.dtype for n, t in kw.w.workload.tensors.items()}
    along = step_vector(stmt, kw.vector, vectorisable(stmt, dtypes))
    tile = dict(zip(node.dims, node.tile, strict=True))
    tiles = [_local(kw, n) for n in (node.out, *node.operands.values())]
    if along is None or tile[along] % kw.lanes or any(
            t.vector is not None or t.splat for t in tiles):
        return None
    if not _whole(kw, node.dims, node.origin, node.tile):
        return None
    return along


def _outer(kw: KernelWriter, node: Compute, stmt: Statement) -> tuple[Access, bool] | None:
    """The operand B of a contraction of an online step that runs as an outer product
    (`outer_product`) and whether B's tile is read transposed; None when it does not."""
    if not is_online(kw.kernel):
        return None
    along = _along_target(kw, node, stmt)
    if along is not None:
        return along, False
    moved = transposed_operand(stmt)
    if moved is None or _step_dim(kw, node, stmt) is None:
        return None
    return moved, True


def streams(kw: KernelWriter, buffer: str) -> bool:
    """Whether the innermost tile `buffer` of an online kernel is read where it lies (in
    the tensor, through the caches) rather than copied into the step's array: a tile of
    a tensor the kernel does not write, whole, read only by outer products as their
    operand B (K and V of attention: the copies were a quarter of the step's time)."""
    decl = kw.decls[buffer]
    if (decl.memory != kw.innermost or buffer not in kw.locals or not is_online(kw.kernel)
            or not _whole(kw, decl.dims, decl.origin, decl.shape)):
        return False
    readers = [n for n in walk(kw.kernel.body) if isinstance(n, Compute)
               and buffer in n.operands.values()]
    if not readers or any(n.out == buffer for n in walk(kw.kernel.body)
                          if isinstance(n, Compute)):
        return False
    for node in readers:
        product = _outer(kw, node, kw.w.workload.statement(node.statement))
        if product is None or node.operands[product[0].tensor] != buffer:
            return False
    return True


def _source(kw: KernelWriter, buffer: str, index: dict[str, str]) -> str:
    """The element of innermost tile `buffer` at tile offsets `index`: in the step's
    array, or where it lies when it `streams`."""
    local = kw.locals[buffer]
    if not streams(kw, buffer):
        return local.scalar(index)
    decl = local.decl
    return kw.address(kw.root_of(buffer), [kw.offset(decl, i, index[d])
                                           for i, d in enumerate(decl.dims)])


def _along_target(kw: KernelWriter, node: Compute, stmt: Statement) -> Access | None:
    """The operand B of a contraction `T[.., r, e] += A[.., r, ..] * B[.., e]` along the
    kernel's vector dimension e (attention's `o += p * V`), when it runs as a
    register-blocked outer product: T's and B's tiles vectors along e, whole tiles."""
    found = contraction(stmt)
    e = kw.vector
    if found is None or not stmt.indices or stmt.indices[-1] != e or not _whole(
            kw, node.dims, node.origin, node.tile):
        return None
    having = [a for a in found if e in a.indices]
    if len(having) != 1 or having[0].indices[-1] != e or (
            len(stmt.indices) > 1 and stmt.indices[-2] in having[0].indices):
        return None
    tiles = (_local(kw, node.out), _local(kw, node.operands[having[0].tensor]))
    if any(t.vector != e for t in tiles) or stmt.dtype.is_float is False:
        return None
    return having[0]


def outer_product(kw: KernelWriter, code: Code, node: Compute, stmt: Statement,
                  moved: Access, transpose: bool) -> None:
    """`T[.., r, j] += A[.., r, ..] * B[.., j]` as a register-blocked micro-kernel (B:
    `moved`; `transpose`: its tile is first copied with j last, `online.
    transposed_operand`): for blocks of rows r and of vectors along j, accumulators in
    registers across the reduced dims, each step one broadcast of A per row and one load
    of B per vector, as a GEMM micro-kernel does."""
    found = contraction(stmt)
    assert found is not None
    suffix = "f32" if stmt.dtype.is_float else "i32"
    other = found[0] if found[1] is moved else found[1]
    tile = dict(zip(node.dims, node.tile, strict=True))
    lanes, j = kw.lanes, stmt.indices[-1]
    buffer = node.operands[moved.tensor]
    dims = [d for d in moved.indices if d != j] + [j]
    name = kw.w.names(f"t:{kw.kernel.name}:{node.statement}:{len(code.lines)}", "t_")

    def flat(index: dict[str, str]) -> str:
        text = ""
        for d in dims:
            text = index[d] if not text else f"({text}) * {tile[d]} + {index[d]}"
        return text

    def operand(index: dict[str, str]) -> str:
        if not transpose:
            return f"&{_source(kw, buffer, {d: index[d] for d in moved.indices})}"
        return f"&{name}[{flat(index)}]"

    if transpose and buffer in kw.transposed:  # copied where the tile's copy sits
        name = kw.transposed[buffer]
        code.comment(f"{moved.tensor}'s tile read with {j} last from {name}")
    elif transpose:
        _fill_transposed(kw, code, moved, buffer, tile, flat, name, j, suffix == "f32")
    else:
        code.comment(f"an outer product in vectors along {j}, accumulators in registers")
    chunks = tile[j] // lanes
    block = max(c for c in range(1, min(chunks, 8) + 1) if chunks % c == 0)
    rows = [d for d in stmt.indices if d != j]
    row = rows[-1] if rows else None
    rb = max((r for r in range(1, 9) if row and tile[row] % r == 0
              and r * block <= ACCUMULATORS), default=1) if row else 1
    target = kw.locals[node.out]
    reduced = [d for d in stmt.reduced]
    outer = [d for d in rows if d != row]
    steps = [*(tile[d] for d in outer), *([tile[row] // rb] if row else []), chunks // block]
    with kw.tile_loops(code, [*outer, *([row] if row else []), j], steps) as at:
        def at_row(r: int, c: int | None = None) -> dict[str, str]:
            here = dict(at)
            if row:
                here[row] = f"{at[row]} * {rb} + {r}"
            if c is not None:
                here[j] = f"({at[j]} * {block} + {c}) * {lanes}"
            return here

        code(f"v{suffix} a_[{rb}][{block}];")
        for r in range(rb):
            for c in range(block):
                code(f"a_[{r}][{c}] = vload_{suffix}(&{target.scalar(at_row(r, c))});")
        with kw.tile_loops(code, reduced, [tile[d] for d in reduced]) as red:
            for r in range(rb):
                here = {**at_row(r), **red}
                value = kw.locals[node.operands[other.tensor]].scalar(
                    {d: here[d] for d in other.indices})
                code(f"v{suffix} x{r}_ = vsplat_{suffix}({value});")
            # kept in a register for its rb uses (`vload_kept`: not a load per FMA)
            load = "vload_kept" if rb > 1 else "vload"
            for c in range(block):
                code(f"v{suffix} y{c}_ = {load}_{suffix}({operand({**at_row(0, c), **red})});")
                for r in range(rb):
                    code(f"a_[{r}][{c}] += x{r}_ * y{c}_;")
        for r in range(rb):
            for c in range(block):
                code(f"vstore_{suffix}(&{target.scalar(at_row(r, c))}, a_[{r}][{c}]);")


def pretranspose(kw: KernelWriter, code: Code, buffer: str) -> None:
    """At the copy of a tile read where it lies (`streams`) that an outer product reads
    transposed: the tile copied with j last once there, into an array of its own, and
    read from it by every step inside (`outer_product`), not transposed again in each
    step (the copy sits outside the loops that do not walk the tensor, as
    `online_terms.step_copies` prices it: attention's K tile was transposed once per
    block of rows, 2.3x the modelled time of its kernel)."""
    for node in walk(kw.kernel.body):
        if not isinstance(node, Compute) or buffer not in node.operands.values():
            continue
        stmt = kw.w.workload.statement(node.statement)
        product = _outer(kw, node, stmt)
        if product is None or not product[1] or node.operands[product[0].tensor] != buffer:
            continue
        moved, j = product[0], stmt.indices[-1]
        tile = dict(zip(node.dims, node.tile, strict=True))
        dims = [d for d in moved.indices if d != j] + [j]
        name = kw.w.names(f"t:{kw.kernel.name}:{buffer}", f"{buffer}_t")
        _fill_transposed(kw, code, moved, buffer, tile, _flattener(dims, tile), name, j,
                         stmt.dtype.is_float)
        kw.transposed[buffer] = name
        return


def _flattener(dims: Sequence[str], tile: dict[str, int]) -> Callable[[dict[str, str]], str]:
    """The row-major flat index, in a tile of `tile` laid out along `dims`."""
    def flat(index: dict[str, str]) -> str:
        text = ""
        for d in dims:
            text = index[d] if not text else f"({text}) * {tile[d]} + {index[d]}"
        return text
    return flat


def _fill_transposed(kw: KernelWriter, code: Code, moved: Access, buffer: str,
                     tile: dict[str, int], flat: Callable[[dict[str, str]], str],
                     name: str, j: str, floating: bool) -> None:
    """Declare `name` and copy `moved`'s tile into it with j last."""
    code.comment(f"{moved.tensor}'s tile with {j} last (an outer product in vectors "
                 f"along {j})")
    dims = [d for d in moved.indices if d != j] + [j]
    code(f"float {name}[{math.prod(tile[d] for d in dims)}];")
    last = moved.indices[-1]
    if tile[last] % kw.lanes or tile[j] % kw.lanes or not floating:
        with kw.tile_loops(code, moved.indices, [tile[d] for d in moved.indices]) as at:
            code(f"{name}[{flat(at)}] = {_source(kw, buffer, at)};")
    else:
        _transpose_blocks(kw, code, moved, buffer, tile, flat, name, j)


def _transpose_blocks(kw: KernelWriter, code: Code, moved: Access, buffer: str,
                      tile: dict[str, int], flat: Callable[[dict[str, str]], str],
                      name: str, j: str) -> None:
    """`moved`'s tile into `name` with j last, in square blocks of one vector's lanes:
    each block's rows loaded as vectors, transposed in registers by log2(lanes) rounds
    of two-source shuffles (each round swaps the off-diagonal sub-blocks of half the
    size before), stored as vectors: a shuffle per lane-row per round instead of a
    scalar load and store per element."""
    lanes = kw.lanes
    last = moved.indices[-1]
    others = [d for d in moved.indices if d not in (j, last)]
    blocks = [tile[d] for d in others] + [tile[j] // lanes, tile[last] // lanes]
    with kw.tile_loops(code, [*others, j, last], blocks) as at:
        def element(dim_j: str, dim_last: str) -> dict[str, str]:
            return {**{d: at[d] for d in others}, j: dim_j, last: dim_last}

        for r in range(lanes):
            where = element(f"{at[j]} * {lanes} + {r}", f"{at[last]} * {lanes}")
            code(f"vf32 r{r}_ = vload_f32(&{_source(kw, buffer, where)});")
        step = lanes // 2
        while step:
            low = ", ".join(str(k if not k & step else lanes + k - step) for k in range(lanes))
            high = ", ".join(str(k + step if not k & step else lanes + k)
                             for k in range(lanes))
            for r in range(lanes):
                if r & step:
                    continue
                code(f"{{ vf32 a_ = r{r}_, b_ = r{r + step}_; "
                     f"r{r}_ = __builtin_shuffle(a_, b_, (vi32){{{low}}}); "
                     f"r{r + step}_ = __builtin_shuffle(a_, b_, (vi32){{{high}}}); }}")
            step //= 2
        for r in range(lanes):
            where = element(f"{at[j]} * {lanes}", f"{at[last]} * {lanes} + {r}")
            code(f"vstore_f32(&{name}[{flat(where)}], r{r}_);")

