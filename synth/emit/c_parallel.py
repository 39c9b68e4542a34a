"""The parallel structure of the C emitter's kernels (`synth.emit.c`): how many OpenMP
threads a kernel runs, whether it runs as one parallel region per call, and which
tensors' fills can be left out.

A kernel whose units (the cores) are parallel loops inside sequential ones ran a
parallel region per step of those loops: a fork and a join each (16 per call of a
1024^3 GEMM whose L3 tiles are 4 x 2 x 2 steps). As one region, every thread walks the
sequential loops and each parallel loop is an `omp for` that hands each thread its
unit, with a barrier at its end; fills and combines of tensors in the root memory,
which all threads reach, are shared out with `omp for` too. Partial results are
allocated before the region, so that every thread sees the same buffer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from synth.ir.nodes import (
    Alloc,
    Combine,
    Compute,
    Fill,
    Kernel,
    Load,
    Loop,
    LoopKind,
    Node,
    Program,
    Store,
    walk,
)
from synth.workload import Workload

__all__ = ["one_region", "parallel_units", "unread_tensors"]


def unread_tensors(program: Program, workload: Workload) -> frozenset[str]:
    """Tensors in the root memory that only fills name: no kernel loads, stores or
    combines them and they are not outputs (a fused kernel's intermediate that lives in
    registers, as swiglu's a and b). Their fills write memory nothing reads."""
    named: set[str] = set()
    for kernel in program.kernels:
        for node in walk(kernel.body):
            if isinstance(node, Load | Store):
                named.update((node.src, node.dst))
            elif isinstance(node, Combine):
                named.update((node.target, node.partials))
            elif isinstance(node, Compute):
                named.update((node.out, *node.operands.values()))
    outputs = {t.name for t in workload.outputs}
    return frozenset(name for name in workload.tensors
                     if name not in named and name not in outputs)


def one_region(nodes: Sequence[Node], root: str, innermost: str,
               packs: Mapping[str, object], top: bool = True) -> bool:
    """Whether a kernel can run as one OpenMP parallel region (one fork and join per
    call, and a barrier per parallel loop, instead of a region per iteration of the
    sequential loops around it): every thread runs the code outside its parallel loops,
    so that code must only walk loops, fill or combine root tensors (shared out with
    `omp for`) or name views; partial results are allocated at the kernel's start."""
    for node in nodes:
        if isinstance(node, Loop):
            if node.var.kind is LoopKind.SEQUENTIAL and not one_region(
                    node.body, root, innermost, packs, top=False):
                return False
        elif isinstance(node, Alloc):
            memory = node.buffer.memory
            if memory == innermost or node.buffer.name in packs or (memory == root
                                                                    and not top):
                return False
        elif isinstance(node, Load | Store):
            pass  # between views (innermost tiles are allocated inside the units' loops)
        elif not isinstance(node, Fill | Combine):
            return False
    return True


def parallel_units(kernel: Kernel) -> int:
    """Threads a kernel runs: the product of its parallel loops' extents."""
    units = 1
    for node in walk(kernel.body):
        if isinstance(node, Loop) and node.var.kind is LoopKind.PARALLEL:
            units *= node.var.extent
    return units
