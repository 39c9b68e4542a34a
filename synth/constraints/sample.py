"""Random feasible schedules: complete assignments that satisfy every constraint of a
`ConstraintSet` without being optimal, for testing that everything downstream of the
solver (cost model, materialiser, verifier, interpreter) holds for *any* legal schedule,
not only for the optimum.

How a sample is drawn: from the seed, a random *target* position in each decision's
candidate list and a random positive weight per decision. CP-SAT (the same `Lowering` as
the optimiser, so the same constraints) then finds the feasible assignment whose
candidate positions are nearest the target in weighted L1 distance; the cost model is
not part of that objective. Why this gives varied schedules:

- a feasibility search alone returns whatever its default branching hits first (nearly
  always the smallest values), the same schedule for every seed;
- random objective coefficients on the values themselves push every variable to an end
  of its domain, so all samples are corners;
- a random target spreads the samples over the space: each target, uniform over the
  candidate positions, pulls towards a different region, and the solution is the legal
  schedule nearest to it. Measuring distance in positions, not values, weighs a domain
  like (1, 2, 4, ..., 4096) evenly instead of favouring its large values.

Not uniform over the feasible set: targets that fall where the constraints forbid pull
to the nearest legal schedule, so the edges of the feasible region (full memories, the
most units) are drawn more often than their share, which suits tests well.

When one draw over everything finds nothing within the work limit (attention at
S = 1024 on cpu, 16 candidate kernels in one part, for every seed), fusion is drawn
first: a random cover (`decompose.random_cover`: each statement's kernels tried in a
random order), its fusion decisions substituted as the optimiser's cover loop does
(`decompose.with_fusion`), which leaves each chosen kernel's tiling a small problem of
its own; up to `COVER_TRIES` covers. (Drawing the cover first for every schedule
took a draw there from 0.7 s to 0.1 s, but it changes every seed's schedule, and the
tests' samples with it: it is the fallback, not the rule.) Independent parts of the problem
(`decompose.components`, as the optimiser splits it) are drawn one after the other,
each with its own targets: the same distribution as one joint draw, without the search
over the product. A set with no decisions at all has one schedule, returned when it
satisfies the constraints.

Reproducible: the target and weights come from `random.Random(seed)`; CP-SAT runs with one
worker, `random_seed = seed` and a *deterministic* time limit (its work count, not the
wall clock), so the same seed gives the same schedule on any machine and any load. The
wall-clock limit is only a safety net and far larger. Every schedule returned is checked
against the constraints in plain Python (`ConstraintSet.violated`) as well.

CP-SAT runs with the optimiser's settings (`cpsat.new_solver`): the workarounds for
CP-SAT 9.15's presolve, which proves some feasible models infeasible (where a draw would
find no schedule though there are some), and no LP relaxation, which on these models costs more
than it prunes here too: the same draws (4 seeds) of fa6 on upmem (S=16, D=8) took
13.6 s instead of 6.7 s with CP-SAT's defaults, attention on cpu (S=32, D=16) 12.3 s
instead of 5.8 s, and softmax on upmem (N=1009), whose draws are proved nearest their
targets either way, 3.2 s instead of 0.8 s (RESULTS.md, "A faster sampler").
"""

from __future__ import annotations

import random

from ortools.sat.python import cp_model

from synth.constraints.cpsat import Lowering, new_solver
from synth.constraints.decompose import components, random_cover, with_fusion
from synth.constraints.space import ConstraintSet, is_fusion_decision

# CP-SAT's deterministic time units (about seconds) per part. The nearest schedule to the
# target is not needed, only a legal one near it: on fused attention and fa6 the search
# runs to the limit, and 0.5 draws a sample in 0.5-1.7 s (Xeon of RESULTS.md) where 5.0
# took 15-30 s.
DETERMINISTIC_LIMIT = 0.5
COVER_TRIES = 4  # random fusion covers tried before one joint draw
WALL_LIMIT_S = 60.0


def random_schedule(cset: ConstraintSet, seed: int) -> dict[str, int] | None:
    """A random complete assignment of `cset` satisfying every constraint, or None when
    the constraints admit none (or none was found within the work limit).

    The same `cset` and `seed` always give the same assignment."""
    rng = random.Random(seed)
    found = _sample_parts(cset, rng, seed)
    if found is not None:
        env = cset.complete(found)
        return None if cset.violated(env) else env
    names = [n for n in cset.decisions if is_fusion_decision(n)]
    for _ in range(COVER_TRIES if names else 0):
        chosen = random_cover(cset, names, rng)
        cover = None if chosen is None else with_fusion(cset, chosen)
        found = None if cover is None else _sample_parts(cover, rng, seed)
        if found is not None:  # the kernels left out take their smallest values
            decisions = {name: values[0] for name, values in cset.decisions.items()}
            env = cset.complete({**decisions, **found})
            if not cset.violated(env):
                return env
    return None


def _sample_parts(cset: ConstraintSet, rng: random.Random, seed: int
                  ) -> dict[str, int] | None:
    """Every decision of `cset`, drawn one independent part at a time."""
    decisions: dict[str, int] = {}
    for part in components(cset):
        found = _sample_part(part, rng, seed)
        if found is None:
            return None
        decisions.update(found)
    return decisions


def _sample_part(cset: ConstraintSet, rng: random.Random, seed: int) -> dict[str, int] | None:
    """The decisions of one part nearest a random target, or None when there are none."""
    lowering = Lowering(cset)
    model = lowering.model
    for constraint in cset.constraints:
        lowering.require(constraint.cond)
    distance = []
    for name, values in cset.decisions.items():
        target = rng.randrange(len(values))
        weight = rng.randint(1, 8)
        index = model.new_int_var(0, len(values) - 1, f"index.{name}")
        model.add_element(index, list(values), lowering.vars[name])
        gap = model.new_int_var(0, len(values) - 1, f"gap.{name}")
        model.add_abs_equality(gap, index - target)
        distance.append(weight * gap)
    model.minimize(sum(distance))
    solver = new_solver(WALL_LIMIT_S, workers=1)
    solver.parameters.random_seed = seed % (2**31)
    solver.parameters.max_deterministic_time = DETERMINISTIC_LIMIT
    code = solver.solve(model)
    if code not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    return {name: int(solver.value(lowering.vars[name])) for name in cset.decisions}
