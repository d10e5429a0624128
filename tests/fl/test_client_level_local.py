"""Client-level DP-FedAvg and DP-FedProx (``mechanism="client-level"``).

The privacy unit is one client (replace-one). Pinned here: the part's sensitivity on
worst-case neighbouring clients with the proximal term (also at extreme magnitudes), the
run's events (one ``Gaussian(z)`` per round, not one per local step), DP-FedAvg's
client-level form against ``fedgd``'s (the same releases), FedProx at ``mu = 0`` against
DP-FedAvg, the secure-aggregation run against its own sums, checkpoints, and the
refusals that name the setting (client-level SCAFFOLD, the config's ``local_steps``).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from dp_accounting import dp_event

from dpprecond.accounting import epsilon_of
from dpprecond.fl import FLConfig
from dpprecond.fl.client import client_level_updates, local_deltas, round_generators
from dpprecond.fl.data import ClientData
from dpprecond.fl.engine import simulate
from dpprecond.fl.methods import make_method
from dpprecond.fl.models import LinearSoftmax
from dpprecond.fl.tasks import LocalStepsTask, task_from_config
from dpprecond.secagg.fl import (
    local_work,
    round_event,
    secure_gradient_sum,
    secure_plan,
    simulate_secure,
)

# random labels at few rounds: the test loss may climb; the runs are checked exactly
pytestmark = pytest.mark.filterwarnings("ignore::dpprecond.fl.divergence.DivergenceWarning")

BOUNDS = np.array([0, 7, 19, 20, 40])  # four clients, one of a single record
D_FEAT, N_CLASSES, C = 30, 5, 0.5
L, ETA, MU = 3, 0.2, 0.5


def _data(seed: int = 0, n: int = 40) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, D_FEAT)), rng.integers(0, N_CLASSES, n)


def _client_data(seed: int = 0) -> ClientData:
    X, y = _data(seed)
    return ClientData(X, y, BOUNDS, N_CLASSES)


def _config(**kw: object) -> FLConfig:
    base: dict[str, object] = dict(n_rounds=4, clip_norm=C, target_epsilon=2.0,
                                   mechanism="client-level")
    base.update(kw)
    return FLConfig(**base)  # type: ignore[arg-type]


def _fedprox(mu: float = MU):  # type: ignore[no-untyped-def]
    return make_method("fedprox", local_steps=L, local_lr=ETA, mu=mu)


@pytest.mark.parametrize("mu", [MU, 1e8, 1e300])
@pytest.mark.parametrize("magnitude", [1.0, 1e8, 1e300])
def test_a_replaced_client_moves_only_its_proximal_part_by_at_most_2c(
        magnitude: float, mu: float) -> None:
    """Client 1's records replaced by their negations at ``magnitude``, FedProx's local
    steps (``mu`` from 0.5 to 1e300) from a nonzero model: only its part moves, by at most
    ``2C`` as computed, every part is finite with norm at most ``C``, and no warning is
    raised (an overflow counts as a zero update, a function of that client's data)."""
    X, y = _data()
    X2 = X.copy()
    X[7:19] *= magnitude / np.linalg.norm(X[7:19], axis=1, keepdims=True)
    X2[7:19] = -X[7:19]
    model = LinearSoftmax(D_FEAT, N_CLASSES)
    params = np.random.default_rng(1).standard_normal(model.n_params)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        P = client_level_updates(model, params, X, y, BOUNDS, C, local_steps=L,
                                 local_lr=ETA, proximal_mu=mu)
        Q = client_level_updates(model, params, X2, y, BOUNDS, C, local_steps=L,
                                 local_lr=ETA, proximal_mu=mu)
    assert np.isfinite(P).all() and np.isfinite(Q).all()
    assert np.all(np.linalg.norm(P, axis=1) <= C) and np.all(np.linalg.norm(Q, axis=1) <= C)
    assert np.array_equal(P[[0, 2, 3]], Q[[0, 2, 3]])
    assert float(np.linalg.norm(P[1] - Q[1])) <= 2 * C
    if magnitude == 1e8 and mu == MU:  # a clipped update in both: a large move, not zero
        assert float(np.linalg.norm(P[1] - Q[1])) > C


def test_the_proximal_term_is_the_gradient_of_mu_half_the_squared_distance() -> None:
    """One client, one local step from ``theta``: the proximal gradient is zero at the
    start, so the first step is DP-FedAvg's; the second step's difference from DP-FedAvg's
    is ``-eta mu (y_1 - theta)`` exactly as the definition states."""
    X, y = _data()
    model = LinearSoftmax(D_FEAT, N_CLASSES)
    theta = np.random.default_rng(2).standard_normal(model.n_params)
    b = np.array([0, 40])
    one_avg = local_deltas(model, theta, X, y, b, np.inf, local_steps=1, local_lr=ETA)
    one_prox = local_deltas(model, theta, X, y, b, np.inf, local_steps=1, local_lr=ETA,
                            proximal_mu=MU)
    assert np.array_equal(one_avg, one_prox)
    y1 = theta + one_avg[0]
    step2_avg = local_deltas(model, y1, X, y, b, np.inf, local_steps=1, local_lr=ETA)[0]
    two_prox = local_deltas(model, theta, X, y, b, np.inf, local_steps=2, local_lr=ETA,
                            proximal_mu=MU)[0]
    expected = one_avg[0] + step2_avg - ETA * MU * (y1 - theta)
    np.testing.assert_allclose(two_prox, expected, rtol=0, atol=1e-12)


def test_client_level_fedavg_releases_what_client_level_fedgd_releases() -> None:
    """``fedavg`` at client level with ``L`` local steps at ``eta`` is ``fedgd`` at client
    level with ``local_steps = L``, ``local_lr = eta`` and server step ``L eta``: the same
    seeded run (the same aggregator noise stream), the same events and epsilon, and the
    same model up to the order of one product."""
    Xt, yt = _data(5, 30)
    data, model = _client_data(), LinearSoftmax(D_FEAT, N_CLASSES)
    avg = simulate(model, data, make_method("fedavg", local_steps=L, local_lr=ETA),
                   _config(), X_test=Xt, y_test=yt, seed=3)
    gd = simulate(model, data, make_method("fedgd", learning_rate=L * ETA),
                  _config(local_steps=L, local_lr=ETA), X_test=Xt, y_test=yt, seed=3)
    np.testing.assert_allclose(avg.params, gd.params, rtol=1e-12, atol=1e-13)
    assert avg.events == gd.events and avg.epsilon == gd.epsilon
    assert avg.events == [dp_event.GaussianDpEvent(avg.noise_multiplier)] * 4
    assert avg.epsilon == pytest.approx(
        epsilon_of(dp_event.SelfComposedDpEvent(avg.events[0], 4), 1e-5), rel=1e-9)
    assert avg.epsilon <= 2.0 + 1e-9


def test_fedprox_at_mu_zero_is_fedavg_bit_for_bit_and_mu_changes_the_model() -> None:
    Xt, yt = _data(5, 30)
    data, model = _client_data(), LinearSoftmax(D_FEAT, N_CLASSES)
    avg = simulate(model, data, make_method("fedavg", local_steps=L, local_lr=ETA),
                   _config(), X_test=Xt, y_test=yt, seed=4)
    prox0 = simulate(model, data, _fedprox(0.0), _config(), X_test=Xt, y_test=yt, seed=4)
    prox = simulate(model, data, _fedprox(), _config(), X_test=Xt, y_test=yt, seed=4)
    assert np.array_equal(avg.params, prox0.params)
    assert not np.array_equal(avg.params, prox.params)
    assert prox.events == avg.events  # the proximal term is local: no extra release


def test_the_aggregate_is_the_clipped_sum_plus_the_aggregators_noise() -> None:
    """The trusted aggregator's release of a client-level FedProx round: the noiseless
    task gives the exact mean of the clipped updates; the noisy one differs from it by
    ``N(0, (2 z C)^2) / K`` per coordinate (checked within 5 standard errors of its std
    over the parameters, and its mean within 5 standard errors of 0)."""
    X, y = _data()
    model = LinearSoftmax(D_FEAT, N_CLASSES)
    params = np.random.default_rng(6).standard_normal(model.n_params)
    z, K = 3.0, 4
    D = client_level_updates(model, params, X, y, BOUNDS, C, local_steps=L, local_lr=ETA,
                             proximal_mu=MU)
    task0 = LocalStepsTask(C, 0.0, local_steps=L, local_lr=ETA, proximal_mu=MU,
                           mechanism="client-level").validated()
    rngs = [np.random.default_rng(s) for s in range(K + 1)]
    exact = task0.release(model, params, X, y, BOUNDS, rngs).arrays["aggregate"][0]
    np.testing.assert_allclose(exact, D.sum(axis=0) / K, rtol=0, atol=1e-15)
    task = LocalStepsTask(C, z, local_steps=L, local_lr=ETA, proximal_mu=MU,
                          mechanism="client-level").validated()
    noisy = task.release(model, params, X, y, BOUNDS, rngs).arrays["aggregate"][0]
    e = (noisy - exact) * K
    sigma, p = 2 * z * C, model.n_params
    assert abs(e.mean()) < 5 * sigma / np.sqrt(p)
    assert abs(e.std() - sigma) < 5 * sigma / np.sqrt(2 * p)
    assert task.server_streams == 1 and task0.reply_shapes(p) == {"aggregate": (p,)}
    assert task_from_config(task.to_config()) == task


def test_a_secure_client_level_fedprox_run_is_its_own_secure_sums() -> None:
    """A seeded secure-aggregation run of client-level FedProx, one round: the model is
    the initial one plus the server step on the decoded sum of the clients' FedProx
    parts (:func:`secure_gradient_sum` with :func:`local_work`), with the events of the
    secure sums; and at tiny noise it ends near the trusted aggregator's run."""
    Xt, yt = _data(5, 30)
    data, model = _client_data(), LinearSoftmax(D_FEAT, N_CLASSES)
    method = _fedprox()
    config = _config(n_rounds=1, trust="secure-aggregation")
    res = simulate_secure(model, data, method, config, X_test=Xt, y_test=yt, seed=7)
    work = local_work(method, config.validated())
    assert work == {"local_steps": L, "local_lr": ETA, "proximal_mu": MU}
    init_seq, noise_root, _ = np.random.SeedSequence(7).spawn(3)
    params0 = model.init_params(np.random.default_rng(init_seq))
    plan = secure_plan(model, config.validated(), data, res.noise_multiplier, 4)
    G = secure_gradient_sum(model, params0, data.X, data.y, BOUNDS, C, plan,
                            round_generators(noise_root, 0, 4), client_level=True,
                            **work) / 4
    assert np.array_equal(res.params, params0 - L * ETA * G)
    assert res.events == [round_event(res.noise_multiplier)]
    assert res.config["trust"] == "secure-aggregation" and res.config["mu"] == MU

    quiet = dict(target_epsilon=None, noise_multiplier=1e-6, n_rounds=3)
    sec = simulate_secure(model, data, method, _config(trust="secure-aggregation", **quiet),
                          X_test=Xt, y_test=yt, seed=8)
    loc = simulate(model, data, method, _config(**quiet), X_test=Xt, y_test=yt, seed=8)
    # the same init (root.spawn(3)[0]); the sums differ by the rounding (at most
    # sqrt(p) / gamma per coordinate of the sum) and the tiny noise
    np.testing.assert_allclose(sec.params, loc.params, rtol=0, atol=1e-3)


def test_a_secure_client_level_fedavg_checkpoint_resumes_to_the_same_model(tmp_path) -> None:
    Xt, yt = _data(5, 30)
    data, model = _client_data(), LinearSoftmax(D_FEAT, N_CLASSES)
    method = make_method("fedavg", local_steps=L, local_lr=ETA)
    config = _config(trust="secure-aggregation")
    whole = simulate_secure(model, data, method, config, X_test=Xt, y_test=yt, seed=9)
    path = tmp_path / "run.ckpt"

    def stop_after_two(record: dict[str, float]) -> None:
        if record["round"] == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        simulate_secure(model, data, method, config, X_test=Xt, y_test=yt, seed=9,
                        checkpoint=path, checkpoint_every=1, callback=stop_after_two)
    assert path.exists()
    resumed = simulate_secure(model, data, method, config, X_test=Xt, y_test=yt, seed=9,
                              checkpoint=path, checkpoint_every=1)
    assert np.array_equal(resumed.params, whole.params)
    assert resumed.events == whole.events


def test_what_has_no_client_level_form_is_refused_by_name() -> None:
    Xt, yt = _data(5, 30)
    data, model = _client_data(), LinearSoftmax(D_FEAT, N_CLASSES)
    for trust in ("local", "secure-aggregation"):
        with pytest.raises(ValueError, match="scaffold has no client-level form"):
            fn = simulate if trust == "local" else simulate_secure
            fn(model, data, make_method("scaffold"), _config(trust=trust), X_test=Xt,
               y_test=yt, seed=0)
        with pytest.raises(ValueError, match=r"config\.local_steps=2.*make_method\('fedavg', "
                                             r"local_steps=2\)"):
            fn = simulate if trust == "local" else simulate_secure
            fn(model, data, make_method("fedavg"), _config(trust=trust, local_steps=2),
               X_test=Xt, y_test=yt, seed=0)
        for mechanism in ("client-level", "full-batch"):  # never silently ignored
            extra = {} if mechanism == "client-level" else {"weighting": "size"}
            with pytest.raises(ValueError, match=r"config\.local_lr=0\.7.*make_method\("
                                                 r"'fedprox', local_lr=0\.7\)"):
                simulate(model, data, make_method("fedprox"),  # full-batch: record-level,
                         _config(trust=trust if mechanism == "client-level" else "local",
                                 local_lr=0.7, mechanism=mechanism, **extra),
                         X_test=Xt, y_test=yt, seed=0)  # which secure aggregation refuses
    with pytest.raises(ValueError, match="control_variates has no client-level form"):
        LocalStepsTask(C, 1.0, control_variates=True, mechanism="client-level").validated()
    with pytest.raises(ValueError, match="mechanism"):
        LocalStepsTask(C, 1.0, mechanism="poisson").validated()
    with pytest.raises(ValueError, match=r"mechanism=.full-batch., record-level.*.poisson."):
        simulate(model, data, make_method("fedavg"),
                 _config(mechanism="poisson", sampling_rate=0.5, weighting="size"),
                 X_test=Xt, y_test=yt, seed=0)


def test_step_sizes_whose_product_overflows_are_refused_by_name() -> None:
    """The client-level server step is ``global_lr * L * local_lr``: a product that
    overflows would make the model non-finite, so it is refused when the method is built."""
    with pytest.raises(ValueError, match=r"global_lr \* local_steps \* local_lr overflows"):
        make_method("fedprox", local_steps=3, local_lr=1e308)
    with pytest.raises(ValueError, match="overflows"):
        make_method("fedavg", global_lr=1e200, local_lr=1e200)
    make_method("fedavg", local_lr=1e300)  # finite: allowed (the user's choice)
