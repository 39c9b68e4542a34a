"""The greedy baseline (`--solver greedy`, seed 000's TileFirst order): its schedules satisfy
every constraint and validate against NumPy, CP-SAT's optimum is never worse, it is
deterministic and fast, its variable order is the seed's, and where it loses it is because
of that order (it fills the tasklets and the WRAM tile before the ranks)."""

from __future__ import annotations

import functools
import time

import pytest
from conftest import TWO_CORES, solve

from synth import pipeline
from synth.constraints import expr as ex
from synth.constraints import greedy
from synth.constraints.cost import Model, evaluate_cost
from synth.constraints.result import SolveResult, Status
from synth.constraints.space import ConstraintSet, NamedConstraint, Slot, SlotKind
from synth.lang import list_builtin_workloads
from synth.workload import Workload

# every built-in at sizes where CP-SAT proves its optimum quickly; prime and uneven sizes
# make the greedy move padded extents
SMALL_SIZES: dict[str, dict[str, int]] = {
    "attention": {"S": 8, "D": 4},
    "fa6": {"S": 8, "D": 2},
    "gemm2k": {"M": 8, "N": 8, "K": 8},
    "matmul": {"M": 6, "N": 10, "K": 7},
    "mv": {"M": 8, "N": 12},
    "red": {"N": 13},
    "softmax": {"N": 64},
    "va": {"N": 20},
    "rmsnorm": {"S": 6, "D": 10},
    "layernorm": {"S": 6, "D": 10},
    "swiglu": {"S": 4, "D": 6, "F": 10},
    "mha": {"B": 2, "H": 2, "S": 6, "E": 4},
    "transformer": {"S": 4, "D": 8, "H": 2, "E": 4, "F": 8},
}
HARDWARE = {"upmem": (), "cpu": TWO_CORES}  # the CPU's core count pinned: same on any machine


@functools.cache
def encoded(workload: str, hw: str, sizes: tuple[tuple[str, int], ...] = (),
            constraints: tuple[str, ...] = ()) -> tuple[Workload, Model]:
    request = pipeline.Request(workload, hw, sizes=dict(sizes), hw_overrides=HARDWARE[hw])
    wl = pipeline.parse(request)
    return wl, pipeline.encode(wl, pipeline.hardware(request), constraints)


def small(workload: str, hw: str) -> tuple[Workload, Model]:
    return encoded(workload, hw, tuple(sorted(SMALL_SIZES[workload].items())))


def solve_greedy(model: Model, time_limit_s: float = 30.0) -> SolveResult:
    return greedy.solve(model.constraints, time_limit_s, model.slots)


def test_every_builtin_has_small_sizes() -> None:
    assert sorted(SMALL_SIZES) == list_builtin_workloads()


# ---------------------------------------------------------------- schedules are correct


VALIDATED = [("softmax", "upmem"), ("softmax", "cpu"), ("va", "upmem"), ("red", "upmem"),
             ("mv", "upmem"), ("matmul", "cpu"), ("attention", "upmem"), ("fa6", "cpu")]


@pytest.mark.parametrize(("workload", "hw"), VALIDATED, ids=[f"{w}/{h}" for w, h in VALIDATED])
def test_greedy_schedule_satisfies_every_constraint_and_validates(workload: str,
                                                                   hw: str) -> None:
    wl, model = small(workload, hw)
    result = solve_greedy(model)
    assert result.solver == "greedy"
    assert result.status is Status.FEASIBLE  # never OPTIMAL: it proves nothing
    assert result.bound is None
    assert result.env is not None and result.objective is not None
    env = dict(result.env)
    assert model.constraints.violated(env) == []
    assert result.objective == sum(evaluate_cost(model, env).values())
    program = pipeline.materialize(model, env)
    pipeline.verify(program, wl, model.hw)
    validation = pipeline.validate(program, wl)
    assert validation.passed, validation.per_output


@pytest.mark.parametrize("hw", sorted(HARDWARE))
@pytest.mark.parametrize("workload", sorted(SMALL_SIZES))
def test_cpsat_optimum_is_never_worse_than_the_greedy(workload: str, hw: str) -> None:
    _, model = small(workload, hw)
    optimum = solve(model.constraints)
    result = solve_greedy(model)
    assert optimum.status is Status.OPTIMAL
    assert result.status is Status.FEASIBLE
    assert optimum.objective is not None and result.objective is not None
    assert optimum.objective <= result.objective


def test_greedy_is_deterministic() -> None:
    for workload, hw in [("softmax", "upmem"), ("attention", "cpu"), ("matmul", "upmem")]:
        first = solve_greedy(small(workload, hw)[1])
        # a fresh encoding, not the cached one: nothing depends on object identity
        sizes = SMALL_SIZES[workload]
        request = pipeline.Request(workload, hw, sizes=sizes, hw_overrides=HARDWARE[hw])
        again = solve_greedy(pipeline.encode(pipeline.parse(request),
                                             pipeline.hardware(request)))
        assert first.env == again.env
        assert first.objective == again.objective
        assert first.stats == again.stats


@pytest.mark.parametrize("hw", sorted(HARDWARE))
def test_greedy_finds_a_schedule_on_every_builtin_at_default_sizes(hw: str) -> None:
    # its speed (under 0.5 s each; the transformer block about 0.7 s idle) is measured in
    # benchmarks/greedy_vs_optimal.py and benchmarks/scale.py, not held to in a test
    for workload in (w for w in list_builtin_workloads() if w != "transformer"):
        _, model = encoded(workload, hw)
        result = solve_greedy(model)
        assert result.status is Status.FEASIBLE, (workload, result.stats)
        assert result.env is not None and model.constraints.violated(result.env) == []


# ---------------------------------------------------------------- the seed's order


def test_variable_order_on_upmem_is_the_seeds() -> None:
    _, model = encoded("softmax", "upmem", (("N", 4096),))
    assert greedy.symbol_order(model.slots) == (("T", "Q"), ("D", "M"), ("R",))
    order = greedy.variable_order(model.constraints, model.slots)
    symbols = [name.split(".")[0] for name in order]
    assert list(dict.fromkeys(symbols)) == ["T", "Q", "D", "M", "R"]
    assert symbols == sorted(symbols, key=["T", "Q", "D", "M", "R"].index)  # grouped
    # within a symbol: the ConstraintSet's decision order
    decisions = list(model.constraints.decisions)
    for symbol in "TQDMR":
        mine = [n for n in order if n.startswith(symbol + ".")]
        assert mine == [n for n in decisions if n.startswith(symbol + ".")]
        assert mine


def test_variable_order_on_the_cpu() -> None:
    _, model = encoded("softmax", "cpu", (("N", 4096),))
    # the core level: its cores, then the registers' tile, L1's, L2's; then the system
    # level's L3
    assert greedy.symbol_order(model.slots) == (("P", "V", "Q", "L"), ("S",))


def test_symbol_order_is_computed_from_the_slots() -> None:
    slots = (Slot(SlotKind.TEMPORAL, "top", "A", 0), Slot(SlotKind.TEMPORAL, "big", "B", 0),
             Slot(SlotKind.SPATIAL, "pod", "X", 1), Slot(SlotKind.SPATIAL, "lane", "Y", 2),
             Slot(SlotKind.TEMPORAL, "near", "C", 2), Slot(SlotKind.TEMPORAL, "reg", "E", 2))
    assert greedy.symbol_order(slots) == (("Y", "E", "C"), ("X",), ("B",))


def test_the_order_makes_the_greedy_strictly_worse_on_softmax_upmem() -> None:
    """The seed's case: the greedy fills T and the WRAM tile first, then DPUs and MRAM
    steps; nothing is left for the ranks, and the modelled time is far from optimal."""
    _, model = encoded("softmax", "upmem", (("N", 4096),))
    optimum = solve(model.constraints)
    result = solve_greedy(model)
    assert optimum.status is Status.OPTIMAL and optimum.env is not None
    assert result.env is not None and result.objective is not None
    assert optimum.objective is not None
    assert result.objective > 2 * optimum.objective
    assert result.env["T"] == 16  # filled to its bound first, as in the seed
    assert result.env["R"] == 1  # the rank level comes last: nothing left to split
    assert optimum.env["R"] > 1
    assert model.constraints.violated(dict(result.env)) == []


# ---------------------------------------------------------------- failures are honest


def test_a_greedy_dead_end_is_not_reported_infeasible() -> None:
    """T == Q and T >= 4 need T and Q to move together; one factor at a time, each step
    trades one violation for the other, so the greedy never gets there. That says nothing
    about the problem: CP-SAT solves it."""
    _, model = encoded("va", "upmem", (("N", 4096),), ("T.c.i == Q.c.i", "T.c.i >= 4"))
    result = solve_greedy(model)
    assert result.status is Status.TIMEOUT  # no schedule, nothing proven
    assert result.env is None and result.objective is None
    failure = str(result.stats["failure"])
    assert "proves nothing" in failure and "user." in failure
    assert result.stats["repair_passes"] == greedy.MAX_REPAIRS
    assert solve(model.constraints).status is Status.OPTIMAL


def test_the_repair_moves_towards_a_constraint_it_cannot_meet_in_one_step() -> None:
    """R*D >= 512 on UPMEM needs D = 64 and R = 8: no single factor meets it, but D at 64
    is nearer than D at 1, so the repair takes it and R finishes."""
    _, model = encoded("softmax", "upmem", (("N", 65536),), ("R*D >= 512",))
    result = solve_greedy(model)
    assert result.status is Status.FEASIBLE and result.env is not None
    assert (result.env["R"], result.env["D"]) == (8, 64)
    assert model.constraints.violated(dict(result.env)) == []


def test_a_constraint_over_no_decision_proves_infeasibility() -> None:
    _, model = encoded("va", "upmem", (("N", 4096),), ("wram.capacity <= 5",))
    result = solve_greedy(model)
    assert result.status is Status.INFEASIBLE
    assert "never holds" in str(result.stats["failure"])
    assert solve(model.constraints).status is Status.INFEASIBLE


def test_out_of_time_before_a_feasible_point() -> None:
    _, model = encoded("va", "upmem", (("N", 4096),))  # f32-like runs: needs a repair
    result = solve_greedy(model, time_limit_s=0.0)
    assert result.status is Status.TIMEOUT
    assert str(result.stats["failure"]).startswith("out of time")


def test_user_constraints_are_respected() -> None:
    _, model = encoded("softmax", "upmem", (("N", 4096),), ("R*D >= 16", "T <= 8"))
    result = solve_greedy(model)
    assert result.status is Status.FEASIBLE and result.env is not None
    assert result.env["R"] * result.env["D"] >= 16 and result.env["T"] <= 8
    assert model.constraints.violated(dict(result.env)) == []


# ---------------------------------------------------------------- greedy fusion


def fusion_space() -> tuple[ConstraintSet, tuple[Slot, ...]]:
    """Two statements a, b that may run alone or fused as `a_b`: one 0/1 decision per
    candidate, each statement covered exactly once, and each kernel's tile (Q) bounded
    only while the kernel is used."""
    slots = (Slot(SlotKind.TEMPORAL, "dram", "H", 0), Slot(SlotKind.TEMPORAL, "sram", "Q", 0))
    fuse = {k: ex.Var(f"fuse.{k}") for k in ("a", "b", "a_b")}
    decisions: dict[str, tuple[int, ...]] = {f"fuse.{k}": (0, 1) for k in fuse}
    decisions |= {f"Q.{k}.i": (1, 2, 4, 8) for k in fuse}
    cover = [NamedConstraint("fusion.cover", f"statement {s}",
                             ex.Cmp(ex.add(fuse[s], fuse["a_b"]), "==", ex.ONE))
             for s in ("a", "b")]
    tiles = [NamedConstraint("capacity.sram", f"kernel {k}", ex.AnyOf((
        ex.Cmp(fuse[k], "==", ex.ZERO), ex.Cmp(ex.Var(f"Q.{k}.i"), "<=", ex.const(4)))))
        for k in fuse]
    objective = ex.add(*(ex.Var(f"Q.{k}.i") for k in fuse))
    return ConstraintSet(decisions, {}, tuple(cover + tiles), objective), slots


def test_greedy_fusion_tries_the_largest_candidate_first() -> None:
    cs, slots = fusion_space()
    assert greedy.default_fusion_order(cs) == ["fuse.a_b", "fuse.a", "fuse.b"]
    result = greedy.solve(cs, 1.0, slots)
    assert result.status is Status.FEASIBLE and result.env is not None
    assert (result.env["fuse.a_b"], result.env["fuse.a"], result.env["fuse.b"]) == (1, 0, 0)
    assert result.env["Q.a_b.i"] == 4  # raised to its bound
    assert result.env["Q.a.i"] == result.env["Q.b.i"] == 1  # unused kernels: left alone
    assert cs.violated(dict(result.env)) == []


def test_greedy_fusion_follows_a_given_order() -> None:
    cs, slots = fusion_space()
    result = greedy.solve(cs, 1.0, slots,
                          fusion_order=["fuse.a", "fuse.c", "fuse.a_b", "fuse.b"])
    assert result.env is not None
    assert (result.env["fuse.a_b"], result.env["fuse.a"], result.env["fuse.b"]) == (0, 1, 1)
    assert result.env["Q.a.i"] == result.env["Q.b.i"] == 4


def test_greedy_fuses_softmax_when_fusion_is_a_decision() -> None:
    wl, model = encoded("softmax", "upmem", (("N", 4096),))
    fuse = greedy.fusion_decisions(model.constraints)
    if not fuse:
        pytest.skip("this encoding has no fusion decisions")
    result = solve_greedy(model)
    assert result.env is not None
    used = {n for n in fuse if result.env[n] == 1}
    largest = greedy.default_fusion_order(model.constraints)[0]
    assert largest in used
    program = pipeline.materialize(model, dict(result.env))
    pipeline.verify(program, wl, model.hw)
    assert pipeline.validate(program, wl).passed


def test_solve_time_is_measured() -> None:
    _, model = small("softmax", "upmem")
    start = time.perf_counter()
    result = solve_greedy(model)
    assert 0 < result.wall_s <= time.perf_counter() - start
