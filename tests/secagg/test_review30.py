"""Review 30: the federated secure sums' accounting covers every plan they may take.

:func:`~dpprecond.secagg.fl.round_plan` coarsens the scale up to the accounted inflation
``2^-6`` to fit the modulus in ``2^30``; :func:`~dpprecond.secagg.fl.round_event` is
:func:`~dpprecond.secagg.sums.sum_event` at that inflation. Checked here from the code's
own formulas: every plan's published Skellam bound (its own ``D2``, ``D1``, ``v``) lies
below the event's, over a grid of dimensions, sensitivities, noise multipliers, records,
federation sizes and ``min_clients``, including plans exactly at the cap; the default
``sum_event`` does not cover the coarsened plans (so a path charging it would be caught);
and every federated path (the simulator's gradient and covariance runs, the plan event
the pipeline composes, the SecAgg+ strategy) charges ``round_event``.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from dp_accounting import dp_event

from dpprecond.fl import FLConfig
from dpprecond.fl.data import ClientData
from dpprecond.fl.engine import plan_event
from dpprecond.fl.models import LinearSoftmax
from dpprecond.secagg.fl import (
    ACCOUNTED_INFLATION,
    FIT_BITS,
    round_event,
    round_plan,
    secure_multipliers,
    secure_noise_multiplier,
    simulate_secure,
)
from dpprecond.secagg.skellam import skellam_rdp
from dpprecond.secagg.sums import ROUNDING_INFLATION, sum_event

ORDERS = np.arange(2, 400)  # the published bound is stated for integer orders


def _integer_order_bound(event: dp_event.DpEvent) -> np.ndarray:
    """The event's RDP at integer orders without the fractional-order extension ``rho/2``
    (``skellam_event`` adds it to ``xi``): what the published bound must stay below."""
    assert isinstance(event, dp_event.ZCDpEvent)
    return event.xi - event.rho / 2 + event.rho * ORDERS


def _plans():
    grid = itertools.product([1, 3, 78, 650, 7850], [1e-3, 0.05, 2.0, 37.0],
                             [0.3, 1.0, 5.0, 50.0], [10, 1000, 60_000, 10**6], [2, 20, 300])
    for dim, sens, z, n, k in grid:
        for k_min in sorted({1, max(k // 2, 1), k}):
            try:
                yield round_plan(dim, sens, z, n_rows=n, n_clients=k, min_clients=k_min)
            except ValueError:  # no exact plan (named error): nothing released
                continue
    # plans exactly at the cap: sensitivities at (and one ulp around) sqrt(m) 2^6 / 2^j,
    # records swept so that the coarsening stops at every scale up to the cap
    for dim, j in itertools.product([1, 3, 78, 7850], [-3, 0, 5]):
        base = math.sqrt(dim) / ACCOUNTED_INFLATION / 2.0**j
        for sens in (base, float(np.nextafter(base, 0)), float(np.nextafter(base, np.inf))):
            for e in np.arange(8, 26, 0.5):
                try:
                    yield round_plan(dim, sens, 3.0, n_rows=int(2**e), n_clients=50,
                                     min_clients=25)
                except ValueError:
                    continue


def test_round_event_dominates_every_plan_round_plan_returns():
    plans = list(_plans())
    coarsened = [p for p in plans if p.inflation > ROUNDING_INFLATION]
    at_cap = [p for p in plans if p.inflation == pytest.approx(ACCOUNTED_INFLATION, rel=1e-12)]
    assert len(plans) > 3000 and len(coarsened) > 300 and len(at_cap) > 20
    for p in plans:
        assert p.inflation <= ACCOUNTED_INFLATION
        assert p.bits <= FIT_BITS or p.inflation <= ROUNDING_INFLATION  # else the fine plan
        # the decoded std over the central Gaussian's, as the docs claim (<= 1.6%)
        assert p.noise_std() * p.scale / math.sqrt(p.n_clients / p.min_clients) <= \
            p.noise_multiplier * p.scale * p.sensitivity * (1 + ACCOUNTED_INFLATION) * (1 + 1e-9)
        own = skellam_rdp(ORDERS, p.l2_sensitivity, p.l1_sensitivity, p.noise_variance)
        assert np.all(own <= _integer_order_bound(round_event(p.noise_multiplier))), p
        # the zCDP parameters too (the fractional-order extension is the same rho/2)
        mine, charged = p.event(), round_event(p.noise_multiplier)
        assert mine.rho <= charged.rho * (1 + 1e-14) and mine.xi <= charged.xi * (1 + 1e-14)
    # the default sum_event (inflation 2^-10) does not dominate the coarsened plans: a path
    # charging it for a round_plan plan would under-count, which this test would see
    worse = [p for p in coarsened if np.any(skellam_rdp(
        ORDERS, p.l2_sensitivity, p.l1_sensitivity, p.noise_variance)
        > _integer_order_bound(sum_event(p.noise_multiplier)))]
    assert worse


def _coarsened_data() -> tuple[LinearSoftmax, ClientData, np.ndarray, np.ndarray]:
    """650 parameters and 24,000 records: 31 bits at the 2^-10 scale, so the plan
    coarsens (the setup sum's 2,211 moment coordinates too, at the row clip)."""
    rng = np.random.default_rng(0)
    n, d = 24_000, 64
    X = rng.standard_normal((n, d)) / math.sqrt(d)
    y = rng.integers(0, 10, n)
    bounds = np.linspace(0, n, 5).astype(np.int64)
    return LinearSoftmax(d, 10), ClientData(X, y, bounds, 10), X[:50], y[:50]


@pytest.mark.parametrize("method", ["fedgd", "fedfc"])
def test_every_federated_path_charges_round_event(method):
    from dpprecond.adapters.flower.secagg import SecAggDPStrategy

    model, data, Xt, yt = _coarsened_data()
    config = FLConfig(n_rounds=1, clip_norm=1.0, target_epsilon=2.0, weighting="size",
                      trust="secure-aggregation", adaptive_clip=None)
    result = simulate_secure(model, data, method, config, X_test=Xt, y_test=yt, seed=1)
    assert result.config["rounding_inflation"] > ROUNDING_INFLATION  # coarsened
    strategy = SecAggDPStrategy(model, method, config, data.n_clients, data.X.shape[0])
    if method == "fedgd":
        z = secure_noise_multiplier(config)
        charged = [round_event(z)]
        assert strategy.release_ == round_event(z)
    else:
        zs = secure_multipliers(strategy.method, config)
        charged = [round_event(zs["z_cov"]), round_event(zs["z_grad"])]
        assert [strategy.setup_release_, strategy.release_] == charged
    assert result.events == charged
    assert all(e != sum_event(e_z) for e, e_z in zip(
        charged, [zs["z_cov"], zs["z_grad"]] if method == "fedfc" else [z], strict=True))
    # the run's plan event (what the pipeline composes and checks a ledger with)
    whole = plan_event(model, method, config)
    flat = [whole] if not isinstance(whole, dp_event.ComposedDpEvent) else whole.events
    got = []
    for e in flat:
        while isinstance(e, dp_event.SelfComposedDpEvent):
            e = e.event
        got.append(e)
    assert got == charged
