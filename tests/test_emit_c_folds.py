"""The horizontal folds of synth_vec.h (`vsum_f32` and its kin): pairwise, on the ISA's
reduce sequences with AVX-512 and a portable tree elsewhere; both give the fold of every
lane (exactly for i32, which wraps; within f32 rounding for sums and products)."""

from __future__ import annotations

import math
import shutil
import subprocess
from importlib import resources
from pathlib import Path

import numpy as np
import pytest

PROGRAM = r"""
#include <stdio.h>
#include "synth_vec.h"
int main(void) {
    vf32 f; vi32 i;
    for (int l = 0; l < SYNTH_W; l++) { f[l] = 0.75f + 0.125f * l * (l % 3 ? 1 : -1);
                                        i[l] = 3 * l - 7 + (l == 5 ? 1000 : 0); }
    printf("%d\n%.9g %.9g %.9g %.9g\n%d %d %d %d\n", SYNTH_W, vsum_f32(f), vprod_f32(f),
           vhmax_f32(f), vhmin_f32(f), vsum_i32(i), vprod_i32(i), vhmax_i32(i), vhmin_i32(i));
    return 0;
}
"""


def run(tmp_path: Path, vb: int, flags: tuple[str, ...]) -> list[str]:
    with resources.as_file(resources.files("synth.emit") / "c_runtime" / "synth_vec.h") as h:
        shutil.copy(h, tmp_path / "synth_vec.h")
    (tmp_path / "f.c").write_text(PROGRAM)
    exe = tmp_path / f"f{vb}"
    subprocess.run(["cc", "-O2", "-std=gnu11", "-fwrapv", *flags, f"-DSYNTH_VB={vb}",
                    "-o", str(exe), str(tmp_path / "f.c"), "-lm"], check=True)
    return subprocess.run([str(exe)], check=True, capture_output=True,
                          text=True).stdout.split()


@pytest.mark.parametrize(("vb", "flags"), [(64, ("-march=native",)), (32, ()), (16, ())])
def test_folds_give_the_fold_of_every_lane(tmp_path: Path, vb: int,
                                           flags: tuple[str, ...]) -> None:
    if shutil.which("cc") is None:
        pytest.skip("no C compiler")
    out = run(tmp_path, vb, flags)
    lanes = int(out[0])
    assert lanes == vb // 4
    f = np.array([0.75 + 0.125 * k * (1 if k % 3 else -1) for k in range(lanes)],
                 dtype=np.float32)
    i = np.array([3 * k - 7 + (1000 if k == 5 else 0) for k in range(lanes)], dtype=np.int64)
    sums = [float(v) for v in out[1:5]]
    assert sums[0] == pytest.approx(float(f.sum(dtype=np.float64)), rel=1e-6)
    assert sums[1] == pytest.approx(float(np.prod(f, dtype=np.float64)), rel=1e-5)
    assert sums[2:] == [float(f.max()), float(f.min())]
    ints = [int(v) for v in out[5:9]]
    assert ints[0] == int(i.sum()) and ints[2:] == [int(i.max()), int(i.min())]
    product = math.prod(int(v) for v in i)  # wrapped like int32 (-fwrapv)
    assert ints[1] == (product + 2**31) % 2**32 - 2**31


EXTREMA = r"""
#include <stdio.h>
#include "synth_vec.h"
static float smax(float a, float b) { return a > b ? a : b; }
static float smin(float a, float b) { return a < b ? a : b; }
int main(void) {
    const float v[] = {NAN, 1.0f, -1.0f, 0.0f, -0.0f, INFINITY, -INFINITY};
    int n = (int)(sizeof v / sizeof v[0]), bad = 0;
    for (int x = 0; x < n; x++)
        for (int y = 0; y < n; y++) {
            vf32 a = vsplat_f32(v[x]), b = vsplat_f32(v[y]);
            float hi = vmax_f32(a, b)[SYNTH_W - 1], lo = vmin_f32(a, b)[0];
            /* bit for bit: NaN, and the sign of a zero */
            float want_hi = smax(v[x], v[y]), want_lo = smin(v[x], v[y]);
            bad += memcmp(&hi, &want_hi, 4) != 0 || memcmp(&lo, &want_lo, 4) != 0;
            int32_t p = (int32_t)(x * 7 - 20), q = (int32_t)(y * 5 - 15);
            bad += vmax_i32(vsplat_i32(p), vsplat_i32(q))[0] != (p > q ? p : q);
            bad += vmin_i32(vsplat_i32(p), vsplat_i32(q))[0] != (p < q ? p : q);
        }
    printf("%d\n", bad);
    return 0;
}
"""


@pytest.mark.parametrize(("vb", "flags"), [(64, ("-march=native",)), (32, ("-mavx2",)),
                                           (16, ())])
def test_vector_max_and_min_are_the_scalar_ones(tmp_path: Path, vb: int,
                                                flags: tuple[str, ...]) -> None:
    """vmax_f32 is the ISA's maxps where there is one (a chain of them waits 2 cycles on
    AMD Zen 5, the compare and select 10.6): the same as `a > b ? a : b` bit for bit,
    NaN (the second operand) and signed zeros included."""
    if shutil.which("cc") is None:
        pytest.skip("no C compiler")
    with resources.as_file(resources.files("synth.emit") / "c_runtime" / "synth_vec.h") as h:
        shutil.copy(h, tmp_path / "synth_vec.h")
    (tmp_path / "x.c").write_text(EXTREMA)
    exe = tmp_path / f"x{vb}"
    subprocess.run(["cc", "-O2", "-std=gnu11", *flags, f"-DSYNTH_VB={vb}", "-o", str(exe),
                    str(tmp_path / "x.c"), "-lm"], check=True)
    assert subprocess.run([str(exe)], check=True, capture_output=True,
                          text=True).stdout.split() == ["0"]
