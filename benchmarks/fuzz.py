"""Fuzz synth's command line with generated workloads, hardware files and options.

    python benchmarks/fuzz.py [--count 3000] [--seed 12] [--jobs 2] [--keep DIR]
                              [--markdown PATH]

A generator with a fixed seed writes `--count` inputs (plus every reproducer of issue
12, `REPRODUCERS`): `.syn` workloads built from the language's grammar and then bent
(pathological nesting, huge or non-ASCII numbers, literals of the wrong type, stray
characters and line separators, missing outputs), hardware models built from the
built-in TOML files with keys changed, removed or added (reserved symbols, odd
alignments, quantities past 64 bits, infinities), and option values (`--set`,
`--hw-set`, `--fix`, `--constraint`, `--drop`, `--vary`, `--time-limit`, `--solver`,
`--emit`). Each runs through the real CLI (`synth.cli.app`) in a process forked from
one that has already imported synth, so a run costs its work, not Python's start-up,
and a run that hangs can be killed.

It reports how many runs ended with each exit code, and lists every run that exited 70
(an internal error: a bug) or that ran past its budget: its time limit (`--time-limit`,
per variant for `synth tune`) plus `SLACK_S`. The targets (issue 12): no exit 70, no run
past its budget. Runs whose check failed (exit 4) are listed too, to be looked at. `--keep
DIR` writes the failing inputs there (and those of exit 4), with the command to
reproduce each. The last line says PASS or FAIL; the script itself exits 0 unless its
command line is bad. Run it on an idle machine: budgets are wall-clock times.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import math
import os
import platform
import random
import shlex
import signal
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SEED = 12  # issue 12
SLACK_S = 5.0  # a run may take its time limit plus this (the target)
DEFAULT_LIMIT_S = 5.0  # the --time-limit of most generated runs
VALIDATE_POINTS = 2**20  # a workload validates when its sizes multiply to at most this:
# validation runs the whole workload, which --time-limit does not bound (it bounds the
# solver), so a budget of the time limit + SLACK_S holds for small problems only
KILL_AFTER_S = 120.0  # a run still going then is killed and counted as past its budget
ROOT = Path(__file__).resolve().parent.parent

# ---------------------------------------------------------------- value pools

SMALL_SIZES = ["1", "2", "3", "4", "7", "8", "16", "17", "32", "64", "100", "128", "256",
               "1000", "1024", "4096"]
LARGE_SIZES = ["65536", "1048576", "104858592", str(2**31 - 1)]
BAD_SIZES = ["0", "-4", str(2**31), str(2**32), str(2**63), "1e20", "9" * 400, "٣٢", "２",
             "²", "3²", "4.0", "0x10", ""]
INTS = ["0", "1", "2", "4", "11", "16", "60", "64", "-1", "1024", "1", "2", "4", "8", "16",
        "32", "64", "1", "4", "16", str(2**53), str(2**63), "-9223372036854775808",
        "99999999999999999999", "٣", "²", "1e3"]
FLOATS = ["0.5", "1.0", "1e-5", ".5", "2.5e3", "1e39", "1e400", "3.4e38"]
DTYPES = ["f32", "f32", "f32", "i32", "i32", "f16", "bf16", "i16", "i8"]
FUNCS1 = ["exp", "log", "sqrt", "rsqrt", "recip", "tanh", "abs", "relu"]
FUNCS2 = ["max", "min"]
NOISE = ["\u2028", "\u2029", "\x0c", "\x0b", "\x85", "\r", "\t", "٣", "²", "Ω", "@", "$",
         "[", "]", "(", ")", ",", "=", "+=", "#", "\x00", "é"]
SIZE_VALUES = ["64KiB", "32KiB", "1KiB", "8B", "0B", "3B", "1e20B", "1.5KiB", "-1",
               "64 furlongs", "٣٢KiB", "", 0, 1, 2**70, 4096, "16GiB"]
TIME_VALUES = ["20us", "1ns", "0", 0, "77cycles", "1e9s", "-5us", "1e-30s", "fast",
               "5µs", 10**30]
BANDWIDTH_VALUES = ["6.68GB/s", "2B/cycle", "1e-30GB/s", "0B/s", "1e30GB/s", "1GB",
                    "700MB/s"]
COUNT_VALUES = ["1..8", "1..16", "1..auto", "0..4", "4..1", "1..99999999999999999999", "²",
                "٣٢", 4, 0, -1, 2**40, "1..3"]
CYCLE_VALUES = [0, 1, 0.25, -1, 1e300, float("inf"), float("nan"), "3", 2**60]
SYMBOL_VALUES = ["fuse", "combine", "buffers", "pack", "ext", "online", "user", "T", "R",
                 "Ω", "", "1x", "a.b", "Q", "Z", "int"]
NAME_VALUES = ["wram", "mram", "core", "x y", "Ω", "", "l1", "fuse", "host"]
VARIABLES = ["R", "D", "T", "P", "X", "Y", "Q.y.i", "Q.m.i", "M.y.i", "fuse.e_s", "fuse.e",
             "combine.m.tasklet", "ext.y.i", "nope"]
GROUPS = ["capacity", "capacity.wram", "transfer", "transfer.wram", "count", "count.dpu",
          "tiling", "implied", "user", "fusion.cover", "nope", "capacity.l1"]
TIME_LIMITS = ["2", "5"] * 60 + ["1", "0", "-1", "nan", "inf", "1e9", "abc"]
SOLVERS = ["cpsat"] * 40 + ["z3"] * 4 + ["greedy"] * 3 + ["exhaustive", "bogus"]
VALID: dict[str, list[Any]] = {  # values a model could have, for mutations that keep it valid
    "capacity": ["64KiB", "32KiB", "4KiB", "1MiB", 65536], "reserved": ["0B", "1KiB", 0],
    "min": ["8B", "1B", 4], "max": ["2048B", "4096B", "1KiB"], "multiple": ["8B", "4B", 1],
    "align": ["8B", "4B", "1B", "64B"], "latency": ["100ns", "77cycles", "1us", 0],
    "launch": ["20us", "1us", "50us"], "barrier": ["0", "100ns", "50cycles"],
    "bandwidth": ["1GB/s", "2B/cycle", "10GB/s"], "count": ["1..4", "1..8", 2, "1..16"],
    "issue_share": [1, 2, 11], "clock": ["350MHz", "1GHz", "2.5GHz"],
    "streams": [False], "detect": ["L1d", "L2"],
}

# ---------------------------------------------------------------- inputs


@dataclass
class Case:
    """One run: the CLI arguments, files to write first (name -> text, `{dir}` in the
    arguments is where they are), and its budget."""

    label: str
    args: list[str]
    files: dict[str, str] = field(default_factory=dict)
    budget_s: float = DEFAULT_LIMIT_S + SLACK_S

    def argv(self, directory: Path) -> list[str]:
        return [a.replace("{dir}", str(directory)) for a in self.args]


REPRODUCERS: list[tuple[str, list[str], dict[str, str]]] = [
    ("empty workload", ["solve", "{dir}/w.syn", "--hw", "cpu"], {"w.syn": ""}),
    ("comments only", ["solve", "{dir}/w.syn", "--hw", "cpu"], {"w.syn": "# nothing\n\n"}),
    ("declarations only", ["solve", "{dir}/w.syn", "--hw", "cpu"],
     {"w.syn": "size N = 4\nin x : f32[N]\n"}),
    ("no output", ["solve", "{dir}/w.syn", "--hw", "cpu"],
     {"w.syn": "size N = 4\nin x : f32[N]\nt[i] = x[i]\n"}),
    ("parens 300", ["solve", "{dir}/w.syn", "--hw", "cpu"],
     {"w.syn": "size N = 4\nin x : f32[N]\nout y : f32[N]\ny[i] = " + "(" * 300 + "x[i]"
      + ")" * 300 + "\n"}),
    ("1000 minuses", ["solve", "{dir}/w.syn", "--hw", "cpu"],
     {"w.syn": "size N = 4\nin x : f32[N]\nout y : f32[N]\ny[i] = " + "-" * 1000 + "x[i]\n"}),
    ("200 exps", ["solve", "{dir}/w.syn", "--hw", "cpu"],
     {"w.syn": "size N = 4\nin x : f32[N]\nout y : f32[N]\ny[i] = " + "exp(" * 200 + "x[i]"
      + ")" * 200 + "\n"}),
    ("sum of 1000", ["solve", "{dir}/w.syn", "--hw", "cpu"],
     {"w.syn": "size N = 4\nin x : f32[N]\nout y : f32[N]\ny[i] = "
      + " + ".join(["x[i]"] * 1000) + "\n"}),
    ("constraint nested 1000", ["solve", "softmax", "--hw", "upmem", "--set", "N=4096",
                                "--constraint", "(" * 1000 + "T" + ")" * 1000 + " >= 1"], {}),
    ("fix past 64 bits", ["solve", "softmax", "--hw", "cpu", "--set", "N=4096", "--fix",
                          "P=99999999999999999999"], {}),
    ("constraint literal past 64 bits", ["solve", "softmax", "--hw", "upmem", "--set",
                                         "N=4096", "--constraint",
                                         "Q.y.i * 99999999999999999999 <= 1"], {}),
    ("count past 64 bits", ["solve", "softmax", "--hw", "cpu", "--set", "N=4096", "--hw-set",
                            "core.count=1..99999999999999999999"], {}),
    ("transfer min 1e20B", ["solve", "matmul", "--hw", "aie", "--hw-set",
                            "l1.transfer.min=1e20B"], {}),
    ("issue share 1e40", ["solve", "matmul", "--hw", "aie", "--hw-set",
                          "core.issue_share=1e40"], {}),
    ("bandwidth 1e-30GB/s", ["solve", "matmul", "--hw", "aie", "--hw-set",
                             "l1.bandwidth=1e-30GB/s"], {}),
    ("vary INT_MIN", ["tune", "softmax", "--hw", "upmem", "--set", "N=4096", "--vary",
                      "Y=-9223372036854775808"], {}),
    ("vary T INT_MIN", ["tune", "softmax", "--hw", "upmem", "--set", "N=4096", "--vary",
                        "T=-9223372036854775808"], {}),
    ("fa6 size 2^32", ["solve", "fa6", "--hw", "upmem", "--set", f"S={2**32}"], {}),
    ("va aux bound below int64", ["solve", "va", "--hw", "upmem", "--set", "N=104858592",
                                  "--fix", "R=1", "--fix", "D=60", "--fix", "T=16",
                                  "--no-validate"], {}),
    ("--set N=²", ["solve", "softmax", "--hw", "upmem", "--set", "N=²"], {}),
    ("--vary set:N=²", ["tune", "softmax", "--hw", "upmem", "--vary", "set:N=²"], {}),
    ("--hw-set count=²", ["solve", "softmax", "--hw", "cpu", "--set", "N=4096", "--hw-set",
                          "core.count=²"], {}),
    ("intrinsic 4x8x²", ["solve", "matmul", "--hw", "{dir}/hw.toml", "--set", "M=64",
                         "--set", "N=64", "--set", "K=64"], {"hw.toml": "INTRINSIC"}),
    ("arabic digits", ["solve", "softmax", "--hw", "cpu", "--hw-set", "core.count=٣٢",
                       "--set", "N=4096"], {}),
    ("fullwidth digit", ["solve", "softmax", "--hw", "cpu", "--set", "N=２"], {}),
    ("size 400 digits", ["solve", "{dir}/w.syn", "--hw", "cpu"],
     {"w.syn": "size N = " + "9" * 400 + "\nin x : f32[N]\nout y : f32[N]\ny[i] = x[i]\n"}),
    ("size 2^63", ["solve", "{dir}/w.syn", "--hw", "cpu"],
     {"w.syn": f"size N = {2**63}\nin x : f32[N]\nout y : f32[N]\ny[i] = x[i]\n"}),
    ("size 1e20", ["solve", "softmax", "--hw", "cpu", "--set", "N=100000000000000000000"],
     {}),
    ("symbol fuse", ["solve", "softmax", "--hw", "upmem", "--set", "N=4096", "--hw-set",
                     "wram.symbol=fuse"], {}),
    ("align 3B", ["solve", "softmax", "--hw", "upmem", "--set", "N=4096", "--hw-set",
                  "wram.transfer.align=3B"], {}),
    ("float literal to i32", ["solve", "{dir}/w.syn", "--hw", "cpu"],
     {"w.syn": "size N = 4\nin x : i32[N]\nout y : i32[N]\ny[i] = 2.5\n"}),
    ("int literal past i8", ["solve", "{dir}/w.syn", "--hw", "cpu"],
     {"w.syn": "size N = 4\nin x : i8[N]\nout y : i8[N]\ny[i] = x[i] + 300\n"}),
    ("U+2028", ["solve", "{dir}/w.syn", "--hw", "cpu"],
     {"w.syn": "size N = 4\u2028in x : f32[N]\nout y : f32[N]\ny[i] = x[i]\n"}),
    ("hw-set error named", ["solve", "softmax", "--hw", "upmem", "--hw-set",
                            "wram.capacity=64furlongs"], {}),
]


def reproducers() -> list[Case]:
    cases = []
    for label, args, files in REPRODUCERS:
        texts = {name: (_intrinsic_model() if text == "INTRINSIC" else text)
                 for name, text in files.items()}
        cases.append(Case(f"reproducer: {label}", args, texts, 30.0 + SLACK_S))
    return cases


def _intrinsic_model() -> str:
    text = (ROOT / "synth" / "hardware" / "aie.toml").read_text(encoding="utf-8")
    return text.replace('shape = "4x8x8"', 'shape = "4x8x²"', 1)


# ---------------------------------------------------------------- workloads


def size_value(rng: random.Random) -> str:
    roll = rng.random()
    pool = SMALL_SIZES if roll < 0.85 else LARGE_SIZES if roll < 0.93 else BAD_SIZES
    return rng.choice(pool)


@dataclass
class _Scope:
    sizes: dict[str, str]
    tensors: dict[str, tuple[str, tuple[str, ...]]]  # name -> (dtype, dims)
    index_of: dict[str, str]  # size name -> its index letter
    floats: bool  # a float workload (else integers: no float literals or functions)


def workload(rng: random.Random) -> tuple[str, bool]:
    """A `.syn` text, and whether every size is small enough to validate quickly.

    Mostly well-formed (so that runs reach the solver, the IR and validation), one in
    three then bent by `_bend`."""
    if rng.random() < 0.03:
        return rng.choice(["", "# only a comment\n", "size N = 4\nin x : f32[N]\n",
                           "\n\n\n", "out y : f32[]\n"]), True
    names = rng.sample(["N", "M", "K"], rng.randint(1, 3))
    floats = rng.random() < 0.8
    family = ["f32"] * 6 + ["f16", "bf16"] if floats else ["i32"] * 4 + ["i16", "i8"]
    scope = _Scope({n: size_value(rng) for n in names}, {},
                   dict(zip(names, ("i", "j", "k"), strict=False)), floats)
    lines = [f"size {n} = {v}" for n, v in scope.sizes.items()]
    for k in range(rng.randint(1, 3)):
        dims = tuple(rng.sample(names, rng.randint(0, min(2, len(names)))))
        dtype = rng.choice(family)
        scope.tensors[f"x{k}"] = (dtype, dims)
        lines.append(f"in x{k} : {dtype}[{', '.join(dims)}]")
    out_dims = tuple(rng.sample(names, rng.randint(0, min(2, len(names)))))
    lines.append(f"out y : {rng.choice(family)}[{', '.join(out_dims)}]")
    for k in range(rng.randint(0, 4)):
        lines.append(_statement(rng, scope, f"t{k}", None))
    lines.append(_statement(rng, scope, "y", out_dims))
    if rng.random() < 0.3:
        lines.append(_statement(rng, scope, "y", out_dims, accumulate=True))
    text = "\n".join(lines) + "\n"
    if rng.random() < 0.3:
        text = _bend(rng, text)
    sizes = [int(v) for v in scope.sizes.values() if v in SMALL_SIZES]
    small = len(sizes) == len(scope.sizes) and math.prod(sizes) <= VALIDATE_POINTS
    return text, small


def _statement(rng: random.Random, scope: _Scope, target: str,
               dims: tuple[str, ...] | None, accumulate: bool = False) -> str:
    """A statement whose subscripts agree with the declarations: with `=` the right
    reads only the target's dimensions; a new temporary takes its dimensions from the
    right (all of them with `=`, some with a reduction)."""
    op = rng.choice(["+=", "max=", "min="] + ["*="] * (not scope.floats)) if accumulate \
        else rng.choice(["=", "=", "+=", "max="])
    allowed = None if op != "=" or dims is None else set(dims)
    expr, used = _expr(rng, scope, rng.randint(0, 3), allowed)
    if dims is None:
        order = [d for d in scope.sizes if d in used]
        dims = tuple(order) if op == "=" else tuple(
            d for d in order if rng.random() < 0.5)
        scope.tensors[target] = ("f32" if scope.floats else "i32", dims)
    return f"{target}[{', '.join(scope.index_of[d] for d in dims)}] {op} {expr}"


def _expr(rng: random.Random, scope: _Scope, depth: int, allowed: set[str] | None
          ) -> tuple[str, set[str]]:
    """An expression and the dimensions it reads (only `allowed` ones, when given)."""
    roll = rng.random()
    if depth <= 0 or roll < 0.3:
        return _atom(rng, scope, allowed)
    if roll < 0.6:
        (a, da), (b, db) = (_expr(rng, scope, depth - 1, allowed),
                            _expr(rng, scope, depth - 1, allowed))
        return f"{a} {rng.choice(['+', '-', '*', '/'])} {b}", da | db
    if roll < 0.85 and (scope.floats or roll >= 0.75):
        if roll < 0.75:
            inner, dims = _expr(rng, scope, depth - 1, allowed)
            return f"{rng.choice(FUNCS1)}({inner})", dims
        (a, da), (b, db) = (_expr(rng, scope, depth - 1, allowed),
                            _expr(rng, scope, depth - 1, allowed))
        return f"{rng.choice(FUNCS2)}({a}, {b})", da | db
    inner, dims = _expr(rng, scope, depth - 1, allowed)
    return (f"({inner})" if roll < 0.95 else f"-{inner}"), dims


def _atom(rng: random.Random, scope: _Scope, allowed: set[str] | None
          ) -> tuple[str, set[str]]:
    fits = [n for n, (_, dims) in scope.tensors.items()
            if allowed is None or set(dims) <= allowed]
    roll = rng.random()
    if roll < 0.75 and fits:
        name = rng.choice(fits)
        dims = scope.tensors[name][1]
        return f"{name}[{', '.join(scope.index_of[d] for d in dims)}]", set(dims)
    if roll < 0.85:
        return rng.choice(list(scope.sizes)), set()
    if scope.floats and roll < 0.95:
        return rng.choice(FLOATS[:5]), set()
    return rng.choice(["1", "2", "3", "0", "300", "2147483648"]), set()


def _bend(rng: random.Random, text: str) -> str:
    """One pathological change: deep nesting, a long chain, a stray character, a line
    moved, a literal of a wrong type, a line break that is not one."""
    roll = rng.random()
    lines = text.rstrip("\n").split("\n")
    last = lines[-1]
    head, _, rhs = last.partition("= ")
    if roll < 0.15 and rhs:
        depth = rng.choice([50, 99, 100, 101, 300])
        opener = rng.choice(["(", "-", "exp(", "-("])
        lines[-1] = f"{head}= {opener * depth}{rhs}{')' * (depth * opener.count('('))}"
    elif roll < 0.3 and rhs:
        lines[-1] = head + "= " + " + ".join([rhs] * rng.choice([50, 100, 101, 1000]))
    elif roll < 0.55:
        k = rng.randrange(len(text) + 1)
        return text[:k] + rng.choice(NOISE) + text[k:]
    elif roll < 0.7 and len(text) > 1:
        k = rng.randrange(len(text))
        return text[:k] + text[k + 1:]
    elif roll < 0.8:
        rng.shuffle(lines)
    elif roll < 0.9:
        lines.append(head + "= " + rng.choice(FLOATS + INTS))
    else:
        lines = [line.replace("N", rng.choice(["٣", "N N", "fuse", "size"]), 1)
                 for line in lines]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- hardware files


def hardware(rng: random.Random) -> str:
    """A built-in model's TOML with one to three keys changed, removed or added."""
    name = rng.choice(["upmem", "cpu", "aie"])
    tree = tomllib.loads((ROOT / "synth" / "hardware" / f"{name}.toml").read_text("utf-8"))
    for _ in range(rng.choice([0, 1, 1, 1, 2, 3])):
        _mutate(rng, tree)
    return to_toml(tree)


def _leaves(node: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], Any]]:
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _leaves(value, (*path, key))
    elif isinstance(node, list) and node and isinstance(node[0], dict):
        for index, value in enumerate(node):
            yield from _leaves(value, (*path, index))
    else:
        yield path, node


def _value_for(rng: random.Random, key: Any) -> Any:
    if str(key) in VALID and rng.random() < 0.5:
        return rng.choice(VALID[str(key)])
    if str(key) not in VALID and rng.random() < 0.5:
        return rng.choice([0, 1, 2, 0.5, 4, 16])  # cycles and lanes that make sense
    pools: dict[str, list[Any]] = {
        "capacity": SIZE_VALUES, "reserved": SIZE_VALUES, "min": SIZE_VALUES,
        "max": SIZE_VALUES, "multiple": SIZE_VALUES, "align": ["3B", "8B", "6B", 1, 0, 1024],
        "latency": TIME_VALUES, "launch": TIME_VALUES, "barrier": TIME_VALUES,
        "bandwidth": BANDWIDTH_VALUES, "count": COUNT_VALUES, "symbol": SYMBOL_VALUES,
        "name": NAME_VALUES, "clock": ["350MHz", "0Hz", "1Hz", "1e30GHz", "fast", 350],
        "issue_share": [1, 11, 0, 1e40, 2**40, "11"], "streams": [True, False, "yes"],
        "shape": ["4x8x8", "4x8x²", "0x8x8", "4x8", "٤x8x8", "99999999999x8x8"],
        "detect": ["L1d", "L4", ""],
    }
    return rng.choice(pools.get(str(key), CYCLE_VALUES))


def _mutate(rng: random.Random, tree: dict[str, Any]) -> None:
    leaves = list(_leaves(tree))
    path, _ = rng.choice(leaves)
    parent: Any = tree
    for step in path[:-1]:
        parent = parent[step]
    roll = rng.random()
    if roll < 0.65:
        parent[path[-1]] = _value_for(rng, path[-1])
    elif roll < 0.75 and isinstance(parent, dict):
        del parent[path[-1]]
    elif roll < 0.85 and isinstance(parent, dict):
        parent[rng.choice(["colour", "symbol", "count", "lanes"])] = _value_for(rng, "x")
    elif roll < 0.92:
        section = rng.choice(["level", "memory"])
        entries = tree.get(section)
        if isinstance(entries, list) and entries:
            rng.shuffle(entries)
            if rng.random() < 0.5:
                entries.append(dict(rng.choice(entries)))
    else:
        tree[rng.choice(["level", "memory", "compute", "host"])] = rng.choice([[], {}, 3])


def to_toml(tree: dict[str, Any]) -> str:
    """A small TOML writer for the trees `tomllib` reads from synth's models: scalars and
    inline tables first, then tables and arrays of tables."""
    lines: list[str] = []
    _table(lines, tree, ())
    return "\n".join(lines) + "\n"


def _table(lines: list[str], table: dict[str, Any], path: tuple[str, ...]) -> None:
    nested = [(k, v) for k, v in table.items() if isinstance(v, dict) or (
        isinstance(v, list) and v and all(isinstance(e, dict) for e in v))]
    for key, value in table.items():
        if (key, value) not in nested:
            lines.append(f"{_key(key)} = {_value(value)}")
    for key, value in nested:
        if isinstance(value, dict):
            lines.append(f"\n[{'.'.join(map(_key, (*path, key)))}]")
            _table(lines, value, (*path, key))
        else:
            for entry in value:
                lines.append(f"\n[[{'.'.join(map(_key, (*path, key)))}]]")
                _table(lines, entry, (*path, key))


def _key(key: str) -> str:
    return key if key and all(c.isalnum() or c in "_-" for c in key) and key.isascii() \
        else _string(key)


def _string(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    return '"' + "".join(c if c.isprintable() else f"\\u{ord(c):04x}" for c in escaped) + '"'


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf") \
            if math.isinf(value) else repr(value)
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{_key(k)} = {_value(v)}" for k, v in value.items()) + " }"
    if isinstance(value, list):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    return _string(str(value))


# ---------------------------------------------------------------- options


def options(rng: random.Random, sizes: Sequence[str]) -> list[str]:
    """Zero to four options of the kinds a user gives, values from the pools."""
    args: list[str] = []
    for _ in range(rng.choice([0, 1, 1, 1, 2, 2, 3, 4])):
        kind = rng.choice(["set", "hw-set", "fix", "fix", "constraint", "drop", "range"])
        if kind == "set":
            args += ["--set", f"{rng.choice([*sizes, 'Z'])}={size_value(rng)}"]
        elif kind == "range":
            lo, hi = rng.choice(SMALL_SIZES), rng.choice(SMALL_SIZES + BAD_SIZES[:5])
            step = rng.choice(["1", "4", "0", "٣"])
            args += ["--set", f"{rng.choice(sizes or ['N'])}={lo}..{hi}:{step}"]
        elif kind == "hw-set":
            key = rng.choice(["wram.capacity", "mram.transfer.align", "tasklet.count",
                              "core.count", "l1.bandwidth", "compute.clock", "launch",
                              "compute.cycles.f32.exp", "dpu.symbol", "bogus.key"])
            args += ["--hw-set", f"{key}={_value_for(rng, key.split('.')[-1])}"]
        elif kind == "fix":
            args += ["--fix", f"{rng.choice(VARIABLES)}={rng.choice(INTS)}"]
        elif kind == "constraint":
            args += ["--constraint", _constraint(rng)]
        else:
            args += ["--drop", rng.choice(GROUPS)]
    return args


def _constraint(rng: random.Random) -> str:
    if rng.random() < 0.1:
        depth = rng.choice([10, 99, 101, 1000])
        return "(" * depth + rng.choice(VARIABLES) + ")" * depth + " >= 1"
    terms = [rng.choice([*VARIABLES, *INTS[:8], "wram.capacity", "tasklet.count.max"])
             for _ in range(rng.randint(1, 4))]
    expr = " ".join(f"{t} {rng.choice(['+', '*', '-'])}" for t in terms[:-1]) + f" {terms[-1]}"
    return f"{expr} {rng.choice(['<=', '>=', '==', '<', '>', '=', ''])} {rng.choice(INTS)}"


def common(rng: random.Random, validate: bool) -> tuple[list[str], float]:
    """Solver, time limit and output flags; the run's budget. Only runs whose sizes are
    small validate (`validate`): validation runs the whole workload, and `--time-limit`
    bounds the solver, not that."""
    args = ["--solver", rng.choice(SOLVERS)]
    limit = rng.choice(TIME_LIMITS)
    args += ["--time-limit", limit]
    if rng.random() < 0.3:
        args.append("--json")
    if not validate or rng.random() < 0.5:
        args.append("--no-validate")
    if rng.random() < 0.05:
        args.append("--show-constraints")
    if rng.random() < 0.03:
        args.append("--binding")
    try:
        seconds = float(limit)
    except ValueError:
        seconds = DEFAULT_LIMIT_S
    ok = math.isfinite(seconds) and 0 < seconds <= 30
    return args, (seconds if ok else 0.0) + SLACK_S


BUILTINS = {"softmax": ["N"], "va": ["N"], "red": ["N"], "mv": ["M", "N"],
            "matmul": ["M", "N", "K"], "attention": ["S", "D"], "fa6": ["S", "D"],
            "gemm2k": ["M", "N", "K"]}
SMALL_BUILTIN_SIZES = {"N": "4096", "M": "64", "K": "64", "S": "32", "D": "16"}


def generate(seed: int, count: int) -> list[Case]:
    """`count` generated cases (a fixed mix of kinds) after the reproducers."""
    rng = random.Random(seed)
    makers: list[tuple[float, Callable[[random.Random, int], Case]]] = [
        (0.40, _workload_case), (0.25, _hardware_case), (0.25, _options_case),
        (0.08, _tune_case), (0.02, _plain_case)]
    cases = reproducers()
    for index in range(count):
        roll, total = rng.random(), 0.0
        for weight, maker in makers:
            total += weight
            if roll < total:
                cases.append(maker(rng, index))
                break
        else:
            cases.append(makers[-1][1](rng, index))
    return cases


def _workload_case(rng: random.Random, index: int) -> Case:
    text, small = workload(rng)
    flags, budget = common(rng, small)
    if not small:
        flags.append("--no-validate")
    hw = rng.choice(["upmem", "cpu", "aie"])
    return Case(f"{index}: workload", ["solve", "{dir}/w.syn", "--hw", hw, *flags],
                {"w.syn": text}, budget)


def _hardware_case(rng: random.Random, index: int) -> Case:
    name = rng.choice(list(BUILTINS))
    sizes = [a for s in BUILTINS[name] for a in ("--set", f"{s}={SMALL_BUILTIN_SIZES[s]}")]
    flags, budget = common(rng, True)
    return Case(f"{index}: hardware", ["solve", name, "--hw", "{dir}/hw.toml", *sizes, *flags],
                {"hw.toml": hardware(rng)}, budget)


def builtin_elements(name: str, sizes: dict[str, str]) -> int:
    """The elements of the built-in's largest tensor (intermediates too) at `sizes` (each
    in SMALL_SIZES): validation's error bounds take arrays of that many. fa6 at S=4096
    D=16 (its scores S x S, 2^24) validated in 7-11 s of a 2 s time limit's budget, though
    its sizes multiply to 2^16."""
    from synth.lang import load_workload
    workload = load_workload(name, {k: int(v) for k, v in sizes.items()
                                    if k in BUILTINS[name]})
    return max(math.prod(tensor.shape) for tensor in workload.tensors.values())


def _options_case(rng: random.Random, index: int) -> Case:
    name = rng.choice(list(BUILTINS))
    sizes = [a for s in BUILTINS[name] for a in ("--set", f"{s}={SMALL_BUILTIN_SIZES[s]}")]
    extra = options(rng, BUILTINS[name])
    given = {extra[k + 1].partition("=")[0] for k in range(0, len(extra), 2)
             if extra[k] == "--set"}
    sizes = [a for k in range(0, len(sizes), 2) for a in sizes[k:k + 2]
             if sizes[k + 1].partition("=")[0] not in given]
    chosen = dict(extra[k + 1].partition("=")[::2] for k in range(0, len(extra), 2)
                  if extra[k] == "--set")
    small = (all(v in SMALL_SIZES for v in chosen.values())
             and builtin_elements(name, {**SMALL_BUILTIN_SIZES, **chosen}) <= VALIDATE_POINTS)
    flags, budget = common(rng, small)  # validating takes time the time limit does not bound
    hw = rng.choice(["upmem", "cpu", "aie"])
    args = ["solve", name, "--hw", hw, *sizes, *extra, *flags]
    if rng.random() < 0.03:
        args += ["--emit", rng.choice(["upmem", "mlir", "c"]), "--out", "{dir}/out"]
        budget += 30.0  # building and running the emitted program
    return Case(f"{index}: options", args, {}, budget)


def _tune_case(rng: random.Random, index: int) -> Case:
    name = rng.choice(["softmax", "va", "mv", "red"])
    sizes = [a for s in BUILTINS[name] for a in ("--set", f"{s}={SMALL_BUILTIN_SIZES[s]}")]
    axes: list[str] = []
    for _ in range(rng.choice([0, 1, 1, 1, 2, 2])):
        key = rng.choice(["T", "D", "wram.capacity", "drop:capacity.wram", "set:N",
                          "fix:Q.y.i", "Y", "bogus", "hw:launch"])
        values = ",".join(rng.choice([*INTS[:6], "on", "off", "32KiB", "²", *SMALL_SIZES[:4]])
                          for _ in range(rng.randint(1, 3)))
        axes += ["--vary", f"{key}={values}"]
    limit = rng.choice(["1", "2"])
    variants = 9  # at most 3 x 3
    return Case(f"{index}: tune", ["tune", name, "--hw", "upmem", *sizes, *axes,
                                   "--time-limit", limit],
                {}, variants * float(limit) + SLACK_S)


def _plain_case(rng: random.Random, index: int) -> Case:
    args = rng.choice([["list"], ["--help"], ["--version"], ["solve", "--help"], [],
                       ["solve"], ["nonsense"]])
    return Case(f"{index}: plain", list(args), {}, SLACK_S)


# ---------------------------------------------------------------- running


@dataclass(frozen=True)
class Result:
    case: Case
    code: int  # the exit code; -SIGNAL when killed by a signal
    seconds: float
    killed: bool  # still running after KILL_AFTER_S
    stderr: str

    @property
    def over_budget(self) -> bool:
        return self.killed or self.seconds > self.case.budget_s


def preload() -> None:
    """Import what every run needs once, before forking (a run then costs its work)."""
    import synth.cli  # noqa: F401
    import synth.pipeline  # noqa: F401
    import synth.render  # noqa: F401


def start(case: Case, directory: Path) -> tuple[int, float, Path]:
    """Fork a child that runs one case; its stdout goes nowhere, stderr to a file."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in case.files.items():
        (directory / name).write_text(text, encoding="utf-8")
    errors = directory / "stderr.txt"
    pid = os.fork()
    if pid == 0:  # the child: run, then leave without the parent's clean-up
        os._exit(_child(case, directory, errors))
    return pid, time.perf_counter(), errors


def _child(case: Case, directory: Path, errors: Path) -> int:
    """The exit code of one run, stdout discarded and stderr written to `errors`."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(os.open(errors, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 2)
    from synth.cli import app

    try:
        app(case.argv(directory), prog_name="synth")
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # what the CLI let through: counted as an internal error
        return 70
    return 0


def run_all(cases: Sequence[Case], jobs: int, root: Path,
            done: Callable[[Result], None]) -> list[Result]:
    """Run the cases, `jobs` at a time; kill any that runs past KILL_AFTER_S."""
    pending = list(enumerate(cases))
    running: dict[int, tuple[Case, float, Path]] = {}
    results: list[Result] = []
    while pending or running:
        while pending and len(running) < jobs:
            index, case = pending.pop(0)
            pid, began, errors = start(case, root / f"case{index}")
            running[pid] = (case, began, errors)
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            for other, (_, started, _) in list(running.items()):
                if time.perf_counter() - started > KILL_AFTER_S:
                    os.kill(other, signal.SIGKILL)
            time.sleep(0.005)
            continue
        case, began, errors = running.pop(pid)
        seconds = time.perf_counter() - began
        code = os.waitstatus_to_exitcode(status)
        text = errors.read_text(encoding="utf-8", errors="replace")
        result = Result(case, code, seconds, code == -signal.SIGKILL, text[-2000:])
        results.append(result)
        done(result)
    return results


# ---------------------------------------------------------------- the report


def report(results: Sequence[Result], wall_s: float, args: argparse.Namespace) -> list[str]:
    codes = collections.Counter(r.code for r in results)
    internal = [r for r in results if r.code not in (0, 1, 2, 3, 4)]
    late = [r for r in results if r.over_budget]
    slowest = sorted(results, key=lambda r: r.seconds - r.case.budget_s)[-5:]
    lines = [
        f"## Fuzzing the CLI: {len(results)} runs ({len(REPRODUCERS)} reproducers of issue "
        f"12, {len(results) - len(REPRODUCERS)} generated, seed {args.seed})", "",
        f"Command: `python benchmarks/fuzz.py --count {args.count} --seed {args.seed} "
        f"--jobs {args.jobs}`; {datetime.date.today()}, {platform.machine()}, "
        f"{os.cpu_count()} CPUs, load average at the start {args.load}; "
        f"{wall_s:.0f} s in all.", "",
        "| exit code | runs |", "|---:|---:|",
        *(f"| {code} | {count} |" for code, count in sorted(codes.items())), "",
        f"Runs that exited otherwise than 0-4 (70: internal error): {len(internal)}.",
        f"Runs past their budget (time limit + {SLACK_S:g} s): {len(late)}.",
        "The slowest runs against their budgets: " + "; ".join(
            f"{r.case.label} {r.seconds:.1f} s of {r.case.budget_s:g} s" for r in slowest)
        + ".", ""]
    checks = [r for r in results if r.code == 4]
    for r in [*internal, *late][:20]:
        lines.append(_listed(r))
    if checks:
        lines += ["", f"Runs whose check failed (exit 4), to be looked at: {len(checks)}.",
                  *(_listed(r) for r in checks[:20]), ""]
    verdict = "PASS" if not internal and not late else "FAIL"
    lines.append(f"{verdict}: no exit 70 ({len(internal)}), no run past its time limit + "
                 f"{SLACK_S:g} s ({len(late)})")
    return lines


def _listed(r: Result) -> str:
    tail = r.stderr.strip().splitlines()[-1:] or [""]
    return (f"- {r.case.label} (exit {r.code}, {r.seconds:.1f} s): "
            f"`synth {shlex.join(r.case.args)[:300]}`: {tail[0][:200]}")


def keep(results: Sequence[Result], directory: Path) -> None:
    """The failing inputs (fail*) and those whose check failed (check*, exit 4), and how
    to rerun each."""
    directory.mkdir(parents=True, exist_ok=True)
    bad = [("fail", r) for r in results if r.code not in (0, 1, 2, 3, 4) or r.over_budget]
    bad += [("check", r) for r in results if r.code == 4]
    for number, (kind, result) in enumerate(bad):
        place = directory / f"{kind}{number}"
        place.mkdir(exist_ok=True)
        for name, text in result.case.files.items():
            (place / name).write_text(text, encoding="utf-8")
        (place / "command.sh").write_text(
            "synth " + shlex.join(result.case.argv(place)) + "\n", encoding="utf-8")
        (place / "stderr.txt").write_text(result.stderr, encoding="utf-8")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=3000, help="generated inputs")
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--jobs", type=int, default=2, help="runs at a time")
    parser.add_argument("--keep", type=Path, help="write failing inputs here")
    parser.add_argument("--markdown", type=Path, help="also write the report here")
    args = parser.parse_args(argv)
    if args.count < 0 or args.jobs < 1:
        parser.error("--count must be >= 0 and --jobs >= 1")
    args.load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    cases = generate(args.seed, args.count)
    preload()
    began = time.perf_counter()
    seen = [0]

    def done(result: Result) -> None:
        seen[0] += 1
        if result.code not in (0, 1, 2, 3, 4) or result.over_budget or seen[0] % 250 == 0:
            print(f"[{seen[0]}/{len(cases)}] {result.case.label}: exit {result.code} in "
                  f"{result.seconds:.1f} s", file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory(prefix="synth-fuzz-") as root:
        results = run_all(cases, args.jobs, Path(root), done)
    lines = report(results, time.perf_counter() - began, args)
    print("\n".join(lines))
    if args.markdown:
        args.markdown.write_text("\n".join(lines) + "\n", encoding="utf-8")
    if args.keep:
        keep(results, args.keep)
    return 0


if __name__ == "__main__":
    sys.exit(main())
