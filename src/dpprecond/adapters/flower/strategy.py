"""A Flower strategy for every federated method of :mod:`dpprecond.fl.methods`.

The strategy only moves arrays and configurations; the run itself is a
:class:`~dpprecond.adapters.flower.server_side.ServerSide` (calibration from the method's
release schedule, the run's ledger, the method's client task and server half). Each round
it

1. registers any newly connected node (a ``query`` message: which client id are you?);
2. records the round's releases in the ledger, then sends every eligible client the model
   (and the method's broadcast arrays, such as SCAFFOLD's ``c``) and its
   :class:`~dpprecond.adapters.flower.protocol.RoundRequest` (with adaptive clipping, the
   round's clip ``C_t`` and the count each client releases beside its message);
3. validates the replies, hands the valid ones to the method's server half (and the
   counts to the clip's update), and records the epsilon spent, the round's clip and
   which clients dropped out.

A method with a setup task (DP-FedFC and DP-FedNew: the noisy feature second moment) first
runs a setup round (round 0) in which every registered client releases it.

Privacy. The clients add their own Gaussian noise before sending (no trusted aggregator),
so nothing here is wrapped in Flower's differential-privacy strategies, which add noise
after aggregation. The server step is post-processing and costs nothing. Every round's
releases are recorded *before* the requests go out: a client that was asked may have
released its message even if it never arrives (a late reply), so the epsilon never relies
on a reply having been lost. Dropout policies per method: see
:mod:`~dpprecond.adapters.flower.server_side` and docs/flower.md.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict
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
from dpprecond.accounting import PrivacyLedger
from dpprecond.adapters.flower.protocol import KEYS, RoundRequest, reply_shapes, simulator_seeds
from dpprecond.adapters.flower.records import read_array, read_int
from dpprecond.adapters.flower.server_side import ServerSide
from dpprecond.fl.config import FLConfig
from dpprecond.fl.engine import FLResult
from dpprecond.fl.methods import Method
from dpprecond.fl.models import FLModel
from dpprecond.fl.server import GradientTransformation

__all__ = ["DPFedStrategy"]

logger = logging.getLogger(__name__)


class DPFedStrategy(Strategy):
    """Server side of DP federated learning with client-side noise, over a Flower Grid.

    Parameters
    ----------
    model : FLModel
        The model (``init_params``, ``n_params``, and ``evaluate`` with test data, are used
        at the server).
    method : Method, str or GradientTransformation
        The algorithm: ``make_method(name, **options)`` of :mod:`dpprecond.fl.methods`, a
        method name, or a server transform (run on the config's mechanism), as for
        :func:`dpprecond.fl.engine.simulate`.
    config : FLConfig
        Privacy and training settings; the noise is calibrated once, here, from the
        method's release schedule exactly as the engine does.
    n_clients : int
        Expected federation size K (client ids ``0 .. K-1``).
    X_test, y_test : ndarray, optional
        Public held-out data for a server-side accuracy and loss after every round.
    seed : int or None
        Model initialization from ``run_federated``'s seed tree; ``None`` uses fresh
        entropy. It never touches the clients' noise.
    ledger : PrivacyLedger, optional
        A caller's ledger: the whole run is checked against its ``max_epsilon`` before the
        first message, and every release is recorded in it too.
    secure : bool, default=False
        Ask the clients for secure-mode noise (:mod:`dpprecond.secure`; ``seed`` must then
        be ``None``, as for the engine).
    connect_timeout : float, default=120
        Seconds to wait before the first round (or the setup round) for all K clients to
        connect and register; afterwards the run goes on with the registered ones (the
        others count as absent).
    min_replies : int, default=1
        A round with fewer valid replies leaves the model and the server state unchanged.

    Attributes
    ----------
    noise_multiplier_ : float
        The per-round gradient release's noise multiplier (as the engine reports it).
    server_ : ServerSide
        The run: schedule, multipliers, the run's ledger, the server state.
    history_ : list of dict
        One record per round: ``round``, ``epsilon``, ``update_norm``, ``seconds``,
        ``clip_norm`` (the clip of the round's messages: ``C_t`` with adaptive clipping),
        ``n_replied``, ``clients_replied``, ``clients_failed``, ``clients_timed_out``,
        ``clients_absent`` (not connected), ``clients_excluded`` (connected but not asked:
        DP-FedNew without a moment), ``failures`` (client id -> reason) and, with test
        data, ``test_accuracy`` and ``test_loss``.
    setup_ : dict or None
        DP-FedFC/DP-FedNew: the setup round's record (the same client lists).
    result_ : FLResult
        After :meth:`run`: final parameters, history, privacy figures and ``events``
        (with adaptive clipping its ``config`` has the engine's ``clip_norms``, the clip
        of every round, and ``count_noise_multiplier``).
    """

    def __init__(self, model: FLModel, method: Method | str | GradientTransformation,
                 config: FLConfig, n_clients: int, *, X_test: np.ndarray | None = None,
                 y_test: np.ndarray | None = None, seed: int | None = None,
                 ledger: PrivacyLedger | None = None, secure: bool = False,
                 connect_timeout: float = 120.0, min_replies: int = 1) -> None:
        if getattr(config, "trust", "local") != "local":  # secure aggregation: not on Flower
            raise ValueError(f"DPFedStrategy runs trust='local' (each client noises its own "
                             f"release); got trust={config.trust!r}. For secure aggregation with "
                             "distributed noise use dpprecond.adapters.flower.secagg "
                             "(SecAggDPStrategy on Flower's SecAgg+).")
        self.server_ = ServerSide(method, model, config, n_clients, ledger=ledger,
                                  secure=secure)
        self.model = model
        self.config = self.server_.config
        self.n_clients = self.server_.n_clients
        self.seed = None if seed is None else check_int("seed", seed, low=0)
        if secure and self.seed is not None:
            raise ValueError(f"secure=True refuses seeds (got seed={seed!r}).")
        self.connect_timeout = check_positive("connect_timeout", connect_timeout)
        self.min_replies = check_int("min_replies", min_replies, low=1)
        if self.min_replies > self.n_clients:
            raise ValueError(f"min_replies={min_replies} exceeds n_clients={self.n_clients}: "
                             f"no round could update the model; pass min_replies <= "
                             f"{self.n_clients}.")
        self.X_test = self.y_test = None
        if (X_test is None) != (y_test is None):
            raise ValueError("Pass both X_test and y_test, or neither.")
        if X_test is not None:
            self.X_test = check_array("X_test", X_test)
            self.y_test = check_labels("y_test", y_test, getattr(model, "n_classes", 2**31),
                                       n_rows=self.X_test.shape[0])
        self.noise_multiplier_ = self.server_.noise_multiplier
        self._clients: dict[int, int] = {}  # node id -> client id (registration)
        self._reset()

    # -- bookkeeping ---------------------------------------------------------------------

    def _reset(self) -> None:
        self.history_: list[dict[str, Any]] = []
        self.setup_: dict[str, Any] | None = None
        self._sent: dict[int, tuple[int, RoundRequest]] = {}  # node -> (client, request)
        self._excluded: list[int] = []
        self._round_start = 0.0
        self._params: np.ndarray | None = None
        self.server_.reset()

    def initial_params(self) -> np.ndarray:
        """The model's initial parameters (from the seed tree when ``seed`` is set)."""
        init = None if self.seed is None else simulator_seeds(self.seed).init
        return np.asarray(self.model.init_params(np.random.default_rng(init)), dtype=np.float64)

    def summary(self) -> None:
        """Log the settings (Flower calls this when the strategy starts)."""
        logger.info("DPFedStrategy: %s, K=%d clients, T=%d rounds, mechanism=%s, noise %s, "
                    "C=%g, weighting=%s, delta=%g", self.server_.method.name, self.n_clients,
                    self.config.n_rounds, self.config.mechanism, self.server_.multipliers,
                    self.config.clip_norm, self.config.weighting, self.config.target_delta)

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
            told = read_int(metrics, KEYS.n_clients, "registration")
            if told != self.n_clients:
                raise ValueError(f"Node {node} was configured with num-partitions={told}, but "
                                 f"the server expects n_clients={self.n_clients}; give every "
                                 "SuperNode the same num-partitions.")
            self._clients[node] = read_int(metrics, KEYS.client_id, "registration")

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
                if not current:
                    raise RuntimeError(f"No client registered within connect_timeout="
                                       f"{self.connect_timeout:g} s; start the SuperNodes "
                                       "(each with --node-config \"partition-id=I "
                                       "num-partitions=K\").")
                if wait and len(current) < self.n_clients:
                    logger.warning("only %d of %d clients registered; going on without the "
                                   "others", len(current), self.n_clients)
                return current
            time.sleep(0.2)

    # -- messages --------------------------------------------------------------------------

    def _messages(self, nodes: Mapping[int, int], requests: Mapping[int, RoundRequest],
                  arrays: ArrayRecord | None, message_type: str) -> list[Message]:
        self._sent = {n: (c, requests[c]) for n, c in nodes.items()}
        out = []
        for n in sorted(nodes):
            content = RecordDict({KEYS.config: ConfigRecord(requests[nodes[n]].to_config())})
            if arrays is not None:
                content[KEYS.params] = arrays
            out.append(Message(content, dst_node_id=n, message_type=message_type))
        return out

    def _parse(self, content: RecordDict, client: int,
               request: RoundRequest) -> tuple[dict[str, np.ndarray], int]:
        metrics = content[KEYS.metrics]
        said = read_int(metrics, KEYS.client_id, "reply")
        if said != client:
            raise ValueError(f"reply says client-id={said}, registered as {client}")
        record = content[KEYS.reply]
        shapes = reply_shapes(request, self.model.n_params,
                              getattr(self.model, "n_features", None))
        arrays = {}
        for name, shape in shapes.items():
            a = np.asarray(read_array(record, name, "reply"), dtype=np.float64)
            if a.shape != shape or not np.isfinite(a).all():
                raise ValueError(f"{name} of shape {a.shape} (finite: "
                                 f"{bool(np.isfinite(a).all())}), expected {shape} finite "
                                 "values")
            arrays[name] = a
        n = 1
        if request.report_size:
            n = read_int(metrics, KEYS.n_examples, "reply")
            if n < 1:
                raise ValueError(f"num-examples={n} < 1")
        return arrays, n

    def _collect(self, replies: Iterable[Message]
                 ) -> tuple[dict[int, dict[str, np.ndarray]], dict[int, int], dict[int, str],
                            list[int]]:
        """Valid replies (client -> arrays), sizes, failures and clients that timed out."""
        valid: dict[int, dict[str, np.ndarray]] = {}
        sizes: dict[int, int] = {}
        failures: dict[int, str] = {}
        for msg in replies:
            sent = self._sent.get(msg.metadata.src_node_id)
            if sent is None or sent[0] in valid or sent[0] in failures:
                continue
            client, request = sent
            if msg.has_error():
                failures[client] = str(msg.error.reason)
                continue
            try:
                valid[client], sizes[client] = self._parse(msg.content, client, request)
            except (KeyError, ValueError, TypeError) as exc:
                failures[client] = f"malformed reply: {exc}"
        asked = {c for c, _ in self._sent.values()}
        timed_out = sorted(asked - valid.keys() - failures.keys())
        for c in (*sorted(failures), *timed_out):
            logger.warning("client %d dropped (%s)", c,
                           failures.get(c, "no reply before the timeout"))
        return valid, sizes, failures, timed_out

    def _dropouts(self, replied: Iterable[int], failures: Mapping[int, str],
                  timed_out: list[int]) -> dict[str, Any]:
        asked = {c for c, _ in self._sent.values()}
        return {"n_replied": len(list(replied)), "clients_replied": sorted(replied),
                "clients_failed": sorted(failures), "clients_timed_out": timed_out,
                "clients_absent": sorted(set(range(self.n_clients)) - asked
                                         - set(self._excluded)),
                "clients_excluded": list(self._excluded),
                "failures": {str(k): v for k, v in sorted(failures.items())}}

    # -- the setup round (methods with a one-off release, e.g. DP-FedFC, DP-FedNew) ----------

    def _setup(self, grid: Grid, params: np.ndarray, timeout: float) -> None:
        current = self._registered(grid, wait=True)
        request = self.server_.setup_request()
        self.server_.spend_setup()  # charged whether or not the replies arrive
        messages = self._messages(current, {c: request for c in current.values()}, None,
                                  MessageType.TRAIN)
        valid, _, failures, timed_out = self._collect(
            grid.send_and_receive(messages, timeout=timeout))
        self.setup_ = {"round": 0, "epsilon": self.server_.ledger.epsilon,
                       **self._dropouts(valid, failures, timed_out)}
        if len(valid) < self.min_replies:
            raise RuntimeError(f"Only {len(valid)} client(s) answered the setup round "
                               f"(min_replies={self.min_replies}); the server's setup cannot "
                               f"be built. Failures: {failures}, timed out: {timed_out}.")
        self.server_.finish_setup(valid, params)

    # -- one round -------------------------------------------------------------------------

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        """Register new nodes, record the round's releases, send model and requests."""
        current = self._registered(grid, wait=server_round == 1 and self.setup_ is None)
        eligible = set(self.server_.eligible(current.values()))
        self._excluded = sorted(set(current.values()) - eligible)
        asked = {n: c for n, c in current.items() if c in eligible}
        if not asked:
            raise RuntimeError(f"Round {server_round}: no eligible client is connected "
                               f"(excluded: {self._excluded}).")
        self._params = np.asarray(arrays[KEYS.params].numpy(), dtype=np.float64)
        out = ArrayRecord({KEYS.params: Array(self._params),
                           **{k: Array(np.asarray(v)) for k, v in
                              self.server_.broadcast().items()}})
        requests = {c: self.server_.round_request(server_round, c) for c in asked.values()}
        self.server_.spend_round()  # charged whether or not they reply
        self._round_start = time.perf_counter()
        return self._messages(asked, requests, out, MessageType.TRAIN)

    def aggregate_train(self, server_round: int, replies: Iterable[Message]
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Apply the server transform to the valid replies and record the round."""
        assert self._params is not None  # configure_train ran first (internal invariant)
        valid, sizes, failures, timed_out = self._collect(replies)
        updates = np.zeros_like(self._params)
        if len(valid) >= self.min_replies:
            updates = self.server_.update(server_round, valid, sizes, self._params)
            self._params = self._params + updates
        else:
            logger.warning("round %d: %d valid replies < min_replies=%d; model unchanged",
                           server_round, len(valid), self.min_replies)
        seconds = time.perf_counter() - self._round_start  # as the engine: no evaluation
        record: dict[str, Any] = {"round": server_round}
        if self.X_test is not None:
            loss, acc = self.model.evaluate(self._params, self.X_test,
                                            self.y_test)  # type: ignore[arg-type]
            record.update(test_accuracy=acc, test_loss=loss)
        record.update(epsilon=self.server_.ledger.epsilon,
                      update_norm=float(np.linalg.norm(updates)), seconds=seconds,
                      clip_norm=self.server_.round_clip,
                      **self._dropouts(valid, failures, timed_out))
        self.history_.append(record)
        logger.info("round %d: %d/%d replied, epsilon=%.4g", server_round, len(valid),
                    self.n_clients, record["epsilon"])
        metrics = MetricRecord({  # test accuracy: ServerApp-side evaluate (evaluate_fn)
            "epsilon": record["epsilon"], "update-norm": record["update_norm"],
            "clip-norm": record["clip_norm"], "n-replied": len(valid),
            "clients-failed": record["clients_failed"],
            "clients-timed-out": timed_out, "clients-absent": record["clients_absent"]})
        return ArrayRecord({KEYS.params: Array(self._params)}), metrics

    # -- evaluation: none at the clients (their metrics on private data are not private) ---

    def evaluate_fn(self, server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
        """Server-side accuracy and loss on the public test data (Flower's ServerApp-side
        evaluate metrics); ``None`` without test data."""
        if self.X_test is None:
            return None
        params = np.asarray(arrays[KEYS.params].numpy(), dtype=np.float64)
        loss, acc = self.model.evaluate(params, self.X_test, self.y_test)  # type: ignore[arg-type]
        return MetricRecord({"test-accuracy": float(acc), "test-loss": float(loss)})

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
        """Check the plan, run the setup round if any, then Flower's round loop.

        Refuses more rounds than the noise was calibrated for, and a plan the caller's
        ledger cannot afford, before any message is sent.
        """
        num_rounds = check_int("num_rounds", num_rounds, low=1)
        if num_rounds > self.config.n_rounds:
            raise ValueError(f"num_rounds={num_rounds} exceeds config.n_rounds="
                             f"{self.config.n_rounds}, for which the noise was calibrated; "
                             "more rounds would spend more than the budget.")
        self._reset()
        logger.info("the run's plan: epsilon %.4g at delta %g", self.server_.check_plan(),
                    self.config.target_delta)
        params = np.asarray(initial_arrays[KEYS.params].numpy(), dtype=np.float64)
        if self.server_.needs_setup:
            self._setup(grid, params, timeout)
        else:
            self.server_.init(params)
        return super().start(grid, initial_arrays, num_rounds=num_rounds, timeout=timeout,
                             train_config=train_config, evaluate_config=evaluate_config,
                             evaluate_fn=evaluate_fn)

    def run(self, grid: Grid, *, timeout: float = 600.0) -> FLResult:
        """Run all ``config.n_rounds`` rounds on ``grid``; return the :class:`FLResult`.

        ``timeout`` is the per-round wait for replies (Flower's ``send_and_receive``):
        clients that have not answered by then are left out of the round.
        """
        timeout = check_positive("timeout", timeout)
        self.start(grid, ArrayRecord({KEYS.params: Array(self.initial_params())}),
                   num_rounds=self.config.n_rounds, timeout=timeout,
                   evaluate_fn=self.evaluate_fn if self.X_test is not None else None)
        assert self._params is not None
        ledger = self.server_.ledger
        config = {**asdict(self.config), **self.server_.method.describe(),
                  "n_clients": self.n_clients, "engine": "flower", "seed": self.seed,
                  "secure": self.server_.secure}
        if self.setup_ is not None:
            config["setup_round"] = self.setup_
        self.result_ = FLResult(self._params, self.history_, self.noise_multiplier_,
                                float(ledger.epsilon), self.config.target_delta, config,
                                ledger.events)
        return self.result_
