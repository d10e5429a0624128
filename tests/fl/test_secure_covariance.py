"""DP-FedFC and DP-FedNew under secure aggregation: the setup sum, then the secure rounds.

The setup sum's parts are the upper triangles of the clients' clipped second moments:
worst-case neighbours (also at 1e300, through the row clip's overflow-safe path) round
within ``gamma Delta + sqrt(m)``; the decoded moment's noise matches the plan's claim;
the run's epsilon is the RDP composition of its ``1 + T`` recorded events and meets the
target; both methods learn; what cannot run is refused by name."""

from __future__ import annotations

import math

import numpy as np
import pytest
from dp_accounting import dp_event

from dpprecond import PrivacyBudgetExceededError
from dpprecond.accounting import PrivacyLedger, epsilon_of
from dpprecond.fl import FLConfig, run_federated
from dpprecond.fl.client import covariance_sensitivity, gram_inflation
from dpprecond.fl.data import ClientData
from dpprecond.fl.engine import plan_event
from dpprecond.fl.methods import make_method
from dpprecond.fl.methods.fedfc import FedFC
from dpprecond.fl.methods.fednew import FedNew
from dpprecond.fl.models import LinearSoftmax
from dpprecond.secagg import InsufficientNoiseError
from dpprecond.secagg.fl import (
    moment_parts,
    moment_plan,
    moment_sensitivity,
    round_event,
    secure_moment_sum,
    secure_multipliers,
    simulate_secure,
)
from dpprecond.secagg.sums import ROUNDING_INFLATION, round_shared
from tests.fl.conftest import secure_config

K = 6
BOUNDS = np.array([0, 7, 19, 20, 40])  # four clients, one of a single record
D_FEAT = 30


def _config(**kw: object) -> FLConfig:
    return secure_config(**{"n_rounds": 10, "target_epsilon": 4.0, **kw})  # type: ignore[arg-type]


def _run(digits: tuple[np.ndarray, ...], algorithm: str, seed: int = 3, **kw: object):
    X, y, Xt, yt = digits
    return run_federated(X, y, Xt, yt, 10, algorithm=algorithm, n_clients=K, seed=seed,
                         config=_config(**kw))


# -- the runs ----------------------------------------------------------------------------


@pytest.mark.parametrize("algorithm", ["fedfc", "fednew"])
def test_both_methods_learn_under_secure_aggregation(digits, algorithm: str) -> None:
    """Digits (10 classes, chance 0.1) at epsilon 4, T = 10, K = 6: well above chance,
    and a seeded run repeats bitwise."""
    res = _run(digits, algorithm)
    assert res.config["trust"] == "secure-aggregation" and res.config["method"] == algorithm
    assert res.final_accuracy >= 0.6
    np.testing.assert_array_equal(res.params, _run(digits, algorithm).params)
    assert not np.array_equal(res.params, _run(digits, algorithm, seed=4).params)
    setup = res.config["setup"]
    assert setup["wrap_probability"] <= 1e-12 and res.config["wrap_probability"] <= 1e-12
    assert setup["rounding_inflation"] <= ROUNDING_INFLATION


@pytest.mark.parametrize("algorithm", ["fedfc", "fednew"])
def test_the_epsilon_is_the_composition_of_the_setup_and_round_sums(digits,
                                                                    algorithm: str) -> None:
    """Events: the setup sum at ``z_cov`` first, then ``T`` sums at ``z_grad``, at the
    local schedule's ratio ``z_grad / z_cov = sqrt(s T / (1 - s))``; their RDP
    composition is the reported epsilon and the planned event's, and it meets the target
    to the calibration's tolerance."""
    T, s = 10, 0.2
    res = _run(digits, algorithm)
    z = res.config["noise_multipliers"]
    assert res.noise_multiplier == z["z_grad"]
    assert z["z_grad"] / z["z_cov"] == pytest.approx(math.sqrt(s * T / (1 - s)), rel=1e-12)
    assert res.events == [round_event(z["z_cov"])] + [round_event(z["z_grad"])] * T
    spent = epsilon_of(dp_event.ComposedDpEvent(list(res.events)), 1e-5, "rdp")
    assert res.epsilon == pytest.approx(spent, rel=1e-9)
    assert 4.0 * (1 - 1e-3) <= res.epsilon <= 4.0
    planned = plan_event(LinearSoftmax(64, 10), algorithm, _config())
    assert epsilon_of(planned, 1e-5, "rdp") == pytest.approx(spent, rel=1e-9)
    # an explicit noise_multiplier is the scale c, as under local trust
    explicit = secure_multipliers(make_method(algorithm),
                                  _config(target_epsilon=None, noise_multiplier=2.0))
    assert explicit == {"z_cov": 2.0 / math.sqrt(s), "z_grad": 2.0 * math.sqrt(T / (1 - s))}


def test_the_callers_ledger_is_checked_first_and_records_every_sum(digits) -> None:
    X, y, Xt, yt = digits
    tight = PrivacyLedger(1e-5, max_epsilon=3.0, accountant="rdp")
    with pytest.raises(PrivacyBudgetExceededError):
        run_federated(X, y, Xt, yt, 10, algorithm="fedfc", n_clients=K, seed=1,
                      config=_config(), ledger=tight)
    assert tight.events == []  # refused before the setup sum
    roomy = PrivacyLedger(1e-5, max_epsilon=10.0, accountant="rdp")
    res = run_federated(X, y, Xt, yt, 10, algorithm="fedfc", n_clients=K, seed=1,
                        config=_config(), ledger=roomy)
    assert len(roomy.events) == 11
    assert roomy.epsilon == pytest.approx(res.epsilon, rel=1e-9)


def test_local_step_methods_are_refused_and_flower_secagg_takes_covariance(digits) -> None:
    for name in ("fedavg", "scaffold", "fedprox"):
        with pytest.raises(ValueError, match=f"'{name}' with mechanism='full-batch' sends "
                                             "other releases.*local steps"):
            _run(digits, name)
    X, y, Xt, yt = digits
    data = ClientData(X, y, np.linspace(0, X.shape[0], K + 1).astype(np.int64), 10)
    with pytest.raises(ValueError, match="min_clients"):
        simulate_secure(LinearSoftmax(64, 10), data, "fedfc", _config(), X_test=Xt,
                        y_test=yt, seed=0, min_clients=0)
    with pytest.raises(ValueError, match="finite row_clip"):
        simulate_secure(LinearSoftmax(64, 10), data, make_method("fedfc", row_clip=math.inf),
                        _config(), X_test=Xt, y_test=yt, seed=0)
    pytest.importorskip("flwr")
    from dpprecond.adapters.flower.app import RunConfigError, check_run_config
    from dpprecond.adapters.flower.secagg import SecAggDPStrategy

    rc = {"target-epsilon": 1.0, "noise-multiplier": "", "trust": "secure-aggregation",
          "weighting": "size"}
    check_run_config({**rc, "algorithm": "fedgd"})
    for name in ("fedfc", "fednew"):  # the setup sum is SecAgg+'s round 1
        strategy = SecAggDPStrategy(LinearSoftmax(64, 10), name, _config(), K, X.shape[0])
        assert strategy.setup_rounds == 1 and strategy.setup_plan_ is not None
        check_run_config({**rc, "algorithm": name})
    for name in ("fedavg", "scaffold"):
        with pytest.raises(RunConfigError, match=f"'{name}'"):
            check_run_config({**rc, "algorithm": name})


# -- the setup sum -----------------------------------------------------------------------


def _neighbours(magnitude: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Data and a neighbour: record 10 (client 1) on a random axis, replaced by a record on
    another axis, both at ``magnitude`` (so both clip to ``C_x``, the constant feature
    shrinking to ``C_x / magnitude``: the sensitivity is nearly attained); for seed 0 the
    replacement is the all-``magnitude`` row instead."""
    rng = np.random.default_rng(seed)
    X = rng.uniform(-1.0, 1.0, (BOUNDS[-1], D_FEAT))
    a, b = rng.choice(D_FEAT, size=2, replace=False)
    X[10] = 0.0
    X[10, a] = magnitude
    X2 = X.copy()
    X2[10] = 0.0
    X2[10, b] = magnitude
    if seed == 0:
        X2[10] = magnitude
    return X, X2


def _maximal_uniforms(y1: np.ndarray, y2: np.ndarray) -> np.ndarray:
    """Uniforms under which every coordinate's rounded difference is ``ceil(|y2 - y1|)``
    (the coupling's worst case)."""
    lo, hi = np.minimum(y1, y2), np.maximum(y1, y2)
    f = lo - np.floor(lo)
    e = (hi - lo) - np.floor(hi - lo)
    return np.minimum(f + np.minimum(e, 1.0 - f) / 2, np.nextafter(1.0, 0.0))


@pytest.mark.parametrize("magnitude", [1e3, 1e8, 1e300])
def test_worst_case_neighbours_round_within_the_setup_sums_sensitivity(
        magnitude: float) -> None:
    """Replacing one record moves only its client's moment part, by at most ``Delta_cov =
    sqrt(2) C_x^2 gram_inflation(n)`` in L2 (and by nearly ``sqrt(2) C_x^2`` for two
    axes: the bound is tight); coupled by the same uniforms the rounded parts differ by an
    integer vector within ``D2 = gamma Delta_cov + sqrt(m)``, for 200 draws and for the
    uniforms that make every coordinate's difference maximal. At 1e300 the row clip takes
    its overflow-safe path."""
    c_x = math.sqrt(D_FEAT + 1)  # the default row clip
    data = ClientData(np.zeros((BOUNDS[-1], D_FEAT)), np.zeros(BOUNDS[-1], np.int64),
                      BOUNDS, 2)
    plan = moment_plan(FedFC(), data, 1.0, 4, max_client_rows=20)
    delta = moment_sensitivity(c_x, 20)
    # the default sizes the slack for clients of up to N rows (a SecAgg+ server's bound)
    assert moment_plan(FedFC(), data, 1.0, 4).sensitivity == moment_sensitivity(
        c_x, int(BOUNDS[-1]))
    assert plan.dim == (D_FEAT + 1) * (D_FEAT + 2) // 2 and plan.sensitivity == delta
    assert delta == covariance_sensitivity(c_x) * gram_inflation(20)
    for seed in range(4):
        X, X2 = _neighbours(magnitude, seed)
        with np.errstate(over="ignore"):
            p1, p2 = moment_parts(X, BOUNDS, c_x), moment_parts(X2, BOUNDS, c_x)
        assert np.all(np.isfinite(p1)) and np.all(np.isfinite(p2))
        np.testing.assert_array_equal(np.delete(p1, 1, axis=0), np.delete(p2, 1, axis=0))
        moved = float(np.linalg.norm(p1[1] - p2[1]))
        assert moved <= delta
        if seed:  # two axes: within a 1/magnitude^2 of the bound
            assert moved >= covariance_sensitivity(c_x) * (1 - 1e-5)
        y1, y2 = p1[1] * plan.scale, p2[1] * plan.scale
        rng = np.random.default_rng(seed)
        draws = [rng.random(plan.dim) for _ in range(200)] + [_maximal_uniforms(y1, y2)]
        worst = 0.0
        for u in draws:
            w = round_shared(y2, u) - round_shared(y1, u)
            worst = max(worst, float(np.linalg.norm(w)))
            assert float(np.abs(w).sum()) <= plan.l1_sensitivity
        bound = plan.scale * delta + math.sqrt(plan.dim)  # gamma Delta + sqrt(m)
        assert plan.scale * moved - math.sqrt(plan.dim) <= worst <= bound
        assert bound <= plan.l2_sensitivity <= bound * (1 + 1e-11)


@pytest.mark.parametrize("k_min", [4, 2])
def test_the_decoded_moments_noise_matches_the_plans_claim(k_min: int) -> None:
    """Decoded sum minus the exact sum of the parts, over the ``m = 861`` upper-triangle
    coordinates of 10 independent sums: its std is ``plan.noise_std(K) = z Delta_cov (1 +
    inflation) sqrt(K / k_min)`` (the sample std of ``n`` near-Gaussian draws has relative
    sd ``1 / sqrt(2 n)``: 5 of them; the rounding adds at most ``K / 4`` integer units of
    variance, below ``1e-9`` of the noise's), its mean 0 (5 standard errors), and the lower
    triangle mirrors the upper one exactly."""
    d = 40
    rng = np.random.default_rng(7)
    X = rng.uniform(-1.0, 1.0, (BOUNDS[-1], d))
    data = ClientData(X, np.zeros(BOUNDS[-1], np.int64), BOUNDS, 2)
    z = 0.8
    plan = moment_plan(FedFC(), data, z, k_min, max_client_rows=20)
    c_x = math.sqrt(d + 1)
    claim = plan.noise_std(4)
    assert claim == pytest.approx(z * moment_sensitivity(c_x, 12) * (1 + plan.inflation)
                                  * math.sqrt(4 / k_min), rel=1e-12)
    assert plan.inflation <= ROUNDING_INFLATION
    iu = np.triu_indices(d + 1)
    exact = moment_parts(X, BOUNDS, c_x).sum(axis=0)
    residuals = []
    for rep in range(10):
        rngs = [np.random.default_rng([rep, i]) for i in range(4)]
        S = secure_moment_sum(X, BOUNDS, c_x, plan, rngs)
        np.testing.assert_array_equal(S, S.T)
        residuals.append(S[iu] - exact)
    r = np.concatenate(residuals)
    n = r.size
    assert abs(r.std() / claim - 1) <= 5 / math.sqrt(2 * n)
    assert abs(r.mean()) <= 5 * claim / math.sqrt(n)


def test_a_setup_sum_missing_shares_is_not_released() -> None:
    X = np.random.default_rng(0).uniform(-1.0, 1.0, (BOUNDS[-1], D_FEAT))
    data = ClientData(X, np.zeros(BOUNDS[-1], np.int64), BOUNDS, 2)
    plan = moment_plan(FedNew(), data, 1.0, 3)
    rngs = [np.random.default_rng(i) for i in range(4)]
    c_x = math.sqrt(D_FEAT + 1)
    with pytest.raises(InsufficientNoiseError, match="min_clients=3"):
        secure_moment_sum(X, BOUNDS, c_x, plan, rngs, clients=[0, 2])
    assert secure_moment_sum(X, BOUNDS, c_x, plan, rngs, clients=[0, 1, 3]).shape == (
        D_FEAT + 1, D_FEAT + 1)


def test_fednew_on_the_aggregate_is_one_member_admm() -> None:
    """The server half of DP-FedNew given one setup row and one reply row: its dual stays
    0 and each step is ``y_t = (hessian_scale PSD(M) + (alpha + rho) I)^{-1} (G_t + rho
    y_{t-1})``, ``update = -lr y_t``."""
    from dpprecond.fl.methods import RunSpec

    rng = np.random.default_rng(1)
    d1, k = 5, 3
    A = rng.standard_normal((d1, d1))
    M = A @ A.T
    model = LinearSoftmax(d1 - 1, k)
    method = make_method("fednew", learning_rate=0.7, rho=1.3, alpha=0.1)
    spec = RunSpec(_config(), {"z_cov": 1.0, "z_grad": 1.0}, model, K)
    params = np.zeros(model.n_params)
    state = method.server_init(spec, params, {"moment": M[None]}, [0])
    w, V = np.linalg.eigh(M)
    S = (V / (0.5 * np.maximum(w, 0) + 0.1 + 1.3)) @ V.T
    y_prev = np.zeros((d1, k))
    for _ in range(3):
        G = rng.standard_normal(model.n_params)
        update, state = method.server_update(spec, {"message": G[None]}, [0],
                                             np.array([40]), state, params)
        y_prev = S @ (G.reshape(d1, k) + 1.3 * y_prev)
        np.testing.assert_allclose(update, -0.7 * y_prev.ravel(), rtol=1e-12, atol=1e-14)
        np.testing.assert_array_equal(state[1].duals, 0.0)


def test_pipeline_composes_the_pca_and_the_covariance_methods_sums(digits) -> None:
    """``run_pipeline(pca:8, fedfc, trust="secure-aggregation")``: the ledger's total is
    the RDP composition of the PCA's planned releases and the training's ``1 + T`` sums,
    and it meets the target."""
    from dpprecond.accounting import compose
    from dpprecond.pca.api import planned_event
    from dpprecond.pipeline import run_pipeline, split_noise

    X, y, Xt, yt = digits
    res = run_pipeline(X, y, Xt, yt, 10, features="pca:8", target_epsilon=2.0, row_norm=8.0,
                       trust="secure-aggregation", algorithm="fedfc", n_clients=K,
                       n_rounds=3, clip_norm=1.0, seed=2)
    assert res.fl.n_releases == 4 and res.fl.config["method"] == "fedfc"
    z_pca, _ = split_noise(2.0, 1e-5, 0.2)
    c = res.fl.config["noise_multiplier"]  # the training's scale, calibrated
    config = FLConfig(n_rounds=3, clip_norm=1.0, noise_multiplier=c, weighting="size",
                      trust="secure-aggregation")
    planned = compose([planned_event("auto", target_epsilon=None, noise_multiplier=z_pca,
                                     target_delta=1e-5, trust="secure-aggregation"),
                       plan_event(LinearSoftmax(8, 10), "fedfc", config)])
    assert res.epsilon == pytest.approx(epsilon_of(planned, 1e-5, "rdp"), rel=1e-9)
    assert 2.0 * (1 - 1e-3) <= res.epsilon <= 2.0
