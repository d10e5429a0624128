"""Federated rounds under secure aggregation: each client sends a share, the server a sum.

``trust="secure-aggregation"`` (:class:`~dpprecond.fl.config.FLConfig`): in every round
each client quantizes its records' clipped per-example gradients and adds its share of the
Skellam noise (:func:`~dpprecond.secagg.skellam.client_share`); the server learns only the
modular sum of the shares, decodes it and divides by the number of records,

    G = (sum_i sum_{x in D_i} r(gamma clip_C(grad l(theta; x))) + Sk) / (gamma N),

the size-weighted aggregate of the engine's messages (``weighting="size"``, whose noise
the sum carries once instead of ``K`` times). The method's server transform then runs as
in :func:`dpprecond.fl.engine.simulate`.

Privacy unit: one record, replace-one; the sensitivity and the accounting of one round's
sum are :mod:`~dpprecond.secagg.skellam`'s; a run composes ``T`` of them with
dp_accounting's RDP accountant. The guarantee holds against an honest-but-curious server
that sees only the secure sum (docs/secure_aggregation.md); against the server and ``c``
colluding clients it is that of :func:`~dpprecond.secagg.skellam.colluding_variance`.

Supported: the one-message gradient methods (``fedgd``, the SOFIM forms, ``adam``,
``yogi``) with the full-batch mechanism and size weighting; everything else is refused
with an error naming the setting.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict
from typing import Any

import numpy as np
from dp_accounting import dp_event

from dpprecond._validation import (
    check_array,
    check_int,
    check_labels,
    check_seed,
    check_target_delta,
)
from dpprecond.accounting import PrivacyLedger, calibrate_noise
from dpprecond.fl import client as client_mod
from dpprecond.fl.config import FLConfig
from dpprecond.fl.data import ClientData
from dpprecond.fl.methods import GradientMethod, Method
from dpprecond.fl.models import FLModel
from dpprecond.fl.result import FLResult, as_method
from dpprecond.fl.server import GradientTransformation
from dpprecond.secagg.skellam import (
    SkellamPlan,
    aggregate,
    client_share,
    decode,
    plan_event,
    plan_skellam,
    skellam_event,
)

__all__ = ["check_secure_aggregation", "secure_gradient_sum", "secure_noise_multiplier",
           "secure_plan", "secure_plan_event", "simulate_secure"]

logger = logging.getLogger(__name__)


def secure_plan(config: FLConfig, data: ClientData, n_params: int, noise_multiplier: float,
                min_clients: int) -> SkellamPlan:
    """The round plan of a run: ``C``, ``d``, the noise multiplier and the modulus
    sized for all ``N`` records and ``K`` shares."""
    return plan_skellam(config.clip_norm, n_params, noise_multiplier, min_clients,
                        int(data.X.shape[0]), max_clients=data.n_clients)


def secure_noise_multiplier(config: FLConfig, plan: SkellamPlan) -> float:
    """``z`` (noise std over the sum's L2 sensitivity) for the run's ``T`` sums.

    Calibrated with dp_accounting's RDP accountant on ``T`` compositions of the Skellam
    event (:func:`~dpprecond.secagg.skellam.skellam_event`) when ``target_epsilon`` is
    set; the explicit ``noise_multiplier`` otherwise.
    """
    if config.target_epsilon is None:
        return float(config.noise_multiplier or 0.0)
    d2, d1, t = plan.l2_sensitivity, plan.l1_sensitivity, config.n_rounds

    def event(z: float) -> dp_event.DpEvent:
        return dp_event.SelfComposedDpEvent(skellam_event(d2, d1, (z * d2) ** 2), t)

    return calibrate_noise(event, config.target_epsilon, config.target_delta, "rdp")


def secure_plan_event(model: FLModel, config: FLConfig) -> dp_event.DpEvent:
    """The whole run's event under secure aggregation: ``T`` Skellam sums.

    The sensitivities depend only on ``C``, ``d`` and the resolution (not on the data), so
    a caller can check a plan against a ledger before touching any data; it is the
    composition of the events :func:`simulate_secure` records.
    """
    config = config.validated()
    probe = plan_skellam(config.clip_norm, model.n_params, 1.0, 1, 0)
    z = secure_noise_multiplier(config, probe)
    d2 = probe.l2_sensitivity
    return dp_event.SelfComposedDpEvent(
        skellam_event(d2, probe.l1_sensitivity, (z * d2) ** 2), config.n_rounds)


def secure_gradient_sum(model: FLModel, params: np.ndarray, X: np.ndarray, y: np.ndarray,
                        bounds: np.ndarray, plan: SkellamPlan, rngs: list[Any],
                        clients: list[int] | None = None) -> np.ndarray:
    """The decoded secure sum of a round, in gradient units (shape ``(n_params,)``).

    Client ``i`` (rows ``bounds[i]:bounds[i+1]``) computes its share with ``rngs[i]``
    (:func:`~dpprecond.secagg.skellam.client_share`); ``clients`` lists whose shares reach
    the sum (default all; fewer than ``plan.min_clients`` is refused by
    :func:`~dpprecond.secagg.skellam.decode`).
    """
    ids = list(range(len(bounds) - 1)) if clients is None else list(clients)
    shares = []
    for i in ids:
        lo, hi = int(bounds[i]), int(bounds[i + 1])
        grads = model.per_example_grads(params, X[lo:hi], y[lo:hi])
        shares.append(client_share(grads, plan, rngs[i]))
    return decode(aggregate(shares, plan), plan, len(shares))


def check_secure_aggregation(method: Method, config: FLConfig, secure: bool) -> GradientMethod:
    """Refuse, naming the setting, what secure aggregation does not run; return the method."""
    if not isinstance(method, GradientMethod):
        raise ValueError(f"trust='secure-aggregation' runs the one-message gradient methods "
                         f"(fedgd, sofim*, adam, yogi); {method.name!r} sends other releases. "
                         "Use trust='local' for it.")
    if getattr(config, "adaptive_clip", None) not in (None, "auto"):  # "auto": fixed here
        raise ValueError("adaptive_clip is not available with trust='secure-aggregation' (its "
                         "private counts are not part of the secure sum).")
    if config.mechanism != "full-batch":
        raise ValueError(f"trust='secure-aggregation' needs mechanism='full-batch', got "
                         f"mechanism={config.mechanism!r}.")
    if config.weighting != "size":
        raise ValueError(f"trust='secure-aggregation' aggregates the records of all clients "
                         f"in one sum, i.e. weighting='size'; got weighting="
                         f"{config.weighting!r}. Set weighting='size'.")
    if secure:
        raise ValueError("secure=True is not available with trust='secure-aggregation': the "
                         "Skellam noise needs Poisson draws, which the secure noise source "
                         "does not provide.")
    if not config.private:
        raise ValueError("trust='secure-aggregation' is a private mechanism; a non-private "
                         "run (noise_multiplier=0) uses trust='local'.")
    return method


def simulate_secure(model: FLModel, data: ClientData,
                    method: Method | GradientTransformation | str, config: FLConfig, *,
                    X_test: Any, y_test: Any, seed: Any = None,
                    min_clients: int | None = None, ledger: PrivacyLedger | None = None,
                    secure: bool = False) -> FLResult:
    """:func:`~dpprecond.fl.engine.simulate` under secure aggregation (module docstring).

    Parameters
    ----------
    model, data, method, config, X_test, y_test, seed, ledger
        As for :func:`~dpprecond.fl.engine.simulate`. Randomness: client ``i`` of round
        ``t`` uses the engine's stream ``(t, i)`` for its rounding and its noise share.
    min_clients : int, optional
        Fewest clients whose shares a released sum holds (default: all ``K``; the noise of
        each share is ``1 / min_clients`` of the sum's). Smaller values tolerate dropouts
        at the price of more noise when everyone replies.
    secure : bool
        Refused (the secure noise source has no Poisson sampler).

    Returns
    -------
    FLResult
        As the engine's; ``config`` also has ``trust``, ``min_clients``, ``modulus_bits``,
        ``resolution`` (``gamma C``) and ``wrap_probability``; ``noise_multiplier`` is the
        Skellam noise std over the sum's L2 sensitivity (integer units).
    """
    config = config.validated()
    gm = check_secure_aggregation(as_method(method), config, secure)
    X_test = check_array("X_test", X_test)
    y_test = check_labels("y_test", y_test, data.n_classes, n_rows=X_test.shape[0])
    for what, have, want in (("classes", getattr(model, "n_classes", data.n_classes),
                              data.n_classes),
                             ("features", getattr(model, "n_features", data.X.shape[1]),
                              data.X.shape[1]),
                             ("test features", X_test.shape[1], data.X.shape[1])):
        if have != want:
            raise ValueError(f"The model or test data has {have} {what} but the training data "
                             f"has {want}; build the model for the data.")
    check_target_delta("target_delta", config.target_delta, data.X.shape[0])
    K = data.n_clients
    k_min = K if min_clients is None else check_int("min_clients", min_clients, low=1,
                                                    high=K)
    probe = secure_plan(config, data, model.n_params, 1.0, k_min)
    z = secure_noise_multiplier(config, probe)
    plan = secure_plan(config, data, model.n_params, z, k_min)
    release = plan_event(plan)
    if ledger is not None:
        ledger.check(dp_event.SelfComposedDpEvent(release, config.n_rounds))
    root = check_seed("seed", seed)
    init_seq, noise_root, _ = root.spawn(3)
    n_records = int(data.X.shape[0])
    # noise of G per coordinate: K / k_min shares of variance v / k_min each ... / (gamma N)^2
    noise_var = K / k_min * plan.noise_variance / (plan.scale * n_records) ** 2
    transform = gm.transform_for(noise_var)
    params = model.init_params(np.random.default_rng(init_seq))
    state = transform.init(params)
    run_ledger = PrivacyLedger(config.target_delta, accountant="rdp")
    events: list[dp_event.DpEvent] = []
    history: list[dict[str, float]] = []
    wrap = plan.wrap_probability(n_records, K)
    logger.info("secure-aggregation run %s: K=%d, T=%d, z=%.4g, 2^%d modulus, wrap <= %.3g",
                gm.name, K, config.n_rounds, z, plan.bits, wrap)
    for t in range(config.n_rounds):
        start = time.perf_counter()
        rngs = client_mod.round_generators(noise_root, t, K)
        run_ledger.spend(release)  # before the shares are computed: charged regardless
        events.append(release)
        if ledger is not None:
            ledger.spend(release)
        G = secure_gradient_sum(model, params, data.X, data.y, data.bounds, plan, rngs)
        G = G / n_records
        updates, state = transform.update(G, state, params)
        params = params + updates
        seconds = time.perf_counter() - start
        loss, acc = model.evaluate(params, X_test, y_test)
        history.append({"round": t + 1, "test_accuracy": acc, "test_loss": loss,
                        "epsilon": run_ledger.epsilon,
                        "update_norm": float(np.linalg.norm(updates)), "seconds": seconds})
    info = {**asdict(config), **gm.describe(), "accountant": "rdp",
            "trust": "secure-aggregation", "min_clients": k_min, "modulus_bits": plan.bits,
            "resolution": plan.scale * plan.clip_norm, "wrap_probability": wrap}
    return FLResult(params, history, z, history[-1]["epsilon"], config.target_delta, info,
                    events)
