"""Transfers priced beyond one latency and one bandwidth per memory (docs/hardware.md):

- host transfers as parallel pushes (a memory's `push` table, `hardware.Push`): one
  transfer per tensor per group of instances (UPMEM's `dpu_push_xfer`: one per tensor
  per rank, equal sizes per DPU), each direction its own part of the breakdown;
- blocking transfers (a memory's `blocking = true`): a unit waits for its own transfers
  into the innermost memory, and only other units' work hides them (UPMEM's `mram_read`);
- a set-associative cache (a memory's `ways`) whose tile's rows alias in its sets: the
  tile does not stay, and its lines move again for every tile of the next memory in
  (`aliased_moves`).

Built on `cost`'s terms; `cost.kernel_cost` and `cost.kernel_objective` call in here.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from synth.constraints import expr as ex
from synth.constraints import roofline
from synth.constraints.combines import exchanged_on_device
from synth.constraints.cost import (
    KernelTerms,
    _blocking,
    _latency_ps,
    _memory_slots,
    _shared_pipelines,
    compute_cost,
    run_terms,
    tensor_transfer_cost,
    transfer_cost,
    transfer_count,
    transfer_loops,
)
from synth.constraints.space import NamedConstraint, SlotKind, TensorUse
from synth.hardware import Memory
from synth.vectors import contraction, pack_memory, packable_operand
from synth.workload import Workload


def push_costs(kt: KernelTerms, workload: Workload, mem: Memory, slot: int
               ) -> dict[str, ex.Int]:
    """Host transfers as parallel pushes (`mem.push`, UPMEM's `dpu_push_xfer`), one part
    per direction (`transfer:host->mram`, `transfer:mram->host`).

    Each time a tensor's tile moves, one push per unit of the push level (a rank) moves
    the tiles of all its instances (DPUs) at once: latency + per_unit x instances +
    tile x (one - full) + tile x instances x full, i.e. one instance's rate alone and
    nearly the full rate for many. The push level's units push concurrently, together at
    most at the cap: the bytes part takes at least all their bytes x cap. Bytes are
    written per dimension as products of its factors (`pushed_bytes`), so the solver
    sees that all ranks together move the whole tensor."""
    push = mem.push
    assert push is not None
    parent = kt.hw.parent(mem)
    group = kt.hw.level_index(push.level)
    groups = kt.spatial_between(0, group)
    members = kt.spatial_between(group, kt.slots[slot].level_index)
    instances = ex.mul(*(kt.units(s) for s in members))
    into: list[ex.Int] = []
    out: list[ex.Int] = []
    for use in kt.moving():
        itemsize = workload.tensors[use.tensor].dtype.itemsize
        alone, rank, every = (pushed_bytes(kt, use, mem, slot, itemsize, spatial)
                              for spatial in ([], members, groups + members))
        for moved, way, acc in ((use.read, push.into, into), (use.written, push.out, out)):
            if not moved:
                continue
            spread = ex.add(ex.mul(way.one_ps_per_byte - way.full_ps_per_byte, alone),
                            ex.mul(way.full_ps_per_byte, rank))
            if push.cap_ps_per_byte:
                spread = ex.maximum(spread, ex.mul(push.cap_ps_per_byte, every))
            fixed = ex.mul(transfer_count(kt, use, slot),
                           ex.add(way.latency_ps, ex.mul(way.per_unit_ps, instances)))
            acc.append(ex.select(exchanged_on_device(kt, use, slot), 0,
                                 ex.add(fixed, spread)))
    return {f"transfer:{parent.name}->{mem.name}": ex.add(*into),
            f"transfer:{mem.name}->{parent.name}": ex.add(*out)}


def pushed_bytes(kt: KernelTerms, use: TensorUse, mem: Memory, slot: int, itemsize: int,
                 spatial: Sequence[int]) -> ex.Int:
    """Bytes of `use`'s tiles moved between `mem` and its parent over the kernel by the
    units of the `spatial` slots together (none: one instance), each run padded to the
    memory's transfer multiple: per dimension one product of its factors (the loops
    moving the tile, the tile's extent and the units), as `tensor_transfer_cost` writes
    one unit's."""
    counted, optional = transfer_loops(kt, use, slot)
    inner = set(kt.inner(slot))
    units = set(spatial)
    common = ex.mul(kt.partials(slot, use), *optional,
                    *(kt.dim_product(d, counted[d] | inner | units) for d in use.indices[:-1]),
                    *(kt.dim_product(d, counted[d] | units) for d in kt.kernel.dims
                      if d not in use.indices))
    if not use.indices:
        return ex.mul(common, run_terms(kt, use, mem, slot, itemsize).padded_bytes)
    last = use.indices[-1]
    run = run_terms(kt, use, mem, slot, itemsize)
    moved = ex.add(ex.mul(itemsize, kt.dim_product(last, counted[last] | inner | units)),
                   ex.mul(kt.dim_product(last, counted[last] | units), run.waste_bytes))
    return ex.mul(common, moved)


def blocking_time(kt: KernelTerms, workload: Workload, compute: ex.Int) -> ex.Int:
    """Compute and the transfers into the innermost memory when each unit waits for its
    own transfers (UPMEM: `mram_read` blocks the tasklet) and only other units' work
    hides them:

        max(compute + one unit's transfers, every unit's transfers) + issue

    A unit's instructions run at its share of the pipeline (`compute`, which the
    `issue_share` stretch prices), and it waits for its own transfers on top of them:
    while it waits, the others' instructions fill the pipeline, so the others' transfers
    hide. The engine serves every unit's transfers in turn, which bounds the time from
    below too. One unit alone (T=1) pays compute + transfers. `issue`: the instructions
    that issue each transfer (the memory's `issue`), on the pipeline; added outside the
    max (a few cycles per transfer of hundreds where the engine is the bound)."""
    slot, mem = _memory_slots(kt)[-1]
    total = ex.maximum(ex.add(compute, unit_transfer_cost(kt, workload, mem, slot)),
                       engine_cost(kt, workload, mem, slot))
    if not mem.issue_ps:
        return total
    calls = dataclasses.replace(mem, latency_ps=mem.issue_ps, write_latency_ps=None,
                                ps_per_byte=0)
    # all units' calls on the full pipeline; one unit's at its issue share at least
    alone = ex.mul(unit_transfer_cost(kt, workload, calls, slot), *_stretch(kt))
    return ex.add(total, ex.maximum(alone, engine_cost(kt, workload, calls, slot)))


def _stretch(kt: KernelTerms) -> list[ex.Int]:
    """The issue share of each shared pipeline: what one unit's instructions take alone."""
    return [ex.const(kt.hw.levels[kt.slots[i].level_index].issue_share)
            for i in _shared_pipelines(kt)]


def unit_transfer_cost(kt: KernelTerms, workload: Workload, mem: Memory, slot: int
                       ) -> ex.Int:
    """`transfer_cost` of one unit: its own transfers, not the others' it queues behind."""
    return ex.add(*(ex.select(exchanged_on_device(kt, use, slot), 0, tensor_transfer_cost(
        kt, use, mem, slot, workload.tensors[use.tensor].dtype.itemsize))
        for use in kt.moving()))


def engine_cost(kt: KernelTerms, workload: Workload, mem: Memory, slot: int) -> ex.Int:
    """`transfer_cost` (every unit's transfers, in turn on their shared engine), written
    per dimension as one product over the units too, as `pushed_bytes` does: the
    solver then sees that all units together move the whole tensor, whatever the split."""
    if kt.hw.compute.tiling.edge:
        return transfer_cost(kt, workload, mem, slot)
    serial = kt.spatial_between(kt.hw.level_index(mem.shared_by), kt.slots[slot].level_index)
    units, inner = set(serial), set(kt.inner(slot))
    total: list[ex.Int] = []
    for use in kt.moving():
        itemsize = workload.tensors[use.tensor].dtype.itemsize
        counted, optional = transfer_loops(kt, use, slot)
        run = run_terms(kt, use, mem, slot, itemsize)
        common = ex.mul(kt.partials(slot, use), *optional,
                        *(kt.dim_product(d, counted[d] | inner | units)
                          for d in use.indices[:-1]),
                        *(kt.dim_product(d, counted[d] | units) for d in kt.kernel.dims
                          if d not in use.indices))
        last = use.indices[-1] if use.indices else None
        moves_last = kt.dim_product(last, counted[last] | units) if last else ex.ONE
        operations = ex.mul(common, moves_last, run.chunks)
        moved = pushed_bytes(kt, use, mem, slot, itemsize, serial)
        time = ex.add(ex.mul(_latency_ps(mem, use), operations),
                      ex.mul(mem.ps_per_byte * (int(use.read) + int(use.written)), moved))
        total.append(ex.select(exchanged_on_device(kt, use, slot), 0, time))
    return ex.add(*total)


def blocking_bounds(kt: KernelTerms, workload: Workload) -> list[NamedConstraint]:
    """Redundant: compute and the blocking transfers take at least the mean of the
    pipeline's time and the engine's (a max is at least any mean of its arguments).
    True of every schedule; the solver's bound then grows with both, where a max's
    follows only the larger (mv on upmem: 17 s to prove optimal without it, 1 s with)."""
    slots = [slot for slot, _ in _memory_slots(kt) if _blocking(kt, slot)]
    if not slots:
        return []
    mem = kt.hw.memory(kt.slots[slots[0]].name)
    compute = compute_cost(kt)
    both = ex.add(compute, engine_cost(kt, workload, mem, slots[0]))
    return [NamedConstraint(
        "implied", f"kernel {kt.kernel.name}: compute and the {mem.name} transfers that "
        "block it take at least their mean",
        ex.Cmp(ex.mul(2, blocking_time(kt, workload, compute)), ">=", both))]


def aliased_moves(kt: KernelTerms, workload: Workload, use: TensorUse, mem: Memory,
                  slot: int, itemsize: int) -> ex.Int:
    """`use`'s moves into `mem`, a set-associative cache (`mem.ways`), where its tile's
    rows may alias in the cache's sets.

    Priced where a tile's register tiles are gathered (the kernel's vector dimension
    indexes the tensor before its last axis), the case measured (layernorm, RESULTS.md),
    and where the tile is a strip a line wide walked down its rows (`strip_moves`).
    A cache of C bytes and W ways maps an address to a set by its offset modulo C / W
    (the L1d of the development machine: 48 KiB, 12 ways, 4 KiB a way). Rows of a tensor
    `stride` bytes apart start at as many distinct offsets as (C / W) / gcd(stride, C / W)
    (lines at least), so at most W x that many of them stay at once (`aliased_rows`:
    layernorm's x, rows of 1024 f32 = 4 KiB apart, all in one set: 12 rows). A tile with
    more rows than that is not kept between the steps of the loops inside it: each tile
    of the next memory in (the register tile, e.g. a [128 x 1] column of x gathered into
    vectors along the rows) moves its own lines from the parent. Priced where fewer rows
    stay than a vector has lanes (so every vectorised tile of the rows aliases): then not
    even a gather's own 16 lines stay until the next gather of the same rows, and a tile
    read so moves a whole line per element (a tile written so, lane by lane, a line per
    row: `walked_moves`). So the tile's moves are priced at that inner slot's tiles and
    loops (at this memory's rates and line), and otherwise as usual. (The emitter gathers
    a register tile a vector at a time, its lanes from consecutive rows, with the ISA's
    gather; reading each row's elements of the tile in a row instead ran 2x slower:
    RESULTS.md, "Gathered row reductions".)"""
    normal = tensor_transfer_cost(kt, use, mem, slot, itemsize)
    inner = next((i for i in range(slot + 1, len(kt.slots))
                  if kt.slots[i].kind is SlotKind.TEMPORAL), None)
    vector = kt.kernel.vector
    if (inner is None or not kt.hw.compute.vector_tiles or len(use.indices) < 2
            or packed_operand(kt, use)):
        return normal  # rows alias only in a tensor with rows
    held = aliased_rows(mem, workload.tensors[use.tensor].shape[-1] * itemsize)
    if held is None:
        return normal
    if vector not in use.indices[:-1]:  # not gathered: a strip walked down its rows?
        return strip_moves(kt, use, mem, slot, inner, itemsize, held, normal)
    width = max(roofline.lanes(s, vector, workload, kt.hw.compute) for s in kt.kernel.statements)
    if held >= width:  # a vector's rows stay; more rows walked at once than stay do not
        return ex.select(walks_at_most(kt, use, mem, vector, itemsize, held), normal,
                         lines_again(kt, use, mem, inner, itemsize, held))
    aliased = roofline.whole_vectors(kt.tile(vector, len(kt.slots) - 1), width,
                                     kt.factors.domains)
    if aliased is False:
        return normal
    fresh = walked_moves(kt, use, mem, slot, inner, itemsize, vector, width, held)
    return fresh if aliased is True else ex.select(aliased, fresh, normal)


SHORT_ROW_LINES = 6  # rows of at most this many lines come in one at a time (`strip_moves`)


def strip_moves(kt: KernelTerms, use: TensorUse, mem: Memory, slot: int, inner: int,
                itemsize: int, held: int, normal: ex.Int) -> ex.Int:
    """`use`'s moves into `mem` (`aliased_moves`) where its tile's rows alias in `mem`'s
    sets, more of them than stay (`held`, from `aliased_rows`), and the kernel reads it
    in whole vectors (not gathered): the register tiles inside walk down the tile's
    rows, so no row's lines stay until the walk comes back to them, and each register
    tile moves its own rows in from the parent (`normal` otherwise).

    A row so moved costs `mem.aliased_read_ps` (`aliased_write_ps` where the kernel writes
    the tensor), the time of one line, not its bytes at the parent's rate: every miss to one
    set waits for the one before (and a written line for its eviction), so the time is the
    misses', divided by the sets the rows spread over (misses to different sets overlap),
    and a row's lines, each in its own set, come together. (Measured on AMD Zen 5, a 64-byte
    column of 256 rows walked again and again, read and written: 54 cycles a line with rows
    4 KiB apart (one set), 31 at 2 KiB (two), 8 at 1 KiB (four); read only 14, 7, 5; 2
    cycles with rows 4160 bytes apart. Attention S=1024's QK^T with the scores' L1 tile [256
    x 16] and [4 x 16] register tiles ran 13.3 ms, priced 0.73 as lines at the L2's rate:
    RESULTS.md, "Strips of aliasing rows". 64 rows walked, 1, 2, 4 and 8 lines a row: 43,
    63, 73 and 63 cycles a row at 4 KiB apart, 31, 36, 32 and 42 at 2 KiB. The f32 matmul
    512^3 whose C tile in the L1 is [32 x 32], rows 2 KiB apart, reloaded by [8 x 32]
    register tiles at every step of k, ran 24 ms, priced 2.7 (a wider tile was priced as
    streamed lines): "Wide tiles of aliasing rows".)

    The same where the tile has few rows but the loops around it walk more than stay
    before they step to the rows' next line (`walked_rows`, `next_line`): no row's next
    line is prefetched, and the lines written share the set. (Measured on AMD Zen 5, a
    line read and written per row of 512 rows 4 KiB apart, walking R rows at a time:
    4.2 cycles a line at R = 1, 13.5 at 12, 23 at 16, 52 at 64 and more; read only 5 to
    8, written only 3 to 40. rownorm's xc[s, d] = x[s, d] - mu[s] walking 64 rows of a
    line ran 0.41 ms, priced 0.038: RESULTS.md, "Rows walked before the next line".)
    A tile whose rows are a few lines wide (at most `SHORT_ROW_LINES`) walked by register
    tiles narrower than its rows: each visit of its rows costs a row's price, shared by
    the register tiles along the row (each pays 1 / f of it; no less than streamed).
    Wider rows are streamed: not kept either, each register tile's lines come back from
    the parent at this memory's own rate (as `normal` prices them at the inner slot, no
    less than `normal`). (The f32 matmul 512^3 with C's L1 tile [32 x 256], rows 2 KiB
    apart and 16 lines wide, reloaded and stored by [8 x 16] register tiles at every step
    of k, ran 13.4 ms, priced 5.6 as a tile kept in the L1, 7.7 so: RESULTS.md, "Wide rows
    that alias".)
    (Measured on AMD Zen 5, blocks of 32 rows 4 KiB apart read and written twice, by 8 x
    1-line tiles: 37, 52, 64, 55, 50 and 49 cycles a row at 1 to 6 lines a row, 30 at 7,
    24 at 8; 3 cycles a line with rows 4160 bytes apart. Attention S=1024's QK^T with
    the scores' L1 tile [16 x 64] reloaded at every step of d by [8 x 16] register tiles
    ran 19.5 ms, priced 2.4: RESULTS.md, "Short rows of aliasing lines".)

    One select, on the rows; a memory without `aliased_read`/`aliased_write` prices every
    line alike."""
    line_ps = aliased_line_ps(use, mem, held)  # misses to as many sets overlap
    if not line_ps:
        return normal
    line = line_bytes(mem, itemsize)
    rows, last = use.indices[-2], use.indices[-1]
    # more rows than stay, in the tile or walked by the loops around it before they step
    # to the rows' next line
    walked = walked_rows(kt, rows, last, max(line // itemsize, 1), next_line=True)
    many = ex.any_of([ex.Cmp(kt.tile(rows, slot), ">", ex.const(held)),
                      ex.Cmp(walked, ">", ex.const(held))])
    # a row at most a line wide, or as wide as the register tile: each register tile's
    # rows are a visit of the tile's rows (register tiles along a row, one after the
    # other, find its next lines prefetched)
    visits = ex.any_of([ex.Cmp(ex.mul(itemsize, kt.tile(last, slot)), "<=", ex.const(line)),
                        ex.Cmp(kt.f(last, slot), "==", ex.const(1))])
    strip = tensor_transfer_cost(kt, use, per_row(mem, use, line_ps), inner, itemsize)
    # rows of a few lines, walked by register tiles narrower than them: each visit of
    # the tile's rows costs a row's price, shared by the register tiles along the row
    short = ex.Cmp(ex.mul(itemsize, kt.tile(last, slot)), "<=", ex.const(SHORT_ROW_LINES * line))
    streamed = ex.maximum(normal, tensor_transfer_cost(kt, use, mem, inner, itemsize))
    shared = ex.select(short, ex.maximum(normal, ex.ceil_div(strip, kt.f(last, slot))),
                       streamed)
    return ex.select(many, ex.select(visits, strip, shared), normal)


def per_row(mem: Memory, use: TensorUse, row_ps: int) -> Memory:
    """`mem` moving each row of `use`'s tiles at `row_ps`, however wide, whichever ways it
    moves (read, written or both), and nothing per byte."""
    directions = int(use.read) + int(use.written)
    return dataclasses.replace(mem, ps_per_byte=0, store_ps_per_byte=0, write_latency_ps=None,
                               latency_ps=max(1, round(row_ps / directions)))


def per_line(mem: Memory, use: TensorUse, line_ps: int, line: int) -> Memory:
    """`mem` moving `use`'s tiles at `line_ps` per `line` bytes, whichever ways it moves
    (read, written or both), with no fixed cost per tile."""
    directions = int(use.read) + int(use.written)
    return dataclasses.replace(mem, latency_ps=0, write_latency_ps=None, store_ps_per_byte=0,
                               ps_per_byte=max(1, round(line_ps / line / directions)))


def walked_moves(kt: KernelTerms, use: TensorUse, mem: Memory, slot: int, inner: int,
                 itemsize: int, vector: str, width: int, held: int) -> ex.Int:
    """The moves of a gathered tile whose rows alias in `mem` (`aliased_moves`), by how
    many rows the loop nest walks before it comes back to a line (`walked_rows`).

    At most a vector's lanes of rows (as many lines as the prefetchers follow), each
    register tile moves its lines again at `mem`'s own rate; more rows than that, at the
    parent's own fill rate at least (lines of rows a page apart, revisited after other rows:
    no prefetcher follows them), and at the aliased prices below. Measured on rownorm's `vs`
    (one thread, 512 x 1024 f32, rows 4 KiB apart; RESULTS.md, "Rows walked at once"): with
    the L1 tile 128, 64 or 32 rows and [16-64 x 4] register tiles it ran 0.26-0.27 ms,
    priced 0.076 (lines at the L1's rate); a [16 x 1] register tile walking 512 columns of
    16 rows ran 0.16 against 0.17. (Pricing every register tile's lines at the parent's rate
    put that [16 x 1] tile at 1.2 ms; so did pricing the L1 tile's own lines there when it
    is narrower than a line, as the next columns find them still in the L1.) One select on
    the tile's rows: CP-SAT's time on layernorm and the other built-ins was unchanged.

    A tile the kernel writes so into more rows than that, with `mem.aliased_write_ps`,
    moves a line per element at that price over the sets the rows spread over (as
    `strip_moves`): rownorm's mu_xc_vs kernel writing xc lane by lane down 512 rows 4
    KiB apart ran 44 cycles per element; a tile read so, `mem.aliased_read_ps` per line
    (rownorm's sample 14, its sums over rows walking 256 and 512 rows with [16 x 1]
    register tiles, ran 7.3 cycles per element, priced 2.5 at the L2's rate; the `vs`
    above with [16-64 x 4] tiles, 5.3 per line).

    Into a register tile's own rows alone (a vector's lanes of them: a loop along the
    last axis with more rows inside walks more than that), more than the `held` that
    stay, a written tile costs a share (lanes - held) / lanes of `aliased_write` per
    element, at least its lines both ways (`scattered`); a tile read so keeps `mem`'s own
    rate. Measured on AMD Zen 5 (12 ways; RESULTS.md, "Stores into a register tile's
    aliasing rows"), a column of R rows 4 KiB apart after the other: stores lane by lane
    took 1.1-1.8 cycles each at R <= 12, 7.8 at 16, 25 at 32; a gather of 16 lanes 34,
    62, 109 and 122 cycles at R = 16, 32, 64 and 128 or more (14-21 where rows do not
    alias)."""
    few = walks_at_most(kt, use, mem, vector, itemsize, width)
    fills = scattered(kt, use, mem)  # written: a line in and back out at the parent's rate
    many = lines_again(kt, use, mem, inner, itemsize, held)
    aliased_ps = aliased_line_ps(use, mem, held)
    if not aliased_ps or not use.written:
        return ex.select(few, tensor_transfer_cost(kt, use, fills, inner,
                                                   element_moves(use, mem, itemsize)), many)
    share = round(aliased_ps * (width - held) / width)  # the lanes past the rows that stay
    return ex.select(few, at_line_price(kt, use, mem, inner, itemsize, share), many)


def lines_again(kt: KernelTerms, use: TensorUse, mem: Memory, inner: int, itemsize: int,
                held: int) -> ex.Int:
    """`use`'s moves into `mem` where the loop nest walks more of its aliasing rows at once
    than the `held` that stay (`walked_moves`, `aliased_moves`): each register tile (at
    slot `inner`) moves its own lines again, each at `mem`'s aliased price over the sets
    the rows spread over and at least the parent's fill rate (no prefetcher follows rows
    a page apart); at that rate alone where the model has no aliased price."""
    aliased_ps = aliased_line_ps(use, mem, held)
    if not aliased_ps:
        return tensor_transfer_cost(kt, use, unprefetched(kt, mem, scattered(kt, use, mem)),
                                    inner, element_moves(use, mem, itemsize))
    parent = kt.hw.parent(mem)
    return at_line_price(kt, use, mem, inner, itemsize,
                         max(aliased_ps, parent.ps_per_byte * line_bytes(mem, itemsize)))


def walks_at_most(kt: KernelTerms, use: TensorUse, mem: Memory, vector: str, itemsize: int,
                  rows: int) -> ex.Cond:
    """Whether the loop nest walks at most `rows` of `use`'s rows before it comes back to
    a line of `mem` (`walked_rows`)."""
    elements = max(mem.rules.multiple // itemsize, 1)  # a line's
    return ex.Cmp(walked_rows(kt, vector, use.indices[-1], elements), "<=", ex.const(rows))


def line_bytes(mem: Memory, itemsize: int) -> int:
    """A line of `mem` (its transfer multiple), at least an element."""
    return max(mem.rules.multiple, itemsize)


def element_moves(use: TensorUse, mem: Memory, itemsize: int) -> int:
    """Bytes an element of a tile whose rows alias moves: a whole line read, itself
    written (lane by lane; `scattered` prices the line it brings)."""
    return itemsize if use.written else line_bytes(mem, itemsize)


def aliased_line_ps(use: TensorUse, mem: Memory, held: int) -> int:
    """`mem`'s aliased price of a line (`aliased_write` where the kernel writes `use`),
    over the sets rows that alias spread over (`held` of them stay, `ways` a set)."""
    price = mem.aliased_write_ps if use.written else mem.aliased_read_ps
    return price // (held // mem.ways)


def at_line_price(kt: KernelTerms, use: TensorUse, mem: Memory, inner: int, itemsize: int,
                  line_ps: int) -> ex.Int:
    """`use`'s moves into `mem` as each register tile's lines at `line_ps` each, at least
    a line's time at the rate its fills come at (`scattered`; both ways where the kernel
    reads and writes it)."""
    whole = line_bytes(mem, itemsize)
    floor = scattered(kt, use, mem).ps_per_byte * whole * (int(use.read) + int(use.written))
    return tensor_transfer_cost(kt, use, per_line(mem, use, max(line_ps, floor), whole),
                                inner, element_moves(use, mem, itemsize))


def walked_rows(kt: KernelTerms, rows: str, column: str, line: int,
                next_line: bool = False) -> ex.Int:
    """How many of a tensor's rows (along `rows`) the loop nest walks before it comes
    back to a line: the most, over the loops that step along `column` (the tensor's last
    axis) by less than a line (`line`, in elements: its next step reads the same lines),
    of the extent along `rows` of the loops inside that one, in the emitted nest's order
    (`materialize`: slots outermost first, within a slot the kernel's dimensions in
    order). Temporal loops only (a spatial slot's units walk their own rows), not the
    register tile's own (its columns are one gather apart). 1 where no loop comes back.
    `next_line`: before it comes to the rows' next line (loops that step by a line too)."""
    dims = kt.kernel.dims
    walks: list[ex.Int] = []
    for k, slot in enumerate(kt.slots[:-1]):
        if slot.kind is not SlotKind.TEMPORAL:
            continue
        inside = kt.tile(rows, k + 1)
        if dims.index(rows) > dims.index(column):  # the rows' loop here is inside too
            inside = ex.mul(inside, kt.f(rows, k))
        within = ex.Cmp(kt.tile(column, k + 1), "<=" if next_line else "<", ex.const(line))
        walks.append(ex.select(ex.greater_than_one(kt.f(column, k)),
                               ex.select(within, inside, 1), 1))
    return ex.maximum(*walks) if walks else ex.ONE


def unprefetched(kt: KernelTerms, mem: Memory, rates: Memory) -> Memory:
    """`rates` (`mem`, or `scattered`'s variant of it) where its lines come from the
    parent with no prefetcher ahead of them: at the parent's own fill rate at least."""
    parent = kt.hw.parent(mem)
    return dataclasses.replace(rates, ps_per_byte=max(parent.ps_per_byte, rates.ps_per_byte))


def scattered(kt: KernelTerms, use: TensorUse, mem: Memory) -> Memory:
    """`mem` as it takes a tile written lane by lane into rows that alias (a tensor the
    kernel writes, gathered along its rows: rownorm's xc[s, d] in a kernel vectorised
    along s): every element's store brings its row's line in from the parent (a write
    allocates it) and sends it back evicted, so the lines move both ways at the parent's
    own fill rate, not streamed from it. (Measured on rownorm, 512 x 1024 f32: the
    kernels writing xc so ran 1.4-3.6 ms alone against 0.29-0.34 modelled as lines
    streamed from the L2; the same kernels reading it so ran near their model:
    RESULTS.md, "Folds, packed panels and scattered stores".) A tile read is unchanged."""
    if not use.written or use.read:
        return mem
    parent = kt.hw.parent(mem)
    both = 2 * max(parent.ps_per_byte, mem.ps_per_byte)
    return dataclasses.replace(mem, ps_per_byte=both, store_ps_per_byte=0)


def aliased_rows(mem: Memory, stride: int) -> int | None:
    """The most rows `stride` bytes apart whose first lines `mem` (with `ways`) holds at
    once, or None when such rows spread over all its sets (no fewer than it holds lines)."""
    if not mem.ways or mem.capacity % mem.ways:
        return None
    way = mem.capacity // mem.ways
    line = max(mem.rules.multiple, 1)
    step = max(math.gcd(stride, way), line)
    if step <= line:
        return None
    return mem.ways * (way // step)


def packed_moves(kt: KernelTerms, use: TensorUse, mem: Memory, slot: int, itemsize: int
                 ) -> ex.Int | None:
    """`use`'s moves into `mem` where the C emitter has packed it into contiguous panels
    in an outer memory (`packed_operand`; `synth.emit.c_pack`: each core's L2 tile of a
    contraction operand, laid out [blocks of the free dimensions][the reduced
    dimensions][offsets within a block]), and `mem` is a cache inside that one but not
    the registers (`cpu`: the L1): its tiles are then runs of the panel, not rows of
    the tensor, so they move as their bytes, without a line per row of the tensor.
    (Priced in the tensor's rows, attention's QK^T with K's L1 tile a column [256 x 1]
    of a panel packed in blocks of 16 was priced 256 lines per step where it reads 16,
    1.35 ms modelled against 0.19 measured: RESULTS.md, "Packed operands".) None where
    this does not apply."""
    packer = pack_memory(kt.hw)
    names = [m.name for m in kt.hw.memories]
    if (packer is None or mem.name == names[-1] or not mem.cache
            or names.index(mem.name) <= names.index(packer) or not use.indices
            or use.written or not packed_operand(kt, use)):
        return None
    runs = dataclasses.replace(mem.rules, multiple=itemsize)
    return tensor_transfer_cost(kt, use, dataclasses.replace(mem, rules=runs), slot, itemsize)


def resident_moves(kt: KernelTerms, workload: Workload, use: TensorUse, mem: Memory,
                   slot: int, itemsize: int) -> ex.Int | None:
    """`use`'s moves into `mem`, a cache, where the kernel only reads the tensor and the
    whole of it stays there (`stays`): each distinct tile moves in once, as its bytes
    (the lines its tiles share come once), however often the loops around meet it
    again. The cache model of `transfer_loops` otherwise moves a tile again for every
    step of a loop around it that has a loop walking the tensor inside (its tiles
    between are taken to evict it). Where the C emitter packs the tensor (a
    contraction operand, `c_pack`), the copy packs each distinct tile once per call
    (`c_pack.revisits`) and the panels stay as the tensor's lines do. (Priced at every
    meeting, attention S=1024's QK^T with K's L2 tile [1024 x 2] under a loop over the
    1024 queries was 75 ms of L3 traffic; K, 256 KiB, stays in the 2 MiB L2 and the
    kernel ran 2.7 ms; rownorm's g and b, 4 KiB each, were priced 2 MiB of L3
    traffic each in a kernel of 0.14 ms: RESULTS.md, "Tensors that stay in a cache".)
    None where this does not apply: a tensor that does not stay is priced as any other
    (for a packed one, its panels' revisits as rows of the tensor: pricing them as the
    panel's bytes changed no measured schedule and slowed CP-SAT on swiglu and the
    transformer)."""
    if (not mem.cache or not use.indices or use.written or mem.name == kt.hw.memories[-1].name
            or not stays(workload, use, mem)):
        return None
    runs = dataclasses.replace(mem, rules=dataclasses.replace(mem.rules, multiple=itemsize))
    return tensor_transfer_cost(kt, use, runs, slot, itemsize, once=True)


def stays(workload: Workload, use: TensorUse, mem: Memory) -> bool:
    """Whether `use`'s whole tensor takes at most half of `mem` (the rest for the kernel's
    other tensors streaming through it), so its lines and panels stay there. (The f32
    matmul 512^3 with B's 1 MiB of panels met again by each of 512 rows of A ran 3.2 ms
    where refetching them from the L3 would take 15.7 ms.)"""
    tensor = workload.tensors[use.tensor]
    return tensor.dtype.itemsize * math.prod(tensor.shape) * 2 <= mem.usable


def packed_operand(kt: KernelTerms, use: TensorUse) -> bool:
    """Whether the C emitter packs `use` into contiguous panels (a contraction operand,
    `synth.emit.c_pack`): its rows are then not the tensor's."""
    for stmt in kt.kernel.core:
        operands = contraction(stmt)
        if operands is not None and any(a.tensor == use.tensor and packable_operand(stmt, a)
                                        for a in operands):
            return True
    return False
