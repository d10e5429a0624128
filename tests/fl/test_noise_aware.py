"""Noise-aware SOFIM: the public noise variance, its momentum variance, the shrunk
Sherman-Morrison step against dense references, the reduction to plain SOFIM at zero noise,
extreme magnitudes, and bad options."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpprecond.fl import client as client_mod
from dpprecond.fl import server
from dpprecond.fl.models import LinearSoftmax
from tests.fl.conftest import FIXED


def dense_H(m: np.ndarray, rho: float) -> np.ndarray:
    return np.linalg.inv(np.outer(m, m) + rho * np.eye(len(m)))


def kappa_of(m: np.ndarray, noise_energy: float) -> float:
    return max(0.0, 1.0 - noise_energy / float(m @ m))


# ----------------------------------------------------------------------------------------
# aggregate_noise_variance


def test_aggregate_noise_variance_formula() -> None:
    sizes = np.array([10, 20, 40])
    z, C = 1.5, 2.0
    uniform = sum((2 * z * C / n / 3) ** 2 for n in sizes)
    assert server.aggregate_noise_variance(z, C, sizes) == pytest.approx(uniform, rel=1e-14)
    w = np.array([0.5, 0.25, 0.25])
    weighted = sum((wi * 2 * z * C / n) ** 2 for wi, n in zip(w, sizes, strict=True))
    assert server.aggregate_noise_variance(z, C, sizes, w) == pytest.approx(weighted,
                                                                             rel=1e-14)
    assert server.aggregate_noise_variance(0.0, C, sizes) == 0.0
    assert server.aggregate_noise_variance(0.0, math.inf, sizes) == 0.0
    assert server.aggregate_noise_variance(z, C, sizes, mechanism="client-level") == \
        pytest.approx((2 * z * C / 3) ** 2, rel=1e-14)
    pois = sum((z * C / (0.2 * n) / 3) ** 2 for n in sizes) / 4
    assert server.aggregate_noise_variance(z, C, sizes, mechanism="poisson", sampling_rate=0.2,
                                           local_steps=4) == pytest.approx(pois, rel=1e-14)


def _noise_samples(mechanism: str, rounds: int = 40) -> tuple[np.ndarray, float]:
    """Aggregate noise ``G(z) - G(0)`` of the real client code, with the same generators."""
    rng = np.random.default_rng(0)
    d, k, sizes = 50, 3, np.array([7, 11, 30, 52])
    X = rng.standard_normal((sizes.sum(), d))
    y = rng.integers(0, k, sizes.sum())
    bounds = np.r_[0, np.cumsum(sizes)]
    model = LinearSoftmax(d, k)
    params = np.zeros(model.n_params)  # zero: the Poisson messages are linear in the noise
    w = np.array([0.1, 0.2, 0.3, 0.4])
    z, C = 0.8, 3.0
    root = np.random.SeedSequence(1)
    out = []
    for t in range(rounds):
        def gens(t: int = t) -> list[np.random.Generator]:
            return client_mod.round_generators(root, t, len(sizes) + 1)

        if mechanism == "full-batch":
            U = [client_mod.full_batch_messages(model, params, X, y, bounds, C, zz, gens()[:4])
                 for zz in (z, 0.0)]
            out.append(w @ (U[0] - U[1]))
        elif mechanism == "poisson":
            kw = dict(sampling_rate=1.0, local_steps=3, local_lr=1e-12)
            U = [client_mod.poisson_local_messages(model, params, X, y, bounds, C, zz,
                                                   gens()[:4], **kw) for zz in (z, 0.0)]
            out.append(w @ (U[0] - U[1]))
        else:
            G = [client_mod.client_level_aggregate(model, params, X, y, bounds, C, zz,
                                                   gens()[4]) for zz in (z, 0.0)]
            out.append(G[0] - G[1])
    kw = {"local_steps": 3, "mechanism": "poisson"} if mechanism == "poisson" else {
        "mechanism": mechanism}
    weights = None if mechanism == "client-level" else w
    return np.concatenate(out), server.aggregate_noise_variance(z, C, sizes, weights, **kw)


@pytest.mark.parametrize("mechanism", ["full-batch", "poisson", "client-level"])
def test_aggregate_noise_variance_matches_the_client_mechanism(mechanism: str) -> None:
    """Empirical variance of the real aggregate noise (n = 6120 coordinates): relative
    standard error sqrt(2 / n) = 0.018; the tolerance is 5.5 of those."""
    noise, s2 = _noise_samples(mechanism)
    assert noise.size == 40 * 153
    assert np.mean(noise**2) / s2 == pytest.approx(1.0, abs=0.1)


@pytest.mark.parametrize(("kwargs", "exc", "name"), [
    ({"noise_multiplier": -1.0}, ValueError, "noise_multiplier"),
    ({"noise_multiplier": "1"}, TypeError, "noise_multiplier"),
    ({"clip_norm": 0.0}, ValueError, "clip_norm"),
    ({"clip_norm": math.inf}, ValueError, "clip_norm"),
    ({"sizes": [3, 0]}, ValueError, "size"),
    ({"sizes": [[3, 4]]}, ValueError, "sizes"),
    ({"weights": [1.0]}, ValueError, "weight"),
    ({"weights": [1.5, -0.5]}, ValueError, "weights"),
    ({"mechanism": "local"}, ValueError, "mechanism"),
    ({"local_steps": 2}, ValueError, "local_steps"),
    ({"sampling_rate": 0.5}, ValueError, "sampling_rate"),
    ({"mechanism": "client-level", "weights": [0.9, 0.1]}, ValueError, "uniform"),
    ({"noise_multiplier": 1e300, "clip_norm": 1e300}, ValueError, "overflows"),
])
def test_aggregate_noise_variance_bad_input(kwargs: dict, exc: type, name: str) -> None:
    args = {"noise_multiplier": 1.0, "clip_norm": 1.0, "sizes": [3, 4], **kwargs}
    with pytest.raises(exc, match=name):
        server.aggregate_noise_variance(**args)


# ----------------------------------------------------------------------------------------
# momentum_noise_variance


@pytest.mark.parametrize("bias_correction", [True, False])
def test_momentum_noise_variance_formula(bias_correction: bool) -> None:
    s2 = 0.37
    for beta in (0.0, 0.5, 0.9, 0.999):
        for t in (1, 2, 7, 70, 5000):
            explicit = s2 * (1 - beta) ** 2 * sum(beta ** (2 * j) for j in range(t))
            if bias_correction:
                explicit /= (1 - beta**t) ** 2
            got = server.momentum_noise_variance(s2, beta, t, bias_correction)
            assert got == pytest.approx(explicit, rel=1e-9)
    assert server.momentum_noise_variance(s2, 0.9, 1) == pytest.approx(s2, rel=1e-14)
    assert server.momentum_noise_variance(s2, 0.9, 10**6) == pytest.approx(s2 * 0.1 / 1.9)
    assert server.momentum_noise_variance(s2, 0.9, 0) == 0.0
    assert server.momentum_noise_variance(0.0, 0.9, 5) == 0.0


def test_momentum_noise_variance_monte_carlo() -> None:
    """Pure noise through SOFIM's own momentum: variance over p = 20000 coordinates
    (relative standard error 0.01, tolerance 0.05)."""
    p, s2, beta = 20000, 2.5, 0.8
    opt = server.scale_by_sofim(beta=beta)
    rng = np.random.default_rng(3)
    state = opt.init(np.zeros(p))
    for t in range(1, 13):
        _, state = opt.update(math.sqrt(s2) * rng.standard_normal(p), state, np.zeros(p))
        m_hat = state.momentum / (1 - beta**t)
        expected = server.momentum_noise_variance(s2, beta, t)
        assert np.mean(m_hat**2) / expected == pytest.approx(1.0, abs=0.05)


def test_momentum_noise_variance_bad_input() -> None:
    with pytest.raises(ValueError, match="noise_variance"):
        server.momentum_noise_variance(-1.0, 0.9, 3)
    with pytest.raises(ValueError, match="beta"):
        server.momentum_noise_variance(1.0, 1.0, 3)
    with pytest.raises(ValueError, match="rounds"):
        server.momentum_noise_variance(1.0, 0.9, -1)
    with pytest.raises(TypeError, match="rounds"):
        server.momentum_noise_variance(1.0, 0.9, 2.5)


# ----------------------------------------------------------------------------------------
# the shrunk Sherman-Morrison kernels


@pytest.mark.parametrize("rho", [1e-3, 0.5, 7.0])
def test_shrunk_sherman_morrison_identities(rho: float) -> None:
    rng = np.random.default_rng(4)
    for p in (1, 5, 12):
        m, v = rng.standard_normal(p) * 3, rng.standard_normal(p)
        # no noise: the plain Sherman-Morrison formula and a dense solve
        plain = server.shrunk_sherman_morrison_apply(m, v, rho)
        np.testing.assert_allclose(plain, server.sherman_morrison_apply(m, v, rho),
                                   rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(plain, np.linalg.solve(np.outer(m, m) + rho * np.eye(p), v),
                                   rtol=1e-9, atol=1e-12)
        # shrinkage: (m_s m_s^T + rho I)^{-1} v with m_s = kappa m
        energy = 0.4 * float(m @ m)
        kappa = kappa_of(m, energy)
        np.testing.assert_allclose(server.shrunk_sherman_morrison_apply(m, v, rho, energy),
                                   dense_H(kappa * m, rho) @ v, rtol=1e-9, atol=1e-12)
        # a debiased inner product: kappa (m . v - bias) in place of m_s . v
        bias = 0.3
        ref = dense_H(kappa * m, rho) @ v + kappa**2 * bias * m / (
            rho * (rho + kappa**2 * float(m @ m)))
        np.testing.assert_allclose(
            server.shrunk_sherman_morrison_apply(m, v, rho, energy, bias), ref,
            rtol=1e-9, atol=1e-12)
        # noise energy above ||m||^2: kappa = 0, H = I / rho exactly
        np.testing.assert_array_equal(
            server.shrunk_sherman_morrison_apply(m, v, rho, 2 * float(m @ m), bias), v / rho)
    np.testing.assert_array_equal(
        server.shrunk_sherman_morrison_apply(np.zeros(4), np.ones(4), rho, 1.0), np.ones(4) / rho)


def test_shrunk_momentum_direction_closed_form() -> None:
    rng = np.random.default_rng(5)
    m = rng.standard_normal(9) * 2
    for energy in (0.0, 0.3 * float(m @ m), 5 * float(m @ m)):
        kappa = kappa_of(m, energy)
        d = server._shrunk_momentum_direction(m, 0.5, energy)
        np.testing.assert_allclose(d, dense_H(kappa * m, 0.5) @ m, rtol=1e-10)
        np.testing.assert_allclose(d, m / (0.5 + kappa**2 * float(m @ m)), rtol=1e-12)
    np.testing.assert_array_equal(server._shrunk_momentum_direction(np.zeros(3), 0.5, 1.0),
                                  np.zeros(3))


@pytest.mark.parametrize("log2_scale", [-1000, -500, 0, 500, 1000])
def test_shrunk_kernels_at_extreme_magnitudes(log2_scale: int) -> None:
    """Scaling identities, exact for powers of two: with m -> c m, rho -> c^2 rho and the
    noise energy -> c^2 energy the step is divided by c^2; v -> a v (and the bias -> a c
    bias) multiplies it by a. ||c m||^2 overflows or underflows in a naive computation."""
    rng = np.random.default_rng(6)
    p = 50
    m, v = rng.standard_normal(p), rng.standard_normal(p)
    rho, energy, bias = 0.7, 0.2 * float(m @ m), 0.05
    base = server.shrunk_sherman_morrison_apply(m, v, rho, energy, bias)
    c = a = 2.0 ** (log2_scale // 2)  # entries of m and v near 2^(+-500)
    with np.errstate(all="raise"):
        got = server.shrunk_sherman_morrison_apply(c * m, a * v, c * c * rho, c * c * energy,
                                                   a * c * bias)
    np.testing.assert_allclose(got, base * (a / (c * c)), rtol=1e-12, atol=0.0)
    # momentum form: m -> c m, rho -> c^2 rho, energy -> c^2 energy divides the step by c
    base_m = server._shrunk_momentum_direction(m, rho, energy)
    got_m = server._shrunk_momentum_direction(c * m, c * c * rho, c * c * energy)
    np.testing.assert_allclose(got_m, base_m / c, rtol=1e-12, atol=0.0)
    # entries near the top and the bottom of the float range, the published rho
    # (a representable noise energy is negligible next to ||m||^2 ~ 2^2000 there)
    for scale, e in ((2.0**1000, 1e300), (2.0**-1000, 0.0)):
        with np.errstate(all="raise"):
            step = server.shrunk_sherman_morrison_apply(m * scale, v * 2.0**1000, 0.5, e)
            step_m = server._shrunk_momentum_direction(m * scale, 0.5, e)
        assert np.isfinite(step).all() and np.isfinite(step_m).all()


# ----------------------------------------------------------------------------------------
# the transform


def reference_noise_aware(grads: list[np.ndarray], lr: float, beta: float, rho: float,
                          form: str, bias_correction: bool, warmup: int,
                          s2: float) -> np.ndarray:
    """The derivation of ``scale_by_sofim``'s docstring, with dense matrices and the
    momentum noise variance written as an explicit sum."""
    p = grads[0].size

    def var(t: int) -> float:
        out = s2 * (1 - beta) ** 2 * sum(beta ** (2 * j) for j in range(t))
        return out / (1 - beta**t) ** 2 if (bias_correction and t > 0) else out

    theta = np.zeros(p)
    M = np.zeros(p)
    for t, G in enumerate(grads, start=1):
        prev = M / (1 - beta ** (t - 1)) if (bias_correction and t > 1) else M.copy()
        M = beta * M + (1 - beta) * G
        Mh = M / (1 - beta**t) if bias_correction else M
        if t <= warmup:
            d = Mh
        elif form == "lagged":
            k = kappa_of(prev, p * var(t - 1)) if prev.any() else 0.0
            d = dense_H(k * prev, rho) @ G
        elif form == "momentum":
            d = dense_H(kappa_of(Mh, p * var(t)) * Mh, rho) @ Mh
        else:
            k = kappa_of(Mh, p * var(t))
            w = (1 - beta) / (1 - beta**t) if bias_correction else 1 - beta
            ms = k * Mh
            inner = k * (float(Mh @ G) - w * p * s2)
            d = (G - ms * inner / (rho + float(ms @ ms))) / rho
        theta = theta - lr * d
    return theta


def run(opt: server.GradientTransformation, grads: list[np.ndarray]) -> np.ndarray:
    theta = np.zeros(grads[0].size)
    state = opt.init(theta)
    for G in grads:
        upd, state = opt.update(G, state, theta)
        theta = theta + upd
    return theta


def form_kwargs(form: str) -> dict:
    return {"gradient": {}, "lagged": {"lagged": True},
            "momentum": {"precondition": "momentum"}}[form]


@pytest.mark.parametrize("form", ["gradient", "lagged", "momentum"])
@pytest.mark.parametrize(("bias_correction", "warmup"), [(True, 0), (False, 0), (True, 2)])
def test_noise_aware_matches_dense_reference(form: str, bias_correction: bool,
                                             warmup: int) -> None:
    rng = np.random.default_rng(7)
    p, s2 = 12, 0.05  # p s2 = 0.6, comparable to ||g||^2: kappa strictly inside (0, 1)
    g = rng.standard_normal(p)
    grads = [g + math.sqrt(s2) * rng.standard_normal(p) for _ in range(8)]
    opt = server.sofim(0.3, beta=0.8, rho=0.7, bias_correction=bias_correction,
                       warmup_rounds=warmup, noise_variance=s2, **form_kwargs(form))
    ref = reference_noise_aware(grads, 0.3, 0.8, 0.7, form, bias_correction, warmup, s2)
    np.testing.assert_allclose(run(opt, grads), ref, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("form", ["gradient", "lagged", "momentum"])
def test_noise_aware_reduces_to_plain_sofim(form: str) -> None:
    rng = np.random.default_rng(8)
    grads = [rng.standard_normal(20) for _ in range(10)]
    plain = run(server.sofim(0.2, **form_kwargs(form)), grads)
    np.testing.assert_array_equal(run(server.sofim(0.2, noise_variance=0.0,
                                                   **form_kwargs(form)), grads), plain)
    # the noise-aware code path itself tends to the plain step as the noise vanishes
    np.testing.assert_allclose(run(server.sofim(0.2, noise_variance=1e-300,
                                                **form_kwargs(form)), grads), plain,
                               rtol=1e-10, atol=1e-13)


def mean_descent(form: str, noise_variance: float, s2: float, p: int = 4000,
                 rounds: int = 30, seeds: int = 6) -> tuple[float, float]:
    """Mean and standard error of ``g . d_t`` over rounds 6..30 for a constant gradient
    ``g`` (||g|| = 1) observed through noise of variance ``s2`` per coordinate."""
    g = np.zeros(p)
    g[:10] = 1 / math.sqrt(10)
    opt = server.scale_by_sofim(0.9, 0.5, noise_variance=noise_variance, **form_kwargs(form))
    vals = []
    for seed in range(seeds):
        rng = np.random.default_rng(seed)
        state = opt.init(np.zeros(p))
        for t in range(rounds):
            d, state = opt.update(g + math.sqrt(s2) * rng.standard_normal(p), state,
                                  np.zeros(p))
            if t >= 5:
                vals.append(float(g @ d))
    return float(np.mean(vals)), float(np.std(vals) / math.sqrt(len(vals)))


def test_noise_aware_paper_form_no_longer_climbs() -> None:
    """Noise energy p s2 = 40 against ||g||^2 = 1: the paper's step has a negative inner
    product with the true gradient (it climbs, docs/fl_results.md); with the known noise
    correlation removed it descends. Both means are > 20 standard errors from 0."""
    s2 = 40.0 / 4000
    plain, se_plain = mean_descent("gradient", 0.0, s2)
    aware, se_aware = mean_descent("gradient", s2, s2)
    assert plain < -20 * se_plain
    assert aware > 20 * se_aware


def test_noise_aware_momentum_step_is_not_shrunk_by_noise() -> None:
    """Authors' form under noise: the step M / (rho + ||M||^2) is divided by the noise
    energy p v ~ 2.1; the noise-aware step is not: close to M / rho when the signal
    energy (1) is small next to rho + p v. Expected g . d: plain <= 1 / (0.5 + 2.1) ~ 0.4,
    noise-aware in (1, 2)."""
    s2 = 40.0 / 4000
    plain, _ = mean_descent("momentum", 0.0, s2)
    aware, _ = mean_descent("momentum", s2, s2)
    assert plain < 0.4
    assert 1.0 < aware < 2.0


def test_pure_noise_gives_an_undeflated_step() -> None:
    """No signal: the plain lagged step projects out a random direction of energy
    ||M||^2 >> rho; the noise-aware one is (almost always exactly) G / rho."""
    p, s2 = 2000, 0.01
    rng = np.random.default_rng(9)
    opt = server.scale_by_sofim(0.9, 0.5, lagged=True, noise_variance=s2)
    state = opt.init(np.zeros(p))
    ratios = []
    for _ in range(30):
        G = math.sqrt(s2) * rng.standard_normal(p)
        d, state = opt.update(G, state, np.zeros(p))
        ratios.append(np.linalg.norm(d - G / 0.5) / np.linalg.norm(G / 0.5))
    # kappa = O(sqrt(2 / p)) at most: the deflation is below 1e-2 of the step
    assert max(ratios) < 1e-2


def test_noise_aware_shapes_and_state() -> None:
    p = 1000
    opt = server.sofim(noise_variance=0.1, lagged=True)
    theta = np.zeros(p)
    state = opt.init(theta)
    upd, state = opt.update(np.ones(p), state, theta)
    assert upd.shape == (p,)
    arrays = [x for s in state for x in s if isinstance(x, np.ndarray)]
    assert arrays and all(a.size <= p for a in arrays)
    opt2 = server.sofim(0.1, precondition="momentum", noise_variance=0.1)
    upd2, _ = opt2.update(np.ones(p), opt2.init(theta), theta)
    assert upd2.shape == (p,) and np.isfinite(upd2).all()


@pytest.mark.parametrize(("value", "exc"), [(-1.0, ValueError), (math.nan, ValueError),
                                            (math.inf, ValueError), ("0.1", TypeError),
                                            (None, TypeError)])
def test_bad_noise_variance(value: object, exc: type) -> None:
    with pytest.raises(exc, match="noise_variance"):
        server.sofim(noise_variance=value)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------------------
# the registry option noise_aware=True on the round engine


@pytest.mark.parametrize("name", ["sofim", "sofim-lagged", "sofim-momentum"])
def test_noise_aware_option_builds_the_transform_from_the_runs_public_noise(name: str) -> None:
    """``make_method(name, noise_aware=True)`` equals the transform built by hand with the
    noise variance of the run's aggregate (z, C, sizes and weights are public)."""
    from dpprecond.fl import ClientData, FLConfig, make_method, simulate
    from dpprecond.fl.methods import GradientMethod
    from dpprecond.fl.partition import iid_partition
    from tests.fl.conftest import make_problem

    X, y, Xt, yt = make_problem(n=300)
    data = ClientData.from_partition(X, y, iid_partition(len(y), 4, seed=0), 3)
    config = FLConfig(**FIXED, n_rounds=4, clip_norm=1.0, target_epsilon=2.0)
    auto = simulate(LinearSoftmax(X.shape[1], 3), data, make_method(name, noise_aware=True),
                    config, X_test=Xt, y_test=yt, seed=5)
    s2 = server.aggregate_noise_variance(auto.noise_multiplier, 1.0, np.diff(data.bounds))
    assert s2 > 0
    form = {"sofim": ("gradient", False), "sofim-lagged": ("gradient", True),
            "sofim-momentum": ("momentum", False)}[name]
    manual = GradientMethod(server.sofim(0.1, 0.9, 0.5, form[0], lagged=form[1],
                                         noise_variance=s2), "manual")
    ref = simulate(LinearSoftmax(X.shape[1], 3), data, manual, config, X_test=Xt, y_test=yt,
                   seed=5)
    np.testing.assert_array_equal(auto.params, ref.params)
    plain = simulate(LinearSoftmax(X.shape[1], 3), data, make_method(name), config,
                     X_test=Xt, y_test=yt, seed=5)
    assert not np.array_equal(plain.params, auto.params)  # the option changes the run
    with pytest.raises(TypeError, match="noise_aware"):
        make_method(name, noise_aware="yes")
