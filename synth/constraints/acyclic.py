"""`fusion.acyclic`: no candidate kernels chosen together that no order could run.

Each candidate kernel is convex on its own (`fusion.py`), yet a set of them can still have
no order that respects the dependences, and then the schedule cannot run at all:

- two can each need a result of the other first: a statement of each reaches one of the
  other through the dependence graph, whatever runs in between (t1_y#1 and t0_t2_t3 of
  fuzz seed 97: t3 reads t1, y#1 reads t2). Never both;
- more can need each other's results in a ring, each reading a result of the one before
  it (a_out_a_in, b_out_b_in, c_out_c_in where b_in reads a_out, c_in b_out and a_in
  c_out), possibly through kernels that are always chosen. Never all of a ring.

The constraints are complete: if the chosen kernels (disjoint, they cover the statements)
had no order, the graph of kernels, an edge where one reads a result of another, would
have a cycle; a simple one is a ring of disjoint kernels, each reading a result of the
one before, no two of them a pair excluded already, and three or more (two would be such
a pair, or a candidate that is not convex). Every such ring is listed (`rings`), so no
cycle is left for `Model.selected` to fail on.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence

import networkx as nx

from synth.constraints import expr as ex
from synth.constraints.fusion import check_deadline, dependence_graph
from synth.constraints.space import KernelSpec, NamedConstraint
from synth.deadline import Deadline
from synth.workload import Workload

STEPS_PER_CHECK = 4096  # ring search steps between looks at the deadline


def acyclic_constraints(workload: Workload, kernels: Sequence[KernelSpec],
                        chosen: Mapping[str, ex.Int], deadline: Deadline | None = None
                        ) -> list[NamedConstraint]:
    """The pairs of candidates (those with a decision in `chosen`) and the rings of
    kernels that no order could run, each as a constraint that not all of it is chosen.
    A ring may pass through kernels that are always chosen (a statement no other
    candidate runs): softmax's `m`, the transformer block's `k` and `v`. Past `deadline`
    while listing the rings: `SolveTimeout` (exit 3)."""
    graph = dependence_graph(workload)
    index = {stmt.name: i for i, stmt in enumerate(workload.statements)}
    # every kernel can be on a ring: those always chosen (the only candidate for their
    # statements) link the others as well; only the deciding ones can be left out
    nodes = [k.name for k in kernels]
    deciding = [name for name in nodes if isinstance(chosen[name], ex.Var)]
    members = {k.name: frozenset(index[s.name] for s in k.statements) for k in kernels}
    running: dict[int, list[str]] = {i: [] for i in graph}  # statement -> its kernels
    for name in nodes:
        for stmt in members[name]:
            running[stmt].append(name)

    def others(stmts: set[int], name: str) -> list[str]:
        """The kernels apart from `name`, disjoint from it, that run one of `stmts`, in
        the kernels' order."""
        found = {other for i in stmts for other in running[i]
                 if not members[other] & members[name]}
        return [other for other in nodes if other in found]

    below = {i: nx.descendants(graph, i) for i in graph}
    # kernels a statement of each reaches; those one of each reads a result of directly
    reaches = {name: set(others(set().union(*(below[i] for i in members[name])), name))
               for name in nodes}
    feeds = {name: others(set().union(*(graph.successors(i) for i in members[name])), name)
             for name in nodes}
    mutual = {name: {other for other in reaches[name] if name in reaches[other]}
              for name in nodes}
    out = []
    for a, b in itertools.combinations(deciding, 2):
        if b in mutual[a]:
            # fuse.a = 1 -> fuse.b = 0, and fuse.b = 1 -> fuse.a = 0
            out.append(NamedConstraint(
                "fusion.acyclic", f"kernels {a} and {b} each need a result of the other "
                f"first: not both", ex.Cmp(ex.add(chosen[a], chosen[b]), "<=", ex.ONE)))
    for ring in rings(nodes, members, feeds, mutual, deadline):
        # all of the ring -> no first kernel among them; any fewer leave one out (a
        # kernel always chosen counts as 1)
        out.append(NamedConstraint(
            "fusion.acyclic", f"kernels {_listed(ring)} need each other's results in a "
            f"ring: not all {len(ring)}",
            ex.Cmp(ex.add(*(chosen[name] for name in ring)), "<=", ex.const(len(ring) - 1))))
    return out


def rings(names: Sequence[str], members: Mapping[str, frozenset[int]],
          feeds: Mapping[str, Sequence[str]], mutual: Mapping[str, set[str]],
          deadline: Deadline | None = None) -> list[tuple[str, ...]]:
    """Every ring of three or more kernels, each in `feeds` of the one before it,
    pairwise disjoint (`members`), no two of them in `mutual` (such a pair is excluded on
    its own). Each ring once, from its first kernel in `names`, in the order found.

    A ring lies in one strongly connected component of the `feeds` graph, and from its
    first kernel every other one reaches back to it through kernels after it: the
    depth-first search from each kernel steps only there, so a graph without rings
    (every built-in's) costs one pass over its edges."""
    order = {name: k for k, name in enumerate(names)}
    graph = nx.DiGraph()
    graph.add_nodes_from(names)
    graph.add_edges_from((a, b) for a in names for b in feeds[a])
    found: list[tuple[str, ...]] = []
    steps = 0
    for component in nx.strongly_connected_components(graph):
        if len(component) < 3:
            continue
        for first in sorted(component, key=order.__getitem__):
            later = graph.subgraph(n for n in component if order[n] >= order[first])
            back = nx.ancestors(later, first)
            stack: list[tuple[str, ...]] = [(first,)]
            while stack:
                path = stack.pop()
                used = frozenset().union(*(members[n] for n in path))
                for nxt in reversed(feeds[path[-1]]):
                    steps += 1
                    if steps % STEPS_PER_CHECK == 0:
                        check_deadline(deadline, "listing the rings of fused kernels")
                    if nxt == first and len(path) > 2:
                        found.append(path)
                    elif (nxt in back and not members[nxt] & used
                          and not mutual[nxt].intersection(path)):
                        stack.append((*path, nxt))
    return sorted(found, key=lambda ring: [order[n] for n in ring])


def _listed(names: Sequence[str]) -> str:
    """'a, b and c'."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
