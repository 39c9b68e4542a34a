"""The cpu model's view of packed operands (issue 11): the C emitter packs each core's
L2 tile of a contraction operand into contiguous panels (`synth.emit.c_pack`), so the
tiles inside that cache (the L1's, the registers') are runs of the panel, not rows of
the tensor. Measured (RESULTS.md, "Packed operands"): attention S=256's QK^T with K's
L1 tile a column [256 x 1] ran 0.19 ms against 1.35 modelled in the tensor's rows.
Also here: the L2 keeps a workload that fits in it between runs (`l2.warm`). Relations
only, deterministic limits."""

from __future__ import annotations

from conftest import ROW_SUM, qk, solved_on_cpu

from synth.constraints import cost
from synth.constraints import expr as ex
from synth.constraints.transfers import packed_moves
from synth.hwfile import load_hardware
from synth.pipeline import encode

QK = qk(256, 64)




def terms(model: cost.Model) -> cost.KernelTerms:
    """The terms of the model's one kernel vectorised along its target's last index."""
    [kernel] = [k for k in model.kernels if "__" not in k.name]
    return cost.KernelTerms(kernel, model.factors, model.hw)


def slot_of(kt: cost.KernelTerms, name: str) -> int:
    return max(i for i, s in enumerate(kt.slots) if s.name == name)


def test_a_packed_column_moves_its_bytes_not_a_line_per_row() -> None:
    """K's L1 tile a column [256 x 1] of its packed panel: priced as 1 KiB a step, where
    the tensor's rows (256 B apart) would take a 64-byte line each, 16 KiB."""
    model, env = solved_on_cpu(QK, ("core.count=1",), ("V.s.i=1", "V.s.j=16", "V.s.d=1",
                                                "Q.s.d=1", "Q.s.j=16"))
    kt = terms(model)
    use = next(u for u in kt.moving() if u.tensor == "K")
    l1 = model.hw.memory("l1")
    packed = packed_moves(kt, use, l1, slot_of(kt, "l1"), 4)
    assert packed is not None
    rows = cost.tensor_transfer_cost(kt, use, l1, slot_of(kt, "l1"), 4)
    assert ex.evaluate(packed, env) * 8 < ex.evaluate(rows, env)


def test_packed_moves_apply_only_inside_the_packing_cache() -> None:
    """Not to the written target, not to the L2 (where the panel is packed from the
    tensor's rows) nor to the registers (their loads are priced per register)."""
    model, _ = solved_on_cpu(QK, ("core.count=1",))
    kt = terms(model)
    by = {u.tensor: u for u in kt.moving()}
    hw = model.hw
    assert packed_moves(kt, by["K"], hw.memory("l1"), slot_of(kt, "l1"), 4) is not None
    assert packed_moves(kt, by["s"], hw.memory("l1"), slot_of(kt, "l1"), 4) is None
    assert packed_moves(kt, by["K"], hw.memory("l2"), slot_of(kt, "l2"), 4) is None
    assert packed_moves(kt, by["K"], hw.memory("reg"), slot_of(kt, "reg"), 4) is None


def test_a_packed_operand_loads_whole_vectors_a_gathered_one_by_element() -> None:
    """K[j, d] vectorised along j is contiguous along j in its panel: a register of it
    is one vector load (its bytes). x[s, d] of a row sum vectorised along s is not
    packed: each element is gathered on its own (a register's bytes each)."""
    model, _ = solved_on_cpu(QK, ("core.count=1",))
    kt = terms(model)
    reg = model.hw.memory("reg")
    [k_use] = [u for u in kt.moving() if u.tensor == "K"]
    assert cost.element_bytes(kt, model.workload, k_use, reg, moving=True) == 4
    model, _ = solved_on_cpu(ROW_SUM, ("core.count=1",), ("fuse.sm=1", "V.sm.s=16", "V.sm.d=1"))
    kt = terms(model)
    [x_use] = [u for u in kt.moving() if u.tensor == "x"]
    assert cost.element_bytes(kt, model.workload, x_use, reg, moving=True) > 4


def test_a_workload_that_fits_stays_in_the_l2() -> None:
    """QK^T at S=256 (448 KiB of tensors) fits a core's L2: nothing moves in from the L3
    in the steady state; with `l2.warm=false` its tiles do."""
    hw_set = ("core.count=1", "l2.capacity=2MiB")
    model, env = solved_on_cpu(QK, hw_set)
    cold = encode(model.workload, load_hardware("cpu", (*hw_set, "l2.warm=false")))

    def into_l2(m: cost.Model) -> int:
        kt = terms(m)
        return ex.evaluate(cost.transfer_cost(kt, m.workload, m.hw.memory("l2"),
                                              slot_of(kt, "l2")), env)

    assert into_l2(model) == 0
    assert into_l2(cold) > 0
