"""The cpu model where a tensor stays in a core's L2 and where an online step waits for
its accumulators (issue 11, RESULTS.md "Tensors that stay in a cache" and "Chains in the
online step"):

- a packed operand whose whole tensor takes at most half the L2 moves in once per
  distinct tile (`transfers.resident_moves`), not again at every step of a loop that
  meets its panels again (attention S=1024's QK^T: 75 ms modelled, 2.7 ms measured);
- an online step's streamed operand (attention's V) that stays in the L2 is not
  refetched for every block of rows (`online_terms.stream_cost`);
- an online step whose outer products keep few accumulators pays their chains
  (`online_terms.step_chains`: a step of 1 x 16 scores ran 2.2x its price without).

Relations only, deterministic solver limits."""

from __future__ import annotations

import pytest
from conftest import qk, solve, solved_on_cpu

from synth.constraints import cost, online_terms
from synth.constraints import expr as ex
from synth.constraints.cpu_compute import vector_compute_cost
from synth.constraints.result import Status
from synth.constraints.transfers import resident_moves
from synth.hwfile import load_hardware
from synth.lang import load_workload
from synth.pipeline import encode

QK = qk(1024, 64)

# K's L2 tile [1024 x 2] under the loop over the queries (the measured schedule)
QK_FIXES = ("S.s.i=1", "L.s.i=1", "Q.s.i=1", "V.s.i=1",
            "S.s.d=32", "V.s.d=2", "L.s.j=8", "V.s.j=128")



def slot_of(kt: cost.KernelTerms, name: str) -> int:
    return max(i for i, s in enumerate(kt.slots) if s.name == name)


def test_a_packed_operand_that_stays_in_the_l2_moves_in_once() -> None:
    """K (256 KiB) in a 2 MiB L2: its panels move in once, at most its bytes again
    (not 1024 x 32 tiles of 1024 lines); in a 256 KiB L2 it does not stay and is
    priced as any tile."""
    hw_set = ("core.count=1", "l2.capacity=2MiB")
    model, env = solved_on_cpu(QK, hw_set, QK_FIXES)
    [kernel] = model.kernels
    kt = cost.KernelTerms(kernel, model.factors, model.hw)
    use = next(u for u in kt.moving() if u.tensor == "K")
    l2 = model.hw.memory("l2")
    once = resident_moves(kt, model.workload, use, l2, slot_of(kt, "l2"), 4)
    assert once is not None
    rows = cost.tensor_transfer_cost(kt, use, l2, slot_of(kt, "l2"), 4)
    assert ex.evaluate(once, env) <= 1024 * 64 * 4 * l2.ps_per_byte
    assert ex.evaluate(once, env) * 100 < ex.evaluate(rows, env)
    small = encode(model.workload, load_hardware("cpu", ("core.count=1",
                                                         "l2.capacity=256KiB")))
    kt = cost.KernelTerms(small.kernels[0], small.factors, small.hw)
    use = next(u for u in kt.moving() if u.tensor == "K")
    l2 = small.hw.memory("l2")
    assert resident_moves(kt, small.workload, use, l2, slot_of(kt, "l2"), 4) is None
    assert resident_moves(kt, small.workload, next(
        u for u in kt.moving() if u.tensor == "s"), l2, slot_of(kt, "l2"), 4) is None


def online_model(hw_set: tuple[str, ...], fixes: tuple[str, ...], size: int
                 ) -> tuple[cost.Model, dict[str, int], cost.KernelTerms]:
    workload = load_workload("attention", {"S": size, "D": 64})
    model = encode(workload, load_hardware("cpu", hw_set), fixes=fixes)
    result = solve(model.constraints)
    assert result.status is Status.OPTIMAL and result.env is not None, result.status
    env = dict(result.env)
    [kernel] = [k for k in model.selected(env) if k.online is not None]
    return model, env, cost.KernelTerms(kernel, model.factors, model.hw)


def test_a_streamed_operand_that_stays_is_not_refetched_per_row_block() -> None:
    """attention S=1024, an online step of 1 row and 64 keys (QK^T its own kernel): V
    (256 KiB) streams through a 2 MiB L2 once; through a 256 KiB L2 (where it does not
    stay), the same schedule moves it again for each block of rows."""
    fixes = ("online.m_p_l_o=1", "S.m_p_l_o.i=16", "L.m_p_l_o.i=16", "Q.m_p_l_o.i=4",
             "Q.m_p_l_o.j=16", "V.m_p_l_o.j=64")
    model, env, kt = online_model(("core.count=1", "l2.capacity=2MiB"), fixes, 1024)
    small = encode(model.workload, load_hardware("cpu", ("core.count=1",
                                                         "l2.capacity=256KiB")))
    prices = []
    for m in (model, small):
        terms = cost.KernelTerms(next(k for k in m.kernels if k.name == kt.kernel.name),
                                 m.factors, m.hw)
        use = next(u for u in terms.moving() if u.tensor == "V")
        prices.append(ex.evaluate(online_terms.stream_cost(
            terms, m.workload, use, m.hw.memory("l2"), 4), env))
    assert prices[0] * 100 < prices[1]


def test_few_accumulators_in_a_step_add_their_chain(monkeypatch: pytest.MonkeyPatch) -> None:
    """attention S=256 fused online with a step of 1 x 16 scores: one accumulator takes
    64 dependent FMAs per row, so the step costs more than its issue alone; with a step
    of 8 x 64 (16 accumulators) the chains add nothing."""
    compute = {}
    for name, step in (("few", ("V.s_m_p_l_o.i=1", "V.s_m_p_l_o.j=16")),
                       ("many", ("V.s_m_p_l_o.i=8", "V.s_m_p_l_o.j=64"))):
        model, env, kt = online_model(("core.count=1",), ("online.s_m_p_l_o=1", *step), 256)
        with_chains = ex.evaluate(vector_compute_cost(kt, model.workload), env)
        with monkeypatch.context() as patch:
            patch.setattr(online_terms, "FEW_ACCUMULATORS", 0)
            without = ex.evaluate(vector_compute_cost(kt, model.workload), env)
        compute[name] = (with_chains, without)
    few, many = compute["few"], compute["many"]
    assert few[0] > 1.5 * few[1]
    assert many[0] == many[1]
