"""Grammar-aware fuzzing of the CLI (issue 12): generated workloads, hardware files and
option values, each run through `synth.cli.app` in a forked process, end with an exit
code of 0-4 (never 70, an internal error) and within a watchdog.

The inputs come from `benchmarks/fuzz.py`'s generators, driven by hypothesis (which
shrinks a failure to a small input); the budgets are deterministic: small sizes, a time
limit of 2 s per solve, no validation of large problems, and a fixed number of examples
with a fixed seed. The watchdog (`fuzz.KILL_AFTER_S`) only catches a hang, far above any
budget, so the verdict does not depend on the machine's speed. The benchmark runs
thousands of such inputs and reports their times (`benchmarks/RESULTS.md`).
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from conftest import benchmark_module
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

fuzz = benchmark_module("fuzz")
FUZZ = settings(max_examples=30, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])
LIMIT = ["--time-limit", "2"]


def run(case: object, tmp_path: Path) -> object:
    results = fuzz.run_all([case], 1, tmp_path, lambda result: None)
    assert len(results) == 1
    return results[0]


def check(result: object) -> None:
    assert result.code in (0, 1, 2, 3, 4), (result.case.args, result.case.files,
                                           result.stderr)
    assert not result.killed, (result.case.args, result.case.files)
    assert "internal error" not in result.stderr and "Traceback" not in result.stderr


@pytest.fixture(scope="module", autouse=True)
def _preloaded() -> None:
    fuzz.preload()


@FUZZ
@given(rng=st.randoms(use_true_random=False))
def test_generated_workloads(rng: random.Random, tmp_path_factory: pytest.TempPathFactory
                             ) -> None:
    text, small = fuzz.workload(rng)
    flags = LIMIT + ([] if small else ["--no-validate"])
    case = fuzz.Case("workload", ["solve", "{dir}/w.syn", "--hw",
                                  rng.choice(["upmem", "cpu", "aie"]), *flags],
                     {"w.syn": text})
    check(run(case, tmp_path_factory.mktemp("w")))


@FUZZ
@given(rng=st.randoms(use_true_random=False))
def test_generated_hardware_files(rng: random.Random,
                                  tmp_path_factory: pytest.TempPathFactory) -> None:
    case = fuzz.Case("hardware", ["solve", "softmax", "--hw", "{dir}/hw.toml", "--set",
                                  "N=4096", *LIMIT], {"hw.toml": fuzz.hardware(rng)})
    check(run(case, tmp_path_factory.mktemp("h")))


@FUZZ
@given(rng=st.randoms(use_true_random=False))
def test_generated_options(rng: random.Random, tmp_path_factory: pytest.TempPathFactory
                           ) -> None:
    name = rng.choice(["softmax", "mv", "matmul"])
    sizes = [a for s in fuzz.BUILTINS[name]
             for a in ("--set", f"{s}={fuzz.SMALL_BUILTIN_SIZES[s]}")]
    extra = fuzz.options(rng, fuzz.BUILTINS[name])
    given_sizes = {extra[k + 1].partition("=")[0] for k in range(0, len(extra), 2)
                   if extra[k] == "--set"}
    sizes = [a for k in range(0, len(sizes), 2) for a in sizes[k:k + 2]
             if sizes[k + 1].partition("=")[0] not in given_sizes]
    case = fuzz.Case("options", ["solve", name, "--hw", rng.choice(["upmem", "cpu", "aie"]),
                                 *sizes, *extra, *LIMIT, "--no-validate"])
    check(run(case, tmp_path_factory.mktemp("o")))


@pytest.mark.parametrize("label", [label for label, _, _ in fuzz.REPRODUCERS])
def test_issue_reproducers(label: str, tmp_path: Path) -> None:
    case = next(c for c in fuzz.reproducers() if c.label.endswith(label))
    result = run(case, tmp_path)
    check(result)
    assert result.code == 2 or label.startswith("va aux"), (label, result.stderr)


def test_a_builtin_validates_only_where_its_largest_tensor_is_small() -> None:
    """--time-limit bounds the solver, not validation: a run validates only where its
    largest tensor (fa6's S x S scores at S=4096: 2^24 elements) stays under the cap."""
    small = fuzz.SMALL_BUILTIN_SIZES
    assert fuzz.builtin_elements("fa6", small) <= fuzz.VALIDATE_POINTS
    assert fuzz.builtin_elements("fa6", {**small, "S": "4096"}) == 4096 * 4096
    assert fuzz.builtin_elements("matmul", small) == 64 * 4096  # A, B, C: the largest
