"""Shared helpers of the solver and IR tests: cached models, solutions and samples, and
the rewriting of loop nests that the mutation tests use.

Models, optima and random schedules are pure functions of their arguments (the solver
runs with one worker and a fixed seed; the sampler is seeded), so they are computed once
per session and shared between tests.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest

from synth import hwunits
from synth.constraints import cpsat
from synth.constraints import expr as ex
from synth.constraints.cost import Model
from synth.constraints.result import SolveResult, Status
from synth.constraints.sample import random_schedule
from synth.constraints.space import ConstraintSet
from synth.constraints.user import user_constraints
from synth.errors import IRError
from synth.hardware import Hardware
from synth.hwfile import load_hardware
from synth.ir.materialize import materialize
from synth.ir.nodes import Loop, LoopKind, Node, Program, walk
from synth.ir.verify import verify
from synth.lang import load_workload, parse_workload, read_workload
from synth.pipeline import encode
from synth.workload import Workload

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


# ---------------------------------------------------------------- the machine the tests see


@dataclass(frozen=True)
class FakeMachine:
    """What the `cpu` model reads off the running machine (`synth.hwunits`): the CPU's
    flags (/proc/cpuinfo) and its caches (sysfs: level, type, size, ways)."""

    flags: str
    caches: tuple[tuple[int, str, str, int], ...]

    def write(self, root: Path) -> tuple[Path, Path]:
        """The fake /proc/cpuinfo and cpu0/cache directory under `root`, which stands for
        `/` (`SYNTH_FSROOT`)."""
        cpuinfo, cache = hwunits.machine_files(root)
        cpuinfo.parent.mkdir(parents=True, exist_ok=True)
        cpuinfo.write_text(f"processor\t: 0\nflags\t\t: {self.flags}\n")
        for index, (level, kind, size, ways) in enumerate(self.caches):
            entry = cache / f"index{index}"
            entry.mkdir(parents=True, exist_ok=True)
            for name, value in (("level", level), ("type", kind), ("size", size),
                                ("ways_of_associativity", ways)):
                (entry / name).write_text(f"{value}\n")
        return cpuinfo, cache


# The development machine the cpu tests' numbers were worked out on (docs/hardware-facts.md):
# an Intel Xeon with AVX-512, L1d 48 KiB 12-way, L2 2 MiB, L3 480 MiB
XEON = FakeMachine("fpu sse2 avx avx2 fma avx512f",
                   ((1, "Data", "48K", 12), (1, "Instruction", "32K", 8),
                    (2, "Unified", "2048K", 16), (3, "Unified", "491520K", 15)))
# another seen here: an AMD EPYC (Zen 3) with AVX2, L1d 32 KiB 8-way, L2 512 KiB, L3 32 MiB
ZEN3 = FakeMachine("fpu sse2 avx avx2 fma",
                   ((1, "Data", "32K", 8), (1, "Instruction", "32K", 8),
                    (2, "Unified", "512K", 8), (3, "Unified", "32768K", 16)))


def pytest_configure(config: pytest.Config) -> None:
    """Every test sees the same CPU, whatever machine runs the suite: the `cpu` model's
    caches and vector width are the development Xeon's (`XEON`), not this machine's, in
    this process and in every process it starts (`SYNTH_FSROOT`). The emitted C still runs
    here (`synth_vec.h` falls back to generic vectors where the machine lacks the ISA). A
    test that wants another machine uses `on_machine`; one that measures this machine,
    `the_real_machine`."""
    root = Path(tempfile.mkdtemp(prefix="synth-tests-machine-"))
    config.add_cleanup(lambda: shutil.rmtree(root, ignore_errors=True))
    hwunits.CPUINFO, hwunits.CACHE_DIR = XEON.write(root)
    os.environ["SYNTH_FSROOT"] = str(root)


@pytest.fixture
def on_machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[FakeMachine], None]:
    """`on_machine(ZEN3)`: the `cpu` model reads that machine for the rest of the test (in
    this process)."""
    def use(machine: FakeMachine) -> None:
        cpuinfo, cache = machine.write(tmp_path / "machine")
        monkeypatch.setattr(hwunits, "CPUINFO", cpuinfo)
        monkeypatch.setattr(hwunits, "CACHE_DIR", cache)
    return use


@contextlib.contextmanager
def the_real_machine() -> Iterator[None]:
    """Within it, the `cpu` model reads the machine running the suite, as outside it: for
    tests that measure this machine (`synth calibrate`)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("SYNTH_FSROOT", raising=False)
        cpuinfo, cache = hwunits.machine_files(Path("/"))
        patch.setattr(hwunits, "CPUINFO", cpuinfo)
        patch.setattr(hwunits, "CACHE_DIR", cache)
        yield


def benchmark_module(name: str) -> ModuleType:
    """A script of benchmarks/ as a module (benchmarks/ is not a package)."""
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    return importlib.import_module(name)


# UPMEM with few units, so that spaces stay small enough to enumerate
SMALL_UPMEM = ("rank.count=1..2", "dpu.count=1..4", "tasklet.count=1..4")
# The CPU's core count is this machine's ("1..auto"); pinned where a space must stay small
TWO_CORES = ("core.count=1..2",)

# A row sum over rows 4 KiB apart (all in one set of a 12-way 48 KiB L1d): the cpu model's
# aliasing, gather and vector-dimension tests
ROW_SUM = """
size S = 64
size D = 1024
in  x : f32[S, D]
out sm : f32[S]
sm[s] += x[s, d]
"""


def gemm(m: int, n: int, k: int) -> str:
    """An f32 GEMM C = A B (M x K times K x N) without a fill: the cpu model's tests."""
    return (f"size M = {m}\nsize N = {n}\nsize K = {k}\nin  A : f32[M, K]\n"
            "in  B : f32[K, N]\nout C : f32[M, N]\nC[m, n] += A[m, k] * B[k, n]\n")


def qk(s: int, d: int) -> str:
    """Attention's scores s = Q K^T (S x D each), f32: the cpu model's tests."""
    return (f"size S = {s}\nsize D = {d}\nin  Q : f32[S, D]\nin  K : f32[S, D]\n"
            "out s : f32[S, S]\ns[i, j] += Q[i, d] * K[j, d]\n")


# The UPMEM model before issue 13's measured numbers (double-buffered WRAM, host transfers
# per row and DPU): the tests of the machinery it exercised (double buffering, prefetch in
# the emitted C, printed nests) keep using it; the built-in upmem is the measured model.
UPMEM_PRIOR = str(Path(__file__).parent / "data" / "upmem_prior.toml")

@dataclass(frozen=True)
class Case:
    """A workload (built-in name, or `.syn` text) on a hardware model, with overrides."""

    workload: str
    hardware: str
    sizes: tuple[tuple[str, int], ...] = ()
    overrides: tuple[str, ...] = ()
    text: str | None = None  # `.syn` source instead of a built-in

    @staticmethod
    def of(workload: str, hardware: str, sizes: Mapping[str, int] | None = None,
           overrides: Sequence[str] = (), text: str | None = None) -> Case:
        return Case(workload, hardware, tuple(sorted((sizes or {}).items())),
                    tuple(overrides), text)

    @property
    def id(self) -> str:
        sizes = ",".join(f"{k}={v}" for k, v in self.sizes)
        extra = "+hw-set" if self.overrides else ""
        return f"{self.workload}/{self.hardware}[{sizes}]{extra}"


@dataclass(frozen=True)
class Built:
    workload: Workload
    hw: Hardware
    model: Model


@functools.cache
def build(case: Case) -> Built:
    if case.text is not None:
        workload = parse_workload(case.text, f"{case.workload}.syn", case.workload,
                                  dict(case.sizes))
    else:
        workload = load_workload(case.workload, dict(case.sizes))
    hw = load_hardware(case.hardware, case.overrides)
    return Built(workload, hw, encode(workload, hw))


# Solver verdicts in tests come from deterministic work (CP-SAT's deterministic time per
# call, one worker, a fixed seed), not from the wall clock: WALL_S is a safety net far
# past any case, so a loaded or slow machine gives the same verdicts.
WORK_S = 60.0
WALL_S = 1800.0


def solve(cset: ConstraintSet, work_s: float = WORK_S, cutoff: int | None = None
          ) -> SolveResult:
    """CP-SAT on `cset` within `work_s` deterministic seconds per call."""
    return cpsat.solve(cset, WALL_S, cutoff=cutoff, work_limit_s=work_s)


def solved_on_cpu(text: str, hw_set: tuple[str, ...] = (), fixes: tuple[str, ...] = ()
                  ) -> tuple[Model, dict[str, int]]:
    """Workload `text` encoded for the `cpu` model (with `--hw-set` and `--fix` values)
    and solved to optimality: the model and the optimum's values."""
    model = encode(parse_workload(text, "<test>", "w"), load_hardware("cpu", hw_set),
                   fixes=fixes)
    result = solve(model.constraints)
    assert result.status is Status.OPTIMAL and result.env is not None, result.status
    return model, dict(result.env)


@functools.cache
def optimum(case: Case) -> SolveResult:
    return solve(build(case).model.constraints)


def forced(case: Case, fix: str, *more: str) -> tuple[Built, Program]:
    """`case` solved with the user constraint `fix` (a `--fix` text; `more` of them)
    added, materialised."""
    built = build(case)
    extra = user_constraints(built.model, (), (fix, *more))
    cset = dataclasses.replace(built.model.constraints,
                               constraints=built.model.constraints.constraints + tuple(extra))
    result = solve(cset)
    assert result.env is not None, result.status
    model = dataclasses.replace(built.model, constraints=cset)
    return built, materialize(model, result.env)


@functools.cache
def optimal_program(case: Case) -> Program:
    result = optimum(case)
    assert result.env is not None, f"{case.id}: no schedule ({result.status})"
    return materialize(build(case).model, result.env)


@functools.cache
def sample(case: Case, seed: int) -> Mapping[str, int] | None:
    return random_schedule(build(case).model.constraints, seed)


def memory_usage(model: Model, env: Mapping[str, int]) -> dict[str, int]:
    """Bytes per instance of each memory below the root that the model's capacity
    constraints count (`capacity.<memory>`), the most of any kernel."""
    usage: dict[str, int] = {}
    for constraint in model.constraints.constraints:
        if constraint.group.startswith("capacity."):
            cond = constraint.cond
            if isinstance(cond, ex.AnyOf):  # a candidate kernel's: (fuse.K == 0) or (...)
                chosen, cond = cond.conds
                if ex.holds(chosen, env):
                    continue
            assert isinstance(cond, ex.Cmp)
            memory = constraint.group.split(".", 1)[1]
            used = ex.evaluate(cond.lhs, env)
            usage[memory] = max(usage.get(memory, 0), used)
    return usage


def check_capacity_boundary(program: Program, workload: Workload, model: Model,
                            env: Mapping[str, int], hardware: str,
                            overrides: Sequence[str]) -> None:
    """The verifier measures exactly what the capacity constraints count: the program
    fits each memory with exactly that many usable bytes, and not with one byte less."""
    for memory, used in memory_usage(model, env).items():
        reserved = model.hw.memory(memory).reserved
        exact = load_hardware(hardware, (*overrides, f"{memory}.capacity={used + reserved}B"))
        verify(program, workload, exact)
        if used > 1:
            less = load_hardware(hardware,
                                 (*overrides, f"{memory}.capacity={used + reserved - 1}B"))
            with pytest.raises(IRError, match=rf"expected tiles in one {memory} to fit "
                                              rf"{used - 1} bytes, got {used}"):
                verify(program, workload, less)


# ---------------------------------------------------------------- rewriting loop nests

Rewrite = Callable[[Node], "Node | list[Node] | None"]


def rewrite_nodes(nodes: tuple[Node, ...], fn: Rewrite) -> tuple[Node, ...]:
    """Apply `fn` to every node, innermost first: it returns the node (or a new one), a
    list of nodes to put in its place, or None to drop it."""
    out: list[Node] = []
    for node in nodes:
        if isinstance(node, Loop):
            node = dataclasses.replace(node, body=rewrite_nodes(node.body, fn))
        result = fn(node)
        if result is None:
            continue
        out.extend(result if isinstance(result, list) else [result])
    return tuple(out)


def rewrite(program: Program, kernel: str, fn: Rewrite) -> Program:
    """`program` with `fn` applied to the nodes of one kernel (which must exist): the
    kernel of that name, or else the one that runs the statement of that name (which
    the optimum may have fused with others)."""
    names = [k.name for k in program.kernels]
    if kernel not in names:
        owners = [k.name for k in program.kernels if kernel in k.statements]
        assert owners, f"no kernel {kernel} in {names}"
        kernel = owners[0]
    kernels = tuple(dataclasses.replace(k, body=rewrite_nodes(k.body, fn))
                    if k.name == kernel else k for k in program.kernels)
    return dataclasses.replace(program, kernels=kernels)


def count_nodes(program: Program, kind: type, kernel: str | None = None) -> int:
    return sum(isinstance(node, kind) for k in program.kernels
               if kernel is None or k.name == kernel for node in walk(k.body))


def parallel_loops(program: Program) -> list[Loop]:
    return [node for k in program.kernels for node in walk(k.body)
            if isinstance(node, Loop) and node.var.kind is LoopKind.PARALLEL]


# small problems the brute-force enumerator finishes: the ground truth for every solver
EXHAUSTIVE_CASES = [
    Case.of("softmax", "upmem", {"N": 16}, SMALL_UPMEM),
    Case.of("softmax", "upmem", {"N": 24}, SMALL_UPMEM),
    Case.of("softmax", "cpu", {"N": 17}, TWO_CORES),  # prime
    Case.of("red", "upmem", {"N": 13}, SMALL_UPMEM),  # split reduction, padded
    Case.of("va", "upmem", {"N": 20}, SMALL_UPMEM),
    Case.of("mv", "upmem", {"M": 8, "N": 8}, SMALL_UPMEM),
    # the cpu's five memory slots (registers included) multiply the space: small sizes
    Case.of("mv", "cpu", {"M": 4, "N": 8}, TWO_CORES),
    Case.of("matmul", "cpu", {"M": 4, "N": 2, "K": 2}, TWO_CORES),
    Case.of("attention", "cpu", {"S": 2, "D": 4}, TWO_CORES),
]


# ---------------------------------------------------------------- tt-lang workloads

F32_MATMUL = """size M = 64
size N = 64
size K = 128
in  A : f32[M, K]
in  B : f32[K, N]
out C : f32[M, N]
C[m, n]  = 0
C[m, n] += A[m, k] * B[k, n]
"""
# the fill and the product fused, C accumulated over 4 blocks of k
SPLIT_K = ("fuse.C#1_C#2=1", "Q.C#1_C#2.k=32")


def f32_matmul(directory: Path) -> Path:
    """`F32_MATMUL` as a workload file in `directory`."""
    path = directory / "mm.syn"
    path.write_text(F32_MATMUL)
    return path


def f32_twin(builtin: str, directory: Path) -> Path:
    """An i32 built-in over f32 (tt-lang-sim 1.1.6 has no int32), as a file."""
    twin = directory / f"{builtin}.syn"
    twin.write_text(read_workload(builtin)[0].replace("i32", "f32"))
    return twin
