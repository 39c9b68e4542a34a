"""Regenerate the README's example outputs from real runs of synth.

    python benchmarks/readme_examples.py           # rewrite README.md's example blocks
    python benchmarks/readme_examples.py --check   # exit 1 when a block has drifted

Each example block of README.md sits between two markers,

    <!-- example: NAME -->
    ```text
    ...
    ```
    <!-- /example -->

and NAME is one of `EXAMPLES` below: a command, run as `python -m synth.cli ...` with
COLUMNS=100 (the README shows a 100-column terminal), and how its output is cut for the
README (the whole output, its first and last lines, or a loop nest trimmed after its
first kernels). `--check` and tests/test_readme.py compare what does not depend on the
machine: every line with its durations masked (solve, total, proof, validation and
check times; the objective and costs are the model's and stay) and the validation's float
errors masked (NumPy's math functions may round differently on another CPU), and its
spacing ignored (column widths follow the durations' lengths).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
COLUMNS = "100"  # the terminal width the README's examples show
EMIT_DIR = "/tmp/sm"  # the --emit example's directory, as the README shows it
OUT = "{out}"  # where an example's --out goes; `block` puts a real directory there

Shape = Callable[[list[str]], list[str]]


def whole(lines: list[str]) -> list[str]:
    return lines


def ends(first: int, last: int) -> Shape:
    """The first `first` and the last `last` lines, `[...]` between."""
    return lambda lines: [*lines[:first], "[...]", *lines[-last:]] if last else lines[:first]


def last(count: int) -> Shape:
    return lambda lines: lines[-count:]


def section(title: str) -> Shape:
    """From the line `title` (a table's) to the blank line after the text below it."""
    def cut(lines: list[str]) -> list[str]:
        start = lines.index(title)
        body = next(k for k in range(start + 1, len(lines)) if lines[k].strip())
        end = next((k for k in range(body, len(lines)) if not lines[k].strip()), len(lines))
        return lines[start:end]
    return cut


def trimmed_nest(kernels: int) -> Shape:
    """The whole output with the loop nest cut after its first `kernels` kernels."""
    def cut(lines: list[str]) -> list[str]:
        nest = lines.index("Loop nest")
        starts = [k for k in range(nest, len(lines)) if lines[k].startswith("kernel ")]
        end = lines.index("", nest)
        if len(starts) <= kernels:
            return lines
        names = [lines[k].split()[1] for k in starts[kernels:]]
        note = f"[... kernel {', '.join(names)} trimmed for this README ...]"
        return [*lines[:starts[kernels]], note, *lines[end:]]
    return cut


@dataclass(frozen=True)
class Example:
    args: tuple[str, ...]
    shape: Shape = whole
    prompt: bool = False  # show the command as `$ synth ...` above the output


EXAMPLES: dict[str, Example] = {
    "quickstart": Example(("solve", "softmax", "--hw", "upmem"), trimmed_nest(2)),
    "binding": Example(("solve", "softmax", "--hw", "upmem", "--set", "N=4096",
                        "--constraint", "T <= 4", "--binding", "--no-validate"),
                       section("Constraint groups at the optimum"), prompt=True),
    "tune": Example(("tune", "softmax", "--hw", "upmem", "--set", "N=4096",
                     "--vary", "wram.capacity=2056B,4KiB,64KiB",
                     "--vary", "drop:capacity.wram=on,off", "--binding"), prompt=True),
    "range": Example(("solve", "softmax", "--hw", "upmem", "--set", "N=1024..65536:1024"),
                     ends(1, 4), prompt=True),
    "emit": Example(("solve", "softmax", "--hw", "upmem", "--emit", "upmem", "--out", OUT),
                    last(2), prompt=True),
}


def run(example: Example, out_dir: str) -> list[str]:
    """The example's output lines, as a 100-column terminal would show them, with
    `out_dir` for its `--out` (shown as `EMIT_DIR`)."""
    env = {**os.environ, "COLUMNS": COLUMNS, "NO_COLOR": "1"}
    args = [out_dir if a == OUT else a for a in example.args]
    proc = subprocess.run([sys.executable, "-m", "synth.cli", *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"synth {' '.join(args)} exited {proc.returncode}: {proc.stderr}")
    return proc.stdout.rstrip("\n").replace(out_dir, EMIT_DIR).split("\n")


def block(name: str, out_dir: str = EMIT_DIR) -> str:
    """The text of one example block (without the fence); `out_dir` is where an example
    with `--out` writes (the README shows `EMIT_DIR`)."""
    example = EXAMPLES[name]
    lines = example.shape(run(example, out_dir))
    if example.prompt:
        lines = [prompt([EMIT_DIR if a == OUT else a for a in example.args]), *lines]
    return "\n".join(line.rstrip() for line in lines)


def prompt(args: Sequence[str]) -> str:
    """`$ synth ARGS`, quoted as a shell needs, wrapped before `--vary`/`--emit`."""
    words = [f"'{a}'" if re.search(r"[\s<>*]", a) else a for a in args]
    text = "$ synth " + " ".join(words)
    if len(text) > 90 and " --vary " in text:
        head, _, rest = text.partition(" --vary ")
        text = f"{head} \\\n      --vary {rest}"
    return text


MARKER = re.compile(r"<!-- example: (?P<name>[\w-]+) -->\n```text\n(?P<body>.*?)\n```\n"
                    r"<!-- /example -->", re.DOTALL)


def blocks_in(text: str) -> dict[str, str]:
    return {m.group("name"): m.group("body") for m in MARKER.finditer(text)}


def rewrite(text: str, bodies: dict[str, str]) -> str:
    return MARKER.sub(lambda m: (f"<!-- example: {m.group('name')} -->\n```text\n"
                                 f"{bodies.get(m.group('name'), m.group('body'))}\n```\n"
                                 "<!-- /example -->"), text)


DURATION = r"[0-9.]+ (?:s|ms|µs|ns|ps)"
_MASKS = [
    (re.compile(rf"(solve time|total time) {DURATION}"), r"\1 <t>"),
    (re.compile(rf"\({DURATION}\)$", re.MULTILINE), "(<t>)"),
    (re.compile(rf"([%-]\s+){DURATION}"), r"\1<t>"),  # tune's solve column, after vs best
    # float errors of a validation: NumPy's math may round differently on another CPU
    (re.compile(r"max (abs|rel) err [0-9.e+-]+"), r"max \1 err <e>"),
    (re.compile(r"[0-9]+% of the error bound"), "<p> of the error bound"),
]


def structure(text: str) -> str:
    """What must not drift: the text with durations masked and spacing and table rules
    removed (wrapped table cells then read the same whatever the column widths)."""
    for pattern, replacement in _MASKS:
        text = pattern.sub(replacement, text)
    return re.sub(r"[\s─]+", "", text)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 when a README block differs from a fresh run")
    args = parser.parse_args(argv)
    text = README.read_text(encoding="utf-8")
    found = blocks_in(text)
    unknown = sorted(set(found) - set(EXAMPLES))
    if unknown:
        parser.error(f"README.md has example markers this script does not know: {unknown}")
    fresh = {name: block(name) for name in found}
    if args.check:
        drifted = [name for name in found if structure(found[name]) != structure(fresh[name])]
        for name in drifted:
            print(f"README example {name!r} drifted; regenerate with "
                  f"python benchmarks/readme_examples.py", file=sys.stderr)
        return 1 if drifted else 0
    README.write_text(rewrite(text, fresh), encoding="utf-8")
    print(f"rewrote {len(fresh)} example blocks of README.md: {', '.join(fresh)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
