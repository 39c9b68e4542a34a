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
from conftest import Rewrite, rewrite

from synth import pipeline
from synth.errors import IRError
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
from synth.ir.prove import Failure, Proof, prove
from synth.ir.verify import verify
from synth.lang import list_builtin_workloads
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
    # at least one obligation per transfer axis, compute access and memory
    transfers = sum(isinstance(n, Load | Store) for k in outcome.program.kernels
                    for n in walk(k.body))
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
    (decl,) = [n.buffer for k in program.kernels if k.name == kernel for n in walk(k.body)
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
    outcome = softmax(4096)
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
    small = load_hardware("upmem", ["wram.capacity=8KiB"])
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
