"""The `aie` model (npu1): streaming K derived by the solver, the matrix intrinsic as a
decision, and the hardware keys behind them (`streams`, `[compute.intrinsic]`)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import Case, build, optimal_program, optimum
from typer.testing import CliRunner

import synth
from synth.cli import app
from synth.errors import InputError
from synth.hwfile import load_hardware
from synth.ir.nodes import Alloc, Compute, Load, Loop, LoopKind, Node, Store, walk
from synth.ir.verify import verify
from synth.pipeline import validate

MATMUL = Case.of("matmul", "aie")  # seed 001: 1024 x 512 x 2048 i32, fill + GEMM


def _loops_around(nodes: tuple[Node, ...], match: object, outer: tuple[Loop, ...] = ()
                  ) -> tuple[Loop, ...] | None:
    for node in nodes:
        if node == match:
            return outer
        if isinstance(node, Loop):
            found = _loops_around(node.body, match, (*outer, node))
            if found is not None:
                return found
    return None


def test_the_optimum_streams_k_with_the_accumulator_resident_in_l1() -> None:
    """Seed 001's structure, found by the solver: the fill fused and run in L1, C never
    loaded, its L1 tile outside every loop over k, stored once; A and B copied inside
    the k loops of their own memory; the contraction packed to the intrinsic."""
    built, program = build(MATMUL), optimal_program(MATMUL)
    env = optimum(MATMUL).env or {}
    [kernel] = program.kernels
    assert kernel.name == "C#1_C#2" and env["pack.C#1_C#2"] == 1
    body = kernel.body
    allocs = {n.buffer.name: n for n in walk(body) if isinstance(n, Alloc)}
    c_tile = _loops_around(body, allocs["C_l1"])
    assert c_tile is not None and all(lp.var.dim != "k" for lp in c_tile)
    assert not any(isinstance(n, Load) and n.dst.startswith("C_") for n in walk(body))
    k_loops = [n for n in walk(body) if isinstance(n, Loop) and n.var.dim == "k"]
    assert k_loops and all(lp.var.kind is LoopKind.SEQUENTIAL for lp in k_loops)
    for name in ("A_l2", "B_l2", "A_l1", "B_l1"):
        around = _loops_around(body, allocs[name])
        assert around is not None and any(lp.var.dim == "k" for lp in around), name
    stores = [n for n in walk(body) if isinstance(n, Store) and n.src == "C_l1"]
    assert len(stores) == 1 and all(lp.var.dim != "k" for lp in
                                    _loops_around(body, stores[0]) or ())
    [mm] = [n for n in walk(body) if isinstance(n, Compute) and n.statement == "C#2"]
    assert all(t % b == 0 for t, b in zip(mm.tile, (4, 8, 8), strict=True))
    assert validate(program, built.workload).passed


def test_without_streams_a_columns_cores_do_not_combine_under_ddr(tmp_path: Path) -> None:
    """aie without `streams`: the memory just outside a column's cores is DDR, which
    holds whole tensors, not a tile their partials could fold into. mv there chose to
    combine its cores' partials on the device anyway (fuzz seed 67), and four cores wrote
    one partial tile (the verifier's exit 4). Now that is no decision; the optimum
    verifies and matches NumPy."""
    text = (Path(synth.__file__).parent / "hardware" / "aie.toml").read_text()
    path = tmp_path / "aie_without_streams.toml"
    path.write_text(re.sub(r"(?m)^streams = true.*\n", "", text))
    case = Case.of("mv", str(path), {"M": 64, "N": 4096})
    built = build(case)
    assert not built.model.hw.streams and not built.model.combines.get("y")
    program = optimal_program(case)
    verify(program, built.workload, built.model.hw)
    assert validate(program, built.workload).passed


def test_root_loops_run_inside_the_units_when_the_hardware_streams() -> None:
    program = optimal_program(MATMUL)
    first = program.kernels[0].body[0]
    assert isinstance(first, Loop) and first.var.kind is LoopKind.PARALLEL


def test_packing_is_a_decision_with_its_granularity() -> None:
    runner = CliRunner()
    args = ["solve", "matmul", "--hw", "aie", "--set", "M=64", "--set", "N=64", "--set",
            "K=256", "--fix", "fuse.C#1_C#2=1", "--no-validate"]
    packed_bad = runner.invoke(app, [*args, "--fix", "pack.C#1_C#2=1",
                                     "--fix", "Q.C#1_C#2.m=2"])
    assert packed_bad.exit_code == 1 and "intrinsic" in packed_bad.output
    plain = runner.invoke(app, [*args, "--fix", "pack.C#1_C#2=0", "--fix", "Q.C#1_C#2.m=2"])
    assert plain.exit_code == 0, plain.output


def test_the_hardware_keys_are_checked(tmp_path: pytest.TempPathFactory) -> None:
    source = load_hardware("aie").source
    text = open(source).read()  # noqa: SIM115
    bad_shape = tmp_path / "bad.toml"  # type: ignore[operator]
    bad_shape.write_text(text.replace('shape = "4x8x8", cycles = 8', 'shape = "4x8", cycles = 8'))
    with pytest.raises(InputError, match="MxNxK"):
        load_hardware(str(bad_shape))
    cpu = open(load_hardware("cpu").source).read()  # noqa: SIM115
    streaming_cpu = tmp_path / "cpu.toml"  # type: ignore[operator]
    streaming_cpu.write_text(cpu.replace('name = "cpu"', 'name = "cpu"\nstreams = true'))
    with pytest.raises(InputError, match="below the root level"):
        load_hardware(str(streaming_cpu))
