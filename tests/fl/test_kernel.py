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
    # n gamma_b / 2 with the float64 unit roundoff: the sums are float64 in both precisions
    assert rounding_slack(3000) == pytest.approx(3000 * 2048 * 2.0**-53 / 2, rel=1e-6)
    assert rounding_slack(3000, np.float32) == rounding_slack(3000)
    assert rounding_slack(600) < rounding_slack(3000) < 1e-9


def test_float32_run_trains_like_float64(setup) -> None:
    data, model, _, Xt, yt = setup
    runs = {p: simulate(model, data, make_method("fedgd", learning_rate=0.5),
                        FLConfig(n_rounds=20, target_epsilon=8.0, precision=p),
                        X_test=Xt, y_test=yt, seed=4) for p in ("float64", "float32")}
    assert abs(runs["float32"].final_accuracy - runs["float64"].final_accuracy) < 0.02
    assert runs["float32"].epsilon == runs["float64"].epsilon
