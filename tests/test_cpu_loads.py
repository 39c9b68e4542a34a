"""Broadcasting loads and gathers into the registers, priced by their instructions'
cycles where the model says them (`compute.broadcast_cycles`, `compute.gather_cycles`,
which `synth calibrate` measures; `cost.loaded_bytes`). On AMD Zen 5 a broadcast takes
half a cycle (two load ports) and a gather of 16 lanes 20-24 cycles, where a register's
bytes at the registers' rate priced one cycle and 16 (RESULTS.md, "Max as one
instruction"). Relations only, deterministic solver limits."""

from __future__ import annotations

from conftest import solved_on_cpu
from test_cpu_model import MATMUL

from synth.constraints.cost import evaluate_cost
from synth.hwfile import load_hardware
from synth.pipeline import encode

ROW_SUM = """
size S = 64
size D = 256
in  x : f32[S, D]
out sm : f32[S]
sm[s] += x[s, d]
"""


def register_moves(text: str, hw_set: tuple[str, ...], fixes: tuple[str, ...]) -> int:
    """The moves into the registers of the schedule `fixes`, under the model `hw_set`."""
    solved, env = solved_on_cpu(text, (), fixes)
    model = encode(solved.workload, load_hardware("cpu", hw_set))
    return sum(v for k, v in evaluate_cost(model, env).items() if k.endswith("->reg"))


def test_a_broadcast_costs_its_cycles_not_a_registers_bytes() -> None:
    """A [4 x 16] register tile of C loads 4 elements of A per step, each broadcast: at
    half a cycle each they cost less than a 64-byte register each at the registers' rate
    (88 B/cycle in `cpu`), at 2 cycles more; B's vector loads are unchanged."""
    tile = ("V.C.m=4", "V.C.n=16", "V.C.k=1", "P=1")
    plain = register_moves(MATMUL, (), tile)
    cheap = register_moves(MATMUL, ("compute.broadcast_cycles.f32=0.5",), tile)
    dear = register_moves(MATMUL, ("compute.broadcast_cycles.f32=2",), tile)
    assert cheap < plain < dear


def test_a_gather_costs_its_cycles_over_its_lanes() -> None:
    """Row sums vectorised along the rows gather x: at 24 cycles per 16-lane gather an
    element costs more than a register's bytes at 88 B/cycle (0.73 cycles), at 4 less."""
    tile = ("V.sm.s=16", "V.sm.d=4", "P=1")
    plain = register_moves(ROW_SUM, ("l1.ways=0",), tile)
    dear = register_moves(ROW_SUM, ("l1.ways=0", "compute.gather_cycles.f32=24"), tile)
    cheap = register_moves(ROW_SUM, ("l1.ways=0", "compute.gather_cycles.f32=4"), tile)
    assert cheap < plain < dear
