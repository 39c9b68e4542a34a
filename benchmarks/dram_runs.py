"""DRAM read in runs: the cpu model's price against the time measured (`l3.run_latency`).

    python benchmarks/dram_runs.py [--hw calibrated|FILE.toml] [--one-core] [--json]

A contraction operand past the L3 is read from DRAM in runs: the C emitter packs it into
each core's L2 tile by tile, row by row, each row a run. A run costs more than its bytes:
each starts on another page, and the prefetchers start over. The model prices each run
the packs read from DRAM at the `run_latency` of the memory DRAM fills (`l3`), beyond
its bytes at that memory's `bandwidth` (docs/hardware.md, `cost.pack_runs`). This reads
a buffer of twice the L3 (at least 64 MiB) in runs of 64 B to 16 KiB, rows 16 KiB apart
(16 KiB runs: the whole buffer in order), with the calibration's own loop
(`synth_cal_runs`, every usable core its own columns), and prints per run length the
time measured (fastest of 9), the model's price (runs x run_latency + bytes x the
bandwidth's time per byte) and measured / modelled.

The model is this machine's: by default (`--hw calibrated`) `synth calibrate --hw cpu`
first, as a user would. `--one-core` runs everything on one CPU (the process's first):
the calibration then describes one core, as `taskset -c 0 synth calibrate` does.
Timings are wall-clock: run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from synth import calibrate
from synth.emit.c import vector_bytes
from synth.hwfile import load_hardware

RUNS = (64, 128, 256, 512, 1024, 4096, 16384)  # bytes; the last is the row: one run
STRIDE = calibrate.RUN_STRIDE
REPS = 9
PS_PER_S = 1e12


def measure(lib: ctypes.CDLL, size: int, threads: int) -> dict[int, float]:
    """Seconds to read `size` bytes in each of `RUNS`, fastest of `REPS`."""
    settings = calibrate.Settings(reps=REPS)
    return {run: calibrate.read_in_runs(lib, settings, threads, size, run) for run in RUNS}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hw", default="calibrated",
                        help="the model: calibrated (synth calibrate now) or a TOML file")
    parser.add_argument("--one-core", action="store_true",
                        help="calibrate and measure on one CPU")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    if args.one_core:
        calibrate.on_one_cpu()
    threads = calibrate.usable_cpus()
    with tempfile.TemporaryDirectory(prefix="dram-runs-") as tmp:
        model = args.hw
        if model == "calibrated":
            model = str(Path(tmp) / "calibrated.toml")
            calibrate.calibrate("cpu", model)
        hw = load_hardware(model)
        l3 = hw.memory("l3")
        lib = calibrate.build(vector_bytes(hw), Path(tmp))
        size = calibrate.buffer_sizes(calibrate.DEFAULT)["DRAM"]
        started = time.perf_counter()
        measured = measure(lib, size, threads)
        seconds = time.perf_counter() - started
    rows = []
    for run, took in measured.items():
        runs = (size // STRIDE) * (STRIDE // run)
        modelled = (runs * l3.run_latency_ps + size * l3.ps_per_byte) / PS_PER_S
        rows.append({"run_bytes": run, "measured_s": took, "modelled_s": modelled,
                     "ratio": took / modelled, "gb_per_s": size / took / 1e9})
    load = [round(x, 2) for x in os.getloadavg()]
    about = {"cpu": calibrate.cpu_name(), "threads": threads, "buffer_bytes": size,
             "run_latency_ps": l3.run_latency_ps, "ps_per_byte": l3.ps_per_byte,
             "load_average": load, "seconds": seconds}
    if args.json:
        print(json.dumps({**about, "runs": rows}, indent=2))
        return 0
    print(f"{about['cpu']}, {threads} thread(s), {size >> 20} MiB read in runs of rows "
          f"{STRIDE >> 10} KiB apart; model: run_latency {l3.run_latency_ps / 1000:.1f} ns, "
          f"{1000 / l3.ps_per_byte:.1f} GB/s; load average "
          f"{' '.join(map(str, load))}", file=sys.stderr)
    print("| run | measured (ms) | GB/s | modelled (ms) | measured / modelled |")
    print("|---:|---:|---:|---:|---:|")
    for row in rows:
        print(f"| {row['run_bytes']} B | {row['measured_s'] * 1e3:.2f} | "
              f"{row['gb_per_s']:.1f} | {row['modelled_s'] * 1e3:.2f} | {row['ratio']:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
