"""Secure mode: CSPRNG noise with the right law, snapped releases, seeds refused."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

import dpprecond.noise as noise_module
import dpprecond.secure as secure_module
from dpprecond.fl import FLConfig, run_federated
from dpprecond.noise import release
from dpprecond.pca import fit_private_pca
from dpprecond.secure import SNAP_BITS, SecureGenerator, snap
from tests.fl.conftest import make_problem

N = 200_000


def test_standard_normal_has_the_normal_law() -> None:
    z = SecureGenerator().standard_normal(N)
    # mean within 5 standard errors, variance within 5 standard errors (2/N for normals)
    assert abs(z.mean()) < 5 / math.sqrt(N)
    assert abs(z.var() - 1.0) < 5 * math.sqrt(2 / N)
    # Kolmogorov-Smirnov against N(0, 1): the p-value of a correct sampler is uniform;
    # 1e-4 is a 1-in-10,000 false alarm rate.
    assert stats.kstest(z, "norm").pvalue > 1e-4


def test_other_draws() -> None:
    g = SecureGenerator()
    u = g.random(N)
    assert 0.0 <= u.min() and u.max() < 1.0 and abs(u.mean() - 0.5) < 5 / math.sqrt(12 * N)
    k = g.integers(0, 7, N)
    counts = np.bincount(k, minlength=7)
    assert stats.chisquare(counts).pvalue > 1e-4
    geo = g.geometric(0.25, N)
    assert geo.min() >= 1
    assert abs(geo.mean() - 4.0) < 5 * math.sqrt(0.75 / 0.25**2 / N)
    assert set(g.choice([3, 5], 100)) == {3, 5}
    assert isinstance(g.spawn(2)[1], SecureGenerator)


def test_snapping_rounds_to_the_public_grid_and_keeps_symmetry() -> None:
    rng = SecureGenerator()
    S = np.arange(16.0).reshape(4, 4)
    S = S + S.T
    W = rng.standard_normal((4, 4)) * 3.0
    W = np.triu(W) + np.triu(W, 1).T
    out = release(S, 3.0, rng, noise=W)
    grid = math.ldexp(1.0, math.floor(math.log2(3.0)) - SNAP_BITS)
    np.testing.assert_array_equal(out / grid, np.rint(out / grid))
    np.testing.assert_array_equal(out, out.T)
    assert np.abs(out - (S + W)).max() <= grid / 2
    # outside secure mode nothing is rounded
    plain = release(S, 3.0, np.random.default_rng(0), noise=W)
    np.testing.assert_array_equal(plain, S + W)
    assert snap(np.array([1.0]), 0.0)[0] == 1.0


def test_pca_secure_mode() -> None:
    X = np.random.default_rng(0).normal(size=(3000, 6))
    X /= np.linalg.norm(X, axis=1).max()
    with pytest.raises(ValueError, match="secure=True refuses seeds"):
        fit_private_pca(X, 2, method="analyze_gauss", target_epsilon=1.0, target_delta=1e-6,
                        row_norm=1.0, seed=0, secure=True)
    fits = [fit_private_pca(X, 2, method=m, target_epsilon=1.0, target_delta=1e-6,
                            row_norm=1.0, secure=True) for m in ("analyze_gauss", "select",
                                                                   "select", "auto")]
    assert all(np.all(np.isfinite(f.components)) for f in fits)
    assert not np.allclose(fits[1].components, fits[2].components)
    assert fits[0].epsilon <= 1.0
    assert fits[3].epsilon == pytest.approx(1.0, rel=1e-4)
    for branch in ("analyze_gauss", "iterate"):  # every release of auto is snapped
        fit = fit_private_pca(X, 2, target_epsilon=1.0, target_delta=1e-6, row_norm=1.0,
                              secure=True, branch=branch)
        assert fit.info["branch"] == branch and np.all(np.isfinite(fit.components))


@pytest.mark.parametrize("branch", ["analyze_gauss", "iterate"])
def test_pca_auto_forms_every_release_through_release(monkeypatch: pytest.MonkeyPatch,
                                                      branch: str) -> None:
    import dpprecond.pca.auto as auto

    calls: list[bool] = []

    def spy(value, std, source, **kw):  # type: ignore[no-untyped-def]
        calls.append(secure_module.is_secure(source))
        return noise_module.release(value, std, source, **kw)

    monkeypatch.setattr(auto, "release", spy)
    X = np.random.default_rng(0).normal(size=(3000, 6))
    X /= np.linalg.norm(X, axis=1).max()
    fit = fit_private_pca(X, 2, target_epsilon=1.0, target_delta=1e-6, row_norm=1.0,
                          secure=True, branch=branch, n_iter=2)
    # M1, then M2 (the forced Analyze Gauss branch releases no probe), or M1, the probe
    # histogram and one release per iteration
    assert calls == [True] * (2 if branch == "analyze_gauss" else 4)
    assert fit.info["branch"] == branch


def test_fl_secure_mode_including_poisson_masks() -> None:
    X, y, Xt, yt = make_problem(n=200)
    for mech, extra in (("full-batch", {}), ("poisson", {"sampling_rate": 0.5})):
        res = run_federated(X, y, Xt, yt, 3, algorithm="fedgd", n_clients=4,
                            config=FLConfig(n_rounds=2, target_epsilon=2.0, mechanism=mech,
                                            **extra), secure=True)
        assert np.all(np.isfinite(res.params))
    with pytest.raises(ValueError, match="refuses seeds"):
        run_federated(X, y, Xt, yt, 3, algorithm="fedgd", n_clients=4, seed=1,
                      config=FLConfig(n_rounds=1, target_epsilon=2.0), secure=True)
    from dpprecond.fl import ClientData, make_method, simulate
    from dpprecond.fl.models import LinearSoftmax
    from dpprecond.fl.partition import iid_partition

    data = ClientData.from_partition(X, y, iid_partition(len(y), 4, 0), 3)
    with pytest.raises(ValueError, match="refuses seeds"):
        simulate(LinearSoftmax(6, 3), data, make_method("fedgd"),
                 FLConfig(n_rounds=1, target_epsilon=1.0), X_test=Xt, y_test=yt, seed=3,
                 secure=True)
