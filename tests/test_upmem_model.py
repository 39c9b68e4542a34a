"""The UPMEM model against the measurements of issue 13: host transfers as one parallel push
per tensor per rank, per direction; launch and barrier costs growing with DPUs and
tasklets; blocking WRAM transfers (no double buffering; hidden only by other tasklets).

No exact cost-model floats: orderings, ratios and identities between schedules."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import Case, build

from synth import pipeline
from synth.constraints import cpsat, decompose
from synth.constraints import expr as ex
from synth.constraints.cost import _memory_slots, evaluate_cost, transfer_cost
from synth.constraints.transfers import engine_cost
from synth.hwfile import load_hardware

TIME_LIMIT = 60.0


def solve(workload: str, *fixes: str, sizes: dict[str, int] | None = None,
          hw: tuple[str, ...] = ()) -> pipeline.Outcome:
    outcome = pipeline.run(pipeline.Request(workload, "upmem", sizes=sizes or {},
                                            fixes=fixes, hw_overrides=hw, validate=False,
                                            time_limit_s=TIME_LIMIT))
    assert outcome.cost is not None, outcome.result.status
    return outcome


def parts(outcome: pipeline.Outcome) -> dict[str, int]:
    assert outcome.cost is not None
    return dict(outcome.cost)


VA = {"N": 2**20}


def va(dpus: int, ranks: int = 1, tasklets: int = 16, *extra: str,
       hw: tuple[str, ...] = ()) -> dict[str, int]:
    return parts(solve("va", f"R.c.i={ranks}", f"D.c.i={dpus}", f"T.c.i={tasklets}", *extra,
                       sizes=VA, hw=hw))


def test_host_transfers_are_two_parts_per_direction() -> None:
    cost = va(1)
    assert cost["transfer:host->mram"] > 0 and cost["transfer:mram->host"] > 0
    # va moves a and b in, c out: per byte DPU->CPU is the slower direction (0.14 vs 0.33 GB/s)
    assert cost["transfer:mram->host"] > cost["transfer:host->mram"] / 2


def test_a_rank_of_dpus_pushes_far_faster_than_one_dpu() -> None:
    one, rank = va(1), va(64)
    ratio = one["transfer:host->mram"] / rank["transfer:host->mram"]
    # measured: 0.33 GB/s into one DPU, 2.3-4.1 GB/s into a rank
    assert 5 < ratio < 15
    assert 5 < one["transfer:mram->host"] / rank["transfer:mram->host"] < 30


def test_the_host_caps_ranks_together() -> None:
    one_rank, eight = va(64), va(64, ranks=8)
    ratio = one_rank["transfer:host->mram"] / eight["transfer:host->mram"]
    assert 1 < ratio < 2  # eight independent ranks would be 8x; the host caps them (3.9 GB/s)


def test_one_push_per_tensor_per_rank_not_per_row() -> None:
    """mv's matrix tile has many rows per DPU; the old model charged a latency per row
    and DPU, serially (11.7x too slow at 60 DPUs). A push moves the tile at once: the
    part stays within the bytes at the rank's rate, plus a few fixed costs."""
    outcome = solve("mv", "R.y.i=1", "D.y.i=64", "D.y.j=1", "T.y.i=16")
    cost = parts(outcome)
    push = outcome.model.hw.memory("mram").push
    assert push is not None
    matrix_bytes = 2048 * 4096 * 4
    at_full_rate = matrix_bytes * push.into.full_ps_per_byte
    assert cost["transfer:host->mram"] < 2 * at_full_rate


def test_launch_grows_with_the_dpus_launched() -> None:
    few, many = va(1), va(64, ranks=8)
    assert many["launch"] > few["launch"]
    assert many["launch"] < 4 * few["launch"]  # measured 47-50 us to 64 DPUs, 90 at 512


def test_barrier_grows_with_the_tasklets() -> None:
    def barrier_share(tasklets: int) -> int:
        fixes = ("R.s.i=1", "D.s.i=1", f"T.s.i={tasklets}", "combine.s.tasklet=1")
        base = parts(solve("red", *fixes, sizes={"N": 2**16}))
        free = parts(solve("red", *fixes, sizes={"N": 2**16},
                           hw=("tasklet.barrier_per_unit=0",)))
        return base["device_combine"] - free["device_combine"]

    four, sixteen = barrier_share(4), barrier_share(16)
    assert four > 0
    assert 3 < sixteen / four < 5  # about linear in the tasklets meeting


def test_wram_is_not_double_buffered() -> None:
    outcome = solve("va", sizes=VA)
    assert not any(name.startswith("buffers.") for name in outcome.model.constraints.decisions)
    free = pipeline.run(pipeline.Request("va", "upmem", sizes=VA, validate=False,
                                         hw_overrides=("wram.blocking=false",)))
    assert any(name.startswith("buffers.") for name in free.model.constraints.decisions)


def test_one_tasklet_pays_compute_plus_its_transfers() -> None:
    """Blocking: a lone tasklet cannot hide its DMAs. With no issue cost the exposed
    part equals the plain (single-buffered) transfer time."""
    hw = ("wram.issue=0",)
    blocking = va(1, 1, 1, hw=hw)
    plain = va(1, 1, 1, "buffers.c.wram=1", hw=(*hw, "wram.blocking=false"))
    assert blocking["transfer:mram->wram"] == plain["transfer:mram->wram"]
    assert blocking["compute"] == plain["compute"]


def test_other_tasklets_hide_transfers() -> None:
    hw = ("wram.issue=0",)
    blocking = va(1, hw=hw)
    plain = va(1, 1, 16, "buffers.c.wram=1", hw=(*hw, "wram.blocking=false"))
    assert blocking["transfer:mram->wram"] < plain["transfer:mram->wram"]
    # ... but not below what the DMA engine needs for every tasklet's transfers
    assert blocking["compute"] + blocking["transfer:mram->wram"] >= plain[
        "transfer:mram->wram"]


def test_write_alpha_is_cheaper_than_read() -> None:
    base = va(1, hw=("wram.issue=0",))
    slow = va(1, hw=("wram.issue=0", "wram.write_latency=77cycles", "compute.cycles.i32.add=200"))
    fast = va(1, hw=("wram.issue=0", "compute.cycles.i32.add=200"))
    assert base["transfer:mram->wram"] >= 0
    # compute-bound, one tasklet's own DMAs exposed: a cheaper write shows
    assert slow["transfer:mram->wram"] > fast["transfer:mram->wram"]


def test_engine_cost_equals_transfer_cost() -> None:
    """`engine_cost` is `transfer_cost` written per dimension over the units: the same
    value for every schedule."""
    for workload, fixes in (("va", ("T.c.i=16",)), ("mv", ("T.y.i=8", "T.y.j=2")),
                            ("softmax", ())):
        outcome = solve(workload, *fixes)
        model, env = outcome.model, dict(outcome.result.env or {})
        from synth.constraints.cost import KernelTerms  # noqa: PLC0415
        for kernel in model.selected(env):
            kt = KernelTerms(kernel, model.factors, model.hw,
                             model.combines.get(kernel.name, {}),
                             model.buffers.get(kernel.name, {}))
            slot, mem = _memory_slots(kt)[-1]
            assert ex.evaluate(engine_cost(kt, model.workload, mem, slot), env) == \
                ex.evaluate(transfer_cost(kt, model.workload, mem, slot), env)
        assert evaluate_cost(model, env) == dict(outcome.cost or {})


@pytest.mark.parametrize("workload", ["va", "red", "mv", "softmax"])
def test_free_solves_choose_dmas_of_256_bytes_or_more(workload: str) -> None:
    """The tensors a kernel streams in or out move in DMAs of 256 bytes or more. (mv's
    accumulator y is not streamed: it stays in WRAM across the whole row, and WRAM is
    better spent on long rows of A than on more rows at once.)"""
    outcome = solve(workload)
    env = dict(outcome.result.env or {})
    for kernel in outcome.model.selected(env):
        for use in kernel.uses:
            accumulated = any(s.target == use.tensor and s.reduced for s in kernel.statements)
            if use.local or not use.indices or accumulated:
                continue
            last = use.indices[-1]
            elements = env[f"Q.{kernel.name}.{last}"]
            itemsize = outcome.workload.tensors[use.tensor].dtype.itemsize
            assert elements * itemsize >= 256, (kernel.name, use.tensor, elements)


def test_upmem_model_loads_with_measured_keys() -> None:
    hw = load_hardware("upmem")
    assert hw.memory("wram").blocking and hw.memory("mram").push is not None


@pytest.mark.parametrize(("workload", "sizes"), [("va", {"N": 65536}),
                                                 ("mv", {"M": 256, "N": 512})])
def test_emitted_host_code_pushes_what_the_model_prices(workload: str, sizes: dict[str, int],
                                                        tmp_path: Path) -> None:
    """The emitted host code moves each tensor's tiles with one parallel transfer for all
    DPUs per move (dpu_push_xfer, or dpu_broadcast_to for a tile every DPU shares), as the
    model's push prices; rows are packed on the host, never transferred one by one."""
    from synth.emit.upmem import emit_upmem  # noqa: PLC0415
    from synth.reference import evaluate, make_inputs  # noqa: PLC0415

    outcome = solve(workload, sizes=sizes)
    assert outcome.program is not None
    inputs = make_inputs(outcome.workload, 0)
    emit_upmem(outcome.program, outcome.workload, outcome.hardware, tmp_path, inputs,
               evaluate(outcome.workload, inputs))
    host = (tmp_path / "host.c").read_text()
    pushes = host.count("dpu_push_xfer(set, DPU_XFER_TO_DPU") - host.count('"args"')
    pulls = host.count("dpu_push_xfer(set, DPU_XFER_FROM_DPU")
    broadcasts = host.count("dpu_broadcast_to(")
    kernels = outcome.model.selected(dict(outcome.result.env or {}))
    moved = [u for k in kernels for u in k.uses if not u.local]
    # one transfer call per tensor and direction the model prices (an accumulator both
    # ways); each sits in the launch's host loops, if any
    assert pushes + broadcasts == sum(u.read for u in moved)
    assert pulls == sum(u.written for u in moved)
    assert "dpu_copy_to(" not in host and "dpu_copy_from(" not in host


def test_a_gemm_part_floor_pairs_the_units_with_their_stretch() -> None:
    """`ConstraintSet.floor` of matmul's GEMM kernel is near its optimum (mostly compute):
    the issue-share stretch is written as max(work x 11, work x tasklets), so the bound
    pairs the points per tasklet with the tasklets that divide them. As work x max(11,
    tasklets) the bound took the most tasklets and the least stretch at once, 11/16 of the
    compute (floor / optimum 0.60), and every refutation searched from there."""
    cset = build(Case.of("matmul", "upmem", {})).model.constraints
    optima = [(cpsat._solve_part(part, TIME_LIMIT, cpsat.Effort()).objective or 0, part)
              for part in decompose.components(decompose.fusion_covers(cset)[0])]
    best, gemm = max(optima, key=lambda item: item[0])
    assert 0.8 * best <= gemm.floor() <= best
