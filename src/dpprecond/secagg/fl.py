"""Federated rounds under secure aggregation: each client sends a share, the server a sum.

``trust="secure-aggregation"`` (:class:`~dpprecond.fl.config.FLConfig`): in every round
client ``i`` computes its *part*, the sum of its records' clipped gradients
``p_i = sum_{x in D_i} clip_C(grad l(theta; x))`` (the engine's fused kernel,
``model.clipped_grad_sums``: no per-example gradient is formed), and sends it as one
secure sum of :mod:`dpprecond.secagg.sums` (:func:`~dpprecond.secagg.sums.client_message`:
scaled by a power of two ``gamma``, rounded with shared-uniform stochastic rounding, plus
its Skellam share, modulo ``2^bits``); the server learns only the modular sum of the
messages, decodes it and divides by the number of records,

    G = (sum_i R(gamma p_i) + Sk) / (gamma N),

the size-weighted aggregate of the engine's messages (``weighting="size"``, whose noise
the sum carries once instead of ``K`` times). The method's server transform then runs as
in :func:`dpprecond.fl.engine.simulate`.

Privacy unit: one record, replace-one. Sensitivity: replacing one record of client ``i``
changes its computed part by at most ``Delta = 2 C (1 + slack)`` in L2 (``2C`` for the
exact clipped sums; ``slack`` bounds the floating-point rounding of the computed sums,
:func:`dpprecond.fl.kernels.rounding_slack`, the factor
:func:`dpprecond.fl.client.noise_inflation` by which the local mechanism multiplies its
noise) and leaves every other part unchanged. Coupled through the client's uniforms, the
rounded parts differ by an integer vector of L2 norm at most ``D2 = gamma Delta + sqrt(p)``
(``p = n_params``; :mod:`dpprecond.secagg.sums`), and the sum's Skellam noise has std
``z D2`` in integer units, i.e. ``z Delta (1 + sqrt(p) / (gamma Delta))`` per coordinate in
gradient-sum units, at most ``1 + 2^-10`` times the central Gaussian std ``z Delta`` at
the same noise multiplier ``z`` (with ``min_clients`` shares; ``K`` shares carry
``K / min_clients`` times the variance).

Accounting: every round's sum is dominated by :func:`~dpprecond.secagg.sums.sum_event`
(a ``ZCDpEvent`` depending only on ``z`` and the rounding inflation, not on the data or on
``p``); a run composes ``T`` of them with dp_accounting's RDP accountant, and ``z`` is
calibrated to the target with :func:`~dpprecond.accounting.calibrate_noise` on that
composition. The guarantee holds against an honest-but-curious server that sees only the
secure sum (docs/secure_aggregation.md); against the server and ``c`` colluding clients it
is that of the sum with ``(min_clients - c) / min_clients`` of its variance
(:func:`~dpprecond.secagg.skellam.colluding_variance`).

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
    check_positive,
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
from dpprecond.secagg.sums import SumPlan, client_message, plan_sum, secure_sum, sum_event

__all__ = ["check_secure_aggregation", "client_part", "part_sensitivity",
           "secure_gradient_sum", "secure_info", "secure_message", "secure_noise_multiplier",
           "secure_plan", "secure_plan_event", "simulate_secure"]

logger = logging.getLogger(__name__)


def part_sensitivity(model: FLModel, clip_norm: float, max_client_rows: int,
                     dtype: Any = np.float64) -> float:
    """``Delta``: replace-one L2 bound on the change of one client's computed part.

    ``2 C`` times :func:`dpprecond.fl.client.noise_inflation` for clients of at most
    ``max_client_rows`` rows of ``dtype`` (the bound on the floating-point rounding of the
    computed clipped sums that the local mechanism's noise carries too).
    """
    clip_norm = check_positive("clip_norm", clip_norm)
    n = check_int("max_client_rows", max_client_rows, low=0)
    fp = client_mod.noise_inflation(model, np.empty((0, 0), dtype=dtype),
                                    np.array([0, max(n, 1)]))
    return 2.0 * clip_norm * fp


def secure_plan(model: FLModel, config: FLConfig, data: ClientData, noise_multiplier: float,
                min_clients: int) -> SumPlan:
    """The plan of a run's round sums (:func:`~dpprecond.secagg.sums.plan_sum`):
    ``p = n_params`` coordinates, sensitivity :func:`part_sensitivity` for the data's
    largest client in ``config.precision``, the noise multiplier, and the modulus sized for
    all ``N`` records and ``K`` shares."""
    sizes = np.diff(data.bounds)
    dtype = np.float32 if config.precision == "float32" else np.float64
    delta = part_sensitivity(model, config.clip_norm, int(sizes.max(initial=1)), dtype)
    return plan_sum(model.n_params, delta, noise_multiplier, n_rows=int(data.X.shape[0]),
                    n_clients=data.n_clients, min_clients=min_clients)


def secure_noise_multiplier(config: FLConfig) -> float:
    """``z`` (noise std over the sum's L2 sensitivity ``D2``) for the run's ``T`` sums.

    Calibrated with dp_accounting's RDP accountant on ``T`` compositions of
    :func:`~dpprecond.secagg.sums.sum_event` when ``target_epsilon`` is set; the explicit
    ``noise_multiplier`` otherwise. Depends on the settings only (no data, no model).
    """
    if config.target_epsilon is None:
        return float(config.noise_multiplier or 0.0)
    t = config.n_rounds

    def event(z: float) -> dp_event.DpEvent:
        return dp_event.SelfComposedDpEvent(sum_event(z), t)

    return calibrate_noise(event, config.target_epsilon, config.target_delta, "rdp")


def secure_plan_event(model: FLModel, config: FLConfig) -> dp_event.DpEvent:
    """The whole run's event under secure aggregation: ``T`` compositions of
    :func:`~dpprecond.secagg.sums.sum_event` at the run's ``z``.

    It depends only on the settings (not on the data or the model), so a caller can check
    a plan against a ledger before touching any data; it is the composition of the
    events :func:`simulate_secure` records.
    """
    del model  # the event does not depend on the model's size
    config = config.validated()
    z = secure_noise_multiplier(config)
    return dp_event.SelfComposedDpEvent(sum_event(z), config.n_rounds)


def client_part(model: FLModel, params: np.ndarray, X: np.ndarray, y: np.ndarray,
                clip_norm: float) -> np.ndarray:
    """One client's part of a round's sum: its records' clipped gradient sum, ``(p,)``."""
    return model.clipped_grad_sums(params, X, y, np.array([0, X.shape[0]]),
                                   clip_norm)[0]


def secure_message(model: FLModel, params: np.ndarray, X: np.ndarray, y: np.ndarray,
                   clip_norm: float, plan: SumPlan, rng: Any) -> np.ndarray:
    """One client's message of a round (int64 in ``[0, 2^bits)``): :func:`client_part`,
    then :func:`~dpprecond.secagg.sums.client_message` with the client's ``rng`` (its
    rounding's uniforms, then its Skellam share)."""
    return client_message(client_part(model, params, X, y, clip_norm), plan, rng)


def secure_gradient_sum(model: FLModel, params: np.ndarray, X: Any, y: np.ndarray,
                        bounds: np.ndarray, clip_norm: float, plan: SumPlan,
                        rngs: list[Any], clients: list[int] | None = None, *,
                        x_sq_norms: Any = None) -> np.ndarray:
    """The decoded secure sum of a round, in gradient-sum units (shape ``(n_params,)``).

    The parts of all clients (rows ``bounds[i]:bounds[i+1]`` are client ``i``'s) come from
    one call of ``model.clipped_grad_sums``; client ``i`` forms its message with
    ``rngs[i]`` (:func:`~dpprecond.secagg.sums.secure_sum`); ``clients`` lists whose
    messages reach the sum (default all; fewer than ``plan.min_clients`` raises
    :class:`~dpprecond.secagg.skellam.InsufficientNoiseError` before any part is
    computed). ``x_sq_norms`` optionally caches the rows' squared norms (the kernel's).
    """
    K = len(bounds) - 1
    ids = list(range(K)) if clients is None else [int(i) for i in clients]
    if len(ids) < plan.min_clients:  # refuse before touching the data
        return secure_sum(np.zeros((K, plan.dim)), plan, rngs, ids)
    parts = model.clipped_grad_sums(params, X, y, bounds, clip_norm, x_sq_norms=x_sq_norms)
    return secure_sum(parts, plan, rngs, ids)


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


def secure_info(plan: SumPlan, n_shares: int) -> dict[str, Any]:
    """The public facts of a run's round plan, for ``FLResult.config``: ``min_clients``,
    ``sensitivity`` (``Delta``), ``scale`` (``gamma``), ``resolution`` (``gamma Delta``),
    ``rounding_inflation``, ``modulus_bits``, and with ``n_shares`` shares the
    ``wrap_probability`` bound and the decoded sum's ``noise_std`` (gradient-sum units)."""
    return {"min_clients": plan.min_clients, "sensitivity": plan.sensitivity,
            "scale": plan.scale, "resolution": plan.scale * plan.sensitivity,
            "rounding_inflation": plan.inflation, "modulus_bits": plan.bits,
            "wrap_probability": plan.wrap_probability(n_shares),
            "noise_std": plan.noise_std(n_shares)}


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
        As the engine's; ``noise_multiplier`` is ``z``, the sum's Skellam noise std over
        its L2 sensitivity ``D2 = gamma Delta + sqrt(p)`` (integer units: the decoded noise
        std per coordinate, with ``min_clients`` shares, is ``z Delta (1 +
        rounding_inflation)`` in gradient-sum units). ``config`` also has ``trust``,
        ``min_clients``, ``sensitivity`` (``Delta``, the part's), ``scale`` (``gamma``),
        ``resolution`` (``gamma Delta``: integer levels per sensitivity),
        ``rounding_inflation`` (``sqrt(p) / (gamma Delta)``), ``modulus_bits`` and
        ``wrap_probability`` (bound per round, all ``K`` shares), ``noise_std`` (the
        decoded sum's, gradient-sum units, all ``K`` shares).
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
    z = secure_noise_multiplier(config)
    plan = secure_plan(model, config, data, z, k_min)
    release = sum_event(z)
    if ledger is not None:
        ledger.check(dp_event.SelfComposedDpEvent(release, config.n_rounds))
    X_run, x_sq_norms = client_mod.kernel_rows(data.X, config, model)  # as the engine
    root = check_seed("seed", seed)
    init_seq, noise_root, _ = root.spawn(3)
    n_records = int(data.X.shape[0])
    # noise of G per coordinate: K / k_min shares of variance v / k_min each ... / (gamma N)^2
    noise_var = (plan.noise_std(K) / n_records) ** 2
    transform = gm.transform_for(noise_var)
    params = model.init_params(np.random.default_rng(init_seq))
    state = transform.init(params)
    run_ledger = PrivacyLedger(config.target_delta, accountant="rdp")
    events: list[dp_event.DpEvent] = []
    history: list[dict[str, float]] = []
    wrap = plan.wrap_probability(K)
    logger.info("secure-aggregation run %s: K=%d, T=%d, z=%.4g, 2^%d modulus, wrap <= %.3g",
                gm.name, K, config.n_rounds, z, plan.bits, wrap)
    for t in range(config.n_rounds):
        start = time.perf_counter()
        rngs = client_mod.round_generators(noise_root, t, K)
        run_ledger.spend(release)  # before the shares are computed: charged regardless
        events.append(release)
        if ledger is not None:
            ledger.spend(release)
        G = secure_gradient_sum(model, params, X_run, data.y, data.bounds,
                                config.clip_norm, plan, rngs, x_sq_norms=x_sq_norms)
        G = G / n_records
        updates, state = transform.update(G, state, params)
        params = params + updates
        seconds = time.perf_counter() - start
        loss, acc = model.evaluate(params, X_test, y_test)
        history.append({"round": t + 1, "test_accuracy": acc, "test_loss": loss,
                        "epsilon": run_ledger.epsilon,
                        "update_norm": float(np.linalg.norm(updates)), "seconds": seconds})
    info = {**asdict(config), **gm.describe(), "accountant": "rdp",
            "trust": "secure-aggregation", **secure_info(plan, K)}
    return FLResult(params, history, z, history[-1]["epsilon"], config.target_delta, info,
                    events)
