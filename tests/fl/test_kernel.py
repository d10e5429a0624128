"""The one-pass kernel of the linear head against the overflow-safe reference."""

from __future__ import annotations

import numpy as np
import pytest

from dpprecond.fl import ClientData, FLConfig, make_method, simulate
from dpprecond.fl.kernels import clipped_sums, rounding_slack
from dpprecond.fl.models import LinearSoftmax
from dpprecond.fl.partition import iid_partition

from .conftest import make_problem


@pytest.fixture(scope="module")
def setup():
    X, y, Xt, yt = make_problem(n=3000, d=20, k=4, seed=2)
    data = ClientData.from_partition(X, y, iid_partition(len(y), 7, 0), 4)
    model = LinearSoftmax(20, 4)
    params = np.random.default_rng(1).standard_normal(model.n_params) * 0.2
    return data, model, params, Xt, yt


@pytest.mark.parametrize("clip", [0.3, 5.0, np.inf])
def test_fused_pass_equals_the_reference(setup, clip: float) -> None:
    data, model, params, _, _ = setup
    ref = model.clipped_grad_sums_safe(params, data.X, data.y, data.bounds, clip)
    x_sq = np.einsum("ij,ij->i", data.X, data.X)
    for block in (1, 37, 2048):  # blocks smaller than, across and beyond the clients
        got, hard = clipped_sums(data.X, data.y, params.reshape(21, 4), data.bounds, clip,
                                 x_sq, block_rows=block, n_threads=2)
        assert hard.size == 0
        np.testing.assert_allclose(got.reshape(ref.shape), ref, rtol=1e-11, atol=1e-11)
    # per-client parameters (the local-steps mechanisms)
    P = params + np.random.default_rng(3).standard_normal((7, model.n_params)) * 0.1
    np.testing.assert_allclose(model.clipped_grad_sums(P, data.X, data.y, data.bounds, clip),
                               model.clipped_grad_sums_safe(P, data.X, data.y, data.bounds,
                                                            clip), rtol=1e-11, atol=1e-11)


def test_float32_products_are_close_and_contributions_stay_clipped(setup) -> None:
    data, model, params, _, _ = setup
    C = 0.5
    X32 = data.X.astype(np.float32)
    x_sq = np.einsum("ij,ij->i", X32, X32, dtype=np.float64)
    got, _ = clipped_sums(X32, data.y, params.reshape(21, 4), data.bounds, C, x_sq)
    ref = model.clipped_grad_sums_safe(params, X32.astype(np.float64), data.y, data.bounds, C)
    np.testing.assert_allclose(got.reshape(ref.shape), ref, rtol=2e-4, atol=2e-4)
    # one row per client: the computed contribution has norm <= C
    one = np.arange(0, 3000, 1)[:7]
    single, _ = clipped_sums(X32[one], data.y[one], params.reshape(21, 4),
                             np.arange(8), C, x_sq[one])
    assert np.linalg.norm(single.reshape(7, -1), axis=1).max() <= C


def test_rounding_slack_bounds() -> None:
    # n (gamma + gamma' (1 + gamma)) + 2^-40: both neighbours' rounding (issue 22)
    u, u32 = 2.0**-53, 2.0**-24
    def g(m: int, unit: float) -> float:
        return m * unit / (1 - m * unit)
    assert rounding_slack(3000) == pytest.approx(3000 * 2 * g(3000, u) + 2.0**-40, rel=1e-6)
    assert rounding_slack(3000, np.float64, block_rows=2048) == pytest.approx(
        3000 * (g(2048, u) + g(2, u)) + 2.0**-40, rel=1e-6)
    assert rounding_slack(3000, np.float32) == pytest.approx(
        3000 * (g(32, u32) + g(3000, u)) + 2.0**-40, rel=1e-6)
    assert rounding_slack(600) < rounding_slack(3000) < 3e-9
    assert 5e-3 < rounding_slack(3000, np.float32) < 7e-3
    torch = pytest.importorskip("torch")
    assert rounding_slack(3000, torch.float32) == rounding_slack(3000, np.float32)


def test_float32_run_trains_like_float64(setup) -> None:
    data, model, _, Xt, yt = setup
    runs = {p: simulate(model, data, make_method("fedgd", learning_rate=0.5),
                        FLConfig(n_rounds=20, target_epsilon=8.0, precision=p),
                        X_test=Xt, y_test=yt, seed=4) for p in ("float64", "float32")}
    assert abs(runs["float32"].final_accuracy - runs["float64"].final_accuracy) < 0.02
    assert runs["float32"].epsilon == runs["float64"].epsilon


def _single_row_sums(X: np.ndarray, y: np.ndarray, W: np.ndarray, C: float) -> np.ndarray:
    """Every row as its own client: the computed per-record contributions, (n, p)."""
    x_sq = np.einsum("ij,ij->i", X, X, dtype=np.float64)
    out, hard = clipped_sums(X, y, W, np.arange(X.shape[0] + 1), C, x_sq)
    assert hard.size == 0
    return out.reshape(X.shape[0], -1)


def _norm(v: np.ndarray) -> float:
    """``||v||`` without underflow or overflow (scaled by its largest entry)."""
    top = float(np.max(np.abs(v)))
    return 0.0 if top == 0 else top * float(np.sqrt(np.sum(np.square(v / top))))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("scale", [1e-30, 1e-8, 1.0, 1e8, 1e15])
@pytest.mark.parametrize("C", [1e-300, 1e-12, 0.5, 1e100])
def test_every_computed_contribution_has_norm_at_most_C(dtype, scale: float, C: float) -> None:
    # the fast path's contributions at extreme magnitudes (rows, clip norms, underflow)
    rng = np.random.default_rng(5)
    X = (rng.standard_normal((64, 20)) * scale).astype(dtype)
    y = rng.integers(0, 4, 64)
    W = rng.standard_normal((21, 4)) / max(scale, 1.0)
    got = _single_row_sums(X, y, W, C)
    norms = np.array([_norm(r) for r in got])
    assert np.all(np.isfinite(got))
    assert norms.max() <= C
    # and they are the contributions, not lost to underflow: against the float64 safe path
    ref = LinearSoftmax(20, 4).clipped_grad_sums_safe(
        W.ravel(), X.astype(np.float64), y, np.arange(65), C)
    rel = 1e-4 if dtype == np.float32 else 1e-12  # float32: the logits' own rounding
    for g, r in zip(got, ref, strict=True):
        assert _norm(g - r) <= rel * _norm(r)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("value", [1e8, 1e30, 3e38])
def test_float32_and_float64_huge_rows_stay_within_the_sensitivity(dtype, value: float) -> None:
    """Worst-case neighbours (one record replaced by a huge one): the computed sums move by
    at most 2C (1 + slack), the sensitivity the noise is calibrated to."""
    rng = np.random.default_rng(6)
    n, C = 300, 0.7
    X = rng.standard_normal((n, 20))
    y = rng.integers(0, 4, n)
    model = LinearSoftmax(20, 4)
    params = rng.standard_normal(model.n_params) * 0.3
    X2 = X.copy()
    X2[7] = value * np.sign(rng.standard_normal(20))
    y2 = y.copy()
    y2[7] = (y[7] + 1) % 4
    sums = [model.clipped_grad_sums(params, A.astype(dtype), b, np.array([0, n]), C)
            for A, b in ((X, y), (X2, y2))]
    assert all(np.all(np.isfinite(s)) for s in sums)
    diff = float(np.linalg.norm(sums[0] - sums[1]))
    assert diff <= 2 * C * (1 + rounding_slack(n, dtype))


def test_float32_sum_error_is_within_the_stated_bound() -> None:
    """Aligned contributions at the clip norm (the worst case of the bound's magnitude):
    the float32 kernel's sum against the exact sum of its own contributions."""
    n, C = 3000, 1.0
    rng = np.random.default_rng(7)
    x = rng.uniform(0.5, 1.5, 30).astype(np.float32)
    X = np.tile(x, (n, 1)) * rng.uniform(0.9, 1.1, (n, 1)).astype(np.float32)
    y = np.zeros(n, dtype=np.int64)
    W = np.zeros((31, 3))
    contributions = _single_row_sums(X, y, W, C)  # each computed exactly as in the sum
    exact = np.zeros(contributions.shape[1])
    for j in range(contributions.shape[1]):  # math.fsum: the correctly rounded sum
        import math

        exact[j] = math.fsum(contributions[:, j])
    x_sq = np.einsum("ij,ij->i", X, X, dtype=np.float64)
    got, _ = clipped_sums(X, y, W, np.array([0, n]), C, x_sq)
    err = float(np.linalg.norm(got.ravel() - exact))
    one_side = rounding_slack(n, np.float32)  # = n (gamma32_s + ...) + 2^-40, both sides
    assert err <= one_side * C  # one dataset's rounding is half of it: a margin of 2x
    assert err > 0  # float32 does round here: the test can fail


def test_float64_numpy_kernel_does_not_depend_on_threads_or_blocking(setup) -> None:
    data, _, params, _, _ = setup
    W = params.reshape(21, 4)
    x_sq = np.einsum("ij,ij->i", data.X, data.X)
    runs = [clipped_sums(data.X, data.y, W, data.bounds, 0.5, x_sq, n_threads=t)[0]
            for t in (1, 2, 3)]
    for r in runs[1:]:
        np.testing.assert_array_equal(r, runs[0])
