"""The `wormhole` model: 32x32 tiles, the DST register file (`capacity.dst`, subblock
decisions), the dataflow-buffer count, and the hardware keys behind them."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
from conftest import Case, build, optimal_program, optimum, solve
from typer.testing import CliRunner

from synth.cli import app
from synth.constraints import expr as ex
from synth.constraints.cost import KernelTerms, tensor_transfer_cost, transfer_count
from synth.constraints.dst import (
    MAX_BUFFERS,
    live_tiles,
    model_dram_tiles,
    op_kind,
    tiled_units,
)
from synth.constraints.result import Status
from synth.constraints.tiled import tile_scale
from synth.errors import InputError
from synth.hwfile import load_hardware
from synth.ir.nodes import Compute, walk
from synth.lang import parse_workload
from synth.pipeline import encode
from synth.tiles import batch_dims, block_tiles, lines_of_tiles, tile_units

FA6 = Case.of("fa6", "wormhole", {"S": 128, "D": 64})
FUSED = "kt_s_u_p_r_O"


def test_the_model_cites_the_facts() -> None:
    hw = load_hardware("wormhole")
    assert [(lv.symbol, lv.count_min, lv.count_max) for lv in hw.levels[1:]] == [
        ("Y", 1, 8), ("X", 1, 8)]
    assert hw.memory("l1").usable == 1432 * 1024
    tiling = hw.compute.tiling
    assert (tiling.edge, tiling.sync, tiling.dst["bf16"], tiling.dst["f32"]) == (32, "half", 8, 4)
    assert hw.compute.intrinsics["bf16"].cycles == 32  # HiFi2
    full = load_hardware("wormhole", ["compute.dst.sync=full"]).compute.tiling
    assert (full.dst["bf16"], full.dst["f32"]) == (16, 8)
    blackhole = load_hardware("blackhole")  # data only: Wormhole's core, a larger grid
    assert [lv.count_max for lv in blackhole.levels[1:]] == [10, 13]
    assert blackhole.compute.tiling == tiling and blackhole.compute.clock_hz == 1_350_000_000


@pytest.mark.parametrize(("text", "fragment"), [
    ("tile = 48", "expected a power of two"),
    ("tile = 32\n[compute.dst]\nsync = \"quarter\"\nhalf = { f32 = 4 }", "expected one of"),
    ("tile = 32\n[compute.dst]\nhalf = { f33 = 4 }", "unknown dtype 'f33'"),
    ("tile = 32\n[compute.dst]\nhalf = { f32 = 0 }", "expected a count of tiles"),
    ("[compute.dst]\nhalf = { f32 = 4 }", "needs tiled data"),
])
def test_bad_tile_and_dst_tables_are_exit_2(tmp_path: Path, text: str, fragment: str) -> None:
    source = (Path(__file__).parent.parent / "synth/hardware/wormhole.toml").read_text()
    lines = [ln for ln in source.splitlines() if not ln.startswith(
        ("tile =", "[compute.dst]", "sync =", "half =", "full ="))]
    path = tmp_path / "bad.toml"
    path.write_text("\n".join(lines).replace("[compute.cycles]", text + "\n[compute.cycles]"))
    with pytest.raises(InputError, match=fragment):
        load_hardware(str(path))
    result = CliRunner().invoke(app, ["solve", "va", "--hw", str(path), "--set", "N=1024"])
    assert result.exit_code == 2, result.output


def test_liveness_of_seed_004s_chain() -> None:
    """transpose and matmul read buffers; the subtract finds s in DST, so runs on the
    SFPU with Bias loaded beside it (2 tiles); exp, sqrt, recip work in place."""
    built = build(FA6)
    kernel = next(k for k in built.model.kernels if k.name == FUSED)
    assert [op_kind(s) for s in kernel.statements] == [
        "unary", "matmul", "binary", "unary", "unary", "unary"]
    live = live_tiles(kernel)
    assert (live.peak, live.values, live.statement) == (2, ("s", "Bias"), "u")
    alone = next(k for k in built.model.kernels if k.name == "p")
    assert live_tiles(alone).peak == 1


def test_vectors_indexed_by_a_matrix_row_are_columns_of_tiles() -> None:
    workload = parse_workload("size N = 64\nin x : f32[N, N]\nout m : f32[N]\nin v : f32[N]\n"
                              "out w : f32[N]\nm[i] max= x[i, j]\nw[k] = v[k]\n", "t.syn", "t")
    hw = load_hardware("wormhole")
    kernels = encode(workload, hw).kernels
    units = {k.name: tiled_units(workload, k, 32) for k in kernels}
    assert units["m"] == {"i": 32, "j": 32} and units["w"] == {"k": 1024}


def test_lines_of_tiles_keep_their_layout_in_a_kernel_of_vectors_alone() -> None:
    workload = parse_workload(
        "size N = 64\nin x : f32[N, N]\nin g : f32[N]\nin v : f32[N]\nout y : f32[N, N]\n"
        "out w : f32[N]\nm[i] max= x[i, j]\nr[i] = m[i] * 2\nh[j] = g[j] + 1\n"
        "y[i, j] = x[i, j] * r[i] * h[j]\nw[k] = v[k] * 3\n", "t.syn", "t")
    assert lines_of_tiles(workload) == {"m", "r", "h", "g"}  # w, v: a flat vector
    assert tile_units([("i",)], 32) == {"i": 1024}
    assert tile_units([("i",)], 32, [("i",)]) == {"i": 32}
    assert tile_units([("b", "i")], 32, [("b", "i")]) == {"i": 32}  # b: a batch index
    kernels = encode(workload, load_hardware("wormhole")).kernels
    units = {k.name: tiled_units(workload, k, 32) for k in kernels}
    assert units["r"] == {"i": 32} and units["h"] == {"j": 32} and units["w"] == {"k": 1024}


def test_the_optimum_fits_dst_and_whole_tiles() -> None:
    program = optimal_program(FA6)
    env = optimum(FA6).env or {}
    for node in (n for k in program.kernels for n in walk(k.body)):
        if isinstance(node, Compute):
            assert all(t % 32 == 0 for t in node.tile), node
    subs = {k: v for k, v in env.items() if k.startswith(f"sub.{FUSED}.")}
    if env.get(f"fuse.{FUSED}") == 1:
        assert 2 * subs[f"sub.{FUSED}.i"] * subs[f"sub.{FUSED}.j"] <= 4


def test_seed_003s_2x2_subblock_is_infeasible_and_explained() -> None:
    """Seed 003: a 2x2 block of the fused flash-attention chain as one DST subblock. In
    f32 (DST 4 tiles, half sync) it needs 2x2 x 2 = 8 tiles: capacity.dst and the fixes."""
    fixes = [f"--fix=fuse.{FUSED}=1", f"--fix=sub.{FUSED}.i=2", f"--fix=sub.{FUSED}.j=2"]
    result = CliRunner().invoke(app, ["solve", "fa6", "--hw", "wormhole", "--set", "S=128",
                                      "--no-validate", "--json", *fixes])
    assert result.exit_code == 1, result.output
    report = json.loads(result.output)
    groups = {g["group"]: g["meaning"] for g in report["explanation"]["groups"]}
    assert set(groups) == {"capacity.dst", f"user.fix.fuse.{FUSED}",
                           f"user.fix.sub.{FUSED}.i", f"user.fix.sub.{FUSED}.j"}
    assert "x 2 live per tile (s, Bias at u) fit 4 DST tiles (f32, half sync)" \
        in groups["capacity.dst"]
    full = CliRunner().invoke(app, ["solve", "fa6", "--hw", "wormhole", "--set", "S=128",
                                    "--no-validate", "--json", "--hw-set",
                                    "compute.dst.sync=full", *fixes])
    assert full.exit_code == 0, full.output  # 8 f32 tiles in full sync: it fits


@pytest.mark.parametrize(("inputs", "status"), [(MAX_BUFFERS - 1, Status.OPTIMAL),
                                                (MAX_BUFFERS, Status.INFEASIBLE)])
def test_a_kernel_has_at_most_32_dataflow_buffers(inputs: int, status: Status) -> None:
    """One buffer per tensor: 31 inputs and the output fit, 32 inputs do not."""
    decls = "".join(f"in a{n} : f32[N]\n" for n in range(inputs))
    expr = " + ".join(f"a{n}[i]" for n in range(inputs))
    text = f"size N = 1024\n{decls}out y : f32[N]\ny[i] = {expr}\n"
    model = encode(parse_workload(text, "wide.syn", "wide"), load_hardware("wormhole"))
    assert solve(model.constraints).status is status
    [count] = [c for c in model.constraints.constraints if c.group == "count.buffers"]
    assert f"{inputs + 1} dataflow buffers" in count.meaning


def test_batch_and_head_dimensions_are_not_tiled_and_hold_one_index_per_block() -> None:
    """mha's [B, H, S, E] tensors are tiled along S and E only; a row statistic m[b, h, i]
    of sc[b, h, i, j] is a column of tiles along i (h is not padded to a tile); the `tile`
    family gives a block one b and one h, and the optimum honours it."""
    workload = parse_workload(
        "size B = 2\nsize H = 3\nsize S = 64\nin sc : f32[B, H, S, S]\nout m : f32[B, H, S]\n"
        "m[b, h, i] max= sc[b, h, i, j]\n", "t.syn", "t")
    hw = load_hardware("wormhole")
    model = encode(workload, hw)
    [kernel] = model.kernels
    assert tiled_units(workload, kernel, 32) == {"i": 32, "j": 32}
    assert tile_units([("b", "h", "i"), ("b", "h", "i", "j")], 32) == {"i": 32, "j": 32}
    assert tile_units([("h", "s", "e"), ("h", "t", "e")], 32) == {"s": 32, "t": 32, "e": 32}
    assert batch_dims([("b", "h", "i"), ("b", "h", "i", "j")], 32) == ("b", "h")
    meanings = [c.meaning for c in model.constraints.constraints if c.group == "tile"]
    assert any("a block holds one b" in m for m in meanings)
    assert any("a block holds one h" in m for m in meanings)
    result = solve(model.constraints)
    assert result.status is Status.OPTIMAL and result.env is not None
    assert result.env["ext.m.h"] == 3  # not padded to 32
    assert result.env["Q.m.h"] == result.env["Q.m.b"] == 1
    assert block_tiles(("b", "h", "i"), {"b": 1, "h": 2, "i": 64}, {"i": 32}) == 4
    assert block_tiles(("i",), {"i": 64}, {"i": 32}) == 2  # a column: a tile per 32 rows
    assert block_tiles(("k",), {"k": 2048}, {"k": 1024}) == 2  # a flat vector


@pytest.mark.parametrize("case", [
    Case.of("attention", "wormhole", {"S": 64, "D": 32}),  # row max and sum: columns
    Case.of("rmsnorm", "wormhole", {"S": 64, "D": 64}),  # g[d]: a row of tiles
    Case.of("softmax", "wormhole", {"N": 4096}),  # scalars: a tile each
    Case.of("mha", "wormhole", {"B": 2, "H": 2, "S": 64, "E": 32}),  # batched columns
], ids=lambda c: c.id)
def test_transfers_are_priced_in_whole_tiles(case: Case) -> None:
    """The cost model's DRAM bytes are the tiles the emitted kernel moves (as many as the
    simulator counts, `model_dram_tiles`) x 4096 bytes (f32), and one copy per block: a
    column statistic of 64 rows moves 2 tiles, 32x its elements' bytes."""
    built = build(case)
    env = optimum(case).env or {}
    mem = built.model.hw.memory("l1")
    per_byte = dataclasses.replace(mem, latency_ps=0, write_latency_ps=None, ps_per_byte=1)
    per_copy = dataclasses.replace(mem, latency_ps=1, write_latency_ps=None, ps_per_byte=0)
    moved = copies = 0
    for kernel in built.model.selected(env):
        kt = KernelTerms(kernel, built.model.factors, built.model.hw)
        slot = len(kt.slots) - 1
        units = math.prod(ex.evaluate(kt.units(s), env) for s in kt.spatial_inside(-1))
        for use in kt.moving():
            moved += units * ex.evaluate(tensor_transfer_cost(kt, use, per_byte, slot, 4), env)
            copies += units * ex.evaluate(tensor_transfer_cost(kt, use, per_copy, slot, 4), env)
            blocks = (int(use.read) + int(use.written)) * ex.evaluate(
                transfer_count(kt, use, slot), env)
            assert ex.evaluate(tensor_transfer_cost(kt, use, per_copy, slot, 4), env) == blocks
            if len(use.indices) == 1 and tiled_units(built.workload, kernel, 32).get(
                    use.indices[0]) == 32:  # a column or a row of tiles
                assert tile_scale(kt, use) == 32
    read, written = model_dram_tiles(built.model, env)
    assert moved == (read + written) * 32 * 32 * 4 and copies > 0


def test_heads_between_a_weights_tiled_indices_are_batch_indices() -> None:
    """The transformer's projection q[h, s, e] += xn[s, d] * Wq[d, h, e]: d is a matrix
    index of xn (tiled), h a leading index of q that no matrix is indexed by (a batch
    index, one per block: Wq's block is one head's columns), so H=2 is not padded to 32."""
    subscripts = [("s", "d"), ("d", "h", "e"), ("h", "s", "e")]
    assert tile_units(subscripts, 32) == {"s": 32, "d": 32, "e": 32}
    assert batch_dims(subscripts, 32) == ("h",)
    assert tile_units([("s", "d"), ("d", "h", "e")], 32) == {"s": 32, "d": 32, "h": 32,
                                                             "e": 32}  # no q: h is tiled
    case = Case.of("transformer", "wormhole", {"S": 64, "D": 64, "H": 2, "E": 32, "F": 64})
    env = optimum(case).env or {}
    assert ex.evaluate(build(case).model.factors.extents[("q", "h")], env) == 2  # not 32
    assert env["Q.q.h"] == 1
