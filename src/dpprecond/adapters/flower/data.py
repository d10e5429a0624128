"""Where a Flower client's data comes from: two ready-made ``load_data`` callables.

- :class:`PartitionedDataset` (simulations and tests): a named dataset of
  :mod:`dpprecond.data`, featurized, and cut among the clients exactly as
  :func:`dpprecond.fl.simulator.run_federated` cuts it (same partition seed tree), so a
  Flower simulation and the in-process simulator train on the same client data.
- :class:`NodeFileData` (deployments): each client reads its own ``.npz`` file named in its
  SuperNode's node config (``data-path``); nothing about the data is shared or sent.

Both cache the loaded arrays per process, since a ClientApp is called once per round.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from dpprecond._validation import (
    check_array,
    check_choice,
    check_int,
    check_labels,
    check_positive,
)
from dpprecond.adapters.flower.client_app import ClientInfo, LocalData
from dpprecond.adapters.flower.protocol import simulator_seeds
from dpprecond.data.base import Dataset
from dpprecond.fl.models import LinearSoftmax
from dpprecond.fl.partition import make_partition

__all__ = ["NodeFileData", "PartitionedDataset", "featurized_dataset", "raw_dataset"]


@lru_cache(maxsize=2)
def raw_dataset(name: str, data_path: str | None = None) -> Dataset:
    """``load_dataset(name, data_path)`` (raw pixels in [0, 1]), cached per process."""
    from dpprecond.data import load_dataset

    return load_dataset(name, data_path)


@lru_cache(maxsize=2)
def featurized_dataset(name: str, data_path: str | None = None,
                       features: str = "pixels") -> Dataset:
    """``featurize(load_dataset(name, data_path), features)``, cached per process."""
    from dpprecond.data import load_dataset
    from dpprecond.features import featurize

    return featurize(load_dataset(name, data_path), kind=features)


@lru_cache(maxsize=8)
def _parts(name: str, data_path: str | None, features: str, n_clients: int, partition: str,
           alpha: float, seed: int) -> tuple[np.ndarray, ...]:
    y = featurized_dataset(name, data_path, features).y_train
    rng = np.random.default_rng(simulator_seeds(seed).partition)
    return tuple(make_partition(y, n_clients, partition, alpha, rng))  # type: ignore[arg-type]


@dataclass(frozen=True)
class PartitionedDataset:
    """Client ``i`` of ``K`` gets part ``i`` of ``run_federated(seed=seed)``'s split.

    Parameters
    ----------
    name : str
        A dataset name of :func:`dpprecond.data.load_dataset` (``"digits"``,
        ``"fashion-mnist"``, ...).
    data_path : str or None
        Where its files are (``None``: the loader's default place).
    features : str
        Feature map of :func:`dpprecond.features.featurize` (``"pixels"``).
    partition : {"iid", "dirichlet"}
        The split, with ``alpha`` for Dirichlet label skew.
    seed : int
        The ``run_federated`` seed whose partition stream is used. It only decides who
        holds which example (simulated data preparation), never any noise.
    """

    name: str = "digits"
    data_path: str | None = None
    features: str = "pixels"
    partition: str = "iid"
    alpha: float = 0.5
    seed: int = 0

    @classmethod
    def from_run_config(cls, run_config: dict[str, Any]) -> PartitionedDataset:
        """Read ``data``, ``data-path``, ``features``, ``partition``, ``alpha``,
        ``partition-seed`` from a Flower run config (absent keys keep the defaults)."""
        path = run_config.get("data-path", "") or None
        return cls(name=str(run_config.get("data", "digits")), data_path=path,
                   features=str(run_config.get("features", "pixels")),
                   partition=check_choice("partition", run_config.get("partition", "iid"),
                                          ["iid", "dirichlet"]),
                   alpha=check_positive("alpha", run_config.get("alpha", 0.5)),
                   seed=check_int("partition-seed", run_config.get("partition-seed", 0), low=0))

    def dataset(self) -> Dataset:
        """The whole featurized dataset (the server uses its test split)."""
        return featurized_dataset(self.name, self.data_path, self.features)

    def indices(self, info: ClientInfo) -> np.ndarray:
        """The training-row indices of client ``info.client_id`` of ``info.n_clients``."""
        parts = _parts(self.name, self.data_path, self.features, info.n_clients,
                       self.partition, float(self.alpha), int(self.seed))
        return parts[info.client_id]

    def raw_rows(self, info: ClientInfo) -> np.ndarray:
        """This client's training rows before featurizing (pixels in [0, 1]), cut as
        :meth:`__call__` cuts them: the rows of the federated PCA app."""
        return raw_dataset(self.name, self.data_path).X_train[self.indices(info)]

    def __call__(self, info: ClientInfo) -> LocalData:
        ds = self.dataset()
        idx = self.indices(info)
        return LocalData(LinearSoftmax(ds.n_features, ds.n_classes), ds.X_train[idx],
                         ds.y_train[idx])


@lru_cache(maxsize=2)
def _read_npz(path: str, n_classes: int) -> tuple[np.ndarray, np.ndarray]:
    if not os.path.isfile(path):
        raise FileNotFoundError(f"This client's data file {path!r} (node config data-path) "
                                "does not exist; write an .npz with arrays X (n, d) and y (n,).")
    with np.load(path, allow_pickle=False) as f:
        missing = [k for k in ("X", "y") if k not in f]
        if missing:
            raise ValueError(f"{path!r} has no array(s) {missing}; expected X (n, d) features "
                             "and y (n,) labels.")
        X = check_array("X", f["X"])
        y = check_labels("y", f["y"], n_classes, n_rows=X.shape[0])
    return X, y


@dataclass(frozen=True)
class NodeFileData:
    """Each client reads its own ``.npz`` (arrays ``X``, ``y``) from node config ``data-path``.

    The model is a linear softmax head over the file's ``d`` features and ``n_classes``
    classes; ``n_classes`` comes from the run config (key ``n-classes``) when not given.
    """

    n_classes: int | None = None

    def __call__(self, info: ClientInfo) -> LocalData:
        path = info.node_config.get("data-path")
        if not path:
            raise ValueError("This SuperNode has no data-path in its node config; start it "
                             "with --node-config \"... data-path='/path/to/client.npz'\".")
        k = self.n_classes if self.n_classes is not None else info.run_config.get("n-classes")
        k = check_int("n-classes", k, low=2)
        X, y = _read_npz(str(path), k)
        return LocalData(LinearSoftmax(X.shape[1], k), X, y)
