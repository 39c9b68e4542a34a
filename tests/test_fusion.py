"""Fusion as a decision of the solver: which groups are legal, and that fused schedules
(chosen by the optimiser, forced by the user, or drawn at random) run correctly."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path

import networkx as nx
import pytest
from conftest import (
    SMALL_UPMEM,
    TWO_CORES,
    UPMEM_PRIOR,
    Case,
    build,
    forced,
    optimum,
    sample,
)
from typer.testing import CliRunner, Result

from synth.cli import app
from synth.constraints import cpsat, decompose, exhaustive
from synth.constraints import expr as ex
from synth.constraints.fusion import candidate_groups, illegal_reason, kernel_order
from synth.constraints.space import fusion_decision, is_fusion_decision
from synth.hwfile import load_hardware
from synth.ir.materialize import materialize
from synth.ir.nodes import Alloc, Compute, Load, Loop, Node, Store, walk
from synth.lang import load_workload, parse_workload
from synth.pipeline import encode, validate
from synth.pipeline import solve as synth_solve


def fused_groups(workload: str) -> list[list[str]]:
    wl = load_workload(workload, {})
    return [[wl.statements[i].name for i in g] for g in candidate_groups(wl) if len(g) > 1]


def reason(workload: str, *names: str) -> str | None:
    wl = load_workload(workload, {})
    return illegal_reason(wl, [[s.name for s in wl.statements].index(n) for n in names])


# ---------------------------------------------------------------- legality


def test_candidate_groups_of_the_builtins() -> None:
    assert fused_groups("softmax") == [["e", "s"]]
    # p is a prologue of o (p iterates i, j of o's i, e, j); O an epilogue after o's pass
    assert fused_groups("attention") == [["p", "l"], ["p", "o"], ["o", "O"]] + [
        ["m", "p", "l", "o"], ["s", "m", "p", "l", "o"],  # online (tests/test_online.py)
        ["m", "p", "l", "o", "O"], ["s", "m", "p", "l", "o", "O"]]
    assert ["u", "p", "r", "O"] in fused_groups("fa6")
    assert ["kt", "s", "u", "p", "r", "O"] in fused_groups("fa6")  # seed 004's chain
    assert fused_groups("matmul") == [["C#1", "C#2"]]  # the fill runs where C lives


def test_a_reduced_value_is_not_consumed_inside_its_own_pass() -> None:
    why = reason("softmax", "m", "e")
    assert why is not None and "e consumes m" in why and "reduces over i" in why
    why = reason("softmax", "s", "y")
    assert why is not None and "y consumes s" in why


def test_kernels_are_convex_in_the_dag() -> None:
    why = reason("softmax", "e", "y")  # s reads e and y reads s: s would sit in between
    assert why is not None and why.startswith("s depends on the group")


def test_fused_statements_share_the_loops_of_a_core_statement() -> None:
    assert reason("fa6", "kt", "s") is None  # the transpose runs per tile of kt
    assert reason("fa6", "u", "p", "r", "O") is None
    why = reason("attention", "l", "O")  # (i, j) and (i, e): no statement spans both
    assert why is not None and "no statement spans" in why
    why = reason("attention", "p", "l", "o")  # l accumulates outside o's loops over e
    assert why is not None and "l iterates only i, j" in why and "accumulates" in why


def test_an_epilogue_may_read_a_reduction_only_after_its_pass() -> None:
    assert reason("attention", "o", "O") is None  # O does not iterate the reduced j
    why = reason("attention", "m", "p")  # p iterates the j that m reduces over
    assert why is not None and "p consumes m" in why


def test_the_cli_refuses_an_illegal_fusion_in_the_users_terms() -> None:
    result = CliRunner().invoke(app, ["solve", "softmax", "--hw", "upmem", "--set", "N=4096",
                                      "--fix", "fuse.m_e=1"])
    assert result.exit_code == 2
    assert "statements m, e cannot be fused: e consumes m" in result.output


def test_a_kernel_that_is_always_used_may_be_fixed_as_used_not_as_unused() -> None:
    """softmax's y fuses with nothing: `fuse.y` is not a decision. Fixing it to 1 says
    what is so (a sweep may fix every kernel); to 0, what cannot be."""
    def solve(*fixes: str) -> Result:
        args = ["solve", "softmax", "--hw", "cpu", "--set", "N=4096", "--no-validate",
                "--json"]
        return CliRunner().invoke(app, [*args, *(a for f in fixes for a in ("--fix", f))])
    used, plain = solve("fuse.y=1"), solve()
    assert used.exit_code == 0, used.output
    assert json.loads(used.output)["variables"] == json.loads(plain.output)["variables"]
    unused = solve("fuse.y=0")
    assert unused.exit_code == 2
    assert "kernel y is the only kernel that can run y: it is always used" in unused.output
    assert "fixed twice" in solve("fuse.y=1", "fuse.y=1").output


# ---------------------------------------------------------------- fused schedules run

FA6 = Case.of("fa6", UPMEM_PRIOR, {"S": 16, "D": 8}, SMALL_UPMEM)
SOFTMAX = Case.of("softmax", "upmem", {"N": 64}, SMALL_UPMEM)


def test_the_optimum_fuses_fa6s_elementwise_chain_and_keeps_it_on_chip() -> None:
    built = build(FA6)
    env = dict(optimum(FA6).env or {})
    chosen = built.model.selected(env)
    fused = [k for k in chosen if len(k.statements) > 1]
    assert fused, [k.name for k in chosen]
    program = materialize(built.model, env)
    assert validate(program, built.workload).passed
    innermost = built.hw.memories[-1].name
    for spec, kernel in zip(chosen, program.kernels, strict=True):
        local = {u.tensor for u in spec.uses if u.local}
        buffers = {n.buffer.name: n.buffer for n in walk(kernel.body) if isinstance(n, Alloc)}
        for buf in buffers.values():
            if buf.tensor in local:
                assert buf.memory == innermost  # never in an outer memory
        for node in walk(kernel.body):
            if isinstance(node, Load | Store):
                moved = {node.dst, node.src}
                assert not any(buffers[b].tensor in local for b in moved if b in buffers), node
    assert any(u.local for k in fused for u in k.uses)


@pytest.mark.parametrize("case", [FA6, SOFTMAX], ids=lambda c: c.id)
def test_random_feasible_schedules_fused_or_not_validate(case: Case) -> None:
    built = build(case)
    shapes = set()
    for seed in range(5):
        env = sample(case, seed)
        assert env is not None
        shapes.add(tuple(k.name for k in built.model.selected(env)))
        assert validate(materialize(built.model, env), built.workload).passed, (seed, env)
    assert len(shapes) > 1, shapes  # the samples do vary the fusion


def test_fusion_is_decided_jointly_the_brute_force_optimum_agrees() -> None:
    """Exhaustive enumeration of every fusion cover and every tiling finds the same
    optimum as CP-SAT's joint model."""
    cset = build(SOFTMAX).model.constraints
    truth = exhaustive.solve(cset, 120.0)
    assert truth.objective == optimum(SOFTMAX).objective


def test_forcing_and_forbidding_a_fusion() -> None:
    runner = CliRunner()
    args = ["solve", "softmax", "--hw", "upmem", "--set", "N=4096", "--json"]
    fused = runner.invoke(app, [*args, "--fix", "fuse.e_s=1"])
    apart = runner.invoke(app, [*args, "--fix", "fuse.e_s=0"])
    assert fused.exit_code == 0 and apart.exit_code == 0, fused.output + apart.output
    kernels = [g["name"] for g in json.loads(fused.stdout)["groups"]]
    assert "e_s" in kernels and "e" not in kernels
    assert "e_s" not in [g["name"] for g in json.loads(apart.stdout)["groups"]]


# ---------------------------------------------------------------- prologue and epilogue

MATMUL = Case.of("matmul", "cpu", {"M": 32, "N": 16, "K": 64}, TWO_CORES)


def test_a_fused_fill_initialises_the_accumulator_where_it_lives() -> None:
    """C = 0 fused with C += A*B: C is never loaded, its innermost tile is filled by the
    prologue once and then stays resident across every loop over k (streaming K)."""
    built, program = forced(MATMUL, "fuse.C#1_C#2=1")
    [kernel] = program.kernels
    assert kernel.name == "C#1_C#2"
    assert not any(isinstance(n, Load) and n.dst.startswith("C_") for n in walk(kernel.body))
    tile = _enclosing(kernel.body, lambda n: isinstance(n, Alloc)
                      and n.buffer.name == f"C_{built.model.hw.memories[-1].name}")
    assert all(loop.var.dim != "k" for loop in tile)  # resident across all of K
    fill = _enclosing(kernel.body, lambda n: isinstance(n, Compute) and n.statement == "C#1")
    assert fill == tile  # the fill runs where the tile is allocated, outside the k loops
    assert validate(program, built.workload).passed


def test_an_epilogue_chain_runs_after_the_reduction_it_reads() -> None:
    case = Case.of("fa6", "cpu", {"S": 32, "D": 16}, TWO_CORES)
    built, program = forced(case, "fuse.kt_s_u_p_r_O=1")
    [kernel] = program.kernels
    matmul = _enclosing(kernel.body, lambda n: isinstance(n, Compute) and n.statement == "s")
    for name in ("u", "p", "r", "O"):
        around = _enclosing(kernel.body, lambda n, name=name: isinstance(n, Compute)
                            and n.statement == name)
        assert all(loop.var.dim != "d" for loop in around)  # after the whole pass over d
        assert around == matmul[:len(around)]
    assert validate(program, built.workload).passed


def test_the_completion_constraint_binds_when_k_cannot_stay_inner() -> None:
    """With an l2 too small for K's operands, fusing the fill would need C's tile to be
    reloaded mid-reduction: the fused kernel is infeasible and the solver keeps them
    apart, while forcing the fusion is explained by fusion.complete."""
    small = Case.of("matmul", "cpu", {"M": 32, "N": 16, "K": 4096},
                    ("core.count=1..2", "l2.capacity=4KiB", "l1.capacity=1KiB"))
    built = build(small)
    result = optimum(small)
    assert result.env is not None
    assert [k.name for k in built.model.selected(result.env)] == ["C#1", "C#2"]
    runner = CliRunner()
    out = runner.invoke(app, ["solve", "matmul", "--hw", "cpu", "--set", "M=32", "--set",
                              "N=16", "--set", "K=4096", *(a for o in small.overrides
                                                            for a in ("--hw-set", o)),
                              "--fix", "fuse.C#1_C#2=1"])
    assert out.exit_code == 1, out.output
    assert "fusion.complete" in out.output


def _enclosing(nodes: tuple[Node, ...], match: Callable[[Node], bool],
               outer: tuple[Loop, ...] = ()) -> tuple[Loop, ...]:
    """The loops around the first node that matches."""
    for node in nodes:
        if match(node):
            return outer
        if isinstance(node, Loop):
            try:
                return _enclosing(node.body, match, (*outer, node))
            except LookupError:
                continue
    raise LookupError("no such node")


def test_two_candidates_that_each_need_the_others_result_are_never_both_chosen() -> None:
    """Fuzz seed 97: each candidate is convex, but t1_y#1 and t0_t2_t3 need each other's
    results first (t3 reads t1, y#1 reads t2). The optimum took both and no order of the
    kernels existed (exit 70); `fusion.acyclic` forbids the pair, and the schedule
    validates."""
    text = ("size K = 256\nin x0 : bf16[K]\nin x1 : f32[K]\nout y : f32[]\n"
            "t0[i] = x0[i]\nt1[i] += x1[i]\nt2[] max= t0[i]\n"
            "t3[i] = sqrt(max(x0[i], t1[i]) / t0[i] * x0[i])\n"
            "y[] += max(x1[i], t1[i] / t2[])\ny[] += -1\n")
    workload = parse_workload(text, "<test>", "w")
    model = encode(workload, load_hardware("cpu"))
    pairs = [c.meaning for c in model.constraints.constraints if c.group == "fusion.acyclic"]
    assert "kernels t1_y#1 and t0_t2_t3 each need a result of the other first: not both" \
        in pairs
    result = synth_solve(model, "cpsat", 30.0)
    assert result.env is not None
    assert not (result.env["fuse.t1_y#1"] and result.env["fuse.t0_t2_t3"])
    assert validate(materialize(model, result.env), workload).passed


def ring_workload(n: int) -> str:
    """n pairs k_out, k_in; each k_in reads its own k_out and the previous pair's:
    fused pairwise, the n kernels need each other's results in a ring. N is small: the
    ring does not depend on it, and the explanation of the conflict checks less."""
    names = [chr(ord("a") + k) for k in range(n)]
    return "\n".join(["size N = 16", "in x : f32[N]",
                      *(f"out {k}_in : f32[N]" for k in names),
                      *(f"{k}_out[i] = x[i] * {j + 2}" for j, k in enumerate(names)),
                      *(f"{k}_in[i] = {k}_out[i] + {names[j - 1]}_out[i]"
                        for j, k in enumerate(names))]) + "\n"


@pytest.mark.parametrize("n", [3, 4, 5])
def test_candidates_in_a_ring_are_never_all_chosen(tmp_path: Path, n: int) -> None:
    """No two of the pairs' kernels (a_out_a_in, ...) need each other, but all n need each
    other's results in a ring: forced together they were exit 70 (no kernel order; for 3
    since fuzz seed 97's fix, for 4 and more until rings of any length were listed); now
    the fixes conflict (exit 1, each named), and all but one of them solve and
    validate."""
    text = ring_workload(n)
    pairs = [f"fuse.{k}_out_{k}_in" for k in (chr(ord("a") + j) for j in range(n))]
    model = encode(parse_workload(text, "<test>", "w"), load_hardware("cpu"))
    rings = [c.meaning for c in model.constraints.constraints if c.group == "fusion.acyclic"]
    listed = ", ".join(p.removeprefix("fuse.") for p in pairs[:-1])
    assert (f"kernels {listed} and {pairs[-1].removeprefix('fuse.')} need each other's "
            f"results in a ring: not all {n}") in rings
    path = tmp_path / "ring.syn"
    path.write_text(text)

    def solve(*fixes: str) -> Result:
        args = ["solve", str(path), "--hw", "cpu", *(a for f in fixes for a in ("--fix", f))]
        return CliRunner().invoke(app, args)
    every = solve(*(f"{name}=1" for name in pairs))
    assert every.exit_code == 1, every.output
    assert all(f"user.fix.{name}" in every.output for name in pairs)
    fewer = solve(*(f"{name}=1" for name in pairs[1:]))
    assert fewer.exit_code == 0, fewer.output
    assert "validation against NumPy: passed" in fewer.output


RING_THROUGH_FIXED = ("size N = 16\nin x : f32[N]\nout a_in : f32[N]\nout b_in : f32[N]\n"
                      "out c_in : f32[N]\na_out[i] = x[i] + 1\nb_out[i] = x[i] * 2\n"
                      "c_out[i] = x[i] - 3\nkk[t] = a_out[t] * 5\n"
                      "a_in[i] = a_out[i] + c_out[i]\nb_in[i] = b_out[i] + kk[i]\n"
                      "c_in[i] = c_out[i] + b_out[i]\n")


def test_a_ring_through_a_kernel_always_chosen_is_never_all_chosen(tmp_path: Path) -> None:
    """kk (over t) fuses with nothing, so it is always its own kernel; a_out_a_in feeds
    it, it feeds b_out_b_in, which feeds c_out_c_in, which feeds a_out_a_in. No two of
    the three need each other, and none feeds the next directly: forced together they
    were exit 70 until the rings ran through kernels always chosen; now exit 1."""
    model = encode(parse_workload(RING_THROUGH_FIXED, "<test>", "w"), load_hardware("cpu"))
    assert not isinstance(model.chosen["kk"], ex.Var)
    rings = [c.meaning for c in model.constraints.constraints if c.group == "fusion.acyclic"]
    assert ("kernels kk, b_out_b_in, c_out_c_in and a_out_a_in need each other's results "
            "in a ring: not all 4") in rings
    path = tmp_path / "ring.syn"
    path.write_text(RING_THROUGH_FIXED)
    fixes = ["fuse.a_out_a_in=1", "fuse.b_out_b_in=1", "fuse.c_out_c_in=1"]
    run = CliRunner().invoke(app, ["solve", str(path), "--hw", "cpu",
                                   *(a for f in fixes for a in ("--fix", f))])
    assert run.exit_code == 1, run.output
    fewer = CliRunner().invoke(app, ["solve", str(path), "--hw", "cpu",
                                     *(a for f in fixes[1:] for a in ("--fix", f))])
    assert fewer.exit_code == 0, fewer.output
    assert "validation against NumPy: passed" in fewer.output


def element_wise_dag(seed: int, least: int = 4, most: int = 8) -> str:
    """A random element-wise workload of `least` to `most` statements: each adds two
    earlier tensors (inputs or results); the results nothing reads are the outputs."""
    rng = random.Random(seed)
    body, names = [], []
    for k in range(rng.randint(least, most)):
        a, b = rng.choice(["x", "z", *names]), rng.choice(["x", "z", *names])
        body.append((f"t{k}", a, b))
        names.append(f"t{k}")
    read = {name for _, a, b in body for name in (a, b)}
    outs = [t for t in names if t not in read] or names[-1:]
    return "\n".join(["size N = 64", "in x : f32[N]", "in z : f32[N]",
                      *(f"out {t} : f32[N]" for t in outs),
                      *(f"{t}[i] = {a}[i] + {b}[i]" for t, a, b in body)]) + "\n"


@pytest.mark.parametrize("seed", [17, 33, 94, 95, 101])
def test_random_element_wise_dags_schedule_in_some_kernel_order(seed: int) -> None:
    """Random element-wise DAGs whose candidates include pairs that need each other
    (`fusion.acyclic` has constraints on each): the optimum's kernels have an order, and
    the schedule validates. Seed 94 was the one of them whose optimum had no order."""
    workload = parse_workload(element_wise_dag(seed), "<test>", f"dag{seed}")
    model = encode(workload, load_hardware("cpu"))
    assert any(c.group == "fusion.acyclic" for c in model.constraints.constraints)
    result = cpsat.solve(model.constraints, 600.0, work_limit_s=60.0)
    assert result.env is not None
    assert validate(materialize(model, result.env), workload).passed


def test_fusion_acyclic_forbids_exactly_the_covers_without_a_kernel_order() -> None:
    """A random element-wise DAG of 12 statements whose candidates form rings of three and
    four: over all 3,440 covers of its statements by candidate kernels, `fusion.acyclic`
    allows a cover exactly when its kernels have an order (`kernel_order`). Before rings
    of any length were listed, covers with rings of four were allowed and had none."""
    workload = parse_workload(element_wise_dag(31, 12, 14), "<test>", "dag31")
    model = encode(workload, load_hardware("cpu"))
    cset = model.constraints
    acyclic = [c for c in cset.constraints if c.group == "fusion.acyclic"]
    assert {c.meaning.split("not all ")[-1] for c in acyclic if "ring" in c.meaning} \
        == {"3", "4"}
    names = [n for n in cset.decisions if is_fusion_decision(n)]
    index = {s.name: i for i, s in enumerate(workload.statements)}
    members = {fusion_decision(k.name): [index[s.name] for s in k.statements]
               for k in model.kernels}
    covers = decompose._exact_covers(cset, names)
    assert len(covers) == 3440
    ordered = allowed = 0
    for values in covers:
        env = dict(zip(names, values, strict=True))
        groups = [members[n] for n in names if env[n]]
        groups += [m for n, m in members.items() if n not in env]  # always their own kernel
        try:
            kernel_order(workload, groups)
            has_order = True
        except nx.NetworkXUnfeasible:
            has_order = False
        allows = all(ex.holds(c.cond, env) for c in acyclic)
        assert allows == has_order, env
        ordered += has_order
        allowed += allows
    assert 0 < ordered < len(covers)
