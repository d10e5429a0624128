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
    assert check_epsilon(1) == 1.0
    for v in (0, -1.0):
        with pytest.raises(ValueError, match=f"epsilon > 0, got epsilon={v}"):
            check_epsilon(v)
    with pytest.raises(ValueError, match="finite epsilon"):
        check_epsilon(float("inf"))
    with pytest.raises(TypeError, match="epsilon"):
        check_epsilon("1")
    for v in (0, 1, -0.1, float("nan")):
        with pytest.raises(ValueError, match="delta"):
            check_delta(v)
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
    a = check_random_state(3).normal(size=3)
    np.testing.assert_array_equal(a, check_random_state(3).normal(size=3))
    g = np.random.default_rng(0)
    assert check_random_state(g) is g
    with pytest.raises(TypeError, match="random_state"):
        check_random_state("seed")
    with pytest.raises(ValueError, match="random_state >= 0"):
        check_random_state(-1)
