"""Federated private PCA on Flower: every pass of the fit is one message round.

The fit is :func:`dpprecond.pca.fit_private_pca` itself, run at the server on a
:class:`~dpprecond.pca.remote.RemoteFederation` whose transport is Flower's Grid
(:class:`FlowerTransport`): each pass (the Gram matrix, a product with the broadcast
iterate, a clipped sum, ``auto``'s probe histogram, the private mean) is one
``grid.send_and_receive`` of ``query.pca`` messages, one per client, carrying the public
broadcast (the iterate, radius, bins, mean, noise std) and the draws to make; each client
computes its part on its own rows with the passes in-process federated PCA uses
(:func:`~dpprecond.pca.remote.client_answer`, which calls
:class:`~dpprecond.pca.rows.ClippedRows`), adds its own noise and replies; the server sums
the noisy parts in client order (client ids ``0 .. K-1`` from the SuperNodes' node config).

Trust model ``trust="local"`` (no trusted party): every client adds Gaussian noise
with the central std to its part, so each message is by itself the Gaussian mechanism
with the fit's noise multiplier on that client's records, against the server, the
SuperLink and the network; the accounting is the central one (the fit's plan, its
dp_accounting event and epsilon, equal to the in-process ``trust="local"`` fit's).
Privacy unit: one row (record) of one client, replace-one adjacency, rows of norm at most
``row_norm`` (clipped after division by it). ``trust="secure-aggregation"``: every release
is one SecAgg+ masked sum of the clients' Skellam-noised integer messages
(:mod:`dpprecond.adapters.flower.pca_secagg`), the in-process secure fit's plan and
releases; refused (:class:`SecureAggregationUnavailableError`) when the fit's sums need
more than the ``2^30`` SecAgg+ carries (:data:`SECURE_AGGREGATION_REFUSAL`).

A pass cannot drop a client: a release is a sum over every client's rows, and a sum
without one client is neither the statistic nor calibrated for it. A client that fails,
sends a malformed reply or does not answer within ``timeout`` stops the fit with
:class:`~dpprecond.pca.remote.ClientMissingError`, whose message states the privacy
already spent (nothing before the first release; otherwise at most the fit's planned
event, which is charged to the ``ledger`` if one is given).

Seeds: a client follows a seed only through :func:`make_pca_client_app`'s ``noise_seed``
(one-owner simulations) or a run-config ``noise-seed`` its SuperNode consented to
(``allow-seeded-noise=true``), as the FL ClientApp; then client ``i``'s streams are those
of ``fit_private_pca(X, ..., seed=s, clients=bounds, trust="local")`` and the released
components equal the in-process fit's up to the summation order of the parts (the
server adds ``K`` noisy parts where the in-process fit adds ``K`` exact parts and then the
summed noise; differences at the last bits, ~1e-15 relative). Otherwise every request
draws fresh OS entropy; node config ``secure-noise=true`` (or ``secure=True`` at the
server) makes the clients draw from :mod:`dpprecond.secure` and snap their releases
(under ``trust="secure-aggregation"``: their rounding, Skellam shares and public draws from
the OS CSPRNG, nothing snapped; a seeded client refuses secure mode either way).
Node config ``min-noise-multiplier=Z`` refuses a release that would make the fit, with its
earlier releases, a Gaussian mechanism of noise multiplier below ``Z`` (the precisions
``(bound / std)^2`` add, with the sensitivity bound the client computes itself).
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.client.mod import secaggplus_mod
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from dpprecond._validation import check_choice, check_int, check_positive
from dpprecond.accounting import PrivacyLedger
from dpprecond.adapters.flower.client_app import (
    ClientInfo,
    _as_bool,
    _run_config_seed,
    client_info,
)
from dpprecond.adapters.flower.pca_common import (
    SECURE_AGGREGATION_REFUSAL,
    SecureAggregationUnavailableError,
    _keep_state,
    _load_state,
    _local_rows,
)
from dpprecond.adapters.flower.pca_secagg import (
    SecAggPlusPCATransport,
    check_modulus,
    secure_pca_reply,
)
from dpprecond.adapters.flower.records import read_array, read_int
from dpprecond.pca.api import PCAResult, fit_private_pca, planned_event
from dpprecond.pca.federated import TRUST_MODELS
from dpprecond.pca.methods import METHODS
from dpprecond.pca.remote import (
    REMOTE_METHODS,
    ClientMissingError,
    RemoteFederation,
    client_answer,
)
from dpprecond.pca.remote_secure import client_public_draw

__all__ = [
    "MESSAGE_TYPE",
    "SECURE_AGGREGATION_REFUSAL",
    "ClientMissingError",
    "FlowerTransport",
    "LoadRows",
    "SecureAggregationUnavailableError",
    "SplitRows",
    "add_pca_handler",
    "check_pca_config",
    "fit_pca_on_flower",
    "make_pca_client_app",
    "make_pca_server_app",
    "pca_reply",
]

logger = logging.getLogger(__name__)

#: The Flower message type of every PCA request (``ClientApp.query("pca")``).
MESSAGE_TYPE = "query.pca"
_REQUEST, _ARRAYS, _REPLY, _METRICS = "pca-request", "pca-arrays", "pca-reply", "metrics"

#: ``load_rows(info) -> X_i`` (an array of the client's rows, or a
#: :class:`~dpprecond.adapters.flower.client_app.LocalData`, whose ``X`` is used).
LoadRows = Callable[[ClientInfo], Any]


@dataclass(frozen=True)
class SplitRows:
    """A simulation's loader: client ``i`` holds ``X[bounds[i]:bounds[i + 1]]``.

    The split of ``fit_private_pca(X, ..., clients=bounds)``; picklable (Flower's Ray
    simulation ships it to the actors). A deployment loads each node's own rows instead.
    """

    X: np.ndarray
    bounds: np.ndarray

    def __call__(self, info: ClientInfo) -> np.ndarray:
        """This client's rows."""
        b = np.asarray(self.bounds, dtype=np.int64)
        if b.size != info.n_clients + 1:
            raise ValueError(f"SplitRows has {b.size - 1} parts, but this SuperNode is one of "
                             f"num-partitions={info.n_clients}.")
        return np.asarray(self.X)[b[info.client_id]:b[info.client_id + 1]]


# ---------------------------------------------------------------------------------------
# The server: validation, registration, transport, fit
# ---------------------------------------------------------------------------------------


def check_pca_config(n_components: Any, *, target_epsilon: float | None,
                     target_delta: float, row_norm: float | None, method: str = "auto",
                     center: Any = None, trust: str = "local",
                     noise_multiplier: float | None = None,
                     ledger: PrivacyLedger | None = None, n_clients: int | None = None,
                     connect_timeout: float = 120.0, timeout: float = 600.0,
                     min_clients: int | None = None, secure: bool = False,
                     **options: Any) -> Any:
    """Check a Flower PCA fit's settings without sending anything; return its planned event.

    Raises ``ValueError``/``TypeError`` naming a bad setting (method: one of
    :data:`~dpprecond.pca.remote.REMOTE_METHODS` under both trust models; options, budget,
    ``row_norm``, ``center``, timeouts, ``min_clients``, ``secure``) and
    :class:`~dpprecond.PrivacyBudgetExceededError` when ``ledger`` cannot afford the plan.
    """
    for name in ("seed", "clients", "diagnostics"):
        if name in options:
            raise ValueError(f"{name}={options[name]!r} is not a setting of PCA on Flower: "
                             + {"seed": "the clients draw the noise (a seeded simulation "
                                        "gives them the seed: make_pca_client_app(..., "
                                        "noise_seed=...)).",
                                "clients": "the SuperNodes are the clients (partition-id "
                                           "0 .. K-1).",
                                "diagnostics": "they are functions of the clients' private "
                                               "rows, which the server never sees."}[name])
    check_choice("trust", trust, TRUST_MODELS)
    if not isinstance(secure, bool):
        raise TypeError(f"Expected secure to be True or False, got {secure!r}.")
    if trust == "secure-aggregation":
        if min_clients is not None:
            check_int("min_clients", min_clients, low=2,
                      high=n_clients if n_clients is not None else None)
    elif min_clients is not None:
        raise ValueError(f"min_clients={min_clients!r} applies to trust='secure-aggregation' "
                         "only (the fewest noise shares a secure sum may hold).")
    check_choice("method", method, list(METHODS))
    if method not in REMOTE_METHODS:
        raise ValueError(f"method={method!r} does not run on Flower; use one of "
                         f"{list(REMOTE_METHODS)} (fixed's trials and select spawn random "
                         "streams; exact is not private).")
    if isinstance(n_components, bool) or not isinstance(n_components, (int, np.integer)) \
            or n_components < 1:
        raise ValueError(f"Expected n_components to be an int >= 1, got {n_components!r}.")
    if row_norm is None:
        raise ValueError("row_norm is required: a public bound on the l2 norm of the "
                         "clients' rows (never derived from the data).")
    check_positive("row_norm", row_norm)
    if center is not None and not isinstance(center, str) and np.ndim(center) != 1:
        raise ValueError(f"Expected center to be None, 'private' or a public mean (1-D), got "
                         f"{center!r}.")
    if n_clients is not None:
        check_int("n_clients", n_clients, low=1)
    check_positive("connect_timeout", connect_timeout)
    check_positive("timeout", timeout)
    if ledger is not None and not isinstance(ledger, PrivacyLedger):
        raise TypeError(f"Expected ledger to be a PrivacyLedger, got {type(ledger).__name__}.")
    event = planned_event(method, target_epsilon=target_epsilon, target_delta=target_delta,
                          center=center, noise_multiplier=noise_multiplier, trust=trust,
                          **options)
    if options.get("add_noise", True) is False:
        raise ValueError("add_noise=False would send every client's exact part to the "
                         "server; PCA on Flower is private only.")
    if ledger is not None:
        ledger.check(event)  # before any message (PrivacyBudgetExceededError)
    return event


def _message(node: int, request: dict[str, Any], arrays: Sequence[np.ndarray]) -> Message:
    content = RecordDict({
        _REQUEST: ConfigRecord({"json": json.dumps(request)}),
        _ARRAYS: ArrayRecord({str(i): Array(np.asarray(a)) for i, a in enumerate(arrays)}),
    })
    return Message(content, dst_node_id=node, message_type=MESSAGE_TYPE)


def _collect(grid: Grid, nodes: Sequence[int], request: dict[str, Any],
             arrays: Sequence[np.ndarray], timeout: float
             ) -> tuple[dict[int, Message], dict[int, str]]:
    """Send ``request`` to ``nodes``; the valid replies by node and the failures' reasons."""
    replies = grid.send_and_receive([_message(n, request, arrays) for n in nodes],
                                    timeout=timeout)
    got: dict[int, Message] = {}
    failed: dict[int, str] = {}
    for reply in replies:
        node = int(reply.metadata.src_node_id)
        if node not in nodes:
            continue
        if reply.has_error():
            failed[node] = f"error: {reply.error.reason}"
        else:
            got[node] = reply
    return got, failed


class FlowerTransport:
    """The :data:`~dpprecond.pca.remote.Transport` over a Flower Grid.

    ``nodes[i]`` is the node id of client ``i``; every request goes to all of them and
    every client must answer with a finite array of the expected shape, else
    :class:`~dpprecond.pca.remote.ClientMissingError`.
    """

    def __init__(self, grid: Grid, nodes: Sequence[int], timeout: float) -> None:
        self.grid, self.nodes, self.timeout = grid, [int(n) for n in nodes], float(timeout)

    def __call__(self, request: dict[str, Any], arrays: list[np.ndarray]) -> list[np.ndarray]:
        got, failed = _collect(self.grid, self.nodes, request, arrays, self.timeout)
        parts: dict[int, np.ndarray] = {}
        for client, node in enumerate(self.nodes):
            if node in failed:
                continue
            if node not in got:
                failed[node] = f"no reply within timeout={self.timeout:g} s"
                continue
            try:
                content = got[node].content
                if read_int(content[_METRICS], "client-id", "reply") != client:
                    raise ValueError("the reply names another client id")
                part = read_array(content[_REPLY], "part", "reply").astype(np.float64)
                if not np.all(np.isfinite(part)):
                    raise ValueError("the part is not finite")
            except (KeyError, ValueError, TypeError) as exc:
                failed[node] = f"malformed reply ({exc})"
                continue
            parts[client] = part
        if failed:
            missing = [c for c, n in enumerate(self.nodes) if n in failed]
            reasons = {c: failed[self.nodes[c]] for c in missing}
            raise ClientMissingError(
                f"Federated PCA request {request['kind']!r}: client(s) {missing} gave no valid "
                f"part ({'; '.join(f'client {c}: {r}' for c, r in reasons.items())}).",
                clients=missing, reasons=reasons, kind=str(request["kind"]))
        return [parts[c] for c in range(len(self.nodes))]


def _register(grid: Grid, n_clients: int | None, connect_timeout: float,
              timeout: float) -> tuple[list[int], list[int], int]:
    """Node ids and row counts of clients ``0 .. K-1`` and ``d`` (one query per node)."""
    deadline = time.monotonic() + connect_timeout
    seen: dict[int, tuple[int, int, int, int]] = {}  # node -> (client, K, n_i, d)
    asked: set[int] = set()
    reasons: dict[int, str] = {}
    request = {"kind": "register"}
    while True:
        new = [n for n in grid.get_node_ids() if n not in asked]
        if new:
            asked.update(new)
            got, failed = _collect(grid, new, request, [], min(timeout, connect_timeout))
            for node, reply in got.items():
                m = reply.content[_METRICS]
                seen[node] = tuple(read_int(m, key, "registration")  # type: ignore[assignment]
                                   for key in ("client-id", "num-partitions", "n-rows",
                                               "n-features"))
            for node, why in failed.items():
                logger.warning("node %d did not register: %s", node, why)
                reasons[node] = why
        sizes = {v[1] for v in seen.values()}
        if len(sizes) > 1 or (n_clients is not None and sizes - {n_clients}):
            raise ValueError(f"The SuperNodes report num-partitions {sorted(sizes)}, expected "
                             f"{n_clients if n_clients is not None else 'one value'}: every "
                             "node of a PCA federation must hold one of the same K parts.")
        K = n_clients if n_clients is not None else (sizes.pop() if sizes else None)
        ids = sorted(v[0] for v in seen.values())
        if K is not None and ids and ids[-1] >= K:
            raise ValueError(f"A SuperNode reports partition-id {ids[-1]} of a federation of "
                             f"{K} clients; expected 0 .. {K - 1}.")
        if len(ids) != len(set(ids)):
            raise ValueError(f"Two SuperNodes report the same partition-id ({ids}).")
        if K is not None and ids == list(range(K)):
            break
        if time.monotonic() >= deadline:
            missing = sorted(set(range(K or 0)) - set(ids)) if K else ["all"]
            raise ClientMissingError(
                f"Federated PCA: client(s) {missing} did not register within connect_timeout="
                f"{connect_timeout:g} s (registered: {ids}"
                + "".join(f"; node {n}: {why}" for n, why in sorted(reasons.items()))
                + "); a PCA pass needs every client. Nothing was released.",
                clients=[m for m in missing if isinstance(m, int)], reasons={},
                kind="register")
        time.sleep(0.2)
    by_client = {v[0]: (node, v[2], v[3]) for node, v in seen.items()}
    ds = {by_client[c][2] for c in range(K)}
    if len(ds) != 1:
        raise ValueError(f"The clients' rows have different numbers of features {sorted(ds)}; "
                         "every client must hold rows of the same d columns.")
    return ([by_client[c][0] for c in range(K)], [by_client[c][1] for c in range(K)],
            ds.pop())


def fit_pca_on_flower(grid: Grid, n_components: int, *, target_epsilon: float | None,
                      target_delta: float, row_norm: float | None, method: str = "auto",
                      center: Any = None, trust: str = "local",
                      noise_multiplier: float | None = None,
                      ledger: PrivacyLedger | None = None, secure: bool = False,
                      n_clients: int | None = None, connect_timeout: float = 120.0,
                      timeout: float = 600.0, min_clients: int | None = None,
                      **options: Any) -> PCAResult:
    """Differentially private PCA of the rows held by the Flower clients.

    The settings are :func:`~dpprecond.pca.fit_private_pca`'s (``method`` one of
    :data:`~dpprecond.pca.remote.REMOTE_METHODS`; no ``seed``: the clients hold the
    noise) and are checked before any message (:func:`check_pca_config`). Then one
    ``query.pca`` per node registers the clients (``partition-id`` ``0 .. K-1`` of the same
    ``num-partitions``; ``n_clients`` if given must equal it; all must connect within
    ``connect_timeout``), and the fit runs with every pass a message round (``timeout``
    each).

    A missing, failing or malformed reply raises
    :class:`~dpprecond.pca.remote.ClientMissingError`: a PCA pass is a sum over every
    client's rows and never drops one. Its message states the privacy spent: nothing if
    no release had been asked for; otherwise at most the fit's planned event (its epsilon
    at ``target_delta``), which is then charged to ``ledger``.

    ``trust="secure-aggregation"`` (:mod:`dpprecond.adapters.flower.pca_secagg`): every
    release is one SecAgg+ masked sum of the clients' Skellam-noised messages, the
    in-process secure fit's plan and event, charged to ``ledger`` before the first share;
    ``min_clients`` (default K) is the fewest shares a released sum holds (with fewer than
    K, a sum SecAgg+ completes without some clients holds only the survivors' rows, at
    full noise). A federation
    whose sums need more than SecAgg+'s ``2^30`` is refused after registration, before
    any release (:class:`SecureAggregationUnavailableError`, stating the bits).

    Returns
    -------
    PCAResult
        As the in-process fit: components, explained variance, ``dp_event`` and
        ``epsilon`` (the fit's dp_accounting event), ``info["n_clients"]``,
        ``info["trust"]`` (and ``info["secure_aggregation"]``: the sums' moduli, the
        ``seconds_per_release`` of the SecAgg+ rounds and the ``shares_per_release``).
    """
    check_pca_config(
        n_components, target_epsilon=target_epsilon, target_delta=target_delta,
        row_norm=row_norm, method=method, center=center, trust=trust,
        noise_multiplier=noise_multiplier, ledger=ledger, n_clients=n_clients,
        connect_timeout=connect_timeout, timeout=timeout, min_clients=min_clients,
        secure=secure, **options)
    nodes, n_rows, d = _register(grid, n_clients, connect_timeout, timeout)
    secagg = trust == "secure-aggregation"
    secure_transport = None
    if secagg:
        check_modulus(d, sum(n_rows), len(nodes), min_clients, method=method,
                      n_components=n_components, target_epsilon=target_epsilon,
                      target_delta=target_delta, center=center,
                      noise_multiplier=noise_multiplier, options=options)
        secure_transport = SecAggPlusPCATransport(grid, nodes, timeout)
    federation = RemoteFederation(FlowerTransport(grid, nodes, timeout), n_rows, d,
                                  fit_id=uuid.uuid4().hex, secure_transport=secure_transport)
    # A missing client stops the fit with a ClientMissingError stating the privacy spent
    # (fit_private_pca charges the ledger with the plan once a release was asked for).
    result = fit_private_pca(federation, n_components, target_epsilon=target_epsilon,
                             target_delta=target_delta, row_norm=row_norm, method=method,
                             center=center, ledger=ledger, secure=secure, trust=trust,
                             noise_multiplier=noise_multiplier, min_clients=min_clients,
                             **options)
    if secure_transport is not None:
        result.info["secure_aggregation"].update(
            seconds_per_release=list(secure_transport.seconds),
            shares_per_release=list(secure_transport.shares))
    return result


def make_pca_server_app(n_components: int, *, target_epsilon: float | None,
                        target_delta: float, row_norm: float | None,
                        on_result: Callable[[PCAResult, Context], None] | None = None,
                        **settings: Any) -> ServerApp:
    """A ServerApp whose ``main`` runs :func:`fit_pca_on_flower` once and logs its epsilon.

    ``settings`` are :func:`fit_pca_on_flower`'s (``method``, ``center``, ``ledger``,
    ``n_clients``, timeouts, method options); they are checked here, when the app is built
    (and again before the first message). ``on_result(result, context)`` receives the
    :class:`~dpprecond.pca.PCAResult`.
    """
    check_pca_config(n_components, target_epsilon=target_epsilon,
                     target_delta=target_delta, row_norm=row_norm, **settings)
    app = ServerApp()

    @app.main()
    def _main(grid: Grid, context: Context) -> None:
        result = fit_pca_on_flower(grid, n_components, target_epsilon=target_epsilon,
                                   target_delta=target_delta, row_norm=row_norm, **settings)
        logger.info("federated PCA (%s, %d clients, trust=%s): epsilon=%.6g at delta=%g "
                    "(event %s)", result.method, result.info["n_clients"],
                    result.info["trust"], result.epsilon, result.delta, result.dp_event)
        if on_result is not None:
            on_result(result, context)

    return app


# ---------------------------------------------------------------------------------------
# The client
# ---------------------------------------------------------------------------------------


def pca_reply(message: Message, context: Context, load_rows: LoadRows, *,
              noise_seed: int | None = None) -> Message:
    """Answer one PCA request (registration, rounding bound, public draw or release).

    The part is computed and noised here, on the client
    (:func:`~dpprecond.pca.remote.client_answer`); the fit's streams and draws live in
    ``context.state``. Node config: ``secure-noise``, ``min-noise-multiplier``,
    ``allow-seeded-noise`` as for the FL ClientApp
    (:mod:`dpprecond.adapters.flower.client_app`).
    """
    info = client_info(context)
    if _REQUEST not in message.content:
        raise ValueError("The PCA request has no 'pca-request' record; the server and the "
                         "client run different versions of the dpprecond adapter.")
    request = json.loads(str(message.content[_REQUEST]["json"]))
    X = _local_rows(load_rows(info))
    metrics: dict[str, int | float | list[int] | list[float]] = {"client-id": info.client_id}
    if request.get("kind") == "register":
        metrics.update({"num-partitions": info.n_clients, "n-rows": int(X.shape[0]),
                        "n-features": int(X.shape[1])})
        return Message(RecordDict({_METRICS: MetricRecord(metrics)}), reply_to=message)
    node = info.node_config
    floor = node.get("min-noise-multiplier", 0.0)
    if isinstance(floor, bool) or not isinstance(floor, (int, float)) or not floor >= 0:
        raise TypeError(f"Expected node config min-noise-multiplier to be a number >= 0, got "
                        f"{floor!r}.")
    secure = _as_bool("secure-noise", node.get("secure-noise", False))
    seed = noise_seed if noise_seed is not None else _run_config_seed(info)
    record: Any = message.content[_ARRAYS] if _ARRAYS in message.content else {}
    arrays = [read_array(record, str(i), "request") for i in range(len(record))]
    state = _load_state(context)
    if request.get("kind") == "secure-public":  # the server's public draw (secure fit)
        out = client_public_draw(request, X, n_clients=info.n_clients, state=state,
                                 noise_seed=seed, secure=secure)
    else:
        out = client_answer(request, arrays, X, client_id=info.client_id, state=state,
                            noise_seed=seed, secure=secure,
                            min_noise_multiplier=float(floor))
    _keep_state(context, state)
    return Message(RecordDict({_REPLY: ArrayRecord({"part": Array(np.asarray(out))}),
                               _METRICS: MetricRecord(metrics)}), reply_to=message)


def add_pca_handler(app: ClientApp, load_rows: LoadRows, *,
                    noise_seed: int | None = None) -> ClientApp:
    """Register the PCA handler (``query.pca``) on an existing ClientApp and return it.

    The FL ClientApp (:func:`~dpprecond.adapters.flower.make_client_app`) answers
    ``query`` and ``train``; with this it also answers federated PCA on the same nodes,
    under ``trust="local"`` (a secure fit's SecAgg+ rounds are ``train`` messages, which
    :func:`make_pca_client_app` answers behind ``secaggplus_mod``, and so does
    :func:`~dpprecond.adapters.flower.secagg.make_dual_client_app` with ``pca=True``, the
    FL ClientApp for both trust models).
    """
    if noise_seed is not None:
        check_int("noise_seed", noise_seed, low=0)

    @app.query("pca")
    def _pca(message: Message, context: Context) -> Message:
        return pca_reply(message, context, load_rows, noise_seed=noise_seed)

    return app


def make_pca_client_app(load_rows: LoadRows, *, noise_seed: int | None = None) -> ClientApp:
    """A ClientApp answering federated PCA requests under both trust models.

    ``query.pca`` (:func:`pca_reply`: registration, rounding bounds, public draws, the
    local path's noisy parts) and, behind Flower's ``secaggplus_mod``, the SecAgg+ fit
    rounds of a secure fit (:func:`~dpprecond.adapters.flower.pca_secagg.secure_pca_reply`:
    one masked message per release).

    Parameters
    ----------
    load_rows : callable
        ``load_rows(ClientInfo) -> X_i`` (this client's rows, raw: the server's public
        ``row_norm`` scales and clips them here), or a ``LocalData``.
    noise_seed : int or None, default=None
        ``None`` draws fresh OS entropy (always, in a deployment). An integer makes client
        ``i`` use the streams of ``fit_private_pca(..., seed=noise_seed, clients=bounds,
        trust="local")`` (only for simulations owned by one party).
    """
    app = add_pca_handler(ClientApp(mods=[secaggplus_mod]), load_rows, noise_seed=noise_seed)

    @app.train()
    def _secure(message: Message, context: Context) -> Message:
        return secure_pca_reply(message, context, load_rows, noise_seed=noise_seed)

    return app
