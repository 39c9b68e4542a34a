"""z3 against CP-SAT on every built-in at default sizes: same optimum, both solve times.

    python benchmarks/z3_agreement.py [--workloads ...] [--hardware ...] [--z3-time-limit S]

Both backends lower the same constraint set (synth/constraints/); this records that they
reach the same proven optimum, and what the cross-check costs.
"""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.table import Table

from synth.cli import format_seconds
from synth.constraints import cpsat, z3backend
from synth.constraints.result import SolveResult
from synth.lang import list_builtin_workloads
from synth.pipeline import Request, encode, hardware, parse


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="*", default=list_builtin_workloads())
    parser.add_argument("--hardware", nargs="*", default=["upmem", "cpu"])
    parser.add_argument("--z3-time-limit", type=float, default=120.0, metavar="S")
    args = parser.parse_args()
    table = Table("workload", "hw", "CP-SAT", "z3", "same optimum", "CP-SAT time", "z3 time")
    agree = 0
    cases = [(w, h) for w in args.workloads for h in args.hardware]
    for workload, hw in cases:
        request = Request(workload, hw)
        cset = encode(parse(request), hardware(request)).constraints
        a, b = cpsat.solve(cset, 60.0), z3backend.solve(cset, args.z3_time_limit)
        same = (a.status, a.objective) == (b.status, b.objective)
        agree += same
        table.add_row(workload, hw, outcome(a), outcome(b), "yes" if same else "NO",
                      format_seconds(a.wall_s), format_seconds(b.wall_s))
        print(f"{workload}/{hw}: cpsat {outcome(a)}, z3 {outcome(b)} "
              f"({format_seconds(b.wall_s)})", flush=True)
    Console(width=140).print(table)
    print(f"{'PASS' if agree == len(cases) else 'FAIL'} z3 reaches CP-SAT's optimum: "
          f"{agree}/{len(cases)} cases")


def outcome(result: SolveResult) -> str:
    """Status and objective (a time-out may have none)."""
    if result.objective is None:
        return result.status.value
    return f"{result.status.value} {result.objective:,}"


if __name__ == "__main__":
    main()
