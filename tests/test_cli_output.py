"""The command line's time and output (issue 12, item 7): a light `synth --help`, `synth
--version`, the whole run's time in the first line, a live status only on a terminal,
piped output neither wrapped nor padded, a broken pipe that keeps the exit code, and a
timeout message with the time actually spent."""

from __future__ import annotations

import io
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from synth import cli, pipeline, progress
from synth.cli import app
from synth.render import timeout_message

SYNTH = [sys.executable, "-m", "synth.cli"]
SMALL = ["solve", "softmax", "--hw", "upmem", "--set", "N=4096"]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SYNTH, *args], capture_output=True, text=True, timeout=300,
                          check=False)


def test_the_cli_module_imports_nothing_heavy() -> None:
    """`synth --help` loads the CLI alone: not the pipeline, the solvers, NumPy or rich
    (checked by what is imported, not by a clock)."""
    code = ("import sys, synth.cli; heavy = ['synth.pipeline', 'numpy', 'ortools', 'z3', "
            "'rich', 'networkx', 'synth.lang']; "
            "print([m for m in heavy if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"


def test_solvers_and_emitters_agree_with_the_pipeline() -> None:
    assert cli.SOLVERS == pipeline.SOLVERS
    assert cli.EMITTERS == pipeline.EMITTERS


def test_version() -> None:
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.stdout.strip() == f"synth {cli.version()}"
    assert cli.version()[0].isdigit()


def test_help_points_to_the_reference_pages() -> None:
    result = CliRunner().invoke(app, ["--help"])
    assert "docs/language.md" in result.stdout and "docs/hardware.md" in result.stdout
    listing = CliRunner().invoke(app, ["list"]).stdout
    assert "docs/language.md" in listing and "docs/hardware.md" in listing


def test_first_line_states_the_solve_and_the_total_time() -> None:
    result = CliRunner().invoke(app, [*SMALL, "--no-validate"])
    assert result.exit_code == 0, result.output
    first = result.stdout.splitlines()[0]
    assert ", solve time " in first and first.split(", ")[-1].startswith("total time ")


def test_piped_output_is_neither_wrapped_nor_padded() -> None:
    proc = run(*SMALL, "--binding", "--no-validate")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert not [line for line in lines if line != line.rstrip()]
    assert max(map(len, lines)) > 100  # a meaning or a loop line is not folded at 80
    # a table row is whole: the header of the variables table and a row of it
    assert any(line.split() == ["name", "value", "meaning"] for line in lines)
    assert any(line.split()[:2] == ["T", "16"] and "tasklets per dpu" in line
               for line in lines)
    assert proc.stderr == ""  # no status off a terminal


@pytest.mark.parametrize(("args", "code"), [
    (SMALL, 0),
    ([*SMALL, "--hw-set", "wram.capacity=16B"], 1),
    (["list"], 0),
    ([*SMALL, "--json"], 0),
])
def test_a_broken_pipe_ends_quietly_with_the_runs_exit_code(args: list[str], code: int
                                                            ) -> None:
    proc = subprocess.Popen([*SYNTH, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.read(1)
    proc.stdout.close()  # like `| head -c 1`
    assert proc.wait(timeout=300) == code
    assert proc.stderr.read() == b""


def test_status_only_on_a_terminal_and_erased() -> None:
    quiet = io.StringIO()
    with progress.Status(quiet):
        progress.stage("solve")
    assert quiet.getvalue() == ""
    shown = io.StringIO()
    status = progress.Status(shown, enabled=True)
    with status:
        progress.stage("solve")
        progress.best(20_350_000_000)
        assert status.line().startswith("synth: solve ")
        assert status.line().endswith(", best schedule so far 20.35 ms")
        status._write(status.line())
        status.shown = True
    assert shown.getvalue().endswith("\r\x1b[2K")  # the line is erased at the end
    progress.stage("after")  # no status is active any more: nothing happens
    progress.best(1)


def test_the_pipeline_reports_each_stage(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str] = []
    monkeypatch.setattr(progress, "stage", seen.append)
    pipeline.run(pipeline.Request("softmax", "upmem", {"N": 4096}, validate=True))
    assert seen[:5] == ["parse", "hardware", "encode", "solve", "materialise"]
    assert "validate" in seen


def test_timeout_message_states_the_time_spent() -> None:
    full = timeout_message(30.2, 30.0, {})
    assert full.startswith("no schedule found in 30.2 s (time limit 30 s)")
    early = timeout_message(13.0, 200.0, {"unknown": "incomplete quantifiers"})
    assert "gave up after 13 s, before its time limit of 200 s (incomplete quantifiers)" \
        in early
    told = timeout_message(2.0, 2.0, {"unknown": "reading its 31.0 MB encoding would run "
                                                 "past the time limit"})
    assert told.startswith("no schedule found in 2 s (time limit 2 s) (reading its 31.0 MB")
    assert "(timeout)" not in timeout_message(2.0, 2.0, {"unknown": "timeout"})


def test_unpadded_stream_strips_trailing_spaces_per_line() -> None:
    out = io.StringIO()
    stream = cli.Unpadded(out)
    stream.write("a  \nb")
    stream.write("  c   \n")
    assert out.getvalue() == "a\nb  c\n"

