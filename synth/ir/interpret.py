"""Execute a loop nest with NumPy, one array per buffer, to validate a schedule.

Sequential loops run one iteration at a time; parallel loops do not iterate at all: each
adds an axis to a *grid* of units, and every node below runs once for all units at once
(a loop variable is an index array along its axis). A buffer allocated under k parallel
loops holds one tile per unit of those loops.

Memory starts poisoned (NaN, or a sentinel for integers) and every element carries an
"initialised" flag: reading an element no write or transfer produced, storing one, two
units writing the same element, or a transfer that leaves its parent's tile all raise
IRError. So a dropped transfer or an off-by-one tile cannot pass unnoticed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from synth.errors import IRError
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
    Program,
    Store,
    walk,
)
from synth.reference import elementwise
from synth.workload import Access, BinOp, DType, Role, Workload

Array = np.ndarray[Any, Any]


@dataclass
class BufferState:
    decl: BufferDecl
    values: Array
    init: Array  # which elements hold data
    instance_loops: tuple[str, ...]  # parallel loops around the allocation (leading axes)
    complete: bool | None = False  # every element holds data (None: not known, ask `init`)

    def is_complete(self) -> bool:
        """Cached, because copying `init` along with the data doubles a transfer's cost."""
        if self.complete is None:
            self.complete = bool(self.init.all())
        return self.complete


def poison(dtype: DType) -> float | int:
    return float("nan") if dtype.is_float else int(np.iinfo(dtype.numpy).min) + 7


_HANDLERS: dict[type, Handler] = {}


Handler = Callable[["Machine", Any], None]


def handles(kind: type) -> Callable[[Handler], Handler]:
    """Register the implementation of one node kind."""

    def register(fn: Handler) -> Handler:
        _HANDLERS[kind] = fn
        return fn

    return register


class Machine:
    """The state of one run: buffers, loop variables and the grid of parallel loops."""

    def __init__(self, program: Program, workload: Workload,
                 inputs: Mapping[str, Array]) -> None:
        self.program = program
        self.workload = workload
        self.buffers: dict[str, BufferState] = {}
        self.env: dict[str, int | Array] = {}
        self.grid: list[LoopVar] = []
        self.loops: dict[str, LoopVar] = {}  # the running kernel's loops, by name
        self.carried: set[str] = set()  # dims whose loops carry a dependence (reductions)
        self.nested_units: dict[str, int] = {}  # loop -> most parallel units nested inside
        self.written: set[str] = set()  # buffers the running kernel writes
        for decl in program.globals:
            state = self._fresh(decl, ())
            if decl.name in inputs:
                state.values[...] = inputs[decl.name]
                state.init[...] = True
                state.complete = True
            self.buffers[decl.name] = state

    # -- running -----------------------------------------------------------------

    def run(self, nodes: tuple[Node, ...]) -> None:
        for position, node in enumerate(nodes):
            if isinstance(node, Alloc) and _loaded_next(nodes, position):
                # the load writes every element (data, or poison where ragged): skip the fill
                self.buffers[node.buffer.name] = self._fresh(
                    node.buffer, tuple(v.name for v in self.grid), poisoned=False)
                continue
            _HANDLERS[type(node)](self, node)

    def result(self) -> dict[str, Array]:
        out = {}
        for tensor in self.workload.tensors.values():
            state = self.buffers[tensor.name]
            if tensor.role is not Role.OUTPUT and not state.init.all():
                continue  # an intermediate a fused kernel kept in its innermost memory
            if not state.init.all():
                missing = int((~state.init).sum())
                raise IRError(f"tensor {tensor.name}: expected every element written, "
                              f"got {missing} never written")
            out[tensor.name] = state.values
        return out

    # -- grid helpers ------------------------------------------------------------

    @property
    def grid_shape(self) -> tuple[int, ...]:
        return tuple(v.extent for v in self.grid)

    def value(self, name: str, trailing: int) -> int | Array:
        """A loop variable shaped for an array of grid axes plus `trailing` axes."""
        val = self.env[name]
        if isinstance(val, int):
            return val
        missing = len(self.grid) - val.ndim
        return val.reshape(val.shape + (1,) * (missing + trailing))

    def affine(self, expr: Affine, trailing: int) -> int | Array:
        total: int | Array = expr.const
        for var, coeff in expr.terms:
            total = total + coeff * self.value(var, trailing)
        return total

    def trailing_range(self, length: int, position: int, trailing: int) -> Array:
        shape = [1] * (len(self.grid) + trailing)
        shape[len(self.grid) + position] = length
        return np.arange(length).reshape(shape)

    def _fresh(self, decl: BufferDecl, instance: tuple[str, ...],
               poisoned: bool = True) -> BufferState:
        partials = tuple(self.loop_extent(p) for p in decl.partial_loops)
        shape = self.grid_shape[:len(instance)] + partials + decl.shape
        values = (np.full(shape, poison(decl.dtype), dtype=decl.dtype.numpy) if poisoned
                  else np.empty(shape, dtype=decl.dtype.numpy))
        return BufferState(decl, values, np.zeros(shape, dtype=bool), instance)

    def loop_extent(self, name: str) -> int:
        if name not in self.loops:
            raise IRError(f"expected a loop named {name}, got none")
        return self.loops[name].extent

    # -- transfers ---------------------------------------------------------------

    def region(self, child: BufferState, parent: BufferState, what: str
               ) -> tuple[tuple[int | Array, ...], Array | None]:
        """Index arrays into `parent` for every element of `child`'s value (broadcastable,
        not materialised), and which of those lie inside the tensor (None: all do)."""
        cdecl, pdecl = child.decl, parent.decl
        trailing = len(cdecl.partial_loops) + len(cdecl.shape)
        index: list[int | Array] = [self.value(v, trailing) for v in parent.instance_loops]
        for loop in pdecl.partial_loops:
            if loop in self.env:
                index.append(self.value(loop, trailing))
            elif loop in cdecl.partial_loops:
                index.append(self.trailing_range(self.loop_extent(loop),
                                                 cdecl.partial_loops.index(loop), trailing))
            else:
                raise IRError(f"{what}: expected partial loop {loop} to enclose the transfer "
                              f"or to be an axis of {cdecl.name}, got neither")
        extents = self.workload.tensors[cdecl.tensor].shape
        valid: Array | None = None
        first = len(cdecl.partial_loops)
        for axis, size in enumerate(cdecl.shape):
            coord = self.affine(cdecl.origin[axis], trailing) + self.trailing_range(
                size, first + axis, trailing)
            local = coord - self.affine(pdecl.origin[axis], trailing)
            inside = coord < extents[axis]
            ragged = not bool(np.all(inside))
            bad = (local < 0) | (local >= pdecl.shape[axis])
            if ragged:
                bad = bad & inside
            if bad.any():
                raise IRError(f"{what}: expected the tile inside {pdecl.name} "
                              f"(axis {axis}, 0..{pdecl.shape[axis] - 1}), got index "
                              f"{int(np.asarray(local)[bad].flat[0])}")
            if ragged:
                valid = inside if valid is None else valid & inside
                local = np.where(inside, local, 0)
            index.append(local)
        if valid is not None:
            shape = self.grid_shape + tuple(self.loop_extent(p) for p in cdecl.partial_loops) \
                + cdecl.shape
            valid = np.broadcast_to(valid, shape)
        return tuple(index), valid


@dataclass
class _Axis:
    """One axis of a parent buffer's index: const + sum(coeff * unit or tile axis)."""

    const: int
    coeffs: dict[int, int]  # axis of the moved value -> coefficient


def strided(m: Machine, child: BufferState, parent: BufferState, store: bool
            ) -> tuple[Array, Array] | None:
    """The child's region of the parent (values, init flags) as strided views, or None
    when it cannot be one: a ragged tile, an index leaving the parent, or (for a store)
    two elements of the value landing on one parent element. Views copy at memory speed
    where index arrays gather element by element; a load may read one element many times
    (a tile replicated across units is a zero stride)."""
    cdecl, pdecl = child.decl, parent.decl
    grid_axis = {v.name: g for g, v in enumerate(m.grid)}
    first = len(m.grid) + len(cdecl.partial_loops)
    axes = [_Axis(0, {grid_axis[v]: 1}) for v in parent.instance_loops]
    for loop in pdecl.partial_loops:
        if loop in grid_axis:
            axes.append(_Axis(0, {grid_axis[loop]: 1}))
        elif loop in cdecl.partial_loops:
            axes.append(_Axis(0, {len(m.grid) + cdecl.partial_loops.index(loop): 1}))
        elif isinstance(m.env.get(loop), int):
            axes.append(_Axis(int(m.env[loop]), {}))
        else:
            return None
    extents = m.workload.tensors[cdecl.tensor].shape
    for axis, size in enumerate(cdecl.shape):
        local = _fold(m, cdecl.origin[axis] - pdecl.origin[axis], grid_axis)
        origin = _fold(m, cdecl.origin[axis], grid_axis)
        if origin is None or local is None:
            return None
        shape = m.grid_shape
        if origin.const + sum(c * (shape[g] - 1) for g, c in origin.coeffs.items() if c > 0) \
                + size > extents[axis]:
            return None  # ragged: some elements lie outside the tensor
        local.coeffs[first + axis] = 1
        axes.append(local)
    value_shape = child.values.shape
    for a, ax in enumerate(axes):
        low = ax.const + sum(c * (value_shape[k] - 1) for k, c in ax.coeffs.items() if c < 0)
        high = ax.const + sum(c * (value_shape[k] - 1) for k, c in ax.coeffs.items() if c > 0)
        if low < 0 or high >= parent.values.shape[a]:
            return None
    logical = _logical_strides(parent.values.shape)
    if store and not _injective(_strides(axes, logical, len(value_shape)), value_shape):
        return None  # two units would write one element: the index path reports it
    start = tuple(ax.const for ax in axes)
    return _view(parent.values, start, axes, value_shape), \
        _view(parent.init, start, axes, value_shape)


def _view(array: Array, start: tuple[int, ...], axes: list[_Axis],
          shape: tuple[int, ...]) -> Array:
    """`array` read at start + sum(coeff * index) as a strided view (any strides, so a
    view of a view works too)."""
    origin = array[tuple(slice(c, None) for c in start) + (Ellipsis,)]  # a view, even 0-d
    strides = _strides(axes, array.strides, len(shape))
    return np.lib.stride_tricks.as_strided(origin, shape, strides)


def _strides(axes: list[_Axis], unit: tuple[int, ...] | list[int], rank: int) -> list[int]:
    strides = [0] * rank
    for a, ax in enumerate(axes):
        for k, c in ax.coeffs.items():
            strides[k] += c * unit[a]
    return strides


def _logical_strides(shape: tuple[int, ...]) -> list[int]:
    """Row-major element strides of `shape`: positions, whatever the memory layout."""
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= n
    return strides[::-1]


def _fold(m: Machine, expr: Affine, grid_axis: Mapping[str, int]) -> _Axis | None:
    """An affine index with sequential loop variables replaced by their values."""
    out = _Axis(expr.const, {})
    for var, coeff in expr.terms:
        if var in grid_axis:
            out.coeffs[grid_axis[var]] = out.coeffs.get(grid_axis[var], 0) + coeff
        elif isinstance(m.env.get(var), int):
            out.const += coeff * int(m.env[var])
        else:
            return None
    return out


def _injective(strides: list[int], shape: tuple[int, ...]) -> bool:
    """Whether distinct index vectors reach distinct elements: sorted by stride, each
    stride exceeds the reach of all smaller ones (a mixed-radix layout)."""
    reach = 0
    for stride, extent in sorted((abs(st), n) for st, n in zip(strides, shape, strict=True)
                                 if n > 1):
        if stride <= reach:
            return False
        reach += stride * (extent - 1)
    return True


def _written(nodes: tuple[Node, ...]) -> set[str]:
    """Buffers some node of `nodes` writes (store targets, compute outputs, fills)."""
    out: set[str] = set()
    for node in walk(nodes):
        if isinstance(node, Store):
            out.add(node.dst)
        elif isinstance(node, Compute):
            out.add(node.out)
        elif isinstance(node, Fill | Combine):
            out.add(node.buffer if isinstance(node, Fill) else node.target)
    return out


def _loaded_next(nodes: tuple[Node, ...], position: int) -> bool:
    alloc, after = nodes[position], nodes[position + 1: position + 2]
    return (isinstance(alloc, Alloc) and bool(after) and isinstance(after[0], Load)
            and after[0].dst == alloc.buffer.name)


def _nested_units(nodes: tuple[Node, ...]) -> dict[str, int]:
    """For each loop, the largest product of parallel extents found inside its body."""
    table: dict[str, int] = {}

    def visit(body: tuple[Node, ...]) -> int:
        most = 1
        for node in body:
            if isinstance(node, Loop):
                inside = visit(node.body)
                table[node.var.name] = inside
                own = node.var.extent if node.var.kind is LoopKind.PARALLEL else 1
                most = max(most, own * inside)
        return most

    visit(nodes)
    return table


def _all_loops(nodes: tuple[Node, ...]) -> list[Loop]:
    out: list[Loop] = []
    for node in nodes:
        if isinstance(node, Loop):
            out.append(node)
            out.extend(_all_loops(node.body))
    return out


# ---------------------------------------------------------------- one handler per node kind


MAX_GRID = 1 << 16  # units run at once; beyond this, independent loops iterate instead


@handles(Loop)
def run_loop(m: Machine, node: Loop) -> None:
    """Parallel loops, and sequential loops whose iterations are independent (they walk a
    dimension the kernel does not reduce over), become grid axes; the rest iterate."""
    var = node.var
    units = int(np.prod(m.grid_shape, dtype=np.int64)) * var.extent * m.nested_units[var.name]
    if var.kind is LoopKind.PARALLEL or (var.dim not in m.carried and units <= MAX_GRID):
        axis = len(m.grid)
        m.env[var.name] = np.arange(var.extent).reshape((1,) * axis + (var.extent,))
        m.grid.append(var)
        m.run(node.body)
        m.grid.pop()
    else:
        for i in range(var.extent):
            m.env[var.name] = i
            m.run(node.body)
    del m.env[var.name]


@handles(Alloc)
def run_alloc(m: Machine, node: Alloc) -> None:
    node.verify()
    m.buffers[node.buffer.name] = m._fresh(node.buffer, tuple(v.name for v in m.grid))


@handles(Load)
def run_load(m: Machine, node: Load) -> None:
    child, parent = m.buffers[node.dst], m.buffers[node.src]
    views = strided(m, child, parent, store=False)
    if views is not None and node.dst not in m.written and parent.is_complete():
        # a read-only tile of a read-only parent: alias it instead of copying (exact,
        # since nothing in the kernel writes either; replication costs a zero stride)
        child.values = views[0]
        child.values.flags.writeable = False
        child.init = np.broadcast_to(np.True_, child.values.shape)
        child.complete = True
        return
    if views is not None:
        child.values[...] = views[0]
        if parent.is_complete():
            child.init[...] = True
            child.complete = True
        else:
            child.init[...] = views[1]
            child.complete = None
        return
    child.complete = None
    index, valid = m.region(child, parent, f"load {node.dst} <- {node.src}")
    if valid is None:
        child.values[...] = parent.values[index]
        child.init[...] = parent.init[index]
        return
    child.values[...] = np.where(valid, parent.values[index], poison(child.decl.dtype))
    child.init[...] = valid & parent.init[index]


@handles(Store)
def run_store(m: Machine, node: Store) -> None:
    child, parent = m.buffers[node.src], m.buffers[node.dst]
    what = f"store {node.src} -> {node.dst}"
    views = strided(m, child, parent, store=True)
    if views is not None:
        if not child.is_complete():
            raise IRError(f"{what}: expected a computed tile, got uninitialised elements")
        views[0][...] = child.values
        views[1][...] = True
        parent.complete = None
        return
    index, valid = m.region(child, parent, what)
    shape = child.values.shape
    if valid is None:  # every element lies inside the tensor: no masking needed
        if not child.init.all():
            raise IRError(f"{what}: expected a computed tile, got uninitialised elements")
        targets = tuple(np.broadcast_to(i, shape) for i in index)
        values = child.values
    else:
        if not child.init[valid].all():
            raise IRError(f"{what}: expected a computed tile, got uninitialised elements")
        targets = tuple(np.broadcast_to(i, shape)[valid] for i in index)
        values = child.values[valid]
    if targets and _repeats(np.ravel_multi_index(targets, parent.values.shape),
                            parent.values.size):
        raise IRError(f"{what}: expected each element written by one unit, got units "
                      f"writing the same element")
    parent.values[targets] = values
    parent.init[targets] = True
    parent.complete = None


def _repeats(flat: Array, size: int) -> bool:
    """Whether any flat index occurs twice (linear time, unlike sorting)."""
    seen = np.zeros(size, dtype=bool)
    seen[flat] = True
    return int(np.count_nonzero(seen)) != flat.size


@handles(Fill)
def run_fill(m: Machine, node: Fill) -> None:
    state = m.buffers[node.buffer]
    state.values[...] = node.value
    state.init[...] = True
    state.complete = True


@handles(Combine)
def run_combine(m: Machine, node: Combine) -> None:
    """target = op(target, reduce(partials)), where the target holds data: elements of a
    ragged tile past the tensor's edge hold none and are left alone (masked)."""
    target, partials = m.buffers[node.target], m.buffers[node.partials]
    # partial axes follow the instance axes (the grid of units the buffer belongs to)
    lead = len(partials.instance_loops)
    axes = tuple(range(lead, lead + len(partials.decl.partial_loops)))
    valid = target.init
    if not valid.any() or not np.all(partials.init.all(axis=axes) | ~valid):
        raise IRError(f"combine {node.partials}: expected initialised partials and target")
    reduced = node.op.ufunc.reduce(partials.values, axis=axes, dtype=target.values.dtype)
    combined = node.op.ufunc(target.values, reduced).astype(target.values.dtype)
    target.values[...] = np.where(valid, combined, target.values)


@handles(Compute)
def run_compute(m: Machine, node: Compute) -> None:
    stmt = m.workload.statement(node.statement)
    frame = ComputeFrame(m, node, stmt.extents)
    operands = {t: frame.place(node.operands[t], stmt.inputs_indices(t)) for t in stmt.inputs}
    target = frame.place(node.out, stmt.indices)
    for tensor, place in operands.items():
        place.require_initialised(f"compute {node.statement}: expected initialised "
                                  f"{node.operands[tensor]}, got elements no load or "
                                  f"compute wrote")
    if stmt.op.reduces:
        target.require_initialised(f"compute {node.statement}: expected the accumulator "
                                   f"{node.out} loaded or filled, got uninitialised elements")
    with np.errstate(all="ignore"):
        value = contract(frame, stmt)
        if value is None:
            value = elementwise(stmt.expr, lambda acc: frame.place(
                node.operands[acc.tensor], acc.indices).read())
            if stmt.reduced:
                value = reduce_points(frame, stmt, value)
        if stmt.op.reduces:
            value = stmt.op.ufunc(target.read(), value)
    target.write(_cast(np.asarray(value), stmt.dtype))


def reduce_points(frame: ComputeFrame, stmt: Any, value: Array) -> Array:
    """Reduce over the statement's reduced dims; points outside the tensor count as the
    operator's identity."""
    if frame.ragged:
        value = np.where(frame.everywhere, value, stmt.op.identity(stmt.dtype))
    axes = tuple(len(frame.m.grid) + frame.node.dims.index(d) for d in stmt.reduced)
    return stmt.op.ufunc.reduce(value, axis=axes, keepdims=True, dtype=np.result_type(value))


def contract(frame: ComputeFrame, stmt: Any) -> Array | None:
    """`a * b` summed over the reduced dims as one batched matrix product, when the
    statement is exactly that. Axes are sorted by which operand varies along them: both
    (batch, or the contracted dims), only `a` (rows), only `b` (columns), neither
    (dropped, broadcast back at the end). So a tile that many units share is multiplied
    once, not once per unit. Integers are contracted exactly (in floating point only when
    every partial sum provably fits its mantissa) and wrap like C."""
    expr = stmt.expr
    if not (stmt.op.value == "+=" and stmt.reduced and not frame.ragged
            and isinstance(expr, BinOp) and expr.op == "*"
            and isinstance(expr.lhs, Access) and isinstance(expr.rhs, Access)):
        return None
    node = frame.node
    a, b = (frame.place(node.operands[acc.tensor], acc.indices).frame_view()
            for acc in (expr.lhs, expr.rhs))
    grid = len(frame.m.grid)
    reduced = {grid + node.dims.index(d) for d in stmt.reduced}
    varies_a = [n > 1 and st != 0 for n, st in zip(a.shape, a.strides, strict=True)]
    varies_b = [n > 1 and st != 0 for n, st in zip(b.shape, b.strides, strict=True)]
    rank = a.ndim
    if any(varies_a[k] != varies_b[k] for k in reduced):
        return None  # a reduced dim only one operand walks: not a plain product-sum
    batch = [k for k in range(rank) if k not in reduced and varies_a[k] and varies_b[k]]
    rows = [k for k in range(rank) if varies_a[k] and not varies_b[k]]
    cols = [k for k in range(rank) if varies_b[k] and not varies_a[k]]
    inner = [k for k in reduced if varies_a[k]]
    sizes = [max(a.shape[k], b.shape[k]) for k in range(rank)]

    def matrix(x: Array, outer: list[int], keep: set[int]) -> Array:
        pick = tuple(slice(None) if k in keep else 0 for k in range(rank))
        kept = [k for k in range(rank) if k in keep]
        order = [kept.index(k) for k in batch + outer + inner]
        squeezed = x[pick].transpose(order)
        return squeezed.reshape(_prod(batch, sizes), _prod(outer, sizes), _prod(inner, sizes))

    left = matrix(a, rows, set(batch + rows + inner))
    right = matrix(b, cols, set(batch + cols + inner)).transpose(0, 2, 1)
    if left.dtype.kind in "iu":
        bound = float(np.abs(left).max(initial=0)) * float(np.abs(right).max(initial=0)) \
            * max(_prod(inner, sizes), 1)
        # the smallest type in which every partial sum is exact
        work = np.float32 if bound < 2.0**24 else np.float64 if bound < 2.0**53 else np.int64
        left, right = left.astype(work), right.astype(work)
    else:  # floats in float64, like the reference and the elementwise path
        left, right = left.astype(np.float64), right.astype(np.float64)
    product = np.matmul(left, right)
    if product.dtype.kind == "f" and a.dtype.kind in "iu":
        product = np.rint(product).astype(np.int64)
    shaped = product.reshape([sizes[k] for k in batch + rows + cols])
    placed = _place(shaped, batch + rows + cols, rank)
    out_shape = list(frame.m.grid_shape) + [1 if d in stmt.reduced else node.tile[k]
                                            for k, d in enumerate(node.dims)]
    return np.broadcast_to(placed, out_shape)


def _prod(axes: list[int], sizes: list[int]) -> int:
    return int(np.prod([sizes[k] for k in axes], dtype=np.int64))


def _place(array: Array, axes: list[int], rank: int) -> Array:
    """`array`, whose axes are `axes` of a rank-`rank` layout, with size-1 axes elsewhere."""
    order = sorted(range(len(axes)), key=lambda i: axes[i])
    moved = array.transpose(order)
    shape = [1] * rank
    for i in order:
        shape[axes[i]] = array.shape[i]
    return moved.reshape(shape)


class ComputeFrame:
    """The iteration points of one compute: per dim, global coordinates and validity,
    laid out as the grid's axes followed by one axis per dim."""

    def __init__(self, m: Machine, node: Compute, extents: Mapping[str, int]) -> None:
        self.m = m
        self.node = node
        trailing = len(node.dims)
        self.coords = [m.affine(o, trailing) + m.trailing_range(t, k, trailing)
                       for k, (o, t) in enumerate(zip(node.origin, node.tile, strict=True))]
        self.inside = [c < extents[d] for c, d in zip(self.coords, node.dims, strict=True)]
        self.ragged = not all(bool(np.all(i)) for i in self.inside)

    @property
    def everywhere(self) -> Array | bool:
        """Which points lie inside every dimension (True when all do)."""
        if not self.ragged:
            return True
        mask = self.inside[0]
        for inside in self.inside[1:]:
            mask = mask & inside
        return mask

    def place(self, buffer: str, indices: tuple[str, ...]) -> TilePlace:
        return TilePlace(self, self.m.buffers[buffer], indices)


class TilePlace:
    """Where a compute's points fall in one buffer: a slice when the tile sits at the same
    offset for every unit (the common case), index arrays otherwise."""

    def __init__(self, frame: ComputeFrame, state: BufferState,
                 indices: tuple[str, ...]) -> None:
        self.frame, self.state, self.indices = frame, state, indices
        node = frame.node
        self.positions = [node.dims.index(d) for d in indices]
        self.view_index = self._slices()
        if self.view_index is None:
            self.index, self.mask = self._arrays()

    def _slices(self) -> tuple | None:
        m, node, decl = self.frame.m, self.frame.node, self.state.decl
        if self.state.instance_loops != tuple(v.name for v in m.grid):
            return None
        if not self.positions:  # a scalar per unit: nothing to be ragged; `...` keeps a view
            return (slice(None),) * len(m.grid) + (Ellipsis,)
        if self.frame.ragged:
            return None
        slices = []
        for axis, k in enumerate(self.positions):
            offset = m.affine(node.origin[k] - decl.origin[axis], 0)
            if not isinstance(offset, int):
                return None
            if offset < 0 or offset + node.tile[k] > decl.shape[axis]:
                raise IRError(f"compute {node.statement}: expected {node.dims[k]} inside "
                              f"tile of {decl.name}, got an index outside "
                              f"0..{decl.shape[axis] - 1}")
            slices.append(slice(offset, offset + node.tile[k]))
        return (slice(None),) * len(m.grid) + tuple(slices)

    def _arrays(self) -> tuple[tuple, Array]:
        m, node, decl = self.frame.m, self.frame.node, self.state.decl
        trailing = len(node.dims)
        index: list[int | Array] = [m.value(v, trailing) for v in self.state.instance_loops]
        mask: Array = np.ones((1,) * (len(m.grid) + trailing), dtype=bool)
        for axis, k in enumerate(self.positions):
            local = self.frame.coords[k] - m.affine(decl.origin[axis], trailing)
            ok = self.frame.inside[k]
            if (ok & ((local < 0) | (local >= decl.shape[axis]))).any():
                raise IRError(f"compute {node.statement}: expected {node.dims[k]} inside "
                              f"tile of {decl.name}, got an index outside "
                              f"0..{decl.shape[axis] - 1}")
            index.append(np.where(ok, local, 0))
            mask = mask & ok
        shape = np.broadcast_shapes(*(np.shape(i) for i in index), mask.shape)
        return tuple(np.broadcast_to(i, shape) for i in index), np.broadcast_to(mask, shape)

    def _to_frame(self, tile: Array) -> Array:
        """A view's axes (grid, then buffer axes) reordered and padded to the frame's."""
        grid = len(self.frame.m.grid)
        order = sorted(range(len(self.positions)), key=lambda a: self.positions[a])
        tile = tile.transpose(tuple(range(grid)) + tuple(grid + a for a in order))
        shape = list(tile.shape[:grid]) + [1] * len(self.frame.node.dims)
        for a in order:
            shape[grid + self.positions[a]] = self.frame.node.tile[self.positions[a]]
        return tile.reshape(shape)

    def read(self) -> Array:
        if self.view_index is not None:
            return self._to_frame(self.state.values[self.view_index])
        return self.state.values[self.index]

    def frame_view(self) -> Array:
        """The tile in the frame's layout without copying: absent dims, and units that
        share one tile, are zero strides (read-only)."""
        if self.view_index is None:
            return self.read()
        tile = self.state.values[self.view_index]
        grid = len(self.frame.m.grid)
        node = self.frame.node
        shape = list(tile.shape[:grid]) + [1] * len(node.dims)
        strides = list(tile.strides[:grid]) + [0] * len(node.dims)
        for axis, k in enumerate(self.positions):
            shape[grid + k] = tile.shape[grid + axis]
            strides[grid + k] = tile.strides[grid + axis]
        return np.lib.stride_tricks.as_strided(tile, shape, strides, writeable=False)

    def require_initialised(self, message: str) -> None:
        if self.state.complete:
            return
        if self.view_index is not None:
            ok = bool(self.state.init[self.view_index].all())
        else:
            ok = bool(self.state.init[self.index][self.mask].all())
        if not ok:
            raise IRError(message)

    def write(self, result: Array) -> None:
        if self.view_index is not None:
            target = self._to_frame(self.state.values[self.view_index])
            target[...] = np.broadcast_to(result, target.shape)
            self.state.init[self.view_index] = True
            self.state.complete = None
            return
        values = np.broadcast_to(result, self.mask.shape)[self.mask]
        points = tuple(i[self.mask] for i in self.index)
        if not points:  # a scalar target outside any parallel loop
            self.state.values[...] = values.reshape(-1)[0]
            self.state.init[...] = True
            self.state.complete = True
            return
        self.state.values[points] = values
        self.state.init[points] = True
        self.state.complete = None


def _cast(values: Array, dtype: DType) -> Array:
    if dtype.is_float:
        return values.astype(dtype.numpy)
    return values.astype(np.int64).astype(dtype.numpy)


def interpret(program: Program, workload: Workload, inputs: Mapping[str, Array]
              ) -> dict[str, Array]:
    """Run every kernel in order; the final value of every tensor."""
    machine = Machine(program, workload, inputs)
    for kernel in program.kernels:
        machine.loops = {loop.var.name: loop.var for loop in _all_loops(kernel.body)}
        machine.carried = {d for name in kernel.statements
                           for d in workload.statement(name).reduced}
        machine.nested_units = _nested_units(kernel.body)
        machine.written = _written(kernel.body)
        machine.run(kernel.body)
    return machine.result()
