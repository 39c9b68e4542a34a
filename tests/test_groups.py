"""Named constraint groups: --constraint, --fix, --drop, --show-constraints, explanations
of infeasible requests (minimal sets of conflicting groups) and binding groups."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest
from typer.testing import CliRunner

from synth import pipeline
from synth.cli import app
from synth.constraints import explain, user
from synth.constraints.result import Status
from synth.errors import InputError

SOFTMAX = ("softmax", "upmem", {"N": 4096})


def invoke(*args: str) -> Any:
    return CliRunner().invoke(app, list(args))


def request(workload: str = "softmax", hw: str = "upmem", sizes: dict[str, int] | None = None,
            **kw: Any) -> pipeline.Request:
    return pipeline.Request(workload, hw, {"N": 4096} if sizes is None else sizes,
                            validate=False, **kw)


# ---------------------------------------------------------------- infeasible, per family


@dataclass(frozen=True)
class Infeasible:
    name: str
    request: pipeline.Request
    groups: frozenset[str]  # the minimal conflicting set expected
    words: tuple[str, ...] = ()  # the message must contain these


CASES = [
    Infeasible("capacity", request(hw_overrides=("wram.capacity=2056",)),
               frozenset({"capacity.wram"}), ("8 B usable",)),
    Infeasible("transfer", request(hw_overrides=("wram.transfer.min=16B",)),
               frozenset({"transfer.wram"}), ("at least 16 B", "m into wram")),
    Infeasible("capacity+transfer",
               request("va", hw_overrides=("wram.transfer.min=1KiB", "wram.reserved=62KiB")),
               frozenset({"capacity.wram", "transfer.wram"}), ("2048 B usable", "1024 B")),
    Infeasible("count", request("matmul", sizes={"M": 64, "N": 64, "K": 64},
                                fixes=("T.C#2.m=16", "T.C#2.n=2", "fuse.C#1_C#2=0")),
               frozenset({"count.tasklet", "user.fix.T.C#2.m", "user.fix.T.C#2.n",
                          "user.fix.fuse.C#1_C#2"}),
               ("kernel C#2: at most T <= 16",)),
    Infeasible("tiling", request(sizes={"N": 12}, fixes=("T.y.i=8", "Q.y.i=4")),
               frozenset({"tiling", "user.fix.T.y.i", "user.fix.Q.y.i"}),
               ("kernel y: tiles of i divide",)),
    Infeasible("user", request(constraints=("T >= 11", "T <= 4", "R >= 1")),
               frozenset({"user.1", "user.2"}), ("T >= 11", "T <= 4")),
    Infeasible("user alone", request(constraints=("T >= 17",)), frozenset({"user.1"})),
]


@pytest.fixture(scope="module")
def outcomes() -> dict[str, pipeline.Outcome]:
    return {case.name: pipeline.run(case.request) for case in CASES}


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_each_family_is_explained_by_a_minimal_set(
        case: Infeasible, outcomes: dict[str, pipeline.Outcome]) -> None:
    outcome = outcomes[case.name]
    assert outcome.result.status is Status.INFEASIBLE
    assert outcome.explanation is not None
    groups = {c.group for c in outcome.explanation}
    assert groups == case.groups
    assert "implied" not in groups
    from synth.report import infeasible_message
    message = infeasible_message(outcome)
    for word in (*case.groups, *case.words):
        assert word in message, word


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_dropping_any_group_of_an_explanation_makes_the_request_feasible(
        case: Infeasible, outcomes: dict[str, pipeline.Outcome]) -> None:
    """Through the pipeline (--drop) for every droppable group; `tiling` cannot be dropped
    (it defines the factors), so for it the explanation's own check says so."""
    explanation = outcomes[case.name].explanation or []
    model = outcomes[case.name].model
    checker = explain.Feasibility(model.constraints)
    for conflict in explanation:
        if conflict.group in user.UNDROPPABLE:
            rest = [g for g in checker.literals if g != conflict.group]
            assert checker.check(rest)[0] is Status.FEASIBLE, conflict.group
            continue
        without = pipeline.run(pipeline.Request(
            case.request.workload, case.request.hardware, case.request.sizes,
            case.request.hw_overrides, constraints=case.request.constraints,
            fixes=case.request.fixes, drops=(conflict.group,), validate=False))
        assert without.result.status is Status.OPTIMAL, conflict.group


def test_the_explanation_is_a_conflict_of_the_solver_itself() -> None:
    """Keeping only the explanation's groups (and the implied ones) is still infeasible."""
    outcome = pipeline.run(CASES[2].request)
    kept = {c.group for c in outcome.explanation or []} | {"implied"}
    cset = outcome.model.constraints
    drops = [g for g in user.group_names(cset) if g not in kept]
    again = pipeline.run(pipeline.Request(
        "va", "upmem", {"N": 4096}, CASES[2].request.hw_overrides, validate=False,
        drops=[d for d in drops if d not in user.UNDROPPABLE]))
    assert again.result.status is Status.INFEASIBLE


# ---------------------------------------------------------------- the example


def test_wram_capacity_4_names_the_wram_capacity_and_the_dma_minimum() -> None:
    args = ["solve", "softmax", "--hw", "upmem", "--hw-set", "wram.capacity=4"]
    result = invoke(*args)
    assert result.exit_code == 1, result.output
    assert "capacity.wram" in result.stdout
    assert "wram: 4 B per dpu, 2 KiB of it reserved, so -2044 B usable" in result.stdout
    assert "DMA minimum size" in result.stdout
    result = invoke(*args, "--json")
    assert result.exit_code == 1
    data = json.loads(result.stdout)
    assert data["status"] == "infeasible"
    groups = data["explanation"]["groups"]
    assert [g["group"] for g in groups] == ["capacity.wram"]
    assert "DMA minimum size" in groups[0]["facts"]
    assert "capacity.wram" in data["explanation"]["message"]
    assert data["binding"] is None


def test_a_group_that_never_holds_is_explained_without_a_solve(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Constraints whose terms' bounds already break them fail in every assignment: the
    cheap check names them, with no CP-SAT check per constraint of the group (fa6/upmem
    with a WRAM of 1 KiB: 0.5-0.7 s each)."""
    from synth.constraints import expr as ex
    from synth.constraints.space import ConstraintSet, NamedConstraint

    x, y = ex.Var("x"), ex.Var("y")
    cset = ConstraintSet({"x": (1, 2, 3), "y": (0, 1)}, {}, (
        NamedConstraint("g", "x at most 0", ex.Cmp(x, "<=", ex.ZERO)),
        NamedConstraint("g", "2x + y under 2", ex.Cmp(ex.add(ex.mul(2, x), y), "<", ex.const(2))),
        NamedConstraint("g", "y is 1", ex.Cmp(y, "==", ex.ONE)),
    ), x)
    checker = explain.Feasibility(cset)

    def no_solve(*args: object) -> None:
        raise AssertionError("a CP-SAT check")

    monkeypatch.setattr(explain.Feasibility, "_status", no_solve)
    assert checker.violated("g", []) == ("x at most 0", "2x + y under 2")


def test_an_explanation_asked_for_past_the_deadline_is_a_conflict_still(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`--time-limit` bounds the explanation too: past the deadline each check gets
    `LEAST_CHECK_S`, the set of groups is not shrunk further, and it still cannot hold
    together (the fa6 run of the fuzz corpus took 18 s of its 5 explaining why a WRAM of
    1 KiB fits nothing). The deadline here is already past, and a check's least time far
    more than it needs (0.06 s): no wall-clock verdict."""
    from synth.deadline import Deadline

    monkeypatch.setattr(explain, "LEAST_CHECK_S", 60.0)

    model = pipeline.run(request("softmax", hw_overrides=("wram.capacity=2056",))).model
    cset = model.constraints
    core = explain.minimal_core(cset, Deadline(0.0))
    assert core and set(core) <= {c.group for c in cset.constraints}
    checker = explain.Feasibility(cset)
    assert checker.check(list(core))[0] is Status.INFEASIBLE
    conflicts = explain.explain(cset, model.hw, Deadline(0.0))
    assert [c.info.group for c in conflicts] == list(core)
    assert all(c.violated for c in conflicts)  # the group's own meanings at least


# ---------------------------------------------------------------- user controls


def test_fix_sets_the_variable() -> None:
    outcome = pipeline.run(request(fixes=("T=8",)))
    assert outcome.result.env is not None and outcome.result.env["T"] == 8
    outcome = pipeline.run(request(fixes=("T=16",)))
    assert outcome.result.env is not None and outcome.result.env["T"] == 16


def test_fix_on_the_cli_shows_in_the_report() -> None:
    result = invoke("solve", "softmax", "--hw", "upmem", "--set", "N=4096", "--fix", "T=16",
                    "--fix", "Q.y.i=64", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["variables"]["T"] == 16 and data["variables"]["Q.y.i"] == 64


def test_constraint_is_respected_and_binds() -> None:
    free = pipeline.run(request())
    assert free.result.env is not None and free.result.env["T"] == 16
    limited = pipeline.run(request(constraints=("T <= 4", "R*D <= 256"), binding=True))
    env = limited.result.env
    assert env is not None and env["T"] <= 4 and env["R"] * env["D"] <= 256
    assert limited.result.objective is not None and free.result.objective is not None
    assert limited.result.objective > free.result.objective
    status = {g.group: g for g in limited.group_status or []}
    assert status["user.1"].binding is True and status["user.1"].tight
    assert status["user.1"].objective_without is not None
    assert status["user.1"].objective_without < limited.result.objective
    assert status["implied"].binding is None  # never re-solved without it


def test_constraint_with_hardware_parameters() -> None:
    outcome = pipeline.run(request(constraints=("(Q.y.i + 1) * 4 <= wram.usable - 63000",)))
    env = outcome.result.env
    assert env is not None and (env["Q.y.i"] + 1) * 4 <= 488


def test_constraint_t_at_least_11() -> None:
    result = invoke("solve", "softmax", "--hw", "upmem", "--set", "N=4096", "--constraint",
                    "T >= 11", "--constraint", "Q.y.i * 4 <= wram.usable - 8", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["variables"]["T"] >= 11
    assert [g["group"] for g in data["constraint_groups"]][-2:] == ["user.1", "user.2"]


def test_dropping_capacity_lets_a_too_small_wram_solve() -> None:
    args = ["solve", "softmax", "--hw", "upmem", "--set", "N=4096",
            "--hw-set", "wram.capacity=4"]
    assert invoke(*args).exit_code == 1
    result = invoke(*args, "--drop", "capacity.wram", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["validation"]["passed"]
    assert "capacity.wram" not in [g["group"] for g in data["constraint_groups"]]
    # a prefix drops every group under it
    outcome = pipeline.run(request(hw_overrides=("wram.capacity=4",), drops=("capacity",)))
    assert outcome.result.status is Status.OPTIMAL
    assert not any(g.startswith("capacity") for g in user.group_names(outcome.model.constraints))


def test_dropping_a_transfer_group_relaxes_the_rule() -> None:
    outcome = pipeline.run(request(hw_overrides=("wram.transfer.min=16B",),
                                   drops=("transfer.wram",)))
    assert outcome.result.status is Status.OPTIMAL


@pytest.mark.parametrize(("args", "names"), [
    (["--constraint", "Tt >= 11"], ["'Tt'", "did you mean T"]),
    (["--constraint", "wram.capacty >= 1"], ["'wram.capacty'", "wram.capacity"]),
    (["--constraint", "Q.y.j <= 4"], ["'Q.y.j'", "Q.y.i"]),
    (["--constraint", "T >= 1 >= 0"], ["one comparison"]),
    (["--constraint", "T + >= 3"], ["expected a number, a name or '('"]),
    (["--constraint", "T"], ["expected one comparison"]),
    (["--fix", "Q.y.j=4"], ["'Q.y.j'", "did you mean Q.y.i"]),
    (["--fix", "nothing=4"], ["'nothing'", "valid variables: "]),
    (["--fix", "T=four"], ["expected VAR=INT"]),
    (["--fix", "T=4", "--fix", "T=8"], ["fixed twice"]),
    (["--drop", "capacity.wrm"], ["'capacity.wrm'", "did you mean capacity.wram"]),
    (["--drop", "implied"], ["cannot be dropped"]),
    (["--drop", "tiling"], ["cannot be dropped"]),
])
def test_unknown_names_exit_2_with_suggestions(args: list[str], names: list[str]) -> None:
    result = invoke("solve", "softmax", "--hw", "upmem", "--set", "N=4096", *args)
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: ")
    for name in names:
        assert name in result.stderr, name


def test_parse_constraint_builds_the_term() -> None:
    model = pipeline.encode(*[f(request()) for f in (pipeline.parse, pipeline.hardware)])
    constraint = user.parse_constraint("-(T + 1) * 2 < R*D - wram.reserved", 3,
                                       model.constraints, model.hw)
    assert constraint.group == "user.3"
    env = {"T": 4, "R": 2, "D": 3}
    assert ex_holds(constraint.cond, env) == (-(4 + 1) * 2 < 2 * 3 - 2048)
    with pytest.raises(InputError):
        user.parse_constraint("T >= 1 1", 1, model.constraints, model.hw)


def ex_holds(cond: Any, env: dict[str, int]) -> bool:
    from synth.constraints import expr as ex
    return ex.holds(cond, env)


# ---------------------------------------------------------------- listing and binding


def test_show_constraints_lists_groups_and_exits_0() -> None:
    result = invoke("solve", "softmax", "--hw", "upmem", "--set", "N=4096",
                    "--show-constraints", "--constraint", "T >= 11")
    assert result.exit_code == 0, result.output
    for group in ("tiling", "capacity.wram", "transfer.wram", "count.tasklet", "implied",
                  "user.1"):
        assert group in result.stdout, group
    assert "wram.capacity=65536" in result.stdout
    assert "Q.y.i" in result.stdout
    result = invoke("solve", "softmax", "--hw", "upmem", "--show-constraints", "--json",
                    "--drop", "count")
    data = json.loads(result.stdout)
    names = [g["group"] for g in data["constraint_groups"]]
    assert "capacity.wram" in names and not any(n.startswith("count") for n in names)
    assert data["hardware_parameters"]["wram.reserved"] == 2048
    assert data["variables"]["T"] == "defined"


def test_binding_groups_in_json_and_human_output() -> None:
    args = ["solve", "softmax", "--hw", "upmem", "--set", "N=4096", "--constraint", "T <= 4",
            "--binding"]
    result = invoke(*args, "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert [b["group"] for b in data["binding"]] == ["user.1"]
    entry = data["binding"][0]
    assert entry["meaning"] == "T <= 4"
    assert entry["objective_without"] < data["solver"]["objective"]
    groups = {g["group"]: g for g in data["constraint_groups"]}
    assert groups["user.1"]["tight"] is True and groups["user.1"]["binding"] is True
    assert groups["capacity.wram"]["binding"] is False
    result = invoke(*args)
    assert "Constraint groups at the optimum" in result.stdout
    assert "yes:" in result.stdout


@pytest.mark.parametrize("flag", [(), ("--no-binding",)])
def test_no_binding_skips_the_re_solves_and_says_so(flag: tuple[str, ...]) -> None:
    """The binding analysis is off by default; --no-binding says so explicitly."""
    args = ["solve", "softmax", "--hw", "upmem", "--set", "N=4096", "--constraint", "T <= 4",
            *flag, "--no-validate"]
    result = invoke(*args, "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["binding"] is None and "binding" not in data["timings"]
    assert all(g["binding"] is None and g["tight"] is None for g in data["constraint_groups"])
    assert data["status"] == "optimal"  # the schedule itself is unaffected
    assert "Constraint groups at the optimum" not in invoke(*args).stdout


def test_small_wram_makes_capacity_binding() -> None:
    """With room for small tiles only, the WRAM capacity shapes the optimum."""
    outcome = pipeline.run(request(hw_overrides=("wram.capacity=2112",), binding=True))
    status = {g.group: g for g in outcome.group_status or []}
    assert status["capacity.wram"].binding is True
    assert outcome.result.objective is not None
    assert (status["capacity.wram"].objective_without or 0) < outcome.result.objective
