"""Issue 15: an online kernel's pass split across UPMEM tasklets (FlashDecoding's
split-KV combine). Each tasklet runs the pass over its share of the keys into its own
partial running statistics; an `OnlineCombine` merges them, each rescaled to the common
maximum. Checked: the interpreter's merge against NumPy on random splits (scores where a
naive exp overflows), a split schedule through verifier, prover, interpreter and the
emitted UPMEM C, the same schedule with plain combines instead of the merge caught by
every check, the solver choosing the split where it pays, and a split the emitters cannot
follow refused with its reason."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from conftest import SMALL_UPMEM, TWO_CORES, Built, Case, build, forced, solve
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from synth.cli import app
from synth.constraints.result import Status
from synth.constraints.user import user_constraints
from synth.emit.upmem import check_upmem, emit_upmem
from synth.errors import IRError
from synth.ir.interpret import BufferState, interpret
from synth.ir.nodes import (
    Affine,
    BufferDecl,
    Combine,
    Kernel,
    Loop,
    MergedSum,
    Node,
    OnlineCombine,
    Program,
    walk,
)
from synth.ir.online_merge import run_online_combine
from synth.ir.prove import prove
from synth.ir.verify import verify
from synth.reference import evaluate_errors, make_inputs
from synth.workload import DType, ReduceOp, Workload

needs_make = pytest.mark.skipif(shutil.which("cc") is None or shutil.which("make") is None,
                                reason="needs a C compiler and make")

ATTENTION = Case.of("attention", "upmem", {"S": 64, "D": 16}, SMALL_UPMEM)
# the tasklets split the pass, the DPUs and ranks do not (their split, merged on the
# host, is tests/test_online_hostmerge.py's)
SPLIT = ("online.s_m_p_l_o=1", "T.s_m_p_l_o.j=4", "D.s_m_p_l_o.j=1", "R.s_m_p_l_o.j=1")
LSE_TEXT = """size N = 4
size M = 64
in x : f32[N, M]
out y : f32[N]
m[n] max= x[n, j]
l[n] += exp((x[n, j] - m[n]) * 0.5)
y[n] = m[n] + log(l[n]) * 2.0
"""
LSE = Case.of("lse", "upmem", {}, SMALL_UPMEM, text=LSE_TEXT)
LSE_SPLIT = ("online.m_l=1", "T.m_l.j=4", "D.m_l.j=1", "R.m_l.j=1")


def large(workload: Workload) -> dict[str, np.ndarray]:
    """Inputs whose exponents reach hundreds: a naive exp of them overflows float32."""
    inputs = make_inputs(workload)
    for name, factor in {"Q": 12.0, "K": 12.0, "x": 300.0}.items():
        if name in inputs:
            inputs[name] = (inputs[name] * factor).astype(np.float32)
    return inputs


# ---------------------------------------------------------------- the merge itself


def _decl(name: str, dims: tuple[str, ...], shape: tuple[int, ...],
          partial: bool = False) -> BufferDecl:
    return BufferDecl(name, name.split("_")[0], "wram", dims, shape,
                      tuple(Affine() for _ in dims), DType.F32,
                      ("t_j",) if partial else ())


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(st.integers(1, 4), st.integers(1, 40), st.integers(1, 5), st.integers(0, 2**31 - 1),
       st.sampled_from([1.0, 300.0, 1e4]), st.booleans())
def test_the_merge_of_random_splits_matches_numpy(rows: int, keys: int, parts: int,
                                                   seed: int, magnitude: float,
                                                   before: bool) -> None:
    """Scores of `magnitude` split at random points into `parts` shares (some empty: a
    unit that saw no key holds -inf and zeros), each share's running maximum, sum of
    exponentials and weighted sum of values computed as a unit would; merged, they equal
    softmax statistics over all the keys (exp(s - max) in float64). `before`: the tile
    merged into already holds a share of its own."""
    rng = np.random.default_rng(seed)
    scores = rng.standard_normal((rows, keys)) * magnitude
    values = rng.standard_normal((keys, 3))
    cuts = np.sort(rng.integers(0, keys + 1, size=parts - 1))
    shares = np.split(np.arange(keys), cuts)
    first, shares = (shares[0], shares[1:]) if before else (np.arange(0), shares)
    if not shares:
        shares = [np.arange(0)]

    def stats(share: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if share.size == 0:
            return np.full(rows, -np.inf), np.zeros(rows), np.zeros((rows, 3))
        part = scores[:, share]
        top = part.max(axis=1)
        weights = np.exp(part - top[:, None])
        return top, weights.sum(axis=1), weights @ values[share]

    each = [stats(s) for s in shares]
    mine = stats(first)
    states = {}
    for name, dims, shape, value, partial in (
            ("m_mram", ("i",), (rows,), mine[0], False),
            ("l_mram", ("i",), (rows,), mine[1], False),
            ("o_mram", ("i", "e"), (rows, 3), mine[2], False),
            ("m_combine", ("i",), (rows,), np.stack([e[0] for e in each]), True),
            ("l_combine", ("i",), (rows,), np.stack([e[1] for e in each]), True),
            ("o_combine", ("e", "i"), (3, rows),
             np.stack([e[2].T for e in each]), True)):  # o's partials transposed
        array = np.asarray(value, dtype=np.float32)
        states[name] = BufferState(_decl(name, dims, shape, partial), array,
                                   np.ones(array.shape, dtype=bool), ())
    node = OnlineCombine("m_mram", "m_combine", (MergedSum("l_mram", "l_combine", -1.0),
                                                 MergedSum("o_mram", "o_combine", -1.0)))
    with np.errstate(over="ignore"):
        run_online_combine(SimpleNamespace(buffers=states), node)  # type: ignore[arg-type]
    top = scores.max(axis=1)
    weights = np.exp(scores - top[:, None])
    np.testing.assert_allclose(states["m_mram"].values, top.astype(np.float32))
    np.testing.assert_allclose(states["l_mram"].values, weights.sum(axis=1), rtol=1e-5)
    np.testing.assert_allclose(states["o_mram"].values, weights @ values, rtol=1e-4,
                               atol=1e-4 * float(np.abs(values).sum()))


# ---------------------------------------------------------------- a split schedule


def _merges(program: Program) -> list[OnlineCombine]:
    return [n for k in program.kernels for n in walk(k.body) if isinstance(n, OnlineCombine)]


# S = 40 padded to 64 keys in blocks of 16: the fourth tasklet's keys are all padding (its
# partial maximum -inf, its sums 0), the third's half
PADDED = Case.of("attention", "upmem", {"S": 40, "D": 16}, SMALL_UPMEM)


@needs_make
@pytest.mark.parametrize(("case", "fixes"), [
    (ATTENTION, SPLIT), (LSE, LSE_SPLIT), (PADDED, (*SPLIT, "Q.s_m_p_l_o.j=16"))],
    ids=["attention", "log-sum-exp", "attention-padded"])
def test_a_split_pass_validates_everywhere(tmp_path: Path, case: Case,
                                           fixes: tuple[str, ...]) -> None:
    built, program = forced(case, *fixes)
    merges = _merges(program)
    assert len(merges) == 1 and merges[0].sums
    kernel = next(k for k in program.kernels if any(isinstance(n, OnlineCombine)
                                                    for n in walk(k.body)))
    tasklets = [n for n in walk(kernel.body) if isinstance(n, Loop)
                and n.var.where == "tasklet" and n.var.dim == "j"]
    assert len(tasklets) == 1 and tasklets[0].var.extent == 4
    assert not any(isinstance(n, Combine) for n in walk(kernel.body))
    every_check_passes(built, program, tmp_path)
    assert "partial running statistics" in (tmp_path / f"dpu_{kernel.name}.c").read_text()


def every_check_passes(built: Built, program: Program, tmp_path: Path) -> None:
    """The verifier, the prover, the interpreter on large scores (against NumPy) and
    the emitted UPMEM C's `make check` all accept `program`."""
    verify(program, built.workload, built.hw)
    assert prove(program, built.workload, built.hw).proved
    inputs = large(built.workload)
    expected, bounds = evaluate_errors(built.workload, inputs)
    got = interpret(program, built.workload, inputs)
    for name, value in got.items():
        np.testing.assert_allclose(value, expected[name], rtol=2e-4, atol=2e-5)
    emit_upmem(program, built.workload, built.hw, tmp_path, inputs, expected, bounds)
    check = check_upmem(tmp_path)
    assert check.passed, check.log[-3000:]


def plain_combines(program: Program) -> Program:
    """`program` with each merge replaced by plain combines (max of the maxima, sums of
    the sums): the merge without its rescale."""
    def swap(body: tuple[Node, ...]) -> tuple[Node, ...]:
        out: list[Node] = []
        for n in body:
            if isinstance(n, Loop):
                out.append(Loop(n.var, swap(n.body)))
            elif isinstance(n, OnlineCombine):
                out += [Combine(s.target, s.partials, ReduceOp.ADD) for s in n.sums]
                out.append(Combine(n.running, n.partials, ReduceOp.MAX))
            else:
                out.append(n)
        return tuple(out)

    kernels = tuple(dataclasses.replace(k, body=swap(k.body)) for k in program.kernels)
    return dataclasses.replace(program, kernels=kernels)


def test_the_merge_without_its_rescale_fails_every_check(tmp_path: Path) -> None:
    built, program = forced(ATTENTION, *SPLIT)
    every_check_fails(built, plain_combines(program), tmp_path)


def every_check_fails(built: Built, broken: Program, tmp_path: Path) -> None:
    """The verifier, the prover, the interpreter on large scores and the emitted UPMEM
    C's `make check` each catch `broken` (an online merge replaced by plain combines)."""
    with pytest.raises(IRError, match="merged by an online combine"):
        verify(broken, built.workload, built.hw)
    assert not prove(broken, built.workload, built.hw).proved
    inputs = large(built.workload)
    expected, bounds = evaluate_errors(built.workload, inputs)
    got = interpret(broken, built.workload, inputs)["O"]
    assert not np.allclose(got, expected["O"], rtol=1e-2, atol=1e-3)
    if shutil.which("cc") and shutil.which("make"):
        emit_upmem(broken, built.workload, built.hw, tmp_path, inputs, expected, bounds)
        check = check_upmem(tmp_path)
        assert not check.passed
        assert "the outputs differ from the reference" in check.log


def test_a_merge_of_partials_shaped_otherwise_is_refused() -> None:
    built, program = forced(ATTENTION, *SPLIT)
    merge = _merges(program)[0]
    odd = dataclasses.replace(merge, sums=(dataclasses.replace(
        merge.sums[0], partials=merge.sums[1].partials), merge.sums[1]))

    def swap(body: tuple[Node, ...]) -> tuple[Node, ...]:
        return tuple(Loop(n.var, swap(n.body)) if isinstance(n, Loop)
                     else odd if n == merge else n for n in body)

    kernels = tuple(Kernel(k.name, k.statements, swap(k.body), k.vector)
                    for k in program.kernels)
    with pytest.raises(IRError, match="expected .* shaped as"):
        verify(dataclasses.replace(program, kernels=kernels), built.workload, built.hw)


# ---------------------------------------------------------------- the solver's choice

# decoding: 4 query rows against 512 keys, on one DPU of up to 8 tasklets whose float
# arithmetic is cheap (a DPU with a float unit; the built-in model emulates floats in
# hundreds of cycles, so there compute hides what the split saves)
DECODE_TEXT = """size N = 4
size S = 512
size D = 16
in  Q : f32[N, D]
in  K : f32[S, D]
in  V : f32[S, D]
out O : f32[N, D]
s[i, j] += Q[i, d] * K[j, d]
m[i]   max= s[i, j]
p[i, j]  = exp(s[i, j] - m[i])
l[i]    += p[i, j]
o[i, e] += p[i, j] * V[j, e]
O[i, e]  = o[i, e] / l[i]
"""
FLOAT_UNIT = ("rank.count=1", "dpu.count=1", "tasklet.count=1..8",
              "compute.cycles.f32.exp=20", "compute.cycles.f32.mul=2",
              "compute.cycles.f32.add=2", "compute.cycles.f32.max=2")
DECODE = Case.of("decode", "upmem", {}, FLOAT_UNIT, text=DECODE_TEXT)


def test_the_solver_splits_the_pass_where_it_pays() -> None:
    """With few rows, the online kernel's rows alone keep few tasklets busy: the free
    solve runs it with its keys split across tasklets and merged, and that schedule costs
    less than the best one whose pass runs in one tasklet."""
    built = build(DECODE)
    result = solve(built.model.constraints)
    assert result.status is Status.OPTIMAL and result.env is not None
    env = result.env
    assert env["online.s_m_p_l_o"] == 1
    assert env["T.s_m_p_l_o.j"] > 1 and env["combine.s_m_p_l_o.tasklet"] == 1
    extra = user_constraints(built.model, ["T.s_m_p_l_o.j <= 1"], [])
    whole = solve(dataclasses.replace(built.model.constraints, constraints=(
        *built.model.constraints.constraints, *extra)))
    assert whole.objective is not None and result.objective is not None
    assert whole.objective > result.objective


def test_a_split_on_a_cpu_is_refused_with_its_reason() -> None:
    args = ["solve", "attention", "--hw", "cpu", "--set", "S=64", "--set", "D=16",
            "--hw-set", TWO_CORES[0], "--fix", "online.s_m_p_l_o=1",
            "--fix", "P.s_m_p_l_o.j=2", "--no-validate"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1, result.output
    assert "online.split" in result.output
    assert "the pass over j runs in one core unit" in result.output


def test_emit_mlir_keeps_an_online_pass_in_one_tasklet(tmp_path: Path) -> None:
    """The MLIR emitter writes no merge: with `--emit mlir` on upmem the split is refused
    before solving, by the group online.split with its reason."""
    args = ["solve", "attention", "--hw", "upmem", "--set", "S=64", "--set", "D=16",
            "--fix", "online.s_m_p_l_o=1", "--fix", "T.s_m_p_l_o.j=4", "--emit", "mlir",
            "--out", str(tmp_path), "--no-validate",
            # few units: the refusal is the same, its explanation's checks are cheaper
            *(arg for unit in SMALL_UPMEM for arg in ("--hw-set", unit))]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1, result.output
    assert "--emit mlir: that emitter does not merge partial running statistics" \
        in result.output
