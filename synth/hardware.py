"""Hardware models as plain frozen data.

A model is a hierarchy, outermost first: spatial *levels* (host, ranks, DPUs, tasklets; or
system, cores) whose unit counts are fixed or symbolic, and *memories* placed in that
hierarchy. The TOML files that describe built-in models live in `synth/hardware/` and are
read by `synth.hwfile`. All costs are integers in picoseconds so that the solver and the
plain-Python cost model compute exactly the same numbers.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

from synth.errors import InputError
from synth.tiles import Tiling
from synth.workload import DType

# Operation classes a compute table prices, per element. `base` is charged once per
# iteration point (loads, stores, loop overhead); the rest per operation of that class.
OP_CLASSES = ("base", "mov", "add", "mul", "div", "max", "exp", "log", "sqrt", "rsqrt",
              "recip", "tanh")


@dataclass(frozen=True)
class Level:
    """A level of spatial units: each unit of the level above holds `count` of these."""

    name: str
    symbol: str | None  # the count's variable (R, D, T, P); None for the root
    count_min: int
    count_max: int
    # > 1 when units share their parent's pipeline, which needs this many of them to issue
    # one instruction per cycle (UPMEM tasklets: 11). 1 means units are independent.
    issue_share: int = 1
    # time for the units of one parent to meet at a barrier (0: not modelled); what an
    # on-device combine of partial results pays besides the combining itself
    barrier_ps: int = 0
    # time to start the units of one parent and join them again (an OpenMP parallel
    # region), paid each time they start when more than one runs (0: not modelled)
    fork_ps: int = 0
    # more per unit meeting at the barrier (UPMEM tasklets: about 0.5 us each, measured)
    barrier_per_unit_ps: int = 0

    @property
    def is_root(self) -> bool:
        return self.symbol is None


@dataclass(frozen=True)
class TransferRules:
    """Rules for one transfer between a memory and its parent."""

    min_bytes: int = 1
    max_bytes: int | None = None  # larger transfers are split into chunks of at most this
    multiple: int = 1  # a transfer's size is padded up to a multiple of this
    align: int = 1  # byte alignment of both ends of a transfer


@dataclass(frozen=True)
class PushDirection:
    """The cost of one parallel host transfer in one direction (see `Push`)."""

    one_ps_per_byte: int  # a transfer to or from one instance alone
    full_ps_per_byte: int  # the group's shared rate, all its instances in one transfer
    latency_ps: int = 0  # fixed cost of one parallel transfer
    per_unit_ps: int = 0  # more per instance the transfer reaches


@dataclass(frozen=True)
class Push:
    """Transfers between the root memory and a memory below it as parallel pushes
    (UPMEM's `dpu_push_xfer`): one transfer per tensor per unit of `level` (a rank),
    moving every instance's tile below it at once (equal sizes per instance). One push
    takes latency + per_unit x instances + tile bytes x (one - full) + the rank's bytes x
    full (ps per byte); the units of `level` push concurrently, together at most at
    `cap` (ps per byte over all of them; 0: no cap)."""

    level: str
    into: PushDirection  # root -> memory
    out: PushDirection  # memory -> root
    cap_ps_per_byte: int = 0


@dataclass(frozen=True)
class Memory:
    name: str
    level: str  # tiles here belong to one unit of this level (its place in the hierarchy)
    instance_level: str  # one physical instance per unit of this level (shared when outer)
    capacity: int  # bytes per instance
    reserved: int  # bytes per instance that buffers may not use (stacks, runtime)
    symbol: str  # name of the sequential loop at this memory (M for MRAM, Q for WRAM, ...)
    rules: TransferRules  # transfers between this memory and its parent
    latency_ps: int  # fixed cost of one transfer from or to the parent memory
    ps_per_byte: int  # cost per byte of such a transfer
    shared_by: str  # units of this level each own one transfer engine; transfers below serialise
    # transfers run beside compute (caches filled by the hardware while the core computes):
    # the kernel takes the longest of its compute and these transfers, not their sum
    overlap: bool = False
    # filled and kept by the hardware (a cache): a tile stays while the loops around it do
    # not walk its tensor, so it moves again only when it changes (not each time a loop
    # outside the units' starts repeats it, as an explicit copy would)
    cache: bool = False
    # cost per byte written back to the parent, when it differs from a read's (0: the same)
    store_ps_per_byte: int = 0
    # a cache that holds the program's tensors from its previous run (or their producers)
    # when they all fit: nothing moves into it from its parent then (steady state)
    warm: bool = False
    # a cache that keeps the whole of its parent's tile of a tensor when that takes at
    # most half of it: the tiles of it the loops inside meet again move in once per
    # parent tile (`cost.kept_in_cache`)
    keeps: bool = False
    # fixed cost of one transfer back to the parent (None: `latency_ps`); UPMEM mram_write
    write_latency_ps: int | None = None
    # a unit waits for its own transfers into this memory (UPMEM mram_read): only other
    # units' work hides them, so double buffering buys nothing and is not offered
    blocking: bool = False
    # transfers from the root memory as parallel pushes (None: latency + bandwidth)
    push: Push | None = None
    # pipeline time of the instructions that issue one transfer (the call, addresses),
    # paid by the issuing unit like compute; priced where transfers block (`blocking`)
    issue_ps: int = 0
    # the share of this memory's transfer time that adds to compute, where it overlaps
    # (`overlap`): register loads and stores are instructions of the same core, which run
    # beside its arithmetic only in part; a cache's fills (which still bound the kernel
    # from below) hide behind compute only in part (cpu_compute.exposed_cost)
    exposed: float = 0.0
    # a cache's associativity (0: not modelled): rows of a tile a power-of-two stride apart
    # share its sets, and at most `ways` of them stay per set (transfers.aliased_moves)
    ways: int = 0
    # a line of a strip of rows that alias in this cache's sets (more rows than stay: a
    # column a line wide walked down its rows, transfers.strip_moves), moved in from the
    # parent: every miss to the one set waits for the last, and a written line's eviction
    # too (0: priced as other lines). Read only, and read or written (in and back out).
    aliased_read_ps: int = 0
    aliased_write_ps: int = 0
    # each contiguous run the C emitter's packs read from the parent through this memory
    # (a row of a packed operand's tile in the pack memory) costs this beyond its bytes:
    # DRAM pages opened, the prefetchers started over (0: runs are free; cost.pack_runs)
    run_latency_ps: int = 0

    @property
    def usable(self) -> int:
        return self.capacity - self.reserved

    @property
    def store_latency_ps(self) -> int:
        return self.latency_ps if self.write_latency_ps is None else self.write_latency_ps


@dataclass(frozen=True)
class Intrinsic:
    """A matrix instruction: C[m, n] += A[m, k] * B[k, n] on an m x n x k block of one
    dtype in `cycles`, on operands packed into blocks of its shape (AIE: 4x8x8 for i8)."""

    m: int
    n: int
    k: int
    cycles: float  # per instruction (one m x n x k block)
    pack_cycles: float  # per element of an operand tile laid out into blocks

    def point_ps(self, clock_hz: int) -> int:
        """Picoseconds per multiply-accumulate (one iteration point) when packed."""
        return max(1, round(self.cycles / (self.m * self.n * self.k) * 1e12 / clock_hz))

    def pack_ps(self, clock_hz: int) -> int:
        return round(self.pack_cycles * 1e12 / clock_hz)


# the operation classes that run on the divider (`Compute.divider_lanes`)
DIVIDER_OPS = frozenset({"div", "sqrt", "rsqrt", "recip"})


@dataclass(frozen=True)
class Compute:
    """The cost of arithmetic on one unit of a level."""

    clock_hz: int
    cycles: Mapping[str, Mapping[str, float]]  # dtype name -> op class -> cycles per instruction
    # SIMD width: elements of a dtype one instruction handles (absent: 1, scalar)
    lanes: Mapping[str, int] = field(default_factory=dict)
    # dtype name -> the matrix instruction for a contraction in it (absent: none)
    intrinsics: Mapping[str, Intrinsic] = field(default_factory=dict)
    # data in tiles and a DST register file (Tenstorrent; `synth.tiles`); default: neither
    tiling: Tiling = field(default_factory=Tiling)
    # the innermost memory's tiles are the vector registers: a statement runs in vector
    # instructions only when its tile along the vector dimension is whole vectors, else
    # one element per instruction (synth.constraints.roofline)
    vector_tiles: bool = False
    # a multiply feeding an add costs one instruction (FMA)
    fused_multiply_add: bool = False
    # dtype -> cycles before an accumulator takes its next update (a dependent FMA, or
    # any update where `add_latency` does not say)
    accumulate_latency: Mapping[str, float] = field(default_factory=dict)
    # dtype -> the same for an accumulator updated by one add, max or min (no multiply
    # fused in: a sum or a maximum); absent: `accumulate_latency`
    add_latency: Mapping[str, float] = field(default_factory=dict)
    # vector instructions the out-of-order core looks ahead past a waiting accumulator
    # (0: none; every chain is exposed)
    accumulate_window: int = 0
    # dtype -> elements the divider (div, sqrt, rsqrt, recip) handles at once: an
    # instruction of fewer lanes than the dtype's `lanes` costs its cycles x
    # max(lanes used, these) / `lanes` (absent: the same cycles at every width)
    divider_lanes: Mapping[str, int] = field(default_factory=dict)
    # dtype -> cycles per vector the ISA's gather fills, its lanes from separate lines in
    # L1 (a register tile read along a dimension other than the tensor's last); absent:
    # each lane costs a register's bytes at the register memory's rate
    gather_cycles: Mapping[str, float] = field(default_factory=dict)
    # dtype -> the same for each of several gathers back to back (a register tile of
    # several vectors, gathered one after the other); absent: `gather_cycles`
    grouped_gather_cycles: Mapping[str, float] = field(default_factory=dict)
    # dtype -> cycles per element loaded into every lane of a vector (a broadcasting
    # load: an operand without the kernel's vector dimension); absent: a register's bytes
    # at the register memory's rate
    broadcast_cycles: Mapping[str, float] = field(default_factory=dict)
    # dtype -> cycles per cross-lane shuffle of a fold (the pairwise folds of a vector's
    # lanes, `fold_cost`), which one port executes (absent: a `mov`'s cycles)
    shuffle_cycles: Mapping[str, float] = field(default_factory=dict)

    @property
    def cycle_ps(self) -> int:
        return round(1e12 / self.clock_hz)

    def point_ps(self, ops: Counter[str], dtype: DType, lanes: int | None = None) -> int:
        """Picoseconds for one iteration point doing `ops` in `dtype`, at `lanes` elements
        per instruction (default: the dtype's SIMD lanes)."""
        table = self.cycles.get(dtype.value)
        if table is None:
            raise InputError(f"the hardware model has no compute costs for dtype {dtype.value}")
        width = self.lanes.get(dtype.value, 1)
        used = width if lanes is None else lanes
        divider = self.divider_lanes.get(dtype.value)
        narrow = min(1.0, max(used, divider) / width) if divider else 1.0
        cycles = table["base"] + sum(table[op] * n * (narrow if op in DIVIDER_OPS else 1)
                                     for op, n in ops.items())
        per_element = cycles / used
        return max(1, round(per_element * 1e12 / self.clock_hz))

    def shuffle_ps(self, dtype: DType) -> int:
        """Picoseconds for one cross-lane shuffle of a vector of `dtype` (`shuffle_cycles`;
        absent: a `mov`)."""
        cycles = self.shuffle_cycles.get(dtype.value)
        if cycles is None:
            return self.point_ps(Counter({"mov": 1}), dtype, 1)
        return max(1, round(cycles * 1e12 / self.clock_hz))


@dataclass(frozen=True)
class Hardware:
    name: str
    levels: tuple[Level, ...]  # outermost first; levels[0] is the root, count 1
    memories: tuple[Memory, ...]  # outermost first; memories[0] is at the root, holds tensors
    compute: Compute  # the innermost level's units
    host: Compute  # the root: combines of partial results run here
    launch_ps: int  # fixed cost of starting a kernel once
    source: str = ""  # file it was read from
    # the units fetch their tiles from the root memory themselves, within one launch: the
    # root memory's sequential loops run inside the spatial levels (AIE: shim DMAs)
    streams: bool = False
    # starting a kernel costs this much more per unit of `launch_level` it runs on (and
    # every level above it), e.g. per DPU launched; 0: a fixed cost
    launch_per_unit_ps: int = 0
    launch_level: str | None = None

    @property
    def root(self) -> Level:
        return self.levels[0]

    @property
    def root_memory(self) -> Memory:
        return self.memories[0]

    def level(self, name: str) -> Level:
        for lvl in self.levels:
            if lvl.name == name:
                return lvl
        raise KeyError(name)

    def memory(self, name: str) -> Memory:
        for mem in self.memories:
            if mem.name == name:
                return mem
        raise KeyError(name)

    def parent(self, mem: Memory) -> Memory:
        """The memory `mem` is filled from (the one before it, outward), found by name: a
        copy of `mem` with other rates (`cpu_compute.exposed_cost`) has the same parent."""
        return self.memories[[m.name for m in self.memories].index(mem.name) - 1]

    def level_index(self, name: str) -> int:
        return [lvl.name for lvl in self.levels].index(name)

    def shares_instance(self, mem: Memory, level_index: int) -> bool:
        """Whether the units of the level at `level_index` share one instance of `mem`:
        the level lies inside the memory's instance level and at or above its owner
        (UPMEM: the tasklets of a DPU, under its WRAM)."""
        return self.level_index(mem.instance_level) < level_index <= self.level_index(mem.level)

    @property
    def count_symbols(self) -> tuple[str, ...]:
        return tuple(lvl.symbol for lvl in self.levels if lvl.symbol is not None)
