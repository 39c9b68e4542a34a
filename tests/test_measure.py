"""`synth solve --measure K`: the K best distinct schedules under the model, each run as
C and timed; the fastest measured is the result. No test judges a time: the tests check
which schedules are measured, the report's shape, Spearman's arithmetic and the exit
codes (a failing check is provoked by replacing the timing function)."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import TWO_CORES, Case, benchmark_module, forced
from typer.testing import CliRunner

import synth.constraints.cpsat
import synth.constraints.sample
import synth.hwfile
import synth.pipeline
from synth import measure
from synth.cli import app
from synth.constraints import expr as ex
from synth.constraints.result import Status
from synth.constraints.space import is_fusion_decision
from synth.emit.c import translation_units
from synth.emit.c_check import check_c
from synth.measure import Measured, Timing, exclusion, next_best, ranks, relevant, spearman
from synth.pipeline import Outcome, Request, run
from synth.render import measured_line, spearman_text

SOFTMAX = {"N": 4096}


def invoke(*args: str) -> Any:
    return CliRunner().invoke(app, list(args))


@pytest.fixture(scope="module")
def measured() -> Outcome:
    return run(Request("softmax", "cpu", SOFTMAX, ("core.count=1..2",), validate=False,
                       measure=3))


def test_measure_returns_k_distinct_schedules_best_first(measured: Outcome) -> None:
    result = measured.measured
    assert result is not None and result.passed
    schedules = result.schedules
    assert [s.rank for s in schedules] == [1, 2, 3]
    assert schedules[0].source == "optimum"
    modelled = [s.modelled_ps for s in schedules]
    assert modelled == sorted(modelled)
    assert len({tuple(sorted(s.variables.items())) for s in schedules}) == 3
    assert all(s.measured_s is not None and s.measured_s > 0 for s in schedules)
    # the result is the fastest measured; the optimum stays in the report
    assert result.chosen == min(schedules, key=lambda s: (s.measured_s, s.rank)).rank
    chosen = result.schedule(result.chosen)
    assert measured.result.env == chosen.env
    assert measured.result.objective == chosen.modelled_ps
    expected = Status.OPTIMAL if result.chosen == 1 else Status.FEASIBLE
    assert measured.result.status is expected


def test_relevant_leaves_out_unused_kernels(measured: Outcome) -> None:
    env = measured.result.env
    assert env is not None
    used = {k.name for k in measured.model.selected(env)}
    unused = {k.name for k in measured.model.kernels} - used
    assert unused  # softmax has fusion candidates the schedule does not use
    names = relevant(measured.model, env)
    assert not [n for n in names if n.split(".")[1:2] and n.split(".")[1] in unused
                and not n.startswith("fuse.")]
    assert any(n.startswith("fuse.") for n in names)


# wall clock far away, deterministic work limits: the verdict does not depend on the load
NO_CLOCK_S, WORK_S = 3600.0, 30.0


@pytest.mark.parametrize(("workload", "hw", "sizes"), [
    ("softmax", "upmem", {"N": 65536}), ("mv", "upmem", {"M": 256, "N": 512}),
    ("attention", "cpu", {"S": 64, "D": 16})])
def test_next_best_is_the_order_of_one_solve_per_schedule(
        workload: str, hw: str, sizes: dict[str, int]) -> None:
    """Lawler's pieces give the same costs in the same order as solving again with every
    earlier schedule excluded, and never the same relevant decisions twice."""
    outcome = run(Request(workload, hw, sizes, validate=False))
    model, first = outcome.model, outcome.result
    assert first.env is not None and first.objective is not None
    k = 6
    lawler = []
    for env in next_best(model, first, NO_CLOCK_S, lambda _: None, WORK_S):
        lawler.append(env)
        if len(lawler) == k:
            break
    one_by_one, excluded = [first.objective], [exclusion(relevant(model, first.env), 1)]
    while len(one_by_one) < k:
        cset = dataclasses.replace(model.constraints, constraints=(
            *model.constraints.constraints, *excluded))
        result = synth.constraints.cpsat.solve(cset, NO_CLOCK_S, work_limit_s=WORK_S)
        assert result.status is Status.OPTIMAL
        assert result.env is not None and result.objective is not None
        one_by_one.append(result.objective)
        excluded.append(exclusion(relevant(model, result.env), len(excluded) + 1))
    costs = [ex.evaluate(model.constraints.objective, env) for env in lawler]
    assert costs == one_by_one
    distinct = {tuple(sorted(relevant(model, env).items())) for env in lawler}
    assert len(distinct) == k


def test_next_best_solves_the_pieces_that_fix_the_most_first(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Of pieces with one lower bound, the last made is solved first: it keeps the
    schedule's fusion (one cover), while the first made, another fusion, is one problem
    over every cover (the transformer block's took 11 s)."""
    outcome = run(Request("attention", "cpu", {"S": 64, "D": 16}, validate=False))
    model, first = outcome.model, outcome.result
    assert first.env is not None
    solved: list[bool] = []  # whether each piece solved keeps the fusion
    original = synth.constraints.cpsat.solve

    def spy(cset: Any, *args: Any, **kwargs: Any) -> Any:
        solved.append(any(c.group == "measure.fixed" and is_fusion_decision(
            next(iter(ex.variables(c.cond)))) for c in cset.constraints))
        return original(cset, *args, **kwargs)

    monkeypatch.setattr(measure.cpsat, "solve", spy)
    found = list(itertools.islice(
        next_best(model, first, NO_CLOCK_S, lambda _: None, WORK_S), 3))
    assert len(found) == 3 and solved and solved[0]


def test_measure_json(tmp_path: Path) -> None:
    result = invoke("solve", "softmax", "--hw", "cpu", "--set", "N=4096", "--hw-set",
                    "core.count=1..2", "--measure", "2", "--no-validate", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)["measured"]
    assert set(data) >= {"schedules", "spearman", "chosen", "load_average"}
    assert len(data["schedules"]) == 2
    for entry in data["schedules"]:
        assert set(entry) >= {"rank", "modelled_s", "measured_s", "variables"}
    assert data["chosen"] in (1, 2)
    assert data["spearman"] is None or -1 <= data["spearman"] <= 1


def test_measure_human_output() -> None:
    result = invoke("solve", "softmax", "--hw", "cpu", "--set", "N=4096", "--hw-set",
                    "core.count=1..2", "--measure", "2", "--no-validate")
    assert result.exit_code == 0, result.output
    assert "Measured: the 2 best schedules under the model" in result.stdout
    assert "Spearman (modelled vs measured, 2 schedules)" in result.stdout


def test_without_measure_the_report_has_null() -> None:
    result = invoke("solve", "softmax", "--hw", "cpu", "--set", "N=4096", "--no-validate",
                    "--json")
    assert json.loads(result.stdout)["measured"] is None


@pytest.mark.parametrize("k", ["0", "65", "two", "-1"])
def test_bad_k_is_exit_2(k: str) -> None:
    result = invoke("solve", "softmax", "--hw", "cpu", "--measure", k)
    assert result.exit_code == 2, result.output
    assert "--measure" in result.output


def test_measure_off_cpu_is_exit_2_before_solving(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_solve(*args: Any) -> Any:
        raise AssertionError("solved")

    monkeypatch.setattr(synth.pipeline, "solve", no_solve)
    result = invoke("solve", "softmax", "--hw", "upmem", "--measure", "2")
    assert result.exit_code == 2, result.output
    assert "--measure times schedules as C on this machine's cores" in result.output


def test_a_failed_check_is_exit_4(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[Path] = []

    def fake(out_dir: Path, quick: bool = True) -> Timing:
        assert (out_dir / "libsynth.so").exists()  # built before any is timed
        calls.append(out_dir)
        if out_dir.name == "rank2":
            return Timing(False, None, "y: DIFFERS from the reference")
        return Timing(True, 1.0 / len(calls), "")

    monkeypatch.setattr(measure, "time_emitted", fake)
    result = invoke("solve", "softmax", "--hw", "cpu", "--set", "N=4096", "--hw-set",
                    "core.count=1..2", "--measure", "3", "--no-validate", "--json")
    assert result.exit_code == 4, result.output
    data = json.loads(result.stdout)["measured"]
    assert [s["passed"] for s in data["schedules"]] == [True, False, True]
    assert data["schedules"][1]["measured_s"] is None
    assert data["chosen"] == 3  # the fastest of those that ran


def test_spearman_of_known_rankings() -> None:
    assert spearman([1, 2, 3, 4, 5], [10, 20, 30, 40, 50]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4, 5], [5, 4, 3, 2, 1]) == pytest.approx(-1.0)
    # one swap among 5: 1 - 6 * sum(d^2) / (n (n^2 - 1)) = 1 - 6 * 2 / 120
    assert spearman([1, 2, 3, 4, 5], [1, 3, 2, 4, 5]) == pytest.approx(0.9)
    # ties share their mean rank: x ranks 1, 2.5, 2.5, 4 against 1, 2, 3, 4
    assert ranks([1, 2, 2, 3]) == [1.0, 2.5, 2.5, 4.0]
    assert spearman([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(4.5 / math.sqrt(22.5))
    assert spearman([1], [2]) is None
    assert spearman([1, 1, 1], [1, 2, 3]) is None
    with pytest.raises(ValueError):
        spearman([1, 2], [1])


def test_the_solvers_schedule_need_not_be_rank_1() -> None:
    """With --solver greedy the first schedule is greedy's, which CP-SAT's next best may
    beat under the model: it is labelled as greedy's and ranked by its modelled time."""
    outcome = run(Request("softmax", "cpu", SOFTMAX, ("core.count=1..2",), solver="greedy",
                          validate=False, measure=2))
    result = outcome.measured
    assert result is not None and result.chosen is not None
    sources = [s.source for s in result.schedules]
    assert "greedy's" in sources and "optimum" not in sources
    modelled = [s.modelled_ps for s in result.schedules]
    assert modelled == sorted(modelled)
    assert outcome.result.env == result.schedule(result.chosen).env


def test_cost_fidelity_summary() -> None:
    """benchmarks/cost_fidelity.py's per-workload numbers, on made-up times."""
    fidelity = benchmark_module("cost_fidelity")
    points = tuple(fidelity.Point(source, modelled, measured, measured is not None, {})
                   for source, modelled, measured in (
                       ("optimum", 1.0, 3.0), ("greedy", 2.0, 2.0), ("sample 0", 3.0, 4.0),
                       ("sample 1", 4.0, None)))
    problem = fidelity.Problem("p", {"N": 1}, points, 0.0, 0.0)
    assert len(problem.ran()) == 3
    assert problem.optimum_rank() == 2  # greedy ran faster
    assert problem.optimum_ratio() == pytest.approx(1.5)
    assert problem.spearman() == pytest.approx(spearman([1, 2, 3], [3, 2, 4]))
    assert set(problem.json()) >= {"spearman", "optimum_rank", "optimum_over_fastest"}
    # the problems, and a GEMM whose weight is past the L3
    assert set(fidelity.PROBLEMS) == {"matmul-512", "matmul-1024x512x2048", "softmax-2^20",
                                      "rownorm", "attention-256", "attention-1024", "fa6",
                                      "matmul-16x4096x4096"}
    assert problem.first_pass_spearman() is None  # no first timings given
    timed = fidelity.Problem("p", {"N": 1}, tuple(
        dataclasses.replace(p, first_pass_s=first)
        for p, first in zip(points, (1.0, 2.0, 3.0, None), strict=True)), 0.0, 0.0)
    assert timed.first_pass_spearman() == pytest.approx(1.0)
    assert timed.spearman() == problem.spearman()


def test_cost_fidelity_spearman_interval() -> None:
    """The bootstrap interval holds the Spearman, is one point for a perfect ranking,
    widens with a misranked pair, and is the same on every call (seeded)."""
    fidelity = benchmark_module("cost_fidelity")
    modelled = [float(k) for k in range(20)]
    assert fidelity.spearman_interval(modelled, [2.0 * m for m in modelled]) == (1.0, 1.0)
    measured = [*modelled[:5], 9.5, *modelled[6:9], 5.5, *modelled[10:]]  # 5 and 9 swapped
    low, high = fidelity.spearman_interval(modelled, measured)
    assert low < spearman(modelled, measured) <= high <= 1.0 and low > 0.5
    assert fidelity.spearman_interval(modelled, measured) == (low, high)
    assert fidelity.spearman_interval([1.0, 2.0], [1.0, 2.0]) is None


def test_cost_fidelity_interleaved_rounds(tmp_path: Path) -> None:
    """Two schedules of one workload, built, timed in one child over interleaved rounds:
    a positive median each, in their order."""
    from test_emit_c import assert_passes, emit_and_check

    from synth.ir.materialize import materialize
    from synth.lang import parse_workload
    fidelity = benchmark_module("cost_fidelity")
    workload = parse_workload("size N = 4096\nin x : f32[N]\nout y : f32[N]\n"
                              "y[i] = x[i] * 2\n", "<test>", "w")
    model = synth.pipeline.encode(workload, synth.hwfile.load_hardware("cpu"))
    dirs = []
    for seed in (0, 1):
        env = synth.constraints.sample.random_schedule(model.constraints, seed)
        assert env is not None
        dirs.append(tmp_path / str(seed))
        assert_passes(emit_and_check(materialize(model, env), workload, dirs[-1]))
    medians = fidelity.interleaved(dirs, 3, True, placements=2)
    assert len(medians) == 2 and all(m > 0 for m in medians)


def test_cost_fidelity_places_the_tensors_at_other_offsets() -> None:
    """Each placement but the first copies every tensor to another offset within a page,
    on a cache line, other than the other tensors' and the other placements'."""
    fidelity = benchmark_module("cost_fidelity")
    tensors = [np.arange(5000, dtype=np.float32) + k for k in range(3)]
    assert fidelity.placed(tensors, 0) is tensors
    offsets = set()
    for placement in (1, 2):
        copies = fidelity.placed(tensors, placement)
        for tensor, copy in zip(tensors, copies, strict=True):
            assert np.array_equal(tensor, copy) and copy.ctypes.data % 64 == 0
            offsets.add(copy.ctypes.data % fidelity.PAGE)
    assert len(offsets) == 6


def test_c_vs_numpy_ratios() -> None:
    c_vs_numpy = benchmark_module("c_vs_numpy")
    row = c_vs_numpy.Row("x", "N=1", True, 2.0, 4.0, 1.0)
    assert row.vs_numpy == pytest.approx(2.0) and row.vs_blas == pytest.approx(0.5)
    assert c_vs_numpy.Row("x", "N=1", False, None, 4.0).vs_numpy is None


def test_quick_timing_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    """--measure's timing: no extra warm-up (the checking call was one) and the given
    number of runs; the default keeps a warm-up and at least MIN_RUNS."""
    from synth.emit import c_check

    monkeypatch.setattr(c_check, "TIMING_BUDGET_S", 0.0)
    calls: list[int] = []
    c_check.median_time(lambda: calls.append(1), False, c_check.QUICK_RUNS)
    assert len(calls) == c_check.QUICK_RUNS
    calls.clear()
    c_check.median_time(lambda: calls.append(1))
    assert len(calls) == 1 + c_check.MIN_RUNS


TWO_KERNELS = ("size N = 4096\nin x : f32[N]\nout y : f32[N]\nout z : f32[N]\n"
               "y[i] = x[i] * 2.0\nz[i] = x[i] + 1.0\n")


def test_schedules_that_share_a_kernel_compile_it_once(tmp_path: Path) -> None:
    """`build_all` builds each schedule from a file per kernel: the kernel two schedules
    share is compiled once, and each library passes the check as kernels.c's would."""
    case = Case.of("two", "cpu", {}, TWO_CORES, text=TWO_KERNELS)
    built, first = forced(case, "fuse.y=1", "fuse.z=1", "V.z.i=16")
    _, second = forced(case, "fuse.y=1", "fuse.z=1", "V.z.i=64")
    assert [k.name for k in first.kernels] == [k.name for k in second.kernels] == ["y", "z"]
    units = [translation_units(p, built.workload, built.hw) for p in (first, second)]
    assert units[0]["kernel0.c"] == units[1]["kernel0.c"]  # kernel y: the same schedule
    assert units[0]["kernel1.c"] != units[1]["kernel1.c"]
    dirs = [tmp_path / "a", tmp_path / "b"]
    measure.build_all(list(zip((first, second), dirs, strict=True)), built.workload,
                      built.hw, measure.reference_data(built.workload), tmp_path / "objects")
    # y's file once, z's two, the driver's once (it calls the same kernels)
    assert len(list((tmp_path / "objects").glob("*.o"))) == 4
    for out in dirs:
        built_at = (out / "libsynth.so").stat().st_mtime_ns
        check = check_c(out, time_runs=False)
        assert check.passed, check.log[-2000:]
        assert (out / "libsynth.so").stat().st_mtime_ns == built_at  # make found it built


def test_a_missing_spearman_says_why() -> None:
    def schedules(*pairs: tuple[int, float | None]) -> Measured:
        rows = tuple(measure.MeasuredSchedule(rank, "next best", modelled, seconds,
                                              seconds is not None, {}, {})
                     for rank, (modelled, seconds) in enumerate(pairs, 1))
        ran = [(s.modelled_s, s.measured_s) for s in rows if s.measured_s is not None]
        rho = spearman([m for m, _ in ran], [t or 0.0 for _, t in ran])
        return Measured(rows, rho, 1, 1.0, len(rows))

    assert spearman_text(schedules((1, 1.0), (2, 2.0), (3, 3.0))) == "1.00"
    assert spearman_text(schedules((1, 1.0), (2, None))) == "n/a (fewer than two ran)"
    assert spearman_text(schedules((5, 1.0), (5, 2.0), (5, 1.5))) == (
        "n/a (the model prices them all the same)")
    assert spearman_text(schedules((1, 2.0), (2, 2.0))) == "n/a (they all ran in the same time)"
    assert "n/a (the model prices them all the same)" in measured_line(
        schedules((5, 1.0), (5, 2.0)))
