"""DRAM read in runs (`Memory.run_latency_ps`, the cpu model's `l3.run_latency`): the C
emitter packs a contraction operand past the L3 into each core's L2 row by row, each row
a run read from DRAM, and each run costs a fixed time beyond its bytes. Measured on AMD
Zen 5 (RESULTS.md, "Weights past the L3"): 64 MiB read in 128-byte runs of rows 16 KiB
apart took 7.3 ms on one core, 2.3 ms in 4 KiB runs; the model priced them alike, and
its optimum for a 16 x 4096 x 4096 f32 GEMM (packing 4096 x 32 panels of the weight) ran
1.5x slower than the greedy schedule."""

from __future__ import annotations

import pytest
from conftest import F32_MATMUL, solved_on_cpu

from synth.constraints.cost import evaluate_cost
from synth.errors import InputError
from synth.hwfile import load_hardware

# a decode step's GEMM: B, 64 MiB, is past the L3 (`L3` below), so not warm; A (256 KiB)
# stays there
GEMM = (F32_MATMUL.replace("size M = 64", "size M = 16").replace("size N = 64", "size N = 4096")
        .replace("size K = 128", "size K = 4096"))
LATENCY = "30ns"
# an L3 of the fallback's size, whatever this machine's (B must not fit, A must); the caches'
# fills wholly in the max (no share exposed), as when these runs were measured
L3 = ("l3.capacity=32MiB", "l3.exposed=0", "l2.exposed=0")
KERNEL = "C#2"


def dram_part(width: int, latency: str) -> int:
    """The DRAM part (picoseconds) of the GEMM's optimum on one core, every row of A in
    one L3 tile (B moves from DRAM once) and B's L2 tiles (the packs) 256 rows deep and
    `width` columns wide, under `l3.run_latency = latency`."""
    fixes = ("P=1", f"fuse.{KERNEL}=1", f"S.{KERNEL}.m=1", f"L.{KERNEL}.m=2",
             f"Q.{KERNEL}.m=1", f"V.{KERNEL}.m=8", f"V.{KERNEL}.n=32", f"Q.{KERNEL}.n=1",
             f"L.{KERNEL}.n={width // 32}", f"L.{KERNEL}.k=256", f"Q.{KERNEL}.k=1",
             f"V.{KERNEL}.k=1")
    model, env = solved_on_cpu(GEMM, (f"l3.run_latency={latency}", *L3), fixes)
    return evaluate_cost(model, env)["transfer:dram->l3"]


def test_each_row_of_a_pack_is_a_run_from_dram() -> None:
    """B's packs read its K rows in N / width runs each: the latency adds 30 ns per run,
    so the narrow packs pay for K x (4096 / 32 - 4096 / 512) more runs than the wide
    ones, whatever the L3 tiles around them (A, which stays, pays alike in both)."""
    extra = {width: dram_part(width, LATENCY) - dram_part(width, "0ns") for width in (32, 512)}
    assert extra[512] > 0
    assert extra[32] - extra[512] == 4096 * (4096 // 32 - 4096 // 512) * 30_000


def test_narrow_packs_cost_more_from_dram_only_with_the_latency() -> None:
    """With runs free the two widths move the same bytes at the same price; with the
    latency the narrow one costs more by its extra runs."""
    assert dram_part(32, "0ns") == dram_part(512, "0ns")
    assert dram_part(32, LATENCY) > dram_part(512, LATENCY)


def test_tensors_read_in_place_or_in_the_l3_pay_no_runs() -> None:
    """A tensor the kernel reads in place (not a contraction operand: the inner loops and
    the prefetchers decide its runs) pays none, nor does a warm L3 (every tensor fits)."""
    scale = """
size K = 4096
size N = 4096
in  x : f32[K, N]
out y : f32[K, N]
y[k, n] = x[k, n] * 2
"""
    fixes = ("P=1", "V.y.n=16", "Q.y.n=1", "L.y.n=2")
    parts = {latency: evaluate_cost(*solved_on_cpu(scale, (f"l3.run_latency={latency}", *L3),
                                                   fixes))["transfer:dram->l3"]
             for latency in (LATENCY, "0ns")}
    assert parts[LATENCY] == parts["0ns"] > 0
    small, env = solved_on_cpu(GEMM.replace("4096", "256"),
                              (f"l3.run_latency={LATENCY}", *L3))
    assert evaluate_cost(small, env)["transfer:dram->l3"] == 0


def test_the_cpu_model_prices_runs_and_the_root_has_none() -> None:
    assert load_hardware("cpu").memory("l3").run_latency_ps > 0
    assert load_hardware("cpu", ("l3.run_latency=0ns",)).memory("l3").run_latency_ps == 0
    with pytest.raises(InputError, match="run_latency"):
        load_hardware("cpu", ("dram.run_latency=5ns",))
