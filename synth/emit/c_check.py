"""Checks the C that `synth.emit.c` wrote: build, run against the reference, time.

`check_c(out_dir)` runs `python -m synth.emit.c_check out_dir` in a child process, so a
crash of the emitted code (or of the compiler) is a failed check, not a dead synth. The
child:

1. builds `libsynth.so` with the system C compiler (`make`, flags in `synth.emit.c`);
2. loads it with ctypes, runs `synth_run` on the validation inputs written beside it,
   and compares every output with the reference (`synth.reference.compare`);
3. times it: one warm-up call, then the median of at least `MIN_RUNS` calls (more when
   a call is short, up to `MAX_RUNS`), the compiled computation only; and NumPy
   evaluating the same workload (`synth.numpy_eval`) timed the same way.

It prints one JSON object, which `check_c` reads back into a `CCheck`.

`one_thread=True` measures one thread's worth of work instead of the wall clock: the
child runs with `OMP_THREAD_LIMIT=1` (every parallel region of the emitted code on the
calling thread, the schedule's units one after another) and one BLAS thread
(`OPENBLAS_NUM_THREADS=1` and the like), and both sides are timed as the calling
thread's CPU time (`time.thread_time`), median of at least `ONE_THREAD_RUNS` calls: a
busy machine slows that far less than it slows a wall clock waiting for a second core.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import math
import os
import pickle
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

MIN_RUNS = 5
# `--measure` (`quick`): the checking call is the warm-up, and a call longer than
# LONG_RUN_S needs only QUICK_RUNS timed calls (its median moves little; gemm2k's optimum
# runs for seconds, and 8 schedules x 7 calls would take minutes)
QUICK_RUNS = 3
LONG_RUN_S = 1.0
MAX_RUNS = 50
ONE_THREAD_RUNS = 7
# the environment of a one-thread check: OpenMP and every BLAS NumPy may load on one thread
ONE_THREAD_ENV = {"OMP_THREAD_LIMIT": "1", "OMP_NUM_THREADS": "1",
                  "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
TIMING_BUDGET_S = 0.5  # per side: repeat a short call until about this much was spent
WORKLOAD_FILE = "workload.pkl"
# what the emitted Makefile builds; here, not in `synth.emit.c`, so that the checking child
# does not import the emitter (0.6 s of the transformer's 2.6 s check)
LIBRARY = "libsynth.so"
ALIGN = 64  # bytes: a cache line and an AVX-512 vector; every tensor handed to the C starts on one


def padded(nbytes: int) -> int:
    """`nbytes` rounded up to a whole number of `ALIGN`: C11's `aligned_alloc` takes a
    size that is a multiple of its alignment."""
    return -(-nbytes // ALIGN) * ALIGN


def aligned(array: np.ndarray) -> np.ndarray:
    """A C-contiguous copy of `array` whose data starts on an `ALIGN`-byte boundary.

    The emitted C loads and stores whole vectors (64 bytes with AVX-512) at offsets that
    are multiples of a vector from a tensor's start; on a tensor that starts elsewhere
    every one of them straddles two lines. NumPy's large arrays (glibc's mmap'd blocks)
    start 16 bytes past a page: fa6's QK^T with [1 x 16] register tiles, stored at every
    step of d, ran 0.090 ms on aligned tensors and 0.143 with s and kt 16 bytes off
    (RESULTS.md, "Tensors on cache lines")."""
    raw = np.empty(array.nbytes + ALIGN, dtype=np.uint8)
    start = -raw.ctypes.data % ALIGN
    out = raw[start:start + array.nbytes].view(array.dtype).reshape(array.shape)
    out[...] = array
    return out


def c_tensors(workload: Any, inputs: Mapping[str, np.ndarray],
              align: bool = True) -> dict[str, np.ndarray]:
    """Every tensor of `workload` as the emitted C takes it, in the workload's order:
    the `inputs` given, the others zeros, each on an `ALIGN`-byte boundary (`aligned`)
    unless not `align` (then each its own allocation, C-contiguous)."""
    tensors = {name: np.ascontiguousarray(inputs[name]) if name in inputs
               else np.zeros(t.shape, dtype=t.dtype.numpy)
               for name, t in workload.tensors.items()}
    return {name: aligned(t) for name, t in tensors.items()} if align else tensors


@dataclass(frozen=True)
class CCheck:
    built: bool
    passed: bool  # built, ran, and every output matched the reference
    max_abs_err: float | None
    max_rel_err: float | None
    run_s: float | None  # median time of one synth_run call
    numpy_s: float | None  # median time of NumPy evaluating the workload
    threads: int | None  # the most threads a kernel uses
    seconds: float  # the whole check
    log: str  # the compiler's output and the per-output verdicts

    @property
    def speedup_vs_numpy(self) -> float | None:
        if self.run_s is None or self.numpy_s is None or self.run_s <= 0:
            return None
        return self.numpy_s / self.run_s


def check_c(out_dir: str | Path, timeout_s: float = 600.0, time_runs: bool = True,
            time_numpy: bool = True, quick: bool = False, one_thread: bool = False
            ) -> CCheck:
    """Run the check in a child process; a crash or a timeout is a failed check.
    `time_numpy` False times the emitted code only (`numpy_s` stays None); `quick` times
    it after the checking call, with fewer runs when a call is long (`QUICK_RUNS`);
    `one_thread` times one thread's work as its CPU time (see the module's doc)."""
    start = time.perf_counter()
    args = [sys.executable, "-m", "synth.emit.c_check", str(out_dir)]
    if not time_runs:
        args.append("--no-timing")
    if not time_numpy:
        args.append("--no-numpy")
    if quick:
        args.append("--quick")
    env = None
    if one_thread:
        args.append("--one-thread")
        env = os.environ | ONE_THREAD_ENV
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env=env)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        return _failed(f"check timed out after {timeout_s:g} s\n{err}", start)
    try:
        data = json.loads(out.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError):
        how = (f"killed by signal {-proc.returncode}" if proc.returncode < 0
               else f"exit {proc.returncode}")
        built = (Path(out_dir) / "libsynth.so").exists()  # it crashed after building
        return _failed(f"the emitted program crashed ({how})\n{out}{err}", start, built)
    return CCheck(**data, seconds=time.perf_counter() - start)


def _failed(log: str, start: float, built: bool = False) -> CCheck:
    return CCheck(built, False, None, None, None, None, None, time.perf_counter() - start, log)


# ---------------------------------------------------------------- the child


def build(out: Path) -> tuple[bool, str]:
    proc = subprocess.run(["make", "--no-print-directory", "-C", str(out)],
                          capture_output=True, text=True)
    return proc.returncode == 0, proc.stdout + proc.stderr


def build_from_units(builds: Sequence[tuple[Path, Mapping[str, str]]], objects: Path,
                     compiler: Sequence[str], header: Path, vector_bytes: int,
                     workers: int) -> None:
    """Each directory's library from its translation units (`synth.emit.c.
    translation_units`, file name -> text), every distinct text compiled once into
    `objects` by `compiler` (the command and its flags), `workers` at a time, then each
    library linked. What the Makefile would build from kernels.c; a unit or link that
    fails leaves no library, and the check's `make` then builds kernels.c (and says why
    it fails, if it does).

    The units include `header` (synth_vec.h, at `vector_bytes`), which pulls in the
    ISA's intrinsics: 0.45 s of every compile with -march=native, most of a kernel's.
    It is precompiled once beside them (GCC's `.gch`; a compiler that cannot use it
    reads the header)."""
    if not builds:
        return
    objects.mkdir(parents=True, exist_ok=True)
    named = [(out, {_digest(text): text for text in units.values()}) for out, units in builds]
    sources = {digest: text for _, units in named for digest, text in units.items()}
    shutil.copyfile(header, objects / header.name)
    subprocess.run([*compiler, f"-DSYNTH_VB={vector_bytes}", "-x", "c-header", "-o",
                    str(objects / f"{header.name}.gch"), str(objects / header.name)],
                   capture_output=True)

    def compile_unit(digest: str) -> bool:
        source = objects / f"{digest}.c"  # beside the header: `#include "synth_vec.h"`
        source.write_text(sources[digest])
        return subprocess.run([*compiler, "-c", "-o", str(objects / f"{digest}.o"),
                               str(source)], capture_output=True).returncode == 0

    def link(out: Path, digests: Sequence[str]) -> None:
        subprocess.run([*compiler, "-o", str(out / LIBRARY),
                        *(str(objects / f"{d}.o") for d in digests), "-lm"],
                       capture_output=True)

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        built = dict(zip(sources, pool.map(compile_unit, sources), strict=True))
        list(pool.map(lambda job: link(*job),
                      [(out, list(units)) for out, units in named
                       if all(built[d] for d in units)]))


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def median_time(fn: Callable[[], object], warm_up: bool = True,
                min_runs: int = MIN_RUNS,
                clock: Callable[[], float] = time.perf_counter) -> float:
    """Median seconds of one call: a warm-up (unless the caller just made one), then at
    least `min_runs` timed calls (more when calls are short), by `clock`."""
    if warm_up:
        fn()
    times: list[float] = []
    while len(times) < min_runs or (sum(times) < TIMING_BUDGET_S and len(times) < MAX_RUNS):
        start = clock()
        fn()
        times.append(clock() - start)
    return statistics.median(times)


def run_child(out: Path, time_runs: bool, time_numpy: bool = True, quick: bool = False,
              one_thread: bool = False) -> dict[str, Any]:
    from synth import numpy_eval
    from synth.reference import compare

    built, log = build(out)
    result: dict[str, Any] = {"built": built, "passed": False, "max_abs_err": None,
                              "max_rel_err": None, "run_s": None, "numpy_s": None,
                              "threads": None, "log": log}
    if not built:
        return result
    workload = pickle.loads((out / "data" / WORKLOAD_FILE).read_bytes())
    inputs = {t.name: np.load(out / "data" / f"input_{t.name}.npy") for t in workload.inputs}
    # under the sanitizers (CFLAGS -fsanitize=...), each tensor is its own allocation, so
    # that a read past its end is past the allocation's
    sanitized = "-fsanitize" in os.environ.get("CFLAGS", "")
    tensors = c_tensors(workload, inputs, align=not sanitized)
    inputs = {name: tensors[name] for name in inputs}  # NumPy reads the same arrays
    lib = ctypes.CDLL(str((out / LIBRARY).resolve()))
    pointers = (ctypes.c_void_p * len(tensors))(*(a.ctypes.data for a in tensors.values()))
    checked = time.perf_counter()
    lib.synth_run(pointers)
    checked = time.perf_counter() - checked
    errors, lines = _compare(workload, tensors, out, compare)
    result.update(passed=all(ok for ok, _, _ in errors.values()),
                  max_abs_err=max((e[1] for e in errors.values()), default=0.0),
                  max_rel_err=max((e[2] for e in errors.values()), default=0.0),
                  threads=1 if one_thread else int(lib.synth_threads()),
                  log=log + "\n".join(lines))
    if time_runs and result["passed"] and one_thread:
        result["run_s"] = median_time(lambda: lib.synth_run(pointers), True,
                                      ONE_THREAD_RUNS, time.thread_time)
        if time_numpy:
            result["numpy_s"] = median_time(lambda: numpy_eval.evaluate(workload, inputs),
                                            True, ONE_THREAD_RUNS, time.thread_time)
    elif time_runs and result["passed"]:
        if quick:  # the checking call was the warm-up
            runs = QUICK_RUNS if checked > LONG_RUN_S else MIN_RUNS
            result["run_s"] = median_time(lambda: lib.synth_run(pointers), False, runs)
        else:
            result["run_s"] = median_time(lambda: lib.synth_run(pointers))
        if time_numpy:
            result["numpy_s"] = median_time(lambda: numpy_eval.evaluate(workload, inputs))
    return result


def _compare(workload: Any, tensors: Mapping[str, np.ndarray], out: Path,
             compare: Callable[..., tuple[Any, ...]]
             ) -> tuple[dict[str, tuple[bool, float, float]], list[str]]:
    """Each output against the reference, within the per-element tolerances of its error
    bound (`bound_<name>.npy`, see `synth.reference.compare`)."""
    errors = {}
    lines = []
    for tensor in workload.outputs:
        expected = np.load(out / "data" / f"expected_{tensor.name}.npy")
        bound_file = out / "data" / f"bound_{tensor.name}.npy"
        bound = np.load(bound_file) if bound_file.exists() else None
        ok, abs_err, rel_err, *_ = compare(expected, tensors[tensor.name], tensor.dtype,
                                           bound)
        errors[tensor.name] = (ok, _finite(abs_err), _finite(rel_err))
        lines.append(f"{tensor.name}: {'matches' if ok else 'DIFFERS from'} the reference "
                     f"(max abs err {abs_err:.3g}, max rel err {rel_err:.3g})")
    return errors, lines


def _finite(value: float) -> float:
    return value if math.isfinite(value) else sys.float_info.max


def main(argv: list[str]) -> int:
    out = Path(argv[0])
    result = run_child(out, time_runs="--no-timing" not in argv,
                       time_numpy="--no-numpy" not in argv, quick="--quick" in argv,
                       one_thread="--one-thread" in argv)
    print(json.dumps(result, allow_nan=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
