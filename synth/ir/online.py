"""The online rewrite in the loop nest: one step of a running maximum and its rescale.

An online kernel (`KernelSpec.online`, see `synth.constraints.online`) computes, at each
step over its pass dimension, in its innermost body:

    alloc reg m_reg_prev : f32[rows]        (the running statistic before this step)
    running m_reg -> m_reg_prev  (before m)
    compute m(s_reg) -> m_reg               (the maximum, updated with this step's tile)
    rescale l_reg *= exp(-1 * (m_reg - m_reg_prev))
    rescale o_reg *= exp(-1 * (m_reg - m_reg_prev))
    compute p(s_reg, m_reg) -> p_reg        (exponentials against the new maximum)
    compute l(p_reg) -> l_reg ...

`online_step` inserts the nodes where the materialiser put the max's compute;
`check_step` is the verifier's and the prover's view of them (buffers in scope, the
previous tile shaped as the running one, every rescaled tile holding the rows of the
running maximum).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from synth.constraints.online import OnlinePlan
from synth.errors import IRError
from synth.hardware import Hardware
from synth.ir.nodes import (
    Alloc,
    BufferDecl,
    Compute,
    Kernel,
    MergedSum,
    Node,
    OnlineCombine,
    Rescale,
    Running,
    walk,
)

if TYPE_CHECKING:
    from synth.ir.materialize import KernelBuilder


def previous_name(running: str) -> str:
    return f"{running}_prev"


def online_step(builder: KernelBuilder, nodes: list[Node], plan: OnlinePlan) -> list[Node]:
    """`nodes` (the computes of one innermost step) with the running maximum's update
    wrapped: its previous value kept before, the sums rescaled after."""
    at = next(k for k, n in enumerate(nodes)
              if isinstance(n, Compute) and n.statement == plan.statement)
    compute = nodes[at]
    assert isinstance(compute, Compute)
    running = compute.out
    tensor = builder.model.workload.tensors[plan.target]
    rows = {d: (o, t) for d, o, t in zip(compute.dims, compute.origin, compute.tile,
                                         strict=True)}
    previous = BufferDecl(previous_name(running), plan.target, builder.innermost, plan.rows,
                          tuple(rows[d][1] for d in plan.rows),
                          tuple(rows[d][0] for d in plan.rows), tensor.dtype)
    before: list[Node] = [Alloc(previous), Running(plan.statement, running, previous.name)]
    after: list[Node] = [Rescale(f"{target}_{builder.innermost}", running, previous.name, coeff)
             for target, coeff in plan.rescaled.items()]
    return [*nodes[:at], *before, compute, *after, *nodes[at + 1:]]


def online_merge(plan: OnlinePlan, combines: Mapping[str, tuple[str, str]]
                 ) -> tuple[OnlineCombine, tuple[str, ...]]:
    """The merge of an online kernel's partial running statistics where its units combine
    them on the device (`combines`: tensor -> (the tile merged into, its partials)): the
    running maximum and every sum it rescales (those that are split: all of them, since
    they reduce over the pass as the maximum does), and the tensors it covers."""
    parent, partials = combines[plan.target]
    sums = tuple(MergedSum(*combines[target], coeff)
                 for target, coeff in plan.rescaled.items() if target in combines)
    return (OnlineCombine(parent, partials, sums),
            (plan.target, *(t for t in plan.rescaled if t in combines)))


def check_merge(node: OnlineCombine, decls: Mapping[str, BufferDecl]) -> None:
    """What a merge of partial running statistics needs of the buffers in scope: each
    partial buffer holds the tile it merges into once per unit (the same partial axes for
    the maximum and every sum), and every sum holds the rows of the maximum. A tensor
    merged into whole on the host (its global, whose dims are its axes' positions)
    is read along its partials' dims."""
    what = f"online combine {node.partials}"
    pairs = [(node.running, node.partials), *((s.target, s.partials) for s in node.sums)]
    for name in (n for pair in pairs for n in pair):
        if name not in decls:
            raise IRError(f"{what}: expected {name} allocated in scope, got none")
    loops = decls[node.partials].partial_loops
    if not loops:
        raise IRError(f"{what}: expected partial results (partial loops), got none")
    running_dims = merge_dims(decls[node.running], decls[node.partials])
    running = decls[node.running]
    for target, partials in pairs:
        tile, part = decls[target], decls[partials]
        dims = merge_dims(tile, part)
        if part.partial_loops != loops:
            raise IRError(f"{what}: expected {partials} partial over ({', '.join(loops)}), "
                          f"got ({', '.join(part.partial_loops)})")
        if (part.shape, part.dims) != (tile.shape, dims):
            raise IRError(f"{what}: expected {partials} shaped as {target} {tile.shape} "
                          f"({', '.join(dims)}), got {part.shape} ({', '.join(part.dims)})")
        for dim, extent in zip(running_dims, running.shape, strict=True):
            if dim not in dims or tile.shape[dims.index(dim)] != extent:
                raise IRError(f"{what}: expected {target} to hold the rows of "
                              f"{node.running} ({dim}: {extent}), got {dims} "
                              f"{tile.shape}")


def merge_dims(tile: BufferDecl, partials: BufferDecl) -> tuple[str, ...]:
    """The dims of `tile`, or of its partials where it is a whole tensor's global (dims
    named by position: `m.0`)."""
    positional = tuple(f"{tile.tensor}.{k}" for k in range(len(tile.shape)))
    if tile.dims == positional and len(partials.dims) == len(positional):
        return partials.dims
    return tile.dims


def describe_merge(node: OnlineCombine) -> str:
    """The printer's line of a merge."""
    sums = ", ".join(f"{s.target} += {s.partials} * exp({s.coeff:g} * (m - m_k))"
                     for s in node.sums)
    return (f"online combine {node.running} max= reduce({node.partials}) as m; "
            f"rescaled: {sums}")


def check_step(node: Running | Rescale, decls: Mapping[str, BufferDecl]) -> None:
    """What a running statistic or a rescale needs of the buffers in scope (`decls`)."""
    names = ((node.running, node.previous) if isinstance(node, Running)
             else (node.target, node.running, node.previous))
    for name in names:
        if name not in decls:
            raise IRError(f"{_what(node)}: expected {name} allocated in scope, got none")
    running, previous = decls[node.running], decls[node.previous]
    if (running.shape, running.dims) != (previous.shape, previous.dims):
        raise IRError(f"{_what(node)}: expected {previous.name} shaped as {running.name} "
                      f"{running.shape}, got {previous.shape}")
    if isinstance(node, Rescale):
        target = decls[node.target]
        for dim, extent in zip(running.dims, running.shape, strict=True):
            if dim not in target.dims or target.shape[target.dims.index(dim)] != extent:
                raise IRError(f"{_what(node)}: expected {target.name} to hold the rows "
                              f"of {running.name} ({dim}: {extent}), got {target.dims} "
                              f"{target.shape}")


def _what(node: Running | Rescale) -> str:
    return (f"running {node.running}" if isinstance(node, Running)
            else f"rescale {node.target}")


def describe(node: Running | Rescale | OnlineCombine) -> str:
    """The printer's line."""
    if isinstance(node, OnlineCombine):
        return describe_merge(node)
    if isinstance(node, Running):
        return f"running {node.running} -> {node.previous}  (before {node.statement})"
    return (f"rescale {node.target} *= exp({node.coeff:g} * ({node.running} - "
            f"{node.previous}))")


def is_online(kernel: Kernel) -> bool:
    """Whether a kernel runs with the online rewrite (has its nodes)."""
    return any(isinstance(n, Running | Rescale) for n in walk(kernel.body))


def statistics(kernel: Kernel) -> frozenset[str]:
    """The tensors of an online kernel's running statistics (the running maximum and the
    sums it rescales): their partial results merge only by an `OnlineCombine`."""
    decls = {n.buffer.name: n.buffer for n in walk(kernel.body) if isinstance(n, Alloc)}
    names = {n.running if isinstance(n, Running) else n.target
             for n in walk(kernel.body) if isinstance(n, Running | Rescale)}
    return frozenset(decls[n].tensor for n in names if n in decls)


def step_in_cache(kernel: Kernel, hw: Hardware) -> bool:
    """Whether the kernel is an online kernel on a CPU (`compute.vector_tiles`): its
    innermost tiles are the step's plain C arrays (an element's bytes are its dtype's),
    which live in the memory just outside the registers (`online_terms.step_capacity`,
    the cost model's rule)."""
    return hw.compute.vector_tiles and is_online(kernel)


def usable(kernel: Kernel, hw: Hardware, memory: str) -> int:
    """Bytes the kernel's tiles in one instance of `memory` may take."""
    mem = hw.memory(memory)
    if memory != hw.memories[-1].name or not step_in_cache(kernel, hw):
        return mem.usable
    outside = [m for m in hw.memories[:-1] if m.level == mem.level]
    return outside[-1].usable if outside else mem.usable


def counted(kernel: Kernel, hw: Hardware, buf: BufferDecl) -> BufferDecl:
    """The tile `buf` takes in its memory's capacity: itself, or for a pass operand of an
    online kernel on a CPU in a cache outside the step (K, V: indexed by the pass
    dimension, by no row), one step's block of it, the tile of the same tensor in the
    innermost memory (it streams through the cache: `online_terms.streamed`)."""
    if not step_in_cache(kernel, hw) or not hw.memory(buf.memory).cache \
            or buf.memory == hw.memories[-1].name:
        return buf
    nodes = list(walk(kernel.body))
    running = next((n for n in nodes if isinstance(n, Running)), None)
    allocs = [n.buffer for n in nodes if isinstance(n, Alloc)]
    step = {d.tensor: d for d in allocs if d.memory == hw.memories[-1].name}
    if running is None or buf.tensor not in step:
        return buf
    rows = set(next(d.dims for d in allocs if d.name == running.running))
    passed = {d for n in nodes if isinstance(n, Compute) and n.statement == running.statement
              for d in n.dims} - rows
    if passed & set(buf.dims) and not rows & set(buf.dims):
        return step[buf.tensor]
    return buf
