"""The schedule space: the hierarchy's loop slots, the kernels, and their variables.

A schedule splits every loop dimension of every kernel into one factor per *slot*. The
slots come from the hardware hierarchy, outermost first: a temporal slot for each memory
(a sequential loop over the tiles that move from it into the next memory) and a spatial
slot for each level below the root (a parallel loop over that level's units). On UPMEM:

    H (host, temporal)  R (ranks)  D (DPUs)  M (mram, temporal)  T (tasklets)  Q (wram)

The tile a memory holds is the product of the factors from its own slot inward; the
innermost memory's factor is the compute tile. The root memory's factor is not a
variable: it is ceil(extent / tile below), which is how sizes that do not divide (a prime
length) are covered, with the padding paid in the cost.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from synth.constraints import expr as ex
from synth.constraints.fusion import candidate_groups, needed_outside, online_plan
from synth.constraints.online import ONLINE_PREFIX, OnlinePlan, is_candidate
from synth.deadline import Deadline
from synth.hardware import Hardware
from synth.tiles import lines_of_tiles, named_tile_units, tiled_extent
from synth.vectors import vector_dim, vector_options
from synth.workload import Access, Statement, Workload, accesses


class SlotKind(enum.Enum):
    SPATIAL = "spatial"
    TEMPORAL = "temporal"


@dataclass(frozen=True)
class Slot:
    kind: SlotKind
    name: str  # the level (spatial) or memory (temporal) it belongs to
    symbol: str  # R, D, T for levels; H, M, Q for memories
    level_index: int  # index of the level it sits in

    def __str__(self) -> str:
        return f"{self.kind.value}:{self.name}"


def hierarchy_slots(hw: Hardware) -> tuple[Slot, ...]:
    """The slots of `hw`, outermost first: each level's spatial slot, then its memories."""
    slots: list[Slot] = []
    for index, level in enumerate(hw.levels):
        if not level.is_root:
            assert level.symbol is not None
            slots.append(Slot(SlotKind.SPATIAL, level.name, level.symbol, index))
        for mem in hw.memories:
            if mem.level == level.name:
                slots.append(Slot(SlotKind.TEMPORAL, mem.name, mem.symbol, index))
    if hw.streams:  # the root memory's loops run inside every level's units
        root, *rest = slots
        last_spatial = max(i for i, s in enumerate(rest) if s.kind is SlotKind.SPATIAL)
        slots = [*rest[:last_spatial + 1], root, *rest[last_spatial + 1:]]
    return tuple(slots)


# ---------------------------------------------------------------- kernels


@dataclass(frozen=True)
class TensorUse:
    """One tensor as a kernel touches it: its name, subscripts, and whether it is written."""

    tensor: str
    indices: tuple[str, ...]
    written: bool
    read: bool  # written tensors are also read when they accumulate (read-modify-write)
    local: bool = False  # produced and consumed only inside the kernel: lives in the
    # innermost memory alone and never moves (a fused intermediate)


@dataclass(frozen=True)
class KernelSpec:
    """Statements that share one loop nest."""

    name: str
    statements: tuple[Statement, ...]
    dims: tuple[str, ...]  # loop order at every level: parallel dims first, reductions inner
    extents: Mapping[str, int]
    reduced: tuple[str, ...]  # dims some statement reduces over
    uses: tuple[TensorUse, ...]
    # the online rewrite this kernel runs with (a max consumed inside its own pass)
    online: OnlinePlan | None = None
    # the dimension its register tiles are vectors along on models with vector registers
    # (`synth.vectors.vector_options`: a variant of the same group may take another one)
    vector: str | None = None
    # the tensors it uses that the program lays out as lines of tiles (`lines_of_tiles`)
    lines: frozenset[str] = frozenset()

    def tile_units(self, edge: int) -> dict[str, int]:
        """Each dimension some tensor is tiled along -> elements per tile along it, on a
        model of `edge` x `edge` tiles (`synth.tiles.tile_units`)."""
        return named_tile_units(((u.tensor, u.indices) for u in self.uses), edge, self.lines)

    def spans(self, stmt: Statement) -> bool:
        """Whether `stmt` is a core statement, iterating every loop of the kernel (the
        others, prologue and epilogue, run once per tile of their target). In an online
        kernel, the core is the pass: the statements that iterate its dimension."""
        if self.online is not None:
            return self.online.dim in stmt.dims
        return set(stmt.dims) == set(self.dims)

    @property
    def core(self) -> tuple[Statement, ...]:
        return tuple(s for s in self.statements if self.spans(s))

    @property
    def prologue(self) -> tuple[Statement, ...]:
        """Element-wise statements before the core: `C = 0` before `C += A * B`."""
        first = self.statements.index(self.core[0])
        return self.statements[:first]

    @property
    def epilogue(self) -> tuple[Statement, ...]:
        """Element-wise statements after the core: `u = s - Bias` after `s += Q * kt`."""
        last = self.statements.index(self.core[-1])
        return self.statements[last + 1:]

    def use(self, tensor: str) -> TensorUse:
        return next(u for u in self.uses if u.tensor == tensor)

    def completed(self) -> tuple[tuple[Statement, TensorUse], ...]:
        """Core reductions whose target another statement of the kernel initialises
        (`C = 0`) or reads (an epilogue): their whole reduction must happen inside one
        tile of the target in the innermost memory."""
        return tuple((stmt, self.use(stmt.target)) for stmt in _completed(self))

    def initialised(self, stmt: Statement) -> bool:
        """Whether core reduction `stmt` starts its target tile from the identity in the
        innermost memory (it is completed there and nothing assigned it before)."""
        return (self.spans(stmt) and stmt.op.reduces and not stmt.accumulates
                and stmt.target in {s.target for s in _completed(self)})


def _completed(spec: KernelSpec) -> list[Statement]:
    around = spec.prologue + spec.epilogue if spec.core else ()
    inner = set(spec.online.inner) if spec.online is not None else set()
    return [stmt for stmt in spec.core if stmt.reduced and (
        any(s.target == stmt.target or stmt.target in s.inputs for s in around)
        or set(stmt.reduced) <= inner)]  # online: reduced whole in every compute tile


def kernel_for(statements: Sequence[Statement], workload: Workload | None = None
               ) -> KernelSpec:
    """The kernel that runs `statements` (a legal fusion group, see
    `synth.constraints.fusion`) in one loop nest. With the workload, a tensor the group
    writes that nothing after it reads is local to the kernel."""
    dims: dict[str, int] = {}
    reduced: list[str] = []
    for stmt in statements:
        for dim in stmt.dims:
            dims.setdefault(dim, stmt.extents[dim])
        reduced.extend(d for d in stmt.reduced if d not in reduced)
    order = [d for d in dims if d not in reduced] + reduced
    online = None
    if workload is not None and is_candidate(statements):
        found = online_plan(workload, [workload.statements.index(s) for s in statements])
        assert not isinstance(found, str), found  # candidates are legal groups
        online = found
        order = [d for d in order if d != online.dim] + [online.dim]  # the pass innermost
    spec = KernelSpec(
        name=kernel_name(statements),
        statements=tuple(statements),
        dims=tuple(order),
        extents={d: dims[d] for d in order},
        reduced=tuple(reduced),
        uses=(),
        online=online,
        vector=vector_dim(statements),
    )
    completed = {stmt.target for stmt in _completed(spec)}
    uses = _tensor_uses(statements, workload, completed)
    lines = lines_of_tiles(workload) if workload is not None else frozenset()
    return dataclasses.replace(spec, uses=uses,
                               lines=frozenset(u.tensor for u in uses if u.tensor in lines))



def kernel_name(statements: Sequence[Statement]) -> str:
    """`e_s` for statements e and s fused (the name that variables like `Q.e_s.i` carry)."""
    return "_".join(s.name for s in statements)


def _tensor_uses(statements: Sequence[Statement], workload: Workload | None,
                 completed: set[str]) -> tuple[TensorUse, ...]:
    """Each tensor's use. A reduction `completed` inside one tile of its target starts
    that tile from the identity where it lives, so it reads nothing from outside."""
    uses: dict[str, TensorUse] = {}
    produced: set[str] = set()
    for stmt in statements:
        for acc in _distinct(accesses(stmt.expr)):
            if acc.tensor not in uses and acc.tensor not in produced:
                uses[acc.tensor] = TensorUse(acc.tensor, acc.indices, written=False, read=True)
        if stmt.target not in produced:
            # `+=` and reductions read what they add to, unless the group made it
            read_back = stmt.accumulates or (stmt.op.reduces
                                             and stmt.target not in completed)
            uses[stmt.target] = TensorUse(stmt.target, stmt.indices, written=True,
                                          read=read_back)
        produced.add(stmt.target)
    if workload is not None:
        members = [workload.statements.index(s) for s in statements]
        for name, use in uses.items():
            if (use.written and not use.read and not needed_outside(workload, members, name)
                    and (name in completed or not any(s.reduced for s in statements
                                                      if s.target == name))):
                uses[name] = dataclasses.replace(use, local=True)
    return tuple(uses.values())


def _distinct(items: list[Access]) -> list[Access]:
    return list(dict.fromkeys(items))


def one_kernel_per_statement(workload: Workload) -> tuple[KernelSpec, ...]:
    return tuple(kernel_for([stmt], workload) for stmt in workload.statements)


def candidate_kernels(workload: Workload, deadline: Deadline | None = None,
                      vectors: bool = False) -> tuple[KernelSpec, ...]:
    """Every legal fusion group as a kernel (singletons first); the solver picks a cover.
    With `vectors` (a model whose register tiles are vectors), a group that may run its
    vectors along another dimension (`synth.vectors.vector_options`) is also a second
    kernel, `<group>__<dim>`, right after it. Past `deadline`: `SolveTimeout` (exit 3)."""
    groups = [kernel_for([workload.statements[i] for i in group], workload)
              for group in candidate_groups(workload, deadline)]
    taken = {spec.name for spec in groups}  # a variant named like a group is left out
    kernels: list[KernelSpec] = []
    for spec in groups:
        kernels.append(spec)
        if vectors and spec.online is None:
            variants = (vector_variant(spec, d) for d in vector_options(spec.statements)[1:])
            kernels.extend(v for v in variants if v.name not in taken)
    return tuple(kernels)


def vector_variant(spec: KernelSpec, dim: str) -> KernelSpec:
    """`spec` with its register tiles vectors along `dim`, as kernel `<name>__<dim>`."""
    return dataclasses.replace(spec, name=f"{spec.name}__{dim}", vector=dim)


# ---------------------------------------------------------------- the constraint set


@dataclass(frozen=True)
class NamedConstraint:
    """A condition that belongs to a user-visible group, e.g. `capacity.wram`."""

    group: str
    meaning: str  # one line a user reads, e.g. "kernel y: WRAM tiles fit in 62 KiB"
    cond: ex.Cond


@dataclass(frozen=True)
class ConstraintSet:
    """Everything a backend needs: decisions, definitions, constraints, objective."""

    decisions: Mapping[str, tuple[int, ...]]  # variable -> its candidate values, ascending
    definitions: Mapping[str, ex.Int]  # variable -> term over decisions (and earlier ones)
    constraints: tuple[NamedConstraint, ...]
    objective: ex.Int  # modelled time of the whole program, picoseconds
    breakdown: Mapping[str, ex.Int] = field(default_factory=dict)  # parts of the objective
    # factor term -> the dimension it splits; backends use it only to bound auxiliaries
    groups: Mapping[ex.Int, ex.Group] = field(default_factory=dict)

    def complete(self, decisions: Mapping[str, int]) -> dict[str, int]:
        """All variable values: the decisions plus every definition evaluated."""
        env = dict(decisions)
        for name, term in self.definitions.items():
            env[name] = ex.evaluate(term, env)
        return env

    def violated(self, env: Mapping[str, int]) -> list[NamedConstraint]:
        return [c for c in self.constraints if not _holds(c.cond, env)]

    def floor(self, memo: ex.BoundsMemo | None = None) -> int:
        """A lower bound of the objective (definitions inlined), from the decisions'
        domains alone (`expr.bounds`, no constraint; costs are never negative): it takes
        a millisecond and is within a few times the optimum. `memo` as in `expr.bounds`
        (kept for terms over the same domains)."""
        domains = {name: (values[0], values[-1]) for name, values in self.decisions.items()}
        return max(0, ex.bounds(self.objective, domains, self.groups, memo)[0])


def _holds(cond: ex.Cond, env: Mapping[str, int]) -> bool:
    """A condition that divides by zero (a tile larger than its extent makes a factor
    0) does not hold; the tiling constraint says why."""
    try:
        return ex.holds(cond, env)
    except ZeroDivisionError:
        return False


# ---------------------------------------------------------------- factors


def var_name(symbol: str, kernel: str, dim: str) -> str:
    """The one naming rule for factor variables: `Q.y.i` is kernel y's Q factor of dim i."""
    return f"{symbol}.{kernel}.{dim}"


def fusion_decision(kernel: str) -> str:
    """The one naming rule for fusion decisions: `fuse.e_s` is 1 when kernel e_s is used."""
    return f"{FUSION_PREFIX}{kernel}"


FUSION_PREFIX = "fuse."


def is_fusion_decision(name: str) -> bool:
    """`fuse.<kernel>`, or `online.<kernel>` (a kernel that runs only with the online
    rewrite: its decision says whether the schedule uses it)."""
    return name.startswith((FUSION_PREFIX, ONLINE_PREFIX))


@dataclass(frozen=True)
class Factors:
    """The factor term of every (kernel, dim, slot), each dimension's padded extent, and
    the decision domains behind them."""

    slots: tuple[Slot, ...]
    terms: Mapping[tuple[str, str, int], ex.Int]  # (kernel, dim, slot index) -> term
    extents: Mapping[tuple[str, str], ex.Int]  # (kernel, dim) -> product of all its factors
    domains: Mapping[str, tuple[int, ...]]
    groups: Mapping[ex.Int, ex.Group]
    # factor variable -> why the space gives it the one value 1 (said by `--fix` errors)
    pinned: Mapping[str, str] = field(default_factory=dict)

    def of(self, kernel: str, dim: str, slot: int) -> ex.Int:
        return self.terms[(kernel, dim, slot)]


def build_factors(kernels: Sequence[KernelSpec], hw: Hardware, slots: tuple[Slot, ...],
                  named: Mapping[str, Collection[int]] | None = None) -> Factors:
    """The factors of every kernel's dimensions. `named` (level name -> unit counts)
    adds counts a request names (`--fix D=60`) to that level's spatial candidates."""
    terms: dict[tuple[str, str, int], ex.Int] = {}
    extents: dict[tuple[str, str], ex.Int] = {}
    domains: dict[str, tuple[int, ...]] = {}
    groups: dict[ex.Int, ex.Group] = {}
    pinned: dict[str, str] = {}
    root_slot = root_temporal_slot(slots, hw)
    for kernel in kernels:
        units = kernel.tile_units(hw.compute.tiling.edge) if hw.compute.tiling.edge else {}
        for dim in kernel.dims:
            extent = tiled_extent(kernel.extents[dim], units.get(dim, 1))  # whole tiles
            largest = _largest_padding(extent, hw)
            values = {index: _candidates(slot, hw, extent, largest, (named or {}).get(
                slot.name, ())) for index, slot in enumerate(slots) if index != root_slot}
            innermost = len(slots) - 1
            values[innermost] = whole_vector_candidates(kernel, dim, hw, values[innermost],
                                                        extent)
            for index in _online_candidates(kernel, dim, slots, values,
                                            vector_width(kernel, hw), extent,
                                            _merging_slots(slots, hw)):
                pinned[var_name(slots[index].symbol, kernel.name, dim)] = (
                    unsplit_reason(kernel, slots[index].name))
            ext = _variable(domains, f"ext.{kernel.name}.{dim}",
                            padded_extents(extent, list(values.values())))
            for index, candidates in values.items():
                name = var_name(slots[index].symbol, kernel.name, dim)
                terms[(kernel.name, dim, index)] = _variable(domains, name, candidates)
            inner = ex.mul(*(terms[(kernel.name, dim, s)] for s in range(len(slots))
                             if s != root_slot))
            terms[(kernel.name, dim, root_slot)] = ex.exact_div(ext, inner)
            extents[(kernel.name, dim)] = ext
            members = tuple(terms[(kernel.name, dim, i)] for i in range(len(slots)))
            levels = tuple((s.name, hw.levels[s.level_index].count_max)
                           if s.kind is SlotKind.SPATIAL else None for s in slots)
            group = ex.Group(f"{kernel.name}.{dim}", extent, members, levels, ext)
            for member in members:
                if not isinstance(member, ex.Const):
                    groups[member] = group
    return Factors(slots, terms, extents, domains, groups, pinned)


def _merging_slots(slots: tuple[Slot, ...], hw: Hardware) -> frozenset[int]:
    """Spatial slots whose units share a memory below the root, under a memory tile
    (`combines.device_combine_slots`), or hand their partials to the host over its pushes
    (`combines.host_merges`): the only ones an online pass may split across."""
    from synth.constraints.combines import host_merges, shared_memory  # build on this
    return frozenset(
        i for i, s in enumerate(slots) if s.kind is SlotKind.SPATIAL
        and ((shared_memory(hw, s.level_index) is not None
              and any(o.kind is SlotKind.TEMPORAL for o in slots[:i]))
             or host_merges(hw, s.level_index)))


def _online_candidates(kernel: KernelSpec, dim: str, slots: tuple[Slot, ...],
                       values: dict[int, tuple[int, ...]], width: int, extent: int,
                       merging: frozenset[int] = frozenset()) -> list[int]:
    """An online kernel's inner dimensions have no loops (whole in the compute tile) and
    its pass is split only across units that merge their running statistics on the
    device or hand them to the host's merge (`merging`, `online_terms.split_constraints`):
    the other factors are 1 from the start (the group `online` states the rest), which
    keeps its space small. On a CPU (`width`: lanes of a vector register) a step's block
    of the pass is whole vectors within the pass's `extent` where it can be: the maximum,
    exponentials and row sums run in vectors along it (`online.step_vector`)."""
    plan = kernel.online
    if plan is None:
        return []
    innermost = len(slots) - 1
    unsplit = []
    read_whole = bool(_statistics_read_whole(kernel))  # by its epilogue: never split
    for index in values:
        inner = dim in plan.inner and index != innermost
        whole = (dim == plan.dim and slots[index].kind is SlotKind.SPATIAL
                 and (index not in merging or read_whole))
        if inner or whole:
            values[index] = (1,)
        if whole:
            unsplit.append(index)
    if dim == plan.dim:
        values[innermost] = whole_vectors(values[innermost], width, extent)
    return unsplit


def _statistics_read_whole(kernel: KernelSpec) -> list[str]:
    """The online kernel's running statistics that another of its statements reads
    whole (an epilogue's `O = o / l`: `fusion.complete` keeps their reduction in one
    tile, so no unit holds a share of the pass)."""
    assert kernel.online is not None
    stats = {kernel.online.target, *kernel.online.rescaled}
    return [stmt.target for stmt, _ in kernel.completed() if stmt.target in stats]


def unsplit_reason(kernel: KernelSpec, level: str) -> str:
    """Why an online kernel's pass is not split across the units of `level` (the group
    `online.split`, `online_terms.split_constraints`, says the same)."""
    assert kernel.online is not None
    read = _statistics_read_whole(kernel)
    if read:
        return (f"online.split: kernel {kernel.name}: the pass over {kernel.online.dim} "
                f"runs in one {level} unit (the kernel reads {', '.join(read)} whole after "
                f"it: fusion.complete)")
    return (f"online.split: kernel {kernel.name}: the pass over {kernel.online.dim} runs "
            f"in one {level} unit (running statistics are merged across units only on "
            f"the device, where the units share a memory below the root: UPMEM tasklets, "
            f"or on the host, where their partials come back over its pushes: UPMEM ranks "
            f"and DPUs)")


def vector_width(kernel: KernelSpec, hw: Hardware) -> int:
    """Elements per vector register of the kernel's statements (the most lanes among
    their dtypes), on models whose innermost tiles are vector registers; else 1."""
    if not hw.compute.vector_tiles:
        return 1
    return max((hw.compute.lanes.get(s.dtype.value, 1) for s in kernel.statements), default=1)


def whole_vector_candidates(kernel: KernelSpec, dim: str, hw: Hardware,
                            values: tuple[int, ...], extent: int) -> tuple[int, ...]:
    """The register tile along the kernel's vector dimension is whole vectors when it can
    be (`compute.vector_tiles`): only its multiples of the width stay candidates, as in
    BLIS's micro-kernels. A tile of scalars is never faster where vectors fit, and the
    choice made here keeps the cost model free of a vectorised-or-not case split. A
    dimension too short for one vector keeps its candidates (and runs scalar)."""
    if dim != kernel.vector:
        return values
    return whole_vectors(values, vector_width(kernel, hw), extent)


def whole_vectors(values: tuple[int, ...], width: int, extent: int) -> tuple[int, ...]:
    """The candidates that are whole vectors of `width` lanes within the `extent` (a
    larger one would leave no padded extent it divides: `padded_extents`); all of them
    when none is (the dimension is shorter than a vector, or scalar)."""
    if width <= 1:
        return values
    return tuple(v for v in values if v % width == 0 and v <= extent) or values


def _variable(domains: dict[str, tuple[int, ...]], name: str,
              values: tuple[int, ...]) -> ex.Int:
    """A decision over `values`, or the constant when there is only one."""
    if len(values) == 1:
        return ex.const(values[0])
    domains[name] = values
    return ex.Var(name)


def root_temporal_slot(slots: tuple[Slot, ...], hw: Hardware) -> int:
    """The slot of the root memory's loop, whose factor is the extent over the others."""
    return next(i for i, s in enumerate(slots) if s.name == hw.root_memory.name
                and s.kind is SlotKind.TEMPORAL)


def padded_extents(extent: int, candidates: Sequence[Collection[int]]) -> tuple[int, ...]:
    """What a dimension may be padded to: the extent rounded up to a multiple of a
    product of the other slots' candidate factors (each product that fits the extent).
    Tiles divide the padded extent, so a dimension with no useful divisors (a prime), or
    split across a count of units that does not divide it (60 DPUs, as PrIM pads for
    them), is still split evenly; the padding is paid for in the cost."""
    products = {1}
    for values in candidates:
        products = {p * v for p in products for v in values if p * v <= extent}
    return tuple(sorted({-(-extent // q) * q for q in products}))


def _largest_padding(extent: int, hw: Hardware) -> int:
    """The largest value the power-of-two candidates of a factor reach: the extent
    rounded up to a power of two times 1 or a level's unit count."""
    steps = {1 << k for k in range(extent.bit_length())}
    for level in hw.levels:
        steps |= {level.count_max << k for k in range(extent.bit_length())}
    return max(-(-extent // q) * q for q in steps if q <= extent)


def _candidates(slot: Slot, hw: Hardware, extent: int, largest: int,
                named: Collection[int] = ()) -> tuple[int, ...]:
    """Values a factor may take: divisors of the extent and powers of two, and for a
    spatial slot also the level's full count and every count the request names (with
    its divisors, so that the units can be split over several dimensions), all capped
    by the level's maximum.

    Divisors give exact tilings; powers of two, full counts and named counts give
    padded ones (a prime extent, 60 DPUs). Other counts are left out of the space:
    they are rarely better and multiply the search (every count of every level made
    attention on upmem 40x slower to prove optimal)."""
    values = set(divisors(extent)) | set(powers_of_two(largest))
    if slot.kind is SlotKind.SPATIAL:
        limit = hw.levels[slot.level_index].count_max
        values |= {d for n in named if 1 <= n <= limit for d in divisors(n)}
        values = {v for v in values if v <= min(limit, largest)} | {min(limit, largest)}
    return tuple(sorted(values))


def divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def powers_of_two(limit: int) -> list[int]:
    return [1 << k for k in range(limit.bit_length()) if (1 << k) <= limit]
