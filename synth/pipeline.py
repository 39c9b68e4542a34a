"""The pipeline: one short list of named stages, each taking and returning plain data.

    parse -> hardware -> encode -> solve [-> measure] -> materialise -> verify -> prove
                                                  -> validate [-> emit] [-> binding]
                                     (infeasible: -> explain)

`encode` adds the user's --constraint/--fix groups and removes --drop groups
(`synth.constraints.user`); `explain` names a minimal set of conflicting groups and
`binding` (when asked) the groups that shape the optimum (`synth.constraints.explain`).
`measure` (`--measure K`, `synth.measure`) times the K best schedules as C on this
machine; the fastest measured is the schedule the later stages work on.

Sizes given as ranges (`Request.ranges`, `--set N=LO..HI[:STEP]`) are solved at their
largest admissible value, with the root loops over a ranged dimension constrained to run
ceil(N / step) times there (`encode`'s `dependence`: groups `parametric.<kernel>.<dim>`);
`prove` then proves the loop nest for every admissible value (tiles fixed, host loops
adapting: `synth.ir.prove`), and with validation the same nest is also run at the
smallest values (`run_smallest`).

`run` is what `synth solve` does; every stage is also callable alone (tests and
benchmarks use them that way). Errors a user can cause are raised as `SynthError`
subclasses with their exit codes; a solve that finds no schedule is not an error here but
a `Status` in the outcome, which the CLI maps to an exit code.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from synth import measure, progress, shrink
from synth.constraints import cpsat, exhaustive, explain, greedy, user, z3backend
from synth.constraints.cost import Model, build_model, evaluate_cost
from synth.constraints.fusion import check_deadline
from synth.constraints.result import SolveResult, Status
from synth.constraints.space import candidate_kernels
from synth.deadline import Deadline
from synth.emit import targets
from synth.emit.targets import Emitted
from synth.errors import InputError, IRError
from synth.hardware import Hardware, Memory
from synth.hwfile import load_hardware
from synth.ir.interpret import interpret
from synth.ir.materialize import materialize
from synth.ir.nodes import Program
from synth.ir.prove import Dependence, Proof, instantiate, probe_value, prove, size_dependence
from synth.ir.verify import verify
from synth.lang import SizeRange, load_workload
from synth.measure import Measured
from synth.reference import compare, evaluate_errors, make_inputs
from synth.workload import Workload

SOLVERS = ("cpsat", "z3", "exhaustive", "greedy")


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
    constraints: Sequence[str] = ()  # --constraint EXPR: groups user.1, user.2, ...
    fixes: Sequence[str] = ()  # --fix VAR=INT: groups user.fix.VAR
    drops: Sequence[str] = ()  # --drop GROUP (or a prefix: `capacity` drops capacity.*)
    binding: bool = False  # find the groups that bind at the optimum (one re-solve each)
    # --set N=LO..HI[:STEP]: solved at the largest admissible value, proved for every one
    ranges: Mapping[str, SizeRange] = field(default_factory=dict)
    emit: str | None = None  # --emit TARGET: write the program's source for that target
    out_dir: str | None = None  # --out DIR: where
    measure: int = 0  # --measure K: time the K best schedules as C, keep the fastest
    jobs: int = 1  # --jobs N: processes solving candidate kernels side by side (cpsat)

    def solved_sizes(self) -> dict[str, int]:
        """The sizes the schedule is solved at: `sizes`, and each range's largest value
        (the tiles are chosen for the largest problem; smaller ones reuse them)."""
        clash = sorted(set(self.sizes) & set(self.ranges))
        if clash:
            name = clash[0]
            raise InputError(f"--set {name} given twice ({name}={self.sizes[name]} and "
                             f"{name}={self.ranges[name].lo}..{self.ranges[name].hi})")
        return {**self.sizes, **{name: r.last for name, r in self.ranges.items()}}


@dataclass(frozen=True)
class Validation:
    passed: bool
    max_abs_err: float
    max_rel_err: float
    wall_s: float
    per_output: Mapping[str, Mapping[str, Any]]
    # the smaller sizes the schedule ran at (`shrink`: the workload is past
    # shrink.MAX_POINTS); None: the workload's own
    sizes: Mapping[str, int] | None = None


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
    explanation: Sequence[explain.Conflict] | None = None  # infeasible: a minimal conflict
    group_status: Sequence[explain.GroupStatus] | None = None  # Request.binding: per group
    proof: Proof | None = None  # z3: every access in bounds, every memory within capacity
    smallest: SmallestRun | None = None  # ranges: the same tiles run at the smallest sizes
    emitted: Emitted | None = None  # --emit: the source written, and its check
    measured: Measured | None = None  # --measure K: the K best schedules, timed


EMITTERS = targets.names()


@dataclass(frozen=True)
class SmallestRun:
    """With size ranges: the solved loop nest instantiated at the smallest admissible
    sizes (root loops adapted, tiles unchanged), verified and run against NumPy."""

    sizes: Mapping[str, int]
    validation: Validation


# ---------------------------------------------------------------- stages


def parse(request: Request) -> Workload:
    return load_workload(request.workload, request.solved_sizes())


def dependence(request: Request, workload: Workload) -> Dependence:
    """Which extents of `workload` are a ranged size: found by parsing the workload again
    with each ranged size at another admissible value (a workload that is not valid there
    is bad input, reported before solving)."""
    probes: dict[str, Workload] = {}
    for name, admissible in request.ranges.items():
        value = probe_value(workload.sizes.get(name, admissible.last), admissible)
        if value is None:
            continue
        try:
            probes[name] = load_workload(request.workload, {**request.solved_sizes(),
                                                            name: value})
        except InputError as exc:
            raise InputError(f"--set {name}={admissible.lo}..{admissible.hi}: workload "
                             f"'{workload.name}' is not valid at {name}={value}: {exc}"
                             ) from None
    return size_dependence(workload, request.ranges, probes)


def run_smallest(request: Request, program: Program, workload: Workload, hw: Hardware,
                 dep: Dependence) -> SmallestRun:
    """The loop nest solved at the largest sizes, run at the smallest: verified by the
    IR verifier, then compared with NumPy (as `validate`)."""
    sizes = {name: r.lo for name, r in request.ranges.items()}
    small = load_workload(request.workload, {**request.solved_sizes(), **sizes})
    at = ", ".join(f"{k}={v}" for k, v in sizes.items())
    try:
        program = instantiate(program, workload, dep, sizes)
        verify(program, small, hw)
    except IRError as exc:
        raise IRError(f"the loop nest at {at} (the smallest admissible sizes): {exc}"
                      ) from None
    return SmallestRun(sizes, validate(program, small, request.seed))


def hardware(request: Request) -> Hardware:
    return load_hardware(request.hardware, tuple(request.hw_overrides))


def encode(workload: Workload, hw: Hardware, constraints: Sequence[str] = (),
           fixes: Sequence[str] = (), drops: Sequence[str] = (),
           deadline: Deadline | None = None, emit: str | None = None,
           dependence: Dependence | None = None) -> Model:
    """The model, then the user's constraints and fixes added, then dropped groups removed
    (see `synth.constraints.user`). Unit counts the constraints and fixes name are
    candidates of the model's spatial factors (`user.named_counts`). Past `deadline`
    (checked while listing candidates and after each build): `SolveTimeout`, exit 3.
    `emit`: the `--emit` target, whose emitter may not merge an online pass split
    across units (`online_terms.whole_pass_constraints`). `dependence` (size ranges: the
    extents that are a ranged size, as `prove` reads them): the root loops over those
    dimensions run ceil(N / step) times, so that the proof over the range can hold
    (`cost.parametric_constraints`, groups `parametric.<kernel>.<dim>`)."""
    kernels = candidate_kernels(workload, deadline, vectors=hw.compute.vector_tiles)
    ranged = dependence.statements if dependence is not None else None
    model = build_model(workload, hw, kernels, deadline=deadline, ranged=ranged)
    check_deadline(deadline, "encoding")
    extra = user.user_constraints(model, constraints, fixes)
    named = user.named_counts(model, extra)
    if named:  # counts the request names (--fix T=11) become candidates: build again
        model = build_model(workload, hw, kernels, named=named, deadline=deadline,
                            ranged=ranged)
        check_deadline(deadline, "encoding")
        extra = user.user_constraints(model, constraints, fixes)
    if emit is not None and emit not in targets.MERGES_ONLINE:
        from synth.constraints.online_terms import whole_pass_constraints
        extra += whole_pass_constraints(model, emit)
    cset = dataclasses.replace(model.constraints,
                               constraints=model.constraints.constraints + tuple(extra))
    return dataclasses.replace(model, constraints=user.drop_groups(cset, drops))


def what_if(hw: Hardware, drops: Sequence[str]) -> Hardware:
    """The hardware a schedule is verified against when groups were dropped: a memory
    without its capacity or transfer rules where `capacity.<memory>` or
    `transfer.<memory>` is dropped (the verifier re-derives those rules itself)."""
    def dropped(group: str) -> bool:
        return any(user.matches(group, pattern) for pattern in drops)

    def relaxed(mem: Memory) -> Memory:
        if dropped(f"capacity.{mem.name}"):
            mem = dataclasses.replace(mem, capacity=mem.reserved + 2**62)
        if dropped(f"transfer.{mem.name}"):
            mem = dataclasses.replace(mem, rules=dataclasses.replace(
                mem.rules, min_bytes=1, align=1))
        return mem

    return dataclasses.replace(hw, memories=tuple(relaxed(m) for m in hw.memories))


def solve(model: Model, solver: str, time_limit_s: float, jobs: int = 1) -> SolveResult:
    if solver == "cpsat":
        return cpsat.solve(model.constraints, time_limit_s, jobs=jobs)
    if solver == "z3":
        return z3backend.solve(model.constraints, time_limit_s)
    if solver == "exhaustive":
        return exhaustive.solve(model.constraints, time_limit_s)
    if solver == "greedy":
        return greedy.solve(model.constraints, time_limit_s, model.slots)
    raise InputError(f"unknown solver {solver!r}; expected one of {', '.join(SOLVERS)}")


def explain_infeasible(model: Model, deadline: Deadline | None = None
                       ) -> list[explain.Conflict]:
    return explain.explain(model.constraints, model.hw, deadline)


def binding(model: Model, result: SolveResult, time_limit_s: float,
            deadline: Deadline | None = None) -> list[explain.GroupStatus]:
    """Each group at the solution: tight, and (when it is proven optimal) binding; the
    groups past `deadline` without a verdict."""
    assert result.env is not None and result.objective is not None
    optimal = result.status is Status.OPTIMAL
    return explain.binding(model.constraints, result.env, result.objective,
                           min(time_limit_s, explain.RESOLVE_LIMIT_S), resolve=optimal,
                           deadline=deadline)


def validate(program: Program, workload: Workload, seed: int = 0) -> Validation:
    """Run the loop nest on random inputs and compare every output with the reference."""
    start = time.perf_counter()
    inputs = make_inputs(workload, seed)
    expected, sigmas = evaluate_errors(workload, inputs)
    actual = interpret(program, workload, inputs)
    per_output: dict[str, dict[str, Any]] = {}
    for tensor in workload.outputs:
        result = compare(expected[tensor.name], actual[tensor.name], tensor.dtype,
                         sigmas.get(tensor.name))
        per_output[tensor.name] = {"passed": result.passed, "max_abs_err": result.max_abs_err,
                                   "max_rel_err": result.max_rel_err,
                                   "tolerance_used": result.used,
                                   "unchecked": result.unchecked}
    return Validation(
        passed=all(o["passed"] for o in per_output.values()),
        max_abs_err=max((o["max_abs_err"] for o in per_output.values()), default=0.0),
        max_rel_err=max((o["max_rel_err"] for o in per_output.values()), default=0.0),
        wall_s=time.perf_counter() - start, per_output=per_output)


def validate_schedule(request: Request, model: Model, env: Mapping[str, int],
                      program: Program, hw: Hardware) -> Validation:
    """`validate`; on a workload past `shrink.MAX_POINTS` iteration points, the same
    schedule with fewer loop steps on a smaller instance (`shrink.smaller_schedule`),
    verified on `hw` and run. Where there is none, the whole workload is run."""
    smaller = shrink.smaller_schedule(
        model, env, lambda at: load_workload(request.workload, at),
        lambda at: encode(at, model.hw, (), (), request.drops, None, request.emit))
    if smaller is None:
        return validate(program, model.workload, request.seed)
    sizes, small, small_env = smaller
    small_program = materialize(small, small_env)
    try:
        verify(small_program, small.workload, hw)
    except IRError as exc:
        raise IRError(f"the schedule at {_listed_sizes(sizes)} (fewer loop steps, to "
                      f"validate it): {exc}") from None
    return dataclasses.replace(validate(small_program, small.workload, request.seed),
                               sizes=dict(sizes))


def _listed_sizes(sizes: Mapping[str, int]) -> str:
    return ", ".join(f"{name}={value}" for name, value in sizes.items())


def check_emit(request: Request, hw: Hardware | None = None) -> None:
    """--emit names a known target and comes with --out (and --out with --emit); with the
    hardware, the target can run on it (see `synth.emit.targets`)."""
    if request.emit is None:
        if request.out_dir is not None:
            raise InputError(f"--out {request.out_dir}: expected --emit TARGET too "
                             f"({', '.join(EMITTERS)})")
        return
    target = targets.target(request.emit)
    if not request.out_dir:
        raise InputError(f"--emit {request.emit}: expected --out DIR, the directory to "
                         f"write the program into")
    if hw is not None:
        target.require(hw, request.validate)


def emit(request: Request, program: Program, workload: Workload, hw: Hardware) -> Emitted:
    """Write the source for `request.emit` into `request.out_dir` and, unless validation
    is off, build it and run it on the validation inputs against the reference."""
    check_emit(request, hw)
    assert request.emit is not None and request.out_dir is not None
    target = targets.target(request.emit)
    inputs = make_inputs(workload, request.seed)
    expected, bounds = evaluate_errors(workload, inputs)
    out_dir = Path(request.out_dir)
    files = target.emit(program, workload, hw, out_dir, inputs, expected, bounds)
    check = target.check(out_dir) if request.validate else None
    return Emitted(request.emit, str(out_dir),
                   tuple(str(f.relative_to(out_dir)) for f in files), check)


def run(request: Request) -> Outcome:
    """Every stage in order; stops after the solve when there is no schedule."""
    timings: dict[str, float] = {}
    deadline = Deadline(request.time_limit_s)  # every stage up to binding within it

    def timed(name: str, fn: Any, *args: Any) -> Any:
        progress.stage(name)
        start = time.perf_counter()
        value = fn(*args)
        timings[name] = time.perf_counter() - start
        return value

    workload = timed("parse", parse, request)
    dep = timed("ranges", dependence, request, workload) if request.ranges else None
    hw = timed("hardware", hardware, request)
    check_emit(request, hw)  # before solving: a target that cannot run here is bad input
    if request.measure:
        measure.require(hw)  # likewise: --measure runs C on this machine's cores
    model = timed("encode", encode, workload, hw, request.constraints, request.fixes,
                  request.drops, None, request.emit, dep)
    result = timed("solve", solve, model, request.solver, max(0.01, deadline.left()),
                   request.jobs)
    if result.status is Status.INFEASIBLE:
        conflicts = timed("explain", explain_infeasible, model, deadline)
        return Outcome(workload, hw, model, result, None, None, None, timings, conflicts)
    if result.env is None:
        return Outcome(workload, hw, model, result, None, None, None, timings)
    checked_hw = what_if(hw, request.drops)
    measured = None
    if request.measure:  # the fastest of the K best, measured, is the schedule from here on
        measured = timed("measure", measure.run, model, result, request.measure, workload,
                         hw, request.time_limit_s, request.seed, checked_hw)
        result = measure.chosen_result(result, measured)
    assert result.env is not None
    program = timed("materialise", materialize, model, result.env)
    timed("verify", verify, program, workload, checked_hw)
    proof = timed("prove", prove, program, workload, checked_hw, request.ranges, dep)
    cost = evaluate_cost(model, dict(result.env))
    validation = (timed("validate", validate_schedule, request, model, result.env, program,
                        checked_hw) if request.validate else None)
    ranged = dep is not None and any(r.count > 1 for r in request.ranges.values())
    smallest = (timed("validate smallest", run_smallest, request, program, workload,
                      checked_hw, dep)
                if request.validate and ranged and proof.proved else None)
    emitted = (timed(f"emit {request.emit}", emit, request, program, workload, hw)
               if request.emit else None)
    groups = (timed("binding", binding, model, result, request.time_limit_s, deadline)
              if request.binding else None)
    return Outcome(workload, hw, model, result, program, cost, validation, timings,
                   group_status=groups, proof=proof, smallest=smallest, emitted=emitted,
                   measured=measured)


def solved(outcome: Outcome) -> bool:
    return outcome.result.status in (Status.OPTIMAL, Status.FEASIBLE)
