"""Private hyperparameter selection of federated runs: budget, score, selection, refusals."""

from __future__ import annotations

import logging
import math
import warnings

import numpy as np
import pytest
from dp_accounting import dp_event

from dpprecond import PrivacyBudgetExceededError
from dpprecond.accounting import PrivacyLedger, epsilon_of, gaussian_precision
from dpprecond.fl import FLConfig, LinearSoftmax
from dpprecond.fl.adaptive_clip import AdaptiveClip
from dpprecond.fl.divergence import DivergenceWarning, find_climb
from dpprecond.fl.tuning import (
    Candidate,
    TuningResult,
    correct_count,
    score_sensitivity,
    search_space,
    tune_private,
)
from tests.fl.conftest import make_problem

SPACE = [Candidate("fedgd", 0.5, 2.0), Candidate("sofim-lagged", 0.05, 1.0),
         Candidate("adam", 0.01, None, {}, AdaptiveClip())]


def _tune(problem: tuple, **kwargs: object) -> TuningResult:
    X, y, Xt, yt = problem
    kwargs.setdefault("config", FLConfig(n_rounds=4, target_epsilon=2.0))
    kwargs.setdefault("candidates", SPACE)
    kwargs.setdefault("n_clients", 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tune_private(X, y, Xt, yt, 3, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("trials", ["geometric", "logarithmic", 2.0])
def test_the_total_epsilon_is_the_target_tuning_included(problem: tuple,
                                                         trials: str | float) -> None:
    res = _tune(problem, mean_trials=3.0, trials=trials, seed=1)
    assert res.epsilon <= 2.0 + 1e-9
    assert res.epsilon == pytest.approx(2.0, rel=1e-3)
    z = res.trial_noise_multiplier
    shape = {"geometric": 1.0, "logarithmic": 0.0}.get(trials, trials)  # type: ignore[call-overload]
    ev = dp_event.RepeatAndSelectDpEvent(dp_event.GaussianDpEvent(z), 3.0, shape)
    assert res.event == ev
    assert epsilon_of(ev, 1e-5, "rdp") == pytest.approx(res.epsilon, rel=1e-12)


def test_every_trial_is_one_gaussian_of_the_planned_precision(problem: tuple) -> None:
    share = 0.3
    res = _tune(problem, score_share=share, seed=2)
    z = res.trial_noise_multiplier
    spent = gaussian_precision(dp_event.ComposedDpEvent(list(res.result.events)))
    assert spent == pytest.approx((1 - share) / z**2, rel=1e-9)
    assert res.score_noise_multiplier == pytest.approx(z / math.sqrt(share))
    # training plus score is exactly Gaussian(z)
    assert spent + 1 / res.score_noise_multiplier**2 == pytest.approx(1 / z**2, rel=1e-9)


def test_the_score_has_sensitivity_one_over_n_val_at_worst_case_neighbours() -> None:
    X, y, _, _ = make_problem(n=50, seed=4)
    model = LinearSoftmax(6, 3)
    params = np.random.default_rng(0).standard_normal(model.n_params)
    pred = (np.hstack([X, np.ones((50, 1))]) @ params.reshape(7, 3)).argmax(1)
    right = int(np.flatnonzero(pred == y)[0])
    y2 = y.copy()
    y2[right] = (y[right] + 1) % 3  # the worst case: a right answer replaced by a wrong one
    diff = correct_count(model, params, X, y) - correct_count(model, params, X, y2)
    assert diff == 1
    assert diff / 50 == score_sensitivity(50)
    rng = np.random.default_rng(1)
    for _ in range(200):
        X2, y3 = X.copy(), y.copy()
        j = int(rng.integers(50))
        X2[j] = rng.standard_normal(6) * 10
        y3[j] = rng.integers(3)
        d = correct_count(model, params, X, y) - correct_count(model, params, X2, y3)
        assert abs(d) <= 1


def test_a_non_private_search_picks_the_candidate_that_learns(problem: tuple) -> None:
    space = [Candidate("fedgd", 1e-9, 2.0), Candidate("fedgd", 1.0, 10.0)]
    res = _tune(problem, candidates=space, mean_trials=8.0, seed=0,
                config=FLConfig(n_rounds=10, noise_multiplier=0.0))
    assert res.n_trials >= 2  # this seed draws both candidates
    assert res.candidate == space[1]
    assert math.isinf(res.epsilon)


def test_the_ledger_is_checked_first_and_charged(problem: tuple) -> None:
    ledger = PrivacyLedger(1e-5, max_epsilon=1.0)
    with pytest.raises(PrivacyBudgetExceededError):
        _tune(problem, ledger=ledger, seed=0)
    assert ledger.n_releases == 0
    ledger = PrivacyLedger(1e-5, max_epsilon=5.0, accountant="rdp")
    res = _tune(problem, ledger=ledger, seed=0)
    assert ledger.n_releases == 1
    assert ledger.epsilon == pytest.approx(res.epsilon, rel=1e-9)


def test_a_held_out_split_scores_on_its_own_records(problem: tuple) -> None:
    res = _tune(problem, validation_fraction=0.25, seed=0)
    assert res.n_validation == 60
    assert _tune(problem, seed=0).n_validation == 240  # default: every training record


def test_n_trials_is_not_published(problem: tuple) -> None:
    out = _tune(problem, seed=0).to_dict()
    assert "n_trials" not in out
    assert out["epsilon"] == pytest.approx(2.0, rel=1e-3)


def test_secure_mode_refuses_seeds_and_runs(problem: tuple) -> None:
    with pytest.raises(ValueError, match="secure"):
        _tune(problem, secure=True, seed=0)
    res = _tune(problem, secure=True, mean_trials=1.5)
    assert res.result is not None


def test_a_poisson_count_of_zero_releases_nothing(problem: tuple) -> None:
    # a Poisson(1) count is 0 with probability 1/e: one of 20 seeds draws it
    for seed in range(20):
        rng_res = _tune(problem, trials="poisson", mean_trials=1.0, seed=seed)
        if rng_res.n_trials == 0:
            assert rng_res.result is None and rng_res.candidate is None
            assert math.isnan(rng_res.noisy_score)
            return
    pytest.fail("no seed of 20 drew zero trials")


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"validation_fraction": -0.1}, "validation_fraction"),
    ({"validation_fraction": 0.999}, "validation_fraction"),
    ({"validation_fraction": 1.0}, "validation_fraction"),
    ({"score_share": 1.0}, "score_share"),
    ({"mean_trials": 0.5}, "mean_trials"),
    ({"trials": "uniform"}, "trials"),
    ({"candidates": []}, "candidates"),
    ({"config": FLConfig(n_rounds=2, noise_multiplier=1.0)}, "target_epsilon"),
    ({"config": FLConfig(n_rounds=2, target_epsilon=1.0, mechanism="poisson",
                         sampling_rate=0.5)}, "full-batch"),
])
def test_bad_settings_are_refused_by_name(problem: tuple, kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        _tune(problem, **kwargs)


def test_bad_candidates_are_refused_before_any_run(problem: tuple) -> None:
    with pytest.raises(ValueError, match="method"):
        _tune(problem, candidates=[Candidate("newton")])
    with pytest.raises(TypeError, match="Unknown option"):
        _tune(problem, candidates=[Candidate("fedgd", 0.1, None, {"beta": 0.9})])
    with pytest.raises(TypeError, match="Candidate"):
        _tune(problem, candidates=[{"algorithm": "fedgd"}])


def test_search_space_is_the_grid() -> None:
    space = search_space({"fedgd": (0.1, 0.3), "adam": (0.01,)}, clip_norms=(1.0, 10.0))
    assert len(space) == 6
    assert Candidate("fedgd", 0.3, 10.0) in space


def test_warnings_do_not_count_the_hidden_trials(problem: tuple) -> None:
    """Each trial warns (delta above 1/n; a climbing loss at a large step): what the caller
    sees must not depend on how many trials ran."""
    X, y, Xt, yt = problem
    config = FLConfig(n_rounds=4, target_epsilon=0.5, target_delta=5e-3)  # 1/n = 1/240
    seen: dict[int, list[type[Warning]]] = {}
    for seed in range(12):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            res = tune_private(X, y, Xt, yt, 3, config=config, n_clients=4, seed=seed,
                               candidates=[Candidate("fedgd", 50.0, 2.0)], mean_trials=4.0)
        seen.setdefault(res.n_trials, sorted((w.category for w in caught), key=str))
        if len(seen) >= 3:
            break
    assert len(seen) >= 2, seen.keys()  # runs with different numbers of trials
    assert len({tuple(v) for v in seen.values()}) == 1, seen


def test_the_engine_logs_no_line_per_trial(problem: tuple,
                                           caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="dpprecond")
    res = _tune(problem, seed=3, mean_trials=4.0)
    assert res.n_trials >= 1
    assert not [r for r in caplog.records if r.name == "dpprecond.fl.engine"]


def test_only_the_selected_trial_shows_its_diagnostics(problem: tuple,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    # a diverging candidate: a warning or a log line per trial would tell the hidden
    # number of trials and describe the models of trials that were not selected
    X, y, Xt, yt = problem
    space = [Candidate("fedgd", 50.0, 2.0), Candidate("fedgd", 0.5, 2.0)]
    caplog.set_level(logging.INFO, logger="dpprecond")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = tune_private(X, y, Xt, yt, 3, config=FLConfig(n_rounds=12, target_epsilon=1.0),
                           candidates=space, n_clients=4, mean_trials=6.0, seed=5)
    assert res.n_trials >= 2 and res.result is not None and res.candidate is not None
    climbs = [w for w in caught if issubclass(w.category, DivergenceWarning)]
    selected = find_climb(res.result.history)
    assert len(climbs) == (0 if selected is None else 1)
    if selected is not None:
        assert str(climbs[0].message) == selected.describe(res.candidate.algorithm)
    trial_records = [r for r in caplog.records if r.name != "dpprecond.fl.tuning"]
    assert trial_records == []
