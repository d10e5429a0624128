"""With clipping off and zero noise, every algorithm equals its non-private version.

The reference below is written independently of the library: plain full-batch softmax
gradients per client, a uniform average over clients, and the textbook server update
(dense inverse for SOFIM).
"""

from __future__ import annotations

import numpy as np
import pytest

from dpprecond.fl import ClientData, FLConfig, make_method, server, simulate
from dpprecond.fl.models import LinearSoftmax
from tests.fl.conftest import mean_gradient


def reference_run(algorithm: str, data: ClientData, n_rounds: int, lr: float,
                  k: int) -> np.ndarray:
    d = data.X.shape[1]
    W = np.zeros((d + 1, k))
    m, v = np.zeros_like(W), np.zeros_like(W)
    m_prev = np.zeros(W.size)
    v_yogi = np.full(W.shape, 1e-6)
    for t in range(1, n_rounds + 1):
        G = np.mean([mean_gradient(W, data.X[a:b], data.y[a:b])
                     for a, b in zip(data.bounds[:-1], data.bounds[1:], strict=True)], axis=0)
        g = G.ravel()
        if algorithm == "fedgd":
            step = g
        elif algorithm == "sofim-lagged":
            H = np.linalg.inv(np.outer(m_prev, m_prev) + 0.5 * np.eye(W.size))
            step = H @ g
            m = 0.9 * m + 0.1 * G
            m_prev = (m / (1 - 0.9**t)).ravel()
        elif algorithm.startswith("sofim"):
            m = 0.9 * m + 0.1 * G
            mh = (m / (1 - 0.9**t)).ravel()
            H = np.linalg.inv(np.outer(mh, mh) + 0.5 * np.eye(len(mh)))
            step = H @ (g if algorithm == "sofim" else mh)
        elif algorithm == "adam":
            m = 0.9 * m + 0.1 * G
            v = 0.99 * v + 0.01 * G**2
            step = ((m / (1 - 0.9**t)) / (np.sqrt(v / (1 - 0.99**t)) + 1e-3)).ravel()
        else:
            m = 0.9 * m + 0.1 * G
            v_yogi = v_yogi - 0.01 * np.sign(v_yogi - G**2) * G**2
            step = (m / (np.sqrt(v_yogi) + 1e-3)).ravel()
        W = W - lr * step.reshape(W.shape)
    return W.ravel()


@pytest.mark.parametrize("algorithm", ["fedgd", "sofim", "sofim-momentum", "sofim-lagged",
                                       "adam", "yogi"])
@pytest.mark.parametrize("mechanism", ["full-batch", "poisson", "client-level"])
def test_nonprivate_reduction(client_data: ClientData, problem: tuple, algorithm: str,
                              mechanism: str) -> None:
    _, _, Xt, yt = problem
    lr, T = 0.2, 6
    model = LinearSoftmax(client_data.X.shape[1], 3)
    config = FLConfig(n_rounds=T, clip_norm=np.inf, noise_multiplier=0.0,
                      mechanism=mechanism, local_lr=0.05)
    res = simulate(model, client_data, make_method(algorithm, lr), config,
                   X_test=Xt, y_test=yt, seed=5)
    ref = reference_run(algorithm, client_data, T, lr, 3)
    np.testing.assert_allclose(res.params, ref, rtol=1e-9, atol=1e-12)
    assert all(np.isinf(h["epsilon"]) for h in res.history)


def test_size_weighting_is_the_pooled_gradient(client_data: ClientData, problem: tuple) -> None:
    _, _, Xt, yt = problem
    model = LinearSoftmax(client_data.X.shape[1], 3)
    config = FLConfig(n_rounds=1, clip_norm=np.inf, noise_multiplier=0.0, weighting="size")
    res = simulate(model, client_data, server.sgd(1.0), config, X_test=Xt, y_test=yt)
    pooled = mean_gradient(np.zeros((client_data.X.shape[1] + 1, 3)), client_data.X,
                           client_data.y)
    np.testing.assert_allclose(res.params, -pooled.ravel(), rtol=1e-10, atol=1e-13)
