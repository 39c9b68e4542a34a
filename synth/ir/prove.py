"""Symbolic verification of a materialised loop nest with z3: bounds and capacities.

`synth.ir.verify` checks a program by interval arithmetic over its affine offsets; this
module states the same facts as z3 obligations, one per (node, buffer access, axis), over
*all* values of the enclosing loop variables and *all* element positions of the tile,
exactly as the interpreter (`synth.ir.interpret`) indexes them:

- bounds: for a transfer, element `e` (0 <= e < tile) of the child along an axis has the
  global coordinate `c = child.origin + e` and the local index `c - parent.origin` into
  the parent's tile; for a compute, `c = compute.origin[dim] + e` indexes each operand's
  and the target's buffer the same way. Elements with `c >= extent` of the tensor (or of
  the statement's dimension) are masked at run time (ragged tiles) and exempt, per axis,
  as in the interpreter; every other element's local index must lie in
  `0 .. buffer extent - 1`. A parent's partial axes are indexed by enclosing loops or by
  the child's own partial axes: those indices must be in range too.
- capacity: per kernel and memory instance, the bytes of every tile allocated in the
  memory (times the copies an instance holds: parallel loops below the memory's instance
  level, and partial axes; rows padded to the memory's transfer multiple, as the verifier
  counts them) must fit the memory's usable bytes.

Each obligation is proved by asking z3 for a counterexample (its negation): unsat is a
proof, sat is a failure whose model gives the loop values that exhibit the fault.

Size ranges (`--set N=LO..HI[:STEP]`). The program was materialised at one value of each
ranged size (the pipeline solves at the largest admissible one). The same code runs at any
other value with every tile fixed: only the loops of the root memory (the host loops)
adapt, running ceil(N / step) times, and the whole tensors in the root memory take the
new extents. So the prover makes each ranged size a z3 integer restricted to its
admissible values (`lo <= N <= hi`, `(N - lo) % step == 0`), and every extent that is that
size symbolic: tensor extents (the masks: elements at or past N are exempt, as the
interpreter skips them), the root memory's whole-tensor buffers, the statements'
dimensions, and the root loops' extents. Spatial loops, the other sequential loops and
every tile keep their values. Two more kinds of obligation make that parametrisation
sound: `parametric`, per root loop over a ranged dimension, that its extent is
ceil(extent / step) at the materialised size (extra, padded host iterations, or units
over the dimension outside the loop that each walk a share of it, would make its count
depend on more than N), and `coverage`, per compute and ranged dimension, that
its tiles reach element N - 1 for every admissible N (a dimension without a host loop
covers a fixed number of elements). Which extents are a ranged size is found by parsing
the workload again at another admissible value (`size_dependence`), not from names. The
solver is held to the root loops' `parametric` obligation already
(`synth.constraints.cost.parametric_constraints`, given the same dependence by the
pipeline), so a root loop refuted as `parametric` means a schedule that did not come
from a model built with the ranges (or one with `--drop parametric`).
A counterexample of a ranged proof names the sizes' values beside the loop values.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import z3

from synth.errors import InputError, IRError
from synth.hardware import Hardware
from synth.ir import online
from synth.ir.nodes import (
    Affine,
    Alloc,
    BufferDecl,
    Combine,
    Compute,
    Kernel,
    Load,
    Loop,
    LoopKind,
    LoopVar,
    Node,
    OnlineCombine,
    Program,
    Rescale,
    Running,
    Store,
)
from synth.ir.online import check_step, describe
from synth.ir.verify import buffer_bytes, element_bytes, instance_copies, kernel_vector
from synth.lang import SizeRange, load_workload
from synth.workload import Workload, accesses

TIMEOUT_MS = 10_000  # per obligation; these are small linear problems over boxes
SIZE_PREFIX = "size:"  # z3 names of ranged sizes (loop variable names never hold a colon)

Term = Any  # an int, or a z3 integer expression over the ranged sizes


@dataclass(frozen=True)
class Failure:
    kind: str  # "bounds" | "capacity" | "coverage" | "parametric"
    where: str  # the node's text, e.g. "load x_wram <- x_mram", or "kernel e: wram"
    message: str
    counterexample: Mapping[str, int]  # ranged sizes, then loop variables -> value
    kernel: str = ""  # the kernel holding the node (node texts repeat across kernels)

    def to_json(self) -> dict[str, object]:
        return {"kind": self.kind, "kernel": self.kernel, "where": self.where,
                "message": self.message, "counterexample": dict(self.counterexample)}


@dataclass(frozen=True)
class Proof:
    proved: bool
    checks: int  # obligations stated (each proved or refuted)
    failures: list[Failure] = field(default_factory=list)
    sizes: Mapping[str, SizeRange] = field(default_factory=dict)  # ranged sizes, if any
    solved: Mapping[str, int] = field(default_factory=dict)  # the value each was solved at
    kinds: tuple[str, ...] = ("bounds", "capacity")  # the kinds of obligation stated

    def to_json(self) -> dict[str, object]:
        data: dict[str, object] = {"proved": self.proved, "checks": self.checks,
                                   "failures": [f.to_json() for f in self.failures]}
        if self.sizes:
            data["sizes"] = {name: {"min": r.lo, "max": r.last, "step": r.step,
                                    "values": r.count, "solved_at": self.solved.get(name)}
                             for name, r in self.sizes.items()}
            data["kinds"] = list(self.kinds)
        return data

    def ranges_text(self) -> str:
        """`N in 1024..65536 step 1024 (64 values)`, joined by ` and `."""
        return " and ".join(f"{name} in {r} ({r.count} value{'s' if r.count > 1 else ''})"
                            for name, r in self.sizes.items())

    def __str__(self) -> str:
        kinds = ", ".join(self.kinds)
        scope = f" for {self.ranges_text()}" if self.sizes else ""
        if self.proved:
            if not self.sizes:
                return f"proved: {self.checks} obligations (bounds, capacity) hold"
            return f"proved{scope}: {self.checks} obligations ({kinds}) hold"
        lines = [f"refuted{scope}: {len(self.failures)} of {self.checks} obligations fail"]
        for f in self.failures:
            place = f"kernel {f.kernel}: {f.where}" if f.kind in ("bounds", "coverage") \
                else f.where
            values = ", ".join(f"{k}={v}" for k, v in f.counterexample.items())
            at = f" [at {values}]" if values and f"[at {values}]" not in f.message else ""
            lines.append(f"  {f.kind}: {place}: {f.message}{at}")
        return "\n".join(lines)


@dataclass(frozen=True)
class Dependence:
    """Which extents of a workload are a ranged size (every other extent is fixed)."""

    tensors: Mapping[tuple[str, int], str] = field(default_factory=dict)  # (tensor, axis)
    statements: Mapping[tuple[str, str], str] = field(default_factory=dict)  # (stmt, dim)


def prove(program: Program, workload: Workload, hw: Hardware,
          ranges: Mapping[str, SizeRange] | None = None,
          dependence: Dependence | None = None) -> Proof:
    """Prove every bounds and capacity obligation of `program`, or refute some.

    With `ranges`, for every admissible value of those sizes at once (see the module
    docstring); `workload` is the one the program was materialised for, and `dependence`
    (default: `size_dependence(workload, ranges)`) says which of its extents vary."""
    ranges = dict(ranges or {})
    if ranges and dependence is None:
        dependence = size_dependence(workload, ranges)
    prover = _Prover(program, workload, hw, ranges, dependence or Dependence())
    for kernel in program.kernels:
        prover.kernel(kernel)
    kinds = (("bounds", "capacity") if not ranges else
             tuple(k for k in ("bounds", "capacity", "coverage", "parametric")
                   if k in prover.kinds))
    return Proof(not prover.failures, prover.checks, prover.failures, ranges,
                 {name: workload.sizes[name] for name in ranges}, kinds)


# ---------------------------------------------------------------- which extents vary


def probe_value(solved: int, admissible: SizeRange) -> int | None:
    """An admissible value other than `solved` to parse the workload at, if any."""
    return next((v for v in (admissible.lo, admissible.last) if v != solved), None)


def size_dependence(workload: Workload, ranges: Mapping[str, SizeRange],
                    probes: Mapping[str, Workload] | None = None) -> Dependence:
    """The extents of `workload` that are a ranged size: those that change when the
    workload is parsed again with that one size at another admissible value (`probes`,
    by default loaded from `workload.source`). Sizes are declared as names or literals, so
    an extent either is the size or does not depend on it."""
    tensors: dict[tuple[str, int], str] = {}
    statements: dict[tuple[str, str], str] = {}
    for name, admissible in ranges.items():
        if name not in workload.sizes:
            raise InputError(f"--set {name}={admissible.lo}..{admissible.hi}: no size named "
                             f"'{name}' in workload '{workload.name}'")
        solved = workload.sizes[name]
        other = (probes or {}).get(name)
        if other is None:
            value = probe_value(solved, admissible)
            if value is None:
                continue  # the only admissible value is the solved one: nothing varies
            other = _reparse(workload, name, value)
        pair = (solved, other.sizes[name])
        for tensor in workload.tensors.values():
            shape = other.tensors[tensor.name].shape
            for axis, (a, b) in enumerate(zip(tensor.shape, shape, strict=True)):
                _record(tensors, (tensor.name, axis), (a, b), name, pair,
                        f"dimension {axis + 1} of {tensor.name}")
        for stmt in workload.statements:
            extents = other.statement(stmt.name).extents
            for dim, a in stmt.extents.items():
                _record(statements, (stmt.name, dim), (a, extents[dim]), name, pair,
                        f"the extent of {dim} in statement {stmt.name}")
    return Dependence(tensors, statements)


def _record(found: dict[Any, str], key: Any, values: tuple[int, int], name: str,
            sizes: tuple[int, int], what: str) -> None:
    """`key`'s extent is `values` where the size `name` is `sizes`: the size, or fixed."""
    if values[0] == values[1]:
        return
    if values != sizes or key in found:
        raise InputError(f"--set {name}: {what} is {values[0]} at {name}={sizes[0]} and "
                         f"{values[1]} at {name}={sizes[1]}: not the size {name} itself, so "
                         f"the schedule cannot be parametrised by it")
    found[key] = name


def _reparse(workload: Workload, name: str, value: int) -> Workload:
    if not workload.source:
        raise ValueError(f"workload {workload.name} has no source to parse again at "
                         f"{name}={value}; pass the probes to size_dependence")
    try:
        return load_workload(workload.source, {**workload.sizes, name: value})
    except InputError as exc:
        raise InputError(f"--set {name}: workload '{workload.name}' is not valid at "
                         f"{name}={value}: {exc}") from None


def kernel_dims(workload: Workload, dependence: Dependence, kernel: Kernel
                ) -> dict[str, str]:
    """Each dimension of `kernel` that is a ranged size -> the size's name."""
    dims: dict[str, str] = {}
    for name in kernel.statements:
        for dim in workload.statement(name).dims:
            size = dependence.statements.get((name, dim))
            if size is not None:
                dims[dim] = size
    return dims


def is_root_loop(program: Program, var: LoopVar) -> bool:
    """A loop of the root memory's slot: the host loop that walks tiles of the memory
    below; the only loop whose count adapts to a ranged size."""
    return var.kind is LoopKind.SEQUENTIAL and var.where == program.root_memory


def instantiate(program: Program, workload: Workload, dependence: Dependence,
                values: Mapping[str, int]) -> Program:
    """The program that the parametric loop nest is at other values of ranged sizes:
    root loops over a ranged dimension run ceil(value / step) times and the root memory's
    whole-tensor buffers take the new extents; every tile stays. Raises IRError when a
    root loop's count is not ceil(extent / step) (the proof refutes it as `parametric`)."""
    solved = {name: workload.sizes[name] for name in values}

    def shape(decl: BufferDecl) -> BufferDecl:
        if decl.memory != program.root_memory:
            return decl
        new = list(decl.shape)
        for axis, n in enumerate(decl.shape):
            size = dependence.tensors.get((decl.tensor, axis))
            if size is not None and size in values and n == solved[size]:
                new[axis] = values[size]
        return dataclasses.replace(decl, shape=tuple(new))

    def nodes(body: tuple[Node, ...], dims: Mapping[str, str]) -> tuple[Node, ...]:
        out: list[Node] = []
        for node in body:
            if isinstance(node, Loop):
                var = node.var
                size = dims.get(var.dim)
                if size is not None and size in values and is_root_loop(program, var):
                    if var.extent != -(-solved[size] // var.step):
                        raise IRError(f"loop {var.name}: expected {var.extent} == "
                                      f"ceil({solved[size]} / {var.step}) iterations, so "
                                      f"that its count is a function of {size}")
                    var = dataclasses.replace(var, extent=-(-values[size] // var.step))
                out.append(Loop(var, nodes(node.body, dims)))
            elif isinstance(node, Alloc):
                out.append(Alloc(shape(node.buffer)))
            else:
                out.append(node)
        return tuple(out)

    dims = {k.name: kernel_dims(workload, dependence, k) for k in program.kernels}
    kernels = tuple(dataclasses.replace(k, body=nodes(k.body, dims[k.name]))
                    for k in program.kernels)
    extents: dict[str, dict[str, int]] = {}
    for kernel, old in program.extents.items():
        sizes = dims.get(kernel, {})
        extents[kernel] = {d: values.get(sizes.get(d, ""), n) for d, n in old.items()}
    return dataclasses.replace(program, globals=tuple(shape(b) for b in program.globals),
                               kernels=kernels, extents=extents)


# ---------------------------------------------------------------- the obligations


@dataclass
class _Scope:
    buffers: dict[str, BufferDecl]
    loops: list[LoopVar]


class _Prover:
    def __init__(self, program: Program, workload: Workload, hw: Hardware,
                 ranges: Mapping[str, SizeRange], dependence: Dependence) -> None:
        self.program = program
        self.workload = workload
        self.hw = hw
        self.dependence = dependence
        self.globals = {b.name: b for b in program.globals}
        self.solver = z3.Solver()
        self.solver.set("timeout", TIMEOUT_MS)
        self.checks = 0
        self.failures: list[Failure] = []
        self.kinds: set[str] = set()
        self.name = ""  # the running kernel
        self.dims: dict[str, str] = {}  # the running kernel's ranged dims -> size
        self.extents: dict[str, Term] = {}  # the running kernel's loops -> extent
        self.loop_extent: dict[LoopVar, Term] = {}
        self.usage: dict[str, list[tuple[str, Term, int]]] = {}  # memory -> (buf, copies, bytes)
        # the ranged sizes: z3 integers over their admissible values, for every obligation
        self.size = {name: z3.Int(SIZE_PREFIX + name) for name in ranges}
        self.solved = {name: workload.sizes[name] for name in ranges}
        for name, admissible in ranges.items():
            n = self.size[name]
            self.solver.add(n >= admissible.lo, n <= admissible.hi)
            if admissible.step > 1:
                self.solver.add((n - admissible.lo) % admissible.step == 0)

    # -- walking ---------------------------------------------------------------

    def kernel(self, kernel: Kernel) -> None:
        self.name = kernel.name
        self.vector = kernel_vector(kernel, self.workload)
        self.plain = online.step_in_cache(kernel, self.hw)  # an online step's C arrays
        self.statistics = online.statistics(kernel)  # merged only by an online combine
        self.current = kernel
        self.dims = self._kernel_dims(kernel)
        self.loop_extent = {v: self._loop_extent(v) for v in _loops(kernel.body)}
        self.extents = {v.name: extent for v, extent in self.loop_extent.items()}
        self.usage = {}
        self._block(kernel.body, _Scope(dict(self.globals), []))
        for memory, tiles in self.usage.items():
            self._capacity(kernel, memory, tiles)

    def _kernel_dims(self, kernel: Kernel) -> dict[str, str]:
        """The kernel's dimensions that are a ranged size; a dimension that is one in a
        statement and fixed in another, or whose extent in the program is not the size's
        solved value, cannot be parametrised (a `parametric` failure)."""
        if not self.size:
            return {}
        dims = kernel_dims(self.workload, self.dependence, kernel)
        for dim, size in dims.items():
            fixed = [s for s in kernel.statements
                     if dim in self.workload.statement(s).dims
                     and (s, dim) not in self.dependence.statements]
            extent = self.program.extents.get(kernel.name, {}).get(dim)
            if fixed:
                self._parametric(f"kernel {kernel.name}: dim {dim}",
                                 f"{dim} is {size} in one statement but fixed in "
                                 f"{', '.join(fixed)}", size)
            elif extent is not None and extent != self.solved[size]:
                self._parametric(f"kernel {kernel.name}: dim {dim}",
                                 f"{dim} has extent {extent} in the program but "
                                 f"{size}={self.solved[size]} in the workload", size)
        return dims

    def _loop_extent(self, var: LoopVar) -> Term:
        """A root loop over a ranged dimension runs ceil(N / step) times; others are fixed."""
        size = self.dims.get(var.dim)
        if size is None or not is_root_loop(self.program, var):
            return var.extent
        self.checks += 1
        self.kinds.add("parametric")
        solved = self.solved[size]
        need = -(-solved // var.step)
        if var.extent != need:
            why = ("the extra iterations come from padding" if var.extent > need else
                   f"parallel loops over {var.dim} outside it split the rest")
            self._parametric(
                f"kernel {self.name}: loop {var.name}",
                f"{var.name} ({var.where}) runs {var.extent} times at {size}={solved}, but "
                f"its steps of {var.step} need ceil({solved} / {var.step}) = {need}: {why}, "
                f"so its count is not a function of {size}", size, counted=True)
            return var.extent
        return (self.size[size] + (var.step - 1)) / var.step

    def _parametric(self, where: str, message: str, size: str, counted: bool = False
                    ) -> None:
        if not counted:
            self.checks += 1
        self.kinds.add("parametric")
        self.failures.append(Failure("parametric", where, message,
                                     {size: self.solved[size]}, self.name))

    def _block(self, nodes: tuple[Node, ...], scope: _Scope) -> None:
        for node in nodes:
            if isinstance(node, Loop):
                self._block(node.body, _Scope(dict(scope.buffers), scope.loops + [node.var]))
            elif isinstance(node, Alloc):
                scope.buffers[node.buffer.name] = node.buffer
                self._account(node.buffer, scope)
            elif isinstance(node, Load):
                self._transfer(node.dst, node.src, scope, f"load {node.dst} <- {node.src}")
            elif isinstance(node, Store):
                self._transfer(node.src, node.dst, scope, f"store {node.src} -> {node.dst}")
            elif isinstance(node, Compute):
                self._compute(node, scope)
            elif isinstance(node, Running | Rescale):  # the online rewrite's step
                try:
                    check_step(node, scope.buffers)
                except IRError as err:
                    self._structural(describe(node), str(err))
            elif isinstance(node, Combine) and node.partials in scope.buffers and \
                    scope.buffers[node.partials].tensor in self.statistics:
                self._structural(f"combine {node.partials}", "a plain combine of a running "
                                 "statistic's partials (expected an online combine)")
            elif isinstance(node, OnlineCombine):  # partial running statistics merged
                try:
                    online.check_merge(node, scope.buffers)
                except IRError as err:
                    self._structural(describe(node), str(err))

    def _buffer(self, name: str, scope: _Scope, where: str) -> BufferDecl | None:
        if name not in scope.buffers:
            self._structural(where, f"no buffer {name} allocated around the node")
            return None
        return scope.buffers[name]

    def _structural(self, where: str, message: str) -> None:
        """A fault no loop value is needed to exhibit (the node cannot be indexed at all)."""
        self.checks += 1
        self.failures.append(Failure("bounds", where, message, {}, self.name))

    # -- extents that may be a ranged size ---------------------------------------

    def _tensor_extent(self, tensor: str, axis: int) -> Term:
        size = self.dependence.tensors.get((tensor, axis))
        if size is None or size not in self.size:
            return self.workload.tensors[tensor].shape[axis]
        return self.size[size]

    def _dim_extent(self, statement: str, dim: str) -> Term:
        size = self.dependence.statements.get((statement, dim))
        if size is None or size not in self.size:
            return self.workload.statement(statement).extents[dim]
        return self.size[size]

    def _buffer_extent(self, buffer: BufferDecl, axis: int) -> Term:
        """A whole tensor in the root memory takes the ranged size; a tile stays fixed."""
        size = self.dependence.tensors.get((buffer.tensor, axis))
        if (size is None or size not in self.size or buffer.memory != self.program.root_memory
                or buffer.shape[axis] != self.solved[size]):
            return buffer.shape[axis]
        return self.size[size]

    # -- bounds ----------------------------------------------------------------

    def _transfer(self, child_name: str, parent_name: str, scope: _Scope, where: str) -> None:
        child = self._buffer(child_name, scope, where)
        parent = self._buffer(parent_name, scope, where)
        if child is None or parent is None:
            return
        domain = self._domain(scope.loops)
        for loop in parent.partial_loops:
            if loop in domain:
                # the enclosing loop's value indexes the parent's partial axis
                top = self.extents[loop] - 1
                self._check(where, domain, z3.Int(loop) > top,
                            _partial_message(loop, top, parent.name))
            elif loop in child.partial_loops and loop in self.extents:
                # the child's own partial axis of the same loop, index for index: in
                # range by construction (counted, nothing to ask)
                self.checks += 1
            else:
                self._structural(where, f"partial loop {loop} of {parent.name} neither "
                                        f"encloses the transfer nor is an axis of {child.name}")
        if len(child.shape) != len(parent.shape):
            self._structural(where, f"{child.name} has rank {len(child.shape)}, "
                                    f"{parent.name} rank {len(parent.shape)}")
            return
        for axis, size in enumerate(child.shape):
            self._access(where, domain, axis, child.origin[axis], size,
                         self._tensor_extent(child.tensor, axis), parent, axis,
                         f"{child.name}")

    def _compute(self, node: Compute, scope: _Scope) -> None:
        tiles = ", ".join(f"{d}: {t}" for d, t in zip(node.dims, node.tile, strict=True))
        where = (f"compute {node.statement}({', '.join(node.operands.values())}) -> "
                 f"{node.out}  [{tiles}]")
        stmt = self.workload.statement(node.statement)
        places = [(node.out, stmt.indices)]
        for access in dict.fromkeys((a.tensor, a.indices) for a in accesses(stmt.expr)):
            tensor, indices = access
            if tensor not in node.operands:
                self._structural(where, f"no buffer for operand {tensor}")
                continue
            places.append((node.operands[tensor], indices))
        domain = self._domain(scope.loops)
        for name, indices in dict.fromkeys(places):
            decl = self._buffer(name, scope, where)
            if decl is None:
                continue
            if len(indices) != len(decl.shape):
                self._structural(where, f"{name} has rank {len(decl.shape)}, indexed by "
                                        f"{len(indices)} subscripts")
                continue
            for axis, dim in enumerate(indices):
                if dim not in node.dims:
                    self._structural(where, f"{name} indexed by {dim}, not a dim of the "
                                            f"compute")
                    continue
                k = node.dims.index(dim)
                self._access(where, domain, axis, node.origin[k], node.tile[k],
                             self._dim_extent(stmt.name, dim), decl, axis, f"the {dim} tile")
        for k, dim in enumerate(node.dims):
            if (stmt.name, dim) in self.dependence.statements and dim in stmt.extents:
                self._coverage(where, domain, dim, node.origin[k], node.tile[k],
                               self._dim_extent(stmt.name, dim))

    def _coverage(self, where: str, domain: Mapping[str, Term], dim: str, origin: Affine,
                  tile: int, extent: Term) -> None:
        """Obligation: the compute's tiles along a ranged `dim` reach its last element
        (the tiles of one loop nest are contiguous whatever N is; only how far they reach
        depends on the host loop's count)."""
        reach = z3.IntVal(origin.const + tile)
        for var, coeff in origin.terms:
            if coeff > 0:
                reach = reach + coeff * (domain.get(var, 1) - 1)

        def message(model: z3.ModelRef) -> str:
            r, n = _show(model, reach), _show(model, extent)
            return (f"the {dim} tiles reach elements 0..{int(r) - 1} only: {r}..{int(n) - 1} "
                    f"of {n} are never computed")

        self._check(where, {}, reach < extent, message, kind="coverage")

    def _access(self, where: str, domain: Mapping[str, Term], axis: int, origin: Affine,
                size: int, extent: Term, buffer: BufferDecl, buffer_axis: int,
                what: str) -> None:
        """Obligation: every element `e` of a `size`-long tile at global `origin + e` that
        lies inside the tensor (< `extent`) indexes `buffer` inside its tile."""
        element = z3.Int(f"{what}@{axis}")
        coord = _z3(origin) + element
        local = coord - _z3(buffer.origin[buffer_axis])
        top = self._buffer_extent(buffer, buffer_axis) - 1
        bad = z3.And(element >= 0, element < size, coord < extent,
                     z3.Or(local < 0, local > top))

        def message(model: z3.ModelRef) -> str:
            e = model.eval(element, model_completion=True).as_long()
            c = model.eval(coord, model_completion=True).as_long()
            i = model.eval(local, model_completion=True).as_long()
            return (f"axis {buffer_axis}: element {e} of {what} (global {c} < "
                    f"{_show(model, extent)}) has index {i} outside 0..{_show(model, top)} "
                    f"of {buffer.name} (origin {buffer.origin[buffer_axis]})")

        self._check(where, domain, bad, message)

    def _check(self, where: str, domain: Mapping[str, Term], bad: z3.BoolRef,
               message: Callable[[z3.ModelRef], str], kind: str = "bounds") -> None:
        """Ask z3 for sizes and loop values (within `domain`) and element positions
        satisfying `bad`: none is a proof; one is a failure with those values."""
        self.checks += 1
        self.kinds.add(kind)
        solver = self.solver
        solver.push()
        try:
            for name, extent in domain.items():
                var = z3.Int(name)
                solver.add(var >= 0, var < extent)
            solver.add(bad)
            verdict = solver.check()
            if verdict == z3.unsat:
                return
            if verdict == z3.unknown:
                self.failures.append(Failure(kind, where,
                                             f"z3 could not decide ({solver.reason_unknown()})",
                                             {}, self.name))
                return
            model = solver.model()
            # the ranged sizes, the enclosing loops, and any free variable an origin names
            # (a scoping fault)
            values = self._sizes_of(model)
            names = list(domain) + sorted(d.name() for d in model.decls()
                                          if "@" not in d.name() and d.name() not in domain
                                          and not d.name().startswith(SIZE_PREFIX))
            values.update({name: model.eval(z3.Int(name), model_completion=True).as_long()
                           for name in names})
            self.failures.append(Failure(kind, where, message(model), values, self.name))
        finally:
            solver.pop()

    def _sizes_of(self, model: z3.ModelRef) -> dict[str, int]:
        return {name: model.eval(var, model_completion=True).as_long()
                for name, var in self.size.items()}

    def _domain(self, loops: list[LoopVar]) -> dict[str, Term]:
        """Each enclosing loop variable -> its extent (an inner loop of the same name wins)."""
        return {v.name: self.loop_extent.get(v, v.extent) for v in loops}

    # -- capacity --------------------------------------------------------------

    def _account(self, buf: BufferDecl, scope: _Scope) -> None:
        if buf.memory == self.hw.root_memory.name:
            return
        # the shared rule counts fixed extents; a partial axis over a loop whose count
        # varies with a ranged size multiplies in symbolically
        varying = [self.extents[loop] for loop in buf.partial_loops
                   if not isinstance(self.extents.get(loop, 1), int)]
        copies: Term = instance_copies(
            buf, scope.loops, self.hw,
            lambda loop: e if isinstance(e := self.extents.get(loop, 1), int) else 1)
        for extent in varying:
            copies = copies * extent
        self.usage.setdefault(buf.memory, []).append(
            (buf.name, copies, buffer_bytes(
                online.counted(self.current, self.hw, buf) if self.plain else buf,
                self.hw.memory(buf.memory),
                buf.dtype.itemsize if self.plain else element_bytes(buf, self.hw,
                                                                    self.vector))))

    def _capacity(self, kernel: Kernel, memory: str, tiles: list[tuple[str, Term, int]]
                  ) -> None:
        self.checks += 1
        self.kinds.add("capacity")
        usable = online.usable(kernel, self.hw, memory)
        used = z3.Sum([z3.IntVal(nbytes) * copies for _, copies, nbytes in tiles])
        solver = self.solver
        solver.push()
        try:
            solver.add(used > usable)
            verdict = solver.check()
            if verdict == z3.unsat:
                return
            where = f"kernel {kernel.name}: {memory}"
            if verdict == z3.unknown:
                self.failures.append(Failure("capacity", where, f"z3 could not decide "
                                             f"({solver.reason_unknown()})", {}, kernel.name))
                return
            model = solver.model()
            counts = [(name, int(_show(model, copies)), nbytes)
                      for name, copies, nbytes in tiles]
            sizes = self._sizes_of(model)
        finally:
            solver.pop()
        total = sum(copies * nbytes for _, copies, nbytes in counts)
        parts = ", ".join(f"{name} {nbytes}B" + (f" x{copies}" if copies > 1 else "")
                          for name, copies, nbytes in counts)
        self.failures.append(Failure(
            "capacity", where,
            f"tiles in one {memory} take {total} bytes > {usable} usable ({parts})",
            sizes, kernel.name))


def _partial_message(loop: str, top: Term, buffer: str) -> Callable[[z3.ModelRef], str]:
    return lambda model: f"partial loop {loop} outside 0..{_show(model, top)} of {buffer}"


def _show(model: z3.ModelRef, term: Term) -> str:
    """A term's value in a counterexample."""
    if isinstance(term, int):
        return str(term)
    return str(model.eval(term, model_completion=True).as_long())


def _z3(expr: Affine) -> z3.ArithRef:
    total: z3.ArithRef = z3.IntVal(expr.const)
    for var, coeff in expr.terms:
        total = total + coeff * z3.Int(var)
    return total


def _loops(nodes: tuple[Node, ...]) -> Iterator[LoopVar]:
    for node in nodes:
        if isinstance(node, Loop):
            yield node.var
            yield from _loops(node.body)
