"""Every contraction of a kernel on the matrix intrinsic (issue 15): an online kernel's two
(s = Q K^T and o += p V) and a fused kernel's several are priced on `[compute.intrinsic]`
under one `pack.<kernel>` decision, each one's tile bound to the intrinsic's block, and
the emitters follow (tt-lang: block products; MLIR: the same linalg ops, checked)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from synth import pipeline
from synth.cli import app
from synth.constraints import expr as ex
from synth.emit.mlir_check import MlirCheck

ONLINE = "s_m_p_l_o_O"  # attention's whole chain as one online kernel
TWO = """
size S = 64
size D = 64
size F = 64
in  x  : i32[S, D]
in  W1 : i32[D, F]
in  W3 : i32[D, F]
out h  : i32[S, F]
a[s, f]  += x[s, d] * W1[d, f]
b[s, f]  += x[s, d] * W3[d, f]
h[s, f]   = a[s, f] * b[s, f]
"""  # two contractions of x, fused into one kernel a_b_h


def _solve(workload: str, hw: str, sizes: dict[str, int], fixes: tuple[str, ...] = (),
           **kw: object) -> pipeline.Outcome:
    return pipeline.run(pipeline.Request(workload, hw, sizes, fixes=fixes,
                                         validate=False, **kw))  # type: ignore[arg-type]


def test_an_online_kernels_two_contractions_are_priced_on_the_matrix_engine() -> None:
    """The online attention kernel on wormhole is packed, and its compute is the
    intrinsic's: unpacked (the same schedule priced as SFPU element-wise ops) it is over
    4x more, and it is within 1.5x of the unfused kernels' compute (at a size where both
    use every core: at S = 512 the online kernel's rows fill 16 of the 64)."""
    sizes = {"S": 4096}
    outcome = _solve("attention", "wormhole", sizes, (f"online.{ONLINE}=1",))
    env = outcome.result.env or {}
    assert env[f"pack.{ONLINE}"] == 1
    compute = outcome.model.constraints.breakdown["compute"]
    packed = ex.evaluate(compute, env)
    unpacked = ex.evaluate(compute, {**env, f"pack.{ONLINE}": 0})
    assert unpacked > 4 * packed
    unfused = _solve("attention", "wormhole", sizes, tuple(
        f"{name}=0" for name in env if name.startswith("online.")))
    unfused_env = unfused.result.env or {}
    assert not any(v for n, v in unfused_env.items() if n.startswith("online."))
    assert packed < 1.5 * ex.evaluate(unfused.model.constraints.breakdown["compute"],
                                      unfused_env)


def test_the_intrinsic_binds_the_tile_of_each_contraction() -> None:
    """One constraint per dimension of each contraction, naming the kernel, the dimension
    and the contraction: the online kernel's s (i, j, d) and o (i, e, j)."""
    outcome = _solve("attention", "wormhole", {"S": 128, "D": 32}, (f"online.{ONLINE}=1",))
    meanings = [c.meaning for c in outcome.model.constraints.constraints
                if c.group == "intrinsic" and f"kernel {ONLINE}:" in c.meaning]
    tiles = {m.split("compute tile of ")[1].split(" ")[0] for m in meanings}
    assert tiles == {"i", "j", "d", "e"} and len(meanings) == 4
    assert any("contraction s," in m for m in meanings)
    assert any("contraction o," in m for m in meanings)


def test_a_fused_kernels_contractions_all_take_the_intrinsic_block(tmp_path: Path) -> None:
    """On aie (i32: 4x8x8) the kernel with a and b packed needs d (k of both) in 8s."""
    source = tmp_path / "two.syn"
    source.write_text(TWO)
    args = ["solve", str(source), "--hw", "aie", "--fix", "fuse.a_b_h=1", "--no-validate"]
    runner = CliRunner()
    bad = runner.invoke(app, [*args, "--fix", "pack.a_b_h=1", "--fix", "Q.a_b_h.d=4"])
    assert bad.exit_code == 1 and "intrinsic" in bad.output, bad.output
    plain = runner.invoke(app, [*args, "--fix", "pack.a_b_h=0", "--fix", "Q.a_b_h.d=4"])
    assert plain.exit_code == 0, plain.output
    packed = runner.invoke(app, [*args, "--fix", "pack.a_b_h=1"])
    assert packed.exit_code == 0 and "pack.a_b_h" in packed.output, packed.output


def test_the_mlir_of_a_kernel_with_two_packed_contractions_runs(tmp_path: Path) -> None:
    """The MLIR emitter writes the same linalg ops packed or not (the decision prices; the
    layout is the AIE lowering's): two packed contractions of one kernel check."""
    source = tmp_path / "two.syn"
    source.write_text(TWO)
    outcome = pipeline.run(pipeline.Request(
        str(source), "aie", {}, fixes=("fuse.a_b_h=1", "pack.a_b_h=1"), emit="mlir",
        out_dir=str(tmp_path / "out")))
    assert outcome.emitted is not None
    check = outcome.emitted.check
    assert isinstance(check, MlirCheck), check
    assert check.passed, check.log


@pytest.mark.parametrize("hw", ["wormhole", "blackhole"])
def test_attention_at_4096_runs_online_where_the_scores_do_not_fit(hw: str) -> None:
    """Free, the solver picks the online kernel (no S x S scores through DRAM), packed,
    cheaper than the best schedule with the rewrite forbidden."""
    free = _solve("attention", hw, {"S": 4096})
    env = free.result.env or {}
    online = [n for n, v in env.items() if n.startswith("online.") and v == 1]
    assert online, env
    kernel = online[0].removeprefix("online.")
    assert env[f"pack.{kernel}"] == 1
    forbidden = _solve("attention", hw, {"S": 4096}, tuple(
        f"{name}=0" for name in env if name.startswith("online.")))
    assert free.result.objective is not None and forbidden.result.objective is not None
    assert free.result.objective < forbidden.result.objective


def test_a_batched_contraction_is_one_product_per_leading_index() -> None:
    """`sc[b, i, j] += Q[b, i, e] * K[b, j, e]` is a product per b, and so is a
    projection whose other operand is shared by every b (`bc`); a target index in neither
    operand (`rp`: the same product repeated) or a max-product is not."""
    from synth.constraints.intrinsic import contraction
    from synth.lang import parse_workload
    workload = parse_workload("""
size B = 2
size S = 64
size E = 32
in  Q : f32[B, S, E]
in  K : f32[B, S, E]
in  W : f32[S, E]
out sc : f32[B, S, S]
out bc : f32[B, S, S]
out mx : f32[B, S, S]
out rp : f32[B, S, S]
sc[b, i, j] += Q[b, i, e] * K[b, j, e]
bc[b, i, j] += Q[b, i, e] * W[j, e]
mx[b, i, j] max= Q[b, i, e] * K[b, j, e]
rp[b, i, j] += W[i, e] * W[j, e]
""", "<test>", "batched")
    found = {s.name: contraction(s) for s in workload.statements}
    assert found == {"sc": ("i", "j", "e"), "bc": ("i", "j", "e"), "mx": None, "rp": None}


def test_multi_head_attention_runs_both_products_on_the_matrix_engine() -> None:
    """mha at S=4096, E=128 (B=2, H=12) on wormhole: the scores fused into the online
    kernel, packed; without the batched contractions on the engine it cost 20x more."""
    outcome = _solve("mha", "wormhole", {"S": 4096, "E": 128})
    env = outcome.result.env or {}
    [kernel] = [n.removeprefix("online.") for n, v in env.items()
                if n.startswith("online.") and v == 1]
    assert kernel.startswith("sc_") and env[f"pack.{kernel}"] == 1
    compute = outcome.model.constraints.breakdown["compute"]
    assert ex.evaluate(compute, {**env, f"pack.{kernel}": 0}) > 4 * ex.evaluate(compute, env)


def test_the_projections_into_heads_run_on_the_matrix_engine() -> None:
    """The transformer's q[h, s, e] += xn[s, d] * Wq[d, h, e] (xn shared by the heads) is
    a product per head: packed on wormhole, at a reduced size."""
    outcome = _solve("transformer", "wormhole", {"S": 64, "D": 64, "H": 2, "E": 32, "F": 64})
    env = outcome.result.env or {}
    packed = {n for n, v in env.items() if n.startswith("pack.") and v == 1}
    for stmt in ("q", "k", "v"):
        [kernel] = [k for k in outcome.model.selected(env)
                    if stmt in {s.name for s in k.statements}]
        assert f"pack.{kernel.name}" in packed, (stmt, kernel.name, packed)

