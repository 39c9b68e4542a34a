"""Bad input of every kind the fuzzing of issue 12 found, each cause as a class: deep
expressions, integers out of range, non-ASCII digits, reserved names, transfer rules,
literals against their dtype, line breaks, and `--hw-set` named in its errors. Every
case is exit 2 with a message naming the place, never a traceback or exit 70."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from conftest import SMALL_UPMEM, solve
from typer.testing import CliRunner

from synth import hwfile, pipeline
from synth.cli import app
from synth.constraints import user
from synth.constraints.result import Status
from synth.errors import InputError, LocatedError
from synth.hwfile import RESERVED_SYMBOLS, load_hardware
from synth.ir.materialize import materialize
from synth.ir.printer import print_program
from synth.lang import MAX_EXPR_DEPTH, list_builtin_workloads, load_workload, parse_workload
from synth.limits import MAX_SIZE
from synth.pipeline import encode
from synth.workload import BinOp, Num, walk

HEAD = "size N = 4\nin x : f32[N]\nout y : f32[N]\n"


def parse(text: str) -> object:
    return parse_workload(text, "t.syn", "t")


def located(text: str, *fragments: str) -> LocatedError:
    with pytest.raises(LocatedError) as info:
        parse(text)
    for fragment in fragments:
        assert fragment in str(info.value), str(info.value)
    assert info.value.exit_code == 2
    return info.value


# ---------------------------------------------------------------- depth


@pytest.mark.parametrize("rhs", [
    "(" * 300 + "x[i]" + ")" * 300,
    "-" * 1000 + "x[i]",
    "exp(" * 200 + "x[i]" + ")" * 200,
    " + ".join(["x[i]"] * 1000),
    " * ".join(["x[i]"] * 150),
])
def test_deep_expressions_are_bad_input(rhs: str) -> None:
    err = located(HEAD + f"y[i] = {rhs}\n", f"more than {MAX_EXPR_DEPTH} levels")
    assert err.location.line == 4
    assert len(str(err).splitlines()[1]) < 120  # the long line is shown cut, not whole


@pytest.mark.parametrize("rhs", [
    " + ".join(["x[i]"] * MAX_EXPR_DEPTH),
    "tanh(" * (MAX_EXPR_DEPTH - 1) + "x[i]" + ")" * (MAX_EXPR_DEPTH - 1),
    "-(" * (MAX_EXPR_DEPTH // 2) + "x[i]" + ")" * (MAX_EXPR_DEPTH // 2),
])
def test_expressions_at_the_depth_limit_run_through_every_stage(rhs: str) -> None:
    text = "size N = 64\nin x : f32[N]\nout y : f32[N]\n" + f"y[i] = {rhs}\n"
    workload = parse_workload(text, "deep.syn", "deep")
    hw = load_hardware("upmem", SMALL_UPMEM)
    model = encode(workload, hw)
    result = solve(model.constraints)
    assert result.env is not None
    program = materialize(model, result.env)
    assert print_program(program)
    assert pipeline.validate(program, workload).passed


def test_walk_is_iterative() -> None:
    expr: object = Num(1.0)
    for _ in range(20000):
        expr = BinOp("+", expr, Num(2.0))  # type: ignore[arg-type]
    assert sum(1 for _ in walk(expr)) == 40001  # type: ignore[arg-type]


def test_constraint_nesting_is_bad_input() -> None:
    model = encode(load_workload("softmax", {"N": 64}), load_hardware("upmem", SMALL_UPMEM))
    for text in ("(" * 1000 + "T" + ")" * 1000 + " >= 1", "-" * 1000 + "T <= 1"):
        with pytest.raises(InputError, match="nests more than 100 levels"):
            user.user_constraints(model, [text], [])


# ---------------------------------------------------------------- numbers


@pytest.mark.parametrize("size", ["٣٢", "２", "²", "3²"])
def test_non_ascii_digits_in_a_workload(size: str) -> None:
    located(f"size N = {size}\nin x : f32[N]\nout y : f32[N]\ny[i] = x[i]\n",
            "unexpected character")


@pytest.mark.parametrize(("size", "fragment"), [
    (str(2**31), "out of range: expected 1..2^31-1"),
    (str(2**63), "out of range"),
    ("9" * 400, "a 400-digit number is out of range"),
    ("1e20", "expected a positive integer size"),
])
def test_sizes_past_the_limit(size: str, fragment: str) -> None:
    located(f"size N = {size}\nin x : f32[N]\nout y : f32[N]\ny[i] = x[i]\n", fragment)


def test_largest_size_parses() -> None:
    workload = parse(f"size N = {MAX_SIZE}\nin x : f32[N]\nout y : f32[N]\ny[i] = x[i]\n")
    assert workload.sizes["N"] == MAX_SIZE  # type: ignore[attr-defined]


@pytest.mark.parametrize(("text", "fragment"), [
    ("size N = 4\nin x : i32[N]\nout y : i32[N]\ny[i] = 2.5\n",
     "a float literal is assigned to i32 tensor 'y'"),
    ("size N = 4\nin x : i32[N]\nout y : i32[N]\ny[i] = x[i] + 99999999999999999999\n",
     "beyond C's int range"),
    ("size N = 4\nin x : i8[N]\nout y : i8[N]\ny[i] = x[i] + 300\n",
     "integer literal 300 is beyond the range of i8 (-128..127)"),
    ("size N = 4\nin x : f16[N]\nout y : f16[N]\ny[i] = x[i] * 100000.0\n",
     "float literal 100000.0 is beyond the range of f16"),
    ("size N = 4\nin x : f32[N]\nout y : f32[N]\ny[i] = x[i] * 1e39\n",
     "beyond the range of f32"),
])
def test_literals_against_their_dtype(text: str, fragment: str) -> None:
    located(text, fragment)


@pytest.mark.parametrize("text", [
    "", "# comments only\n\n", "size N = 4\nin x : f32[N]\n",
    "size N = 4\nin x : f32[N]\nt[i] = x[i]\n",
])
def test_a_workload_without_outputs_is_bad_input(text: str) -> None:
    with pytest.raises(InputError, match="has no .*output tensor"):
        parse(text)


# ---------------------------------------------------------------- lines


def test_only_newlines_end_lines() -> None:
    err = located("size N = 4\u2028in x : f32[N]\nin x : f32[N]\n", "unexpected character")
    assert err.location.line == 1
    text = "size N = 4\r\nin x : f32[N]\r\nout y : f32[N]\r\ny[i] = x[i] \x0c\r\nz z\n"
    err = located(text, "expected '['")
    assert err.location.line == 5


# ---------------------------------------------------------------- hardware


@pytest.mark.parametrize("symbol", RESERVED_SYMBOLS)
def test_reserved_symbols(symbol: str) -> None:
    with pytest.raises(InputError, match=f"--hw-set wram.symbol={symbol}: .*is reserved"):
        load_hardware("upmem", [f"wram.symbol={symbol}"])


def test_reserved_symbols_cover_every_prefix_the_encoding_uses() -> None:
    """Every variable of every built-in model is named by a hardware symbol or by one of
    `RESERVED_SYMBOLS`: a new kind of decision must reserve its prefix."""
    for hw_name in hwfile.list_builtin_hardware():
        hw = load_hardware(hw_name, SMALL_UPMEM if hw_name == "upmem" else ())
        symbols = {lv.symbol for lv in hw.levels} | {m.symbol for m in hw.memories}
        for name in list_builtin_workloads():
            cset = encode(load_workload(name, _small(name)), hw).constraints
            prefixes = {v.split(".")[0] for v in [*cset.decisions, *cset.definitions]}
            assert prefixes <= symbols | set(RESERVED_SYMBOLS), (hw_name, name, prefixes)


def _small(name: str) -> dict[str, int]:
    return {size: 8 for size in load_workload(name).sizes}


@pytest.mark.parametrize(("override", "fragment"), [
    ("wram.transfer.align=3B", "align: expected a power of two"),
    ("wram.symbol=Ω", "not a valid identifier"),
    ("wram.capacity=1e20B", "past the largest quantity synth models"),
    ("mram.bandwidth=1e-30GB/s", "ps per byte, past the largest quantity"),
    ("launch=1e9s", "past the largest quantity"),
    ("tasklet.count=1..99999999999999999999", "a count must be at most 2^31-1"),
    ("tasklet.count=²", "expected a count"),
    ("tasklet.count=٣٢", "expected a count"),
    ("tasklet.issue_share=1e40", "expected an integer in 1..2147483647"),
    ("compute.cycles.f32.exp=1e300", "expected a number of cycles in 0..2^53"),
])
def test_hw_set_errors_name_the_override(override: str, fragment: str) -> None:
    with pytest.raises(InputError) as info:
        load_hardware("upmem", [override])
    assert str(info.value).startswith(f"--hw-set {override}: hardware upmem: ")
    assert fragment in str(info.value)


def test_errors_of_the_file_stay_the_files(tmp_path: Path) -> None:
    text = (Path(hwfile.__file__).parent / "hardware" / "upmem.toml").read_text()
    bad = tmp_path / "bad.toml"
    bad.write_text(text.replace('symbol = "Q"', 'symbol = "fuse"'))
    with pytest.raises(InputError) as info:
        load_hardware(str(bad), ["wram.capacity=32KiB"])
    assert str(info.value).startswith(f"hardware {bad}: memory 'wram': symbol: 'fuse'")
    huge = tmp_path / "huge.toml"
    huge.write_text(text.replace('launch = "47us"', "launch = " + "9" * 5000))
    with pytest.raises(InputError, match="invalid TOML"):
        load_hardware(str(huge))


def test_intrinsic_shapes_are_ascii() -> None:
    path = hwfile._builtin_dir() / "aie.toml"
    text = path.read_text(encoding="utf-8")
    assert 'shape = "4x8x8"' in text
    tree = tomllib.loads(text.replace('shape = "4x8x8"', 'shape = "4x8x²"', 1))
    with pytest.raises(InputError, match='expected "MxNxK"'):
        hwfile._build_hardware(tree, hwfile._Where("aie"))


# ---------------------------------------------------------------- encoding


def test_products_past_64_bits_are_bounded_or_bad_input() -> None:
    """An auxiliary variable whose interval bound falls below int64 (va at a large N
    with few units) is cut to the objective's range; a term whose every value is past
    that range is bad input."""
    request = pipeline.Request("va", "upmem", {"N": 104858592}, validate=False,
                               fixes=("R=1", "D=60", "T=16"))
    outcome = pipeline.run(request)
    assert outcome.result.status in (Status.OPTIMAL, Status.FEASIBLE, Status.INFEASIBLE)
    huge = pipeline.Request("softmax", "cpu", {"N": 4096}, ("compute.cycles.f32.exp=1e15",),
                            validate=False)
    with pytest.raises(InputError, match="too large to model with 64-bit integers"):
        pipeline.run(huge)


def test_domains_whose_sum_is_past_64_bits_are_bad_input() -> None:
    """Each term fits, but CP-SAT refuses a model whose variables' domains sum past int64
    (fuzz seed 67: attention at D = 104858592 was exit 70, "CP-SAT rejected the model")."""
    request = pipeline.Request("attention", "cpu", {"S": 32, "D": 104858592}, validate=False)
    with pytest.raises(InputError, match="too large to model with 64-bit integers: CP-SAT "
                                         "says .*int64"):
        pipeline.run(request)


# ---------------------------------------------------------------- the command line


@pytest.mark.parametrize("args", [
    ["solve", "softmax", "--hw", "upmem", "--set", "N=²"],
    ["solve", "softmax", "--hw", "upmem", "--set", "N=٣٢"],
    ["solve", "softmax", "--hw", "upmem", "--set", "N=1..２"],
    ["solve", "softmax", "--hw", "upmem", "--set", f"N={2**40}"],
    ["solve", "softmax", "--hw", "upmem", "--set", "N=1..99999999999999999999999:3"],
    ["solve", "softmax", "--hw", "upmem", "--fix", "T=٣"],
    ["solve", "softmax", "--hw", "upmem", "--set", "N=64", "--fix", "T=99999999999999999999"],
    ["solve", "softmax", "--hw", "upmem", "--set", "N=64", "--constraint",
     "Q.y.i * 99999999999999999999 <= 1"],
    ["solve", "softmax", "--hw", "upmem", "--time-limit", "inf"],
    ["solve", "softmax", "--hw", "upmem", "--time-limit", "٣"],
    ["solve", "fa6", "--hw", "upmem", "--set", f"S={2**32}"],
    ["tune", "softmax", "--hw", "upmem", "--vary", "set:N=²"],
    ["tune", "softmax", "--hw", "upmem", "--set", "N=64", "--vary",
     "T=-9223372036854775808"],
])
def test_command_line_numbers_are_checked(args: list[str]) -> None:
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "error: " in result.output and "internal error" not in result.output


@pytest.mark.parametrize("dtype", ["f16", "i8"])
def test_alignment_of_runs_from_a_streamed_root_is_enforced(dtype: str, tmp_path: Path
                                                            ) -> None:
    """On aie (streams = true) the root memory's loops run inside the cores, so a core's
    run from DDR starts inside the tensor: with 2- or 1-byte elements and 4-byte aligned
    transfers, the encoding must not take one core's share of DDR for the whole row (the
    verifier then refused the optimum: "expected 4-byte aligned runs into l2, got 2-byte
    runs", exit 4)."""
    path = tmp_path / "small.syn"
    path.write_text(f"size N = 3\nsize M = 128\nin x : {dtype}[M]\nout y : {dtype}[N]\n"
                    "t[j] = x[j]\ny[i] max= 2\n")
    outcome = pipeline.run(pipeline.Request(str(path), "aie", validate=False))
    assert outcome.result.status is Status.OPTIMAL and outcome.program is not None
