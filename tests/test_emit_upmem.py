"""The UPMEM emitter and its stand-in runtime.

Behaviour first: every built-in workload, ragged sizes, host and MRAM loops, and random
workloads with optimal and random schedules are emitted, built against the stand-in and
run (`make check`), which passes only if the outputs match the NumPy reference. The
stand-in must catch what a DPU would reject (bad DMAs, WRAM overflow, deadlocks) and a
wrong result must fail the check.
"""

from __future__ import annotations

import ctypes
import dataclasses
import re
import shutil
import subprocess
from importlib import resources
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest
from conftest import SMALL_UPMEM, UPMEM_PRIOR, solve
from hypothesis import HealthCheck, assume, given, settings
from strategies import GeneratedWorkload, workloads

from synth import pipeline
from synth.constraints.cost import build_model
from synth.constraints.sample import random_schedule
from synth.constraints.space import kernel_for
from synth.emit import upmem_dpu
from synth.emit.cstyle import EmitError
from synth.emit.upmem import CheckResult, Emission, check_upmem, emit_upmem
from synth.hwfile import load_hardware
from synth.ir.interpret import interpret
from synth.ir.materialize import materialize
from synth.ir.nodes import (
    Affine,
    Alloc,
    BufferDecl,
    Compute,
    Load,
    Loop,
    LoopKind,
    Program,
    Store,
    walk,
)
from synth.lang import parse_workload
from synth.reference import compare, evaluate, evaluate_errors, make_inputs

pytestmark = pytest.mark.skipif(shutil.which("cc") is None or shutil.which("make") is None,
                                reason="needs a C compiler and make")

SIZES = {  # small, so that solving, building and running all take about a second
    "attention": {"S": 16, "D": 8},
    "fa6": {"S": 32, "D": 32},
    "gemm2k": {"M": 16, "N": 16, "K": 32},
    "matmul": {"M": 16, "N": 8, "K": 32},
    "mv": {"M": 64, "N": 128},
    "red": {"N": 4096},
    "softmax": {"N": 4096},
    "va": {"N": 4096},
}
RUNTIME = Path(str(resources.files("synth.emit").joinpath("upmem_runtime")))


def emitted(request: pipeline.Request, out_dir: Path) -> Emission:
    outcome = pipeline.run(dataclasses.replace(request, validate=False))
    assert outcome.program is not None, outcome.result.status
    inputs = make_inputs(outcome.workload, 0)
    expected = evaluate(outcome.workload, inputs)
    return emit_upmem(outcome.program, outcome.workload, outcome.hardware, out_dir, inputs,
                      expected)


def assert_passes(result: CheckResult) -> None:
    assert result.passed, result.log[-4000:]
    assert "every output matches the reference" in result.log


@pytest.fixture(scope="module")
def softmax(tmp_path_factory: pytest.TempPathFactory) -> Emission:
    return emitted(pipeline.Request("softmax", UPMEM_PRIOR, {"N": 999}),
                   tmp_path_factory.mktemp("softmax"))


# ---------------------------------------------------------------- emitted programs run


@pytest.mark.parametrize("workload", sorted(SIZES))
def test_builtin_passes_make_check(workload: str, tmp_path: Path) -> None:
    emitted(pipeline.Request(workload, "upmem", SIZES[workload]), tmp_path)
    assert_passes(check_upmem(tmp_path))


def test_ragged_tiles_pass(softmax: Emission, tmp_path: Path) -> None:
    """N = 999 and 31 x 67 leave the last tiles partly outside the tensors."""
    assert_passes(check_upmem(softmax.out_dir))
    emitted(pipeline.Request("mv", "upmem", {"M": 31, "N": 67}), tmp_path)
    assert "tile_points" in (tmp_path / "dpu_y.c").read_text()
    assert_passes(check_upmem(tmp_path))


def test_host_loops_and_mram_steps_pass(tmp_path: Path) -> None:
    """Few DPUs and small memories force sequential loops at the host (one launch per
    step) and at MRAM (steps inside the DPU program, with barriers between them)."""
    request = pipeline.Request("softmax", "upmem", {"N": 5000}, hw_overrides=(
        "rank.count=1", "dpu.count=1..2", "mram.capacity=4KiB", "wram.capacity=1KiB",
        "wram.reserved=0"))
    outcome = pipeline.run(dataclasses.replace(request, validate=False))
    assert outcome.program is not None
    kinds = {(n.var.kind, n.var.where) for k in outcome.program.kernels
             for n in walk(k.body) if isinstance(n, Loop)}
    assert {(LoopKind.SEQUENTIAL, "host"), (LoopKind.SEQUENTIAL, "mram")} <= kinds
    emitted(request, tmp_path)
    assert "barrier_wait(&sync_tasklets);" in (tmp_path / "dpu_m.c").read_text()
    assert "one launch per step" in (tmp_path / "host.c").read_text()
    assert_passes(check_upmem(tmp_path))


@pytest.mark.parametrize("on_device", [0, 1])
def test_partial_results_of_tasklets_are_combined(tmp_path: Path, on_device: int) -> None:
    """Across tasklets, partial sums go to the host through MRAM (0), or meet in WRAM and
    are combined on the DPU by one tasklet, after a barrier (1); mv's are 2-D tiles."""
    for workload, sizes, kernel, tasklets in (("red", {"N": 4096}, "s", "T.s.i=4"),
                                              ("mv", {"M": 64, "N": 96}, "y", "T.y.j=4")):
        out = tmp_path / workload
        # single buffered: double buffering pays for MRAM steps, and barriers between them
        emitted(pipeline.Request(workload, UPMEM_PRIOR, sizes, fixes=(
            f"combine.{kernel}.tasklet={on_device}", tasklets, f"buffers.{kernel}.wram=1")),
            out)
        dpu = (out / f"dpu_{kernel}.c").read_text()
        assert (f"/* combine {kernel}_mram += the " in dpu) == bool(on_device)
        assert ("barrier_wait(&sync_tasklets);" in dpu) == bool(on_device)
        assert_passes(check_upmem(out))


def test_long_dma_runs_are_split(tmp_path: Path) -> None:
    """8 KiB tiles: mram_read moves at most 2048 bytes, so read_mram splits each run."""
    emitted(pipeline.Request("red", "upmem", {"N": 65536}, fixes=("Q.s.i=2048",)), tmp_path)
    dpu = (tmp_path / "dpu_s.c").read_text()
    assert "x, 8192);" in dpu and "mram_read(src + done, dst + done, bytes - done < 2048" in dpu
    assert_passes(check_upmem(tmp_path))


def examples(count: int) -> settings:
    return settings(max_examples=count, derandomize=True, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow,
                                           HealthCheck.function_scoped_fixture])


@examples(4)
@given(workloads())
def test_random_workloads_pass(tmp_path: Path, generated: GeneratedWorkload) -> None:
    """The optimum and a random feasible schedule (odd tiles, steps at every memory)."""
    workload = parse_workload(generated.text, "generated.syn", "generated")
    hw = load_hardware("upmem", SMALL_UPMEM)
    model = pipeline.encode(workload, hw)
    optimum = solve(model.constraints).env
    assert optimum is not None
    inputs = make_inputs(workload, 0)
    expected = evaluate(workload, inputs)
    for tag, env in (("optimum", optimum), ("random", random_schedule(model.constraints, 1))):
        assert env is not None
        out = tmp_path / f"{len(list(tmp_path.iterdir()))}_{tag}"
        emit_upmem(materialize(model, env), workload, hw, out, inputs, expected)
        result = check_upmem(out)
        assert result.passed, f"{tag}:\n{generated.text}\n{result.log[-3000:]}"


def test_work_outside_tasklet_loops_waits_at_a_barrier(tmp_path: Path) -> None:
    """A loop nest the materialiser does not produce (yet): tasklets compute t in parallel
    and store it to MRAM, then tasklet 0 alone reads all of t back and computes c. The
    emitted program must make the others wait and put a barrier between the two."""
    text = "size N = 64\nin a : f32[N]\nin b : f32[N]\nout t : f32[N]\nout c : f32[N]\n" \
           "t[i] = a[i] + b[i]\nc[i] = t[i] * 2\n"
    workload = parse_workload(text, "two.syn", "two")
    hw = load_hardware("upmem", ("rank.count=1", "dpu.count=1", "tasklet.count=1..4"))
    model = build_model(workload, hw, [kernel_for(workload.statements, workload)])  # fused
    result = solve(model.constraints)
    assert result.env is not None
    program = materialize(model, result.env)
    assert [k.name for k in program.kernels] == ["t_c"]
    program = solo_c(program)
    inputs = make_inputs(workload, 0)
    expected, sigmas = evaluate_errors(workload, inputs)
    actual = interpret(program, workload, inputs)  # the rewritten nest is still right
    assert compare(expected["c"], actual["c"], workload.tensors["c"].dtype,
                   sigmas.get("c")).passed
    emit_upmem(program, workload, hw, tmp_path, inputs, expected)
    dpu = (tmp_path / "dpu_t_c.c").read_text()
    region, solo = dpu.index("t_i < T.t_c.i"), dpu.index("if (tasklet == 0)")
    assert region < dpu.index("barrier_wait(&sync_tasklets);", region) < solo
    assert_passes(check_upmem(tmp_path))


def solo_c(program: Program) -> Program:
    """Kernel t_c with c computed by one tasklet over the whole tile, after the loop."""
    kernel = program.kernels[0]
    loop = next(n for n in kernel.body if isinstance(n, Loop))
    keep = tuple(n for n in loop.body if not (
        (isinstance(n, Alloc) and n.buffer.tensor == "c")
        or (isinstance(n, Compute) and n.statement == "c")
        or (isinstance(n, Store) and n.src == "c_wram")))
    whole = {t: BufferDecl(f"{t}_whole", t, "wram", ("i",), (64,), (Affine(),),
                           program.globals[0].dtype) for t in ("t", "c")}
    after = (Alloc(whole["t"]), Load("t_whole", "t_mram"), Alloc(whole["c"]),
             Compute("c", "c_whole", {"t": "t_whole"}, ("i",), (Affine(),), (64,)),
             Store("c_whole", "c_mram"))
    at = kernel.body.index(loop)
    body = kernel.body[:at] + (dataclasses.replace(loop, body=keep),) + after \
        + kernel.body[at + 1:]
    return dataclasses.replace(program, kernels=(dataclasses.replace(kernel, body=body),))


# ---------------------------------------------------------------- what the check catches


def test_a_wrong_result_fails_the_check(softmax: Emission, tmp_path: Path) -> None:
    out = shutil.copytree(softmax.out_dir, tmp_path / "copy")
    expected = out / "data" / "expected_y.bin"
    values = np.fromfile(expected, dtype=np.float32)
    values[500] += 1e-3  # well beyond f32's tolerance, in one element
    values.tofile(expected)
    result = check_upmem(out)
    assert not result.passed
    assert "1 of 999 elements differ from the reference; the first, element 500" in result.log


def test_an_emitted_wram_overflow_is_caught(tmp_path: Path) -> None:
    """With the WRAM capacity rule dropped, a 32 KiB tile per tasklet fits no DPU."""
    emitted(pipeline.Request("va", "upmem", {"N": 65536}, drops=("capacity.wram",),
                             fixes=("Q.c.i=8192", "T.c.i=4")), tmp_path)
    result = check_upmem(tmp_path)
    assert not result.passed
    assert "dpu_load(dpu_c): WRAM overflow" in result.log


def test_check_fails_without_a_program(tmp_path: Path) -> None:
    assert not check_upmem(tmp_path).passed


DPU = """\
#include <stdint.h>
#include <alloc.h>
#include <barrier.h>
#include <defs.h>
#include <mram.h>

__mram_noinit uint32_t data[1024];
static __dma_aligned uint32_t buf[NR_TASKLETS][64];
BARRIER_INIT(sync, NR_TASKLETS);
EXTRA

int main(void)
{
    const uint32_t t = me();
    (void)t;
    BODY
    return 0;
}
"""

GLUE = """\
#include "standin.h"
#define main dpu_main_t
#include "dpu_t.c"
#undef main
static const struct standin_symbol symbols[] = {STANDIN_MRAM(data), STANDIN_WRAM(buf) SYMBOLS};
STANDIN_PROGRAM(dpu_t, dpu_main_t, symbols)
"""

HOST = """\
#include <dpu.h>
#include <stdio.h>
int main(void)
{
    static uint32_t values[2][1024];
    struct dpu_set_t set, dpu;
    uint32_t each;
    DPU_ASSERT(dpu_alloc(2, NULL, &set));
    DPU_ASSERT(dpu_load(set, "./dpu_t", NULL));
    DPU_FOREACH(set, dpu, each) {
        for (uint32_t i = 0; i < 1024; i++)
            values[each][i] = 1000 * each + i;
        DPU_ASSERT(dpu_prepare_xfer(dpu, values[each]));
    }
    DPU_ASSERT(dpu_push_xfer(set, DPU_XFER_TO_DPU, "data", 0, 4096, DPU_XFER_DEFAULT));
    DPU_ASSERT(dpu_launch(set, DPU_SYNCHRONOUS));
    DPU_FOREACH(set, dpu, each)
        DPU_ASSERT(dpu_prepare_xfer(dpu, values[each]));
    DPU_ASSERT(dpu_push_xfer(set, DPU_XFER_FROM_DPU, "data", 0, 4096, DPU_XFER_DEFAULT));
    printf("%u %u %u\\n", values[0][0], values[1][64], values[1][1023]);
    DPU_ASSERT(dpu_free(set));
    return 0;
}
"""

GOOD = """\
mram_read(&data[t * 64], buf[t], 256);
    buf[t][0] += 7;
    barrier_wait(&sync);
    mram_write(buf[t], &data[t * 64], 256);"""


def run_dpu_program(tmp_path: Path, body: str, extra: str = "", symbols: str = "",
                    host: str = HOST) -> subprocess.CompletedProcess[str]:
    """Build a hand-written DPU program (4 tasklets, 2 DPUs) with the stand-in and run it."""
    (tmp_path / "dpu_t.c").write_text(DPU.replace("EXTRA", extra).replace("BODY", body))
    (tmp_path / "standin_dpu_t.c").write_text(GLUE.replace("SYMBOLS", symbols))
    (tmp_path / "host.c").write_text(host)
    build = subprocess.run(
        ["cc", "-std=gnu11", "-pthread", "-Wall", "-Werror", f"-I{RUNTIME}", "-DNR_TASKLETS=4",
         "-o", "prog", "host.c", "standin_dpu_t.c", str(RUNTIME / "standin.c")],
        cwd=tmp_path, capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    return subprocess.run(["./prog"], cwd=tmp_path, capture_output=True, text=True, timeout=60)


def test_a_correct_dpu_program_runs(tmp_path: Path) -> None:
    run = run_dpu_program(tmp_path, GOOD)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["7", "1071", "2023"]  # tasklet 0 of DPU 0, 1 of DPU 1


@pytest.mark.parametrize(("body", "extra", "message"), [
    ("mram_read(&data[1], buf[t], 8);", "",
     "mram_read(8 bytes) from MRAM data+4: the MRAM address 0x4 is not 8-byte aligned"),
    ("mram_read(&data[0], &buf[t][1], 8);", "", "is not 8-byte aligned"),
    ("mram_read(&data[0], buf[t], 4096);", "",
     "mram_read(4096 bytes): a DMA moves 8..2048 bytes, a multiple of 8"),
    ("mram_write(buf[t], &data[0], 12);", "",
     "mram_write(12 bytes): a DMA moves 8..2048 bytes, a multiple of 8"),
    ("mram_read(&data[1020], buf[t], 32);", "",
     "mram_read(32 bytes) from MRAM data+4080: out of range, only 16 bytes remain"),
    ("mram_read(&data[0], buf[t], 512);", "",  # fits, except in the last tasklet's tile
     "tasklet 3, program dpu_t: mram_read(512 bytes) with WRAM buf+768: out of range, only "
     "256 bytes remain there"),
    ("if (t) barrier_wait(&sync);", "", "deadlock"),
    ("mem_alloc(70000);", "", "mem_alloc(70000): the WRAM heap is exhausted"),
])
def test_the_stand_in_catches(tmp_path: Path, body: str, extra: str, message: str) -> None:
    run = run_dpu_program(tmp_path, body, extra)
    assert run.returncode == 3, (run.stdout, run.stderr)
    assert "upmem stand-in: DPU 0, tasklet" in run.stderr
    assert message in run.stderr, run.stderr


def test_the_stand_in_catches_wram_globals_overflow(tmp_path: Path) -> None:
    run = run_dpu_program(tmp_path, "big[t] = 1;", "static __dma_aligned uint8_t big[65536];",
                          ", STANDIN_WRAM(big)")
    assert run.returncode == 3
    assert "dpu_load(dpu_t): WRAM overflow: globals take 66560 bytes" in run.stderr, run.stderr


@pytest.mark.parametrize(("transfer", "message"), [
    ('"data", 4, 4088', 'dpu_push_xfer("data", offset 4, 4088 bytes) on DPU 0: MRAM transfers '
                        'need offsets and sizes that are multiples of 8'),
    ('"data", 8, 4096', 'dpu_push_xfer("data", offset 8, 4096 bytes) on DPU 0: runs past the '
                        'end of data (4096 bytes)'),
    ('"nothing", 0, 8', 'dpu_push_xfer: program dpu_t has no symbol "nothing"'),
])
def test_host_transfers_are_checked(tmp_path: Path, transfer: str, message: str) -> None:
    host = HOST.replace('"data", 0, 4096, DPU_XFER_DEFAULT));\n    DPU_ASSERT(dpu_launch',
                        f'{transfer}, DPU_XFER_DEFAULT));\n    DPU_ASSERT(dpu_launch')
    run = run_dpu_program(tmp_path, "", host=host)
    assert run.returncode == 3
    assert message in run.stderr, run.stderr


# ---------------------------------------------------------------- what the emitter writes


def test_emitted_code_uses_the_sdk(softmax: Emission) -> None:
    out = softmax.out_dir
    host = (out / "host.c").read_text()
    for call in ("#include <dpu.h>", "dpu_alloc(NR_DPUS, NULL, &set)",
                 'dpu_load(set, "./dpu_m", NULL)', "DPU_FOREACH(set, dpu, each)",
                 "dpu_prepare_xfer(dpu,", "dpu_push_xfer(set, DPU_XFER_TO_DPU, \"x_mram\", 0,",
                 "dpu_push_xfer(set, DPU_XFER_FROM_DPU, \"y_mram\", 0,",
                 "dpu_broadcast_to(set,", "dpu_launch(set, DPU_SYNCHRONOUS)", "dpu_free(set)",
                 "DPU_ASSERT("):
        assert call in host, call
    for kernel in softmax.kernels:
        dpu = (out / f"dpu_{kernel}.c").read_text()
        for call in ("#include <defs.h>", "#include <mram.h>", "__mram_noinit", "__host",
                     "__dma_aligned", "me()", "mram_read(", "mram_write("):
            assert call in dpu, (kernel, call)
        assert "standin" not in dpu  # the SDK build sees nothing of the stand-in
    assert "/* t_i < T.e.i = " in (out / "dpu_e.c").read_text()
    makefile = (out / "Makefile").read_text()
    assert "dpu-upmem-dpurte-clang" in makefile and "dpu-pkg-config --cflags --libs dpu" \
        in makefile
    assert "standin" not in host


def test_unsupported_dtypes_are_refused(tmp_path: Path) -> None:
    text = "size N = 64\nin x : f16[N]\nout y : f16[N]\ny[i] = x[i] * 2\n"
    syn = tmp_path / "half.syn"
    syn.write_text(text)
    with pytest.raises(EmitError, match="cannot emit f16 tensors yet"):
        emitted(pipeline.Request(str(syn), "upmem"), tmp_path / "out")


def test_unaligned_runs_are_refused(tmp_path: Path) -> None:
    """Without the transfer rules, 3-byte tiles of i8 would need DMAs at odd addresses:
    the emitter says so rather than emit code a DPU would reject."""
    syn = tmp_path / "bytes.syn"
    syn.write_text("size N = 999\nin a : i8[N]\nout c : i8[N]\nc[i] = a[i] + 3\n")
    request = pipeline.Request(str(syn), "upmem", drops=("transfer.wram",), fixes=("Q.c.i=3",))
    with pytest.raises(EmitError, match="a run may start at element .* not 8-byte aligned"):
        emitted(request, tmp_path / "out")


def test_other_hardware_is_refused(tmp_path: Path) -> None:
    with pytest.raises(EmitError, match="the UPMEM emitter needs levels host > rank > dpu"):
        emitted(pipeline.Request("va", "cpu", {"N": 64}), tmp_path)


# ---------------------------------------------------------------- double buffering

ONE_DPU = ("rank.count=1", "dpu.count=1", "tasklet.count=2")


class Dma(NamedTuple):
    """One line of the stand-in's DMA trace: a tasklet's mram_read or mram_write."""

    call: str
    mram: str  # MRAM array
    mram_at: int  # byte offset in it
    wram: str
    wram_at: int
    size: int


def dma_trace(out: Path) -> dict[tuple[int, int], list[Dma]]:
    """Run the program `make check` built, with the stand-in tracing every DMA: the
    transfers of each (DPU, tasklet), in the order it issued them."""
    trace = out / "dma.trace"
    run = subprocess.run(["./host_standin"], cwd=out, capture_output=True, text=True,
                         timeout=120, env={"STANDIN_DMA_TRACE": str(trace)})
    assert run.returncode == 0, run.stderr
    per_tasklet: dict[tuple[int, int], list[Dma]] = {}
    for line in trace.read_text().splitlines():
        dpu, tasklet, call, mram, wram, size = line.split()
        (mram_name, mram_at), (wram_name, wram_at) = (p.split("+") for p in (mram, wram))
        per_tasklet.setdefault((int(dpu), int(tasklet)), []).append(
            Dma(call, mram_name, int(mram_at), wram_name, int(wram_at), int(size)))
    return per_tasklet


def at(events: list[Dma], call: str, mram: str) -> list[int]:
    """Where in `events` the `call`s on MRAM array `mram` are, in order."""
    return [i for i, e in enumerate(events) if e.call == call and e.mram == mram]


def alternate(offsets: list[int]) -> bool:
    """Whether consecutive tiles use the two halves of their WRAM tile in turn."""
    return len(set(offsets[:2])) == 2 and all(o == offsets[i % 2] for i, o in enumerate(offsets))


@pytest.mark.parametrize("n", [64, 61])  # 61: the last tile lies partly outside the tensors
def test_double_buffered_loads_go_one_step_ahead(tmp_path: Path, n: int) -> None:
    """c = a + b in 4 steps per tasklet: tile i + 1 of a and b is loaded, into the other
    half, before tile i is computed and stored, and the outputs are still right."""
    emitted(pipeline.Request("va", UPMEM_PRIOR, {"N": n}, hw_overrides=ONE_DPU, fixes=(
        "buffers.c.wram=2", "T.c.i=2", "M.c.i=4")), tmp_path)
    assert_passes(check_upmem(tmp_path))
    dpu = (tmp_path / "dpu_c.c").read_text()
    loop = dpu.index("for (uint32_t m_i = 0; m_i < 4; m_i++)")
    # in the step: the prefetch, then the compute, then the store
    assert loop < dpu.index("if (m_i + 1 < 4)", loop) < dpu.index("c[i] = ", loop) \
        < dpu.index("write_mram(", loop)
    trace = dma_trace(tmp_path)
    assert len(trace) == 2  # both tasklets of the one DPU
    for events in trace.values():
        stores = at(events, "mram_write", "c_mram")
        assert len(stores) == 4
        for tensor in ("a_mram", "b_mram"):
            loads = at(events, "mram_read", tensor)
            tiles = [events[i].mram_at for i in loads]
            assert len(loads) == 4 and tiles == sorted(set(tiles))
            assert alternate([events[i].wram_at for i in loads])
            for tile in range(3):  # tile + 1 arrives before tile is done
                assert loads[tile + 1] < stores[tile]
        assert alternate([events[i].wram_at for i in stores])


def test_an_accumulator_is_loaded_in_place(tmp_path: Path) -> None:
    """s += x with the tasklets' partial sums in MRAM: the partial sum the next step
    reads is the one this step writes, so it is not prefetched (x still is)."""
    emitted(pipeline.Request("red", UPMEM_PRIOR, {"N": 128}, hw_overrides=ONE_DPU, fixes=(
        "buffers.s.wram=2", "combine.s.tasklet=0", "T.s.i=2", "M.s.i=4")), tmp_path)
    assert_passes(check_upmem(tmp_path))
    for events in dma_trace(tmp_path).values():
        loads, stores = at(events, "mram_read", "s_mram"), at(events, "mram_write", "s_mram")
        assert len(loads) == len(stores) == 4
        for step in range(3):  # this step's sum is stored before the next step reads it
            assert loads[step] < stores[step] < loads[step + 1]
        x = at(events, "mram_read", "x_mram")
        assert all(x[step + 1] < stores[step] for step in range(3))


def test_prefetching_an_accumulator_would_fail_the_check(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    """The rule above matters, and the check sees it: loading the partial sum one step
    ahead reads it before this step's store, and the sum comes out wrong."""
    monkeypatch.setattr(upmem_dpu, "written_buffers", lambda nodes: set())
    emitted(pipeline.Request("red", UPMEM_PRIOR, {"N": 128}, hw_overrides=ONE_DPU, fixes=(
        "buffers.s.wram=2", "combine.s.tasklet=0", "T.s.i=2", "M.s.i=4")), tmp_path)
    assert (tmp_path / "dpu_s.c").read_text().count("prefetch:") == 2
    result = check_upmem(tmp_path)
    assert not result.passed
    assert "differ from the reference" in result.log


@examples(3)
@given(workloads())
def test_random_workloads_pass_double_buffered(tmp_path: Path,
                                               generated: GeneratedWorkload) -> None:
    """Every kernel double buffered, on a machine small enough for steps at MRAM: the
    optimum and a random schedule still compute the reference."""
    workload = parse_workload(generated.text, "generated.syn", "generated")
    hw = load_hardware("upmem", SMALL_UPMEM + ("wram.capacity=4KiB", "wram.reserved=512B"))
    names = [d for d in pipeline.encode(workload, hw).constraints.decisions
             if d.startswith("buffers.")]
    model = pipeline.encode(workload, hw, fixes=[f"{name}=2" for name in names])
    optimum = solve(model.constraints).env
    assume(optimum is not None)  # two of every tile may not fit
    inputs = make_inputs(workload, 0)
    expected = evaluate(workload, inputs)
    for tag, env in (("optimum", optimum), ("random", random_schedule(model.constraints, 1))):
        if env is None:
            continue
        out = tmp_path / f"{len(list(tmp_path.iterdir()))}_{tag}"
        emit_upmem(materialize(model, env), workload, hw, out, inputs, expected)
        result = check_upmem(out)
        assert result.passed, f"{tag}:\n{generated.text}\n{result.log[-3000:]}"


def test_without_a_loop_a_double_buffer_is_one_tile(tmp_path: Path) -> None:
    """One step per tasklet: nothing to prefetch; the tile uses its first half."""
    emitted(pipeline.Request("va", UPMEM_PRIOR, {"N": 64}, hw_overrides=ONE_DPU, fixes=(
        "buffers.c.wram=2", "T.c.i=2", "M.c.i=1")), tmp_path)
    dpu = (tmp_path / "dpu_c.c").read_text()
    assert "prefetch:" not in dpu and "= a_wram[tasklet];" in dpu
    assert_passes(check_upmem(tmp_path))


# ---------------------------------------------------------------- math on a DPU


MATH_FUNCTIONS = {"exp": np.exp, "log": np.log, "sqrt": np.sqrt, "tanh": np.tanh,
                  "fabs": np.abs}


@pytest.fixture(scope="module")
def dpu_math(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    """upmem_runtime/dpu_math.c built for the host, each function exported."""
    out = tmp_path_factory.mktemp("dpu_math")
    exports = "".join(f"float {f}_f(float x) {{ return math_{f}f(x); }}\n"
                      f"double {f}_d(double x) {{ return math_{f}(x); }}\n"
                      for f in MATH_FUNCTIONS)
    (out / "exports.c").write_text(f'#include <stdint.h>\n#include "{RUNTIME / "dpu_math.c"}"\n'
                                   f"{exports}")
    build = subprocess.run(["cc", "-O2", "-std=gnu11", "-Wall", "-Wextra", "-Werror", "-shared",
                            "-fPIC", "-o", "dpu_math.so", "exports.c"], cwd=out,
                           capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    return ctypes.CDLL(str(out / "dpu_math.so"))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", sorted(MATH_FUNCTIONS))
def test_dpu_math_matches_numpy(dpu_math: ctypes.CDLL, name: str, dtype: type) -> None:
    """The DPU runtime has no libm, so DPU programs use synth's: within 4 ulp of the
    correctly rounded result (sqrt and fabs exact), specials exactly."""
    rng = np.random.default_rng(0)
    x = np.concatenate([
        rng.uniform(-120, 100, 4000), rng.uniform(-2, 2, 4000),
        np.exp(rng.uniform(-100, 88, 4000)), np.exp(rng.uniform(-740, 700, 2000)),
        [0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, 4.0, 9.0, 0.5, 1e-45, 1e-40, 1e-310,
         3.4e38, 88.72, 88.73, -103.9, -104.5, 709.8, -745.2, 1e-8, -1e-8, 0.55, 22.5]])
    with np.errstate(over="ignore"):  # beyond float32: infinities, as intended
        x = x.astype(dtype)
    ctype = ctypes.c_float if dtype is np.float32 else ctypes.c_double
    fn = getattr(dpu_math, f"{name}_{'f' if dtype is np.float32 else 'd'}")
    fn.restype, fn.argtypes = ctype, [ctype]
    got = np.array([fn(v) for v in x.tolist()], dtype=dtype)
    with np.errstate(all="ignore"):
        want = MATH_FUNCTIONS[name](x.astype(np.float64)).astype(dtype)
    finite = np.isfinite(want)
    assert np.array_equal(got[~finite], want[~finite], equal_nan=True)
    assert np.isfinite(got[finite]).all()
    ulps = np.abs(got[finite].astype(np.float64) - want[finite]) / np.spacing(
        np.abs(want[finite]))
    assert ulps.max() <= (0 if name in ("sqrt", "fabs") else 4), name


# ---------------------------------------------------------------- the real SDK's API

# Parameters of the SDK calls the emitted sources make, from the SDK's headers (see
# upmem_runtime/SDK_NOTES.md): host include/dpu/dpu.h; DPU syslib/defs.h, mram.h,
# barrier.h, alloc.h. DPU_FOREACH takes the set, a DPU and optionally an index.
SDK_ARITY: dict[str, tuple[int, ...]] = {
    "dpu_alloc": (3,), "dpu_free": (1,), "dpu_load": (3,), "dpu_launch": (2,),
    "dpu_sync": (1,), "dpu_prepare_xfer": (2,), "dpu_push_xfer": (6,),
    "dpu_broadcast_to": (6,), "dpu_copy_to": (5,), "dpu_copy_from": (5,),
    "dpu_get_nr_dpus": (2,), "DPU_ASSERT": (1,), "DPU_FOREACH": (2, 3),
    "me": (0,), "mram_read": (3,), "mram_write": (3,), "barrier_wait": (1,),
    "BARRIER_INIT": (2,), "mem_alloc": (1,), "mem_reset": (0,),
}
# Headers a DPU program can include: the DPU runtime's stdlib and syslib (no <math.h>)
DPU_HEADERS = {"stdint.h", "stddef.h", "stdbool.h", "string.h", "float.h", "limits.h",
               "defs.h", "mram.h", "barrier.h", "alloc.h", "attributes.h", "perfcounter.h"}


def call_arities(source: str, name: str) -> list[int]:
    """How many arguments each call (or declaration) of `name` in C `source` has."""
    arities = []
    for match in re.finditer(rf"(?<![\w.>]){name}\s*\(", source):
        depth, start, args = 1, match.end(), []
        at = start
        while depth:
            char = source[at]
            if char in "([{":
                depth += 1
            elif char in ")]}":
                depth -= 1
            elif char == "," and depth == 1:
                args.append(source[start:at])
                start = at + 1
            elif char == '"':
                at = source.index('"', at + 1)
            at += 1
        args.append(source[start:at - 1])
        empty = len(args) == 1 and args[0].strip() in ("", "void")
        arities.append(0 if empty else len(args))
    return arities


def test_emitted_calls_have_the_sdk_arity(softmax: Emission) -> None:
    """Every SDK call in the emitted sources has the real headers' arity, and so does every
    declaration in the stand-in (so `make check` rejects what the SDK would)."""
    out = softmax.out_dir
    host = (out / "host.c").read_text()
    dpus = [(out / f"dpu_{k}.c").read_text() for k in softmax.kernels]
    seen = set()
    for source in [host, *dpus]:
        for name, arity in SDK_ARITY.items():
            calls = call_arities(source, name)
            assert all(n in arity for n in calls), (name, calls)
            seen |= {name} if calls else set()
    assert seen >= {"dpu_alloc", "dpu_free", "dpu_load", "dpu_launch", "dpu_prepare_xfer",
                    "dpu_push_xfer", "dpu_broadcast_to", "DPU_FOREACH", "DPU_ASSERT", "me",
                    "mram_read", "mram_write", "barrier_wait", "BARRIER_INIT"}
    for dpu in dpus:
        assert set(re.findall(r"#include <([\w/.]+)>", dpu)) <= DPU_HEADERS
    headers = "".join((RUNTIME / h).read_text() for h in ("dpu.h", "defs.h", "mram.h",
                                                          "barrier.h", "alloc.h"))
    for name, arity in SDK_ARITY.items():
        if name not in ("DPU_FOREACH", "DPU_ASSERT"):
            declared = call_arities(headers, name)
            assert declared and all(n in arity for n in declared), (name, declared)
