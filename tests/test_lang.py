"""Tests of the `.syn` parser: built-ins, every error rule with its location, types, overrides."""

from __future__ import annotations

from pathlib import Path

import pytest

from synth.errors import InputError, LocatedError
from synth.lang import list_builtin_workloads, load_workload, parse_workload
from synth.workload import Access, BinOp, Call, DType, Neg, Num, ReduceOp, Role, SizeRef

BUILTINS = ["attention", "fa6", "gemm2k", "layernorm", "matmul", "mha", "mv", "red",
            "rmsnorm", "softmax", "swiglu", "transformer", "va"]

# Four header lines shared by the error cases, so a case's first line is line 5.
HEADER = "size N = 8\nsize M = 4\nin x : f32[N]\nin A : i32[M, N]\n"
# An output for tests about temporaries: a workload without one is bad input.
OUT = "out done : i32[]\ndone[] = 1\n"


def parse(text: str, overrides: dict[str, int] | None = None):
    return parse_workload(text, "t.syn", "t", overrides)


def located(body: str) -> LocatedError:
    """Parse HEADER + body, which must fail with a located input error (exit code 2)."""
    with pytest.raises(LocatedError) as info:
        parse(HEADER + body)
    err = info.value
    assert isinstance(err, InputError)
    assert err.exit_code == 2
    return err


def assert_at(err: LocatedError, line: int, col: int, *fragments: str) -> None:
    assert (err.location.line, err.location.col) == (line, col), str(err)
    assert str(err).startswith(f"t.syn:{line}:{col}: ")
    for fragment in fragments:
        assert fragment in err.message, err.message
    # the rendered error shows the line and a caret under the column
    rendered = str(err).splitlines()
    assert rendered[1] == "  " + err.location.text
    assert rendered[2] == "  " + " " * (col - 1) + "^"


# ---------------------------------------------------------------- built-ins


def test_builtin_list() -> None:
    assert list_builtin_workloads() == BUILTINS


@pytest.mark.parametrize("name", BUILTINS)
def test_every_builtin_parses(name: str) -> None:
    workload = load_workload(name)
    assert workload.name == name
    assert workload.source == name
    assert workload.outputs, "every built-in has an output"
    for stmt in workload.statements:
        assert stmt.dtype is workload.tensors[stmt.target].dtype
        assert set(stmt.extents) == set(stmt.dims)


def test_softmax_is_the_design_example() -> None:
    w = load_workload("softmax")
    assert w.sizes == {"N": 1048576}
    assert [s.name for s in w.statements] == ["m", "e", "s", "y"]
    m, e, s, y = w.statements
    assert (m.op, m.indices, m.reduced) == (ReduceOp.MAX, (), ("i",))
    assert e.expr == Call("exp", (BinOp("-", Access("x", ("i",)), Access("m", ())),))
    assert (s.op, s.reduced) == (ReduceOp.ADD, ("i",))
    assert y.expr == BinOp("/", Access("e", ("i",)), Access("s", ()))
    assert w.tensors["e"].role is Role.TEMP and w.tensors["e"].shape == (1048576,)
    assert w.tensors["e"].dim_names == ("N",)
    assert w.tensors["m"].shape == () and w.tensors["m"].dtype is DType.F32


def test_matmul_fill_then_accumulate() -> None:
    w = load_workload("matmul")
    assert w.sizes == {"M": 1024, "N": 512, "K": 2048}
    fill, mm = w.statements
    assert (fill.name, fill.op, fill.accumulates, fill.expr) == ("C#1", ReduceOp.ASSIGN, False,
                                                                  Num(0))
    assert (mm.name, mm.op, mm.accumulates, mm.reduced) == ("C#2", ReduceOp.ADD, True, ("k",))
    assert dict(mm.extents) == {"m": 1024, "n": 512, "k": 2048}
    assert mm.dims == ("m", "n", "k")
    assert w.tensors["C"].dtype is DType.I32


def test_gemm2k_and_prim_sizes() -> None:
    assert load_workload("gemm2k").sizes == {"M": 2048, "N": 2048, "K": 2048}
    assert load_workload("va").tensors["c"].shape == (2097152,)
    red = load_workload("red")
    assert red.tensors["s"].shape == () and red.statements[0].reduced == ("i",)
    mv = load_workload("mv")
    assert mv.tensors["A"].shape == (2048, 4096) and mv.statements[0].reduced == ("j",)


def test_fa6_is_a_six_op_chain() -> None:
    w = load_workload("fa6")
    assert len(w.statements) == 6
    assert all(s % 32 == 0 for s in w.sizes.values())
    fns = [s.expr.fn for s in w.statements if isinstance(s.expr, Call)]
    assert fns == ["exp", "sqrt", "recip"]
    assert w.statements[0].expr == Access("K", ("j", "d"))  # the transpose
    assert w.statements[1].reduced == ("d",)  # the matmul
    assert w.statements[-1].target == "O"


def test_attention_statements() -> None:
    w = load_workload("attention")
    ops = [(s.target, s.op, s.reduced) for s in w.statements]
    assert ops == [("s", ReduceOp.ADD, ("d",)), ("m", ReduceOp.MAX, ("j",)),
                   ("p", ReduceOp.ASSIGN, ()), ("l", ReduceOp.ADD, ("j",)),
                   ("o", ReduceOp.ADD, ("j",)), ("O", ReduceOp.ASSIGN, ())]
    assert w.tensors["s"].shape == (512, 512) and w.tensors["o"].shape == (512, 64)


def test_load_from_path(tmp_path: Path) -> None:
    path = tmp_path / "double.syn"
    path.write_text("size N = 4\nin x : i16[N]\nout y : i16[N]\ny[i] = x[i] * 2\n")
    w = load_workload(str(path))
    assert (w.name, w.source) == ("double", str(path))
    assert w.tensors["y"].dtype is DType.I16


def test_load_unknown_lists_builtins(tmp_path: Path) -> None:
    for ref in ("nosuch", str(tmp_path / "missing.syn")):
        with pytest.raises(InputError) as info:
            load_workload(ref)
        assert not isinstance(info.value, LocatedError)
        assert ref in str(info.value)
        assert ", ".join(BUILTINS) in str(info.value)


def test_file_error_names_the_path(tmp_path: Path) -> None:
    path = tmp_path / "bad.syn"
    path.write_text("size N = 4\nin x : f64[N]\n")
    with pytest.raises(LocatedError) as info:
        load_workload(str(path))
    assert str(info.value).startswith(f"{path}:2:8: unknown dtype 'f64'")


# ---------------------------------------------------------------- overrides


def test_overrides_replace_sizes_everywhere() -> None:
    w = load_workload("matmul", {"M": 16, "K": 32})
    assert w.sizes == {"M": 16, "N": 512, "K": 32}
    assert w.tensors["A"].shape == (16, 32)
    assert dict(w.statements[1].extents) == {"m": 16, "n": 512, "k": 32}
    ref = parse("size N = 8\nin x : f32[N]\nout y : f32[N]\ny[i] = x[i] / N\n", {"N": 3})
    assert ref.statements[0].expr == BinOp("/", Access("x", ("i",)), SizeRef("N", 3))


def test_override_unknown_size_lists_sizes() -> None:
    with pytest.raises(InputError) as info:
        load_workload("matmul", {"Q": 4})
    assert not isinstance(info.value, LocatedError)
    assert "'Q'" in str(info.value) and "M, N, K" in str(info.value)


@pytest.mark.parametrize("value", [0, -4])
def test_override_must_be_positive(value: int) -> None:
    with pytest.raises(InputError) as info:
        load_workload("softmax", {"N": value})
    assert "'N'" in str(info.value) and "positive" in str(info.value)


def test_override_makes_extents_conflict() -> None:
    text = "size N = 4\nin x : f32[N]\nin z : f32[4]\nout y : f32[N]\ny[i] = x[i] + z[i]\n"
    assert parse(text).tensors["y"].shape == (4,)
    with pytest.raises(LocatedError) as info:
        parse(text, {"N": 8})
    assert (info.value.location.line, info.value.location.col) == (5, 17)
    assert "8 from y[i]" in info.value.message and "4 from z[i]" in info.value.message


# ---------------------------------------------------------------- declarations


def test_comments_and_blank_lines() -> None:
    w = parse("# a comment\n\n   \nsize N = 4 # trailing\nin x: f32[N]\nout y :f32[N]\n"
              "y[i]=x[i]#no space\n")
    assert w.sizes == {"N": 4} and len(w.statements) == 1


def test_scalar_and_literal_dims() -> None:
    w = parse("size N = 4\nin x : f32[N, 3]\nin c : f32[]\nout y : f32[N]\n"
              "y[i] += x[i, j] * c[]\n")
    assert w.tensors["x"].shape == (4, 3) and w.tensors["x"].dim_names == ("N", "3")
    assert w.tensors["c"].shape == ()


def test_bad_dtype_names_valid_ones() -> None:
    err = located("out y : f64[N]\n")
    assert_at(err, 5, 9, "'f64'", "f32, f16, bf16, i32, i16, i8")


def test_unknown_size_in_dims() -> None:
    assert_at(located("out y : f32[N, Q]\n"), 5, 16, "unknown size 'Q'", "N, M")


def test_nonpositive_dims_and_sizes() -> None:
    assert_at(located("out y : f32[0]\n"), 5, 13, "positive")
    assert_at(located("size Z = 0\n"), 5, 10, "'Z'", "positive")
    assert_at(located("size Z = -1\n"), 5, 10, "expected a positive integer size", "'-'")


@pytest.mark.parametrize(("body", "col", "line"), [
    ("in x : f32[N]\n", 4, 3),
    ("size N = 3\n", 6, 1),
    ("out M : f32[N]\n", 5, 2),
])
def test_duplicate_declarations(body: str, col: int, line: int) -> None:
    assert_at(located(body), 5, col, "already declared", f"line {line}")


def test_temporary_cannot_take_a_size_name() -> None:
    assert_at(located("N[i] = x[i]\n"), 5, 1, "'N' is a size")


# ---------------------------------------------------------------- statements


def test_affine_subscripts_are_not_supported() -> None:
    assert_at(located("out y : f32[N]\ny[i] = x[i+1]\n"), 6, 11,
              "affine subscripts are not supported yet")
    assert_at(located("out y : f32[N]\ny[i] = x[0]\n"), 6, 10,
              "affine subscripts are not supported yet")
    assert_at(located("out y : f32[N]\ny[i * 2] = x[i]\n"), 6, 5,
              "affine subscripts are not supported yet")


def test_reduction_with_assign_names_the_index() -> None:
    assert_at(located("out y : f32[]\ny[] = x[i]\n"), 6, 9, "index 'i'", "reduce")
    assert_at(located("out y : i32[M]\ny[r] = A[r, c]\n"), 6, 13, "index 'c'", "'='")


def test_conflicting_extents_name_both() -> None:
    err = located("out y : f32[M]\ny[i] = x[i]\n")
    assert_at(err, 6, 10, "index 'i'", "4", "8", "y[i]", "x[i]")
    err = located("t[i] += A[i, j] * A[j, i]\n")
    assert_at(err, 5, 21, "index 'j'", "A[i, j]", "A[j, i]")


def test_unbound_target_index_of_a_fresh_temp() -> None:
    assert_at(located("t[i] = 1.0\n"), 5, 3, "extent of index 'i'")
    assert_at(located("t[i, k] = x[i]\n"), 5, 6, "extent of index 'k'")


def test_fill_of_a_declared_output_takes_its_shape() -> None:
    w = parse(HEADER + "out C : i32[M, N]\nC[m, n] = 0\n")
    assert dict(w.statements[0].extents) == {"m": 4, "n": 8}
    assert w.statements[0].accumulates is False


@pytest.mark.parametrize(("expr", "col", "fragments"), [
    ("foo(x[i])", 8, ("unknown function 'foo'", "exp", "relu", "min")),
    ("exp(x[i], x[i])", 8, ("'exp' takes 1 argument, got 2",)),
    ("max(x[i])", 8, ("'max' takes 2 arguments, got 1",)),
    ("relu()", 8, ("'relu' takes 1 argument, got 0",)),
])
def test_function_calls(expr: str, col: int, fragments: tuple[str, ...]) -> None:
    assert_at(located(f"out y : f32[N]\ny[i] = {expr}\n"), 6, col, *fragments)


def test_assign_to_input() -> None:
    assert_at(located("x[i] = 1.0\n"), 5, 1, "input tensor 'x'")


def test_use_before_definition() -> None:
    err = located("out y : f32[N]\ny[i] = t[i]\nt[i] = x[i]\n")
    assert_at(err, 6, 8, "'t'", "before it is defined")
    err = located("t[i] = t[i] + x[i]\n")
    assert_at(err, 5, 8, "'t'", "before it is defined")


def test_output_read_before_assigned() -> None:
    err = located("out y : f32[N]\nz[i] = y[i]\ny[i] = x[i]\n")
    assert_at(err, 6, 8, "'y'", "before any statement assigns it")


def test_every_output_is_assigned() -> None:
    err = located("out y : f32[N]\nout z : f32[N]\ny[i] = x[i]\n")
    assert_at(err, 6, 5, "output 'z' is never assigned")


def test_wrong_number_of_subscripts() -> None:
    assert_at(located("out y : f32[N]\ny[i] = x[i, j]\n"), 6, 8,
              "'x' has 1 dimension", "2 subscripts")
    assert_at(located("out y : f32[N, N]\ny[i] = x[i]\n"), 6, 1,
              "'y' has 2 dimensions", "1 subscript")
    assert_at(located("t[i] = x[i]\nt[i, j] += A[j, i]\n"), 6, 1, "'t' has 1 dimension")


def test_index_rules() -> None:
    assert_at(located("out y : f32[N]\ny[N] = x[N]\n"), 6, 3, "'N' is a size")
    assert_at(located("out y : f32[N, N]\ny[i, i] = x[i]\n"), 6, 6, "appears twice")


def test_self_read_must_be_pointwise() -> None:
    err = located("out y : f32[N]\ny[i] = x[i]\ny[j] += y[i] * x[j]\n")
    assert_at(err, 7, 9, "'y'", "y[j]")
    w = parse(HEADER + "out y : f32[N]\ny[i] = x[i]\ny[i] *= y[i] + 1\n")
    assert w.statements[1].accumulates


@pytest.mark.parametrize(("body", "col", "fragments"), [
    ("out y : f32[N]\ny[i] = x[i] +\n", 14, ("expected a number, a name or '('", "end of line")),
    ("out y : f32[N]\ny[i] -= x[i]\n", 6, ("expected an operator", "max=", "found '-='")),
    ("out y : f32[N]\ny[i] = (x[i]\n", 13, ("expected ')'", "end of line")),
    ("out y : f32[N]\ny[i] = x[i] @\n", 13, ("unexpected character '@'",)),
    ("out y : f32[N]\ny[i] = x[i] 3\n", 13, ("expected end of line", "number 3")),
    ("out y : f32[N]\ny i = x[i]\n", 3, ("expected '['", "name 'i'")),
    ("out y : f32[N]\ny[i] =\n", 7, ("expected an expression",)),
    ("out y : f32[N]\ny[i] = x\n", 8, ("'x' needs subscripts",)),
    ("out y : f32[N]\ny[i] = q\n", 8, ("unknown name 'q'",)),
    ("out y : f32[N]\ny[i] = N[i]\n", 8, ("'N' is a size, not a tensor",)),
    ("out y f32[N]\n", 7, ("expected ':'", "name 'f32'")),
    ("out y : f32(N)\n", 12, ("expected '['", "'('")),
    ("out y : f32[N,]\n", 15, ("expected a size name or a positive integer", "']'")),
    ("size = 3\n", 6, ("expected a size name", "'='")),
    ("3 = x\n", 1, ("expected a declaration", "number 3")),
    ("out y : f32[N]\ny[i] max x[i]\n", 6, ("expected an operator", "name 'max'")),
])
def test_syntax_errors(body: str, col: int, fragments: tuple[str, ...]) -> None:
    line = 4 + body.count("\n")
    assert_at(located(body), line, col, *fragments)


def test_float_literal_with_integer_operand_is_rejected() -> None:
    err = located("out y : i32[M]\ny[i] += A[i, j] * 0.5\n")
    assert_at(err, 6, 17, "float literal")


# ---------------------------------------------------------------- expressions and types


def test_precedence_unary_minus_and_parentheses() -> None:
    w = parse(HEADER + "out y : f32[N]\ny[i] = -x[i] + 2 * x[i] / (1 - x[i]) * -3\n")
    x = Access("x", ("i",))
    rhs = BinOp("*", BinOp("/", BinOp("*", Num(2), x), BinOp("-", Num(1), x)), Num(-3))
    assert w.statements[0].expr == BinOp("+", Neg(x), rhs)
    w = parse(HEADER + "out y : f32[N]\ny[i] = max(x[i], 0.5) - min(1e-3, .5) + M\n")
    expr = w.statements[0].expr
    assert expr == BinOp("+", BinOp("-", Call("max", (x, Num(0.5))),
                                    Call("min", (Num(0.001), Num(0.5)))), SizeRef("M", 4))


@pytest.mark.parametrize(("decls", "stmt", "dtype"), [
    ("in a : f16[N]\nin b : bf16[N]", "t[i] = a[i] + b[i]", DType.F32),
    ("in a : f16[N]\nin b : f16[N]", "t[i] = a[i] * b[i] * 2.0", DType.F16),
    ("in a : f16[N]\nin b : f32[N]", "t[i] = a[i] - b[i]", DType.F32),
    ("in a : bf16[N]\nin b : i32[N]", "t[i] = a[i] + b[i]", DType.BF16),
    ("in a : i8[N]\nin b : i16[N]", "t[i] = a[i] + b[i]", DType.I16),
    ("in a : i8[N]\nin b : i8[N]", "t[i] = a[i] * b[i] + 100", DType.I8),
    ("in a : i8[N]\nin b : i8[N]", "t[] += a[i] * b[i]", DType.I32),
    ("in a : i16[N]\nin b : i8[N]", "t[] *= a[i]", DType.I32),
    ("in a : i8[N]\nin b : i8[N]", "t[] max= a[i]", DType.I8),
    ("in a : i16[N]\nin b : i8[N]", "t[i] = abs(a[i]) + relu(b[i])", DType.I16),
    ("in a : i16[N]\nin b : i8[N]", "t[i] = exp(a[i])", DType.F32),
    ("in a : i16[N]\nin b : i8[N]", "t[i] = recip(b[i]) * 0.5", DType.F32),
    ("in a : f16[N]\nin b : i8[N]", "t[i] = sqrt(a[i])", DType.F16),
    ("in a : f16[N]\nin b : i8[N]", "t[i] = max(a[i], b[i])", DType.F16),
    ("in a : f16[N]\nin b : i8[N]", "t[] = 1.5", DType.F32),
    ("in a : f16[N]\nin b : i8[N]", "t[] = 3 * N", DType.I32),
])
def test_temporary_dtypes(decls: str, stmt: str, dtype: DType) -> None:
    w = parse(f"size N = 4\n{decls}\n{stmt}\n" + OUT)
    assert w.tensors["t"].dtype is dtype
    assert w.tensors["t"].role is Role.TEMP
    assert w.statements[0].dtype is dtype


def test_temporary_shape_and_dim_names_prefer_sizes() -> None:
    w = parse("size N = 4\nin z : f32[4]\nin x : f32[N]\nin q : f32[3]\nu[i] = z[i]\n"
              "v[i] = z[i] + x[i]\nw[j, i] += x[i] * q[j] * x[k]\n" + OUT)
    assert w.tensors["u"].dim_names == ("N",)  # the literal 4 equals size N
    assert w.tensors["v"].dim_names == ("N",)
    assert w.tensors["w"].shape == (3, 4) and w.tensors["w"].dim_names == ("3", "N")


def test_temporary_dim_names_follow_the_dimension_indexed() -> None:
    # A and B have the same value: each name comes from the dimension the index indexes
    w = parse("size A = 8\nsize B = 8\nin x : f32[B, A]\nt[j, i] = x[i, j]\n" + OUT)
    assert w.tensors["t"].dim_names == ("A", "B")


def test_reduced_in_order_of_first_appearance() -> None:
    w = parse(HEADER + "t[] += x[j] * A[i, j]\nu[] max= A[i, j]\n" + OUT)
    assert w.statements[0].reduced == ("j", "i")
    assert w.statements[1].reduced == ("i", "j")
    assert dict(w.statements[0].extents) == {"j": 8, "i": 4}


def test_repeated_targets_are_numbered_and_accumulate() -> None:
    w = parse(HEADER + "out y : f32[N]\nt[i] = x[i]\ny[i] = t[i]\nt[i] += x[i]\n"
              "y[i] max= t[i]\ny[i] += 1\n")
    names = [s.name for s in w.statements]
    assert names == ["t#1", "y#1", "t#2", "y#2", "y#3"]
    assert [s.accumulates for s in w.statements] == [False, False, True, True, True]
    assert w.statement("y#3").op is ReduceOp.ADD
    assert w.statements[2].location is not None and w.statements[2].location.line == 8


def test_max_equals_with_space_and_tabs() -> None:
    w = parse("size N = 4\nin x : f32[N]\nout m : f32[]\nm[]\tmax =\tx[i]\n")
    assert w.statements[0].op is ReduceOp.MAX
