"""Readable, MLIR-like text of a loop nest, with symbolic extents beside their values."""

from __future__ import annotations

from synth.ir.nodes import (
    Alloc,
    BufferDecl,
    Combine,
    Compute,
    Fill,
    Kernel,
    Load,
    Loop,
    LoopKind,
    Node,
    OnlineCombine,
    Program,
    Rescale,
    Running,
    Store,
)
from synth.ir.online import describe


def print_program(program: Program) -> str:
    counts = ", ".join(f"{k}={v}" for k, v in program.counts.items())
    lines = [f"program {program.workload} on {program.hardware}"
             + (f" with {counts}" if counts else "")]
    for kernel in program.kernels:
        lines.extend(print_kernel(kernel))
    return "\n".join(lines)


def print_kernel(kernel: Kernel) -> list[str]:
    lines = [f"kernel {kernel.name} {{"]
    for node in kernel.body:
        lines.extend(_node(node, 1))
    lines.append("}")
    return lines


def _node(node: Node, depth: int) -> list[str]:
    pad = "  " * depth
    if isinstance(node, Loop):
        var = node.var
        where = f"  // {var.where}" + (f", step {var.step}" if var.step > 1 else "")
        head = (f"{pad}{var.kind.value} {var.name} in 0..{var.symbol}={var.extent} {{{where}")
        body = [line for child in node.body for line in _node(child, depth + 1)]
        return [head, *body, f"{pad}}}"]
    return [pad + _statement(node)]


def _statement(node: Node) -> str:
    if isinstance(node, Alloc):
        return _alloc(node.buffer)
    if isinstance(node, Load):
        return f"load {node.dst} <- {node.src}"
    if isinstance(node, Store):
        return f"store {node.src} -> {node.dst}"
    if isinstance(node, Fill):
        return f"fill {node.buffer} = {node.value}"
    if isinstance(node, Compute):
        tiles = ", ".join(f"{d}: {t}" for d, t in zip(node.dims, node.tile, strict=True))
        operands = ", ".join(node.operands.values())
        return f"compute {node.statement}({operands}) -> {node.out}  [{tiles}]"
    if isinstance(node, Combine):
        return f"combine {node.target} {node.op.value} reduce({node.partials})"
    if isinstance(node, Running | Rescale | OnlineCombine):
        return describe(node)
    raise TypeError(type(node))


def _alloc(buf: BufferDecl) -> str:
    shape = "x".join(str(n) for n in buf.shape)
    kind = f"{buf.dtype.value}[{shape}]"
    text = f"alloc {buf.memory} {buf.name} : {kind}"
    if any(str(o) != "0" for o in buf.origin):
        text += f" at {buf.tensor}[{', '.join(str(o) for o in buf.origin)}]"
    if buf.partial_loops:
        text += f" partials over ({', '.join(buf.partial_loops)})"
    if buf.buffers > 1:
        text += f" x{buf.buffers}"
    if buf.shared:
        text += f" shared by ({', '.join(buf.shared)})"
    return text


def loop_summary(kernel: Kernel) -> list[str]:
    """The loops of a kernel, outermost first, as `d_i:D.y.i=64`."""
    out: list[str] = []

    def visit(nodes: tuple[Node, ...]) -> None:
        for node in nodes:
            if isinstance(node, Loop):
                kind = "par" if node.var.kind is LoopKind.PARALLEL else "seq"
                out.append(f"{kind} {node.var.symbol}={node.var.extent}")
                visit(node.body)

    visit(kernel.body)
    return out
