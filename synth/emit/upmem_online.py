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

Where the tasklets split the pass (`OnlineCombine`, `merge`), each ran it over its share
of the keys into its own slot of the combine buffers in WRAM (the partial maximum and
sums); after the barrier, tasklet 0 folds the slots into the first, pairwise: per row,
m = max(m_a, m_b), each sum s_a * exp(c (m - m_a)) + s_b * exp(c (m - m_b)) (a factor 1
where its side holds m), then folds the tiles above (MRAM, read into the second slot) the
same way and writes the first slot back to them.

Where DPUs or ranks split the pass (`host_merge`: an `OnlineCombine` in the kernel's
epilogue, on the host), each DPU's MRAM tiles of the statistics come back into its slot
of the host's partial buffers, and after the launch the host merges them row by row into
the tensors: the row's common maximum over the tensor's value and every partial, then
each sum scaled to it (its own value by exp(c (m - m_old)), each partial's by
exp(c (m - m_k)), 1 where a side holds m), with the host's libm `expf`.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from synth.emit.cstyle import Code, EmitError, affine_sum, scale, term
from synth.ir.nodes import BufferDecl, OnlineCombine, Rescale, Running

if TYPE_CHECKING:
    from synth.emit.upmem_dpu import DpuWriter
    from synth.emit.upmem_host import HostWriter
    from synth.emit.upmem_plan import KernelPlan


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


def merge(w: DpuWriter, code: Code, node: OnlineCombine) -> None:
    """The tasklets' partial running statistics merged into the tiles above (one
    tasklet, after the barrier `device` puts before it)."""
    what = f"online combine {node.partials}"
    pairs = [(node.running, node.partials), *((s.target, s.partials) for s in node.sums)]
    count = 0
    for target, partials in pairs:
        decl, found = w.plan.buffers.get(target), w.plan.buffers.get(partials)
        lay = w.plan.layout(partials, w.target) if found is not None else None
        if decl is None or lay is None or partials not in w.tiles \
                or decl.partial_loops or not (target in w.mram_names or target in w.tiles) \
                or w.plan.layout(target, w.target).size != lay.instance \
                or not decl.dtype.is_float:
            raise EmitError(f"kernel {w.kernel}: {what}: expected float partial results of "
                            f"{target}'s tile in WRAM, got {partials}")
        count = count or math.prod(lay.partials)
        if math.prod(lay.partials) != count or count < 2:
            raise EmitError(f"kernel {w.kernel}: {what}: expected the same two or more "
                            f"partial results of every statistic, got {partials} with "
                            f"{math.prod(lay.partials)}")
    part = w.names("#part", "part")
    code.comment(f"merge the {count} tasklets' partial running statistics: each rescaled "
                 f"to the common maximum of {node.running} (FlashDecoding's combine)")
    with w.for_loop(code, part, count, start=1):
        _fold(w, code, node, part)
    for target, partials in pairs:  # the tiles above into the second slot
        size = w.plan.layout(partials, w.target).instance
        itemsize = w.plan.buffers[target].dtype.itemsize
        w.exchange(code, target, f"&{w.tiles[partials]}[{size}]", size * itemsize, read=True)
    _fold(w, code, node, "1")
    for target, partials in pairs:
        size = w.plan.layout(partials, w.target).instance
        itemsize = w.plan.buffers[target].dtype.itemsize
        w.exchange(code, target, w.tiles[partials], size * itemsize, read=False)


def _fold(w: DpuWriter, code: Code, node: OnlineCombine, part: str) -> None:
    """Slot 0 of every partial buffer merged with slot `part`, row by row."""
    run = w.plan.buffers[node.partials]
    rows = {d: w.names(f"#row:{d}", d) for d in run.dims}
    exp = w.math_function("expf")
    depth = code.depth
    for d, var in rows.items():
        code(f"for ({w.index_type} {var} = 0; {var} < {run.shape[run.dims.index(d)]}; "
             f"{var}++)")
        code.depth += 1
    with code.block("", "one row: the two sides' maxima, then each sum"):
        first, other = _places(w, node.partials, part, {})
        a, b, top = (w.names(f"#{n}", n) for n in ("m_a", "m_b", "m_top"))
        code(f"const float {a} = {first}, {b} = {other};")
        code(f"const float {top} = {a} > {b} ? {a} : {b};")
        factors: dict[float, tuple[str, str]] = {}  # coefficient -> both sides' factors
        for merged in node.sums:
            if merged.coeff not in factors:
                coeff = w.literal(float(merged.coeff)).code
                factors[merged.coeff] = (w.names(f"#f_a:{merged.coeff}", "f_a"),
                                         w.names(f"#f_b:{merged.coeff}", "f_b"))
                for side, m in zip(factors[merged.coeff], (a, b), strict=True):
                    code(f"const float {side} = {m} == {top} ? 1.0f : "
                         f"{exp}({coeff} * ({top} - {m}));")
            fa, fb = factors[merged.coeff]
            sums = w.plan.buffers[merged.partials]
            rest = {d: w.names(f"#col:{d}", d) for d in sums.dims if d not in rows}
            inner = code.depth
            for d, var in rest.items():
                code(f"for ({w.index_type} {var} = 0; {var} < {sums.shape[sums.dims.index(d)]}"
                     f"; {var}++)")
                code.depth += 1
            mine, theirs = _places(w, merged.partials, part, rest)
            code(f"{mine} = {mine} * {fa} + {theirs} * {fb};")
            code.depth = inner
        code(f"{first} = {top};")
    code.depth = depth


def _places(w: DpuWriter, partials: str, part: str, rest: dict[str, str]) -> tuple[str, str]:
    """The element at the current row (and columns `rest`) of slot 0 and of slot
    `part` of a partial buffer."""
    decl = w.plan.buffers[partials]
    lay = w.plan.layout(partials, w.target)
    at = {d: f"#col:{d}" if d in rest else f"#row:{d}" for d in decl.dims}
    index = w.index(affine_sum(scale(term(at[d]), s)
                               for d, s in zip(decl.dims, lay.strides, strict=True)))
    tile = w.tiles[partials]
    return f"{tile}[{index}]", f"{tile}[{part} * {lay.instance} + {index}]"


def host_merge(w: HostWriter, code: Code, plan: KernelPlan, node: OnlineCombine) -> None:
    """The DPUs' (or ranks') partial running statistics merged on the host, row by row
    (FlashDecoding's split-KV combine): the common maximum of the row over the tensor's
    value and every partial, then each sum rescaled to it, its own value by
    exp(c (m - m_old)) and each partial's by exp(c (m - m_k)) (1 where a side holds m:
    also -inf against -inf, a unit that saw only padding)."""
    what = f"online combine {node.partials}"
    pairs = [(node.running, node.partials), *((s.target, s.partials) for s in node.sums)]
    count = 0
    for target, partials in pairs:
        lay, whole = plan.layout(partials, w.target), plan.layout(target, w.target)
        decl = plan.buffers[target]
        if not decl.dtype.is_float or whole.partials or lay.shape != whole.shape \
                or lay.row != whole.row or not lay.partials:
            raise EmitError(f"kernel {plan.kernel.name}: {what}: expected float partial "
                            f"results of the whole {target} on the host, got {partials}")
        count = count or math.prod(lay.partials)
        if math.prod(lay.partials) != count:
            raise EmitError(f"kernel {plan.kernel.name}: {what}: expected the same number "
                            f"of partial results of every statistic")
    run = plan.buffers[node.partials]
    rows = {d: w.names(f"#row:{d}", d) for d in run.dims}
    code.comment(f"merge the {count} partial running statistics in {node.partials} and "
                 f"beside it: each rescaled to the common maximum of {node.running} "
                 f"(FlashDecoding's split-KV combine)")
    exp = "expf"
    depth = code.depth
    for d, var in rows.items():
        code(f"for (size_t {var} = 0; {var} < {run.shape[run.dims.index(d)]}; {var}++)")
        code.depth += 1
    with code.block("", "one row: the common maximum, then every sum rescaled to it"):
        mine, theirs = _host_places(w, plan, node.running, node.partials, rows)
        old, top, mk = (w.names(f"#host:{n}", n) for n in ("m_old", "m_top", "m_k"))
        part = w.names("#host:part", "part")
        code(f"const float {old} = {mine};")
        code(f"float {top} = {old};")
        with w.for_loop(code, part, count):
            code(f"if ({theirs} > {top}) {top} = {theirs};")
        factors: dict[float, str] = {}
        for merged in node.sums:  # the tensor's own share first
            if merged.coeff not in factors:
                factors[merged.coeff] = w.names(f"#host:f:{merged.coeff}", "f_own")
                coeff = w.literal(float(merged.coeff)).code
                code(f"const float {factors[merged.coeff]} = {old} == {top} ? 1.0f : "
                     f"{exp}({coeff} * ({top} - {old}));")
            _host_sum(w, plan, code, merged.target, merged.partials, rows, "", factors[
                merged.coeff])
        with w.for_loop(code, part, count):
            code(f"const float {mk} = {theirs};")
            shares: dict[float, str] = {}
            for merged in node.sums:
                if merged.coeff not in shares:
                    shares[merged.coeff] = w.names(f"#host:fk:{merged.coeff}", "f_k")
                    coeff = w.literal(float(merged.coeff)).code
                    code(f"const float {shares[merged.coeff]} = {mk} == {top} ? 1.0f : "
                         f"{exp}({coeff} * ({top} - {mk}));")
                _host_sum(w, plan, code, merged.target, merged.partials, rows, part,
                          shares[merged.coeff])
        code(f"{mine} = {top};")
    code.depth = depth


def _host_sum(w: HostWriter, plan: KernelPlan, code: Code, target: str, partials: str,
              rows: dict[str, str], part: str, factor: str) -> None:
    """One row of a merged sum: scaled by `factor` (`part` empty), or the partial `part`
    times `factor` added."""
    decl = plan.buffers[partials]
    rest = {d: w.names(f"#col:{d}", d) for d in decl.dims if d not in rows}
    depth = code.depth
    for d, var in rest.items():
        code(f"for (size_t {var} = 0; {var} < {decl.shape[decl.dims.index(d)]}; {var}++)")
        code.depth += 1
    mine, theirs = _host_places(w, plan, target, partials, {**rows, **rest}, part or "0")
    code(f"{mine} *= {factor};" if not part else f"{mine} += {theirs} * {factor};")
    code.depth = depth


def _host_places(w: HostWriter, plan: KernelPlan, target: str, partials: str,
                 at: dict[str, str], part: str | None = None) -> tuple[str, str]:
    """The element at the current indices `at` of the tensor `target` and of partial
    `part` of its partials on the host (both laid out alike, partials outermost)."""
    decl = plan.buffers[partials]
    lay = plan.layout(partials, w.target)
    index = affine_sum(scale(term(at[d]), s) for d, s in zip(decl.dims, lay.strides,
                                                             strict=True))
    part = part if part is not None else w.names("#host:part", "part")
    dest, source = w.buffer(plan, target), w.buffer(plan, partials)
    return (f"{dest}[{w.affine(index).code}]",
            f"{source}[{part} * {lay.instance} + {w.affine(index).code}]")
