"""Same random_state, same output; different seeds, different noise."""

import numpy as np
import pytest

from dpprecond.pca import fit_private_pca

OPTS = {"select": {"mean_trials": 3.0}, "fixed": {"clip_radius": 0.05}, "analyze_gauss": {},
        "power": {"n_iter": 3}}


@pytest.mark.parametrize("method", list(OPTS))
def test_same_seed_same_output_different_seed_differs(spiked, method):
    def fit(seed):
        return fit_private_pca(spiked, 2, method=method, target_epsilon=1.0, target_delta=1e-6,
                               row_norm=1.0, seed=seed, **OPTS[method])

    a, b, c = fit(3), fit(3), fit(4)
    assert np.array_equal(a.components, b.components)
    assert a.info.get("n_iter") == b.info.get("n_iter")
    assert not np.allclose(a.components, c.components, atol=1e-9)
    g = fit(np.random.default_rng(3))
    h = fit(np.random.default_rng(3))
    assert np.array_equal(g.components, h.components)


def test_private_mean_noise_is_seeded(spiked):
    def fit(seed):
        return fit_private_pca(spiked, 2, method="analyze_gauss", target_epsilon=1.0,
                               target_delta=1e-6,
                               row_norm=1.0, center="private", seed=seed)

    assert np.array_equal(fit(1).mean, fit(1).mean)
    assert not np.allclose(fit(1).mean, fit(2).mean)
