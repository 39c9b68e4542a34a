"""The `synth` command line: output, the JSON report and the exit codes of DESIGN.md 8.

Most tests run the CLI in-process with typer's CliRunner (fast, and lets failures be
provoked by monkeypatching a pipeline stage); one runs `python -m synth.cli` in a
subprocess to check the real entry point and that `--json` keeps stdout pure.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

import synth.pipeline
from synth.cli import app, parse_size_option, parse_size_setting
from synth.constraints.result import SolveResult, Status
from synth.errors import InputError, IRError
from synth.hwfile import list_builtin_hardware, load_hardware
from synth.lang import SizeRange, list_builtin_workloads
from synth.report import jsonable

DESIGN_KEYS = ("workload", "hardware", "status", "solver", "variables", "groups",
               "placement", "cost", "validation", "explanation")
SOFTMAX = ["solve", "softmax", "--hw", "upmem", "--set", "N=4096"]
INFEASIBLE = [*SOFTMAX, "--hw-set", "wram.capacity=2056"]  # 8 usable bytes per WRAM


def invoke(*args: str) -> Any:
    return CliRunner().invoke(app, list(args))


def report_of(result: Any) -> dict[str, Any]:
    """The whole of stdout must be one JSON object."""
    data = json.loads(result.stdout)
    assert isinstance(data, dict)
    return data


@pytest.fixture(scope="module")
def softmax_json() -> dict[str, Any]:
    result = invoke(*SOFTMAX, "--json")
    assert result.exit_code == 0, result.output
    return report_of(result)


# ---------------------------------------------------------------- synth list


def test_list_shows_every_builtin() -> None:
    result = invoke("list")
    assert result.exit_code == 0, result.output
    for name in [*list_builtin_workloads(), *list_builtin_hardware()]:
        assert re.search(rf"^\s*{name}\s", result.stdout, re.MULTILINE), name


# ---------------------------------------------------------------- the JSON report


def test_json_report_has_the_design_keys(softmax_json: dict[str, Any]) -> None:
    for key in DESIGN_KEYS:
        assert key in softmax_json
    assert softmax_json["workload"] == "softmax"
    assert softmax_json["hardware"] == "upmem"
    assert softmax_json["status"] == "optimal"
    assert softmax_json["solver"]["name"] == "cpsat"
    assert softmax_json["solver"]["gap"] == 0
    assert softmax_json["explanation"] is None
    assert softmax_json["binding"] is None  # off unless --binding
    assert 0 < softmax_json["solver"]["wall_s"] < softmax_json["wall_s"]
    assert {g["group"] for g in softmax_json["constraint_groups"]} >= {
        "tiling", "capacity.wram", "transfer.wram", "count.tasklet", "implied"}
    assert softmax_json["validation"]["passed"] is True
    assert "forall" in softmax_json["loop_nest"]


def test_json_counts_are_integers_within_the_hardware_ranges(
        softmax_json: dict[str, Any]) -> None:
    variables = softmax_json["variables"]
    levels = {lv.symbol: lv for lv in load_hardware("upmem").levels if lv.symbol}
    assert list(variables)[:3] == ["R", "D", "T"]  # hardware counts come first
    for symbol, level in levels.items():
        value = variables[symbol]
        assert isinstance(value, int) and not isinstance(value, bool)
        assert level.count_min <= value <= level.count_max
    assert all(isinstance(v, int) for v in variables.values())
    assert any(name.startswith("Q.") for name in variables)


def test_json_cost_total_is_the_sum_of_the_breakdown(softmax_json: dict[str, Any]) -> None:
    cost = softmax_json["cost"]
    breakdown = cost["breakdown"]
    parts = [v for k, v in breakdown.items() if k != "transfer_s"]
    parts += breakdown["transfer_s"].values()
    assert {"compute_s", "launch_s", "combine_s", "transfer_s"} <= set(breakdown)
    assert "host->mram" in breakdown["transfer_s"]
    assert cost["total_s"] == pytest.approx(sum(parts), rel=1e-12)
    assert cost["total_ps"] == softmax_json["solver"]["objective"]


def test_json_groups_and_placement_agree(softmax_json: dict[str, Any]) -> None:
    names = [g["name"] for g in softmax_json["groups"]]
    assert names and all(g["statements"] for g in softmax_json["groups"])
    for key, memory in softmax_json["placement"].items():
        kernel, tensor = key.split("/")
        assert kernel in names
        assert any(b["kernel"] == kernel and b["tensor"] == tensor and b["memory"] == memory
                   for b in softmax_json["buffers"])


def test_matmul_on_cpu_solves_and_validates() -> None:
    result = invoke("solve", "matmul", "--hw", "cpu", "--set", "M=64", "--set", "N=32",
                    "--set", "K=128", "--json")
    assert result.exit_code == 0, result.output
    data = report_of(result)
    assert data["status"] in ("optimal", "feasible")
    assert data["validation"]["passed"] is True
    assert "P" in data["variables"]


def test_no_validate_still_exits_zero() -> None:
    result = invoke(*SOFTMAX, "--json", "--no-validate")
    assert result.exit_code == 0, result.output
    assert report_of(result)["validation"] is None


def test_jsonable_keeps_json_strict() -> None:
    data = jsonable({"a": np.float32(1.5), "b": float("nan"), "c": -float("inf"),
                     "d": np.int64(3), "e": (1, 2), "f": Status.OPTIMAL})
    assert data == {"a": 1.5, "b": "nan", "c": "-inf", "d": 3, "e": [1, 2], "f": "optimal"}
    json.dumps(data, allow_nan=False)


# ---------------------------------------------------------------- human output


def test_human_output_shows_the_schedule() -> None:
    result = invoke(*SOFTMAX)
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "optimal" in out.splitlines()[0]
    assert re.search(r"forall \w+ in 0\.\.[A-Z]\.\w+\.\w+=\d+", out)  # symbolic extents
    assert "Symbolic variables" in out and "tasklets per dpu" in out
    assert "Modelled cost" in out and "transfer host->mram" in out
    assert "validation against NumPy: passed" in out
    assert "\x1b[" not in out  # no colour when stdout is not a terminal


# ---------------------------------------------------------------- exit codes


@pytest.mark.parametrize(("args", "names"), [
    (["solve", "nosuch", "--hw", "upmem"], "nosuch"),
    (["solve", "softmax", "--hw", "nosuch"], "nosuch"),
    ([*SOFTMAX[:4], "--set", "N=abc"], "N=abc"),
    ([*SOFTMAX[:4], "--set", "N=0"], "N=0"),
    ([*SOFTMAX[:4], "--set", "N"], "--set N"),
    ([*SOFTMAX[:4], "--set", "NOPE=4"], "NOPE"),
    ([*SOFTMAX, "--solver", "nosuch"], "nosuch"),
    ([*SOFTMAX, "--hw-set", "wram.nosuch=1"], "wram.nosuch"),
])
def test_bad_input_exits_2(args: list[str], names: str) -> None:
    result = invoke(*args)
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: ")
    assert names in result.stderr
    assert "Traceback" not in result.output


def test_malformed_workload_file_shows_where(tmp_path: Path) -> None:
    path = tmp_path / "bad.syn"
    path.write_text("size N = 8\nin x : f32[N]\nout y : f32[N]\ny[i] = x[i] +\n")
    result = invoke("solve", str(path), "--hw", "upmem")
    assert result.exit_code == 2, result.output
    assert f"{path}:4:14:" in result.stderr
    assert "y[i] = x[i] +" in result.stderr
    assert re.search(r"^\s+\^$", result.stderr, re.MULTILINE)  # the caret line


def test_infeasible_exits_1_with_a_message() -> None:
    result = invoke(*INFEASIBLE)
    assert result.exit_code == 1, result.output
    assert "infeasible" in result.stdout
    assert "'softmax'" in result.stdout and "'upmem'" in result.stdout
    assert "capacity.wram" in result.stdout and "8 B usable" in result.stdout
    assert "--hw-set" in result.stdout


def test_infeasible_json_has_the_explanation() -> None:
    result = invoke(*INFEASIBLE, "--json")
    assert result.exit_code == 1, result.output
    data = report_of(result)
    assert data["status"] == "infeasible"
    explanation = data["explanation"]
    assert [g["group"] for g in explanation["groups"]] == ["capacity.wram"]
    assert explanation["groups"][0]["meaning"]
    message = explanation["message"]
    assert "softmax" in message and "capacity.wram" in message and "--hw-set" in message
    assert data["cost"] is None and data["groups"] == [] and data["binding"] is None


def test_timeout_exits_3(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_solution(model: Any, solver: str, time_limit_s: float, jobs: int) -> SolveResult:
        return SolveResult(solver, Status.TIMEOUT, time_limit_s)

    monkeypatch.setattr(synth.pipeline, "solve", no_solution)
    result = invoke(*SOFTMAX, "--time-limit", "0.5")
    assert result.exit_code == 3, result.output
    assert "time limit" in result.stdout
    result = invoke(*SOFTMAX, "--json")
    assert result.exit_code == 3
    assert report_of(result)["status"] == "timeout"


def test_a_real_tiny_time_limit_maps_its_status_to_the_exit_code() -> None:
    """A microsecond limit usually times out attention, but the solver may be faster on
    some machine; whatever the status, the exit code must match it."""
    result = invoke("solve", "attention", "--hw", "upmem", "--time-limit", "0.000001",
                    "--no-validate", "--json")
    status = report_of(result)["status"]
    assert result.exit_code == {"timeout": 3, "optimal": 0, "feasible": 0}[status]


def test_validation_failure_exits_4(monkeypatch: pytest.MonkeyPatch) -> None:
    real = synth.pipeline.interpret

    def off_by_one(program: Any, workload: Any, inputs: Any) -> dict[str, Any]:
        return {name: value + 1 for name, value in real(program, workload, inputs).items()}

    monkeypatch.setattr(synth.pipeline, "interpret", off_by_one)
    result = invoke(*SOFTMAX)
    assert result.exit_code == 4, result.output
    assert "validation against NumPy: FAILED" in result.stdout
    result = invoke(*SOFTMAX, "--json")
    assert result.exit_code == 4
    assert report_of(result)["validation"]["passed"] is False


def test_ir_error_exits_4_with_its_message(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: Any) -> None:
        raise IRError("buffer x_wram: expected 8 bytes, got 4")

    monkeypatch.setattr(synth.pipeline, "verify", broken)
    result = invoke(*SOFTMAX, "--json")
    assert result.exit_code == 4
    assert result.stdout == ""
    assert result.stderr == "error: buffer x_wram: expected 8 bytes, got 4\n"


def test_internal_error_exits_70_and_debug_reraises(monkeypatch: pytest.MonkeyPatch) -> None:
    def bug(*args: Any) -> None:
        raise KeyError("oops")

    monkeypatch.setattr(synth.pipeline, "materialize", bug)
    result = invoke(*SOFTMAX)
    assert result.exit_code == 70
    assert "internal error: KeyError: 'oops'" in result.stderr
    assert "SYNTH_DEBUG=1" in result.stderr
    monkeypatch.setenv("SYNTH_DEBUG", "1")
    result = invoke(*SOFTMAX)
    assert isinstance(result.exception, KeyError)


def test_parse_size_setting() -> None:
    assert parse_size_setting("N=4096") == ("N", 4096)
    assert parse_size_setting(" M = 7 ") == ("M", 7)
    for bad in ("N", "N=", "=4", "N=-1", "N=1.5", "N=0x10"):
        with pytest.raises(InputError, match="--set"):
            parse_size_setting(bad)


# ---------------------------------------------------------------- the real entry point


def test_module_entry_point_prints_only_json() -> None:
    proc = subprocess.run([sys.executable, "-m", "synth.cli", *SOFTMAX, "--json"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["status"] == "optimal" and data["validation"]["passed"] is True


def test_z3_solver_reaches_the_cpsat_optimum_from_the_command_line() -> None:
    args = ["solve", "matmul", "--hw", "cpu", "--set", "M=64", "--set", "N=32",
            "--set", "K=128", "--json"]
    cpsat_run = invoke(*args)
    z3_run = invoke(*args, "--solver", "z3")
    assert cpsat_run.exit_code == 0 and z3_run.exit_code == 0, z3_run.output
    cp, z3 = json.loads(cpsat_run.stdout), json.loads(z3_run.stdout)
    assert z3["solver"]["name"] == "z3" and z3["status"] == "optimal"
    assert z3["solver"]["objective"] == cp["solver"]["objective"]
    assert z3["validation"]["passed"] is True


def test_a_refuted_proof_exits_4_with_its_counterexample(monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    from synth.ir import prove as prove_module

    refuted = prove_module.Proof(proved=False, checks=1, failures=(prove_module.Failure(
        kind="bounds", kernel="y", where="load x_wram <- x_mram", message="index 64 outside",
        counterexample={"t_i": 15}),))
    proved = invoke("solve", "softmax", "--hw", "upmem", "--set", "N=4096", "--no-validate")
    assert proved.exit_code == 0
    assert "symbolic verification (z3): proved" in proved.stdout
    monkeypatch.setattr("synth.pipeline.prove", lambda *args: refuted)
    result = invoke("solve", "softmax", "--hw", "upmem", "--set", "N=4096", "--no-validate")
    assert result.exit_code == 4
    assert "t_i=15" in result.stdout


# ---------------------------------------------------------------- size ranges

RANGED = ["solve", "softmax", "--hw", "upmem", "--set", "N=1024..8192:1024"]


def test_a_size_range_is_proved_and_reported() -> None:
    result = invoke(*RANGED)
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert out.splitlines()[0].startswith("softmax (N=8192) on upmem: optimal")
    assert re.search(r"^symbolic verification \(z3\): proved for N in 1024\.\.8192 step 1024 "
                     r"\(8 values\): \d+ obligations \(bounds, capacity, coverage\) hold",
                     out, re.MULTILINE)
    assert "solved at N=8192, the largest admissible value: the tiles stay fixed" in out
    assert re.search(r"^validation against NumPy at N=1024 \(the smallest admissible, same "
                     r"tiles\): passed", out, re.MULTILINE)


def test_a_size_range_in_json() -> None:
    result = invoke(*RANGED, "--json")
    assert result.exit_code == 0, result.output
    data = report_of(result)
    assert data["sizes"] == {"N": 8192}  # solved at the largest admissible value
    verification = data["verification"]
    assert verification["proved"] is True and verification["failures"] == []
    assert verification["checks"] > 0
    assert verification["sizes"] == {"N": {"min": 1024, "max": 8192, "step": 1024,
                                           "values": 8, "solved_at": 8192}}
    assert set(verification["kinds"]) >= {"bounds", "capacity", "coverage"}
    assert "solved at N=8192" in verification["note"]
    assert verification["smallest"]["sizes"] == {"N": 1024}
    assert verification["smallest"]["passed"] is True
    # without a range, the same keys (sizes empty)
    plain = report_of(invoke(*SOFTMAX, "--json", "--no-validate"))["verification"]
    assert plain["sizes"] == {} and plain["proved"] is True
    assert "smallest" not in plain


def test_a_range_whose_largest_value_is_below_hi() -> None:
    """Admissible values are LO, LO+STEP, ... <= HI: 1000..1030:7 solves at 1028."""
    result = invoke("solve", "va", "--hw", "upmem", "--set", "N=1000..1030:7", "--json")
    assert result.exit_code == 0, result.output
    data = report_of(result)
    assert data["sizes"] == {"N": 1028}
    assert data["verification"]["sizes"]["N"] == {"min": 1000, "max": 1028, "step": 7,
                                                  "values": 5, "solved_at": 1028}


@pytest.mark.parametrize(("value", "message"), [
    ("N=1024..", "expected a range LO..HI or LO..HI:STEP of integers"),
    ("N=..4096", "expected a range LO..HI or LO..HI:STEP of integers"),
    ("N=1..8:", "expected a range LO..HI or LO..HI:STEP of integers"),
    ("N=1..8:2:3", "expected a range LO..HI or LO..HI:STEP of integers"),
    ("N=a..b", "expected a range LO..HI or LO..HI:STEP of integers"),
    ("N=1.5..8", "expected a range LO..HI or LO..HI:STEP of integers"),
    ("N=8..1", "empty range, LO 8 > HI 1"),
    ("N=0..8", "size 'N' must be positive, got LO 0"),
    ("N=-4..8", "size 'N' must be positive, got LO -4"),
    ("N=1..8:0", "STEP must be a positive integer, got 0"),
    ("N=1..8:-2", "STEP must be a positive integer, got -2"),
    ("=1..8", "expected NAME=INT or NAME=LO..HI[:STEP]"),
    ("NOPE=1..8", "no size named 'NOPE'"),
])
def test_a_bad_size_range_exits_2(value: str, message: str) -> None:
    result = invoke("solve", "softmax", "--hw", "upmem", "--set", value, "--no-validate")
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith(f"error: --set {value.partition('=')[0]}")
    assert message in result.stderr
    assert "Traceback" not in result.output


def test_a_size_given_as_a_value_and_a_range_exits_2() -> None:
    result = invoke(*RANGED, "--set", "N=4096")
    assert result.exit_code == 2
    assert "error: --set N given twice (N=1024..8192:1024 and N=4096)" in result.stderr


def test_parse_size_option() -> None:
    assert parse_size_option("N=4096") == ("N", 4096)
    assert parse_size_option("N=1024..65536:1024") == ("N", SizeRange(1024, 65536, 1024))
    assert parse_size_option(" M = 3 .. 9 ") == ("M", SizeRange(3, 9, 1))
    admissible = SizeRange(1000, 1030, 7)
    assert list(admissible.values()) == [1000, 1007, 1014, 1021, 1028]
    assert admissible.last == 1028 and admissible.count == 5
    assert 1021 in admissible and 1022 not in admissible and 1035 not in admissible
    assert str(admissible) == "1000..1028 step 7" and str(SizeRange(1, 8)) == "1..8"


def test_tune_refuses_a_size_range() -> None:
    result = invoke("tune", "softmax", "--hw", "upmem", "--set", "N=1..8", "--vary", "T=8,16")
    assert result.exit_code == 2
    assert "--set N=1..8: a size range is for synth solve" in result.stderr


def test_a_range_proof_refuted_exits_4_naming_the_size(monkeypatch: pytest.MonkeyPatch
                                                       ) -> None:
    """A schedule whose host loop runs one padded iteration too many: fine at the solved
    size (the verifier passes it), but its count is not ceil(N / step), so the range
    proof is refuted and the failure names N."""
    import dataclasses

    from synth.ir.nodes import Loop
    from synth.ir.prove import is_root_loop

    real = synth.pipeline.materialize

    def padded(model: Any, env: Any) -> Any:
        program = real(model, env)

        def bump(nodes: tuple[Any, ...]) -> tuple[Any, ...]:
            return tuple(dataclasses.replace(n, var=dataclasses.replace(
                n.var, extent=n.var.extent + is_root_loop(program, n.var)),
                body=bump(n.body)) if isinstance(n, Loop) else n for n in nodes)

        return dataclasses.replace(program, kernels=tuple(
            dataclasses.replace(k, body=bump(k.body)) for k in program.kernels))

    monkeypatch.setattr(synth.pipeline, "materialize", padded)
    args = ["solve", "va", "--hw", "upmem", "--hw-set", "rank.count=1..1", "--hw-set",
            "dpu.count=1..2", "--hw-set", "tasklet.count=1..2", "--hw-set",
            "mram.capacity=64KiB", "--set", "N=1024..65536:1024", "--no-validate"]
    result = invoke(*args)
    assert result.exit_code == 4, result.output
    assert "refuted for N in 1024..65536 step 1024 (64 values): 1 of" in result.stdout
    assert re.search(r"parametric: kernel c: loop h_i: h_i \(host\) runs \d+ times at "
                     r"N=65536, .* not a function of N \[at N=65536\]", result.stdout)
    data = report_of(invoke(*args, "--json"))
    (failure,) = data["verification"]["failures"]
    assert failure["kind"] == "parametric" and failure["counterexample"] == {"N": 65536}


# ---------------------------------------------------------------- --emit


def test_emit_upmem_writes_builds_and_checks_the_program(tmp_path: Path) -> None:
    out = tmp_path / "softmax"
    result = invoke("solve", "softmax", "--hw", "upmem", "--set", "N=4096", "--emit", "upmem",
                    "--out", str(out), "--json")
    assert result.exit_code == 0, result.output
    emitted = report_of(result)["emitted"]["upmem"]
    assert emitted["checked"] is True and emitted["passed"] is True
    assert emitted["path"] == str(out)
    assert {"host.c", "Makefile"} <= set(emitted["files"])
    assert (out / "host.c").read_text().count("dpu_push_xfer") > 0


def test_emit_without_validation_writes_but_does_not_check(tmp_path: Path) -> None:
    result = invoke("solve", "va", "--hw", "upmem", "--set", "N=4096", "--emit", "upmem",
                    "--out", str(tmp_path), "--no-validate")
    assert result.exit_code == 0, result.output
    assert "not checked: --no-validate" in result.output
    assert (tmp_path / "dpu_c.c").exists()


@pytest.mark.parametrize("args, message", [
    (["--emit", "cuda", "--out", "x"], "--emit cuda: unknown target; expected one of upmem"),
    (["--emit", "upmem"], "--emit upmem: expected --out DIR"),
    (["--out", "x"], "--out x: expected --emit TARGET too"),
])
def test_emit_usage_errors_exit_2_before_solving(args: list[str], message: str) -> None:
    result = invoke("solve", "softmax", "--hw", "upmem", "--set", "N=4096", *args)
    assert result.exit_code == 2
    assert message in result.output


def test_a_failed_emitted_check_exits_4(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                        ) -> None:
    from synth.emit import upmem
    from synth.emit.upmem import CheckResult

    monkeypatch.setattr(upmem, "check_upmem",
                        lambda out: CheckResult(False, "dpu 3: mram_read of 4096 bytes", 0.1))
    result = invoke("solve", "va", "--hw", "upmem", "--set", "N=4096", "--emit", "upmem",
                    "--out", str(tmp_path))
    assert result.exit_code == 4
    assert "FAILED" in result.output and "4096 bytes" in result.output
