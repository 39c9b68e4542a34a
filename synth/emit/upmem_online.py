"""The UPMEM emitter's code for the online rewrite (`synth.ir.online`): kept apart from
`upmem.py` so that the two change independently.

The running statistics live in WRAM, in each tasklet's own tiles (the running maximum,
its previous value and the running sums are tiles of the tasklet unit, as any tile the
materialiser puts in WRAM). `running` copies the maximum's tile into the previous one
before the step updates it; `rescale` multiplies each element of a running sum's tile
by its row's factor exp(c (m - m_prev)), computed once per row and only where the
maximum moved (a row that has seen only padding, -inf on both sides, stays as it is).
The DPU has no hardware float exp and its runtime no libm: the factor is synth's
`math_expf` (`upmem_runtime/dpu_math.c`), the function the emitter uses for `exp`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from synth.emit.cstyle import Code, EmitError, affine_sum, scale, term
from synth.ir.nodes import BufferDecl, Rescale, Running

if TYPE_CHECKING:
    from synth.emit.upmem import DpuWriter


def _tile(w: DpuWriter, name: str, what: str) -> BufferDecl:
    decl = w.plan.buffers.get(name)
    if decl is None or name not in w.tiles:
        raise EmitError(f"kernel {w.kernel}: {what}: expected a WRAM tile {name} allocated "
                        f"on the DPU, got none")
    if decl.partial_loops:
        raise EmitError(f"kernel {w.kernel}: {what}: expected a tile without partial "
                        f"results, got {name} with partial loops "
                        f"({', '.join(decl.partial_loops)})")
    return decl


def running(w: DpuWriter, code: Code, node: Running) -> None:
    """previous = running, the whole tile (its padding included)."""
    what = f"running {node.running}"
    run, prev = _tile(w, node.running, what), _tile(w, node.previous, what)
    size = w.plan.layout(node.running, w.target).size
    if (run.shape, run.dtype) != (prev.shape, prev.dtype) or \
            w.plan.layout(node.previous, w.target).size != size:
        raise EmitError(f"kernel {w.kernel}: {what}: expected {node.previous} laid out as "
                        f"{node.running} {run.dtype.value}{list(run.shape)}, got "
                        f"{prev.dtype.value}{list(prev.shape)}")
    k = w.names("#k", "k")
    with w.for_loop(code, k, size, f"the running maximum {node.running} before "
                                   f"{node.statement}'s update"):
        code(f"{w.tiles[node.previous]}[{k}] = {w.tiles[node.running]}[{k}];")


def rescale(w: DpuWriter, code: Code, node: Rescale) -> None:
    """target *= exp(coeff * (running - previous)) per row of the running maximum."""
    what = f"rescale {node.target}"
    target = _tile(w, node.target, what)
    run, prev = _tile(w, node.running, what), _tile(w, node.previous, what)
    if not (target.dtype.is_float and run.dtype.is_float):
        raise EmitError(f"kernel {w.kernel}: {what}: expected float tiles, got "
                        f"{target.dtype.value} and {run.dtype.value}")
    missing = [d for d in run.dims if d not in target.dims]
    if missing:
        raise EmitError(f"kernel {w.kernel}: {what}: expected {node.target} to hold the "
                        f"rows of {node.running}, got none along {missing[0]}")
    run_lay = w.plan.layout(node.running, w.target)
    if (prev.shape, prev.dims) != (run.shape, run.dims):
        raise EmitError(f"kernel {w.kernel}: {what}: expected {node.previous} shaped as "
                        f"{node.running} {list(run.shape)}, got {list(prev.shape)}")
    target_lay = w.plan.layout(node.target, w.target)
    shape = dict(zip(target.dims, target.shape, strict=True))
    rows = {d: w.names(f"#row:{d}", d) for d in run.dims}
    rest = {d: w.names(f"#col:{d}", d) for d in target.dims if d not in rows}
    at = {**{d: f"#row:{d}" for d in rows}, **{d: f"#col:{d}" for d in rest}}
    row_index = w.index(affine_sum(scale(term(at[d]), s)
                                   for d, s in zip(run.dims, run_lay.strides, strict=True)))
    target_index = w.index(affine_sum(
        scale(term(at[d]), s) for d, s in zip(target.dims, target_lay.strides, strict=True)))
    exp = w.math_function("expf")
    coeff = w.literal(float(node.coeff)).code
    now, before = (f"{w.tiles[name]}[{row_index}]" for name in (node.running, node.previous))
    code.comment(f"{node.target} rescaled to the new maximum {node.running}: "
                 f"exp({node.coeff:g} * ({node.running} - {node.previous})) per row")
    depth = code.depth
    for d, var in rows.items():
        code(f"for ({w.index_type} {var} = 0; {var} < {shape[d]}; {var}++)")
        code.depth += 1
    with code.block(f"if ({now} != {before})", "1 where the maximum did not move"):
        factor = w.names("#factor", "factor")
        code(f"const float {factor} = {exp}({coeff} * ({now} - {before}));")
        inner = code.depth
        for d, var in rest.items():
            code(f"for ({w.index_type} {var} = 0; {var} < {shape[d]}; {var}++)")
            code.depth += 1
        code(f"{w.tiles[node.target]}[{target_index}] *= {factor};")
        code.depth = inner
    code.depth = depth
