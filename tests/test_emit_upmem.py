"""The UPMEM emitter and its stand-in runtime.

Behaviour first: every built-in workload, ragged sizes, host and MRAM loops, and random
workloads with optimal and random schedules are emitted, built against the stand-in and
run (`make check`), which passes only if the outputs match the NumPy reference. The
stand-in must catch what a DPU would reject (bad DMAs, WRAM overflow, deadlocks) and a
wrong result must fail the check.
"""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
from importlib import resources
from pathlib import Path

import numpy as np
import pytest
from conftest import SMALL_UPMEM
from hypothesis import HealthCheck, given, settings
from strategies import GeneratedWorkload, workloads

from synth import pipeline
from synth.constraints import cpsat
from synth.constraints.cost import build_model
from synth.constraints.sample import random_schedule
from synth.constraints.space import kernel_for
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
from synth.reference import compare, evaluate, make_inputs

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
    return emitted(pipeline.Request("softmax", "upmem", {"N": 999}),
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
        emitted(pipeline.Request(workload, "upmem", sizes, fixes=(
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
    optimum = cpsat.solve(model.constraints, 30.0).env
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
    result = cpsat.solve(model.constraints, 30.0)
    assert result.env is not None
    program = materialize(model, result.env)
    assert [k.name for k in program.kernels] == ["t_c"]
    program = solo_c(program)
    inputs = make_inputs(workload, 0)
    expected = evaluate(workload, inputs)
    actual = interpret(program, workload, inputs)  # the rewritten nest is still right
    assert compare(expected["c"], actual["c"], workload.tensors["c"].dtype)[0]
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
