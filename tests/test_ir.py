"""The loop-nest IR: the printer shows the schedule, every built-in validates on both
hardware models, the verifier and the interpreter catch broken loop nests (each mutation
below is a bug a materialiser could have), and the verifier enforces capacities."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from conftest import (
    SMALL_UPMEM,
    TWO_CORES,
    UPMEM_PRIOR,
    Case,
    Rewrite,
    build,
    check_capacity_boundary,
    count_nodes,
    memory_usage,
    optimal_program,
    optimum,
    parallel_loops,
    rewrite,
    sample,
    solve,
)

from synth import pipeline
from synth.constraints import expr as ex
from synth.constraints.cost import build_model
from synth.constraints.result import Status
from synth.constraints.space import NamedConstraint, one_kernel_per_statement
from synth.errors import IRError
from synth.hwfile import load_hardware
from synth.ir.interpret import interpret
from synth.ir.materialize import materialize
from synth.ir.nodes import (
    Affine,
    Alloc,
    BufferDecl,
    Combine,
    Compute,
    Fill,
    Load,
    Loop,
    LoopKind,
    LoopVar,
    Node,
    Program,
    Store,
    walk,
)
from synth.ir.printer import print_program
from synth.ir.verify import verify
from synth.lang import list_builtin_workloads, parse_workload
from synth.reference import make_inputs

SOFTMAX = Case.of("softmax", UPMEM_PRIOR, {"N": 4096})
RED = Case.of("red", UPMEM_PRIOR, {"N": 65536})


def run_interpreter(case: Case, program: Program) -> dict[str, np.ndarray]:
    workload = build(case).workload
    return interpret(program, workload, make_inputs(workload))


def check_verifier(case: Case, program: Program) -> None:
    verify(program, build(case).workload, build(case).hw)


# ---------------------------------------------------------------- printer


def test_printed_softmax_reads_like_a_schedule() -> None:
    program = optimal_program(SOFTMAX)
    text = print_program(program)
    lines = text.splitlines()
    counts = ", ".join(f"{k}={v}" for k, v in program.counts.items())
    assert lines[0] == f"program softmax on upmem with {counts}"
    assert list(program.counts) == ["R", "D", "T"]
    for kernel in ("m", "e", "s", "y"):
        assert f"kernel {kernel} {{" in lines
    # parallel loops keep their symbolic extents beside their values
    assert re.search(r"^\s+forall t_i in 0\.\.T\.y\.i=\d+ \{  // tasklet", text, re.M)
    assert re.search(r"^\s+forall r_i in 0\.\.R\.y\.i=\d+ \{  // rank", text, re.M)
    assert re.search(r"^\s+alloc wram x_wram : f32\[\d+\] at x\[", text, re.M)
    assert re.search(r"^\s+alloc mram e_mram : f32\[\d+\]", text, re.M)
    assert re.search(r"^\s+load x_wram <- x_mram$", text, re.M)
    assert re.search(r"^\s+store y_mram -> y$", text, re.M)
    assert re.search(r"^\s+compute y\(e_wram, s_wram\) -> y_wram  \[i: \d+\]$", text, re.M)
    # split reductions: partial results, then their combine with the statement's operator
    split = re.findall(r"alloc host (\w+)_partials : f32\[\] partials over \(", text)
    assert split, "the optimum splits neither reduction any more"
    operators = {"m": "max=", "s": "+="}
    for target in split:
        assert f"combine {target} {operators[target]} reduce({target}_partials)" in text
    assert text.count("{") == text.count("}")


def printed_programs() -> list[tuple[str, Program]]:
    """Optima of several workloads, and random schedules (with sequential loops)."""
    cases = [SOFTMAX, RED, Case.of("matmul", "cpu", {"M": 64, "N": 32, "K": 128}),
             Case.of("mv", "upmem", {"M": 64, "N": 128}),
             Case.of("attention", "cpu", {"S": 32, "D": 16})]
    out = [(c.id, optimal_program(c)) for c in cases]
    for case in cases[:4]:
        for seed in (1, 2, 3):
            env = sample(case, seed)
            assert env is not None
            out.append((f"{case.id}#{seed}", materialize(build(case).model, env)))
    return out


def test_printer_shows_every_node() -> None:
    """One printed line per node, of the node's kind, with each loop's symbol=extent."""
    sequential = 0
    for name, program in printed_programs():
        text = print_program(program)
        nodes = [n for k in program.kernels for n in walk(k.body)]
        loops = [n for n in nodes if isinstance(n, Loop)]
        par = sum(n.var.kind is LoopKind.PARALLEL for n in loops)
        seq = len(loops) - par
        sequential += seq
        assert len(re.findall(r"^\s+forall ", text, re.M)) == par, name
        assert len(re.findall(r"^\s+for ", text, re.M)) == seq, name
        for kind, word in ((Alloc, "alloc"), (Load, "load"), (Store, "store"),
                           (Fill, "fill"), (Compute, "compute"), (Combine, "combine")):
            printed = len(re.findall(rf"^\s+{word} ", text, re.M))
            assert printed == count_nodes(program, kind), (name, word)
        for loop in loops:
            var = loop.var
            assert f"{var.name} in 0..{var.symbol}={var.extent} {{" in text, (name, var)
    assert sequential > 0, "no program with a sequential loop was printed"


def test_partial_results_are_always_combined() -> None:
    """Whenever a kernel allocates partial results of a split reduction, on the host or in
    a memory the units share (an on-device combine), it combines them into the target
    with the statement's operator, after the loops that produce them."""
    seen = {"host": 0, "device": 0}
    for name, program in printed_programs():
        for kernel in program.kernels:
            allocs = {n.buffer.name: n.buffer for n in walk(kernel.body)
                      if isinstance(n, Alloc)}
            partials = [b for b in allocs.values()
                        if b.name.endswith(("_partials", "_combine"))]
            combines = [n for n in walk(kernel.body) if isinstance(n, Combine)]
            assert sorted(c.partials for c in combines) == sorted(b.name for b in partials), \
                (name, kernel.name)
            for buffer in partials:
                assert buffer.partial_loops, (name, buffer)
                combine = next(c for c in combines if c.partials == buffer.name)
                if buffer.memory == program.root_memory:
                    assert combine.target == buffer.tensor
                    assert isinstance(kernel.body[-1], Combine), (name, kernel.name)
                    seen["host"] += 1
                else:  # into the tile of the same tensor in the memory outside the units
                    target = allocs[combine.target]
                    assert target.tensor == buffer.tensor and target.shape == buffer.shape
                    assert target.memory != buffer.memory
                    seen["device"] += 1
    assert all(seen.values()), seen


# ---------------------------------------------------------------- built-ins validate

SIZES = {
    "attention": {"S": 64, "D": 16},
    "fa6": {"S": 64, "D": 32},
    "gemm2k": {"M": 64, "N": 64, "K": 64},
    "matmul": {"M": 64, "N": 32, "K": 128},
    "mv": {"M": 128, "N": 256},
    "red": {"N": 65536},
    "softmax": {"N": 65536},
    "va": {"N": 65536},
    "rmsnorm": {"S": 24, "D": 40},
    "layernorm": {"S": 24, "D": 40},
    "swiglu": {"S": 16, "D": 24, "F": 40},
    "mha": {"B": 2, "H": 3, "S": 16, "E": 8},
    "transformer": {"S": 8, "D": 16, "H": 2, "E": 8, "F": 24},
}


# issue 12's built-ins, validated on every model by tests/test_scale.py
SCALE_BUILTINS = ("rmsnorm", "layernorm", "swiglu", "mha", "transformer")


def test_every_builtin_has_a_reduced_size() -> None:
    assert set(list_builtin_workloads()) == set(SIZES)


@pytest.mark.parametrize("hw", ["upmem", "cpu"])
@pytest.mark.parametrize("workload", sorted(SIZES))
def test_builtin_validates(workload: str, hw: str) -> None:
    if hw == "upmem" and workload in SCALE_BUILTINS:
        pytest.skip("on upmem these solve past 30 s here; tests/test_scale.py validates them")
    outcome = pipeline.run(pipeline.Request(workload, hw, SIZES[workload]))
    assert outcome.result.status is Status.OPTIMAL
    assert outcome.program is not None
    assert outcome.validation is not None
    assert outcome.validation.passed, outcome.validation.per_output
    assert set(outcome.validation.per_output) == {t.name for t in outcome.workload.outputs}


# ---------------------------------------------------------------- broken loop nests


def drop_load(dst: str) -> Rewrite:
    return lambda n: None if isinstance(n, Load) and n.dst == dst else n


def drop_store(src: str) -> Rewrite:
    return lambda n: None if isinstance(n, Store) and n.src == src else n


def change_buffer(name: str, **changes: Callable[[BufferDecl], object]) -> Rewrite:
    """Replace fields of one buffer's declaration, each computed from the old one."""
    def fn(node: Node) -> Node:
        if isinstance(node, Alloc) and node.buffer.name == name:
            fields = {k: f(node.buffer) for k, f in changes.items()}
            return Alloc(dataclasses.replace(node.buffer, **fields))
        return node
    return fn


def shifted(by: int) -> Callable[[BufferDecl], object]:
    """A buffer's origin moved by `by` elements along its last axis."""
    return lambda b: b.origin[:-1] + (b.origin[-1] + Affine((), by),)


def mutated(program: Program, kernel: str, fn: Rewrite) -> Program:
    """The mutation must change something, or the test would prove nothing."""
    broken = rewrite(program, kernel, fn)
    assert broken != program, "the mutation did not apply"
    return broken


def test_dropped_load_is_caught() -> None:
    broken = mutated(optimal_program(SOFTMAX), "e", drop_load("x_wram"))
    with pytest.raises(IRError, match=r"x_wram \(x\) loaded or computed before"):
        check_verifier(SOFTMAX, broken)
    with pytest.raises(IRError, match=r"expected initialised x_wram"):
        run_interpreter(SOFTMAX, broken)


def test_dropped_outer_load_is_caught_by_the_interpreter() -> None:
    # x_wram is still loaded, but from an x_mram that nothing filled
    broken = mutated(optimal_program(SOFTMAX), "e", drop_load("x_mram"))
    with pytest.raises(IRError, match=r"expected initialised x_wram"):
        run_interpreter(SOFTMAX, broken)


@pytest.mark.parametrize("by", [1, -1])
@pytest.mark.parametrize("buffer", ["x_wram", "x_mram", "e_wram", "e_mram"])
def test_tile_off_by_one_is_caught(buffer: str, by: int) -> None:
    broken = mutated(optimal_program(SOFTMAX), "e", change_buffer(buffer, origin=shifted(by)))
    with pytest.raises(IRError, match=r"expected the tile inside [a-z]+(_mram)?"):
        check_verifier(SOFTMAX, broken)
    with pytest.raises(IRError, match=r"expected (the tile inside|i inside tile of)"):
        run_interpreter(SOFTMAX, broken)


@pytest.mark.parametrize("buffer", ["x_wram", "x_mram", "e_wram", "e_mram"])
def test_shrunk_tile_is_caught(buffer: str) -> None:
    shrink = change_buffer(buffer, shape=lambda b: tuple(n - 1 for n in b.shape))
    broken = mutated(optimal_program(SOFTMAX), "e", shrink)
    with pytest.raises(IRError, match=r"(tile inside|aligned runs)"):
        check_verifier(SOFTMAX, broken)
    with pytest.raises(IRError, match=r"(tile inside|inside tile of) [a-z]_(w|m)ram"):
        run_interpreter(SOFTMAX, broken)


def test_dropped_inner_store_is_caught() -> None:
    broken = mutated(optimal_program(SOFTMAX), "y", drop_store("y_wram"))
    with pytest.raises(IRError, match=r"store y_mram: expected a tile computed or loaded"):
        check_verifier(SOFTMAX, broken)
    with pytest.raises(IRError, match=r"store y_mram -> y: expected a computed tile"):
        run_interpreter(SOFTMAX, broken)


def test_output_never_stored_is_caught() -> None:
    broken = mutated(optimal_program(SOFTMAX), "y", drop_store("y_mram"))
    with pytest.raises(IRError, match=r"tensor y: expected every element written, got 4096"):
        run_interpreter(SOFTMAX, broken)


def test_temporary_never_stored_is_caught() -> None:
    broken = mutated(optimal_program(SOFTMAX), "e", drop_store("e_mram"))
    with pytest.raises(IRError, match=r"compute s: expected initialised e_wram"):
        run_interpreter(SOFTMAX, broken)


@pytest.mark.parametrize("case, statement", [(SOFTMAX, "m"), (SOFTMAX, "s"), (RED, "s")],
                         ids=["softmax-max", "softmax-sum", "red"])
def test_dropped_combine_is_caught(case: Case, statement: str) -> None:
    """Each combine, on the device or on the host, is needed: dropping any one of them
    changes the result."""
    program = optimal_program(case)
    kernel = next(k.name for k in program.kernels if statement in k.statements)
    combines = count_nodes(program, Combine, kernel)
    assert combines >= 1, "the optimum no longer splits"
    assert pipeline.validate(program, build(case).workload).passed
    for victim in range(combines):
        seen = iter(range(combines))

        def drop(node: Node, victim: int = victim, seen: Iterator[int] = seen) -> Node | None:
            return None if isinstance(node, Combine) and next(seen) == victim else node

        result = pipeline.validate(mutated(program, kernel, drop), build(case).workload)
        assert result.passed is False, victim
        assert result.max_abs_err > 0


def test_two_units_writing_one_element_are_caught() -> None:
    """Every unit of the innermost parallel loop of kernel e writes the same tile: its
    loop variable is dropped from every offset, so the loop no longer splits anything."""
    program = optimal_program(SOFTMAX)
    kernel = next(k for k in program.kernels if k.name == "e")
    var = [n.var for n in walk(kernel.body)
           if isinstance(n, Loop) and n.var.kind is LoopKind.PARALLEL][-1]

    def without(a: Affine) -> Affine:
        return Affine(tuple((v, c) for v, c in a.terms if v != var.name), a.const)

    def fn(node: Node) -> Node:
        if isinstance(node, Alloc):
            return Alloc(dataclasses.replace(
                node.buffer, origin=tuple(without(o) for o in node.buffer.origin)))
        if isinstance(node, Compute):
            return dataclasses.replace(node, origin=tuple(without(o) for o in node.origin))
        return node

    broken = mutated(program, "e", fn)
    with pytest.raises(IRError, match=r"expected each element written by one unit"):
        run_interpreter(SOFTMAX, broken)


def test_a_whole_kernel_run_twice_in_parallel_is_caught() -> None:
    program = optimal_program(SOFTMAX)
    kernel = next(k for k in program.kernels if k.name == "y")
    twice = LoopVar("dup", "i", "X.y.i", 2, 1, LoopKind.PARALLEL, "rank")
    doubled = dataclasses.replace(kernel, body=(Loop(twice, kernel.body),))
    broken = dataclasses.replace(program, kernels=tuple(
        doubled if k.name == "y" else k for k in program.kernels))
    with pytest.raises(IRError, match=r"store y_mram -> y: expected each element written"):
        run_interpreter(SOFTMAX, broken)


def test_unscoped_buffer_is_caught() -> None:
    broken = mutated(optimal_program(SOFTMAX), "e",
                     lambda n: None if isinstance(n, Alloc) and n.buffer.name == "x_wram"
                     else n)
    with pytest.raises(IRError, match=r"expected buffer x_wram allocated around its use"):
        check_verifier(SOFTMAX, broken)


def test_rank_mismatch_is_caught() -> None:
    bad = change_buffer("x_wram", shape=lambda b: b.shape + (1,))
    broken = mutated(optimal_program(SOFTMAX), "e", bad)
    with pytest.raises(IRError, match=r"buffer x_wram: expected dims, shape and origin"):
        check_verifier(SOFTMAX, broken)


# ---------------------------------------------------------------- verifier: capacities


@pytest.mark.parametrize("case", [SOFTMAX, Case.of("mv", "upmem", {"M": 64, "N": 128}),
                                  Case.of("matmul", "cpu", {"M": 64, "N": 32, "K": 128},
                                          TWO_CORES)],
                         ids=lambda c: c.id)
def test_verifier_capacity_is_the_models_to_the_byte(case: Case) -> None:
    """The verifier re-derives what the capacity constraints count: a program fits a
    memory of exactly the bytes the model says it uses, and not one byte less."""
    built = build(case)
    for seed in range(4):
        env = dict(optimum(case).env or {}) if seed == 0 else sample(case, seed)
        assert env is not None
        program = materialize(built.model, env)
        assert memory_usage(built.model, env)
        check_capacity_boundary(program, built.workload, built.model, env, case.hardware,
                                case.overrides)


def test_verifier_rejects_a_program_for_a_smaller_wram() -> None:
    program = optimal_program(SOFTMAX)
    assert memory_usage(build(SOFTMAX).model, optimum(SOFTMAX).env or {})["wram"] > 512
    small = load_hardware("upmem", ["wram.capacity=512B", "wram.reserved=0"])
    with pytest.raises(IRError, match=r"expected tiles in one wram to fit 512 bytes"):
        verify(program, build(SOFTMAX).workload, small)


def test_verifier_rejects_transfers_below_the_minimum() -> None:
    program = optimal_program(SOFTMAX)
    strict = load_hardware("upmem", ["mram.transfer.min=1MiB"])
    with pytest.raises(IRError, match=r"expected transfers of at least 1048576 bytes into mram"):
        verify(program, build(SOFTMAX).workload, strict)


# ---------------------------------------------------------------- known bugs

# The verifier's dataflow check is shallow: every global (temporaries and outputs too)
# counts as written from the start, and a Load never asks whether its source holds data,
# so a loop nest that reads data nothing produced passes (docs/architecture.md:
# "verify.py ... read-after-write"; DESIGN.md 6: "every read preceded by the write or
# transfer that produces it"). The interpreter catches each of these.
SHALLOW_DATAFLOW = {
    "load from an MRAM tile nothing loaded": ("e", drop_load("x_mram")),
    "temporary never stored, read by a later kernel": ("e", drop_store("e_mram")),
    "accumulator's MRAM tile never loaded": ("s", drop_load("s_mram")),
    "partials never initialised": ("s", lambda n: None if isinstance(n, Fill)
                                   and n.buffer == "s_partials" else n),
    "output never stored": ("y", drop_store("y_mram")),
}


@pytest.mark.parametrize("mutation", sorted(SHALLOW_DATAFLOW))
def test_interpreter_catches_reads_of_data_nothing_produced(mutation: str) -> None:
    kernel, fn = SHALLOW_DATAFLOW[mutation]
    broken = mutated(optimal_program(SOFTMAX), kernel, fn)
    with pytest.raises(IRError, match=r"expected (initialised|the accumulator|every element)"):
        run_interpreter(SOFTMAX, broken)


@pytest.mark.parametrize("mutation", sorted(SHALLOW_DATAFLOW))
def test_verifier_follows_dataflow(mutation: str) -> None:
    kernel, fn = SHALLOW_DATAFLOW[mutation]
    broken = mutated(optimal_program(SOFTMAX), kernel, fn)
    with pytest.raises(IRError):
        check_verifier(SOFTMAX, broken)


def test_verifier_requires_partials_to_be_combined() -> None:
    broken = mutated(optimal_program(SOFTMAX), "s",
                     lambda n: None if isinstance(n, Combine) else n)
    with pytest.raises(IRError):
        check_verifier(SOFTMAX, broken)


SCALAR_ONE_CORE = [
    Case.of("red", "cpu", {"N": 64}, ("core.count=1",)),
    Case.of("softmax", "cpu", {"N": 1009}, ("core.count=1",)),
    Case.of("red", "upmem", {"N": 64}, ("rank.count=1", "dpu.count=1", "tasklet.count=1")),
]


@pytest.mark.parametrize("case", SCALAR_ONE_CORE, ids=lambda c: c.id)
def test_scalar_reduction_without_parallel_loops_validates(case: Case) -> None:
    outcome = pipeline.run(pipeline.Request(case.workload, case.hardware, dict(case.sizes),
                                            case.overrides))
    assert outcome.validation is not None and outcome.validation.passed


def test_scalar_reduction_over_a_padded_extent_runs() -> None:
    case = Case.of("red", "cpu", {"N": 1000}, ("core.count=1",))
    cset = build(case).model.constraints
    env = cset.complete({"ext.s.i": 1024, "S.s.i": 1, "L.s.i": 8, "Q.s.i": 8, "V.s.i": 16})
    assert cset.violated(env) == []
    program = materialize(build(case).model, env)
    assert pipeline.validate(program, build(case).workload).passed


FRESH_ACCUMULATE = "size N = 16\nin x : f32[N]\nout y : f32[N]\ny[i] += x[i]\n"


@pytest.mark.parametrize("hw", ["upmem", "cpu"])
def test_fresh_accumulation_without_reduction(hw: str, tmp_path: Path) -> None:
    path = tmp_path / "acc.syn"
    path.write_text(FRESH_ACCUMULATE)
    outcome = pipeline.run(pipeline.Request(str(path), hw))
    assert outcome.validation is not None and outcome.validation.passed


PADDED_I8 = "size M = 2\nsize N = 3\nin x : i8[M, N]\nout y : i8[M, N]\ny[i, j] = x[i, j]\n"


def test_verifier_accepts_what_the_constraints_admit() -> None:
    workload = parse_workload(PADDED_I8, "pad.syn", "pad")
    hw = load_hardware("upmem")
    pad = NamedConstraint("user.1", "pad j to 4",
                          ex.Cmp(ex.Var("ext.y.j"), "==", ex.Const(4)))
    model = build_model(workload, hw, one_kernel_per_statement(workload), [pad])
    result = solve(model.constraints)
    assert result.status is Status.OPTIMAL and result.env is not None
    program = materialize(model, result.env)
    assert pipeline.validate(program, workload).passed  # the schedule is correct
    verify(program, workload, hw)


F16_SUM = "size N = 9\nin x : f16[N]\nout s : f16[]\ns[] += x[i]\n"


def test_f16_split_sum_validates() -> None:
    """f16 partial sums (stored in f16, as the IR says) differ from the float64 reference
    by about an f16 ulp of the partials; with cancellation the scalar is small, which a
    tolerance relative to the result rejected (max_rel_err 0.0113 > 0.011); the error
    scale of the sum's terms accepts it."""
    case = Case.of("f16sum", "upmem", {}, SMALL_UPMEM, text=F16_SUM)
    cset = build(case).model.constraints
    env = cset.complete({"ext.s.i": 16, "R.s.i": 1, "D.s.i": 4, "M.s.i": 1, "T.s.i": 1,
                         "Q.s.i": 4, "combine.s.tasklet": 0, "buffers.s.wram": 1})
    assert cset.violated(env) == []
    program = materialize(build(case).model, env)
    verify(program, build(case).workload, build(case).hw)
    assert count_nodes(program, Combine) == 1
    assert pipeline.validate(program, build(case).workload).passed


def test_parallel_loops_use_the_counts_the_program_allocates() -> None:
    for name, program in printed_programs():
        for loop in parallel_loops(program):
            symbol = loop.var.symbol.split(".")[0]
            assert loop.var.extent <= program.counts[symbol], (name, loop.var)


def test_buffers_live_in_the_hardware_memories() -> None:
    """Tiles live below the root; the root memory holds only whole tensors' partials."""
    for name, program in printed_programs():
        hw = load_hardware(program.hardware)
        below_root = {m.name for m in hw.memories[1:]}
        for kernel in program.kernels:
            for node in walk(kernel.body):
                if isinstance(node, Alloc):
                    buffer = node.buffer
                    if buffer.memory == hw.root_memory.name:
                        assert buffer.name == f"{buffer.tensor}_partials", (name, buffer)
                    else:
                        assert buffer.memory in below_root, (name, buffer)
                        assert buffer.name in (f"{buffer.tensor}_{buffer.memory}",
                                               f"{buffer.tensor}_{buffer.memory}_combine",
                                               # an online kernel's statistic before a step
                                               f"{buffer.tensor}_{buffer.memory}_prev")
