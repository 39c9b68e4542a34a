"""Tiled cores with a DST register file (Tenstorrent): the constraint families `tile`,
`capacity.dst` and `count.buffers`, and the subblock decisions.

On a model with `tile = E` (`synth.tiles`) data lives in E x E tiles: every dimension a
tensor is tiled along (its last two indices; the one index of a vector, whose tiles hold
E*E elements) has a compute tile that is a whole number of tiles (`tile`). The leading
(batch, head) indices of tensors of rank 3 and 4 are not tiled: a block holds one of
each (`tile`), as tt-lang's 2-D blocks do (`synth.emit.ttlang`).

The compute of a kernel runs over *subblocks* of its output block held in the DST register
file: `sub.<kernel>.<dim>` (a number of tiles, dividing the block) for the kernel's last two
tiled parallel dimensions (height and width; tt-metal's out_subblock_h x out_subblock_w).
Per position of the subblock, the tiles live at once in DST are counted from the kernel's
statements in order, by what each kind of operation reads (`live_tiles`):

- matmul, reductions and FPU binary ops whose operands are all in buffers read them there
  (the unpacker feeds the FPU from L1): only their result or accumulator takes a tile;
- an op with an operand already in DST (the result of the statement before) runs on the
  SFPU, which reads its operands from DST: each operand not yet there is loaded (a tile);
- unary ops (exp, sqrt, recip, a copy or transpose) work in place;
- a result some later statement reads stays in DST unless that reader needs it in a buffer
  (matmul, reductions), so it is packed out.

`capacity.dst`: sub_h x sub_w x (peak live tiles) <= DST tiles for the kernel's widest dtype
in the model's sync mode. `count.buffers`: the dataflow buffers of a kernel (one per tensor
it touches and the second ones its loop nest needs, `synth.ir.dataflow`), at most
`MAX_BUFFERS` (the simulator's and tt-metal's limit per core).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from synth.constraints import expr as ex
from synth.constraints.space import KernelSpec, NamedConstraint

if TYPE_CHECKING:
    from synth.constraints.cost import KernelTerms, Model
from synth.errors import InputError
from synth.tiles import block_tiles
from synth.workload import BinOp, Call, Statement, Workload, accesses

MAX_BUFFERS = 32  # dataflow (circular) buffers per core [tt-mlir; tt-lang-sim warns past it]


def subblock_decision(kernel: str, dim: str) -> str:
    """`sub.s.i` is kernel s's DST subblock along i, in tiles."""
    return f"sub.{kernel}.{dim}"


def subblock_meanings(env: Mapping[str, int], used: Collection[str]) -> dict[str, str]:
    """What each subblock decision of a used kernel means, for the report."""
    out = {}
    for name in env:
        if name.startswith("sub."):
            kernel, dim = name[len("sub."):].rsplit(".", 1)
            if kernel in used:
                out[name] = (f"DST subblock of kernel {kernel} along {dim}: tiles computed "
                             f"per DST acquire")
    return out


@dataclass(frozen=True)
class Liveness:
    """The most tiles live in DST per subblock position, and which values they are."""

    peak: int
    values: tuple[str, ...]  # at the peak: results held and operands loaded
    statement: str  # where the peak is


def tiled_units(workload: Workload, kernel: KernelSpec, edge: int) -> dict[str, int]:
    """Each dimension of `kernel` some tensor is tiled along -> elements per tile along it
    (`synth.tiles.tile_units`)."""
    units = kernel.tile_units(edge)
    return {d: u for d, u in units.items() if d in kernel.dims}


def subblock_dims(workload: Workload, kernel: KernelSpec, edge: int) -> tuple[str, ...]:
    """The kernel's last two tiled parallel dimensions: the subblock's height and width."""
    units = tiled_units(workload, kernel, edge)
    return tuple(d for d in kernel.dims if d not in kernel.reduced and d in units)[-2:]


def op_kind(stmt: Statement) -> str:
    """matmul, reduce, binary or unary: what decides where the operands are read."""
    if stmt.reduced:
        expr = stmt.expr
        return "matmul" if isinstance(expr, BinOp) and expr.op == "*" else "reduce"
    if isinstance(stmt.expr, Call) or len(list(accesses(stmt.expr))) <= 1:
        return "unary"
    return "binary"


def live_tiles(kernel: KernelSpec) -> Liveness:
    """The peak of DST tiles per subblock position over the kernel's statements."""
    held: list[str] = []  # results in DST, in order
    best = Liveness(0, (), kernel.statements[0].name)
    stmts = kernel.statements
    for index, stmt in enumerate(stmts):
        kind = op_kind(stmt)
        later = stmts[index + 1:]
        operands = list(stmt.inputs)
        in_dst = [t for t in operands if t in held]
        loads = [] if kind in ("matmul", "reduce") or (kind == "binary" and not in_dst) \
            else [t for t in operands if t not in held]
        if kind == "unary":
            loads = loads[:1] if not in_dst else []
        dying = [t for t in in_dst if not any(t in s.inputs for s in later)]
        result = [] if dying or (kind == "unary" and loads) else [stmt.target]
        values = (*held, *loads, *result)
        if len(values) > best.peak:
            best = Liveness(len(values), tuple(values), stmt.name)
        held = [t for t in held if t not in dying]
        if stmt.target not in held:
            held.append(stmt.target)
        readers = [s for s in later if stmt.target in s.inputs]
        if not readers or any(op_kind(s) in ("matmul", "reduce") for s in readers):
            held.remove(stmt.target)  # packed out to a buffer
    return best


def dst_dtype(workload: Workload, kernel: KernelSpec) -> str:
    """The kernel's widest dtype: 32-bit values halve DST."""
    dtypes = [workload.tensors[u.tensor].dtype for u in kernel.uses]
    return max(dtypes, key=lambda d: d.itemsize).value


def with_subblocks(workload: Workload, kernel: KernelSpec, edge: int, capacity: int,
                   domains: dict[str, tuple[int, ...]]) -> dict[str, ex.Int]:
    """The subblock decisions of `kernel` (added to `domains`): dim -> term, in tiles."""
    out: dict[str, ex.Int] = {}
    for dim in subblock_dims(workload, kernel, edge):
        name = subblock_decision(kernel.name, dim)
        domains[name] = tuple(v for v in (1, 2, 4, 8, 16) if v <= capacity)
        out[dim] = ex.Var(name)
    return out


def dst_constraints(workload: Workload, kernel: KernelSpec, block: dict[str, ex.Int],
                    capacity: int, dtype: str, sync: str, edge: int,
                    subs: dict[str, ex.Int], domains: dict[str, tuple[int, ...]]
                    ) -> list[NamedConstraint]:
    """`tile` (whole tiles per block), the subblocks dividing the block, and `capacity.dst`."""
    units = tiled_units(workload, kernel, edge)
    out = [NamedConstraint(
        "tile", f"kernel {kernel.name}: the block of {dim} is whole {edge}x{edge} tiles "
        f"({unit} elements)", ex.Cmp(ex.mod(block[dim], unit), "==", ex.ZERO))
        for dim, unit in units.items()]
    out += [NamedConstraint(
        "tile", f"kernel {kernel.name}: a block holds one {dim} (a batch dimension: "
        "tt-lang blocks are 2-D, a tensor's leading dimensions are walked one at a time)",
        ex.Cmp(block[dim], "==", ex.ONE)) for dim in kernel.dims if dim not in units]
    for dim, sub in subs.items():
        assert isinstance(sub, ex.Var)
        out += [NamedConstraint(  # sub != v or the block is whole subblocks of v tiles
            "tile", f"kernel {kernel.name}: the DST subblock along {dim} divides the block",
            ex.AnyOf((ex.Cmp(sub, "<", ex.const(v)), ex.Cmp(sub, ">", ex.const(v)),
                      ex.Cmp(ex.mod(block[dim], v * units[dim]), "==", ex.ZERO))))
            for v in domains[sub.name] if v > 1]
    live = live_tiles(kernel)
    shape = " x ".join(subblock_decision(kernel.name, d) for d in subs) or "1"
    out.append(NamedConstraint(
        "capacity.dst",
        f"kernel {kernel.name}: subblock ({shape}) tiles x {live.peak} live per tile "
        f"({', '.join(live.values)} at {live.statement}) fit {capacity} DST tiles "
        f"({dtype}, {sync} sync)",
        ex.Cmp(ex.mul(live.peak, *subs.values()), "<=", ex.const(capacity))))
    return out


def count_constraints(kt: KernelTerms, workload: Workload) -> list[NamedConstraint]:
    """At most `MAX_BUFFERS` dataflow buffers per core: one per tensor the kernel touches
    and the second ones its loop nest needs (`tiled.dataflow_terms`: a loaded block
    computed into, a stored block read again, an accumulator across a loop)."""
    from synth.constraints.tiled import dataflow_terms
    terms = dataflow_terms(kt, workload)
    per_tensor = len(kt.kernel.uses)
    extra = ", ".join(terms.fixed)
    maybe = ", ".join(terms.maybe)
    detail = "".join((f" + {extra}" if extra else "",
                      f" + {maybe} when a loop accumulates into it" if maybe else ""))
    return [NamedConstraint(
        "count.buffers", f"kernel {kt.kernel.name}: {per_tensor} dataflow buffers (one "
        f"per tensor){detail} fit the {MAX_BUFFERS} a core has",
        ex.Cmp(terms.count, "<=", ex.const(MAX_BUFFERS)))]


def tiled_constraints(kt: KernelTerms, workload: Workload,
                      domains: dict[str, tuple[int, ...]]) -> list[NamedConstraint]:
    """The families of this module for one kernel on a tiled model (none elsewhere); the
    subblock decisions go into `domains`."""
    tiling = kt.hw.compute.tiling
    if not tiling.edge:
        return []
    kernel = kt.kernel
    innermost = len(kt.slots) - 1
    block = {d: kt.tile(d, innermost) for d in kernel.dims}
    out = count_constraints(kt, workload) + local_reduction_constraints(kt)
    if kt.packed is not None:  # tiles are the matrix engine's blocks: always packed
        out.append(NamedConstraint("implied", f"kernel {kernel.name}: a matmul of tiles runs "
                                   "on the matrix engine", ex.Cmp(kt.packed, "==", ex.ONE)))
    if not tiling.dst:
        return out + dst_constraints(workload, kernel, block, 0, "", "", tiling.edge, {},
                                     domains)[:-1]
    dtype = dst_dtype(workload, kernel)
    capacity = tiling.dst_tiles(dtype)
    if capacity is None:
        raise InputError(f"the hardware model gives no DST capacity for dtype {dtype} "
                         f"([compute.dst] {tiling.sync}), which kernel {kernel.name} uses")
    subs = with_subblocks(workload, kernel, tiling.edge, capacity, domains)
    return out + dst_constraints(workload, kernel, block, capacity, dtype, tiling.sync,
                                 tiling.edge, subs, domains)


def model_dram_tiles(model: Model, env: Mapping[str, int]) -> tuple[int, int]:
    """DRAM tiles the cost model moves at `env`: per chosen kernel and tensor moving into
    the innermost memory, its copies per unit (`cost.transfer_count`) x units x tiles per
    block; reads for tensors read, writes for tensors written (what `--emit ttlang`'s
    simulator counts), in tiles as `synth.tiles.block_tiles` counts them."""
    from synth.constraints.cost import KernelTerms, transfer_count
    edge = model.hw.compute.tiling.edge or 1
    read = written = 0
    for kernel in model.selected(env):
        kt = KernelTerms(kernel, model.factors, model.hw)
        slot = len(kt.slots) - 1
        units = ex.evaluate(ex.mul(*(kt.units(s) for s in kt.spatial_inside(-1))), env) \
            if kt.spatial_inside(-1) else 1
        per_dim = tiled_units(model.workload, kernel, edge)
        for use in kt.moving():
            copies = ex.evaluate(transfer_count(kt, use, slot), env) * units
            block = {d: ex.evaluate(kt.tile(d, slot), env) for d in use.indices}
            tiles = copies * block_tiles(use.indices, block, per_dim)
            read += tiles if use.read else 0
            written += tiles if use.written else 0
    return read, written


def model_dataflow(model: Model, env: Mapping[str, int]) -> dict[str, tuple[int, int]]:
    """Per chosen kernel, the dataflow buffers the cost model counts at `env` and their
    bytes on one core (`count.buffers` and `capacity.<innermost>`: a block per tensor
    times its block count, and `tiled.dataflow_terms`' second buffers), which
    `synth.ir.dataflow.kernel_usage` derives from the loop nest and the tt-lang emitter
    declares."""
    import dataclasses

    from synth.constraints.cost import KernelTerms, element_bytes
    from synth.constraints.tiled import block_bytes, dataflow_terms
    out = {}
    mem = model.hw.memories[-1]
    for kernel in model.selected(env):
        kt = dataclasses.replace(KernelTerms(kernel, model.factors, model.hw),
                                 buffered=model.buffers.get(kernel.name, {}))
        slot = len(kt.slots) - 1
        blocks = kt.buffered.get(slot, ex.ONE)
        terms = dataflow_terms(kt, model.workload)
        used = ex.add(terms.extra_bytes, *(ex.mul(block_bytes(
            kt, use, slot, element_bytes(kt, model.workload, use, mem)),
            ex.ONE if use.local else blocks) for use in kt.resident(slot)))
        out[kernel.name] = (ex.evaluate(terms.count, env), ex.evaluate(used, env))
    return out


def local_reduction_constraints(kt: KernelTerms) -> list[NamedConstraint]:
    """`reduce.local`: a reduced dimension is not split across cores. A tt-lang
    operation has no step that combines partial results of several cores (that would be
    a second operation, or a gather over the NoC that this model does not price)."""
    from synth.constraints.space import SlotKind
    out = []
    for dim in kt.kernel.reduced:
        for slot, info in enumerate(kt.slots):
            if info.kind is SlotKind.SPATIAL:
                out.append(NamedConstraint(
                    "reduce.local", f"kernel {kt.kernel.name}: the reduction over {dim} "
                    f"stays on one core along {info.name}",
                    ex.Cmp(kt.f(dim, slot), "==", ex.ONE)))
    return out
