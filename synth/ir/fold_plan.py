"""Which sequential reduction loops the interpreter (`synth.ir.interpret`) may run as one
batched step: `fold_plan` shows, from the loop nest alone, that running a loop's
iterations at once computes what running them in turn does (see `fold_plan`'s rules:
disjoint slabs, accumulators and relays), and `reorderable` when folding contributions
in any order gives the same bits."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from synth.ir.nodes import (
    Affine,
    Alloc,
    BufferDecl,
    Combine,
    Compute,
    Fill,
    Kernel,
    Load,
    Loop,
    LoopKind,
    Node,
    OnlineCombine,
    Rescale,
    Running,
    Store,
    walk,
)
from synth.workload import DType, ReduceOp, Statement, Workload


def all_loops(nodes: tuple[Node, ...]) -> list[Loop]:
    """Every loop of `nodes`, outer before inner, in program order."""
    out: list[Loop] = []
    for node in nodes:
        if isinstance(node, Loop):
            out.append(node)
            out.extend(all_loops(node.body))
    return out


@dataclass(frozen=True)
class FoldPlan:
    """How a sequential loop over a reduced dimension runs as one batched step."""

    promoted: frozenset[str]  # buffers allocated in its body that all iterations share


_WRITES = {"load-dst", "store-dst", "fill", "compute-out", "combine-target"}


def fold_plans(kernel: Kernel, decls: Mapping[str, BufferDecl], workload: Workload,
               carried: set[str]) -> dict[int, FoldPlan]:
    """The plan of each reduction loop of `kernel` that can batch, by id(loop). A loop
    batches only if every reduction loop inside it can too (see `Machine.how`)."""
    plans: dict[int, FoldPlan] = {}
    for loop in reversed(all_loops(kernel.body)):  # inner loops first
        if loop.var.kind is LoopKind.PARALLEL or loop.var.dim not in carried:
            continue
        inner = [n for n in walk(loop.body) if isinstance(n, Loop)
                 and n.var.kind is LoopKind.SEQUENTIAL and n.var.dim in carried]
        plan = fold_plan(loop, decls, workload) \
            if all(id(n) in plans for n in inner) else None
        if plan is not None:
            plans[id(loop)] = plan
    return plans


def fold_plan(loop: Loop, decls: Mapping[str, BufferDecl], workload: Workload
              ) -> FoldPlan | None:
    """A plan when running `loop`'s iterations at once computes what running them in turn
    does, else None.

    Buffers allocated in the body belong to one iteration (they get the loop's grid
    axis). Each buffer from outside that the body writes must be either
    - *disjoint*: only loaded into and stored from tiles that lie, along one axis, in a
      slab of the loop's step that each iteration owns (`_slab`): no iteration touches
      what another one does; or
    - an *accumulator*: only the target of reducing computes (never an operand), at a
      place that does not depend on the loop, and the source and destination of relays.
    A *relay* is a buffer allocated in the body at a place that does not depend on the
    loop, loaded from an accumulator or relay right after its allocation, stored back to
    it later in the same block, and in between only accumulated into and relayed, with
    nothing else touching its source. Every iteration then does `acc = acc op part`
    through the same places, so one tile of each relay for all iterations (*promoted*)
    ends with the same value when the parts are folded in iteration order (`fold`). One
    operator per accumulated tensor, and one compute into it where the order matters.
    """
    if any(isinstance(n, Running | Rescale | OnlineCombine) for n in walk(loop.body)):
        return None  # an online step depends on the one before (a merge: not folded)
    var = loop.var.name
    inner = {n.var.name: n.var.extent for n in walk(loop.body) if isinstance(n, Loop)}
    uses: dict[str, list[tuple[Node, str]]] = defaultdict(list)
    for node in walk(loop.body):
        for name, kind in _uses(node):
            uses[name].append((node, kind))
    local = {name for name, found in uses.items() if any(k == "alloc" for _, k in found)}
    written = {name for name, found in uses.items() if any(k in _WRITES for _, k in found)}
    relays = _relays(loop.body, var, uses, workload, local)
    accumulators = set(relays)
    for name in sorted(written - local):
        if all(_accumulates(node, kind, relays, var, workload) for node, kind in uses[name]):
            accumulators.add(name)
        elif not _disjoint(uses[name], relays, decls, var, inner):
            return None
    if not _one_operator(loop.body, accumulators, decls, workload):
        return None
    return FoldPlan(frozenset(relays))


def _uses(node: Node) -> list[tuple[str, str]]:
    """The buffers one node touches, each with how."""
    if isinstance(node, Alloc):
        return [(node.buffer.name, "alloc")]
    if isinstance(node, Load):
        return [(node.dst, "load-dst"), (node.src, "load-src")]
    if isinstance(node, Store):
        return [(node.src, "store-src"), (node.dst, "store-dst")]
    if isinstance(node, Fill):
        return [(node.buffer, "fill")]
    if isinstance(node, Compute):
        return [(node.out, "compute-out")] + [(b, "operand") for b in node.operands.values()]
    if isinstance(node, Combine):
        return [(node.target, "combine-target"), (node.partials, "combine-partials")]
    return []


def _accumulates(node: Node, kind: str, relays: set[str], var: str,
                 workload: Workload) -> bool:
    """Whether one use of an accumulator or relay keeps it one: a relay moving its value,
    or a reducing compute into it (not reading it) at a place the loop `var` leaves."""
    if kind == "load-src":
        return isinstance(node, Load) and node.dst in relays
    if kind == "store-dst":
        return isinstance(node, Store) and node.src in relays
    if kind != "compute-out" or not isinstance(node, Compute):
        return False
    stmt = workload.statement(node.statement)
    place = [node.origin[node.dims.index(d)] for d in stmt.indices]
    return (stmt.op.reduces and node.out not in node.operands.values()
            and all(var not in dict(o.terms) for o in place))


def _alloc_sites(nodes: tuple[Node, ...]) -> Iterator[tuple[tuple[Node, ...], int]]:
    """Every alloc, as the block it is in and its position there."""
    for position, node in enumerate(nodes):
        if isinstance(node, Alloc):
            yield nodes, position
        elif isinstance(node, Loop):
            yield from _alloc_sites(node.body)


def _relays(body: tuple[Node, ...], var: str, uses: Mapping[str, list[tuple[Node, str]]],
            workload: Workload, local: set[str]) -> set[str]:
    """The relays of a loop body (see `fold_plan`): the buffers with a relay's shape whose
    uses inside keep them relays, given which others are (a fixed point)."""
    windows = {}
    for nodes, position in _alloc_sites(body):
        window = _relay_window(nodes, position, var, uses)
        if window is not None:
            windows[window[0]] = window[1:]
    relays = set(windows)
    while True:
        broken = {name for name, (source, inside) in windows.items() if name in relays
                  and ((source in local and source not in relays)
                       or not all(_accumulates(node, kind, relays, var, workload)
                                  for node in inside
                                  for used, kind in _uses(node) if used == name))}
        if not broken:
            return relays
        relays -= broken


def _relay_window(nodes: tuple[Node, ...], position: int, var: str,
                  uses: Mapping[str, list[tuple[Node, str]]]
                  ) -> tuple[str, str, list[Node]] | None:
    """For a buffer allocated at `nodes[position]` with a relay's shape: its name, its
    source and the nodes between its load and its store; None without that shape."""
    alloc = nodes[position]
    assert isinstance(alloc, Alloc)
    name = alloc.buffer.name
    if any(v == var for o in alloc.buffer.origin for v, _ in o.terms):
        return None  # its place moves with the loop
    load = nodes[position + 1] if position + 1 < len(nodes) else None
    if not isinstance(load, Load) or load.dst != name:
        return None
    back = Store(name, load.src)
    end = next((j for j in range(position + 2, len(nodes)) if nodes[j] == back), None)
    if end is None:
        return None
    inside = list(walk(nodes[position + 2:end]))
    within = sum(used == name for node in inside for used, _ in _uses(node))
    if len(uses[name]) != 3 + within:  # the alloc, load, store and what lies between
        return None
    if any(used == load.src for node in inside for used, _ in _uses(node)):
        return None
    return name, load.src, inside


def _disjoint(found: list[tuple[Node, str]], relays: set[str],
              decls: Mapping[str, BufferDecl], var: str, inner: Mapping[str, int]) -> bool:
    """Whether every use of an outer buffer moves a tile of an iteration's own slab."""
    tiles = []
    for node, kind in found:
        if kind == "load-src" and isinstance(node, Load) and node.dst not in relays:
            tiles.append(decls[node.dst])
        elif kind == "store-dst" and isinstance(node, Store) and node.src not in relays:
            tiles.append(decls[node.src])
        else:
            return False
    return any(_slab([(t.origin[axis], t.shape[axis]) for t in tiles], var, inner)
               for axis in range(len(tiles[0].origin)))


def _slab(tiles: list[tuple[Affine, int]], var: str, inner: Mapping[str, int]) -> bool:
    """Whether, along one axis, every tile lies in its iteration's slab of the loop `var`:
    the same coefficient of `var` and the same terms of loops outside, and a reach over
    the loops inside (plus the tile) shorter than that coefficient, so slabs never meet."""
    steps, outers, lows, highs = set(), set(), [], []
    for origin, size in tiles:
        coeffs = dict(origin.terms)
        steps.add(coeffs.pop(var, 0))
        outers.add(tuple(sorted((v, c) for v, c in coeffs.items() if v not in inner)))
        spread = [(c, inner[v] - 1) for v, c in coeffs.items() if v in inner]
        lows.append(origin.const + sum(c * n for c, n in spread if c < 0))
        highs.append(origin.const + sum(c * n for c, n in spread if c > 0) + size - 1)
    step = steps.pop() if len(steps) == 1 else 0
    return step > 0 and len(outers) == 1 and max(highs) - min(lows) < step


def _one_operator(body: tuple[Node, ...], accumulators: set[str],
                  decls: Mapping[str, BufferDecl], workload: Workload) -> bool:
    """Each accumulated tensor gets one operator, and one compute where order matters."""
    by_tensor: dict[str, list[Statement]] = defaultdict(list)
    for node in walk(body):
        if isinstance(node, Compute) and node.out in accumulators:
            by_tensor[decls[node.out].tensor].append(workload.statement(node.statement))
    return all(len({s.op for s in stmts}) == 1 and (len(stmts) == 1 or reorderable(stmts[0]))
               for stmts in by_tensor.values())


def reorderable(stmt: Statement) -> bool:
    """Whether folding a statement's contributions in any order gives the same bits:
    integer + and * wrap modulo 2**n in any order; max and min of floats, or into a target
    that holds every int32 contribution, are exact. Float + and * round differently."""
    if stmt.op in (ReduceOp.ADD, ReduceOp.MUL):
        return not stmt.dtype.is_float
    return stmt.dtype.is_float or stmt.dtype is DType.I32
