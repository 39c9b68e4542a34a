"""Seed 001's GEMM on AMD AIE: synth's optimum against the seed's hand schedule and an
approximation of iree-amd-aie's pack-peel choice, rebuilt in synth's model.

    python benchmarks/aie_streaming_k.py [--repeats 3]

For `matmul` (1024 x 512 x 2048 i32 with fill) and `gemm2k` (2048^3) on `aie`, each row
is a `synth solve` with `--fix`es (printed), solved by CP-SAT and priced by the same model:

- synth: nothing fixed; the solver derives fusion, packing, tiles and unit counts.
- seed 001: the hand schedule of the discussion: fill fused into the matmul's L1 tile
  (`fuse`), packed to 4x8x8 (`pack`), a 2x2 logical core grid (2 columns along m, 2 cores
  along n), 32x32 of C per core in L1, K tiled 256 from L3 to L2 and 32 from L2 to L1,
  single buffered. Synth's L2 tiles are per core (the memtile's share), so the seed's
  64x64 L2 block of the 2x2 group is four 32x32 L2 tiles here.
- pack-peel (approximate): iree-amd-aie's default on npu1 (docs/hardware-facts.md):
  the whole 4x4 array (4 columns along m, 4 cores along n), K tile 32 at L2 and L1, L1
  double buffered, packed; its L1 tile search (16..128 per dimension, multiples of the
  intrinsic) is left to the solver, which picks the best such tile under the model.

Reports the modelled cost, the ratio to synth, the solve time (median of --repeats) and
the key variables. Costs are synth's model, not measurements on an NPU.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence

from synth import pipeline
from synth.constraints.result import Status

KERNEL = "C#1_C#2"
SEED = ("fuse.C#1_C#2=1", "pack.C#1_C#2=1", "X.C#1_C#2.m=2", "X.C#1_C#2.n=1",
        "Y.C#1_C#2.m=1", "Y.C#1_C#2.n=2", "Q.C#1_C#2.m=32", "Q.C#1_C#2.n=32",
        "Q.C#1_C#2.k=32", "M.C#1_C#2.m=1", "M.C#1_C#2.n=1", "M.C#1_C#2.k=8",
        "buffers.C#1_C#2.l1=1")
PACK_PEEL = ("fuse.C#1_C#2=1", "pack.C#1_C#2=1", "X.C#1_C#2.m=4", "X.C#1_C#2.n=1",
             "Y.C#1_C#2.m=1", "Y.C#1_C#2.n=4", "Q.C#1_C#2.k=32", "M.C#1_C#2.m=1",
             "M.C#1_C#2.n=1", "M.C#1_C#2.k=1", "buffers.C#1_C#2.l1=2")
ROWS = (("synth", ()), ("seed 001", SEED), ("pack-peel (approx.)", PACK_PEEL))
SHOWN = ("X", "Y", "G", "M", "Q")


def run(workload: str, fixes: Sequence[str], repeats: int) -> tuple[pipeline.Outcome, float]:
    walls = []
    for _ in range(repeats):
        start = time.perf_counter()
        outcome = pipeline.run(pipeline.Request(workload, "aie", fixes=tuple(fixes),
                                                validate=False))
        walls.append(time.perf_counter() - start)
    return outcome, statistics.median(walls)


def describe(outcome: pipeline.Outcome) -> str:
    env = outcome.result.env or {}
    kernels = [k.name for k in outcome.model.selected(env)]
    values = [f"{s}.{d}={env[f'{s}.{k}.{d}']}" for k in kernels for s in SHOWN
              for d in ("m", "n", "k") if env.get(f"{s}.{k}.{d}", 1) > 1]
    extra = [f"{n}={env[n]}" for n in (f"pack.{KERNEL}", f"buffers.{KERNEL}.l1") if n in env]
    return f"kernels {', '.join(kernels)}; " + " ".join(values + extra)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print("| workload | schedule | status | modelled cost | ratio to synth | solve (median) "
          "| schedule |")
    print("|---|---|---|---:|---:|---:|---|")
    for workload in ("matmul", "gemm2k"):
        best = None
        for label, fixes in ROWS:
            outcome, wall = run(workload, fixes, args.repeats)
            if outcome.result.status not in (Status.OPTIMAL, Status.FEASIBLE):
                print(f"| {workload} | {label} | {outcome.result.status.value} | - | - | "
                      f"{wall:.2f} s | |")
                continue
            cost = outcome.result.objective or 0
            best = cost if best is None else best
            print(f"| {workload} | {label} | {outcome.result.status.value} | "
                  f"{cost / 1e9:.3f} ms | {cost / best:.2f}x | {wall:.2f} s | "
                  f"{describe(outcome)} |")


if __name__ == "__main__":
    main()
