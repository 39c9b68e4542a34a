"""The C emitter's code for the online rewrite's nodes (`synth.ir.online`): kept apart
from `c.py` so that the two change independently.

Both are scalar loops over the innermost tiles (one previous maximum per row; the
rescale multiplies each element of a sum's tile by its row's factor, 1 where the
maximum did not move, so a row that has seen only padding stays as it is).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from synth.ir.nodes import Rescale, Running

if TYPE_CHECKING:
    from synth.emit.c import KernelWriter
    from synth.emit.cstyle import Code


def running(kw: KernelWriter, code: Code, node: Running) -> None:
    """previous = running, element by element."""
    _folded(kw, code, node.running)
    run, prev = kw.locals[node.running], kw.locals[node.previous]
    code.comment(f"the running maximum {run.decl.name} before {node.statement}'s update")
    with kw.tile_loops(code, run.decl.dims, run.decl.shape) as at:
        code(f"{prev.scalar(at)} = {run.scalar(at)};")


def rescale(kw: KernelWriter, code: Code, node: Rescale) -> None:
    """target *= exp(coeff * (running - previous)) per row."""
    for name in (node.target, node.running):
        _folded(kw, code, name)
    target = kw.locals[node.target]
    run, prev = kw.locals[node.running], kw.locals[node.previous]
    exp = kw.w.math_function("expf")
    coeff = kw.w.literal(float(node.coeff), "float").code
    code.comment(f"{target.decl.name} rescaled to the new maximum {run.decl.name}")
    with kw.tile_loops(code, target.decl.dims, target.decl.shape) as at:
        rows = {d: at[d] for d in run.decl.dims}
        now, before = run.scalar(rows), prev.scalar(rows)
        code(f"if ({now} != {before}) {target.scalar(at)} *= "
             f"{exp}(({coeff}) * ({now} - {before}));")


def _folded(kw: KernelWriter, code: Code, buffer: str) -> None:
    """Vector partial results of `buffer` folded first (the running maximum's)."""
    if buffer in kw.pending:
        kw.fold(code, buffer)
