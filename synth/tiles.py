"""Tiled compute (Tenstorrent): the `tile` and `[compute.dst]` keys of a hardware model.

A model with `tile = 32` stores data in 32x32 tiles: the compute tile (the block one core
holds in L1) of every dimension a tensor is tiled along is a multiple of the tile edge.
`[compute.dst]` gives the DST register file's capacity in tiles per dtype for each sync
mode; `sync` picks the mode (`half`, tt-metal's default double-buffered DST, or `full`).
The constraint family that uses them is `synth.constraints.dst`.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from synth.limits import MAX_SIZE
from synth.workload import Workload

SYNC_MODES = ("half", "full")
DST_KEYS = ("sync", *SYNC_MODES)
MAX_TILE_EDGE = 4096  # a tile edge past this is a typo, not a tile


@dataclass(frozen=True)
class Tiling:
    """`edge` x `edge` tiles (0: the model does not tile), DST tiles per dtype."""

    edge: int = 0
    sync: str = "half"
    dst: Mapping[str, int] = field(default_factory=dict)

    def dst_tiles(self, dtype: str) -> int | None:
        return self.dst.get(dtype)


def parse_tiling(compute: Mapping[str, Any], dtypes: tuple[str, ...], where: Any) -> Tiling:
    """Read `tile` and `dst` from a `[compute]` table; `where` names errors (hwfile._Where)."""
    edge = compute.get("tile", 0)
    if isinstance(edge, bool) or not isinstance(edge, int) or not 0 <= edge <= MAX_TILE_EDGE \
            or edge & (edge - 1):
        raise where.at("tile").error(f"expected a power of two in 1..{MAX_TILE_EDGE} (the "
                                     f"tile edge in elements), got {edge!r}")
    if "dst" not in compute:
        return Tiling(edge=edge)
    if not edge:
        raise where.at("dst").error("a DST register file needs tiled data: set tile too")
    table = compute["dst"]
    if not isinstance(table, dict):
        raise where.at("dst").error(f"expected a table, got {table!r}")
    unknown = [k for k in table if k not in DST_KEYS]
    if unknown:
        raise where.at("dst").error(f"unknown key {unknown[0]!r} (expected {', '.join(DST_KEYS)})")
    sync = table.get("sync", "half")
    if sync not in SYNC_MODES or sync not in table:
        given = ", ".join(m for m in SYNC_MODES if m in table)
        raise where.at("dst", "sync").error(
            f"expected one of the modes the table gives ({given}), got {sync!r}")
    return Tiling(edge=edge, sync=sync, dst=_dst_table(table[sync], dtypes, where.at("dst", sync)))


def _dst_table(value: object, dtypes: tuple[str, ...], where: Any) -> dict[str, int]:
    if not isinstance(value, dict):
        raise where.error(f"expected a table of dtype = tiles, got {value!r}")
    out: dict[str, int] = {}
    for dtype, tiles in value.items():
        if dtype not in dtypes:
            raise where.error(f"unknown dtype {dtype!r} (expected one of {', '.join(dtypes)})")
        if isinstance(tiles, bool) or not isinstance(tiles, int) or not 1 <= tiles <= MAX_SIZE:
            raise where.at(dtype).error(f"expected a count of tiles >= 1, got {tiles!r}")
        out[dtype] = tiles
    return out



def is_statistic(indices: Sequence[str], others: Iterable[Sequence[str]]) -> bool:
    """A tensor of rank r >= 2 indexed as the first r indices of a rank r + 1 access (a
    row statistic of a batched matrix: `m[b, h, i]` of `sc[b, h, i, j]`): like a vector
    of a matrix's rows, a column of tiles, its leading indices batch dimensions."""
    return len(indices) >= 2 and any(len(o) == len(indices) + 1 and
                                     tuple(o[:-1]) == tuple(indices) for o in others)


def tile_units(indices: Iterable[Sequence[str]], edge: int,
               lines: Iterable[Sequence[str]] = ()) -> dict[str, int]:
    """Each index some tensor (given by its subscripts) is tiled along -> elements per tile
    along it: E for the indices of matrices (a vector indexed by one of them, a row's
    statistic, is a column of tiles: tt-lang's row reductions leave it in column 0; one
    indexed by a matrix's last index a row of tiles), E*E for the index of vectors alone
    (32x32 tiles of a flat vector). Not tiled: the batch indices (`batch_indices`).
    `lines`: the subscripts of those tensors the program lays out as a line of tiles
    wherever it uses them (`lines_of_tiles`): E along their last index, the others batch
    indices, in a kernel of vectors alone too."""
    subscripts = [tuple(ix) for ix in indices]
    lined = {tuple(ix) for ix in lines}
    batch = batch_indices(subscripts, lined)
    in_matrix = ({d for ix in subscripts if len(ix) > 1 for d in ix}
                 | {ix[-1] for ix in lined if ix}) - batch
    in_vector = {ix[0] for ix in subscripts if len(ix) == 1}
    return {d: edge for d in in_matrix} | {d: edge * edge for d in in_vector - in_matrix}


def named_tile_units(tensors: Iterable[tuple[str, Sequence[str]]], edge: int,
                     lines: Collection[str]) -> dict[str, int]:
    """`tile_units` of a kernel's tensors, given as (name, subscripts); `lines`: the
    names of the program's lines of tiles (`lines_of_tiles`)."""
    named = [(name, tuple(ix)) for name, ix in tensors]
    return tile_units([ix for _, ix in named], edge, [ix for name, ix in named if name in lines])


def lines_of_tiles(workload: Workload) -> frozenset[str]:
    """The tensors laid out as one line of tiles, E elements along each: a vector some
    statement indexes by an index of one of its matrices (a row's statistic, `r[s]` of
    `y[s, d] = xc[s, d] * r[s]`, a column; `g[d]` of it, a row) and a batched row
    statistic (`is_statistic`: `m[b, h, i]` of `sc[b, h, i, j]`), and the vectors a
    statement of vectors over one index uses with one of them. A kernel of such
    tensors alone tiles them so too: its own tiling would be flat E x E tiles of them, not
    the layout the rest of the program reads and writes."""
    out: set[str] = set()
    vectors_alone = []
    for stmt in workload.statements:
        named = stmt.subscripted
        subscripts = [ix for _, ix in named]
        if over_one_index(subscripts):
            vectors_alone.append({name for name, _ in named})
        matrix = {d for ix in subscripts if len(ix) > 1 for d in ix} - batch_indices(subscripts)
        out |= {name for name, ix in named
                if (len(ix) == 1 and ix[0] in matrix) or is_statistic(ix, subscripts)}
    while True:  # a statement of vectors over one index lays them alike
        more = {name for group in vectors_alone if group & out for name in group} - out
        if not more:
            return frozenset(out)
        out |= more


def over_one_index(subscripts: Sequence[Sequence[str]]) -> bool:
    """Whether a statement's tensors (their subscripts, `Statement.subscripted`) are
    vectors over one index (`h[d] = g[d] + 1`): it reads and writes them tile by tile, so
    they share one layout."""
    return len({tuple(ix) for ix in subscripts}) == 1 and len(subscripts[0]) == 1


def batch_indices(subscripts: Sequence[tuple[str, ...]],
                  lines: Collection[tuple[str, ...]] = ()) -> set[str]:
    """The leading indices of tensors of rank 3 or more (all but the last two) and of
    batched row statistics (`is_statistic`, or of rank 2 or more among `lines`: all but
    the last) that no matrix or vector is indexed by: batch and heads. A tensor may hold
    one in between its tiled indices (the transformer's Wq[d, h, e], h a leading index of
    q[h, s, e], d one of xn[s, d]): a block holds one head of it, its heads side by side
    along the columns."""
    stats = [ix for ix in subscripts
             if is_statistic(ix, subscripts) or (len(ix) >= 2 and ix in lines)]
    lead = {d for ix in subscripts if len(ix) >= 3 and ix not in stats for d in ix[:-2]}
    lead |= {d for ix in stats for d in ix[:-1]}
    low = {d for ix in subscripts if len(ix) <= 2 and ix not in stats for d in ix}
    return lead - low


def batch_dims(indices: Iterable[Sequence[str]], edge: int) -> tuple[str, ...]:
    """The indices no tensor is tiled along (`tile_units`): the leading, batch and head,
    indices of tensors of rank 3 or more, in order of first appearance."""
    subscripts = [tuple(ix) for ix in indices]
    units = tile_units(subscripts, edge)
    return tuple(dict.fromkeys(d for ix in subscripts for d in ix if d not in units))


def block_tiles(indices: Sequence[str], block: Mapping[str, int], units: Mapping[str, int]
                ) -> int:
    """Tiles a block of a tensor indexed by `indices` spans (`block`: elements along each
    index; `units`: `tile_units`): one per element of a batch index, whole tiles along the
    tiled ones (a column of tiles: one per E rows), at least one (a scalar)."""
    tiles = 1
    for d in indices:
        unit = units.get(d, 1)
        tiles *= -(-block[d] // unit)
    return tiles


def tiled_extent(extent: int, unit: int) -> int:
    """The extent padded to whole tiles."""
    return -(-extent // unit) * unit
