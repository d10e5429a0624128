"""trust='secure-aggregation': the engine's rounds with distributed Skellam noise."""

from __future__ import annotations

import numpy as np
import pytest

from dpprecond.accounting import PrivacyLedger
from dpprecond.fl import FLConfig, run_federated
from dpprecond.fl.data import ClientData
from dpprecond.fl.engine import simulate
from dpprecond.fl.models import LinearSoftmax, clip_rows_safely
from dpprecond.secagg import InsufficientNoiseError
from dpprecond.secagg.fl import secure_gradient_sum, secure_plan
from dpprecond.secagg.sums import round_shared
from tests.fl.conftest import secure_config

K = 6


def _config(**kw: object) -> FLConfig:
    return secure_config(**{"n_rounds": 4, "target_epsilon": 2.0, **kw})  # type: ignore[arg-type]


def _run(digits: tuple[np.ndarray, ...], seed: int | None = 3, **kw: object):
    X, y, Xt, yt = digits
    return run_federated(X, y, Xt, yt, 10, algorithm="sofim", n_clients=K, seed=seed,
                         config=_config(**kw))


def test_same_seed_same_releases_and_the_budget_is_met(digits):
    a, b = _run(digits), _run(digits)
    np.testing.assert_array_equal(a.params, b.params)
    assert not np.array_equal(a.params, _run(digits, seed=4).params)
    assert a.config["trust"] == "secure-aggregation" and a.config["accountant"] == "rdp"
    assert 0.9 * 2.0 <= a.epsilon <= 2.0
    assert len(a.events) == 4 and a.config["wrap_probability"] <= 1e-12
    # the sum carries the noise once: its noise multiplier is that of one central release
    local = run_federated(*digits, 10, algorithm="sofim", n_clients=K, seed=3,
                          config=FLConfig(n_rounds=4, clip_norm=1.0, target_epsilon=2.0,
                                          weighting="size", accountant="rdp"))
    assert a.noise_multiplier == pytest.approx(local.noise_multiplier, rel=0.1)


def test_the_decoded_sum_is_the_clipped_gradient_sum_up_to_rounding(digits):
    from dataclasses import replace

    X, y, _, _ = digits
    model = LinearSoftmax(64, 10)
    params = model.init_params(np.random.default_rng(0)) + 0.1
    bounds = np.linspace(0, X.shape[0], K + 1).astype(np.int64)
    data = ClientData(X, y, bounds, 10)
    plan = secure_plan(model, _config(), data, 1.0, K)
    quiet = replace(plan, noise_multiplier=1e-300)  # shares of Poisson(~0): no noise
    assert quiet.share_parameter == 0.0
    rngs = [np.random.default_rng(i) for i in range(K)]
    got = secure_gradient_sum(model, params, X, y, bounds, 1.0, quiet, rngs)
    exact = clip_rows_safely(model.per_example_grads(params, X, y), 1.0).sum(axis=0)
    # each client's rounding moves a coordinate by < 1/gamma: K levels in all
    assert np.abs(got - exact).max() <= K / plan.scale + 1e-9
    # and it is exactly the rounded parts' sum (the parts: each client's clipped sum)
    parts = model.clipped_grad_sums(params, X, y, bounds, 1.0)
    again = sum(round_shared(parts[i] * plan.scale,
                             np.random.default_rng(i).random(plan.dim)) for i in range(K))
    np.testing.assert_array_equal(got * plan.scale, again)


def test_a_sum_missing_shares_is_not_released(digits):
    X, y, _, _ = digits
    model = LinearSoftmax(64, 10)
    bounds = np.linspace(0, X.shape[0], K + 1).astype(np.int64)
    plan = secure_plan(model, _config(), ClientData(X, y, bounds, 10), 1.0, K)
    rngs = [np.random.default_rng(i) for i in range(K)]
    with pytest.raises(InsufficientNoiseError, match=f"min_clients={K}"):
        secure_gradient_sum(model, model.init_params(np.random.default_rng(0)), X, y, bounds,
                            1.0, plan, rngs, clients=list(range(K - 1)))


def test_the_callers_ledger_is_checked_first_and_records_every_sum(digits):
    X, y, Xt, yt = digits
    ledger = PrivacyLedger(1e-5, max_epsilon=1.0, accountant="rdp")
    from dpprecond import PrivacyBudgetExceededError

    with pytest.raises(PrivacyBudgetExceededError):
        run_federated(X, y, Xt, yt, 10, algorithm="fedgd", n_clients=K, seed=1,
                      config=_config(), ledger=ledger)
    roomy = PrivacyLedger(1e-5, max_epsilon=10.0, accountant="rdp")
    res = run_federated(X, y, Xt, yt, 10, algorithm="fedgd", n_clients=K, seed=1,
                        config=_config(), ledger=roomy)
    assert roomy.epsilon == pytest.approx(res.epsilon, rel=1e-9)


@pytest.mark.parametrize("kw, match", [
    ({"weighting": "uniform"}, "weighting='size'"),
    ({"mechanism": "poisson", "sampling_rate": 0.5}, "full-batch"),
    ({"trust": "central"}, "trust"),
])
def test_unsupported_settings_are_refused_by_name(digits, kw, match):
    with pytest.raises(ValueError, match=match):
        _run(digits, **kw)


def test_methods_with_other_releases_and_secure_mode_are_refused(digits):
    X, y, Xt, yt = digits
    with pytest.raises(ValueError, match="scaffold"):
        run_federated(X, y, Xt, yt, 10, algorithm="scaffold", n_clients=K, seed=1,
                      config=_config())
    model = LinearSoftmax(64, 10)
    bounds = np.linspace(0, X.shape[0], K + 1).astype(np.int64)
    with pytest.raises(ValueError, match=r"secure=True refuses seeds.*seed=1"):
        simulate(model, ClientData(X, y, bounds, 10), "fedgd", _config(), X_test=Xt,
                 y_test=yt, secure=True, seed=1)


@pytest.mark.parametrize("algorithm", ["fedgd", "fedfc"])
def test_secure_mode_draws_every_share_and_rounding_from_the_csprng(digits, monkeypatch,
                                                                    algorithm):
    """secure=True under secure aggregation: every client message (its rounding uniforms
    and its Skellam share, drawn from one stream) comes from a SecureGenerator, whose
    Poisson draws are two per share; two runs differ, and the plan, events and epsilon are
    the seeded run's (the settings alone fix them)."""
    import dpprecond.secure as secure_module
    from tests.spies import share_sources

    poisson = [0]
    real_poisson = secure_module.SecureGenerator.poisson

    def counting(self, lam=1.0, size=None):  # type: ignore[no-untyped-def]
        poisson[0] += 1
        return real_poisson(self, lam, size)

    X, y, Xt, yt = digits
    seeded = run_federated(X, y, Xt, yt, 10, algorithm=algorithm, n_clients=K, seed=3,
                           config=_config())
    with monkeypatch.context() as m:
        kinds = share_sources(m)
        m.setattr(secure_module.SecureGenerator, "poisson", counting)
        a = run_federated(X, y, Xt, yt, 10, algorithm=algorithm, n_clients=K,
                          config=_config(), secure=True)
        b = run_federated(X, y, Xt, yt, 10, algorithm=algorithm, n_clients=K,
                          config=_config(), secure=True)
    n_sums = 4 + (algorithm == "fedfc")  # the rounds (and the setup sum)
    assert kinds == ["SecureGenerator"] * (2 * K * n_sums)
    assert poisson[0] == 2 * len(kinds)
    assert not np.array_equal(a.params, b.params)
    assert a.events == seeded.events and a.epsilon == seeded.epsilon
    assert a.config["modulus_bits"] == seeded.config["modulus_bits"]
    assert np.isfinite(a.params).all() and a.history[-1]["test_accuracy"] > 0.2


def test_the_flower_strategy_refuses_secure_aggregation_by_name():
    pytest.importorskip("flwr")
    from dpprecond.adapters.flower import DPFedStrategy

    with pytest.raises(ValueError, match="trust='secure-aggregation'"):
        DPFedStrategy(LinearSoftmax(64, 10), "fedgd", _config(), K)


def test_plan_event_is_the_composition_of_the_runs_events(digits):
    from dp_accounting import dp_event

    from dpprecond.accounting import epsilon_of
    from dpprecond.fl.engine import plan_event

    res = _run(digits)
    planned = plan_event(LinearSoftmax(64, 10), "sofim", _config())
    spent = epsilon_of(dp_event.ComposedDpEvent(list(res.events)), 1e-5, "rdp")
    assert epsilon_of(planned, 1e-5, "rdp") == pytest.approx(spent, rel=1e-12)
    with pytest.raises(ValueError, match="weighting='size'"):
        plan_event(LinearSoftmax(64, 10), "sofim", _config(weighting="uniform"))


# -- run_pipeline(trust="secure-aggregation"): PCA shares, then the Skellam rounds --------------


def _pipeline(digits: tuple[np.ndarray, ...], **kw: object):
    from dpprecond.pipeline import run_pipeline

    X, y, Xt, yt = digits
    base: dict[str, object] = dict(features="pca:8", target_epsilon=1.0, row_norm=8.0,
                                   trust="secure-aggregation", algorithm="fedgd",
                                   n_clients=K, n_rounds=3, clip_norm=1.0, seed=2)
    base.update(kw)
    return run_pipeline(X, y, Xt, yt, 10, **base)  # type: ignore[arg-type]


def test_pipeline_composes_the_pca_and_the_skellam_rounds_in_rdp(digits) -> None:
    """The ledger's total is the planned composition (the PCA's releases and the ``T``
    Skellam sums, dp_accounting's RDP accountant), calibrated to the target."""
    from dp_accounting import dp_event

    from dpprecond.accounting import compose, epsilon_of
    from dpprecond.fl.engine import plan_event
    from dpprecond.fl.methods import make_method
    from dpprecond.pca.api import planned_event
    from dpprecond.pipeline import split_budget, split_noise

    res = _pipeline(digits)
    assert res.fl.config["trust"] == "secure-aggregation" and res.fl.config["weighting"] == "size"
    eps_pca, _ = split_budget(1.0, 1e-5, 0.2)
    z_pca, _ = split_noise(1.0, 1e-5, 0.2)
    assert res.pca_epsilon == pytest.approx(eps_pca, rel=1e-3)  # Skellam sums, RDP
    z = res.fl.noise_multiplier
    config = FLConfig(n_rounds=3, clip_norm=1.0, noise_multiplier=z, weighting="size",
                      trust="secure-aggregation")
    planned = compose([planned_event("auto", target_epsilon=None, noise_multiplier=z_pca,
                                     target_delta=1e-5, trust="secure-aggregation"),
                       plan_event(LinearSoftmax(8, 10), make_method("fedgd"), config)])
    total = epsilon_of(planned, 1e-5, "rdp")
    assert res.epsilon == pytest.approx(total, rel=1e-9)
    assert 1.0 * (1 - 1e-3) <= res.epsilon <= 1.0
    skellam = [e for e in res.ledger.events if isinstance(e, dp_event.ZCDpEvent)]
    assert len(skellam) >= 1 and res.fl.n_releases == 3
    # the training alone gets less than the whole budget: more noise than a lone run's
    alone = _config(n_rounds=3, target_epsilon=1.0)
    from dpprecond.secagg.fl import secure_noise_multiplier

    assert z > secure_noise_multiplier(alone)


def test_pipeline_secure_aggregation_refusals(digits) -> None:
    # The PCA's secure sums are calibrated in RDP to the epsilon of its share, which is
    # below the target for any share < 1: even pca_share=0.99 leaves the training a
    # budget, and the whole run still meets the target.
    from dpprecond.accounting import epsilon_of
    from dpprecond.pca.api import planned_event
    from dpprecond.pipeline import split_budget

    eps_pca, _ = split_budget(1.0, 1e-5, 0.99)
    pca = planned_event("auto", target_epsilon=eps_pca, target_delta=1e-5,
                        trust="secure-aggregation")
    assert epsilon_of(pca, 1e-5, "rdp") <= eps_pca < 1.0
    res = _pipeline(digits, pca_share=0.99)
    assert res.epsilon <= 1.0
    with pytest.raises(ValueError, match="trust='secure-aggregation' is a private"):
        _pipeline(digits, target_epsilon=None)
    with pytest.raises(ValueError, match="weighting='size'"):
        _pipeline(digits, weighting="uniform")
    for algorithm in ("scaffold", "fedavg", "fedprox"):  # named before any calibration
        with pytest.raises(ValueError, match=rf"record level \(mechanism='full-batch'\), "
                                             rf"where '{algorithm}' cannot run on secure "
                                             r"sums.*Use trust='local'"):
            _pipeline(digits, algorithm=algorithm)


def test_pipeline_pixels_under_secure_aggregation_spends_the_whole_target(digits) -> None:
    res = _pipeline(digits, features="pixels")
    assert res.pca_epsilon is None and res.fl.config["trust"] == "secure-aggregation"
    assert 1.0 * (1 - 1e-3) <= res.epsilon <= 1.0
