"""Hole 5 of the privacy issue: the privacy level is stated once, and explicitly.

``FLConfig(**FIXED, target_epsilon=1, noise_multiplier=0)`` used to run non-private without a
word, and ``noise_multiplier=0.5`` with ``target_epsilon=1`` reported epsilon 46. Giving
both is an error; giving neither is an error; a non-private run is asked for explicitly
with ``noise_multiplier=0``.
"""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest

from dpprecond.fl import ClientData, FLConfig, make_method, run_federated, simulate
from dpprecond.fl.models import LinearSoftmax
from dpprecond.fl.partition import iid_partition
from tests.fl.conftest import FIXED

from .conftest import make_problem


@pytest.mark.parametrize("kwargs", [dict(target_epsilon=1.0, noise_multiplier=0.0),
                                    dict(target_epsilon=1.0, noise_multiplier=0.5)])
def test_both_levels_is_an_error(kwargs: dict) -> None:
    with pytest.raises(ValueError, match=r"target_epsilon.*noise_multiplier.*not both"):
        FLConfig(**{"target_epsilon": 1.0, **kwargs}).validated()


def test_no_level_is_an_error() -> None:
    with pytest.raises(ValueError, match=r"target_epsilon=.*or noise_multiplier="):
        FLConfig(**FIXED).validated()


def test_non_private_is_explicit_and_logged(caplog) -> None:
    X, y, Xt, yt = make_problem(n=120)
    with caplog.at_level(logging.WARNING, logger="dpprecond"):
        res = run_federated(X, y, Xt, yt, 3, n_clients=3, seed=0,
                            config=FLConfig(**FIXED, n_rounds=2, noise_multiplier=0.0))
    assert math.isinf(res.epsilon)
    assert any("non-private" in r.message for r in caplog.records)


def test_explicit_noise_reports_its_own_epsilon() -> None:
    X, y, Xt, yt = make_problem(n=120)
    res = run_federated(X, y, Xt, yt, 3, n_clients=3, seed=0,
                        config=FLConfig(**FIXED, n_rounds=2, noise_multiplier=5.0))
    assert 0 < res.epsilon < 2.0


@pytest.mark.parametrize("name", ["scaffold", "fedfc", "fednew"])
def test_baselines_take_the_same_config(name: str) -> None:
    X, y, Xt, yt = make_problem(n=120)
    data = ClientData.from_partition(X, y, iid_partition(len(y), 3, 1), 3)
    with pytest.raises(ValueError, match="not both"):
        simulate(LinearSoftmax(X.shape[1], 3), data, make_method(name),
                 FLConfig(**FIXED, n_rounds=2, target_epsilon=1.0, noise_multiplier=0.0),
                 X_test=Xt, y_test=yt, seed=0)
    res = simulate(LinearSoftmax(X.shape[1], 3), data, make_method(name),
                   FLConfig(**FIXED, n_rounds=2, noise_multiplier=3.0), X_test=Xt, y_test=yt,
                   seed=0)
    assert np.isfinite(res.epsilon)


def test_the_papers_sofim_form_warns_when_it_runs_with_noise() -> None:
    from dpprecond.fl.methods import NoisyPreconditionerWarning

    X, y, Xt, yt = make_problem(n=200)
    kw = dict(n_clients=2, seed=0)
    with pytest.warns(NoisyPreconditionerWarning, match="uphill"):
        run_federated(X, y, Xt, yt, 3, algorithm="sofim",
                      config=FLConfig(**FIXED, n_rounds=2, target_epsilon=1.0), **kw)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        warnings.simplefilter("error", NoisyPreconditionerWarning)  # checked first
        run_federated(X, y, Xt, yt, 3, algorithm="sofim",  # no noise: nothing to warn about
                      config=FLConfig(**FIXED, n_rounds=2, noise_multiplier=0.0), **kw)
        run_federated(X, y, Xt, yt, 3, algorithm="sofim-lagged",
                      config=FLConfig(**FIXED, n_rounds=2, target_epsilon=1.0), **kw)


def test_a_shared_ledger_refuses_a_run_before_any_round() -> None:
    """A private PCA and a federated run on the same records in one ledger: the run that
    would exceed ``max_epsilon`` is refused whole, before its first message."""
    from dpprecond import PrivacyBudgetExceededError
    from dpprecond.accounting import PrivacyLedger
    from dpprecond.pca import fit_private_pca

    X, y, Xt, yt = make_problem(n=300)
    ledger = PrivacyLedger(1e-5, max_epsilon=1.3)
    fit_private_pca(X, 2, target_epsilon=1.0, target_delta=1e-5, row_norm=10.0, seed=0,
                    ledger=ledger)
    assert ledger.n_releases == 1
    rounds: list[dict] = []
    with pytest.raises(PrivacyBudgetExceededError, match=r"max_epsilon=1\.3"):
        run_federated(X, y, Xt, yt, 3, algorithm="fedgd", n_clients=3, seed=0,
                      config=FLConfig(**FIXED, n_rounds=5, target_epsilon=1.0), ledger=ledger,
                      callback=rounds.append)
    assert rounds == [] and ledger.n_releases == 1  # nothing ran, nothing was recorded
    res = run_federated(X, y, Xt, yt, 3, algorithm="fedgd", n_clients=3, seed=0,
                        config=FLConfig(**FIXED, n_rounds=5, target_epsilon=0.3), ledger=ledger)
    assert ledger.n_releases == 1 + 5 and ledger.epsilon <= 1.3
    assert ledger.epsilon > max(1.0, res.epsilon)  # the total composes both
