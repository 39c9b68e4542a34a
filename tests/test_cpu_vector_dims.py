"""Which dimension a kernel's register tiles are vectors along, as a decision of the solver
(`synth.vectors.vector_options`, `KernelSpec.vector`): a row reduction `sm[s] += x[s, d]`
may run along its target's rows (each vector gathered from 16 rows) or along the reduced
d (plain loads, each row's accumulators folded at its end), as kernel `sm__d`. Measured
(RESULTS.md, "Row reductions vectorised along the row"): layernorm's C ran 0.30 ms with
its row sums gathered, 0.10 ms along d. With the extra candidates one joint random draw
can find nothing (attention at S = 1024): the sampler then draws the fusion cover first.
Relations only; deterministic solver limits."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from conftest import ROW_SUM, solve

from synth.constraints import expr as ex
from synth.constraints.decompose import random_cover, with_fusion
from synth.constraints.result import Status
from synth.constraints.sample import random_schedule
from synth.constraints.space import candidate_kernels, fusion_decision, is_fusion_decision
from synth.emit.c import emit_c
from synth.emit.c_check import check_c
from synth.hwfile import load_hardware
from synth.ir.materialize import materialize
from synth.ir.verify import verify
from synth.lang import load_workload, parse_workload
from synth.pipeline import encode
from synth.reference import evaluate_errors, make_inputs
from synth.vectors import vector_options


def statements(text: str) -> tuple:
    return parse_workload(text, "<test>", "w").statements


def test_a_row_reduction_may_run_along_its_rows_or_along_the_reduced_dimension() -> None:
    assert vector_options(statements(ROW_SUM)) == ("s", "d")
    # a column sum reads x along s, its target's own index: one option
    columns = ROW_SUM.replace("x[s, d]", "x[d, s]").replace("f32[S, D]", "f32[D, S]")
    assert vector_options(statements(columns)) == ("s",)
    # a contraction's operands are packed for the micro-kernel instead
    assert vector_options(load_workload("matmul", {}).statements) == ("n",)
    # a reduction into a scalar is along its operand already
    assert vector_options(load_workload("red", {}).statements) == ("i",)
    rms = load_workload("rmsnorm", {}).statements
    assert vector_options(rms[:1]) == ("s", "d")  # x * x is not a contraction


def test_a_second_kernel_per_group_only_where_registers_are_vectors() -> None:
    workload = load_workload("layernorm", {})
    plain = {k.name: k for k in candidate_kernels(workload)}
    vectors = {k.name: k for k in candidate_kernels(workload, vectors=True)}
    assert not any("__" in name for name in plain)
    assert set(plain) < set(vectors)
    assert vectors["sm_mu__d"].vector == "d" and vectors["sm_mu"].vector == "s"
    assert vectors["sm_mu__d"].statements == vectors["sm_mu"].statements
    # y = xc * r * g + b reduces nothing: no variant
    assert "y__d" not in vectors and "y__s" not in vectors


def objective(text: str, fixes: tuple[str, ...]) -> int:
    model = encode(parse_workload(text, "<test>", "w"), load_hardware("cpu"), fixes=fixes)
    result = solve(model.constraints)
    assert result.status is Status.OPTIMAL and result.env is not None, result.status
    return ex.evaluate(model.constraints.objective, dict(result.env))


def test_long_rows_are_cheaper_along_the_row_than_gathered() -> None:
    """Rows 4 KiB apart: a gather per vector of 16 rows (aliasing in the L1's sets)
    against a load per vector and a fold per row; the solver's optimum takes the row."""
    along_d = objective(ROW_SUM, ("fuse.sm__d=1",))
    gathered = objective(ROW_SUM, ("fuse.sm=1",))
    assert along_d < gathered
    assert objective(ROW_SUM, ()) == along_d


def test_a_fixed_kernel_is_kept_where_a_cheaper_partition_dominates_it() -> None:
    """`--fix fuse.sm_mu=1`: sm__d then mu cost less than sm_mu (gathered), which the
    set partition's dominance cutoff would prove and leave sm_mu out (`partition.
    _Candidates.cutoff`); the fix names it, so it keeps no cutoff and is used."""
    workload = load_workload("layernorm", {"S": 24, "D": 96})
    fixed = encode(workload, load_hardware("cpu"), fixes=("fuse.sm_mu=1",))
    free = encode(workload, load_hardware("cpu"))
    result, best = solve(fixed.constraints), solve(free.constraints)
    assert result.status is Status.OPTIMAL and result.env is not None, result.status
    assert result.env["fuse.sm_mu"] == 1
    assert best.objective is not None and result.objective is not None
    assert best.objective < result.objective


@pytest.mark.parametrize(("name", "sizes", "kernel", "vector"), [
    ("rmsnorm", {"S": 24, "D": 96}, "ss_r__d", "d"),
    ("layernorm", {"S": 24, "D": 96}, "sm_mu__d", "d"),
    ("layernorm", {"S": 24, "D": 96}, "xc_vs__d", "d"),
    ("layernorm", {"S": 24, "D": 96}, "sm_mu", "s"),
])
def test_kernels_along_either_dimension_run_and_match(
        name: str, sizes: dict[str, int], kernel: str, vector: str, tmp_path: Path) -> None:
    """Forced (`--fix fuse.<kernel>=1`): verified, emitted as C vectorised along the
    kernel's dimension (96 is not whole vectors of 64 bytes' lanes: ragged tails), and
    matching the reference."""
    workload = load_workload(name, sizes)
    hw = load_hardware("cpu")
    model = encode(workload, hw, fixes=(f"fuse.{kernel}=1",))
    result = solve(model.constraints)
    assert result.status is Status.OPTIMAL and result.env is not None, result.status
    program = materialize(model, dict(result.env))
    [chosen] = [k for k in program.kernels if k.name == kernel]
    assert chosen.vector == vector
    verify(program, workload, hw)
    inputs = make_inputs(workload, 0)
    expected, bounds = evaluate_errors(workload, inputs)
    emit_c(program, workload, hw, tmp_path, inputs, expected, bounds)
    assert f"kernel {kernel}: " in (tmp_path / "kernels.c").read_text()
    assert f"vectorised along {vector}" in (tmp_path / "kernels.c").read_text()
    check = check_c(tmp_path, time_runs=False)
    assert check.built and check.passed, check.log


def test_a_random_cover_runs_each_statement_once_and_varies_with_the_seed() -> None:
    """`decompose.random_cover`, the sampler's fallback: every statement in exactly one
    chosen kernel, and another seed draws another cover (layernorm's 22 candidates)."""
    model = encode(load_workload("layernorm", {}), load_hardware("cpu"))
    cset = model.constraints
    names = [n for n in cset.decisions if is_fusion_decision(n)]
    covers = set()
    for seed in range(6):
        chosen = random_cover(cset, names, random.Random(seed))
        assert chosen is not None
        kernels = [k for k in model.kernels if chosen.get(fusion_decision(k.name), 1)]
        ran = sorted(s.name for k in kernels for s in k.statements)
        assert ran == sorted(s.name for s in model.workload.statements)
        covers.add(tuple(sorted(k.name for k in kernels)))
        cover = with_fusion(cset, chosen)
        assert cover is not None and all(cover.decisions[n] == (chosen[n],) for n in names)
    assert len(covers) > 1


def test_attention_at_1024_has_random_schedules() -> None:
    """The joint draw finds none within its work limit (16 candidate kernels in one
    part); drawn cover first, each seed gives a legal schedule, not all the same."""
    model = encode(load_workload("attention", {"S": 1024, "D": 64}), load_hardware("cpu"))
    envs = [random_schedule(model.constraints, seed) for seed in range(3)]
    assert all(env is not None and not model.constraints.violated(env) for env in envs)
    assert len({tuple(sorted(env.items())) for env in envs if env is not None}) > 1
