"""Validation at scale: the schedule run on a smaller instance of its workload.

Validation interprets the loop nest with NumPy (`ir.interpret`). That takes seconds on the
built-ins, about 20 s on the transformer block's 7.1e9 iteration points, and half an hour
on a Llama-7B layer's 4.5e11. Past `MAX_POINTS`, the schedule is run on a smaller
instance instead, with what the schedule chose kept: the fusion, the placements, the
loop orders, the compute tiles (the innermost slot), every tile below the loops that
shrink. The counts of sequential loops shrink first, outermost first (the root loop,
whose count is the extent over the tiles below it; then the caches' loops); where those
cannot take it, the units a dimension is spread over, outermost level first (UPMEM
spreads a row of 2048 over ranks, DPUs and tasklets, with no sequential loop over it).

The sizes are chosen by `plan`: the largest size is divided by its smallest prime factor
while every kernel's loops over it can absorb the division, until the workload has at
most `SHRUNK_POINTS`; `rescale` then gives the schedule's decisions at those sizes, and
`smaller_schedule` checks them against the model encoded there (where they break a
constraint of it, the step before is tried).
The same workload and schedule give the same sizes (no timing is involved).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

from synth.constraints import expr as ex
from synth.constraints.cost import Model
from synth.constraints.space import KernelSpec, SlotKind, root_temporal_slot, var_name
from synth.errors import InputError
from synth.tiles import tiled_extent
from synth.workload import Workload

# iteration points interpreted in full: the largest built-in, gemm2k, has 8.6e9 (1 s:
# its contraction is one batched step); the transformer block 7.1e9 (about 20 s)
MAX_POINTS = 10**10
# what a larger workload is shrunk to: a few seconds of interpreting
SHRUNK_POINTS = 10**9


def points(workload: Workload) -> int:
    """Iteration points of the workload: each statement's iteration space, summed."""
    return sum(math.prod(stmt.extents[d] for d in stmt.dims) for stmt in workload.statements)


def plan(model: Model, env: Mapping[str, int], load: Callable[[dict[str, int]], Workload]
         ) -> list[Workload]:
    """The workload at sizes at which the schedule `env` runs with fewer loop steps, each
    step one size divided by its smallest prime factor, the last with at most `SHRUNK_POINTS`
    iteration points (as near as the loops allow); none when the workload has at most
    `MAX_POINTS` already. The largest size is divided first, if every chosen kernel's
    loops over it can take the division (`_steps`). `load` parses the workload at other
    sizes (InputError where it is not valid)."""
    workload = model.workload
    if points(workload) <= MAX_POINTS:
        return []
    kernels = model.selected(env)
    sizes = dict(workload.sizes)
    current = workload
    found: list[Workload] = []
    while points(current) > SHRUNK_POINTS:
        for name in sorted(sizes, key=lambda n: (-sizes[n], n)):
            trial = {**sizes, name: sizes[name] // smallest_prime(sizes[name])}
            if trial[name] == sizes[name]:
                continue  # 1
            try:
                smaller = load(trial)
            except InputError:
                continue
            if all(_steps(model, env, k, smaller) is not None for k in kernels):
                sizes, current = trial, smaller
                found.append(smaller)
                break
        else:
            break  # no loop takes a smaller size
    return found


def smaller_schedule(model: Model, env: Mapping[str, int],
                     load: Callable[[dict[str, int]], Workload],
                     encode: Callable[[Workload], Model]
                     ) -> tuple[dict[str, int], Model, dict[str, int]] | None:
    """The smallest of `plan`'s steps at which the rescaled decisions are a schedule of
    the model there (`encode` builds it): its sizes, that model and the decisions
    (complete); None when the workload is within `MAX_POINTS` or no step keeps the
    schedule."""
    for smaller in reversed(plan(model, env, load)):
        small = encode(smaller)
        small_env = small.constraints.complete(rescale(model, env, small))
        if not small.constraints.violated(small_env):
            return dict(smaller.sizes), small, small_env
    return None


def rescale(model: Model, env: Mapping[str, int], smaller: Model) -> dict[str, int]:
    """The decisions of `smaller` (the model at `plan`'s sizes) that keep the schedule
    `env` of `model`: each chosen kernel's sequential loops take fewer steps (`_steps`);
    the other decisions keep their values, and the kernels left out take the smallest of
    theirs where a value is no longer a candidate."""
    domains = smaller.constraints.decisions
    out = {name: env[name] if name in env and env[name] in values else values[0]
           for name, values in domains.items()}
    for kernel in model.selected(env):
        steps = _steps(model, env, kernel, smaller.workload)
        if steps is None:
            raise ValueError(f"kernel {kernel.name}: its loops do not absorb the sizes "
                             f"{smaller.workload.sizes}")
        out.update((name, value) for name, value in steps.items() if name in domains)
    return out


def _steps(model: Model, env: Mapping[str, int], kernel: KernelSpec, smaller: Workload
           ) -> dict[str, int] | None:
    """Kernel `kernel`'s extents (`ext.K.d`) and factors at the sizes of `smaller`: each
    dimension's extent divided by q = old / new, taken out of its sequential slots
    outermost first (the root's count, then the caches' steps), then out of its spatial
    ones, outermost first; None when a dimension shrinks by other than a whole factor, is
    padded or would be (the new extent is not whole tiles of the hardware's), or its
    loops cannot take all of q without changing a compute tile."""
    slots = model.slots
    root = root_temporal_slot(slots, model.hw)
    innermost = len(slots) - 1
    edge = model.hw.compute.tiling.edge
    units = kernel.tile_units(edge) if edge else {}
    by_name = {stmt.name: stmt for stmt in smaller.statements}
    out: dict[str, int] = {}
    for dim in kernel.dims:
        new = next(by_name[s.name].extents[dim] for s in kernel.statements
                   if dim in s.dims)
        if new == kernel.extents[dim]:
            continue  # its factors stay, padded or not
        ext = f"ext.{kernel.name}.{dim}"
        whole = tiled_extent(kernel.extents[dim], units.get(dim, 1))
        new_whole = tiled_extent(new, units.get(dim, 1))
        if env.get(ext, whole) != whole or whole % new_whole or new % units.get(dim, 1):
            return None  # padded, or a tile of the hardware's would be partly padding
        left = whole // new_whole
        factors = {i: ex.evaluate(model.factors.of(kernel.name, dim, i), env)
                   for i in range(len(slots)) if i != root}
        root_count = whole // math.prod(factors.values())
        # the sequential loops outermost first, then the units (outermost level first)
        order = sorted((i for i in range(innermost)),
                       key=lambda i: (slots[i].kind is not SlotKind.TEMPORAL, i))
        for index in order:
            if left == 1:
                break
            value = root_count if index == root else factors[index]
            taken = math.gcd(value, left)
            if slots[index].kind is SlotKind.SPATIAL and value > 1:
                # a dimension spread over units stays spread (units share tiles, combine)
                taken = math.gcd(value // 2, left) if taken == value else taken
            left //= taken
            if index != root:
                factors[index] = value // taken
        if left != 1:
            return None
        if ext in env:
            out[ext] = new_whole
        out.update({var_name(slots[i].symbol, kernel.name, dim): v for i, v in factors.items()})
    return out


def smallest_prime(n: int) -> int:
    """The smallest prime factor of n (n itself when prime; 1 for 1)."""
    if n < 2:
        return 1
    return next((p for p in range(2, math.isqrt(n) + 1) if n % p == 0), n)
