"""`synth tune`: variants as the product of --vary axes, their rows, JSON, CSV and errors.

Softmax at N=4096 on UPMEM solves in tens of milliseconds per variant (plus, with
--binding, one re-solve per droppable group), so the whole file stays well under 30 s.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from typer.testing import CliRunner

import synth.cli
import synth.pipeline
from synth.cli import app

TUNE = ["tune", "softmax", "--hw", "upmem", "--set", "N=4096"]
WRAM_BY_DROP = ["--vary", "wram.capacity=2560B,64KiB", "--vary", "drop:capacity.wram=on,off"]


def invoke(*args: str) -> Any:
    return CliRunner().invoke(app, list(args))


@pytest.fixture(scope="module")
def tuned(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], list[list[str]]]:
    """One tune, written as JSON (stdout) and CSV (a file) at once."""
    path = tmp_path_factory.mktemp("tune") / "variants.csv"
    result = invoke(*TUNE, *WRAM_BY_DROP, "--binding", "--json", "--csv", str(path))
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)  # the whole of stdout is one object
    with path.open(newline="", encoding="utf-8") as handle:
        rows = list(csv.reader(handle))
    return data, rows


def by_settings(data: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(v["settings"]["wram.capacity"], v["settings"]["drop:capacity.wram"]): v
            for v in data["variants"]}


@pytest.fixture
def no_solving(monkeypatch: pytest.MonkeyPatch) -> None:
    """Bad input must be reported before any variant runs."""
    def refuse(request: Any) -> Any:
        raise AssertionError(f"a variant ran: {request}")

    monkeypatch.setattr(synth.pipeline, "run", refuse)


# ---------------------------------------------------------------- the variants


def test_json_has_one_row_per_variant_in_product_order(
        tuned: tuple[dict[str, Any], list[list[str]]]) -> None:
    data, _ = tuned
    assert data["workload"] == "softmax" and data["hardware"] == "upmem"
    assert data["vary"]["wram.capacity"] == {"kind": "hw", "key": "wram.capacity",
                                             "values": ["2560B", "64KiB"]}
    assert data["vary"]["drop:capacity.wram"]["kind"] == "drop"
    settings = [tuple(v["settings"].values()) for v in data["variants"]]
    assert settings == [("2560B", "on"), ("2560B", "off"), ("64KiB", "on"), ("64KiB", "off")]
    for index, variant in enumerate(data["variants"], start=1):
        assert variant["index"] == index
        assert variant["sizes"] == {"N": 4096}
        assert variant["status"] == "optimal"
        assert variant["gap"] == 0
        assert variant["cost_s"] == pytest.approx(variant["objective_ps"] / 1e12)
        assert 0 < variant["solve_s"] <= variant["wall_s"]
        assert isinstance(variant["binding"], list)
        assert variant["conflict"] is None and variant["error"] is None
        assert variant["validation"] is None  # tune does not validate unless asked
        assert variant["variables"]["T"] >= 1


def test_costs_are_ordered_and_the_small_wram_binds(
        tuned: tuple[dict[str, Any], list[list[str]]]) -> None:
    rows = by_settings(tuned[0])
    for drop in ("on", "off"):  # a smaller WRAM is never cheaper
        assert rows["2560B", drop]["objective_ps"] >= rows["64KiB", drop]["objective_ps"]
    for wram in ("2560B", "64KiB"):  # dropping a group is never more expensive
        assert rows[wram, "on"]["objective_ps"] <= rows[wram, "off"]["objective_ps"]
    # 2560 B (512 B usable) shapes the optimum (double buffering makes
    # small WRAM tiles cheap: 4 KiB no longer does); without the rule, WRAM size is irrelevant
    assert rows["2560B", "off"]["objective_ps"] > rows["64KiB", "off"]["objective_ps"]
    assert "capacity.wram" in rows["2560B", "off"]["binding"]
    assert "capacity.wram" not in rows["64KiB", "off"]["binding"]
    assert rows["2560B", "on"]["objective_ps"] == rows["64KiB", "on"]["objective_ps"]


def test_csv_has_one_row_per_variant(tuned: tuple[dict[str, Any], list[list[str]]]) -> None:
    data, rows = tuned
    header, body = rows[0], rows[1:]
    assert header[:4] == ["index", "wram.capacity", "drop:capacity.wram", "status"]
    assert {"objective_ps", "cost_s", "solve_s", "binding", "conflict"} <= set(header)
    assert len(body) == len(data["variants"]) == 4
    for line, variant in zip(body, data["variants"], strict=True):
        cell = dict(zip(header, line, strict=True))
        assert cell["index"] == str(variant["index"])
        assert cell["wram.capacity"] == variant["settings"]["wram.capacity"]
        assert cell["status"] == variant["status"]
        assert int(cell["objective_ps"]) == variant["objective_ps"]
        assert cell["binding"] == " ".join(variant["binding"])
        assert cell["conflict"] == "" and cell["error"] == ""


def test_infeasible_variant_is_a_row_with_its_conflict() -> None:
    result = invoke(*TUNE, "--vary", "wram.capacity=2056B",  # 8 usable bytes
                    "--vary", "drop:capacity.wram=off,on", "--json")
    assert result.exit_code == 0, result.output  # every variant ran
    kept, dropped = json.loads(result.stdout)["variants"]
    assert kept["status"] == "infeasible"
    assert kept["conflict"] == ["capacity.wram"]
    assert kept["objective_ps"] is None and kept["cost_s"] is None
    assert kept["binding"] is None and kept["variables"] is None
    assert dropped["status"] == "optimal" and dropped["conflict"] is None


def test_binding_is_opt_in() -> None:
    """Without --binding no group is re-solved: `binding` is null, the column says
    "groups" and keeps only conflicts (as synth solve, where binding is off by default)."""
    result = invoke(*TUNE, "--vary", "wram.capacity=2056B,64KiB", "--json")
    assert result.exit_code == 0, result.output
    small, large = json.loads(result.stdout)["variants"]
    assert small["status"] == "infeasible" and small["conflict"] == ["capacity.wram"]
    assert large["status"] == "optimal" and large["binding"] is None
    table = invoke(*TUNE, "--vary", "wram.capacity=2056B,64KiB")
    assert table.exit_code == 0, table.output
    assert "binding groups" not in table.stdout and "groups" in table.stdout
    assert "conflict:" in table.stdout and "capacity.wram" in table.stdout


def test_vs_best_compares_rows_of_the_same_sizes_only() -> None:
    """Before, a tune over sizes compared a large size with a small one's cost (+3530%);
    each size's best row is now +0%, and a worse row at one size is measured against the
    best at that size."""
    result = invoke("tune", "softmax", "--hw", "upmem", "--vary", "set:N=1024,65536",
                    "--vary", "T=1,16", "--json")
    assert result.exit_code == 0, result.output
    rows = {(v["settings"]["set:N"], v["settings"]["T"]): v
            for v in json.loads(result.stdout)["variants"]}
    for n in ("1024", "65536"):
        best, worse = rows[n, "16"], rows[n, "1"]
        assert best["objective_ps"] < worse["objective_ps"]  # one tasklet is slower
        assert best["vs_best"] == 0
        assert worse["vs_best"] == pytest.approx(
            worse["objective_ps"] / best["objective_ps"] - 1)
    # the large size costs more, yet its best row is not compared with the small one's
    assert rows["65536", "16"]["objective_ps"] > rows["1024", "1"]["objective_ps"]


def test_fixing_a_bare_variable_changes_the_schedule() -> None:
    result = invoke(*TUNE, "--vary", "T=1,16", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["vary"]["T"]["kind"] == "fix"
    one, sixteen = data["variants"]
    assert (one["variables"]["T"], sixteen["variables"]["T"]) == (1, 16)
    assert one["objective_ps"] > sixteen["objective_ps"]  # one tasklet cannot hide latency


# ---------------------------------------------------------------- human output


def test_human_table(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "120")
    result = invoke(*TUNE, "--vary", "wram.capacity=2560B,64KiB", "--binding")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "Variants of softmax on upmem" in out
    for word in ("wram.capacity", "status", "cost", "solve", "binding groups"):
        assert word in out
    lines = [line for line in out.splitlines() if line.strip().startswith(("1 ", "2 "))]
    assert len(lines) == 2
    assert "2560B" in lines[0] and "capacity.wram" in lines[0]
    assert "64KiB" in lines[1] and "+0.0%" in lines[1]
    assert "━" not in out and "tuning" not in out  # no progress bar off a terminal


def test_progress_bar_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    screen = io.StringIO()
    monkeypatch.setattr(synth.cli, "make_console",
                        lambda: Console(file=screen, force_terminal=True, width=120))
    result = invoke(*TUNE, "--vary", "T=8,16")
    assert result.exit_code == 0, result.output
    assert "tuning" in screen.getvalue()  # the bar was drawn (then replaced by the table)
    assert "Variants of softmax on upmem" in screen.getvalue()


# ---------------------------------------------------------------- bad input: exit 2, nothing run


@pytest.mark.usefixtures("no_solving")
@pytest.mark.parametrize(("vary", "message"), [
    ("wram.capacty=32KiB", "did you mean wram.capacity"),
    ("N=1024", "did you mean set:N?"),
    ("TT=1,2", "did you mean T"),
    ("fix:Q.y.j=1", "did you mean Q.y.i"),
    ("drop:capacity.wramm=on", "did you mean capacity.wram"),
    ("drop:tiling=on", "cannot be dropped"),
    ("drop:capacity.wram=yes", "expected on (group dropped) or off (group kept)"),
    ("set:M=64", "unknown size 'M'"),
    ("set:N=0", "must be a positive integer"),
    ("T=8,8", "given twice"),
    ("wram.capacity", "expected KEY=V1,V2,..."),
    ("size:N=4", "unknown prefix"),
])
def test_bad_vary_exits_2_before_running(vary: str, message: str) -> None:
    result = invoke(*TUNE, "--vary", vary)
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith(f"error: --vary {vary}")
    assert message in result.stderr
    assert result.stdout == ""


@pytest.mark.usefixtures("no_solving")
def test_a_bad_value_in_the_last_variant_stops_the_tune_before_the_first() -> None:
    result = invoke(*TUNE, "--vary", "wram.capacity=64KiB,12furlongs", "--json")
    assert result.exit_code == 2
    assert "variant 2 (wram.capacity=12furlongs)" in result.stderr
    assert "expected a size like '64KiB'" in result.stderr
    assert result.stdout == ""


@pytest.mark.usefixtures("no_solving")
@pytest.mark.parametrize("args", [
    ["--vary", "set:N=1024,2048"],  # --set N is a base setting
    ["--hw-set", "wram.capacity=32KiB", "--vary", "wram.capacity=4KiB"],
    ["--fix", "T=8", "--vary", "fix:T=16"],
    ["--drop", "capacity", "--vary", "drop:capacity.wram=on,off"],
    ["--vary", "T=8", "--vary", "fix:T=16"],  # the same key twice
])
def test_a_key_is_varied_once_and_not_also_a_base_setting(args: list[str]) -> None:
    result = invoke(*TUNE, *args)
    assert result.exit_code == 2, result.output
    assert "varied" in result.stderr


@pytest.mark.usefixtures("no_solving")
def test_tune_needs_a_vary() -> None:
    result = invoke(*TUNE)
    assert result.exit_code == 2
    assert "at least one --vary" in result.stderr


def test_csv_path_is_written_with_the_table(tmp_path: Path) -> None:
    path = tmp_path / "out.csv"
    result = invoke(*TUNE, "--vary", "T=16", "--csv", str(path))
    assert result.exit_code == 0, result.output
    assert "Variants of softmax" in result.stdout
    header, row = list(csv.reader(path.open(newline="", encoding="utf-8")))
    assert header[:3] == ["index", "T", "status"] and row[:3] == ["1", "16", "optimal"]


# ---------------------------------------------------------------- the model as an axis


def test_the_hardware_model_is_an_axis() -> None:
    """`--vary hw=upmem,aie` (issue 16: was exit 2): one variant per model, each as
    `synth solve` finds it on that model, and "vs best" among the rows of one size
    compares the models; `--hw` may be left out."""
    result = invoke("tune", "softmax", "--vary", "hw=upmem,cpu", "--vary",
                    "set:N=1024,4096", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["hardware"] == ["upmem", "cpu"]
    assert data["vary"]["hw"] == {"kind": "model", "key": "hw", "values": ["upmem", "cpu"]}
    rows = {(v["settings"]["hw"], v["settings"]["set:N"]): v for v in data["variants"]}
    assert list(rows) == [("upmem", "1024"), ("upmem", "4096"), ("cpu", "1024"),
                          ("cpu", "4096")]
    assert set(rows["upmem", "1024"]["variables"]) >= {"R", "D", "T"}
    assert "P" in rows["cpu", "1024"]["variables"]
    solved = synth.pipeline.run(synth.pipeline.Request("softmax", "cpu", {"N": 4096},
                                                       validate=False))
    assert rows["cpu", "4096"]["objective_ps"] == solved.result.objective
    for n in ("1024", "4096"):
        upmem, cpu = rows["upmem", n], rows["cpu", n]
        best, other = sorted((upmem, cpu), key=lambda v: v["objective_ps"])
        assert best["vs_best"] == 0
        assert other["vs_best"] == pytest.approx(
            other["objective_ps"] / best["objective_ps"] - 1)
    table = invoke("tune", "softmax", "--hw", "upmem", "--set", "N=1024",
                   "--vary", "hw=upmem,cpu")
    assert table.exit_code == 0, table.output
    assert "Variants of softmax on upmem, cpu" in table.stdout


@pytest.mark.usefixtures("no_solving")
@pytest.mark.parametrize(("args", "message"), [
    (["--hw", "cpu", "--vary", "hw=upmem,aie"], "--hw cpu is not one of its values"),
    (["--vary", "hw=upmem,aei"], "--vary hw=upmem,aei: unknown hardware 'aei'"),
    (["--vary", "hw=upmem,aie", "--vary", "T=4,8"],
     "variant 3 (hw=aie T=4): --fix T=4: unknown variable 'T'"),
    (["--vary", "hw=upmem,cpu", "--hw-set", "wram.capacity=32KiB"],
     "hardware cpu: --hw-set: unknown key 'wram.capacity'"),
    (["--vary", "T=4,8"], "synth tune needs --hw HW"),
])
def test_a_bad_model_axis_exits_2_before_any_solve(args: list[str], message: str) -> None:
    result = invoke("tune", "softmax", *args)
    assert result.exit_code == 2, result.output
    assert message in result.stderr
