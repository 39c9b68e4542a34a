"""The README's example outputs are what synth prints today: each block between the
README's example markers is compared with a fresh run of its command
(`benchmarks/readme_examples.py`: durations and float errors masked, spacing ignored).
Regenerate them with `python benchmarks/readme_examples.py`."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import benchmark_module

examples = benchmark_module("readme_examples")
README_BLOCKS = examples.blocks_in(examples.README.read_text(encoding="utf-8"))


def test_every_example_marker_is_known_and_every_example_is_used() -> None:
    assert set(README_BLOCKS) == set(examples.EXAMPLES)


@pytest.mark.parametrize("name", sorted(README_BLOCKS))
def test_readme_example_has_not_drifted(name: str, tmp_path: Path) -> None:
    fresh = examples.block(name, str(tmp_path / "sm"))
    expected = examples.structure(README_BLOCKS[name])
    assert examples.structure(fresh) == expected, (
        f"README example {name!r} drifted; run python benchmarks/readme_examples.py\n"
        f"--- README\n{README_BLOCKS[name]}\n--- now\n{fresh}")


def test_masks_durations_and_float_errors_only() -> None:
    a = ("x: optimal, objective 1.2 ms, solve time 3.4 ms (cpsat), total time 5 s\n"
         "validation: passed, max abs err 1e-07, max rel err 0.003, 2% of the error bound "
         "(1.5 s)\n 1  on  optimal  1.225 ms  +0.0%  51.96 ms  none")
    b = ("x: optimal, objective 1.2 ms, solve time 9 ms (cpsat), total time 7.25 s\n"
         "validation: passed, max abs err 0, max rel err 0, 5% of the error bound "
         "(2 ms)\n 1  on  optimal     1.225 ms  +0.0%  7 ms  none")
    assert examples.structure(a) == examples.structure(b)
    assert examples.structure(a) != examples.structure(a.replace("1.225 ms", "1.226 ms"))
    assert examples.structure(a) != examples.structure(a.replace("optimal,", "feasible,"))
