"""The L1's set aliasing in the cpu model (`transfers.aliased_moves`): a row reduction
vectorised along the rows gathers its vectors from rows a power-of-two stride apart,
which share the L1's sets, so only `ways` of them stay. Measured (RESULTS.md, "Gathered
row reductions"): layernorm's row sums with a [128 x 1] register tile ran 4x slower
than with [32 x 8], which the model priced alike. Relations only, deterministic limits."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from conftest import F32_MATMUL, ROW_SUM, ZEN3, FakeMachine, solve

from synth.constraints import cost
from synth.constraints import expr as ex
from synth.constraints.result import Status
from synth.constraints.transfers import aliased_moves, aliased_rows
from synth.hwfile import load_hardware
from synth.lang import parse_workload
from synth.pipeline import encode


def test_rows_a_way_apart_share_a_set() -> None:
    """48 KiB, 12 ways (4 KiB a way, 64 B lines): rows 4 KiB apart all fall in one set
    (12 stay), 1 KiB apart in 4 (48), 256 B apart in 16; rows at an odd stride spread
    over every set, and a cache without `ways` is not modelled."""
    l1 = dataclasses.replace(load_hardware("cpu").memory("l1"), capacity=48 * 1024, ways=12)
    assert aliased_rows(l1, 4096) == 12
    assert aliased_rows(l1, 8192) == 12
    assert aliased_rows(l1, 1024) == 48
    assert aliased_rows(l1, 256) == 192
    assert aliased_rows(l1, 4100) is None
    assert aliased_rows(l1, 64) is None
    assert aliased_rows(dataclasses.replace(l1, ways=0), 4096) is None


def objective(hw_set: tuple[str, ...], fixes: tuple[str, ...], text: str = ROW_SUM) -> int:
    """The objective at the optimum of the workload `text` under `fixes` and `hw_set`."""
    workload = parse_workload(text, "<test>", "w")
    model = encode(workload, load_hardware("cpu", hw_set), fixes=fixes)
    result = solve(model.constraints)
    assert result.status is Status.OPTIMAL and result.env is not None, result.status
    return ex.evaluate(model.constraints.objective, dict(result.env))


def test_a_tile_gathered_from_aliasing_rows_costs_a_line_per_element() -> None:
    """Row sums over rows 4 KiB apart, vectorised along the rows: the 16 rows a gather
    reads do not stay in a 12-way set, so every gather moves its 16 lines again, whether
    the register tile is one column (a [16 x 1] tile, the L1 tile 8 columns wide) or 8
    (RESULTS.md, "Max as one instruction": on AMD Zen 5 a [64 x 4] tile's gathers ran
    47.6 cycles against 24.1 at a stride that does not alias, where a line per row per
    register tile priced 10 extra). With the associativity modelled both cost more than
    without it (`l1.ways=0`), the wider tile by as much as the column: a line per element
    in both."""
    column = ("fuse.sm=1", "V.sm.s=16", "V.sm.d=1", "Q.sm.d=8")
    block = ("fuse.sm=1", "V.sm.s=16", "V.sm.d=8")
    assert load_hardware("cpu").memory("l1").ways > 1
    extra = {tile: objective((), tile) - objective(("l1.ways=0",), tile)
             for tile in (column, block)}
    assert extra[column] > 0 and extra[block] > 0
    assert extra[block] >= 0.9 * extra[column]


def test_where_a_vector_of_rows_stays_a_register_tile_of_more_rows_costs_more(
        on_machine: Callable[[FakeMachine], None]) -> None:
    """AMD Zen 3: an 8-way L1d and vectors of 8 f32 lanes, so the 8 rows 4 KiB apart one
    gather reads stay in their set, and a one-vector register tile costs what it does
    without the associativity modelled. A [32 x 1] register tile walks 32 such rows at
    each column; they do not stay, and every element comes back as a line (mv, i32 rows
    16 KiB apart on Zen 3: [8 x 1] tiles ran 3.4 ms, [16 x 1] 7.4, [32 x 1] 13.3, where the
    model priced them within 4% of each other: RESULTS.md, "Broadcasts that load")."""
    on_machine(ZEN3)
    assert load_hardware("cpu").memory("l1").ways == 8
    one = ("fuse.sm=1", "V.sm.s=8", "V.sm.d=1", "Q.sm.s=1", "P=1")
    four = ("fuse.sm=1", "V.sm.s=32", "V.sm.d=1", "Q.sm.s=1", "P=1")
    assert objective((), one) == objective(("l1.ways=0",), one)
    assert objective((), four) > 2 * objective(("l1.ways=0",), four)


def test_more_rows_walked_at_once_cost_more() -> None:
    """The same [16 x 4] register tile of the row sum, its L1 tile 16 rows or 64: with 64
    rows walked at once the lines come back from the L2 at its own fill rate (no
    prefetcher follows 64 rows a page apart), with 16 at the L1's (RESULTS.md, "Rows
    walked at once": rownorm's `vs` ran 0.26 ms with 32-128 rows, 0.18 with 16)."""
    few = ("fuse.sm=1", "V.sm.s=16", "V.sm.d=4", "Q.sm.s=1", "Q.sm.d=2", "P=1")
    many = ("fuse.sm=1", "V.sm.s=16", "V.sm.d=4", "Q.sm.s=4", "Q.sm.d=2", "P=1")
    assert l1_moves(many) > l1_moves(few)  # same register tiles, same lines per tile
    assert objective((), many) > objective((), few)


def l1_moves(fixes: tuple[str, ...]) -> int:
    """The row sum's moves of x into the L1 at its optimum under `fixes`."""
    workload = parse_workload(ROW_SUM, "<test>", "rowsum")
    model = encode(workload, load_hardware("cpu"), fixes=fixes)
    result = solve(model.constraints)
    assert result.status is Status.OPTIMAL and result.env is not None, result.status
    [kernel] = model.selected(dict(result.env))
    kt = cost.KernelTerms(kernel, model.factors, model.hw)
    slot = max(i for i, s in enumerate(kt.slots) if s.name == "l1")
    [use] = [u for u in kt.moving() if u.tensor == "x"]
    moves = aliased_moves(kt, workload, use, model.hw.memory("l1"), slot, 4)
    return ex.evaluate(moves, dict(result.env))


def test_rows_that_stay_are_not_charged() -> None:
    """With 64 ways every one of the 16 rows stays: the column tile costs what it does
    without the associativity modelled."""
    column = ("fuse.sm=1", "V.sm.s=16", "V.sm.d=1", "Q.sm.d=8")
    assert objective(("l1.ways=64",), column) == objective(("l1.ways=0",), column)


CENTRED = """
size S = 64
size D = 1024
in  x : f32[S, D]
in  mu : f32[S]
out xc : f32[S, D]
out vs : f32[S]
xc[s, d] = x[s, d] - mu[s]
vs[s] += xc[s, d] * xc[s, d]
"""


def kernel_transfer(text: str, tensor: str, fixes: tuple[str, ...],
                    hw_set: tuple[str, ...] = (), kernel_name: str | None = None) -> int:
    """The L2 -> L1 moves of `tensor` at the optimum under `fixes` (of the one kernel, or
    of `kernel_name`)."""
    from synth.constraints import combines, cost, intrinsic

    workload = parse_workload(text, "<test>", "w")
    model = encode(workload, load_hardware("cpu", hw_set), fixes=fixes)
    result = solve(model.constraints)
    assert result.status is Status.OPTIMAL and result.env is not None, result.status
    env = dict(result.env)
    domains = dict(model.factors.domains)
    [kernel] = [k for k in model.selected(env) if kernel_name in (None, k.name)]
    kt = intrinsic.with_pack_choice(cost.with_buffer_choices(combines.with_combine_choices(
        cost.KernelTerms(kernel, model.factors, model.hw), domains), domains), domains)
    [(slot, l1)] = [(i, m) for i, m in cost._memory_slots(kt) if m.name == "l1"]
    [use] = [u for u in kt.moving() if u.tensor == tensor]
    return ex.evaluate(cost._moves(kt, workload, use, l1, slot), env)


def test_a_tile_written_lane_by_lane_into_aliasing_rows_moves_its_lines_both_ways() -> None:
    """xc[s, d] written by a kernel vectorised along s (its last statement's target is
    vs[s]): each lane's store lands in its own row, 4 KiB from the next, and its line
    comes in and goes back at the L2's fill rate (rownorm's such kernels ran 5-10x their
    old model). x, read the same way, keeps the L1's streamed rate: its moves cost less
    than xc's, where the two were alike."""
    fixes = ("fuse.xc_vs=1", "V.xc_vs.s=16", "V.xc_vs.d=1", "Q.xc_vs.d=8", "P=1")
    read = kernel_transfer(CENTRED, "x", fixes)
    written = kernel_transfer(CENTRED, "xc", fixes)
    assert written > 2 * read > 0


SCALE = """
size I = 64
size J = {J}
in  x : f32[I, J]
out y : f32[I, J]
y[i, j] = x[i, j] * 2.0
"""


def scale_objective(columns: int, hw_set: tuple[str, ...], fixes: tuple[str, ...]) -> int:
    return objective(hw_set, fixes, SCALE.format(J=columns))


NO_STRIPS = ("l1.aliased_read=0ns", "l1.aliased_write=0ns")


def test_a_strip_of_aliasing_rows_costs_its_lines_each_walk() -> None:
    """A kernel vectorised along the rows' own axis (not gathered) whose L1 tile is a
    strip one line wide down 64 rows 4 KiB apart: its [4 x 16] register tiles walk down
    the rows, and no row's line stays in the 12-way set (attention S=1024's QK^T so ran
    13.3 ms, priced 0.73: RESULTS.md, "Strips of aliasing rows"). With `aliased_read`
    and `aliased_write` it costs more than priced as streamed lines; rows 4160 bytes
    apart (no aliasing) are priced alike either way."""
    strip = ("P=1", "V.y.i=4", "V.y.j=16", "Q.y.i=16", "Q.y.j=1")
    hw = load_hardware("cpu").memory("l1")
    assert hw.aliased_read_ps > 0 and hw.aliased_write_ps > hw.aliased_read_ps
    assert scale_objective(1024, (), strip) > scale_objective(1024, NO_STRIPS, strip)
    assert scale_objective(1040, (), strip) == scale_objective(1040, NO_STRIPS, strip)


def test_short_rows_walked_by_narrower_register_tiles_share_a_rows_price() -> None:
    """An L1 tile of 64 rows 4 KiB apart, 4 lines wide, whose [4 x 16] register tiles walk
    along each row's lines before the next rows: every visit of a row costs a row's price,
    shared by its 4 register tiles, so more than streamed lines and less than the strip
    a line wide (which pays it per register tile); rows 8 lines wide stream (measured on
    AMD Zen 5, blocks of 32 rows walked so: 55 cycles a row at 4 lines, 24 at 8 and 3 a
    line at rows 4160 bytes apart: RESULTS.md, "Short rows of aliasing lines")."""
    strip = ("P=1", "V.y.i=4", "V.y.j=16", "Q.y.i=16", "Q.y.j=1")
    wide = ("P=1", "V.y.i=4", "V.y.j=16", "Q.y.i=16", "Q.y.j=4")
    wider = ("P=1", "V.y.i=4", "V.y.j=16", "Q.y.i=8", "Q.y.j=8")  # 32 rows: x, y fit
    assert scale_objective(1024, (), wide) > scale_objective(1024, NO_STRIPS, wide)
    assert scale_objective(1024, (), wide) < scale_objective(1024, (), strip)
    assert scale_objective(1088, (), wide) == scale_objective(1088, NO_STRIPS, wide)
    assert scale_objective(1024, (), wider) == scale_objective(1024, NO_STRIPS, wider)


def test_rows_walked_between_visits_of_a_line_follow_the_loop_order() -> None:
    """xc[s, d] written lane by lane by a kernel vectorised along s, [16 x 1] tiles in the
    L1 and the registers alike, 64 rows in each core's L2 tile. With the loop over the
    1024 columns outside the loop over the rows (the L3's), 64 rows are walked before a
    line comes back, more than a vector's lanes: each element's store costs a line
    (`aliased_write`). With the columns inside the rows (both loops the L2's: the
    kernel's dimensions in order), 16 rows are: the lines come back from the L1, each
    store still bringing its line both ways (`scattered`).
    (rownorm's mu_xc_vs so, columns outside 512 rows: priced 0.76 ms, ran 5.2; columns
    inside: ran 1.9: RESULTS.md, "Rows walked between visits of a line".)"""
    tiles = ("fuse.xc_vs=1", "P=1", "V.xc_vs.s=16", "V.xc_vs.d=1", "Q.xc_vs.s=1",
             "Q.xc_vs.d=1", "L.xc_vs.s=4")
    outside = kernel_transfer(CENTRED, "xc", (*tiles, "S.xc_vs.d=1024"))
    inside = kernel_transfer(CENTRED, "xc", (*tiles, "L.xc_vs.d=1024"))
    assert outside > 2 * inside > 0


def test_rows_walked_before_the_next_line_cost_an_aliased_line_each() -> None:
    """y = 2x over rows 4 KiB apart, the same [1 x 16] register tiles and [4 x 16] L1
    tiles, the L2's tile 64 rows of a line or 4 rows of 64 lines. Walking 64 rows before
    it steps along them to the rows' next line, no row's next line is prefetched and the
    lines written share one 12-way set: each costs `aliased_write` (measured on AMD Zen
    5, a line read and written per row: 4.2 cycles with 1 row walked at a time, 13.5 with
    12, 52 with 64; rownorm's xc[s, d] = x[s, d] - mu[s] so, 64 rows, ran 0.41 ms, priced
    0.038: RESULTS.md, "Rows walked before the next line"). Walking 4 rows, or rows 4160
    bytes apart, the lines are priced as any other."""
    tiles = ("P=1", "V.y.i=1", "V.y.j=16", "Q.y.i=4", "Q.y.j=1")
    down = (*tiles, "L.y.i=16", "L.y.j=1")
    along = (*tiles, "L.y.i=1", "L.y.j=64")
    assert scale_objective(1024, (), down) > 2 * scale_objective(1024, NO_STRIPS, down)
    assert scale_objective(1024, (), along) == scale_objective(1024, NO_STRIPS, along)
    assert scale_objective(1040, (), down) == scale_objective(1040, NO_STRIPS, down)


def test_a_gathered_tile_read_down_many_rows_costs_an_aliased_line_each() -> None:
    """Row sums over rows 4 KiB apart, [16 x 1] register tiles gathered along the rows:
    with 64 rows walked before the next column (the L1 tile [64 x 1]) every line read
    costs `aliased_read` where that is more than the L2's rate (rownorm's sample 14 so ran
    7.3 cycles per element, priced 2.5); with the rows' loop outside the columns' (16 rows
    walked) the lines come from the L1 at its own rate, with or without the price."""
    many = ("fuse.sm=1", "V.sm.s=16", "V.sm.d=1", "Q.sm.s=4", "Q.sm.d=1", "P=1")
    few = ("fuse.sm=1", "V.sm.s=16", "V.sm.d=1", "Q.sm.s=1", "Q.sm.d=64", "P=1")
    assert objective((), many) > objective(NO_STRIPS, many)
    assert objective((), few) == objective(NO_STRIPS, few)


def test_a_tile_as_wide_as_its_register_tiles_costs_an_aliased_line_per_row() -> None:
    """An L1 tile [64 x 32] of rows 4 KiB apart, two lines wide, walked down by [4 x 32]
    register tiles: each row's two lines, in two sets, come in together, so it costs an
    aliased line per row, half the narrow strip's [64 x 16] per column of the same rows
    (the f32 matmul 512^3 with C's L1 tile [32 x 32], rows 2 KiB apart, and [8 x 32]
    register tiles ran 24 ms, priced 2.7 as streamed lines: RESULTS.md, "Wide tiles of
    aliasing rows")."""
    narrow = ("P=1", "V.y.i=4", "V.y.j=16", "Q.y.i=16", "Q.y.j=1")
    wide = ("P=1", "V.y.i=4", "V.y.j=32", "Q.y.i=16", "Q.y.j=1")
    assert scale_objective(1024, (), wide) > 2 * scale_objective(1024, NO_STRIPS, wide)
    assert scale_objective(1024, (), wide) < 0.7 * scale_objective(1024, (), narrow)


def test_wide_rows_that_alias_come_back_at_every_step_inside_the_tile() -> None:
    """C's L1 tile [32 x 256] (rows 16 lines wide), reloaded and stored by [8 x 16]
    register tiles at every step of k (the loop over k outside theirs). With rows 2 KiB
    apart (N = 512) only 24 of its 32 rows stay in the 12-way L1, and the walk down its
    rows evicts each line before the next step comes back to it: every register tile
    brings its lines from the L2 again, 128 times, where the tile priced as kept moves in
    once (cost_fidelity's matmul-512 sample with this C tile ran 13.4 ms, priced 5.6:
    RESULTS.md, "Wide rows that alias"). With rows 2080 bytes apart the rows stay;
    without the aliasing prices the tile is kept, as before."""
    tiles = ("fuse.C#1=1", "fuse.C#2=1", "P=1", "V.C#2.m=8", "V.C#2.n=16", "V.C#2.k=1",
             "Q.C#2.m=4", "Q.C#2.n=16", "Q.C#2.k=1", "L.C#2.k=128")
    l1 = ("l1.capacity=48KiB", "l1.ways=12")

    def moves(columns: int, hw_set: tuple[str, ...]) -> int:
        gemm = F32_MATMUL.replace("size N = 64", f"size N = {columns}")
        return kernel_transfer(gemm, "C", tiles, (*l1, *hw_set), "C#2")

    aliasing, kept = moves(512, ()), moves(512, NO_STRIPS)
    assert aliasing > 64 * kept > 0
    assert moves(520, ()) == moves(520, NO_STRIPS) < 2 * kept
