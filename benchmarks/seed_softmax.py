"""Seed 000's hand schedule of softmax on UPMEM, rebuilt in synth's model, against synth's
CP-SAT optimum and the greedy baseline; then CP-SAT against the greedy on every built-in.

    python benchmarks/seed_softmax.py [--set N=1048576] [--repeats 3] [--time-limit 30]
                                      [--no-builtins] [--no-cli-check]

Seed 000 (`/work/shared/seeds/000_33c7ba06f25b2e48.txt`) scheduled a softmax over
1,048,576 f32 on UPMEM by hand with TileFirst: greedy fusion (max, sub+exp+sum, div); the
fused `sub+exp+sum` split again into a parallel `sub+exp` whose output e is placed on the
host and a reduction `sum`; reductions split across R*D DPUs with the partials combined on
the host; every schedule tiled by R*D over ranks x DPUs, blocked by Q over T tasklets,
coarsened by MX at MRAM; buffers on host / mram(r,d) / wram(r,d); then
`block_solve_greedy [T, Q]` and `block_solve_greedy [D, M, R] schedule_eq_constraints`.

The reconstruction (`variants`, row 3), choice by choice:

1. Fusion: the seed's final kernels are one per statement (m, e, s, y): `--fix fuse.e_s=0`
   (which leaves fuse.e = fuse.s = 1; m and y always run alone).
2. Placement: e is an intermediate between kernels, which synth keeps in the root memory
   (the host) and loads into mram(r,d) and wram(r,d) per kernel, as the seed placed it;
   m and s are reductions split over ranks x DPUs with partials combined on the host, as
   in the seed. The seed reduces its tasklets' partials in wram(r,d) on the DPU: where the
   model has on-device combine decisions (`combine.KERNEL.tasklet`) they are fixed to 1
   for m and s (`seed_structure`); a model without them combines every partial on the
   host, and the reconstruction says so (`combines_on_device`).
3. The same R, D, M, T, Q in every kernel: the seed's symbols are shared by all its
   schedules (one `R*D` tiling, one `Q`, one `T`, one `MX`), and `schedule_eq_constraints`
   keeps them equal. Expressed as 15 user constraints `X.k.i == X.m.i` for X in R D M T Q
   and k in e s y (`SEED_CONSTRAINTS`).
4. The values: the seed's two greedy passes, over the *shared* symbols (`seed_values`).
   Order T, Q, then D, M, R; each symbol is raised, in all four kernels at once, to its
   largest candidate with which every constraint of synth's model holds, the others at
   their current values; the cost is never looked at. The start is synth's greedy start
   (`synth.constraints.greedy`): every factor 1, then a repair pass in the same order
   taking the smallest value that leaves the fewest constraints violated (a 1-element
   f32 tile breaks UPMEM's 8-byte DMA rule, so Q starts at 2). At N=1048576 this gives
   T=16, Q=256 (WRAM holds two f32[Q] tiles per tasklet in kernels e and y), D=64, M=4
   (the rest of N: the factors multiply to N exactly), R=1: filling M before R leaves no
   work for a second rank. The values are fixed on kernel m (`--fix R.m.i=1 ...`) and
   carried to the others by the constraints of 3; CP-SAT then only evaluates that point.

Why not `--solver greedy` with the constraints of 3 (row 5): synth's greedy raises one
factor of one kernel at a time, so with `T.e.i == T.m.i` no single raise keeps the
constraints and every factor stays at its start (thousands of times the optimum). Row 5
leaves out the combine fixes of 2: synth's greedy keeps every decision other than fusion
and factors at its smallest value, so it could not meet them at all. The seed's greedy
raises a shared symbol, which is what `seed_values` does.

What synth cannot express of the seed (the reconstruction differs there):

- TileFirst's own constraint set and its greedy's start point: the values above are what
  the seed's procedure picks under synth's constraints (WRAM capacity minus reserved
  bytes, DMA rules, exact tiling), not numbers copied from the seed, which records none.
  Its `[T, Q]` pass ran before the MRAM level existed; in synth MRAM is always there but
  with D = M = R = 1 it does not limit T or Q.
- `eliminate_transfers` and the exact position of each copy: synth places copies by its
  one rule (`cost.copy_loops`); no double buffering in either.
- Without on-device combine decisions in the model (see 2), the tasklet-level reduction
  on the DPU.
- Costs are synth's model (picoseconds from the hardware TOML), not measurements.

Tables printed (markdown): the schedules of softmax with their modelled cost, ratio to
synth's optimum, status, validation, key values and the equivalent `synth solve` command;
their cost breakdowns; and for every built-in on `upmem` and `cpu`, CP-SAT against the
greedy (`greedy_vs_optimal.py`). With the CLI check (default) every command is run as a
subprocess with `--json --no-validate` and its `cost.total_ps` compared with the row.
Exit code 0 unless the command line is bad.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import shlex
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from synth import pipeline
from synth.constraints import user
from synth.constraints.cost import Model
from synth.constraints.result import Status
from synth.constraints.space import ConstraintSet
from synth.lang import list_builtin_workloads

sys.path.insert(0, str(Path(__file__).resolve().parent))
import greedy_vs_optimal  # noqa: E402  (the sibling benchmark script)

WORKLOAD, HARDWARE = "softmax", "upmem"
KERNELS = ("m", "e", "s", "y")  # one per statement, as the seed ends
SYMBOLS = ("R", "D", "M", "T", "Q")  # the seed's R, D, MX, T, Q
SEED_ORDER = ("T", "Q", "D", "M", "R")  # block_solve_greedy [T, Q], then [D, M, R]
SEED_FUSION = ("fuse.e_s=0",)
SEED_KERNELS = {"fuse.e": 1, "fuse.s": 1, "fuse.e_s": 0}
REDUCTIONS = ("m", "s")  # the seed's reduction schedules (max, sum)
SEED_CONSTRAINTS = tuple(f"{x}.{k}.i == {x}.{KERNELS[0]}.i"
                         for x in SYMBOLS for k in KERNELS[1:])
MAX_REPAIRS = 3


# ---------------------------------------------------------------- the seed's greedy


def _names(cs: ConstraintSet, symbol: str) -> list[str]:
    """The factor decisions of one shared symbol, one per kernel of the seed."""
    names = [f"{symbol}.{k}.i" for k in KERNELS]
    missing = [n for n in names if n not in cs.decisions]
    if missing:
        raise ValueError(f"{missing} are not decisions at these sizes (folded to a constant)")
    return names


def _candidates(cs: ConstraintSet, symbol: str) -> list[int]:
    """Values the symbol can take in every kernel, ascending."""
    common = set.intersection(*(set(cs.decisions[n]) for n in _names(cs, symbol)))
    return sorted(common)


def _with(cs: ConstraintSet, decisions: Mapping[str, int], symbol: str, value: int
          ) -> list[dict[str, int]]:
    """`decisions` with `symbol` set to `value` in every kernel; one assignment per padded
    extent (smallest first) when the extent is a decision, as synth's greedy moves it."""
    base = dict(decisions) | {n: value for n in _names(cs, symbol)}
    exts = [f"ext.{k}.i" for k in KERNELS if f"ext.{k}.i" in cs.decisions]
    if not exts:
        return [base]
    values = sorted(set.intersection(*(set(cs.decisions[e]) for e in exts)))
    return [base | {e: v for e in exts} for v in values]


def _violated(cs: ConstraintSet, decisions: Mapping[str, int]) -> int:
    return len(cs.violated(cs.complete(decisions)))


def _encode(request: pipeline.Request) -> Model:
    return pipeline.encode(pipeline.parse(request), pipeline.hardware(request),
                           request.constraints, request.fixes)


def combine_decisions(sizes: Mapping[str, int] | None = None) -> list[str]:
    """The model's on-device combine decisions for the seed's reductions (tasklet level),
    if it has them."""
    decisions = _encode(pipeline.Request(WORKLOAD, HARDWARE, sizes=dict(sizes or {})
                                         )).constraints.decisions
    return [n for k in REDUCTIONS if (n := f"combine.{k}.tasklet") in decisions]


def seed_structure(sizes: Mapping[str, int] | None = None) -> tuple[str, ...]:
    """The `--fix`es of the seed's structure: no fusion, and the tasklets' partials of
    each reduction combined on the DPU where the model can say so."""
    return SEED_FUSION + tuple(f"{n}=1" for n in combine_decisions(sizes))


def seed_model(sizes: Mapping[str, int]) -> Model:
    """softmax on UPMEM with the seed's structure: no fusion, equal factors everywhere."""
    return _encode(pipeline.Request(WORKLOAD, HARDWARE, sizes=dict(sizes),
                                    constraints=SEED_CONSTRAINTS,
                                    fixes=seed_structure(sizes)))


def seed_values(sizes: Mapping[str, int] | None = None) -> dict[str, int]:
    """The values of R, D, M, T, Q the seed's greedy passes choose in synth's model (see
    the module docstring, item 4): one value per symbol, shared by every kernel."""
    sizes = dict(sizes or {})
    cs = seed_model(sizes).constraints
    decisions = {n: values[0] for n, values in cs.decisions.items()}
    decisions |= SEED_KERNELS | {n: 1 for n in combine_decisions(sizes)}
    for _ in range(MAX_REPAIRS):  # the start: fewest violations, smallest value
        if not _violated(cs, decisions):
            break
        before = dict(decisions)
        for symbol in SEED_ORDER:
            options = [a for v in _candidates(cs, symbol) for a in _with(cs, decisions,
                                                                         symbol, v)]
            decisions = min(options, key=lambda a: _violated(cs, a))  # first of the fewest
        if decisions == before:
            break
    if _violated(cs, decisions):
        raise RuntimeError("no feasible start for the seed's greedy: "
                           + "; ".join(c.meaning for c in cs.violated(cs.complete(decisions))))
    for symbol in SEED_ORDER:  # the fill: the largest value that keeps every constraint
        decisions = next(a for v in reversed(_candidates(cs, symbol))
                         for a in _with(cs, decisions, symbol, v) if not _violated(cs, a))
    return {s: decisions[f"{s}.{KERNELS[0]}.i"] for s in SYMBOLS}


# ---------------------------------------------------------------- the schedules compared


@dataclass(frozen=True)
class Variant:
    label: str
    request: pipeline.Request
    note: str


def seed_fixes(values: Mapping[str, int], sizes: Mapping[str, int] | None = None
               ) -> tuple[str, ...]:
    """The `--fix`es of the reconstruction: the structure, then the values on kernel m."""
    return seed_structure(sizes) + tuple(f"{s}.{KERNELS[0]}.i={values[s]}" for s in SYMBOLS)


def variants(sizes: Mapping[str, int] | None = None, time_limit_s: float = 30.0,
             validate: bool = True) -> list[Variant]:
    """synth's optimum, the greedy baseline, the seed's reconstruction, and two rows that
    separate the seed's structure from its value choice."""
    sizes = dict(sizes or {})
    base = pipeline.Request(WORKLOAD, HARDWARE, sizes=sizes, time_limit_s=time_limit_s,
                            validate=validate)
    request = functools.partial(dataclasses.replace, base)
    values = seed_values(sizes)
    structure = seed_structure(sizes)
    on_device = ("tasklet partials combined on the DPU" if len(structure) > 1
                 else "every partial combined on the host")
    return [
        Variant("synth optimum (CP-SAT)", base, "proven optimal in synth's model"),
        Variant("greedy baseline", request(solver="greedy"),
                "greedy fusion, then factors filled in the seed's order"),
        Variant("seed 000 reconstruction",
                request(fixes=seed_fixes(values, sizes), constraints=SEED_CONSTRAINTS),
                f"no fusion, {on_device}, equal factors, values of the seed's greedy: "
                + " ".join(f"{s}={values[s]}" for s in SEED_ORDER)),
        Variant("seed structure, CP-SAT values",
                request(fixes=structure, constraints=SEED_CONSTRAINTS),
                f"the seed's kernels, {on_device}, equal factors; the best values"),
        Variant("--solver greedy + seed structure",
                request(solver="greedy", fixes=SEED_FUSION, constraints=SEED_CONSTRAINTS,
                        validate=False),
                "not the seed: synth's greedy raises one kernel's factor at a time, so "
                "tied factors never move; "
                + ("without the combine fixes, which it would leave at 0 (it keeps every "
                   "decision but fusion and factors at its smallest value); "
                   if structure != SEED_FUSION else "")
                + "not validated, as its tiny tiles make the NumPy run take minutes"),
    ]


def command(req: pipeline.Request) -> str:
    """The `synth solve` line equivalent to `req`."""
    parts = ["synth", "solve", req.workload, "--hw", req.hardware]
    parts += [a for k, v in req.sizes.items() for a in ("--set", f"{k}={v}")]
    if req.solver != "cpsat":
        parts += ["--solver", req.solver]
    parts += [a for f in req.fixes for a in ("--fix", f)]
    parts += [a for c in req.constraints for a in ("--constraint", c)]
    if not req.validate:
        parts.append("--no-validate")
    return " ".join(shlex.quote(p) for p in parts)


@dataclass(frozen=True)
class Row:
    variant: Variant
    outcome: pipeline.Outcome

    @property
    def objective(self) -> int | None:
        return self.outcome.result.objective


def measure(variant: Variant) -> Row:
    return Row(variant, pipeline.run(variant.request))


def kernels_used(outcome: pipeline.Outcome) -> list[str]:
    env = outcome.result.env
    if env is None:
        return []
    return [k.name for k in outcome.model.kernels if env.get(f"fuse.{k.name}", 1) == 1]


def factors(outcome: pipeline.Outcome, kernel: str) -> dict[str, int]:
    """R, D, M, T, Q of a kernel's dimension i (a folded factor: its constant)."""
    env, folded = outcome.result.env or {}, user.folded_factors(outcome.model)
    out = {}
    for symbol in SYMBOLS:
        name = f"{symbol}.{kernel}.i"
        out[symbol] = env[name] if name in env else folded.get(name, 1)
    return out


def per_kernel(outcome: pipeline.Outcome) -> str:
    return "; ".join(f"{k}: " + " ".join(f"{s}{v}" for s, v in factors(outcome, k).items())
                     for k in kernels_used(outcome))


def ms(ps: int | None) -> str:
    return "-" if ps is None else f"{ps / 1e9:.4g}"


def table(rows: Sequence[Row]) -> list[str]:
    best = rows[0].objective
    lines = ["| # | schedule | modelled cost (ms) | / synth optimum | status | validation "
             "| R | D | T | kernels | per kernel (R D M T Q of i) |",
             "|---|---|---:|---:|---|---|---:|---:|---:|---|---|"]
    for index, row in enumerate(rows, start=1):
        out = row.outcome
        env = out.result.env or {}
        ratio = "-" if row.objective is None or not best else f"{row.objective / best:.2f}x"
        valid = ("not run" if out.validation is None
                 else "passed" if out.validation.passed else "FAILED")
        lines.append(
            f"| {index} | {row.variant.label} | {ms(row.objective)} | {ratio} "
            f"| {out.result.status.value} | {valid} | {env.get('R', '-')} "
            f"| {env.get('D', '-')} | {env.get('T', '-')} | {' '.join(kernels_used(out))} "
            f"| {per_kernel(out) or '-'} |")
    failures = [f"- row {i}: {row.outcome.result.stats['failure']}"
                for i, row in enumerate(rows, start=1)
                if "failure" in (row.outcome.result.stats or {})]
    return lines + ([""] + failures if failures else [])


def breakdown(rows: Sequence[Row]) -> list[str]:
    """The parts of each row's modelled cost (the model's own names, e.g. `compute`,
    `transfer:host->mram`, `combine`), in ms."""
    parts = list(dict.fromkeys(p for row in rows for p in row.outcome.cost or {}))
    lines = ["| # | schedule | " + " | ".join(parts) + " | total (ms) |",
             "|---|---|" + "---:|" * (len(parts) + 1)]
    for index, row in enumerate(rows, start=1):
        cost = row.outcome.cost or {}
        cells = [ms(cost.get(p, 0)) if cost else "-" for p in parts]
        lines.append(f"| {index} | {row.variant.label} | " + " | ".join(cells)
                     + f" | {ms(row.objective)} |")
    return lines


def commands(rows: Sequence[Row]) -> list[str]:
    lines = []
    for index, row in enumerate(rows, start=1):
        lines += [f"{index}. {row.variant.label} ({row.variant.note}):", "",
                  "   ```", "   " + command(row.variant.request), "   ```", ""]
    return lines


def synth_executable() -> list[str]:
    """`synth` as this interpreter finds it (the same code as the rows, e.g. with
    PYTHONPATH pointing at another checkout)."""
    return [sys.executable, "-m", "synth.cli"]


def cli_total_ps(req: pipeline.Request) -> int | None:
    """`cost.total_ps` of the command line of `req`, run with `--json --no-validate`."""
    argv = synth_executable() + shlex.split(command(req))[1:] + ["--json"]
    if req.validate:
        argv.append("--no-validate")
    run = subprocess.run(argv, capture_output=True, text=True)
    try:
        cost = json.loads(run.stdout).get("cost") or {}
    except json.JSONDecodeError:
        return None
    total = cost.get("total_ps")
    return None if total is None else int(total)


def cli_check(rows: Sequence[Row]) -> list[str]:
    lines = []
    for index, row in enumerate(rows, start=1):
        total = cli_total_ps(row.variant.request)
        same = total == row.objective
        found = "no schedule" if total is None else f"cost.total_ps = {total:,}"
        lines.append(f"- row {index}: the command gives {found}: "
                     f"{'same as the row' if same else 'DIFFERENT from the row'}")
    return lines


def targets(rows: Sequence[Row], builtins: Sequence[greedy_vs_optimal.Row]) -> list[str]:
    optimum, greedy_row, seed = rows[0], rows[1], rows[2]

    def leq(a: Row, b: Row) -> bool:
        return a.objective is not None and b.objective is not None \
            and a.objective <= b.objective

    def ratio(a: Row) -> str:
        return f"{a.objective / optimum.objective:.2f}x" if a.objective and \
            optimum.objective else "-"

    lines = [
        f"- **{'PASS' if leq(optimum, greedy_row) else 'FAIL'}** synth's optimum <= greedy "
        f"on softmax (greedy / optimum {ratio(greedy_row)})",
        f"- **{'PASS' if leq(optimum, seed) else 'FAIL'}** synth's optimum <= seed 000's "
        f"schedule on softmax (seed / optimum {ratio(seed)})",
        f"- **{'PASS' if optimum.outcome.result.status is Status.OPTIMAL else 'FAIL'}** "
        "synth's softmax schedule is proven optimal",
    ]
    if builtins:
        ok = [r for r in builtins if r.optimum.objective is not None
              and r.greedy.objective is not None and r.optimum.objective <= r.greedy.objective]
        lines.append(f"- **{'PASS' if len(ok) == len(builtins) else 'FAIL'}** CP-SAT <= "
                     f"greedy on every built-in: {len(ok)}/{len(builtins)} cases")
    return lines


def parse_sizes(items: Sequence[str]) -> dict[str, int]:
    sizes = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not value.isdigit() or int(value) < 1:
            raise argparse.ArgumentTypeError(f"--set {item}: expected NAME=INT")
        sizes[name.strip()] = int(value)
    return sizes


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", action="append", default=[], metavar="N=INT",
                        help="a size of softmax (default: the workload's, N=1048576)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="solves per solver in the built-in table (median time)")
    parser.add_argument("--time-limit", type=float, default=30.0)
    parser.add_argument("--no-builtins", action="store_true",
                        help="skip the table of every built-in")
    parser.add_argument("--no-cli-check", action="store_true",
                        help="do not run the synth solve commands to check them")
    args = parser.parse_args(argv)
    try:
        sizes = parse_sizes(args.set)
    except argparse.ArgumentTypeError as exc:
        parser.error(str(exc))
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    rows = [measure(v) for v in variants(sizes, args.time_limit)]
    shown = " ".join(f"{k}={v}" for k, v in rows[0].outcome.workload.sizes.items())
    print(f"softmax on upmem ({shown}): synth's optimum, the greedy baseline and seed 000's "
          f"schedule; git {greedy_vs_optimal.revision()}, {os.cpu_count()} CPUs, synth "
          f"imported from {Path(pipeline.__file__).parent}\n")
    print("\n".join(table(rows)))
    print("\nCost breakdown (ms):\n")
    print("\n".join(breakdown(rows)))
    print("\nCommands (each row is `synth solve` with these options):\n")
    print("\n".join(commands(rows)))
    if not args.no_cli_check:
        print("CLI check (each command run with `--json --no-validate`):\n")
        print("\n".join(cli_check(rows)))
        print()
    builtins: list[greedy_vs_optimal.Row] = []
    if not args.no_builtins:
        builtins = [greedy_vs_optimal.measure(w, h, args.repeats, args.time_limit)
                    for w in list_builtin_workloads()
                    for h in greedy_vs_optimal.DEFAULT_HARDWARE]
        print(f"Every built-in at its default size, CP-SAT vs greedy (median of "
              f"{args.repeats} solves; as `python benchmarks/greedy_vs_optimal.py "
              f"--repeats {args.repeats}`):\n")
        print("\n".join(greedy_vs_optimal.table(builtins)))
        print()
        print("\n".join(greedy_vs_optimal.summary(builtins)))
        print()
    print("Targets:\n")
    print("\n".join(targets(rows, builtins)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
