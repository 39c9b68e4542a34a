"""Worker processes: a `ProcessPoolExecutor` whose workers fork from a server that has
imported what they run once (each worker then starts in milliseconds, not the second an
import of the solvers takes), and that ignore Ctrl-C (their owner stops them). Used by
`synth sweep` (points) and by the CP-SAT backend (candidate kernels, `--jobs`)."""

from __future__ import annotations

import multiprocessing
import os
import signal
from concurrent.futures import ProcessPoolExecutor


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask where there is one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _ignore_interrupt() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def process_pool(workers: int, preload: str) -> ProcessPoolExecutor:
    """`workers` processes forked from a server that has imported module `preload`."""
    return ProcessPoolExecutor(workers, mp_context=_context(preload),
                               initializer=_ignore_interrupt)


def warm(preload: str) -> None:
    """Start `process_pool`'s fork server now, without waiting for it: it imports module
    `preload` (about 0.4 s) while the caller goes on, and a pool made later starts its
    workers at once."""
    if _context(preload).get_start_method() == "forkserver":
        from multiprocessing import forkserver
        forkserver.ensure_running()


def _context(preload: str) -> multiprocessing.context.BaseContext:
    """A fork server that imports `preload` first where there is one; spawn otherwise
    (Windows: every worker imports synth itself)."""
    if "forkserver" in multiprocessing.get_all_start_methods():
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload([preload])
        return context
    return multiprocessing.get_context("spawn")


def stop(pool: ProcessPoolExecutor) -> None:
    """Stop the workers now, whatever they run (an interrupted or abandoned run)."""
    processes = getattr(pool, "_processes", None) or {}  # no public way before Python 3.14
    for process in list(processes.values()):
        process.terminate()
    pool.shutdown(wait=True, cancel_futures=True)
