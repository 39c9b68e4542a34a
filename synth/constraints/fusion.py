"""Which statements may share one loop nest: the candidate kernels of a workload.

Fusion is a decision of the solver, not a pre-pass: this module lists every *legal*
group of statements (singletons included), and `synth.constraints.cost.build_model` gives
each group a 0/1 decision `fuse.<kernel>` with one constraint per statement (it runs in
exactly one chosen kernel). The tiling, capacity and transfer terms of each candidate are
enforced and paid only when it is chosen, so fusion, placement and tiling are decided
together.

A group is legal when (checked on the statement DAG, built with networkx):
- it is connected and *convex*: no path leaves the group and comes back into it (else no
  order of the kernels respects the dependencies);
- its *core* statements iterate every dimension of the group, and share every loop. The
  others (*prologue* before the core, *epilogue* after it) iterate some of those
  dimensions, are element-wise (no reduction, no `+=`), and run once per tile of their
  target, outside the loops they do not iterate: `C = 0` before `C += A * B` (the
  accumulator is initialised where it lives), a transpose feeding a matmul, an
  element-wise chain after one (seed 004);
- every value produced inside the group and consumed inside it is consumed at the point
  that produced it (pointwise), and is not a reduction consumed inside the pass that
  reduces it: a value reduced over a dimension is complete only after the whole pass
  over that dimension (softmax's `m` cannot be fused with `e = exp(x - m)`, which
  iterates the reduced `i` too; an epilogue that does not iterate it runs after the pass,
  and the cost model keeps the reduction inside one tile of its target, see
  `cost.completion_constraints`);
- no statement overwrites a tensor an earlier statement of the group reads.

The one exception to the pass rule is the online-softmax rewrite (`online.py`): a max
consumed inside its own pass through exponentials whose sums can be rescaled.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import networkx as nx

from synth.constraints import online
from synth.deadline import Deadline
from synth.errors import SolveTimeout
from synth.workload import Role, Statement, Workload, accesses

MAX_FUSED = 6  # statements per candidate kernel; longer chains gain little and grow the space


def dependence_graph(workload: Workload) -> nx.DiGraph:
    """Statement index -> later statement index, when the later one reads what the
    earlier writes (or writes it again, or overwrites what the earlier reads)."""
    graph = nx.DiGraph()
    stmts = workload.statements
    graph.add_nodes_from(range(len(stmts)))
    for i, j in itertools.combinations(range(len(stmts)), 2):
        first, later = stmts[i], stmts[j]
        if (first.target in later.inputs or first.target == later.target
                or later.target in first.inputs):
            graph.add_edge(i, j)
    return graph


def illegal_reason(workload: Workload, members: Sequence[int],
                   graph: nx.DiGraph | None = None) -> str | None:
    """Why the statements at `members` cannot share one loop nest, or None if they can."""
    graph = dependence_graph(workload) if graph is None else graph
    group = sorted(set(members))
    stmts = [workload.statements[i] for i in group]
    names = ", ".join(s.name for s in stmts)
    if len(group) > 1 and not nx.is_weakly_connected(graph.subgraph(group)):
        return f"{names} do not depend on each other (nothing to share)"
    outside = _path_through_outside(graph, group)
    if outside is not None:
        return (f"{workload.statements[outside].name} depends on the group and the group "
                f"depends on it, so it would have to run in the middle of the fused pass")
    running = None
    if online.is_candidate(stmts):  # a max consumed inside its own pass
        found = online_plan(workload, group)
        if isinstance(found, str):
            return f"{_pass_reason(stmts)}, and {names} cannot run online: {found}"
        running = found.statement
    else:
        reason = _shape_reason(stmts)
        if reason is not None:
            return reason
    for pos, producer in enumerate(stmts):
        for consumer in stmts[pos + 1:]:
            reason = _edge_reason(producer, consumer, producer.name == running)
            if reason is not None:
                return reason
    return None


def _pass_reason(stmts: Sequence[Statement]) -> str:
    """The first consumer of a reduction inside its own pass, in the plain rule's words."""
    for pos, producer in enumerate(stmts):
        for consumer in stmts[pos + 1:]:
            if producer.reduced and producer.target in consumer.inputs and set(
                    producer.reduced) & set(consumer.dims):
                reason = _edge_reason(producer, consumer)
                if reason is not None:
                    return reason
    return "a reduction is consumed inside its own pass"


def online_plan(workload: Workload, members: Sequence[int]) -> online.OnlinePlan | str:
    """How the group at `members` (an online candidate, `online.is_candidate`) runs with
    the online rewrite, or why it cannot."""
    stmts = [workload.statements[i] for i in sorted(set(members))]
    leaves = {s.target: needed_outside(workload, members, s.target) for s in stmts}
    return online.plan(stmts, leaves)


def _shape_reason(stmts: Sequence[Statement]) -> str | None:
    """Why the group has no core iterating all its dimensions with element-wise
    statements only before and after it, or None."""
    union = {d for s in stmts for d in s.dims}
    core = [k for k, s in enumerate(stmts) if set(s.dims) == union]
    if not core:
        widest = max(stmts, key=lambda s: len(s.dims))
        other = next(s for s in stmts if not set(s.dims) <= set(widest.dims))
        return (f"{widest.name} iterates {_dims(widest.dims)} but {other.name} iterates "
                f"{_dims(other.dims)}: no statement spans the loops they would share")
    for k, stmt in enumerate(stmts):
        if k in core:
            continue
        if stmt.op.reduces or stmt.accumulates:
            return (f"{stmt.name} iterates only {_dims(stmt.dims)} of the fused "
                    f"{_dims(stmts[core[0]].dims)} and accumulates; only element-wise "
                    f"statements run outside the shared loops")
        if core[0] < k < core[-1]:
            return (f"{stmt.name} iterates only {_dims(stmt.dims)} but sits between "
                    f"{stmts[core[0]].name} and {stmts[core[-1]].name}, which share all "
                    f"of {_dims(stmts[core[0]].dims)}")
    return None


def _edge_reason(producer: Statement, consumer: Statement, running: bool = False
                 ) -> str | None:
    """Why `consumer` cannot follow `producer` in one loop nest; `running`: the producer
    is the running maximum of an online group (its consumers are checked by
    `online.plan`)."""
    consumes = producer.target in consumer.inputs or producer.target == consumer.target
    after_pass = running or not set(producer.reduced) & set(consumer.dims)
    if consumes and producer.reduced and not after_pass:
        return (f"{consumer.name} consumes {producer.target}, which {producer.name} "
                f"reduces over {_dims(producer.reduced)}, inside the same pass over "
                f"{_dims(producer.reduced)}")
    if producer.target in consumer.inputs:
        reads = {a.indices for a in accesses(consumer.expr) if a.tensor == producer.target}
        if reads != {producer.indices}:
            return (f"{consumer.name} reads {producer.target} at other points than "
                    f"{producer.name} writes it, which a shared loop nest cannot provide")
    if producer.target == consumer.target and producer.indices != consumer.indices:
        return f"{producer.name} and {consumer.name} write {producer.target} at other points"
    if consumer.target in producer.inputs:
        return f"{consumer.name} overwrites {consumer.target}, which {producer.name} reads"
    return None


def _path_through_outside(graph: nx.DiGraph, group: list[int]) -> int | None:
    members = set(group)
    below = set().union(*(nx.descendants(graph, i) for i in group)) - members
    above = set().union(*(nx.ancestors(graph, i) for i in group)) - members
    both = sorted(below & above)
    return both[0] if both else None


def _dims(dims: Sequence[str]) -> str:
    return ", ".join(dims) if dims else "nothing"


def candidate_groups(workload: Workload, deadline: Deadline | None = None
                     ) -> list[tuple[int, ...]]:
    """Every legal group of statement indices, singletons first, then by size and
    position (deterministic). Past `deadline`: `SolveTimeout` (exit 3)."""
    graph = dependence_graph(workload)
    undirected = graph.to_undirected()
    found: set[tuple[int, ...]] = {(i,) for i in graph.nodes}
    frontier = sorted(found)
    while frontier:
        check_deadline(deadline, "listing the candidate kernels")
        grown: set[tuple[int, ...]] = set()
        for group in frontier:
            if len(group) >= MAX_FUSED:
                continue
            neighbours = set().union(*(undirected[i] for i in group)) - set(group)
            for extra in neighbours:
                candidate = tuple(sorted((*group, extra)))
                if candidate not in found and candidate not in grown:
                    grown.add(candidate)
        # a group can be illegal while a larger one containing it is legal (an outside
        # statement becomes inside), so growth continues through illegal groups
        found |= grown
        frontier = sorted(grown)
    check_deadline(deadline, "listing the candidate kernels")
    legal = [g for g in found if illegal_reason(workload, g, graph) is None]
    return sorted(legal, key=lambda g: (len(g), g))


def check_deadline(deadline: Deadline | None, doing: str) -> None:
    if deadline is not None and deadline.expired():
        raise SolveTimeout(f"the time limit of {deadline.seconds:g} s ran out while {doing}, "
                           f"before any schedule was found")


def needed_outside(workload: Workload, members: Sequence[int], tensor: str) -> bool:
    """Whether a tensor written by the group is read after it by another statement or is
    an output: otherwise it lives only in the innermost memory."""
    if workload.tensors[tensor].role is Role.OUTPUT:
        return True
    inside = set(members)
    return any(tensor in s.inputs or (s.target == tensor and s.accumulates)
               for k, s in enumerate(workload.statements) if k not in inside)


def kernel_order(workload: Workload, groups: Sequence[Sequence[int]]) -> list[int]:
    """Positions of `groups` (a cover of the statements by legal groups) in an order that
    respects every dependence: a topological order of the groups, the earliest first
    statement first when several are ready."""
    graph = dependence_graph(workload)
    owner = {stmt: g for g, members in enumerate(groups) for stmt in members}
    quotient = nx.DiGraph()
    quotient.add_nodes_from(range(len(groups)))
    quotient.add_edges_from((owner[i], owner[j]) for i, j in graph.edges
                            if owner[i] != owner[j])
    return list(nx.lexicographical_topological_sort(quotient, key=lambda g: min(groups[g])))
