"""DP-FedProx: DP-FedAvg's releases on the proximal local objective.

The non-private reference is written independently of the library (a loop over clients,
dense matrices, the textbook proximal step).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpprecond.fl import ClientData, FLConfig, make_method, simulate
from dpprecond.fl.models import LinearSoftmax
from dpprecond.fl.partition import iid_partition
from dpprecond.secure import observe_releases
from tests.fl.conftest import FIXED
from tests.fl.conftest import mean_gradient as grad

T = 4
PRIVATE = FLConfig(**FIXED, n_rounds=T, clip_norm=1.0, target_epsilon=2.0)


def run(name: str, data: ClientData, problem, config: FLConfig, seed=3, **options):
    return simulate(LinearSoftmax(data.X.shape[1], data.n_classes), data,
                    make_method(name, **options), config, X_test=problem[2],
                    y_test=problem[3], seed=seed)


def test_mu_zero_is_fedavg_bit_for_bit(client_data, problem) -> None:
    options = dict(local_steps=3, local_lr=0.2, global_lr=0.7)
    prox = run("fedprox", client_data, problem, PRIVATE, mu=0.0, **options)
    avg = run("fedavg", client_data, problem, PRIVATE, **options)
    np.testing.assert_array_equal(prox.params, avg.params)
    assert prox.events == avg.events and prox.epsilon == avg.epsilon
    assert prox.noise_multiplier == avg.noise_multiplier > 0


def test_the_proximal_term_changes_the_run_but_not_its_releases(client_data,
                                                                 problem) -> None:
    """Same schedule, calibration and events as DP-FedAvg (the proximal gradient is
    post-processing); the model differs."""
    prox = run("fedprox", client_data, problem, PRIVATE, mu=0.5, local_steps=3)
    avg = run("fedavg", client_data, problem, PRIVATE, local_steps=3)
    assert prox.events == avg.events and prox.epsilon == avg.epsilon
    assert len(prox.events) == 3 * T
    assert prox.epsilon == pytest.approx(2.0, rel=1e-3)
    assert np.abs(prox.params - avg.params).max() > 1e-3
    assert prox.config["method"] == "fedprox" and prox.config["mu"] == 0.5


def ref_fedprox(data: ClientData, k: int, L: int, lr_l: float, lr_g: float,
                mu: float) -> np.ndarray:
    W = np.zeros((data.X.shape[1] + 1, k))
    for _ in range(T):
        changes = []
        for a, b in zip(data.bounds[:-1], data.bounds[1:], strict=True):
            X, y = data.X[a:b], data.y[a:b]
            Y = W.copy()
            for _ in range(L):
                Y = Y - lr_l * (grad(Y, X, y) + mu * (Y - W))
            changes.append(Y - W)
        W = W + lr_g * np.mean(changes, axis=0)
    return W.ravel()


def test_non_private_fedprox_is_the_proximal_local_descent(client_data, problem) -> None:
    config = FLConfig(**FIXED, n_rounds=T, clip_norm=math.inf, noise_multiplier=0.0)
    res = run("fedprox", client_data, problem, config, mu=0.8, local_steps=3, local_lr=0.2,
              global_lr=0.7)
    ref = ref_fedprox(client_data, 3, 3, 0.2, 0.7, 0.8)
    np.testing.assert_allclose(res.params, ref, rtol=1e-10, atol=1e-12)
    assert math.isinf(res.epsilon)


def _clients() -> ClientData:
    """Two clients, two classes, three features."""
    rng = np.random.default_rng(4)
    X = rng.standard_normal((40, 3))
    y = rng.integers(0, 2, 40)
    return ClientData.from_partition(X, y, iid_partition(40, 2, 0), 2)


def _worst_case_sums(model: LinearSoftmax, Y: np.ndarray, X: np.ndarray, y: np.ndarray,
                     C: float) -> float:
    """``||S_D(Y) - S_D'(Y)||`` for the worst-case neighbours at the model ``Y``: record 0
    replaced by a large-norm record (features orthogonal to the weight difference, so
    neither label's gradient vanishes) once with label 0 and once with label 1. For two
    classes the two clipped gradients are antiparallel (``p - e_0 = -(p - e_1)`` up to
    scale), so the clipped sums differ by exactly ``2C``."""
    W = Y.reshape(X.shape[1] + 1, 2)
    w = W[:-1, 0] - W[:-1, 1]
    v = np.array([1.0, -2.0, 0.5])
    v = v - (v @ w) / max(w @ w, 1e-300) * w
    a, b = X.copy(), X.copy()
    a[0] = b[0] = 1e3 * v / np.linalg.norm(v)
    ya, yb = y.copy(), y.copy()
    ya[0], yb[0] = 0, 1
    bounds = np.array([0, len(y)])
    S = model.clipped_grad_sums(Y[None, :], a, ya, bounds, C)
    S2 = model.clipped_grad_sums(Y[None, :], b, yb, bounds, C)
    return float(np.linalg.norm(S - S2))


def test_sensitivity_of_every_local_step_with_worst_case_neighbours() -> None:
    """Every local step releases the clipped sum at the client's iterate plus noise of std
    ``2 z C`` (times the rounding inflation); worst-case neighbours move that clipped sum
    by exactly ``2C`` at every iterate of a DP-FedProx trajectory, including those where
    the proximal term is active (it adds nothing to the release)."""
    D = _clients()
    model = LinearSoftmax(3, 2)
    C, z, mu, lr, L = 1.0, 1.5, 2.0, 0.5, 3
    config = FLConfig(**FIXED, n_rounds=2, clip_norm=C, noise_multiplier=z)
    method = make_method("fedprox", mu=mu, local_steps=L, local_lr=lr)
    with observe_releases() as seen:
        simulate(model, D, method, config, X_test=D.X, y_test=D.y, seed=1)
    K = D.n_clients
    assert len(seen) == 2 * L * K  # rounds x local steps x clients
    slack = model.rounding_slack(int(np.diff(D.bounds).max()))
    for _, std in seen:
        assert std == pytest.approx(2 * z * C * (1 + slack), rel=1e-15)
    # client 0's iterates in round 1, rebuilt from its releases (steps 1..L)
    lo, hi = D.bounds[0], D.bounds[1]
    theta = np.zeros(model.n_params)
    iterates = [theta]
    for value, _ in seen[: L * K: K]:
        y_t = iterates[-1]
        iterates.append(y_t - lr * (value / (hi - lo) + mu * (y_t - theta)))
    assert np.abs(iterates[1] - theta).max() > 1e-3  # the proximal term acts from step 2
    for Y in iterates:
        assert _worst_case_sums(model, Y, D.X[lo:hi], D.y[lo:hi], C) == pytest.approx(
            2 * C, rel=1e-9)


def test_bad_mu_is_refused() -> None:
    with pytest.raises(ValueError, match="mu"):
        make_method("fedprox", mu=-1.0)
    with pytest.raises(ValueError, match="mechanism='full-batch'"):
        run("fedprox", *_client_problem(), FLConfig(**FIXED, n_rounds=2, noise_multiplier=1.0,
                                                    mechanism="poisson", sampling_rate=0.5))


def _client_problem():
    D = _clients()
    return D, (D.X, D.y, D.X, D.y)
