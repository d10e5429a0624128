"""Federated private PCA on Flower's SecAgg+: every release one masked secure sum.

``fit_pca_on_flower(..., trust="secure-aggregation")`` runs
:func:`~dpprecond.pca.fit_private_pca` at the server on a
:class:`~dpprecond.pca.remote.RemoteFederation` whose ``secure_transport`` is
:class:`SecAggPlusPCATransport`: each release (the Gram matrix, ``auto``'s probe and
second release, the iterations' products, the private mean) is ONE run of Flower's
``SecAggPlusWorkflow`` over the Grid, with a one-round legacy strategy
(:class:`_ReleaseStrategy`) whose ``configure_fit`` sends the release request (the
deferred expression and the sum's plan, :mod:`dpprecond.pca.remote_secure`) in the
FitIns config and the public arrays as its parameters, and whose ``aggregate_fit``
receives only the sum. Each client (:func:`secure_pca_reply`, behind ``secaggplus_mod``)
evaluates the expression on its own rows, encodes its part exactly as the in-process
secure fit's client (:func:`~dpprecond.secagg.sums.client_message`: scale, shared-uniform
stochastic rounding, its Skellam share, modulo ``2^bits``) and hands the integers to
SecAgg+ with the exact-arithmetic settings of :mod:`dpprecond.adapters.flower.secaggplus`
(quantization range ``q = 2^bits``, ``num_examples = 1``, ``max_weight = q``); the
server recovers the modular sum and decodes it with :func:`~dpprecond.secagg.skellam.decode`
(the in-process decoder). Registration, the rounding bounds and public draws are plain
``query.pca`` rounds (:mod:`dpprecond.adapters.flower.pca`).

Secure mode: the server's ``secure=True`` (sent with every request) or a node's own
``secure-noise=true`` draws that client's rounding uniforms, Skellam shares and public
draws from the OS CSPRNG, as the in-process secure fit's clients
(:mod:`dpprecond.pca.remote_secure`); a seeded client refuses it.

Trust model: an honest-but-curious server that sees only each sum (SecAgg+ masks every
message), clients that add their shares honestly; a client's message alone carries only
``1/min_clients`` of the noise variance. Accounting: the in-process secure fit's plan
(Skellam ``ZCDpEvent``s calibrated in RDP), charged to the ledger before the first share.

Modulus: SecAgg+'s ``modulus_range`` is ``2^31``, so a sum's plan may use at most
``2^30`` (:data:`~dpprecond.secagg.fl.FIT_BITS`, the transport's ``fit_bits``). The fit
caps its sums to it (:mod:`dpprecond.pca.secure_plan`): a sum that needs more bits at the
in-process fit's ``2^-10`` rounding scale is coarsened, at up to 12.5% more noise std, and
the fit's events are calibrated at the coarsest scale any of its sums may take (the
epsilon is the target). Before the ledger is charged and before any release, after
registration (which gives ``n`` and ``d``), :func:`check_modulus` bounds every sum the
method may make (:func:`secure_release_sums`: the Gram sum, the private mean, the power
method's products of ``d k`` coordinates, ``auto``'s probe, diagnostic, completion and
iteration steps, each at its own noise multiplier) at the largest ``gamma Delta`` its
sensitivity may give it, and refuses a federation that no scale fits
(:class:`~dpprecond.adapters.flower.pca.SecureAggregationUnavailableError`). Where every
sum fits at ``2^-10``, the fit is the uncapped in-process fit; otherwise it is the
in-process fit with ``max_modulus_bits=30``, release for release. The transport still
refuses any release whose plan would exceed ``2^30``, before its shares.

Dropouts: a sum with fewer than ``min_clients`` surviving shares is not released (SecAgg+
halts below its reconstruction threshold, ``min_clients``, and the decoder refuses fewer
shares); the fit stops with :class:`~dpprecond.pca.remote.ClientMissingError` stating the
privacy spent (the plan, already charged).
"""

from __future__ import annotations

import json
import time
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
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
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS
from flwr.compat.common import recorddict_compat as compat
from flwr.server import ServerConfig
from flwr.server.client_manager import ClientManager, SimpleClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.compat import LegacyContext
from flwr.server.compat.grid_client_proxy import GridClientProxy
from flwr.server.strategy import Strategy
from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD
from flwr.server.workflow.constant import Key as WorkflowKey
from flwr.serverapp import Grid

from dpprecond.adapters.flower.client_app import _as_bool, _run_config_seed, client_info
from dpprecond.adapters.flower.pca_common import (
    SecureAggregationUnavailableError,
    _keep_state,
    _load_state,
    _local_rows,
)
from dpprecond.adapters.flower.secaggplus import (
    MAX_SECAGG_CLIENTS,
    SECAGG_MODULUS,
    check_secaggplus_state,
    exact_vector,
    exact_workflow,
    recovered_sum,
)
from dpprecond.pca.remote import ClientMissingError, ClientState
from dpprecond.pca.remote_secure import client_secure_message
from dpprecond.pca.secure_plan import (
    ModulusUnavailableError,
    gram_modulus_bits,
    secure_release_sums,
    sum_modulus_bits,
)
from dpprecond.secagg.fl import FIT_BITS
from dpprecond.secagg.sums import SumPlan

__all__ = ["SECURE_REQUEST_KEY", "SecAggPlusPCATransport", "check_modulus",
           "gram_modulus_bits", "secure_pca_reply", "secure_release_sums", "sum_modulus_bits"]

#: The FitIns config entry carrying a release request (JSON).
SECURE_REQUEST_KEY = "pca-secure-request"


def _refusal(why: str) -> str:
    return (f"trust='secure-aggregation' on Flower: {why} (Flower's SecAgg+ carries "
            f"2^{FIT_BITS}: its modulus_range 2^31; dpprecond.secagg.fl.FIT_BITS). Run the "
            "secure-aggregation fit in process, fit_private_pca(X, clients=bounds, "
            "trust='secure-aggregation') (up to 2^62), use trust='local' on Flower, or fit "
            "fewer rows or features.")


def check_modulus(n_features: int, n_rows: int, n_clients: int, min_clients: int | None, *,
                  method: str, n_components: int, target_epsilon: float | None,
                  target_delta: float, center: Any = None,
                  noise_multiplier: float | None = None,
                  options: dict[str, Any] | None = None) -> float:
    """Refuse a federation one of whose secure sums SecAgg+ cannot carry (before the
    ledger is charged and before any release); return the fit's inflation bound.

    The fit's plan under SecAgg+'s cap, ``2^30``
    (:func:`~dpprecond.pca.api.planned_secure_budget`: every sum the method may make,
    at the largest ``gamma Delta`` its sensitivity may give it, at the finest rounding
    scale that fits, up to :data:`~dpprecond.pca.secure_plan.MAX_FIT_INFLATION`). Raises
    :class:`~dpprecond.adapters.flower.pca.SecureAggregationUnavailableError` naming the
    sum that needs the most bits, the bits and the in-process alternative; ``ValueError``
    for ``min_clients`` above ``n_clients``, for fewer than 2 clients (SecAgg+ masks
    pairwise) or more than :data:`~dpprecond.adapters.flower.secaggplus.MAX_SECAGG_CLIENTS`
    (the float recovery of the sum, :func:`~dpprecond.adapters.flower.secaggplus.
    recovered_sum`, is exact up to it).
    """
    from dpprecond.pca.api import planned_secure_budget

    if n_clients < 2:
        raise ValueError(f"trust='secure-aggregation' needs at least 2 clients (SecAgg+ masks "
                         f"each message with its neighbours'); got {n_clients}.")
    if n_clients > MAX_SECAGG_CLIENTS:
        raise ValueError(f"n_clients={n_clients} is above the {MAX_SECAGG_CLIENTS} clients "
                         "whose SecAgg+ sum the server reads back exactly (secaggplus."
                         "MAX_SECAGG_CLIENTS, as for the FL rounds); run the secure fit in "
                         "process, fit_private_pca(X, clients=bounds, trust="
                         "'secure-aggregation'), or merge clients.")
    if min_clients is not None and min_clients > n_clients:
        raise ValueError(f"min_clients={min_clients} exceeds the {n_clients} clients that "
                         "registered: no secure sum could hold that many shares; set "
                         f"min_clients <= {n_clients} (None: every client), or start more "
                         "SuperNodes. Nothing was released.")
    try:
        _, bound = planned_secure_budget(
            method, target_epsilon=target_epsilon, target_delta=target_delta,
            n_features=n_features, n_components=n_components, n_rows=n_rows,
            n_clients=n_clients, min_clients=min_clients, max_modulus_bits=FIT_BITS,
            center=center, noise_multiplier=noise_multiplier, **(options or {}))
    except ModulusUnavailableError as exc:
        raise SecureAggregationUnavailableError(_refusal(str(exc))) from exc
    return bound


class _ReleaseStrategy(Strategy):
    """One SecAgg+ fit round: the release request to every client, the sum captured."""

    def __init__(self, request: dict[str, Any], arrays: list[np.ndarray], plan: SumPlan,
                 proxies: list[ClientProxy]) -> None:
        self.request, self.arrays, self.plan, self.proxies = request, arrays, plan, proxies
        self.total: np.ndarray | None = None
        self.n_shares = 0
        self.malformed = ""  # why a sum SecAgg+ handed over was not read

    def initialize_parameters(self, client_manager: ClientManager) -> Parameters | None:
        return None

    def configure_fit(self, server_round: int, parameters: Parameters,
                      client_manager: ClientManager) -> list[tuple[ClientProxy, FitIns]]:
        config: dict[str, Scalar] = {SECURE_REQUEST_KEY: json.dumps(self.request),
                                     "secagg-range": self.plan.modulus}
        fit = FitIns(ndarrays_to_parameters(self.arrays), config)
        return [(proxy, fit) for proxy in self.proxies]

    def aggregate_fit(self, server_round: int, results: list[tuple[ClientProxy, FitRes]],
                      failures: list[Any]) -> tuple[Parameters | None, dict[str, Scalar]]:
        if results:
            average = parameters_to_ndarrays(results[0][1].parameters)[0]
            total = recovered_sum(average, len(results), self.plan.modulus)
            if total.shape == (self.plan.dim,):
                self.total = np.mod(total, self.plan.modulus)
                self.n_shares = len(results)
            else:
                self.malformed = (f"SecAgg+ handed a sum of shape {total.shape}, expected "
                                  f"({self.plan.dim},)")
        return None, {}

    def configure_evaluate(self, server_round: int, parameters: Parameters,
                           client_manager: ClientManager
                           ) -> list[tuple[ClientProxy, EvaluateIns]]:
        return []

    def aggregate_evaluate(self, server_round: int,
                           results: list[tuple[ClientProxy, EvaluateRes]],
                           failures: list[Any]) -> tuple[float | None, dict[str, Scalar]]:
        return None, {}

    def evaluate(self, server_round: int,
                 parameters: Parameters) -> tuple[float, dict[str, Scalar]] | None:
        return None


class SecAggPlusPCATransport:
    """The ``secure_transport`` of a PCA fit on Flower: one SecAgg+ round per release.

    ``nodes[i]`` is the node id of client ``i``; ``timeout`` bounds each SecAgg+ stage.
    Returns the sum modulo the plan's modulus and the number of shares in it; raises
    :class:`~dpprecond.pca.remote.ClientMissingError` when SecAgg+ released no sum (fewer
    than ``min_clients`` clients completed it).
    """

    #: The largest modulus ``2^fit_bits`` SecAgg+ carries exactly: the fit caps its sums
    #: to it (:attr:`~dpprecond.pca.remote.RemoteFederation.secure_fit_bits`).
    fit_bits = FIT_BITS

    def __init__(self, grid: Grid, nodes: list[int], timeout: float) -> None:
        self.grid, self.nodes, self.timeout = grid, [int(n) for n in nodes], float(timeout)
        self.rounds = 0
        self.seconds: list[float] = []  # wall time of every SecAgg+ round
        self.shares: list[int] = []  # the shares in every released sum

    def __call__(self, request: dict[str, Any], arrays: list[np.ndarray],
                 plan: SumPlan) -> tuple[np.ndarray, int]:
        if plan.modulus >= SECAGG_MODULUS:  # the pre-check bounds every sum: never here
            raise SecureAggregationUnavailableError(_refusal(
                f"release {self.rounds + 1} ({plan.dim} coordinates) needs a modulus of "
                f"2^{plan.bits}") + " Nothing of this release was sent; the fit's plan was "
                "charged.")
        self.rounds += 1
        proxies: list[ClientProxy] = [GridClientProxy(n, self.grid, 0) for n in self.nodes]
        manager = SimpleClientManager()
        for proxy in proxies:
            manager.register(proxy)
        strategy = _ReleaseStrategy(request, arrays, plan, proxies)
        base = Context(run_id=0, node_id=0, node_config={}, state=RecordDict(), run_config={})
        context = LegacyContext(base, config=ServerConfig(num_rounds=1), strategy=strategy,
                                client_manager=manager)
        context.state.config_records[MAIN_CONFIGS_RECORD] = ConfigRecord(
            {WorkflowKey.CURRENT_ROUND: self.rounds})
        context.state.array_records[MAIN_PARAMS_RECORD] = ArrayRecord()
        start = time.perf_counter()
        exact_workflow(plan.modulus, min_clients=plan.min_clients, n_clients=len(self.nodes),
                       timeout=self.timeout)(self.grid, context)
        self.seconds.append(time.perf_counter() - start)
        if strategy.total is None:
            why = strategy.malformed or (
                f"fewer than min_clients={plan.min_clients} of the {len(self.nodes)} clients "
                "completed the masked sum (a client refused the request, failed or timed "
                "out; see the clients' logs), so SecAgg+ released nothing")
            raise ClientMissingError(f"Federated PCA secure sum {self.rounds} (SecAgg+): "
                                     f"{why}.", clients=[], reasons={},
                                     kind="secure-release")
        self.shares.append(strategy.n_shares)
        return strategy.total, strategy.n_shares


def secure_pca_reply(message: Message, context: Context, load_rows: Any, *,
                     noise_seed: int | None = None) -> Message:
    """A client's answer to a SecAgg+ PCA release (the ``train`` handler behind
    ``secaggplus_mod``): its exact message vector, ``num_examples = 1``.

    Refuses a train message outside SecAgg+ (without its configs record), a request whose
    ``secagg-range`` is not the plan's modulus or whose plan exceeds ``2^30``, SecAgg+
    settings other than the exact ones or a threshold that could unmask fewer than
    ``min_clients`` shares (``secaggplus.check_secaggplus_state``), and every request
    :func:`~dpprecond.pca.remote_secure.client_secure_message` refuses. Node config
    ``min-noise-multiplier``, ``allow-seeded-noise`` and ``secure-noise`` apply as for the
    local path: with ``secure-noise=true`` (whatever the server asks) or a request in
    secure mode (the server's ``secure=True``), the rounding uniforms and the Skellam
    share come from the OS CSPRNG (:class:`~dpprecond.secure.SecureGenerator`), and a
    seeded client refuses.
    """
    if RECORD_KEY_CONFIGS not in message.content.config_records:
        raise ValueError("Refusing a PCA secure release outside SecAgg+: a client's message "
                         "carries only its share of the noise and is sent masked only.")
    fitins = compat.recorddict_to_fitins(message.content, keep_input=True)
    config = dict(fitins.config)
    if SECURE_REQUEST_KEY not in config:
        raise ValueError("The SecAgg+ fit request has no PCA release request; this client "
                         "answers dpprecond's federated PCA only.")
    info = client_info(context)
    secure = _as_bool("secure-noise", info.node_config.get("secure-noise", False))
    floor = info.node_config.get("min-noise-multiplier", 0.0)
    if isinstance(floor, bool) or not isinstance(floor, (int, float)) or not floor >= 0:
        raise TypeError(f"Expected node config min-noise-multiplier to be a number >= 0, got "
                        f"{floor!r}.")
    seed = noise_seed if noise_seed is not None else _run_config_seed(info)
    request = json.loads(str(config[SECURE_REQUEST_KEY]))
    arrays = parameters_to_ndarrays(fitins.parameters)
    state: ClientState = _load_state(context)
    X = _local_rows(load_rows(info))
    sent, plan = client_secure_message(request, arrays, X, client_id=info.client_id,
                                       n_clients=info.n_clients, state=state,
                                       noise_seed=seed, min_noise_multiplier=float(floor),
                                       secure=secure)
    q = config.get("secagg-range")
    if q != plan.modulus or plan.modulus >= SECAGG_MODULUS:
        raise ValueError(f"Refusing secagg-range={q!r} for a plan of modulus 2^{plan.bits}: "
                         f"expected the plan's modulus, at most 2^{FIT_BITS}.")
    check_secaggplus_state(context, plan.modulus, plan.min_clients)  # exact and masked
    _keep_state(context, state)
    fitres = FitRes(Status(Code.OK, ""),
                    ndarrays_to_parameters([exact_vector(sent, plan.modulus, plan.modulus)]),
                    1, {})
    return Message(compat.fitres_to_recorddict(fitres, keep_input=True), reply_to=message)
