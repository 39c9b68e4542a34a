"""What one Compute node computes, over a frame of tiles (the interpreter's arithmetic).

`interpret.Machine` runs the loop nest: grids of units, batched loops, buffers and their
transfers. A `Compute` node then evaluates its statement at every point of its frame (the
compute tile's dims, times the grid): `ComputeFrame` holds the frame's index arrays,
`TilePlace` reads and writes one buffer's tile at those points (a strided view where the
tile's layout allows, gathered points elsewhere) and checks that what it reads was
initialised. `points` evaluates the statement's expression (`reference.elementwise`, as
the NumPy reference does), `contract` a product-sum as one matrix product, `accumulate`
and `fold` a reduction whose loop the interpreter batched (every iteration's
contribution folded in iteration order, cast to the accumulator's dtype after each).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from synth.errors import IRError
from synth.ir.fold_plan import reorderable
from synth.ir.nodes import Affine, Compute
from synth.reference import elementwise
from synth.workload import Access, BinOp, DType, ReduceOp, Statement

if TYPE_CHECKING:
    from synth.ir.interpret import BufferState, Machine

Array = np.ndarray[Any, Any]
UFUNCS = {op: op.ufunc for op in ReduceOp if op.reduces}  # (`ReduceOp.ufunc` builds a dict)


@functools.cache
def minus(a: Affine, b: Affine) -> Affine:
    """`a - b`, once per pair: transfers and computes ask for the same offsets per step."""
    return a - b


def accumulator_message(node: Compute) -> str:
    return (f"compute {node.statement}: expected the accumulator {node.out} loaded or "
            f"filled, got uninitialised elements")


def points(frame: ComputeFrame, stmt: Statement) -> Array:
    """The statement's value at every point of the frame, reduced over its reduced dims."""
    node = frame.node
    value = elementwise(stmt.expr, lambda acc: frame.place(
        node.operands[acc.tensor], acc.indices).read())
    return reduce_points(frame, stmt, value) if stmt.reduced else value


def accumulate(m: Machine, frame: ComputeFrame, stmt: Statement,
               folded: tuple[int, ...]) -> None:
    """A compute, in batched reduction loops, into a tile all their iterations share (the
    `folded` grid axes): every iteration's contribution at once, then folded into it."""
    node = frame.node
    if not stmt.op.reduces:  # `fold_plan` admits reductions only; a plain store would race
        raise IRError(f"compute {node.statement}: expected a reduction into {node.out}, "
                      f"which the iterations of a batched loop share, got an assignment")
    with np.errstate(all="ignore"):
        value, pending = contributions(frame, stmt, folded)
    with m.collapsed(frozenset(m.grid[axis].name for axis in folded)):
        target = ComputeFrame(m, node, stmt.extents).place(node.out, stmt.indices)
        target.require_initialised(accumulator_message(node))
        with np.errstate(all="ignore"):
            result = fold(stmt, target.read(), value, pending)
        target.write(result)


def contributions(frame: ComputeFrame, stmt: Statement, folded: tuple[int, ...]
                  ) -> tuple[Array, tuple[int, ...]]:
    """Each iteration's contribution over the whole frame, and the axes still to fold:
    none when a product-sum contracted them too (only where the order cannot matter)."""
    if reorderable(stmt):
        value = contract(frame, stmt, folded)
        if value is not None:
            return value, ()
    value = contract(frame, stmt)
    if value is None:
        value = points(frame, stmt)
    # an iteration whose operands do not vary along a folded axis still contributes
    return np.broadcast_to(value, frame.out_shape), folded


def fold(stmt: Statement, acc: Array, value: Array, axes: tuple[int, ...]) -> Array:
    """`acc op= value` along `axes` of `value`: in iteration order, cast to the target's
    dtype after each step (the step-by-step run's rounding), or in one reduction where no
    order changes the result (`reorderable`)."""
    op = UFUNCS[stmt.op]
    if axes and reorderable(stmt):
        wide = np.int64 if value.dtype.kind in "iu" else value.dtype  # wraps mod 2**64
        value, axes = op.reduce(value, axis=axes, keepdims=True, dtype=wide), ()
    if not axes:
        return cast(np.asarray(op(acc, value)), stmt.dtype)
    steps = np.moveaxis(value, axes, tuple(range(len(axes))))
    steps = steps.reshape((-1,) + steps.shape[len(axes):])  # iteration order: C order
    out = np.squeeze(acc, axis=axes)
    for step in steps:
        out = cast(np.asarray(op(out, step)), stmt.dtype)
    return np.expand_dims(out, axes)


def reduce_points(frame: ComputeFrame, stmt: Any, value: Array) -> Array:
    """Reduce over the statement's reduced dims; points outside the tensor count as the
    operator's identity."""
    if frame.ragged:
        value = np.where(frame.everywhere, value, stmt.op.identity(stmt.dtype))
    axes = tuple(len(frame.m.grid) + frame.node.dims.index(d) for d in stmt.reduced)
    return UFUNCS[stmt.op].reduce(value, axis=axes, keepdims=True,
                                   dtype=np.result_type(value))


def contract(frame: ComputeFrame, stmt: Any, folded: tuple[int, ...] = ()) -> Array | None:
    """`a * b` summed over the reduced dims as one batched matrix product, when the
    statement is exactly that. Axes are sorted by which operand varies along them: both
    (batch, or the contracted dims), only `a` (rows), only `b` (columns), neither
    (dropped, broadcast back at the end). So a tile that many units share is multiplied
    once, not once per unit. Integers are contracted exactly (in floating point only when
    every partial sum provably fits its mantissa) and wrap like C. `folded` grid axes
    (batched reduction loops, `accumulate`) are contracted too, if both operands walk
    them (an operand constant along one would have to count once per iteration)."""
    expr = stmt.expr
    if not product_sum(stmt) or frame.ragged:
        return None
    assert isinstance(expr, BinOp) and isinstance(expr.lhs, Access) \
        and isinstance(expr.rhs, Access)
    node = frame.node
    a, b = (frame.place(node.operands[acc.tensor], acc.indices).frame_view()
            for acc in (expr.lhs, expr.rhs))
    grid = len(frame.m.grid)
    reduced = {grid + node.dims.index(d) for d in stmt.reduced} | set(folded)
    varies_a = [n > 1 and st != 0 for n, st in zip(a.shape, a.strides, strict=True)]
    varies_b = [n > 1 and st != 0 for n, st in zip(b.shape, b.strides, strict=True)]
    rank = a.ndim
    if any(varies_a[k] != varies_b[k] for k in reduced):
        return None  # a reduced dim only one operand walks: not a plain product-sum
    if not all(varies_a[k] for k in folded):
        return None
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
    out_shape = list(frame.out_shape)
    for axis in folded:
        out_shape[axis] = 1
    return np.broadcast_to(placed, out_shape)


def product_sum(stmt: Statement) -> bool:
    """`target += a[...] * b[...]` with reduced dims: what `contract` computes."""
    expr = stmt.expr
    return (stmt.op is ReduceOp.ADD and bool(stmt.reduced)
            and isinstance(expr, BinOp) and expr.op == "*"
            and isinstance(expr.lhs, Access) and isinstance(expr.rhs, Access))


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
    def out_shape(self) -> list[int]:
        """The frame's shape once reduced over the statement's reduced dims."""
        reduced = self.m.workload.statement(self.node.statement).reduced
        return list(self.m.grid_shape) + [1 if d in reduced else self.node.tile[k]
                                          for k, d in enumerate(self.node.dims)]

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
        self.lead = self._lead()
        self.view_index = self._slices()
        if self.view_index is None:
            self.index, self.mask = self._arrays()

    def _lead(self) -> int | None:
        """How many leading grid axes the buffer has: all of them, or all but trailing
        axes of one unit (batched loops collapsed around a tile they share); None when
        its tiles follow another set of loops (index arrays then)."""
        grid, instance = self.frame.m.grid, self.state.instance_loops
        lead = len(instance)
        if tuple(v.name for v in grid[:lead]) != instance:
            return None
        if lead < len(grid) and (self.state.decl.partial_loops
                                 or any(v.extent != 1 for v in grid[lead:])):
            return None
        return lead

    def _slices(self) -> tuple | None:
        m, node, decl = self.frame.m, self.frame.node, self.state.decl
        if self.lead is None:
            return None
        if not self.positions:  # a scalar per unit: nothing to be ragged; `...` keeps a view
            return (slice(None),) * self.lead + (Ellipsis,)
        if self.frame.ragged:
            return None
        slices = []
        for axis, k in enumerate(self.positions):
            offset = m.affine(minus(node.origin[k], decl.origin[axis]), 0)
            if not isinstance(offset, int):
                return None
            if offset < 0 or offset + node.tile[k] > decl.shape[axis]:
                raise IRError(f"compute {node.statement}: expected {node.dims[k]} inside "
                              f"tile of {decl.name}, got an index outside "
                              f"0..{decl.shape[axis] - 1}")
            slices.append(slice(offset, offset + node.tile[k]))
        return (slice(None),) * self.lead + tuple(slices)

    def _arrays(self) -> tuple[tuple, Array]:
        m, node, decl = self.frame.m, self.frame.node, self.state.decl
        trailing = len(node.dims)
        # a grid axis along which the buffer holds one tile (shared by the units of a
        # parallel loop, `BufferDecl.shared`) is indexed at 0 by every unit
        index: list[int | Array] = [
            0 if self.state.values.shape[axis] == 1 else m.value(v, trailing)
            for axis, v in enumerate(self.state.instance_loops)]
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
        grid, lead = len(self.frame.m.grid), self.lead or 0
        order = sorted(range(len(self.positions)), key=lambda a: self.positions[a])
        tile = tile.transpose(tuple(range(lead)) + tuple(lead + a for a in order))
        shape = list(tile.shape[:lead]) + [1] * (grid - lead + len(self.frame.node.dims))
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
            value = self.read()
            if value.ndim == 0:  # a scalar tensor read through index arrays: no axes at all
                value = value.reshape((1,) * (len(self.frame.m.grid)
                                              + len(self.frame.node.dims)))
            return value
        tile = self.state.values[self.view_index]
        grid, lead = len(self.frame.m.grid), self.lead or 0
        node = self.frame.node
        shape = list(tile.shape[:lead]) + [1] * (grid - lead + len(node.dims))
        strides = list(tile.strides[:lead]) + [0] * (grid - lead + len(node.dims))
        for axis, k in enumerate(self.positions):
            shape[grid + k] = tile.shape[lead + axis]
            strides[grid + k] = tile.strides[lead + axis]
        return np.lib.stride_tricks.as_strided(tile, shape, strides, writeable=False)

    def require_initialised(self, message: str) -> None:
        if self.state.complete:
            return
        if self.view_index is not None:
            ok = bool(self.state.init[self.view_index].all())
        elif not self.index:  # a scalar tensor (as in `write`)
            ok = bool(self.state.init.all())
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


def cast(values: Array, dtype: DType) -> Array:
    if dtype.is_float:
        return values.astype(dtype.numpy)
    return values.astype(np.int64).astype(dtype.numpy)
