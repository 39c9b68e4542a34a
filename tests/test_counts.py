"""Any unit count (issue 12, item 4): a count the request names is a candidate of the
spatial factors, the extent padded to a multiple of it and the padding paid.

Limits: every solve here takes at most a few seconds, far from its 60 s limit."""

from __future__ import annotations

import pytest
from conftest import solve

from synth import pipeline
from synth.constraints import user
from synth.constraints.result import Status
from synth.constraints.space import padded_extents
from synth.ir.materialize import materialize
from synth.ir.verify import verify

LIMIT_S = 60.0


def solved(workload: str, sizes: dict[str, int], fixes: tuple[str, ...] = (),
           constraints: tuple[str, ...] = ()) -> tuple[pipeline.Model, pipeline.SolveResult]:
    request = pipeline.Request(workload, "upmem", sizes, fixes=fixes,
                               constraints=constraints, validate=False)
    workload_ = pipeline.parse(request)
    model = pipeline.encode(workload_, pipeline.hardware(request), constraints, fixes)
    return model, solve(model.constraints)


def test_padded_extents_are_multiples_of_products_of_candidates() -> None:
    # 10 over {1, 3} x {1, 4}: products 1, 3, 4 fit (12 does not): 10, 12, 12
    assert padded_extents(10, [(1, 3), (1, 4)]) == (10, 12)
    assert padded_extents(1024, [(1, 2, 4), (1, 8)]) == (1024,)
    assert padded_extents(7, [(1, 2, 4)]) == (7, 8)


def test_fix_d_60_on_va_pads_and_solves() -> None:
    """PrIM's case: a rank with 60 working DPUs, 2,621,440 elements."""
    model, result = solved("va", {"N": 2621440}, fixes=("D=60",))
    assert result.status is Status.OPTIMAL and result.env is not None
    assert result.env["D"] == 60
    verify(materialize(model, result.env), model.workload, model.hw)


def test_fix_t_11_on_softmax_solves_with_11_tasklets() -> None:
    model, result = solved("softmax", {"N": 65536}, fixes=("T=11",))
    assert result.status is Status.OPTIMAL and result.env is not None
    assert result.env["T"] == 11
    verify(materialize(model, result.env), model.workload, model.hw)
    padded = [k for k, v in result.env.items() if k.startswith("ext.") and v > 65536]
    assert padded, "11 tasklets do not divide 65536: some dimension is padded"
    _, free = solved("softmax", {"N": 65536})
    assert free.objective is not None and result.objective is not None
    assert result.objective >= free.objective  # a fix never improves the optimum


def test_a_named_count_splits_over_dimensions() -> None:
    """60 = 4 x 15: its divisors are candidates too, so a 2-D kernel can use 60 DPUs
    as 4 x 15 or 15 x 4, not only 60 along one dimension."""
    model, _ = solved("mv", {"M": 64, "N": 64}, fixes=("D=60",))
    domains = model.constraints.decisions
    assert {4, 15, 60} <= set(domains["D.y.i"]) and 15 in domains["D.y.j"]


@pytest.mark.parametrize(("text", "level", "values"), [
    ("T >= 11", "tasklet", {11}),
    ("R*D <= 120", "dpu", set()),  # 120 is past the DPUs of a rank (64)
    ("D*2 >= 60", "dpu", {2, 60}),
])
def test_named_counts_come_from_constraints(text: str, level: str, values: set[int]) -> None:
    model, _ = solved("softmax", {"N": 4096})
    parsed = user.user_constraints(model, (text,), ())
    assert user.named_counts(model, parsed).get(level, set()) == values


def test_a_count_that_is_not_named_is_not_a_candidate() -> None:
    model, _ = solved("softmax", {"N": 4096})
    assert 11 not in model.constraints.decisions["T.y.i"]
