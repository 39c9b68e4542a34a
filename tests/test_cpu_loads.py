"""Broadcasting loads and gathers into the registers, priced by their instructions'
cycles where the model says them (`compute.broadcast_cycles`, `compute.gather_cycles`,
which `synth calibrate` measures; `cost.loaded_bytes`). On AMD Zen 5 a broadcast takes
half a cycle (two load ports) and a gather of 16 lanes 20-24 cycles, where a register's
bytes at the registers' rate priced one cycle and 16 (RESULTS.md, "Max as one
instruction"). Relations only, deterministic solver limits."""

from __future__ import annotations

import conftest
import pytest
from conftest import solved_on_cpu
from test_cpu_model import MATMUL

from synth.constraints.cost import evaluate_cost
from synth.hwfile import load_hardware
from synth.pipeline import encode

ROW_SUM = conftest.ROW_SUM.replace("size D = 1024", "size D = 256")


def register_moves(text: str, hw_set: tuple[str, ...], fixes: tuple[str, ...]) -> int:
    """The moves into the registers of the schedule `fixes`, under the model `hw_set`."""
    solved, env = solved_on_cpu(text, (), fixes)
    model = encode(solved.workload, load_hardware("cpu", hw_set))
    return sum(v for k, v in evaluate_cost(model, env).items() if k.endswith("->reg"))


def test_a_broadcast_costs_its_cycles_not_a_registers_bytes() -> None:
    """A [4 x 16] register tile of C loads 4 elements of A per step, each broadcast: at
    half a cycle each they cost less than a 64-byte register each at the registers' rate
    (88 B/cycle in `cpu`), at 2 cycles more; B's vector loads are unchanged."""
    tile = ("V.C.m=4", "V.C.n=16", "V.C.k=1", "P=1")
    plain = register_moves(MATMUL, (), tile)
    cheap = register_moves(MATMUL, ("compute.broadcast_cycles.f32=0.5",), tile)
    dear = register_moves(MATMUL, ("compute.broadcast_cycles.f32=2",), tile)
    assert cheap < plain < dear


def test_a_gather_costs_its_cycles_over_its_lanes() -> None:
    """Row sums vectorised along the rows gather x: at 24 cycles per 16-lane gather an
    element costs more than a register's bytes at 88 B/cycle (0.73 cycles), at 4 less."""
    tile = ("fuse.sm=1", "V.sm.s=16", "V.sm.d=4", "P=1")
    plain = register_moves(ROW_SUM, ("l1.ways=0",), tile)
    dear = register_moves(ROW_SUM, ("l1.ways=0", "compute.gather_cycles.f32=24"), tile)
    cheap = register_moves(ROW_SUM, ("l1.ways=0", "compute.gather_cycles.f32=4"), tile)
    assert cheap < plain < dear


def test_a_gather_alone_costs_more_than_each_of_a_run() -> None:
    """The emitter gathers a register tile's vectors back to back: on AMD Zen 5 a run of
    them took 13.5 cycles each, a gather between other instructions 20.5
    (`compute.grouped_gather_cycles`, `cost.gather_starts`). A [16 x 1] tile of x is one
    gather per fill and costs `gather_cycles` whatever a run's price; a [16 x 4] tile is a
    run of 4, cheaper where runs are cheaper."""
    alone = ("fuse.sm=1", "V.sm.s=16", "V.sm.d=1", "P=1")
    run = ("fuse.sm=1", "V.sm.s=16", "V.sm.d=4", "P=1")
    flat = ("l1.ways=0", "compute.gather_cycles.f32=20")
    runs = (*flat, "compute.grouped_gather_cycles.f32=13")
    # (the same but for rounding to whole picoseconds per byte and per start)
    assert register_moves(ROW_SUM, runs, alone) == pytest.approx(
        register_moves(ROW_SUM, flat, alone), rel=0.01)
    assert register_moves(ROW_SUM, runs, run) < register_moves(ROW_SUM, flat, run)
    # a run of 4 pays one start of 7 cycles: 13 + 7 / 4 = 14.75 cycles a gather
    assert register_moves(ROW_SUM, runs, run) < 0.8 * register_moves(ROW_SUM, runs, alone)


def test_a_gather_is_priced_whole_not_at_the_exposed_share() -> None:
    """A gather is microcoded; the core's FMAs do not run beside it (fa6's [1 x 16] tile
    of Q K^T, one gather and one FMA per step, ran 20 cycles a step), so the registers'
    `exposed` share scales the other moves into the registers, not the gathers."""
    tile = ("fuse.sm=1", "V.sm.s=16", "V.sm.d=4", "P=1")
    gathers = ("l1.ways=0", "compute.gather_cycles.f32=20")
    low, high = ("reg.exposed=0.2",), ("reg.exposed=0.8",)
    gathered_low = register_moves(ROW_SUM, (*gathers, *low), tile)
    gathered_high = register_moves(ROW_SUM, (*gathers, *high), tile)
    # x's 64 x 256 gathered elements cost 20 / 16 cycles each at both shares
    x_cycles = 64 * 256 * 20 / 16
    clock = load_hardware("cpu").compute.clock_hz
    assert gathered_low >= x_cycles * 1e12 / clock * 0.98
    assert gathered_high - gathered_low < 0.5 * x_cycles * 1e12 / clock
