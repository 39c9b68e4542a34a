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
)
from synth.reference import elementwise
from synth.workload import Access, DType, Workload

Array = np.ndarray[Any, Any]


@dataclass
class BufferState:
    decl: BufferDecl
    values: Array
    init: Array  # which elements hold data
    instance_loops: tuple[str, ...]  # parallel loops around the allocation (leading axes)


def poison(dtype: DType) -> float | int:
    return float("nan") if dtype.is_float else int(np.iinfo(dtype.numpy).min) + 7


_HANDLERS: dict[type, Callable[[Machine, Any], None]] = {}


def handles(kind: type) -> Callable[[Callable[[Machine, Any], None]], Callable[[Machine, Any], None]]:
    """Register the implementation of one node kind."""

    def register(fn: Callable[[Machine, Any], None]) -> Callable[[Machine, Any], None]:
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
        for decl in program.globals:
            state = self._fresh(decl, ())
            if decl.name in inputs:
                state.values[...] = inputs[decl.name]
                state.init[...] = True
            self.buffers[decl.name] = state

    # -- running -----------------------------------------------------------------

    def run(self, nodes: tuple[Node, ...]) -> None:
        for node in nodes:
            _HANDLERS[type(node)](self, node)

    def result(self) -> dict[str, Array]:
        out = {}
        for tensor in self.workload.tensors.values():
            state = self.buffers[tensor.name]
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

    def _fresh(self, decl: BufferDecl, instance: tuple[str, ...]) -> BufferState:
        partials = tuple(self.loop_extent(p) for p in decl.partial_loops)
        shape = self.grid_shape[:len(instance)] + partials + decl.shape
        return BufferState(decl, np.full(shape, poison(decl.dtype), dtype=decl.dtype.numpy),
                           np.zeros(shape, dtype=bool), instance)

    def loop_extent(self, name: str) -> int:
        if name not in self.loops:
            raise IRError(f"expected a loop named {name}, got none")
        return self.loops[name].extent

    # -- transfers ---------------------------------------------------------------

    def region(self, child: BufferState, parent: BufferState, what: str
               ) -> tuple[tuple[int | Array, ...], Array]:
        """Index arrays into `parent` for every element of `child`'s value, and which of
        those elements lie inside the tensor."""
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
        valid: Array = np.ones((1,) * (len(self.grid) + trailing), dtype=bool)
        first = len(cdecl.partial_loops)
        for axis, size in enumerate(cdecl.shape):
            coord = self.affine(cdecl.origin[axis], trailing) + self.trailing_range(
                size, first + axis, trailing)
            inside = coord < extents[axis]
            local = coord - self.affine(pdecl.origin[axis], trailing)
            bad = inside & ((local < 0) | (local >= pdecl.shape[axis]))
            if bad.any():
                raise IRError(f"{what}: expected the tile inside {pdecl.name} "
                              f"(axis {axis}, 0..{pdecl.shape[axis] - 1}), got index "
                              f"{int(np.asarray(local)[bad].flat[0])}")
            valid = valid & inside
            index.append(np.where(inside, local, 0))
        shape = self.grid_shape + tuple(self.loop_extent(p) for p in cdecl.partial_loops) \
            + cdecl.shape
        return tuple(np.broadcast_to(i, shape) for i in index), np.broadcast_to(valid, shape)


def _all_loops(nodes: tuple[Node, ...]) -> list[Loop]:
    out: list[Loop] = []
    for node in nodes:
        if isinstance(node, Loop):
            out.append(node)
            out.extend(_all_loops(node.body))
    return out


# ---------------------------------------------------------------- one handler per node kind


@handles(Loop)
def run_loop(m: Machine, node: Loop) -> None:
    var = node.var
    if var.kind is LoopKind.PARALLEL:
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
    index, valid = m.region(child, parent, f"load {node.dst} <- {node.src}")
    child.values[...] = np.where(valid, parent.values[index], poison(child.decl.dtype))
    child.init[...] = valid & parent.init[index]


@handles(Store)
def run_store(m: Machine, node: Store) -> None:
    child, parent = m.buffers[node.src], m.buffers[node.dst]
    what = f"store {node.src} -> {node.dst}"
    index, valid = m.region(child, parent, what)
    if not child.init[valid].all():
        raise IRError(f"{what}: expected a computed tile, got uninitialised elements")
    targets = tuple(np.asarray(i)[valid] for i in index)
    flat = np.ravel_multi_index(targets, parent.values.shape) if targets else np.zeros(0)
    if len(np.unique(flat)) != len(flat):
        raise IRError(f"{what}: expected each element written by one unit, got units "
                      f"writing the same element")
    parent.values[targets] = child.values[valid]
    parent.init[targets] = True


@handles(Fill)
def run_fill(m: Machine, node: Fill) -> None:
    state = m.buffers[node.buffer]
    state.values[...] = node.value
    state.init[...] = True


@handles(Combine)
def run_combine(m: Machine, node: Combine) -> None:
    target, partials = m.buffers[node.target], m.buffers[node.partials]
    if not (partials.init.all() and target.init.all()):
        raise IRError(f"combine {node.partials}: expected initialised partials and target")
    axes = tuple(range(len(partials.decl.partial_loops)))
    reduced = node.op.ufunc.reduce(partials.values, axis=axes, dtype=target.values.dtype)
    target.values[...] = node.op.ufunc(target.values, reduced).astype(target.values.dtype)


@handles(Compute)
def run_compute(m: Machine, node: Compute) -> None:
    stmt = m.workload.statement(node.statement)
    trailing = len(node.dims)
    coords = [m.affine(o, trailing) + m.trailing_range(t, k, trailing)
              for k, (o, t) in enumerate(zip(node.origin, node.tile, strict=True))]
    inside = [c < stmt.extents[d] for c, d in zip(coords, node.dims, strict=True)]

    def read(buffer: str, indices: tuple[str, ...]) -> tuple[Array, Array, tuple]:
        state = m.buffers[buffer]
        index: list[int | Array] = [m.value(v, trailing) for v in state.instance_loops]
        mask: Array = np.ones((1,) * (len(m.grid) + trailing), dtype=bool)
        for axis, dim in enumerate(indices):
            k = node.dims.index(dim)
            local = coords[k] - m.affine(state.decl.origin[axis], trailing)
            ok = inside[k]
            if (ok & ((local < 0) | (local >= state.decl.shape[axis]))).any():
                raise IRError(f"compute {node.statement}: expected {dim} inside tile of "
                              f"{buffer}, got an index outside 0..{state.decl.shape[axis] - 1}")
            index.append(np.where(ok, local, 0))
            mask = mask & ok
        idx = tuple(index)
        if not state.init[idx][np.broadcast_to(mask, state.init[idx].shape)].all():
            raise IRError(f"compute {node.statement}: expected initialised {buffer}, got "
                          f"elements no load or compute wrote")
        return state.values[idx], mask, idx

    def access(acc: Access) -> Array:
        return read(node.operands[acc.tensor], acc.indices)[0]

    with np.errstate(all="ignore"):
        value = elementwise(stmt.expr, access)
        grid_axes = len(m.grid)
        full = np.broadcast_shapes(np.shape(value), m.grid_shape + tuple(
            node.tile[k] if node.dims[k] not in stmt.reduced else 1 for k in range(trailing)))
        if stmt.reduced:
            shape = np.broadcast_shapes(np.shape(value), m.grid_shape + node.tile)
            everywhere = np.broadcast_to(np.logical_and.reduce(np.broadcast_arrays(*inside)),
                                         shape)
            value = np.broadcast_to(value, everywhere.shape)
            identity = stmt.op.identity(stmt.dtype)
            value = np.where(everywhere, value, identity)
            axes = tuple(grid_axes + node.dims.index(d) for d in stmt.reduced)
            value = stmt.op.ufunc.reduce(value, axis=axes, keepdims=True,
                                         dtype=np.result_type(value))
        out_values, out_mask, out_idx = read_target(m, node, stmt, coords, inside, trailing)
        if stmt.op.reduces:
            value = stmt.op.ufunc(out_values, value)
        result = np.broadcast_to(value, np.broadcast_shapes(np.shape(value), full))
    store_target(m, node, stmt.dtype, result, out_mask, out_idx)


def read_target(m: Machine, node: Compute, stmt: Any, coords: list, inside: list,
                trailing: int) -> tuple[Array, Array, tuple]:
    """The target tile at the compute's points (its reduced axes of length 1)."""
    state = m.buffers[node.out]
    index: list[int | Array] = [m.value(v, trailing) for v in state.instance_loops]
    mask: Array = np.ones((1,) * (len(m.grid) + trailing), dtype=bool)
    for axis, dim in enumerate(stmt.indices):
        k = node.dims.index(dim)
        local = coords[k] - m.affine(state.decl.origin[axis], trailing)
        if (inside[k] & ((local < 0) | (local >= state.decl.shape[axis]))).any():
            raise IRError(f"compute {node.statement}: expected {dim} inside tile of "
                          f"{node.out}, got an index outside 0..{state.decl.shape[axis] - 1}")
        index.append(np.where(inside[k], local, 0))
        mask = mask & inside[k]
    idx = tuple(index)
    values = state.values[idx] if idx else state.values
    if stmt.op.reduces:
        init = state.init[idx] if idx else state.init
        if not init[np.broadcast_to(mask, init.shape)].all():
            raise IRError(f"compute {node.statement}: expected the accumulator {node.out} "
                          f"loaded or filled, got uninitialised elements")
    return values, mask, idx


def store_target(m: Machine, node: Compute, dtype: DType, result: Array, mask: Array,
                 idx: tuple) -> None:
    state = m.buffers[node.out]
    shape = np.broadcast_shapes(result.shape, mask.shape)
    full_mask = np.broadcast_to(mask, shape)
    targets = tuple(np.broadcast_to(i, shape)[full_mask] for i in idx)
    values = np.broadcast_to(result, shape)[full_mask]
    if not targets:  # a scalar target outside any parallel loop
        state.values[...] = _cast(values, dtype).reshape(())
        state.init[...] = True
        return
    state.values[targets] = _cast(values, dtype)
    state.init[targets] = True


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
        machine.run(kernel.body)
    return machine.result()
