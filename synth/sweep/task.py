"""One point of a sweep, run where a worker runs it (a local process or a Dask worker).

`run` is `pipeline.run` on the point's request, turned into a JSON-ready result; it never
raises: a point whose run raised (bad input only this point has, a loop nest breaking an
IR rule, a bug) is a result with `status` "error", its message and exit code. The
workload and the model travel with the point as text: a worker reads them from their
files when it has the same files (a built-in, or the same path with the same text), else
from copies in a temporary directory, so a worker on another machine needs no shared
files. The result says which synth ran it (`synth`: version and source digest) and where.
"""

from __future__ import annotations

import contextlib
import os
import socket
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from synth import pipeline, report, tune
from synth.errors import InputError, SynthError
from synth.hwfile import read_model
from synth.lang import read_workload
from synth.pipeline import Outcome
from synth.sweep.points import Point, synth_version

EXIT_INTERNAL = 70  # as synth.cli: a bug in synth, not in the input
TRACEBACK_LINES = 12  # of an internal error's traceback, kept in the result for a report


class InternalError(SynthError):
    """A point's run raised something other than a `SynthError`: a bug in synth."""

    exit_code = EXIT_INTERNAL


def _same_text(read: Callable[[str], tuple[str, str, str]], ref: str, text: str) -> bool:
    try:
        return read(ref)[0] == text
    except InputError:
        return False


@contextlib.contextmanager
def _sources(point: Point) -> Iterator[tuple[str, str]]:
    """References to the point's workload and model that read its texts here."""
    refs = {"workload": point.workload_ref, "hardware": point.hardware_ref}
    stale = {kind: text for kind, text, read in (
        ("workload", point.workload_text, read_workload),
        ("hardware", point.hardware_text, read_model))
        if not _same_text(read, refs[kind], text)}
    if not stale:
        yield refs["workload"], refs["hardware"]
        return
    with tempfile.TemporaryDirectory(prefix="synth-sweep-") as tmp:
        for kind, text in stale.items():
            suffix = ".syn" if kind == "workload" else ".toml"
            path = Path(tmp) / (Path(refs[kind]).stem + suffix)  # the name is the stem
            path.write_text(text, encoding="utf-8")
            refs[kind] = str(path)
        yield refs["workload"], refs["hardware"]


def dask_setup(worker: object) -> None:
    """Run by each worker of `--dask local` as it starts (a Dask preload): the worker
    leaves the terminal's process group, so that Ctrl-C reaches the sweep only, which
    then stops the cluster itself (Ctrl-C in the worker killed it mid-solve, with
    CP-SAT's SIGINT handler printing `terminate called ... bad_function_call`)."""
    if hasattr(os, "setpgrp"):
        os.setpgrp()


def run(point: Point, emit_root: str | None = None) -> dict[str, Any]:
    """The point's result (see `result`); `emit_root/<key>` receives `--emit`'s files."""
    start = time.perf_counter()
    out_dir = str(Path(emit_root) / point.key) if emit_root and point.options.emit else None
    request = point.request(point.workload_ref, point.hardware_ref, out_dir)
    outcome: Outcome | None = None
    error: SynthError | None = None
    trace: list[str] | None = None
    try:
        with _sources(point) as (workload_ref, hardware_ref):
            outcome = pipeline.run(point.request(workload_ref, hardware_ref, out_dir))
    except SynthError as exc:
        error = exc
    except Exception as exc:  # a bug: this point's row says so, the sweep goes on
        error = InternalError(f"internal error: {type(exc).__name__}: {exc}")
        trace = traceback.format_exc().splitlines()[-TRACEBACK_LINES:]
    wall = time.perf_counter() - start
    data = result(tune.VariantResult(tune.Variant(point.index, (), request), outcome, error,
                                     wall))
    data["traceback"] = trace
    return data


def result(run: tune.VariantResult) -> dict[str, Any]:
    """A point's result: the fields of a `synth tune` row (`tune.row`: status, objective,
    bound, gap, cost, solve and wall time, binding, conflict, validation, variables,
    error) and the cost's parts in seconds, the hardware counts and kernels chosen, the
    stages' times, validation and emitted-program details, and who ran it."""
    data = tune.row(run)
    for key in ("index", "settings", "vs_best"):
        data.pop(key)
    outcome = run.outcome
    cost = outcome.cost if outcome is not None else None
    data.update({
        "cost_ps": tune.cost_ps(run),
        "breakdown_s": {("transfer " if p.is_transfer else "") + p.name: p.seconds
                        for p in report.cost_parts(cost)} if cost is not None else None,
        "counts": _counts(outcome),
        "kernels": ([k.name for k in outcome.program.kernels]
                    if outcome is not None and outcome.program is not None else None),
        "timings": dict(outcome.timings) if outcome is not None else None,
        "validation_detail": _validation(outcome),
        "emitted": _emitted(outcome),
        "error_type": type(run.error).__name__ if run.error is not None else None,
        "exit_code": run.error.exit_code if run.error is not None else None,
        "synth": synth_version(),
        "host": socket.gethostname(),
    })
    return report.jsonable(data)


def _counts(outcome: Outcome | None) -> dict[str, int] | None:
    """The hardware's unit counts the schedule allocates (R, D, T; P; X, Y)."""
    if outcome is None or outcome.program is None:
        return None
    symbols = set(outcome.hardware.count_symbols)
    return {row.name: row.value for row in report.variable_rows(outcome)
            if row.name in symbols}


def _validation(outcome: Outcome | None) -> dict[str, Any] | None:
    data = report.validation_json(outcome) if outcome is not None else None
    if data is None:
        return None
    return {key: data[key] for key in ("passed", "max_abs_err", "max_rel_err",
                                       "tolerance_used", "wall_s")}


def _emitted(outcome: Outcome | None) -> dict[str, Any] | None:
    """`--emit`: the target, where its files are, and whether its check passed (None
    when it did not run: validation off)."""
    if outcome is None or outcome.emitted is None:
        return None
    target, data = next(iter(report.emitted_json(outcome).items()))
    return {"target": target, "path": data["path"], "files": data["files"],
            "checked": data["checked"], "passed": data["passed"], "seconds": data["seconds"]}
