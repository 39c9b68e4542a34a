"""Execute a loop nest with NumPy, one array per buffer, to validate a schedule.

Parallel loops do not iterate at all: each adds an axis to a *grid* of units, and every
node below runs once for all units at once (a loop variable is an index array along its
axis). A buffer allocated under k grid loops holds one tile per unit of those loops.
Sequential loops whose iterations are independent (they walk a dimension the kernel does
not reduce over) become grid axes too, while the arrays stay small (`MAX_ELEMENTS`).

A sequential loop over a reduced dimension carries its accumulators from one iteration
to the next. It still runs as one *batched* step, its iterations one more grid axis, when
`fold_plan` shows that to be equivalent: each buffer from outside the loop that its body
writes is either written at a different place by every iteration, or only accumulated
into (by reducing computes, directly or through tiles loaded from it and stored back).
Those tiles are *promoted*: one tile for all iterations, moved with the loop collapsed
to one iteration, and a compute into such a tile computes every iteration's contribution
at once and folds them in iteration order, cast to the tile's dtype after each, as the
step-by-step run does (or in one reduction where the order cannot change the result).
`interpret(..., batch=False)` runs every such loop step by step instead.

Memory starts poisoned (NaN, or a sentinel for integers) and every element carries an
"initialised" flag: reading an element no write or transfer produced, storing one, two
units writing the same element, or a transfer that leaves its parent's tile all raise
IRError. So a dropped transfer or an off-by-one tile cannot pass unnoticed.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from synth.errors import IRError
from synth.ir.compute_eval import (
    UFUNCS,
    ComputeFrame,
    accumulate,
    accumulator_message,
    cast,
    contract,
    minus,
    points,
    product_sum,
)
from synth.ir.fold_plan import FoldPlan, all_loops, fold_plans, reorderable
from synth.ir.nodes import (
    Affine,
    Alloc,
    BufferDecl,
    Combine,
    Compute,
    Fill,
    Kernel,
    Load,
    Loop,
    LoopKind,
    LoopVar,
    Node,
    OnlineCombine,
    Program,
    Store,
    walk,
)
from synth.workload import DType, Role, Workload

Array = np.ndarray[Any, Any]


@dataclass
class BufferState:
    decl: BufferDecl
    values: Array
    init: Array  # which elements hold data
    instance_loops: tuple[str, ...]  # grid loops around the allocation (leading axes)
    complete: bool | None = False  # every element holds data (None: not known, ask `init`)
    # batched reduction loops (or parallel loops whose units share it) along which it
    # holds one tile (an axis of extent 1)
    shared: frozenset[str] = frozenset()

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
                 inputs: Mapping[str, Array], batch: bool = True) -> None:
        self.program = program
        self.workload = workload
        self.batch = batch  # run reduction loops as batched steps where `fold_plan` allows
        self.buffers: dict[str, BufferState] = {}
        self.env: dict[str, int | Array] = {}
        self.grid: list[LoopVar] = []
        self.loops: dict[str, LoopVar] = {}  # the running kernel's loops, by name
        self.carried: set[str] = set()  # dims whose loops carry a dependence (reductions)
        self.written: set[str] = set()  # buffers the running kernel writes
        # id(alloc) -> Load or Fill, when the next node writes every element it allocates
        self.written_next: dict[int, type] = {}
        self.plans: dict[int, FoldPlan] = {}  # id(loop) -> how that reduction loop batches
        self.folding: list[str] = []  # batched reduction loops on the grid, outermost first
        self.promoted: dict[str, frozenset[str]] = {}  # buffer -> batched loops sharing it
        self.fitting: dict[tuple[Any, ...], bool] = {}  # `fits`, per loop and grid
        self.constants: dict[tuple[Any, ...], Array] = {}  # `constant`
        for decl in program.globals:
            state = self._fresh(decl, ())
            if decl.name in inputs:
                state.values[...] = inputs[decl.name]
                state.init[...] = True
                state.complete = True
            self.buffers[decl.name] = state

    # -- running -----------------------------------------------------------------

    def start(self, kernel: Kernel) -> None:
        """What the handlers look up about the kernel about to run."""
        self.loops = {loop.var.name: loop.var for loop in all_loops(kernel.body)}
        self.carried = {d for name in kernel.statements
                        for d in self.workload.statement(name).reduced}
        self.written = _written(kernel.body)
        self.written_next = _written_next(kernel.body)
        decls = {d.name: d for d in self.program.globals} | {
            n.buffer.name: n.buffer for n in walk(kernel.body) if isinstance(n, Alloc)}
        self.plans = fold_plans(kernel, decls, self.workload, self.carried) \
            if self.batch else {}
        self.fitting = {}
        # parallel loops around partial results or their combines: always on the grid
        self.partial = {loop for decl in decls.values() for loop in decl.partial_loops} | {
            loop.var.name for loop in all_loops(kernel.body)
            if any(isinstance(n, Combine | OnlineCombine) for n in walk(loop.body))}

    def run(self, nodes: tuple[Node, ...]) -> None:
        for node in nodes:
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
        if not poisoned:
            # a load or fill writes every element next (a load may alias its parent's
            # tile instead): no memory until it runs (`_materialise`, `run_fill`)
            return BufferState(decl, self.constant(decl.dtype.numpy.type(0), shape),
                               self.constant(False, shape), instance)
        values = np.full(shape, poison(decl.dtype), dtype=decl.dtype.numpy)
        return BufferState(decl, values, np.zeros(shape, dtype=bool), instance)

    def constant(self, value: Any, shape: tuple[int, ...]) -> Array:
        """A read-only array of one value (shared: a loop allocates the same ones often)."""
        key = (value, np.asarray(value).dtype, shape)
        if key not in self.constants:
            self.constants[key] = np.broadcast_to(np.asarray(value), shape)
        return self.constants[key]

    def allocate(self, decl: BufferDecl, poisoned: bool) -> None:
        """A fresh buffer with one tile per unit of the grid; a promoted one (`fold_plan`)
        has one tile for all iterations of the batched loops that share it, and a tile
        the units of parallel loops share (`BufferDecl.shared`: UPMEM tasklets' K and V
        blocks) one for all of them, loaded once (`_once_per_share`)."""
        shared = self.promoted.get(decl.name, frozenset()) | frozenset(decl.shared)
        with self.collapsed(shared):
            state = self._fresh(decl, tuple(v.name for v in self.grid), poisoned)
        state.shared = shared
        self.buffers[decl.name] = state

    def loop_extent(self, name: str) -> int:
        if name not in self.loops:
            raise IRError(f"expected a loop named {name}, got none")
        return self.loops[name].extent

    # -- batched reduction loops -------------------------------------------------

    def how(self, node: Loop) -> str:
        """How a sequential loop runs: as a grid axis ("grid"), as one batched step of a
        reduction ("batch"), or iteration by iteration ("iterate")."""
        if node.var.dim not in self.carried:  # independent iterations
            return "grid" if self.fits(node, None) else "iterate"
        plan = self.plans.get(id(node))
        if plan is None:
            return "iterate"
        if self.folding:
            # inside a batched loop every reduction loop batches too, so that each fold
            # sees its contributions in the order the step-by-step run adds them
            return "batch"
        return "batch" if self.fits(node, plan) else "iterate"

    def fits(self, node: Loop, plan: FoldPlan | None) -> bool:
        """Whether running `node` as a grid axis keeps every array within MAX_ELEMENTS
        (decided once per grid: an iterating loop asks again with the same answer)."""
        key = (id(node), self.grid_shape, tuple(self.folding))
        if key not in self.fitting:
            self.fitting[key] = footprint(self, node, plan) <= MAX_ELEMENTS
        return self.fitting[key]

    @contextlib.contextmanager
    def batching(self, node: Loop) -> Iterator[None]:
        """Run `node`'s body with the loop on the grid as a batched reduction loop."""
        plan, before = self.plans[id(node)], dict(self.promoted)
        for name in plan.promoted:
            self.promoted[name] = self.promoted.get(name, frozenset()) | {node.var.name}
        self.folding.append(node.var.name)
        try:
            yield
        finally:
            self.folding.pop()
            self.promoted = before

    @contextlib.contextmanager
    def collapsed(self, loops: frozenset[str]) -> Iterator[None]:
        """The batched loops `loops` shrunk to their first iteration, for the nodes that
        move or write tiles all their iterations share (which do not depend on them)."""
        axes = [axis for axis, var in enumerate(self.grid) if var.name in loops]
        if not axes:
            yield
            return
        grid = list(self.grid)
        for axis in axes:
            self.grid[axis] = dataclasses.replace(self.grid[axis], extent=1)
            self.env[self.grid[axis].name] = np.zeros((1,) * (axis + 1), dtype=np.int64)
        try:
            yield
        finally:
            for axis in axes:
                self.env[grid[axis].name] = np.arange(grid[axis].extent).reshape(
                    (1,) * axis + (grid[axis].extent,))
            self.grid[:] = grid

    def folded_axes(self, state: BufferState) -> tuple[int, ...]:
        """Grid axes of batched reduction loops along which `state` has one tile: a
        compute into it accumulates every iteration's contribution."""
        if not self.folding:
            return ()
        return tuple(axis for axis, var in enumerate(self.grid) if var.name in self.folding
                     and (var.name in state.shared or var.name not in state.instance_loops))

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
        local = _fold(m, minus(cdecl.origin[axis], pdecl.origin[axis]), grid_axis)
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
        elif isinstance(node, OnlineCombine):
            out |= {node.running, *(s.target for s in node.sums)}
    return out


def _written_next(nodes: tuple[Node, ...]) -> dict[int, type]:
    """The allocs right before a load into, or a fill of, the buffer they allocate."""
    out: dict[int, type] = {}
    for node, after in zip(nodes, nodes[1:] + (None,), strict=True):
        if isinstance(node, Alloc) and (
                isinstance(after, Load) and after.dst == node.buffer.name
                or isinstance(after, Fill) and after.buffer == node.buffer.name):
            out[id(node)] = type(after)
        if isinstance(node, Loop):
            out |= _written_next(node.body)
    return out


# ---------------------------------------------------------------- batched reduction loops


def footprint(m: Machine, loop: Loop, plan: FoldPlan | None) -> int:
    """About the most elements one array holds while `loop` runs as a grid axis (batched
    with `plan`): each tile allocated or computed on below it, once per unit of the grid
    and of the parallel and batched loops inside. Read-only tiles a load aliases count
    nothing, promoted tiles once for the iterations that share them, and a product-sum
    only its (contracted) result. Other sequential loops inside count once: each decides
    for itself when it runs."""
    estimate = _Footprint(m)
    if plan is not None:
        estimate.batch(loop, plan)
    return estimate.nodes(loop.body, math.prod(m.grid_shape) * loop.var.extent)


class _Footprint:
    """The walk behind `footprint`: which batched loops are on the grid, which tiles they
    share, and which batched loops each buffer has an axis for."""

    def __init__(self, m: Machine) -> None:
        self.m = m
        self.extents = {name: var.extent for name, var in m.loops.items()}
        self.folds = {name: self.extents[name] for name in m.folding}
        self.promoted = {name: set(loops) for name, loops in m.promoted.items()}
        self.has = {name: {f for f in m.folding if f in state.instance_loops
                           and f not in state.shared} for name, state in m.buffers.items()}

    def batch(self, loop: Loop, plan: FoldPlan) -> None:
        self.folds[loop.var.name] = loop.var.extent
        for name in plan.promoted:
            self.promoted.setdefault(name, set()).add(loop.var.name)

    def nodes(self, nodes: tuple[Node, ...], units: int) -> int:
        most = 0
        for node in nodes:
            if isinstance(node, Loop):
                most = max(most, self.loop(node, units))
            elif isinstance(node, Alloc):
                most = max(most, self.alloc(node, units))
            elif isinstance(node, Compute):
                most = max(most, self.compute(node, units))
        return most

    def loop(self, node: Loop, units: int) -> int:
        var, plan = node.var, self.m.plans.get(id(node))
        if var.kind is LoopKind.PARALLEL:
            return self.nodes(node.body, units * var.extent)
        if self.folds and var.dim in self.m.carried and plan is not None:
            folds, promoted = dict(self.folds), {k: set(v) for k, v in self.promoted.items()}
            self.batch(node, plan)  # batches with the loops around it
            most = self.nodes(node.body, units * var.extent)
            self.folds, self.promoted = folds, promoted
            return most
        return self.nodes(node.body, units)

    def alloc(self, node: Alloc, units: int) -> int:
        decl = node.buffer
        shared = self.promoted.get(decl.name, set()) & set(self.folds)
        self.has[decl.name] = set(self.folds) - shared
        if self.m.written_next.get(id(node)) is Load and decl.name not in self.m.written \
                and not self.ragged(decl.origin, decl.shape,
                                    self.m.workload.tensors[decl.tensor].shape):
            return 0  # aliased
        partials = math.prod(self.m.loop_extent(p) for p in decl.partial_loops)
        per_tile = partials * math.prod(decl.shape)
        return units // math.prod(self.folds[f] for f in shared) * per_tile

    def compute(self, node: Compute, units: int) -> int:
        stmt = self.m.workload.statement(node.statement)
        extents = tuple(stmt.extents[d] for d in node.dims)
        if not product_sum(stmt) or self.ragged(node.origin, node.tile, extents):
            return units * math.prod(node.tile)  # every point's value, then reduced
        lacks = set(self.folds) - self.has.get(node.out, set())
        contracted = math.prod(self.folds[f] for f in lacks) if reorderable(stmt) else 1
        kept = math.prod(n for n, d in zip(node.tile, node.dims, strict=True)
                         if d not in stmt.reduced)
        return units // contracted * kept

    def ragged(self, origin: tuple[Affine, ...], shape: tuple[int, ...],
               extents: tuple[int, ...]) -> bool:
        """Whether some tile may reach past the tensor's edge (masked: no views)."""
        return any(o.max_value(self.extents) + n > e
                   for o, n, e in zip(origin, shape, extents, strict=True))


# ---------------------------------------------------------------- one handler per node kind


MAX_ELEMENTS = 1 << 24  # the largest array a grid axis may create; beyond, loops iterate


@handles(Loop)
def run_loop(m: Machine, node: Loop) -> None:
    """Parallel loops become grid axes (those partial results have an axis for always;
    the others while the arrays stay small: a 130-core grid of 8-Mi-element tiles is 9 GB);
    sequential loops too when their iterations are independent or `fold_plan` batches
    them, and the arrays stay small; the rest iterate."""
    var = node.var
    how = m.how(node) if var.kind is not LoopKind.PARALLEL else (
        "grid" if var.name in m.partial or m.fits(node, None) else "iterate")
    if how == "iterate":
        for i in range(var.extent):
            m.env[var.name] = i
            m.run(node.body)
    else:
        m.env[var.name] = np.arange(var.extent).reshape((1,) * len(m.grid) + (var.extent,))
        m.grid.append(var)
        if how == "batch":
            with m.batching(node):
                m.run(node.body)
        else:
            m.run(node.body)
        m.grid.pop()
    del m.env[var.name]


@handles(Alloc)
def run_alloc(m: Machine, node: Alloc) -> None:
    node.verify()
    # a load or fill right after writes every element (data, or poison where ragged)
    m.allocate(node.buffer, poisoned=id(node) not in m.written_next)


@handles(Load)
def run_load(m: Machine, node: Load) -> None:
    _once_per_share(m, node.dst, lambda: load(m, node))


def _once_per_share(m: Machine, buffer: str, move: Callable[[], None]) -> None:
    """Run `move` of `buffer`'s tile: a promoted tile moves once for all iterations of
    the loops that share it."""
    shared = m.buffers[buffer].shared
    if not shared:
        move()
        return
    with m.collapsed(shared):
        move()


def load(m: Machine, node: Load) -> None:
    child, parent = m.buffers[node.dst], m.buffers[node.src]
    views = strided(m, child, parent, store=False)
    if views is not None and node.dst not in m.written and parent.is_complete():
        # a read-only tile of a read-only parent: alias it instead of copying (exact,
        # since nothing in the kernel writes either; replication costs a zero stride)
        child.values = views[0]
        child.values.flags.writeable = False
        child.init = m.constant(True, child.values.shape)
        child.complete = True
        return
    _materialise(child)
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


def _materialise(state: BufferState) -> None:
    """Arrays of its own for a buffer allocated for a load that aliases nothing (or for a
    reload of an aliased tile): the load writes every element."""
    if not state.values.flags.writeable:
        state.values = np.empty(state.values.shape, dtype=state.values.dtype)
        state.init = np.empty(state.values.shape, dtype=bool)


@handles(Store)
def run_store(m: Machine, node: Store) -> None:
    _once_per_share(m, node.src, lambda: store(m, node))


def store(m: Machine, node: Store) -> None:
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
    if state.values.flags.writeable:
        state.values[...] = node.value
        state.init[...] = True
    else:  # allocated for this fill (`_fresh`)
        state.values = np.full(state.values.shape, node.value, dtype=state.values.dtype)
        state.init = np.ones(state.values.shape, dtype=bool)
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
    reduced = UFUNCS[node.op].reduce(partials.values, axis=axes, dtype=target.values.dtype)
    combined = UFUNCS[node.op](target.values, reduced).astype(target.values.dtype)
    target.values[...] = np.where(valid, combined, target.values)


@handles(Compute)
def run_compute(m: Machine, node: Compute) -> None:
    stmt = m.workload.statement(node.statement)
    frame = ComputeFrame(m, node, stmt.extents)
    operands = {t: frame.place(node.operands[t], stmt.inputs_indices(t)) for t in stmt.inputs}
    folded = m.folded_axes(m.buffers[node.out])
    target = None if folded else frame.place(node.out, stmt.indices)
    for tensor, place in operands.items():
        place.require_initialised(f"compute {node.statement}: expected initialised "
                                  f"{node.operands[tensor]}, got elements no load or "
                                  f"compute wrote")
    if target is None:
        accumulate(m, frame, stmt, folded)
        return
    if stmt.op.reduces:
        target.require_initialised(accumulator_message(node))
    with np.errstate(all="ignore"):
        value = contract(frame, stmt)
        if value is None:
            value = points(frame, stmt)
        if stmt.op.reduces:
            value = UFUNCS[stmt.op](target.read(), value)
    target.write(cast(np.asarray(value), stmt.dtype))


def interpret(program: Program, workload: Workload, inputs: Mapping[str, Array],
              batch: bool = True) -> dict[str, Array]:
    """Run every kernel in order; the final value of every tensor. `batch=False` runs
    every sequential reduction loop step by step (the plain reference execution)."""
    machine = Machine(program, workload, inputs, batch)
    with one_blas_thread():
        for kernel in program.kernels:
            machine.start(kernel)
            machine.run(kernel.body)
    return machine.result()


@contextlib.contextmanager
def one_blas_thread() -> Iterator[None]:
    """Matrix products on one BLAS thread meanwhile. The interpreter runs many mid-sized
    products; waking BLAS threads for each costs more than they give where cores are
    busy (8x on two loaded cores: 0.25 s instead of 0.03 s for 16 products of
    2048x128x128). A no-op where the BLAS is not an OpenBLAS this can find."""
    control = _openblas_threads()
    if control is None:
        yield
        return
    get, put = control
    before = get()
    put(1)
    try:
        yield
    finally:
        put(before)


@functools.cache
def _openblas_threads() -> tuple[Callable[[], int], Callable[[int], None]] | None:
    """OpenBLAS's get/set thread count functions, from the library this process loaded."""
    try:
        with open("/proc/self/maps") as maps:
            paths = sorted({line.split()[-1] for line in maps if "openblas" in line.lower()})
    except OSError:
        return None
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for prefix, suffix in (("scipy_openblas", "64_"), ("scipy_openblas", ""),
                               ("openblas", "64_"), ("openblas", "")):
            get = getattr(lib, f"{prefix}_get_num_threads{suffix}", None)
            put = getattr(lib, f"{prefix}_set_num_threads{suffix}", None)
            if get is not None and put is not None:
                return get, put
    return None


from synth.ir import online_merge, online_run  # noqa: E402,F401  (register the online nodes)
