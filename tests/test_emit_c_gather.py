"""The gathered loads of synth_vec.h (`vgather_f32`, `vgather_i32`): lane l of the vector
is p[l * stride], on the ISA's gather (AVX-512, AVX2) where the offsets fit 32 bits and
lane by lane otherwise (a negative stride here). The emitter loads a tile strided along
the vector dimension with them (a row reduction vectorised along the rows)."""

from __future__ import annotations

import shutil
import subprocess
from importlib import resources
from pathlib import Path

import pytest

PROGRAM = r"""
#include <stdio.h>
#include "synth_vec.h"
float f[4096]; int32_t i[4096];
int main(void) {
    for (int k = 0; k < 4096; k++) { f[k] = 0.5f * k - 3.0f; i[k] = 7 * k - 11; }
    int64_t strides[3] = {1, 37, 256};
    for (int s = 0; s < 3; s++) {
        vf32 a = vgather_f32(&f[5], strides[s]); vi32 b = vgather_i32(&i[3], strides[s]);
        for (int l = 0; l < SYNTH_W; l++) printf("%.9g %d ", a[l], b[l]);
        printf("\n");
    }
    vf32 a = vgather_f32(&f[4000], -9); vi32 b = vgather_i32(&i[4000], -9);
    for (int l = 0; l < SYNTH_W; l++) printf("%.9g %d ", a[l], b[l]);
    printf("\n");
    return 0;
}
"""


@pytest.mark.parametrize(("vb", "flags"), [(64, ("-march=native",)), (32, ("-mavx2",)),
                                           (32, ()), (16, ())])
def test_a_gather_reads_every_stride(tmp_path: Path, vb: int, flags: tuple[str, ...]) -> None:
    if shutil.which("cc") is None:
        pytest.skip("no C compiler")
    with resources.as_file(resources.files("synth.emit") / "c_runtime" / "synth_vec.h") as h:
        shutil.copy(h, tmp_path / "synth_vec.h")
    (tmp_path / "g.c").write_text(PROGRAM)
    exe = tmp_path / "g"
    subprocess.run(["cc", "-O2", "-std=gnu11", "-fwrapv", *flags, f"-DSYNTH_VB={vb}",
                    "-o", str(exe), str(tmp_path / "g.c"), "-lm"], check=True)
    lines = subprocess.run([str(exe)], check=True, capture_output=True,
                           text=True).stdout.splitlines()
    lanes = vb // 4
    for line, (f0, i0, stride) in zip(lines, [(5, 3, 1), (5, 3, 37), (5, 3, 256),
                                              (4000, 4000, -9)], strict=True):
        values = line.split()
        assert len(values) == 2 * lanes
        for lane in range(lanes):
            assert float(values[2 * lane]) == 0.5 * (f0 + lane * stride) - 3.0
            assert int(values[2 * lane + 1]) == 7 * (i0 + lane * stride) - 11
