"""Packed operand panels in the emitted C (`synth.emit.c_pack`): the layout the
micro-kernel reads, which tiles are packed, and that packed and unpacked code both match
the reference, also where the sizes are not multiples of the register tile (ragged
tiles, zeros packed past the tensor's edge) and under AddressSanitizer and UBSan."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pytest
from conftest import Case, build, optimal_program
from test_emit_c import assert_passes, emit_and_check, sanitized
from test_emit_c_region import fixed

from synth.emit import c_pack
from synth.emit.c import KernelWriter, ProgramWriter
from synth.emit.c_pack import Pack, Part, contraction, exact_div, panel_parts, revisits
from synth.hwfile import load_hardware
from synth.ir.nodes import Affine, BufferDecl, Loop, LoopKind, LoopVar, Program
from synth.lang import parse_workload
from synth.workload import DType

GEMM = (Path(__file__).resolve().parent.parent / "benchmarks" / "workloads"
        / "matmul_f32.syn").read_text()


def gemm_case(sizes: Mapping[str, int]) -> Case:
    return Case.of("matmul_f32", "cpu", sizes, text=GEMM)


def packs(case: Case, program: Program) -> dict[str, Pack]:
    writer = ProgramWriter(program, build(case).workload, load_hardware("cpu"))
    found: dict[str, Pack] = {}
    for kernel in program.kernels:
        found.update(KernelWriter(writer, kernel).packs)
    return found


def test_the_packed_layout_is_blocks_then_the_reduction_then_the_block() -> None:
    """A 6 x 8 tile of B[k, n] in panels of 4 along n: panel p holds B[k, 4p + j] at
    k * 4 + j, one register tile's row after another."""
    decl = BufferDecl("B_l2", "B", "l2", ("k", "n"), (6, 8), (Affine(), Affine()), DType.F32)
    pack = Pack(decl, ("n",), ("k",), {"n": 4}, ())
    tile = np.arange(48).reshape(6, 8)
    packed = np.empty(48, dtype=int)
    for block in range(2):
        for k in range(6):
            for j in range(4):
                start = {"k": Affine(), "n": Affine((), 4 * block)}
                at = int(eval(pack.index(start, {"k": str(k), "n": str(j)}, str)))  # noqa: S307
                packed[at] = tile[k, 4 * block + j]
    expected = tile.reshape(6, 2, 4).transpose(1, 0, 2).reshape(-1)
    assert packed.tolist() == expected.tolist()


def test_exact_division_of_an_offset() -> None:
    assert exact_div(Affine((("l_m", 8),), 16), 4) == Affine((("l_m", 2),), 4)
    with pytest.raises(ValueError):
        exact_div(Affine((("l_m", 6),)), 4)


def test_contractions_are_products_of_two_tensors_summed() -> None:
    text = ("size M = 8\nsize N = 8\nsize K = 8\nin A : f32[M, K]\nin B : f32[K, N]\n"
            "out C : f32[M, N]\nout D : f32[M, N]\nout E : f32[M]\n"
            "C[m, n] += A[m, k] * B[k, n]\nD[m, n] = A[m, n] * B[m, n]\n"
            "E[m] += A[m, k] * A[m, k]\n")
    workload = parse_workload(text, "g.syn", "g")
    kinds = {s.name: contraction(s) is not None for s in workload.statements}
    assert kinds == {"C": True, "D": False, "E": False}


@pytest.mark.parametrize("sizes", [{"M": 96, "N": 64, "K": 40},
                                   {"M": 37, "N": 50, "K": 23}])
def test_a_packed_gemm_matches_the_reference(sizes: Mapping[str, int],
                                             tmp_path: Path) -> None:
    case = gemm_case(sizes)
    program = optimal_program(case)
    assert packs(case, program), "the GEMM's operand tiles are packed"
    check = emit_and_check(program, build(case).workload, tmp_path)
    assert_passes(check)
    source = (tmp_path / "kernels.c").read_text()
    assert "static float *pack_" in source and "aligned_alloc(64" in source


def test_ragged_tiles_are_packed_with_zeros_past_the_edge(tmp_path: Path) -> None:
    """Sizes that are no multiple of the register tile: the packing copies stop at the
    tensor's edge (0 beyond), the micro-kernel's ragged tiles take the scalar path."""
    case = gemm_case({"M": 37, "N": 50, "K": 23})
    program = optimal_program(case)
    assert_passes(emit_and_check(program, build(case).workload, tmp_path))
    source = (tmp_path / "kernels.c").read_text()
    assert re.search(r"< \d+ \? [AB]\[.*\] : 0\.0f;", source), "no guarded packing copy"


def test_unpacked_code_still_matches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With packing off, the micro-kernel reads the tensors."""
    monkeypatch.setattr(c_pack, "PACKING", False)
    case = gemm_case({"M": 37, "N": 50, "K": 23})
    program = optimal_program(case)
    assert not packs(case, program)
    assert_passes(emit_and_check(program, build(case).workload, tmp_path))
    assert "pack_" not in (tmp_path / "kernels.c").read_text()

# attention's online candidates (its kernels read K into the step's arrays, not panels)
ONLINE_ATTENTION = ("m_p_l_o", "m_p_l_o_O", "s_m_p_l_o", "s_m_p_l_o_O")


def test_a_gathered_operand_is_packed_contiguous_along_the_vector(tmp_path: Path) -> None:
    """attention's K[j, d] is vectorised along j, not its last axis: packed in panels of
    j, its register tiles load whole vectors (no lane-by-lane gather). Without the
    online rewrite (its kernels read K into the step's arrays, not packed panels)."""
    case = Case.of("attention", "cpu", {"S": 48, "D": 16})
    built, program = fixed(case, *(f"online.{k}=0" for k in ONLINE_ATTENTION))
    found = [p for p in packs(case, program).values() if p.decl.tensor == "K"]
    assert found and found[0].free == ("j",)
    assert_passes(emit_and_check(program, built.workload, tmp_path))
    source = (tmp_path / "kernels.c").read_text()
    assert re.search(r"K_reg\w*\[[^\]]*\] = vload(_kept)?_f32\(&K_l2", source)


def test_packed_code_under_the_sanitizers(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    case = gemm_case({"M": 37, "N": 50, "K": 23})
    program = optimal_program(case)
    assert_passes(emit_and_check(program, build(case).workload, tmp_path))
    check = sanitized(tmp_path, monkeypatch)
    assert "-fsanitize=address" in check.log
    assert_passes(check)


def test_a_matrix_vector_products_matrix_is_not_packed() -> None:
    """mv's A[m, n] is indexed by every dimension of y[m]: each element is used once, and
    packing would only copy it."""
    case = Case.of("mv", "cpu", {"M": 63, "N": 100})
    assert not packs(case, optimal_program(case))


def test_a_packed_tile_is_packed_again_only_when_its_origin_moves(tmp_path: Path) -> None:
    """A's L2 tile does not move along n: over the L3 steps along n its pack is reused
    (each instance keeps the origin it holds), and the result still matches."""
    case = Case.of("matmul", "cpu", {"M": 96, "N": 64, "K": 40})
    built, program = fixed(case, "S.C#1_C#2.n=2")
    assert_passes(emit_and_check(program, built.workload, tmp_path))
    source = (tmp_path / "kernels.c").read_text()
    assert re.search(r"if \(A_l2_at\[[^\]]*\] != ", source), source
    assert re.search(r"int64_t A_l2_at\[\d+\];", source)


def test_a_panel_met_again_under_a_loop_that_does_not_walk_it_is_packed_once(
        tmp_path: Path) -> None:
    """Loops m > n around B's [K x 16] L2 tile: each step along m meets B's 4 panels
    again. Each panel gets its own slot (keyed by h_n), so it is packed on its first
    visit only, and the result still matches; A's tile (walked by h_m, outside every
    loop that does not walk it) keeps one slot."""
    case = gemm_case({"M": 64, "N": 64, "K": 32})
    built, program = fixed(case, "P=1", "fuse.C#1_C#2=1", "S.C#1_C#2.m=1",
                           "L.C#1_C#2.m=1", "V.C#1_C#2.m=4", "S.C#1_C#2.n=1",
                           "L.C#1_C#2.n=1", "V.C#1_C#2.n=16")
    found = {p.decl.tensor: p for p in packs(case, program).values()}
    assert found["B"].slots == (("h_n", 4),)
    assert found["A"].slots == ()
    assert_passes(emit_and_check(program, built.workload, tmp_path))
    source = (tmp_path / "kernels.c").read_text()
    assert re.search(r"pack_B_l2 = aligned_alloc\(64, 8192\)", source), source  # 4 x 2 KiB
    assert re.search(r"B_l2 = pack_B_l2 \+ \(h_n\) \* 512;", source), source


def test_only_walking_loops_inside_a_non_walking_one_are_slots() -> None:
    def loop(name: str, extent: int, kind: LoopKind = LoopKind.SEQUENTIAL) -> Loop:
        return Loop(LoopVar(name, name[-1], name, extent, 1, kind, "dram"), ())

    tile = BufferDecl("B_l2", "B", "l2", ("k", "n"), (8, 8),
                      (Affine((("s_k", 8),)), Affine((("h_n", 8), ("s_n", 8)))), DType.F32)
    walk_out = [loop("h_n", 4), loop("h_m", 3), loop("s_n", 2), loop("s_k", 5)]
    assert revisits(tile, walk_out) == (("s_n", 2), ("s_k", 5))
    assert revisits(tile, [loop("h_n", 4), loop("s_k", 5)]) == ()  # every loop walks it
    assert revisits(tile, [loop("h_m", 3), loop("s_n", 1)]) == ()  # one step: no revisit
    assert revisits(tile, [loop("p_m", 2, LoopKind.PARALLEL), loop("s_n", 2)]) == ()


def test_a_tile_that_is_one_run_of_its_tensor_is_not_packed(tmp_path: Path) -> None:
    """A's L2 tile [1 x K] is one run of A already, in the order its panels would hold it:
    packing would only copy it and check its origin at every step (fa6's QK^T with [1 x 1]
    tiles of Q and [1 x 16] of kt checked both at each of its 262,144 steps). B's [K x 16]
    (rows of B) is still packed."""
    case = gemm_case({"M": 16, "N": 32, "K": 32})
    built, program = fixed(case, "P=1", "fuse.C#1_C#2=1", "L.C#1_C#2.m=1",
                           "Q.C#1_C#2.m=1", "V.C#1_C#2.m=1", "V.C#1_C#2.n=16")
    assert {p.decl.tensor for p in packs(case, program).values()} == {"B"}
    assert_passes(emit_and_check(program, built.workload, tmp_path))
    source = (tmp_path / "kernels.c").read_text()
    assert "pack_A" not in source and "pack_B_l2" in source


def test_panels_follow_the_loops_that_walk_them() -> None:
    """B's [32 x 64] tile walked by a loop over k's steps of 8 (l_k), inside it one over
    n's blocks of 16 (q_n), inside that one over k's steps (q_k), around [2 x 16] register
    tiles: the panels take those loops' order, then the register tile. With the steps of
    k innermost, or loops that do not split the tile into register tiles exactly, the
    micro-kernel's [n / 16][k][n % 16]."""
    def loop(name: str, dim: str, extent: int, step: int) -> Loop:
        return Loop(LoopVar(name, dim, name, extent, step, LoopKind.SEQUENTIAL, "l1"), ())

    tile = BufferDecl("B_l2", "B", "l2", ("k", "n"), (32, 64), (Affine(), Affine()),
                      DType.F32)
    reg = {"k": 2, "n": 16}
    nest = [loop("l_k", "k", 4, 8), loop("q_n", "n", 4, 16), loop("q_k", "k", 4, 2)]
    assert panel_parts(tile, reg, ("n",), nest) == (
        Part("l_k", "k", 4, 8), Part("q_n", "n", 4, 16), Part("q_k", "k", 4, 2))
    assert panel_parts(tile, reg, ("n",), [nest[1], nest[0], nest[2]]) == ()
    assert panel_parts(tile, reg, ("n",), nest[:2]) == ()  # k's steps of 2 not walked
    pack = Pack(tile, ("n",), ("k",), {"n": 16}, (), (), panel_parts(tile, reg, ("n",), nest),
                reg)
    start = {"k": Affine((("l_k", 8), ("q_k", 2)), 0), "n": Affine((("q_n", 16),), 0)}
    at = pack.index(start, {"k": "t", "n": "j"}, lambda a: " + ".join(v for v, _ in a.terms))
    # l_k, q_n, q_k, the register tile's row, its lane: strides 512, 128, 32, 16, 1
    values = {"l_k": 3, "q_n": 2, "q_k": 1, "t": 1, "j": 5}
    assert int(eval(at, {}, values)) == 3 * 512 + 2 * 128 + 1 * 32 + 16 + 5  # noqa: S307


def test_a_tile_walked_along_n_inside_k_is_packed_in_that_order(tmp_path: Path) -> None:
    """The f32 matmul 1024x512x2048's sample 11 shape: B's L2 tile [K x N] walked by 4
    register tiles along n inside each step of k. Packed [n / 16][k][n % 16], those tiles
    were K x 16 floats apart (16 KiB there: one set of the L1) and the kernel ran 2x
    slower than packed in the loops' order. Also with the steps of k split around the
    loop along n (sample 16's shape)."""
    case = gemm_case({"M": 8, "N": 64, "K": 32})
    tile = ("P=1", "fuse.C#2=1", "V.C#2.m=1", "V.C#2.n=16", "Q.C#2.n=4")
    for name, fixes, axes in (("k_n", ("V.C#2.k=1", "L.C#2.k=32"), ["k", "n"]),
                              ("k_n_k", ("V.C#2.k=2", "L.C#2.k=4", "Q.C#2.k=4"),
                               ["k", "n", "k"])):
        built, program = fixed(case, *tile, *fixes)
        found = {p.decl.tensor: p for p in packs(case, program).values()}
        assert [p.dim for p in found["B"].parts] == axes, found["B"]
        out = tmp_path / name
        assert_passes(emit_and_check(program, built.workload, out))
        assert "pack l2 tile of B [32x64]: [k / " in (out / "kernels.c").read_text()


def test_panels_in_the_loops_order_with_ragged_tiles_under_the_sanitizers(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """M, N and K not multiples of the tiles (zeros packed past the edges), panels in the
    loops' order: the result matches, and AddressSanitizer and UBSan find nothing."""
    case = gemm_case({"M": 7, "N": 60, "K": 30})
    built, program = fixed(case, "P=1", "fuse.C#2=1", "V.C#2.m=1", "V.C#2.n=16",
                           "Q.C#2.n=4", "V.C#2.k=2", "L.C#2.k=4", "Q.C#2.k=4")
    found = {p.decl.tensor: p for p in packs(case, program).values()}
    assert [p.dim for p in found["B"].parts] == ["k", "n", "k"], found["B"]
    assert_passes(emit_and_check(program, built.workload, tmp_path))
    check = sanitized(tmp_path, monkeypatch)
    assert "-fsanitize=address" in check.log
    assert_passes(check)
