"""The z3 backend lowers the same ConstraintSet as CP-SAT and reaches the same proven
optimum: against CP-SAT on every built-in workload at small sizes on both hardware
models, and against brute force where the space is small enough to enumerate."""

from __future__ import annotations

import functools

import pytest
from conftest import EXHAUSTIVE_CASES, SMALL_UPMEM, TWO_CORES, Case, build, optimum

from synth.constraints import exhaustive, z3backend
from synth.constraints import expr as ex
from synth.constraints.result import SolveResult, Status

TINY_WRAM = ("wram.capacity=16B", "wram.reserved=0")
# Deterministic limits: each z3 check may use this many of z3's resource units (the
# largest check of these cases uses at most 3.2e7), and the clock is far away, so a
# verdict does not depend on how fast or busy the machine is (at load 7-12 on 2 cores two
# cases once hit a 30 s wall-clock limit here).
RLIMIT = 10**9
NO_CLOCK_S = 3600.0


@functools.cache
def z3_optimum(case: Case) -> SolveResult:
    return z3backend.solve(build(case).model.constraints, NO_CLOCK_S, RLIMIT)


def check_solution(case: Case, result: SolveResult) -> None:
    """A proven optimum whose schedule is legal and whose objective is its cost."""
    cset = build(case).model.constraints
    assert result.status is Status.OPTIMAL, (case.id, result.status, dict(result.stats))
    assert result.env is not None and result.objective is not None
    assert result.bound == result.objective
    assert cset.violated(result.env) == []
    assert dict(result.env) == cset.complete({n: result.env[n] for n in cset.decisions})
    for name, values in cset.decisions.items():
        assert result.env[name] in values, name
    assert ex.evaluate(cset.objective, result.env) == result.objective


# ---------------------------------------------------------------- z3 == CP-SAT == brute force



@pytest.mark.parametrize("case", EXHAUSTIVE_CASES, ids=lambda c: c.id)
def test_z3_agrees_with_cpsat_and_brute_force(case: Case) -> None:
    cset = build(case).model.constraints
    result = z3_optimum(case)
    check_solution(case, result)
    assert result.objective == optimum(case).objective
    brute = exhaustive.solve(cset, 60.0)
    assert brute.status is Status.OPTIMAL and brute.objective == result.objective


# every built-in, both hardware models, at sizes small enough to keep the file fast
# (halving these halves z3's work or better, and the upmem optima still spread over DPUs,
# ranks and tasklets; mv and attention on upmem split a reduction, red on upmem pads)
SMALL_SIZES = {
    "softmax": {"N": 1024},
    "va": {"N": 500},
    "red": {"N": 509},  # a prime: only padded tilings split it
    "mv": {"M": 16, "N": 32},
    "matmul": {"M": 16, "N": 8, "K": 32},
    "gemm2k": {"M": 8, "N": 8, "K": 8},
    "fa6": {"S": 4, "D": 4},  # 15 fused candidates contain its matmul: z3 solves each
    "attention": {"S": 4, "D": 4},
}
BUILTIN_CASES = [Case.of(w, hw, sizes, SMALL_UPMEM if hw == "upmem" else TWO_CORES)
                 for hw in ("cpu", "upmem") for w, sizes in SMALL_SIZES.items()]


@pytest.mark.parametrize("case", BUILTIN_CASES, ids=lambda c: c.id)
def test_z3_agrees_with_cpsat_on_every_builtin(case: Case) -> None:
    result = z3_optimum(case)
    check_solution(case, result)
    assert result.objective == optimum(case).objective


def test_cases_cover_a_split_reduction_and_padding() -> None:
    """The agreement above includes z3 optima that split a reduction across units and
    that pad a size that does not divide."""
    split, padded = [], []
    for case in EXHAUSTIVE_CASES + BUILTIN_CASES:
        env = z3_optimum(case).env or {}
        kernels = build(case).model.selected(env)
        hw = build(case).hw
        spatial = [lv.symbol for lv in hw.levels if lv.symbol is not None]
        for spec in kernels:
            for dim in spec.reduced:
                if any(env.get(f"{s}.{spec.name}.{dim}", 1) > 1 for s in spatial):
                    split.append(case.id)
            for dim, extent in spec.extents.items():
                if env.get(f"ext.{spec.name}.{dim}", extent) > extent:
                    padded.append(case.id)
    assert split, "no case splits a reduction"
    assert padded, "no case pads"


# ---------------------------------------------------------------- edge cases


def test_infeasible_capacity_is_infeasible() -> None:
    # three tensors of at least 8 bytes (the DMA minimum) cannot share 16 bytes of WRAM
    cset = build(Case.of("va", "upmem", {"N": 20}, SMALL_UPMEM + TINY_WRAM)).model.constraints
    result = z3backend.solve(cset, NO_CLOCK_S, RLIMIT)
    assert result.status is Status.INFEASIBLE and result.env is None


def test_space_without_decisions() -> None:
    case = Case.of("va", "upmem", {"N": 1})
    cset = build(case).model.constraints
    assert not cset.decisions
    result = z3backend.solve(cset, NO_CLOCK_S, RLIMIT)
    assert result.status is Status.OPTIMAL
    assert result.objective == ex.evaluate(cset.objective, cset.complete({}))
    tiny = build(Case.of("va", "upmem", {"N": 1}, TINY_WRAM)).model.constraints
    assert z3backend.solve(tiny, NO_CLOCK_S, RLIMIT).status is Status.INFEASIBLE


def test_same_input_same_schedule() -> None:
    case = Case.of("matmul", "cpu", {"M": 16, "N": 8, "K": 32}, TWO_CORES)
    cset = build(case).model.constraints
    first = z3_optimum(case)  # solved above (a BUILTIN_CASES case), other solves between
    second = z3backend.solve(cset, NO_CLOCK_S, RLIMIT)
    assert first.env == second.env and first.objective == second.objective


def test_a_resource_limit_is_not_claimed_optimal() -> None:
    """Deterministically out of resources: the same verdict on any machine (this matmul
    takes z3 about 2e7 units above, far past the 1000 here)."""
    cset = build(Case.of("matmul", "upmem", SMALL_SIZES["matmul"], SMALL_UPMEM)
                 ).model.constraints
    result = z3backend.solve(cset, NO_CLOCK_S, rlimit=1000)
    assert result.status is Status.TIMEOUT and result.env is None


def test_out_of_time_is_not_claimed_optimal() -> None:
    cset = build(Case.of("matmul", "upmem", {"M": 64, "N": 64, "K": 64})).model.constraints
    result = z3backend.solve(cset, 0.05)
    assert result.status in (Status.TIMEOUT, Status.FEASIBLE)
    if result.status is Status.FEASIBLE:
        assert result.bound is not None and result.objective is not None
        assert result.bound <= result.objective


def test_an_encoding_too_large_to_read_in_time_is_not_read(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """z3's time limit does not cover reading the SMT text (52 MB took 3.7 s past a 2 s
    limit): a text that would take past the limit at `SMT_READ_BYTES_PER_S` is a TIMEOUT
    before z3 sees it. Here every text is too large to read in time."""
    cset = build(Case.of("matmul", "cpu", {"M": 16, "N": 8, "K": 32}, TWO_CORES)
                 ).model.constraints
    read: list[int] = []
    original = z3backend.z3.Solver.from_string
    monkeypatch.setattr(z3backend.z3.Solver, "from_string",
                        lambda self, text: read.append(len(text)) or original(self, text))
    assert z3backend.solve(cset, NO_CLOCK_S, RLIMIT).status is Status.OPTIMAL and read
    read.clear()
    monkeypatch.setattr(z3backend, "SMT_READ_BYTES_PER_S", 1e-12)
    result = z3backend.solve(cset, NO_CLOCK_S, RLIMIT)
    assert result.status is Status.TIMEOUT and result.env is None and not read
    assert "would run past the time limit" in str(result.stats["unknown"])  # for the CLI
