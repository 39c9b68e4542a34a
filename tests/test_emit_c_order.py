"""The C emitter's innermost loops over register tiles: a register tile's stores stay in
address order (`-fno-schedule-insns2` in the build flags: gcc -O3 stored the first vector
of an 8-vector tile last, and stores that split cache lines ran up to 40% slower out of
order), and the innermost loop over register tiles along the vector dimension is
unrolled to `UNROLL_VECTORS` vectors per iteration (one vector of exps per iteration ran
10-12% slower than four from the L3). RESULTS.md, "Cost fidelity round 5". Each emitted
program is checked against the reference; no timing here."""

from __future__ import annotations

import re
import shutil
import subprocess
from importlib import resources
from pathlib import Path

import pytest
from conftest import Case, forced
from test_emit_c import assert_passes, emit_and_check
from test_emit_c_region import kernel_source

from synth.emit.c import CFLAGS, UNROLL_STEPS, UNROLL_VECTORS
from synth.hwfile import load_hardware

SOFTMAX = Case.of("softmax", "cpu", {"N": 1 << 14})


def softmax_source(tmp_path: Path, *fixes: str) -> tuple[str, str]:
    """softmax with `fixes` (e and s fused), emitted and checked: the sources of its
    e_s and y kernels."""
    built, program = forced(SOFTMAX, "fuse.e_s=1", *fixes)
    assert_passes(emit_and_check(program, built.workload, tmp_path))
    return kernel_source(tmp_path, "e_s"), kernel_source(tmp_path, "y")


def unrolled(source: str) -> list[tuple[int, str, str]]:
    """Each `#pragma GCC unroll N` with the loops around and after it: (N, the loop over
    groups of N iterations, the loop over one group that it unrolls)."""
    lines = source.splitlines()
    return [(int(m.group(1)), lines[i - 1], lines[i + 1]) for i, line in enumerate(lines)
            if (m := re.fullmatch(r"\s*#pragma GCC unroll (\d+)", line))]


def test_one_vector_tiles_are_unrolled_to_four_vectors(tmp_path: Path) -> None:
    e_s, y = softmax_source(tmp_path, "V.e_s.i=16", "V.y.i=32")
    # one loop each: the innermost over register tiles along i (its body opens no other
    # loop over tiles), as groups of iterations around one the compiler unrolls
    for source, kernel, factor in ((e_s, "e_s", UNROLL_VECTORS), (y, "y", UNROLL_VECTORS // 2)):
        (unroll, groups, group), = unrolled(source)
        assert unroll == factor
        outer = re.search(rf"for \(int64_t (\w+) = 0; \1 < (\d+); \1 \+= {factor}\) "
                          rf"{{ /\* \w+: [SLQ]\.{kernel}\.i \*/", groups)
        assert outer, groups
        assert int(outer.group(2)) % factor == 0
        assert re.search(rf"for \(int64_t (\w+) = {outer.group(1)}; \1 < {outer.group(1)} "
                         rf"\+ {factor}; \1\+\+\) {{$", group), group
        assert not re.search(r"/\* \w+: [SLQ]\.", source[source.index(group):]), source


def test_a_loop_around_a_short_innermost_loop_unrolls_too(tmp_path: Path) -> None:
    # softmax's optimum on cpu: m folds its maximum after every L2 tile of 2 vectors (the
    # loop over tiles in DRAM walks 2 vectors per iteration): both loops unroll by 2
    built, program = forced(SOFTMAX, "fuse.e_s=1", "S.m.i=1", "L.m.i=2", "Q.m.i=1",
                            "V.m.i=16")
    assert_passes(emit_and_check(program, built.workload, tmp_path))
    found = unrolled(kernel_source(tmp_path, "m"))
    assert [factor for factor, _, _ in found] == [2, 2], found
    assert re.search(r"\+= 2\) { /\* dram: H\.m\.i \*/", found[0][1]), found
    assert re.search(r"\+= 2\) { /\* l2: L\.m\.i \*/", found[1][1]), found


def test_tiles_of_four_vectors_or_more_are_not_unrolled(tmp_path: Path) -> None:
    e_s, y = softmax_source(tmp_path, "V.e_s.i=64", "V.y.i=128")
    assert "#pragma GCC unroll" not in e_s + y


STORES = r"""
#include "synth_vec.h"
void tile(const float *restrict e, float *restrict y, const float *restrict s) {
    vf32 sv = vsplat_f32(s[0]);
    for (long l = 0; l < 32; l++) {
        for (long q = 0; q < 32; q++) {
            vf32 r[8], o[8];
            for (int t = 0; t < 8; t++) r[t] = vload_f32(&e[l * 4096 + q * 128 + t * 16]);
            for (int t = 0; t < 8; t++) o[t] = r[t] / sv;
            for (int t = 0; t < 8; t++) vstore_f32(&y[l * 4096 + q * 128 + t * 16], o[t]);
        }
    }
}
"""


def test_a_tiles_stores_keep_their_order_in_the_assembly(tmp_path: Path) -> None:
    # the shape of softmax's y with 8 vectors per register tile, as the emitter writes it;
    # gcc tuned for this machine (-march=native: Sapphire Rapids) stored its first vector last
    cc = shutil.which("gcc")
    cpuinfo = Path("/proc/cpuinfo")
    if cc is None or not cpuinfo.exists() or " avx512f" not in cpuinfo.read_text():
        pytest.skip("needs gcc on a machine with AVX-512")
    with resources.as_file(resources.files("synth.emit") / "c_runtime" / "synth_vec.h") as h:
        shutil.copy(h, tmp_path / "synth_vec.h")
    (tmp_path / "t.c").write_text(STORES)
    flags = [f for f in CFLAGS if f not in ("-fopenmp", "-fPIC", "-shared")]
    subprocess.run([cc, *flags, "-DSYNTH_VB=64", "-S",
                    "-o", str(tmp_path / "t.s"), str(tmp_path / "t.c")], check=True)
    stores = re.findall(r"vmovups\s+%zmm\d+, (-?\d*)\(%(\w+)", (tmp_path / "t.s").read_text())
    assert len(stores) == 8, stores
    offsets = [int(off or 0) for off, _ in stores]
    assert offsets == sorted(offsets), offsets


STRIP = r"""
#include "synth_vec.h"
void strip(const float *restrict x, float *restrict y, const float *restrict r) {
    for (long d = 0; d < 64; d++) {
        for (long s = 0; s < 64; s++) {
            vf32 v = vload_f32(&x[s * 1024 + d * 16]) * vsplat_f32(r[s]);
            vstore_f32(&y[s * 1024 + d * 16], v);
        }
    }
}
"""


def test_gcc_keeps_the_schedules_loop_order(tmp_path: Path) -> None:
    """A strip [64 x 16] walked down its rows, as the emitter writes rownorm's y kernel
    where the schedule says so: gcc -O3 interchanges the two loops (the rows then run
    along a row's lines), which the build flags forbid. The loop order is the schedule's
    and the model prices it (`transfers.strip_moves`); interchanged, rownorm's kernel ran
    8x faster than the schedule the model priced."""
    cc = shutil.which("gcc")
    if cc is None:
        pytest.skip("needs gcc")
    with resources.as_file(resources.files("synth.emit") / "c_runtime" / "synth_vec.h") as h:
        shutil.copy(h, tmp_path / "synth_vec.h")
    (tmp_path / "t.c").write_text(STRIP)

    def report(flags: list[str]) -> str:
        return subprocess.run([cc, *flags, "-DSYNTH_VB=64", "-fopt-info-loop-optimized", "-c",
                               "-o", str(tmp_path / "t.o"), str(tmp_path / "t.c")],
                              check=True, capture_output=True, text=True).stderr

    plain = report(["-O3", "-march=native", "-std=gnu11"])
    if "interchanged" not in plain:
        pytest.skip("this gcc does not interchange the strip's loops at -O3 anyway")
    flags = [f for f in CFLAGS if f not in ("-fopenmp", "-fPIC", "-shared")]
    assert "interchanged" not in report(flags)


GEMM = (Path(__file__).resolve().parent.parent / "benchmarks" / "workloads"
        / "matmul_f32.syn").read_text()


def test_a_loop_of_single_reduction_steps_is_unrolled(tmp_path: Path) -> None:
    """One step of k per register tile, 32 steps of the loop at L1 around it: unrolled to
    `UNROLL_STEPS` steps per iteration (each step's counter and branch took the window's
    place of the next tiles' FMAs: fa6's QK^T ran 2.6 cycles a step, 1.5 unrolled). With
    8 steps in the register tile, the loop around it stays as it is."""
    case = Case.of("matmul_f32", "cpu", {"M": 16, "N": 32, "K": 32}, text=GEMM)
    lanes = load_hardware("cpu").compute.lanes["f32"]
    tile = ("P=1", "fuse.C#1_C#2=1", "V.C#1_C#2.m=1", f"V.C#1_C#2.n={lanes}")
    for steps, fixes in ((1, ("V.C#1_C#2.k=1", "Q.C#1_C#2.k=32")),
                         (8, ("V.C#1_C#2.k=8", "Q.C#1_C#2.k=4"))):
        built, program = forced(case, *tile, *fixes)
        out = tmp_path / f"k{steps}"
        assert_passes(emit_and_check(program, built.workload, out))
        found = [(factor, groups) for factor, groups, _ in
                 unrolled(kernel_source(out, "C_1_C_2")) if "Q.C#1_C#2.k" in groups]
        if steps == 1:
            assert [factor for factor, _ in found] == [UNROLL_STEPS], found
            assert re.search(rf"< 32; \w+ \+= {UNROLL_STEPS}\) {{", found[0][1]), found
        else:
            assert not found, found
