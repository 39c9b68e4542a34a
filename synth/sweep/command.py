"""What `synth sweep` does: read the sweep (a spec file or the flags), check and expand
its points, run the points the store does not have (local processes or Dask) under a
progress bar, store each result as it arrives, then write the tables, the plots and the
page into DIR and print a summary.

Exit codes: 0 when every point has a row and none failed, whatever its status
(infeasible and timed-out points are rows); else the first failed point's code: its
error's (4 for a loop nest breaking an IR rule, 70 for a bug in synth), or 4 for a failed
validation or emitted-program check (only with validation on). 2 for bad input, found
before any point runs. 130 when interrupted (Ctrl-C), 69 when the Dask scheduler is lost
mid-sweep (`execute.EXIT_LOST`): the rows so far are written, the
finished points stored, and a rerun of the same command resumes.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from synth import processes
from synth.errors import InputError
from synth.limits import parse_int
from synth.sweep import execute, store
from synth.sweep.points import Baseline, Point, baseline, expand, synth_version
from synth.sweep.spec import Flags, Spec, from_file, from_flags

if TYPE_CHECKING:
    from rich.console import Console

EXIT_OK = 0
EXIT_VALIDATION = 4
EXIT_INTERRUPTED = 130  # 128 + SIGINT: how shells report a run stopped by Ctrl-C
MAX_WORKERS = 1024  # more local processes than this is a typo on any machine
ERRORS_SHOWN = 5  # failed points the summary lists (the table has them all)
BAR_WIDTH = 24  # characters: the bar, counts and times fit 80 columns with room to spare


def read_spec(flags: Flags) -> Spec:
    """The sweep: the spec file, or the flags; not both."""
    if flags.spec is None:
        return from_flags(flags)
    given = flags.axis_flags()
    if given:
        raise InputError(f"{given[0]}: the sweep is described by {flags.spec}; set it there "
                         f"(docs/sweep.md), or give the whole sweep by flags without a spec "
                         f"file")
    return from_file(flags.spec)


@dataclass(frozen=True)
class Runner:
    workers: int  # local processes, or the workers of `--dask local`
    dask: str | None  # a scheduler's address, "local", or None (local processes)


def read_runner(flags: Flags) -> Runner:
    workers = (parse_int(flags.workers, "--workers", 1, MAX_WORKERS)
               if flags.workers is not None else None)
    if flags.dask is not None and not flags.dask.strip():
        raise InputError("--dask: expected a scheduler's address (tcp://HOST:PORT) or local")
    if flags.dask not in (None, "local") and workers is not None:
        raise InputError(f"--workers {flags.workers}: a Dask cluster at an address has its "
                         f"own workers; --workers sets local processes or --dask local's "
                         f"workers")
    _require("matplotlib", "draws its plots with")
    if flags.dask is not None:
        _require("distributed", "runs on Dask with")
        execute.check_address(flags.dask.strip())
    return Runner(workers or processes.usable_cores(),
                  flags.dask.strip() if flags.dask is not None else None)


def _require(module: str, what: str) -> None:
    try:
        importlib.import_module(module)
    except ImportError:
        raise InputError(f"synth sweep {what} {module}, which is not installed: "
                         f"pip install 'synth[sweep]'") from None


def out_dir(text: str, create: bool = True) -> Path:
    """`--out DIR`, checked (not a file); created unless `create` is False."""
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise InputError(f"--out {text}: exists and is not a directory")
    try:
        if create:
            path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"--out {text}: cannot create the directory: {exc}") from None
    return path


# ---------------------------------------------------------------- running


def say(text: str) -> None:
    """A line about the sweep on stderr (not stdout: that is the summary's)."""
    print(f"sweep: {text}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def progress(total: int, done: int, console: Console | None = None
             ) -> Iterator[Callable[[Point, Mapping[str, Any]], None]]:
    """A progress bar on stderr when it is a terminal: points done of all, elapsed, ETA,
    and the point that finished last; else (a log file, a batch job) one line per
    finished point with the same counts and estimate."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )
    from rich.table import Column

    console = console or Console(stderr=True)
    last = Column(no_wrap=True, overflow="ellipsis", ratio=1)  # what gives way when narrow
    columns = (TextColumn("sweep"), BarColumn(bar_width=BAR_WIDTH), MofNCompleteColumn(),
               TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
               TextColumn("{task.description}", table_column=last))
    log = LogLines(total, done, console.file) if not console.is_terminal else None
    with Progress(*columns, console=console, disable=log is not None,
                  expand=True) as bar:
        task_id = bar.add_task("", total=total, completed=done)

        def advance(point: Point, result: Mapping[str, Any]) -> None:
            description = f"{point.describe()}: {result['status']}"
            bar.update(task_id, advance=1, description=description)
            if log is not None:
                log.line(description)

        yield advance


class LogLines:
    """The progress bar as lines: `[12/195 2m01s eta 1m20s] softmax N=4096 on cpu ...`;
    the estimate is the points left at the rate points finished so far."""

    def __init__(self, total: int, done: int, file: IO[str]) -> None:
        self.total, self.done, self.file = total, done, file
        self.start, self.ran = time.monotonic(), 0

    def line(self, description: str) -> None:
        self.done, self.ran = self.done + 1, self.ran + 1
        elapsed = time.monotonic() - self.start
        left = (self.total - self.done) * elapsed / self.ran
        self.file.write(f"[{self.done}/{self.total} {clock(elapsed)} eta {clock(left)}] "
                        f"{description}\n")
        self.file.flush()


def clock(seconds: float) -> str:
    """`1h02m03s`, `2m01s`, `7s`."""
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m{secs:02d}s"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def results(points: Sequence[Point], runner: Runner, cluster: execute.Cluster | None,
            emit_root: str | None) -> execute.Results:
    if cluster is not None:
        return execute.on_dask(points, cluster, emit_root)
    return execute.local(points, runner.workers, emit_root)


def run_points(points: Sequence[Point], todo: Sequence[Point], runner: Runner, out: Path,
               rows: dict[int, dict[str, Any]], cluster: execute.Cluster | None = None
               ) -> int | None:
    """Run `todo`, storing each result and adding its row (to `rows` and to the end of
    `results.jsonl`) as it arrives; None when every point ran, else the exit code of
    why the sweep stopped early (interrupted; the Dask scheduler lost)."""
    keep = store.Store(out)
    version = synth_version()
    emit_root = str((out / "emit").resolve())
    try:
        with progress(len(points), len(points) - len(todo)) as advance, \
                store.Stream(out, [rows[p.index] for p in points if p.index in rows]
                             ) as stream, \
                contextlib.closing(results(todo, runner, cluster, emit_root)) as finished:
            for point, result, storable in finished:
                if result.get("synth") != version:
                    result = execute.failed(  # the setup's fault, not synth's: exit 2
                        point, f"the worker runs synth {result.get('synth')}, this sweep "
                        f"{version}: install this synth on every worker", InputError)
                    storable = False
                if storable:
                    keep.save(point, result)
                rows[point.index] = store.row(point, result, from_store=False)
                stream.add(rows[point.index])
                advance(point, result)
    except KeyboardInterrupt:
        say("interrupted: the finished points are stored; stopping the points in flight")
        return EXIT_INTERRUPTED
    except execute.ClusterLost as exc:
        say(f"{exc}: the finished points are stored; the others did not run")
        return execute.EXIT_LOST
    return None


@contextlib.contextmanager
def connected(runner: Runner, todo: Sequence[Point]) -> Iterator[execute.Cluster | None]:
    """The Dask cluster the points run on (None: local processes, or nothing to run),
    connected before the sweep writes anything."""
    if runner.dask is None or not todo:
        yield None
        return
    cluster = execute.Cluster(runner.dask, runner.workers)
    try:
        cluster.connect(say)
        yield cluster
    finally:
        cluster.close()


# ---------------------------------------------------------------- the command


def main(flags: Flags) -> int:
    spec = read_spec(flags)
    runner = read_runner(flags)
    points = expand(spec)
    base = baseline(spec, points)
    out = out_dir(flags.out, create=False)
    keep = store.Store(out)
    rows: dict[int, dict[str, Any]] = {}
    todo = []
    for point in points:
        stored = None if flags.force else keep.load(point.key)
        if stored is None:
            todo.append(point)
        else:
            rows[point.index] = store.row(point, stored, from_store=True)
    with connected(runner, todo) as cluster:  # a Dask scheduler that does not answer:
        out_dir(flags.out)                     # exit 2 before anything is written
        start = time.perf_counter()
        stopped = run_points(points, todo, runner, out, rows, cluster) if todo else None
        elapsed = time.perf_counter() - start
    ordered = [rows[p.index] for p in points if p.index in rows]
    written = write_outputs(out, ordered, base, spec, len(points), runner.workers)
    print(summary(ordered, len(points), elapsed, written, stopped), flush=True)
    return exit_code(ordered) if stopped is None else stopped


def write_outputs(out: Path, rows: Sequence[Mapping[str, Any]], base: Baseline | None,
                  spec: Spec, total: int, workers: int) -> list[Path]:
    """The tables, the plots (drawn side by side by up to `workers` processes) and the
    page; the paths written."""
    from synth.sweep import html, plots

    written = store.write_tables(out, rows)
    if workers > 1:
        with execute.process_pool(min(workers, len(plots.PLOTS))) as pool:
            drawn = plots.draw_all(out, rows, base, pool.map)
    else:
        drawn = plots.draw_all(out, rows, base)
    title = f"synth sweep: {spec.source}" if spec.source != "flags" else "synth sweep"
    written.append(html.write_index(out, title, rows, drawn, total, base))
    return written + [path for plot in drawn for path in plot.files]


def summary(rows: Sequence[Mapping[str, Any]], total: int, elapsed: float,
            written: Sequence[Path], stopped: int | None) -> str:
    statuses = Counter(str(r["status"]) for r in rows)
    counts = ", ".join(f"{n} {status}" for status, n in statuses.most_common())
    stored = sum(1 for r in rows if r["from_store"])
    head = (f"sweep: {len(rows)} of {total} points ({len(rows) - stored} run in "
            f"{elapsed:.1f} s, {stored} from the store): {counts or 'none'}")
    lines = [head]
    if stopped is not None:
        why = "interrupted" if stopped == EXIT_INTERRUPTED else "the Dask scheduler was lost"
        lines.append(f"{why}: {total - len(rows)} points not run; the same command "
                     f"resumes (finished points are stored)")
    failed = [r for r in rows if r["status"] == "error"]
    for r in failed[:ERRORS_SHOWN]:
        lines.append(f"  point {r['index']} ({r['workload']} on {r['config']}, "
                     f"{r['variant']}, {r['solver']}): {r['error']}")
    if len(failed) > ERRORS_SHOWN:
        lines.append(f"  ... {len(failed) - ERRORS_SHOWN} more errors (results.csv)")
    page = next((p for p in written if p.name == "index.html"), None)
    lines.append(f"wrote {len(written)} files into {written[0].parent}"
                 + (f"; open {page}" if page else "") if written else "wrote nothing")
    return "\n".join(lines)


def exit_code(rows: Sequence[Mapping[str, Any]]) -> int:
    for r in rows:
        if r["status"] == "error":
            return int(r.get("exit_code") or EXIT_OK)
        emitted = r.get("emitted") or {}
        if r.get("validation") is False or emitted.get("passed") is False:
            return EXIT_VALIDATION
    return EXIT_OK
