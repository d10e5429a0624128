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
``K / min_clients`` times the variance). When that scale needs a modulus above
``2^30`` (:data:`FIT_BITS`, the largest Flower's SecAgg+ carries), the plan halves
``gamma`` until the modulus fits, while ``sqrt(p) / (gamma Delta)`` stays at most
``2^-6`` (:data:`ACCOUNTED_INFLATION`, at most 1.6% more noise; :func:`round_plan`), so
that a deployment can run what the simulator runs (Fashion-MNIST's shape, ``p = 7,850``
and ``N = 60,000``: 30 bits at inflation 1.08% instead of 34 bits at 0.07%).

Accounting: every round's sum is dominated by :func:`round_event`, the
:func:`~dpprecond.secagg.sums.sum_event` at :data:`ACCOUNTED_INFLATION` (a ``ZCDpEvent``
depending only on ``z``, not on the data, on ``p`` or on the plan's scale: it covers every
scale :func:`round_plan` may take); a run composes ``T`` of them with dp_accounting's RDP
accountant, and ``z`` is calibrated to the target with
:func:`~dpprecond.accounting.calibrate_noise` on that composition. The guarantee holds
against an honest-but-curious server that sees only the secure sum
(docs/secure_aggregation.md); against the server and ``c`` colluding clients it is that of
the sum with ``(min_clients - c) / min_clients`` of its variance
(:func:`~dpprecond.secagg.skellam.colluding_variance`).

DP-FedFC and DP-FedNew (:class:`~dpprecond.fl.methods.CovarianceMethod`) add one setup
sum before the rounds: client ``i``'s part is the upper triangle (diagonal included, ``m =
(d + 1)(d + 2) / 2`` coordinates) of its clipped feature second moment ``S_i = sum_{x in
D_i} x^ x^^T``, ``x^ = clip_{C_x}([x, 1])``, computed as the local mechanism computes it
(:func:`moment_parts`); the server decodes the sum, mirrors it and divides by ``N``: the
size-weighted second moment ``M = (sum_i S_i + Sk) / N`` (:func:`secure_moment_sum`).
Sensitivity (:func:`moment_sensitivity`): replacing one record ``x`` by ``x'`` changes
``S_i`` by ``x^ x^^T - x'^ x'^^T``, whose Frobenius norm is ``(||x^||^4 + ||x'^||^4 - 2
(x^ . x'^)^2)^(1/2) <= sqrt(2) C_x^2``; the upper triangle's L2 norm is at most the
Frobenius norm, and the bound is approached (two huge rows along orthogonal axes, clipped
to ``C_x``: the constant coordinate vanishes and the difference is diagonal), so ``sqrt(2)
C_x^2`` (:func:`~dpprecond.fl.client.covariance_sensitivity`) is the tight upper-triangle
bound, not a looser one. The float64 Gram sum of a client of at most ``n`` rows adds the
factor :func:`~dpprecond.fl.client.gram_inflation` ``(n)``, the local mechanism's own
(there per client; here at the largest client, one plan for all), so ``Delta_cov =
sqrt(2) C_x^2 gram_inflation(max_i |D_i|)``. The coupled rounded parts then differ by at
most ``gamma Delta_cov + sqrt(m)`` in L2, as for every secure sum.

The server halves then run on the aggregate: the secure sum is the one row of the setup
(``{"moment": M[None]}``, client list ``[0]``) and each round's decoded mean gradient
``G`` the one row of its replies, so DP-FedFC's ``P = (PSD(M) + gamma I)^{-1}`` steps
``W <- W - lr P G`` and DP-FedNew runs its ADMM with a single member (the aggregate): its
dual stays 0 and the step is ``y_t = (hessian_scale PSD(M) + (alpha + rho) I)^{-1} (G_t
+ rho y_{t-1})``, ``W <- W - lr y_t`` (the server holds no per-client statistic under
secure aggregation, so the per-client solvers of the local form do not exist). Both are
post-processing of the sums.

Accounting of the covariance methods: the run is one setup sum at ``z_cov`` and ``T``
round sums at ``z_grad``, each dominated by :func:`~dpprecond.secagg.sums.sum_event` at
its multiplier; the multipliers keep the local schedule's ratio
(:meth:`~dpprecond.fl.accounting.Schedule.multipliers`: ``z_cov = c / sqrt(s)``, ``z_grad
= c sqrt(T / (1 - s))``, ``s = covariance_share``), and the one scale ``c`` is calibrated
with :func:`~dpprecond.accounting.calibrate_noise` (RDP) on the composition of the ``1 +
T`` events (:func:`secure_multipliers`); an explicit ``noise_multiplier`` is ``c``, as
under local trust. Every event is recorded before its sum is formed.

Client-level DP (``mechanism="client-level"``, the DP-FedAvg of McMahan et al. 2018 with
the trusted aggregator replaced by secure aggregation, as in Kairouz, Liu and Steinke
2021): client ``i``'s part is its clipped update ``clip_C(Delta_i)``
(:func:`~dpprecond.fl.client.client_level_updates`: ``local_steps`` non-private local
full-batch steps at ``local_lr``, their average gradient, clipped overflow-safely to
computed norm at most ``C``), and the server divides the decoded sum by the number of
clients it holds (uniform weights; ``K`` in the simulator, the survivors in a
deployment, both public):

    G = (sum_i R(gamma clip_C(Delta_i)) + Sk) / (gamma K).

Privacy unit: one client, replace-one (every record of one client may change), which also
covers one record. Sensitivity :func:`~dpprecond.fl.client.client_level_sensitivity`
``2C``: the replaced client's computed part moves by at most ``2C`` and no other part
changes (no floating-point slack: the sum of the parts is the exact integer sum, never a
float one). The sum's magnitude is at most ``K C``, so the modulus is sized for ``K`` terms
of norm at most ``Delta``. Accounting: the same :func:`round_event` per round as the
record-level sums (an event of ``z`` alone), ``T`` of them composed, at the client level.
A client-level message does not carry the client's record count (it sends 1: the server
learns the number of summed clients, which it knows).

Supported: the one-message gradient methods (``fedgd``, the SOFIM forms, ``adam``,
``yogi``) with the full-batch mechanism and size weighting, or with the client-level
mechanism (uniform weighting, any ``local_steps``); the covariance methods (``fedfc``,
``fednew``) with the full-batch mechanism and size weighting; the client-level forms of
``fedavg`` and ``fedprox`` (their own local steps, FedProx's proximal term, DP-FedAvg's
server step; :mod:`dpprecond.fl.methods.local`). The record-level local-step methods
(``fedavg``, ``scaffold``, ``fedprox``: noise at every local step), client-level
``scaffold`` and every other setting are refused with an error naming it;
``mechanism="client-level"`` with ``fedgd`` and ``local_steps > 1`` is the client-level
DP-FedAvg, the same release as client-level ``fedavg``.

Adaptive clipping (``adaptive_clip="auto"``, the default, for the one-message gradient
methods at the full-batch mechanism): each round's count is one more coordinate of the
clients' parts, each round has the plan of its clip, and the event is the same
:func:`round_event`, so the epsilon is the fixed clip's (:mod:`dpprecond.secagg.adaptive`).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np
from dp_accounting import dp_event
from tqdm.auto import tqdm

from dpprecond._validation import (
    check_array,
    check_int,
    check_labels,
    check_positive,
    check_seed,
    check_target_delta,
)
from dpprecond.accounting import PrivacyLedger, calibrate_noise
from dpprecond.clipping import check_width
from dpprecond.fl import client as client_mod
from dpprecond.fl.accounting import Schedule
from dpprecond.fl.adaptive_clip import resolve_adaptive_clip, secure_counts
from dpprecond.fl.config import FLConfig
from dpprecond.fl.data import ClientData
from dpprecond.fl.methods import CovarianceMethod, GradientMethod, Method, RunSpec
from dpprecond.fl.methods.local import LocalStepsMethod
from dpprecond.fl.models import FLModel, round_evaluator
from dpprecond.fl.result import FLResult, as_method
from dpprecond.fl.server import GradientTransformation
from dpprecond.secagg.adaptive import SecureClip, counted_parts, split_counted_sum
from dpprecond.secagg.rounds import (
    ACCOUNTED_INFLATION,
    FIT_BITS,
    part_sensitivity,
    round_event,
    round_plan,
)
from dpprecond.secagg.skellam import check_shares
from dpprecond.secagg.sums import SumPlan, client_message, secure_sum
from dpprecond.secure import SECURE_ROOT

__all__ = ["ACCOUNTED_INFLATION", "FIT_BITS", "check_secure_aggregation", "client_level_plan",
           "client_part", "is_client_level", "local_work", "moment_parts", "moment_plan",
           "moment_sensitivity", "part_sensitivity",
           "round_event", "round_parts", "round_plan", "secure_gradient_sum", "secure_info",
           "secure_message", "secure_moment_sum", "secure_multipliers",
           "secure_noise_multiplier", "secure_plan", "secure_plan_event", "server_half",
           "simulate_secure"]

logger = logging.getLogger(__name__)

def is_client_level(config: Any) -> bool:
    """Whether a run's parts are the clients' clipped updates (``mechanism="client-level"``)
    rather than their clipped gradient sums."""
    return getattr(config, "mechanism", "full-batch") == "client-level"


def secure_plan(model: FLModel, config: FLConfig, data: ClientData, noise_multiplier: float,
                min_clients: int, max_client_rows: int | None = None) -> SumPlan:
    """The plan of a run's round sums (:func:`~dpprecond.secagg.sums.plan_sum`):
    ``p = n_params`` coordinates, sensitivity :func:`part_sensitivity` for clients of at
    most ``max_client_rows`` rows in ``config.precision``, the noise multiplier, and the
    modulus sized for all ``N`` records and ``K`` shares.

    ``max_client_rows`` defaults to ``N``: the public bound a deployment's server has
    (:class:`~dpprecond.adapters.flower.secagg.SecAggDPStrategy`'s default too), so that a
    seeded simulation and a deployment plan the same sums; the slack
    (:func:`dpprecond.fl.kernels.rounding_slack`) grows like ``2 N^2 2^-53``: ``8e-7`` at
    ``N = 60,000`` against ``2e-9`` for a client of 3,000 rows. A smaller value must cover
    the largest client (``ValueError`` otherwise).
    """
    sizes = np.diff(data.bounds)
    largest = int(sizes.max(initial=1))
    n_records = int(data.X.shape[0])
    rows = max(n_records, 1) if max_client_rows is None else check_int(
        "max_client_rows", max_client_rows, low=max(largest, 1))
    if is_client_level(config):
        return client_level_plan(model, config.clip_norm, noise_multiplier,
                                 n_clients=data.n_clients, min_clients=min_clients)
    dtype = np.float32 if config.precision == "float32" else np.float64
    delta = part_sensitivity(model, config.clip_norm, rows, dtype)
    return round_plan(model.n_params, delta, noise_multiplier, n_rows=int(data.X.shape[0]),
                      n_clients=data.n_clients, min_clients=min_clients)


def client_level_plan(model: FLModel, clip_norm: float, noise_multiplier: float, *,
                      n_clients: int, min_clients: int) -> SumPlan:
    """The plan of a client-level round's sum (module docstring): ``p = n_params``
    coordinates, sensitivity ``2C`` (:func:`~dpprecond.fl.client.client_level_sensitivity`),
    the modulus sized for ``K`` parts of norm at most ``C``. The simulator and the SecAgg+
    server and clients all plan with it."""
    clip_norm = check_positive("clip_norm", clip_norm)
    check_width("the model's parameters", int(model.n_params))
    return round_plan(model.n_params, client_mod.client_level_sensitivity(clip_norm),
                      noise_multiplier, n_rows=n_clients, n_clients=n_clients,
                      min_clients=min_clients)


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
        return dp_event.SelfComposedDpEvent(round_event(z), t)

    return calibrate_noise(event, config.target_epsilon, config.target_delta, "rdp")


def secure_plan_event(model: FLModel, config: FLConfig,
                      method: Method | None = None) -> dp_event.DpEvent:
    """The whole run's event under secure aggregation, from the settings alone.

    A gradient method (the default when ``method`` is ``None``): ``T`` compositions of
    :func:`~dpprecond.secagg.sums.sum_event` at the run's ``z``. A covariance method
    (``fedfc``, ``fednew``): the setup sum's event at ``z_cov`` composed with ``T`` at
    ``z_grad`` (:func:`secure_multipliers`). It depends only on the settings (not on the
    data or the model), so a caller can check a plan against a ledger before touching any
    data; it is the composition of the events :func:`simulate_secure` records.
    """
    del model  # the event does not depend on the model's size
    config = config.validated()
    if isinstance(method, CovarianceMethod):
        return _covariance_event(method.schedule(config), _covariance_scale(method, config))
    z = secure_noise_multiplier(config)
    return dp_event.SelfComposedDpEvent(round_event(z), config.n_rounds)


def local_work(method: Method, config: FLConfig) -> dict[str, Any]:
    """The local steps of a client-level part (:func:`round_parts`): the method's own for
    the local-step methods (``fedavg``, ``fedprox``: ``local_steps``, ``local_lr`` and the
    proximal ``mu``), ``config.local_steps`` and ``config.local_lr`` for the gradient
    methods. Public settings; the simulator and the SecAgg+ strategy both read them here."""
    if isinstance(method, LocalStepsMethod):
        return {"local_steps": method.local_steps, "local_lr": method.local_lr,
                "proximal_mu": method.proximal_mu}
    return {"local_steps": int(config.local_steps), "local_lr": float(config.local_lr),
            "proximal_mu": 0.0}


def round_parts(model: FLModel, params: np.ndarray, X: Any, y: np.ndarray,
                bounds: np.ndarray, clip_norm: float, *, client_level: bool = False,
                local_steps: int = 1, local_lr: float = 0.1, proximal_mu: float = 0.0,
                x_sq_norms: Any = None) -> np.ndarray:
    """Every client's part of a round's sum, ``(K, p)``: its records' clipped gradient sum
    (``model.clipped_grad_sums``), or with ``client_level`` its clipped update
    (:func:`~dpprecond.fl.client.client_level_updates` after ``local_steps`` steps at
    ``local_lr``, with FedProx's proximal term ``proximal_mu``)."""
    if client_level:
        return client_mod.client_level_updates(model, params, X, y, bounds, clip_norm,
                                               local_steps=local_steps, local_lr=local_lr,
                                               proximal_mu=proximal_mu)
    return model.clipped_grad_sums(params, X, y, bounds, clip_norm, x_sq_norms=x_sq_norms)


def client_part(model: FLModel, params: np.ndarray, X: np.ndarray, y: np.ndarray,
                clip_norm: float, *, client_level: bool = False, local_steps: int = 1,
                local_lr: float = 0.1, proximal_mu: float = 0.0) -> np.ndarray:
    """One client's part of a round's sum, ``(p,)``: :func:`round_parts` of its own rows."""
    return round_parts(model, params, X, y, np.array([0, X.shape[0]]), clip_norm,
                       client_level=client_level, local_steps=local_steps,
                       local_lr=local_lr, proximal_mu=proximal_mu)[0]


def secure_message(model: FLModel, params: np.ndarray, X: np.ndarray, y: np.ndarray,
                   clip_norm: float, plan: SumPlan, rng: Any, *, client_level: bool = False,
                   local_steps: int = 1, local_lr: float = 0.1,
                   proximal_mu: float = 0.0) -> np.ndarray:
    """One client's message of a round (int64 in ``[0, 2^bits)``): :func:`client_part`,
    then :func:`~dpprecond.secagg.sums.client_message` with the client's ``rng`` (its
    rounding's uniforms, then its Skellam share)."""
    part = client_part(model, params, X, y, clip_norm, client_level=client_level,
                       local_steps=local_steps, local_lr=local_lr, proximal_mu=proximal_mu)
    return client_message(part, plan, rng)


def secure_gradient_sum(model: FLModel, params: np.ndarray, X: Any, y: np.ndarray,
                        bounds: np.ndarray, clip_norm: float, plan: SumPlan,
                        rngs: list[Any], clients: list[int] | None = None, *,
                        x_sq_norms: Any = None, client_level: bool = False,
                        local_steps: int = 1, local_lr: float = 0.1,
                        proximal_mu: float = 0.0) -> np.ndarray:
    """The decoded secure sum of a round, in the parts' units (shape ``(n_params,)``).

    The parts of all clients (rows ``bounds[i]:bounds[i+1]`` are client ``i``'s) come from
    one call of :func:`round_parts` (the clipped gradient sums, or with ``client_level``
    the clipped updates after ``local_steps`` steps at ``local_lr`` with ``proximal_mu``);
    client ``i`` forms its message with
    ``rngs[i]`` (:func:`~dpprecond.secagg.sums.secure_sum`); ``clients`` lists whose
    messages reach the sum (default all; fewer than ``plan.min_clients`` raises
    :class:`~dpprecond.secagg.skellam.InsufficientNoiseError` before any part is
    computed). ``x_sq_norms`` optionally caches the rows' squared norms (the kernel's).
    """
    K = len(bounds) - 1
    ids = list(range(K)) if clients is None else [int(i) for i in clients]
    check_shares(len(ids), plan)  # before touching the data
    parts = round_parts(model, params, X, y, bounds, clip_norm, client_level=client_level,
                        local_steps=local_steps, local_lr=local_lr, proximal_mu=proximal_mu,
                        x_sq_norms=x_sq_norms)
    return secure_sum(parts, plan, rngs, ids)


# -- DP-FedFC / DP-FedNew: the setup sum of the clipped feature second moments ---------------


def moment_sensitivity(row_clip: float, max_client_rows: int) -> float:
    """``Delta_cov``: replace-one L2 bound on the change of one client's moment part.

    ``sqrt(2) C_x^2`` (:func:`~dpprecond.fl.client.covariance_sensitivity`, tight for the
    upper triangle, module docstring) times :func:`~dpprecond.fl.client.gram_inflation`
    ``(max_client_rows)``, the bound on the float64 Gram sum's rounding that the local
    mechanism's noise carries too (there per client; the factor grows with the rows, so
    the largest client's covers every client).
    """
    row_clip = check_positive("row_clip", row_clip)
    n = check_int("max_client_rows", max_client_rows, low=1)
    if not 1e-150 <= row_clip <= 1e150:  # row_clip^2 would leave float64's normal range
        raise ValueError(f"row_clip={row_clip:g}: the setup sum's sensitivity sqrt(2) "
                         "row_clip^2 is outside float64's range; rescale the features so "
                         "that a row clip within [1e-150, 1e150] bounds them.")
    return client_mod.covariance_sensitivity(row_clip) * client_mod.gram_inflation(n)


def moment_parts(X: np.ndarray, bounds: np.ndarray, row_clip: float) -> np.ndarray:
    """Every client's part of the setup sum, ``(K, m)``: the upper triangle (diagonal
    included, row-major, ``np.triu_indices``) of ``sum_{x in D_i} x^ x^^T``,
    ``x^ = clip_{C_x}([x, 1])``, computed as :func:`~dpprecond.fl.client.
    second_moment_releases` computes it (float64, overflow-safe clipping)."""
    Xt = client_mod.clip_feature_rows(X, row_clip)
    d1 = Xt.shape[1]
    iu = np.triu_indices(d1)
    K = len(bounds) - 1
    parts = np.empty((K, iu[0].size))
    for i in range(K):
        rows = Xt[bounds[i]:bounds[i + 1]].astype(np.float64, copy=False)
        parts[i] = (rows.T @ rows)[iu]
    return parts


def moment_plan(method: CovarianceMethod, data: ClientData, noise_multiplier: float,
                min_clients: int, max_client_rows: int | None = None) -> SumPlan:
    """The plan of the setup sum (:func:`round_plan`): ``m = (d + 1) (d + 2) / 2``
    coordinates, sensitivity :func:`moment_sensitivity` at the method's row clip for
    clients of at most ``max_client_rows`` rows, ``z_cov``, the modulus sized for ``N``
    records (a record adds at most ``C_x^2 <= Delta_cov`` to a coordinate) and ``K``
    shares.

    ``max_client_rows`` defaults to ``N``, as in :func:`secure_plan` (the public bound a
    SecAgg+ server has, so a seeded simulation and a deployment plan the same sums); a
    smaller value must cover the largest client (``ValueError`` otherwise).
    """
    d1 = int(data.X.shape[1]) + 1
    largest = int(np.diff(data.bounds).max(initial=1))
    n_records = int(data.X.shape[0])
    rows = max(n_records, 1) if max_client_rows is None else check_int(
        "max_client_rows", max_client_rows, low=max(largest, 1))
    delta = moment_sensitivity(method.feature_clip(d1 - 1), rows)
    return round_plan(d1 * (d1 + 1) // 2, delta, noise_multiplier, n_rows=n_records,
                      n_clients=data.n_clients, min_clients=min_clients)


def secure_moment_sum(X: np.ndarray, bounds: np.ndarray, row_clip: float, plan: SumPlan,
                      rngs: list[Any], clients: list[int] | None = None) -> np.ndarray:
    """The decoded, mirrored setup sum ``sum_i S_i + Sk``, shape ``(d + 1, d + 1)``.

    Client ``i``'s part is its row of :func:`moment_parts`, its message formed with
    ``rngs[i]`` (:func:`~dpprecond.secagg.sums.secure_sum`); ``clients`` lists whose
    messages reach the sum (default all; fewer than ``plan.min_clients`` raises
    :class:`~dpprecond.secagg.skellam.InsufficientNoiseError` before any part is
    computed). The lower triangle is the upper one's copy (post-processing).
    """
    K = len(bounds) - 1
    ids = list(range(K)) if clients is None else [int(i) for i in clients]
    d1 = int(X.shape[1]) + 1
    if plan.dim != d1 * (d1 + 1) // 2:
        raise ValueError(f"The plan has dim={plan.dim}, but the upper triangle of a "
                         f"({d1}, {d1}) moment has {d1 * (d1 + 1) // 2} coordinates; plan it "
                         "with moment_plan for these features.")
    check_shares(len(ids), plan)  # before the data
    flat = secure_sum(moment_parts(X, bounds, row_clip), plan, rngs, ids)
    M = np.zeros((d1, d1))
    M[np.triu_indices(d1)] = flat
    return M + np.triu(M, 1).T


def _covariance_event(schedule: Schedule, scale: float) -> dp_event.DpEvent:
    """The setup sum and ``T`` round sums at ``schedule.multipliers(scale)``, composed."""
    z = schedule.multipliers(scale)
    rounds = round_event(z["z_grad"])
    return dp_event.ComposedDpEvent([
        round_event(z["z_cov"]),
        rounds if schedule.n_rounds == 1 else dp_event.SelfComposedDpEvent(rounds,
                                                                           schedule.n_rounds)])


def _covariance_scale(method: CovarianceMethod, config: FLConfig) -> float:
    """The scale ``c`` of a covariance method's run (:func:`secure_multipliers`)."""
    if config.target_epsilon is None:
        return float(config.noise_multiplier or 0.0)
    schedule = method.schedule(config)
    return calibrate_noise(lambda c: _covariance_event(schedule, c), config.target_epsilon,
                           config.target_delta, "rdp")


def secure_multipliers(method: Method, config: FLConfig) -> dict[str, float]:
    """The run's noise multipliers under secure aggregation (settings only, no data).

    A gradient method: ``{"z": secure_noise_multiplier(config)}``. A covariance method:
    ``{"z_cov", "z_grad"}`` at the local schedule's ratio
    (:meth:`~dpprecond.fl.accounting.Schedule.multipliers` of ``method.schedule``), the
    scale ``c`` the explicit ``noise_multiplier`` or calibrated with dp_accounting's RDP
    accountant so that the setup's :func:`~dpprecond.secagg.sums.sum_event` at ``z_cov``
    composed with ``T`` of them at ``z_grad`` meets the target.
    """
    if not isinstance(method, CovarianceMethod):
        return {"z": secure_noise_multiplier(config)}
    return method.schedule(config).multipliers(_covariance_scale(method, config))


def check_secure_aggregation(method: Method, config: FLConfig,
                             secure: bool
                             ) -> GradientMethod | CovarianceMethod | LocalStepsMethod:
    """Refuse, naming the setting, what secure aggregation does not run; return the method.

    It runs the gradient methods, the covariance methods (``fedfc``, ``fednew``) and the
    client-level forms of ``fedavg`` and ``fedprox`` (``mechanism="client-level"``: the
    local steps are not private, the clipped update is the summed part). The record-level
    local-step methods are refused: each local step of a client uses that client's own
    noisy gradient before anything is summed, so a share of the noise (``1 / min_clients``
    of its variance) would leave those releases under-noised, and the update a client
    sends is not a sum of per-record terms with one bounded sensitivity. Client-level
    ``scaffold`` is refused by :meth:`LocalStepsMethod.check_mechanism` (its server
    control variate integrates the summed noise).
    """
    if isinstance(method, LocalStepsMethod) and is_client_level(config):
        method.check_mechanism(config)
    elif not isinstance(method, (GradientMethod, CovarianceMethod)):
        raise ValueError(f"trust='secure-aggregation' runs the one-message gradient methods "
                         f"(fedgd, sofim*, adam, yogi; with mechanism='client-level' and "
                         f"local_steps > 1, fedgd is the client-level DP-FedAvg), the "
                         f"covariance methods (fedfc, fednew) and the client-level forms of "
                         f"fedavg and fedprox; {method.name!r} with mechanism="
                         f"{config.mechanism!r} sends other releases (record-level local "
                         "steps: each step uses the client's own noisy gradient before any "
                         "sum, which a share of the noise does not protect). Use "
                         "mechanism='client-level' (fedavg, fedprox: one client, which also "
                         "covers any one record) or trust='local' for it.")
    if getattr(config, "adaptive_clip", None) not in (None, "auto") and not (
            config.mechanism == "full-batch" and secure_counts(method)):  # "auto": fixed
        raise ValueError(f"adaptive_clip with trust='secure-aggregation' runs with the "
                         f"one-message gradient methods (fedgd, sofim*, adam, yogi; not "
                         f"noise-aware) and mechanism='full-batch', whose round sums carry "
                         f"its count; got {method.name!r} with mechanism="
                         f"{config.mechanism!r}. Drop adaptive_clip (None: the fixed "
                         "clip_norm) for it.")
    if is_client_level(config):
        if isinstance(method, CovarianceMethod):
            raise ValueError(f"mechanism='client-level' with trust='secure-aggregation' runs "
                             f"the one-message gradient methods; {method.name!r} releases a "
                             "record-level second moment first. Use mechanism='full-batch' "
                             "for it.")
        if config.weighting != "uniform":  # FLConfig enforces it; say why here too
            raise ValueError("mechanism='client-level' weighs clients uniformly (a size "
                             "weight would reveal the replaced client's size); set "
                             "weighting='uniform'.")
    elif config.mechanism != "full-batch":
        raise ValueError(f"trust='secure-aggregation' needs mechanism='full-batch' or "
                         f"'client-level', got mechanism={config.mechanism!r}.")
    elif config.weighting != "size":
        raise ValueError(f"trust='secure-aggregation' aggregates the records of all clients "
                         f"in one sum, i.e. weighting='size'; got weighting="
                         f"{config.weighting!r}. Set weighting='size'.")
    del secure  # secure mode runs (the Skellam shares from the OS CSPRNG)
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
                    secure: bool = False, max_client_rows: int | None = None,
                    progress: bool = False,
                    callback: Callable[[dict[str, float]], None] | None = None,
                    checkpoint: str | os.PathLike | None = None,
                    checkpoint_every: int = 10) -> FLResult:
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
    max_client_rows : int, optional
        The bound on a client's records that sizes the round sums' floating-point slack
        (:func:`secure_plan`; default ``N``, as a deployment's server plans it, so that
        the same seed gives a Flower SecAgg+ deployment's releases).
    secure : bool
        Secure mode (:mod:`dpprecond.secure`): every client's rounding uniforms and
        Skellam share (:meth:`~dpprecond.secure.SecureGenerator.poisson`) from the OS
        CSPRNG; ``seed`` must be ``None`` (the model's initialisation still follows the
        run's fresh seed). Nothing is snapped: the noise is integer and is added to
        integer messages, and each release is a fixed function of the integer sum, so no
        floating-point pattern of it depends on the data.
    progress, callback
        As for :func:`~dpprecond.fl.engine.simulate`: a tqdm bar over the rounds, and a
        function called with each round's history record after the round.
    checkpoint, checkpoint_every
        As for :func:`~dpprecond.fl.engine.simulate`: the model, the server half's state
        (a covariance method's holds its setup sum's result, which a resumed run does not
        release again), the adaptive clip's target and applied clips, the history and the
        events so far, and the root seed. Every round's streams are
        derived from the root and the round, so a resumed seeded run releases the
        uninterrupted run's sums; the resumed rounds' events are recorded in the ledger
        again. The fingerprint also covers ``min_clients`` and ``max_client_rows``.

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
        decoded sum's, gradient-sum units, all ``K`` shares). A covariance method's run
        reports ``z_grad`` as ``noise_multiplier`` (as under local trust), its
        ``noise_multipliers`` (``z_cov``, ``z_grad``), and the setup sum's facts under
        ``setup`` (the same keys, second-moment units); its ``events`` are the setup
        sum's then the ``T`` rounds'.
    """
    # it runs secure aggregation whatever config.trust says, and its records say so
    config = replace(config, trust="secure-aggregation").validated()
    checkpoint_every = check_int("checkpoint_every", checkpoint_every, low=1)
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
    if secure and seed is not None:
        raise ValueError(f"secure=True refuses seeds (got seed={seed!r}): a seeded run's "
                         "noise is known to whoever knows the seed; pass seed=None.")
    root = check_seed("seed", seed)
    n_records = int(data.X.shape[0])
    rows = max(n_records, 1) if max_client_rows is None else check_int(
        "max_client_rows", max_client_rows, low=max(int(np.diff(data.bounds).max(initial=1)),
                                                    1))

    def open_resume() -> Resume | None:
        if checkpoint is None:
            return None
        return Resume.open(Path(checkpoint), gm, config, data, model, X_test, y_test, root,
                           seeded=seed is not None, every=checkpoint_every, secure=secure,
                           extra={"min_clients": k_min, "max_client_rows": rows})

    if isinstance(gm, CovarianceMethod):
        return _simulate_covariance(model, data, gm, config, X_test, y_test, root, k_min,
                                    ledger, max_client_rows, _Report(progress, callback),
                                    secure=secure, open_resume=open_resume)
    z = secure_noise_multiplier(config)
    plan = secure_plan(model, config, data, z, k_min, max_client_rows)
    release = round_event(z)
    clip = secure_clip(model, gm, config, z, n_records=n_records, n_clients=K,
                       min_clients=k_min, max_client_rows=rows)
    if clip is not None:  # the first round's plan (public settings) before any charge
        clip.plan()
    if ledger is not None:
        ledger.check(dp_event.SelfComposedDpEvent(release, config.n_rounds))
    resume = open_resume()
    if resume is not None:
        root = resume.root
    X_run, x_sq_norms = client_mod.kernel_rows(data.X, config, model)  # as the engine
    init_seq, noise_root, _ = root.spawn(3)
    if secure:
        noise_root = SECURE_ROOT  # type: ignore[assignment]
    # noise of G per coordinate: K / k_min shares of variance v / k_min each ... / (gamma N)^2
    # (client-level: / (gamma K)^2)
    noise_var = (plan.noise_std(K) / _divisor(config, data)) ** 2
    params = model.init_params(np.random.default_rng(init_seq))
    half = server_half(gm, RunSpec(config, {"z": z}, model, K), noise_var)
    state, step = half.init(params), half.update
    spend = _Spend(config.target_delta, ledger)
    wrap = plan.wrap_probability(K)
    logger.info("secure-aggregation run %s: K=%d, T=%d, z=%.4g, 2^%d modulus, wrap <= %.3g",
                gm.name, K, config.n_rounds, z, plan.bits, wrap)
    if resume is not None and resume.state is not None:  # the rounds done, recorded again
        params, state = resume.state["params"], resume.restore(resume.state["state"], clip)
        resume.charge(spend, release, config.n_rounds)
    params, history = _secure_rounds(
        model, data, config, plan, release, noise_root, X_run, x_sq_norms, params,
        state, step, spend,
        X_test, y_test, clip, _Report(progress, callback), resume, local_work(gm, config))
    info = {**asdict(config), **gm.describe(), "accountant": "rdp",
            "trust": "secure-aggregation", **secure_info(plan, K), "adaptive_clip": None}
    if clip is not None:  # the last round's plan; every round's clip (public)
        info.update(secure_info(clip.plan(clip.norms[-1])[0], K), clip_norms=list(clip.norms),
                    adaptive_clip=asdict(clip.settings))
    return FLResult(params, history, z, history[-1]["epsilon"], config.target_delta, info,
                    spend.events)


class Resume:
    """A secure-aggregation run's checkpoint (:mod:`dpprecond.fl.checkpoint`, the engine's
    format and checks: :func:`~dpprecond.fl.checkpoint.open_checkpoint`): its state when the
    run resumes, and the writes every ``every`` rounds. The saved state is ``(the server
    transform's state, the adaptive clip's {"clip", "norms"} or None)``."""

    def __init__(self, path: Path, fingerprint: str, root: np.random.SeedSequence,
                 state: dict[str, Any] | None, every: int, secure: bool = False) -> None:
        self.path, self.fingerprint, self.root = path, fingerprint, root
        self.state, self.every, self.secure = state, every, secure

    @classmethod
    def open(cls, path: Path, method: Method, config: FLConfig, data: ClientData,
             model: FLModel, X_test: np.ndarray, y_test: np.ndarray,
             root: np.random.SeedSequence, *, seeded: bool, every: int,
             extra: dict[str, Any], secure: bool = False) -> Resume:
        from dpprecond.fl.checkpoint import fingerprint_of, open_checkpoint

        every = check_int("checkpoint_every", every, low=1)
        if secure:  # a secure run's checkpoint and a seeded run's never resume each other
            extra = {**extra, "secure": True}
        fingerprint = fingerprint_of(method, config, data, model, X_test, y_test,
                                     extra=extra)
        state, root = open_checkpoint(path, fingerprint, root, seeded=seeded,
                                      n_rounds=config.n_rounds, model=model)
        return cls(path, fingerprint, root, state, every, secure)

    def charge(self, spend: _Spend, release: dp_event.DpEvent, n_rounds: int) -> None:
        """Record the checkpoint's events again; in secure mode also the ``pending``
        rounds the stopped run may have released after it (one ``release`` each), which
        the resumed run releases again with fresh noise (:mod:`dpprecond.fl.checkpoint`).

        Before any charge, a caller's ledger is checked against all this process will
        spend (the checkpoint's events, the lost rounds and the ``n_rounds - round`` left).
        The lost rounds' charge is written back to the checkpoint before anything is
        released, so a crash of this run before its next checkpoint is charged again on
        the next resume."""
        from dpprecond.fl.checkpoint import lost_rounds, resumed_spend, write_checkpoint

        assert self.state is not None
        done = int(self.state["round"])
        lost = lost_rounds(self.state, self.secure)
        if lost and spend.ledger is not None:
            spend.ledger.check(resumed_spend(self.state["events"], [(release, 1)],
                                             lost + n_rounds - done))
        for event in self.state["events"]:
            spend(event)
        if not lost:
            return
        logger.warning("Secure mode resumes from %s at round %d: the %d rounds after it "
                       "may have been released by the stopped run, and are charged again "
                       "(fresh noise).", self.path, done, lost)
        for _ in range(lost):
            spend(release)
        write_checkpoint(self.path, self.fingerprint, self.root, done, self.state["params"],
                         self.state["state"], self.state["history"], spend.events,
                         int(self.state["pending"]))

    def restore(self, saved: Any, clip: SecureClip | None) -> Any:
        """The transform's state; the clip's target and history set from the checkpoint."""
        if not isinstance(saved, tuple) or len(saved) != 2 or \
                (saved[1] is None) != (clip is None):
            raise ValueError(f"The checkpoint {self.path} does not fit this run (its state "
                             "is not this run's transform and clip); delete it to start the "
                             "run from the beginning.")
        if clip is not None:
            kept = saved[1]
            if not isinstance(kept, dict) or set(kept) != {"clip", "norms"}:
                raise ValueError(f"The checkpoint {self.path} has no adaptive clip state; "
                                 "delete it to start the run from the beginning.")
            clip.clip = check_positive("the checkpoint's clip", kept["clip"])
            clip.norms = [float(v) for v in kept["norms"]]
        return saved[0]

    def save(self, done: int, n_rounds: int, params: np.ndarray, state: Any,
             history: list[dict[str, float]], events: list[dp_event.DpEvent],
             clip: SecureClip | None) -> None:
        """Write the state after ``done`` rounds, every ``every`` rounds before the last."""
        from dpprecond.fl.checkpoint import pending_rounds, write_checkpoint

        if done % self.every or done >= n_rounds:
            return
        kept = None if clip is None else {"clip": float(clip.clip),
                                          "norms": [float(v) for v in clip.norms]}
        write_checkpoint(self.path, self.fingerprint, self.root, done, params,
                         (state, kept), history, events,
                         pending_rounds(self.secure, self.every, done, n_rounds))

    def done(self) -> None:
        """The run completed: the checkpoint (it holds the seed) is deleted."""
        self.path.unlink(missing_ok=True)


class _Spend:
    """The run's ledger (and the caller's): every event recorded before its sum is formed,
    so a round is charged whatever happens to it."""

    def __init__(self, target_delta: float, ledger: PrivacyLedger | None) -> None:
        self.run_ledger = PrivacyLedger(target_delta, accountant="rdp")
        self.ledger = ledger
        self.events: list[dp_event.DpEvent] = []

    def __call__(self, event: dp_event.DpEvent) -> None:
        self.run_ledger.spend(event)
        self.events.append(event)
        if self.ledger is not None:
            self.ledger.spend(event)


def secure_clip(model: FLModel, method: Method, config: FLConfig, noise_multiplier: float,
                *, n_records: int, n_clients: int, min_clients: int,
                max_client_rows: int) -> SecureClip | None:
    """The run's adaptive clip under secure aggregation (:mod:`dpprecond.secagg.adaptive`),
    or ``None`` for the fixed clip (:func:`~dpprecond.fl.adaptive_clip.
    resolve_adaptive_clip`: ``"auto"`` turns it on for the one-message gradient methods at
    the full-batch mechanism). Its plans are sized for ``n_records`` records and
    ``n_clients`` shares, with the slack for clients of at most ``max_client_rows`` rows,
    as :func:`secure_plan`'s; the simulator and the SecAgg+ strategy both build it here."""
    settings = resolve_adaptive_clip(method, config)
    if settings is None:
        return None
    initial = config.clip_norm if settings.initial_clip is None else settings.initial_clip
    return SecureClip(settings, model, initial, noise_multiplier, n_rows=n_records,
                      n_clients=n_clients, min_clients=min_clients,
                      max_client_rows=max_client_rows,
                      dtype=np.float32 if config.precision == "float32" else np.float64)


def _divisor(config: FLConfig, data: ClientData) -> int:
    """What the decoded sum is divided by: ``N`` records (size weights), or ``K`` clients
    (client-level, uniform weights)."""
    return data.n_clients if is_client_level(config) else int(data.X.shape[0])


class _Report:
    """What a run reports as it goes: a tqdm bar over the rounds, a per-round callback."""

    def __init__(self, progress: bool = False,
                 callback: Callable[[dict[str, float]], None] | None = None) -> None:
        self.progress, self.callback = bool(progress), callback

    def rounds(self, n_rounds: int, first: int = 0) -> Any:
        return tqdm(range(first, n_rounds), disable=not self.progress, desc="rounds",
                    leave=False, initial=first, total=n_rounds)

    def __call__(self, record: dict[str, float]) -> None:
        if self.callback is not None:
            self.callback(record)


def server_half(method: GradientMethod | LocalStepsMethod, spec: RunSpec,
                noise_var: float) -> GradientTransformation:
    """The server half of a secure-aggregation run of a gradient or local-step method.

    Post-processing of each round's decoded mean ``G``: ``init(params) -> state`` and
    ``update(G, state, params) -> (updates, state)``. The simulator
    (:func:`simulate_secure`) and the SecAgg+ strategy
    (:class:`~dpprecond.adapters.flower.secagg.SecAggDPStrategy`) both step the model
    with it, so a seeded SecAgg+ run follows the simulator's trajectory.

    Parameters
    ----------
    method : GradientMethod or LocalStepsMethod
        A one-message gradient method, or a client-level local-step method (``fedavg``,
        ``fedprox``; :func:`check_secure_aggregation` refuses the others).
    spec : RunSpec
        The run's settings, multipliers, model and ``K`` clients.
    noise_var : float
        The noise variance per coordinate of ``G`` (a noise-aware transform reads it).

    Returns
    -------
    GradientTransformation
        A gradient method's transform set for ``noise_var``
        (:meth:`~dpprecond.fl.methods.GradientMethod.transform_for`), or the local-step
        method's own server update on ``G`` as the aggregate of all ``K`` clients
        (:meth:`~dpprecond.fl.methods.local.LocalStepsMethod.server_update` on the
        ``"aggregate"`` reply: ``theta <- theta - eta_g L eta_l G``).
    """
    if isinstance(method, GradientMethod):
        return method.transform_for(noise_var)
    clients, ones = list(range(spec.n_clients)), np.ones(spec.n_clients)

    def init(params: np.ndarray) -> Any:
        return method.server_init(spec, params)

    def update(G: np.ndarray, state: Any, params: np.ndarray) -> tuple[np.ndarray, Any]:
        return method.server_update(spec, {"aggregate": G[None, :]}, clients, ones, state,
                                    params)

    return GradientTransformation(init, update)


def _secure_rounds(model: FLModel, data: ClientData, config: FLConfig, plan: SumPlan,
                   release: dp_event.DpEvent, noise_root: np.random.SeedSequence,
                   X_run: Any, x_sq_norms: Any, params: np.ndarray, state: Any,
                   step: Any, spend: _Spend, X_test: np.ndarray,
                   y_test: np.ndarray, clip: SecureClip | None = None,
                   report: _Report | None = None, resume: Resume | None = None,
                   work: dict[str, Any] | None = None
                   ) -> tuple[np.ndarray, list[dict[str, float]]]:
    """The ``T`` secure gradient rounds of a run: each round's event recorded, the secure
    sum of the clients' parts (streams ``(t, i)`` of ``noise_root``), its size-weighted
    mean ``G`` (client-level: the mean over clients) handed to ``step(G, state, params) ->
    (updates, state)`` (the server half, post-processing), and the round's history
    record. With ``clip`` (adaptive clipping) each round's parts carry the count
    (:func:`~dpprecond.secagg.adaptive.counted_parts`, the round's own plan) and the
    decoded count moves the clip. With ``resume`` the rounds start after the checkpoint's
    and a checkpoint is written every ``resume.every`` rounds. ``work``: the local steps
    of a client-level part (:func:`local_work`; default the config's)."""
    K = data.n_clients
    divisor = _divisor(config, data)
    client_level = is_client_level(config)
    work = {"local_steps": int(config.local_steps), "local_lr": float(config.local_lr)} \
        if work is None else work
    history: list[dict[str, float]] = []
    first = 0
    if resume is not None and resume.state is not None:
        history, first = list(resume.state["history"]), int(resume.state["round"])
    report = _Report() if report is None else report
    evaluate = round_evaluator(model, X_test, y_test)
    for t in report.rounds(config.n_rounds, first):
        start = time.perf_counter()
        rngs = client_mod.round_generators(noise_root, t, K)
        if clip is not None:  # the round's plan from the public clip, before the charge
            used = clip.applied()
            counted, weight = clip.plan()
            check_shares(K, counted)
        spend(release)  # before the shares are computed: charged regardless
        if clip is None:
            G = secure_gradient_sum(model, params, X_run, data.y,
                                    data.bounds, config.clip_norm, plan, rngs,
                                    x_sq_norms=None if client_level else x_sq_norms,
                                    client_level=client_level, **work)
        else:  # the round's clip, its own plan, the count in the sum
            parts = counted_parts(model, params, X_run, data.y, data.bounds, used, weight,
                                  x_sq_norms=x_sq_norms)
            G, count = split_counted_sum(secure_sum(parts, counted, rngs, list(range(K))),
                                         weight)
            clip.update(count / divisor)
        updates, state = step(G / divisor, state, params)
        params = params + updates
        seconds = time.perf_counter() - start
        loss, acc = evaluate(params)
        history.append({"round": t + 1, "test_accuracy": acc, "test_loss": loss,
                        "epsilon": spend.run_ledger.epsilon,
                        "update_norm": float(np.linalg.norm(updates)), "seconds": seconds})
        if clip is not None:
            history[-1]["clip_norm"] = used
        report(history[-1])
        if resume is not None:
            resume.save(t + 1, config.n_rounds, params, state, history, spend.events, clip)
    if resume is not None:
        resume.done()
    return params, history


def _simulate_covariance(model: FLModel, data: ClientData, method: CovarianceMethod,
                         config: FLConfig, X_test: np.ndarray, y_test: np.ndarray,
                         root: np.random.SeedSequence, k_min: int,
                         ledger: PrivacyLedger | None,
                         max_client_rows: int | None = None,
                         report: _Report | None = None, *, secure: bool = False,
                         open_resume: Callable[[], Resume | None] = lambda: None
                         ) -> FLResult:
    """DP-FedFC / DP-FedNew under secure aggregation (module docstring): the setup sum of
    the clipped second moments, then ``T`` secure gradient sums, the server half on the
    aggregate (one row). Streams: the model's init, the rounds' ``(t, i)`` and the setup's
    ``(0, i)`` from ``root.spawn(3)``, as in :func:`~dpprecond.fl.engine.simulate`.

    ``open_resume()`` gives the run's checkpoint (:class:`Resume`) or ``None``. The setup
    sum's result is part of the server half's state (post-processing of the released
    sum), so a checkpoint keeps it: a resumed run neither recomputes nor re-releases the
    setup sum, and records the setup's and the done rounds' events again."""
    method.check(config, model)
    multipliers = secure_multipliers(method, config)
    z_cov, z_grad = multipliers["z_cov"], multipliers["z_grad"]
    setup_plan = moment_plan(method, data, z_cov, k_min, max_client_rows)
    plan = secure_plan(model, config, data, z_grad, k_min, max_client_rows)
    setup_release, release = round_event(z_cov), round_event(z_grad)
    T = config.n_rounds
    if ledger is not None:  # the whole plan, before any data is touched
        ledger.check(_covariance_event(method.schedule(config),
                                       _covariance_scale(method, config)))
    K = data.n_clients
    n_records = int(data.X.shape[0])
    resume = open_resume()
    if resume is not None:
        root = resume.root
    X_run, x_sq_norms = client_mod.kernel_rows(data.X, config, model)  # as the engine
    init_seq, noise_root, setup_root = root.spawn(3)
    if secure:
        noise_root = setup_root = SECURE_ROOT  # type: ignore[assignment]
    spend = _Spend(config.target_delta, ledger)
    spec = RunSpec(config, multipliers, model, K)
    params = model.init_params(np.random.default_rng(init_seq))
    n_features = int(data.X.shape[1])
    # the aggregate is the server half's one client: its setup row and its reply rows
    one, sizes = [0], np.array([n_records])
    if resume is not None and resume.state is not None:  # the setup and rounds done
        params, state = resume.state["params"], resume.restore(resume.state["state"], None)
        resume.charge(spend, release, config.n_rounds)
    else:
        spend(setup_release)
        S = secure_moment_sum(data.X, data.bounds, method.feature_clip(n_features),
                              setup_plan, client_mod.round_generators(setup_root, 0, K))
        state = method.server_init(spec, params, {"moment": (S / n_records)[None]}, one)
    logger.info("secure-aggregation run %s: K=%d, T=%d, z_cov=%.4g, z_grad=%.4g, 2^%d and "
                "2^%d moduli", method.name, K, T, z_cov, z_grad, setup_plan.bits, plan.bits)

    def step(G: np.ndarray, state: Any, params: np.ndarray) -> tuple[np.ndarray, Any]:
        return method.server_update(spec, {"message": G[None]}, one, sizes, state, params)

    params, history = _secure_rounds(model, data, config, plan, release, noise_root, X_run,
                                     x_sq_norms, params, state, step, spend, X_test, y_test,
                                     report=report, resume=resume)
    info = {**asdict(config), **method.describe(), "accountant": "rdp",
            "trust": "secure-aggregation", **secure_info(plan, K), "adaptive_clip": None,
            "noise_multipliers": dict(multipliers), "setup": secure_info(setup_plan, K)}
    return FLResult(params, history, z_grad, history[-1]["epsilon"], config.target_delta,
                    info, spend.events)
