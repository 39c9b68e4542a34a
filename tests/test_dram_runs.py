"""DRAM read in runs (`Memory.run_latency_ps`, the cpu model's `l3.run_latency`): the code
reads a tensor past the L3 in runs of the L2 tiles' rows, and each run costs a fixed time
beyond its bytes. Measured on AMD Zen 5 (RESULTS.md, "Weights past the L3"): 64 MiB read
in 128-byte runs of rows 16 KiB apart took 7.3 ms on one core, 2.3 ms in 4 KiB runs; the
model priced them alike, and its optimum for a 16 x 4096 x 4096 f32 GEMM (packing
4096 x 32 panels of the weight) ran 1.5x slower than the greedy schedule."""

from __future__ import annotations

import pytest
from conftest import solved_on_cpu

from synth.constraints.cost import evaluate_cost
from synth.errors import InputError
from synth.hwfile import load_hardware

# 64 MiB in, 64 MiB out: past any L3, so not warm, and both move through DRAM once
SCALE = """
size K = 4096
size N = 4096
in  x : f32[K, N]
out y : f32[K, N]
y[k, n] = x[k, n] * 2
"""
LATENCY = "30ns"


def dram_part(width: int, latency: str) -> int:
    """The DRAM part (picoseconds) of the scale's optimum with L2 tiles `width` columns
    wide and one core, under `l3.run_latency = latency`."""
    fixes = ("P=1", "V.y.n=16", "Q.y.n=1", f"L.y.n={width // 16}")
    model, env = solved_on_cpu(SCALE, (f"l3.run_latency={latency}",), fixes)
    return evaluate_cost(model, env)["transfer:dram->l3"]


@pytest.mark.parametrize("width", [32, 512])
def test_each_row_of_an_l2_tile_is_a_run_from_dram(width: int) -> None:
    """x and y each move once, K rows of N / width runs each: the latency adds exactly
    30 ns per run, whatever the L3 tiles around them."""
    runs = 2 * 4096 * (4096 // width)
    extra = dram_part(width, LATENCY) - dram_part(width, "0ns")
    assert extra == runs * 30_000


def test_narrow_tiles_cost_more_from_dram_only_with_the_latency() -> None:
    """With runs free the two widths move the same bytes at the same price; with the
    latency the narrow one costs more by its extra runs."""
    assert dram_part(32, "0ns") == dram_part(512, "0ns")
    assert dram_part(32, LATENCY) > dram_part(512, LATENCY)


def test_tensors_that_stay_in_the_l3_pay_no_runs() -> None:
    """A warm L3 (every tensor fits) moves nothing from DRAM, runs or not."""
    small = SCALE.replace("4096", "256")
    for latency in (LATENCY, "0ns"):
        model, env = solved_on_cpu(small, (f"l3.run_latency={latency}",), ("P=1",))
        assert evaluate_cost(model, env)["transfer:dram->l3"] == 0


def test_the_cpu_model_prices_runs_and_the_root_has_none() -> None:
    assert load_hardware("cpu").memory("l3").run_latency_ps > 0
    assert load_hardware("cpu", ("l3.run_latency=0ns",)).memory("l3").run_latency_ps == 0
    with pytest.raises(InputError, match="run_latency"):
        load_hardware("cpu", ("dram.run_latency=5ns",))
