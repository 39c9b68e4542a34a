"""The online rewrite's terms in the one cost model (see `synth.constraints.online`).

A kernel that runs online (`KernelSpec.online`) has its own constraint group `online`:
the inner dimensions of its pass are whole in every compute tile (at each step the
running maximum of a row sees the whole row of scores); and `online.split`: the pass is
split across units only where their partial running statistics are merged, on the device
(UPMEM tasklets, `split_constraints`; the merge's price `merge_cost`) or on the host
(UPMEM DPUs and ranks; `host_merge_cost`). Its price: each
statement of the pass runs over its own points only (not over the kernel's full product
of dimensions), and at each step over the pass dimension every row pays the rescale:
the previous maximum kept, one subtract, multiply and exp for the factor, and one
multiply per element of each sum it corrects (`rescale_cost`); the previous maximum is
a tile of the rows in the innermost memory (`footprint`). Its saving is not a term: the
scores and exponentials of the pass are local to the kernel, so they are never stored
or moved.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping

from synth.constraints import expr as ex
from synth.constraints import roofline
from synth.constraints.cost import (
    KernelTerms,
    Model,
    buffer_bytes,
    tensor_transfer_cost,
    transfer_count,
    when_chosen,
)
from synth.constraints.online import step_vector, transposed_operand
from synth.constraints.space import NamedConstraint, SlotKind, TensorUse, unsplit_reason
from synth.hardware import Memory
from synth.vectors import contraction, vectorisable
from synth.workload import Num, Statement, Workload


def online_constraints(kt: KernelTerms) -> list[NamedConstraint]:
    """The group `online` of an online kernel (nothing for the others): its inner
    dimensions whole in every compute tile (`_whole_inner`), its pass split across units
    only where they merge their running statistics on the device (`split_constraints`)."""
    if kt.kernel.online is None:
        return []
    return _whole_inner(kt) + split_constraints(kt)


def _whole_inner(kt: KernelTerms) -> list[NamedConstraint]:
    plan = kt.kernel.online
    assert plan is not None
    out = []
    innermost = len(kt.slots) - 1
    name, where = kt.kernel.name, kt.slots[innermost].name
    for dim in plan.inner:
        ext = kt.factors.extents[(name, dim)]
        out.append(NamedConstraint(
            "online", f"kernel {name}: {dim} whole in every {where} tile (each step of the "
            f"running maximum {plan.target} sees whole rows)",
            ex.Cmp(kt.f(dim, innermost), "==", ext)))
    return out


def split_constraints(kt: KernelTerms) -> list[NamedConstraint]:
    """Group `online.split`. The pass over j may be split across the units of a level
    only where their partial running statistics are merged (FlashDecoding's combine,
    `ir.nodes.OnlineCombine`): on the device, at a level whose units share a memory below
    the root (UPMEM tasklets: WRAM; `combines.device_combine_slots`) with the combine
    there chosen on the device; or on the host, at a level whose units hand their
    partials to it over its pushes (UPMEM ranks and DPUs: `combines.host_merges`; priced
    by `host_merge_cost`). At a device level both ways: a factor of j above 1 forces
    `combine.<kernel>.<level>` = 1 (its units' partials do not go to the host one by
    one), and with the combine on the device the factor is free. At any other level (a
    CPU's cores, AIE and Tenstorrent cores: no shared memory below the root, no host
    pushes) the factor is 1."""
    from synth.constraints.combines import (
        combine_decision,
        device_combine_slots,
        host_merges,
    )
    plan = kt.kernel.online
    assert plan is not None
    name, out = kt.kernel.name, []
    shared = device_combine_slots(kt)
    for slot, kind in enumerate(kt.slots):
        factor = kt.f(plan.dim, slot)
        if kind.kind is not SlotKind.SPATIAL or factor == ex.ONE:
            continue
        on_device = kt.combined.get(slot)
        if slot in shared and on_device is not None:
            out.append(NamedConstraint(
                "online.split", f"kernel {name}: the pass over {plan.dim} splits across "
                f"{kind.name} units only when they merge their running statistics in "
                f"{shared[slot].name} ({combine_decision(name, kind.name)}=1)",
                ex.AnyOf((ex.Cmp(factor, "==", ex.ONE),
                          ex.Cmp(on_device, "==", ex.ONE)))))
            continue
        if host_merges(kt.hw, kind.level_index):
            continue  # the host merges them
        out.append(NamedConstraint(
            "online.split", unsplit_reason(kt.kernel, kind.name).removeprefix(
                "online.split: "), ex.Cmp(factor, "==", ex.ONE)))
    return out


def whole_pass_constraints(model: Model, emit: str) -> list[NamedConstraint]:
    """Group `online.split` for `--emit TARGET` whose emitter writes no merge of partial
    running statistics (`emit.targets.MERGES_ONLINE`: only UPMEM's does): every online
    kernel's pass runs in one unit where the model would let its units split it."""
    out = []
    for kernel in model.kernels:
        plan = kernel.online
        if plan is None:
            continue
        for slot, kind in enumerate(model.slots):
            factor = model.factors.of(kernel.name, plan.dim, slot)
            if kind.kind is not SlotKind.SPATIAL or factor == ex.ONE:
                continue
            level = model.slots[slot].name
            out.append(when_chosen(model.chosen.get(kernel.name, ex.ONE), NamedConstraint(
                "online.split", f"kernel {kernel.name}: the pass over {plan.dim} runs in "
                f"one {level} unit (--emit {emit}: that emitter does not merge partial "
                f"running statistics; --emit upmem does)", ex.Cmp(factor, "==", ex.ONE))))
    return out


def statement_points(kt: KernelTerms, stmt: Statement) -> ex.Int:
    """Points of `stmt` one innermost unit runs: its own dimensions only."""
    return ex.mul(*(kt.dim_product(d, kt.temporal()) for d in stmt.dims))


def row_steps(kt: KernelTerms) -> ex.Int:
    """Rows times steps over the pass dimension one innermost unit runs: how many times
    a row's running maximum moves."""
    plan = kt.kernel.online
    assert plan is not None
    innermost = len(kt.slots) - 1
    steps = [s for s in kt.temporal() if s != innermost]
    return ex.mul(*(kt.dim_product(r, kt.temporal()) for r in plan.rows),
                  kt.dim_product(plan.dim, steps))


def rescale_ops(kt: KernelTerms) -> Counter[str]:
    """Operations per row per step: keep the previous maximum, the factor
    exp(c (m_new - m_old)) (a subtract, a multiply, an exp), and one multiply per element
    of each corrected sum in that row."""
    plan = kt.kernel.online
    assert plan is not None
    elements = 0
    for target in plan.rescaled:
        stmt = next(s for s in kt.kernel.statements if s.target == target)
        extents = [kt.kernel.extents[d] for d in stmt.indices if d in plan.inner]
        elements += ex.evaluate(ex.mul(*(ex.const(n) for n in extents)), {})
    return Counter({"mov": 1, "add": 1, "exp": 1, "mul": 1 + elements})


def rescale_cost(kt: KernelTerms) -> ex.Int:
    plan = kt.kernel.online
    assert plan is not None
    stmt = next(s for s in kt.kernel.statements if s.name == plan.statement)
    return ex.mul(kt.hw.compute.point_ps(rescale_ops(kt), stmt.dtype), row_steps(kt))


def merge_cost(kt: KernelTerms) -> ex.Int:
    """The rescale of an online kernel's merge (`ir.nodes.OnlineCombine`) where its units
    split the pass and combine on the device: after the barrier, one unit (at
    1/issue_share of the pipeline) folds each unit's partial statistics into the tile
    above in turn, each fold rescaling both sides to their common maximum: twice a step's
    rescale (`rescale_ops`: the factor's subtract, multiply and exp, a multiply per
    element of each sum) per row per partial, each time the tile above is done. The
    maximum and the additions of the sums, the barrier and the partials' exchanges are
    those of any combine on the device (`combines.device_combine_cost`,
    `device_combine_capacity`, `exchanged_on_device`)."""
    from synth.constraints.combines import combines_on_device
    plan = kt.kernel.online
    assert plan is not None
    stmt = next(s for s in kt.kernel.statements if s.name == plan.statement)
    use = kt.kernel.use(plan.target)
    op_ps = kt.hw.compute.point_ps(rescale_ops(kt) + rescale_ops(kt), stmt.dtype)
    total = []
    for slot in kt.combined:
        level = kt.hw.levels[kt.slots[slot].level_index]
        parent = max(i for i in range(slot) if kt.slots[i].kind is SlotKind.TEMPORAL)
        rows = ex.mul(*(kt.tile(r, parent) for r in plan.rows))
        times = transfer_count(kt, use, parent) if parent > 0 else ex.ONE
        once = ex.mul(level.issue_share * op_ps, kt.units(slot, (plan.dim,)), rows)
        total.append(ex.select(combines_on_device(kt, slot, (plan.dim,)),
                               ex.mul(once, times), 0))
    return ex.add(*total)


def host_merge_cost(kt: KernelTerms, workload: Workload) -> ex.Int:
    """The rescale of an online kernel's merge on the host (`ir.nodes.OnlineCombine` in
    the kernel's epilogue) where units that hand their partials to the host (UPMEM ranks
    and DPUs, `combines.host_merges`) split the pass: per partial per row of the running
    maximum, a step's rescale (`rescale_ops`: the factor's subtract, multiply and exp, a
    multiply per element of each sum) at the host's rate. The maximum and the additions
    of the sums are `combines.combine_cost`'s (one op per partial per element); the
    partials' way back is the `mram->host` transfers of their tiles."""
    plan = kt.kernel.online
    assert plan is not None
    stmt = next(s for s in kt.kernel.statements if s.name == plan.statement)
    spatial = [i for i, s in enumerate(kt.slots) if s.kind is SlotKind.SPATIAL]
    partials = ex.mul(*(kt.split_units(s, (plan.dim,)) for s in spatial))
    rows = 1
    for n in workload.tensors[plan.target].shape:
        rows *= n
    op_ps = kt.hw.host.point_ps(rescale_ops(kt), stmt.dtype)
    return ex.select(ex.greater_than_one(partials), ex.mul(op_ps, rows, partials), 0)


def core_compute(kt: KernelTerms, point_ps: dict[str, ex.Int]) -> ex.Int:
    """The pass's compute: each core statement at its cost per point (`point_ps`, by
    statement name) over its own points, and the rescale. Statements over the same
    dimensions but the inner ones (whole in every tile: a constant number of points)
    share one product of factors, their costs per point summed first: a sum of such
    products takes as many values as one (the z3 backend's one-hot lowering of the
    unsummed form ran past its cap once the tasklets split the pass)."""
    plan = kt.kernel.online
    assert plan is not None
    groups: dict[tuple[str, ...], list[ex.Int]] = {}
    for stmt in kt.kernel.core:
        outer = tuple(d for d in stmt.dims if d not in plan.inner)
        inner = [kt.dim_product(d, kt.temporal()) for d in stmt.dims if d in plan.inner]
        groups.setdefault(outer, []).append(ex.mul(point_ps[stmt.name], *inner))
    return ex.add(*(ex.mul(ex.add(*costs), *(kt.dim_product(d, kt.temporal()) for d in outer))
                    for outer, costs in groups.items()), rescale_cost(kt))


def implied_bounds(kt: KernelTerms, pipelines: list[int], compute: ex.Int
                   ) -> list[NamedConstraint]:
    """Redundant (`cost.implied_compute_bounds` for an online kernel): where units share
    a pipeline (UPMEM tasklets), compute takes at least each pass statement's points over
    all of them, at its cheapest cost per point (packed or not): `core_compute` stretched
    by at least their number. Stated per dimension as one product of factors (the points
    one DPU holds), so the solver sees how splitting the pass or the rows across DPUs and
    ranks bounds it."""
    from synth.constraints.intrinsic import packable, statement_point_ps
    plan = kt.kernel.online
    assert plan is not None
    plain = statement_point_ps(kt, False)
    packed = statement_point_ps(kt, True) if packable(kt) else plain
    out = []
    for i in pipelines:
        inside = [*kt.temporal(), i]
        groups: dict[tuple[str, ...], int] = {}
        for stmt in kt.kernel.core:
            least = min(ex.evaluate(plain[stmt.name], {}), ex.evaluate(packed[stmt.name], {}))
            groups[stmt.dims] = groups.get(stmt.dims, 0) + least
        bound = ex.add(*(ex.mul(ps, *(kt.dim_product(d, inside) for d in dims))
                         for dims, ps in groups.items()))
        out.append(NamedConstraint(
            "implied", f"kernel {kt.kernel.name}: compute takes the points of its pass "
            f"statements over all {kt.slots[i].name} units sharing a pipeline",
            ex.Cmp(compute, ">=", bound)))
    return out


def footprint(kt: KernelTerms, itemsize: int) -> ex.Int:
    """Bytes of the previous maximum kept beside the running one in the innermost
    memory (the rows of one compute tile). On a tiled core, none here: the step's
    buffers are dataflow buffers of whole tiles (`tiled.dataflow_terms`)."""
    plan = kt.kernel.online
    if plan is None or kt.hw.compute.tiling.edge:
        return ex.ZERO
    innermost = len(kt.slots) - 1
    return ex.mul(itemsize, *(kt.tile(r, innermost) for r in plan.rows))


# ------------------------------------------------ the step's tiles on a CPU (`vector_tiles`)
#
# On a model whose innermost memory is the vector register file, an online kernel's step
# (FlashAttention-2's: a block of Br query rows against a block of Bc keys, the Q, K, V
# and O blocks with the whole head dimension) does not fit in registers: its innermost
# tiles are the C arrays of the step, on the thread's stack, which is the memory just
# outside the registers (L1). Each statement runs over them as vector loops of its own
# (`online.step_vector`): QK^T as dot products along d, the maximum, exponentials and
# row sum along j, PV along e (the kernel's vector dimension, the C emitter's own code).


def step_in_cache(kt: KernelTerms) -> bool:
    return kt.kernel.online is not None and kt.hw.compute.vector_tiles


def step_capacity(kt: KernelTerms, mem: Memory) -> int:
    """What the innermost tiles of a kernel may take: the memory's usable bytes, or for an
    online kernel on a CPU, those of the memory just outside the registers (its step's
    arrays live there)."""
    if not step_in_cache(kt) or mem.name != kt.hw.memories[-1].name:
        return mem.usable
    outside = [m for m in kt.hw.memories[:-1] if m.level == mem.level]
    return outside[-1].usable if outside else mem.usable


def step_prices(kt: KernelTerms, workload: Workload, vectorised: Mapping[str, int]
                ) -> tuple[dict[str, ex.Int], list[ex.Int]]:
    """Cost per point of each pass statement in vector code (`vectorised`: by the kernel's
    vector dimension), with those that run along a step vector dimension of their own
    priced at its lanes; and the step's other work: the folds of the reductions along
    such a dimension (per element of the target per step, the vector accumulator's lanes
    combined one operation each) and the copies into the step's arrays (`step_copies`)."""
    prices: dict[str, ex.Int] = {name: ex.const(ps) for name, ps in vectorised.items()}
    folds: list[ex.Int] = step_copies(kt, workload) if step_in_cache(kt) else []
    if not step_in_cache(kt):
        return prices, folds
    vector = kt.kernel.vector
    dtypes = {name: t.dtype for name, t in workload.tensors.items()}
    innermost = len(kt.slots) - 1
    steps = [s for s in kt.temporal() if s != innermost]
    for stmt in kt.kernel.core:
        along = step_vector(stmt, vector, vectorisable(stmt, dtypes))
        lanes = kt.hw.compute.lanes.get(stmt.dtype.value, 1)
        if along is None or lanes <= 1:
            continue
        prices[stmt.name] = ex.const(roofline.point_ps(stmt, kt.hw.compute, lanes))
        if along in stmt.reduced:
            op = roofline.point_ps(dataclasses.replace(stmt, expr=Num(0)), kt.hw.compute, 1)
            folds.append(ex.mul(op * lanes, kt.dim_product(along, steps), *(
                kt.dim_product(d, kt.temporal()) for d in stmt.dims if d != along)))
    return prices, folds


# the C emitter's outer products in a step keep at most this many accumulators in a row
# of dependent updates before the step's exposed chain is priced (`step_chains`)
FEW_ACCUMULATORS = 4


def step_chains(kt: KernelTerms, prices: Mapping[str, ex.Int]) -> list[ex.Int]:
    """The accumulation chains of a step's contractions that the rest of the step waits
    for, beyond their own issue (`prices`: cost per point by statement).

    The C emitter runs a step's contraction as a register-blocked outer product in
    vectors along the target's last dimension (`emit.c_online.outer_product`: QK^T along
    j with K transposed, PV along e), its accumulators a block of the step's rows times
    vectors along that dimension (up to 8 x 8, at most 24), each updated once per step of
    the reduced dimensions, `accumulate_latency` apart. With few accumulators (a block
    of rows times vectors of at most four) the updates wait for the latency, not for the
    FMA units, and the step's next statements (the maximum, the exponentials, the
    update of o) need the result: the next block's chain does not start under this
    one's, as it does between the register tiles of a GEMM (`cpu_compute.chain_cost`).
    So where the step's tile of rows times that dimension is at most
    FEW_ACCUMULATORS vectors, the chain (latency x the updates of one accumulator in a
    row: the statement's points over the tile's rows and that dimension) adds to the
    step's compute what it exceeds the contraction's own issue by. (Attention S=256's
    online kernel with a step of 1 x 16 scores, one accumulator of 64 updates, ran
    0.42 ms against 0.19 priced without it: RESULTS.md, "Chains in the online step".)"""
    plan = kt.kernel.online
    if plan is None or not step_in_cache(kt):
        return []
    compute = kt.hw.compute
    vector = kt.kernel.vector
    innermost = len(kt.slots) - 1
    outer = [s for s in kt.temporal() if s != innermost]
    out: list[ex.Int] = []
    for stmt in kt.kernel.core:
        latency = roofline.accumulate_ps(stmt, compute)
        lanes = compute.lanes.get(stmt.dtype.value, 1)
        if contraction(stmt) is None or not latency or lanes <= 1 or not stmt.indices:
            continue
        along = stmt.indices[-1]
        if along != vector and (transposed_operand(stmt) is None
                                or step_vector(stmt, vector, True) is None):
            continue  # not an outer product in vectors along `along`
        issue = ex.evaluate(prices[stmt.name], {}) * lanes  # per vector instruction
        if issue * FEW_ACCUMULATORS >= latency:
            continue  # four accumulators already keep the FMA units busy
        rows = [d for d in stmt.indices if d != along]
        block = [along, *rows[-1:]]  # the dims of the accumulators' block
        chain = ex.mul(*(kt.dim_product(d, outer if d in block else kt.temporal())
                         for d in stmt.dims))
        few = ex.Cmp(ex.mul(*(kt.tile(d, innermost) for d in block)), "<=",
                     ex.const(FEW_ACCUMULATORS * lanes))
        points = statement_points(kt, stmt)
        out.append(ex.select(few, ex.add(ex.mul(latency, chain),
                                         ex.mul(-1, prices[stmt.name], points)), 0))
    return out


def step_copies(kt: KernelTerms, workload: Workload) -> list[ex.Int]:
    """The step's arrays are filled by the core's own loads and stores (the C emitter's
    copies into the thread's stack), not by the caches beside compute: each operand tile
    copied in (and each result tile out) at the registers' bandwidth, but for the pass
    operands read in place (`pass_operand`), and the operand a
    contraction reads transposed (`online.transposed_operand`) copied once more, one
    element per load and store."""
    innermost = len(kt.slots) - 1
    mem = kt.hw.memories[-1]
    out: list[ex.Int] = []
    vector = kt.kernel.vector
    for use in kt.moving():
        if pass_operand(kt, use):
            continue  # read where it lies, through the caches (`stream_cost`)
        itemsize = workload.tensors[use.tensor].dtype.itemsize
        out.append(tensor_transfer_cost(kt, use, mem, innermost, itemsize))
    for stmt in kt.kernel.core:
        moved = transposed_operand(stmt)
        if moved is None or step_vector(stmt, vector, True) is None:
            continue
        use = kt.kernel.use(moved.tensor)
        element = kt.hw.compute.point_ps(Counter({"mov": 2}), stmt.dtype)
        out.append(ex.mul(element, transfer_count(kt, use, innermost),
                          *(kt.tile(d, innermost) for d in use.indices)))
    return out


def pass_operand(kt: KernelTerms, use: TensorUse) -> bool:
    """An operand of the pass that no row indexes (K and V of attention): the emitted
    step reads it where it lies rather than copying it into the step's arrays
    (`c_online.streams`: the outer products' operand B), except the transposed copy
    `step_copies` prices on its own."""
    return (_walked_by_the_pass(kt, use)
            and use.tensor not in {s.target for s in kt.kernel.statements})


def _walked_by_the_pass(kt: KernelTerms, use: TensorUse) -> bool:
    """`use` is indexed by the online pass's dimension and by none of its rows."""
    plan = kt.kernel.online
    return (plan is not None and plan.dim in use.indices
            and not set(plan.rows) & set(use.indices))


def streamed(kt: KernelTerms, use: TensorUse, slot: int) -> bool:
    """Whether `use` streams through the cache at `slot` (not the innermost memory) of an
    online kernel on a CPU: a pass operand (K, V: indexed by the pass dimension, by no
    row) is walked a step's block at a time by every row block, so such a cache holds
    one step's block of it (not the whole pass: attention's K and V at S = 4096 take the
    whole 2 MiB L2 of a core, so the model found no fused schedule there) and it moves
    into that cache with every step (`stream_cost`), as into the step's arrays."""
    plan = kt.kernel.online
    if not step_in_cache(kt) or plan is None or slot == len(kt.slots) - 1:
        return False
    mem = kt.hw.memory(kt.slots[slot].name)
    return mem.cache and _walked_by_the_pass(kt, use)


def stream_bytes(kt: KernelTerms, use: TensorUse, mem: Memory, itemsize: int) -> ex.Int:
    """Bytes a streamed operand takes in a cache: one step's block."""
    return buffer_bytes(kt, use, mem, len(kt.slots) - 1, itemsize)


def stream_cost(kt: KernelTerms, workload: Workload, use: TensorUse, mem: Memory,
                itemsize: int) -> ex.Int:
    """A streamed operand's moves into a cache: a step's block per step of every row
    block, at the cache's rate (it is not kept across row blocks); but where the whole
    tensor takes at most half the cache (`transfers.stays`), its blocks stay
    there from one row block to the next and each moves in once. (Attention S=1024's
    V, 256 KiB, priced as refetched from the L3 for each of 256 row blocks: 7.9 ms of
    an online kernel that ran in 2-3 ms: RESULTS.md, "Tensors that stay in a cache".)"""
    from synth.constraints.transfers import stays
    if stays(workload, use, mem):
        return tensor_transfer_cost(kt, use, mem, len(kt.slots) - 1, itemsize, once=True)
    return tensor_transfer_cost(kt, use, dataclasses.replace(mem, cache=False),
                                len(kt.slots) - 1, itemsize)
