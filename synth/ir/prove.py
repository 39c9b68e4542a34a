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
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

import z3

from synth.hardware import Hardware
from synth.ir.nodes import (
    Affine,
    Alloc,
    BufferDecl,
    Compute,
    Kernel,
    Load,
    Loop,
    LoopVar,
    Node,
    Program,
    Store,
)
from synth.ir.verify import buffer_bytes, instance_copies
from synth.workload import Workload, accesses

TIMEOUT_MS = 10_000  # per obligation; these are small linear problems over boxes


@dataclass(frozen=True)
class Failure:
    kind: str  # "bounds" | "capacity"
    where: str  # the node's text, e.g. "load x_wram <- x_mram", or "kernel e: wram"
    message: str
    counterexample: Mapping[str, int]  # loop variable -> value (empty for capacities)
    kernel: str = ""  # the kernel holding the node (node texts repeat across kernels)

    def to_json(self) -> dict[str, object]:
        return {"kind": self.kind, "kernel": self.kernel, "where": self.where,
                "message": self.message, "counterexample": dict(self.counterexample)}


@dataclass(frozen=True)
class Proof:
    proved: bool
    checks: int  # obligations stated (each proved or refuted)
    failures: list[Failure] = field(default_factory=list)

    def to_json(self) -> dict[str, object]:
        return {"proved": self.proved, "checks": self.checks,
                "failures": [f.to_json() for f in self.failures]}

    def __str__(self) -> str:
        if self.proved:
            return f"proved: {self.checks} obligations (bounds, capacity) hold"
        lines = [f"refuted: {len(self.failures)} of {self.checks} obligations fail"]
        for f in self.failures:
            place = f"kernel {f.kernel}: {f.where}" if f.kind == "bounds" else f.where
            values = ", ".join(f"{k}={v}" for k, v in f.counterexample.items())
            at = f" [at {values}]" if values and f"[at {values}]" not in f.message else ""
            lines.append(f"  {f.kind}: {place}: {f.message}{at}")
        return "\n".join(lines)


def prove(program: Program, workload: Workload, hw: Hardware) -> Proof:
    """Prove every bounds and capacity obligation of `program`, or refute some."""
    prover = _Prover(program, workload, hw)
    for kernel in program.kernels:
        prover.kernel(kernel)
    return Proof(not prover.failures, prover.checks, prover.failures)


# ---------------------------------------------------------------- the obligations


@dataclass
class _Scope:
    buffers: dict[str, BufferDecl]
    loops: list[LoopVar]


class _Prover:
    def __init__(self, program: Program, workload: Workload, hw: Hardware) -> None:
        self.program = program
        self.workload = workload
        self.hw = hw
        self.globals = {b.name: b for b in program.globals}
        self.solver = z3.Solver()
        self.solver.set("timeout", TIMEOUT_MS)
        self.checks = 0
        self.failures: list[Failure] = []
        self.name = ""  # the running kernel
        self.extents: dict[str, int] = {}  # the running kernel's loops -> extent
        self.usage: dict[str, list[tuple[str, int, int]]] = {}  # memory -> (buf, copies, bytes)

    # -- walking ---------------------------------------------------------------

    def kernel(self, kernel: Kernel) -> None:
        self.name = kernel.name
        self.extents = {v.name: v.extent for v in _loops(kernel.body)}
        self.usage = {}
        self._block(kernel.body, _Scope(dict(self.globals), []))
        for memory, tiles in self.usage.items():
            self._capacity(kernel, memory, tiles)

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

    def _buffer(self, name: str, scope: _Scope, where: str) -> BufferDecl | None:
        if name not in scope.buffers:
            self._structural(where, f"no buffer {name} allocated around the node")
            return None
        return scope.buffers[name]

    def _structural(self, where: str, message: str) -> None:
        """A fault no loop value is needed to exhibit (the node cannot be indexed at all)."""
        self.checks += 1
        self.failures.append(Failure("bounds", where, message, {}, self.name))

    # -- bounds ----------------------------------------------------------------

    def _transfer(self, child_name: str, parent_name: str, scope: _Scope, where: str) -> None:
        child = self._buffer(child_name, scope, where)
        parent = self._buffer(parent_name, scope, where)
        if child is None or parent is None:
            return
        domain = _domain(scope.loops)
        for loop in parent.partial_loops:
            if loop in domain:
                # the enclosing loop's value indexes the parent's partial axis
                top = self.extents[loop] - 1
                self._check(where, domain, z3.Int(loop) > top,
                            _fixed(f"partial loop {loop} outside 0..{top} of {parent.name}"))
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
        extents = self.workload.tensors[child.tensor].shape
        for axis, size in enumerate(child.shape):
            self._access(where, domain, axis, child.origin[axis], size, extents[axis],
                         parent, axis, f"{child.name}")

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
        domain = _domain(scope.loops)
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
                             stmt.extents[dim], decl, axis, f"the {dim} tile")

    def _access(self, where: str, domain: Mapping[str, int], axis: int, origin: Affine,
                size: int, extent: int, buffer: BufferDecl, buffer_axis: int,
                what: str) -> None:
        """Obligation: every element `e` of a `size`-long tile at global `origin + e` that
        lies inside the tensor (< `extent`) indexes `buffer` inside its tile."""
        element = z3.Int(f"{what}@{axis}")
        coord = _z3(origin) + element
        local = coord - _z3(buffer.origin[buffer_axis])
        top = buffer.shape[buffer_axis] - 1
        bad = z3.And(element >= 0, element < size, coord < extent,
                     z3.Or(local < 0, local > top))

        def message(model: z3.ModelRef) -> str:
            e = model.eval(element, model_completion=True).as_long()
            c = model.eval(coord, model_completion=True).as_long()
            i = model.eval(local, model_completion=True).as_long()
            return (f"axis {buffer_axis}: element {e} of {what} (global {c} < {extent}) "
                    f"has index {i} outside 0..{top} of {buffer.name} "
                    f"(origin {buffer.origin[buffer_axis]})")

        self._check(where, domain, bad, message)

    def _check(self, where: str, domain: Mapping[str, int], bad: z3.BoolRef,
               message: Callable[[z3.ModelRef], str]) -> None:
        """Ask z3 for loop values (within `domain`) and element positions satisfying
        `bad`: none is a proof; one is a failure with those loop values."""
        self.checks += 1
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
                self.failures.append(Failure("bounds", where,
                                             f"z3 could not decide ({solver.reason_unknown()})",
                                             {}, self.name))
                return
            model = solver.model()
            # the enclosing loops, and any free variable an origin names (a scoping fault)
            names = list(domain) + sorted(d.name() for d in model.decls()
                                          if "@" not in d.name() and d.name() not in domain)
            values = {name: model.eval(z3.Int(name), model_completion=True).as_long()
                      for name in names}
            self.failures.append(Failure("bounds", where, message(model), values,
                                         self.name))
        finally:
            solver.pop()

    # -- capacity --------------------------------------------------------------

    def _account(self, buf: BufferDecl, scope: _Scope) -> None:
        if buf.memory == self.hw.root_memory.name:
            return
        copies = instance_copies(buf, scope.loops, self.hw,
                                 lambda loop: self.extents.get(loop, 1))
        self.usage.setdefault(buf.memory, []).append(
            (buf.name, copies, buffer_bytes(buf, self.hw.memory(buf.memory))))

    def _capacity(self, kernel: Kernel, memory: str, tiles: list[tuple[str, int, int]]
                  ) -> None:
        self.checks += 1
        usable = self.hw.memory(memory).usable
        used = z3.Sum([z3.IntVal(copies) * z3.IntVal(nbytes) for _, copies, nbytes in tiles])
        solver = z3.Solver()
        solver.add(used > usable)
        if solver.check() == z3.unsat:
            return
        total = sum(copies * nbytes for _, copies, nbytes in tiles)
        parts = ", ".join(f"{name} {nbytes}B" + (f" x{copies}" if copies > 1 else "")
                          for name, copies, nbytes in tiles)
        self.failures.append(Failure(
            "capacity", f"kernel {kernel.name}: {memory}",
            f"tiles in one {memory} take {total} bytes > {usable} usable ({parts})", {},
            kernel.name))


def _fixed(text: str) -> Callable[[z3.ModelRef], str]:
    return lambda _model: text


def _domain(loops: list[LoopVar]) -> dict[str, int]:
    """Each enclosing loop variable -> its extent (an inner loop of the same name wins)."""
    return {v.name: v.extent for v in loops}


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
