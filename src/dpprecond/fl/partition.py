"""Splitting a training set among clients: IID and Dirichlet(alpha) label skew.

A partition is a list of ``n_clients`` disjoint integer index arrays that together cover
every example exactly once. Both splitters are seeded through an explicit numpy Generator.
Partitioning is data preparation for a simulation, not a private release: the simulator
treats each client's local data set (and its size) as given, as in the paper.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from dpprecond._validation import (
    check_choice,
    check_int,
    check_labels,
    check_positive,
    check_random_state,
)

__all__ = ["client_weights", "dirichlet_partition", "iid_partition", "make_partition"]


def iid_partition(n_examples: int, n_clients: int,
                  seed: np.random.Generator | int | None = None) -> list[np.ndarray]:
    """Shuffle and cut into ``n_clients`` near-equal parts (sizes differ by at most one)."""
    n_examples = check_int("n_examples", n_examples, low=1)
    n_clients = check_int("n_clients", n_clients, low=1, high=n_examples)
    rng = check_random_state("seed", seed)
    return [np.sort(part) for part in np.array_split(rng.permutation(n_examples), n_clients)]


def dirichlet_partition(y: np.ndarray, n_clients: int, alpha: float,
                        seed: np.random.Generator | int | None = None,
                        min_size: int = 1) -> list[np.ndarray]:
    """Label-skewed split: class ``c``'s examples go to clients in proportions ~ Dir(alpha).

    For every class independently, client shares ``p ~ Dirichlet(alpha * 1_K)`` are drawn
    and the shuffled examples of that class are cut at ``floor(cumsum(p) * n_c)``.

    Rule for clients that would get too little data (documented, deterministic given
    ``seed``): a client left with fewer than ``min_size`` examples receives, one client at a
    time in increasing client order, randomly chosen examples moved from the client that is
    currently the largest, until it has ``min_size``. No redraw loop, so small ``alpha``
    always terminates; the moved examples keep the partition disjoint and complete.

    Parameters
    ----------
    y : ndarray of shape (n,)
        Integer labels >= 0 (checked with :func:`~dpprecond._validation.check_labels`).
    n_clients : int
        Number of clients K (``K * min_size <= n``).
    alpha : float
        Dirichlet concentration (> 0); small values give strong label skew.
    seed : Generator, int or None
        Randomness (``None``: fresh OS entropy).
    min_size : int, default=1
        Minimum examples per client after the repair rule.
    """
    y = check_labels("y", y)  # 1-D, integers >= 0: NaN labels would leave rows unassigned
    n = y.shape[0]
    n_clients = check_int("n_clients", n_clients, low=1)
    alpha = check_positive("alpha", alpha)
    min_size = check_int("min_size", min_size, low=1)
    if n_clients * min_size > n:
        raise ValueError(f"Cannot give n_clients={n_clients} clients min_size={min_size} "
                         f"examples each from {n} examples; use fewer clients.")
    rng = check_random_state("seed", seed)
    owner = np.empty(n, dtype=np.int64)
    for c in np.unique(y):  # loop over classes (few), vectorized inside
        idx = rng.permutation(np.flatnonzero(y == c))
        shares = rng.dirichlet(np.full(n_clients, alpha))
        cuts = np.floor(np.cumsum(shares)[:-1] * len(idx)).astype(np.int64)
        owner[idx] = np.repeat(np.arange(n_clients), np.diff(np.r_[0, cuts, len(idx)]))
    sizes = np.bincount(owner, minlength=n_clients)
    for i in np.flatnonzero(sizes < min_size):  # the repair rule (rarely more than a few)
        need = min_size - sizes[i]
        donor = int(np.argmax(sizes))
        moved = rng.choice(np.flatnonzero(owner == donor), size=need, replace=False)
        owner[moved] = i
        sizes[i] += need
        sizes[donor] -= need
    order = np.argsort(owner, kind="stable")
    return np.split(order, np.cumsum(sizes)[:-1])


def make_partition(y: np.ndarray, n_clients: int, kind: Literal["iid", "dirichlet"] = "iid",
                   alpha: float = 0.5,
                   seed: np.random.Generator | int | None = None) -> list[np.ndarray]:
    """Dispatch to :func:`iid_partition` or :func:`dirichlet_partition`."""
    check_choice("partition", kind, ("iid", "dirichlet"))
    if kind == "iid":
        return iid_partition(len(y), n_clients, seed)
    return dirichlet_partition(y, n_clients, alpha, seed)


def client_weights(sizes: np.ndarray, weighting: Literal["uniform", "size"] = "uniform"
                   ) -> np.ndarray:
    """Aggregation weights summing to 1: ``1/K`` (the authors' choice) or ``|D_i| / n``."""
    check_choice("weighting", weighting, ("uniform", "size"))
    sizes = np.asarray(sizes, dtype=np.float64)
    if weighting == "uniform":
        return np.full(sizes.shape[0], 1.0 / sizes.shape[0])
    return sizes / sizes.sum()
