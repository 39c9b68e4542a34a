"""Double buffering as a solver decision: `buffers.<kernel>.<memory>` in {1, 2}.

With 2, the tiles moving into that memory take twice the bytes (model, verifier and
prover agree byte for byte), and its transfers overlap with compute: the exposed time is
max(transfer, compute) - compute + the cost of one move of each tile.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest
from conftest import (
    UPMEM_PRIOR,
    Case,
    build,
    check_capacity_boundary,
    optimal_program,
    optimum,
    solve,
)

from synth import pipeline
from synth.constraints import expr as ex
from synth.constraints.combines import exchanged_on_device
from synth.constraints.cost import (
    KernelTerms,
    buffers_decision,
    compute_cost,
    evaluate_cost,
    tensor_transfer_cost,
    transfer_cost,
    transfer_count,
)
from synth.constraints.result import Status
from synth.constraints.space import SlotKind
from synth.emit.upmem import check_upmem, emit_upmem
from synth.hwfile import load_hardware
from synth.ir.materialize import materialize
from synth.ir.nodes import Alloc, Program, walk
from synth.ir.printer import print_program
from synth.ir.prove import prove
from synth.ir.verify import buffer_bytes, verify
from synth.pipeline import encode, validate
from synth.reference import evaluate, make_inputs

SOFTMAX = Case.of("softmax", UPMEM_PRIOR, {"N": 4096})
VA = Case.of("va", UPMEM_PRIOR, {"N": 4096})


def buffered(program: Program) -> list[str]:
    return [n.buffer.name for k in program.kernels for n in walk(k.body)
            if isinstance(n, Alloc) and n.buffer.buffers == 2]


def test_the_optimum_double_buffers_wram() -> None:
    result = optimum(SOFTMAX)
    assert result.status is Status.OPTIMAL and result.env is not None
    names = [n for n in build(SOFTMAX).model.constraints.decisions if n.startswith("buffers.")]
    # one decision per kernel, for WRAM only: MRAM is filled from the root (between launches)
    assert names and all(n.endswith(".wram") for n in names)
    assert any(result.env[n] == 2 for n in names)
    program = optimal_program(SOFTMAX)
    assert buffered(program)
    assert " x2" in print_program(program)
    verify(program, build(SOFTMAX).workload, build(SOFTMAX).hw)


def test_double_buffering_lowers_the_cost() -> None:
    built = build(SOFTMAX)
    result = optimum(SOFTMAX)
    assert result.env is not None and result.objective is not None
    names = [n for n in built.model.constraints.decisions if n.startswith("buffers.")]
    fixed = [f"{n}=1" for n in names]
    single = solve(encode(built.workload, built.hw, fixes=fixed).constraints)
    assert single.objective is not None and single.objective > result.objective


def test_capacity_forbids_double_buffering() -> None:
    # three 8-byte tiles per tasklet fit (24 B); doubled they do not (48 B)
    hw = load_hardware(UPMEM_PRIOR, ("wram.capacity=2088B", "wram.reserved=2048B"))
    built = build(VA)
    model = encode(built.workload, hw)
    result = solve(model.constraints)
    assert result.status is Status.OPTIMAL and result.env is not None
    names = [n for n in model.constraints.decisions if n.startswith("buffers.")]
    assert names and all(result.env[n] == 1 for n in names)
    program = materialize(model, result.env)
    assert not buffered(program)
    forced = encode(built.workload, hw, fixes=[f"{n}=2" for n in names])
    assert solve(forced.constraints).status is Status.INFEASIBLE


@pytest.mark.parametrize("case", [SOFTMAX, VA], ids=lambda c: c.id)
def test_capacity_is_byte_exact_with_double_buffering(case: Case) -> None:
    built = build(case)
    names = [n for n in built.model.constraints.decisions if n.startswith("buffers.")]
    model = encode(built.workload, built.hw, fixes=[f"{n}=2" for n in names])
    result = solve(model.constraints)
    assert result.env is not None
    program = materialize(model, result.env)
    assert buffered(program)
    check_capacity_boundary(program, built.workload, model, result.env, case.hardware,
                            case.overrides)


@pytest.mark.parametrize("case", [SOFTMAX, VA, Case.of("mv", UPMEM_PRIOR, {"M": 64, "N": 256})],
                         ids=lambda c: c.id)
def test_forced_double_buffering_validates_and_proves(case: Case) -> None:
    built = build(case)
    names = [n for n in built.model.constraints.decisions if n.startswith("buffers.")]
    model = encode(built.workload, built.hw, fixes=[f"{n}=2" for n in names])
    result = solve(model.constraints)
    assert result.env is not None and all(result.env[n] == 2 for n in names)
    program = materialize(model, result.env)
    assert buffered(program)
    verify(program, built.workload, built.hw)
    assert validate(program, built.workload).passed
    proof = prove(program, built.workload, built.hw)
    assert proof.proved, str(proof)


def test_exposed_transfer_formula() -> None:
    """The WRAM transfer part of a double-buffered kernel is max(T, C) - C + first, with
    T and C the single-buffered transfer and compute, and first = sum over tensors of
    (their transfer time / how often their tile moves), computed here independently.
    Tensors exchanged with an on-device combine buffer do not move and count nothing."""
    built = build(SOFTMAX)
    model = built.model
    env = optimum(SOFTMAX).env
    assert env is not None
    parts = evaluate_cost(model, env)
    assert sum(parts.values()) == ex.evaluate(model.constraints.objective, env)
    assert all(v >= 0 for v in parts.values())
    slot = next(i for i, s in enumerate(model.slots)
                if s.kind is SlotKind.TEMPORAL and s.name == "wram")
    mem = model.hw.memory("wram")
    expected = 0
    checked = 0
    for spec in model.selected(env):
        kt = KernelTerms(spec, model.factors, model.hw, model.combines.get(spec.name, {}))
        compute = ex.evaluate(compute_cost(kt), env)
        transfer = ex.evaluate(transfer_cost(kt, built.workload, mem, slot), env)
        if env.get(buffers_decision(spec.name, "wram"), 1) == 1:
            expected += transfer
            continue
        checked += 1
        serial = 1
        for s in kt.spatial_between(model.hw.level_index(mem.shared_by),
                                    model.slots[slot].level_index):
            serial *= ex.evaluate(kt.units(s), env)
        first = 0
        for use in kt.moving():
            exchanged = exchanged_on_device(kt, use, slot)
            if exchanged is True or (exchanged is not False and ex.holds(exchanged, env)):
                continue  # swapped with an on-device combine buffer: never moves
            itemsize = built.workload.tensors[use.tensor].dtype.itemsize
            total = ex.evaluate(tensor_transfer_cost(kt, use, mem, slot, itemsize), env)
            count = ex.evaluate(transfer_count(kt, use, slot), env)
            assert total % count == 0
            first += total // count
        expected += max(transfer, compute) - compute + first * serial
    assert checked
    assert parts["transfer:mram->wram"] == expected


def test_buffers_print_and_count_in_the_ir() -> None:
    program = optimal_program(SOFTMAX)
    decl = next(n.buffer for k in program.kernels for n in walk(k.body)
                if isinstance(n, Alloc) and n.buffer.buffers == 2)
    single = dataclasses.replace(decl, buffers=1)
    mem = build(SOFTMAX).hw.memory(decl.memory)
    assert buffer_bytes(decl, mem) == 2 * buffer_bytes(single, mem)
    assert print_program(program).count(" x2") == len(buffered(program))


# ---------------------------------------------------------------- the UPMEM emitter

needs_cc = pytest.mark.skipif(shutil.which("cc") is None or shutil.which("make") is None,
                              reason="needs a C compiler and make")


def emit_va(out: Path, fixes: tuple[str, ...], drops: tuple[str, ...] = ()) -> None:
    request = pipeline.Request("va", UPMEM_PRIOR, {"N": 65536}, fixes=fixes, drops=drops,
                               validate=False)
    outcome = pipeline.run(request)
    assert outcome.program is not None, outcome.result.status
    inputs = make_inputs(outcome.workload, 0)
    emit_upmem(outcome.program, outcome.workload, outcome.hardware, out, inputs,
               evaluate(outcome.workload, inputs))


@needs_cc
def test_emitted_double_buffers_take_twice_the_wram(tmp_path: Path) -> None:
    """Double-buffered WRAM tiles are allocated twice (no prefetching yet), so the
    program runs and its WRAM footprint is the one solved for: 3 x 2 KiB x 4 tasklets
    x 2 fits; 3 x 4 KiB x 4 x 2 = 96 KiB does not, though it would single buffered."""
    emit_va(tmp_path / "fits", ("buffers.c.wram=2", "Q.c.i=512", "T.c.i=4"))
    assert "[4][1024];" in (tmp_path / "fits" / "dpu_c.c").read_text()
    result = check_upmem(tmp_path / "fits")
    assert result.passed, result.log[-4000:]
    emit_va(tmp_path / "over", ("buffers.c.wram=2", "Q.c.i=1024", "T.c.i=4"),
            drops=("capacity.wram",))
    result = check_upmem(tmp_path / "over")
    assert not result.passed
    assert "WRAM overflow" in result.log


@needs_cc
def test_emitted_double_buffers_prefetch(tmp_path: Path) -> None:
    """With steps at MRAM, each step loads the next step's tiles into the other half
    before computing (`if (m_i + 1 < 8)` blocks, tile 0 before the loop) and the program
    still computes the reference; single buffered, it loads in place."""
    emit_va(tmp_path / "x2", ("buffers.c.wram=2", "Q.c.i=512", "T.c.i=4", "M.c.i=8"))
    dpu = (tmp_path / "x2" / "dpu_c.c").read_text()
    assert dpu.count("if (m_i + 1 < 8) { /* prefetch:") == 2  # a and b; c is only stored
    assert dpu.index("the first tiles of m_i") < dpu.index("for (uint32_t m_i = 0; m_i < 8;")
    result = check_upmem(tmp_path / "x2")
    assert result.passed, result.log[-4000:]
    emit_va(tmp_path / "x1", ("buffers.c.wram=1", "Q.c.i=512", "T.c.i=4", "M.c.i=8"))
    assert "prefetch" not in (tmp_path / "x1" / "dpu_c.c").read_text()
