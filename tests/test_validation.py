"""The boundary checks: the message names the parameter, the value and the fix."""

from __future__ import annotations

import numpy as np
import pytest

from dpprecond._validation import (
    check_array,
    check_choice,
    check_delta,
    check_epsilon,
    check_fraction,
    check_int,
    check_labels,
    check_positive,
    check_random_state,
)


def test_array_checks() -> None:
    X = np.ones((3, 2))
    assert check_array("X", X) is not X or True
    with pytest.raises(ValueError, match=r"X to be a 2-D array, got shape \(3,\)"):
        check_array("X", np.ones(3))
    bad = X.copy()
    bad[1, 0] = np.nan
    with pytest.raises(ValueError, match=r"X contains 1 NaN or infinite entries .*\(1, 0\)"):
        check_array("X", bad)
    bad[1, 0] = np.inf
    with pytest.raises(ValueError, match="infinite"):
        check_array("X", bad)
    with pytest.raises(TypeError, match="numeric array"):
        check_array("X", [["a", "b"]])
    with pytest.raises(ValueError, match="at least 4 rows"):
        check_array("X", X, min_rows=4)
    assert np.isnan(bad).sum() == 0 and np.isinf(bad).sum() == 1  # input untouched


def test_scalar_checks() -> None:
    assert check_epsilon("epsilon", 1) == 1.0
    for v in (0, -1.0):
        with pytest.raises(ValueError, match=f"epsilon > 0, got epsilon={v}"):
            check_epsilon("epsilon", v)
    with pytest.raises(ValueError, match="finite epsilon"):
        check_epsilon("epsilon", float("inf"))
    with pytest.raises(TypeError, match="epsilon"):
        check_epsilon("epsilon", "1")
    for v in (0, 1, -0.1, float("nan")):
        with pytest.raises(ValueError, match="delta"):
            check_delta("delta", v)
    with pytest.raises(ValueError, match="clip_norm > 0, got clip_norm=0"):
        check_positive("clip_norm", 0)
    assert check_positive("R", float("inf"), allow_inf=True) == float("inf")
    with pytest.raises(ValueError, match=r"beta in \[0.0, 1.0\), got beta=1"):
        check_fraction("beta", 1)
    with pytest.raises(TypeError, match="k to be an integer"):
        check_int("k", 2.0)
    with pytest.raises(TypeError, match="integer"):
        check_int("k", True)
    with pytest.raises(ValueError, match="k >= 1, got k=0"):
        check_int("k", 0, low=1)
    with pytest.raises(ValueError, match=r"Unknown method='x'; expected one of \['a', 'b'\]"):
        check_choice("method", "x", ["a", "b"])


def test_labels() -> None:
    np.testing.assert_array_equal(check_labels("y", [0, 2, 1], 3), [0, 2, 1])
    with pytest.raises(ValueError, match=r"y in \[0, 3\), got values in \[0, 3\]"):
        check_labels("y", [0, 3], 3)
    with pytest.raises(ValueError, match="integer class labels"):
        check_labels("y", [0.5], 3)
    with pytest.raises(ValueError, match="one per row"):
        check_labels("y", [0, 1], 3, n_rows=3)


def test_random_state() -> None:
    a = check_random_state("random_state", 3).normal(size=3)
    np.testing.assert_array_equal(a, check_random_state("random_state", 3).normal(size=3))
    g = np.random.default_rng(0)
    assert check_random_state("random_state", g) is g
    with pytest.raises(TypeError, match="random_state"):
        check_random_state("random_state", "seed")
    with pytest.raises(ValueError, match="random_state >= 0"):
        check_random_state("random_state", -1)


# --- dtypes: nothing non-numeric is cast to float silently -------------------------------

@pytest.mark.parametrize(("value", "match"), [
    (np.array([["1.5", "2"]]), r"X to be a numeric array, got dtype <U3 \(text\)"),
    ([["1.5", "2"]], r"dtype <U3 \(text\)"),
    (np.array([[b"1.5", b"2"]]), r"dtype \|S3 \(bytes\)"),
    (np.array([[1, 2]], dtype="datetime64[s]"), r"dtype datetime64\[s\] \(dates\)"),
    (np.array([[1, 2]], dtype="timedelta64[s]"), r"dtype timedelta64\[s\] \(time spans\)"),
    (np.zeros((2, 2), dtype=[("a", "f8")]), r"structured"),
    (np.array([[1.0, "2.5"]], dtype=object), r"object array holding text \(str\)"),
    (np.array([[1.0, b"2"]], dtype=object), r"object array holding text \(bytes\)"),
    (np.array([[1.0, np.timedelta64(3, "s")]], dtype=object), r"dates or times \(timedelta64"),
    (np.array([[1.0, np.datetime64("2020-01-01")]], dtype=object), r"dates or times"),
    (np.array([[1.0, {}]], dtype=object), r"not 'dict'"),
    ("abc", r"dtype <U3"),
    (None, r"got None"),
])
def test_non_numeric_arrays_are_refused(value, match) -> None:
    with pytest.raises(TypeError, match=match):
        check_array("X", value)


def test_every_numpy_float_conversion_of_text_is_refused() -> None:
    """The exact silent casts of the issue: "1.5" strings and dates read as numbers."""
    for value in (["1.5", "2"], np.array(["2020-01-01"], dtype="datetime64[D]")):
        with pytest.raises(TypeError, match="numeric array"):
            check_array("v", value, ndim=1)


@pytest.mark.parametrize("value", [
    np.ones((2, 2), dtype=complex),
    np.array([[1 + 0j, 2]]),  # zero imaginary part: refused too, the caller must say np.real
    np.ones((2, 2), dtype=np.complex64),
    np.array([[1.0, 2j]], dtype=object),
])
def test_complex_is_refused_with_value_error(value) -> None:
    with pytest.raises(ValueError, match=r"Complex data not supported in X .*np\.real\(X\)"):
        check_array("X", value)


def test_numeric_dtypes_are_accepted_bool_as_zero_one() -> None:
    from decimal import Decimal
    from fractions import Fraction

    expected = np.array([[0.0, 1.0], [1.0, 0.0]])
    for value in (expected.astype(bool), expected.astype(np.int8), expected.astype(np.uint64),
                  expected.astype(np.float16), expected.astype(np.float32),
                  expected.astype(np.longdouble), expected.astype(object),
                  [[False, True], [True, False]],
                  np.array([[Decimal(0), Fraction(1)], [np.int64(1), np.float32(0)]],
                           dtype=object)):
        out = check_array("X", value)
        assert out.dtype == np.float64
        np.testing.assert_array_equal(out, expected)


def test_int64_extremes_convert_exactly_enough() -> None:
    big = np.array([[np.iinfo(np.int64).max, np.iinfo(np.int64).min]])
    np.testing.assert_array_equal(check_array("X", big), [[2.0**63, -(2.0**63)]])


def test_values_beyond_float64_are_named_not_called_nan() -> None:
    if np.finfo(np.longdouble).max <= np.finfo(np.float64).max:
        pytest.skip("long double is float64 on this platform")
    x = np.ones((2, 2), dtype=np.longdouble)
    x[1, 0] = np.longdouble(10) ** 400
    with pytest.raises(ValueError, match=r"X holds 1 entries beyond the float64 range .*\(1, 0\)"):
        check_array("X", x)


def test_python_int_too_large_for_float() -> None:
    with pytest.raises(ValueError, match=r"X holds a number too large for float64"):
        check_array("X", [[2**2000, 1]])


def test_sparse_and_masked_input() -> None:
    sparse = pytest.importorskip("scipy.sparse")
    with pytest.raises(TypeError, match=r"Sparse input .* X\.toarray\(\)"):
        check_array("X", sparse.csr_matrix(np.eye(2)))
    masked = np.ma.masked_array(np.ones((2, 2)), mask=[[0, 1], [0, 0]])
    with pytest.raises(ValueError, match=r"X is a masked array with 1 masked entries"):
        check_array("X", masked)
    np.testing.assert_array_equal(check_array("X", np.ma.masked_array(np.eye(2))), np.eye(2))


def test_object_array_with_dict_keeps_numpy_message() -> None:
    """scikit-learn's estimator checks match this message (check_dtype_object)."""
    X = np.ones((2, 2), dtype=object)
    X[0, 0] = {"foo": "bar"}
    with pytest.raises(TypeError, match=r"argument must be .* string.* number"):
        check_array("X", X)


def test_none_inside_an_object_array_is_a_missing_value() -> None:
    with pytest.raises(ValueError, match=r"X contains 1 NaN or infinite entries .*\(0, 1\)"):
        check_array("X", np.array([[1.0, None]], dtype=object))


def test_ragged_nested_lists() -> None:
    with pytest.raises(TypeError, match=r"X to be a numeric array, got list"):
        check_array("X", [[1.0, 2.0], [3.0]])


# --- labels -----------------------------------------------------------------------------

@pytest.mark.parametrize(("y", "match"), [
    (["0", "1"], r"integer class labels in y, got dtype <U1; encode"),
    (np.array([0, None], dtype=object), r"got dtype object"),
    ([0, 2**70], r"got dtype object"),  # beyond int64: numpy makes it an object array
    (np.array([0, 1], dtype="datetime64[s]"), r"datetime64"),
    (np.array([0, 1], dtype="timedelta64[s]"), r"timedelta64"),
])
def test_non_numeric_labels_are_type_errors(y, match) -> None:
    with pytest.raises(TypeError, match=match):
        check_labels("y", y, 3)


@pytest.mark.parametrize(("y", "match"), [
    ([0, 1 + 0j], r"complex dtype complex128"),
    ([0.0, np.nan], r"1 non-integer or non-finite value\(s\), first y\[1\]=nan"),
    ([0.0, np.inf], r"first y\[1\]=inf"),
    ([0.0, 1.0, 2.5, 0.5], r"2 non-integer .*first y\[2\]=2.5"),
    ([-1, 0], r"y in \[0, 3\), got values in \[-1, 0\]"),
    ([0.0, 1e300], r"got values in \[0, 1e\+300\]"),  # no int64 overflow before the check
    ([0.0, -1e300], r"got values in \[-1e\+300, 0\]"),
    (np.array([0, 2**64 - 1], dtype=np.uint64), r"got values in \[0, 1.84467e\+19\]"),
    (np.zeros((3, 1), dtype=int), r"y to be 1-D, got shape \(3, 1\)"),
    (1, r"y to be 1-D, got shape \(\)"),
])
def test_bad_label_values_are_value_errors(y, match) -> None:
    with pytest.raises(ValueError, match=match):
        check_labels("y", y, 3)


def test_label_dtypes_accepted() -> None:
    for y in ([0, 2, 1], np.array([0, 2, 1], np.uint8), np.array([0.0, 2.0, 1.0]),
              np.array([0, 2, 1], np.float16)):
        out = check_labels("y", y, 3)
        assert out.dtype == np.int64
        np.testing.assert_array_equal(out, [0, 2, 1])
    np.testing.assert_array_equal(check_labels("y", [True, False], 2), [1, 0])
    assert check_labels("y", [], 3).dtype == np.int64


def test_n_classes_is_checked_and_optional() -> None:
    with pytest.raises(TypeError, match=r"n_classes to be an integer, got 2.5"):
        check_labels("y", [0, 1], 2.5)
    with pytest.raises(TypeError, match=r"n_classes to be an integer, got True"):
        check_labels("y", [0, 1], True)
    with pytest.raises(ValueError, match=r"n_classes >= 1, got n_classes=0"):
        check_labels("y", [], 0)
    np.testing.assert_array_equal(check_labels("y", [5, 0, 9]), [5, 0, 9])
    with pytest.raises(ValueError, match=r"y to be class labels 0, 1, 2, ..., got values in "
                                         r"\[-2, 1\]"):
        check_labels("y", [-2, 1])
    with pytest.raises(ValueError, match=r"class labels 0, 1, 2"):
        check_labels("y", np.array([0, 2**63], dtype=np.uint64))


# -- issue 17, hole 6: delta above 1/n warns, an absurd delta is refused ----------------------


def test_delta_above_one_over_n_warns_and_an_absurd_delta_is_refused() -> None:
    """``--delta 0.5`` and ``target_delta=1e-2`` with n = 1797 were accepted silently."""
    from dpprecond import LargeDeltaWarning
    from dpprecond.accounting import PrivacyLedger
    from dpprecond.data import load_dataset
    from dpprecond.fl import FLConfig, run_federated
    from dpprecond.pca import fit_private_pca

    ds = load_dataset("digits")
    X = np.vstack([ds.X_train, ds.X_test])
    assert X.shape[0] == 1797
    with pytest.warns(LargeDeltaWarning, match=r"target_delta=0\.01 .* 1/n = 1/1797.*public"):
        fit_private_pca(X, 2, method="analyze_gauss", target_epsilon=1.0, target_delta=1e-2,
                        row_norm=8.0, seed=0)
    for delta in (0.5, 0.02):
        with pytest.raises(ValueError, match=rf"target_delta={delta}.*at most 0\.01"):
            fit_private_pca(X, 2, target_epsilon=1.0, target_delta=delta, row_norm=8.0)
        with pytest.raises(ValueError, match=rf"target_delta={delta}"):
            FLConfig(target_epsilon=1.0, target_delta=delta).validated()
        with pytest.raises(ValueError, match=rf"delta={delta}"):
            PrivacyLedger(delta)
    with pytest.warns(LargeDeltaWarning, match=r"1/n = 1/1437"):  # the federation's records
        run_federated(ds.X_train, ds.y_train, ds.X_test, ds.y_test, 10, algorithm="fedgd",
                      n_clients=4, seed=0, config=FLConfig(n_rounds=1, target_epsilon=1.0,
                                                           target_delta=1e-3))


@pytest.mark.parametrize("command", ["pca", "fl"])
def test_cli_refuses_an_absurd_delta(command: str, capsys: pytest.CaptureFixture) -> None:
    from dpprecond.cli import main

    assert main([command, "--delta", "0.5"]) == 2
    err = capsys.readouterr().err
    assert "--delta=0.5" in err and "at most 0.01" in err
