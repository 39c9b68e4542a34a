"""Issue 14's targets on `wormhole`: solve time of fa6 and attention at their default sizes
(target: OPTIMAL in under 2 s), and emission + simulation under tt-lang-sim of each
built-in at a reduced size (target: under 60 s, simulated DRAM traffic equal to the
schedule's and to the cost model's).

    python benchmarks/tenstorrent.py [--repeats 3]

Solve time is the pipeline's solve stage (CP-SAT, deterministic), median of --repeats.
Emission runs `synth solve ... --emit ttlang` in-process (the simulator in its child
process); a built-in the emitter refuses (exit 2: an i32 tensor, which tt-lang-sim 1.1.6
cannot hold) is reported with the reason. mha is batch x heads x [S, E] (4-D tensors as
2-D views); the transformer block projects into heads (Wq[d, h, e] as D x (H*E), a block
one head's columns), at two reduced sizes. `mm_f32` is an f32 matmul (64x64x128) with its k
loop split into 4 blocks: the accumulator pattern.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from synth import pipeline
from synth.constraints.dst import model_dram_tiles
from synth.emit.ttlang_check import TtlangCheck
from synth.errors import SynthError

REDUCED = {  # small, with several nodes or several blocks per node
    "attention": {"S": 64, "D": 32}, "fa6": {"S": 128, "D": 64},
    "gemm2k": {"M": 64, "N": 64, "K": 64}, "matmul": {"M": 64, "N": 64, "K": 128},
    "mv": {"M": 64, "N": 128}, "red": {"N": 4096}, "softmax": {"N": 4096},
    "va": {"N": 4096}, "mha": {"B": 2, "H": 2, "S": 64, "E": 32},
    "rmsnorm": {"S": 64, "D": 64}, "layernorm": {"S": 64, "D": 64},
    "swiglu": {"S": 64, "D": 64, "F": 64},
    "transformer": {"S": 64, "D": 64, "H": 2, "E": 32, "F": 64},
}
LARGER = [("transformer", {"S": 128, "D": 256, "H": 4, "E": 64, "F": 256})]
MM_F32 = """size M = 64
size N = 64
size K = 128
in  A : f32[M, K]
in  B : f32[K, N]
out C : f32[M, N]
C[m, n]  = 0
C[m, n] += A[m, k] * B[k, n]
"""


def solve_times(repeats: int) -> None:
    print("| workload | size | status | solve [s] (median) | target < 2 s |")
    print("|---|---|---|---:|---|")
    for name in ("fa6", "attention", "mha", "transformer"):
        times, status, sizes = [], "", {}
        for _ in range(repeats):
            outcome = pipeline.run(pipeline.Request(name, "wormhole", validate=False))
            times.append(outcome.timings["solve"])
            status, sizes = outcome.result.status.value, dict(outcome.workload.sizes)
        median = statistics.median(times)
        size = " ".join(f"{k}={v}" for k, v in sizes.items())
        verdict = ("PASS" if status == "optimal" and median < 2 else "FAIL") \
            if name in ("fa6", "attention") else "(no target)"
        print(f"| {name} | {size} | {status} | {median:.3f} | {verdict} |")


def emission(name: str, sizes: dict[str, int], fixes: tuple[str, ...], out: Path) -> str:
    start = time.perf_counter()
    try:
        outcome = pipeline.run(pipeline.Request(name, "wormhole", sizes, fixes=fixes,
                                                emit="ttlang", out_dir=str(out)))
    except SynthError as exc:
        return f"| {Path(name).stem} | {sizes} | not emitted: {str(exc)[:90]} | | | | |"
    seconds = time.perf_counter() - start
    check = outcome.emitted.check if outcome.emitted else None
    assert isinstance(check, TtlangCheck)
    model = model_dram_tiles(outcome.model, outcome.result.env or {})
    sim = (check.dram_tiles_read, check.dram_tiles_written)
    same = sim == (check.model_tiles_read, check.model_tiles_written) == model
    verdict = "PASS" if check.passed and same and seconds < 60 else "FAIL"
    return (f"| {Path(name).stem} | {sizes or 'M=64 N=64 K=128'} | "
            f"{'passed' if check.passed else 'FAILED'} (PCC {check.pcc}) | {seconds:.1f} | "
            f"{sim[0]}/{sim[1]} | {model[0]}/{model[1]} | {verdict} |")


def emissions() -> None:
    print("\n| workload | size | check | solve+emit+simulate [s] | simulator DRAM tiles "
          "R/W | cost model R/W | target |")
    print("|---|---|---|---:|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for name, sizes in [*REDUCED.items(), *LARGER]:
            print(emission(name, sizes, (), Path(tmp) / name), flush=True)
        path = Path(tmp) / "mm_f32.syn"
        path.write_text(MM_F32)
        print(emission(str(path), {}, ("fuse.C#1_C#2=1", "Q.C#1_C#2.k=32"),
                       Path(tmp) / "mm"), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    solve_times(args.repeats)
    emissions()


if __name__ == "__main__":
    main()
