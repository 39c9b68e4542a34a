"""Symbolic verification (`synth.ir.prove`): every built-in schedule is proved, ragged
tiles included; broken loop nests are refuted with loop values that, evaluated here
independently of z3, really index outside a buffer (and make the interpreter fail); and
capacities too small for a program are reported."""

from __future__ import annotations

import dataclasses
import functools
import json
import re
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import pytest
from conftest import UPMEM_PRIOR, Rewrite, rewrite

from synth import pipeline
from synth.constraints.result import Status
from synth.errors import InputError, IRError
from synth.hwfile import load_hardware
from synth.ir.interpret import interpret
from synth.ir.nodes import (
    Affine,
    Alloc,
    BufferDecl,
    Compute,
    Load,
    Loop,
    LoopVar,
    Node,
    Program,
    Store,
    walk,
)
from synth.ir.prove import (
    Failure,
    Proof,
    instantiate,
    is_root_loop,
    prove,
    size_dependence,
)
from synth.ir.verify import verify
from synth.lang import SizeRange, list_builtin_workloads, load_workload
from synth.reference import make_inputs
from synth.workload import Workload, accesses

SIZES = {
    "attention": {"S": 64, "D": 16},
    "fa6": {"S": 64, "D": 32},
    "gemm2k": {"M": 64, "N": 64, "K": 64},
    "matmul": {"M": 64, "N": 32, "K": 128},
    "mv": {"M": 128, "N": 256},
    "red": {"N": 65536},
    "softmax": {"N": 65536},
    "va": {"N": 65536},
    "rmsnorm": {"S": 24, "D": 40},
    "layernorm": {"S": 24, "D": 40},
    "swiglu": {"S": 16, "D": 24, "F": 40},
    "mha": {"B": 2, "H": 3, "S": 16, "E": 8},
    "transformer": {"S": 8, "D": 16, "H": 2, "E": 8, "F": 24},
}

RAGGED = 1000003  # prime: the last tiles run past the tensor and are masked


@functools.cache
def scheduled(workload: str, hw: str, sizes: tuple[tuple[str, int], ...]
              ) -> pipeline.Outcome:
    outcome = pipeline.run(pipeline.Request(workload, hw, dict(sizes), validate=False))
    assert outcome.program is not None
    return outcome


def softmax(n: int) -> pipeline.Outcome:
    return scheduled("softmax", "upmem", (("N", n),))


# ---------------------------------------------------------------- independent evaluation


def value(expr: Affine, env: Mapping[str, int]) -> int:
    return expr.const + sum(c * env[v] for v, c in expr.terms)


def located(program: Program, kernel: str, where: str
            ) -> Iterator[tuple[Node, list[LoopVar], dict[str, BufferDecl]]]:
    """Every node whose text is `where`, with its enclosing loops and the buffers in scope."""
    def visit(nodes: tuple[Node, ...], loops: list[LoopVar], scope: dict[str, BufferDecl]
              ) -> Iterator[tuple[Node, list[LoopVar], dict[str, BufferDecl]]]:
        scope = dict(scope)
        for node in nodes:
            if isinstance(node, Loop):
                yield from visit(node.body, loops + [node.var], scope)
                continue
            if isinstance(node, Alloc):
                scope[node.buffer.name] = node.buffer
            if text(node) == where:
                yield node, loops, scope

    for k in program.kernels:
        if k.name == kernel:
            yield from visit(k.body, [], {b.name: b for b in program.globals})


def text(node: Node) -> str | None:
    if isinstance(node, Load):
        return f"load {node.dst} <- {node.src}"
    if isinstance(node, Store):
        return f"store {node.src} -> {node.dst}"
    if isinstance(node, Compute):
        tiles = ", ".join(f"{d}: {t}" for d, t in zip(node.dims, node.tile, strict=True))
        return (f"compute {node.statement}({', '.join(node.operands.values())}) -> "
                f"{node.out}  [{tiles}]")
    return None


def out_of_range(origin: Affine, size: int, extent: int, buffer: BufferDecl, axis: int,
                 env: Mapping[str, int]) -> list[int]:
    """The local indices, outside `buffer`'s tile, of the elements of a `size`-long tile at
    `origin` that lie inside the tensor: the interpreter's rule, evaluated with NumPy."""
    coord = value(origin, env) + np.arange(size)
    local = coord - value(buffer.origin[axis], env)
    bad = (coord < extent) & ((local < 0) | (local >= buffer.shape[axis]))
    return [int(i) for i in local[bad]]


def exhibits(program: Program, workload: Workload, failure: Failure) -> bool:
    """Whether the failure's loop values put some element of its node outside a buffer."""
    env = failure.counterexample
    found = list(located(program, failure.kernel, failure.where))
    assert found, f"no node {failure.where!r}"
    for node, loops, scope in found:
        assert set(env) == {v.name for v in loops}
        assert all(0 <= env[v.name] < v.extent for v in loops), (env, loops)
        if isinstance(node, Load | Store):
            child, parent = ((scope[node.dst], scope[node.src]) if isinstance(node, Load)
                             else (scope[node.src], scope[node.dst]))
            shape = workload.tensors[child.tensor].shape
            if any(out_of_range(child.origin[a], n, shape[a], parent, a, env)
                   for a, n in enumerate(child.shape)):
                return True
        elif isinstance(node, Compute):
            stmt = workload.statement(node.statement)
            places = [(node.out, stmt.indices)] + [
                (node.operands[a.tensor], a.indices) for a in accesses(stmt.expr)]
            for name, indices in places:
                for axis, dim in enumerate(indices):
                    k = node.dims.index(dim)
                    if out_of_range(node.origin[k], node.tile[k], stmt.extents[dim],
                                    scope[name], axis, env):
                        return True
    return False


# ---------------------------------------------------------------- proofs


def test_every_builtin_has_a_size() -> None:
    assert set(list_builtin_workloads()) == set(SIZES)


@pytest.mark.parametrize("hw", ["upmem", "cpu"])
@pytest.mark.parametrize("workload", sorted(SIZES))
def test_builtin_is_proved(workload: str, hw: str) -> None:
    outcome = scheduled(workload, hw, tuple(sorted(SIZES[workload].items())))
    assert outcome.program is not None
    proof = prove(outcome.program, outcome.workload, outcome.hardware)
    assert proof.proved, str(proof)
    assert proof.failures == []
    # at least one obligation per transfer axis, compute access and memory: a transfer
    # of a tile with an axis has one at least (a scalar's, e.g. a sum's, has none)
    nodes = [n for k in outcome.program.kernels for n in walk(k.body)]
    ranks = {n.buffer.name: len(n.buffer.shape) for n in nodes if isinstance(n, Alloc)}
    transfers = sum(isinstance(n, Load) and ranks.get(n.dst, 1) > 0
                    or isinstance(n, Store) and ranks.get(n.src, 1) > 0 for n in nodes)
    assert proof.checks > transfers


def test_ragged_softmax_is_proved() -> None:
    outcome = softmax(RAGGED)
    program, workload = outcome.program, outcome.workload
    assert program is not None
    # the proof needs the exemption: some tile runs past the tensor's end
    ragged = [node for kernel in program.kernels for node in walk(kernel.body)
              if isinstance(node, Alloc) and node.buffer.shape
              and node.buffer.origin[0].max_value(
                  {v.name: v.extent for k in program.kernels for v in loops_of(k.body)})
              + node.buffer.shape[0] > RAGGED]
    assert ragged
    proof = prove(program, workload, outcome.hardware)
    assert proof.proved, str(proof)


def loops_of(nodes: tuple[Node, ...]) -> Iterator[LoopVar]:
    for node in walk(nodes):
        if isinstance(node, Loop):
            yield node.var


def test_proof_serialises() -> None:
    outcome = softmax(4096)
    assert outcome.program is not None
    proof = prove(outcome.program, outcome.workload, outcome.hardware)
    data = json.loads(json.dumps(proof.to_json()))
    assert data == {"proved": True, "checks": proof.checks, "failures": []}
    assert str(proof).startswith(f"proved: {proof.checks} obligations")
    with pytest.raises(dataclasses.FrozenInstanceError):
        proof.proved = False  # type: ignore[misc]


# ---------------------------------------------------------------- refutations


def change_buffer(kernel: str, name: str, **fields: Any) -> tuple[str, Rewrite]:
    def fn(node: Node) -> Node:
        if isinstance(node, Alloc) and node.buffer.name == name:
            return Alloc(dataclasses.replace(node.buffer, **fields))
        return node
    return kernel, fn


def shift(program: Program, kernel: str, name: str, by: int) -> tuple[str, Rewrite]:
    decl = buffer(program, kernel, name)
    return change_buffer(kernel, name,
                         origin=decl.origin[:-1] + (decl.origin[-1] + Affine((), by),))


def shrink(program: Program, kernel: str, name: str) -> tuple[str, Rewrite]:
    decl = buffer(program, kernel, name)
    return change_buffer(kernel, name, shape=tuple(n - 1 for n in decl.shape))


def enlarge_compute(kernel: str) -> tuple[str, Rewrite]:
    def fn(node: Node) -> Node:
        if isinstance(node, Compute):
            return dataclasses.replace(node, tile=tuple(t + 1 for t in node.tile))
        return node
    return kernel, fn


def buffer(program: Program, kernel: str, name: str) -> BufferDecl:
    (decl,) = [n.buffer for k in program.kernels
               if k.name == kernel or kernel in k.statements for n in walk(k.body)
               if isinstance(n, Alloc) and n.buffer.name == name]
    return decl


MUTATIONS = {
    "shift x_wram +1": lambda p: shift(p, "e", "x_wram", 1),
    "shift x_mram +1": lambda p: shift(p, "e", "x_mram", 1),
    "shift e_wram +1": lambda p: shift(p, "e", "e_wram", 1),
    "shift e_mram +1": lambda p: shift(p, "e", "e_mram", 1),
    "shift x_wram -1": lambda p: shift(p, "e", "x_wram", -1),
    "shrink x_wram": lambda p: shrink(p, "e", "x_wram"),
    "shrink x_mram": lambda p: shrink(p, "e", "x_mram"),
    "shrink e_mram": lambda p: shrink(p, "y", "e_mram"),
    "shrink x_wram of m": lambda p: shrink(p, "m", "x_wram"),
    "enlarge compute e": lambda p: enlarge_compute("e"),
    "enlarge compute s": lambda p: enlarge_compute("s"),
}


def refute(n: int, mutation: str) -> tuple[Program, Workload, Proof]:
    outcome = softmax(n)
    assert outcome.program is not None
    kernel, fn = MUTATIONS[mutation](outcome.program)
    broken = rewrite(outcome.program, kernel, fn)
    assert broken != outcome.program, "the mutation did not apply"
    return broken, outcome.workload, prove(broken, outcome.workload, outcome.hardware)


@pytest.mark.parametrize("n", [4096, RAGGED])
@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_broken_program_is_refuted_with_a_real_counterexample(n: int, mutation: str
                                                              ) -> None:
    broken, workload, proof = refute(n, mutation)
    assert not proof.proved
    assert proof.failures and all(f.kind == "bounds" for f in proof.failures)
    for failure in proof.failures:
        assert exhibits(broken, workload, failure), failure
    # and the fault is real: running the program trips over an index too
    with pytest.raises(IRError, match=r"expected (the tile inside|\w+ inside tile of)"):
        interpret(broken, workload, make_inputs(workload))


def test_failure_report_names_the_node_and_the_index() -> None:
    broken, workload, proof = refute(4096, "shift x_wram +1")
    failure = proof.failures[0]
    assert failure.where in {"load x_wram <- x_mram",
                             "compute e(x_wram, m_wram) -> e_wram  [i: 4]"}
    assert re.search(r"axis 0: element \d+ of .* has index -?\d+ outside 0\.\.\d+ of "
                     r"x_(w|m)ram", failure.message)
    assert set(failure.counterexample) >= {"r_i", "d_i", "t_i"}
    data = proof.to_json()["failures"]
    assert isinstance(data, list) and data[0]["counterexample"] == failure.counterexample
    assert failure.where in str(proof)


def test_a_partial_loop_outside_the_transfer_is_refuted() -> None:
    # tasklets' partials of m go through MRAM to the host (not combined on the DPU)
    outcome = pipeline.run(pipeline.Request("softmax", "upmem", {"N": 4096}, validate=False,
                                            fixes=("combine.m.tasklet=0",)))
    assert outcome.program is not None
    # m_mram's partial axis over t_i is filled by a child axis; take the axis away
    _, fn = change_buffer("m", "m_mram", partial_loops=())
    broken = rewrite(outcome.program, "m", fn)
    proof = prove(broken, outcome.workload, outcome.hardware)
    assert not proof.proved
    assert any("partial loop t_i" in f.message for f in proof.failures)


# ---------------------------------------------------------------- capacity


def test_capacity_of_a_smaller_wram_is_refuted() -> None:
    outcome = softmax(65536)
    program, workload = outcome.program, outcome.workload
    assert program is not None
    small = load_hardware("upmem", ["wram.capacity=2304B"])  # 256 B usable
    proof = prove(program, workload, small)
    assert not proof.proved
    assert proof.failures and all(f.kind == "capacity" for f in proof.failures)
    usable = small.memory("wram").usable
    for failure in proof.failures:
        assert re.fullmatch(r"kernel \S+: wram", failure.where)
        used = taken(failure)
        assert used > usable and f"> {usable} usable" in failure.message
        assert failure.counterexample == {}
    # the concrete verifier measures the same bytes
    with pytest.raises(IRError, match=rf"fit {usable} bytes, got {taken(proof.failures[0])}$"):
        verify(program, workload, small)
    # and with the original WRAM the same program is proved
    assert prove(program, workload, outcome.hardware).proved


def taken(failure: Failure) -> int:
    found = re.search(r"take (\d+) bytes", failure.message)
    assert found, failure.message
    return int(found.group(1))


def test_the_pipeline_reports_the_proof_in_json() -> None:
    from synth.pipeline import Request, run
    from synth.report import to_json

    outcome = run(Request("softmax", "upmem", {"N": 1009}, validate=False))
    verification = to_json(outcome)["verification"]
    assert verification["proved"] is True
    assert verification["checks"] > 0 and verification["failures"] == []


# ---------------------------------------------------------------- size ranges

# a UPMEM so small that va needs a host loop (h_i) to walk N: the loop that adapts to N
HOST_LOOP = ("rank.count=1..1", "dpu.count=1..2", "tasklet.count=1..2", "mram.capacity=64KiB")

RangeSpec = tuple[tuple[str, tuple[int, int, int]], ...]


@functools.cache
def ranged(workload: str, hw: str, ranges: RangeSpec, sizes: tuple[tuple[str, int], ...] = (),
           overrides: tuple[str, ...] = (), fixes: tuple[str, ...] = ()) -> pipeline.Outcome:
    """A pipeline run with sizes given as ranges (solved at the largest admissible value,
    proved for every one, and run against NumPy at the smallest)."""
    request = pipeline.Request(workload, hw, dict(sizes), overrides, fixes=fixes,
                               ranges={n: SizeRange(*r) for n, r in ranges})
    outcome = pipeline.run(request)
    assert outcome.program is not None and outcome.proof is not None
    return outcome


RANGE_CASES = {
    "softmax/upmem": ("softmax", "upmem", (("N", (1024, 16384, 1024)),), (), ()),
    "va/upmem": ("va", "upmem", (("N", (1000, 20000, 7)),), (), ()),
    # single buffered, 1024-element WRAM tiles: one copy per host iteration overflows WRAM
    # past some N (the tile is fixed: which one the model prefers is not this case's point)
    "va/upmem host loop": ("va", UPMEM_PRIOR, (("N", (1024, 65536, 1024)),), (), HOST_LOOP,
                           ("buffers.c.wram=1", "Q.c.i=1024")),
    "mv/cpu": ("mv", "cpu", (("N", (64, 512, 64)),), (("M", 32),), ()),
    "mv/cpu two ranges": ("mv", "cpu", (("M", (8, 64, 8)), ("N", (16, 128, 16))), (), ()),
    # streams: the columns and cores sit outside the root (l3) loop (`parametric` groups)
    "fa6/aie": ("fa6", "aie", (("S", (8, 64, 4)),), (("D", 8),), ()),
}


def range_case(name: str) -> pipeline.Outcome:
    return ranged(*RANGE_CASES[name])


def at_sizes(outcome: pipeline.Outcome, program: Program, values: Mapping[str, int]
             ) -> tuple[Program, Workload]:
    """`program` instantiated at `values` of its ranged sizes, with the workload there."""
    workload = outcome.workload
    ranges = outcome.proof.sizes if outcome.proof else {}
    dependence = size_dependence(workload, ranges)
    small = load_workload(workload.source, {**workload.sizes, **values})
    return instantiate(program, workload, dependence, values), small


@pytest.mark.parametrize("case", sorted(RANGE_CASES))
def test_a_schedule_is_proved_over_a_range(case: str) -> None:
    outcome = range_case(case)
    proof = outcome.proof
    assert proof is not None and proof.proved, str(proof)
    ranges = {n: SizeRange(*r) for n, r in RANGE_CASES[case][2]}
    assert dict(proof.sizes) == ranges
    # solved at the largest admissible value (va: 1000 + 7k <= 20000 is 19998)
    assert dict(proof.solved) == {n: r.last for n, r in ranges.items()}
    assert all(outcome.workload.sizes[n] == r.last for n, r in ranges.items())
    assert "bounds" in proof.kinds and "coverage" in proof.kinds
    if "host loop" in case:
        assert "parametric" in proof.kinds
    elif RANGE_CASES[case][1] == "upmem":  # no loop around the launches varies with size
        assert "parametric" not in proof.kinds
    text = " and ".join(f"{n} in {r.lo}..{r.last}" + (f" step {r.step}" if r.step > 1 else "")
                        + f" ({r.count} values)" for n, r in ranges.items())
    assert str(proof) == f"proved for {text}: {proof.checks} obligations " \
                         f"({', '.join(proof.kinds)}) hold"
    # the same nest, at the smallest sizes, was verified and run against NumPy
    assert outcome.smallest is not None
    assert dict(outcome.smallest.sizes) == {n: r.lo for n, r in ranges.items()}
    assert outcome.smallest.validation.passed


@pytest.mark.parametrize("case", ["va/upmem host loop", "mv/cpu", "softmax/upmem", "fa6/aie"])
def test_the_proved_nest_runs_at_sizes_across_the_range(case: str) -> None:
    """What the proof is about, checked without z3: the nest with its host loops adapted
    passes the concrete verifier and matches NumPy at sizes across the range."""
    outcome = range_case(case)
    assert outcome.program is not None and outcome.proof is not None
    (name, admissible), = outcome.proof.sizes.items()
    values = list(admissible.values())
    for value in (values[0], values[len(values) // 3], values[-2]):
        program, workload = at_sizes(outcome, outcome.program, {name: value})
        verify(program, workload, outcome.hardware)
        assert pipeline.validate(program, workload).passed, value


def test_host_loops_adapt_past_the_solved_size() -> None:
    """A nest proved for sizes above the one it was solved at: its host loop runs more
    often, its tiles stay; the adapted nest really computes the larger problem."""
    outcome = range_case("va/upmem host loop")
    program = outcome.program
    assert program is not None
    host = [n.var for k in program.kernels for n in walk(k.body)
            if isinstance(n, Loop) and is_root_loop(program, n.var)]
    (solved,) = host
    assert solved.extent == -(-65536 // solved.step) > 1
    wider = {"N": SizeRange(1024, 262144, 1024)}
    assert prove(program, outcome.workload, outcome.hardware, wider).proved
    dependence = size_dependence(outcome.workload, wider)
    bigger = instantiate(program, outcome.workload, dependence, {"N": 200704})
    (loop,) = [n.var for k in bigger.kernels for n in walk(k.body) if isinstance(n, Loop)
               and n.var.name == solved.name]
    assert loop.extent == -(-200704 // solved.step) > solved.extent
    workload = load_workload("va", {"N": 200704})
    assert pipeline.validate(bigger, workload).passed


def test_units_outside_the_root_loop_leave_it_parametric() -> None:
    """On AIE (`streams`) the columns and cores sit outside the root (l3) loop, each
    walking its own share of DDR. A root loop over a ranged dimension that those units
    split too runs fewer than ceil(N / step) times, and the proof over the range refutes
    it (`parametric`). The model's `parametric.<kernel>.<dim>` groups, added only with
    ranges, keep the solver from choosing such a schedule: fa6 over a range of S on AIE
    is proved (before them, the solver split i across the units and walked it in l3)."""
    outcome = range_case("fa6/aie")
    proof, program = outcome.proof, outcome.program
    assert proof is not None and program is not None
    assert proof.proved, str(proof)
    groups = {c.group for c in outcome.model.constraints.constraints}
    assert {"parametric.kt_s_u_p_r_O.i", "parametric.kt_s_u_p_r_O.j"} <= groups
    assert not any(g.startswith("parametric.") and g.endswith(".d") for g in groups)  # D=8
    # the schedule the groups exclude, pinned: i split across the 4 columns and walked
    # again in l3 (2 steps of 8 where ceil(64 / 8) = 8 are needed)
    split = ("fuse.kt_s_u_p_r_O=1", "X.kt_s_u_p_r_O.i=4", "Y.kt_s_u_p_r_O.i=1",
             "M.kt_s_u_p_r_O.i=8", "Q.kt_s_u_p_r_O.i=1")
    request = pipeline.Request("fa6", "aie", {"D": 8}, validate=False, fixes=split,
                               ranges={"S": SizeRange(8, 64, 4)})
    # with the groups it is infeasible, and the conflict names the group
    refused = pipeline.run(request)
    assert refused.result.status is Status.INFEASIBLE and refused.explanation is not None
    assert "parametric.kt_s_u_p_r_O.i" in {c.group for c in refused.explanation}
    # without them it is solved, and the proof refutes it
    dropped = pipeline.run(dataclasses.replace(request, drops=("parametric",)))
    assert dropped.proof is not None and not dropped.proof.proved
    (failure,) = dropped.proof.failures
    assert failure.kind == "parametric" and failure.counterexample == {"S": 64}
    assert "parallel loops over i outside it split the rest" in failure.message
    # and a model without ranges has none
    plain = pipeline.encode(outcome.workload, outcome.hardware)
    assert not any(c.group.startswith("parametric") for c in plain.constraints.constraints)


def test_which_extents_are_the_ranged_size() -> None:
    outcome = range_case("mv/cpu")
    dependence = size_dependence(outcome.workload, {"N": SizeRange(64, 512, 64)})
    assert dict(dependence.tensors) == {("A", 1): "N", ("x", 0): "N"}
    assert dict(dependence.statements) == {("y", "j"): "N"}


def test_a_workload_not_valid_across_the_range_is_bad_input(tmp_path: Any) -> None:
    path = tmp_path / "lit.syn"
    path.write_text("size N = 16\nin x : f32[N]\nin w : f32[16]\nout y : f32[N]\n"
                    "y[i] = x[i] * w[i]\n")
    request = pipeline.Request(str(path), "cpu", ranges={"N": SizeRange(8, 16, 8)})
    with pytest.raises(InputError, match=r"--set N=8\.\.16: workload 'lit' is not valid at "
                                         r"N=8: .*conflicting extents"):
        pipeline.run(request)


# -- refutations over a range


def kernel_with(program: Program, name: str) -> str:
    """The kernel that allocates buffer `name` (kernel names change with fusion)."""
    return next(k.name for k in program.kernels for n in walk(k.body)
                if isinstance(n, Alloc) and n.buffer.name == name)


def exhibits_at(outcome: pipeline.Outcome, broken: Program, failure: Failure) -> bool:
    """The failure's sizes and loop values, evaluated on the broken nest instantiated at
    those sizes, put an element outside a buffer (independently of z3)."""
    assert outcome.proof is not None
    sizes = {n: failure.counterexample[n] for n in outcome.proof.sizes}
    assert all(v in outcome.proof.sizes[n] for n, v in sizes.items()), sizes
    program, workload = at_sizes(outcome, broken, sizes)
    loops = {k: v for k, v in failure.counterexample.items() if k not in sizes}
    return exhibits(program, workload, dataclasses.replace(failure, counterexample=loops))


@pytest.mark.parametrize("buffer", ["x_wram", "x_mram"])
def test_a_short_tile_is_refuted_over_the_range_at_a_size(buffer: str) -> None:
    outcome = range_case("softmax/upmem")
    assert outcome.program is not None
    kernel = kernel_with(outcome.program, buffer)
    broken = rewrite(outcome.program, *shrink(outcome.program, kernel, buffer))
    admissible = SizeRange(1024, 16384, 1024)
    proof = prove(broken, outcome.workload, outcome.hardware, {"N": admissible})
    assert not proof.proved
    assert proof.failures and all(f.kind == "bounds" for f in proof.failures)
    for failure in proof.failures:
        assert list(failure.counterexample)[0] == "N"  # the size first, then the loops
        assert failure.counterexample["N"] in admissible
        assert exhibits_at(outcome, broken, failure), failure
        assert f"N={failure.counterexample['N']}" in str(proof)
    # and running the nest at that size trips over an index too
    sizes = {"N": proof.failures[0].counterexample["N"]}
    program, workload = at_sizes(outcome, broken, sizes)
    with pytest.raises(IRError, match=r"expected (the tile inside|\w+ inside tile of)"):
        interpret(program, workload, make_inputs(workload))


def host_loop(program: Program, **fields: Any) -> Program:
    def fn(node: Node) -> Node:
        if isinstance(node, Loop) and is_root_loop(program, node.var):
            return dataclasses.replace(node, var=dataclasses.replace(node.var, **fields))
        return node
    (kernel,) = [k.name for k in program.kernels for n in walk(k.body)
                 if isinstance(n, Loop) and is_root_loop(program, n.var)]
    return rewrite(program, kernel, fn)


def test_a_padded_host_loop_cannot_be_parametrised() -> None:
    """One extra (fully masked) host iteration is harmless at the solved size, but the
    loop's count is then not ceil(N / step): the range proof refutes it, naming N."""
    outcome = range_case("va/upmem host loop")
    assert outcome.program is not None and outcome.proof is not None
    (host,) = [n.var for k in outcome.program.kernels for n in walk(k.body)
               if isinstance(n, Loop) and is_root_loop(outcome.program, n.var)]
    extra = host.extent + 1
    broken = host_loop(outcome.program, extent=extra)
    verify(broken, outcome.workload, outcome.hardware)
    assert prove(broken, outcome.workload, outcome.hardware).proved
    proof = prove(broken, outcome.workload, outcome.hardware, outcome.proof.sizes)
    assert not proof.proved
    (failure,) = proof.failures
    assert failure.kind == "parametric" and failure.counterexample == {"N": 65536}
    assert f"{host.name} (host) runs {extra} times at N=65536" in failure.message
    assert "not a function of N" in failure.message
    with pytest.raises(IRError, match="count is a function of N"):
        instantiate(broken, outcome.workload, size_dependence(outcome.workload,
                                                              outcome.proof.sizes),
                    {"N": 1024})


def test_a_host_loop_that_does_not_adapt_is_refuted_past_its_reach() -> None:
    """The host loop turned into an ordinary loop keeps its count: below the solved size
    the tail is masked (proved), above it the tiles stop short (coverage refuted at a
    size, and the nest run there leaves elements unwritten)."""
    outcome = range_case("va/upmem host loop")
    assert outcome.program is not None
    fixed = host_loop(outcome.program, where="mram")
    below = {"N": SizeRange(1024, 65536, 1024)}
    assert prove(fixed, outcome.workload, outcome.hardware, below).proved
    above = {"N": SizeRange(1024, 262144, 1024)}
    proof = prove(fixed, outcome.workload, outcome.hardware, above)
    assert not proof.proved
    (failure,) = proof.failures
    n = failure.counterexample["N"]
    assert failure.kind == "coverage" and failure.counterexample == {"N": n}
    assert n > 65536 and n in above["N"]
    assert f"reach elements 0..65535 only: 65536..{n - 1} of {n}" in failure.message
    program, workload = at_sizes(outcome, fixed, {"N": n})
    with pytest.raises(IRError, match="expected every element written"):
        interpret(program, workload, make_inputs(workload))


def test_a_schedule_solved_for_a_smaller_size_is_refuted_for_larger_ones() -> None:
    outcome = softmax(4096)
    assert outcome.program is not None
    proof = prove(outcome.program, outcome.workload, outcome.hardware,
                  {"N": SizeRange(4096, 65536, 4096)})
    assert not proof.proved
    assert {f.kind for f in proof.failures} == {"coverage"}
    assert all(4096 < f.counterexample["N"] <= 65536 for f in proof.failures)


def test_capacity_over_a_range_names_the_size() -> None:
    outcome = range_case("softmax/upmem")
    assert outcome.program is not None
    small = load_hardware("upmem", ["wram.capacity=2304B"])  # 256 B usable
    admissible = SizeRange(1024, 16384, 1024)
    proof = prove(outcome.program, outcome.workload, small, {"N": admissible})
    failures = [f for f in proof.failures if f.kind == "capacity"]
    assert failures and not proof.proved
    for failure in failures:
        assert set(failure.counterexample) == {"N"}
        assert failure.counterexample["N"] in admissible


def test_a_buffer_that_grows_with_the_size_is_refuted_where_it_overflows() -> None:
    """Capacity obligations quantify over N: a WRAM tile with one copy per host
    iteration (ceil(N / step) of them) overflows only past some N, and the failure says
    which."""
    outcome = range_case("va/upmem host loop")
    program = outcome.program
    assert program is not None and outcome.proof is not None
    (host,) = [n.var for n in walk(program.kernels[0].body)
               if isinstance(n, Loop) and is_root_loop(program, n.var)]
    (tasklets,) = [n.var.extent for n in walk(program.kernels[0].body)
                   if isinstance(n, Loop) and n.var.where == "tasklet"]
    tile = buffer(program, "c", "a_wram").shape[0] * 4  # bytes of one i32 tile
    broken = rewrite(program, "c", change_buffer("c", "a_wram",
                                                 partial_loops=(host.name,))[1])
    proof = prove(broken, outcome.workload, outcome.hardware, outcome.proof.sizes)
    (failure,) = [f for f in proof.failures if f.kind == "capacity"]
    n = failure.counterexample["N"]
    usable = outcome.hardware.memory("wram").usable
    copies = tasklets * -(-n // host.step)  # one copy per tasklet and host iteration
    others = 2 * tasklets * tile  # b_wram and c_wram
    assert taken(failure) == copies * tile + others > usable
    assert f"a_wram {tile}B x{copies}" in failure.message
    # with one host iteration (N <= step) the tiles fit: the failure is at a larger N
    assert tasklets * tile + others <= usable and n > host.step


def test_range_proof_serialises() -> None:
    outcome = range_case("softmax/upmem")
    proof = outcome.proof
    assert proof is not None
    data = json.loads(json.dumps(proof.to_json()))
    assert data["proved"] is True and data["failures"] == []
    assert data["sizes"] == {"N": {"min": 1024, "max": 16384, "step": 1024, "values": 16,
                                   "solved_at": 16384}}
    assert data["kinds"] == list(proof.kinds)
