"""The MLIR emitter and its checker (upstream MLIR, through the torch-mlir bindings).

Behaviour first: every built-in workload on every hardware model (found at run time) is
emitted at a small size, schedule.mlir verifies, transform.mlir applies to source.mlir,
and both run and match the NumPy reference. A wrong schedule, wrong data, a script
upstream refuses and a crash inside MLIR are failed checks, never passes. The emitted
text of two small hand-built loop nests is compared with golden files
(`SYNTH_UPDATE_GOLDEN=1` rewrites them), and the CLI reports the check in its JSON and
exits 4 when it fails.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import SMALL_UPMEM, TWO_CORES
from hypothesis import HealthCheck, given, settings
from strategies import GeneratedWorkload, workloads
from typer.testing import CliRunner

import synth.emit.mlir
from synth import pipeline
from synth.cli import app
from synth.constraints.sample import random_schedule
from synth.emit import mlir_check
from synth.emit.cstyle import EmitError
from synth.emit.mlir import affine_expr, emit_mlir, float_literal, schedule_text, source_text
from synth.emit.mlir_check import MlirCheck, check_mlir
from synth.hardware import Hardware
from synth.hwfile import list_builtin_hardware, load_hardware
from synth.ir.interpret import interpret
from synth.ir.materialize import materialize
from synth.ir.nodes import (
    Affine,
    Alloc,
    BufferDecl,
    Combine,
    Compute,
    Fill,
    Kernel,
    Load,
    Loop,
    LoopKind,
    LoopVar,
    Program,
    Store,
)
from synth.lang import list_builtin_workloads, load_workload, parse_workload
from synth.reference import compare, evaluate, evaluate_errors, make_inputs
from synth.workload import DType, ReduceOp, Workload

SIZES = {  # small and ragged where it is cheap: each solves in about a second
    "attention": {"S": 8, "D": 4},
    "fa6": {"S": 16, "D": 8},
    "gemm2k": {"M": 16, "N": 16, "K": 16},
    "matmul": {"M": 16, "N": 8, "K": 16},
    "mv": {"M": 32, "N": 48},
    "red": {"N": 1000},
    "softmax": {"N": 999},
    "va": {"N": 1000},
    "rmsnorm": {"S": 6, "D": 10},
    "layernorm": {"S": 6, "D": 10},
    "swiglu": {"S": 4, "D": 6, "F": 10},
    "mha": {"B": 2, "H": 2, "S": 6, "E": 4},
    "transformer": {"S": 4, "D": 8, "H": 2, "E": 4, "F": 8},
}
GOLDEN = Path(__file__).parent / "golden" / "mlir"


def emitted(program: Program, workload: Workload, hw: Hardware, out: Path) -> Path:
    inputs = make_inputs(workload, 0)
    return emit_mlir(program, workload, hw, out, inputs, evaluate(workload, inputs)).out_dir


def assert_passes(check: MlirCheck) -> None:
    assert check.passed, check.log[-4000:]
    assert check.verified and check.transform_applied and check.executed
    assert check.max_abs_err is not None


# ---------------------------------------------------------------- hand-built loop nests


def tile(tensor: str, memory: str, shape: tuple[int, ...], origin: tuple[Affine, ...],
         dims: tuple[str, ...] = ("i",), **extra: Any) -> BufferDecl:
    return BufferDecl(f"{tensor}_{memory}", tensor, memory, dims, shape, origin, DType.I32,
                      **extra)


def whole(tensor: str, shape: tuple[int, ...]) -> BufferDecl:
    return BufferDecl(tensor, tensor, "dram", ("i",) * len(shape), shape,
                      tuple(Affine() for _ in shape), DType.I32)


def va_program() -> tuple[Program, Workload, Hardware]:
    """c = a + b at N = 10: two cores of 6 (the second ragged), l1 tiles of 3 in l2
    (the last one ragged), l1 double buffered."""
    workload = load_workload("va", {"N": 10})
    core = LoopVar("p_i", "i", "P.c.i", 2, 6, LoopKind.PARALLEL, "core")
    step = LoopVar("l_i", "i", "L.c.i", 2, 3, LoopKind.SEQUENTIAL, "l2")
    at_core = Affine((("p_i", 6),))
    at_step = Affine((("p_i", 6), ("l_i", 3)))
    l2 = {t: tile(t, "l2", (6,), (at_core,)) for t in "abc"}
    l1 = {t: tile(t, "l1", (3,), (at_step,), buffers=2) for t in "abc"}
    inner = (Alloc(l1["a"]), Load("a_l1", "a_l2"), Alloc(l1["b"]), Load("b_l1", "b_l2"),
             Alloc(l1["c"]),
             Compute("c", "c_l1", {"a": "a_l1", "b": "b_l1"}, ("i",), (at_step,), (3,)),
             Store("c_l1", "c_l2"))
    body = (Alloc(l2["a"]), Load("a_l2", "a"), Alloc(l2["b"]), Load("b_l2", "b"),
            Alloc(l2["c"]), Loop(step, inner), Store("c_l2", "c"))
    program = Program("va", "cpu", "dram", tuple(whole(t, (10,)) for t in "abc"),
                      (Kernel("c", ("c",), (Loop(core, body),)),), {"P": 2}, {"c": {"i": 10}})
    return program, workload, load_hardware("cpu", TWO_CORES)


def red_program() -> tuple[Program, Workload, Hardware]:
    """s = sum(x) at N = 10 over two cores: partial sums, combined on the host."""
    workload = load_workload("red", {"N": 10})
    core = LoopVar("p_i", "i", "P.s.i", 2, 5, LoopKind.PARALLEL, "core")
    at_core = Affine((("p_i", 5),))
    partials = BufferDecl("s_partials", "s", "dram", (), (), (), DType.I32, ("p_i",))
    body = (Alloc(tile("x", "l1", (5,), (at_core,))), Load("x_l1", "x"),
            Alloc(tile("s", "l1", (), (), ())), Load("s_l1", "s_partials"),
            Compute("s", "s_l1", {"x": "x_l1"}, ("i",), (at_core,), (5,)),
            Store("s_l1", "s_partials"))
    kernel = (Fill("s", 0), Alloc(partials), Fill("s_partials", 0), Loop(core, body),
              Combine("s", "s_partials", ReduceOp.ADD))
    program = Program("red", "cpu", "dram",
                      (whole("x", (10,)), BufferDecl("s", "s", "dram", (), (), (), DType.I32)),
                      (Kernel("s", ("s",), kernel),), {"P": 2}, {"s": {"i": 10}})
    return program, workload, load_hardware("cpu", TWO_CORES)


@pytest.mark.parametrize("build", [va_program, red_program])
def test_hand_built_nests_are_right(build: Any) -> None:
    """The golden nests compute the workload (by synth's own interpreter)."""
    program, workload, _ = build()
    inputs = make_inputs(workload, 0)
    (expected, sigmas), actual = (evaluate_errors(workload, inputs),
                                  interpret(program, workload, inputs))
    for tensor in workload.outputs:
        assert compare(expected[tensor.name], actual[tensor.name], tensor.dtype,
                       sigmas.get(tensor.name)).passed


@pytest.mark.parametrize("build", [va_program, red_program])
def test_emitted_text_matches_golden(build: Any, tmp_path: Path) -> None:
    program, workload, hw = build()
    out = emitted(program, workload, hw, tmp_path)
    golden = GOLDEN / workload.name
    for name in synth.emit.mlir.FILES:
        text = (out / name).read_text()
        if os.environ.get("SYNTH_UPDATE_GOLDEN"):
            golden.mkdir(parents=True, exist_ok=True)
            (golden / name).write_text(text)
        assert text == (golden / name).read_text(), f"{name} differs from {golden / name}"


@pytest.mark.parametrize("build", [va_program, red_program])
def test_hand_built_nests_pass_the_check(build: Any, tmp_path: Path) -> None:
    program, workload, hw = build()
    assert_passes(check_mlir(emitted(program, workload, hw, tmp_path)))


def test_schedule_reads_like_the_nest() -> None:
    """Parallel loops are foralls tagged with their level, memories are spaces in the
    model's order, ragged tiles are affine.min views, partials combine by reduction."""
    text = schedule_text(*va_program())
    assert 'scf.forall (%p_i) in (2) {' in text
    assert '} {synth.level = "core", synth.symbol = "P.c.i"}' in text
    assert "scf.for %l_i = %c0 to %c2 step %c1 {" in text
    assert "%c_l1 = memref.alloc() : memref<3xi32, 3>" in text  # dram l3 l2 l1: 0 1 2 3
    assert "affine.min affine_map<(p_i, l_i) -> (3, -p_i * 6 - l_i * 3 + 10)>" in text
    assert "double buffered" in text
    red = schedule_text(*red_program())
    assert "%s_partials = memref.alloc() : memref<2xi32>" in red
    assert "memref.subview %s_partials[%p_i] [1] [1] : memref<2xi32> to memref<i32, " in red
    assert 'iterator_types = ["reduction"]}\n' in red and "ins(%s_partials : memref<2xi32>)" in red


# ---------------------------------------------------------------- every built-in


def test_every_builtin_has_a_small_size() -> None:
    assert set(SIZES) == set(list_builtin_workloads())


@pytest.mark.parametrize("hardware", list_builtin_hardware())
@pytest.mark.parametrize("workload", list_builtin_workloads())
def test_builtin_verifies_transforms_and_runs(workload: str, hardware: str,
                                              tmp_path: Path) -> None:
    # solved for --emit mlir: the space keeps every online pass in one unit (the MLIR
    # emitter writes no merge of partial running statistics)
    outcome = pipeline.run(pipeline.Request(workload, hardware, SIZES.get(workload, {}),
                                            validate=False, time_limit_s=30.0, emit="mlir",
                                            out_dir=str(tmp_path / "solved")))
    if outcome.program is None:
        pytest.skip(f"no schedule of {workload} on {hardware} at {SIZES.get(workload)}: "
                    f"{outcome.result.status.value}")
    out = emitted(outcome.program, outcome.workload, outcome.hardware, tmp_path)
    assert_passes(check_mlir(out))


def test_arithmetic_follows_the_reference(tmp_path: Path) -> None:
    """C's integer division (0 for a zero divisor, -x for -1), promotions of i8/i16/f16,
    floats stored into integers, and every function the language has."""
    text = """
        size N = 37
        in  a : i32[N]
        in  b : i32[N]
        in  x : f32[N]
        in  g : f16[N]
        in  c : i8[N]
        out q : i32[N]
        out f : f32[N]
        out h : i16[N]
        out k : f16[N]
        out z : i32[N]
        q[i] = a[i] / (b[i] - 2) + abs(a[i] - 3) - relu(b[i] - 2) + max(a[i], b[i]) + -a[i]
        f[i] = tanh(x[i]) + rsqrt(2.0 + abs(x[i])) + recip(2.0 + x[i]) + log(1.0 + abs(x[i])) + min(x[i], 0.5) + exp(x[i]) + sqrt(abs(x[i])) - -x[i]
        h[i] = a[i] * 20000 + c[i] * c[i]
        k[i] = g[i] * 2.0 + x[i]
        z[i] = a[i] * 7 + exp(a[i])
    """  # noqa: E501
    workload = parse_workload(text, "arith.syn", "arith")
    hw = load_hardware("cpu", TWO_CORES)
    model = pipeline.encode(workload, hw)
    result = pipeline.solve(model, "cpsat", 30.0)
    assert result.env is not None
    program = materialize(model, result.env)
    assert_passes(check_mlir(emitted(program, workload, hw, tmp_path)))


def test_statements_that_share_an_input_tile_separately(tmp_path: Path) -> None:
    """a and b both read e inside one loop: upstream fuses producers into a consumer's
    loop, so each consumer gets its own (the same values)."""
    workload = parse_workload("size N = 256\nin x : f32[N]\nout a : f32[N]\n"
                              "out b : f32[N]\ne[i] = exp(x[i])\na[i] = e[i] * 2.0\n"
                              "b[i] = e[i] + 1.0\n", "sib.syn", "sib")
    hw = load_hardware("cpu", TWO_CORES)
    model = pipeline.encode(workload, hw)
    result = pipeline.solve(model, "cpsat", 30.0)
    assert result.env is not None
    program = materialize(model, result.env)
    assert [k.statements for k in program.kernels] == [("e", "a", "b")]
    out = emitted(program, workload, hw, tmp_path)
    script = (out / "transform.mlir").read_text()
    assert "tile b, fuse e" in script and "tile a\n" in script
    assert_passes(check_mlir(out))


def examples(count: int) -> settings:
    return settings(max_examples=count, derandomize=True, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow,
                                           HealthCheck.function_scoped_fixture])


@pytest.mark.parametrize("hardware, overrides", [("cpu", TWO_CORES), ("upmem", SMALL_UPMEM)])
@examples(2)
@given(generated=workloads())
def test_random_workloads_pass(hardware: str, overrides: tuple[str, ...], tmp_path: Path,
                               generated: GeneratedWorkload) -> None:
    """The optimum and a random feasible schedule (odd tiles, steps at every memory)."""
    workload = parse_workload(generated.text, "generated.syn", "generated")
    hw = load_hardware(hardware, overrides)
    model = pipeline.encode(workload, hw)
    optimum = pipeline.solve(model, "cpsat", 30.0).env
    for tag, env in (("optimum", optimum), ("random", random_schedule(model.constraints, 1))):
        assert env is not None
        out = tmp_path / f"{len(list(tmp_path.iterdir()))}_{tag}"
        check = check_mlir(emitted(materialize(model, env), workload, hw, out))
        assert check.passed, f"{tag}:\n{generated.text}\n{check.log[-3000:]}"


def test_bf16_is_refused() -> None:
    workload = parse_workload("size N = 8\nin x : bf16[N]\nout y : bf16[N]\ny[i] = x[i]\n",
                              "b.syn", "b")
    with pytest.raises(EmitError, match="cannot emit bf16 tensors"):
        source_text(workload)


# ---------------------------------------------------------------- failures are failures


@pytest.fixture()
def va_dir(tmp_path: Path) -> Path:
    return emitted(*va_program(), tmp_path / "va")


def test_a_wrong_schedule_fails(va_dir: Path) -> None:
    path = va_dir / "schedule.mlir"
    path.write_text(path.read_text().replace("arith.addi", "arith.subi"))
    check = check_mlir(va_dir)
    assert check.verified and check.executed and not check.passed
    assert "schedule.mlir: c DIFFERS from the reference" in check.log
    assert "source.mlir after transform.mlir: c matches the reference" in check.log


def test_a_schedule_that_does_not_verify_fails_with_mlir_diagnostic(va_dir: Path) -> None:
    path = va_dir / "schedule.mlir"
    text = path.read_text()
    assert "memref.dealloc %c_l1 : memref<3xi32, 3>" in text
    path.write_text(text.replace("memref.dealloc %c_l1 : memref<3xi32, 3>",
                                 "memref.dealloc %c_l1 : memref<4xi32, 3>"))
    check = check_mlir(va_dir)
    assert not check.verified and not check.executed and not check.passed
    assert "schedule.mlir does not verify" in check.log and "error:" in check.log


def test_wrong_reference_data_fails(va_dir: Path) -> None:
    expected = va_dir / "check" / "expected_c.npy"
    np.save(expected, np.load(expected) + 1)
    check = check_mlir(va_dir)
    assert check.executed and not check.passed and check.max_abs_err == 1.0


def test_a_script_upstream_refuses_fails(va_dir: Path) -> None:
    path = va_dir / "transform.mlir"
    text = path.read_text()
    assert "tile_using_for %c_tiled tile_sizes [3]" in text
    path.write_text(text.replace("tile_using_for %c_tiled tile_sizes [3]",
                                 "tile_using_for %c tile_sizes [3]"))  # a consumed handle
    check = check_mlir(va_dir)
    assert check.verified and not check.transform_applied and not check.passed
    assert "transform.mlir does not apply to source.mlir" in check.log
    assert "invalidated" in check.log  # the interpreter's own diagnostic


def test_a_crash_inside_mlir_is_a_failed_check(va_dir: Path) -> None:
    """Upstream's fuse_into_containing_op aborts the process when it fuses into an
    scf.for a producer that is also used after the loop (the emitter never asks for
    that); the check runs in a child process, so the crash is reported, not suffered."""
    (va_dir / "source.mlir").write_text("""
      func.func @va(%a: tensor<10xi32>, %b: tensor<10xi32>) -> (tensor<10xi32>, tensor<i32>) {
        %e = tensor.empty() : tensor<10xi32>
        %c = linalg.generic {indexing_maps = [affine_map<(i) -> (i)>, affine_map<(i) -> (i)>],
            iterator_types = ["parallel"], synth.statement = "c"} ins(%a : tensor<10xi32>)
            outs(%e : tensor<10xi32>) {
        ^bb0(%x: i32, %y: i32):
          linalg.yield %x : i32
        } -> tensor<10xi32>
        %z = arith.constant 0 : i32
        %s0 = tensor.empty() : tensor<i32>
        %s1 = linalg.fill ins(%z : i32) outs(%s0 : tensor<i32>) -> tensor<i32>
        %s = linalg.generic {indexing_maps = [affine_map<(i) -> (i)>, affine_map<(i) -> ()>],
            iterator_types = ["reduction"], synth.statement = "s"} ins(%c : tensor<10xi32>)
            outs(%s1 : tensor<i32>) {
        ^bb0(%x: i32, %y: i32):
          %v = arith.addi %x, %y : i32
          linalg.yield %v : i32
        } -> tensor<i32>
        return %c, %s : tensor<10xi32>, tensor<i32>
      }""")
    (va_dir / "transform.mlir").write_text("""
      module attributes {transform.with_named_sequence} {
        transform.named_sequence @__transform_main(%root: !transform.any_op {transform.readonly}) {
          %c = transform.structured.match attributes {synth.statement = "c"} in %root : (!transform.any_op) -> !transform.any_op
          %s = transform.structured.match attributes {synth.statement = "s"} in %root : (!transform.any_op) -> !transform.any_op
          %t, %loop = transform.structured.tile_using_for %s tile_sizes [5] : (!transform.any_op) -> (!transform.any_op, !transform.any_op)
          %f, %l = transform.structured.fuse_into_containing_op %c into %loop : (!transform.any_op, !transform.any_op) -> (!transform.any_op, !transform.any_op)
          transform.yield
        }
      }""")  # noqa: E501
    check = check_mlir(va_dir)
    assert check.verified and not check.transform_applied and not check.passed
    assert "the MLIR check crashed" in check.log


# ---------------------------------------------------------------- pieces


@pytest.mark.parametrize("value, element, text", [
    (0.5, "f32", "0.5"), (1e-05, "f32", "1.0e-05"), (3.0, "f64", "3.0"),
    (float("-inf"), "f32", "0xFF800000"), (float("inf"), "f16", "0x7C00"),
    (float("nan"), "f64", "0x7FF8000000000000"),
])
def test_float_literals_parse_exactly(value: float, element: str, text: str) -> None:
    assert float_literal(value, element) == text


def test_affine_expressions() -> None:
    assert affine_expr(Affine((("r_i", 512), ("t_i", 1)), 3)) == "r_i * 512 + t_i + 3"
    assert affine_expr(Affine((("p_i", -6),), 10)) == "-p_i * 6 + 10"
    assert affine_expr(Affine((), -2)) == "-2"


# ---------------------------------------------------------------- the command line


def invoke(*args: str) -> Any:
    return CliRunner().invoke(app, list(args))


VA = ["solve", "va", "--hw", "cpu", "--set", "N=1000", "--hw-set", "core.count=1..2"]


def test_cli_reports_the_check_in_json(tmp_path: Path) -> None:
    result = invoke(*VA, "--emit", "mlir", "--out", str(tmp_path), "--json")
    assert result.exit_code == 0, result.output
    emitted_json = json.loads(result.stdout)["emitted"]["mlir"]
    assert set(emitted_json) == {"path", "files", "checked", "verified", "transform_applied",
                                 "executed", "passed", "max_abs_err", "seconds", "log"}
    assert emitted_json["path"] == str(tmp_path)
    assert {"schedule.mlir", "source.mlir", "transform.mlir"} <= set(emitted_json["files"])
    assert all(emitted_json[k] is True for k in ("checked", "verified", "transform_applied",
                                                 "executed", "passed"))
    assert emitted_json["max_abs_err"] == 0.0


def test_cli_without_validation_writes_but_does_not_check(tmp_path: Path) -> None:
    result = invoke(*VA, "--emit", "mlir", "--out", str(tmp_path), "--no-validate")
    assert result.exit_code == 0, result.output
    assert "emitted MLIR to" in result.output and "not checked: --no-validate" in result.output
    assert (tmp_path / "transform.mlir").exists()


def test_cli_exits_4_with_mlir_diagnostic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                          ) -> None:
    real = synth.emit.mlir.schedule_text
    monkeypatch.setattr(synth.emit.mlir, "schedule_text", lambda *args: real(*args).replace(
        "linalg.copy ins(", "linalg.copy ins(%nowhere, ", 1))
    result = invoke(*VA, "--emit", "mlir", "--out", str(tmp_path))
    assert result.exit_code == 4, result.output
    assert "FAILED: schedule.mlir does NOT verify" in result.output
    assert "error:" in result.output  # MLIR's own diagnostic
    data = json.loads(invoke(*VA, "--emit", "mlir", "--out", str(tmp_path), "--json").stdout)
    assert data["emitted"]["mlir"]["verified"] is False


def test_cli_without_torch_mlir_exits_2_before_solving(monkeypatch: pytest.MonkeyPatch,
                                                       tmp_path: Path) -> None:
    monkeypatch.setattr(mlir_check.importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(pipeline, "solve", lambda *args: pytest.fail("solved"))
    result = invoke(*VA, "--emit", "mlir", "--out", str(tmp_path))
    assert result.exit_code == 2
    assert "pip install 'synth[mlir]'" in result.output
