"""Adaptive clipping under secure aggregation: the round's count is a coordinate of the sum.

The counted part's sensitivity on worst-case neighbours (a record inside the clip replaced
by one far outside it, pointing the other way; also at extreme magnitudes), the precision
share of the count, the decoded count against the exact one, the clip's geometric update
from the decoded fraction, the epsilon (the same as the fixed clip's), and the refusals."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from dpprecond.fl import FLConfig
from dpprecond.fl.adaptive_clip import AdaptiveClip, geometric_update
from dpprecond.fl.client import record_counts, round_generators
from dpprecond.fl.data import ClientData
from dpprecond.fl.methods import make_method
from dpprecond.fl.models import LinearSoftmax
from dpprecond.secagg.adaptive import (
    count_weight,
    counted_parts,
    counted_plan,
    counted_sensitivity,
    split_counted_sum,
)
from dpprecond.secagg.fl import part_sensitivity, secure_plan, simulate_secure
from dpprecond.secagg.sums import secure_sum
from tests.secagg.rounding_checks import assert_rounded_parts_within_plan

BOUNDS = np.array([0, 7, 19, 20, 40])  # four clients, one of a single record
D_FEAT, N_CLASSES, C, SHARE = 30, 5, 1.0, 0.05


def _config(**kw: object) -> FLConfig:
    base: dict[str, object] = dict(n_rounds=4, clip_norm=C, target_epsilon=2.0,
                                   weighting="size", trust="secure-aggregation",
                                   adaptive_clip="auto")
    base.update(kw)
    return FLConfig(**base)  # type: ignore[arg-type]


def _data(seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((BOUNDS[-1], D_FEAT)) * 0.05, rng.integers(0, N_CLASSES, 40)


@pytest.mark.parametrize("magnitude", [10.0, 1e8, 1e300])
def test_a_record_inside_the_clip_replaced_by_one_outside_moves_one_part_within_delta(
        magnitude: float) -> None:
    """Record 10 (client 1) small, so its gradient is inside the clip and counted, replaced
    by its direction negated at ``magnitude`` (clipped, not counted): only client 1's
    counted part moves; its count coordinate by exactly ``kappa``, the whole part by at
    most ``Delta`` (the plan's sensitivity); the rounded parts stay within the plan's
    ``D2`` and ``D1`` under 200 draws of the uniforms."""
    model = LinearSoftmax(D_FEAT, N_CLASSES)
    params = np.zeros(model.n_params)
    plan, kappa = counted_plan(model, C, 1.0, count_share=SHARE, n_rows=40, n_clients=4,
                               min_clients=4, max_client_rows=40)
    for seed in range(3):
        X, y = _data(seed)
        X2 = X.copy()
        X2[10] = -X[10] / np.linalg.norm(X[10]) * magnitude
        with np.errstate(over="ignore"):
            P = counted_parts(model, params, X, y, BOUNDS, C, kappa)
            P2 = counted_parts(model, params, X2, y, BOUNDS, C, kappa)
        counts = record_counts(model, params, X, y, BOUNDS, C)
        assert np.array_equal(P[:, -1], kappa * counts) and counts[1] == 12  # all inside
        assert np.array_equal(P[[0, 2, 3]], P2[[0, 2, 3]])
        assert P2[1, -1] == kappa * 11  # one indicator flipped
        moved = float(np.linalg.norm(P[1] - P2[1]))
        assert moved <= plan.sensitivity
        assert moved > kappa  # the gradient moved too
        assert_rounded_parts_within_plan(P[1], P2[1], plan, seed)


def test_the_count_takes_its_share_of_the_sums_precision() -> None:
    """``kappa = Delta_p sqrt(s / (1 - s))``: the count's noise std over its sensitivity 1
    is ``z / sqrt(s)`` and the gradient's over ``Delta_p`` is ``z / sqrt(1 - s)``, up to
    the ``1 + 2 u n`` of the count's float product and the ``2^-50`` of the bound."""
    model = LinearSoftmax(D_FEAT, N_CLASSES)
    for clip, rows in ((1.0, 40), (1e-3, 10**6), (1e4, 7)):
        plan, kappa = counted_plan(model, clip, 2.0, count_share=SHARE, n_rows=40,
                                   n_clients=4, min_clients=4, max_client_rows=rows)
        delta_p = part_sensitivity(model, clip, rows)
        assert kappa == count_weight(delta_p, SHARE)
        assert plan.sensitivity == counted_sensitivity(delta_p, kappa, rows)
        assert plan.sensitivity >= math.hypot(delta_p, kappa * (1 + 2 * 2.0**-53 * rows))
        assert plan.sensitivity / kappa == pytest.approx(1 / math.sqrt(SHARE), rel=1e-9)
        assert plan.sensitivity / delta_p == pytest.approx(1 / math.sqrt(1 - SHARE), rel=1e-9)
        assert plan.dim == model.n_params + 1


def test_the_decoded_count_is_the_total_count_within_rounding_and_noise() -> None:
    """At ``z = 1e-4``: the decoded count differs from the exact total by at most ``K /
    (gamma kappa)`` plus 6 noise stds, and the gradient block is the clipped sums'."""
    model = LinearSoftmax(D_FEAT, N_CLASSES)
    X, y = _data(3)
    params = np.random.default_rng(1).standard_normal(model.n_params) * 0.5
    clip = float(np.median(model.per_example_grad_norms(params, X, y)))  # half inside
    plan, kappa = counted_plan(model, clip, 1e-4, count_share=SHARE, n_rows=40,
                               n_clients=4, min_clients=4, max_client_rows=40)
    parts = counted_parts(model, params, X, y, BOUNDS, clip, kappa)
    S, count = split_counted_sum(secure_sum(parts, plan, [np.random.default_rng([2, i])
                                                          for i in range(4)], range(4)),
                                 kappa)
    exact = record_counts(model, params, X, y, BOUNDS, clip).sum()
    assert 0 < exact < 40
    noise = plan.noise_std(4)
    assert abs(count - exact) <= (4 / plan.scale + 6 * noise) / kappa
    sums = model.clipped_grad_sums(params, X, y, BOUNDS, clip).sum(axis=0)
    assert np.max(np.abs(S - sums)) <= 4 / plan.scale + 6 * noise


def test_a_run_moves_its_clip_by_the_decoded_fraction_at_no_epsilon() -> None:
    """The first round runs at ``clip_norm`` (or the settings' ``initial_clip``); each next
    clip is the geometric update of the round's decoded fraction (recomputed here from
    the round's secure sum with the run's streams); the events and epsilon are the fixed
    clip's; the history and config say the clips."""
    model = LinearSoftmax(D_FEAT, N_CLASSES)
    X, y = _data(5)
    data = ClientData(X, y, BOUNDS, N_CLASSES)
    res = simulate_secure(model, data, "fedgd", _config(), X_test=X, y_test=y, seed=3)
    fixed = simulate_secure(model, data, "fedgd", _config(adaptive_clip=None), X_test=X,
                            y_test=y, seed=3)
    assert res.events == fixed.events and res.epsilon == fixed.epsilon
    clips = res.config["clip_norms"]
    assert [h["clip_norm"] for h in res.history] == clips and clips[0] == C
    assert res.config["adaptive_clip"] == {"target_quantile": 0.5, "learning_rate": 0.2,
                                           "initial_clip": None, "count_share": 0.05}
    assert fixed.config["adaptive_clip"] is None and "clip_norms" not in fixed.config
    # round 1 by hand: the same streams, the same plan, the same update
    init_seq, noise_root, _ = np.random.SeedSequence(3).spawn(3)
    params0 = model.init_params(np.random.default_rng(init_seq))
    z = res.noise_multiplier
    plan, kappa = counted_plan(model, C, z, count_share=SHARE, n_rows=40, n_clients=4,
                               min_clients=4, max_client_rows=40)
    _, count = split_counted_sum(secure_sum(counted_parts(model, params0, X, y, BOUNDS, C,
                                                          kappa),
                                            plan, round_generators(noise_root, 0, 4),
                                            range(4)), kappa)
    assert clips[1] == geometric_update(C, count / 40, 0.5, 0.2)
    started = simulate_secure(model, data, "fedgd",
                              _config(adaptive_clip=AdaptiveClip(initial_clip=2.5)),
                              X_test=X, y_test=y, seed=3)
    assert started.config["clip_norms"][0] == 2.5


def test_float32_rows_plan_the_float32_slack() -> None:
    model = LinearSoftmax(D_FEAT, N_CLASSES)
    X, y = _data(6)
    data = ClientData(X, y, BOUNDS, N_CLASSES)
    res = simulate_secure(model, data, "fedgd", _config(precision="float32", n_rounds=2),
                          X_test=X, y_test=y, seed=1)
    clip = res.config["clip_norms"][-1]
    plan, _ = counted_plan(model, clip, res.noise_multiplier, count_share=SHARE, n_rows=40,
                           n_clients=4, min_clients=4, max_client_rows=40, dtype=np.float32)
    assert res.config["sensitivity"] == plan.sensitivity
    assert plan.sensitivity > counted_plan(model, clip, res.noise_multiplier,
                                           count_share=SHARE, n_rows=40, n_clients=4,
                                           min_clients=4, max_client_rows=40)[0].sensitivity


def test_where_the_count_cannot_ride_auto_keeps_the_fixed_clip_and_an_explicit_one_is_refused(
        ) -> None:
    model = LinearSoftmax(D_FEAT, N_CLASSES)
    X, y = _data(7)
    data = ClientData(X, y, BOUNDS, N_CLASSES)
    client_level = dict(mechanism="client-level", weighting="uniform", local_steps=2)
    for method, kw in (("fedfc", {}), ("fedgd", client_level),
                       (make_method("sofim", noise_aware=True), {})):
        res = simulate_secure(model, data, method, _config(**kw), X_test=X, y_test=y, seed=0)
        assert res.config["adaptive_clip"] is None and "clip_norms" not in res.config
        with pytest.raises(ValueError, match=r"adaptive_clip (with trust='secure-aggregation'"
                                             r"|needs mechanism='full-batch')"):
            simulate_secure(model, data, method, _config(adaptive_clip=AdaptiveClip(), **kw),
                            X_test=X, y_test=y, seed=0)
    # the fixed-clip plan of a run without adaptive clipping is unchanged
    assert secure_plan(model, _config(adaptive_clip=None), data, 1.0, 4).dim == model.n_params
    assert replace(_config(), adaptive_clip=None).validated().adaptive_clip is None
