"""Server transforms: Sherman-Morrison against a dense solve, optimizers against references."""

from __future__ import annotations

import numpy as np
import pytest

from dpprecond.fl import server
from dpprecond.fl.methods import make_method


def dense_H(m: np.ndarray, rho: float) -> np.ndarray:
    return np.linalg.inv(np.outer(m, m) + rho * np.eye(len(m)))


@pytest.mark.parametrize("rho", [1e-3, 0.5, 7.0])
def test_sherman_morrison_equals_dense_solve(rho: float) -> None:
    rng = np.random.default_rng(0)
    for p in (1, 5, 12):
        m, v = rng.standard_normal(p) * 3, rng.standard_normal(p)
        dense = np.linalg.solve(np.outer(m, m) + rho * np.eye(p), v)
        np.testing.assert_allclose(server.sherman_morrison_apply(m, v, rho), dense,
                                   rtol=1e-9, atol=1e-12)


def reference_sofim(grads: list[np.ndarray], theta: np.ndarray, lr: float, beta: float,
                    rho: float, precondition: str, bias_correction: bool, warmup: int,
                    wd: float, lagged: bool = False) -> np.ndarray:
    """The spec's DP-FedSOFIM server step with a dense (M M^T + rho I)^{-1}."""
    M = np.zeros_like(theta)
    for t, G in enumerate(grads, start=1):
        Mprev = M / (1 - beta ** (t - 1)) if (bias_correction and t > 1) else M
        M = beta * M + (1 - beta) * G
        Mh = M / (1 - beta**t) if bias_correction else M
        if t <= warmup:
            d = Mh
        elif lagged:
            d = dense_H(Mprev, rho) @ G
        else:
            d = dense_H(Mh, rho) @ (G if precondition == "gradient" else Mh)
        theta = theta - lr * (d + wd * theta)
    return theta


@pytest.mark.parametrize("precondition", ["gradient", "momentum", "lagged"])
@pytest.mark.parametrize(("bias_correction", "warmup", "wd"),
                         [(True, 0, 0.0), (False, 0, 0.0), (True, 2, 0.01), (False, 1, 0.1)])
def test_sofim_matches_dense_reference(precondition: str, bias_correction: bool, warmup: int,
                                       wd: float) -> None:
    rng = np.random.default_rng(1)
    p = 9
    grads = [rng.standard_normal(p) for _ in range(6)]
    theta0 = rng.standard_normal(p)
    lagged = precondition == "lagged"
    form = "gradient" if lagged else precondition
    opt = server.sofim(0.3, beta=0.8, rho=0.7, precondition=form, lagged=lagged,
                       bias_correction=bias_correction, warmup_rounds=warmup, weight_decay=wd)
    theta, state = theta0.copy(), opt.init(theta0)
    for G in grads:
        upd, state = opt.update(G, state, theta)
        theta = theta + upd
    ref = reference_sofim(grads, theta0.copy(), 0.3, 0.8, 0.7, form, bias_correction,
                          warmup, wd, lagged)
    np.testing.assert_allclose(theta, ref, rtol=1e-10, atol=1e-12)


def test_momentum_form_is_closed_form() -> None:
    m = np.array([3.0, -4.0])  # ||m||^2 = 25
    np.testing.assert_allclose(dense_H(m, 0.5) @ m, m / 25.5, rtol=1e-12)


def test_adam_and_yogi_match_reference_formulas() -> None:
    rng = np.random.default_rng(2)
    p, lr, b1, b2, eps = 5, 0.05, 0.9, 0.99, 1e-3
    grads = [rng.standard_normal(p) for _ in range(5)]
    for name in ("adam", "yogi"):
        opt = server.adam(lr, b1, b2, eps) if name == "adam" else server.yogi(lr, b1, b2, eps)
        theta = np.zeros(p)
        state = opt.init(theta)
        ref = np.zeros(p)
        mu, nu = np.zeros(p), np.zeros(p) if name == "adam" else np.full(p, 1e-6)
        for t, g in enumerate(grads, start=1):
            upd, state = opt.update(g, state, theta)
            theta = theta + upd
            mu = b1 * mu + (1 - b1) * g
            if name == "adam":
                nu = b2 * nu + (1 - b2) * g**2
                ref = ref - lr * (mu / (1 - b1**t)) / (np.sqrt(nu / (1 - b2**t)) + eps)
            else:
                nu = nu - (1 - b2) * np.sign(nu - g**2) * g**2
                ref = ref - lr * mu / (np.sqrt(nu) + eps)
        np.testing.assert_allclose(theta, ref, rtol=1e-12)


def test_sgd_momentum_and_chain() -> None:
    opt = server.sgd(0.1, momentum=0.5)
    theta = np.ones(3)
    state = opt.init(theta)
    g = np.array([1.0, 2.0, 3.0])
    u1, state = opt.update(g, state, theta)
    u2, state = opt.update(g, state, theta)
    np.testing.assert_allclose(u1, -0.1 * g)
    np.testing.assert_allclose(u2, -0.1 * 1.5 * g)


def test_state_is_o_p() -> None:
    """No p x p object anywhere in the SOFIM state."""
    opt = server.sofim()
    state = opt.init(np.zeros(1000))
    arrays = [x for s in state for x in s if isinstance(x, np.ndarray)]
    assert arrays and all(a.size <= 1000 for a in arrays)


@pytest.mark.parametrize("kwargs", [{"rho": 0.0}, {"rho": -1.0}, {"beta": 1.0},
                                    {"beta": -0.1}, {"beta": 1.5}, {"learning_rate": 0.0},
                                    {"precondition": "hessian"}, {"warmup_rounds": -1},
                                    {"lagged": True, "precondition": "momentum"}])
def test_bad_sofim_parameters(kwargs: dict) -> None:
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        server.sofim(**kwargs)


def test_unknown_method() -> None:
    with pytest.raises(ValueError, match="method"):
        make_method("scafold")
