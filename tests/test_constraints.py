"""The schedule space and its solvers: the cost model agrees with what the solver
optimises, CP-SAT agrees with brute force, random feasible schedules are feasible and
never beat the optimum, infeasibility and refusals are reported as such, and padding
covers sizes that do not divide."""

from __future__ import annotations

import re

import pytest
from conftest import (
    EXHAUSTIVE_CASES,
    SMALL_UPMEM,
    TWO_CORES,
    Case,
    build,
    count_nodes,
    optimal_program,
    optimum,
    sample,
    solve,
)
from ortools.sat.python import cp_model

from synth import pipeline
from synth.constraints import cpsat, exhaustive
from synth.constraints import expr as ex
from synth.constraints.cost import KernelTerms, evaluate_cost, transfer_count
from synth.constraints.result import Status
from synth.constraints.sample import random_schedule
from synth.constraints.space import ConstraintSet, SlotKind
from synth.errors import InputError
from synth.ir.materialize import materialize
from synth.ir.nodes import Combine, Kernel, Load, Loop, LoopKind, Node, Store

# ---------------------------------------------------------------- the cost model

COST_CASES = [
    Case.of("softmax", "upmem", {"N": 4096}),
    Case.of("matmul", "cpu", {"M": 64, "N": 32, "K": 128}),
    Case.of("mv", "upmem", {"M": 64, "N": 128}),
    Case.of("red", "cpu", {"N": 1000}),
    Case.of("attention", "cpu", {"S": 32, "D": 16}),
    Case.of("softmax", "upmem", {"N": 1009}),  # a prime: only padded tilings split it
]
SEEDS = range(6)


def python_cost(case: Case, env: dict[str, int]) -> int:
    return sum(evaluate_cost(build(case).model, env).values())


@pytest.mark.parametrize("case", COST_CASES, ids=lambda c: c.id)
def test_solver_objective_is_the_python_cost(case: Case) -> None:
    cset = build(case).model.constraints
    result = optimum(case)
    assert result.status is Status.OPTIMAL
    assert result.env is not None and result.objective is not None
    env = dict(result.env)
    assert result.objective == python_cost(case, env)
    assert result.objective == ex.evaluate(cset.objective, env)
    assert result.bound == result.objective  # proven optimal: the bound meets it
    assert cset.violated(env) == []
    # a complete assignment: every decision within its candidates, every definition
    for name, values in cset.decisions.items():
        assert env[name] in values, name
    assert env == cset.complete({n: env[n] for n in cset.decisions})
    # every part of the breakdown is a cost, none negative; together the objective
    parts = evaluate_cost(build(case).model, env)
    assert all(value >= 0 for value in parts.values()), parts
    assert {"compute", "launch"} <= set(parts)


@pytest.mark.parametrize("case", COST_CASES, ids=lambda c: c.id)
def test_random_schedules_are_feasible_and_never_beat_the_optimum(case: Case) -> None:
    cset = build(case).model.constraints
    best = optimum(case).objective
    assert best is not None
    seen = set()
    for seed in SEEDS:
        env = sample(case, seed)
        assert env is not None, f"seed {seed}: no schedule"
        assert cset.violated(env) == [], f"seed {seed}"
        for name, values in cset.decisions.items():
            assert env[name] in values, (seed, name)
        cost = python_cost(case, dict(env))
        assert cost == ex.evaluate(cset.objective, env)
        assert cost >= best, f"seed {seed}: {cost} beats the proven optimum {best}"
        seen.add(tuple(sorted(env.items())))
    # the sampler really samples: most seeds give different schedules
    assert len(seen) >= len(SEEDS) // 2, f"only {len(seen)} distinct schedules"


def fixed_objective(cset: ConstraintSet, decisions: dict[str, int], monomials: bool = True
                    ) -> tuple[str, int | None]:
    """CP-SAT's objective with every decision fixed: the lowered model's own cost."""
    lowering = cpsat.Lowering(cset, monomials=monomials)
    for constraint in cset.constraints:
        lowering.require(constraint.cond)
    for name, value in decisions.items():
        lowering.model.add(lowering.vars[name] == value)
    lowering.model.minimize(lowering.linear(cset.objective))
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.max_time_in_seconds = 20.0
    code = solver.solve(lowering.model)
    if code not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return solver.status_name(code), None
    return solver.status_name(code), int(solver.objective_value)


@pytest.mark.parametrize("monomials", [True, False], ids=["exponents", "products"])
@pytest.mark.parametrize("case", [*COST_CASES, Case.of("matmul", "aie", {"M": 64, "N": 32,
                                                                         "K": 128})],
                         ids=lambda c: c.id)
def test_lowered_objective_matches_python_at_non_optimal_points(case: Case,
                                                                 monomials: bool) -> None:
    """Not only the optimum: at any feasible point, the CP-SAT lowering of the objective
    (auxiliary variables, caps, reified selects), over exponents and as products (where a
    product with one select factor is a select of products, `cpsat._by_branch`: aie's
    transfer terms), computes the Python cost."""
    model = build(case).model
    cset = model.constraints
    for seed in range(4):
        env = sample(case, seed)
        assert env is not None
        # an unused candidate kernel's factors are free (its constraints do not bind, so
        # they may break bounds that hold of every used kernel): they are left to CP-SAT
        unused = {k.name for k in model.kernels} - {k.name for k in model.selected(env)}
        decisions = {n: env[n] for n in cset.decisions if _kernel_of(n) not in unused}
        status, value = fixed_objective(cset, decisions, monomials)
        assert status == "OPTIMAL"
        assert value == python_cost(case, dict(env)), f"seed {seed}"


def _kernel_of(decision: str) -> str:
    """The kernel of `X.kernel.dim`, `ext.kernel.dim`, `buffers.kernel.memory`, ...
    (a fusion decision `fuse.kernel` counts as no kernel's: it is always fixed)."""
    head, _, rest = decision.partition(".")
    return "" if head == "fuse" else rest.rpartition(".")[0]


def sequential_executions(kernel: Kernel) -> dict[tuple[str, str], int]:
    """(Load|Store, buffer) -> how often one unit runs it: the product of the sequential
    loops around it (parallel loops are other units)."""
    counts: dict[tuple[str, str], int] = {}

    def visit(nodes: tuple[Node, ...], times: int) -> None:
        for node in nodes:
            if isinstance(node, Loop):
                seq = node.var.kind is LoopKind.SEQUENTIAL
                visit(node.body, times * (node.var.extent if seq else 1))
            elif isinstance(node, Load):
                counts[("Load", node.dst)] = counts.get(("Load", node.dst), 0) + times
            elif isinstance(node, Store):
                counts[("Store", node.src)] = counts.get(("Store", node.src), 0) + times

    visit(kernel.body, 1)
    return counts


@pytest.mark.parametrize("case", COST_CASES[:5], ids=lambda c: c.id)
def test_cost_model_counts_the_transfers_the_loop_nest_makes(case: Case) -> None:
    """The transfer cost multiplies a count of copies per unit; the materialised nest
    must make exactly that many (both follow `copy_loops`, for concrete factors here)."""
    built = build(case)
    model, hw = built.model, built.hw
    root = hw.root_memory.name
    memories = [(i, s.name) for i, s in enumerate(model.slots)
                if s.kind is SlotKind.TEMPORAL and s.name != root]
    checked = 0
    for seed in range(6):
        env = dict(optimum(case).env or {}) if seed == 0 else sample(case, seed)
        assert env is not None
        program = materialize(model, env)
        for spec, kernel in zip(model.selected(env), program.kernels, strict=True):
            terms = KernelTerms(spec, model.factors, hw)
            executed = sequential_executions(kernel)
            for slot, mem in memories:
                for use in terms.moving():  # local intermediates never move
                    want = ex.evaluate(transfer_count(terms, use, slot), env)
                    buffer = f"{use.tensor}_{mem}"
                    for kind, happens in (("Load", use.read), ("Store", use.written)):
                        if happens:
                            assert executed.get((kind, buffer)) == want, \
                                (seed, kernel.name, kind, buffer)
                            checked += 1
    assert checked > 0


# ---------------------------------------------------------------- exhaustive == CP-SAT



@pytest.mark.parametrize("case", EXHAUSTIVE_CASES, ids=lambda c: c.id)
def test_exhaustive_agrees_with_cpsat(case: Case) -> None:
    cset = build(case).model.constraints
    assert exhaustive.space_size(cset) <= exhaustive.MAX_POINTS
    brute = exhaustive.solve(cset, 60.0)
    smart = optimum(case)
    assert brute.status is Status.OPTIMAL and smart.status is Status.OPTIMAL
    assert brute.objective == smart.objective
    assert brute.env is not None
    assert cset.violated(brute.env) == []
    assert python_cost(case, dict(brute.env)) == brute.objective


def test_exhaustive_cases_cover_a_split_reduction_and_padding() -> None:
    """The agreement above includes optima that split a reduction across units (with a
    combine) and that pad a size that does not divide."""
    split = [c.id for c in EXHAUSTIVE_CASES if count_nodes(optimal_program(c), Combine)]
    padded = [c.id for c in EXHAUSTIVE_CASES if padded_dims(c)]
    assert split, "no case splits a reduction"
    assert padded, "no case pads"


def padded_dims(case: Case) -> list[str]:
    """Dimensions the optimum pads beyond their extent: `kernel.dim`."""
    env = optimum(case).env or {}
    return [f"{spec.name}.{dim}" for spec in build(case).model.selected(env)
            for dim, extent in spec.extents.items()
            if env.get(f"ext.{spec.name}.{dim}", extent) > extent]


TWO_STATEMENTS = """\
size N = 6
in x : f32[N]
out y : f32[N]
m[] max= x[i]
y[i] = x[i] - m[]
"""


@pytest.mark.parametrize("case", [
    Case.of("two", "upmem", {}, ("rank.count=1", "dpu.count=1..2", "tasklet.count=1..3"),
            text=TWO_STATEMENTS),
    # N = 4: with a double-buffering decision per kernel, N = 6 passes the enumerator's limit
    Case.of("two", "cpu", {"N": 4}, TWO_CORES, text=TWO_STATEMENTS),
], ids=lambda c: c.id)
def test_joint_enumeration_checks_the_decomposition(case: Case) -> None:
    """Enumerating the whole product (not part by part) finds the same optimum as the
    decomposed solvers: the split into independent parts loses nothing."""
    cset = build(case).model.constraints
    assert exhaustive.space_size(cset, joint=True) > exhaustive.space_size(cset)
    joint = exhaustive.solve(cset, 60.0, joint=True)
    parts = exhaustive.solve(cset, 60.0)
    assert joint.status is Status.OPTIMAL and parts.status is Status.OPTIMAL
    assert joint.objective == parts.objective == optimum(case).objective


def test_exhaustive_refuses_a_big_space() -> None:
    cset = build(Case.of("matmul", "upmem")).model.constraints
    size = exhaustive.space_size(cset)
    assert size > exhaustive.MAX_POINTS
    with pytest.raises(InputError) as caught:
        exhaustive.solve(cset)
    message = str(caught.value)
    assert f"{size:,}" in message
    assert "--set" in message and "--hw-set" in message


def test_exhaustive_refusal_reaches_the_pipeline_as_an_input_error() -> None:
    with pytest.raises(InputError, match=r"refuses a space of [\d,]+ candidate"):
        pipeline.run(pipeline.Request("matmul", "upmem", solver="exhaustive"))


# ---------------------------------------------------------------- determinism


@pytest.mark.parametrize("case", [COST_CASES[0], COST_CASES[4]], ids=lambda c: c.id)
def test_solving_twice_gives_the_same_schedule(case: Case) -> None:
    first = solve(build(case).model.constraints)
    again = pipeline.solve(pipeline.encode(build(case).workload, build(case).hw),
                           "cpsat", 60.0)
    assert first.env == again.env
    assert first.objective == again.objective
    assert dict(first.env or {}) == dict(optimum(case).env or {})


def test_random_schedule_is_reproducible_from_its_seed() -> None:
    cset = build(COST_CASES[0]).model.constraints
    assert random_schedule(cset, 7) == random_schedule(cset, 7)
    assert random_schedule(cset, 7) == sample(COST_CASES[0], 7)
    others = {tuple(sorted((random_schedule(cset, s) or {}).items())) for s in (1, 2, 3)}
    assert len(others) > 1


# ---------------------------------------------------------------- infeasibility

TINY_WRAM = ("wram.capacity=16B", "wram.reserved=0")
ONE_ELEMENT = Case.of("va", "upmem", {"N": 1})  # every factor is 1: no decisions


def test_infeasible_capacity_is_reported_by_both_solvers() -> None:
    # three tensors of at least 8 bytes (the DMA minimum) cannot share 16 bytes of WRAM
    case = Case.of("va", "upmem", {"N": 20}, SMALL_UPMEM + TINY_WRAM)
    cset = build(case).model.constraints
    assert solve(cset).status is Status.INFEASIBLE
    brute = exhaustive.solve(cset, 60.0)
    assert brute.status is Status.INFEASIBLE and brute.env is None
    assert random_schedule(cset, 0) is None


def test_infeasible_request_stops_the_pipeline_after_the_solve() -> None:
    outcome = pipeline.run(pipeline.Request("softmax", "upmem", {"N": 4096},
                                            hw_overrides=TINY_WRAM))
    assert outcome.result.status is Status.INFEASIBLE
    assert outcome.result.env is None and outcome.program is None
    assert outcome.validation is None and not pipeline.solved(outcome)


def test_random_schedule_of_a_space_without_decisions() -> None:
    """No decisions: the one schedule there is, or None when it breaks a constraint."""
    cset = build(ONE_ELEMENT).model.constraints
    assert not cset.decisions
    assert random_schedule(cset, 3) == cset.complete({})
    tiny = build(Case.of("va", "upmem", {"N": 1}, TINY_WRAM)).model.constraints
    assert tiny.violated(tiny.complete({}))
    assert random_schedule(tiny, 3) is None


# ---------------------------------------------------------------- padding


def test_a_prime_size_is_padded_and_validates() -> None:
    n = 1_000_003  # prime
    outcome = pipeline.run(pipeline.Request("softmax", "upmem", {"N": n}))
    assert outcome.result.status is Status.OPTIMAL
    assert outcome.validation is not None and outcome.validation.passed
    env = outcome.result.env or {}
    used = {k.name for k in outcome.model.selected(env)}  # others keep their smallest
    padded = {k: v for k, v in env.items()
              if k.startswith("ext.") and k.split(".")[1] in used}
    assert padded and all(v > n for v in padded.values()), padded  # no divisor to use
    assert outcome.cost is not None and sum(outcome.cost.values()) == outcome.result.objective


# ---------------------------------------------------------------- known bugs


def test_objective_of_a_space_without_decisions() -> None:
    cset = build(ONE_ELEMENT).model.constraints
    assert not cset.decisions
    cost = ex.evaluate(cset.objective, cset.complete({}))
    assert cost > 0
    assert solve(cset).objective == cost
    assert exhaustive.solve(cset, 10.0).objective == cost


def test_constant_constraints_are_enforced() -> None:
    text = ("size N = 1\nsize M = 16\nin x : f32[N]\nin v : f32[N]\nin w : f32[M]\n"
            "out y : f32[N]\nout z : f32[M]\ny[i] = x[i] + v[i]\nz[j] = w[j]\n")
    case = Case.of("mixed", "upmem", {}, TINY_WRAM, text=text)
    cset = build(case).model.constraints
    result = solve(cset)
    assert result.env is None or cset.violated(result.env) == [], \
        [c.meaning for c in cset.violated(result.env)]
    assert result.status is Status.INFEASIBLE
    assert exhaustive.solve(cset, 10.0).status is Status.INFEASIBLE


def test_violated_reports_a_tile_larger_than_the_extent() -> None:
    cset = build(Case.of("va", "cpu", {"N": 8}, TWO_CORES)).model.constraints
    decisions = {name: values[0] for name, values in cset.decisions.items()}
    decisions.update({"Q.c.i": 8, "L.c.i": 2})  # a tile of 16 in a dimension of 8
    groups = {c.group for c in cset.violated(cset.complete(decisions))}
    assert "tiling" in groups


def test_exhaustive_message_names_the_limit() -> None:
    cset = build(Case.of("softmax", "upmem", {"N": 16}, SMALL_UPMEM)).model.constraints
    size = exhaustive.space_size(cset)
    with pytest.raises(InputError) as caught:
        exhaustive.solve(cset, max_points=size - 1)
    assert re.search(rf"{size:,}.*limit {size - 1:,}", str(caught.value))
    assert exhaustive.solve(cset, max_points=size).status is Status.OPTIMAL


def test_widening_a_count_range_keeps_a_feasible_request_feasible() -> None:
    sizes = {"M": 4096, "N": 4096, "K": 4096}
    one = Case.of("gemm2k", "upmem", sizes, ("rank.count=1", "dpu.count=1", "tasklet.count=1"))
    wider = Case.of("gemm2k", "upmem", sizes,
                    ("rank.count=1", "dpu.count=1", "tasklet.count=1..2"))
    narrow = optimum(one)
    assert narrow.status is Status.OPTIMAL and narrow.env is not None
    cset = build(wider).model.constraints
    # the narrow optimum is a schedule of the wider space too (its T factors are 1)
    env = cset.complete({name: narrow.env.get(name, 0 if name.startswith("share.") else 1)
                         for name in cset.decisions})  # (no tile shared by one tasklet)
    assert cset.violated(env) == []
    assert optimum(wider).status in (Status.OPTIMAL, Status.FEASIBLE)
