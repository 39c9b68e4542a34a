"""`synth sweep` (docs/sweep.md): spec files and flags, points and their keys, a sweep end
to end in real processes, resuming, failing points and dying workers, Dask (a
`LocalCluster`, and a scheduler and a worker started as processes on 127.0.0.1), the
plots and the page.

The points are tiny (softmax and va at N <= 4096: tens of milliseconds each), and every
result compared is the solver's (deterministic), never a duration.
"""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from synth import pipeline
from synth.cli import app
from synth.errors import InputError
from synth.sweep import command, execute, points, spec, store, task
from synth.sweep.spec import Flags

ROOT = Path(__file__).resolve().parent.parent
SMALL = ["--workload", "softmax,va", "--hw", "upmem,cpu", "--set", "N=1024,4096"]
SMALL_FLAGS = dict(workloads=["softmax,va"], hardware=["upmem,cpu"], sizes=["N=1024,4096"])
DASK_START_S = 120  # how long a scheduler may take to write its file (a busy machine)


def sweep_process(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "synth.cli", "sweep", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=600, check=False)


def read_rows(out: Path) -> list[dict[str, Any]]:
    lines = (out / store.JSONL_NAME).read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines]


def costs(rows: list[dict[str, Any]]) -> dict[tuple[Any, ...], int]:
    return {(r["workload"], r["config"], r["sizes"]["N"]): r["cost_ps"] for r in rows}


@pytest.fixture(scope="module")
def swept_process(tmp_path_factory: pytest.TempPathFactory
                  ) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """The small sweep, run once as `synth sweep` in its own process, 2 workers."""
    out = tmp_path_factory.mktemp("sweep") / "out"
    run = sweep_process(*SMALL, "--out", str(out), "--workers", "2")
    assert run.returncode == 0, run.stderr
    return out, run


@pytest.fixture(scope="module")
def swept(swept_process: tuple[Path, subprocess.CompletedProcess[str]]) -> tuple[Path, str]:
    return swept_process[0], swept_process[1].stdout


@pytest.fixture
def copy_of(swept: tuple[Path, str], tmp_path: Path) -> Path:
    """A copy of the small sweep's directory, to rerun or damage."""
    return Path(shutil.copytree(swept[0], tmp_path / "out"))


# ---------------------------------------------------------------- end to end


def test_a_small_sweep_end_to_end(swept: tuple[Path, str]) -> None:
    out, stdout = swept
    assert stdout.startswith("sweep: 8 of 8 points (8 run in ")
    assert "0 from the store): 8 optimal" in stdout
    rows = read_rows(out)
    order = [(r["workload"], r["hardware"], r["sizes"]["N"]) for r in rows]
    assert order == [(w, h, n) for w in ("softmax", "va") for h in ("upmem", "cpu")
                     for n in (1024, 4096)]
    assert [r["index"] for r in rows] == list(range(1, 9))
    for r in rows:
        assert r["status"] == "optimal" and r["gap"] == 0 and r["error"] is None
        assert r["variant"] == "base" and r["solver"] == "cpsat" and not r["from_store"]
        assert r["cost_s"] == pytest.approx(r["cost_ps"] / 1e12)
        assert sum(r["breakdown_s"].values()) == pytest.approx(r["cost_s"])
        assert 0 < r["solve_s"] <= r["wall_s"]
        assert r["kernels"] and r["synth"] == points.synth_version()
        assert set(r["counts"]) == ({"R", "D", "T"} if r["hardware"] == "upmem" else {"P"})
    # a row is what synth solve finds for the point
    outcome = pipeline.run(pipeline.Request("va", "cpu", {"N": 4096}, validate=False))
    assert costs(rows)["va", "cpu", 4096] == outcome.result.objective


def test_without_a_terminal_each_finished_point_is_a_line_with_an_eta(
        swept_process: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    """stderr is a pipe here: instead of the bar, one line per point as it finishes."""
    lines = swept_process[1].stderr.splitlines()
    assert len(lines) == 8
    pattern = re.compile(r"^\[(\d)/8 \d+s eta \d+s\] (softmax|va) N=(1024|4096) on "
                         r"(upmem|cpu) \(base, cpsat\): optimal$")
    matches = [pattern.match(line) for line in lines]
    assert all(matches), lines
    assert [int(m[1]) for m in matches if m] == list(range(1, 9))


def test_csv_has_the_rows_with_nested_values_spread(swept: tuple[Path, str]) -> None:
    out, _ = swept
    with (out / store.CSV_NAME).open(newline="", encoding="utf-8") as handle:
        records = list(csv.DictReader(handle))
    rows = read_rows(out)
    assert [r["key"] for r in records] == [r["key"] for r in rows]
    for record, row in zip(records, rows, strict=True):
        assert record["size.N"] == str(row["sizes"]["N"]) == record["size"]
        assert int(record["cost_ps"]) == row["cost_ps"]
        parts = [float(v) for k, v in record.items() if k.startswith("cost.") and v]
        assert sum(parts) == pytest.approx(row["cost_s"])
        for symbol, value in row["counts"].items():
            assert record[f"count.{symbol}"] == str(value)
        assert record["variables"] == " ".join(f"{k}={v}" for k, v in row["variables"].items())
        assert set(row["counts"]) <= set(row["variables"]) and len(row["variables"]) > 3


def test_plots_are_images_with_one_series_per_hardware_model(swept: tuple[Path, str]
                                                             ) -> None:
    from matplotlib.image import imread
    from PIL import Image

    out, _ = swept
    plots = {p["name"]: p for p in json.loads((out / "plots.json").read_text())["plots"]}
    assert set(plots) == {"time_vs_size", "breakdown", "solve_time", "ratio"}
    for plot in plots.values():
        for name in plot["files"]:
            path = out / name
            if path.suffix == ".png":
                with Image.open(path) as image:
                    image.verify()
                height, width = imread(path).shape[:2]
                assert height > 100 and width > 100
            else:
                assert ET.parse(path).getroot().tag.endswith("svg")
    for name in ("time_vs_size", "solve_time"):  # the sweep has two models
        panels = plots[name]["panels"]
        assert [p["title"] for p in panels] == ["softmax", "va"]
        for panel in panels:
            assert panel["series"] == ["upmem", "cpu"] and panel["points"] == 4
        # in the images themselves: the models' colours (C0, C1) and no third one, and
        # each panel's legend names both models
        with Image.open(out / f"{name}.png") as image:
            colours = {c for _, c in image.convert("RGB").getcolors(2**24) or []}
        assert {SERIES_RGB[0], SERIES_RGB[1]} <= colours
        assert not colours & set(SERIES_RGB[2:])
        texts = [t.text for t in ET.parse(out / f"{name}.svg").iter()
                 if t.tag.endswith("text")]
        assert texts.count("upmem") == texts.count("cpu") == 2  # a legend per panel
    # upmem is the baseline (the first model): the ratio has the other one
    assert all(p["series"] == ["cpu"] for p in plots["ratio"]["panels"])
    assert "compute" in plots["breakdown"]["panels"][0]["series"]


SERIES_RGB = [(0x1F, 0x77, 0xB4), (0xFF, 0x7F, 0x0E), (0x2C, 0xA0, 0x2C), (0xD6, 0x27, 0x28),
              (0x94, 0x67, 0xBD), (0x8C, 0x56, 0x4B)]  # matplotlib's C0..C5


class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.images: list[str] = []
        self.links: list[str] = []
        self.rows = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if tag == "img":
            self.images.append(str(found["src"]))
        elif tag == "a":
            self.links.append(str(found["href"]))
        elif tag == "tr":
            self.rows += 1


def test_index_html_shows_the_plots_and_the_table(swept: tuple[Path, str]) -> None:
    out, _ = swept
    page = _Page()
    page.feed((out / "index.html").read_text(encoding="utf-8"))
    assert page.images == ["time_vs_size.svg", "breakdown.svg", "solve_time.svg", "ratio.svg"]
    assert all((out / image).is_file() for image in page.images)
    assert {"results.csv", "results.jsonl"} <= set(page.links)
    assert page.rows == 1 + 8  # the header and one row per point


# ---------------------------------------------------------------- resuming


def _refuse(points: Any, *args: Any) -> Iterator[Any]:
    if points:
        raise AssertionError(f"{len(points)} points ran")
    yield from ()


def test_a_rerun_skips_the_finished_points(copy_of: Path, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    before = {p.name: p.stat().st_mtime_ns for p in (copy_of / "points").iterdir()}
    monkeypatch.setattr(execute, "local", _refuse)
    assert command.main(Flags(str(copy_of), **SMALL_FLAGS)) == 0
    assert "(0 run in " in capsys.readouterr().out
    rows = read_rows(copy_of)
    assert len(rows) == 8 and all(r["from_store"] for r in rows)
    assert {p.name: p.stat().st_mtime_ns for p in (copy_of / "points").iterdir()} == before


def test_a_rerun_runs_the_missing_points_and_force_runs_all(
        copy_of: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = read_rows(copy_of)
    (copy_of / "points" / f"{first[2]['key']}.json").unlink()  # as if it was in flight
    assert command.main(Flags(str(copy_of), workers="1", **SMALL_FLAGS)) == 0
    again = read_rows(copy_of)
    assert [r["from_store"] for r in again] == [k != 2 for k in range(8)]
    assert costs(again) == costs(first)
    seen: list[int] = []

    def record(todo: Any, *args: Any) -> Iterator[Any]:
        seen.extend(p.index for p in todo)
        yield from ()

    monkeypatch.setattr(execute, "local", record)
    command.main(Flags(str(copy_of), force=True, **SMALL_FLAGS))
    assert seen == list(range(1, 9))


def test_an_interrupted_sweep_keeps_what_it_finished(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Ctrl-C after two points: they are stored and written, the sweep exits 130."""
    def two_then_interrupt(todo: Any, workers: int, emit_root: Any) -> Iterator[Any]:
        for point in todo[:2]:
            yield point, task.run(point, emit_root), True
        raise KeyboardInterrupt

    monkeypatch.setattr(execute, "local", two_then_interrupt)
    out = tmp_path / "out"
    assert command.main(Flags(str(out), **SMALL_FLAGS)) == 130
    said = capsys.readouterr().out
    assert "sweep: 2 of 8 points" in said and "interrupted: 6 points not run" in said
    assert len(list((out / "points").iterdir())) == 2
    assert [r["index"] for r in read_rows(out)] == [1, 2]


def test_results_jsonl_grows_as_points_finish(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """While a sweep runs, each finished point is a line of results.jsonl at once (in the
    order they finish); at the end the file is in the sweep's order."""
    out = tmp_path / "out"
    seen: list[list[int]] = []

    def backwards(todo: Any, workers: int, emit_root: Any) -> Iterator[Any]:
        for point in reversed(todo[:3]):
            yield point, task.run(point, emit_root), True
            seen.append([r["index"] for r in read_rows(out)])

    monkeypatch.setattr(execute, "local", backwards)
    flags = Flags(str(out), workloads=["va"], hardware=["cpu"], sizes=["N=64,128,256"])
    assert command.main(flags) == 0
    assert seen == [[3], [3, 2], [3, 2, 1]]
    assert [r["index"] for r in read_rows(out)] == [1, 2, 3]


def test_ctrl_c_on_a_real_sweep_keeps_the_finished_points(tmp_path: Path) -> None:
    """SIGINT to `synth sweep` in its own process, once the first point (va, tens of
    milliseconds) is in results.jsonl while the second (swiglu on upmem: seconds) runs:
    exit 130, the first point stored and in the tables, the second not; a rerun runs
    only the second."""
    import signal

    path = tmp_path / "sweep.toml"
    path.write_text("workloads = [{ name = 'va', sizes = { N = 64 } }, "
                    "{ name = 'swiglu', sizes = { S = 32 } }]\nhardware = ['upmem']\n",
                    encoding="utf-8")
    out = tmp_path / "out"
    sweep = subprocess.Popen([sys.executable, "-m", "synth.cli", "sweep", str(path), "--out",
                              str(out), "--workers", "1"], cwd=ROOT, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    jsonl = out / store.JSONL_NAME
    deadline = time.monotonic() + DASK_START_S
    while sweep.poll() is None and time.monotonic() < deadline and not (
            jsonl.exists() and jsonl.read_text(encoding="utf-8").count("\n") >= 1):
        time.sleep(0.05)
    sweep.send_signal(signal.SIGINT)
    stdout, _ = sweep.communicate(timeout=120)
    assert sweep.returncode == command.EXIT_INTERRUPTED, stdout
    assert "sweep: 1 of 2 points" in stdout and "interrupted: 1 points not run" in stdout
    assert [r["workload"] for r in read_rows(out)] == ["va"]
    assert len(list((out / "points").iterdir())) == 1
    plan = points.expand(spec.from_file(str(path)))
    keep = store.Store(out)
    assert [keep.load(p.key) is not None for p in plan] == [True, False]


def test_keys_follow_what_decides_a_result() -> None:
    def keys(**changes: Any) -> list[str]:
        flags = Flags("unused", **{**SMALL_FLAGS, **changes})
        return [p.key for p in points.expand(spec.from_flags(flags))]

    base = keys()
    assert len(set(base)) == 8 and keys() == base
    assert set(keys(time_limit="5")).isdisjoint(base)
    assert set(keys(hw_set=["launch=1us"])).isdisjoint(base)
    assert set(keys(constraints=["T >= 1"], hardware=["upmem"])).isdisjoint(base)
    # the variant's name is not part of a key; its settings are
    assert keys(variants=["other:"]) == base


def test_the_progress_bar_counts_points_and_shows_an_eta() -> None:
    import io

    from rich.console import Console

    screen = io.StringIO()
    todo = points.expand(spec.from_flags(Flags("unused", **SMALL_FLAGS)))
    with command.progress(8, 5, Console(file=screen, force_terminal=True, width=120)
                          ) as advance:
        advance(todo[5], {"status": "optimal"})
    drawn = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", screen.getvalue())
    assert "6/8" in drawn and "eta" in drawn
    assert "va N=4096 on upmem (base, cpsat): optimal" in drawn


# ---------------------------------------------------------------- failures


def test_a_failing_point_is_a_row_and_the_sweep_goes_on(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """matmul at M = N = K = 2^31-1 is too large to model (found by the solve, so not
    before the sweep): that point is a row with its error, the other one solves."""
    path = tmp_path / "sweep.toml"
    path.write_text("workloads = [{ name = 'matmul', sizes = [{ M = 32, N = 32, K = 32 }, "
                    "{ M = 2147483647, N = 2147483647, K = 2147483647 }] }]\n"
                    "hardware = ['cpu']\n", encoding="utf-8")
    code = command.main(Flags(str(tmp_path / "out"), spec=str(path), workers="1"))
    rows = read_rows(tmp_path / "out")
    assert [r["status"] for r in rows] == ["optimal", "error"]
    assert "too large to model" in rows[1]["error"] and rows[1]["exit_code"] == 2
    assert code == 2  # the failed point's code
    assert "point 2 (matmul on cpu, base, cpsat): " in capsys.readouterr().out


def test_a_worker_running_another_synth_is_an_error_row_with_exit_2(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker whose synth differs from the sweep's (here: the sweep believes itself
    another version) gives rows that say so and are not stored: the setup's fault, exit 2,
    not a bug in synth (70)."""
    monkeypatch.setattr(command, "synth_version", lambda: "0.0.0+another")
    code = command.main(Flags(str(tmp_path / "out"), workloads=["softmax"], hardware=["cpu"],
                              sizes=["N=1024"], workers="1"))
    [row] = read_rows(tmp_path / "out")
    assert row["status"] == "error" and row["exit_code"] == 2 and code == 2
    assert "this sweep 0.0.0+another: install this synth on every worker" in row["error"]
    assert not list((tmp_path / "out" / "points").glob("*"))


def crash_the_second(point: points.Point, emit_root: str | None) -> dict[str, Any]:
    """Run by a worker process: kill it at point 2, like a segfault or the OOM killer."""
    if point.index == 2:
        os._exit(9)
    return task.run(point, emit_root)


def test_a_worker_that_dies_costs_only_its_point() -> None:
    todo = points.expand(spec.from_flags(Flags("unused", workloads=["va"],
                                               hardware=["cpu"], sizes=["N=64,128,256"])))
    finished = {p.index: (result, storable) for p, result, storable in
                execute.local(todo, 1, None, run=crash_the_second)}
    assert sorted(finished) == [1, 2, 3]
    result, storable = finished[2]
    assert result["status"] == "error" and not storable  # a rerun tries it again
    assert f"died {execute.MAX_CRASHES} times" in result["error"]
    assert all(finished[k][0]["status"] == "optimal" and finished[k][1] for k in (1, 3))


# ---------------------------------------------------------------- Dask


def test_dask_local_cluster_gives_the_local_results(
        swept: tuple[Path, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same rows as local processes; and the LocalCluster's workers left the
    terminal's process group (Ctrl-C goes to the sweep, which stops them: CP-SAT in a
    worker died of it, printing a C++ error)."""
    groups: list[int] = []
    connect = execute.Cluster.connect

    def connected(cluster: execute.Cluster, say: Any) -> None:
        connect(cluster, say)
        groups.extend(cluster.client.run(os.getpgrp).values())

    monkeypatch.setattr(execute.Cluster, "connect", connected)
    out = tmp_path / "out"
    flags = Flags(str(out), dask="local", workers="1", **SMALL_FLAGS)
    assert command.main(flags) == 0
    rows = read_rows(out)
    assert costs(rows) == costs(read_rows(swept[0]))
    assert all(r["status"] == "optimal" and not r["from_store"] for r in rows)
    assert len(groups) == 1 and os.getpgrp() not in groups


@pytest.fixture
def dask_cluster(dask_processes: tuple[str, subprocess.Popen[bytes]]) -> str:
    return dask_processes[0]


@pytest.fixture
def dask_processes(tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """`dask scheduler` and `dask worker` as processes on 127.0.0.1; the address and the
    scheduler's process."""
    dask = Path(sys.executable).parent / "dask"
    scheduler_file = tmp_path / "scheduler.json"
    started = []
    try:
        started.append(subprocess.Popen(
            [str(dask), "scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
             "--scheduler-file", str(scheduler_file)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        started.append(subprocess.Popen(
            [str(dask), "worker", "--scheduler-file", str(scheduler_file), "--no-nanny",
             "--nthreads", "1", "--host", "127.0.0.1", "--no-dashboard"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        deadline = time.monotonic() + DASK_START_S
        while not scheduler_file.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        address = json.loads(scheduler_file.read_text())["address"]
        assert address.startswith("tcp://127.0.0.1:")
        yield address, started[0]
    finally:
        for process in reversed(started):  # the worker first: it would wait for the
            process.terminate()            # scheduler to come back
            process.wait(timeout=60)


def test_a_dask_address_nothing_answers_at_exits_2_and_writes_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setattr(execute, "CONNECT_TIMEOUT_S", 1)
    address = f"tcp://127.0.0.1:{port}"
    out = tmp_path / "out"
    with pytest.raises(InputError, match=f"--dask {address}: cannot connect to a Dask "
                                         f"scheduler there"):
        command.main(Flags(str(out), workloads=["va"], hardware=["cpu"], dask=address))
    assert f"connecting to the Dask scheduler at {address}" in capsys.readouterr().err
    assert not out.exists()


def test_dask_scheduler_and_worker_processes(dask_cluster: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    flags = Flags(str(out), workloads=["softmax"], hardware=["upmem,cpu"],
                  sizes=["N=1024"], dask=dask_cluster)
    assert command.main(flags) == 0
    rows = read_rows(out)
    assert [(r["hardware"], r["status"]) for r in rows] == [("upmem", "optimal"),
                                                            ("cpu", "optimal")]
    assert all(r["host"] == socket.gethostname() for r in rows)
    assert len(list((out / "points").iterdir())) == 2


def test_a_lost_scheduler_stops_the_sweep_with_exit_69(
        dask_processes: tuple[str, subprocess.Popen[bytes]], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The scheduler dies once the points are submitted (each takes a second or more to
    solve): the sweep stops at once with EX_UNAVAILABLE, not with one error row per point
    and exit 70 (a bug in synth) as before; a rerun resumes."""
    import distributed

    address, scheduler = dask_processes
    real = distributed.as_completed

    def kill_the_scheduler(futures: Any) -> Any:
        scheduler.kill()
        scheduler.wait(timeout=60)
        return real(futures)

    monkeypatch.setattr(distributed, "as_completed", kill_the_scheduler)
    out = tmp_path / "out"
    flags = Flags(str(out), workloads=["swiglu"], hardware=["cpu"], sizes=["S=32,64"],
                  dask=address)
    assert command.main(flags) == execute.EXIT_LOST == 69
    said = capsys.readouterr()
    assert f"lost the Dask scheduler at {address}" in said.err
    assert "the Dask scheduler was lost: 2 points not run" in said.out
    assert read_rows(out) == [] and "Traceback" not in said.err


# ---------------------------------------------------------------- spec files and flags


def test_size_values_lists_and_ranges() -> None:
    assert spec.size_values("1024..65536:x4", "w") == (1024, 4096, 16384, 65536)
    assert spec.size_values("1..10:3", "w") == (1, 4, 7, 10)
    assert spec.size_values([8, "1..3", "8,16"], "w") == (8, 1, 2, 3, 16)
    assert spec.size_values(5, "w") == (5,)


def _docs_spec() -> str:
    text = (ROOT / "docs" / "sweep.md").read_text(encoding="utf-8")
    return re.findall(r"```toml\n(.*?)```", text, re.DOTALL)[0]


def test_the_documented_spec_file_expands_as_documented(tmp_path: Path) -> None:
    path = tmp_path / "sweep.toml"
    path.write_text(_docs_spec(), encoding="utf-8")
    found = spec.from_file(str(path))
    todo = points.expand(found)
    per = Counter((p.workload, p.config, p.variant) for p in todo)
    # softmax: N from [sizes] (4 values); mv: its M x [sizes] N; matmul: its 2 points
    assert per["softmax", "cpu", "base"] == 4
    assert per["mv", "cpu", "base"] == 2 * 4
    assert per["matmul", "cpu", "base"] == 2
    # few_tasklets only on the upmem models; upmem has two wram.capacity configurations
    assert ("softmax", "cpu", "few_tasklets") not in per
    assert per["softmax", "upmem wram.capacity=64KiB", "few_tasklets"] == 4
    assert per["softmax", "upmem-1rank rank.count=1", "few_tasklets"] == 4
    assert len(todo) == sum(per.values()) == (4 + 8 + 2) * (1 + 2 * 3)
    assert points.baseline(found, todo) == points.Baseline("hw", "cpu")
    mv = next(p for p in todo if p.workload == "mv")
    assert dict(mv.sizes) == {"M": 256, "N": 1024}


BAD_SPECS = [
    ("workloads = []\nhardware = ['cpu']", "workloads: expected a non-empty list"),
    ("workloads = ['softmax']\nhardware = ['cpu']\nsolver = ['cpsat']",
     "solver: unknown key; did you mean 'solvers'?"),
    ("workloads = ['softmax']\nhardware = ['cpu']\n[sizes]\nN = 0", "sizes.N: 0 is out of"),
    ("workloads = ['softmax']\nhardware = ['cpu']\n[sizes]\nM = 4",
     "sizes.M: no workload of the sweep declares the size 'M'"),
    ("workloads = [{ name = 'mv', sizes = { Q = 4 } }]\nhardware = ['cpu']",
     "workloads[0].sizes (mv declares M, N): unknown size 'Q'"),
    ("workloads = ['softmax']\nhardware = [{ model = 'upmem', hw_set = { 'wram.capacty' = "
     "'1KiB' } }]", "hardware[0].hw_set.wram.capacty: unknown hardware key"),
    ("workloads = ['softmax']\nhardware = ['cpu']\n[[variant]]\nname = 'v'\n"
     "constraints = ['TT <= 4']", "variant[0] (v), on softmax and cpu: --constraint"),
    ("workloads = ['softmax']\nhardware = ['cpu']\n[[variant]]\nname = 'v'\n"
     "hardware = ['upmen']", "variant[0] (v) hardware: unknown hardware 'upmen'"),
    ("workloads = ['softmax']\nhardware = ['cpu']\ntime_limit = 'soon'",
     "time_limit: expected a number of seconds"),
    ("workloads = ['softmax']\nhardware = ['cpu', 'cpu']", "hardware[1]: hardware model "
                                                           "'cpu' is already in the sweep"),
    ("workloads = ['softmax']\nhardware = ['cpu']\nbaseline = 'solver:z3'",
     "baseline: unknown solver of the sweep 'z3'"),
    ("workloads = ['softmax'\n", "invalid TOML"),
]


@pytest.mark.parametrize(("text", "message"), BAD_SPECS)
def test_a_bad_spec_file_exits_2_naming_the_key(text: str, message: str,
                                                tmp_path: Path) -> None:
    path = tmp_path / "sweep.toml"
    path.write_text(text, encoding="utf-8")
    result = CliRunner().invoke(app, ["sweep", str(path), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith(f"error: {path}: ")
    assert message in result.stderr
    assert not (tmp_path / "o").exists()  # nothing ran, nothing written


BAD_FLAGS = [
    (["--set", "N=1..64:x1"], "--set N=1..64:x1: '1..64:x1': the factor"),
    (["--set", "N=5..2"], "'5..2' is an empty range"),
    (["--set", "N=1..100000000"], "more than a sweep may have"),
    (["--hw-set", "wram.capacity=12furlongs"], "expected a size like '64KiB'"),
    (["--variant", "T <= 4"], "--variant T <= 4: expected NAME: ITEM"),
    (["--variant", "x: drop capacity.wramm"], "--variant x: drop capacity.wramm, on softmax"),
    (["--solver", "cpsta"], "--solver cpsta: unknown solver 'cpsta'; did you mean cpsat?"),
    (["--workers", "0"], "--workers: 0 is out of range"),
    (["--dask", "tcp://127.0.0.1:1", "--workers", "2"], "--workers 2: a Dask cluster"),
    (["--baseline", "hw:aie"], "--baseline hw:aie: unknown hardware model of the sweep"),
    (["--emit", "cuda"], "--emit cuda: unknown target"),  # c is a target since issue 11
    (["--dask", "127.0.0.1:99999"], "--dask 127.0.0.1:99999: port 99999 is not a TCP port"),
    (["--variant", "few@upmen: T <= 4"], "--variant few@upmen: T <= 4 hardware: unknown "
                                         "hardware 'upmen'; did you mean upmem?"),
    (["--variant", "few: T <= 4"], "--variant few: T <= 4, on softmax and cpu: "
                                   "--constraint 'T <= 4': unknown name 'T'"),
]


@pytest.mark.parametrize(("extra", "message"), BAD_FLAGS)
def test_bad_flags_exit_2_naming_the_flag(extra: list[str], message: str,
                                          tmp_path: Path) -> None:
    args = ["sweep", "--workload", "softmax", "--hw", "upmem,cpu", *extra,
            "--out", str(tmp_path / "o")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: ") and message in result.stderr
    assert not (tmp_path / "o").exists()


def test_a_flag_variant_may_name_its_models() -> None:
    """`--variant 'NAME@HW: ...'`: a constraint on a variable only some models have."""
    flags = Flags("unused", workloads=["softmax"], hardware=["upmem,cpu"],
                  variants=["base:", "few@upmem: T <= 4", "one@cpu: P <= 1; drop capacity"])
    todo = points.expand(spec.from_flags(flags))
    assert [(p.config, p.variant, p.constraints, p.drops) for p in todo] == [
        ("upmem", "base", (), ()), ("upmem", "few", ("T <= 4",), ()),
        ("cpu", "base", (), ()), ("cpu", "one", ("P <= 1",), ("capacity",))]


def test_a_spec_file_and_axis_flags_do_not_mix(tmp_path: Path) -> None:
    path = tmp_path / "sweep.toml"
    path.write_text("workloads = ['softmax']\nhardware = ['cpu']\n", encoding="utf-8")
    with pytest.raises(InputError, match="--hw: the sweep is described by"):
        command.read_spec(Flags(str(tmp_path), spec=str(path), hardware=["upmem"]))


def test_sweep_needs_out() -> None:
    result = CliRunner().invoke(app, ["sweep", "--workload", "softmax", "--hw", "cpu"])
    assert result.exit_code == 2 and "needs --out DIR" in result.stderr


def test_the_cli_imports_no_plotting_or_dask() -> None:
    run = subprocess.run([sys.executable, "-c", "import sys, synth.cli; print(sorted("
                          "m for m in ('matplotlib', 'distributed', 'synth.sweep') "
                          "if m in sys.modules))"], capture_output=True, text=True,
                         check=True)
    assert run.stdout.strip() == "[]"
