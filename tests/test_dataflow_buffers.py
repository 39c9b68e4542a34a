"""Dataflow buffers on a tiled core (issue 14, item 3): the cost model counts every buffer
the emitted tt-lang declares (`synth.ir.dataflow`: a block per tensor and the second
ones, X_in, X_out, X_acc), in `count.buffers` and in `capacity.l1`, in whole tiles x tile
bytes x block count; `synth.ir.verify` counts L1 the same way. The emitter's text is
parsed as the check parses it (`ttlang_check.declared_buffers`), not trusted."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import SPLIT_K, f32_matmul, f32_twin

from synth import pipeline
from synth.constraints.dst import MAX_BUFFERS, model_dataflow
from synth.constraints.result import Status
from synth.constraints.sample import random_schedule
from synth.emit.ttlang import op_name, program_source
from synth.emit.ttlang_check import declared_buffers
from synth.errors import IRError
from synth.hwfile import load_hardware
from synth.ir.dataflow import block_bytes, kernel_buffers, kernel_decls, kernel_usage
from synth.ir.materialize import materialize
from synth.ir.verify import verify
from synth.tiles import lines_of_tiles

# every built-in at reduced sizes that still leave several blocks (the simulated set of
# tests/test_emit_ttlang.py); the integer ones as their f32 twins for the emitter
BUILTINS = [
    ("fa6", {"S": 64, "D": 64}), ("attention", {"S": 64, "D": 32}), ("softmax", {"N": 4096}),
    ("mha", {"B": 2, "H": 2, "S": 64, "E": 32}), ("rmsnorm", {"S": 64, "D": 64}),
    ("layernorm", {"S": 64, "D": 64}), ("swiglu", {"S": 64, "D": 64, "F": 64}),
    ("transformer", {"S": 64, "D": 64, "H": 2, "E": 32, "F": 64}),
    ("va", {"N": 4096}), ("red", {"N": 4096}), ("mv", {"M": 64, "N": 128}),
    ("matmul", {"M": 64, "N": 64, "K": 128}), ("gemm2k", {"M": 64, "N": 64, "K": 64}),
]
INTEGER = ("va", "red", "mv", "matmul", "gemm2k")
def _workload(name: str, tmp_path: Path) -> str:
    return str(f32_twin(name, tmp_path)) if name in INTEGER else name


def _solve(workload: str, sizes: dict[str, int], fixes: tuple[str, ...] = (),
           hw_set: tuple[str, ...] = ()) -> pipeline.Outcome:
    return pipeline.run(pipeline.Request(workload, "wormhole", sizes, hw_overrides=hw_set,
                                         fixes=fixes, validate=False))


def _declared(outcome: pipeline.Outcome, env: dict[str, int] | None = None
              ) -> dict[str, list[int]]:
    """What the emitter writes for the schedule `env` (default: the optimum), parsed."""
    program = materialize(outcome.model, env or dict(outcome.result.env or {}))
    tile_bytes = {t.name: 32 * 32 * t.dtype.itemsize for t in outcome.workload.tensors.values()}
    return declared_buffers(program_source(program, outcome.workload), tile_bytes)


def _modelled(outcome: pipeline.Outcome, env: dict[str, int] | None = None
              ) -> dict[str, list[int]]:
    found = model_dataflow(outcome.model, env or dict(outcome.result.env or {}))
    return {op_name(kernel): list(numbers) for kernel, numbers in found.items()}


@pytest.mark.parametrize(("workload", "sizes"), BUILTINS)
def test_the_emitted_buffers_are_the_models(workload: str, sizes: dict[str, int],
                                            tmp_path: Path) -> None:
    """Per kernel, the buffers program.py declares and their bytes equal the cost
    model's count.buffers and capacity terms at the optimum (and the loop nest's)."""
    outcome = _solve(_workload(workload, tmp_path), sizes)
    assert outcome.program is not None
    declared = _declared(outcome)
    assert declared == _modelled(outcome)
    assert declared == {op_name(k.name): list(kernel_usage(k, outcome.workload, 32))
                        for k in outcome.program.kernels}
    assert all(count >= 1 and size >= 2048 for count, size in declared.values())


@pytest.mark.parametrize(("workload", "sizes"), [
    ("matmul", {"M": 64, "N": 64, "K": 128}), ("attention", {"S": 64, "D": 32}),
    ("layernorm", {"S": 64, "D": 64})])
def test_sampled_schedules_declare_the_models_buffers(workload: str, sizes: dict[str, int],
                                                      tmp_path: Path) -> None:
    """Not only at the optimum: legal schedules drawn at random (some with accumulators
    across a loop, some with a kernel that only zeroes its target) agree too."""
    outcome = _solve(_workload(workload, tmp_path), sizes)
    extra = 0
    for seed in range(3):
        env = random_schedule(outcome.model.constraints, seed)
        assert env is not None
        declared = _declared(outcome, env)
        assert declared == _modelled(outcome, env), seed
        program = materialize(outcome.model, env)
        extra += sum(len(kernel_buffers(k, outcome.workload)) - len(kernel_decls(k))
                     for k in program.kernels)
    assert extra > 0  # the schedules drawn have second buffers: the test sees them


def test_an_accumulator_counts_in_l1_so_a_smaller_l1_changes_the_schedule(
        tmp_path: Path) -> None:
    """Split-k matmul: C accumulates over four blocks of k in C_l1_acc (two blocks) and
    leaves in C_l1. With L1 one byte short of what that schedule holds (its blocks without
    the accumulator would still fit), forcing it is infeasible and explained by
    capacity.l1; free, the solver picks another schedule that fits."""
    outcome = _solve(str(f32_matmul(tmp_path)), {}, SPLIT_K)
    assert outcome.program is not None
    [kernel] = outcome.program.kernels
    roles = {d.role: d.blocks for d in kernel_buffers(kernel, outcome.workload)}
    assert roles.get("acc") == 2
    [(count, needed)] = model_dataflow(outcome.model, outcome.result.env or {}).values()
    decls = kernel_decls(kernel)
    without = sum(d.buffers * block_bytes(kernel, d, 32, ()) for d in decls.values())
    assert needed - without == 2 * block_bytes(kernel, decls["C_l1"], 32, ()) > 0
    assert count == len(decls) + 1
    short = (f"l1.capacity={needed - 1}",)
    forced = _solve(str(f32_matmul(tmp_path)), {}, SPLIT_K, short)
    assert forced.result.status is Status.INFEASIBLE
    assert forced.explanation is not None
    assert "capacity.l1" in {c.group for c in forced.explanation}
    free = _solve(str(f32_matmul(tmp_path)), {}, (), short)  # any other way holds more tiles
    assert free.result.status is Status.INFEASIBLE and free.explanation is not None
    assert "capacity.l1" in {c.group for c in free.explanation}


def test_a_smaller_l1_makes_the_solver_choose_a_schedule_whose_buffers_fit() -> None:
    """attention's optimum holds the most L1 in kernel p_l (p forwarded: p and p_out; l
    loaded and summed into: l and l_in). One byte less and the solver picks another
    schedule whose emitted buffers, counted from the loop nest, fit: were the second
    buffers not in the model, it would keep the old one, 36864 bytes in 36863."""
    sizes = {"S": 64, "D": 32}
    best = _solve("attention", sizes)
    used = model_dataflow(best.model, best.result.env or {})
    kernel, (_, top) = max(used.items(), key=lambda item: item[1][1])
    assert best.program is not None
    [nest] = [k for k in best.program.kernels if k.name == kernel]
    assert {d.role for d in kernel_buffers(nest, best.workload)} >= {"in", "out"}
    short = (f"l1.capacity={top - 1}",)
    other = _solve("attention", sizes, (), short)
    assert other.result.status is Status.OPTIMAL and other.program is not None
    assert other.result.env != best.result.env
    for k in other.program.kernels:
        assert kernel_usage(k, other.workload, 32)[1] <= top - 1, k.name
    verify(other.program, other.workload, load_hardware("wormhole", list(short)))
    with pytest.raises(IRError, match="expected tiles in one l1"):
        verify(best.program, best.workload, load_hardware("wormhole", list(short)))


def test_a_forwarded_result_counts_against_the_32_buffers(tmp_path: Path) -> None:
    """y is stored and read by z's statement: fused, the kernel holds y and y_out. 30
    inputs, y and z are 32 buffers; y_out makes 33, so forcing the fusion is infeasible
    and explained by count.buffers (32 would fit if y_out were not counted)."""
    inputs = MAX_BUFFERS - 2
    decls = "".join(f"in a{n} : f32[N]\n" for n in range(inputs))
    expr = " + ".join(f"a{n}[i]" for n in range(inputs))
    path = tmp_path / "wide.syn"
    path.write_text(f"size N = 4096\n{decls}out y : f32[N]\nout z : f32[N]\n"
                    f"y[i] = {expr}\nz[i] = y[i] * 2.0\n")
    forced = _solve(str(path), {}, ("fuse.y_z=1",))
    assert forced.result.status is Status.INFEASIBLE
    assert forced.explanation is not None
    conflict = {c.group: c for c in forced.explanation}
    assert "count.buffers" in conflict
    assert any("32 dataflow buffers (one per tensor) + y_out" in m
               for m in conflict["count.buffers"].info.meanings)
    free = _solve(str(path), {})
    assert free.result.status is Status.OPTIMAL and free.program is not None
    assert [k.name for k in free.program.kernels] == ["y", "z"]


def test_verify_counts_l1_in_whole_tiles_and_every_dataflow_buffer(tmp_path: Path) -> None:
    """verify rejects the split-k matmul's nest on an L1 one byte short of its dataflow
    buffers (whole tiles, block counts and the accumulator: the model's number) and
    passes at that size; a row statistic m[i] is a column of whole tiles (a 4 KiB f32
    tile per 32 rows), not its elements' bytes."""
    outcome = _solve(str(f32_matmul(tmp_path)), {}, SPLIT_K)
    assert outcome.program is not None
    [(_, needed)] = model_dataflow(outcome.model, outcome.result.env or {}).values()
    verify(outcome.program, outcome.workload,
           load_hardware("wormhole", [f"l1.capacity={needed}"]))
    with pytest.raises(IRError, match=f"fit {needed - 1} bytes, got {needed}"):
        verify(outcome.program, outcome.workload,
               load_hardware("wormhole", [f"l1.capacity={needed - 1}"]))
    attention = _solve("attention", {"S": 64, "D": 32})
    assert attention.program is not None
    columns = [(kernel, decl) for kernel in attention.program.kernels
               for decl in kernel_decls(kernel).values() if decl.dims == ("i",)]
    assert columns  # the row max and sum
    lines = lines_of_tiles(attention.workload)
    for kernel, decl in columns:
        assert block_bytes(kernel, decl, 32, lines) == decl.shape[0] // 32 * 32 * 32 * 4
