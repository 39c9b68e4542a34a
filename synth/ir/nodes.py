"""The loop-nest IR: kernels of loops, buffers, transfers, computes and combines.

Extents keep their symbolic names beside their values (`forall d_i in 0..D.y.i=64`), so a
printed schedule reads like a hand-written one. Parallel loops stay parallel (`forall`),
partial results of split reductions and their combine are explicit, and every tile has a
static shape (ragged edges are masked at run time, never reshaped).

Each node's `verify()` checks what can be checked locally and raises IRError with an
"expected X, got Y" message; `synth.ir.verify` checks whole programs.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from synth.errors import IRError
from synth.workload import DType, ReduceOp


@dataclass(frozen=True)
class Affine:
    """sum(coeff * loop variable) + const: an element offset along one dimension."""

    terms: tuple[tuple[str, int], ...] = ()
    const: int = 0

    def __add__(self, other: Affine) -> Affine:
        merged: dict[str, int] = dict(self.terms)
        for var, coeff in other.terms:
            merged[var] = merged.get(var, 0) + coeff
        return Affine(tuple((v, c) for v, c in merged.items() if c), self.const + other.const)

    def __sub__(self, other: Affine) -> Affine:
        return self + Affine(tuple((v, -c) for v, c in other.terms), -other.const)

    def max_value(self, extents: Mapping[str, int]) -> int:
        """The largest value over loop variables `v` in `0..extents[v]-1`."""
        return self.const + sum(c * (extents[v] - 1) for v, c in self.terms if c > 0)

    def min_value(self, extents: Mapping[str, int]) -> int:
        return self.const + sum(c * (extents[v] - 1) for v, c in self.terms if c < 0)

    def __str__(self) -> str:
        parts = [v if c == 1 else f"{v}*{c}" for v, c in self.terms]
        if self.const or not parts:
            parts.append(str(self.const))
        return " + ".join(parts)


class LoopKind(enum.Enum):
    PARALLEL = "forall"  # across the units of a hardware level
    SEQUENTIAL = "for"


@dataclass(frozen=True)
class LoopVar:
    name: str  # e.g. d_i
    dim: str  # the kernel dimension it walks
    symbol: str  # the schedule variable behind its extent, e.g. D.y.i
    extent: int
    step: int  # elements of `dim` per iteration
    kind: LoopKind
    where: str  # the level (parallel) or memory (sequential) it belongs to


@dataclass(frozen=True)
class BufferDecl:
    """A tile of one tensor in one memory.

    Its array holds one tile per combination of the parallel loops around its allocation
    (the instances) and, for partial results, one per combination of `partial_loops`:
    parallel loops inside it that split a reduced dimension. `buffers` is 2 when the
    tile is double buffered: the memory holds two of it, one computed on while the other
    is filled (timing only; the values are those of one tile). `shared` names parallel
    loops around the allocation whose units share one tile (the same tile for all of
    them, read only: its origin does not depend on them), so a memory instance holds it
    once rather than once per unit (`synth.constraints.sharing`: UPMEM tasklets sharing a
    WRAM block, loaded by one of them between barriers; values as those of one tile).
    """

    name: str
    tensor: str
    memory: str
    dims: tuple[str, ...]  # kernel dimension of each tensor axis
    shape: tuple[int, ...]  # tile extent of each axis
    origin: tuple[Affine, ...]  # global index of the tile's first element, per axis
    dtype: DType
    partial_loops: tuple[str, ...] = ()
    buffers: int = 1
    shared: tuple[str, ...] = ()

    def verify(self) -> None:
        if not (len(self.dims) == len(self.shape) == len(self.origin)):
            raise IRError(f"buffer {self.name}: expected dims, shape and origin of one rank, "
                          f"got {len(self.dims)}, {len(self.shape)}, {len(self.origin)}")
        if any(n < 1 for n in self.shape):
            raise IRError(f"buffer {self.name}: expected positive tile extents, "
                          f"got {self.shape}")
        if self.buffers not in (1, 2):
            raise IRError(f"buffer {self.name}: expected 1 or 2 buffers, got {self.buffers}")
        if self.shared and self.partial_loops:
            raise IRError(f"buffer {self.name}: expected a shared tile or partial results, "
                          f"got both (shared by {', '.join(self.shared)})")
        walked = {v for a in self.origin for v, _ in a.terms} & set(self.shared)
        if walked:
            raise IRError(f"buffer {self.name}: expected a shared tile the same for every "
                          f"unit sharing it, got an origin over {', '.join(sorted(walked))}")


# ---------------------------------------------------------------- statements of the IR


@dataclass(frozen=True)
class Loop:
    var: LoopVar
    body: tuple[Node, ...]

    def verify(self) -> None:
        if self.var.extent < 1 or self.var.step < 1:
            raise IRError(f"loop {self.var.name}: expected extent and step >= 1, "
                          f"got {self.var.extent} and {self.var.step}")


@dataclass(frozen=True)
class Alloc:
    buffer: BufferDecl

    def verify(self) -> None:
        self.buffer.verify()


@dataclass(frozen=True)
class Load:
    """Copy the child's tile from the parent buffer (elements outside the tensor skipped)."""

    dst: str
    src: str


@dataclass(frozen=True)
class Store:
    """Copy the child's tile back into the parent buffer."""

    src: str
    dst: str


@dataclass(frozen=True)
class Fill:
    buffer: str
    value: float | int


@dataclass(frozen=True)
class Compute:
    """One statement over one tile of the iteration space."""

    statement: str
    out: str  # buffer of the target
    operands: Mapping[str, str]  # tensor -> buffer it is read from
    dims: tuple[str, ...]
    origin: tuple[Affine, ...]  # first iteration point, per dim
    tile: tuple[int, ...]  # iteration points, per dim

    def verify(self) -> None:
        if not (len(self.dims) == len(self.origin) == len(self.tile)):
            raise IRError(f"compute {self.statement}: expected one origin and tile per dim, "
                          f"got {len(self.dims)} dims, {len(self.origin)} origins, "
                          f"{len(self.tile)} tiles")


@dataclass(frozen=True)
class Combine:
    """target = op(target, reduce(op, partials over their partial axes))."""

    target: str
    partials: str
    op: ReduceOp


@dataclass(frozen=True)
class Running:
    """The online rewrite's running statistic before this step's update: `previous`
    takes the values of `running` (the tile of a running maximum), so that the rescale
    after the update sees how far the maximum moved."""

    statement: str  # the max reduction about to update `running`
    running: str
    previous: str


@dataclass(frozen=True)
class Rescale:
    """target *= exp(coeff * (running - previous)), the factor of each row of the running
    maximum broadcast over the target's other dimensions (1 where the maximum did not
    move): a running sum of exponentials corrected to the new maximum."""

    target: str
    running: str
    previous: str
    coeff: float


@dataclass(frozen=True)
class MergedSum:
    """One running sum an `OnlineCombine` merges: its tile and its units' partials, and
    the coefficient c of its rescale (as `Rescale.coeff`)."""

    target: str
    partials: str
    coeff: float


@dataclass(frozen=True)
class OnlineCombine:
    """The online rewrite's partial results merged (FlashDecoding's split-KV combine):
    units that each ran the pass over their share of its dimension hand on a running
    maximum m_k and running sums s_k per row. With m = max(running, max_k m_k), every sum
    becomes target * exp(c (m - running)) + sum_k s_k * exp(c (m - m_k)) (each factor 1
    where its maximum is m), then running = m: partials of one sum are comparable only
    once rescaled to a common maximum, so a plain `Combine` of them would be wrong."""

    running: str  # the running maximum's tile the partials are merged into
    partials: str  # its units' partial maxima (partial axes as `Combine.partials`)
    sums: tuple[MergedSum, ...]


Node = (Loop | Alloc | Load | Store | Fill | Compute | Combine | Running | Rescale
        | OnlineCombine)


@dataclass(frozen=True)
class Kernel:
    name: str
    statements: tuple[str, ...]
    body: tuple[Node, ...]
    # the dimension its innermost tiles are SIMD vectors along (a schedule decision on
    # models with vector registers, `vec.<kernel>`); None: not decided
    vector: str | None = None


@dataclass(frozen=True)
class Program:
    workload: str
    hardware: str
    root_memory: str
    globals: tuple[BufferDecl, ...]  # whole tensors in the root memory
    kernels: tuple[Kernel, ...]
    counts: Mapping[str, int]  # the hardware counts the program allocates (R, D, T, ...)
    extents: Mapping[str, Mapping[str, int]]  # kernel -> dim -> extent


def walk(nodes: tuple[Node, ...]) -> Iterator[Node]:
    for node in nodes:
        yield node
        if isinstance(node, Loop):
            yield from walk(node.body)
