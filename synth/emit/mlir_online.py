"""The MLIR emitter's code for the online rewrite (`synth.ir.online`): kept apart from
`mlir.py` so that the two change independently.

In schedule.mlir the running maximum's previous value is a `linalg.copy` of its tile, and
the rescale one `linalg.generic` over the rescaled tile: the running and previous
maxima are read along the rows they share with it, and each element is multiplied by
`exp(c * (m - m_prev))` computed in f32 (`math.exp`), or kept as it is where the maximum
did not move (`arith.cmpf une`, as C's `!=`: a row that has seen only padding, -inf on
both sides, stays as it is).

transform.mlir has no op for the rewrite: upstream fuses a producer into a consumer's
tile by recomputing it there, and a running maximum corrected by rescales is not such a
fusion. The script tiles an online kernel's statements as any kernel's
(`TransformWriter`): the exponentials stay outside the pass loop (they are read after
it), so the maximum does too (nothing inside reads it), and the transformed source
computes the same values in two passes; schedule.mlir is the online program itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from synth.emit.cstyle import EmitError
from synth.ir.nodes import Rescale, Running

if TYPE_CHECKING:
    from synth.emit.mlir import Buf, KernelWriter


def _tile(kw: KernelWriter, name: str, what: str) -> Buf:
    buf = kw.buffers.get(name)
    if buf is None:
        raise EmitError(f"{what}: expected {name} allocated in scope, got none")
    if buf.decl.partial_loops:
        raise EmitError(f"{what}: expected a tile without partial results, got {name} "
                        f"with partial loops ({', '.join(buf.decl.partial_loops)})")
    return buf


def running(kw: KernelWriter, node: Running) -> None:
    """previous = running (the whole tile)."""
    what = f"running {node.running}"
    run, prev = _tile(kw, node.running, what), _tile(kw, node.previous, what)
    if run.type.shape != prev.type.shape:
        raise EmitError(f"{what}: expected {node.previous} shaped as {node.running} "
                        f"{run.type.shape}, got {prev.type.shape}")
    kw.code(f"// running {node.running} -> {node.previous} (before {node.statement})")
    kw.code(f"linalg.copy ins({run.value} : {run.type}) outs({prev.value} : {prev.type})")


def rescale(kw: KernelWriter, node: Rescale) -> None:
    """target *= exp(coeff * (running - previous)) per row, 1 where it did not move."""
    from synth.emit.mlir import INDENT, affine_map, constant, dim_id, float_literal

    what = f"rescale {node.target}"
    target = _tile(kw, node.target, what)
    run, prev = _tile(kw, node.running, what), _tile(kw, node.previous, what)
    for buf in (target, run):
        if not buf.type.element.startswith("f"):
            raise EmitError(f"{what}: expected float tiles, got {buf.decl.name} of "
                            f"{buf.type.element}")
    rows = run.decl.dims
    missing = [d for d in rows if d not in target.decl.dims]
    if missing:
        raise EmitError(f"{what}: expected {node.target} to hold the rows of "
                        f"{node.running}, got none along {missing[0]}")
    dims = [dim_id(d) for d in target.decl.dims]
    row_map = affine_map(dims, [dim_id(d) for d in rows])
    maps = f"{row_map}, {row_map}, {affine_map(dims, dims)}"
    iterators = ", ".join('"parallel"' for _ in dims)
    kw.code(f"// rescale {node.target} *= exp({float_literal(node.coeff, 'f32')} * "
            f"({node.running} - {node.previous})), 1 where the maximum did not move")
    kw.code(f"linalg.generic {{indexing_maps = [{maps}], iterator_types = [{iterators}]}}")
    kw.code(f"{INDENT * 2}ins({run.value}, {prev.value} : {run.type}, {prev.type}) "
            f"outs({target.value} : {target.type}) {{")
    names = kw.names
    now, before, acc = names("now"), names("before"), names("acc")
    element, row = target.type.element, run.type.element
    kw.code(f"^bb0({now}: {row}, {before}: {row}, {acc}: {element}):")
    kw.code.depth += 1
    values = [now, before, acc]
    if row != "f32":  # the factor in f32, as the C emitters compute it
        values[:2] = [_ext(kw, v, row, "f32") for v in (now, before)]
    moved, diff, coeff, scaled, factor = (names(n) for n in
                                          ("moved", "diff", "coeff", "scaled", "factor"))
    kw.code(f"{moved} = arith.cmpf une, {values[0]}, {values[1]} : f32")
    kw.code(f"{diff} = arith.subf {values[0]}, {values[1]} : f32")
    kw.code(f"{coeff} = arith.constant {constant(float(node.coeff), 'f32')}")
    kw.code(f"{scaled} = arith.mulf {coeff}, {diff} : f32")
    kw.code(f"{factor} = math.exp {scaled} : f32")
    value = acc if element == "f32" else _ext(kw, acc, element, "f32")
    product, kept = names("product"), names("kept")
    kw.code(f"{product} = arith.mulf {value}, {factor} : f32")
    kw.code(f"{kept} = arith.select {moved}, {product}, {value} : f32")
    result = kept if element == "f32" else _narrow(kw, kept, element)
    kw.code(f"linalg.yield {result} : {element}")
    kw.code.depth -= 1
    kw.code("}")


def _ext(kw: KernelWriter, value: str, source: str, to: str) -> str:
    name = kw.names("wide")
    verb = "extf" if int(source[1:]) < int(to[1:]) else "truncf"
    kw.code(f"{name} = arith.{verb} {value} : {source} to {to}")
    return name


def _narrow(kw: KernelWriter, value: str, to: str) -> str:
    name = kw.names("narrow")
    verb = "truncf" if int(to[1:]) < 32 else "extf"
    kw.code(f"{name} = arith.{verb} {value} : f32 to {to}")
    return name
