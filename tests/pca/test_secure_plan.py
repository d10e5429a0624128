"""Secure federated PCA under a modulus cap (pca/secure_plan.py, ``max_modulus_bits``).

A sum that needs more bits than the cap at the default rounding scale (2^-10) coarsens its
scale; the fit's events are calibrated at the coarsest scale any of its sums may take, so
the epsilon is the target; a fit no scale fits is refused before the ledger is charged.
The cap here is 20 bits (the uncapped sums of this data take 26-27), standing in for
SecAgg+'s 30 on data large enough to need it.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpprecond.accounting import PrivacyLedger, epsilon_of
from dpprecond.data.synthetic import spiked_covariance
from dpprecond.pca import fit_private_pca
from dpprecond.pca.api import planned_budget, planned_secure_budget
from dpprecond.pca.budget import secure_aggregation_plan
from dpprecond.pca.remote_secure import plan_from_request, plan_to_request
from dpprecond.pca.secure_plan import (
    MAX_FIT_INFLATION,
    ModulusUnavailableError,
    fit_inflations,
    sum_modulus_bits,
)
from dpprecond.secagg.sums import ROUNDING_INFLATION, plan_sum
from tests.pca.test_remote_secure import BOUNDS, K, _federation

FIT = dict(target_epsilon=1.0, target_delta=1e-6, row_norm=1.0, trust="secure-aggregation")
CAP = 20


@pytest.fixture(scope="module")
def data() -> np.ndarray:
    return spiked_covariance(3000, 10, 2, 20.0, seed=4)


def test_the_bounds_run_from_the_default_scale_to_one_eighth() -> None:
    assert fit_inflations() == [2.0**e for e in range(-10, -2)]
    assert fit_inflations()[0] == ROUNDING_INFLATION and fit_inflations()[-1] == 2.0**-3
    assert MAX_FIT_INFLATION == 0.125


@pytest.mark.parametrize(("dim", "n_rows", "z"), [(55, 3000, 4.6), (20, 3000, 14.5),
                                                  (307_720, 60_000, 6.5), (3, 10, 300.0)])
def test_the_worst_scale_bound_covers_every_capped_release(dim, n_rows, z) -> None:
    """The pre-check's soundness: for every sensitivity, the release's capped plan (start
    at 2^-10, halve gamma while it exceeds the cap and stays within the bound) fits the cap
    whenever the worst-scale bound at that inflation does, and never exceeds the bound's
    inflation. 400 sensitivities over eight octaves, both sides of each power of two."""
    rng = np.random.default_rng(0)
    sens = np.concatenate([2.0 ** rng.uniform(-4, 4, 380),
                           2.0 ** np.arange(-4, 4) * (1 - 2.0**-30),
                           2.0 ** np.arange(-4, 4) * (1 + 2.0**-30),
                           2.0 ** np.arange(-4, 4)])
    for bound in fit_inflations():
        cap = sum_modulus_bits(dim, n_rows, K, z, inflation=bound)
        for s in sens:
            plan = plan_sum(dim, float(s), z, n_rows=n_rows, n_clients=K, min_clients=K,
                            fit_bits=cap, max_inflation=bound)
            assert plan.bits <= cap, (bound, s)
            assert plan.inflation <= bound, (bound, s)
    # the bound is attained: just below a power of two the coarsest plan takes it
    worst = math.sqrt(dim) / 2.0**-3 * 2.0**-20 * (1 - 2.0**-20)
    at = plan_sum(dim, worst, z * (1 + 2.0**-39), n_rows=n_rows, n_clients=K, min_clients=K,
                  inflation=2.0**-3)
    assert at.bits == sum_modulus_bits(dim, n_rows, K, z, inflation=2.0**-3)


@pytest.mark.parametrize(("method", "options"), [
    ("analyze_gauss", {}), ("power", {}), ("auto", {}), ("auto", {"branch": "iterate"}),
    ("auto", {"center": "private"})])
def test_a_capped_fit_fits_its_sums_and_meets_the_target(data, method, options) -> None:
    free = fit_private_pca(data, 2, method=method, clients=BOUNDS, seed=5, **FIT, **options)
    assert max(free.info["secure_aggregation"]["modulus_bits"]) > CAP
    got = fit_private_pca(data, 2, method=method, clients=BOUNDS, seed=5, **FIT,
                          max_modulus_bits=CAP, **options)
    sums = got.info["secure_aggregation"]
    bound = sums["accounted_inflation"]
    assert sums["max_modulus_bits"] == CAP and max(sums["modulus_bits"]) <= CAP
    assert bound in fit_inflations() and bound > ROUNDING_INFLATION
    assert 0 < sums["rounding_inflation"] <= bound  # the sums' own, within the bound
    # the events are the recalibrated plan's at the bound, and meet the target
    center = options.get("center")
    opts = {key: val for key, val in options.items() if key != "center"}
    gauss = planned_budget(method, target_epsilon=1.0, target_delta=1e-6, center=center,
                           **opts)
    assert got.dp_event == secure_aggregation_plan(gauss, 1.0, 1e-6, inflation=bound).event
    assert got.epsilon <= 1.0 and got.epsilon == pytest.approx(1.0, rel=1e-3)
    assert got.epsilon == epsilon_of(got.dp_event, 1e-6, "rdp")
    assert got.dp_event != free.dp_event
    planned, planned_bound = planned_secure_budget(
        method, target_epsilon=1.0, target_delta=1e-6, n_features=10, n_components=2,
        n_rows=3000, n_clients=K, max_modulus_bits=CAP, center=center, **opts)
    assert planned.event == got.dp_event and planned_bound == bound
    # coarser sums cost noise only: the subspace is still found
    overlap = np.linalg.svd(got.components @ free.components.T, compute_uv=False)
    assert overlap.min() > 0.9


def test_a_fit_that_fits_the_cap_is_the_uncapped_fit(data) -> None:
    free = fit_private_pca(data, 2, clients=BOUNDS, seed=5, **FIT)
    got = fit_private_pca(data, 2, clients=BOUNDS, seed=5, max_modulus_bits=27, **FIT)
    assert np.array_equal(got.components, free.components)
    assert got.dp_event == free.dp_event
    assert got.info["secure_aggregation"]["accounted_inflation"] == ROUNDING_INFLATION


def test_a_cap_no_scale_fits_is_refused_before_the_ledger_is_charged(data) -> None:
    ledger = PrivacyLedger(1e-6, accountant="rdp")
    with pytest.raises(ModulusUnavailableError,
                       match=r"Gram matrix of d=10 features over n=3000 rows.*2\^20 even at "
                             r"the coarsest rounding scale.*2\^-3.*2\^10.*Raise "
                             r"max_modulus_bits.*Nothing was released or charged"):
        fit_private_pca(data, 2, method="analyze_gauss", clients=BOUNDS, ledger=ledger,
                        max_modulus_bits=10, **FIT)
    assert ledger.events == []


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"trust": "local"}, ValueError, r"max_modulus_bits=20 applies to trust='secure-agg"),
    ({"method": "fixed"}, ValueError, r"method='fixed' is not one of"),
    ({"max_modulus_bits": 1}, ValueError, "max_modulus_bits"),
    ({"max_modulus_bits": 63}, ValueError, "max_modulus_bits"),
    ({"max_modulus_bits": 20.0}, TypeError, "max_modulus_bits"),
    ({"clients": np.array([0, 10, 5, 3000])}, ValueError, "client bounds"),
])
def test_bad_caps_are_refused_by_name(data, kwargs, error, match) -> None:
    fit = {**FIT, "clients": BOUNDS, "max_modulus_bits": CAP, **kwargs}
    with pytest.raises(error, match=match):
        fit_private_pca(data, 2, **fit)


@pytest.mark.parametrize("method", ["analyze_gauss", "auto"])
def test_a_transport_cap_gives_the_in_process_capped_fit_bit_for_bit(data, method) -> None:
    ref = fit_private_pca(data, 2, method=method, clients=BOUNDS, seed=5,
                          max_modulus_bits=CAP, **FIT)
    log: list = []
    fed = _federation(data, log=log, fit_bits=CAP)
    assert fed.secure_fit_bits == CAP
    got = fit_private_pca(fed, 2, method=method, **FIT)
    assert np.array_equal(got.components, ref.components)
    assert got.dp_event == ref.dp_event
    assert got.info["secure_aggregation"] == ref.info["secure_aggregation"]
    bound = ref.info["secure_aggregation"]["accounted_inflation"]
    assert log and all(r["plan"]["fit_bits"] == CAP and r["plan"]["max_inflation"] == bound
                       for r, _ in log)
    # the smaller of the caller's and the transport's cap
    both = fit_private_pca(_federation(data, fit_bits=27), 2, method=method,
                           max_modulus_bits=CAP, **FIT)
    assert np.array_equal(both.components, ref.components)


def test_a_client_rederives_a_capped_plan_and_refuses_a_forged_one() -> None:
    plan = plan_sum(55, 2.0, 4.6, n_rows=3000, n_clients=K, min_clients=K, fit_bits=20,
                    max_inflation=2.0**-3)
    assert plan.bits <= 20 < plan_sum(55, 2.0, 4.6, n_rows=3000, n_clients=K,
                                      min_clients=K).bits
    fields = plan_to_request(plan, fit_bits=20, max_inflation=2.0**-3)
    assert plan_from_request(fields, K) == plan
    with pytest.raises(ValueError, match="scale"):  # sent without its cap: not derived
        plan_from_request({k: v for k, v in fields.items()
                           if k not in ("fit_bits", "max_inflation")}, K)
    with pytest.raises(ValueError, match="scale"):  # a coarser scale than the cap needs
        plan_from_request({**fields, "scale": fields["scale"] / 2}, K)
    with pytest.raises(ValueError, match=r"max_inflation=0\.5"):
        plan_from_request({**fields, "max_inflation": 0.5}, K)
    with pytest.raises(ValueError, match="fit_bits=True"):
        plan_from_request({**fields, "fit_bits": True}, K)
    with pytest.raises(ValueError, match="fields"):
        plan_from_request({**fields, "other": 1}, K)


def test_a_transport_cap_that_is_not_an_int_is_refused_by_name(data) -> None:
    for bad, error in ((30.5, TypeError), (1, ValueError), (True, TypeError)):
        with pytest.raises(error, match=r"secure_transport\.fit_bits"):
            _federation(data, fit_bits=bad).secure_fit_bits  # noqa: B018
