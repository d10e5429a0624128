"""The Flower ClientApp: one client's clipped, noised release per request.

A client answers two kinds of messages:

- ``query`` (registration, once): its client id and the federation size it was told, so
  the server can name clients in its history and detect a misconfigured federation;
- ``train`` (the setup round and every round): the release the
  :class:`~dpprecond.adapters.flower.protocol.RoundRequest` asks for, computed by
  :func:`~dpprecond.adapters.flower.client_side.client_reply` (the method's client task,
  which the engine runs too, on this one client). The noise is added here, on the client,
  before anything leaves the machine.

A stateful task's client state (DP-SCAFFOLD's control variate ``c_i``) lives in the
client's Flower ``context.state`` (which Flower keeps per node and run, across rounds); the
newly computed one is kept pending until the server reports that round's reply as
aggregated (:func:`~dpprecond.adapters.flower.client_side.settle_state`).

Who the client is comes from the SuperNode's node config, which the client's operator sets
(``flower-supernode --node-config "partition-id=3 num-partitions=20"``; Flower's
simulation sets both). Node-config keys the client honours, all optional:

``allow-seeded-noise`` (bool, default false)
    Consent to a ``noise-seed`` in the run config. The run config is chosen by whoever
    starts the run (the server side), and a seed known to the server removes the noise, so a
    client never follows a run-config seed unless its own operator allowed it. Without the
    consent a seeded request is refused (the client drops out, with this reason).
``min-noise-multiplier`` (float, default 0)
    The client refuses any release that asks for a smaller noise multiplier (the round's
    message and, with adaptive clipping, its count).
``secure-noise`` (bool, default false)
    Always draw the noise in secure mode (:mod:`dpprecond.secure`: the OS CSPRNG, snapped
    releases), whatever the server asks; seeds are then refused.

The Python API (:func:`make_client_app` with ``noise_seed``) is for simulations in which
one party owns every client; deployments leave it ``None``: fresh OS entropy per client and
request (:func:`~dpprecond.adapters.flower.protocol.client_rng`).
"""

from __future__ import annotations

import logging
import numbers
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import numpy as np
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Context,
    Message,
    MetricRecord,
    RecordDict,
)
from flwr.clientapp import ClientApp

from dpprecond._validation import check_int
from dpprecond.adapters.flower.client_side import ClientState, client_reply, settle_state
from dpprecond.adapters.flower.protocol import KEYS, RoundRequest, client_rng
from dpprecond.adapters.flower.records import read_array, read_int
from dpprecond.fl.models import FLModel

__all__ = [
    "ClientInfo",
    "LoadData",
    "LocalData",
    "client_info",
    "make_client_app",
    "query_reply",
    "train_reply",
]

logger = logging.getLogger(__name__)


class ClientInfo(NamedTuple):
    """Who a client is and what it was told (Flower-free view of a Flower Context)."""

    client_id: int
    n_clients: int
    run_config: Mapping[str, Any]
    node_config: Mapping[str, Any]


class LocalData(NamedTuple):
    """A client's model and its own examples (features already computed)."""

    model: FLModel
    X: np.ndarray
    y: np.ndarray


#: ``load_data(info) -> LocalData``: where a client's data comes from.
LoadData = Callable[[ClientInfo], LocalData]


def client_info(context: Context) -> ClientInfo:
    """Read the client id and federation size from the node config.

    Raises ``ValueError`` naming the missing key and the SuperNode flag that sets it.
    """
    node = dict(context.node_config)
    for key in ("partition-id", KEYS.n_clients):
        if key not in node:
            raise ValueError(f"This SuperNode has no {key!r} in its node config; start it with "
                             "--node-config \"partition-id=I num-partitions=K\" (client I of "
                             "K, 0 <= I < K).")
    n_clients = check_int("num-partitions", node[KEYS.n_clients], low=1)
    client_id = check_int("partition-id", node["partition-id"], low=0, high=n_clients - 1)
    return ClientInfo(client_id, n_clients, dict(context.run_config), node)


def _as_bool(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise TypeError(f"Expected node config {name} to be true or false, got {value!r}.")


def _run_config_seed(info: ClientInfo) -> int | None:
    """The run config's ``noise-seed`` if set and consented to by the node; else None."""
    raw = info.run_config.get("noise-seed", "")
    if raw == "" or raw is None:
        return None
    if isinstance(raw, str):
        try:
            raw = int(raw)
        except ValueError:
            raise ValueError(f"Expected run config noise-seed to be empty (fresh OS entropy) or "
                             f"an integer >= 0, got {raw!r}.") from None
    seed = check_int("noise-seed", raw, low=0)
    if not _as_bool("allow-seeded-noise", info.node_config.get("allow-seeded-noise", False)):
        raise ValueError("The run config sets noise-seed, but this SuperNode did not consent "
                         "(node config allow-seeded-noise=true): a seed chosen by the server "
                         "would let the server remove the noise. Refusing to answer.")
    return seed


def _check_policy(info: ClientInfo, request: RoundRequest) -> None:
    floor = info.node_config.get("min-noise-multiplier", 0.0)
    if not isinstance(floor, numbers.Real) or isinstance(floor, bool):
        raise TypeError(f"Expected node config min-noise-multiplier to be a number, got "
                        f"{floor!r}.")
    if not float(floor) >= 0:  # nan: `z < nan` is always false, which would be no floor
        raise ValueError(f"Expected node config min-noise-multiplier to be a number >= 0, "
                         f"got {floor!r}; set it to the smallest noise multiplier this node "
                         "accepts (0: no floor). Refusing to answer.")
    lowest = min(request.noise_multipliers)  # every release asked for, count included
    if lowest < float(floor):
        raise ValueError(f"The server asked for noise_multiplier={lowest:g} "
                         f"below this client's min-noise-multiplier={float(floor):g}; "
                         "refusing to answer.")


def query_reply(message: Message, context: Context) -> Message:
    """Registration: reply with this client's id and the federation size it was told."""
    info = client_info(context)
    metrics = MetricRecord({KEYS.client_id: info.client_id, KEYS.n_clients: info.n_clients})
    return Message(RecordDict({KEYS.metrics: metrics}), reply_to=message)


def _received(content: RecordDict, name: str, n_params: int, model: FLModel) -> np.ndarray:
    if KEYS.params not in content:
        raise ValueError("The request has no parameters; the server and the client run "
                         "different versions of the dpprecond adapter.")
    value = np.asarray(read_array(content[KEYS.params], name, "request"), dtype=np.float64)
    if value.shape != (n_params,) or not np.isfinite(value).all():
        raise ValueError(f"Received {name} of shape {value.shape} (finite: "
                         f"{bool(np.isfinite(value).all())}); this client's model {model!r} "
                         f"needs {n_params} finite values.")
    return value


def _client_state(context: Context, n_params: int) -> ClientState:
    """This client's task state (zeros before its first round)."""
    if KEYS.state not in context.state:
        return ClientState(np.zeros(n_params))
    arrays = context.state[KEYS.state]
    pending = read_array(arrays, "pending", "client state") if "pending" in arrays else None
    return ClientState(read_array(arrays, "state", "client state"), pending,
                       read_int(context.state[KEYS.state_round], "pending-round",
                                "client state"))


def _keep_state(context: Context, state: np.ndarray, pending: np.ndarray,
                server_round: int) -> None:
    context.state[KEYS.state] = ArrayRecord({"state": Array(state),
                                             "pending": Array(pending)})
    context.state[KEYS.state_round] = ConfigRecord({"pending-round": server_round})


def train_reply(message: Message, context: Context, load_data: LoadData, *,
                noise_seed: int | None = None) -> Message:
    """Answer one request: read it (and the model), release, reply.

    Parameters
    ----------
    message : Message
        The server's train message (records ``config``, and ``params`` except in the setup
        round).
    context : Context
        The client's Flower context (node config: who it is; run config: the run; state:
        a stateful task's client state).
    load_data : callable
        ``load_data(ClientInfo) -> LocalData`` (the client's model and examples).
    noise_seed : int or None
        ``None`` (deployments): fresh OS entropy. An integer (one-owner simulations): the
        engine's stream of (round, client). Otherwise the run config's ``noise-seed`` is
        used only with the node's consent (module docstring).
    """
    info = client_info(context)
    request = RoundRequest.from_config(message.content[KEYS.config])
    _check_policy(info, request)
    secure = _as_bool("secure-noise", info.node_config.get("secure-noise", False))
    seed = noise_seed if noise_seed is not None else _run_config_seed(info)
    rng = client_rng(seed, request, info.client_id, secure=secure)
    count_rng = None if request.count_task is None else client_rng(
        seed, request, info.client_id, secure=secure, count=True)
    local = load_data(info)
    n_params = local.model.n_params
    task = request.task
    params = client_state = None
    if not task.setup:
        params = _received(message.content, KEYS.params, n_params, local.model)
    broadcast = {name: _received(message.content, name, n_params, local.model)
                 for name in task.broadcast_names}
    if task.stateful:
        client_state = settle_state(_client_state(context, n_params), request.accepted_round)
    arrays, new_state = client_reply(local.model, params, local.X, local.y, request, rng,
                                     broadcast=broadcast, client_state=client_state,
                                     count_rng=count_rng)
    if new_state is not None:
        assert client_state is not None
        _keep_state(context, client_state, new_state, request.server_round)
    metrics: dict[str, int | float | list[int] | list[float]] = {
        KEYS.client_id: info.client_id}
    if request.report_size:
        metrics[KEYS.n_examples] = int(local.X.shape[0])
    content = RecordDict({
        KEYS.reply: ArrayRecord({k: Array(np.asarray(v)) for k, v in arrays.items()}),
        KEYS.metrics: MetricRecord(metrics),
    })
    logger.debug("client %d answered round %d (%s)", info.client_id, request.server_round,
                 request.kind)
    return Message(content, reply_to=message)


def make_client_app(load_data: LoadData, *, noise_seed: int | None = None) -> ClientApp:
    """A ClientApp answering registration (``query``) and requests (``train``).

    Parameters
    ----------
    load_data : callable
        ``load_data(ClientInfo) -> LocalData``; called for every request, so cache
        expensive loading inside it (see :mod:`dpprecond.adapters.flower.data`). It must be
        picklable for Flower's Ray simulation (a module-level function or a dataclass).
    noise_seed : int or None, default=None
        ``None`` draws fresh OS entropy (always, in a deployment). An integer makes client
        ``i`` use the engine's streams of ``run_federated(seed=noise_seed)`` (round ``t``:
        ``stream(noise_root, t - 1, i)``; the setup round: ``stream(setup_root, 0, i)``):
        only for simulations owned by one party.

    Notes
    -----
    Federated evaluation is deliberately not answered: a client's loss or accuracy on its
    own data is a non-private release. Evaluate on public data at the server instead.
    """
    if noise_seed is not None:
        check_int("noise_seed", noise_seed, low=0)
    app = ClientApp()

    @app.query()
    def _query(message: Message, context: Context) -> Message:
        return query_reply(message, context)

    @app.train()
    def _train(message: Message, context: Context) -> Message:
        return train_reply(message, context, load_data, noise_seed=noise_seed)

    return app
