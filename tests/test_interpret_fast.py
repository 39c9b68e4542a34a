"""The interpreter's batched reduction loops (`synth.ir.fold_plan`) against the
plain step-by-step run (`interpret(..., batch=False)`): on random workloads and schedules,
built-ins and hand-written corner cases, the batched run gives the same result, bitwise
for integers and within the validation tolerance for floats (in practice bitwise too:
float sums are folded in iteration order). And a loop whose iterations do not only
accumulate is never batched.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping

import numpy as np
import pytest
from conftest import (
    SMALL_UPMEM,
    TWO_CORES,
    UPMEM_PRIOR,
    Case,
    build,
    optimal_program,
    rewrite,
    sample,
)
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from strategies import GeneratedWorkload, workloads

from synth import pipeline
from synth.errors import IRError
from synth.ir import interpret as interp
from synth.ir.fold_plan import fold_plans
from synth.ir.interpret import interpret
from synth.ir.materialize import materialize
from synth.ir.nodes import (
    Affine,
    Alloc,
    Fill,
    Load,
    Loop,
    LoopKind,
    Node,
    Program,
    Store,
    walk,
)
from synth.lang import parse_workload
from synth.reference import compare, evaluate_errors, make_inputs
from synth.workload import Workload

HARDWARE = {"upmem": SMALL_UPMEM, "cpu": TWO_CORES}


def batched_loops(program: Program, workload: Workload) -> int:
    """How many sequential reduction loops of `program` the fast path may batch."""
    count = 0
    for kernel in program.kernels:
        carried = {d for name in kernel.statements for d in workload.statement(name).reduced}
        decls = {d.name: d for d in program.globals} | {
            n.buffer.name: n.buffer for n in walk(kernel.body) if isinstance(n, Alloc)}
        count += len(fold_plans(kernel, decls, workload, carried))
    return count


def check_same(program: Program, workload: Workload, tag: str, budgets: tuple[int, ...] = ()
               ) -> None:
    """The batched run gives the step-by-step run's outputs (or raises its error); so do
    both runs with arrays capped at each of `budgets` (grids stopping elsewhere)."""
    inputs = make_inputs(workload)
    try:
        slow = interpret(program, workload, inputs, batch=False)
    except IRError as exc:
        with pytest.raises(IRError, match=re.escape(str(exc))):
            interpret(program, workload, inputs)
        return
    runs = [(tag, lambda: interpret(program, workload, inputs))]
    for cap in budgets:
        for batch in (True, False):
            runs.append((f"{tag}, budget {cap}, batch={batch}",
                         lambda cap=cap, batch=batch: capped(cap, program, workload, inputs,
                                                             batch)))
    sigmas = evaluate_errors(workload, inputs)[1]
    for name, run in runs:
        fast = run()
        for tensor in workload.outputs:
            a, b = fast[tensor.name], slow[tensor.name]
            if tensor.dtype.is_float:
                # each run is within the reference's tolerance of the exact result, so
                # within twice that of the other
                result = compare(b, a, tensor.dtype, 2 * sigmas[tensor.name])
                assert result.passed, (name, tensor.name, result.max_abs_err)
            else:
                assert np.array_equal(a, b), (name, tensor.name)


def capped(cap: int, program: Program, workload: Workload, inputs: Mapping[str, np.ndarray],
           batch: bool) -> dict[str, np.ndarray]:
    """`interpret` with the interpreter's array budget (`MAX_ELEMENTS`) set to `cap`."""
    before = interp.MAX_ELEMENTS
    interp.MAX_ELEMENTS = cap
    try:
        return interpret(program, workload, inputs, batch)
    finally:
        interp.MAX_ELEMENTS = before


def schedules(case: Case, seeds: tuple[int, ...]) -> list[tuple[str, Program]]:
    out = [("optimum", optimal_program(case))]
    for seed in seeds:
        env = sample(case, seed)
        if env is not None:
            out.append((f"seed {seed}", materialize(build(case).model, env)))
    return out


# ---------------------------------------------------------------- random workloads


@settings(max_examples=15, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(workloads(), st.sampled_from(["upmem", "cpu"]))
def test_batched_equals_step_by_step_on_random_workloads(generated: GeneratedWorkload,
                                                         hw: str) -> None:
    """The optimum and a random schedule, with the default budget and with arrays capped
    at 8 elements: then outer loops iterate and only inner reduction loops batch (folds
    under iterating loops, grids that stop early)."""
    case = Case.of("generated", hw, overrides=HARDWARE[hw], text=generated.text)
    workload = parse_workload(generated.text, "generated.syn", "generated")
    batched = 0
    for tag, program in schedules(case, seeds=(1,)):
        batched += batched_loops(program, workload)
        check_same(program, workload, tag, budgets=(8,))
    event("batched" if batched else "nothing to batch")


# ---------------------------------------------------------------- built-ins and corner cases

# (case, seeds of random schedules besides the optimum): samples of matmul-like models
# take seconds to draw, so those that test_ir draws anyway (cached) and a few others
SMALL = [
    (Case.of("softmax", "cpu", {"N": 4096}, TWO_CORES), (1, 2, 3)),
    (Case.of("softmax", UPMEM_PRIOR, {"N": 4096}), (1, 2, 3)),
    (Case.of("red", UPMEM_PRIOR, {"N": 65536}), (1, 2, 3)),
    (Case.of("red", "cpu", {"N": 6007}, TWO_CORES), (1, 2, 3)),  # prime: ragged tiles
    (Case.of("matmul", "cpu", {"M": 64, "N": 32, "K": 128}), (1, 2, 3)),
    (Case.of("mv", UPMEM_PRIOR, {"M": 64, "N": 128}), (1, 2, 3)),
    (Case.of("matmul", UPMEM_PRIOR, {"M": 64, "N": 32, "K": 128}), ()),
    (Case.of("gemm2k", "cpu", {"M": 32, "N": 32, "K": 64}, TWO_CORES), ()),
    (Case.of("attention", UPMEM_PRIOR, {"S": 32, "D": 16}), ()),
    (Case.of("attention", "cpu", {"S": 32, "D": 16}), (1, 2, 3)),  # the optimum is online
]

# integer max into i8: a contribution past 127 wraps at every step, so the order of the
# fold matters and it must run in iteration order; and two reductions fused in one loop
I8_MAX = """
size N = 300
in  x : i8[N]
out m : i8[]
out s : i32[]
m[] max= x[i] * x[i] * x[i] * x[i] * x[i]
s[] += x[i] * x[i]
"""

# float sums into f16: rounding at every step is what the schedule computes
F16_SUM = """
size N = 2000
size M = 3
in  x : f16[M, N]
out s : f16[M]
s[j] += x[j, i] * 0.25
"""

CORNER = [(Case.of(name, hw, overrides=HARDWARE[hw], text=text), (1, 2, 3))
          for name, text in (("i8max", I8_MAX), ("f16sum", F16_SUM)) for hw in HARDWARE]


@pytest.mark.parametrize("case, seeds", SMALL + CORNER, ids=lambda c: getattr(c, "id", ""))
def test_batched_equals_step_by_step(case: Case, seeds: tuple[int, ...]) -> None:
    batched = 0
    for tag, program in schedules(case, seeds):
        batched += batched_loops(program, build(case).workload)
        check_same(program, build(case).workload, tag)
    assert batched, "no reduction loop to batch: the test proves nothing"


def test_float_sums_fold_in_iteration_order() -> None:
    """softmax's sum and max, on a CPU schedule that reduces in many steps: the batched
    run is bitwise the step-by-step one, and both pass against the reference."""
    case = SMALL[0][0]
    program, workload = optimal_program(case), build(case).workload
    assert batched_loops(program, workload) >= 2
    inputs = make_inputs(workload)
    fast = interpret(program, workload, inputs)
    slow = interpret(program, workload, inputs, batch=False)
    assert all(np.array_equal(fast[t.name], slow[t.name]) for t in workload.outputs)
    assert pipeline.validate(program, workload).passed


# ---------------------------------------------------------------- loops that must not batch


def batches(program: Program, workload: Workload, kernel: str, loop: str) -> bool:
    """Whether the fast path may batch the sequential loop `loop` of kernel `kernel`, or
    of the kernel that runs statement `kernel`."""
    found = next(k for k in program.kernels if k.name == kernel or kernel in k.statements)
    node = next(n for n in walk(found.body) if isinstance(n, Loop) and n.var.name == loop)
    carried = {d for s in found.statements for d in workload.statement(s).reduced}
    decls = {d.name: d for d in program.globals} | {
        n.buffer.name: n.buffer for n in walk(found.body) if isinstance(n, Alloc)}
    return id(node) in fold_plans(found, decls, workload, carried)


def inner_loop(program: Program, kernel: str) -> Loop:
    """The innermost sequential loop of a kernel (or of the kernel running a statement)."""
    found = next(k for k in program.kernels if k.name == kernel or kernel in k.statements)
    return [n for n in walk(found.body)
            if isinstance(n, Loop) and n.var.kind is LoopKind.SEQUENTIAL][-1]


def test_softmax_reduction_loops_batch() -> None:
    case = SMALL[0][0]
    program, workload = optimal_program(case), build(case).workload
    for statement in ("m", "s"):
        assert batches(program, workload, statement, inner_loop(program, statement).var.name)


def overlapping(program: Program, buffer: str, var: str) -> Program:
    """`buffer`'s tile no longer moves with loop `var`: every iteration writes one tile."""
    def fn(node: Node) -> Node:
        if isinstance(node, Alloc) and node.buffer.name == buffer:
            origin = tuple(Affine(tuple((v, c) for v, c in a.terms if v != var), a.const)
                           for a in node.buffer.origin)
            return Alloc(dataclasses.replace(node.buffer, origin=origin))
        return node
    return rewrite(program, "e", fn)


def test_iterations_storing_one_tile_do_not_batch() -> None:
    """softmax on the CPU fuses e and s: each iteration of the sum's loop stores its e
    tile at its own place. Stored at one place, the last iteration wins step by step, so
    the loop must not batch."""
    case = SMALL[0][0]
    program, workload = optimal_program(case), build(case).workload
    loop = inner_loop(program, "s")
    # the store whose tile moves with the loop: the outermost of e's tiles it writes
    store = [n for n in loop.body if isinstance(n, Store) and n.src.startswith("e_")][-1]
    assert batches(program, workload, "s", loop.var.name)
    broken = overlapping(program, store.src, loop.var.name)
    assert broken != program
    assert not batches(broken, workload, "s", loop.var.name)


def test_accumulator_overwritten_each_iteration_does_not_batch() -> None:
    """softmax on UPMEM relays the sum's accumulator from WRAM partials into a WRAM tile
    and back in every iteration. With the tile filled with 0 instead of loaded, each
    iteration overwrites the partials with its own part (the last one wins): no longer
    `acc = acc op part`, so the loop must not batch."""
    case = SMALL[1][0]
    program, workload = optimal_program(case), build(case).workload
    loop = inner_loop(program, "s")
    assert batches(program, workload, "s", loop.var.name)
    broken = rewrite(program, "s", lambda n: Fill("s_wram", 0)
                     if isinstance(n, Load) and n.dst == "s_wram" else n)
    assert broken != program
    assert not batches(broken, workload, "s", loop.var.name)
    check_same(broken, workload, "overwritten")
    assert not pipeline.validate(broken, workload).passed


# a scalar statistic read inside the loop over i (the fuzz corpus's exit 70: the
# interpreter's initialised check indexed a 0-d tensor like an array)
SCALAR_IN_A_LOOP = """
size M = 4
in x0 : bf16[M]
out y : f32[M]
t0[i] = x0[i] + 1e-5
t1[] max= t0[i]
t2[] = t1[]
y[i] max= t2[] - t1[] + (M)
"""


def test_a_scalar_read_inside_a_loop_validates() -> None:
    case = Case.of("scalar", "cpu", overrides=TWO_CORES, text=SCALAR_IN_A_LOOP)
    assert pipeline.validate(optimal_program(case), build(case).workload).passed


# a product-sum with a scalar operand read through index arrays (CI's hypothesis find:
# the batched contraction zipped a 0-d view against the frame's axes, IndexError)
SCALAR_IN_A_CONTRACTION = """
size NI = 2
in x0 : f32[NI]
in x1 : f32[]
out t0 : f32[]
t0[] += x0[i]
t0[] += x0[i]
t0[] += x0[i]
t0[] += (x0[i] * x1[])
"""


def test_a_scalar_operand_of_a_contraction_validates() -> None:
    case = Case.of("scalar_dot", "cpu", overrides=TWO_CORES, text=SCALAR_IN_A_CONTRACTION)
    assert pipeline.validate(optimal_program(case), build(case).workload).passed
