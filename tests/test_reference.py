"""Tests of the NumPy reference against hand-written NumPy, C integer semantics and compare."""

from __future__ import annotations

import numpy as np
import pytest

import synth.reference as reference
from synth.errors import InputError
from synth.lang import load_workload, parse_workload
from synth.reference import compare, evaluate, evaluate_errors, make_inputs, tolerance
from synth.workload import DType, Workload


def parse(text: str) -> Workload:
    return parse_workload(text, "t.syn", "t")


# ---------------------------------------------------------------- inputs


def test_make_inputs_is_deterministic_and_in_range() -> None:
    w = load_workload("attention", {"S": 64, "D": 16})
    a, b = make_inputs(w, seed=3), make_inputs(w, seed=3)
    assert list(a) == ["Q", "K", "V"]
    for name in a:
        assert np.array_equal(a[name], b[name])
        assert a[name].dtype == np.float32
        assert a[name].min() >= -1.0 and a[name].max() < 1.0
        assert a[name].min() < -0.9 and a[name].max() > 0.9  # really spread over [-1, 1)
    assert not np.array_equal(a["Q"], make_inputs(w, seed=4)["Q"])
    assert not np.array_equal(a["Q"], a["K"])


def test_make_inputs_integers_small_and_nonzero() -> None:
    w = parse("size N = 1000\nin a : i8[N]\nin b : i32[N, 2]\nin c : f16[]\nout y : i32[N]\n"
              "y[i] += a[i] * b[i, j]\n")
    values = make_inputs(w)
    assert values["a"].dtype == np.int8 and values["b"].dtype == np.int32
    assert set(np.unique(values["a"])) == {1, 2, 3}
    assert set(np.unique(values["b"])) == {1, 2, 3}
    assert values["c"].shape == () and values["c"].dtype == np.float16


def test_missing_or_misshapen_input() -> None:
    w = load_workload("va", {"N": 8})
    with pytest.raises(InputError, match="'b'"):
        evaluate(w, {"a": np.ones(8, np.int32)})
    with pytest.raises(InputError, match="shape"):
        evaluate(w, {"a": np.ones(8, np.int32), "b": np.ones(9, np.int32)})


# ---------------------------------------------------------------- built-ins against NumPy


def test_softmax() -> None:
    w = load_workload("softmax", {"N": 4096})
    x = make_inputs(w, seed=1)["x"].astype(np.float64)
    values = evaluate(w, make_inputs(w, seed=1))
    e = np.exp(x - x.max())
    expected = e / e.sum()
    assert values["y"].dtype == np.float32 and values["y"].shape == (4096,)
    np.testing.assert_allclose(values["y"], expected, rtol=1e-6)
    assert values["m"] == np.float32(x.max()) and values["m"].shape == ()
    np.testing.assert_allclose(values["s"], e.sum(), rtol=1e-6)


def test_matmul_small() -> None:
    w = load_workload("matmul", {"M": 16, "N": 8, "K": 32})
    inputs = make_inputs(w)
    c = evaluate(w, inputs)["C"]
    assert c.dtype == np.int32
    assert np.array_equal(c, inputs["A"].astype(np.int64) @ inputs["B"].astype(np.int64))


def test_attention_small() -> None:
    w = load_workload("attention", {"S": 32, "D": 8})
    inputs = make_inputs(w, seed=2)
    q, k, v = (inputs[n].astype(np.float64) for n in "QKV")
    s = q @ k.T
    p = np.exp(s - s.max(axis=1, keepdims=True))
    expected = (p @ v) / p.sum(axis=1, keepdims=True)
    values, sigmas = evaluate_errors(w, inputs)
    np.testing.assert_allclose(values["O"], expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(values["m"], s.max(axis=1), rtol=1e-6)
    assert compare(expected, values["O"], DType.F32, sigmas["O"]).passed


def test_fa6_small_is_finite() -> None:
    w = load_workload("fa6", {"S": 32, "D": 32})
    inputs = make_inputs(w)
    q, k, bias = (inputs[n].astype(np.float64) for n in ("Q", "K", "Bias"))
    expected = 1.0 / np.sqrt(np.exp(q @ k.T - bias))
    values = evaluate(w, inputs)
    assert np.array_equal(values["kt"], inputs["K"].T)
    np.testing.assert_allclose(values["O"], expected, rtol=1e-6)
    assert np.isfinite(values["O"]).all()


def test_red_and_mv() -> None:
    red = load_workload("red", {"N": 1000})
    inputs = make_inputs(red)
    assert evaluate(red, inputs)["s"] == inputs["x"].sum()
    mv = load_workload("mv", {"M": 24, "N": 40})
    inputs = make_inputs(mv)
    y = evaluate(mv, inputs)["y"]
    assert y.dtype == np.int32
    assert np.array_equal(y, inputs["A"].astype(np.int64) @ inputs["x"])


def test_builtins_at_default_size_are_fast() -> None:
    """matmul (1024x2048x512) at full size through the einsum path, exactly."""
    w = load_workload("matmul")
    inputs = make_inputs(w)
    c = evaluate(w, inputs)["C"]
    a, b = inputs["A"].astype(np.float32), inputs["B"].astype(np.float32)
    assert np.array_equal(c[:64], (a[:64] @ b).astype(np.int32))


# ---------------------------------------------------------------- semantics


def test_integer_wraps_in_target_width() -> None:
    w = parse("size N = 3\nin a : i32[N]\nout y : i32[N]\nout z : i8[N]\n"
              "y[i] = a[i] * a[i]\nz[i] = a[i] + a[i]\n")
    a = np.array([100000, 100, -70000], dtype=np.int32)
    values = evaluate(w, {"a": a})
    assert values["y"].tolist() == (a.astype(np.int64) ** 2).astype(np.int32).tolist()
    assert values["y"][0] == 1410065408  # 10^10 mod 2^32
    assert values["z"].dtype == np.int8
    assert values["z"].tolist() == [64, -56, 32]  # 200000, 200, -140000 modulo 2^8


def test_integer_sums_wrap() -> None:
    w = parse("size N = 4\nin x : i32[N]\nout s : i32[]\nout t : i32[]\ns[] += x[i]\n"
              "t[] += x[i] * x[i]\n")
    x = np.full(4, 2**30, dtype=np.int32)
    values = evaluate(w, {"x": x})
    assert values["s"] == 0  # 2^32 wraps to 0
    assert values["t"] == 0  # 4 * 2^60 wraps to 0 (through the exact int64 einsum)


@pytest.mark.parametrize("magnitude", [3, 2**20, 2**30])
def test_sum_of_products_is_exact_at_every_magnitude(magnitude: int) -> None:
    """The einsum path picks f32, f64 or int64 by a bound; each must give the C answer."""
    w = parse("size M = 5\nsize K = 7\nin A : i32[M, K]\nin b : i32[K]\nout y : i32[M]\n"
              "y[m] += A[m, k] * b[k] * 3\n")
    rng = np.random.default_rng(0)
    a = rng.integers(-magnitude, magnitude, size=(5, 7)).astype(np.int32)
    b = rng.integers(-magnitude, magnitude, size=7).astype(np.int32)
    expected = ((a.astype(object) @ b.astype(object)) * 3) % 2**32
    expected = np.array([int(v) - 2**32 if v >= 2**31 else int(v) for v in expected])
    assert evaluate(w, {"A": a, "b": b})["y"].tolist() == expected.tolist()


def test_integer_division_truncates_toward_zero() -> None:
    w = parse("size N = 5\nin a : i32[N]\nin b : i32[N]\nout q : i32[N]\nq[i] = a[i] / b[i]\n")
    a = np.array([-7, 7, -7, 7, 5], dtype=np.int32)
    b = np.array([2, 2, -2, -2, 0], dtype=np.int32)
    assert evaluate(w, {"a": a, "b": b})["q"].tolist() == [-3, 3, 3, -3, 0]


def test_recip_of_integer_is_float_and_store_truncates() -> None:
    w = parse("size N = 3\nin a : i32[N]\nout y : f32[N]\nout z : i32[N]\nt[i] = recip(a[i])\n"
              "y[i] = t[i]\nz[i] = t[i] * 5\n")
    values = evaluate(w, {"a": np.array([1, 2, -3], dtype=np.int32)})
    assert values["t"].dtype == np.float32
    np.testing.assert_allclose(values["y"], [1.0, 0.5, -1 / 3], rtol=1e-7)
    assert values["z"].tolist() == [5, 2, -1]  # 2.5 -> 2 and -1.67 -> -1: toward zero


def test_fresh_targets_start_from_identity_and_accumulate() -> None:
    w = parse("size N = 4\nin x : i16[N]\nout lo : i16[]\nout hi : i16[]\nout p : i32[]\n"
              "lo[] min= x[i]\nhi[] max= x[i]\np[] *= x[i]\nhi[] max= 5\np[] += 1\n")
    values = evaluate(w, {"x": np.array([3, -2, 4, 1], dtype=np.int16)})
    assert (values["lo"], values["hi"], values["p"]) == (-2, 5, -23)


def test_functions_and_size_refs() -> None:
    w = parse("size N = 4\nin x : f32[N]\nout y : f32[N]\n"
              "y[i] = relu(x[i]) + abs(x[i]) * max(x[i], 0.25) - min(tanh(x[i]), 0) + N"
              " + rsqrt(exp(x[i])) + log(sqrt(abs(x[i]) + 1))\n")
    x = np.array([-0.5, 0.0, 0.5, 0.9], dtype=np.float32)
    xd = x.astype(np.float64)
    expected = (np.maximum(xd, 0) + np.abs(xd) * np.maximum(xd, 0.25)
                - np.minimum(np.tanh(xd), 0) + 4 + 1 / np.sqrt(np.exp(xd))
                + np.log(np.sqrt(np.abs(xd) + 1)))
    np.testing.assert_allclose(evaluate(w, {"x": x})["y"], expected, rtol=1e-6)


def test_assign_broadcasts_over_target_indices() -> None:
    w = parse("size M = 2\nsize N = 3\nin r : f32[M]\nout y : f32[M, N]\ny[i, j] = r[i]\n")
    r = np.array([1.5, -2.0], dtype=np.float32)
    assert np.array_equal(evaluate(w, {"r": r})["y"], np.repeat(r[:, None], 3, axis=1))


def test_transposed_and_reordered_access() -> None:
    w = parse("size M = 3\nsize N = 4\nin A : f32[M, N]\nout t : f32[N]\nout u : f32[N, M]\n"
              "t[j] max= A[i, j] + 1\nu[j, i] = A[i, j] * 2\n")
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    values = evaluate(w, {"A": a})
    assert values["t"].tolist() == (a.max(axis=0) + 1).tolist()
    assert np.array_equal(values["u"], a.T * 2)


@pytest.mark.parametrize("chunk", [5, 7, 64])
def test_chunked_evaluation_matches_unchunked(monkeypatch: pytest.MonkeyPatch,
                                              chunk: int) -> None:
    """Blocks along a target index are concatenated, along a reduced index combined."""
    w = parse("size M = 6\nsize K = 5\nsize N = 4\nin A : f32[M, K]\nin B : f32[K, N]\n"
              "in v : i32[K]\nout C : f32[M, N]\nout s : i32[]\nout m : f32[]\n"
              "C[i, j] max= A[i, k] + B[k, j]\ns[] += v[k] * v[k] + 1\nm[] min= A[i, k]\n")
    inputs = make_inputs(w, seed=5)
    whole = evaluate(w, inputs)
    monkeypatch.setattr(reference, "CHUNK_ELEMENTS", chunk)
    parts = evaluate(w, inputs)
    for name in ("C", "s", "m"):
        assert np.array_equal(whole[name], parts[name]), name
    expected = (inputs["A"][:, :, None] + inputs["B"][None, :, :]).max(axis=1)
    assert np.array_equal(whole["C"], expected)
    assert whole["s"] == (inputs["v"].astype(np.int64) ** 2 + 1).sum()


def test_evaluate_returns_every_tensor() -> None:
    w = load_workload("softmax", {"N": 16})
    values = evaluate(w, make_inputs(w))
    assert set(values) == {"x", "y", "m", "e", "s"}
    for name, tensor in w.tensors.items():
        assert values[name].shape == tensor.shape and values[name].dtype == tensor.dtype.numpy


# ---------------------------------------------------------------- compare


def test_compare_integers_exact() -> None:
    e = np.array([1, 2, 3], dtype=np.int32)
    assert compare(e, e.copy(), DType.I32)[:3] == (True, 0.0, 0.0)
    passed, max_abs, max_rel, _, _ = compare(e, np.array([1, 2, 4], dtype=np.int32), DType.I32)
    assert (passed, max_abs) == (False, 1.0) and max_rel == pytest.approx(1 / 3)


def test_compare_floats_within_lambda_sigma() -> None:
    e = np.linspace(-1, 1, 101).astype(np.float32)
    sigma = np.full(101, 1e-6)
    allowed = tolerance(e, sigma, DType.F32)
    assert allowed == pytest.approx(8e-6 + 2**-24 * np.abs(e.astype(float)), rel=1e-6)
    assert compare(e, e + 7.9e-6, DType.F32, sigma).passed
    result = compare(e, e + 8.2e-6, DType.F32, sigma)
    assert not result.passed and result.max_abs_err == pytest.approx(8.2e-6, rel=1e-2)
    assert result.used > 1
    # without an error scale only the final rounding is allowed: half an ulp
    assert compare(e, e, DType.F32).passed
    assert not compare(e, e * (1 + 1e-6), DType.F32).passed
    assert compare(e, e * (1 + 1e-6), DType.F16).passed  # f16 rounds more


def test_compare_skips_elements_with_an_infinite_error_scale() -> None:
    e = np.array([1.0, 2.0, 3.0], dtype=np.float32)
    sigma = np.array([0.0, np.inf, 0.0])
    result = compare(e, np.array([1.0, np.nan, 3.0]), DType.F32, sigma)
    assert result.passed and result.unchecked == 1
    assert not compare(e, np.array([1.5, 2.0, 3.0]), DType.F32, sigma).passed


def test_compare_specials_and_shapes() -> None:
    e = np.array([np.nan, np.inf, 1.0])
    assert compare(e, e.copy(), DType.F32)[0]
    assert not compare(e, np.array([1.0, np.inf, 1.0]), DType.F32)[0]
    assert not compare(e, np.array([np.nan, -np.inf, 1.0]), DType.F32)[0]
    assert compare(e, np.zeros(4), DType.F32)[:3] == (False, float("inf"), float("inf"))
