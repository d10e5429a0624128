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

Trust model: an honest-but-curious server that sees only each sum (SecAgg+ masks every
message), clients that add their shares honestly; a client's message alone carries only
``1/min_clients`` of the noise variance. Accounting: the in-process secure fit's plan
(Skellam ``ZCDpEvent``s calibrated in RDP), charged to the ledger before the first share.

Modulus: SecAgg+'s ``modulus_range`` is ``2^31``, so a sum's plan may use at most
``2^30`` (:data:`~dpprecond.secagg.fl.FIT_BITS`). PCA's plans keep the in-process fit's
``2^-10`` rounding inflation (the accounting covers no coarser scale), so a federation
one of whose sums may need more bits is refused after registration, before the ledger
is charged and before any release (:func:`check_modulus`,
:class:`~dpprecond.adapters.flower.pca.SecureAggregationUnavailableError`): every sum the
method may make is bounded (:func:`secure_release_sums`: the Gram sum, the private mean,
the power method's products of ``d k`` coordinates, ``auto``'s probe, diagnostic,
completion and iteration steps, each at its own noise multiplier), at the largest
``gamma Delta`` its sensitivity may give it. The transport still refuses any release
whose plan would exceed it, before its shares.

Dropouts: a sum with fewer than ``min_clients`` surviving shares is not released (SecAgg+
halts below its reconstruction threshold, ``min_clients``, and the decoder refuses fewer
shares); the fit stops with :class:`~dpprecond.pca.remote.ClientMissingError` stating the
privacy spent (the plan, already charged).
"""

from __future__ import annotations

import json
import math
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
from dpprecond.pca.budget import BudgetPlan
from dpprecond.pca.remote import ClientMissingError, ClientState
from dpprecond.pca.remote_secure import client_secure_message
from dpprecond.secagg.fl import FIT_BITS
from dpprecond.secagg.sums import ROUNDING_INFLATION, SumPlan, plan_sum

__all__ = ["SECURE_REQUEST_KEY", "SecAggPlusPCATransport", "check_modulus",
           "gram_modulus_bits", "secure_pca_reply", "secure_release_sums", "sum_modulus_bits"]

#: The FitIns config entry carrying a release request (JSON).
SECURE_REQUEST_KEY = "pca-secure-request"


def sum_modulus_bits(dim: int, n_rows: int, n_clients: int, noise_multiplier: float,
                     min_clients: int | None = None) -> int:
    """Bits of the modulus a secure sum of ``dim`` coordinates over ``n_rows`` rows needs
    at noise multiplier ``noise_multiplier``, at the largest ``gamma Delta`` any release
    sensitivity may give it.

    ``gamma`` is the power of two with ``gamma Delta`` in ``[sqrt(m) / 2^-10,
    2 sqrt(m) / 2^-10)`` (:func:`~dpprecond.secagg.sums.plan_sum`), and the plan's integers
    depend on ``Delta`` only through ``gamma Delta``: the bound is the plan at a
    sensitivity just below a power of two of that range. The multiplier is nudged up by
    ``2^-39`` (:func:`~dpprecond.secagg.sums.release_plan` plans a release at ``z (1 +
    2^-40)``). The bits grow with ``dim`` and with the multiplier.
    """
    worst = math.sqrt(dim) / ROUNDING_INFLATION * 2.0**-20 * (1.0 - 2.0**-20)
    k_min = n_clients if min_clients is None else min_clients
    return plan_sum(dim, worst, noise_multiplier * (1.0 + 2.0**-39), n_rows=n_rows,
                    n_clients=n_clients, min_clients=k_min).bits


def gram_modulus_bits(n_features: int, n_rows: int, n_clients: int,
                      noise_multiplier: float, min_clients: int | None = None) -> int:
    """Bits of the modulus a secure Gram sum of ``d = n_features`` (its ``d (d + 1) / 2``
    coordinates) needs over ``n_rows`` rows (:func:`sum_modulus_bits`)."""
    return sum_modulus_bits(n_features * (n_features + 1) // 2, n_rows, n_clients,
                            noise_multiplier, min_clients)


def secure_release_sums(method: str, plan: BudgetPlan, n_features: int, n_components: int,
                        options: dict[str, Any] | None = None
                        ) -> list[tuple[str, int, float]]:
    """Every kind of secure sum a fit of ``method`` may make: ``(what, coordinates, noise
    multiplier)``, the largest multiplier of each kind.

    The multipliers are the plan's (``z0``, ``z_power``, ``z_mean``) and, for ``auto``,
    those :func:`~dpprecond.pca.auto.fit_auto` splits ``z_pca`` into: ``M1`` at ``z /
    sqrt(init_share)``, the probe at ``z / sqrt(probe_share)``, the rescaled diagnostic at
    ``z / sqrt(rescale_share)`` (``branch="rule"``), the completion at ``z / sqrt(rest)``
    and the iteration's steps at ``z / sqrt(rest w_0)`` (``w_0 = 1 / (2^T - 1)`` the
    smallest step weight of the most steps ``T`` it may take). ``options`` are the
    method's (``auto``'s: :data:`~dpprecond.pca.auto.AUTO_DEFAULTS`).
    """
    from dpprecond.pca.auto import AUTO_DEFAULTS, HIST_EDGES, check_auto_options

    d = int(n_features)
    k = min(int(n_components), d)  # a larger k is refused by the fit, by name
    z = plan.noise_multipliers
    gram, product = d * (d + 1) // 2, d * k
    sums: list[tuple[str, int, float]] = []
    if "z_mean" in z:
        sums.append(("the private mean", d, z["z_mean"]))
    if method == "auto":
        opts = check_auto_options({key: val for key, val in (options or {}).items()
                                   if key in AUTO_DEFAULTS})
        zp, s1, sc = z["z_pca"], opts["init_share"], opts["probe_share"]
        rest = 1.0 - s1 - sc
        sums += [("the Gram matrix", gram, zp / math.sqrt(s1)),
                 ("auto's probe", 2 * (HIST_EDGES.size + 1), zp / math.sqrt(sc))]
        left = rest
        if opts["branch"] == "rule":
            st = opts["rescale_share"]
            sums.append(("auto's rescaled Gram matrix", gram, zp / math.sqrt(st)))
            left = rest - st  # check_auto_options: rest > rescale_share
        z_left = zp / math.sqrt(left)
        if opts["branch"] != "iterate":
            sums.append(("the Gram matrix's completion", gram, z_left))
        if opts["branch"] != "analyze_gauss":
            steps = opts["n_iter"] if opts["n_iter"] is not None else max(opts["iter_choices"])
            sums.append(("auto's clipped step", product,
                         z_left * math.sqrt(2.0**steps - 1.0)))
    elif method == "power":
        if "z0" in z:
            sums.append(("the Gram matrix", gram, z["z0"]))
        sums.append(("a power iteration's product", product, z["z_power"]))
    else:
        sums.append(("the Gram matrix", gram, z["z0"]))
    return [(what, dim, mult) for what, dim, mult in sums if math.isfinite(mult)]


def _refusal(bits: int, what: str) -> str:
    return (f"trust='secure-aggregation' on Flower: {what} needs a modulus of 2^{bits}, "
            f"above the 2^{FIT_BITS} that Flower's SecAgg+ carries exactly (its modulus_range "
            f"2^31; dpprecond.secagg.fl.FIT_BITS). PCA's secure sums keep the 2^-10 rounding "
            "inflation their accounting covers. Run the secure-aggregation fit in process, "
            "fit_private_pca(X, clients=bounds, trust='secure-aggregation') (up to 2^62), "
            "use trust='local' on Flower, or fit fewer rows or features.")


def check_modulus(plan: BudgetPlan, n_features: int, n_rows: int, n_clients: int,
                  min_clients: int | None, *, method: str, n_components: int,
                  options: dict[str, Any] | None = None) -> None:
    """Refuse a federation one of whose secure sums may not run on SecAgg+ (before the
    ledger is charged and before any release).

    Every sum :func:`secure_release_sums` lists for ``method`` is bounded with
    :func:`sum_modulus_bits`. Raises
    :class:`~dpprecond.adapters.flower.pca.SecureAggregationUnavailableError` naming the
    sum that needs the most bits, the bits and the in-process alternative; ``ValueError``
    for fewer than 2 clients (SecAgg+ masks pairwise) or more than
    :data:`~dpprecond.adapters.flower.secaggplus.MAX_SECAGG_CLIENTS` (the float recovery of
    the sum, :func:`~dpprecond.adapters.flower.secaggplus.recovered_sum`, is exact up to it).
    """
    if n_clients < 2:
        raise ValueError(f"trust='secure-aggregation' needs at least 2 clients (SecAgg+ masks "
                         f"each message with its neighbours'); got {n_clients}.")
    if n_clients > MAX_SECAGG_CLIENTS:
        raise ValueError(f"n_clients={n_clients} is above the {MAX_SECAGG_CLIENTS} clients "
                         "whose SecAgg+ sum the server reads back exactly (secaggplus."
                         "MAX_SECAGG_CLIENTS, as for the FL rounds); run the secure fit in "
                         "process, fit_private_pca(X, clients=bounds, trust="
                         "'secure-aggregation'), or merge clients.")
    need = []
    for what, dim, z in secure_release_sums(method, plan, n_features, n_components, options):
        try:
            need.append((sum_modulus_bits(dim, n_rows, n_clients, z, min_clients), what,
                         dim, z))
        except ValueError as exc:  # no plan at all at the sum's worst scale
            raise SecureAggregationUnavailableError(
                f"trust='secure-aggregation' on Flower: a secure sum of {what} of "
                f"d={n_features} features over n={n_rows} rows ({dim} coordinates at noise "
                f"multiplier {z:.4g}, {n_clients} clients) has no plan within SecAgg+'s "
                f"2^{FIT_BITS} at the worst scale a release may give it: {exc}") from exc
    bits, what, dim, z = max(need, key=lambda item: item[0])
    if bits > FIT_BITS:
        raise SecureAggregationUnavailableError(_refusal(
            bits, f"a secure sum of {what} of d={n_features} features over n={n_rows} rows "
                  f"({dim} coordinates at noise multiplier {z:.4g}, {n_clients} clients)"))


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

    def __init__(self, grid: Grid, nodes: list[int], timeout: float) -> None:
        self.grid, self.nodes, self.timeout = grid, [int(n) for n in nodes], float(timeout)
        self.rounds = 0
        self.seconds: list[float] = []  # wall time of every SecAgg+ round
        self.shares: list[int] = []  # the shares in every released sum

    def __call__(self, request: dict[str, Any], arrays: list[np.ndarray],
                 plan: SumPlan) -> tuple[np.ndarray, int]:
        if plan.modulus >= SECAGG_MODULUS:  # the pre-check bounds every sum: never here
            raise SecureAggregationUnavailableError(_refusal(
                plan.bits, f"release {self.rounds + 1} ({plan.dim} coordinates)")
                + " Nothing of this release was sent; the fit's plan was charged.")
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
    ``min-noise-multiplier`` and ``allow-seeded-noise`` apply as for the local path; a
    node with ``secure-noise=true`` refuses every such release (its Skellam share would
    come from a numpy generator, not the OS CSPRNG its operator asked for).
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
    if _as_bool("secure-noise", info.node_config.get("secure-noise", False)):
        raise ValueError("This node's config sets secure-noise=true, but a SecAgg+ PCA "
                         "release draws its Skellam share from a numpy generator (secure "
                         "mode runs the secure sums in process only); refusing to answer. "
                         "Run the fit with trust='local' or in process, or unset "
                         "secure-noise.")
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
                                       noise_seed=seed, min_noise_multiplier=float(floor))
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
