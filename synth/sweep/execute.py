"""Running a sweep's points: in local worker processes (`local`) or as tasks on a Dask
cluster (`on_dask`). Both yield `(point, result, storable)` as points finish, in the
order they finish; `storable` is False for a result that says the run could not be
carried out (a worker died, the cluster lost the task), which a rerun should try again.

Local workers are processes of a `ProcessPoolExecutor`, started from a fork server that
has imported the pipeline once (each worker then starts in milliseconds, not the second
an import of the solvers takes), and ignore Ctrl-C: the sweep stops them itself. At most
`IN_FLIGHT` points per worker are submitted at a time, so a worker never waits for work
and an interruption has little to cancel. A worker that dies (a crash, the kernel's
out-of-memory killer) breaks the pool: its points are retried in a new pool, and a point
whose worker died `MAX_CRASHES` times is an error row: the points that were running
when a worker died run again one at a time, so a point that did not kill its worker is
not blamed for one that did.
"""

from __future__ import annotations

import os
from collections import Counter, deque
from collections.abc import Callable, Generator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from synth import processes, tune
from synth.errors import InputError, SynthError
from synth.sweep import task
from synth.sweep.points import Point

Finished = tuple[Point, dict[str, Any], bool]
Results = Generator[Finished, None, None]

IN_FLIGHT = 2  # points submitted per worker: one running, one waiting in its queue
MAX_CRASHES = 2  # a point is an error once the worker running it died this many times
WORKER_CONFIG = {"distributed.worker.profile.enabled": False}
"""`--dask local`'s workers do not sample their threads' stacks every 10 ms (distributed's
profiler, on by default: overhead a point's Python stages pay, for a dashboard the sweep
does not start)."""
CONNECT_TIMEOUT_S = 30  # to reach a Dask scheduler (distributed's own default is 30 s)
CLOSE_TIMEOUT_S = 10  # to close the client (a lost scheduler: it gives up at once)


def failed(point: Point, message: str,
           kind: type[SynthError] = task.InternalError) -> dict[str, Any]:
    """The result of a point that could not be run (not stored: a rerun tries again),
    with an error of `kind` (its exit code: a bug in synth unless said otherwise)."""
    request = point.request(point.workload_ref, point.hardware_ref, None)
    error = kind(message)
    return task.result(tune.VariantResult(tune.Variant(point.index, (), request), None,
                                          error, 0.0))


# ---------------------------------------------------------------- local processes


def process_pool(workers: int) -> ProcessPoolExecutor:
    """Worker processes forked from a server that has imported the pipeline."""
    return processes.process_pool(workers, "synth.sweep.task")


RunPoint = Callable[[Point, str | None], dict[str, Any]]


class _Local:
    """The points not finished yet, and the pool running some of them."""

    def __init__(self, points: Sequence[Point], workers: int, run: RunPoint,
                 emit_root: str | None) -> None:
        self.queue = deque(points)
        self.suspects: deque[Point] = deque()  # were running when a worker died
        self.crashes: Counter[int] = Counter()
        self.running: dict[Future[dict[str, Any]], Point] = {}
        self.workers, self.run, self.emit_root = workers, run, emit_root
        self.pool = process_pool(workers)

    def submit(self) -> None:
        """Suspects run alone, one after the other (the one that kills its worker alone
        is the culprit); the other points `IN_FLIGHT` per worker."""
        if self.suspects:
            if not self.running:
                self._submit(self.suspects.popleft())
            return
        while self.queue and len(self.running) < IN_FLIGHT * self.workers:
            self._submit(self.queue.popleft())

    def _submit(self, point: Point) -> None:
        self.running[self.pool.submit(self.run, point, self.emit_root)] = point

    def finished(self) -> Results:
        done, _ = wait(self.running, return_when=FIRST_COMPLETED)
        lost = []
        for future in done:
            point = self.running.pop(future)
            try:
                result = future.result()
            except BrokenProcessPool:
                lost.append(point)
                continue
            yield point, result, True
        if lost:  # a worker died: the pool is broken, every point it held is lost
            yield from self._lost([*lost, *self.running.values()])

    def _lost(self, lost: Sequence[Point]) -> Results:
        self.running.clear()
        self.pool.shutdown(wait=True)
        self.pool = process_pool(self.workers)
        for point in lost:
            self.crashes[point.index] += 1
            if self.crashes[point.index] < MAX_CRASHES:
                self.suspects.append(point)
            else:
                yield point, failed(point, "the worker process running this point died "
                                    f"{MAX_CRASHES} times"), False

    def close(self) -> None:
        if self.running or self.queue or self.suspects:
            processes.stop(self.pool)
        else:
            self.pool.shutdown(wait=True)


def local(points: Sequence[Point], workers: int, emit_root: str | None,
          run: RunPoint = task.run) -> Results:
    """The points' results from `workers` local processes, as they finish; each point
    runs as `run(point, emit_root)` (a module-level function: workers import it)."""
    state = _Local(points, workers, run, emit_root)
    try:
        while state.queue or state.suspects or state.running:
            state.submit()
            yield from state.finished()
    finally:
        state.close()


# ---------------------------------------------------------------- Dask


MAX_PORT = 65535


def check_address(address: str) -> None:
    """`--dask ADDRESS`'s shape, before anything waits on it: `local`, or an address
    whose port (when it has one) is a TCP port (InputError: exit 2)."""
    host, sep, port = address.rpartition(":")
    if address == "local" or not sep or not port.isdigit() or "//" in port:
        return
    if not 1 <= int(port) <= MAX_PORT:
        raise InputError(f"--dask {address}: port {port} is not a TCP port (1-{MAX_PORT})")


DASK_LOG_LEVEL = "error"
"""What `--dask local`'s scheduler, nannies and workers log (to stderr): errors only. At
Dask's default (warnings), a sweep interrupted by Ctrl-C printed a screenful: the
cancelled tasks, and a worker `still alive after 4.0 seconds, killing` (one in CP-SAT,
which does not return to Python until its search ends). The sweep's own process logs
nothing from Dask (`critical` only): what matters (a scheduler that cannot be reached or
is lost) the sweep says itself, without the client's reconnection tracebacks."""


def quiet_dask() -> None:
    """Dask's loggers at `DASK_LOG_LEVEL` in the processes started from here (they read
    the environment when they import distributed), at critical here."""
    import logging

    os.environ["DASK_LOGGING__DISTRIBUTED"] = DASK_LOG_LEVEL
    for name in ["distributed", *logging.root.manager.loggerDict]:
        if name.split(".")[0] == "distributed":  # dask's config sets some levels of
            logging.getLogger(name).setLevel(logging.CRITICAL)  # its own (the client's)


class ClusterLost(Exception):
    """The client lost its Dask scheduler in the middle of the sweep: the points not
    finished cannot run (`synth sweep` stores what finished and exits `EXIT_LOST`)."""


EXIT_LOST = 69  # EX_UNAVAILABLE of sysexits.h: the cluster went away; a rerun resumes


class Cluster:
    """A client of the Dask cluster at an address, or of a new `LocalCluster` ("local"):
    `connect` before the sweep writes anything (an address nothing answers at is bad
    input, exit 2, after `CONNECT_TIMEOUT_S`), `close` when the sweep ends."""

    def __init__(self, address: str, workers: int) -> None:
        self.address, self.workers = address, workers
        self.client: Any = None
        self.cluster: Any = None

    def connect(self, say: Callable[[str], None]) -> None:
        from distributed import Client, LocalCluster

        quiet_dask()
        if self.address == "local":
            import dask

            say(f"starting a Dask LocalCluster of {self.workers} worker processes")
            with dask.config.set(WORKER_CONFIG):  # the workers' processes inherit it
                self.cluster = LocalCluster(n_workers=self.workers, threads_per_worker=1,
                                            processes=True, dashboard_address=None,
                                            preload=[task.__name__])  # task.dask_setup
            self.client = Client(self.cluster)
            return
        say(f"connecting to the Dask scheduler at {self.address} (giving up after "
            f"{CONNECT_TIMEOUT_S} s)")
        try:
            self.client = Client(self.address, timeout=CONNECT_TIMEOUT_S)
        except (OSError, TimeoutError, ValueError) as exc:
            raise InputError(f"--dask {self.address}: cannot connect to a Dask scheduler "
                             f"there: {exc}") from None
        if not self.client.scheduler_info().get("workers"):
            say(f"the Dask scheduler at {self.address} has no workers yet: the points "
                f"wait for one")

    def close(self) -> None:
        if self.client is not None:
            self.client.close(timeout=CLOSE_TIMEOUT_S)
        if self.cluster is not None:
            self.cluster.close()


def on_dask(points: Sequence[Point], cluster: Cluster, emit_root: str | None) -> Results:
    """The points' results from tasks on a connected Dask cluster, as they finish."""
    from distributed import as_completed

    client = cluster.client
    futures: dict[Any, Point] = {}
    try:
        for point in points:
            future = client.submit(task.run, point, emit_root, pure=False,
                                   key=f"synth-sweep-{point.index}-{point.key}")
            futures[future] = point
        for future in as_completed(list(futures)):
            point = futures.pop(future)
            try:
                outcome, storable = future.result(), True
            except Exception as exc:  # the task was lost (a worker died) or cancelled
                if client.status != "running":  # no scheduler: no point can run
                    raise ClusterLost(f"lost the Dask scheduler at {cluster.address} "
                                      f"(the client is {client.status})") from None
                outcome = failed(point, f"Dask: {type(exc).__name__}: {exc}")
                storable = False
            yield point, outcome, storable
    finally:
        if futures and client.status == "running":
            client.cancel(list(futures))
