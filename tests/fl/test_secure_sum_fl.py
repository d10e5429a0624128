"""The federated rounds' secure sums: each client's part is its clipped gradient sum.

Sensitivity of the rounded parts on worst-case neighbours (also at extreme magnitudes,
where the kernel takes its overflow-safe path), the decoded sum's noise against the plan's
claim, the run's epsilon as the composition of ``T`` sum events, the generic
``clipped_grad_sums`` of a torch model, and the float32 slack."""

from __future__ import annotations

import math

import numpy as np
import pytest
from dp_accounting import dp_event

from dpprecond.accounting import epsilon_of
from dpprecond.fl import FLConfig
from dpprecond.fl.client import noise_inflation
from dpprecond.fl.data import ClientData
from dpprecond.fl.kernels import rounding_slack
from dpprecond.fl.models import LinearSoftmax
from dpprecond.secagg import InsufficientNoiseError
from dpprecond.secagg.fl import (
    part_sensitivity,
    round_event,
    secure_gradient_sum,
    secure_noise_multiplier,
    secure_plan,
    secure_plan_event,
    simulate_secure,
)
from dpprecond.secagg.sums import ROUNDING_INFLATION, round_shared

BOUNDS = np.array([0, 7, 19, 20, 40])  # four clients, one of a single record
D_FEAT, N_CLASSES = 30, 5


def _config(**kw: object) -> FLConfig:
    base: dict[str, object] = dict(n_rounds=3, clip_norm=1.0, target_epsilon=2.0,
                                   weighting="size", trust="secure-aggregation",
                                   adaptive_clip=None)  # the fixed clip's sums (adaptive:
    # tests/fl/test_secure_adaptive_clip.py)
    base.update(kw)
    return FLConfig(**base)  # type: ignore[arg-type]


def _neighbours(magnitude: float, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Data and a neighbour: record 10 (client 1) replaced by its negation, at
    ``magnitude``. At ``params = 0`` both residuals are ``1/k - onehot(y)``, so the two
    clipped gradients ``[x, 1] r^T`` have opposite feature blocks: their difference has
    norm ``2C ||x|| / ||[x, 1]||``, i.e. ``2C`` up to ``1 / magnitude^2``."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((BOUNDS[-1], D_FEAT))
    y = rng.integers(0, N_CLASSES, BOUNDS[-1])
    x = rng.standard_normal(D_FEAT)
    X[10] = x / np.linalg.norm(x) * magnitude
    X2 = X.copy()
    X2[10] = -X[10]
    return X, X2, y


def _maximal_uniforms(y1: np.ndarray, y2: np.ndarray) -> np.ndarray:
    """Uniforms under which every coordinate's rounded difference is ``ceil(|y2 - y1|)``
    (the coupling's worst case): ``lo + 1 - u`` just below the next integer."""
    lo, hi = np.minimum(y1, y2), np.maximum(y1, y2)
    f = lo - np.floor(lo)
    e = (hi - lo) - np.floor(hi - lo)
    return np.minimum(f + np.minimum(e, 1.0 - f) / 2, np.nextafter(1.0, 0.0))


@pytest.mark.parametrize("magnitude", [1e3, 1e8, 1e300])
def test_worst_case_neighbours_round_within_the_sums_sensitivity(magnitude: float) -> None:
    """Replacing one record by one whose clipped gradient points the opposite way moves
    only its client's computed part, by at most ``Delta = 2C (1 + slack)`` (and by
    nearly ``2C``: the worst case is attained); with the same uniforms the rounded parts
    differ by an integer vector within ``D2 = gamma Delta + sqrt(p)`` and ``D1``, for 300
    draws of the uniforms and for the uniforms that make every coordinate's difference
    maximal. At ``1e300`` the kernel takes its overflow-safe path."""
    model = LinearSoftmax(D_FEAT, N_CLASSES)
    params = np.zeros(model.n_params)
    for seed in range(3):
        X, X2, y = _neighbours(magnitude, seed)
        with np.errstate(over="ignore"):  # 1e300: the squared norm overflows
            assert (X[10] @ X[10] >= 1e280) == (magnitude > 1e100)  # the kernel's safe path
        P = model.clipped_grad_sums(params, X, y, BOUNDS, 1.0)
        P2 = model.clipped_grad_sums(params, X2, y, BOUNDS, 1.0)
        others = [0, 2, 3]
        assert np.array_equal(P[others], P2[others])  # bitwise: they round the same
        delta = part_sensitivity(model, 1.0, int(np.diff(BOUNDS).max()))
        assert delta == 2.0 * noise_inflation(model, X, BOUNDS)  # the local noise's factor
        moved = np.linalg.norm(P[1] - P2[1])
        assert 2.0 * (1 - 1e-6) <= moved <= delta
        plan = secure_plan(model, _config(), ClientData(X, y, BOUNDS, N_CLASSES), 1.0, 4,
                           int(np.diff(BOUNDS).max()))
        assert plan.sensitivity == delta and plan.inflation <= ROUNDING_INFLATION
        y1, y2 = P[1] * plan.scale, P2[1] * plan.scale  # exact: gamma is a power of two
        levels = np.ceil(np.abs(y2 - y1))
        rng = np.random.default_rng(100 + seed)
        for _ in range(300):
            u = rng.random(plan.dim)
            w = round_shared(y2, u) - round_shared(y1, u)
            assert np.all(np.abs(w) <= levels)
            assert np.linalg.norm(w) <= plan.l2_sensitivity
            assert np.abs(w).sum() <= plan.l1_sensitivity
        w = round_shared(y2, _maximal_uniforms(y1, y2)) - round_shared(
            y1, _maximal_uniforms(y1, y2))
        assert np.all(np.abs(w) <= levels)
        assert np.linalg.norm(w) >= np.linalg.norm(y2 - y1)  # at least the scaled move
        assert np.linalg.norm(w) <= plan.l2_sensitivity
        assert np.abs(w).sum() <= plan.l1_sensitivity


@pytest.mark.parametrize("magnitude", [1e3, 1e300])
def test_the_decoded_sums_of_neighbours_differ_by_the_rounded_parts_only(
        magnitude: float) -> None:
    """End to end through :func:`secure_gradient_sum` with the same client streams: the
    noise shares are the same draws, so the decoded sums differ by ``w / gamma`` with
    ``w`` an integer vector within ``D2``."""
    model = LinearSoftmax(D_FEAT, N_CLASSES)
    params = np.zeros(model.n_params)
    X, X2, y = _neighbours(magnitude, 7)
    plan = secure_plan(model, _config(), ClientData(X, y, BOUNDS, N_CLASSES), 0.7, 4)
    for seed in range(20):
        def streams(s: int = seed) -> list[np.random.Generator]:
            return [np.random.default_rng([s, i]) for i in range(4)]

        a = secure_gradient_sum(model, params, X, y, BOUNDS, 1.0, plan, streams())
        b = secure_gradient_sum(model, params, X2, y, BOUNDS, 1.0, plan, streams())
        w = (b - a) * plan.scale
        assert np.array_equal(w, np.rint(w))
        assert np.linalg.norm(w) <= plan.l2_sensitivity


@pytest.mark.parametrize(("K", "k_min"), [(5, 5), (5, 3)])
def test_the_decoded_sums_noise_matches_the_plans_claim(K: int, k_min: int) -> None:
    """The decoded sum minus the rounded parts (recomputed from each client's stream: its
    uniforms come first) is the noise: its std over 40 rounds x 650 coordinates against
    ``plan.noise_std(K) = sqrt(K / k_min) z D2 / gamma``, which is at most ``(1 + 2^-10)``
    times the central Gaussian std ``sqrt(K / k_min) z Delta``. Tolerance: 5 standard
    errors of a sample std, ``sqrt(1 / (2n))`` relative (Skellam's excess kurtosis
    ``1/v`` is negligible)."""
    rng = np.random.default_rng(0)
    n_rows, d, k = 300, 64, 10
    X = rng.standard_normal((n_rows, d)) / 4
    y = rng.integers(0, k, n_rows)
    bounds = np.linspace(0, n_rows, K + 1).astype(np.int64)
    model = LinearSoftmax(d, k)
    params = rng.standard_normal(model.n_params) * 0.1
    z = 1.3
    plan = secure_plan(model, _config(), ClientData(X, y, bounds, k), z, k_min)
    claim = plan.noise_std(K)
    central = math.sqrt(K / k_min) * z * plan.sensitivity
    assert central <= claim <= central * (1 + ROUNDING_INFLATION) * (1 + 1e-9)
    assert claim == pytest.approx(math.sqrt(K / k_min) * z * plan.l2_sensitivity / plan.scale,
                                  rel=1e-12)
    parts = model.clipped_grad_sums(params, X, y, bounds, 1.0)
    noise = []
    for t in range(40):
        seqs = np.random.SeedSequence(t).spawn(K)
        out = secure_gradient_sum(model, params, X, y, bounds, 1.0, plan,
                                  [np.random.default_rng(s) for s in seqs])
        rounded = sum(round_shared(parts[i] * plan.scale,
                                   np.random.default_rng(s).random(plan.dim))
                      for i, s in enumerate(seqs))
        noise.append(out - rounded / plan.scale)
    draws = np.concatenate(noise)
    n = draws.size
    assert abs(draws.mean()) <= 5 * claim / math.sqrt(n)
    assert draws.std() / claim == pytest.approx(1.0, abs=5 * math.sqrt(0.5 / n))


def test_a_runs_epsilon_is_the_composition_of_its_sum_events() -> None:
    """Every round records ``round_event(z)``; the run's epsilon is dp_accounting's RDP
    epsilon of ``T`` of them; ``z`` meets the target within the calibrator's tolerance;
    ``z`` depends on the settings only (the same for another model size); the planned
    event is the recorded composition."""
    rng = np.random.default_rng(1)
    X = rng.standard_normal((200, 12))
    y = rng.integers(0, 3, 200)
    bounds = np.array([0, 50, 120, 200])
    config = _config(n_rounds=4, target_epsilon=1.5)
    model = LinearSoftmax(12, 3)
    res = simulate_secure(model, ClientData(X, y, bounds, 3), "fedgd", config,
                          X_test=X[:20], y_test=y[:20], seed=0)
    z = res.noise_multiplier
    assert res.events == [round_event(z)] * 4
    from dp_accounting.rdp import RdpAccountant

    accountant = RdpAccountant()
    accountant.compose(dp_event.SelfComposedDpEvent(round_event(z), 4))
    direct = accountant.get_epsilon(1e-5)
    assert res.epsilon == pytest.approx(epsilon_of(
        dp_event.SelfComposedDpEvent(round_event(z), 4), 1e-5, "rdp"), rel=1e-12)
    assert res.epsilon == pytest.approx(direct, rel=1e-3)  # dp_accounting's own orders
    assert 1.5 * (1 - 1e-3) <= res.epsilon <= 1.5
    assert secure_noise_multiplier(config) == z
    assert epsilon_of(secure_plan_event(LinearSoftmax(500, 10), config), 1e-5, "rdp") == \
        pytest.approx(res.epsilon, rel=1e-12)
    for key in ("sensitivity", "scale", "resolution", "rounding_inflation", "modulus_bits",
                "wrap_probability", "noise_std", "min_clients"):
        assert key in res.config
    assert res.config["resolution"] == res.config["scale"] * res.config["sensitivity"]


def test_fewer_clients_than_min_clients_are_refused_before_the_parts() -> None:
    model = LinearSoftmax(D_FEAT, N_CLASSES)
    X, _, y = _neighbours(1.0, 0)
    plan = secure_plan(model, _config(), ClientData(X, y, BOUNDS, N_CLASSES), 1.0, 3)

    class Untouchable(LinearSoftmax):
        def clipped_grad_sums(self, *a, **k):  # type: ignore[no-untyped-def]
            raise AssertionError("the parts were computed")

    rngs = [np.random.default_rng(i) for i in range(4)]
    with pytest.raises(InsufficientNoiseError, match="min_clients=3"):
        secure_gradient_sum(Untouchable(D_FEAT, N_CLASSES), np.zeros(model.n_params), X, y,
                            BOUNDS, 1.0, plan, rngs, clients=[0, 3])
    out = secure_gradient_sum(model, np.zeros(model.n_params), X, y, BOUNDS, 1.0, plan,
                              rngs, clients=[0, 1, 3])
    assert out.shape == (model.n_params,) and np.isfinite(out).all()


def test_float32_rows_get_the_float32_slack() -> None:
    model = LinearSoftmax(D_FEAT, N_CLASSES)
    X, _, y = _neighbours(1.0, 0)
    data = ClientData(X, y, BOUNDS, N_CLASSES)
    n = int(BOUNDS[-1])  # the default bound on a client's rows: all N records
    p64 = secure_plan(model, _config(), data, 1.0, 4)
    p32 = secure_plan(model, _config(precision="float32"), data, 1.0, 4)
    assert p64.sensitivity == 2.0 * (1 + rounding_slack(n, np.float64))
    assert p32.sensitivity == 2.0 * (1 + rounding_slack(n, np.float32))
    assert p32.sensitivity > p64.sensitivity
    res = simulate_secure(model, data, "fedgd", _config(precision="float32", n_rounds=2),
                          X_test=X, y_test=y, seed=1)
    assert res.config["sensitivity"] == p32.sensitivity and np.isfinite(res.params).all()


def test_a_torch_model_runs_through_its_generic_clipped_sums() -> None:
    torch = pytest.importorskip("torch")
    from dpprecond.fl.models import TorchModel

    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(8, 6), torch.nn.Tanh(),
                                 torch.nn.Linear(6, 3)).double()
    model = TorchModel(module)
    rng = np.random.default_rng(2)
    X = rng.standard_normal((60, 8))
    y = rng.integers(0, 3, 60)
    bounds = np.array([0, 20, 45, 60])
    data = ClientData(X, y, bounds, 3)
    plan = secure_plan(model, _config(), data, 1.0, 3, max_client_rows=25)
    assert plan.dim == model.n_params
    assert plan.sensitivity == 2.0 * noise_inflation(model, X, bounds)  # the largest: 25
    params = model.init_params(rng)
    parts = model.clipped_grad_sums(params, X, y, bounds, 1.0)
    seqs = np.random.SeedSequence(3).spawn(3)
    out = secure_gradient_sum(model, params, X, y, bounds, 1.0, plan,
                              [np.random.default_rng(s) for s in seqs])
    rounded = sum(round_shared(parts[i] * plan.scale,
                               np.random.default_rng(s).random(plan.dim))
                  for i, s in enumerate(seqs))
    noise = out - rounded / plan.scale  # 5 standard errors of the std of n_params draws
    assert noise.std() / plan.noise_std() == pytest.approx(
        1.0, abs=5 * math.sqrt(0.5 / noise.size))
    res = simulate_secure(model, data, "fedgd", _config(n_rounds=2), X_test=X, y_test=y,
                          seed=0)
    assert len(res.history) == 2 and np.isfinite(res.params).all()


def test_the_plans_client_bound_defaults_to_n_and_must_cover_the_largest_client() -> None:
    """``max_client_rows``: ``N`` by default (what a deployment's server knows, the
    SecAgg+ strategy's default), the largest client's size when given, and a bound below
    the largest client is refused by name (its slack would not cover that client)."""
    model = LinearSoftmax(D_FEAT, N_CLASSES)
    X, _, y = _neighbours(1.0, 0)
    data = ClientData(X, y, BOUNDS, N_CLASSES)
    largest = int(np.diff(BOUNDS).max())
    assert secure_plan(model, _config(), data, 1.0, 4).sensitivity == \
        part_sensitivity(model, 1.0, int(BOUNDS[-1]))
    tight = secure_plan(model, _config(), data, 1.0, 4, largest)
    assert tight.sensitivity == part_sensitivity(model, 1.0, largest)
    with pytest.raises(ValueError, match="max_client_rows"):
        secure_plan(model, _config(), data, 1.0, 4, largest - 1)
    res = simulate_secure(model, data, "fedgd", _config(n_rounds=1), X_test=X, y_test=y,
                          seed=1, max_client_rows=largest)
    assert res.config["sensitivity"] == tight.sensitivity
