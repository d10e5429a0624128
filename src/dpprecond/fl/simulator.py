"""The one-call federated simulation: partition, model, method, engine.

:func:`run_federated` splits a labelled training set among clients (IID or Dirichlet),
builds a linear softmax head (or takes a model), builds the method by name
(:mod:`dpprecond.fl.methods`) and runs it on the round engine
(:func:`dpprecond.fl.engine.simulate`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import numpy as np

from dpprecond._validation import SeedLike, check_array, check_int, check_labels, check_seed
from dpprecond.accounting import PrivacyLedger
from dpprecond.fl.config import FLConfig
from dpprecond.fl.data import ClientData
from dpprecond.fl.engine import FLResult, simulate
from dpprecond.fl.methods import make_method
from dpprecond.fl.models import FLModel, LinearSoftmax
from dpprecond.fl.partition import make_partition

__all__ = ["DEFAULT_ALGORITHM", "run_federated"]

#: The default method of :func:`run_federated`, ``dpprecond fl`` and the demo.
#: The default method: DP-FedSOFIM with the preconditioner built from the previous round's
#: momentum (lowest mean and worst shortfall from the best method over the 20 cells of
#: docs/fl_noise_aware.md; the paper's form, "sofim", climbs under noise and warns).
DEFAULT_ALGORITHM = "sofim-lagged"


def run_federated(X_train: Any, y_train: Any, X_test: Any, y_test: Any, n_classes: int, *,
                  algorithm: str = DEFAULT_ALGORITHM, n_clients: int = 20,
                  partition: Literal["iid", "dirichlet"] = "iid", alpha: float = 0.5,
                  config: FLConfig | None = None, learning_rate: float | None = None,
                  method_options: dict[str, Any] | None = None,
                  model: FLModel | None = None, seed: SeedLike = None,
                  ledger: PrivacyLedger | None = None, progress: bool = False,
                  callback: Callable[[dict[str, float]], None] | None = None,
                  checkpoint: str | None = None, secure: bool = False) -> FLResult:
    """Partition, build the model and the method, and run it on the round engine.

    Parameters
    ----------
    X_train, y_train, X_test, y_test : array-like
        Features (n, d) and integer labels in ``[0, n_classes)``.
    n_classes : int
        Number of classes.
    algorithm : str
        A method of :mod:`dpprecond.fl.methods` (``"fedgd"``, ``"sofim"``,
        ``"sofim-momentum"``, ``"sofim-lagged"``, ``"adam"``, ``"yogi"``, ``"fedavg"``,
        ``"scaffold"``, ``"fedfc"``, ``"fednew"``).
    n_clients, partition, alpha
        ``K`` clients, IID or Dirichlet(alpha) label skew.
    config : FLConfig, optional
        Privacy and training settings; default ``FLConfig(target_epsilon=1.0)``.
    learning_rate : float, optional
        The method's ``learning_rate`` option (the server step of the gradient methods,
        DP-FedFC and DP-FedNew); ``None`` keeps its default. DP-FedAvg and DP-SCAFFOLD
        have ``local_lr`` and ``global_lr`` instead (pass them in ``method_options``).
    method_options : dict, optional
        Other options of the method (:func:`dpprecond.fl.methods.method_options`).
    model : FLModel, optional
        Default: a linear softmax head with bias.
    seed : None, int, SeedSequence or Generator
        ``root.spawn(2)`` gives the simulation's and the partition's streams. ``None``
        (default) draws fresh OS entropy (the noise is unpredictable); a fixed seed is for
        reproducible research only.
    ledger, progress, callback, checkpoint, secure
        As in :func:`dpprecond.fl.engine.simulate` (with ``secure=True`` the partition still
        uses ``seed``, which is then only the data preparation's and may be given).
    """
    config = (config or FLConfig(target_epsilon=1.0)).validated()
    X_train = check_array("X_train", X_train)
    if X_train.shape[1] < 1:
        raise ValueError(f"X_train has no columns (shape {X_train.shape}); give at least one "
                         "feature.")
    n_clients = check_int("n_clients", n_clients, low=1, high=X_train.shape[0])
    y_train = check_labels("y_train", y_train, n_classes, n_rows=X_train.shape[0])
    method = make_method(algorithm, learning_rate, **(method_options or {}))
    sim_seq, part_seq = check_seed(seed).spawn(2)
    sim_seed = None if secure else sim_seq
    parts = make_partition(y_train, n_clients, partition, alpha, np.random.default_rng(part_seq))
    data = ClientData.from_partition(X_train, y_train, parts, n_classes)
    model = model or LinearSoftmax(X_train.shape[1], n_classes)
    result = simulate(model, data, method, config, X_test=X_test, y_test=y_test,
                      seed=sim_seed, ledger=ledger, progress=progress, callback=callback,
                      checkpoint=checkpoint, secure=secure)
    # The seed is not recorded: results are written to disk and shared, and a seed would
    # let anyone regenerate the noise.
    result.config.update(algorithm=algorithm, n_clients=n_clients, partition=partition,
                         alpha=alpha)
    return result
