"""The C emitter's innermost loops over register tiles: a register tile that is only
written is stored in address order (`vstore_seq_*`, volatile stores the compiler keeps in
program order: gcc -O3 stored the first vector of an 8-vector tile last, and stores that
split cache lines ran up to 40% slower out of order), and the innermost loop over
register tiles along the vector dimension is unrolled to `UNROLL_VECTORS` vectors per
iteration (one vector of exps per iteration ran 10-12% slower than four from the L3).
RESULTS.md, "Cost fidelity round 5". Each emitted program is checked against the
reference; no timing here."""

from __future__ import annotations

import re
import shutil
import subprocess
from importlib import resources
from pathlib import Path

import pytest
from conftest import Case, build, forced, sample
from test_emit_c import assert_passes, emit_and_check
from test_emit_c_region import kernel_source

from synth.emit.c import UNROLL_VECTORS
from synth.ir.materialize import materialize

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


def test_tiles_of_four_vectors_or_more_are_not_unrolled(tmp_path: Path) -> None:
    e_s, y = softmax_source(tmp_path, "V.e_s.i=64", "V.y.i=128")
    assert "#pragma GCC unroll" not in e_s + y


def test_written_tiles_store_in_order_and_accumulators_as_before(tmp_path: Path) -> None:
    e_s, y = softmax_source(tmp_path, "V.e_s.i=64", "V.y.i=128")
    assert "vstore_seq_f32(&y[" in y and "vstore_f32(" not in y
    assert "vstore_seq_f32(&e[" in e_s


def test_a_gemm_accumulator_read_back_is_stored_as_before(tmp_path: Path) -> None:
    # sample 0 of a small matmul: its first kernel writes C's register tiles (in order),
    # the second loads them back, accumulates and stores them (plain stores)
    case = Case.of("matmul", "cpu", {"M": 32, "N": 64, "K": 64})
    env = sample(case, 0)
    assert env is not None
    built = build(case)
    assert_passes(emit_and_check(materialize(built.model, env), built.workload, tmp_path))
    source = (tmp_path / "kernels.c").read_text()
    assert "vload_i32(&C[" in source
    assert "vstore_seq_i32(&C[" in source and "vstore_i32(&C[" in source


STORES = r"""
#include "synth_vec.h"
void tile(const float *restrict e, float *restrict y, float s, long n) {
    vf32 sv = vsplat_f32(s);
    for (long q = 0; q < n; q += 8 * SYNTH_W) {
        vf32 r[8], o[8];
        for (int t = 0; t < 8; t++) r[t] = vload_f32(&e[q + t * SYNTH_W]);
        for (int t = 0; t < 8; t++) o[t] = r[t] / sv;
        for (int t = 0; t < 8; t++) vstore_seq_f32(&y[q + t * SYNTH_W], o[t]);
    }
}
"""


def test_ordered_stores_keep_their_order_in_the_assembly(tmp_path: Path) -> None:
    cc = shutil.which("gcc")
    if cc is None or subprocess.run([cc, "-dumpmachine"], capture_output=True,
                                    text=True).stdout.split("-")[0] != "x86_64":
        pytest.skip("needs gcc on x86-64")
    with resources.as_file(resources.files("synth.emit") / "c_runtime" / "synth_vec.h") as h:
        shutil.copy(h, tmp_path / "synth_vec.h")
    (tmp_path / "t.c").write_text(STORES)
    subprocess.run([cc, "-O3", "-mavx512f", "-DSYNTH_VB=64", "-std=gnu11", "-S",
                    "-o", str(tmp_path / "t.s"), str(tmp_path / "t.c")], check=True)
    stores = re.findall(r"vmovups\s+%zmm\d+, (-?\d*)\(%(\w+)", (tmp_path / "t.s").read_text())
    assert len(stores) == 8, stores
    offsets = [int(off or 0) for off, _ in stores]
    assert offsets == sorted(offsets), offsets
