"""The cpu model's divider and its chains across register tiles (issue 11, RESULTS.md
"Scalar divisions" and "Chains across register tiles"):

- `compute.divider_lanes`: div, sqrt, rsqrt and recip run on a divider 4 f32 lanes wide,
  so in scalar code they cost a quarter of a 16-lane instruction (measured: scalar
  1/sqrt 5.0 cycles, 16 lanes 20.1); rownorm's r[s] = rsqrt(...) recomputed per row for
  every column tile was priced 0.31 ms in a kernel that ran 0.14;
- `cpu_compute.chain_cost`: one accumulator per register tile with u updates runs at
  about latency x u / (u + window) per FMA, not the full latency from u = window on; and
  the updates in a row continue through memory where the register tile is loaded and
  stored at every step of a reduction loop it cannot be hoisted above (RESULTS.md,
  "Chains through memory").

Relations only, deterministic solver limits."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from conftest import gemm, solved_on_cpu

from synth.constraints import cpu_compute
from synth.constraints import expr as ex
from synth.constraints.cost import KernelTerms, evaluate_cost
from synth.errors import InputError
from synth.hwfile import load_hardware
from synth.pipeline import encode
from synth.workload import DType

ROW_NORM = """
size S = 64
size D = 1024
in  x : f32[S, D]
in  vs : f32[S]
out y : f32[S, D]
r[s]     = rsqrt(vs[s] / D + 0.00001)
y[s, d]  = x[s, d] * r[s]
"""

MATMUL = gemm(64, 64, 256)



def test_scalar_divisions_cost_a_quarter_of_a_vector_one() -> None:
    """(With AVX-512's 16 lanes a quarter; with AVX2's 8, a half.)"""
    compute = load_hardware("cpu").compute
    lanes = compute.lanes["f32"]
    assert compute.divider_lanes["f32"] == 4 and lanes >= 8
    ratio = lanes / 4
    ops = Counter({"rsqrt": 1})
    vector = compute.point_ps(ops, DType.F32, lanes) * lanes  # one whole-vector instruction
    scalar = compute.point_ps(ops, DType.F32, 1)
    assert 0.9 * ratio * scalar < vector < 1.1 * ratio * scalar
    adds = Counter({"add": 1})  # other operations cost alike at any width
    assert compute.point_ps(adds, DType.F32, lanes) * lanes == pytest.approx(
        compute.point_ps(adds, DType.F32, 1), rel=0.05)
    wide = load_hardware("cpu", (f"compute.divider_lanes.f32={lanes}",)).compute
    assert wide.point_ps(ops, DType.F32, 1) > 0.9 * ratio * scalar


def test_a_row_statistic_recomputed_per_column_tile_is_cheaper_scalar() -> None:
    """r[s] fused with y and recomputed for every tile of 16 columns: the scalar
    rsqrt of each row is the kernel's compute; priced on a 4-lane divider it costs less
    than on one as wide as the vector."""
    lanes = load_hardware("cpu").compute.lanes["f32"]
    fixes = ("fuse.r_y=1", f"V.r_y.d={lanes}", "V.r_y.s=1", "P=1")
    model, env = solved_on_cpu(ROW_NORM, (), fixes)
    wide = encode(model.workload, load_hardware("cpu", (f"compute.divider_lanes.f32={lanes}",)))
    assert evaluate_cost(model, env)["compute"] < evaluate_cost(wide, env)["compute"]


def test_divider_lanes_bad_values_are_clear_errors() -> None:
    for bad in ("compute.divider_lanes.f32=0", "compute.divider_lanes.f32=two"):
        with pytest.raises(InputError, match="divider_lanes"):
            load_hardware("cpu", (bad,))


def test_a_long_chain_per_tile_is_not_exposed_in_full() -> None:
    """One accumulator per 1 x lanes register tile with 256 updates per tile: priced
    between half and all of latency x its updates (measured 2.5 of 4 cycles per FMA;
    the min of chain and window share priced all of it)."""
    hw = load_hardware("cpu").compute
    lanes = hw.lanes["f32"]
    fixes = ("V.C.m=1", f"V.C.n={lanes}", "V.C.k=1", "Q.C.k=256", "P=1")
    model, env = solved_on_cpu(MATMUL, (), fixes)
    fmas = 64 * 64 * 256 // lanes
    full = fmas * round(4 * 1e12 / hw.clock_hz)
    assert full / 2 < evaluate_cost(model, env)["compute"] < full


def test_a_chain_continues_through_memory() -> None:
    """[1 x lanes] register tiles of C, k's 256 steps in a loop around each: hoisted above
    the loop at L1, or loaded and stored at every step of the loop at L3 (outside the
    cores, where it cannot be hoisted): the same 256 updates in a row, and the same
    compute. A loop along n inside the one along k makes the tiles' updates interleave:
    no chain."""
    lanes = load_hardware("cpu").compute.lanes["f32"]
    tile = ("P=1", "V.C.m=1", f"V.C.n={lanes}", "V.C.k=1", "S.C.m=64", "L.C.m=1", "Q.C.m=1",
            "Q.C.n=1")

    def compute(*fixes: str) -> int:
        model, env = solved_on_cpu(MATMUL, (), (*tile, *fixes))
        return evaluate_cost(model, env)["compute"]

    hoisted = compute(f"S.C.n={64 // lanes}", "L.C.n=1", "S.C.k=1", "L.C.k=1", "Q.C.k=256")
    through_memory = compute(f"S.C.n={64 // lanes}", "L.C.n=1", "S.C.k=256", "L.C.k=1",
                             "Q.C.k=1")
    interleaved = compute("S.C.n=1", "S.C.k=256", "L.C.k=1", "Q.C.k=1",
                          f"L.C.n={64 // lanes}")
    assert through_memory == hoisted
    assert interleaved < through_memory / 2


FA6 = (Path(__file__).resolve().parent.parent / "synth" / "workloads" / "fa6.syn").read_text()


def test_routines_between_the_tiles_lengthen_their_chains() -> None:
    """fa6's QK^T fused with its epilogue (exp, sqrt and recip per element): those
    routines fill the out-of-order window between the [1 x lanes] tiles' chains of 64
    updates, so more of each chain shows (measured 163 cycles a tile, 136 priced without
    them). The fill before a GEMM's accumulations is no routine."""
    lanes = load_hardware("cpu").compute.lanes["f32"]
    model, env = solved_on_cpu(FA6, (), ("P=1", "fuse.kt=1", "fuse.s_u_p_r_O=1",
                                         "V.s_u_p_r_O.i=1", f"V.s_u_p_r_O.j={lanes}",
                                         "V.s_u_p_r_O.d=1"))
    kernel = next(k for k in model.selected(env) if k.name == "s_u_p_r_O")
    kt = KernelTerms(kernel, model.factors, model.hw)
    stmt = model.workload.statement("s")
    width = {s.name: lanes for s in kernel.statements}
    routine = cpu_compute.routine_instructions(kt, stmt, width)
    assert routine > 16  # an exp alone issues in the time of 28 FMAs
    with_routines = ex.evaluate(cpu_compute.chain_cost(kt, stmt, "j", lanes, routine), env)
    without = ex.evaluate(cpu_compute.chain_cost(kt, stmt, "j", lanes), env)
    assert with_routines > 1.2 * without

    gemm, genv = solved_on_cpu(MATMUL.replace("C[m, n] +=", "C[m, n] = 0\nC[m, n] +="), (),
                               ("fuse.C#1_C#2=1",))
    [fused] = gemm.selected(genv)
    assert cpu_compute.routine_instructions(
        KernelTerms(fused, gemm.factors, gemm.hw), gemm.workload.statement("C#2"),
        dict.fromkeys((s.name for s in fused.statements), lanes)) == 0
