"""Adaptive clipping: the combined budget, the count's sensitivity, convergence, refusals."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from dp_accounting import dp_event

from dpprecond.accounting import compose, epsilon_of, gaussian_precision
from dpprecond.fl import (
    ClientData,
    FLConfig,
    LinearSoftmax,
    make_method,
    run_federated,
    simulate,
)
from dpprecond.fl.adaptive_clip import (
    AdaptiveClip,
    count_fraction,
    count_root,
    count_sensitivity,
    geometric_update,
    noisy_fraction,
    record_counts,
    split_multipliers,
)
from dpprecond.fl.client import round_generators, stream
from dpprecond.fl.engine import plan_event
from dpprecond.fl.partition import iid_partition
from dpprecond.fl.tasks import RecordCountTask
from tests.fl.conftest import make_problem
from tests.gdp import gaussian_gdp_epsilon

T = 6


def _run(problem: tuple, algorithm: str = "fedgd", adaptive: AdaptiveClip | None = None,
         **config: object) -> object:
    X, y, Xt, yt = problem
    cfg = FLConfig(n_rounds=T, clip_norm=2.0, adaptive_clip=adaptive, **config)  # type: ignore[arg-type]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return run_federated(X, y, Xt, yt, 3, algorithm=algorithm, n_clients=4, config=cfg,
                             seed=3)


@pytest.mark.parametrize("algorithm", ["fedgd", "sofim-lagged", "fedavg", "fedfc"])
@pytest.mark.parametrize("accountant", ["pld", "rdp"])
def test_the_combined_run_spends_exactly_the_target(problem: tuple, algorithm: str,
                                                    accountant: str) -> None:
    plain = _run(problem, algorithm, target_epsilon=2.0, accountant=accountant)
    adaptive = _run(problem, algorithm, AdaptiveClip(count_share=0.2), target_epsilon=2.0,
                    accountant=accountant)
    assert adaptive.epsilon == pytest.approx(plain.epsilon, rel=1e-9)  # type: ignore[attr-defined]
    # every round released one count on top of the method's own releases
    counts = [e for e in adaptive.events if e not in plain.events]  # type: ignore[attr-defined]
    assert len(adaptive.events) == len(plain.events) + T  # type: ignore[attr-defined]
    assert len(counts) >= 1
    # the total Gaussian precision is the plain run's
    p_plain = gaussian_precision(compose(plain.events))  # type: ignore[attr-defined]
    p_adapt = gaussian_precision(compose(adaptive.events))  # type: ignore[attr-defined]
    assert p_adapt == pytest.approx(p_plain, rel=1e-12)


def test_the_split_is_the_papers_formula_for_one_release_per_round(problem: tuple) -> None:
    s = 0.1
    plain = _run(problem, target_epsilon=1.0)
    adaptive = _run(problem, adaptive=AdaptiveClip(count_share=s), target_epsilon=1.0)
    z = plain.noise_multiplier  # type: ignore[attr-defined]
    z_u = adaptive.noise_multiplier  # type: ignore[attr-defined]
    z_b = adaptive.config["count_noise_multiplier"]  # type: ignore[attr-defined]
    assert z_u == pytest.approx(z / math.sqrt(1 - s), rel=1e-12)
    assert z_b == pytest.approx(z / math.sqrt(s), rel=1e-12)
    # the paper: z_Delta = (z^-2 - z_b^-2)^(-1/2)
    assert z_u == pytest.approx((z**-2 - z_b**-2) ** -0.5, rel=1e-12)
    kinds = sorted({e.noise_multiplier for e in adaptive.events})  # type: ignore[attr-defined]
    assert kinds == pytest.approx(sorted([z_u, z_b]))
    # and the closed form: T rounds of (z_u, z_b) are sqrt(T)/z-GDP
    expected = gaussian_gdp_epsilon(math.sqrt(T) / z, 1e-5)
    assert epsilon_of(adaptive.events, 1e-5, "pld") == pytest.approx(expected, rel=1e-6)  # type: ignore[attr-defined]


def test_plan_event_matches_what_the_run_charges(problem: tuple) -> None:
    cfg = FLConfig(n_rounds=T, clip_norm=2.0, target_epsilon=1.0, adaptive_clip=AdaptiveClip())
    planned = plan_event(LinearSoftmax(6, 3), "fedgd", cfg)
    run = _run(problem, adaptive=AdaptiveClip(), target_epsilon=1.0)
    assert epsilon_of(planned, 1e-5, "pld") == pytest.approx(run.epsilon, rel=1e-9)  # type: ignore[attr-defined]


def test_split_multipliers_keeps_the_precision() -> None:
    raised, z_b = split_multipliers({"z_cov": 2.0, "z_grad": 5.0}, 1 / 4 + 10 / 25, 10, 0.3)
    assert raised == pytest.approx({"z_cov": 2.0 / math.sqrt(0.7), "z_grad": 5.0 / math.sqrt(0.7)})
    total = 1 / raised["z_cov"] ** 2 + 10 / raised["z_grad"] ** 2 + 10 / z_b**2
    assert total == pytest.approx(1 / 4 + 10 / 25, rel=1e-12)
    assert split_multipliers({"z": 0.0}, math.inf, 10, 0.3) == ({"z": 0.0}, 0.0)


def _neighbours(seed: int) -> tuple[ClientData, ClientData, np.ndarray]:
    X, y, _, _ = make_problem(n=80, seed=seed)
    parts = iid_partition(len(y), 4, seed)
    a = ClientData.from_partition(X, y, parts, 3)
    X2, y2 = a.X.copy(), a.y.copy()
    return a, ClientData(X2, y2, a.bounds, 3), X2


def test_the_count_has_sensitivity_one_per_client_at_worst_case_neighbours() -> None:
    assert count_sensitivity() == 1.0
    model = LinearSoftmax(6, 3)
    params = np.zeros(model.n_params)
    a, b, X2 = _neighbours(0)
    norms = model.per_example_grad_norms(params, a.X, a.y)
    clip = float(np.median(norms))
    j = int(np.flatnonzero(norms <= clip)[0])  # a record inside the clip
    X2[j] *= 1e3  # replaced by one far outside it: the worst case
    ca = record_counts(model, params, a.X, a.y, a.bounds, clip)
    cb = record_counts(model, params, b.X, b.y, b.bounds, clip)
    diff = ca - cb
    owner = int(np.searchsorted(a.bounds, j, side="right") - 1)
    assert diff[owner] == 1.0
    assert np.count_nonzero(diff) == 1
    # no replacement of one record moves any count by more than 1
    rng = np.random.default_rng(1)
    for _ in range(200):
        a, b, X2 = _neighbours(int(rng.integers(100)))
        j = int(rng.integers(len(X2)))
        X2[j] = rng.standard_normal(X2.shape[1]) * rng.choice([0.0, 1.0, 100.0])
        b.y[j] = rng.integers(3)
        params = rng.standard_normal(model.n_params)
        clip = float(rng.uniform(0.1, 5.0))
        d = record_counts(model, params, a.X, a.y, a.bounds, clip) - \
            record_counts(model, params, b.X, b.y, b.bounds, clip)
        assert np.abs(d).sum() <= 1.0


def test_the_geometric_update_converges_to_the_target_quantile_without_noise() -> None:
    norms = np.random.default_rng(0).lognormal(0.0, 1.0, 5000)
    for gamma in (0.1, 0.5, 0.9):
        clip = 100.0
        for _ in range(400):
            clip = geometric_update(clip, float(np.mean(norms <= clip)), gamma, 0.2)
        assert np.mean(norms <= clip) == pytest.approx(gamma, abs=0.01)


def test_the_update_stays_within_its_bounds() -> None:
    from dpprecond.fl.config import MAX_CLIP_NORM

    assert geometric_update(1e99, 0.0, 0.99, 1e6) == MAX_CLIP_NORM
    assert geometric_update(5.0, 0.0, 0.9, 1.0, upper=6.0) == 6.0
    assert geometric_update(1e-300, 1.0, 0.01, 1e6) == np.finfo(np.float64).tiny


def test_a_noiseless_run_moves_the_clip_to_the_quantile_of_its_norms(problem: tuple) -> None:
    X, y, Xt, yt = problem
    gamma = 0.3
    cfg = FLConfig(n_rounds=60, clip_norm=50.0, noise_multiplier=0.0,
                   adaptive_clip=AdaptiveClip(target_quantile=gamma, learning_rate=0.3))
    data = ClientData.from_partition(X, y, iid_partition(len(y), 4, 1), 3)
    model = LinearSoftmax(6, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # a negligible step keeps the parameters (hence the norms) fixed
        res = simulate(model, data, make_method("fedgd", 1e-12), cfg, X_test=Xt, y_test=yt,
                       seed=0)
    clips = res.config["clip_norms"]
    assert len(clips) == 60 and clips[0] == 50.0
    norms = model.per_example_grad_norms(res.params, data.X, data.y)
    assert np.mean(norms <= clips[-1]) == pytest.approx(gamma, abs=0.05)


def test_adaptive_clipping_resumes_from_a_checkpoint(problem: tuple, tmp_path) -> None:
    X, y, Xt, yt = problem
    data = ClientData.from_partition(X, y, iid_partition(len(y), 4, 1), 3)
    cfg = FLConfig(n_rounds=8, clip_norm=2.0, target_epsilon=2.0, adaptive_clip=AdaptiveClip())
    model = LinearSoftmax(6, 3)
    full = simulate(model, data, "fedgd", cfg, X_test=Xt, y_test=yt, seed=5)
    ck = tmp_path / "ck.npz"

    def crash(record: dict) -> None:
        if record["round"] == 5:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        simulate(model, data, "fedgd", cfg, X_test=Xt, y_test=yt, seed=5, checkpoint=ck,
                 checkpoint_every=4, callback=crash)
    resumed = simulate(model, data, "fedgd", cfg, X_test=Xt, y_test=yt, seed=5,
                       checkpoint=ck, checkpoint_every=4)
    np.testing.assert_array_equal(resumed.params, full.params)
    assert resumed.epsilon == full.epsilon
    assert resumed.events == full.events
    # the clip history travels in the checkpointed state
    assert resumed.config["clip_norms"] == full.config["clip_norms"]
    assert len(full.config["clip_norms"]) == 8


def test_secure_mode_runs_with_adaptive_clipping(problem: tuple) -> None:
    X, y, Xt, yt = problem
    cfg = FLConfig(n_rounds=3, clip_norm=2.0, target_epsilon=2.0, adaptive_clip=AdaptiveClip())
    res = run_federated(X, y, Xt, yt, 3, algorithm="fedgd", n_clients=4, config=cfg,
                        secure=True)
    assert len(res.config["clip_norms"]) == 3
    assert all(isinstance(e, dp_event.GaussianDpEvent) for e in res.events)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"mechanism": "poisson", "sampling_rate": 0.5}, "full-batch"),
    ({"mechanism": "client-level"}, "full-batch"),
])
def test_mechanisms_other_than_full_batch_are_refused(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        FLConfig(target_epsilon=1.0, adaptive_clip=AdaptiveClip(), **kwargs).validated()


@pytest.mark.parametrize(("kwargs", "name"), [
    ({"target_quantile": 1.0}, "target_quantile"), ({"target_quantile": 0.0}, "target_quantile"),
    ({"learning_rate": -1.0}, "learning_rate"), ({"initial_clip": 0.0}, "initial_clip"),
    ({"count_share": 1.0}, "count_share"), ({"count_share": 0.0}, "count_share"),
])
def test_bad_settings_are_refused_by_name(kwargs: dict, name: str) -> None:
    with pytest.raises(ValueError, match=name):
        FLConfig(target_epsilon=1.0, adaptive_clip=AdaptiveClip(**kwargs)).validated()


def test_a_wrong_type_is_refused() -> None:
    with pytest.raises(TypeError, match="adaptive_clip"):
        FLConfig(target_epsilon=1.0, adaptive_clip=0.5).validated()  # type: ignore[arg-type]


def test_noise_aware_sofim_is_refused(problem: tuple) -> None:
    with pytest.raises(ValueError, match="noise_aware"):
        X, y, Xt, yt = problem
        run_federated(X, y, Xt, yt, 3, algorithm="sofim-lagged", n_clients=4,
                      method_options={"noise_aware": True}, seed=0,
                      config=FLConfig(n_rounds=2, target_epsilon=1.0,
                                      adaptive_clip=AdaptiveClip()))


def test_the_initial_clip_overrides_clip_norm(problem: tuple) -> None:
    res = _run(problem, adaptive=AdaptiveClip(initial_clip=0.7), target_epsilon=1.0)
    assert res.config["clip_norms"][0] == 0.7  # type: ignore[attr-defined]


def test_the_count_task_is_the_engines_count(problem: tuple) -> None:
    """The count's client half (a task, what a Flower client runs on its own records) and
    server half give the engine's fraction: the same draws from the same streams."""
    X, y, _, _ = problem
    data = ClientData.from_partition(X, y, iid_partition(len(y), 4, 2), 3)
    model = LinearSoftmax(6, 3)
    params = np.random.default_rng(0).standard_normal(model.n_params)
    root = np.random.SeedSequence(9, spawn_key=(0, 1))
    task = RecordCountTask(1.3, 2.5).validated()
    together = task.release(model, params, data.X, data.y, data.bounds,
                            round_generators(count_root(root), 4, 4)).arrays
    sizes = np.diff(data.bounds)
    alone = [task.release(model, params, data.X[lo:hi], data.y[lo:hi],
                          np.array([0, hi - lo]), [stream(count_root(root), 4, i)]
                          ).arrays["count"][0]
             for i, (lo, hi) in enumerate(zip(data.bounds[:-1], data.bounds[1:], strict=True))]
    np.testing.assert_array_equal(np.stack(alone), together["count"])
    counts = record_counts(model, params, data.X, data.y, data.bounds, 1.3)
    expected = noisy_fraction(counts, len(y), 2.5, round_generators(count_root(root), 4, 4))
    assert count_fraction(together, sizes) == expected
    assert abs(expected - counts.sum() / len(y)) > 1e-4  # the noise is there
    assert count_fraction({"count": counts[:, None]}, sizes) == counts.sum() / len(y)


def test_the_flower_adapter_runs_adaptive_clipping() -> None:
    pytest.importorskip("flwr")
    from dpprecond.adapters.flower.server_side import ServerSide

    cfg = FLConfig(n_rounds=2, target_epsilon=1.0, adaptive_clip=AdaptiveClip())
    server = ServerSide("fedgd", LinearSoftmax(6, 3), cfg, 4)
    server.init(np.zeros(21))
    request = server.round_request(1, 0)
    assert isinstance(request.count_task, RecordCountTask)
    assert request.count_task.clip_norm == request.task.clip_norm == cfg.clip_norm


def test_float32_precision_runs_with_adaptive_clipping(problem: tuple) -> None:
    plain = _run(problem, adaptive=AdaptiveClip(), target_epsilon=1.0)
    single = _run(problem, adaptive=AdaptiveClip(), target_epsilon=1.0, precision="float32")
    assert single.epsilon == pytest.approx(plain.epsilon, rel=1e-9)  # type: ignore[attr-defined]
    assert len(single.config["clip_norms"]) == T  # type: ignore[attr-defined]


def test_per_example_norms_are_exact_and_overflow_safe() -> None:
    """The counts' norms equal the per-example gradients' norms on ordinary records, and
    extreme records give no warning: a norm beyond float64 is inf (outside every clip)."""
    from dpprecond.fl.models import LinearSoftmax

    model = LinearSoftmax(6, 3)
    rng = np.random.default_rng(4)
    params = rng.standard_normal(model.n_params)
    X = rng.standard_normal((50, 6))
    y = rng.integers(0, 3, 50)
    expected = np.linalg.norm(model.per_example_grads(params, X, y), axis=1)
    np.testing.assert_allclose(model.per_example_grad_norms(params, X, y), expected,
                               rtol=1e-12)
    X[3] = 1e300
    X[4] = 1e-300
    X[5, 0] = -1e200
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        norms = model.per_example_grad_norms(params, X, y)
    assert not np.isnan(norms).any()
    assert norms[3] > 1e300 and np.isfinite(norms[4]) and norms[5] > 1e199
    np.testing.assert_allclose(norms[6:], expected[6:], rtol=1e-12)


def _count_data(seed: int = 5) -> tuple[LinearSoftmax, np.ndarray, ClientData]:
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((400, 6))
    y = rng.integers(0, 3, 400)
    X[[7, 150, 399]] = [[1e300] * 6, [-1e200] + [0.0] * 5, [1e155] * 6]  # the safe path
    data = ClientData.from_partition(X, y, iid_partition(400, 5, 1), 3)
    model = LinearSoftmax(6, 3)
    return model, rng.standard_normal(model.n_params), data


@pytest.mark.parametrize("clip", [0.3, 1.3, 4.0, 1e-200, 1e250])
def test_the_pass_counts_exactly_the_count_task(clip: float) -> None:
    """The counts of the gradient pass equal record_counts (the per-example norms of the
    overflow-safe path) at every clip, hard records included, and the sums are the
    plain pass's, bit for bit."""
    model, params, data = _count_data()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sums, counts = model.clipped_grad_sums_and_counts(params, data.X, data.y,
                                                          data.bounds, clip)
    expected = record_counts(model, params, data.X, data.y, data.bounds, clip)
    np.testing.assert_array_equal(counts, expected)
    assert 0 < expected.sum() < 400 or clip in (1e-200, 1e250)
    np.testing.assert_array_equal(
        sums, model.clipped_grad_sums(params, data.X, data.y, data.bounds, clip))


def test_the_pass_counts_with_per_client_parameters_and_float32() -> None:
    model, params, data = _count_data(6)
    K = data.n_clients
    P = params + 0.3 * np.random.default_rng(1).standard_normal((K, model.n_params))
    _, counts = model.clipped_grad_sums_and_counts(P, data.X, data.y, data.bounds, 1.1)
    for i in range(K):
        lo, hi = data.bounds[i], data.bounds[i + 1]
        want = record_counts(model, P[i], data.X[lo:hi], data.y[lo:hi],
                             np.array([0, hi - lo]), 1.1)
        assert counts[i] == want[0]
    # float32-representable extremes (the float64 ones scaled down): rows of 1e30 take the
    # float32 kernel's safe path (norm beyond 2^100 / sqrt(k)), rows of 1e19 do not
    X32 = np.where(np.abs(data.X) > 1e190, np.sign(data.X) * 1e30,
                   np.where(np.abs(data.X) > 1e100, np.sign(data.X) * 1e19, data.X))
    X32 = X32.astype(np.float32)
    _, c32 = model.clipped_grad_sums_and_counts(params, X32, data.y, data.bounds, 1.1)
    want = record_counts(model, params, X32.astype(np.float64), data.y, data.bounds, 1.1)
    # float32 rows: the norms of the float32 values; an indicator can flip only for a
    # norm within float32 rounding of the clip (none here)
    np.testing.assert_array_equal(c32, want)


def test_the_engine_counts_inside_the_gradient_pass(problem: tuple, monkeypatch) -> None:
    """With adaptive clipping a linear head's round reads its rows once: the separate
    count (per_example_grad_norms) is never called, and the run equals a run whose
    counts come from the count task itself (bit for bit: same statistic, same streams)."""
    fused = _run(problem, adaptive=AdaptiveClip(), target_epsilon=1.0)
    monkeypatch.setattr(LinearSoftmax, "counts_in_pass", False)
    separate = _run(problem, adaptive=AdaptiveClip(), target_epsilon=1.0)
    monkeypatch.undo()
    np.testing.assert_array_equal(fused.params, separate.params)  # type: ignore[attr-defined]
    assert fused.config["clip_norms"] == separate.config["clip_norms"]  # type: ignore[attr-defined]

    def no_second_pass(*args: object, **kwargs: object) -> None:
        raise AssertionError("the count read the rows a second time")

    monkeypatch.setattr(LinearSoftmax, "per_example_grad_norms", no_second_pass)
    again = _run(problem, adaptive=AdaptiveClip(), target_epsilon=1.0)
    np.testing.assert_array_equal(again.params, fused.params)  # type: ignore[attr-defined]


def test_release_round_runs_a_local_step_task_and_its_count_apart(problem: tuple) -> None:
    from dpprecond.fl.tasks import LocalStepsTask, release_round

    X, y, _, _ = problem
    data = ClientData.from_partition(X, y, iid_partition(len(y), 4, 2), 3)
    model = LinearSoftmax(6, 3)
    params = np.random.default_rng(0).standard_normal(model.n_params)
    task = LocalStepsTask(1.3, 0.8, local_steps=2).validated()
    count = RecordCountTask(1.3, 2.5).validated()
    root = np.random.SeedSequence(4)
    out = release_round(task, count, model, params, data.X, data.y, data.bounds,
                        round_generators(root, 0, 4), round_generators(count_root(root), 0, 4))
    alone = task.release(model, params, data.X, data.y, data.bounds,
                         round_generators(root, 0, 4)).arrays
    counted = count.release(model, params, data.X, data.y, data.bounds,
                            round_generators(count_root(root), 0, 4)).arrays
    np.testing.assert_array_equal(out.arrays["delta-y"], alone["delta-y"])
    np.testing.assert_array_equal(out.arrays["count"], counted["count"])
    with pytest.raises(ValueError, match="count_rngs"):
        release_round(task, count, model, params, data.X, data.y, data.bounds,
                      round_generators(root, 0, 4))


def test_a_subclass_that_overrides_the_sums_is_not_bypassed(problem: tuple) -> None:
    """The one-pass count is taken only from the class's own sums: a subclass with its own
    clipped_grad_sums (a reference path, a user's variant) gets it called every round."""
    from dpprecond.fl.tasks import GradientTask, release_round

    calls = []

    class Mine(LinearSoftmax):
        def clipped_grad_sums(self, *args: object, **kwargs: object) -> np.ndarray:
            calls.append(1)
            return self.clipped_grad_sums_safe(*args, **kwargs)  # type: ignore[arg-type]

    X, y, _, _ = problem
    data = ClientData.from_partition(X, y, iid_partition(len(y), 4, 2), 3)
    model = Mine(6, 3)
    assert not model.counts_in_pass and LinearSoftmax(6, 3).counts_in_pass
    params = np.zeros(model.n_params)
    root = np.random.SeedSequence(4)
    release_round(GradientTask(1.3, 0.8).validated(), RecordCountTask(1.3, 2.5).validated(),
                  model, params, data.X, data.y, data.bounds, round_generators(root, 0, 4),
                  round_generators(count_root(root), 0, 4))
    assert calls == [1]
