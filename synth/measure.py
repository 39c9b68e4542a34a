"""`synth solve ... --measure K`: the K best distinct schedules under the model, each
emitted as C, built, checked against the reference and timed on this machine; the
fastest measured is the result, and the report sets modelled against measured.

Which schedules (`best_schedules`): the solver's optimum, then the next best ones
(`next_best`), so the k-th is the best schedule the model has that is none of the first
k-1. Only the decisions of the kernels a schedule uses count (`relevant`): the tiles of a
fusion candidate the schedule does not use mean nothing, and excluding them would give
the same program again. Two schedules with the same loop nest are the same schedule.
`next_best` splits the space Lawler's way, by the fusion and then kernel by kernel, so
each solve keeps the problem's kernel-by-kernel structure: one CP-SAT solve with every
earlier schedule excluded (`exclusion` over all decisions) makes the problem one part,
and took 10-130 s of CPU for 8 schedules where this takes 0.04-1.8 s (softmax, layernorm,
attention, fa6 on cpu; rmsnorm on upmem; same costs in the same order). When
the model has fewer than K (or a solve runs out of time), the greedy schedule and the
sampler's random feasible ones (`synth.constraints.sample`) fill up.

How each is timed: `synth.emit.c` writes every one and they are built, a file per kernel,
each distinct file compiled once, one compiler per core (`build_all`); then one by one
(`time_emitted`), `synth.emit.c_check` runs each on the validation inputs against the
reference and times the compiled computation (that run is the warm-up; then the median of
at least 5 runs, 3 for a run over a second); NumPy is not timed again for each. A
schedule whose check fails is reported and not chosen; the run then exits 4.

`spearman` is the rank correlation of modelled and measured times over the schedules that
ran (ties share their mean rank); `benchmarks/cost_fidelity.py` uses the same functions.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import os
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from synth import progress
from synth.constraints import cpsat, greedy
from synth.constraints import expr as ex
from synth.constraints.cost import Model
from synth.constraints.decompose import PartCache
from synth.constraints.result import SolveResult, Status
from synth.constraints.sample import random_schedule
from synth.constraints.space import NamedConstraint, is_fusion_decision
from synth.errors import InputError
from synth.hardware import Hardware
from synth.ir.materialize import materialize
from synth.ir.nodes import Program
from synth.ir.printer import print_program
from synth.ir.verify import verify
from synth.reference import evaluate_errors, make_inputs
from synth.workload import Workload

MAX_K = 64
SAMPLE_ATTEMPTS = 4  # sampler seeds tried per schedule still missing
PS_PER_S = 1e12


@dataclass(frozen=True)
class Candidate:
    """A schedule to measure: where it came from, its modelled cost, its assignment."""

    source: str  # "optimum", "next best", "greedy", "sample (seed N)"
    objective: int  # modelled time, picoseconds
    env: Mapping[str, int]
    program: Program


@dataclass(frozen=True)
class MeasuredSchedule:
    rank: int  # 1 = the model's optimum; by modelled time
    source: str
    modelled_ps: int
    measured_s: float | None  # median of the compiled runs; None when the check failed
    passed: bool
    variables: Mapping[str, int]  # the decisions of the kernels the schedule uses
    env: Mapping[str, int]  # the whole assignment
    log: str = ""

    @property
    def modelled_s(self) -> float:
        return self.modelled_ps / PS_PER_S

    def json(self) -> dict[str, Any]:
        return {"rank": self.rank, "source": self.source, "modelled_s": self.modelled_s,
                "measured_s": self.measured_s, "passed": self.passed,
                "variables": dict(self.variables)}


@dataclass(frozen=True)
class Measured:
    schedules: tuple[MeasuredSchedule, ...]
    spearman: float | None  # modelled vs measured, over the schedules that ran
    chosen: int | None  # rank of the fastest measured (None: none ran)
    seconds: float
    asked: int  # K
    load: float = 0.0  # the 1-minute load average when timing started (wall-clock times)

    @property
    def passed(self) -> bool:
        return all(s.passed for s in self.schedules)

    def schedule(self, rank: int) -> MeasuredSchedule:
        return next(s for s in self.schedules if s.rank == rank)

    def json(self) -> dict[str, Any]:
        return {"schedules": [s.json() for s in self.schedules], "spearman": self.spearman,
                "chosen": self.chosen, "asked": self.asked, "seconds": self.seconds,
                "load_average": self.load}


# ---------------------------------------------------------------- checks


def check_k(k: int) -> int:
    if not 1 <= k <= MAX_K:
        raise InputError(f"--measure {k}: expected a number of schedules from 1 to {MAX_K}")
    return k


def require(hw: Hardware) -> None:
    """--measure runs the schedules as C on this machine's cores: cpu-like models only."""
    if len(hw.levels) != 2 or hw.streams:
        levels = " > ".join(lvl.name for lvl in hw.levels)
        raise InputError(f"--measure times schedules as C on this machine's cores: it needs "
                         f"a hardware model with one level of units below the root (the "
                         f"cores, as in `cpu`); {hw.name} has levels {levels}")


# ---------------------------------------------------------------- which schedules


def relevant(model: Model, env: Mapping[str, int]) -> dict[str, int]:
    """The decisions that shape the schedule `env`: every decision but those of fusion
    candidates it does not use (named `PREFIX.KERNEL[.MORE]`: factors `Q.k.i`, `ext.k.i`,
    `combine.k.LEVEL`, `buffers.k.MEMORY`, `pack.k`, `sub.k.i`, ...)."""
    used = {k.name for k in model.selected(env)}
    unused = {k.name for k in model.kernels} - used
    return {name: int(env[name]) for name in model.constraints.decisions
            if not _owned_by(name, unused)}


def _owned_by(name: str, kernels: set[str]) -> bool:
    parts = name.split(".")
    return len(parts) >= 2 and parts[1] in kernels and parts[0] != "fuse"


def exclusion(decisions: Mapping[str, int], index: int) -> NamedConstraint:
    """At least one of `decisions` takes another value."""
    cond = ex.any_of(cmp for name, value in decisions.items()
                     for cmp in (ex.Cmp(ex.Var(name), "<", ex.const(value)),
                                 ex.Cmp(ex.Var(name), ">", ex.const(value))))
    if isinstance(cond, bool):  # nothing to decide: no other schedule
        cond = ex.Cmp(ex.const(0), ">", ex.const(1))
    return NamedConstraint(f"measure.exclude.{index}",
                           f"not the {_ordinal(index)} schedule measured", cond)


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def best_schedules(model: Model, k: int, first: SolveResult, time_limit_s: float,
                   workload: Workload, hw: Hardware,
                   tell: Callable[[str], None] | None = None) -> list[Candidate]:
    """Up to `k` distinct schedules, best first: `first` (the solver's), then the next
    best ones (`next_best`), then greedy's and samples to fill up."""
    assert first.env is not None and first.objective is not None
    say = tell or (lambda _: None)
    found: list[Candidate] = []
    seen: set[str] = set()

    def add(source: str, env: Mapping[str, int]) -> bool:
        program = materialize(model, env)
        text = print_program(program)
        if text in seen:
            return False
        verify(program, workload, hw)
        seen.add(text)
        objective = ex.evaluate(model.constraints.objective, env)
        found.append(Candidate(source, objective, dict(env), program))
        return True

    first_source = "optimum" if first.status is Status.OPTIMAL else f"{first.solver}'s"
    for env in next_best(model, first, time_limit_s, say):
        add(first_source if not found else "next best", env)
        if len(found) >= k:
            return found
    say("greedy schedule")
    filler = greedy.solve(model.constraints, time_limit_s, model.slots)
    if filler.env is not None:
        add("greedy", filler.env)
    seed = 0
    while len(found) < k and seed < SAMPLE_ATTEMPTS * k:
        say(f"random feasible schedule (seed {seed})")
        sampled = random_schedule(model.constraints, seed)
        if sampled is not None:
            add(f"sample (seed {seed})", sampled)
        seed += 1
    return found


@dataclass(frozen=True)
class _Piece:
    """A piece of the schedule space (`extra` constraints on the model): its best
    schedule once solved (`env`), before that its parent's cost (a lower bound of its
    own). Ordered by that cost, solved pieces first (by when they were made), then the
    pieces to solve, the last made first: of a schedule's pieces the last made fix the
    most (the fusion and every kernel but one), and the first, a fusion other than the
    schedule's, is one problem over all the covers (the transformer block's took 11 s of
    --measure 8's 17 s of search, while its next schedules tie with the optimum)."""

    objective: int
    order: int
    env: dict[str, int] | None
    extra: tuple[NamedConstraint, ...]

    def __lt__(self, other: _Piece) -> bool:
        return self._rank() < other._rank()

    def _rank(self) -> tuple[int, bool, int]:
        return (self.objective, self.env is None,
                self.order if self.env is not None else -self.order)


def next_best(model: Model, first: SolveResult, time_limit_s: float,
              tell: Callable[[str], None], work_limit_s: float | None = None
              ) -> Iterator[dict[str, int]]:
    """The schedules in order of modelled cost, `first` first, each distinct from the
    earlier ones in its `relevant` decisions (Lawler's k-best scheme): the space left
    once a schedule s is taken from its piece P is split into pieces P_1 .. P_n, where
    P_g keeps s's choices of the groups before g (`decision_groups`: the fusion, then
    each kernel s uses, then the rest) and differs from s in group g; the next schedule
    is the best of all pieces' bests. A piece is solved only when its lower bound (its
    parent's cost) comes first, so most are never solved. Its constraints fix single
    decisions or exclude one group's values, so the solver still solves it kernel by
    kernel, and the parts no constraint touches come from the cache shared by all these
    solves. Stops when the space is exhausted or the time is up (a piece solved only to
    FEASIBLE keeps its schedule's place by its cost). `work_limit_s` bounds each solve's
    deterministic time too (`cpsat.solve`; tests)."""
    assert first.env is not None and first.objective is not None
    start = time.perf_counter()
    cache = PartCache()
    pieces = [_Piece(first.objective, 0, dict(first.env), ())]
    made = 0
    while pieces:
        piece = heapq.heappop(pieces)
        if piece.env is None:  # its turn: solve it, and put it back at its own cost
            left = time_limit_s - (time.perf_counter() - start)
            if left <= 0:
                return
            tell(f"searching the next best schedule (piece {piece.order} of {made})")
            cset = dataclasses.replace(model.constraints, constraints=(
                *model.constraints.constraints, *piece.extra))
            result = cpsat.solve(cset, left, cache=cache, work_limit_s=work_limit_s)
            if result.env is not None and result.objective is not None:
                heapq.heappush(pieces, dataclasses.replace(
                    piece, objective=result.objective, env=dict(result.env)))
            continue
        yield piece.env
        fixed: list[NamedConstraint] = []
        for group in decision_groups(model, piece.env):
            made += 1
            heapq.heappush(pieces, _Piece(piece.objective, made, None, (
                *piece.extra, *fixed, exclusion(group, made))))
            fixed += [_fixing(name, value) for name, value in group.items()]


def decision_groups(model: Model, env: Mapping[str, int]) -> list[dict[str, int]]:
    """`relevant(model, env)` in groups, each the decisions of one thing a schedule
    chooses: the fusion (`fuse.*`, `online.*`), then each kernel it uses (decisions
    named `PREFIX.KERNEL[.MORE]`), then the rest (none on most models)."""
    decisions = relevant(model, env)
    kernels = [k.name for k in model.selected(env)]
    fusion = {n: v for n, v in decisions.items() if is_fusion_decision(n)}
    by_kernel = {name: {n: v for n, v in decisions.items()
                        if not is_fusion_decision(n) and _owned_by(n, {name})}
                 for name in kernels}
    grouped = set(fusion).union(*by_kernel.values())
    rest = {n: v for n, v in decisions.items() if n not in grouped}
    return [g for g in (fusion, *by_kernel.values(), rest) if g]


def _fixing(name: str, value: int) -> NamedConstraint:
    return NamedConstraint("measure.fixed", f"{name} as in the schedule before",
                           ex.Cmp(ex.Var(name), "==", ex.const(value)))


# ---------------------------------------------------------------- timing


@dataclass(frozen=True)
class Timing:
    passed: bool
    run_s: float | None
    log: str


def time_schedule(program: Program, workload: Workload, hw: Hardware, out_dir: Path,
                  data: tuple[Mapping[str, Any], Mapping[str, Any], Mapping[str, Any]],
                  quick: bool = True, one_thread: bool = False) -> Timing:
    """Emit `program` as C into `out_dir`, build it, check it against the reference and
    time it (NumPy is not timed). `data`: inputs, expected outputs, error bounds.
    `quick` (--measure): the checking call is the warm-up, and calls over a second are
    timed 3 times, not 5 (`synth.emit.c_check.QUICK_RUNS`); `one_thread`: one thread's
    CPU time (`check_c`'s; benchmarks/cost_fidelity.py)."""
    from synth.emit.c import emit_c

    inputs, expected, bounds = data
    emit_c(program, workload, hw, out_dir, inputs, expected, bounds)
    return time_emitted(out_dir, quick, one_thread)


def time_emitted(out_dir: Path, quick: bool = True, one_thread: bool = False) -> Timing:
    """`time_schedule` of the C already in `out_dir` (built already or not)."""
    from synth.emit.c_check import check_c

    check = check_c(out_dir, time_numpy=False, quick=quick, one_thread=one_thread)
    return Timing(check.passed, check.run_s if check.passed else None, check.log)


def build_all(programs: Sequence[tuple[Program, Path]], workload: Workload, hw: Hardware,
              data: tuple[Mapping[str, Any], Mapping[str, Any], Mapping[str, Any]],
              objects: Path) -> None:
    """Emit each program as C into its directory and build them all before any is
    timed: `time_emitted` then finds each library built. The next-best schedules differ
    from the optimum in a kernel or two, so each is built from a file per kernel
    (`translation_units`), every distinct file compiled once into `objects`, one
    compiler per core (8 transformer blocks built from kernels.c took 12.6 s). A build
    that fails fails again, with its log, in `time_emitted`'s check (`make`)."""
    from synth.emit.c import HEADER, compiler, emit_c, translation_units, vector_bytes
    from synth.emit.c_check import build_from_units

    inputs, expected, bounds = data
    for program, out in programs:
        emit_c(program, workload, hw, out, inputs, expected, bounds)
    if programs:
        build_from_units([(out, translation_units(program, workload, hw))
                          for program, out in programs], objects, compiler(),
                         programs[0][1] / HEADER, vector_bytes(hw), os.cpu_count() or 1)


def reference_data(workload: Workload, seed: int = 0
                   ) -> tuple[Mapping[str, Any], Mapping[str, Any], Mapping[str, Any]]:
    inputs = make_inputs(workload, seed)
    expected, bounds = evaluate_errors(workload, inputs)
    return inputs, expected, bounds


def spearman(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Spearman's rank correlation of paired values (ties share their mean rank); None
    with fewer than two pairs or when either side is constant."""
    if len(xs) != len(ys):
        raise ValueError("spearman: sequences of different lengths")
    if len(xs) < 2:
        return None
    rx, ry = ranks(xs), ranks(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    sxx = sum((a - mx) ** 2 for a in rx)
    syy = sum((b - my) ** 2 for b in ry)
    if sxx == 0 or syy == 0:
        return None
    return sxy / math.sqrt(sxx * syy)


def ranks(values: Sequence[float]) -> list[float]:
    """1-based ranks, ties given the mean of the ranks they span."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    out = [0.0] * len(values)
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and values[order[end + 1]] == values[order[start]]:
            end += 1
        for position in range(start, end + 1):
            out[order[position]] = (start + end) / 2 + 1
        start = end + 1
    return out


def run(model: Model, first: SolveResult, k: int, workload: Workload, hw: Hardware,
        time_limit_s: float, seed: int = 0, checked_hw: Hardware | None = None,
        out_dir: str | None = None) -> Measured:
    """The `measure` stage: the K best schedules, each emitted, checked and timed.
    `checked_hw`: what the loop nests are verified against (`pipeline.what_if`)."""
    start = time.perf_counter()
    candidates = best_schedules(model, k, first, time_limit_s, workload,
                                checked_hw or hw, progress.stage)
    candidates.sort(key=lambda c: (c.objective, c.env != first.env))
    data = reference_data(workload, seed)
    load = os.getloadavg()[0]
    schedules = []
    with tempfile.TemporaryDirectory(prefix="synth-measure-") as tmp:
        root = Path(out_dir) if out_dir is not None else Path(tmp)
        dirs = [root / f"rank{rank}" for rank in range(1, len(candidates) + 1)]
        progress.stage(f"build {len(candidates)}")
        build_all([(cand.program, out) for cand, out in zip(candidates, dirs, strict=True)],
                  workload, hw, data, Path(tmp) / "objects")
        for rank, (cand, out) in enumerate(zip(candidates, dirs, strict=True), 1):
            progress.stage(f"measure {rank}/{len(candidates)}")
            timing = time_emitted(out)
            schedules.append(MeasuredSchedule(
                rank, cand.source, cand.objective, timing.run_s, timing.passed,
                relevant(model, cand.env), cand.env, timing.log[-2000:]))
    ran = [s for s in schedules if s.measured_s is not None]
    rho = spearman([s.modelled_s for s in ran], [s.measured_s or 0.0 for s in ran])
    fastest = min(ran, key=lambda s: (s.measured_s, s.rank)) if ran else None
    return Measured(tuple(schedules), rho, fastest.rank if fastest else None,
                    time.perf_counter() - start, k, load)


def chosen_result(first: SolveResult, measured: Measured) -> SolveResult:
    """The solve result for the fastest measured schedule: the solver's own when it was
    the fastest, else that schedule (FEASIBLE: under the model it is not the optimum;
    the optimum's objective stays the bound)."""
    if measured.chosen is None:
        return first
    chosen = measured.schedule(measured.chosen)
    if dict(chosen.env) == dict(first.env or {}):
        return first
    return dataclasses.replace(first, status=Status.FEASIBLE, env=dict(chosen.env),
                               objective=chosen.modelled_ps,
                               stats={**first.stats, "measured_rank": measured.chosen})
