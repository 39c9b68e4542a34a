"""Properties over random small workloads (tests/strategies.py), on both hardware models:
the CP-SAT optimum and random feasible schedules (synth.constraints.sample) all
materialise, verify and compute what the NumPy reference computes; the cost model
agrees with the solver; brute force agrees with CP-SAT.

Deterministic (`derandomize=True`): the same examples run every time, so a failure is
reproducible and the runtime is stable.
"""

from __future__ import annotations

from collections.abc import Mapping

from conftest import SMALL_UPMEM, TWO_CORES, check_capacity_boundary, solve
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from strategies import GeneratedWorkload, workloads

from synth import pipeline
from synth.constraints import exhaustive
from synth.constraints import expr as ex
from synth.constraints.cost import Model, evaluate_cost
from synth.constraints.result import Status
from synth.constraints.sample import random_schedule
from synth.hwfile import load_hardware
from synth.ir.materialize import materialize
from synth.ir.nodes import Alloc, Combine, Program, walk
from synth.ir.verify import verify
from synth.lang import parse_workload
from synth.workload import Workload

HARDWARE = {"upmem": SMALL_UPMEM, "cpu": ()}
SAMPLES = (1, 2)  # random schedules per workload, besides the optimum


def examples(count: int) -> settings:
    return settings(max_examples=count, derandomize=True, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow])


def python_cost(model: Model, env: Mapping[str, int]) -> int:
    return sum(evaluate_cost(model, dict(env)).values())


def check_program(program: Program, workload: Workload, model: Model, env: Mapping[str, int],
                  hw_name: str, tag: str) -> None:
    verify(program, workload, model.hw)
    check_capacity_boundary(program, workload, model, env, hw_name, HARDWARE[hw_name])
    combines = {n.partials for k in program.kernels for n in walk(k.body)
                if isinstance(n, Combine)}
    # partials on the host, and on-device combine buffers, are each combined exactly once
    partials = {n.buffer.name for k in program.kernels for n in walk(k.body)
                if isinstance(n, Alloc) and n.buffer.partial_loops
                and (n.buffer.memory == model.hw.root_memory.name
                     or n.buffer.name.endswith("_combine"))}
    assert combines == partials, tag
    validation = pipeline.validate(program, workload)
    assert validation.passed, (tag, validation.per_output)


def check_workload(generated: GeneratedWorkload, hw_name: str) -> None:
    workload = parse_workload(generated.text, "generated.syn", "generated")
    hw = load_hardware(hw_name, HARDWARE[hw_name])
    model = pipeline.encode(workload, hw)
    cset = model.constraints

    result = solve(cset)
    assert result.status is Status.OPTIMAL, result.status
    assert result.env is not None and result.objective is not None
    assert cset.violated(result.env) == []
    assert result.objective == python_cost(model, result.env)
    assert result.objective == ex.evaluate(cset.objective, result.env)

    schedules = [("optimum", dict(result.env))]
    for seed in SAMPLES:
        env = random_schedule(cset, seed)
        assert env is not None, f"seed {seed}: no schedule although the optimum exists"
        assert cset.violated(env) == [], f"seed {seed}"
        assert python_cost(model, env) >= python_cost(model, result.env), f"seed {seed}"
        schedules.append((f"seed {seed}", env))

    for tag, env in schedules:
        check_program(materialize(model, env), workload, model, env, hw_name, tag)


@examples(16)
@given(workloads())
def test_random_workloads_on_upmem(generated: GeneratedWorkload) -> None:
    check_workload(generated, "upmem")


@examples(24)
@given(workloads())
def test_random_workloads_on_cpu(generated: GeneratedWorkload) -> None:
    check_workload(generated, "cpu")


SMALL_EXTENTS = st.sampled_from([1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 12, 13])
EXHAUSTIVE_LIMIT = 50_000


@examples(80)
@given(workloads(max_statements=2, extents=SMALL_EXTENTS), st.sampled_from(["upmem", "cpu"]))
def test_exhaustive_agrees_with_cpsat_on_random_workloads(generated: GeneratedWorkload,
                                                          hw_name: str) -> None:
    workload = parse_workload(generated.text, "generated.syn", "generated")
    overrides = SMALL_UPMEM if hw_name == "upmem" else TWO_CORES
    model = pipeline.encode(workload, load_hardware(hw_name, overrides))
    cset = model.constraints
    size = exhaustive.space_size(cset)
    if size > EXHAUSTIVE_LIMIT:
        event("space too big to enumerate")
        return
    event("enumerated")
    brute = exhaustive.solve(cset, 60.0)
    smart = solve(cset)
    assert (brute.status, brute.objective) == (smart.status, smart.objective)
    if brute.env is not None:
        assert cset.violated(brute.env) == []
        assert python_cost(model, brute.env) == brute.objective
