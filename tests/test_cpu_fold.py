"""The cpu model's folds of vector accumulators (issue 11, RESULTS.md "Cost fidelity
round 4"):

- `compute.shuffle_cycles`: the cross-lane shuffles of a lane fold (vextract, vpermil,
  vshuf) run on one port, a cycle each (cpu.toml `{ f32 = 1 }`), not at a `mov`'s two a
  cycle: a fold of one vector after each tile of exps added 6.5 cycles, priced 4.8 at a
  `mov` and 6.8 at a cycle (softmax's samples 8 and 12, which fold their sum at each of
  65536 tiles, ran 0.97 ms, priced 0.89);
- a max (or min) folds its lanes with the ISA's one instruction (vmaxps), priced as an
  add, whatever `max` costs (`vmax_f32` was a compare and select at 1.5 cycles; it is now
  vmaxps too).

Relations only, deterministic solver limits."""

from __future__ import annotations

from collections import Counter

import pytest
from conftest import solved_on_cpu

from synth.constraints.cost import evaluate_cost
from synth.errors import InputError
from synth.hwfile import load_hardware
from synth.pipeline import encode
from synth.workload import DType

SUM = """
size N = 16384
in  x : f32[N]
out s : f32[]
s[] += exp(x[i])
"""

MAX = """
size N = 16384
in  x : f32[N]
out m : f32[]
m[] max= x[i]
"""



def per_tile(kernel: str, lanes: int) -> tuple[str, ...]:
    """One vector per register tile, its target folded and stored after every tile."""
    return (f"S.{kernel}.i={16384 // lanes}", f"L.{kernel}.i=1", f"Q.{kernel}.i=1",
            f"V.{kernel}.i={lanes}", "P=1")


def once(kernel: str, lanes: int) -> tuple[str, ...]:
    """The same register tile, folded once after all of them."""
    return (f"S.{kernel}.i=1", f"L.{kernel}.i={16384 // lanes}", f"Q.{kernel}.i=1",
            f"V.{kernel}.i={lanes}", "P=1")


def test_a_fold_shuffle_takes_a_cycle() -> None:
    compute = load_hardware("cpu").compute
    assert compute.shuffle_cycles["f32"] == 1
    assert compute.shuffle_ps(DType.F32) > compute.point_ps(Counter({"mov": 1}), DType.F32, 1)
    assert compute.shuffle_ps(DType.I32) == compute.point_ps(Counter({"mov": 1}), DType.I32, 1)


def test_folding_at_every_tile_prices_the_shuffles_at_a_cycle() -> None:
    """The sum folded after each of 1024 tiles: its compute is above the same schedule's
    with the shuffles at a `mov`'s price, by 4 shuffles (log2 16 lanes) x the difference
    per fold at AVX-512's 16 lanes."""
    lanes = load_hardware("cpu").compute.lanes["f32"]
    model, env = solved_on_cpu(SUM, (), per_tile("s", lanes))
    mov = "compute.shuffle_cycles.f32=" + str(load_hardware("cpu").compute.cycles["f32"]["mov"])
    cheap = encode(model.workload, load_hardware("cpu", (mov,)))
    dearer, before = evaluate_cost(model, env)["compute"], evaluate_cost(cheap, env)["compute"]
    assert dearer > before
    compute = model.hw.compute
    steps = (lanes - 1).bit_length()
    gap = steps * (compute.shuffle_ps(DType.F32) - cheap.hw.compute.shuffle_ps(DType.F32))
    assert dearer - before == pytest.approx(gap * 16384 // lanes, rel=0.05)
    _, env_once = solved_on_cpu(SUM, (), once("s", lanes))
    assert evaluate_cost(model, env_once)["compute"] < dearer


def test_a_max_folds_its_lanes_at_an_instructions_price() -> None:
    """m max= x[i] folded after each tile: the folds cost the shuffles (a `mov` each: no
    exp in the kernel) and one add-priced instruction per step, less than at `max`'s
    price where a max costs more than an add (a model with the compare and select's 1.5
    cycles)."""
    lanes = load_hardware("cpu").compute.lanes["f32"]
    solved, env = solved_on_cpu(MAX, (), per_tile("m", lanes))
    _, env_once = solved_on_cpu(MAX, (), once("m", lanes))
    model = encode(solved.workload, load_hardware("cpu", ("compute.cycles.f32.max=1.5",)))
    compute = model.hw.compute
    folds = 16384 // lanes - 1
    extra = (evaluate_cost(model, env)["compute"]
             - evaluate_cost(model, env_once)["compute"]) / folds
    steps = (lanes - 1).bit_length()
    vmax = compute.point_ps(Counter({"max": 1}), DType.F32, 1)
    add = compute.point_ps(Counter({"add": 1}), DType.F32, 1)
    assert vmax > add
    shuffle = compute.point_ps(Counter({"mov": 1}), DType.F32, 1)
    assert steps * shuffle < extra < steps * (vmax + shuffle)


def test_folds_without_exps_beside_them_cost_a_mov_a_shuffle() -> None:
    """`shuffle_cycles` is what a fold's shuffle costs after each vector of exps (the
    exps' chains fill the out-of-order window). Without a vector math routine in the
    kernel, the folds of successive tiles run side by side: softmax's max kernel folding
    every vector ran 3.8 cycles a vector, priced 9 at the calibrated shuffle (RESULTS.md,
    "Folds without exps"). So the max's price does not move with `shuffle_cycles`; the
    sum of exps' does."""
    lanes = load_hardware("cpu").compute.lanes["f32"]
    dear = ("compute.shuffle_cycles.f32=4",)
    for text, kernel, moves in ((MAX, "m", False), (SUM, "s", True)):
        solved, env = solved_on_cpu(text, (), per_tile(kernel, lanes))
        priced = evaluate_cost(solved, env)["compute"]
        dearer = evaluate_cost(encode(solved.workload, load_hardware("cpu", dear)), env)
        assert (dearer["compute"] > priced) is moves


def test_shuffle_cycles_bad_values_are_clear_errors() -> None:
    for bad in ("compute.shuffle_cycles.f32=-1", "compute.shuffle_cycles.f32=one",
                "compute.shuffle_cycles.f99=1"):
        with pytest.raises(InputError, match="shuffle_cycles"):
            load_hardware("cpu", (bad,))


DOT = """
size N = 16384
in  x : f32[N]
in  w : f32[N]
out d : f32[]
d[] += x[i] * w[i]
"""


@pytest.mark.parametrize(("text", "waits"), [(SUM, "add"), (MAX, "add"), (DOT, "fma")])
def test_an_accumulator_waits_its_own_operations_latency(text: str, waits: str) -> None:
    """A sum or a maximum accumulates by one add or vmaxps (2 cycles on AMD Zen 5), a dot
    product by FMA (4): `add_latency` prices the first, `accumulate_latency` the second,
    and without `add_latency` both wait `accumulate_latency`."""
    from synth.constraints.roofline import accumulate_ps
    from synth.lang import parse_workload

    stmt = parse_workload(text, "<test>", "w").statements[-1]
    split = load_hardware("cpu", ("compute.add_latency.f32=2",
                                  "compute.accumulate_latency.f32=4")).compute
    same = load_hardware("cpu", ("compute.accumulate_latency.f32=4",)).compute
    ps_per_cycle = 1e12 / split.clock_hz
    assert accumulate_ps(stmt, split) == round((2 if waits == "add" else 4) * ps_per_cycle)
    assert accumulate_ps(stmt, same) == round(4 * ps_per_cycle)
