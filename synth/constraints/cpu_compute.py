"""The CPU's compute terms (models with `compute.vector_tiles`: `cpu`): vector or scalar
instructions by the register tile, the folds of vector accumulators, the dependence
chains of accumulations under the out-of-order window, and the share of the registers'
own loads and stores that adds to compute (`exposed_cost`). Builds on
`synth.constraints.cost`; the per-statement prices are `synth.constraints.roofline`'s."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping, Sequence

from synth.constraints import expr as ex
from synth.constraints import roofline
from synth.constraints.cost import (
    KernelTerms,
    _memory_slots,
    around_points,
    copy_loops,
    transfer_cost,
    transfer_count,
)
from synth.hardware import DIVIDER_OPS, Memory
from synth.workload import Num, ReduceOp, Statement, Workload, op_classes


def vector_compute_cost(kt: KernelTerms, workload: Workload) -> ex.Int:
    """`compute_cost` on a CPU with vector registers (`compute.vector_tiles`): vector
    or scalar instructions by the register tile, and no faster than the dependence
    chains of its accumulations allow (see `synth.constraints.roofline`)."""
    compute = kt.hw.compute
    innermost = len(kt.slots) - 1
    vector = kt.kernel.vector
    width = {s.name: roofline.lanes(s, vector, workload, compute) for s in kt.kernel.statements}
    whole = (roofline.whole_vectors(kt.tile(vector, innermost), max(width.values()),
                                    kt.factors.domains)
             if vector is not None else True)

    def either(vectorised: ex.Int, scalar: ex.Int) -> ex.Int:
        return vectorised if vectorised == scalar else ex.select(whole, vectorised, scalar)

    def per_point(stmts: Sequence[Statement], vectorised: bool) -> int:
        return sum(roofline.point_ps(s, compute, width[s.name] if vectorised else 1)
                   for s in stmts)

    points = kt.sequential_points()
    folds = [fold_cost(kt, s, vector, width[s.name]) for s in kt.kernel.core
             if vector is not None and vector in s.reduced and width[s.name] > 1]
    issue = either(ex.add(ex.mul(per_point(kt.kernel.core, True), points), *folds),
                   ex.mul(per_point(kt.kernel.core, False), points))
    chains = [either(chain_cost(kt, s, vector if width[s.name] > 1 else None, width[s.name],
                                routine_instructions(kt, s, width)),
                     chain_cost(kt, s, None, 1,
                                routine_instructions(kt, s, dict.fromkeys(width, 1))))
              for s in kt.kernel.core if s.reduced and roofline.accumulate_ps(s, compute)]
    if kt.kernel.online is not None:  # each statement over its own points; its own chains
        from synth.constraints.online_terms import core_compute, step_chains, step_prices
        prices, step_folds = step_prices(kt, workload, {s.name: per_point([s], True)
                                                        for s in kt.kernel.core})
        issue = either(ex.add(core_compute(kt, prices), *folds, *step_folds,
                              *step_chains(kt, prices)),
                       core_compute(kt, {s.name: ex.const(per_point([s], False))
                                         for s in kt.kernel.core}))
        chains = []
    around = [either(ex.mul(per_point([s], True), around_points(kt, s)),
                     ex.mul(per_point([s], False), around_points(kt, s)))
              for s in kt.kernel.prologue + kt.kernel.epilogue]
    return ex.add(ex.maximum(issue, *chains), *around)


# the vector math routines of synth_vec.h: long chains of dependent FMAs each
ROUTINES = frozenset({"exp", "log", "tanh"})


def fold_cost(kt: KernelTerms, stmt: Statement, vector: str, lanes: int) -> ex.Int:
    """Folding the vector accumulators of `stmt`, a reduction along the vector dimension,
    into its target (`KernelWriter.fold`): each time the target's register tile leaves
    the registers, per element of it, its vector accumulators (one per vector of the
    tile along the vector dimension) combine into one, whose lanes then fold pairwise
    (`vsum_f32` and its kin in synth_vec.h: halves, then quarters, ...), log2(lanes)
    steps of a cross-lane shuffle (`compute.shuffle_cycles`: one port runs them, so one
    a cycle where a `mov` issues two) and the operation each; the result joins the
    target with one more operation. (The lanes folded one after another in lane order
    cost a chain of `lanes` operations and ran 1.8x this term's old price of that chain:
    RESULTS.md, "Folds, packed panels". A fold of 1, 2 or 4 vectors after each tile of
    exps added 6.5, 6.9 and 8.1 cycles, priced 4.8, 5.4 and 6.5 with the shuffle at a
    `mov`'s 0.5, 6.8, 7.4 and 8.5 at 1: RESULTS.md, "Cost fidelity round 4".) A max or
    min folds its lanes with the ISA's one instruction (`_mm512_reduce_max_ps`: vmaxps),
    priced as an add: a vhmax_f32 ran 5.2 cycles, a vsum_f32 4.7.

    The shuffles cost `shuffle_cycles` (calibrated after each vector of exps) beside a
    vector math routine (`ROUTINES`: chains of dependent FMAs that fill the out-of-order
    window); in a kernel without one the folds of successive tiles run side by side and a
    shuffle costs a `mov`. (softmax's max kernel folding every vector of x ran 3.8 cycles
    a vector, 0.058 ms for 2^20 floats, priced 9 with the calibrated shuffle; 8
    independent folds alone ran 2.6 cycles each: RESULTS.md, "Folds without exps".)"""
    innermost = len(kt.slots) - 1
    use = kt.kernel.use(stmt.target)
    elements = ex.mul(transfer_count(kt, use, innermost),
                      *(kt.tile(d, innermost) for d in use.indices))
    op = roofline.point_ps(dataclasses.replace(stmt, expr=Num(0)), kt.hw.compute, 1)
    routines = any(op_class in ROUTINES for s in kt.kernel.statements
                   for op_class in op_classes(s.expr))
    shuffle = (kt.hw.compute.shuffle_ps(stmt.dtype) if routines
               else kt.hw.compute.point_ps(Counter({"mov": 1}), stmt.dtype, 1))
    lane_op = (kt.hw.compute.point_ps(Counter({"add": 1}), stmt.dtype, 1)
               if stmt.op in (ReduceOp.MAX, ReduceOp.MIN) else op)
    steps = max(lanes - 1, 0).bit_length()  # ceil(log2(lanes))
    vectors = ex.ceil_div(kt.tile(vector, innermost), lanes)  # exact where it is vectorised
    return ex.add(ex.mul(steps * (lane_op + shuffle), elements), ex.mul(op, elements, vectors))


def chain_cost(kt: KernelTerms, stmt: Statement, vector: str | None, lanes: int,
               routine: int = 0) -> ex.Int:
    """The time the accumulations of `stmt` (a core reduction) take by their dependences:
    each accumulator's updates in a row (`chain_points`) at the accumulate latency, where
    the out-of-order core does not find enough other work to fill the wait. It does
    between register tiles: while one tile's chain runs, the next tile's (independent)
    chains start as far as `accumulate_window` vector instructions ahead. With u updates
    per tile of one accumulator, about 1 + window / u chains are in flight, and the
    tile's share of its chain that stays exposed is u / (u + window): over all tiles the
    parallel sum of the chain and of the share the window leaves,

        latency x chain x shared / (chain + shared),
        shared = instructions x (updates per tile) / window

    (no more than the smaller of the two, at least half of it). Measured (one thread, one
    accumulator per 1 x 16 tile, operands from the L1; RESULTS.md, "Chains across register
    tiles"): 1.6, 2.2, 2.5, 3.1, 3.4 cycles per FMA at 64, 128, 256, 512, 1024 updates per
    tile, against 1.3, 2.0, 2.7, 3.2, 3.6 so priced with a window of 128 (the min of the
    two, used before, priced 2.0 and then 4.0 from 128 updates on: attention S=256's PV
    with 256 updates per tile ran 2.7 cycles per FMA where it was priced 4). Written as
    one division: CP-SAT's time on the cpu built-ins was unchanged (the sum written with
    a max took it 1.8-6.7 s on layernorm: RESULTS.md, "Packed operands")."""
    compute = kt.hw.compute
    chain = chain_points(kt, stmt, vector)
    latency = roofline.accumulate_ps(stmt, compute)
    if not compute.accumulate_window:
        return ex.mul(latency, chain)
    instructions = ex.ceil_div(kt.sequential_points(), lanes)
    shared = ex.ceil_div(ex.mul(instructions, updates_per_tile(kt, stmt, vector)),
                         compute.accumulate_window)
    if routine:  # the routines between the tiles' chains take their place in the window
        shared = ex.add(shared, ex.ceil_div(ex.mul(routine, instructions),
                                            compute.accumulate_window))
    return ex.mul(latency, ex.ceil_div(ex.mul(chain, shared), ex.add(chain, shared)))


def routine_instructions(kt: KernelTerms, stmt: Statement, width: Mapping[str, int]) -> int:
    """The vector math routines and divider operations the kernel's prologue and
    epilogue run per vector of `stmt`'s target, in the FMAs of `stmt` that issue in the
    same time (`width`: each statement's elements per instruction). Between the register
    tiles' chains they fill the out-of-order window, and less of the next tiles' chains
    runs beside the current one (`chain_cost`). fa6's samples that fuse the QK^T with its
    epilogue (subtract, exp, sqrt, recip per element; 64 updates per 1 x 16 tile) ran
    0.163-0.164 ms, priced 0.134 without them and 0.167 with; a micro-benchmark of that
    shape ran 165 cycles a tile, 110 without the epilogue (RESULTS.md, "Chains through
    memory"). Other statements' instruction or two per
    vector are within the window's own fit."""
    compute = kt.hw.compute
    lanes = width[stmt.name]
    per_fma = roofline.point_ps(stmt, compute, lanes) * lanes
    long = [s for s in kt.kernel.prologue + kt.kernel.epilogue
            if any(c in ROUTINES or c in DIVIDER_OPS for c in op_classes(s.expr))]
    return round(sum(roofline.point_ps(s, compute, width[s.name]) * lanes
                     for s in long) / per_fma) if long and per_fma else 0


def updates_per_tile(kt: KernelTerms, stmt: Statement, vector: str | None) -> ex.Int:
    """Updates in a row of one accumulator: the reduction's steps inside its register
    tile (but along a vectorised reduced dimension, which are separate accumulators) and
    those of the loops around the tile that no later loop walking the target follows.
    Those are the loops the tile is hoisted above (`transfer_loops`' optional loops) and
    also the ones it cannot be (outside a parallel loop, `copy_loops`' fixed loops): there
    the tile is loaded and stored at every step, and the next step's load waits for the
    store (a chain through memory). fa6's QK^T with its d loop outside the cores' (one
    step per [1 x 16] tile, 262,144 steps) ran 3.3 cycles a step, priced as independent
    tiles (0.5 cycles: RESULTS.md, "Chains through memory")."""
    innermost = len(kt.slots) - 1
    use = kt.kernel.use(stmt.target)
    copies = copy_loops(kt.slots, kt.kernel, innermost)
    loops = (*copies.fixed, *copies.optional)
    steps: list[ex.Int] = [kt.f(d, innermost) for d in kt.kernel.dims
                           if d not in use.indices and d != vector]
    for pos, loop in enumerate(loops):
        if loop.dim in use.indices:
            continue
        walks_later = ex.any_of(ex.greater_than_one(kt.f(lp.dim, lp.slot))
                                for lp in loops[pos:] if lp.dim in use.indices)
        steps.append(ex.select(walks_later, 1, kt.f(loop.dim, loop.slot)))
    return ex.mul(*steps)


def chain_points(kt: KernelTerms, stmt: Statement, vector: str | None) -> ex.Int:
    """Updates in a row of one accumulator of `stmt` (a core reduction) in one unit: its
    points over the independent accumulators, which are the register tile's elements
    of the target and, when vectorised along a reduced dimension (`vector`), that
    dimension's register tile too (a vector accumulator per vector of it)."""
    innermost = len(kt.slots) - 1
    outer = [i for i in kt.temporal() if i != innermost]
    return ex.mul(*(kt.dim_product(d, outer) if d in stmt.indices or d == vector
                    else kt.dim_product(d, kt.temporal()) for d in kt.kernel.dims))


def exposed_cost(kt: KernelTerms, workload: Workload) -> dict[str, ex.Int]:
    """The share `exposed` of an overlapping memory's transfer time that adds to compute,
    keyed like `kernel_cost`'s parts (the memory's rates scaled by the share):

        max(compute + exposed x registers + exposed_c x fills of cache c, ..., l1, l2, l3)

    - The vector registers (`reg`, not a cache): their loads, broadcasts and stores are
      instructions of the same core as the FMAs and overlap them only in part; the rest
      hides behind compute, so the kernel's part for them is this term alone (their whole
      time is not in the max: it would take over only where they move over 3x compute's
      time, and as a term of its own it tripled CP-SAT's time on attention at S=4096).
      Measured per kernel (benchmarks/kernel_times.py): a GEMM whose register tile
      reloads its accumulators every step of the reduction runs in compute + 0.6-0.9 x
      its register moves, not in the longer of the two.
    - A cache: the hardware fills it beside compute, but not wholly in parallel: the
      fills still bound the kernel from below (they stay in the max) and their share
      adds to compute where compute is the longer (`cost.in_max`). On the Xeon of
      benchmarks/RESULTS.md ("Caches that overlap compute in part") whole schedules ran
      that way with half of the L3's and DRAM's fills exposed."""
    out: dict[str, ex.Int] = {}
    for slot, mem in _memory_slots(kt):
        if not (mem.overlap and mem.exposed) or mem.push is not None:
            continue
        parent = kt.hw.parent(mem)
        out[f"transfer:{parent.name}->{mem.name}"] = transfer_cost(
            kt, workload, _scaled(mem, mem.exposed), slot)
    return out


def _scaled(mem: Memory, share: float) -> Memory:
    """`mem` with every time it prices a transfer by scaled by `share`."""
    def times(ps: int) -> int:
        return round(ps * share)
    return dataclasses.replace(
        mem, ps_per_byte=times(mem.ps_per_byte), store_ps_per_byte=times(mem.store_ps_per_byte),
        latency_ps=times(mem.latency_ps),
        write_latency_ps=None if mem.write_latency_ps is None else times(mem.write_latency_ps),
        run_latency_ps=times(mem.run_latency_ps), aliased_read_ps=times(mem.aliased_read_ps),
        aliased_write_ps=times(mem.aliased_write_ps))
