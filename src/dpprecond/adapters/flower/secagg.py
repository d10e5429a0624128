"""Secure aggregation on Flower: distributed Skellam noise through Flower's SecAgg+.

Each client computes its message of a round's secure sum
(:func:`dpprecond.secagg.fl.secure_message`: its records' clipped gradient sum, from the
model's fused kernel, scaled by ``gamma``, rounded with shared-uniform stochastic rounding,
plus its share of the Skellam noise, modulo ``m = 2^bits``; :mod:`dpprecond.secagg.sums`)
and hands it, as a vector of integers, to Flower's ``secaggplus_mod``; Flower's
``SecAggPlusWorkflow`` masks the vectors pairwise and reveals only their sum to the
server, which decodes it and runs the method's server transform. The same plan, seeds and
streams as :func:`dpprecond.secagg.fl.simulate_secure` run by ``run_federated(...,
trust="secure-aggregation", seed=s)`` (a ``noise-seed`` means the same seed tree as under
local trust, :func:`~dpprecond.adapters.flower.protocol.simulator_seeds`), so a seeded
simulation releases
the same sums and ends at the same model (tested; both plan the sensitivity's slack for
clients of at most ``max_client_rows`` records, ``N`` by default).

SecAgg+ is Flower's legacy fit/evaluate workflow: :class:`SecAggDPStrategy` is a
``flwr.server.strategy.Strategy`` run by ``DefaultWorkflow(fit_workflow=SecAggPlusWorkflow
(...))`` (:func:`make_secagg_server_app`), and the client a ``NumPyClient`` wrapped by
``secaggplus_mod`` (:func:`make_secagg_client_app`).

Making SecAgg+'s own arithmetic exact on the messages: let ``m = 2^bits`` be a sum's
modulus and ``q`` SecAgg+'s quantization range, the largest modulus of the run's plans (a
covariance method's setup sum may need another; every plan's modulus divides ``q``; the
requests carry it as ``secagg-range``). Every client reports ``num_examples = 1`` and the
workflow runs with ``max_weight = q``, so each client's weight factor is ``round(1/q * q)
= 1`` and the total factor the server divides by is the number of survivors ``K'``, not
``K' q`` (which would wrap SecAgg+'s modulus). The client sends ``q x_i``: its centred
message ``x_i`` in ``[-m/2, m/2)`` (congruent to its message modulo ``m``) followed by its
record count ``n_i``, times ``q`` (exact: a power of two). SecAgg+ multiplies it by its
weight ``1/q`` (exact) and, with ``clipping_range = q/2`` and ``quantization_range = q``,
its stochastic quantization maps each ``x_i`` to the integer ``x_i + q/2`` exactly; it
sums those modulo ``M = 2^31`` (``modulus_range``) and hands the strategy ``(S - K' q/2)
q / K'`` with ``S`` the modular sum. The strategy recovers the integer ``T = S - K' q/2``
(rounded to the nearest integer: three float64 roundings err by at most ``3 2^-53 |T|``,
``|T| <= K' q/2 + M``, below ``2^-8`` for ``K' <= 2^14``, :data:`MAX_SECAGG_CLIENTS`,
above which the strategy refuses the federation), which is congruent to ``sum_i x_i``
modulo ``M``, hence modulo ``m`` (``m`` divides ``M``): the wrap of SecAgg+'s own sum
costs nothing. So a plan needs only ``q < M``: at most 30 bits
(:data:`~dpprecond.secagg.fl.FIT_BITS`, which the simulator's plans fit when they can),
for every ``K`` up to :data:`MAX_SECAGG_CLIENTS`. The server reduces the sum modulo ``m``
(the secure sum of the messages), decodes it (refused below ``min_clients`` survivors)
and divides by ``sum_i n_i`` (size weighting; the counts' sum, below ``M``, is read
modulo ``M``).

Methods: the one-message gradient methods, the covariance methods (``fedfc``,
``fednew``) and the client-level forms of ``fedavg`` and ``fedprox``
(:func:`check_secagg_plus_method`). A covariance method's run is ``T + 1``
SecAgg+ rounds: round 1 is the setup sum of the clients' clipped second moments
(:func:`~dpprecond.secagg.fl.moment_parts`, its plan ``plan-kind = "moment"``, each
client's message from its setup stream ``(0, i)``), then the ``T`` gradient rounds, as
:func:`~dpprecond.secagg.fl.simulate_secure` runs them.

Client-level DP (``mechanism="client-level"``: the gradient methods, ``fedgd`` with
``local_steps > 1`` being the client-level DP-FedAvg, and ``fedavg`` and ``fedprox`` with
their own local steps): the requests carry ``plan-unit = "client"`` with
``plan-local-steps``, ``plan-local-lr`` and ``plan-local-prox`` (FedProx's proximal
coefficient ``mu``, 0 otherwise; all three public, from
:func:`~dpprecond.secagg.fl.local_work`), and each client's part is its clipped update
(:func:`~dpprecond.fl.client.client_level_updates`, the simulator's function) under the
plan of :func:`~dpprecond.secagg.fl.client_level_plan` (sensitivity ``2C``, a client
checks it); its count coordinate is 1 instead of its size, so the server divides by the
number of summed clients (uniform weights) and learns no client's size. The server steps
the model with the simulator's server half (:func:`~dpprecond.secagg.fl.server_half`:
the gradient method's transform, or ``fedavg``'s and ``fedprox``'s ``theta <- theta -
eta_g L eta_l G``). A client-level run needs no trusted aggregator: the secure sum
replaces it. Client-level ``scaffold`` is refused (its server control variate would
integrate every round's noise, :mod:`dpprecond.fl.methods.local`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict
from typing import Any

import numpy as np
from dp_accounting import dp_event
from flwr.app import Context, Message, MessageType
from flwr.client import NumPyClient
from flwr.client.mod import secaggplus_mod
from flwr.clientapp import ClientApp
from flwr.common import (
    Code,
    EvaluateIns,
    EvaluateRes,
    FitIns,
    FitRes,
    Parameters,
    Scalar,
    Status,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.common.secure_aggregation.secaggplus_constants import (
    RECORD_KEY_CONFIGS,
)
from flwr.compat.common import recorddict_compat as compat
from flwr.server import ServerConfig
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.compat import LegacyContext
from flwr.server.strategy import Strategy
from flwr.server.workflow import DefaultWorkflow, SecAggPlusWorkflow
from flwr.serverapp import Grid, ServerApp

from dpprecond._validation import (
    check_array,
    check_int,
    check_labels,
    check_positive,
    check_seed,
)
from dpprecond.accounting import PrivacyLedger
from dpprecond.adapters.flower.client_app import (
    LoadData,
    _as_bool,
    _run_config_seed,
    client_info,
    query_reply,
    train_reply,
)
from dpprecond.adapters.flower.pca import add_pca_handler
from dpprecond.adapters.flower.pca_secagg import SECURE_REQUEST_KEY, secure_pca_reply
from dpprecond.adapters.flower.protocol import simulator_seeds
from dpprecond.adapters.flower.secaggplus import (
    MAX_SECAGG_CLIENTS,
    SECAGG_MODULUS,
    check_secaggplus_state,
    exact_vector,
    exact_workflow,
    recovered_sum,
    ring_threshold,
    secaggplus_when_asked,
)
from dpprecond.fl import client as client_mod
from dpprecond.fl.config import FLConfig
from dpprecond.fl.methods import CovarianceMethod, GradientMethod, Method, RunSpec
from dpprecond.fl.methods.local import LocalStepsMethod
from dpprecond.fl.models import FLModel
from dpprecond.fl.result import FLResult, as_method
from dpprecond.secagg.adaptive import counted_parts, counted_sensitivity, split_counted_sum
from dpprecond.secagg.fl import (
    ACCOUNTED_INFLATION,
    FIT_BITS,
    check_secure_aggregation,
    client_level_plan,
    is_client_level,
    local_work,
    moment_parts,
    moment_sensitivity,
    part_sensitivity,
    round_event,
    round_plan,
    secure_clip,
    secure_info,
    secure_message,
    secure_multipliers,
    secure_noise_multiplier,
    secure_plan_event,
    server_half,
)
from dpprecond.secagg.skellam import decode
from dpprecond.secagg.sums import SumPlan, client_message
from dpprecond.secure import SecureGenerator

__all__ = ["SecAggDPClient", "SecAggDPStrategy", "SetupSumIncompleteError",
           "check_secagg_plus_method",
           "check_secaggplus_request",
           "make_dual_client_app",
           "make_secagg_client_app",
           "make_secagg_server_app", "plan_from_config", "plan_local_prox", "plan_to_config",
           "plan_unit",
           "run_secagg"]

logger = logging.getLogger(__name__)



#: The two kinds of secure sum a fit request asks for: a round's clipped gradient sums, or
#: the covariance methods' setup sum of clipped second moments (its clip is the row clip).
PLAN_KINDS = ("gradient", "moment")


#: The two parts a gradient round may sum: each client's clipped gradient sum (privacy
#: unit one record) or its clipped update after local steps (one client, client-level DP).
PLAN_UNITS = ("record", "client")


def plan_to_config(plan: SumPlan, clip_norm: float, kind: str = "gradient", *,
                   unit: str = "record", local_steps: int = 1, local_lr: float = 0.1,
                   proximal_mu: float = 0.0) -> dict[str, Scalar]:
    """A round's plan as FitIns config entries (every field is public).

    Parameters
    ----------
    plan : SumPlan
        The round sum's plan.
    clip_norm : float
        The clip norm of the parts (a moment round: the row clip).
    kind : {"gradient", "moment"}
        A gradient round, or a covariance method's setup sum.
    unit : {"record", "client"}
        The privacy unit of a gradient round's parts: clipped gradient sums, or
        client-level clipped updates (gradient rounds only).
    local_steps, local_lr, proximal_mu : int, float, float
        A client-level part's non-private local steps, their step size and FedProx's
        proximal coefficient ``mu`` (``0``: none; client-level parts only), as
        :func:`~dpprecond.secagg.fl.local_work` gives them for the method. Written as
        ``plan-local-steps``, ``plan-local-lr`` and ``plan-local-prox``.
    """
    if kind not in PLAN_KINDS:
        raise ValueError(f"kind={kind!r}: expected one of {PLAN_KINDS}.")
    if unit not in PLAN_UNITS or (unit == "client" and kind != "gradient"):
        raise ValueError(f"unit={unit!r} with kind={kind!r}: expected one of {PLAN_UNITS} "
                         "('client' for gradient rounds only).")
    mu = check_positive("proximal_mu", proximal_mu, allow_zero=True)
    if mu and unit != "client":
        raise ValueError(f"proximal_mu={proximal_mu!r} with unit={unit!r}: the proximal term "
                         "belongs to a client-level part's local steps; pass unit='client' "
                         "or proximal_mu=0.")
    return {"plan-kind": kind, "plan-unit": unit, "plan-local-steps": int(local_steps),
            "plan-local-lr": float(local_lr), "plan-local-prox": mu,
            "plan-clip-norm": float(clip_norm), "plan-dim": plan.dim,
            "plan-sensitivity": plan.sensitivity, "plan-noise-multiplier": plan.noise_multiplier,
            "plan-n-rows": plan.n_rows, "plan-n-clients": plan.n_clients,
            "plan-min-clients": plan.min_clients, "plan-scale": plan.scale,
            "plan-bits": plan.bits}


def plan_kind(config: dict[str, Scalar]) -> str:
    """The kind of secure sum a fit request asks for (``"gradient"`` when absent)."""
    kind = str(config.get("plan-kind", "gradient"))
    if kind not in PLAN_KINDS:
        raise ValueError(f"The fit request's plan-kind={kind!r} is not one of {PLAN_KINDS}; "
                         "refusing to answer.")
    return kind


def quantization_range(config: dict[str, Scalar], plan: SumPlan) -> int:
    """SecAgg+'s quantization range ``q`` of the run (``secagg-range``; the plan's modulus
    when absent): a power of two, at least the plan's modulus and below SecAgg+'s
    modulus (``ValueError`` otherwise). ``m`` divides ``q``, so the sum modulo ``q`` gives
    the sum modulo ``m``."""
    q = int(config.get("secagg-range", plan.modulus))
    if q < plan.modulus or q >= SECAGG_MODULUS or q & (q - 1):
        raise ValueError(f"The fit request's secagg-range={q} is not a power of two in "
                         f"[2^{plan.bits}, 2^31); refusing to answer.")
    return q


def plan_unit(config: dict[str, Scalar]) -> tuple[str, int, float]:
    """The privacy unit of a gradient round's parts and a client-level part's local steps
    and step size: ``(unit, local_steps, local_lr)`` (``("record", 1, 0.1)`` when absent:
    a server of an earlier version asks for clipped gradient sums). The proximal
    coefficient: :func:`plan_local_prox`."""
    unit = str(config.get("plan-unit", "record"))
    if unit not in PLAN_UNITS:
        raise ValueError(f"The fit request's plan-unit={unit!r} is not one of {PLAN_UNITS}; "
                         "refusing to answer.")
    steps = check_int("plan-local-steps", config.get("plan-local-steps", 1), low=1)
    lr = check_positive("plan-local-lr", float(config.get("plan-local-lr", 0.1)))
    return unit, steps, lr


def plan_local_prox(config: dict[str, Scalar]) -> float:
    """FedProx's proximal coefficient ``mu`` of a client-level part's local steps
    (``plan-local-prox``; ``0.0`` when absent: a server of an earlier version asks for no
    proximal term).

    Raises
    ------
    ValueError
        A value that is not a finite number ``>= 0`` (a negative, NaN or infinite
        coefficient, a string, a bool): the client refuses to answer.
    """
    mu = config.get("plan-local-prox", 0.0)
    if isinstance(mu, bool) or not isinstance(mu, int | float) or not np.isfinite(mu) \
            or mu < 0:
        raise ValueError(f"The fit request's plan-local-prox={mu!r} is not a finite number "
                         ">= 0 (FedProx's proximal coefficient mu of the local steps); the "
                         "server must send the method's mu (0 for none); refusing to "
                         "answer.")
    return float(mu)


def plan_from_config(config: dict[str, Scalar]) -> tuple[SumPlan, float]:
    """Read a plan written by :func:`plan_to_config`: ``(plan, clip_norm)``.

    The plan is re-derived from its inputs with :func:`~dpprecond.secagg.sums.plan_sum`
    (which validates them), and a sent scale or modulus that differs from the derived one
    is refused.
    """
    try:
        clip_norm = check_positive("plan-clip-norm", float(config["plan-clip-norm"]))
        plan = round_plan(int(config["plan-dim"]), float(config["plan-sensitivity"]),
                          float(config["plan-noise-multiplier"]),
                          n_rows=int(config["plan-n-rows"]),
                          n_clients=int(config["plan-n-clients"]),
                          min_clients=int(config["plan-min-clients"]))
        sent = {"plan-scale": float(config["plan-scale"]), "plan-bits": int(config["plan-bits"])}
    except KeyError as exc:
        raise ValueError(f"The fit request has no {exc.args[0]!r}: the server does not run "
                         "dpprecond's SecAggDPStrategy.") from None
    for key, derived in (("plan-scale", plan.scale), ("plan-bits", plan.bits)):
        if sent[key] != derived:
            raise ValueError(f"The fit request's {key}={sent[key]!r} is not the plan's "
                             f"{derived!r} (derived from its dim, sensitivity, noise "
                             "multiplier, rows and clients); refusing to answer.")
    return plan, clip_norm


class SetupSumIncompleteError(RuntimeError):
    """A covariance method's setup sum released nothing, so its gradient rounds cannot
    run (raised before any of their requests; the setup's epsilon stays charged)."""


class SecAggDPClient(NumPyClient):
    """One client's share of each round's secure sum (wrapped by ``secaggplus_mod``).

    Parameters
    ----------
    model : FLModel
    X, y : ndarray
        The client's own records.
    client_id : int
        Its index ``i`` (the node config's ``partition-id``).
    noise_seed : int or None
        ``None``: fresh OS entropy (deployments). An integer: the stream ``(t - 1, i)`` of
        ``run_federated(..., trust="secure-aggregation", seed=noise_seed)`` (the noise root
        of :func:`~dpprecond.adapters.flower.protocol.simulator_seeds`, as under local
        trust; one-owner simulations and tests).
    min_noise_multiplier : float
        Refuse a plan whose sum's noise multiplier (std over the L2 sensitivity) is below
        this (the client's own floor; a plan without noise is always refused).
    secure : bool
        Secure mode on this client whatever the server asks (the node config's
        ``secure-noise``): the rounding uniforms and the Skellam share from the OS CSPRNG
        (:class:`~dpprecond.secure.SecureGenerator`). A request with ``plan-secure`` (the
        server's ``secure=True``) turns it on too. Either way a seeded client refuses to
        answer.
    n_clients : int, optional
        The federation's size this node was told (its node config's ``num-partitions``;
        both ClientApps pass it): a plan for another ``n_clients`` is refused (each share
        carries ``1 / min_clients`` of the noise and ``min_clients <= n_clients``, so a
        plan announcing more clients than the federation holds under-noises the sum), as
        the SecAgg+ PCA client refuses it. ``None``: not checked.
    """

    def __init__(self, model: FLModel, X: np.ndarray, y: np.ndarray, client_id: int,
                 noise_seed: int | None = None, min_noise_multiplier: float = 0.0,
                 secure: bool = False, *, n_clients: int | None = None) -> None:
        self.model, self.X, self.y = model, X, y
        self.client_id = client_id
        self.n_clients = None if n_clients is None else check_int("n_clients", n_clients,
                                                                  low=1)
        if not isinstance(secure, bool):
            raise TypeError(f"Expected secure to be True or False, got {secure!r}.")
        self.secure = secure
        if secure and noise_seed is not None:
            raise ValueError(f"secure=True refuses seeds (got noise_seed={noise_seed!r}): a "
                             "seeded client's noise is known to whoever knows the seed.")
        seeds = (None if noise_seed is None
                 else simulator_seeds(check_int("noise_seed", noise_seed, low=0)))
        self.noise_root = None if seeds is None else seeds.noise
        self.setup_root = None if seeds is None else seeds.setup
        self.min_noise_multiplier = float(min_noise_multiplier)
        self._range = 0  # SecAgg+'s quantization range, read from each fit request
        self._secure_now = secure  # secure mode for the request being answered

    def fit(self, parameters: list[np.ndarray], config: dict[str, Scalar]
            ) -> tuple[list[np.ndarray], int, dict[str, Scalar]]:
        plan, clip_norm = plan_from_config(config)
        if self.n_clients is not None and plan.n_clients != self.n_clients:
            raise ValueError(f"The fit request's plan-n-clients={plan.n_clients} is not this "
                             f"node's num-partitions={self.n_clients}: each share carries "
                             "1/min_clients of the noise, so a plan for another federation "
                             "size does not give the sum its noise; refusing to answer.")
        if plan.noise_multiplier < self.min_noise_multiplier:
            raise ValueError(f"The plan's noise multiplier {plan.noise_multiplier:g} is below "
                             f"this client's floor {self.min_noise_multiplier:g}; refusing to "
                             "answer.")
        self._range = quantization_range(config, plan)
        self._secure_now = self._secure_asked(config)
        if plan_kind(config) == "moment":
            return self._moment_message(plan, clip_norm)
        unit, local_steps, local_lr = plan_unit(config)
        mu = plan_local_prox(config)
        if unit == "client":
            return self._update_message(parameters, config, plan, clip_norm, local_steps,
                                        local_lr, mu)
        if mu:
            raise ValueError(f"The fit request's plan-local-prox={mu!r} asks for a proximal "
                             "term in a record-level round (plan-unit='record'), whose parts "
                             "are clipped gradient sums without local steps; refusing to "
                             "answer.")
        if "plan-count-weight" in config:
            return self._counted_message(parameters, config, plan, clip_norm)
        own = part_sensitivity(self.model, clip_norm, self.X.shape[0], self.X.dtype)
        if own > plan.sensitivity:
            raise ValueError(f"The plan's sensitivity {plan.sensitivity!r} does not cover this "
                             f"client's computed clipped sum of {self.X.shape[0]} rows "
                             f"({own!r}, the clip norm times its rounding bound): the server's "
                             "max_client_rows is below this client's size; refusing to "
                             "answer.")
        rng = self._round_stream(config)
        params = np.asarray(parameters[0], dtype=np.float64)
        message = secure_message(self.model, params, self.X, self.y, clip_norm, plan, rng)
        return self._send(message, plan)

    def _round_stream(self, config: dict[str, Scalar]) -> Any:
        """The generator of this client's message in the request's round: fresh OS
        entropy, or the simulator's stream ``(t - 1, i)``."""
        t = check_int("round", config.get("round"), low=1)
        if self._secure_now:
            return SecureGenerator()
        return (np.random.default_rng() if self.noise_root is None
                else client_mod.stream(self.noise_root, t - 1, self.client_id))

    def _secure_asked(self, config: dict[str, Scalar]) -> bool:
        """Secure mode for this request: the client's own setting or the server's
        ``plan-secure``; refused (no answer) on a seeded client."""
        asked = config.get("plan-secure", False)
        if not isinstance(asked, bool):
            raise ValueError(f"The fit request's plan-secure={asked!r} is not true or false; "
                             "refusing to answer.")
        if asked and self.noise_root is not None:
            raise ValueError("The server asked for secure-mode noise (plan-secure) but this "
                             "client was given a noise seed; secure mode refuses seeds, so "
                             "it refuses to answer.")
        return self.secure or asked

    def _counted_message(self, parameters: list[np.ndarray], config: dict[str, Scalar],
                         plan: SumPlan, clip_norm: float
                         ) -> tuple[list[np.ndarray], int, dict[str, Scalar]]:
        """A round with adaptive clipping: the client's clipped gradient sum at the round's
        clip and its weighted count (:func:`~dpprecond.secagg.adaptive.counted_parts`), as
        :func:`~dpprecond.secagg.fl.simulate_secure` forms it."""
        weight = check_positive("plan-count-weight", float(config["plan-count-weight"]))
        if plan.dim != self.model.n_params + 1:
            raise ValueError(f"The plan has dim={plan.dim}, but a counted part has "
                             f"{self.model.n_params + 1} coordinates (the parameters and the "
                             "count); refusing to answer.")
        rows = max(int(self.X.shape[0]), 1)
        own = counted_sensitivity(part_sensitivity(self.model, clip_norm, rows,
                                                   self.X.dtype), weight, rows)
        if own > plan.sensitivity:
            raise ValueError(f"The plan's sensitivity {plan.sensitivity!r} does not cover this "
                             f"client's clipped sum and weighted count of {rows} rows "
                             f"({own!r}); refusing to answer.")
        rng = self._round_stream(config)
        params = np.asarray(parameters[0], dtype=np.float64)
        part = counted_parts(self.model, params, self.X, self.y,
                             np.array([0, self.X.shape[0]]), clip_norm, weight)[0]
        return self._send(client_message(part, plan, rng), plan)

    def _update_message(self, parameters: list[np.ndarray], config: dict[str, Scalar],
                        plan: SumPlan, clip_norm: float, local_steps: int, local_lr: float,
                        proximal_mu: float
                        ) -> tuple[list[np.ndarray], int, dict[str, Scalar]]:
        """A client-level round's message: the client's clipped update after
        ``local_steps`` non-private local steps at ``local_lr``, with FedProx's proximal
        term ``proximal_mu`` (:func:`~dpprecond.fl.client.client_level_updates`), rounded
        and noised from its round stream, as :func:`~dpprecond.secagg.fl.simulate_secure`
        with ``mechanism="client-level"`` (the same function,
        :func:`~dpprecond.secagg.fl.secure_message`). Its count coordinate is 1, not the
        client's size (under client-level DP the size is the client's to hide)."""
        if plan.sensitivity < client_mod.client_level_sensitivity(clip_norm):
            raise ValueError(f"The plan's sensitivity {plan.sensitivity!r} is below 2 * "
                             f"plan-clip-norm ({2.0 * clip_norm!r}), the bound on one "
                             "client's clipped update; refusing to answer.")
        rng = self._round_stream(config)
        params = np.asarray(parameters[0], dtype=np.float64)
        message = secure_message(self.model, params, self.X, self.y, clip_norm, plan, rng,
                                 client_level=True, local_steps=local_steps,
                                 local_lr=local_lr, proximal_mu=proximal_mu)
        return self._send(message, plan, count=1)

    def _moment_message(self, plan: SumPlan, row_clip: float
                        ) -> tuple[list[np.ndarray], int, dict[str, Scalar]]:
        """The setup sum's message: the upper triangle of the client's clipped second
        moment (:func:`~dpprecond.secagg.fl.moment_parts`), rounded and noised from its
        setup stream ``(0, i)``, as :func:`~dpprecond.secagg.fl.secure_moment_sum`."""
        d1 = int(self.X.shape[1]) + 1
        if plan.dim != d1 * (d1 + 1) // 2:
            raise ValueError(f"The setup plan has dim={plan.dim}, but this client's "
                             f"{d1 - 1} features give {d1 * (d1 + 1) // 2} moment "
                             "coordinates; refusing to answer.")
        own = moment_sensitivity(row_clip, max(int(self.X.shape[0]), 1))
        if own > plan.sensitivity:
            raise ValueError(f"The setup plan's sensitivity {plan.sensitivity!r} does not "
                             f"cover this client's second moment of {self.X.shape[0]} rows "
                             f"({own!r}); refusing to answer.")
        rng = (SecureGenerator() if self._secure_now
               else np.random.default_rng() if self.setup_root is None
               else client_mod.stream(self.setup_root, 0, self.client_id))
        part = moment_parts(self.X, np.array([0, self.X.shape[0]]), row_clip)[0]
        return self._send(client_message(part, plan, rng), plan)

    def _send(self, message: np.ndarray, plan: SumPlan, count: int | None = None
              ) -> tuple[list[np.ndarray], int, dict[str, Scalar]]:
        # SecAgg+ multiplies by its weight 1/q: exact (adapters/flower/secaggplus.py); the
        # last coordinate is the client's record count (client-level: 1)
        n = self.X.shape[0] if count is None else count
        return [exact_vector(message, plan.modulus, self._range, [n])], 1, {}


def check_secaggplus_request(msg: Message, ctxt: Context) -> None:
    """Refuse a secure-sum fit request that SecAgg+ would not carry exactly and masked.

    The request must come through ``secaggplus_mod`` (its SecAgg+ record is present:
    otherwise the reply, a share with ``1 / min_clients`` of the noise, would reach the
    server unmasked, e.g. from a strategy run without ``SecAggPlusWorkflow``), and the
    SecAgg+ settings this node received in the setup stage must be the ones
    :meth:`SecAggDPStrategy.workflow` sets for the request's ``secagg-range`` ``q``
    (``quantization_range = max_weight = q``, ``clipping_range = q/2``, ``modulus_range =
    2^31``: otherwise SecAgg+'s quantization clips or rescales each share before the sum)
    with a reconstruction threshold ``t`` that keeps at least the plan's ``min_clients``
    survivors in every round SecAgg+ completes (``t K >= s k_min`` for neighbourhoods of
    ``s`` in ``K``; fewer survivors would be unmasked). ``ValueError`` naming what
    differs.
    """
    if RECORD_KEY_CONFIGS not in msg.content.config_records:
        raise ValueError("A secure-sum fit request (fitins with a plan) arrived outside "
                         "Flower's SecAgg+ (no SecAgg+ record): its reply would reach the "
                         "server unmasked. Run the server with SecAggPlusWorkflow "
                         "(make_secagg_server_app / run_secagg); refusing to answer.")
    fitins = compat.recorddict_to_fitins(msg.content, keep_input=True)
    config = dict(fitins.config)
    try:
        q = int(config["secagg-range"])
        k_min = int(config["plan-min-clients"])
    except KeyError as exc:
        raise ValueError(f"The fit request has no {exc.args[0]!r}: the server does not run "
                         "dpprecond's SecAggDPStrategy.") from None
    check_secaggplus_state(ctxt, q, k_min)


def _secaggplus_checked(msg: Message, ctxt: Context, call_next: Any) -> Message:
    """Inside ``secaggplus_mod``: :func:`check_secaggplus_request` on a fit request."""
    if msg.metadata.message_type == MessageType.TRAIN:
        check_secaggplus_request(msg, ctxt)
    return call_next(msg, ctxt)


def make_dual_client_app(load_data: LoadData, *, noise_seed: int | None = None,
                         pca: bool = False) -> ClientApp:
    """One ClientApp for both trust models: dpprecond's local-noise ClientApp
    (:func:`~dpprecond.adapters.flower.client_app.make_client_app`'s ``query`` and
    ``train``) and, for SecAgg+ fit requests, :class:`SecAggDPClient` behind
    ``secaggplus_mod``. The node config's guards apply to both (``allow-seeded-noise``
    for a run-config ``noise-seed``, ``min-noise-multiplier``).

    ``pca=True``: the same nodes also answer dpprecond's federated PCA on the rows
    ``load_data`` gives, under both trust models (the ``query.pca`` requests of
    :func:`~dpprecond.adapters.flower.pca.add_pca_handler`, and a secure fit's SecAgg+
    rounds, told apart from FL rounds by their PCA request, through
    :func:`~dpprecond.adapters.flower.pca_secagg.secure_pca_reply`), as
    :func:`~dpprecond.adapters.flower.pca.make_pca_client_app` does. Off by default: a
    node answers only the kinds of release its operator chose; each PCA release is a
    privacy release of these rows, charged by the server's plan and bounded by the same
    node-config guards.
    """
    if noise_seed is not None:  # when the app is built, as make_client_app
        check_int("noise_seed", noise_seed, low=0)
    app = ClientApp(mods=[secaggplus_when_asked])
    if pca:
        add_pca_handler(app, load_data, noise_seed=noise_seed)

    @app.query()
    def _query(message: Message, context: Context) -> Message:
        return query_reply(message, context)

    @app.train()
    def _train(message: Message, context: Context) -> Message:
        if "fitins.config" not in message.content.config_records:
            return train_reply(message, context, load_data, noise_seed=noise_seed)
        if SECURE_REQUEST_KEY in message.content.config_records["fitins.config"]:
            if not pca:
                raise ValueError("A SecAgg+ federated PCA request reached a ClientApp "
                                 "built without PCA; build it with "
                                 "make_dual_client_app(..., pca=True) to answer it; refusing "
                                 "to answer.")
            return secure_pca_reply(message, context, load_data, noise_seed=noise_seed)
        check_secaggplus_request(message, context)  # masked, exact, or no answer
        info = client_info(context)
        seed = noise_seed if noise_seed is not None else _run_config_seed(info)
        floor, secure = _node_guards(info)  # as the local-noise path reads them
        local = load_data(info)
        fitins = compat.recorddict_to_fitins(message.content, keep_input=True)
        client = SecAggDPClient(local.model, local.X, local.y, info.client_id, seed,
                                floor, secure=secure, n_clients=info.n_clients)
        arrays, n, metrics = client.fit(parameters_to_ndarrays(fitins.parameters),
                                        dict(fitins.config))
        fitres = FitRes(Status(Code.OK, ""), ndarrays_to_parameters(arrays), n, metrics)
        return Message(compat.fitres_to_recorddict(fitres, keep_input=True),
                       reply_to=message)

    return app


def _node_guards(info: Any) -> tuple[float, bool]:
    """The node config's ``min-noise-multiplier`` (a number >= 0, default 0) and
    ``secure-noise`` (a bool or ``"true"``/``"false"``, default false), as every
    dpprecond ClientApp reads them."""
    floor = check_positive("min-noise-multiplier",
                           info.node_config.get("min-noise-multiplier", 0.0), allow_zero=True)
    return floor, _as_bool("secure-noise", info.node_config.get("secure-noise", False))


def make_secagg_client_app(load_data: LoadData, *, noise_seed: int | None = None) -> ClientApp:
    """A ClientApp whose client is :class:`SecAggDPClient`, wrapped by ``secaggplus_mod``.

    The node config's guards apply as in :func:`make_dual_client_app`:
    ``min-noise-multiplier`` (the client's floor) and ``secure-noise`` (secure mode
    whatever the server asks; refused with ``noise_seed``). The run config's
    ``noise-seed`` is never followed (fresh OS entropy unless ``noise_seed`` is given).
    """

    if noise_seed is not None:  # when the app is built, as make_client_app
        check_int("noise_seed", noise_seed, low=0)

    def client_fn(context: Context) -> Any:
        info = client_info(context)
        floor, secure = _node_guards(info)
        local = load_data(info)
        return SecAggDPClient(local.model, local.X, local.y, info.client_id,
                              noise_seed, floor, secure=secure,
                              n_clients=info.n_clients).to_client()

    return ClientApp(client_fn=client_fn, mods=[secaggplus_mod, _secaggplus_checked])


def check_num_shares(num_shares: Any, n_clients: int | None, *, name: str = "num_shares",
                     every: str = "None") -> int:
    """SecAgg+'s neighbourhood size: ``None`` (every client) gives ``K``; otherwise an odd
    integer from 3 to ``K`` (Flower's ring holds a client and ``(s - 1) / 2`` neighbours
    on each side). ``n_clients=None``: ``K`` not known yet (a run config whose federation
    size comes from the SuperNodes), only ``s >= 3`` and odd are checked. ``name`` and
    ``every`` (the value meaning every client) phrase the error for the caller's setting.
    """
    if num_shares is None:
        if n_clients is None:
            raise ValueError(f"{name}={every} (every client) needs n_clients.")
        return n_clients
    s = check_int(name, num_shares, low=3, high=n_clients)
    if s % 2 == 0 and s != n_clients:
        raise ValueError(f"Expected an odd {name} (SecAgg+'s ring holds a client and "
                         f"(s - 1) / 2 neighbours on each side), got {name}={s}; use "
                         f"{s + 1} or {s - 1}, or {every} for every client.")
    return s


def check_secagg_plus_method(method: Method, config: FLConfig
                             ) -> GradientMethod | CovarianceMethod | LocalStepsMethod:
    """The method, if SecAgg+ runs it here: what
    :func:`~dpprecond.secagg.fl.check_secure_aggregation` accepts (the one-message
    gradient methods, the covariance methods with their setup sum as round 1, and the
    client-level forms of ``fedavg`` and ``fedprox``; the record-level local-step methods
    and client-level ``scaffold`` are refused there, with its reasons) and at
    ``precision="float64"`` (the clients' parts are computed from their float64 records,
    so a float32 simulation would not be the deployment's; ``ValueError`` naming it)."""
    checked = check_secure_aggregation(method, config, secure=False)
    if config.precision != "float64":
        raise ValueError(f"Flower's SecAgg+ clients compute their parts from their float64 "
                         f"records; precision={config.precision!r} would make the simulation's "
                         "parts (from the float32 rows) differ from the deployment's. Use "
                         "precision='float64' on SecAgg+, or simulate the float32 run with "
                         "trust='secure-aggregation'.")
    return checked


class SecAggDPStrategy(Strategy):
    """The server of a secure-aggregation run (legacy strategy for ``SecAggPlusWorkflow``).

    It runs what :func:`~dpprecond.secagg.fl.simulate_secure` runs, with the same plans:
    the gradient methods (with adaptive clipping by default, each round's plan at its clip
    and the count in the sum, :mod:`dpprecond.secagg.adaptive`), the covariance methods
    (the setup sum as round 1), and client-level DP (the clipped updates; of the gradient
    methods, and of ``fedavg`` and ``fedprox`` with their own local steps, step size and
    proximal ``mu``), each round's model step the simulator's
    (:func:`~dpprecond.secagg.fl.server_half`).

    Parameters
    ----------
    model, method, config
        As for :func:`dpprecond.secagg.fl.simulate_secure` (``config.trust`` must be
        ``"secure-aggregation"``).
    n_clients : int
        K, the federation's size.
    n_records : int
        N, the records of all clients (public: it sizes the modulus).
    X_test, y_test : ndarray, optional
        Public test data for the server-side evaluation.
    seed : int or None
        Model initialization from ``run_federated(seed=seed)``'s seed tree
        (:func:`~dpprecond.adapters.flower.protocol.simulator_seeds`; ``None``: fresh
        entropy).
    min_clients : int, optional
        Fewest shares a released sum holds (default K).
    max_client_rows : int, optional
        Most records a client holds (public; default ``n_records``, a bound for every
        client): it sizes the sensitivity's floating-point slack
        (:func:`~dpprecond.secagg.fl.part_sensitivity`), and a client with more rows
        refuses the plan. :func:`~dpprecond.secagg.fl.simulate_secure` has the same
        default (and the same parameter), so a seeded simulation plans the same sums.
    ledger : PrivacyLedger, optional
        A caller's ledger: the whole plan is checked against its ``max_epsilon`` here,
        before any message, and every round's sum is recorded in it.
    num_shares : int, optional
        SecAgg+'s neighbourhood size ``s``: each client agrees masks with, and splits its
        secrets among, the ``s - 1`` clients next to it on a ring the server shuffles
        every round (itself and ``(s - 1) / 2`` on each side), instead of every other
        client (the default, ``None``: all ``K``, which is Flower's SecAgg). An odd
        number from 3 to ``K`` (``K`` means all). A client's work per round grows with
        ``s`` instead of ``K``. The released sums, their noise and their accounting do
        not change; what changes is who must collude with the server to unmask one
        client's message: ``t`` of its ``s`` neighbours instead of ``t`` of all ``K``
        clients (:meth:`reconstruction_threshold`; the threat model in
        docs/secure_aggregation.md).
    secure : bool, default=False
        Ask every client for secure-mode noise (``plan-secure`` in each request: the
        rounding and the Skellam share from the OS CSPRNG, :mod:`dpprecond.secure`); a
        seeded client refuses such a request. ``seed`` must then be ``None``.
    """

    def __init__(self, model: FLModel, method: Method | str, config: FLConfig, n_clients: int,
                 n_records: int, *, X_test: np.ndarray | None = None,
                 y_test: np.ndarray | None = None, seed: int | None = None,
                 min_clients: int | None = None, max_client_rows: int | None = None,
                 ledger: PrivacyLedger | None = None, num_shares: int | None = None,
                 secure: bool = False) -> None:
        config = config.validated()
        if not isinstance(secure, bool):
            raise TypeError(f"Expected secure to be True or False, got {secure!r}.")
        if secure and seed is not None:
            raise ValueError(f"secure=True refuses seeds (got seed={seed!r}).")
        self.secure = secure
        if config.trust != "secure-aggregation":
            raise ValueError(f"SecAggDPStrategy needs trust='secure-aggregation', got "
                             f"trust={config.trust!r}.")
        self.method = check_secagg_plus_method(as_method(method), config)
        self.model, self.config = model, config
        self.n_clients = check_int("n_clients", n_clients, low=2)
        if self.n_clients > MAX_SECAGG_CLIENTS:
            raise ValueError(f"n_clients={self.n_clients} is above the {MAX_SECAGG_CLIENTS} "
                             "clients whose SecAgg+ sum the strategy reads back exactly (its "
                             "float64 average errs by up to 3 2^-53 K' 2^29); run a smaller "
                             "federation per SecAgg+ run, or simulate it with "
                             "trust='secure-aggregation'.")
        self.n_records = check_int("n_records", n_records, low=1)
        self.min_clients = self.n_clients if min_clients is None else check_int(
            "min_clients", min_clients, low=1, high=self.n_clients)
        self.num_shares = check_num_shares(num_shares, self.n_clients)
        rows = self.n_records if max_client_rows is None else check_int(
            "max_client_rows", max_client_rows, low=1, high=self.n_records)
        dtype = np.float32 if config.precision == "float32" else np.float64
        self.setup_plan_: SumPlan | None = None
        self.setup_release_: dp_event.DpEvent | None = None
        if isinstance(self.method, CovarianceMethod):  # the setup sum, then T rounds
            self.method.check(config, model)
            self.multipliers_ = secure_multipliers(self.method, config)
            self.noise_multiplier_ = self.multipliers_["z_grad"]
            d = int(getattr(model, "n_features", 0))
            if d < 1:
                raise ValueError(f"{self.method.name!r} needs a model with n_features (a "
                                 f"linear head); {type(model).__name__} has none.")
            self.row_clip_ = self.method.feature_clip(d)
            self.setup_plan_ = round_plan((d + 1) * (d + 2) // 2,
                                          moment_sensitivity(self.row_clip_, rows),
                                          self.multipliers_["z_cov"], n_rows=self.n_records,
                                          n_clients=self.n_clients,
                                          min_clients=self.min_clients)
            self.setup_release_ = round_event(self.multipliers_["z_cov"])
        else:
            self.noise_multiplier_ = secure_noise_multiplier(config)
            self.multipliers_ = {"z": self.noise_multiplier_}
        self.unit_ = "client" if is_client_level(config) else "record"
        # a client-level part's local steps, step size and proximal mu (public), as the
        # simulator reads them: the method's own for fedavg and fedprox, else the config's
        self.local_work_ = local_work(self.method, config)
        if self.unit_ == "client":
            self.plan_ = client_level_plan(model, config.clip_norm, self.noise_multiplier_,
                                           n_clients=self.n_clients,
                                           min_clients=self.min_clients)
        else:
            self.plan_ = round_plan(model.n_params,
                                    part_sensitivity(model, config.clip_norm, rows, dtype),
                                    self.noise_multiplier_, n_rows=self.n_records,
                                    n_clients=self.n_clients, min_clients=self.min_clients)
        self.release_ = round_event(self.noise_multiplier_)
        self.clip_ = secure_clip(model, self.method, config, self.noise_multiplier_,
                                 n_records=self.n_records, n_clients=self.n_clients,
                                 min_clients=self.min_clients, max_client_rows=rows)
        self._weight = 0.0  # the count's weight in the round being run
        # adaptive clipping: every round's plan is fitted to 2^FIT_BITS where it can be
        # (SecureClip.applied), so the run's quantization range is 2^FIT_BITS
        self._counted_bits = 0 if self.clip_ is None else FIT_BITS
        for plan in (self.plan_, self.setup_plan_):
            if plan is not None and plan.modulus >= SECAGG_MODULUS:
                self._refuse_modulus(plan)

        self.X_test = None if X_test is None else check_array("X_test", X_test)
        self.y_test = None if y_test is None else check_labels(
            "y_test", y_test, getattr(model, "n_classes", 2 ** 31),
            n_rows=self.X_test.shape[0] if self.X_test is not None else None)
        init_seq = (check_seed("seed", None).spawn(3)[0] if seed is None
                    else simulator_seeds(check_int("seed", seed, low=0)).init)
        self._params = np.asarray(model.init_params(np.random.default_rng(init_seq)),
                                  dtype=np.float64)
        self.spec_ = RunSpec(config, dict(self.multipliers_), model, self.n_clients)
        self._state: Any = None
        if not isinstance(self.method, CovarianceMethod):  # the simulator's server half
            # on the mean over records (client-level: over clients)
            divisor = self.n_clients if self.unit_ == "client" else self.n_records
            noise_var = (self.plan_.noise_std(self.n_clients) / divisor) ** 2
            self.transform = server_half(self.method, self.spec_, noise_var)
            self._state = self.transform.init(self._params)
        self.caller_ledger = ledger
        if ledger is not None:  # refuse the whole plan before any message
            ledger.check(secure_plan_event(model, config, self.method))
        self.ledger = PrivacyLedger(config.target_delta, accountant="rdp")
        self.events: list[dp_event.DpEvent] = []
        self.history_: list[dict[str, Any]] = []
        self._round_start = 0.0

    def _refuse_modulus(self, plan: SumPlan) -> None:
        raise ValueError(f"A secure sum of {plan.dim} coordinates over "
                         f"n_records={self.n_records} records needs a modulus of "
                         f"2^{plan.bits} (scale {plan.scale:g}, rounding "
                         f"inflation {plan.inflation:.3g}), above the 2^"
                         f"{FIT_BITS} that SecAgg+'s modulus 2^31 carries even at the "
                         f"largest accounted inflation {ACCOUNTED_INFLATION:g}: lower "
                         "the number of records or the model's size, or simulate it "
                         "with trust='secure-aggregation' (up to 2^62).")

    @property
    def setup_rounds(self) -> int:
        """SecAgg+ rounds before the gradient rounds: 1 for a covariance method's setup
        sum, 0 otherwise (the workflow runs ``n_rounds + setup_rounds`` rounds)."""
        return 0 if self.setup_plan_ is None else 1

    def _round_plan(self, server_round: int) -> tuple[SumPlan, str]:
        if server_round <= self.setup_rounds and self.setup_plan_ is not None:
            return self.setup_plan_, "moment"
        if self.clip_ is not None:  # adaptive clipping: the plan of the round's clip
            return self.clip_.plan()[0], "gradient"
        return self.plan_, "gradient"

    @property
    def quantization_range(self) -> int:
        """``q``: SecAgg+'s quantization range, the largest modulus of the run's plans
        (every plan's modulus divides it; sent to the clients as ``secagg-range``)."""
        moduli = [p.modulus for p in (self.plan_, self.setup_plan_) if p is not None]
        return max([*moduli, 2**self._counted_bits])

    @property
    def reconstruction_threshold(self) -> int:
        """``t``: the shares of a client's secrets that SecAgg+ needs to recover it
        (:func:`~dpprecond.adapters.flower.secaggplus.ring_threshold`: ``ceil(s k_min /
        K)``, at least 2; ``t = s`` with ``min_clients = K``)."""
        return ring_threshold(self.num_shares, self.min_clients, self.n_clients)

    def workflow(self, timeout: float | None = None) -> SecAggPlusWorkflow:
        """Flower's SecAgg+ workflow with the settings that keep the shares exact
        (:func:`~dpprecond.adapters.flower.secaggplus.exact_workflow`, on this
        strategy's neighbourhood and threshold)."""
        return exact_workflow(self.quantization_range, min_clients=self.min_clients,
                              n_clients=self.n_clients, num_shares=self.num_shares,
                              timeout=timeout)

    # -- the legacy Strategy interface ---------------------------------------------------

    def initialize_parameters(self, client_manager: ClientManager) -> Parameters | None:
        return ndarrays_to_parameters([self._params])

    def configure_fit(self, server_round: int, parameters: Parameters,
                      client_manager: ClientManager) -> list[tuple[ClientProxy, FitIns]]:
        plan, kind = self._round_plan(server_round)
        if kind == "gradient" and self.setup_plan_ is not None and self._state is None:
            raise SetupSumIncompleteError(
                f"{self.method.name!r} cannot run its gradient rounds: its setup sum (SecAgg+ "
                "round 1) released nothing (fewer than min_clients="
                f"{self.min_clients} shares reached it, or the round failed). Its epsilon "
                f"({self.ledger.epsilon:.4g}) is charged; rerun with more clients online or "
                "a lower min_clients.")
        extra: dict[str, Scalar] = {"plan-secure": True} if self.secure else {}
        clip = self.row_clip_ if kind == "moment" else self.config.clip_norm
        if kind == "gradient" and self.clip_ is not None:
            plan, self._weight = self.clip_.plan()
            clip = self.clip_.applied()
            extra["plan-count-weight"] = self._weight
            if plan.modulus > self.quantization_range:  # before the round is charged
                raise ValueError(f"Round {server_round}'s plan at clip {clip:.6g} needs a "
                                 f"modulus of 2^{plan.bits}, and no clip within an octave "
                                 f"below it has a plan within SecAgg+'s 2^{FIT_BITS}: lower "
                                 "the number of records or the model's size, or simulate it "
                                 "with trust='secure-aggregation'.")
        clients = client_manager.sample(num_clients=self.n_clients,
                                        min_num_clients=self.n_clients)
        release = self.setup_release_ if kind == "moment" else self.release_
        assert release is not None
        self.ledger.spend(release)  # before the shares: charged regardless
        self.events.append(release)
        if self.caller_ledger is not None:
            self.caller_ledger.spend(release)
        self._round_start = time.perf_counter()
        config: dict[str, Scalar] = {**extra, "round": server_round - self.setup_rounds,
                                     "secagg-range": self.quantization_range,
                                     **plan_to_config(
                                         plan, clip, kind,
                                         unit=self.unit_ if kind == "gradient" else "record",
                                         **self.local_work_)}
        fit = FitIns(ndarrays_to_parameters([self._params]), config)
        return [(c, fit) for c in clients]

    def aggregate_fit(self, server_round: int, results: list[tuple[ClientProxy, FitRes]],
                      failures: list[Any]) -> tuple[Parameters | None, dict[str, Scalar]]:
        if not results:
            return None, {}
        average = parameters_to_ndarrays(results[0][1].parameters)[0]
        plan, kind = self._round_plan(server_round)
        q = self.quantization_range
        # SecAgg+ hands (S - K' q/2) q / K' (q its quantization range); the integer
        # S - K' q/2 is = sum_i x_i (mod M), hence modulo the plan's m (m divides q and M)
        total = recovered_sum(average, len(results), q)
        decoded = decode(np.mod(total[:-1], plan.modulus), plan, len(results))
        n = int(np.mod(total[-1], SECAGG_MODULUS))  # records (client-level: clients) summed
        if kind == "moment":
            return self._setup(decoded, n, server_round, len(results))
        used = None
        if self.clip_ is not None:  # the count rides in the sum: move the clip
            decoded, count = split_counted_sum(decoded, self._weight)
            used = self.clip_.applied()
            self.clip_.update(count / n)
        G = decoded / n
        if isinstance(self.method, CovarianceMethod):
            updates, self._state = self.method.server_update(
                self.spec_, {"message": G[None]}, [0], np.array([n]), self._state,
                self._params)
        else:
            updates, self._state = self.transform.update(G, self._state, self._params)
        self._params = self._params + updates
        record: dict[str, Any] = {"round": server_round - self.setup_rounds,
                                  "epsilon": self.ledger.epsilon,
                                  "n_replied": len(results),
                                  "update_norm": float(np.linalg.norm(updates)),
                                  "seconds": time.perf_counter() - self._round_start}
        if used is not None:
            record["clip_norm"] = used
        self.history_.append(record)
        return ndarrays_to_parameters([self._params]), {"epsilon": record["epsilon"],
                                                        "n-replied": len(results)}

    def _setup(self, flat: np.ndarray, n: int, server_round: int, n_replied: int
               ) -> tuple[Parameters | None, dict[str, Scalar]]:
        """The setup sum's decoded upper triangle: mirrored, divided by the records, handed
        to the method's server half as the aggregate's one row (as the simulator)."""
        assert self.setup_plan_ is not None and isinstance(self.method, CovarianceMethod)
        d1 = int(self.model.n_features) + 1  # type: ignore[attr-defined]
        S = np.zeros((d1, d1))
        S[np.triu_indices(d1)] = flat
        S = S + np.triu(S, 1).T
        self._state = self.method.server_init(self.spec_, self._params,
                                              {"moment": (S / n)[None]}, [0])
        self.setup_ = {"round": server_round, "epsilon": self.ledger.epsilon,
                       "n_replied": n_replied,
                       "seconds": time.perf_counter() - self._round_start}
        return ndarrays_to_parameters([self._params]), {"epsilon": self.ledger.epsilon,
                                                        "n-replied": n_replied}

    def configure_evaluate(self, server_round: int, parameters: Parameters,
                           client_manager: ClientManager
                           ) -> list[tuple[ClientProxy, EvaluateIns]]:
        return []  # a client's accuracy on its own data is not private

    def aggregate_evaluate(self, server_round: int,
                           results: list[tuple[ClientProxy, EvaluateRes]],
                           failures: list[Any]) -> tuple[float | None, dict[str, Scalar]]:
        return None, {}

    def evaluate(self, server_round: int,
                 parameters: Parameters) -> tuple[float, dict[str, Scalar]] | None:
        if self.X_test is None or self.y_test is None:
            return None
        params = parameters_to_ndarrays(parameters)[0]
        loss, acc = self.model.evaluate(params, self.X_test, self.y_test)
        if self.history_ and self.history_[-1]["round"] == server_round - self.setup_rounds:
            self.history_[-1].update(test_accuracy=acc, test_loss=loss)
        return float(loss), {"test-accuracy": float(acc)}

    def result(self) -> FLResult:
        """The run's :class:`FLResult` (after the workflow)."""
        # the settings first, as the simulator's result (the mechanism says the privacy
        # unit of the epsilon: one record, or one client); the sums are charged with RDP
        info: dict[str, Any] = {**asdict(self.config), **self.method.describe(),
                                "accountant": "rdp", "n_clients": self.n_clients,
                                "trust": "secure-aggregation", "engine": "flower-secagg+",
                                "secure_noise_requested": self.secure,
                                **secure_info(self.plan_, self.n_clients)}
        if self.setup_plan_ is not None:
            info.update(noise_multipliers=dict(self.multipliers_),
                        setup=secure_info(self.setup_plan_, self.n_clients))
        if self.clip_ is not None and self.clip_.norms:  # as the simulator reports it
            info.update(secure_info(self.clip_.plan(self.clip_.norms[-1])[0], self.n_clients),
                        clip_norms=list(self.clip_.norms),
                        adaptive_clip=asdict(self.clip_.settings))
        return FLResult(self._params, self.history_, self.noise_multiplier_,
                        float(self.ledger.epsilon), self.config.target_delta, info,
                        list(self.events))


def run_secagg(grid: Grid, context: Context, strategy: SecAggDPStrategy,
               timeout: float | None = None) -> FLResult:
    """Run a :class:`SecAggDPStrategy` with Flower's SecAgg+ workflow (``n_rounds`` plus the
    setup rounds of a covariance method); return its result."""
    legacy = LegacyContext(context=context, config=ServerConfig(
        num_rounds=strategy.config.n_rounds + strategy.setup_rounds), strategy=strategy)
    DefaultWorkflow(fit_workflow=strategy.workflow(timeout))(grid, legacy)
    return strategy.result()


def make_secagg_server_app(strategy_fn: Any, *, timeout: float | None = None,
                           on_result: Any = None) -> ServerApp:
    """A ServerApp running ``strategy_fn(context)`` (a :class:`SecAggDPStrategy`) with SecAgg+."""
    app = ServerApp()

    @app.main()
    def _main(grid: Grid, context: Context) -> None:
        strategy = strategy_fn(context)
        if not isinstance(strategy, SecAggDPStrategy):
            raise TypeError(f"strategy_fn must return a SecAggDPStrategy, got "
                            f"{type(strategy).__name__}.")
        result = run_secagg(grid, context, strategy, timeout)
        if on_result is not None:
            on_result(result, context)

    return app
