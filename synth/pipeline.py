"""The pipeline: one short list of named stages, each taking and returning plain data.

    parse -> hardware -> encode -> solve -> materialise -> verify -> validate

`run` is what `synth solve` does; every stage is also callable alone (tests and
benchmarks use them that way). Errors a user can cause are raised as `SynthError`
subclasses with their exit codes; a solve that finds no schedule is not an error here but
a `Status` in the outcome, which the CLI maps to an exit code.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from synth.constraints import cpsat, exhaustive
from synth.constraints.cost import Model, build_model, evaluate_cost
from synth.constraints.result import SolveResult, Status
from synth.constraints.space import one_kernel_per_statement
from synth.errors import InputError
from synth.hardware import Hardware
from synth.hwfile import load_hardware
from synth.ir.interpret import interpret
from synth.ir.materialize import materialize
from synth.ir.nodes import Program
from synth.ir.verify import verify
from synth.lang import load_workload
from synth.reference import compare, evaluate, make_inputs
from synth.workload import Workload

SOLVERS = ("cpsat", "exhaustive")


@dataclass(frozen=True)
class Request:
    """Everything `synth solve` was asked."""

    workload: str
    hardware: str
    sizes: Mapping[str, int] = field(default_factory=dict)
    hw_overrides: Sequence[str] = ()
    solver: str = "cpsat"
    time_limit_s: float = 30.0
    validate: bool = True
    seed: int = 0  # inputs of the validation run


@dataclass(frozen=True)
class Validation:
    passed: bool
    max_abs_err: float
    max_rel_err: float
    wall_s: float
    per_output: Mapping[str, Mapping[str, Any]]


@dataclass(frozen=True)
class Outcome:
    workload: Workload
    hardware: Hardware
    model: Model
    result: SolveResult
    program: Program | None
    cost: Mapping[str, int] | None  # picoseconds per part of the cost
    validation: Validation | None
    timings: Mapping[str, float]  # seconds per stage


# ---------------------------------------------------------------- stages


def parse(request: Request) -> Workload:
    return load_workload(request.workload, dict(request.sizes))


def hardware(request: Request) -> Hardware:
    return load_hardware(request.hardware, tuple(request.hw_overrides))


def encode(workload: Workload, hw: Hardware) -> Model:
    return build_model(workload, hw, one_kernel_per_statement(workload))


def solve(model: Model, solver: str, time_limit_s: float) -> SolveResult:
    if solver == "cpsat":
        return cpsat.solve(model.constraints, time_limit_s)
    if solver == "exhaustive":
        return exhaustive.solve(model.constraints, time_limit_s)
    raise InputError(f"unknown solver {solver!r}; expected one of {', '.join(SOLVERS)}")


def validate(program: Program, workload: Workload, seed: int = 0) -> Validation:
    """Run the loop nest on random inputs and compare every output with the reference."""
    start = time.perf_counter()
    inputs = make_inputs(workload, seed)
    expected = evaluate(workload, inputs)
    actual = interpret(program, workload, inputs)
    per_output: dict[str, dict[str, Any]] = {}
    for tensor in workload.outputs:
        passed, abs_err, rel_err = compare(expected[tensor.name], actual[tensor.name],
                                           tensor.dtype)
        per_output[tensor.name] = {"passed": passed, "max_abs_err": abs_err,
                                   "max_rel_err": rel_err}
    return Validation(
        passed=all(o["passed"] for o in per_output.values()),
        max_abs_err=max((o["max_abs_err"] for o in per_output.values()), default=0.0),
        max_rel_err=max((o["max_rel_err"] for o in per_output.values()), default=0.0),
        wall_s=time.perf_counter() - start, per_output=per_output)


def run(request: Request) -> Outcome:
    """Every stage in order; stops after the solve when there is no schedule."""
    timings: dict[str, float] = {}

    def timed(name: str, fn: Any, *args: Any) -> Any:
        start = time.perf_counter()
        value = fn(*args)
        timings[name] = time.perf_counter() - start
        return value

    workload = timed("parse", parse, request)
    hw = timed("hardware", hardware, request)
    model = timed("encode", encode, workload, hw)
    result = timed("solve", solve, model, request.solver, request.time_limit_s)
    if result.env is None:
        return Outcome(workload, hw, model, result, None, None, None, timings)
    program = timed("materialise", materialize, model, result.env)
    timed("verify", verify, program, workload, hw)
    cost = evaluate_cost(model, dict(result.env))
    validation = (timed("validate", validate, program, workload, request.seed)
                  if request.validate else None)
    return Outcome(workload, hw, model, result, program, cost, validation, timings)


def solved(outcome: Outcome) -> bool:
    return outcome.result.status in (Status.OPTIMAL, Status.FEASIBLE)
