"""Utility grows with epsilon and with n (fixed seeds; tolerances from the math).

Analyze Gauss is checked against Davis-Kahan: sin(theta) <= 2 ||W||_2 / gap with
||W||_2 <= e_w (the spec's high-probability noise bound, failure probability 0.01 per
draw). For every private method the mean error over 4 seeds must fall as epsilon grows
(the noise std scales like 1/epsilon), by at least 2x from epsilon = 0.25 to 4 (16x less
noise), and fall as n grows at fixed epsilon (the eigengap grows linearly in n while
the noise does not depend on n).
"""

import math

import numpy as np
import pytest

from dpprecond.data.synthetic import spiked_covariance
from dpprecond.pca import fit_private_pca, sin_theta
from dpprecond.pca.core import noise_bound
from dpprecond.pca.metrics import describe, top_right_singular_vectors

EPSILONS = (0.25, 1.0, 4.0)
SEEDS = range(4)
K = 2


@pytest.fixture(scope="module")
def problems():
    out = {}
    for n in (5000, 40000):
        A = spiked_covariance(n, 20, K, 5.0, seed=1)
        out[n] = (A, top_right_singular_vectors(A, K), describe(A, K))
    return out


def _errors(A, V, method, eps, **opts):
    return [sin_theta(fit_private_pca(A, K, method=method, target_epsilon=eps, target_delta=1e-6,
                                      row_norm=1.0, seed=s, **opts).basis, V)
            for s in SEEDS]


def test_analyze_gauss_within_davis_kahan(problems):
    """Only cases whose bound is below 1 are informative; there must be several."""
    informative = 0
    for A, V, stats in problems.values():
        for eps in (*EPSILONS, 16.0):
            res = fit_private_pca(A, K, method="analyze_gauss", target_epsilon=eps,
                                  target_delta=1e-6, row_norm=1.0, seed=0)
            e_w = noise_bound(res.info["noise_multipliers"]["z0"] * math.sqrt(2), A.shape[1])
            bound = 2 * e_w / stats["eigengap"]
            if bound < 1.0:
                informative += 1
                assert sin_theta(res.basis, V) <= bound, (A.shape, eps, bound)
    assert informative >= 3


@pytest.mark.parametrize(("method", "opts"), [
    ("analyze_gauss", {}),
    ("fixed", {"clip_radius": 0.05}),
    ("select", {}),
    ("power", {"n_iter": 8}),
])
def test_error_falls_with_epsilon_and_n(problems, method, opts):
    means = {}
    for n, (A, V, _) in problems.items():
        means[n] = [float(np.mean(_errors(A, V, method, eps, **opts))) for eps in EPSILONS]
    for n, m in means.items():
        assert m[0] > m[1] > m[2], (n, m)
        assert m[2] <= 0.5 * m[0], (n, m)
    assert means[40000][1] < means[5000][1]
