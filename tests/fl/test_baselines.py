"""DP-SCAFFOLD / DP-FedAvg / DP-FedFC / DP-FedNew: non-private reduction, releases, noise.

The non-private references are written independently of the library: plain full-batch
softmax gradients per client (a Python loop over clients), dense matrices and textbook
updates.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from dp_accounting import dp_event

from dpprecond import accounting
from dpprecond.fl import FLConfig, make_method, simulate
from dpprecond.fl.accounting import Schedule, calibrate, resolve_noise_multiplier
from dpprecond.fl.client import covariance_sensitivity, second_moment_releases
from dpprecond.fl.models import LinearSoftmax
from dpprecond.fl.server import sgd
from tests.fl.conftest import FIXED, make_problem
from tests.fl.conftest import mean_gradient as grad
from tests.gdp import gaussian_gdp_epsilon

T = 4


def run(name: str, data, problem, *, n_rounds: int = T, seed=0, config: dict | None = None,
        **options):
    """Run method ``name`` on the engine with FLConfig(**config) (default: non-private)."""
    cfg = FLConfig(n_rounds=n_rounds, **(config or {"noise_multiplier": 0.0,
                                                    "clip_norm": math.inf}))
    return simulate(LinearSoftmax(data.X.shape[1], data.n_classes), data,
                    make_method(name, **options), cfg, X_test=problem[2], y_test=problem[3],
                    seed=seed)


def blocks(data):
    return [(data.X[a:b], data.y[a:b]) for a, b in zip(data.bounds[:-1], data.bounds[1:],
                                                         strict=True)]


def second_moment(X: np.ndarray) -> np.ndarray:
    Xt = np.hstack([X, np.ones((len(X), 1))])
    return Xt.T @ Xt / len(X)


def ref_scaffold(data, k: int, L: int, lr_l: float, lr_g: float,
                 cv: bool) -> np.ndarray:
    d1 = data.X.shape[1] + 1
    W = np.zeros((d1, k))
    K = data.n_clients
    c_i = [np.zeros((d1, k)) for _ in range(K)]
    c = np.zeros((d1, k))
    for _ in range(T):
        ys, new_c = [], []
        for i, (X, y) in enumerate(blocks(data)):
            Y = W.copy()
            for _ in range(L):
                Y = Y - lr_l * (grad(Y, X, y) + ((c - c_i[i]) if cv else 0.0))
            ys.append(Y)
            new_c.append(c_i[i] - c + (W - Y) / (L * lr_l))
        if cv:
            c = c + np.mean([n - o for n, o in zip(new_c, c_i, strict=True)], axis=0)
            c_i = new_c
        W = W + lr_g * np.mean([Y - W for Y in ys], axis=0)
    return W.ravel()


@pytest.mark.parametrize("cv", [True, False])
def test_scaffold_reduces_to_non_private(client_data, problem, cv: bool) -> None:
    res = run("scaffold" if cv else "fedavg", client_data, problem, local_steps=3,
              local_lr=0.2, global_lr=0.7)
    ref = ref_scaffold(client_data, 3, 3, 0.2, 0.7, cv)
    np.testing.assert_allclose(res.params, ref, rtol=1e-10, atol=1e-12)
    assert res.noise_multiplier == 0 and math.isinf(res.epsilon)


def test_fedavg_with_one_step_is_fedgd(client_data, problem) -> None:
    """One local step of size eta with global step 1 is one DP-FedGD step of size eta."""
    model = LinearSoftmax(client_data.X.shape[1], 3)
    a = run("fedavg", client_data, problem, local_steps=1, local_lr=0.3,
            config={"clip_norm": 1.0, "noise_multiplier": 0.0})
    b = simulate(model, client_data, sgd(0.3), FLConfig(**FIXED, n_rounds=T, clip_norm=1.0,
                                                        noise_multiplier=0.0),
                 X_test=problem[2], y_test=problem[3])
    np.testing.assert_allclose(a.params, b.params, rtol=1e-10, atol=1e-12)


def test_fedfc_reduces_to_non_private(client_data, problem) -> None:
    res = run("fedfc", client_data, problem, learning_rate=0.6, gamma=0.3, row_clip=math.inf)
    C = np.mean([second_moment(X) for X, _ in blocks(client_data)], axis=0)
    P = np.linalg.inv(C + 0.3 * np.eye(C.shape[0]))
    W = np.zeros((C.shape[0], 3))
    for _ in range(T):
        G = np.mean([grad(W, X, y) for X, y in blocks(client_data)], axis=0)
        W = W - 0.6 * P @ G
    np.testing.assert_allclose(res.params, W.ravel(), rtol=1e-9, atol=1e-12)


def test_fednew_reduces_to_non_private(client_data, problem) -> None:
    h, rho, alpha, lr = 0.5, 2.0, 0.1, 0.9
    res = run("fednew", client_data, problem, learning_rate=lr, rho=rho, alpha=alpha,
              hessian_scale=h, row_clip=math.inf)
    parts = blocks(client_data)
    K = len(parts)
    d1 = client_data.X.shape[1] + 1
    H = [h * np.kron(second_moment(X), np.eye(3)) for X, _ in parts]  # row-major (d1, k)
    W = np.zeros(d1 * 3)
    lam = [np.zeros(d1 * 3) for _ in range(K)]
    y_bar = np.zeros(d1 * 3)
    for _ in range(T):
        ys = [np.linalg.solve(H[i] + (alpha + rho) * np.eye(d1 * 3),
                              grad(W.reshape(d1, 3), X, y).ravel() - lam[i] + rho * y_bar)
              for i, (X, y) in enumerate(parts)]
        y_new = np.mean(ys, axis=0)
        lam = [lam[i] + rho * (ys[i] - y_new) for i in range(K)]
        y_bar = y_new
        W = W - lr * y_bar
    np.testing.assert_allclose(res.params, W, rtol=1e-9, atol=1e-12)


def test_event_lists_match_releases_and_budget(client_data, problem) -> None:
    """Every release is one event; every method meets the same epsilon for its schedule."""
    cfg = dict(target_epsilon=2.0, target_delta=1e-5, accountant="rdp", clip_norm=1.0, **FIXED)
    sc = run("scaffold", client_data, problem, config=cfg, local_steps=3)
    assert sc.n_releases == T * 3
    assert sc.events == [accounting.gaussian(sc.noise_multiplier)] * (T * 3)
    fc = run("fedfc", client_data, problem, config=cfg)
    nw = run("fednew", client_data, problem, config=cfg)
    z_grad = fc.noise_multiplier
    z_cov = fc.events[0].noise_multiplier
    assert fc.events == [accounting.gaussian(z_cov)] + [accounting.gaussian(z_grad)] * T
    assert fc.events == nw.events
    assert fc.n_releases == T + 1
    # The totals, recomputed from the raw events with dp_accounting, meet the target and
    # are tight (calibration is for each method's own schedule).
    fedgd_z = resolve_noise_multiplier(FLConfig(**FIXED, n_rounds=T, target_epsilon=2.0,
                                                accountant="rdp"))
    for ev in (sc.events, fc.events, [accounting.gaussian(fedgd_z)] * T):
        eps = accounting.epsilon_of(dp_event.ComposedDpEvent(ev), 1e-5, "rdp")
        assert 2.0 * (1 - 1e-3) <= eps <= 2.0 + 1e-9
    # More releases need more noise per release.
    assert sc.noise_multiplier > fedgd_z
    assert z_grad > fedgd_z
    assert sc.history[-1]["epsilon"] == pytest.approx(sc.epsilon)


def test_covariance_split_is_exact_gdp() -> None:
    """The split composes to 1/scale-GDP: compare with the closed-form GDP epsilon."""
    schedule = Schedule("covariance", 50, share=0.2)
    z = schedule.multipliers(2.0)
    mu2 = 1 / z["z_cov"] ** 2 + 50 / z["z_grad"] ** 2
    assert mu2 == pytest.approx(1 / 4.0)
    z = schedule.multipliers(calibrate(schedule, 1.0, 1e-5, "pld"))
    mu = math.sqrt(1 / z["z_cov"] ** 2 + 50 / z["z_grad"] ** 2)
    assert gaussian_gdp_epsilon(mu, 1e-5) == pytest.approx(1.0, rel=2e-3)


def test_covariance_sensitivity_worst_case_pair() -> None:
    """Orthogonal rows of norm C_x attain sqrt(2) C_x^2; random pairs never exceed it."""
    C = 3.0
    d1 = 5
    iu = np.triu_indices(d1)

    def triu_norm(a: np.ndarray, b: np.ndarray) -> float:
        return float(np.linalg.norm((np.outer(a, a) - np.outer(b, b))[iu]))

    e = np.eye(d1) * C
    assert triu_norm(e[0], e[1]) == pytest.approx(covariance_sensitivity(C))
    rng = np.random.default_rng(0)
    A = rng.standard_normal((2000, d1))
    B = rng.standard_normal((2000, d1))
    A *= C / np.linalg.norm(A, axis=1, keepdims=True)
    B *= C * rng.random((2000, 1)) / np.linalg.norm(B, axis=1, keepdims=True)
    worst = max(triu_norm(a, b) for a, b in zip(A, B, strict=True))
    assert worst <= covariance_sensitivity(C) * (1 + 1e-12)


def test_covariance_noise_is_symmetric_with_the_stated_std() -> None:
    X = np.zeros((40, 29))  # rows [0, 1]: clipped second moment is e_last e_last^T
    bounds = np.array([0, 20, 40])
    z, C = 0.7, 2.0
    rngs = [np.random.default_rng(s) for s in (1, 2)]
    mats = list(second_moment_releases(X, bounds, C, z, rngs))
    iu = np.triu_indices(30)
    noise = []
    for M in mats:
        np.testing.assert_array_equal(M, M.T)
        E = M * 20
        E[-1, -1] -= 1.0
        noise.append(E[iu])
    noise = np.concatenate(noise)
    std = z * math.sqrt(2) * C**2
    # n = 930 draws: the sample std has relative standard error 1/sqrt(2n) ~ 2.3%; 5 sigma.
    assert np.std(noise) == pytest.approx(std, rel=5 / math.sqrt(2 * len(noise)))
    assert abs(np.mean(noise)) < 5 * std / math.sqrt(len(noise))


@pytest.mark.parametrize("C", [1.0, 1e8, 1e140])
def test_covariance_rounding_is_covered_by_the_noise(C: float) -> None:
    """The computed second moments of worst-case neighbours (one row replaced by an
    orthogonal one, thousands of equal rows whose sums round at every step) differ by at
    most the sensitivity times :func:`gram_inflation`, and the release's noise std is the
    accounted ``z * sensitivity`` times that factor."""
    from dpprecond.fl.client import clip_feature_rows, gram_inflation
    from dpprecond.noise import symmetric_gaussian

    n, d = 3000, 6
    rng = np.random.default_rng(3)
    X = np.tile(rng.standard_normal(d) * C, (n, 1)) * (1 + 1e-3 * rng.random((n, 1)))
    Xn = X.copy()
    Xn[7] = 0.0
    Xn[7, 0] = -C  # far from the others: the largest change of the clipped moment
    iu = np.triu_indices(d + 1)
    bounds = np.array([0, n])
    exact_rows = [clip_feature_rows(Y, C) for Y in (X, Xn)]
    moments = [R.T @ R for R in exact_rows]  # the sum the release computes
    np.testing.assert_array_equal(
        next(second_moment_releases(X, bounds, C, 0.0, [None])), moments[0] / n)
    # norms of C^-2-scaled differences (exact scalings by a power of 2 would be cleaner; a
    # relative 1e-16 on either side is far below the 1e-9 margin tested)
    diff = float(np.linalg.norm((moments[0] - moments[1])[iu] / C**2))
    exact = float(np.linalg.norm((np.outer(exact_rows[0][7] / C, exact_rows[0][7] / C)
                                  - np.outer(exact_rows[1][7] / C, exact_rows[1][7] / C))[iu]))
    assert exact <= covariance_sensitivity(1.0) * (1 + 1e-12)
    assert diff <= covariance_sensitivity(1.0) * gram_inflation(n)
    assert 1.0 < gram_inflation(n) < 1.0 + 1e-8
    z = 0.9
    released = next(second_moment_releases(X, bounds, C, z, [np.random.default_rng(5)]))
    E = symmetric_gaussian(d + 1, z * covariance_sensitivity(C) * gram_inflation(n),
                           np.random.default_rng(5), draws="triangle")
    np.testing.assert_array_equal(released, (moments[0] + E) / n)


def test_covariance_release_refuses_a_row_clip_that_overflows() -> None:
    X = np.ones((100, 3))
    with pytest.raises(ValueError, match=r"row_clip=1e\+150 with clients of up to 100 rows"):
        next(second_moment_releases(X, np.array([0, 100]), 1e150, 1.0,
                                    [np.random.default_rng(0)]))


def test_noise_is_reproducible_and_seed_dependent(client_data, problem) -> None:
    cfg = dict(noise_multiplier=1.0, clip_norm=1.0)
    for name in ("scaffold", "fedfc", "fednew"):
        a, b, c = (run(name, client_data, problem, n_rounds=2, config=cfg, seed=s)
                   for s in (3, 3, 4))
        np.testing.assert_array_equal(a.params, b.params)
        assert not np.allclose(a.params, c.params)


def test_bad_inputs_are_named(client_data, problem) -> None:
    with pytest.raises(ValueError, match="clip_norm"):
        run("scaffold", client_data, problem, config={"clip_norm": math.inf,
                                                      "target_epsilon": 1.0})
    with pytest.raises(ValueError, match="local_steps"):
        make_method("scaffold", local_steps=0)
    with pytest.raises(ValueError, match="gamma"):
        make_method("fedfc", gamma=-1.0)
    with pytest.raises(ValueError, match="covariance_share"):
        make_method("fednew", covariance_share=1.0)
    with pytest.raises(TypeError, match=r"Unknown option.*'gama'.*gamma"):
        make_method("fedfc", gama=1.0)
    with pytest.raises(ValueError, match="mechanism='full-batch'"):
        run("scaffold", client_data, problem,
            config={"target_epsilon": 1.0, "mechanism": "poisson", "sampling_rate": 0.5})
    with pytest.raises(TypeError, match="LinearSoftmax"):
        simulate(object(), client_data, make_method("fedfc"),  # type: ignore[arg-type]
                 FLConfig(**FIXED, n_rounds=1, target_epsilon=1.0), X_test=problem[2],
                 y_test=problem[3])


def test_private_runs_learn_something() -> None:
    """At a loose budget every baseline beats chance clearly on separable blobs."""
    from dpprecond.fl import ClientData
    from dpprecond.fl.partition import iid_partition

    X, y, Xt, yt = make_problem(n=1200, d=5, k=3, seed=1, scale=3.0)
    data = ClientData.from_partition(X, y, iid_partition(len(y), 3, 0), 3)
    cfg = dict(target_epsilon=8.0, accountant="rdp", clip_norm=1.0)
    for name, extra in (("scaffold", {"local_steps": 2}), ("fedfc", {"gamma": 1.0}),
                        ("fednew", {"rho": 1.0})):
        res = run(name, data, (X, y, Xt, yt), n_rounds=10, config=cfg, **extra)
        assert res.final_accuracy > 0.6
