"""The emitters, in one table: a target's name -> how to emit, check and report it.

Adding a target touches its own module and `TARGETS` below, nothing else: the pipeline,
the JSON report and the human output all go through `target(name)`. Modules are
imported only when their target is used, so `synth --help` does not load them.

A target module defines one object with the `Target` protocol:

- `name`: what `--emit` takes;
- `require(hw, validate)`: before solving, raise `InputError` when the target cannot be
  used here (a hardware model it does not run on, a missing checker);
- `emit(program, workload, hw, out_dir, inputs, expected, bounds)`: write the files
  (with the reference outputs and their error bounds, `synth.reference.evaluate_errors`),
  return them;
- `check(out_dir)`: build and run them against the reference data written beside them;
- `json(check)`: the target's own keys of `"emitted": {name: {...}}` (None values when
  the check did not run);
- `lines(path, files, check)`: the human summary.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from synth.errors import InputError
from synth.hardware import Hardware
from synth.ir.nodes import Program
from synth.workload import Workload


class Check(Protocol):
    """What every target's check result has."""

    @property
    def passed(self) -> bool: ...

    @property
    def seconds(self) -> float: ...

    @property
    def log(self) -> str: ...


class Target(Protocol):
    name: str

    def require(self, hw: Hardware, validate: bool) -> None: ...

    def emit(self, program: Program, workload: Workload, hw: Hardware, out_dir: Path,
             inputs: Mapping[str, np.ndarray], expected: Mapping[str, np.ndarray],
             bounds: Mapping[str, np.ndarray]) -> Sequence[Path]: ...

    def check(self, out_dir: Path) -> Check: ...

    def json(self, check: Check | None) -> dict[str, Any]: ...

    def lines(self, path: str, files: Sequence[str], check: Check | None) -> str: ...


# name -> "module:attribute" of its Target object
TARGETS: Mapping[str, str] = {
    "upmem": "synth.emit.upmem:TARGET",
    "mlir": "synth.emit.mlir_target:TARGET",
    "c": "synth.emit.c_target:TARGET",
    "ttlang": "synth.emit.ttlang_target:TARGET",
}


# targets whose emitter writes `OnlineCombine` (the merge of an online pass split across
# units); `--emit` of any other keeps every online pass in one unit (group online.split,
# `online_terms.whole_pass_constraints`), so that it is never handed a split it cannot write
MERGES_ONLINE = frozenset({"upmem"})


def names() -> tuple[str, ...]:
    return tuple(TARGETS)


def target(name: str) -> Target:
    """The target called `name` (its module imported now); unknown names are bad input."""
    if name not in TARGETS:
        raise InputError(f"--emit {name}: unknown target; expected one of "
                         f"{', '.join(TARGETS)}")
    module, attribute = TARGETS[name].split(":")
    found: Target = getattr(importlib.import_module(module), attribute)
    return found


@dataclass(frozen=True)
class Emitted:
    """The program's source for one target, and the result of building and running it
    against the reference (None when validation is off)."""

    target: str
    path: str
    files: tuple[str, ...]
    check: Check | None

    def json(self) -> dict[str, Any]:
        """`{target: {"path", "files", "checked", ...the target's keys}}`."""
        data: dict[str, Any] = {"path": self.path, "files": list(self.files),
                                "checked": self.check is not None}
        data.update(target(self.target).json(self.check))
        return {self.target: data}

    def lines(self) -> str:
        return target(self.target).lines(self.path, self.files, self.check)
