"""`synth calibrate --hw cpu --out FILE.toml`: measure this machine, write a hardware model.

The micro-benchmarks are C (`synth/emit/c_runtime/calibrate.c`), built with the system
compiler with the emitted code's flags (`synth.emit.c.CFLAGS`, at the base model's
vector width) and called through ctypes. Each returns the seconds its loop took; `measure` sizes
every loop to about `Settings.target_s`, repeats it `Settings.reps` times and keeps the
median. What is measured, and where it goes in the model (docs/hardware.md, "Calibrating"):

- the core clock (a chain of dependent integer adds, one cycle each) -> `compute.clock`,
  `host.clock`; every other time is converted to cycles of it;
- f32 throughput of add, mul, max, FMA (12 independent chains) and synth_vec.h's exp, log,
  tanh, sqrt and the divisions the C emitter writes (x / y, 1 / sqrt, 1 / x), in cycles
  per vector instruction -> `compute.cycles.f32.OP` (and `host.cycles.f32.OP`) for every
  OP the base model lists; the latency of a dependent FMA chain -> the base model's
  `compute.accumulate_latency.f32` when it has one, and of a dependent add or max chain
  (the slower) -> `compute.add_latency.f32`;
- the fold of a vector's lanes into one (`vsum_f32`: log2(lanes) shuffles and adds) after
  each vector of exps, less the same loop summing in a vector -> `compute.shuffle_cycles.f32`
  when the base model has the key: the fold's cycles per step less an add's;
- the ISA's gather of a vector whose lanes lie on separate lines in L1 (`vgather_f32`),
  8 independent ones each followed by its add -> `compute.gather_cycles.f32`, and the 8
  back to back before their adds -> `compute.grouped_gather_cycles.f32`; a broadcasting
  load (`vsplat_f32` of an element in L1), 12 independent ones ->
  `compute.broadcast_cycles.f32`;
- a GEMM register tile's loop (8 broadcasts, a vector load and 8 FMAs per iteration):
  the share of its loads' time (the broadcasts' and the L1 read's) that its FMAs do not
  hide (`exposed_share`), reported in the header only. The registers' `exposed` stays the
  base model's, fitted to whole schedules: a tight loop hides more of its loads than
  kernels do (AMD Zen 3: the loop 0.09-0.27; 22 stored schedules of each GEMM ranked
  best at 0.5-0.9, benchmarks/RESULTS.md "Broadcasts that load");
- a strip a line wide down 128 rows a way of the L1d apart (rows that share one of its
  sets, more of them than it holds), walked again and again, per line: a vector load ->
  the L1 memory's `aliased_read`; a load, an add and a store back -> its `aliased_write`
  (`transfers.strip_moves`), when the base model has `ways` on it and sysfs gives the
  L1d's associativity;
- DRAM read in runs of 128 bytes, rows 16 KiB apart (each run on another page, as the C
  emitter's packs read a tile narrower than a large tensor's rows), with every usable
  core: the time per run beyond its bytes at DRAM's bandwidth -> `run_latency` on the
  memory whose parent is DRAM, when the base model has the key;
- read bandwidth (bytes per cycle) and load-to-use latency (a pointer chase over cache
  lines in random order) of buffers held in L1, L2, L3 and DRAM -> each memory's
  `bandwidth` and `latency`, which describe transfers *from its parent* (l1's are L2's
  reads; a register memory under l1 gets L1's); DRAM's bandwidth with every core
  reading, the caches' with one. A latency the base model sets to 0 stays 0 (the model
  says those transfers overlap compute);
- the L3 this process can keep: read bandwidth (one core) of buffers growing by sqrt(2)
  from twice the L3 buffer up to the detected L3; the last read at least `KEPT_SHARE` of
  the L3's rate -> the L3 memory's `capacity` (its `detect` dropped) when it is below the
  detected size. A virtual machine's L3 is its host's: sysfs said 300 MiB on an Intel
  Xeon where reads past 48 MiB ran at DRAM's rate, and the model kept a 64 MiB weight
  warm there (RESULTS.md, "The L3 a virtual machine keeps");
- an OpenMP parallel region's start and join -> `launch`; a barrier -> the core level's
  `barrier` when the base model has one;
- usable cores: FMA throughput of all CPUs running at once over one's -> the core level's
  `count`.

Every micro-benchmark runs in passes, seconds apart, each number the best any pass gave
(`combine`), until a pass improves none by more than a tenth (`Settings`): a busy moment
outlasts one measurement's repetitions.

The model written is the base model's file with those values substituted, under a
header comment that says what was measured, when, on which CPU and under what load.
"""

from __future__ import annotations

import ctypes
import datetime
import functools
import json
import math
import os
import subprocess
import tempfile
import time
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from synth.emit.c import CFLAGS
from synth.errors import InputError, SynthError
from synth.hardware import Hardware
from synth.hwfile import load_hardware, read_model
from synth.hwunits import detect_cache_size, detect_cache_ways, parse_time

SOURCE = "calibrate.c"
LIBRARY = "libcalibrate.so"
# the f32 operations measured, as calibrate.c names them (synth_cal_OP)
OPS = ("add", "mul", "max", "fma", "div", "sqrt", "rsqrt", "recip", "exp", "log", "tanh")
THROUGHPUT_CHAINS = 12  # vector instructions per iteration of the arithmetic loops
ROUTINE_CALLS = 8  # routine calls per iteration of the vector math loops
CLOCK_STEPS = 16  # dependent adds per iteration of synth_cal_clock
LATENCY_STEPS = 8  # dependent operations per iteration of synth_cal_OP_latency
LATENCIES = ("fma", "add", "max")  # the chains measured (synth_cal_OP_latency)
FOLD_LOOPS = ("exp_sum", "exp_fold")  # a vector of exps per iteration, summed or folded
GATHERS = 8  # gathers per iteration of synth_cal_gather and synth_cal_gather_run
BROADCASTS = 12  # broadcasting loads per iteration of synth_cal_broadcast
TILE_ROWS = 8  # broadcasts and FMAs per iteration of synth_cal_microkernel (one load)
LINE = 64  # bytes: the pointer chase visits one cache line per step
# rows of the strip synth_cal_strip walks, a way of the L1d apart: more than its ways hold
# (12 on AMD Zen 5 and Intel Golden Cove), fewer than the L2 holds
STRIP_ROWS = 128
RUN_BYTES = 128  # the runs synth_cal_runs reads from DRAM, ...
RUN_STRIDE = 16 << 10  # ... each from a row this many bytes after the last (another page)
# where in a line the read buffers start: on a line, as the tensors handed to the emitted C
# (`c_check.aligned`) and its own buffers do. 16 bytes in (as NumPy's large arrays start),
# every 64-byte load splits two lines: L1 read 63 B/cycle against 126 on AMD Zen 5, the L2's
# 23 against 46 on an Intel Xeon (RESULTS.md, "Reads on cache lines").
ALIGN = 0
KEPT_SHARE = 0.7  # a buffer read at this share of the L3's rate or more is kept in the L3
BUSY_LOAD = 0.5  # a 1-minute load average at or above this: the machine is busy
LEVELS = ("L1d", "L2", "L3", "DRAM")
# fallbacks when sysfs does not say (the cpu model's fallbacks)
FALLBACK_CACHE = {"L1d": 32 << 10, "L2": 512 << 10, "L3": 32 << 20}
# what `measure` tells its `step` callback, one call per measurement: per pass (the clock;
# each op; latencies, the fold, gathers, broadcasts, the GEMM tile, usable cores, the
# aliasing strip; each level's bandwidth and latency; the L3 kept; DRAM runs; OpenMP) ...
PASS_STEPS = 1 + len(OPS) + 7 + 2 * len(LEVELS) + 3


def steps(passes: int) -> int:
    """... and building the benchmarks once: the progress bar's total for `passes`."""
    return 1 + passes * PASS_STEPS


class CalibrationError(SynthError):
    """The benchmarks could not be built or run (no C compiler, a crash)."""

    exit_code = 2


@dataclass(frozen=True)
class Settings:
    """How long each measurement runs: `target_s` per repetition, `reps` repetitions
    (the fastest is kept: on a shared machine another process only ever slows a run
    down, and many short runs find the quiet moments more often than a few long
    ones); `dram_cap` bounds the DRAM buffer (twice the L3 otherwise).

    A busy moment can last longer than one measurement's repetitions (a calibration taken
    beside a test suite read the L1 at 68 B/cycle against 111 and kept 8 MiB of the L3
    against 92: RESULTS.md, "A calibration on a busy host"), so every micro-benchmark
    runs in passes, seconds apart, each number the best any pass gave: at least
    `min_passes`, then until a pass improves no number by more than `settle` (a share),
    at most `passes`, and no pass started that would end past `budget_s`."""

    target_s: float = 0.004
    reps: int = 15
    dram_cap: int = 1 << 30
    passes: int = 5
    min_passes: int = 2
    settle: float = 0.1
    budget_s: float = 50.0


DEFAULT = Settings()  # what `synth calibrate` uses (2-5 passes of 5-10 s)
# tests: the numbers are rough
QUICK = Settings(target_s=0.001, reps=1, dram_cap=64 << 20, passes=1, min_passes=1)


@dataclass(frozen=True)
class Calibration:
    """What `measure` found. Cycles are of the measured clock."""

    cpu: str
    when: str  # UTC, ISO 8601
    load: tuple[float, float, float]  # 1, 5, 15-minute load averages before measuring
    cpus: int  # CPUs this process may run on
    vector_bytes: int
    clock_hz: float
    cycles: Mapping[str, float]  # f32 op -> cycles per vector instruction (throughput)
    latency_cycles: Mapping[str, float]  # fma, add, max -> cycles each in a dependent chain
    exp_sum_cycles: float  # per vector of exps summed in a vector accumulator
    exp_fold_cycles: float  # per vector of exps folded into a scalar each time
    gather_cycles: float  # cycles per vector gathered from separate lines in L1
    grouped_gather_cycles: float  # the same, each of 8 gathers back to back
    broadcast_cycles: float  # cycles per broadcasting load of an element in L1
    microkernel_cycles: float  # cycles per iteration of the GEMM register tile's loop
    # "read", "write" -> cycles per line of a strip whose rows alias in the L1d (empty:
    # its associativity unknown)
    strip_cycles: Mapping[str, float]
    bandwidth: Mapping[str, float]  # level -> bytes per cycle (DRAM: all cores)
    latency: Mapping[str, float]  # level -> cycles from load to use
    run_cycles: float  # a RUN_BYTES run of rows RUN_STRIDE apart read from DRAM, all cores
    sizes: Mapping[str, int]  # level -> bytes of the buffer measured
    # bytes: the largest buffer one core read at the L3's rate (`kept_of`); None: every
    # buffer up to the detected L3
    l3_kept: int | None
    region_s: float  # an OpenMP parallel region started and joined
    barrier_s: float
    usable_cores: int
    seconds: float = 0.0  # the whole measurement
    notes: tuple[str, ...] = field(default_factory=tuple)
    # bytes -> bytes per second one core read a buffer that size at (`l3_reads`); the
    # buffers `l3_kept` was found from
    l3_reads: Mapping[int, float] = field(default_factory=dict)
    passes: int = 1  # passes of the micro-benchmarks, each number the best of them
    # numbers the last pass still improved by more than `Settings.settle` (empty: settled)
    unsettled: tuple[str, ...] = field(default_factory=tuple)

    @property
    def fold_cycles(self) -> float:
        """Cycles a fold of one vector's lanes adds after a vector of exps (the two loops'
        difference; a fold costs no less than nothing)."""
        return max(self.exp_fold_cycles - self.exp_sum_cycles, 0.0)

    @property
    def busy(self) -> bool:
        return self.load[0] >= BUSY_LOAD


# ---------------------------------------------------------------- building


def check_request(hw_ref: str, out: str) -> Hardware:
    """The base model, loaded, and the output path checked, before anything runs:
    an unknown model, a model that is not this machine's cores, or an --out that cannot
    be written is bad input (exit 2)."""
    hw = load_hardware(hw_ref)
    if len(hw.levels) != 2 or hw.streams:
        levels = " > ".join(lvl.name for lvl in hw.levels)
        raise InputError(f"--hw {hw_ref}: synth calibrate measures this machine's CPU; it "
                         f"needs a model whose units are its cores (one level below the "
                         f"root, as in `cpu`), and {hw.name} has levels {levels}")
    path = Path(out)
    if path.suffix != ".toml":
        raise InputError(f"--out {out}: expected a .toml file name (the model is loaded "
                         f"later with --hw {path.with_suffix('.toml')})")
    if path.is_dir():
        raise InputError(f"--out {out}: is a directory; expected a .toml file name")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise InputError(f"--out {out}: the directory {parent} does not exist")
    if not os.access(parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise InputError(f"--out {out}: cannot write there (permission denied)")
    return hw


def build(vector_bytes: int, directory: Path) -> ctypes.CDLL:
    """calibrate.c compiled into `directory` and loaded."""
    runtime = resources.files("synth.emit") / "c_runtime"
    with resources.as_file(runtime / SOURCE) as source, \
            resources.as_file(runtime / "synth_vec.h") as header:
        library = directory / LIBRARY
        command = [os.environ.get("CC", "cc"), *CFLAGS, f"-DSYNTH_VB={vector_bytes}",
                   f"-I{Path(header).parent}", "-o", str(library), str(source), "-lm"]
        try:
            proc = subprocess.run(command, capture_output=True, text=True)
        except OSError as exc:
            raise CalibrationError(f"cannot run the C compiler {command[0]!r}: {exc}") from None
        if proc.returncode != 0:
            raise CalibrationError(f"building {SOURCE} failed:\n{proc.stderr[-2000:]}")
    lib = ctypes.CDLL(str(library))
    timed_loops = ("clock", *(f"{op}_latency" for op in LATENCIES),
                   *FOLD_LOOPS, "gather", "gather_run", "broadcast", "microkernel", *OPS)
    for name in timed_loops:
        getattr(lib, f"synth_cal_{name}").argtypes = [ctypes.c_int64]
    for name in ("region", "barrier", "fma_parallel"):
        getattr(lib, f"synth_cal_{name}").argtypes = [ctypes.c_int64, ctypes.c_int]
    lib.synth_cal_read.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                                   ctypes.c_int]
    lib.synth_cal_chase.argtypes = [ctypes.c_void_p, ctypes.c_int64,
                                    ctypes.POINTER(ctypes.c_int64)]
    lib.synth_cal_strip.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                                    ctypes.c_int, ctypes.c_int64]
    lib.synth_cal_runs.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                                   ctypes.c_int64, ctypes.c_int64, ctypes.c_int]
    names = (*timed_loops, "region", "barrier", "fma_parallel", "read", "chase", "strip",
             "runs")
    for name in names:
        getattr(lib, f"synth_cal_{name}").restype = ctypes.c_double
    return lib


# ---------------------------------------------------------------- measuring


def timed(run: Callable[[int], float], settings: Settings, start: int = 16) -> float:
    """Seconds per iteration of `run(n)` (which returns the seconds n iterations took):
    n grown until one run takes about `settings.target_s`, then the fastest of
    `settings.reps` runs."""
    n = start
    while True:
        seconds = run(n)
        if seconds >= settings.target_s / 4 or n >= 1 << 40:
            break
        n *= 4 if seconds < settings.target_s / 64 else 2
    n = max(1, int(n * settings.target_s / max(seconds, 1e-9)))
    return min(run(n) / n for _ in range(settings.reps))


def cache_sizes() -> dict[str, int]:
    return {kind: detect_cache_size(kind) or FALLBACK_CACHE[kind] for kind in FALLBACK_CACHE}


def buffer_sizes(settings: Settings) -> dict[str, int]:
    """The buffer measured per level: half of L1 and of L2, 4x L2 within L3 (at most half
    of it), DRAM twice the L3 (at least 64 MiB, at most `settings.dram_cap`)."""
    caches = cache_sizes()
    l3 = max(caches["L3"], caches["L2"])
    return {"L1d": caches["L1d"] // 2, "L2": caches["L2"] // 2,
            "L3": min(4 * caches["L2"], l3 // 2),
            "DRAM": min(max(2 * l3, 64 << 20), settings.dram_cap)}


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform
    return platform.processor() or platform.machine() or "unknown CPU"


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


Step = Callable[[str], None]  # told what runs next (the progress bar)


def measure(hw: Hardware, settings: Settings = Settings(), step: Step | None = None
            ) -> Calibration:
    """Every micro-benchmark (see the module's docstring), in passes (`Settings`): each
    number the best any pass gave."""
    from synth.emit.c import vector_bytes

    tell = step or (lambda _: None)
    started = time.perf_counter()
    load = os.getloadavg()
    vb = vector_bytes(hw)
    best: Calibration | None = None
    unsettled: tuple[str, ...] = ()
    with tempfile.TemporaryDirectory(prefix="synth-calibrate-") as tmp:
        tell("building the benchmarks")
        lib = build(vb, Path(tmp))
        first = time.perf_counter()
        for number in range(1, settings.passes + 1):
            label = f"pass {number}: " if settings.passes > 1 else ""
            one = measure_pass(lib, settings, vb, functools.partial(_labelled, tell, label))
            combined = one if best is None else combine(best, one)
            unsettled = () if best is None else improved(best, combined, settings.settle)
            best = combined
            if number >= settings.min_passes and not unsettled:
                break
            spent = time.perf_counter() - first
            if time.perf_counter() - started + spent / number > settings.budget_s:
                break  # another pass would end past the budget
    assert best is not None  # settings.passes >= 1
    notes = []
    if load[0] >= BUSY_LOAD:
        notes.append(f"the machine was busy (load average {load[0]:.2f}): each number is "
                     f"the best of {best.passes} pass(es), and one that every pass measured "
                     f"slow is slower than a quiet machine's; calibrate again when it is idle")
    machine = os.cpu_count() or best.cpus
    if best.cpus < machine:
        notes.append(f"this process may run on {best.cpus} of the machine's {machine} CPUs "
                     f"(taskset, a container's limit): the model gives its schedules "
                     f"{best.usable_cores} core(s); calibrate without the limit for "
                     f"schedules that use every core")
    if unsettled:
        notes.append(f"after {best.passes} passes these numbers still improved by more than "
                     f"{settings.settle:.0%} in the last: {', '.join(unsettled)} (the machine "
                     f"was busy); calibrate again when it is idle")
    return replace(best, cpu=cpu_name(),
                   when=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                   load=(load[0], load[1], load[2]), seconds=time.perf_counter() - started,
                   notes=tuple(notes), unsettled=unsettled)


def _labelled(tell: Step, label: str, what: str) -> None:
    tell(label + what)


def measure_pass(lib: ctypes.CDLL, settings: Settings, vb: int, tell: Step) -> Calibration:
    """One pass of every micro-benchmark (`PASS_STEPS` calls of `tell`)."""
    tell("clock")
    clock_hz = clock(lib, settings)
    seconds = {}
    for op in OPS:
        tell(f"f32 {op} throughput")
        per = THROUGHPUT_CHAINS if op in ("add", "mul", "max", "fma") else ROUTINE_CALLS
        seconds[op] = timed(getattr(lib, f"synth_cal_{op}"), settings) / per
    # again (see `clock`), and every number in cycles of the faster: a clock read slow
    # (2x, on a busy host) made the ops' cycles as much too few
    clock_hz = max(clock_hz, clock(lib, settings))
    cycles = {op: value * clock_hz for op, value in seconds.items()}

    def cycles_of(name: str, per: int = 1) -> float:
        """Cycles per `per`th of one iteration of synth_cal_NAME's loop."""
        return timed(getattr(lib, f"synth_cal_{name}"), settings) * clock_hz / per

    tell("FMA, add and max latency")
    latencies = {op: cycles_of(f"{op}_latency", LATENCY_STEPS) for op in LATENCIES}
    tell("a fold of a vector's lanes")
    summed, folded = (cycles_of(name) for name in FOLD_LOOPS)
    tell("gathers")
    gathers = cycles_of("gather", GATHERS)
    grouped = cycles_of("gather_run", GATHERS)
    tell("broadcasts")
    broadcasts = cycles_of("broadcast", BROADCASTS)
    tell("a GEMM register tile")
    microkernel = cycles_of("microkernel")
    cpus = usable_cpus()
    tell("usable cores")
    usable = usable_cores(lib, settings, cpus, cycles["fma"], clock_hz)
    tell("a strip of rows that alias in the L1d")
    strip = strip_cycles(lib, settings, clock_hz)
    bandwidth, latency, sizes = memories(lib, settings, clock_hz, usable, tell)
    tell("the L3 one core keeps")
    l3_rate = bandwidth["L3"] * clock_hz
    reads = l3_reads(lib, settings, l3_rate, sizes["L3"])
    tell("DRAM read in short runs")
    runs = run_cycles(lib, settings, clock_hz, usable, sizes["DRAM"])
    tell("OpenMP region and barrier")
    region_s = timed(lambda n: lib.synth_cal_region(n, usable), settings)
    barrier_s = timed(lambda n: lib.synth_cal_barrier(n, usable), settings)
    return Calibration(
        cpu="", when="", load=(0.0, 0.0, 0.0), cpus=cpus, vector_bytes=vb, clock_hz=clock_hz,
        cycles=cycles, latency_cycles=latencies, exp_sum_cycles=summed, exp_fold_cycles=folded,
        gather_cycles=gathers, grouped_gather_cycles=grouped, broadcast_cycles=broadcasts,
        microkernel_cycles=microkernel, strip_cycles=strip, bandwidth=bandwidth,
        latency=latency, run_cycles=runs, sizes=sizes,
        l3_kept=kept_of(reads, l3_rate, sizes["L3"]), region_s=region_s, barrier_s=barrier_s,
        usable_cores=usable, l3_reads=reads)


# ---------------------------------------------------------------- passes

# Calibration fields in cycles (fewer is better) and in bytes per cycle (more is better);
# each a number or a mapping of them
CYCLE_FIELDS = ("cycles", "latency_cycles", "exp_sum_cycles", "exp_fold_cycles",
                "gather_cycles", "grouped_gather_cycles", "broadcast_cycles",
                "microkernel_cycles", "strip_cycles", "latency", "run_cycles")
RATE_FIELDS = ("bandwidth",)
SECOND_FIELDS = ("region_s", "barrier_s")  # seconds (fewer is better)

Number = float | Mapping[str, float]


def _map(value: Number, f: Callable[[float], float]) -> Number:
    return {k: f(v) for k, v in value.items()} if isinstance(value, Mapping) else f(value)


def _zip(a: Number, b: Number, f: Callable[[float, float], float]) -> Number:
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return {k: f(a[k], b[k]) for k in a}
    assert not isinstance(a, Mapping) and not isinstance(b, Mapping)
    return f(a, b)


def at_clock(cal: Calibration, clock_hz: float) -> Calibration:
    """`cal`'s numbers in cycles of `clock_hz` (the same seconds and bytes per second)."""
    ratio = clock_hz / cal.clock_hz
    changes: dict[str, Any] = {name: _map(getattr(cal, name), lambda v: v * ratio)
                               for name in CYCLE_FIELDS}
    changes.update({name: _map(getattr(cal, name), lambda v: v / ratio)
                    for name in RATE_FIELDS})
    return replace(cal, clock_hz=clock_hz, **changes)


def combine(a: Calibration, b: Calibration) -> Calibration:
    """The best of two passes, number by number (another process only ever slows a
    measurement down): the faster clock, the fewer cycles (counted at that clock) and
    seconds, the more bytes per cycle and usable cores, and the L3 kept found again from
    the best read of each buffer against the best L3 rate."""
    clock_hz = max(a.clock_hz, b.clock_hz)
    a, b = at_clock(a, clock_hz), at_clock(b, clock_hz)
    changes: dict[str, Any] = {name: _zip(getattr(a, name), getattr(b, name), min)
                               for name in (*CYCLE_FIELDS, *SECOND_FIELDS)}
    changes.update({name: _zip(getattr(a, name), getattr(b, name), max)
                    for name in RATE_FIELDS})
    reads = {size: max(a.l3_reads.get(size, 0.0), b.l3_reads.get(size, 0.0))
             for size in sorted({*a.l3_reads, *b.l3_reads})}
    l3_rate = changes["bandwidth"]["L3"] * clock_hz
    return replace(a, usable_cores=max(a.usable_cores, b.usable_cores), l3_reads=reads,
                   l3_kept=kept_of(reads, l3_rate, a.sizes["L3"]), passes=a.passes + b.passes,
                   seconds=a.seconds + b.seconds, **changes)


def numbers(cal: Calibration) -> dict[str, float]:
    """Every number a pass measures, named, each as a time (fewer is better): cycles,
    seconds, cycles per byte, 1 / clock, 1 / usable cores, 1 / the L3 kept."""
    found: dict[str, float] = {"clock": 1 / cal.clock_hz, "usable cores": 1 / cal.usable_cores,
                               "the L3 kept": 1 / (cal.l3_kept or cache_sizes()["L3"])}
    for name in (*CYCLE_FIELDS, *SECOND_FIELDS, *RATE_FIELDS):
        value: Number = getattr(cal, name)
        if name in RATE_FIELDS:
            value = _map(value, lambda v: 1 / v)
        items = value.items() if isinstance(value, Mapping) else [("", value)]
        for key, v in items:
            found[LABELS[name].format(key)] = v
    return found


# how the warning names each number (`numbers`; {} is the op, the level or the way)
LABELS = {"cycles": "f32 {} throughput", "latency_cycles": "f32 {} latency",
          "exp_sum_cycles": "exps summed", "exp_fold_cycles": "exps folded",
          "gather_cycles": "a gather", "grouped_gather_cycles": "gathers back to back",
          "broadcast_cycles": "a broadcasting load", "microkernel_cycles": "the GEMM tile loop",
          "strip_cycles": "an aliasing strip ({})", "latency": "{} latency",
          "run_cycles": "DRAM read in short runs", "region_s": "an OpenMP region",
          "barrier_s": "an OpenMP barrier", "bandwidth": "{} read bandwidth"}


def improved(before: Calibration, after: Calibration, share: float) -> tuple[str, ...]:
    """The numbers that moved by more than `share` from `before` to `after` (its
    combination with another pass: an improvement, or the L3 kept found again against a
    better L3 rate)."""
    old, new = numbers(at_clock(before, after.clock_hz)), numbers(after)
    old["clock"] = 1 / before.clock_hz  # the clock itself, not converted
    return tuple(name for name, value in new.items()
                 if old[name] > 0 and abs(old[name] - value) / old[name] > share)


def clock(lib: ctypes.CDLL, settings: Settings) -> float:
    """The core clock in Hz: dependent adds, in short runs (a fifth of `target_s`, three
    times as many). The clock is the unit of every other number, and a run another
    process interrupts reads slow; `measure` takes the faster of two such measurements,
    before and after the arithmetic."""
    quick = Settings(settings.target_s / 5, 3 * settings.reps, settings.dram_cap)
    return CLOCK_STEPS / timed(lib.synth_cal_clock, quick, 1024)


def usable_cores(lib: ctypes.CDLL, settings: Settings, cpus: int, fma_cycles: float,
                 clock_hz: float) -> int:
    """How many cores give their own FMA throughput when all run at once (a core another
    process keeps busy gives about half)."""
    if cpus <= 1:
        return 1
    per_iteration = timed(lambda n: lib.synth_cal_fma_parallel(n, cpus), settings)
    alone = fma_cycles * THROUGHPUT_CHAINS / clock_hz
    return max(1, min(cpus, round(cpus * alone / per_iteration)))


def strip_cycles(lib: ctypes.CDLL, settings: Settings, clock_hz: float) -> dict[str, float]:
    """Cycles per line of a strip a line wide whose `STRIP_ROWS` rows lie a way of the L1d
    apart (`synth_cal_strip`), read ("read") and read and written back ("write"); empty
    where sysfs does not give the L1d's size and associativity."""
    ways, size = detect_cache_ways("L1d"), detect_cache_size("L1d")
    if not ways or not size or size % ways or (size // ways) % LINE:
        return {}
    stride = size // ways // 4  # floats
    buf = np.ones(stride * STRIP_ROWS + LINE // 4, dtype=np.float32)
    start = buf.ctypes.data + (-buf.ctypes.data) % LINE
    found = {}
    for name, write in (("read", 0), ("write", 1)):
        walk = functools.partial(_strip, lib, start, stride, write)
        found[name] = timed(walk, settings, 1) * clock_hz / STRIP_ROWS
    del buf
    return found


def _strip(lib: ctypes.CDLL, pointer: int, stride: int, write: int, walks: int) -> float:
    return float(lib.synth_cal_strip(pointer, stride, STRIP_ROWS, write, walks))


def run_cycles(lib: ctypes.CDLL, settings: Settings, clock_hz: float, cores: int, size: int
               ) -> float:
    """Cycles per `RUN_BYTES` run of rows `RUN_STRIDE` apart over a buffer of `size`
    bytes (DRAM's: twice the L3), on `cores` threads: the whole time over every run, as
    the model serialises the cores' runs."""
    seconds = read_in_runs(lib, settings, cores, size, RUN_BYTES)
    return seconds * clock_hz / (size // RUN_STRIDE * (RUN_STRIDE // RUN_BYTES))


def read_in_runs(lib: ctypes.CDLL, settings: Settings, threads: int, size: int,
                 run_bytes: int) -> float:
    """Seconds to read `size` bytes (rows `RUN_STRIDE` apart) in runs of `run_bytes`, a
    column of runs after another until the rows are read whole (`synth_cal_runs`), on
    `threads` threads; `benchmarks/dram_runs.py` reads it at several run lengths."""
    stride = RUN_STRIDE // 4  # floats
    rows = max(1, size // RUN_STRIDE)
    buf = np.ones(rows * stride + LINE // 4, dtype=np.float32)
    start = buf.ctypes.data + (-buf.ctypes.data) % LINE
    run = functools.partial(_runs, lib, start, stride, rows, run_bytes // 4, threads)
    seconds = timed(run, settings, 1)
    del buf
    return seconds


def _runs(lib: ctypes.CDLL, pointer: int, stride: int, rows: int, run: int, threads: int,
          passes: int) -> float:
    return float(lib.synth_cal_runs(pointer, stride, rows, run, passes, threads))


def on_one_cpu() -> None:
    """Keep this process on one CPU (the first it may use), as `taskset -c N` would: a
    calibration then describes one core (its DRAM reads, its OpenMP start)."""
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})


def run_latency_cycles(cal: Calibration) -> float:
    """A DRAM run's time beyond its bytes at DRAM's measured bandwidth (never below 0)."""
    return max(0.0, cal.run_cycles - RUN_BYTES / cal.bandwidth["DRAM"])


def memories(lib: ctypes.CDLL, settings: Settings, clock_hz: float, cores: int, tell: Step
             ) -> tuple[dict[str, float], dict[str, float], dict[str, int]]:
    """Read bandwidth (bytes per cycle) and load-to-use latency (cycles) per level."""
    sizes = buffer_sizes(settings)
    bandwidth: dict[str, float] = {}
    latency: dict[str, float] = {}
    rng = np.random.default_rng(0)
    for level in LEVELS:
        size = sizes[level]
        threads = cores if level == "DRAM" else 1
        tell(f"{level} read bandwidth ({size >> 10} KiB)")
        bandwidth[level] = size / _bandwidth(lib, settings, size, threads) / clock_hz
        tell(f"{level} latency")
        lines = size // LINE
        order = rng.permutation(lines)
        chain = np.zeros(lines * (LINE // 8), dtype=np.int64)
        chain[order * (LINE // 8)] = np.roll(order, -1) * (LINE // 8)
        latency[level] = timed(functools.partial(_chase, lib, chain.ctypes.data,
                                                 ctypes.c_int64(0)), settings, 1024) * clock_hz
        del chain, order
    return bandwidth, latency, sizes


def l3_reads(lib: ctypes.CDLL, settings: Settings, l3_rate: float, l3_buffer: int
             ) -> dict[int, float]:
    """Bytes per second one core reads buffers at, growing by sqrt(2) from twice
    `l3_buffer` (the L3 level's buffer, read at `l3_rate` bytes per second) while below
    the detected L3, up to the first read below `KEPT_SHARE` of `l3_rate`."""
    detected = cache_sizes()["L3"]
    reads: dict[int, float] = {}
    size = 2 * l3_buffer
    while size < detected:
        reads[size] = size / _bandwidth(lib, settings, size, 1)
        if reads[size] < KEPT_SHARE * l3_rate:
            break
        size = int(size * math.sqrt(2)) // LINE * LINE
    return reads


def kept_of(reads: Mapping[int, float], l3_rate: float, l3_buffer: int) -> int | None:
    """The largest buffer of `reads` (bytes -> bytes per second) before the first read
    below `KEPT_SHARE` of `l3_rate` (`l3_buffer` when that is the first); None when none
    is (every buffer up to the detected L3 read at its rate)."""
    kept = l3_buffer
    for size in sorted(reads):
        if reads[size] < KEPT_SHARE * l3_rate:
            return kept
        kept = size
    return None


def _bandwidth(lib: ctypes.CDLL, settings: Settings, size: int, threads: int) -> float:
    """Seconds to read a `size`-byte buffer whole on `threads` threads."""
    buf = np.ones(size // 4 + LINE // 4, dtype=np.float32)
    start = buf.ctypes.data + (ALIGN - buf.ctypes.data) % LINE
    return timed(functools.partial(_read, lib, start, size, threads), settings, 1)


def _read(lib: ctypes.CDLL, pointer: int, size: int, threads: int, passes: int) -> float:
    return float(lib.synth_cal_read(pointer, size, passes, threads))


def _chase(lib: ctypes.CDLL, pointer: int, at: ctypes.c_int64, steps: int) -> float:
    return float(lib.synth_cal_chase(pointer, steps, ctypes.byref(at)))


# ---------------------------------------------------------------- the model


def memory_kinds(tree: Mapping[str, Any]) -> list[str | None]:
    """Per `[[memory]]` of a model's TOML tree: which measured level holds its tiles
    ("DRAM" for the root memory; L1d, L2 or L3 by its `detect` key or its name)."""
    kinds: list[str | None] = []
    for index, memory in enumerate(tree.get("memory", [])):
        name = str(memory.get("name", "")).lower()
        detect = memory.get("detect")
        if index == 0:
            kinds.append("DRAM")
        elif detect in LEVELS:
            kinds.append(detect)
        else:
            kinds.append({"l1": "L1d", "l1d": "L1d", "l2": "L2", "l3": "L3"}.get(name))
    return kinds


def substitute(tree: dict[str, Any], cal: Calibration) -> list[str]:
    """Put the measured numbers into a model's TOML tree (in place); returns a line per
    key set, for the header."""
    done: list[str] = []

    def put(table: dict[str, Any], key: str, value: Any, label: str) -> None:
        table[key] = value
        done.append(f"{label} = {value}")

    clock = f"{cal.clock_hz / 1e9:.3f}GHz"
    for unit in ("compute", "host"):
        table = tree.get(unit)
        if not isinstance(table, dict):
            continue
        if "clock" in table:
            put(table, "clock", clock, f"{unit}.clock")
        f32 = table.get("cycles", {}).get("f32")
        if isinstance(f32, dict):
            for op, value in cal.cycles.items():
                if op in f32:
                    put(f32, op, round(value, 2), f"{unit}.cycles.f32.{op}")
        latencies = table.get("accumulate_latency")
        if isinstance(latencies, dict) and "f32" in latencies:
            put(latencies, "f32", round(cal.latency_cycles["fma"], 2),
                f"{unit}.accumulate_latency.f32")
            adds = table.setdefault("add_latency", {})
            put(adds, "f32", round(max(cal.latency_cycles["add"], cal.latency_cycles["max"]), 2),
                f"{unit}.add_latency.f32")
        if unit == "compute" and table.get("vector_tiles"):
            put(table.setdefault("gather_cycles", {}), "f32", round(cal.gather_cycles, 2),
                f"{unit}.gather_cycles.f32")
            put(table.setdefault("grouped_gather_cycles", {}), "f32",
                round(cal.grouped_gather_cycles, 2), f"{unit}.grouped_gather_cycles.f32")
            put(table.setdefault("broadcast_cycles", {}), "f32",
                round(cal.broadcast_cycles, 2), f"{unit}.broadcast_cycles.f32")
        shuffles = table.get("shuffle_cycles")
        if isinstance(shuffles, dict) and "f32" in shuffles:
            put(shuffles, "f32", round(shuffle_cycles(cal), 2), f"{unit}.shuffle_cycles.f32")
    kinds = memory_kinds(tree)
    for index, memory in enumerate(tree.get("memory", [])):
        parent = kinds[index - 1] if index > 0 else None
        if parent is None:
            continue
        name = memory.get("name", f"memory {index}")
        if "bandwidth" in memory:
            put(memory, "bandwidth", f"{cal.bandwidth[parent]:.2f}B/cycle",
                f"{name}.bandwidth ({parent} reads)")
        if kinds[index] == "L1d" and "ways" in memory and cal.strip_cycles:
            for way in ("read", "write"):
                put(memory, f"aliased_{way}", f"{cal.strip_cycles[way]:.1f}cycles",
                    f"{name}.aliased_{way} (a line of a strip of rows that alias)")
        if kinds[index] == "L3" and cal.l3_kept is not None:
            memory.pop("detect", None)
            put(memory, "capacity", f"{cal.l3_kept >> 10}KiB",
                f"{name}.capacity (the largest buffer one core read at the L3's rate)")
        if parent == "DRAM" and "run_latency" in memory:
            put(memory, "run_latency", f"{run_latency_cycles(cal):.1f}cycles",
                f"{name}.run_latency (a {RUN_BYTES}-byte run from DRAM, beyond its bytes)")
        if ("latency" in memory and not _zero_time(memory["latency"])
                and not memory.get("overlap")):  # overlapped with compute: hidden
            put(memory, "latency", f"{cal.latency[parent]:.0f}cycles",
                f"{name}.latency ({parent} load-to-use)")
    levels = tree.get("level", [])
    forks = len(levels) > 1 and "fork" in levels[1]
    if "launch" in tree and not forks:  # a region is a kernel's start, or the cores' fork
        put(tree, "launch", f"{cal.region_s * 1e9:.0f}ns", "launch")
    if len(levels) > 1:
        cores = levels[1]
        if forks:
            put(cores, "fork", f"{cal.region_s * 1e9:.0f}ns", f"{cores.get('name')}.fork")
        count = cores.get("count")
        put(cores, "count", f"1..{cal.usable_cores}" if isinstance(count, str) and ".." in count
            else cal.usable_cores, f"{cores.get('name')}.count")
        if "barrier" in cores:
            put(cores, "barrier", f"{cal.barrier_s * 1e9:.0f}ns", f"{cores.get('name')}.barrier")
    return done


def shuffle_cycles(cal: Calibration) -> float:
    """Cycles of one shuffle step of a fold: `cpu_compute.fold_cost` prices the fold of one
    vector as log2(lanes) x (an add + a shuffle) and the add joining the target, so the
    measured fold less that add, per step, less an add; at least a tenth of a cycle."""
    steps = max(cal.vector_bytes // 4 - 1, 0).bit_length()
    if steps == 0:
        return 0.1
    add = cal.cycles["add"]
    return max(0.1, (cal.fold_cycles - add) / steps - add)


def exposed_share(cal: Calibration) -> float:
    """The share of a register tile's loads its FMAs do not hide in a tight loop: the
    microkernel's cycles less its FMAs', over its loads' (8 broadcasts and a vector read
    from L1 at the L1's bandwidth), between 0.05 and 1. On AMD Zen 5 it ran 4.7 cycles per
    8 FMAs of 4 cycles and loads of 5: 0.14. Reported, not written: whole kernels expose
    more (the registers' `exposed`, 0.7, was fitted on the Xeon's; module docstring)."""
    fmas = TILE_ROWS * cal.cycles["fma"]
    loads = TILE_ROWS * cal.broadcast_cycles + cal.vector_bytes / cal.bandwidth["L1d"]
    return min(1.0, max(0.05, (cal.microkernel_cycles - fmas) / loads))


def _zero_time(value: Any) -> bool:
    """A latency the base model sets to zero: it says the transfers overlap compute (the
    caches' prefetching hides them), which a load-to-use latency must not undo."""
    try:
        return parse_time(value, 10**9) == 0
    except (SynthError, TypeError, ValueError):
        return False


def model_text(hw_ref: str, cal: Calibration) -> str:
    """The base model's TOML with the measured numbers substituted, under a header."""
    text, label, source = read_model(hw_ref)
    tree = tomllib.loads(text)
    done = substitute(tree, cal)
    tree["description"] = (f"{tree.get('description', tree.get('name', label))} -- "
                           f"calibrated on {cal.cpu}, {cal.when}")
    return header(label, cal, done) + "\n" + dump_toml(tree)


def header(base: str, cal: Calibration, done: list[str]) -> str:
    lines = [f"Hardware model written by `synth calibrate --hw {base}`: the model {base!r}",
             "with the numbers below measured on this machine by synth's micro-benchmarks",
             "(synth/emit/c_runtime/calibrate.c; docs/hardware.md, \"Calibrating\").",
             "",
             f"measured: {cal.when} in {cal.seconds:.1f} s, {cal.passes} pass(es) of every "
             f"micro-benchmark, each number the best of them",
             f"CPU: {cal.cpu}, {cal.cpus} CPU(s) usable by the process, "
             f"{cal.usable_cores} giving full FMA throughput at once",
             f"load average before measuring: {cal.load[0]:.2f} {cal.load[1]:.2f} "
             f"{cal.load[2]:.2f}",
             f"vector width: {cal.vector_bytes} bytes ({cal.vector_bytes // 4} f32 lanes); "
             f"clock {cal.clock_hz / 1e9:.3f} GHz (dependent adds)",
             f"f32 FMA: {cal.cycles['fma']:.2f} cycles per vector instruction (throughput), "
             f"latency {cal.latency_cycles['fma']:.2f} cycles; add latency "
             f"{cal.latency_cycles['add']:.2f}, max {cal.latency_cycles['max']:.2f}",
             f"a fold of a vector's lanes after its exps: {cal.fold_cycles:.2f} cycles "
             f"(a shuffle step {shuffle_cycles(cal):.2f}); a gather {cal.gather_cycles:.2f} "
             f"cycles ({cal.grouped_gather_cycles:.2f} each back to back), a broadcasting "
             f"load {cal.broadcast_cycles:.2f}; a GEMM register tile "
             f"(8 broadcasts, a load, 8 FMAs) {cal.microkernel_cycles:.2f} cycles: its loads "
             f"{exposed_share(cal):.2f} exposed (in a tight loop; reg.exposed stays the base "
             f"model's, fitted to whole kernels)",
             (f"a strip a line wide down {STRIP_ROWS} rows a way of the L1d apart: "
              f"{cal.strip_cycles['read']:.1f} cycles a line read, "
              f"{cal.strip_cycles['write']:.1f} read and written" if cal.strip_cycles
              else "the L1d's associativity unknown: no strip of aliasing rows measured"),
             "read bandwidth (B/cycle; DRAM with every usable core) and latency (cycles):",
             *(f"  {level}: {cal.bandwidth[level]:.2f} B/cycle, {cal.latency[level]:.0f} "
               f"cycles ({cal.sizes[level] >> 10} KiB buffer)" for level in LEVELS),
             ("the L3 one core keeps: all of it (buffers up to its size read at its rate)"
              if cal.l3_kept is None else f"the L3 one core keeps: {cal.l3_kept >> 10} KiB "
              "(the largest buffer read at the L3's rate; larger ones ran at DRAM's)"),
             f"DRAM in {RUN_BYTES}-byte runs of rows {RUN_STRIDE >> 10} KiB apart (every usable "
             f"core): {cal.run_cycles:.1f} cycles a run, {run_latency_cycles(cal):.1f} beyond "
             "its bytes",
             f"OpenMP parallel region start+join {cal.region_s * 1e9:.0f} ns, barrier "
             f"{cal.barrier_s * 1e9:.0f} ns",
             *(f"WARNING: {note}" for note in cal.notes),
             "",
             "Measured values substituted (everything else is the base model's):",
             *(f"  {line}" for line in done)]
    return "".join(f"# {line}".rstrip() + "\n" for line in lines)


# ---------------------------------------------------------------- TOML out


def dump_toml(tree: Mapping[str, Any]) -> str:
    """`tree` (as tomllib reads it) as TOML text: tables of scalars inline, tables with
    tables as [sections], lists of tables as [[arrays]]."""
    lines: list[str] = []
    _table(lines, (), tree)
    return "\n".join(lines).strip("\n") + "\n"


def _is_section(value: Any) -> bool:
    return isinstance(value, dict) and any(isinstance(v, dict | list) for v in value.values())


def _is_array_of_tables(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, dict) for v in value)


def _table(lines: list[str], path: tuple[str, ...], table: Mapping[str, Any]) -> None:
    for key, value in table.items():
        if not _is_section(value) and not _is_array_of_tables(value):
            lines.append(f"{_key(key)} = {_value(value)}")
    for key, value in table.items():
        if _is_section(value):
            lines.extend(["", f"[{'.'.join(_key(k) for k in (*path, key))}]"])
            _table(lines, (*path, key), value)
    for key, value in table.items():
        if _is_array_of_tables(value):
            for item in value:
                lines.extend(["", f"[[{'.'.join(_key(k) for k in (*path, key))}]]"])
                _table(lines, (*path, key), item)


def _key(key: str) -> str:
    bare = key.replace("_", "").replace("-", "").isalnum() and key.isascii()
    return key if bare else json.dumps(key)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"cannot write {value} to TOML")
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{_key(k)} = {_value(v)}" for k, v in value.items()) + " }"
    raise ValueError(f"cannot write {value!r} to TOML")


# ---------------------------------------------------------------- the command


def calibrate(hw_ref: str, out: str, settings: Settings = Settings(),
              step: Step | None = None) -> Calibration:
    """Measure, write the model to `out`, and check that it loads."""
    check_request(hw_ref, out)
    hw = load_hardware(hw_ref)
    cal = measure(hw, settings, step)
    text = model_text(hw_ref, cal)
    try:
        Path(out).write_text(text, encoding="utf-8")
    except OSError as exc:
        raise InputError(f"--out {out}: cannot write: {exc}") from None
    load_hardware(out)  # what it wrote loads (a bug otherwise: exit 70)
    return cal
