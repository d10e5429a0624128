"""Client data of a federated simulation: every client's rows, stored client-contiguously."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from dpprecond._validation import check_array, check_int, check_labels

__all__ = ["ClientData"]


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
        bounds = np.asarray(self.bounds)
        if bounds.ndim != 1 or bounds.size < 2 or not np.issubdtype(bounds.dtype, np.integer) \
                or bounds[0] != 0 or bounds[-1] != X.shape[0]:
            raise ValueError(f"Expected ClientData.bounds to be integers from 0 to n = "
                             f"{X.shape[0]}, got {bounds.tolist()[:8]}.")
        empty = np.flatnonzero(np.diff(bounds) <= 0)
        if empty.size:
            raise ValueError(f"Client {int(empty[0])} has no data (bounds "
                             f"{bounds.tolist()[:8]}); every client needs at least one "
                             "example.")

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
