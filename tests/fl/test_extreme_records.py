"""Hole 2 of the privacy issue: a record with huge entries must not poison the release.

A record whose entries are near 1e155 or above used to overflow the per-example norm
(``||x||^2``) and the logits, so the released messages and the model became NaN, which
reveals that the record exists. Per-example clipping bounds each record's contribution to
``C`` for every finite input, so the messages must stay finite, and a hostile record must
change a message by at most the clipping sensitivity ``2C`` (before noise) like any other.
"""

from __future__ import annotations

import numpy as np
import pytest

from dpprecond.fl.models import LinearSoftmax

from .conftest import make_problem


@pytest.mark.parametrize("value", [1e8, 1e155, 1e200, 1e300, 1.7e308, -1.7e308])
def test_clipped_sums_are_finite_and_bounded_for_huge_records(value: float) -> None:
    X, y, _, _ = make_problem(n=60)
    model = LinearSoftmax(X.shape[1], 3)
    rng = np.random.default_rng(0)
    params = rng.standard_normal(model.n_params) * 0.3
    bounds = np.array([0, 30, 60])
    C = 1.5
    base = model.clipped_grad_sums(params, X, y, bounds, C)
    Xh = X.copy()
    Xh[0] = value
    Xh[1, 0] = value  # one huge entry among ordinary ones
    hostile = model.clipped_grad_sums(params, Xh, y, bounds, C)
    assert np.all(np.isfinite(hostile))
    # two records changed in client 0 -> at most 2 * 2C apart; client 1 untouched
    assert np.linalg.norm(hostile[0] - base[0]) <= 4 * C * (1 + 1e-12)
    np.testing.assert_array_equal(hostile[1], base[1])


def test_huge_record_gradient_is_the_limit_direction() -> None:
    """x = t e_1 for huge t: the clipped gradient is C x_hat r^T / ||x_hat r^T|| where the
    softmax saturates; the same as for a large but ordinary t."""
    model = LinearSoftmax(3, 2)
    params = np.array([1.0, -1.0, 0.5, 0.2, 0.0, 0.0, 0.0, 0.0])
    y = np.array([1])
    bounds = np.array([0, 1])
    big = model.clipped_grad_sums(params, np.array([[1e6, 0.0, 0.0]]), y, bounds, 1.0)
    huge = model.clipped_grad_sums(params, np.array([[1e300, 0.0, 0.0]]), y, bounds, 1.0)
    np.testing.assert_allclose(huge, big, atol=1e-5)
    assert np.linalg.norm(huge) == pytest.approx(1.0, rel=1e-6)


def test_run_with_a_huge_record_gives_a_finite_model() -> None:
    from dpprecond.fl import FLConfig, run_federated

    X, y, Xt, yt = make_problem(n=200)
    X[0] = 1e300
    res = run_federated(X, y, Xt, yt, 3, algorithm="fedgd", n_clients=4,
                        config=FLConfig(n_rounds=3, target_epsilon=1.0), seed=0)
    assert np.all(np.isfinite(res.params))
    assert all(np.isfinite(h["test_loss"]) for h in res.history)


@pytest.mark.parametrize("mechanism", ["full-batch", "poisson", "client-level"])
def test_every_client_mechanism_stays_finite(mechanism: str) -> None:
    from dpprecond.fl import FLConfig, run_federated

    X, y, Xt, yt = make_problem(n=200)
    X[0] = 1.7e308
    X[1, 2] = -1e300
    extra = {"poisson": dict(sampling_rate=0.5, local_steps=2),
             "client-level": dict(local_steps=2)}.get(mechanism, {})
    res = run_federated(X, y, Xt, yt, 3, algorithm="fedgd", n_clients=4,
                        config=FLConfig(n_rounds=2, target_epsilon=1.0, mechanism=mechanism,
                                        **extra), seed=0)
    assert np.all(np.isfinite(res.params))


@pytest.mark.parametrize("name", ["scaffold", "fedfc", "fednew"])
def test_baselines_stay_finite(name: str) -> None:
    from dpprecond.fl import ClientData, FLConfig, make_method, simulate
    from dpprecond.fl.partition import iid_partition

    X, y, Xt, yt = make_problem(n=200)
    X[5] = 1e300
    data = ClientData.from_partition(X, y, iid_partition(len(y), 4, 1), 3)
    res = simulate(LinearSoftmax(X.shape[1], 3), data, make_method(name),
                   FLConfig(n_rounds=2, target_epsilon=1.0), X_test=Xt, y_test=yt, seed=0)
    assert np.all(np.isfinite(res.params))


def test_rows_with_overflowing_gradients_are_zero_not_nan() -> None:
    from dpprecond.fl.models import clip_rows_safely

    G = np.array([[np.inf, 0.0], [1e300, 1e300], [3.0, 4.0], [0.0, 0.0]])
    out = clip_rows_safely(G, 1.0)
    assert np.all(np.isfinite(out))
    np.testing.assert_array_equal(out[0], 0.0)
    assert np.linalg.norm(out[1]) <= 1.0
    np.testing.assert_allclose(out[1], [2**-0.5, 2**-0.5], rtol=1e-8)
    np.testing.assert_allclose(out[2], [0.6, 0.8], rtol=1e-8)
    np.testing.assert_array_equal(out[3], 0.0)


def test_torch_model_with_a_huge_record_is_finite() -> None:
    torch = pytest.importorskip("torch")
    from dpprecond.fl.models import TorchModel

    torch.manual_seed(0)
    model = TorchModel(torch.nn.Sequential(torch.nn.Linear(4, 3)).double())
    X = np.random.default_rng(0).standard_normal((10, 4))
    X[0] = 1e300
    y = np.arange(10) % 3
    out = model.clipped_grad_sums(model.init_params(None), X, y, np.array([0, 5, 10]), 1.0)
    assert np.all(np.isfinite(out))
    assert np.linalg.norm(out[0]) <= 5.0
