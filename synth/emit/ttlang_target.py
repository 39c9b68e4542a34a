"""`--emit ttlang` in the emitter table (see `synth.emit.targets`): `synth.emit.ttlang`
writes the tt-lang program, `synth.emit.ttlang_check` runs it under tt-lang's simulator."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np

from synth.constraints.dst import MAX_BUFFERS
from synth.emit.ttlang import block_tile_count, layouts, op_name, program_source
from synth.emit.ttlang_check import MODEL, TtlangCheck, check_ttlang, require_simulator
from synth.errors import InputError
from synth.hardware import Hardware
from synth.ir.dataflow import kernel_usage
from synth.ir.nodes import Alloc, Load, Loop, Node, Program, Store, walk
from synth.workload import Workload

CHECK_KEYS = ("passed", "pcc", "max_abs_err", "dram_tiles_read", "dram_tiles_written",
              "model_tiles_read", "model_tiles_written")


def schedule_tiles(program: Program, workload: Workload) -> tuple[int, int]:
    """DRAM tiles the schedule reads and writes: every block copy times the iterations
    of the loops around it (parallel loops: once per node), in 32x32 tiles of each
    tensor's layout (`block_tile_count`)."""
    read = written = 0
    lay = layouts(program, workload)
    for kernel in program.kernels:
        decls = {n.buffer.name: n.buffer for n in walk(kernel.body) if isinstance(n, Alloc)}
        for node, times in _executions(kernel.body, 1):
            if isinstance(node, Load):
                decl = decls[node.dst]
                read += times * block_tile_count(decl, lay[decl.tensor])
            elif isinstance(node, Store):
                decl = decls[node.src]
                written += times * block_tile_count(decl, lay[decl.tensor])
    return read, written


def _executions(body: tuple[Node, ...], times: int) -> Iterator[tuple[Node, int]]:
    for node in body:
        if isinstance(node, Loop):
            yield from _executions(node.body, times * node.var.extent)
        else:
            yield node, times


class TtlangTarget:
    name = "ttlang"

    def require(self, hw: Hardware, validate: bool) -> None:
        if not hw.compute.tiling.edge:
            raise InputError(f"--emit ttlang: hardware {hw.name!r} has no tiles; tt-lang "
                             "runs on Tenstorrent models (--hw wormhole)")
        if validate:
            require_simulator()

    def emit(self, program: Program, workload: Workload, hw: Hardware, out_dir: Path,
             inputs: Mapping[str, np.ndarray], expected: Mapping[str, np.ndarray],
             bounds: Mapping[str, np.ndarray]) -> tuple[Path, ...]:
        source = program_source(program, workload)
        data = out_dir / "data"
        data.mkdir(parents=True, exist_ok=True)
        files = [out_dir / "program.py", out_dir / MODEL]
        files[0].write_text(source, encoding="utf-8")
        read, written = schedule_tiles(program, workload)
        edge = hw.compute.tiling.edge
        files[1].write_text(json.dumps({
            "tiles_read": read, "tiles_written": written,
            "outputs": {t.name: t.dtype.value for t in workload.outputs},
            # the dataflow buffers the schedule holds per core (`synth.ir.dataflow`, the
            # cost model's count.buffers and capacity terms) and the hardware's limits
            "buffers": {op_name(k.name): kernel_usage(k, workload, edge)
                        for k in program.kernels},
            "tile_bytes": {t.name: edge * edge * t.dtype.itemsize
                           for t in workload.tensors.values()},
            "max_buffers": MAX_BUFFERS, "l1_bytes": hw.memories[-1].usable}, indent=1)
            + "\n", encoding="utf-8")
        for prefix, arrays in (("input", inputs), ("expected", expected), ("bound", bounds)):
            for name, array in arrays.items():
                path = data / f"{prefix}_{name}.npy"
                np.save(path, array)
                files.append(path)
        return tuple(files)

    def check(self, out_dir: Path) -> TtlangCheck:
        return check_ttlang(out_dir)

    def json(self, check: object) -> dict[str, object]:
        found = check if isinstance(check, TtlangCheck) else None
        data: dict[str, object] = {key: getattr(found, key) if found else None
                                   for key in CHECK_KEYS}
        data["dataflow_buffers"] = ({op: {"buffers": mine[0], "bytes": mine[1],
                                          "model_buffers": theirs[0], "model_bytes": theirs[1]}
                                     for op, (mine, theirs) in found.buffers.items()}
                                    if found else None)
        data["seconds"] = found.seconds if found else None
        data["log"] = found.log[-4000:] if found else None
        return data

    def lines(self, path: str, files: Sequence[str], check: object) -> str:
        head = f"emitted tt-lang to {path}: program.py ({len(files)} files)"
        if not isinstance(check, TtlangCheck):
            return head + " (not checked: --no-validate)"
        verdict = "passed" if check.passed else "FAILED"
        detail = (f"PCC {check.pcc:.6f}, max abs err {check.max_abs_err:.3g}, "
                  if check.pcc is not None and check.max_abs_err is not None else "")
        lines = [head, f"tt-lang check (tt-lang-sim, reference data): {verdict}: {detail}"
                       f"DRAM tiles read/written {check.dram_tiles_read}/"
                       f"{check.dram_tiles_written}, schedule {check.model_tiles_read}/"
                       f"{check.model_tiles_written} ({check.seconds:.2f} s)"]
        if not check.passed:
            lines += check.log.strip().splitlines()[-25:]
        return "\n".join(lines)


TARGET = TtlangTarget()
