"""Review 33c: attacks on the capped secure PCA plan (pca/secure_plan.py, plan_sum's cap).

Each test states the claim it attacks: the pre-check (``capped_secure_plan``) bounds every
release the fit makes, the releases stay within the accounted inflation, and a client
accepts only what an honest capped fit sends.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpprecond.data.synthetic import spiked_covariance
from dpprecond.pca import fit_private_pca
from dpprecond.pca.secure_plan import fit_inflations, sum_modulus_bits
from dpprecond.secagg.sums import PCA_MIN_SCALE, plan_sum

BOUNDS = np.array([0, 700, 1500, 1501, 3000])
K = len(BOUNDS) - 1
FIT = dict(target_epsilon=1.0, target_delta=1e-6, row_norm=1.0, trust="secure-aggregation")


@pytest.fixture(scope="module")
def data() -> np.ndarray:
    return spiked_covariance(3000, 10, 2, 20.0, seed=4)


@pytest.mark.parametrize(("dim", "n_rows", "z"), [(3, 10, 300.0), (20, 3000, 14.5),
                                                  (4, 100, 2.0)])
def test_a_large_sensitivity_still_fits_the_worst_scale_bound(dim, n_rows, z) -> None:
    """gamma Delta can exceed the bound's worst case ``2 sqrt(m) / I`` when gamma stops at
    1 (a sensitivity above ``sqrt(m) / I``: auto's clipped step at a large clip_radius);
    the capped plan must still fit the bound and stay within its inflation."""
    for bound in fit_inflations():
        cap = sum_modulus_bits(dim, n_rows, K, z, inflation=bound)
        for s in 2.0 ** np.arange(0.0, 14.0, 0.25):
            plan = plan_sum(dim, float(s), z, n_rows=n_rows, n_clients=K, min_clients=K,
                            fit_bits=cap, max_inflation=bound, min_scale=PCA_MIN_SCALE)
            assert plan.bits <= cap, (bound, s, plan.bits, cap)
            assert plan.inflation <= bound, (bound, s)


@pytest.mark.parametrize("clip_radius", [1e4, 1e6])
def test_a_large_clip_radius_keeps_every_sum_within_the_cap(data, clip_radius) -> None:
    """A fixed clip radius is a public option of any size; the capped fit's steps (each of
    sensitivity ``2 R``) must still fit ``max_modulus_bits`` (the pre-check passed)."""
    got = fit_private_pca(data, 2, method="auto", branch="iterate", clients=BOUNDS, seed=5,
                          clip_radius=clip_radius, max_modulus_bits=20, **FIT)
    sums = got.info["secure_aggregation"]
    assert max(sums["modulus_bits"]) <= 20, sums["modulus_bits"]
    assert sums["rounding_inflation"] <= sums["accounted_inflation"]
    assert got.epsilon <= 1.0
    assert math.isfinite(float(np.sum(got.components)))


@pytest.mark.parametrize(("dim", "n_rows", "z", "bound"), [
    (55, 1_131_081, 4.6, 2.0**-3), (20, 234_354, 14.5, 2.0**-10),
    (307_720, 483_845, 6.5, 2.0**-3)])
def test_the_worst_scale_bound_is_the_supremum_of_gamma_delta(dim, n_rows, z, bound) -> None:
    """A release's ``gamma Delta`` takes every value below ``2 sqrt(m) / I``; the bound
    must hold up to the supremum, not only up to ``(1 - 2^-20)`` of it (at these ``n`` a
    modulus bit steps within that last 2^-20)."""
    cap = sum_modulus_bits(dim, n_rows, K, z, inflation=bound)
    top = float(np.nextafter(2.0 * math.sqrt(dim) / bound, 0.0))
    for sens in (top * 2.0**-21, top * 2.0**-3, top):
        plan = plan_sum(dim, sens, z, n_rows=n_rows, n_clients=K, min_clients=K,
                        fit_bits=cap, max_inflation=bound, min_scale=PCA_MIN_SCALE)
        assert plan.bits <= cap, (sens, plan.bits, cap)
        assert plan.inflation <= bound


def test_a_large_clip_radius_over_a_capped_transport_is_the_in_process_fit(data) -> None:
    """The client re-derives the coarsened plan (its scale below 1) and accepts it; the
    fit over a transport of ``fit_bits = 20`` is the in-process capped fit bit for bit."""
    from tests.pca.test_remote_secure import _federation

    opts = dict(method="auto", branch="iterate", clip_radius=1e4, **FIT)
    ref = fit_private_pca(data, 2, clients=BOUNDS, seed=5, max_modulus_bits=20, **opts)
    log: list = []
    got = fit_private_pca(_federation(data, log=log, fit_bits=20), 2, **opts)
    assert np.array_equal(got.components, ref.components)
    assert got.info["secure_aggregation"] == ref.info["secure_aggregation"]
    assert max(r["plan"]["bits"] for r, _ in log) <= 20
    assert min(r["plan"]["scale"] for r, _ in log) < 1.0


def test_a_client_refuses_a_cap_coarser_than_any_fit_accounts() -> None:
    """An honest capped fit sends ``max_inflation`` in ``2^-10 .. 2^-3``
    (:func:`fit_inflations`); a curious server sending up to ``1/5`` (plan_sum's own
    limit) makes the client's share cover a sum of ``D = 6`` (Skellam term ``1/(2 z^4
    D^2)`` 2.25 times the largest an honest fit gives) at the client's floor check
    unchanged. The client refuses it by name, before it computes its part."""
    from dpprecond.pca.remote_secure import plan_from_request, plan_to_request

    bits = plan_sum(55, 1.5, 4.6, n_rows=3000, n_clients=K, min_clients=K,
                    inflation=0.2).bits
    coarse = plan_sum(55, 1.5, 4.6, n_rows=3000, n_clients=K, min_clients=K, fit_bits=bits,
                      max_inflation=0.2, min_scale=PCA_MIN_SCALE)
    assert 2.0**-3 < coarse.inflation <= 0.2 and coarse.bits <= bits  # it exists
    fields = plan_to_request(coarse, fit_bits=bits, max_inflation=0.2)
    with pytest.raises(ValueError, match=r"max_inflation=0\.2.*2\^-3"):
        plan_from_request(fields, K)
    honest = plan_sum(55, 2.0, 4.6, n_rows=3000, n_clients=K, min_clients=K, fit_bits=18,
                      max_inflation=2.0**-3, min_scale=PCA_MIN_SCALE)
    assert plan_from_request(plan_to_request(honest, fit_bits=18, max_inflation=2.0**-3),
                             K) == honest
    with pytest.raises(ValueError, match="max_inflation"):  # finer than the default
        plan_from_request({**plan_to_request(honest, fit_bits=18, max_inflation=2.0**-3),
                           "max_inflation": 2.0**-11}, K)


def test_a_release_above_the_cap_is_refused_in_process_as_on_a_deployment() -> None:
    """The in-process fit with ``max_modulus_bits`` reproduces a capped deployment: a
    release whose plan still needs more than the cap (the pre-check bounds every release,
    so only a release it missed) is refused by name before any share, not sent at a
    larger modulus than the deployment carries."""
    from dpprecond.secagg.sums import release_plan

    free = release_plan(55, 2.0 * 4.6, 2.0, fp=1.0, n_rows=3000, n_clients=K, min_clients=K)
    assert free.bits > 12
    with pytest.raises(ValueError, match=r"2\^12 \(max_modulus_bits\).*nothing of it was "
                                         r"released"):
        release_plan(55, 2.0 * 4.6, 2.0, fp=1.0, n_rows=3000, n_clients=K, min_clients=K,
                     fit_bits=12, max_inflation=2.0**-3)
    assert release_plan(55, 2.0 * 4.6, 2.0, fp=1.0, n_rows=3000, n_clients=K, min_clients=K,
                        fit_bits=free.bits, max_inflation=2.0**-3) == free
