"""A Flower strategy for the "one noisy message per client per round + server transform"
algorithms: DP-FedSOFIM (every form), DP-FedGD, DP-FedAdam and DP-FedYogi.

The strategy only wires messages. Each round it

1. registers any newly connected node (a ``query`` message: which client id are you?);
2. sends the current model and a :class:`~dpprecond.adapters.flower.protocol.RoundRequest`
   (clip norm, noise multiplier, mechanism) to every registered client;
3. aggregates the noisy messages of the clients that replied
   (:func:`~dpprecond.adapters.flower.protocol.aggregate`, rows in client-id order) and
   applies the server transform (an ``(init, update)`` pair from
   :func:`dpprecond.fl.server.make_optimizer`);
4. records the epsilon spent (:func:`~dpprecond.adapters.flower.protocol.epsilon_after_rounds`,
   the simulator's dp_accounting events) and which clients dropped out.

Privacy. The clients add their own Gaussian noise before sending (no trusted aggregator),
so nothing here is wrapped in Flower's differential-privacy strategies, which add noise
after aggregation. The server step is post-processing and costs nothing.

Dropout. A client whose reply is an error, is malformed, or does not arrive within the
round's timeout is left out of that round; the round aggregates the others with weights
renormalized over the repliers (uniform ``1/m``, or ``|D_i| / sum`` of the repliers' sizes).
Every client that was *sent* a request is charged for that round, replied or not: a client
that failed before computing its message released nothing, but a client that timed out may
have sent a message that arrived late, and the server cannot tell the two apart, so the
reported epsilon never relies on a reply having been lost. The messages that were used are
each protected by their own client's noise, so leaving some out changes nobody's privacy;
it raises the variance of the aggregate's noise (``1/m`` instead of ``1/K``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import asdict, replace
from typing import Any

import numpy as np
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from dpprecond._validation import check_array, check_int, check_labels, check_positive
from dpprecond.adapters.flower.protocol import (
    CLIENT_MECHANISMS,
    KEYS,
    RoundRequest,
    aggregate,
    epsilon_after_rounds,
    simulator_seeds,
)
from dpprecond.fl.config import FLConfig
from dpprecond.fl.engine import FLResult
from dpprecond.fl.models import FLModel
from dpprecond.fl.server import GradientTransformation

__all__ = ["DPFedStrategy"]

logger = logging.getLogger(__name__)


class DPFedStrategy(Strategy):
    """Server side of DP federated learning with client-side noise, over a Flower Grid.

    Parameters
    ----------
    model : FLModel
        The model (only ``init_params``, ``n_params`` and, with test data, ``evaluate``
        are used at the server).
    optimizer : GradientTransformation
        The server transform, e.g. ``dpprecond.fl.server.make_optimizer("sofim")``.
    config : FLConfig
        Privacy and training settings: ``n_rounds``, ``clip_norm``, ``target_epsilon`` or
        ``noise_multiplier``, ``target_delta``, ``mechanism`` (``"full-batch"`` or
        ``"poisson"``), ``weighting``, ``accountant``. The noise multiplier is resolved
        (calibrated) once, here, and sent to the clients every round.
    n_clients : int
        Expected federation size K (client ids ``0 .. K-1``).
    X_test, y_test : ndarray, optional
        Public held-out data for a server-side accuracy and loss after every round.
    seed : int or None
        Model initialization from ``run_federated``'s seed tree; ``None`` uses fresh
        entropy. It never touches the clients' noise.
    connect_timeout : float, default=120
        Seconds to wait before the first round for all K clients to connect and register;
        afterwards the run goes on with the registered ones (the others count as absent).
    min_replies : int, default=1
        A round with fewer valid replies leaves the model and the optimizer state unchanged.

    Attributes
    ----------
    noise_multiplier_ : float
        The noise multiplier sent to the clients.
    history_ : list of dict
        One record per round: ``round``, ``epsilon``, ``update_norm``, ``seconds``,
        ``n_replied``, ``clients_replied``, ``clients_failed``, ``clients_timed_out``,
        ``clients_absent``, ``failures`` (client id -> reason) and, with test data,
        ``test_accuracy`` and ``test_loss``.
    result_ : FLResult
        After :meth:`run`: final parameters, history and privacy figures.
    """

    def __init__(self, model: FLModel, optimizer: GradientTransformation, config: FLConfig,
                 n_clients: int, *, X_test: np.ndarray | None = None,
                 y_test: np.ndarray | None = None, seed: int | None = None,
                 connect_timeout: float = 120.0, min_replies: int = 1) -> None:
        if not isinstance(config, FLConfig):
            raise TypeError(f"Expected config to be an FLConfig, got {type(config).__name__}.")
        self.config = config.validated()
        if self.config.mechanism not in CLIENT_MECHANISMS:
            raise ValueError(f"mechanism={self.config.mechanism!r} is not supported on Flower: "
                             f"the adapter runs the client-noise mechanisms "
                             f"{list(CLIENT_MECHANISMS)}; client-level DP needs a trusted "
                             "aggregator (use the in-process simulator).")
        self.model = model
        self.optimizer = optimizer
        self.n_clients = check_int("n_clients", n_clients, low=1)
        self.seed = None if seed is None else check_int("seed", seed, low=0)
        self.connect_timeout = check_positive("connect_timeout", connect_timeout)
        self.min_replies = check_int("min_replies", min_replies, low=1)
        self.X_test = self.y_test = None
        if (X_test is None) != (y_test is None):
            raise ValueError("Pass both X_test and y_test, or neither.")
        if X_test is not None:
            self.X_test = check_array("X_test", X_test)
            self.y_test = check_labels("y_test", y_test, getattr(model, "n_classes", 2**31),
                                       n_rows=self.X_test.shape[0])
        self.noise_multiplier_ = self.config.resolve_noise_multiplier()
        self._request = RoundRequest(
            1, float(self.config.clip_norm), float(self.noise_multiplier_),
            self.config.mechanism, float(self.config.sampling_rate),
            int(self.config.local_steps), float(self.config.local_lr)).validated()
        self._clients: dict[int, int] = {}  # node id -> client id (registration)
        self._reset()

    # -- bookkeeping ---------------------------------------------------------------------

    def _reset(self) -> None:
        self.history_: list[dict[str, Any]] = []
        self._asked = np.zeros(self.n_clients, dtype=np.int64)
        self._sent: dict[int, int] = {}
        self._round_start = 0.0
        self._params: np.ndarray | None = None
        self._state: Any = None

    def initial_params(self) -> np.ndarray:
        """The model's initial parameters (from the seed tree when ``seed`` is set)."""
        init = None if self.seed is None else simulator_seeds(self.seed).init
        return np.asarray(self.model.init_params(np.random.default_rng(init)), dtype=np.float64)

    def summary(self) -> None:
        """Log the settings (Flower calls this when the strategy starts)."""
        logger.info("DPFedStrategy: K=%d clients, T=%d rounds, mechanism=%s, z=%.4g, C=%g, "
                    "weighting=%s, delta=%g", self.n_clients, self.config.n_rounds,
                    self.config.mechanism, self.noise_multiplier_, self.config.clip_norm,
                    self.config.weighting, self.config.target_delta)

    # -- registration --------------------------------------------------------------------

    def _query(self, grid: Grid, nodes: Iterable[int], timeout: float) -> None:
        content = RecordDict({KEYS.config: ConfigRecord({"request": "client-id"})})
        messages = [Message(content, dst_node_id=n, message_type=MessageType.QUERY)
                    for n in sorted(nodes)]
        for reply in grid.send_and_receive(messages, timeout=timeout):
            node = reply.metadata.src_node_id
            if reply.has_error():
                logger.warning("node %d failed to register: %s", node, reply.error.reason)
                continue
            metrics = reply.content[KEYS.metrics]
            told = int(metrics[KEYS.n_clients])
            if told != self.n_clients:
                raise ValueError(f"Node {node} was configured with num-partitions={told}, but "
                                 f"the server expects n_clients={self.n_clients}; give every "
                                 "SuperNode the same num-partitions.")
            self._clients[node] = int(metrics[KEYS.client_id])

    def _registered(self, grid: Grid, wait: bool) -> dict[int, int]:
        """Connected, registered nodes (node id -> client id), registering new ones."""
        deadline = time.monotonic() + (self.connect_timeout if wait else 0.0)
        while True:
            nodes = set(grid.get_node_ids())
            new = nodes - self._clients.keys()
            if new:
                remaining = max(1.0, deadline - time.monotonic())
                self._query(grid, new, min(remaining, self.connect_timeout))
            current = {n: c for n, c in self._clients.items() if n in nodes}
            ids = list(current.values())
            if len(set(ids)) != len(ids):
                dup = sorted({c for c in ids if ids.count(c) > 1})
                raise ValueError(f"Several connected SuperNodes claim client ids {dup}; give "
                                 "each SuperNode its own partition-id.")
            if not wait or len(current) >= self.n_clients or time.monotonic() >= deadline:
                return current
            time.sleep(0.2)

    # -- one round -------------------------------------------------------------------------

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        """Register new nodes and send the model and the round request to every client."""
        current = self._registered(grid, wait=server_round == 1)
        if not current:
            raise RuntimeError(f"No client registered within connect_timeout="
                               f"{self.connect_timeout:g} s; start the SuperNodes (each with "
                               "--node-config \"partition-id=I num-partitions=K\").")
        if server_round == 1 and len(current) < self.n_clients:
            logger.warning("only %d of %d clients registered; going on without the others",
                           len(current), self.n_clients)
        self._params = np.asarray(arrays[KEYS.params].numpy(), dtype=np.float64)
        request = replace(self._request, server_round=server_round)
        content = RecordDict({KEYS.params: arrays,
                              KEYS.config: ConfigRecord(request.to_config())})
        self._sent = dict(current)
        self._asked[list(current.values())] += 1  # charged whether or not they reply
        self._round_start = time.perf_counter()
        return [Message(content, dst_node_id=n, message_type=MessageType.TRAIN)
                for n in sorted(current)]

    def _parse(self, content: RecordDict, client: int) -> tuple[np.ndarray, int]:
        metrics = content[KEYS.metrics]
        if int(metrics[KEYS.client_id]) != client:
            raise ValueError(f"reply says client-id={metrics[KEYS.client_id]}, registered as "
                             f"{client}")
        u = np.asarray(content[KEYS.message][KEYS.message].numpy(), dtype=np.float64)
        if u.shape != (self.model.n_params,) or not np.isfinite(u).all():
            raise ValueError(f"message of shape {u.shape} (finite: "
                             f"{bool(np.isfinite(u).all())}), expected "
                             f"({self.model.n_params},) finite values")
        n = int(metrics[KEYS.n_examples])
        if n < 1:
            raise ValueError(f"num-examples={n} < 1")
        return u, n

    def aggregate_train(self, server_round: int, replies: Iterable[Message]
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Aggregate the valid replies, apply the server transform, record the round."""
        assert self._params is not None  # configure_train ran first (internal invariant)
        replied: dict[int, tuple[np.ndarray, int]] = {}
        failures: dict[int, str] = {}
        for msg in replies:
            client = self._sent.get(msg.metadata.src_node_id)
            if client is None or client in replied or client in failures:
                continue
            if msg.has_error():
                failures[client] = str(msg.error.reason)
                continue
            try:
                replied[client] = self._parse(msg.content, client)
            except (KeyError, ValueError, TypeError) as exc:
                failures[client] = f"malformed reply: {exc}"
        sent = set(self._sent.values())
        timed_out = sorted(sent - replied.keys() - failures.keys())
        absent = sorted(set(range(self.n_clients)) - sent)
        order = sorted(replied)
        updates = np.zeros_like(self._params)
        if len(order) >= self.min_replies:
            U = np.stack([replied[c][0] for c in order])
            sizes = np.array([replied[c][1] for c in order], dtype=np.int64)
            G = aggregate(U, sizes, self.config.weighting)
            updates, self._state = self.optimizer.update(G, self._state, self._params)
            self._params = self._params + updates
        else:
            logger.warning("round %d: %d valid replies < min_replies=%d; model unchanged",
                           server_round, len(order), self.min_replies)
        for c in (*failures, *timed_out):
            logger.warning("round %d: client %d dropped (%s)", server_round, c,
                           failures.get(c, "no reply before the timeout"))
        record = self._record(server_round, updates, order, failures, timed_out, absent)
        self.history_.append(record)
        metrics = MetricRecord({
            "epsilon": record["epsilon"], "update-norm": record["update_norm"],
            "n-replied": len(order), "clients-failed": sorted(failures),
            "clients-timed-out": timed_out, "clients-absent": absent,
            **({"test-accuracy": record["test_accuracy"], "test-loss": record["test_loss"]}
               if "test_accuracy" in record else {})})
        return ArrayRecord({KEYS.params: Array(self._params)}), metrics

    def _record(self, server_round: int, updates: np.ndarray, replied: list[int],
                failures: dict[int, str], timed_out: list[int],
                absent: list[int]) -> dict[str, Any]:
        cfg = self.config
        seconds = time.perf_counter() - self._round_start  # as the simulator: no evaluation
        record: dict[str, Any] = {"round": server_round}
        if self.X_test is not None:
            loss, acc = self.model.evaluate(self._params, self.X_test, self.y_test)
            record.update(test_accuracy=acc, test_loss=loss)
        record.update(
            epsilon=epsilon_after_rounds(self.noise_multiplier_, int(self._asked.max()),
                                         cfg.target_delta, cfg.mechanism,
                                         sampling_rate=float(cfg.sampling_rate),
                                         local_steps=int(cfg.local_steps),
                                         accountant=cfg.accountant),
            update_norm=float(np.linalg.norm(updates)),
            seconds=seconds,
            n_replied=len(replied), clients_replied=replied,
            clients_failed=sorted(failures), clients_timed_out=timed_out,
            clients_absent=absent, failures={str(k): v for k, v in sorted(failures.items())})
        logger.info("round %d: %d/%d replied, epsilon=%.4g", server_round, len(replied),
                    self.n_clients, record["epsilon"])
        return record

    # -- evaluation: none at the clients (their metrics on private data are not private) ---

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        """No federated evaluation: a client's accuracy on its own data is not private."""
        return []

    def aggregate_evaluate(self, server_round: int,
                           replies: Iterable[Message]) -> MetricRecord | None:
        """Nothing to aggregate (see :meth:`configure_evaluate`)."""
        return None

    # -- the run -----------------------------------------------------------------------------

    def start(self, grid: Grid, initial_arrays: ArrayRecord, num_rounds: int = 3,
              timeout: float = 3600, train_config: ConfigRecord | None = None,
              evaluate_config: ConfigRecord | None = None, evaluate_fn: Any = None) -> Any:
        """Flower's round loop, refusing more rounds than the noise was calibrated for."""
        num_rounds = check_int("num_rounds", num_rounds, low=1)
        if num_rounds > self.config.n_rounds:
            raise ValueError(f"num_rounds={num_rounds} exceeds config.n_rounds="
                             f"{self.config.n_rounds}, for which the noise was calibrated; "
                             "more rounds would spend more than the budget.")
        self._reset()
        params = np.asarray(initial_arrays[KEYS.params].numpy(), dtype=np.float64)
        self._state = self.optimizer.init(params)
        return super().start(grid, initial_arrays, num_rounds=num_rounds, timeout=timeout,
                             train_config=train_config, evaluate_config=evaluate_config,
                             evaluate_fn=evaluate_fn)

    def run(self, grid: Grid, *, timeout: float = 600.0) -> FLResult:
        """Run all ``config.n_rounds`` rounds on ``grid``; return the :class:`FLResult`.

        ``timeout`` is the per-round wait for replies (Flower's ``send_and_receive``):
        clients that have not answered by then are left out of the round.
        """
        timeout = check_positive("timeout", timeout)
        params = self.initial_params()
        self.start(grid, ArrayRecord({KEYS.params: Array(params)}),
                   num_rounds=self.config.n_rounds, timeout=timeout)
        assert self._params is not None
        eps = self.history_[-1]["epsilon"] if self.history_ else 0.0
        config = {**asdict(self.config), "n_clients": self.n_clients, "engine": "flower",
                  "seed": self.seed}
        self.result_ = FLResult(self._params, self.history_, self.noise_multiplier_,
                                float(eps), self.config.target_delta, config)
        return self.result_
