"""The server of one federated run, without Flower: calibration, ledger, requests, transform.

:class:`ServerSide` holds what :func:`dpprecond.fl.engine.simulate` holds for a method of
:mod:`dpprecond.fl.methods`, split at the network: the noise calibrated from the method's
release schedule (:func:`dpprecond.fl.accounting.resolve_scale`, the engine's one
calibrator), the run's :class:`~dpprecond.accounting.PrivacyLedger` with the releases the
engine records (:func:`dpprecond.fl.accounting.round_event` of the schedule's multipliers),
the request each client gets, and the method's server transform applied to the replies.
Nothing here computes a mechanism or a server step of its own.

Methods and what a round moves (the engine's per-client arrays, one row per client):

- :class:`~dpprecond.fl.methods.GradientMethod` (fedgd, the SOFIM forms, adam, yogi): the
  messages ``u_i``, aggregated with ``client_weights`` of the repliers, then
  ``method.transform``;
- :class:`~dpprecond.fl.methods.LocalStepsMethod` (fedavg, scaffold): ``delta_y_i`` (and
  ``delta_c_i``) into ``method.server`` (``scaffold_server``), whose state holds ``c``;
- :class:`~dpprecond.fl.methods.CovarianceMethod` (fedfc, fednew): a setup round of
  second moments, ``method.setup_from_moments``, then gradients into
  ``method.server_transform(setup)``.

Dropout (a client that failed, sent a malformed reply or timed out is left out of that
round; see docs/flower.md for the full policy):

- gradient methods aggregate the repliers with weights renormalized over them;
- DP-FedAvg/DP-SCAFFOLD average the repliers' ``delta_y``; a non-replier's ``delta_c`` is
  zero (its ``c_i`` does not change), so ``c`` stays the mean of all K clients' ``c_i``;
- DP-FedFC builds ``P`` from the moments that arrived, and every client takes part in the
  gradient rounds;
- DP-FedNew: a client without a released moment has no Newton solver and is excluded from
  the consensus for the whole run (it is not asked again); in a gradient round the ADMM
  iteration runs over the repliers, whose duals move while the others' stay put.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
from dp_accounting import dp_event

from dpprecond._validation import check_int
from dpprecond.accounting import PrivacyLedger
from dpprecond.adapters.flower.protocol import CLIENT_MECHANISMS, KEYS, RoundRequest
from dpprecond.fl.accounting import Schedule, resolve_scale, round_event
from dpprecond.fl.config import FLConfig
from dpprecond.fl.engine import as_method
from dpprecond.fl.methods import (
    CovarianceMethod,
    GradientMethod,
    LocalStepsMethod,
    Method,
    NoisyPreconditionerWarning,
)
from dpprecond.fl.models import FLModel
from dpprecond.fl.partition import client_weights
from dpprecond.fl.server import FedNewState, GradientTransformation

__all__ = ["ServerSide", "release_events"]

logger = logging.getLogger(__name__)

Releases = list[tuple[dp_event.DpEvent, int]]


def release_events(schedule: Schedule, multipliers: Mapping[str, float]
                   ) -> tuple[Releases, Releases]:
    """The releases of one client: ``(setup, per round)`` as ``(event, count)`` pairs.

    The engine's events, from the schedule the noise was calibrated for: one
    ``round_event`` of the mechanism per round (``"rounds"``), ``steps`` full-batch
    Gaussians per round (``"local-steps"``), or one ``Gaussian(z_cov)`` setup release and
    one ``Gaussian(z_grad)`` per round (``"covariance"``). Composed over the run they are
    ``schedule.event(scale)`` (a test pins both against the engine).
    """
    if schedule.kind == "rounds":
        return [], [(round_event(multipliers["z"], schedule.mechanism,
                                 sampling_rate=schedule.sampling_rate,
                                 local_steps=schedule.steps), 1)]
    if schedule.kind == "local-steps":
        return [], [(round_event(multipliers["z"]), schedule.steps)]
    return [(round_event(multipliers["z_cov"]), 1)], [(round_event(multipliers["z_grad"]), 1)]


class ServerSide:
    """The server of one run of ``method`` over ``n_clients`` Flower clients.

    Parameters
    ----------
    method : Method or str
        A method of :mod:`dpprecond.fl.methods` (``make_method(name, **options)``) or its
        name; ``GradientMethod``, ``LocalStepsMethod`` and ``CovarianceMethod`` are
        supported (every method of the registry).
    model : FLModel
        The model (``n_params``; ``n_features``/``n_classes`` for the covariance methods).
    config : FLConfig
        Privacy and training settings, as for the engine (mechanism ``"full-batch"`` or
        ``"poisson"``).
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
    """

    def __init__(self, method: Method | str | Any, model: FLModel, config: FLConfig,
                 n_clients: int, *, ledger: PrivacyLedger | None = None,
                 secure: bool = False) -> None:
        if not isinstance(config, FLConfig):
            raise TypeError(f"Expected config to be an FLConfig, got {type(config).__name__}.")
        self.config = config.validated()
        if self.config.adaptive_clip is not None:  # dpprecond.fl.adaptive_clip
            raise ValueError("adaptive_clip is not supported on Flower yet (its per-round "
                             "counts are not in the message protocol); use the in-process "
                             "engine (run_federated) or drop adaptive_clip.")
        self.method = as_method(method)
        if not isinstance(self.method, (GradientMethod, LocalStepsMethod, CovarianceMethod)):
            raise TypeError(f"The Flower adapter runs the methods of dpprecond.fl.methods "
                            f"(GradientMethod, LocalStepsMethod, CovarianceMethod); got "
                            f"{type(self.method).__name__}.")
        if self.config.mechanism not in CLIENT_MECHANISMS:
            raise ValueError(f"mechanism={self.config.mechanism!r} is not supported on Flower: "
                             f"the adapter runs the client-noise mechanisms "
                             f"{list(CLIENT_MECHANISMS)}; client-level DP needs a trusted "
                             "aggregator (use the in-process engine).")
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
        self._setup_events, self._round_events = release_events(self.schedule,
                                                                self.multipliers)
        self.reset()

    # -- state -----------------------------------------------------------------------------

    def reset(self) -> None:
        """Forget a previous run: a fresh ledger, no state, no setup."""
        self.ledger = PrivacyLedger(self.config.target_delta, accountant=self.config.accountant)
        self.state: Any = None
        self.setup: np.ndarray | None = None
        self.setup_clients: list[int] = []
        self._transform: GradientTransformation | None = None
        self._accepted = np.zeros(self.n_clients, dtype=np.int64)  # SCAFFOLD bookkeeping

    @property
    def noise_multiplier(self) -> float:
        """The per-round gradient release's noise multiplier (as the engine reports it)."""
        return self.method.noise_multiplier(self.multipliers)

    @property
    def needs_setup(self) -> bool:
        """True for the methods with a one-off release before round 1 (fedfc, fednew)."""
        return isinstance(self.method, CovarianceMethod)

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
        """Record one round's releases (before the requests go out)."""
        self._spend(self._round_events)

    def init(self, params: np.ndarray) -> None:
        """The server transform's initial state (after the setup, for fedfc/fednew)."""
        if isinstance(self.method, GradientMethod):
            if self.method.noise_warning and self.multipliers.get("z", 0.0) > 0:
                warnings.warn(self.method.noise_warning, NoisyPreconditionerWarning,
                              stacklevel=2)
            self.state = self.method.transform.init(params)
        elif isinstance(self.method, LocalStepsMethod):
            self.state = self.method.server.init(params)
        else:
            if self._transform is None:
                raise RuntimeError("The setup round must finish before the state is built.")
            self.state = self._transform.init(params)

    # -- requests ----------------------------------------------------------------------------

    def setup_request(self) -> RoundRequest:
        """The setup round's request: the noisy second moment (fedfc, fednew)."""
        method: CovarianceMethod = self.method  # type: ignore[assignment]
        return RoundRequest(0, "second-moment",
                            float(method.feature_clip(self.model.n_features)),  # type: ignore
                            float(self.multipliers["z_cov"]), secure=self.secure).validated()

    def round_request(self, server_round: int, client: int) -> RoundRequest:
        """Client ``client``'s request in round ``server_round``."""
        cfg, m = self.config, self.method
        if isinstance(m, LocalStepsMethod):
            return RoundRequest(server_round, "local-steps", float(cfg.clip_norm),
                                float(self.multipliers["z"]), local_steps=m.local_steps,
                                local_lr=m.local_lr, control_variates=m.control_variates,
                                accepted_round=int(self._accepted[client]),
                                secure=self.secure).validated()
        if isinstance(m, CovarianceMethod):
            return RoundRequest(server_round, "gradient", float(cfg.clip_norm),
                                float(self.multipliers["z_grad"]),
                                secure=self.secure).validated()
        noise_aware = isinstance(m, GradientMethod) and m.noise_aware is not None
        return RoundRequest(server_round, "gradient", float(cfg.clip_norm),
                            float(self.multipliers["z"]), cfg.mechanism,
                            float(cfg.sampling_rate), int(cfg.local_steps),
                            float(cfg.local_lr),
                            report_size=cfg.weighting == "size" or noise_aware,
                            secure=self.secure).validated()

    def broadcast(self) -> dict[str, np.ndarray]:
        """Arrays sent with the parameters: SCAFFOLD's ``c``; nothing for the others."""
        if isinstance(self.method, LocalStepsMethod) and self.method.control_variates:
            return {KEYS.control: self.state.control}
        return {}

    def eligible(self, clients: Iterable[int]) -> list[int]:
        """The clients asked in a round, among the connected ones (sorted).

        DP-FedNew asks only the clients whose second moment arrived in the setup round.
        """
        clients = sorted(set(clients))
        if isinstance(self.method, CovarianceMethod) and self.method.name == "fednew":
            return [c for c in clients if c in self.setup_clients]
        return clients

    # -- server transform ----------------------------------------------------------------------

    def finish_setup(self, moments: Mapping[int, np.ndarray], params: np.ndarray) -> None:
        """Build the server transform from the moments that arrived (client id -> C_i)."""
        if not moments:
            raise RuntimeError("No client released its second moment in the setup round; "
                               "the preconditioner cannot be built.")
        method: CovarianceMethod = self.method  # type: ignore[assignment]
        self.setup_clients = sorted(moments)
        self.setup = method.setup_from_moments([moments[c] for c in self.setup_clients])
        self._transform = method.server_transform(self.setup,
                                                  self.model.n_classes)  # type: ignore
        self.init(params)

    def update(self, server_round: int, replies: Mapping[int, Mapping[str, np.ndarray]],
               sizes: Mapping[int, int], params: np.ndarray) -> np.ndarray:
        """Apply the method's server transform to the repliers' arrays; return the update.

        ``replies`` maps client id -> its arrays (validated shapes); rows are stacked in
        client-id order, as the engine's.
        """
        order = sorted(replies)
        m = self.method
        if isinstance(m, GradientMethod):
            U = np.stack([replies[c][KEYS.message] for c in order])
            replier_sizes = np.array([sizes.get(c, 1) for c in order])
            w = client_weights(replier_sizes, self.config.weighting)
            transform = m.transform
            if m.noise_aware is not None:  # this round's repliers set the noise variance
                transform = m.transform_for(m.aggregate_noise_variance(
                    self.config, float(self.multipliers.get("z", 0.0)), replier_sizes, w))
            updates, self.state = transform.update(w @ U, self.state, params)
        elif isinstance(m, LocalStepsMethod):
            delta_y = np.stack([replies[c][KEYS.delta_y] for c in order])
            delta_c = None
            if m.control_variates:  # a non-replier's c_i does not move: a zero row
                delta_c = np.zeros((self.n_clients, params.shape[0]))
                for c in order:
                    delta_c[c] = replies[c][KEYS.delta_c]
            updates, self.state = m.server.update((delta_y, delta_c),  # type: ignore[arg-type]
                                                  self.state, params)
            self._accepted[order] = server_round
        else:
            U = np.stack([replies[c][KEYS.message] for c in order])
            updates = self._covariance_update(U, order, params)
        return updates

    def _covariance_update(self, U: np.ndarray, order: list[int],
                           params: np.ndarray) -> np.ndarray:
        assert self._transform is not None and self.setup is not None
        method: CovarianceMethod = self.method  # type: ignore[assignment]
        if method.name == "fedfc" or order == self.setup_clients:
            updates, self.state = self._transform.update(U, self.state, params)
            return updates
        # DP-FedNew with some participants missing: one ADMM iteration over the repliers
        # (rows of their solvers and duals), the others' duals unchanged.
        rows = [self.setup_clients.index(c) for c in order]
        state: FedNewState = self.state
        sub = method.server_transform(self.setup[rows], self.model.n_classes)  # type: ignore
        updates, new = sub.update(U, FedNewState(state.duals[rows], state.consensus), params)
        duals = state.duals.copy()
        duals[rows] = new.duals
        self.state = FedNewState(duals, new.consensus)
        return updates
