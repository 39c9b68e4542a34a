"""`--emit ttlang`: tt-lang operations run under tt-lang's functional simulator
(`tt-lang-sim`, the `tt` extra), checked against the reference, with the simulator's
DRAM tile traffic equal to the schedule's. Sizes are small (the simulator is slow) but
leave several blocks per node or several nodes."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import SPLIT_K, f32_matmul, f32_twin
from typer.testing import CliRunner

from synth import pipeline
from synth.cli import app
from synth.constraints.dst import model_dram_tiles
from synth.emit import ttlang
from synth.emit.targets import target
from synth.emit.ttlang import program_source
from synth.emit.ttlang_check import TtlangCheck, check_ttlang
from synth.ir.nodes import Affine, Alloc, BufferDecl, walk

pytest.importorskip("ttl")

BATCHED = """size B = 3
size M = 64
size N = 64
size K = 32
in  A : f32[B, M, K]
in  W : f32[B, K, N]
out Y : f32[B, M, N]
C[b, m, n] += A[b, m, k] * W[b, k, n]
r[b, m]   max= C[b, m, n]
Y[b, m, n]  = (C[b, m, n] - r[b, m]) * 0.5
"""
MHA = {"B": 2, "H": 2, "S": 64, "E": 32}
CUBE = """size N = 64
in  A : f32[N, N]
in  B : f32[N, N]
in  T : f32[N, N, N]
out Y : f32[N, N, N]
Y[i, j, k] = T[i, j, k] * A[i, k] * B[j, k]
"""  # T is tiled along all three indices (each is a matrix index of A or B)
BOTH_WAYS = """size N = 64
in  x : f32[N, N]
in  v : f32[N]
out Y : f32[N, N]
out Z : f32[N, N]
Y[i, j] = x[i, j] * v[i]
Z[i, j] = x[i, j] * v[j]
"""  # v scales the rows, then the columns: a column of tiles and a row of tiles


def _emit(workload: str, sizes: dict[str, int], out: Path, fixes: tuple[str, ...] = ()
          ) -> pipeline.Outcome:
    outcome = pipeline.run(pipeline.Request(workload, "wormhole", sizes, fixes=fixes,
                                            emit="ttlang", out_dir=str(out)))
    assert outcome.emitted is not None
    return outcome


@pytest.mark.parametrize(("workload", "sizes", "written"), [
    ("fa6", {"S": 64, "D": 64}, 4),  # 64x64 of O
    # online, one kernel with O, the keys in one block (a step without rescales)
    ("attention", {"S": 64, "D": 32}, 4),
    ("softmax", {"N": 4096}, 10),  # scalar max and sum of a flat vector
    # batch and heads: [2, 2, 64, 32] tensors as 256 x 32 views, a block per (b, h)
    ("mha", {"B": 2, "H": 2, "S": 64, "E": 32}, 16),  # online too
    # a scale g[d] as a row of tiles broadcast down the rows (a column layout differs)
    ("rmsnorm", {"S": 64, "D": 64}, 6),
    ("layernorm", {"S": 64, "D": 64}, 12),
    # the two projections of x fused (a_b_h: both contractions on the matrix engine)
    ("swiglu", {"S": 64, "D": 64, "F": 64}, 8),
    # projections into heads: Wq[d, h, e] as 64 x (2*32), a block one head's columns
    ("transformer", {"S": 64, "D": 64, "H": 2, "E": 32, "F": 64}, 40),
])
def test_builtin_is_simulated_with_the_schedules_traffic(
        workload: str, sizes: dict[str, int], written: int, tmp_path: Path) -> None:
    assert_simulated_as_modelled(_emit(workload, sizes, tmp_path / "out"), written)


def assert_simulated_as_modelled(outcome: pipeline.Outcome, written: int) -> None:
    """The emitted program passed the simulator with the schedule's DRAM tiles, which
    are the cost model's, and wrote `written` tiles."""
    check = outcome.emitted.check if outcome.emitted else None
    assert isinstance(check, TtlangCheck), check
    assert check.passed, check.log
    assert check.pcc is not None and check.pcc > 0.9999
    assert (check.dram_tiles_read, check.dram_tiles_written) == (
        check.model_tiles_read, check.model_tiles_written)
    assert check.model_tiles_read > 0 and check.model_tiles_written == written
    assert model_dram_tiles(outcome.model, outcome.result.env or {}) == (
        check.model_tiles_read, check.model_tiles_written)  # the cost model's transfers


@pytest.mark.parametrize(("workload", "sizes", "written"), [
    ("va", {"N": 4096}, 4),
    ("red", {"N": 4096}, 1),  # a scalar: one tile
    ("mv", {"M": 64, "N": 128}, 2),  # y as a column of tiles
    ("matmul", {"M": 64, "N": 64, "K": 128}, 4),
    ("gemm2k", {"M": 64, "N": 64, "K": 64}, 4),
])
def test_the_integer_builtins_f32_twins_are_simulated_with_the_schedules_traffic(
        workload: str, sizes: dict[str, int], written: int, tmp_path: Path) -> None:
    """tt-lang-sim 1.1.6 has no int32 (i32 is refused: test_refusals below), so the
    i32 built-ins are checked as the same programs over f32."""
    twin = f32_twin(workload, tmp_path)
    assert_simulated_as_modelled(_emit(str(twin), sizes, tmp_path / "out"), written)


def test_an_accumulator_over_a_loop_with_one_block_deadlocks(tmp_path: Path) -> None:
    """The split-k matmul accumulates C across four blocks of k: its buffer is read and
    rewritten, so it needs block_count 2; with 1 the simulator reports the deadlock."""
    out = tmp_path / "out"
    outcome = _emit(str(f32_matmul(tmp_path)), {}, out, SPLIT_K)
    check = outcome.emitted.check
    assert isinstance(check, TtlangCheck) and check.passed, check
    assert model_dram_tiles(outcome.model, outcome.result.env or {}) == (
        check.dram_tiles_read, check.dram_tiles_written)
    source = (out / "program.py").read_text()
    assert "C_l1_acc_dfb = ttl.make_dataflow_buffer_like(C, shape=(1, 1), block_count=2)" \
        in source and "for g_k in range(4):" in source
    assert outcome.program is not None
    (out / "program.py").write_text(program_source(outcome.program, outcome.workload, 1))
    broken = check_ttlang(out)
    assert not broken.ran and not broken.passed
    assert "deadlock" in broken.log and "C_l1_acc_dfb" in broken.log


@pytest.fixture(scope="module")
def emitted_matmul(tmp_path_factory: pytest.TempPathFactory) -> tuple[pipeline.Outcome, Path]:
    """`F32_MATMUL` solved, emitted and checked once for the tests that break a copy of
    its output directory."""
    base = tmp_path_factory.mktemp("matmul")
    out = base / "out"
    return _emit(str(f32_matmul(base)), {}, out), out


def copy_of(emitted: tuple[pipeline.Outcome, Path], tmp_path: Path) -> Path:
    out = tmp_path / "out"
    shutil.copytree(emitted[1], out)
    return out


def test_a_copy_of_the_wrong_tile_count_and_a_wrong_result_are_caught(
        emitted_matmul: tuple[pipeline.Outcome, Path], tmp_path: Path) -> None:
    out = copy_of(emitted_matmul, tmp_path)
    good = (out / "program.py").read_text()
    first = good.index("ttl.copy(A[")
    end = good.index(", blk)", first)
    wrong_count = good[:first] + "ttl.copy(A[0:1, 0:1]" + good[end:]
    (out / "program.py").write_text(wrong_count)
    copy_check = check_ttlang(out)
    assert not copy_check.passed and not copy_check.ran, copy_check.log
    (out / "program.py").write_text(good.replace("out.store(A_l1 @ B_l1)",
                                                 "out.store(A_l1 @ B_l1 + A_l1 @ B_l1)"))
    wrong = check_ttlang(out)
    assert wrong.ran and not wrong.passed and "DIFFERS" in wrong.log
    (out / "program.py").write_text(good)
    model = json.loads((out / "model.json").read_text())
    (out / "model.json").write_text(json.dumps({**model, "tiles_read": model["tiles_read"] + 1}))
    traffic = check_ttlang(out)
    assert traffic.ran and not traffic.passed and "DIFFERENT" in traffic.log


def test_buffers_other_than_the_schedules_fail_the_check(
        emitted_matmul: tuple[pipeline.Outcome, Path], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """program.py's dataflow buffers (count, and bytes: tiles x tile bytes x block_count)
    are compared with the schedule's per operation: one more block is caught, as is a
    schedule whose numbers differ (exit 4 from the CLI); JSON has both per operation."""
    outcome = emitted_matmul[0]
    out = copy_of(emitted_matmul, tmp_path)
    check = outcome.emitted.check if outcome.emitted else None
    assert isinstance(check, TtlangCheck) and check.passed
    [(mine, theirs)] = check.buffers.values()
    assert mine == theirs and mine[0] == 3 and "dataflow buffers: as the schedule's" in check.log
    good = (out / "program.py").read_text()
    line = next(x for x in good.splitlines() if x.strip().startswith("A_l1_dfb ="))
    (out / "program.py").write_text(good.replace(line, line.replace("block_count=1",
                                                                     "block_count=2")))
    more = check_ttlang(out)
    assert more.ran and not more.passed, more.log
    [(declared, schedule)] = more.buffers.values()
    assert declared[1] - schedule[1] == 4 * 32 * 32 * 4  # A's block: 1x4 f32 tiles
    assert "program.py declares 3" in more.log and "DIFFERENT" in more.log
    monkeypatch.setattr(target("ttlang"), "emit", _undercounting(target("ttlang").emit))
    result = CliRunner().invoke(app, ["solve", str(f32_matmul(tmp_path)), "--hw", "wormhole",
                                      "--emit", "ttlang", "--out", str(tmp_path / "u"),
                                      "--json"])
    assert result.exit_code == 4, result.output
    data = json.loads(result.output)["emitted"]["ttlang"]
    [numbers] = data["dataflow_buffers"].values()
    assert numbers["buffers"] == numbers["model_buffers"] + 1


def _undercounting(emit: Any) -> Any:
    """The target's emit with the schedule's buffer count one short in model.json."""
    def wrapped(*args: Any) -> Any:
        files = emit(*args)
        path = next(f for f in files if f.name == "model.json")
        model = json.loads(path.read_text())
        model["buffers"] = {op: [n - 1, b] for op, (n, b) in model["buffers"].items()}
        path.write_text(json.dumps(model))
        return files
    return wrapped


def test_json_keys_and_exit_codes(tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["solve", "fa6", "--hw", "wormhole", "--set", "S=64",
                                 "--set", "D=32", "--emit", "ttlang", "--out",
                                 str(tmp_path / "o"), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)["emitted"]["ttlang"]
    for key in ("path", "files", "checked", "passed", "pcc", "max_abs_err",
                "dram_tiles_read", "dram_tiles_written", "model_tiles_read",
                "model_tiles_written"):
        assert key in data, key
    assert data["checked"] and data["passed"]
    assert data["dram_tiles_read"] == data["model_tiles_read"]
    on_cpu = runner.invoke(app, ["solve", "va", "--hw", "cpu", "--emit", "ttlang", "--out",
                                 str(tmp_path / "c")])
    assert on_cpu.exit_code == 2 and "--hw wormhole" in on_cpu.output
    padded = runner.invoke(app, ["solve", "softmax", "--hw", "wormhole", "--set", "N=999",
                                 "--emit", "ttlang", "--out", str(tmp_path / "a")])
    assert padded.exit_code == 2 and "padded to whole blocks" in padded.output
    integers = runner.invoke(app, ["solve", "va", "--hw", "wormhole", "--set", "N=4096",
                                   "--emit", "ttlang", "--out", str(tmp_path / "v")])
    assert integers.exit_code == 2 and "is i32" in integers.output
    assert "no integer dtype" in integers.output
    cube = tmp_path / "cube.syn"
    cube.write_text(CUBE)
    three = runner.invoke(app, ["solve", str(cube), "--hw", "wormhole", "--emit", "ttlang",
                                "--out", str(tmp_path / "t")])
    assert three.exit_code == 2 and "tensor T[i, j, k] in kernel Y is tiled along i, j, k" \
        in three.output, three.output
    both = tmp_path / "both.syn"
    both.write_text(BOTH_WAYS)
    twice = runner.invoke(app, ["solve", str(both), "--hw", "wormhole", "--emit", "ttlang",
                                "--out", str(tmp_path / "b")])
    assert twice.exit_code == 2 and "vector v is a row of tiles in statement Z and a column" \
        in twice.output, twice.output
    assert "Traceback" not in padded.output + integers.output + three.output + twice.output


def test_the_emitted_program_is_readable_and_named_after_the_tensors(tmp_path: Path) -> None:
    out = tmp_path / "out"
    # not simulated here: test_json_keys_and_exit_codes simulates this program (the
    # same request from the command line) and finds it passes
    outcome = pipeline.run(pipeline.Request("fa6", "wormhole", {"S": 64, "D": 32},
                                            emit="ttlang", out_dir=str(out), validate=False))
    assert outcome.emitted is not None
    source = (out / "program.py").read_text()
    assert "@ttl.operation(grid=(" in source and "def op_kt_s_u_p_r_O(" in source
    for name in ("Q_l1_dfb", "K_l1_dfb", "Bias_l1_dfb", "ttl.block.transpose(K_l1)",
                 "ttl.math.exp(", "ttl.math.sqrt(", "ttl.math.recip("):
        assert name in source, name
    assert target("ttlang").name == "ttlang"
    shutil.rmtree(out)


def test_rank_3_tensors_and_a_batched_row_statistic(tmp_path: Path) -> None:
    """A batched matmul over [3, 64, 32] x [3, 32, 64], the row maxima r[b, m] (a
    column of 3 x 64 rows) and a scaled difference: simulated, the model's traffic."""
    path = tmp_path / "bmm.syn"
    path.write_text(BATCHED)
    out = tmp_path / "out"
    outcome = _emit(str(path), {}, out)
    check = outcome.emitted.check if outcome.emitted else None
    assert isinstance(check, TtlangCheck) and check.passed, check
    assert (check.dram_tiles_read, check.dram_tiles_written) == (
        check.model_tiles_read, check.model_tiles_written) == model_dram_tiles(
        outcome.model, outcome.result.env or {})
    source = (out / "program.py").read_text()
    assert "# A[3, 64, 32] viewed as 192 x 32" in source
    assert "# r[3, 64] viewed as 192 x 32" in source
    assert "'r': (64, 32, False, True, (3, 64), (3,), False, ())" in source  # batched column


BATCHED_ALONE = """size B = 3
size M = 64
size N = 64
in  x : f32[B, M, N]
out y : f32[B, M, N]
m[b, i] max= x[b, i, n]
r[b, i] = exp(m[b, i] * 0.5)
y[b, i, n] = x[b, i, n] * r[b, i]
"""  # r: a batched row statistic, computed in a kernel of statistics alone when unfused
ROW_ALONE = """size N = 64
in  x : f32[N, N]
in  g : f32[N]
out y : f32[N, N]
h[j] = g[j] + 1
y[i, j] = x[i, j] * h[j]
"""  # h: a row of tiles in y, so g too in the kernel h alone


@pytest.mark.parametrize(("workload", "sizes", "fixes"), [
    # r[s] = rsqrt(vs[s] / D + eps) alone: vs and r are columns of tiles, as op_y reads r
    ("layernorm", {"S": 64, "D": 64}, ("fuse.r=1",)),
    ("batched_alone", {}, ("fuse.r=1", "fuse.y=1")),
    ("row_alone", {}, ("fuse.y=1",)),
])
def test_a_kernel_of_vectors_alone_keeps_the_programs_layout_of_them(
        workload: str, sizes: dict[str, int], fixes: tuple[str, ...], tmp_path: Path) -> None:
    """Tiled alone, a kernel of vectors would take them as flat E x E tiles; the rest of
    the program lays them out as columns (rows) of tiles, and so must it (and the
    model): before, the simulator found other buffers than the schedule's (layernorm),
    a wrong result (row_alone), or the emitter refused (batched_alone)."""
    texts = {"batched_alone": BATCHED_ALONE, "row_alone": ROW_ALONE}
    if workload in texts:
        path = tmp_path / f"{workload}.syn"
        path.write_text(texts[workload])
        workload = str(path)
    outcome = _emit(workload, sizes, tmp_path / "out", fixes)
    alone = [k for k in outcome.model.kernels if k.name in ("r", "h")]
    assert alone and set(alone[0].tile_units(32).values()) == {32}  # not 32 * 32
    check = outcome.emitted.check if outcome.emitted else None
    assert isinstance(check, TtlangCheck) and check.passed, check and check.log
    assert (check.dram_tiles_read, check.dram_tiles_written) == (
        check.model_tiles_read, check.model_tiles_written) == model_dram_tiles(
        outcome.model, outcome.result.env or {})


def test_a_wrong_view_of_the_heads_is_caught(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                             ) -> None:
    """mha with the leading indices' stride wrong (every batch reads batch 0's heads):
    the copies stay in bounds and move the same tiles, and the outputs differ."""
    out = tmp_path / "out"
    outcome = _emit("mha", MHA, out)
    assert outcome.program is not None
    good = ttlang.view_row

    def wrong(decl: BufferDecl, layout: ttlang.Layout) -> Affine:
        if not layout.lead:
            return good(decl, layout)
        last = decl.origin[len(layout.lead) - 1]  # the head only: the batch index dropped
        return decl.origin[len(layout.lead)] + Affine(
            tuple((v, c * layout.rows) for v, c in last.terms), last.const * layout.rows)

    monkeypatch.setattr(ttlang, "view_row", wrong)
    (out / "program.py").write_text(ttlang.program_source(outcome.program, outcome.workload))
    broken = check_ttlang(out)
    assert broken.ran and not broken.passed and "O: DIFFERS" in broken.log, broken.log
    assert (broken.dram_tiles_read, broken.dram_tiles_written) == (
        broken.model_tiles_read, broken.model_tiles_written)


def test_a_block_of_several_heads_is_refused(tmp_path: Path) -> None:
    """The emitter takes one leading index per block (the model's `tile` constraint); a
    block of two heads is exit 2, not a wrong kernel."""
    out = tmp_path / "out"
    outcome = _emit("mha", MHA, out)
    assert outcome.program is not None
    decl = next(n.buffer for k in outcome.program.kernels for n in walk(k.body)
                if isinstance(n, Alloc) and n.buffer.tensor == "Q")
    lay = ttlang.layouts(outcome.program, outcome.workload)
    two = dataclasses.replace(decl, shape=(1, 2, *decl.shape[2:]))
    with pytest.raises(ttlang.EmitError, match="holds \\(1, 2\\) of Q's leading"):
        ttlang.tile_slice(two, lay["Q"])


def test_a_reduction_split_in_steps_into_a_loaded_target(tmp_path: Path) -> None:
    """mha's scores with e split in two steps (E=64, 32 per block), the target read from
    DRAM (filled with 0 before): the loaded block starts an accumulator with two blocks
    (one buffer stored into twice per wait deadlocked, as at mha's default size). The
    scores kept a kernel of their own (`fuse.sc=1`: free, mha runs online, fused)."""
    out = tmp_path / "out"
    outcome = _emit("mha", {"B": 1, "H": 2, "S": 64, "E": 64}, out, ("fuse.sc=1", "Q.sc.e=32"))
    check = outcome.emitted.check if outcome.emitted else None
    assert isinstance(check, TtlangCheck) and check.passed, check
    assert (check.dram_tiles_read, check.dram_tiles_written) == (
        check.model_tiles_read, check.model_tiles_written) == model_dram_tiles(
        outcome.model, outcome.result.env or {})
    source = (out / "program.py").read_text()
    assert "acc.store(sc_l1_in)" in source and "for g_e in range(2):" in source


def test_a_projection_into_heads_takes_each_heads_columns(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The transformer's Wq[d, h, e] is the 2-D view D x (H*E) and a block of it one
    head's column slice; with the head's column offset dropped (every head projects
    with head 0's weights) the copies move the same tiles and the output differs."""
    out = tmp_path / "out"
    outcome = _emit("transformer", {"S": 64, "D": 64, "H": 2, "E": 32, "F": 64}, out)
    assert outcome.program is not None
    source = (out / "program.py").read_text()
    assert "# Wq[64, 2, 32] viewed as 64 x 64 (one block per leading index: columns 2 x 32)" \
        in source
    good = ttlang.view_col

    def head_zero(decl: BufferDecl, layout: ttlang.Layout) -> Affine:
        return decl.origin[-1] if layout.mid else good(decl, layout)

    monkeypatch.setattr(ttlang, "view_col", head_zero)
    (out / "program.py").write_text(ttlang.program_source(outcome.program, outcome.workload))
    broken = check_ttlang(out)
    assert broken.ran and not broken.passed and "y: DIFFERS" in broken.log, broken.log
    assert (broken.dram_tiles_read, broken.dram_tiles_written) == (
        broken.model_tiles_read, broken.model_tiles_written)


def test_online_attention_is_chosen_emitted_and_right_where_exp_overflows(
        tmp_path: Path) -> None:
    """On wormhole the solver runs attention online (running max, the sums rescaled by
    exp(m_old - m_new) at each step over the keys' blocks); the emitted step passes the
    simulator on scores in the hundreds (exp of them overflows f32: only the rescaled
    form is finite), with DRAM traffic and buffers equal to the model's. Without its
    rescales the same program is caught."""
    from synth.pipeline import evaluate_errors
    out = tmp_path / "out"
    # the keys in blocks of 32 (free, the solver takes all 128 in one step: no rescale)
    outcome = _emit("attention", {"S": 128, "D": 32}, out, ("Q.s_m_p_l_o_O.j=32",))
    env = outcome.result.env or {}
    assert [n for n, v in env.items() if n.startswith("online.") and v == 1]
    source = (out / "program.py").read_text()
    assert "m_l1_scale_dfb.reserve() as scale" in source and "ttl.math.exp((m_l1_prev - m_l1))" \
        in source and "for g_j in range(" in source  # several steps: rescales that matter
    inputs = {t.name: np.load(out / "data" / f"input_{t.name}.npy")
              for t in outcome.workload.inputs}
    inputs["Q"] = (inputs["Q"] * 12).astype(np.float32)
    inputs["K"] = (inputs["K"] * 12).astype(np.float32)
    expected, bounds = evaluate_errors(outcome.workload, inputs)
    for prefix, arrays in (("input", inputs), ("expected", expected), ("bound", bounds)):
        for name, array in arrays.items():
            np.save(out / "data" / f"{prefix}_{name}.npy", array)
    scores = inputs["Q"].astype(np.float64) @ inputs["K"].T.astype(np.float64)
    assert scores.max() > 100  # exp overflows f32 past 88.7
    check = check_ttlang(out)
    assert check.passed, check.log
    assert check.pcc is not None and check.pcc > 0.9999
    assert model_dram_tiles(outcome.model, env) == (check.dram_tiles_read,
                                                    check.dram_tiles_written)
    # the same buffers and waits, the factor 1: the sums are not rescaled
    unscaled = source.replace("ttl.math.exp((m_l1_prev - m_l1))", "ttl.math.exp((m_l1 - m_l1))")
    assert unscaled != source
    (out / "program.py").write_text(unscaled)
    broken = check_ttlang(out)
    assert broken.ran and not broken.passed and "DIFFERS" in broken.log, broken.log
