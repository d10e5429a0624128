"""The server of one federated run, without Flower: calibration, ledger, requests, halves.

:class:`ServerSide` holds what :func:`dpprecond.fl.engine.simulate` holds for a method of
:mod:`dpprecond.fl.methods`, split at the network: the noise calibrated once from the
method's release schedule (:func:`dpprecond.fl.accounting.resolve_scale`, the engine's one
calibrator), the run's :class:`~dpprecond.accounting.PrivacyLedger` with the releases the
engine records (:meth:`dpprecond.fl.accounting.Schedule.releases`, the one derivation), the
request each client gets (the method's client task) and the method's server half applied
to the replies. Nothing here names a method, computes a mechanism or a server step.

Dropout (a client that failed, sent a malformed reply or timed out is left out of that
round; see docs/flower.md for the full policy): the server half gets the replies of the
clients that answered, in client-id order, and each method defines what that means (its
module's docstring): gradient methods renormalize the weights over the repliers,
DP-SCAFFOLD keeps a non-replier's control variate, DP-FedNew leaves a client without a
released moment out of the whole run (:meth:`~dpprecond.fl.methods.Method.eligible`).
A stateful client task (a client state across rounds) only moves a client's state when
the server aggregated that client's reply: each request says the client's last aggregated
round.

Adaptive clipping (``config.adaptive_clip``, :mod:`dpprecond.fl.adaptive_clip`): the
method is wrapped exactly as the engine wraps it, and each round runs the same halves as
the engine's hook: the round's clip ``C_t`` and count task from the server state, the
count's release recorded before the requests go out (before the round's own), every
asked client releasing its noisy count (its own noise, its count stream) beside its
message at ``C_t``, and the clip ``C_{t+1}`` updated from the repliers' counts and sizes
(post-processing). A round that aggregates no reply leaves the clip where it was.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from dpprecond._validation import check_int
from dpprecond.accounting import PrivacyLedger
from dpprecond.adapters.flower.protocol import RoundRequest
from dpprecond.fl.accounting import Releases, resolve_scale
from dpprecond.fl.adaptive_clip import AdaptiveClipMethod, with_adaptive_clip
from dpprecond.fl.config import FLConfig
from dpprecond.fl.engine import as_method
from dpprecond.fl.methods import Method, RunSpec
from dpprecond.fl.models import FLModel
from dpprecond.fl.tasks import ClientTask

__all__ = ["ServerSide"]

logger = logging.getLogger(__name__)


class ServerSide:
    """The server of one run of ``method`` over ``n_clients`` Flower clients.

    Parameters
    ----------
    method : Method or str
        A method of :mod:`dpprecond.fl.methods` (``make_method(name, **options)``) or its
        name: any :class:`~dpprecond.fl.methods.Method` that defines its client and server
        halves, whose client tasks add their noise at the client.
    model : FLModel
        The model (``n_params``; ``n_features``/``n_classes`` for the covariance methods).
    config : FLConfig
        Privacy and training settings, as for the engine (a mechanism whose noise the
        clients add: ``"full-batch"`` or ``"poisson"``; ``adaptive_clip`` as the engine
        runs it).
    n_clients : int
        The federation size K (client ids ``0 .. K-1``).
    ledger : PrivacyLedger, optional
        A caller's ledger (for example shared with a private PCA on the same records):
        :meth:`check_plan` checks the whole run against its ``max_epsilon`` and every
        release is recorded in it as well.
    secure : bool
        Ask the clients for secure-mode noise (:mod:`dpprecond.secure`).

    Attributes
    ----------
    schedule, scale, multipliers
        The release schedule, the calibrated scale and the named noise multipliers.
    ledger : PrivacyLedger
        This run's own ledger (the history's epsilons).
    round_clip : float
        The clip norm of the current (or next) round's messages: ``config.clip_norm``, or
        ``C_t`` with adaptive clipping.
    """

    def __init__(self, method: Method | str | Any, model: FLModel, config: FLConfig,
                 n_clients: int, *, ledger: PrivacyLedger | None = None,
                 secure: bool = False) -> None:
        if not isinstance(config, FLConfig):
            raise TypeError(f"Expected config to be an FLConfig, got {type(config).__name__}.")
        self.config = config.validated()
        inner = as_method(method)
        if type(inner).round_task is Method.round_task or \
                type(inner).server_update is Method.server_update:
            raise TypeError(f"The Flower adapter runs a method's client and server halves; "
                            f"{type(inner).__name__} does not define them "
                            "(Method.round_task, Method.server_update).")
        # adaptive clipping wraps the method as in the engine (a no-op without it)
        self.method = with_adaptive_clip(inner, self.config)
        if ledger is not None and not isinstance(ledger, PrivacyLedger):
            raise TypeError(f"Expected ledger to be a PrivacyLedger, got "
                            f"{type(ledger).__name__}.")
        if not isinstance(secure, bool):
            raise TypeError(f"Expected secure to be a bool, got {secure!r}.")
        self.method.check(self.config, model)
        self.model = model
        self.n_clients = check_int("n_clients", n_clients, low=1)
        self.caller_ledger = ledger
        self.secure = secure
        self.schedule = self.method.schedule(self.config)
        self.scale = resolve_scale(self.schedule, self.config)
        self.multipliers = self.schedule.multipliers(self.scale)
        self.spec = RunSpec(self.config, self.multipliers, model, self.n_clients)
        # the engine's one hook beside the halves: a count before each round sets its clip
        self._clipping = self.method if isinstance(self.method, AdaptiveClipMethod) else None
        self._setup_task = self.method.setup_task(self.spec)
        self._round_task = self.method.round_task(self.spec)
        if self._round_task.server_streams:
            raise ValueError(f"mechanism={self.config.mechanism!r} is not supported on "
                             "Flower: its noise is added after aggregation by a trusted "
                             "aggregator, which this adapter avoids on purpose (the clients "
                             "add their own noise); run it with trust='secure-aggregation' "
                             "(SecAgg+: the clients add shares of the noise to their clipped "
                             "updates), or use the in-process engine.")
        self._setup_events, self._round_events = self.schedule.releases(
            self.multipliers if self._clipping is None
            else self._clipping.inner_spec(self.spec).multipliers)
        self._count_events: Releases = [] if self._clipping is None \
            else self._clipping.count_releases(self.spec)
        self.reset()

    # -- state -----------------------------------------------------------------------------

    def reset(self) -> None:
        """Forget a previous run: a fresh ledger and no state."""
        self.ledger = PrivacyLedger(self.config.target_delta, accountant=self.config.accountant)
        self.state: Any = None
        self.setup_clients: list[int] = []
        self._accepted = np.zeros(self.n_clients, dtype=np.int64)  # stateful tasks
        self._round = 0  # the round whose spec and tasks are below (0: none yet)
        self._round_spec = self.spec
        self._task = self._round_task
        self._count_task: ClientTask | None = None

    @property
    def round_clip(self) -> float:
        """The clip norm of the current round's messages (``C_t`` with adaptive
        clipping)."""
        return float(self._round_spec.config.clip_norm)

    def begin_round(self, server_round: int) -> None:
        """Fix round ``server_round``'s spec and tasks from the server state (once per
        round; :meth:`round_request` calls it). With adaptive clipping: the round's clip
        ``C_t`` and count task, ``C_t`` entering the clip history."""
        server_round = check_int("server_round", server_round, low=1)
        if server_round == self._round:
            return
        self._round = server_round
        if self._clipping is not None:
            self._round_spec, self._count_task, self.state = self._clipping.begin_round(
                self.spec, self.state)
            self._task = self._clipping.round_task(self._round_spec)

    @property
    def noise_multiplier(self) -> float:
        """The per-round gradient release's noise multiplier (as the engine reports it)."""
        return self.method.noise_multiplier(self.multipliers)

    @property
    def needs_setup(self) -> bool:
        """True for the methods with a one-off release before round 1."""
        return self._setup_task is not None

    def check_plan(self) -> float:
        """Check the whole run against the caller's ledger (before any release).

        Raises :class:`~dpprecond.PrivacyBudgetExceededError` when it would exceed its
        ``max_epsilon``; returns the total epsilon of the plan alone.
        """
        plan = self.schedule.event(self.scale)
        if self.caller_ledger is not None:
            self.caller_ledger.check(plan)
        return PrivacyLedger(self.config.target_delta,
                             accountant=self.config.accountant).epsilon_with(plan)

    def _spend(self, releases: Releases) -> None:
        for event, count in releases:
            if self.caller_ledger is not None:
                self.caller_ledger.spend(event, count)  # may refuse: then nothing is sent
            self.ledger.spend(event, count)

    def spend_setup(self) -> None:
        """Record the setup round's releases (before the requests go out)."""
        self._spend(self._setup_events)

    def spend_round(self) -> None:
        """Record one round's releases (before the requests go out): adaptive clipping's
        count first, then the round's own, in the engine's order."""
        self._spend([*self._count_events, *self._round_events])

    def init(self, params: np.ndarray) -> None:
        """The server half's initial state of a method without a setup phase."""
        self.state = self.method.server_init(self.spec, params)

    # -- requests ----------------------------------------------------------------------------

    def setup_request(self) -> RoundRequest:
        """The setup round's request (the method's setup task)."""
        if self._setup_task is None:
            raise RuntimeError(f"{self.method.name} has no setup round.")
        return RoundRequest(0, self._setup_task, secure=self.secure).validated()

    def round_request(self, server_round: int, client: int) -> RoundRequest:
        """Client ``client``'s request in round ``server_round``."""
        self.begin_round(server_round)
        task = self._task
        accepted = int(self._accepted[client]) if task.stateful else 0
        return RoundRequest(server_round, task, accepted_round=accepted,
                            report_size=self.method.reports_sizes(self.config),
                            secure=self.secure, count_task=self._count_task).validated()

    def broadcast(self) -> dict[str, np.ndarray]:
        """Arrays sent with the parameters (the method's broadcast; often nothing)."""
        return self.method.broadcast(self.state)

    def eligible(self, clients: Iterable[int]) -> list[int]:
        """The clients asked in a round, among the connected ones (sorted)."""
        return self.method.eligible(sorted(set(clients)), self.state)

    # -- server half -------------------------------------------------------------------------

    @staticmethod
    def _stack(replies: Mapping[int, Mapping[str, np.ndarray]],
               order: list[int]) -> dict[str, np.ndarray]:
        names = replies[order[0]].keys() if order else ()
        return {name: np.stack([replies[c][name] for c in order]) for name in names}

    def finish_setup(self, releases: Mapping[int, Mapping[str, np.ndarray]],
                     params: np.ndarray) -> None:
        """Build the server state from the setup releases that arrived (client id ->
        arrays)."""
        self.setup_clients = sorted(releases)
        self.state = self.method.server_init(self.spec, params,
                                             self._stack(releases, self.setup_clients),
                                             self.setup_clients)

    def update(self, server_round: int, replies: Mapping[int, Mapping[str, np.ndarray]],
               sizes: Mapping[int, int], params: np.ndarray) -> np.ndarray:
        """Apply the method's server half to the repliers' arrays; return the update.

        ``replies`` maps client id -> its arrays (validated shapes); rows are stacked in
        client-id order, as the engine's. ``sizes``: the reported ``|D_i|`` (1 when the
        method asks for none).
        """
        if self._clipping is not None and server_round != self._round:
            raise RuntimeError(f"update(server_round={server_round}) without its requests "
                               f"(the last requests were for round {self._round}).")
        order = sorted(replies)
        replier_sizes = np.array([sizes.get(c, 1) for c in order])
        arrays = self._stack(replies, order)
        if self._clipping is not None and self._count_task is not None:  # the clip's update
            names = self._count_task.reply_shapes(self.model.n_params)
            counts = {name: arrays.pop(name) for name in names}
            self.state = self._clipping.update_clip(self._round_spec, counts, replier_sizes,
                                                    self.state)
        updates, self.state = self.method.server_update(
            self._round_spec, arrays, order, replier_sizes, self.state, params)
        if self._round_task.stateful:
            self._accepted[order] = server_round
        return updates
