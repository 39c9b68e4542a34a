"""What every solver backend returns."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field


class Status(enum.Enum):
    OPTIMAL = "optimal"
    FEASIBLE = "feasible"  # a solution, optimality not proven within the time limit
    INFEASIBLE = "infeasible"
    TIMEOUT = "timeout"  # no solution within the time limit


WHY_NO_SCHEDULE = ("unknown", "unsupported")
"""The `stats` keys of a solver's reason for a TIMEOUT (z3's reason_unknown, or what its
encoding cannot express), in the order a message prefers them."""


@dataclass(frozen=True)
class SolveResult:
    solver: str
    status: Status
    wall_s: float
    env: Mapping[str, int] | None = None  # every variable's value, when a solution exists
    objective: int | None = None
    bound: int | None = None  # proven lower bound on the objective
    stats: Mapping[str, int | float | str] = field(default_factory=dict)
