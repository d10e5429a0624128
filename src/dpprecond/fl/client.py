"""Client mechanisms: what every client sends to the server in one round.

Pure functions of (model, parameters, client data, clipping, noise, generators). The
privacy unit, sensitivity and accounting of each mechanism are in
:mod:`dpprecond.fl.accounting`; in short:

- :func:`full_batch_messages` (the paper): record-level, replace-one. Client ``i`` sends
  ``u_i = (sum_{x in D_i} clip_C(g(x)) + N(0, (2 z C)^2 I)) / |D_i|``; the clipped sum has
  l2 sensitivity ``2C`` under replacement of one record, so each message is a Gaussian
  mechanism with noise multiplier ``z``. The client adds its own noise: no trusted server.
- :func:`poisson_local_messages`: record-level, add/remove-one. ``local_steps`` noisy
  clipped steps on Poisson samples (rate ``q``), noise ``N(0, (z C)^2)`` per step (the
  sensitivity of a sampled clipped sum to adding or removing one record is ``C``),
  normalised by the public expected batch size ``q |D_i|``; the client sends its average
  noisy gradient ``(theta - y_L) / (local_lr * local_steps)``.
- :func:`client_level_aggregate`: client-level, replace-one client. Each client's whole
  update is clipped to ``C``, the server (trusted) adds ``N(0, (2 z C)^2)`` once to the sum.

Noise streams: the generator of client ``i`` in round ``t`` is built from the seed
sequence with spawn key ``(t, i)`` (exactly ``root.spawn(T)[t].spawn(K)[i]``), so numbers do
not depend on the order in which clients are processed; the server's stream for
client-level noise is ``(t, K)``.
"""

from __future__ import annotations

import numpy as np

from dpprecond.fl.models import FLModel, clip_rows_safely

__all__ = [
    "client_level_aggregate",
    "full_batch_messages",
    "poisson_local_messages",
    "round_generators",
    "stream",
]


def stream(root: np.random.SeedSequence, round_index: int, client: int) -> np.random.Generator:
    """The generator of (``round_index``, ``client``): spawn key ``root.spawn_key + (t, i)``."""
    seq = np.random.SeedSequence(root.entropy, spawn_key=(*root.spawn_key, round_index, client),
                                 pool_size=root.pool_size)
    return np.random.default_rng(seq)


def round_generators(root: np.random.SeedSequence, round_index: int,
                     n_clients: int) -> list[np.random.Generator]:
    """One independent generator per client for one round."""
    return [stream(root, round_index, i) for i in range(n_clients)]


def _add_noise(S: np.ndarray, std: float, rngs: list[np.random.Generator]) -> np.ndarray:
    if std > 0:
        for i, rng in enumerate(rngs):  # each client draws from its own stream
            S[i] += std * rng.standard_normal(S.shape[1])
    return S


def full_batch_messages(model: FLModel, params: np.ndarray, X: np.ndarray, y: np.ndarray,
                        bounds: np.ndarray, clip_norm: float, noise_multiplier: float,
                        rngs: list[np.random.Generator], *,
                        x_sq_norms: np.ndarray | None = None) -> np.ndarray:
    """Every client's noisy clipped mean gradient, shape (K, p) (the paper's mechanism).

    Privacy unit: one record, replace-one; sensitivity of the clipped sum ``2C``; noise std
    ``noise_multiplier * 2 * clip_norm``; event per round ``GaussianDpEvent(z)``.
    ``clip_norm=inf`` with ``noise_multiplier=0`` is the non-private full-batch gradient.
    """
    sizes = np.diff(bounds).astype(np.float64)
    S = model.clipped_grad_sums(params, X, y, bounds, clip_norm, x_sq_norms=x_sq_norms)
    S = _add_noise(S, noise_multiplier * 2.0 * clip_norm if noise_multiplier else 0.0, rngs)
    return S / sizes[:, None]


def poisson_local_messages(model: FLModel, params: np.ndarray, X: np.ndarray, y: np.ndarray,
                           bounds: np.ndarray, clip_norm: float, noise_multiplier: float,
                           rngs: list[np.random.Generator], *, sampling_rate: float,
                           local_steps: int, local_lr: float) -> np.ndarray:
    """Average noisy gradient of ``local_steps`` local DP-SGD steps per client, (K, p).

    Privacy unit: one record, add/remove-one; per step sensitivity ``C``, noise std
    ``noise_multiplier * clip_norm``; event per round
    ``SelfComposed(PoissonSampled(q, Gaussian(z)), local_steps)``. Each client draws its
    Poisson masks and its noise from its own generator ``rngs[i]``.
    """
    n_clients = len(bounds) - 1
    sizes = np.diff(bounds)
    expected = sampling_rate * sizes.astype(np.float64)
    Y = np.tile(params, (n_clients, 1))
    std = noise_multiplier * clip_norm if noise_multiplier else 0.0
    for _ in range(local_steps):
        if sampling_rate < 1.0:
            mask = np.concatenate([rng.random(int(m)) < sampling_rate
                                   for rng, m in zip(rngs, sizes, strict=True)])
            idx = np.flatnonzero(mask)
            counts = np.add.reduceat(mask, bounds[:-1]) if len(mask) else np.zeros(n_clients)
            sub_bounds = np.r_[0, np.cumsum(counts)].astype(np.int64)
            S = model.clipped_grad_sums(Y, X[idx], y[idx], sub_bounds, clip_norm)
        else:
            S = model.clipped_grad_sums(Y, X, y, bounds, clip_norm)
        S = _add_noise(S, std, rngs)
        Y -= local_lr * (S / expected[:, None])
    return (params - Y) / (local_lr * local_steps)


def client_level_aggregate(model: FLModel, params: np.ndarray, X: np.ndarray, y: np.ndarray,
                           bounds: np.ndarray, clip_norm: float, noise_multiplier: float,
                           server_rng: np.random.Generator, *, local_steps: int = 1,
                           local_lr: float = 0.1) -> np.ndarray:
    """Client-level DP aggregate ``(sum_i clip_C(Delta_i) + N(0, (2 z C)^2 I)) / K``, (p,).

    ``Delta_i`` is client ``i``'s average non-private gradient over ``local_steps`` local
    full-batch steps (the plain mean gradient when ``local_steps=1``). Privacy unit: one
    client, replace-one; sensitivity of the clipped sum ``2C``; the noise is added once by
    a trusted aggregator; event per round ``GaussianDpEvent(z)``.
    """
    n_clients = len(bounds) - 1
    sizes = np.diff(bounds).astype(np.float64)[:, None]
    Y = np.tile(params, (n_clients, 1))
    for _ in range(local_steps):
        Y -= local_lr * model.clipped_grad_sums(Y, X, y, bounds, np.inf) / sizes
    with np.errstate(over="ignore", invalid="ignore"):
        D = (params - Y) / (local_lr * local_steps)
    D = clip_rows_safely(D, clip_norm)  # an update that overflowed counts as zero
    total = D.sum(axis=0)
    if noise_multiplier:
        total += noise_multiplier * 2.0 * clip_norm * server_rng.standard_normal(total.shape[0])
    return total / n_clients
