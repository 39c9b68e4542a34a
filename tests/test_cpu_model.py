"""The CPU's cost terms (synth/constraints/roofline.py and the cpu model's keys): vector
registers, dependence chains, overlapping caches, parallel-region starts. Each test
compares two schedules or two models, never an exact float of the model; whether the
terms rank real runs right is measured in benchmarks/cost_fidelity.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import gemm, solve

from synth import hwunits
from synth.constraints import expr as ex
from synth.constraints.cost import Model, evaluate_cost
from synth.constraints.result import Status
from synth.errors import InputError
from synth.hwfile import load_hardware
from synth.lang import parse_workload
from synth.pipeline import encode
from synth.vectors import vector_dim
from synth.workload import Workload

MATMUL = gemm(64, 64, 64)

SOFTMAX = """
size N = 4096
in  x : f32[N]
out y : f32[N]
m[]  max= x[i]
e[i]  =   exp(x[i] - m[])
s[]  +=   e[i]
y[i]  =   e[i] / s[]
"""


def solved(workload: Workload, hw_set: tuple[str, ...] = (),
           fixes: tuple[str, ...] = ()) -> tuple[Model, dict[str, int]]:
    model = encode(workload, load_hardware("cpu", hw_set), fixes=fixes)
    result = solve(model.constraints)
    assert result.status is Status.OPTIMAL and result.env is not None
    return model, dict(result.env)


def parts(model: Model, env: dict[str, int]) -> dict[str, int]:
    return evaluate_cost(model, env)


def objective(model: Model, env: dict[str, int]) -> int:
    return ex.evaluate(model.constraints.objective, env)


# ---------------------------------------------------------------- the machine


@pytest.mark.parametrize(("flags", "expected"), [
    ("fpu sse2 avx avx2 fma avx512f avx512bw", (32, 64)),
    ("fpu sse2 avx avx2 fma", (16, 32)),
    ("fpu sse2", (16, 16)),
])
def test_vector_isa_from_cpuinfo(tmp_path: Path, flags: str,
                                 expected: tuple[int, int]) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nflags\t\t: {flags}\n\nprocessor\t: 1\n")
    assert hwunits.vector_isa(cpuinfo) == expected


def test_vector_isa_without_cpuinfo(tmp_path: Path) -> None:
    assert hwunits.vector_isa(tmp_path / "missing") == (16, 16)


def test_register_file_follows_the_isa(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("flags\t\t: sse2 avx avx2 fma\n")
    monkeypatch.setattr(hwunits, "CPUINFO", cpuinfo)
    hw = load_hardware("cpu")
    assert hw.memory("reg").capacity == 16 * 32
    assert hw.compute.lanes == {"f32": 8, "i32": 8}


@pytest.mark.parametrize(("setting", "message"), [
    ("compute.vector_tiles=3", r"compute: vector_tiles: expected true or false"),
    ("l1.overlap=yes", r"'l1': overlap: expected true or false"),
    ("compute.accumulate_latency.f32=-1", r"accumulate_latency: f32"),
    ("core.fork=fast", r"fork"),
])
def test_bad_cpu_keys_are_named(setting: str, message: str) -> None:
    with pytest.raises(InputError, match=message):
        load_hardware("cpu", (setting,))


# ---------------------------------------------------------------- register tiles


def test_register_tiles_are_whole_vectors_and_fit() -> None:
    workload = parse_workload(MATMUL, "<test>", "mm")
    model, env = solved(workload)
    hw = model.hw
    lanes = hw.compute.lanes["f32"]
    [kernel] = model.selected(env)
    assert vector_dim(kernel.statements) == "n"
    tile = {d: env.get(f"V.{kernel.name}.{d}", 1) for d in "mnk"}
    assert tile["n"] % lanes == 0
    # the accumulator tile alone fits the register file
    assert tile["m"] * tile["n"] * 4 <= hw.memory("reg").capacity


def test_one_accumulator_is_chain_bound() -> None:
    """A 1 x lanes register tile of a GEMM updates one vector accumulator in a row (4
    cycles each; with 64 updates per tile the next tiles' chains hide a third of it:
    `cpu_compute.chain_cost`); eight rows of accumulators hide that latency."""
    workload = parse_workload(MATMUL, "<test>", "mm")
    model, _ = solved(workload)
    [kernel] = model.kernels
    lanes = model.hw.compute.lanes["f32"]
    name = kernel.name
    narrow = solved(workload, fixes=(f"V.{name}.m=1", f"V.{name}.n={lanes}",
                                     f"V.{name}.k=1", f"Q.{name}.k=64", "P=1"))
    wide = solved(workload, fixes=(f"V.{name}.m=8", f"V.{name}.n={lanes}",
                                   f"V.{name}.k=1", f"Q.{name}.k=64", "P=1"))
    assert parts(*narrow)["compute"] > 1.5 * parts(*wide)["compute"]
    # without the latency the two issue the same instructions
    flat = ("compute.accumulate_latency.f32=0",)
    narrow_flat = solved(workload, flat, (f"V.{name}.m=1", f"V.{name}.n={lanes}",
                                          f"V.{name}.k=1", f"Q.{name}.k=64", "P=1"))
    wide_flat = solved(workload, flat, (f"V.{name}.m=8", f"V.{name}.n={lanes}",
                                        f"V.{name}.k=1", f"Q.{name}.k=64", "P=1"))
    assert parts(*narrow_flat)["compute"] == parts(*wide_flat)["compute"]


def test_shorter_than_a_vector_runs_scalar() -> None:
    """N = 8 is shorter than one vector: its register tiles are scalars, one instruction
    per element, where N = 16 * lanes issues one per 16 * lanes elements."""
    lanes = load_hardware("cpu").compute.lanes["f32"]
    short = solved(parse_workload(MATMUL, "<test>", "mm", {"N": 8}))
    whole = solved(parse_workload(MATMUL, "<test>", "mm", {"N": lanes}))
    assert parts(*short)["compute"] > 2 * parts(*whole)["compute"]


def test_folds_make_tiny_reduction_tiles_dear() -> None:
    """A reduction along the vector dimension folds its vector accumulators each time its
    target leaves the registers: one vector per register tile folds 16 times as often as
    sixteen."""
    workload = parse_workload(SOFTMAX, "<test>", "sm")
    model, _ = solved(workload)
    lanes = model.hw.compute.lanes["f32"]
    def tiles(width: int) -> tuple[str, ...]:  # the loop outside the cores walks i
        return (f"S.m.i={4096 // width}", f"V.m.i={width}", "L.m.i=1", "Q.m.i=1", "P=1")

    one = solved(workload, fixes=tiles(lanes))
    many = solved(workload, fixes=tiles(16 * lanes))
    assert parts(*one)["compute"] > parts(*many)["compute"]


# ---------------------------------------------------------------- caches and regions


def test_overlapped_parts_sum_to_the_objective() -> None:
    for text in (MATMUL, SOFTMAX):
        model, env = solved(parse_workload(text, "<test>", "w"), ("l3.warm=false",))
        breakdown = parts(model, env)
        assert sum(breakdown.values()) == objective(model, env)
        assert any(v > 0 for k, v in breakdown.items() if k.startswith("transfer:"))


def test_overlap_takes_the_longest_not_the_sum() -> None:
    workload = parse_workload(SOFTMAX, "<test>", "sm")
    model, env = solved(workload, ("l3.warm=false",))
    serial = encode(workload, load_hardware("cpu", (
        "l3.warm=false", "l3.overlap=false", "l2.overlap=false", "l1.overlap=false")))
    assert objective(serial, env) > objective(model, env)
    both = parts(serial, env)
    assert objective(model, env) >= max(both["compute"], *(
        v for k, v in both.items() if k.startswith("transfer:")))


def test_warm_last_level_cache() -> None:
    workload = parse_workload(SOFTMAX, "<test>", "sm")
    model, env = solved(workload)
    assert parts(model, env)["transfer:dram->l3"] == 0  # 48 KiB of tensors stay in L3
    cold = encode(workload, load_hardware("cpu", ("l3.warm=false",)))
    assert parts(cold, env)["transfer:dram->l3"] > 0


def test_a_cache_keeps_a_tile_across_loops_that_do_not_walk_it() -> None:
    """C's L2 tile stays across a loop over k outside the cores; an explicit copy (cache
    off) moves it again every step."""
    workload = parse_workload(MATMUL, "<test>", "mm")
    model, _ = solved(workload)
    [kernel] = model.kernels
    fixes = (f"S.{kernel.name}.k=4", "P=1", "l3.warm=false")
    cold = ("l3.warm=false", "l2.warm=false", "core.count=1")
    cached = solved(workload, cold, fixes[:2])
    copied = encode(workload, load_hardware("cpu", (*cold, "l2.cache=false")))
    env = cached[1]
    assert parts(copied, env)["transfer:l3->l2"] > parts(*cached)["transfer:l3->l2"]


def test_parallel_regions_cost_per_start_with_several_cores() -> None:
    workload = parse_workload(MATMUL, "<test>", "mm")
    model, _ = solved(workload)
    [kernel] = model.kernels
    fork = model.hw.level("core").fork_ps
    one = solved(workload, fixes=("P=1", f"S.{kernel.name}.k=4"))
    two = solved(workload, fixes=(f"P.{kernel.name}.m=2", f"S.{kernel.name}.k=4",
                                  f"S.{kernel.name}.m=1", f"S.{kernel.name}.n=1"))
    assert parts(*one)["launch"] == 0
    assert parts(*two)["launch"] == 4 * fork
