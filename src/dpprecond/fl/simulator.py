"""A vectorized federated-learning simulator (one process, all clients at once).

One round is a handful of batched array operations over *all* clients: the data of all
clients is stored client-contiguously, the forward pass of the shared model is one product
``X W``, per-example clipping is elementwise, and the per-client clipped sums are one
``X^T R`` cut into contiguous row blocks. Each client draws its noise from its own stream
(spawn key ``(round, client)``), so a run is reproducible and engine-independent.

The core is :func:`simulate` (model, client data, server optimizer, config, seed ->
:class:`FLResult`); :func:`run_federated` adds partitioning, calibration and model
construction for the common case of a linear softmax head.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from typing import Any, Literal

import numpy as np
from tqdm.auto import tqdm

from dpprecond import accounting
from dpprecond._validation import (
    SeedLike,
    check_array,
    check_choice,
    check_delta,
    check_fraction,
    check_int,
    check_labels,
    check_positive,
    check_seed,
)
from dpprecond.fl import client as client_mod
from dpprecond.fl.accounting import (
    MECHANISMS,
    calibrate_noise_multiplier,
    check_privacy_level,
    training_event,
)
from dpprecond.fl.models import FLModel, LinearSoftmax
from dpprecond.fl.partition import client_weights, make_partition
from dpprecond.fl.server import GradientTransformation, make_optimizer

__all__ = ["ClientData", "FLConfig", "FLResult", "epsilon_after", "run_federated", "simulate"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ClientData:
    """Training data of all clients, stored client-contiguously.

    Client ``i`` owns rows ``bounds[i]:bounds[i + 1]`` of ``X`` and ``y``.
    """

    X: np.ndarray
    y: np.ndarray
    bounds: np.ndarray
    n_classes: int

    def __post_init__(self) -> None:
        # Labels index the one-hot targets: a negative label would silently pick a class from
        # the end, a float one fail deep in a round. Checked here so that every consumer of a
        # ClientData (simulate, the baselines, hand-built data) gets labels in [0, n_classes).
        n_classes = check_int("n_classes", self.n_classes, low=2)
        X = np.asarray(self.X)
        if X.ndim != 2:
            raise ValueError(f"Expected ClientData.X to be 2-D, got shape {X.shape}.")
        object.__setattr__(self, "y", check_labels("y", self.y, n_classes, n_rows=X.shape[0]))

    @property
    def n_clients(self) -> int:
        """Number of clients K."""
        return len(self.bounds) - 1

    @property
    def sizes(self) -> np.ndarray:
        """``|D_i|`` for every client."""
        return np.diff(self.bounds)

    @classmethod
    def from_partition(cls, X: Any, y: Any, parts: list[np.ndarray],
                       n_classes: int) -> ClientData:
        """Validate ``(X, y)`` and reorder the rows client by client following ``parts``.

        Raises ``ValueError`` for NaN/inf features, labels outside ``[0, n_classes)``, a
        client with no data, or parts that do not cover every row exactly once.
        """
        X = check_array("X", X)
        n_classes = check_int("n_classes", n_classes, low=2)
        y = check_labels("y", y, n_classes, n_rows=X.shape[0])
        if len(parts) < 1:
            raise ValueError("Expected at least one client, got an empty partition.")
        sizes = np.array([len(p) for p in parts], dtype=np.int64)
        if (sizes == 0).any():
            raise ValueError(f"Client {int(np.flatnonzero(sizes == 0)[0])} has no data; every "
                             "client needs at least one example (use fewer clients or the "
                             "Dirichlet repair rule, min_size >= 1).")
        order = np.concatenate([np.asarray(p, dtype=np.int64) for p in parts])
        if len(order) != X.shape[0] or not np.array_equal(np.sort(order),
                                                          np.arange(X.shape[0])):
            raise ValueError("The partition must cover every example exactly once.")
        return cls(np.ascontiguousarray(X[order]), y[order], np.r_[0, np.cumsum(sizes)],
                   n_classes)


@dataclass(frozen=True)
class FLConfig:
    """Settings of a federated run (privacy, clipping, mechanism, aggregation).

    Parameters
    ----------
    n_rounds : int
        Number of rounds T.
    clip_norm : float
        Clipping norm C (per example, or per client update for ``"client-level"``);
        ``inf`` disables clipping (only with ``noise_multiplier=0``, a non-private run).
    target_epsilon : float or None
        Privacy budget of the whole run: the noise multiplier is calibrated so that the
        run is ``(target_epsilon, target_delta)``-DP. Give exactly one of
        ``target_epsilon`` and ``noise_multiplier``.
    target_delta : float
        Delta (default 1e-5, as in the paper).
    noise_multiplier : float or None
        Explicit z instead of a target; the reported epsilon is what it spends.
        ``noise_multiplier=0`` is the one way to ask for a non-private run (logged as a
        warning).
    mechanism : {"full-batch", "poisson", "client-level"}
        The client mechanism (see :mod:`dpprecond.fl.accounting`).
    sampling_rate, local_steps, local_lr
        Poisson rate and local steps (``"poisson"``; local steps also for client-level).
    weighting : {"uniform", "size"}
        Aggregation weights (uniform, as the authors, or by client size).
    accountant : {"pld", "rdp"}
        dp_accounting accountant used for calibration and reported epsilons.
    """

    n_rounds: int = 70
    clip_norm: float = 10.0
    target_epsilon: float | None = None
    target_delta: float = 1e-5
    noise_multiplier: float | None = None
    mechanism: Literal["full-batch", "poisson", "client-level"] = "full-batch"
    sampling_rate: float = 1.0
    local_steps: int = 1
    local_lr: float = 0.1
    weighting: Literal["uniform", "size"] = "uniform"
    accountant: Literal["pld", "rdp"] = "pld"

    def validated(self) -> FLConfig:
        """Check every field (raise ``ValueError``/``TypeError`` naming it); return self."""
        check_int("n_rounds", self.n_rounds, low=1)
        check_positive("clip_norm", self.clip_norm, allow_inf=True)
        check_privacy_level(self.target_epsilon, self.noise_multiplier)
        check_delta(self.target_delta, "target_delta")
        check_choice("mechanism", self.mechanism, MECHANISMS)
        check_fraction("sampling_rate", self.sampling_rate, low_open=True, high_open=False)
        check_int("local_steps", self.local_steps, low=1)
        check_positive("local_lr", self.local_lr)
        check_choice("weighting", self.weighting, ("uniform", "size"))
        check_choice("accountant", self.accountant, ("pld", "rdp"))
        private = self.target_epsilon is not None or bool(self.noise_multiplier)
        if private and math.isinf(self.clip_norm):
            raise ValueError("A private run needs a finite clip_norm (the sensitivity is "
                             "2 * clip_norm); got clip_norm=inf.")
        if self.mechanism == "client-level" and self.weighting != "uniform":
            raise ValueError("Client-level DP needs weighting='uniform' (size weights would "
                             "leak client sizes and change the sensitivity).")
        if self.mechanism != "poisson" and self.sampling_rate != 1.0:
            raise ValueError("sampling_rate < 1 needs mechanism='poisson'.")
        if self.mechanism == "full-batch" and self.local_steps != 1:
            raise ValueError("local_steps > 1 needs mechanism='poisson' or 'client-level' "
                             "(the paper's full-batch mechanism sends one step per round).")
        return self

    def resolve_noise_multiplier(self) -> float:
        """The noise multiplier of the run: explicit (0 is non-private) or calibrated."""
        if self.noise_multiplier is not None:
            if self.noise_multiplier == 0:
                logger.warning("noise_multiplier=0: a non-private run, with no privacy "
                               "guarantee.")
            return float(self.noise_multiplier)
        return calibrate_noise_multiplier(
            float(self.target_epsilon), float(self.target_delta), int(self.n_rounds),
            self.mechanism, sampling_rate=float(self.sampling_rate),
            local_steps=int(self.local_steps), accountant=self.accountant)


@lru_cache(maxsize=4096)
def epsilon_after(noise_multiplier: float, n_rounds: int, delta: float,
                  mechanism: str = "full-batch", sampling_rate: float = 1.0,
                  local_steps: int = 1, accountant: str = "pld") -> float:
    """Epsilon spent by one privacy unit after ``n_rounds`` rounds (from dp_accounting)."""
    if noise_multiplier == 0:
        return math.inf
    event = training_event(noise_multiplier, n_rounds, mechanism,  # type: ignore[arg-type]
                           sampling_rate=sampling_rate, local_steps=local_steps)
    return accounting.epsilon_of(event, delta, accountant)  # type: ignore[arg-type]


@dataclass
class FLResult:
    """Outcome of a run: final parameters, per-round history and the privacy figures."""

    params: np.ndarray
    history: list[dict[str, float]]
    noise_multiplier: float
    epsilon: float
    delta: float
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def final_accuracy(self) -> float:
        """Test accuracy after the last round."""
        return self.history[-1]["test_accuracy"]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary (parameters omitted)."""
        return {"noise_multiplier": self.noise_multiplier, "epsilon": self.epsilon,
                "delta": self.delta, "config": self.config, "history": self.history}

    def save_json(self, path: str | os.PathLike) -> None:
        """Write :meth:`to_dict` as JSON (``inf`` written as the string "inf")."""
        def fix(v: Any) -> Any:
            if isinstance(v, float) and not math.isfinite(v):
                return str(v)
            if isinstance(v, dict):
                return {k: fix(x) for k, x in v.items()}
            if isinstance(v, list):
                return [fix(x) for x in v]
            return v

        with open(path, "w", encoding="utf-8") as fh:
            json.dump(fix(self.to_dict()), fh, indent=1)


def simulate(model: FLModel, data: ClientData, optimizer: GradientTransformation,
             config: FLConfig, *, X_test: np.ndarray, y_test: np.ndarray,
             seed: SeedLike = None,
             progress: bool = False,
             callback: Callable[[dict[str, float]], None] | None = None) -> FLResult:
    """Run ``config.n_rounds`` rounds of DP federated training with full participation.

    Privacy: every client's messages satisfy the (epsilon, delta) reported in the history
    for its records (or, for ``"client-level"``, for the whole client); see
    :mod:`dpprecond.fl.accounting`. The server step is post-processing.

    Parameters
    ----------
    model : FLModel
        The model (e.g. :class:`~dpprecond.fl.models.LinearSoftmax`).
    data : ClientData
        Client-contiguous training data.
    optimizer : GradientTransformation
        Server optimizer (:mod:`dpprecond.fl.server`).
    config : FLConfig
        Privacy and training settings.
    X_test, y_test : ndarray
        Held-out data for the per-round accuracy and loss.
    seed : None, int, SeedSequence or Generator
        Root of all randomness: model init, and noise/sampling streams per (round, client).
        ``None`` (default) draws fresh OS entropy, so the noise is unpredictable; a fixed
        seed is for reproducible research only (anyone who knows it can regenerate the
        noise).
    progress : bool
        Show a tqdm progress bar.
    callback : callable, optional
        Called with each round's history record.

    Returns
    -------
    FLResult
        ``history[t]`` has ``round``, ``test_accuracy``, ``test_loss``, ``epsilon`` (spent
        after the round), ``update_norm`` (``||theta_{t+1} - theta_t||``), ``seconds``.
    """
    config = config.validated()
    model_classes = getattr(model, "n_classes", None)
    if model_classes is not None and model_classes != data.n_classes:
        raise ValueError(f"The model has {model_classes} classes but the data has n_classes="
                         f"{data.n_classes}; build the model with n_classes={data.n_classes}.")
    X_test = check_array("X_test", X_test)
    y_test = check_labels("y_test", y_test, data.n_classes, n_rows=X_test.shape[0])
    if X_test.shape[1] != data.X.shape[1]:
        raise ValueError(f"X_test has {X_test.shape[1]} features but the training data has "
                         f"{data.X.shape[1]}.")
    root = check_seed(seed)
    init_seq, noise_root = root.spawn(2)
    z = config.resolve_noise_multiplier()
    K = data.n_clients
    weights = client_weights(data.sizes, config.weighting)
    params = model.init_params(np.random.default_rng(init_seq))
    x_sq_norms = np.einsum("ij,ij->i", data.X, data.X)  # constant over rounds
    state = optimizer.init(params)
    acct = dict(mechanism=config.mechanism, sampling_rate=float(config.sampling_rate),
                local_steps=int(config.local_steps), accountant=config.accountant)
    logger.info("FL run: K=%d, T=%d, z=%.4g, mechanism=%s", K, config.n_rounds, z,
                config.mechanism)
    history: list[dict[str, float]] = []
    for t in tqdm(range(config.n_rounds), disable=not progress, desc="rounds", unit="round"):
        start = time.perf_counter()
        rngs = client_mod.round_generators(noise_root, t, K + 1)
        if config.mechanism == "full-batch":
            U = client_mod.full_batch_messages(model, params, data.X, data.y, data.bounds,
                                               config.clip_norm, z, rngs[:K],
                                               x_sq_norms=x_sq_norms)
            G = weights @ U
        elif config.mechanism == "poisson":
            U = client_mod.poisson_local_messages(
                model, params, data.X, data.y, data.bounds, config.clip_norm, z, rngs[:K],
                sampling_rate=config.sampling_rate, local_steps=config.local_steps,
                local_lr=config.local_lr)
            G = weights @ U
        else:
            G = client_mod.client_level_aggregate(
                model, params, data.X, data.y, data.bounds, config.clip_norm, z, rngs[K],
                local_steps=config.local_steps, local_lr=config.local_lr)
        updates, state = optimizer.update(G, state, params)
        params = params + updates
        seconds = time.perf_counter() - start
        loss, acc = model.evaluate(params, X_test, y_test)
        record = {"round": t + 1, "test_accuracy": acc, "test_loss": loss,
                  "epsilon": epsilon_after(z, t + 1, config.target_delta, **acct),
                  "update_norm": float(np.linalg.norm(updates)), "seconds": seconds}
        history.append(record)
        if callback is not None:
            callback(record)
    eps = history[-1]["epsilon"]
    return FLResult(params, history, z, eps, config.target_delta, asdict(config))


def run_federated(X_train: Any, y_train: Any, X_test: Any, y_test: Any, n_classes: int, *,
                  algorithm: str = "sofim", n_clients: int = 20,
                  partition: Literal["iid", "dirichlet"] = "iid", alpha: float = 0.5,
                  config: FLConfig | None = None, learning_rate: float | None = None,
                  optimizer_kwargs: dict[str, Any] | None = None,
                  model: FLModel | None = None,
                  seed: SeedLike = None,
                  progress: bool = False,
                  callback: Callable[[dict[str, float]], None] | None = None) -> FLResult:
    """Partition, build the model and optimizer, calibrate, and :func:`simulate`.

    The partition uses the stream ``root.spawn(2)[1]`` and the simulation
    ``root.spawn(2)[0]`` with ``root = SeedSequence(seed)``; ``seed=None`` (default) draws
    fresh OS entropy (the noise is unpredictable), a fixed seed is for reproducible research
    only. Defaults follow the paper (linear softmax head,
    full participation, published server settings). ``algorithm`` is one of
    ``"fedgd"``, ``"sofim"``, ``"sofim-momentum"``, ``"adam"``, ``"yogi"``.
    """
    config = (config or FLConfig()).validated()
    X_train = check_array("X_train", X_train)
    n_clients = check_int("n_clients", n_clients, low=1, high=X_train.shape[0])
    y_train = check_labels("y_train", y_train, n_classes, n_rows=X_train.shape[0])
    sim_seq, part_seq = check_seed(seed).spawn(2)
    parts = make_partition(y_train, n_clients, partition, alpha, np.random.default_rng(part_seq))
    data = ClientData.from_partition(X_train, y_train, parts, n_classes)
    model = model or LinearSoftmax(X_train.shape[1], n_classes)
    optimizer = make_optimizer(algorithm, learning_rate, **(optimizer_kwargs or {}))
    result = simulate(model, data, optimizer, config, X_test=X_test, y_test=y_test,
                      seed=sim_seq, progress=progress, callback=callback)
    result.config.update(algorithm=algorithm, n_clients=n_clients, partition=partition,
                         alpha=alpha, seed=seed if isinstance(seed, int) else None,
                         learning_rate=learning_rate,
                         optimizer_kwargs=optimizer_kwargs or {})
    return result
