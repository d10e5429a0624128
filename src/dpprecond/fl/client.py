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
- the local steps of DP-FedAvg, DP-SCAFFOLD and DP-FedProx, each a full-batch message of
  this module at the client's local iterate: :mod:`dpprecond.fl.local_steps`.
- :func:`second_moment_releases` (DP-FedFC, DP-FedNew): record-level, replace-one. A one-off
  release of each client's feature second moment, rows of ``[x, 1]`` clipped to ``C_x``
  (sensitivity ``sqrt(2) C_x^2`` of the upper triangle; event ``Gaussian(z_cov)``).
- :func:`noisy_counts` (adaptive clipping, :mod:`dpprecond.fl.adaptive_clip`):
  record-level, replace-one. Each client's count of its records whose gradient norm is at
  most the round's clip, plus ``N(0, z_b^2)`` (sensitivity 1; event ``Gaussian(z_b)``).

Noise streams: the generator of client ``i`` in round ``t`` is built from the seed
sequence with spawn key ``(t, i)`` (exactly ``root.spawn(T)[t].spawn(K)[i]``), so numbers do
not depend on the order in which clients are processed; the server's stream for
client-level noise is ``(t, K)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeAlias

import numpy as np

from dpprecond import noise
from dpprecond.clipping import gamma
from dpprecond.fl.backend import get_backend
from dpprecond.fl.config import FLConfig
from dpprecond.fl.models import FLModel, LinearSoftmax, clip_rows_safely
from dpprecond.noise import NoiseSource
from dpprecond.secure import SecureGenerator, SecureRoot

#: The random source of one (round, client) stream: noise draws and Poisson masks.
Stream: TypeAlias = np.random.Generator | SecureGenerator

__all__ = [
    "Stream",
    "add_client_noise",
    "aggregate_inflation",
    "client_level_aggregate",
    "client_level_release",
    "client_level_sensitivity",
    "client_level_updates",
    "clip_feature_rows",
    "count_sensitivity",
    "covariance_sensitivity",
    "full_batch_messages",
    "full_batch_messages_and_counts",
    "gram_inflation",
    "kernel_rows",
    "local_deltas",
    "noise_inflation",
    "noisy_counts",
    "poisson_local_messages",
    "record_counts",
    "round_generators",
    "second_moment_releases",
    "stream",
]


def stream(root: np.random.SeedSequence | SecureRoot, round_index: int,
           client: int) -> Stream:
    """The generator of (``round_index``, ``client``): spawn key ``root.spawn_key + (t, i)``.

    In secure mode (``root`` a :class:`dpprecond.secure.SecureRoot`) every stream is a
    :class:`dpprecond.secure.SecureGenerator` instead.
    """
    if isinstance(root, SecureRoot):
        return SecureGenerator()
    seq = np.random.SeedSequence(root.entropy, spawn_key=(*root.spawn_key, round_index, client),
                                 pool_size=root.pool_size)
    return np.random.default_rng(seq)


def kernel_rows(X: np.ndarray, config: FLConfig, model: FLModel) -> tuple[Any, Any]:
    """The rows the gradient passes read and their squared norms (float64), on the
    config's backend: ``X`` itself (numpy, float64), or its float32 rounding, or a copy on
    a torch device (:mod:`dpprecond.fl.backend`). Done once per run.

    The float32 rounding saturates: a finite entry beyond float32's range becomes
    ``+-finfo(float32).max`` (not ``inf``), so every record maps to a finite row (a
    per-record map; such a row takes the kernel's overflow-safe path)."""
    if config.precision == "float64":
        X_run = X
    else:
        with np.errstate(over="ignore"):  # saturated below
            X_run = X.astype(np.float32)
        beyond = np.isinf(X_run)
        if beyond.any():
            X_run[beyond] = np.copysign(np.finfo(np.float32).max, X_run[beyond])
    x_sq = np.einsum("ij,ij->i", X_run, X_run, dtype=np.float64)  # constant over rounds
    if config.backend == "numpy":
        return X_run, x_sq
    if not isinstance(model, LinearSoftmax):
        raise ValueError(f"backend={config.backend!r} runs the linear head's kernel; "
                         f"{type(model).__name__} computes its own gradients (a TorchModel "
                         "runs in torch already): use backend='numpy' with it.")
    be = get_backend(config.backend, config.device)
    return be.asarray(X_run), be.asarray(x_sq)


def round_generators(root: np.random.SeedSequence | SecureRoot, round_index: int,
                     n_clients: int) -> list[Stream]:
    """One independent generator per client for one round."""
    return [stream(root, round_index, i) for i in range(n_clients)]


def noise_inflation(model: FLModel, X: np.ndarray, bounds: np.ndarray) -> float:
    """``1 +`` the model's bound on the rounding of a client's clipped sum, relative to the
    sensitivity (:func:`dpprecond.fl.kernels.rounding_slack`).

    With :func:`aggregate_inflation`, the one place the federated mechanisms account for
    rounding: every noise std of a clipped-sum release is the accounted
    ``z * sensitivity`` times this factor, so that the computed sums meet the accounted
    sensitivity. Only the noise std carries it; the calibration (the noise multiplier ``z``)
    and every epsilon never see it.
    """
    slack = getattr(model, "rounding_slack", None)
    if slack is None or len(bounds) < 2:
        return 1.0
    return 1.0 + slack(int(np.diff(bounds).max(initial=1)), X.dtype)


def aggregate_inflation(n_clients: int) -> float:
    """``1 +`` the bound on the rounding of a float64 sum of ``K`` clipped client updates,
    relative to the sensitivity: ``1 + K^2 u`` (``u = 2^-53``; the sum's error is below
    ``gamma_K K C``). The client-level aggregate's counterpart of :func:`noise_inflation`.
    """
    return 1.0 + n_clients * n_clients * 2.0**-53


def gram_inflation(n_rows: int) -> float:
    """``1 +`` the bound on the rounding of a float64 Gram sum of ``n_rows`` clipped rows,
    relative to the second moment's sensitivity (:func:`covariance_sensitivity`).

    Every entry of the computed ``sum x x^T`` is within ``gamma_n sum |x_j x_l|`` of the
    exact one (a dot product of length ``n``, any summation order; Higham, Thm. 3.1), so the
    error matrix has Frobenius norm at most ``gamma_n sum ||x||^2 <= gamma_n n C_x^2``. Two
    neighbours' computed moments then differ by at most ``sqrt(2) C_x^2 + 2 gamma_n n C_x^2``:
    the relative excess is ``sqrt(2) gamma_n n`` (below ``1e-8`` for ``n <= 1e4``). The
    covariance release's counterpart of :func:`noise_inflation`.
    """
    return 1.0 + math.sqrt(2.0) * gamma(n_rows + 4) * n_rows


def add_client_noise(S: np.ndarray, std: float,
                     rngs: Sequence[NoiseSource]) -> np.ndarray:
    """Release row ``i`` of ``S`` (client ``i``'s clipped sum) with its own ``N(0, std^2 I)``
    drawn from ``rngs[i]`` (in place, through :func:`dpprecond.noise.release`)."""
    if std > 0:
        for i, rng in enumerate(rngs):  # each client draws from its own stream
            S[i] = noise.release(S[i], std, rng)
    return S


def full_batch_messages(model: FLModel, params: np.ndarray, X: np.ndarray, y: np.ndarray,
                        bounds: np.ndarray, clip_norm: float, noise_multiplier: float,
                        rngs: Sequence[NoiseSource], *,
                        x_sq_norms: np.ndarray | None = None) -> np.ndarray:
    """Every client's noisy clipped mean gradient, shape (K, p) (the paper's mechanism).

    Privacy unit: one record, replace-one; sensitivity of the clipped sum ``2C``; noise std
    ``noise_multiplier * 2 * clip_norm``; event per round ``GaussianDpEvent(z)``.
    ``clip_norm=inf`` with ``noise_multiplier=0`` is the non-private full-batch gradient.
    """
    S = model.clipped_grad_sums(params, X, y, bounds, clip_norm, x_sq_norms=x_sq_norms)
    return _noisy_means(model, S, X, bounds, clip_norm, noise_multiplier, rngs)


def full_batch_messages_and_counts(model: FLModel, params: np.ndarray, X: np.ndarray,
                                   y: np.ndarray, bounds: np.ndarray, clip_norm: float,
                                   noise_multiplier: float, rngs: Sequence[NoiseSource], *,
                                   x_sq_norms: np.ndarray | None = None
                                   ) -> tuple[np.ndarray, np.ndarray]:
    """:func:`full_batch_messages` and :func:`record_counts` at ``clip_norm``, one pass.

    For a model that counts inside its gradient pass (``counts_in_pass``, the linear
    head: :meth:`~dpprecond.fl.models.LinearSoftmax.clipped_grad_sums_and_counts`). The
    messages are exactly :func:`full_batch_messages`'s; the counts are the exact
    statistic (not yet noised: :func:`noisy_counts` releases them).
    """
    fused = getattr(model, "clipped_grad_sums_and_counts", None)
    if fused is None:
        raise TypeError(f"{type(model).__name__} does not count inside its gradient pass "
                        "(no clipped_grad_sums_and_counts): use full_batch_messages and "
                        "record_counts.")
    S, counts = fused(params, X, y, bounds, clip_norm, x_sq_norms=x_sq_norms)
    return _noisy_means(model, S, X, bounds, clip_norm, noise_multiplier, rngs), counts


def _noisy_means(model: FLModel, S: np.ndarray, X: np.ndarray, bounds: np.ndarray,
                 clip_norm: float, noise_multiplier: float,
                 rngs: Sequence[NoiseSource]) -> np.ndarray:
    """The clipped sums ``S`` noised (std ``z 2 C`` times the rounding inflation), per
    record of each client."""
    sizes = np.diff(bounds).astype(np.float64)
    std = noise_multiplier * 2.0 * clip_norm * noise_inflation(model, X, bounds) \
        if noise_multiplier else 0.0
    S = add_client_noise(S, std, rngs)
    return S / sizes[:, None]


def poisson_local_messages(model: FLModel, params: np.ndarray, X: np.ndarray, y: np.ndarray,
                           bounds: np.ndarray, clip_norm: float, noise_multiplier: float,
                           rngs: Sequence[Stream], *, sampling_rate: float,
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
    std = noise_multiplier * clip_norm * noise_inflation(model, X, bounds) \
        if noise_multiplier else 0.0
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
        S = add_client_noise(S, std, rngs)
        Y -= local_lr * (S / expected[:, None])
    return (params - Y) / (local_lr * local_steps)


def local_deltas(model: FLModel, params: np.ndarray, X: np.ndarray, y: np.ndarray,
                 bounds: np.ndarray, clip_norm: float, *, local_steps: int, local_lr: float,
                 release: Callable[[np.ndarray], np.ndarray] | None = None,
                 correction: np.ndarray | None = None, proximal_mu: float = 0.0,
                 x_sq_norms: np.ndarray | None = None) -> np.ndarray:
    """Every client's model change ``y_L - params`` after ``local_steps`` full-batch steps.

    The one definition of the local steps of DP-FedAvg, DP-SCAFFOLD and DP-FedProx, in both
    privacy units. Client ``i`` starts from ``params`` and repeats ``y <- y - local_lr (g +
    c_i + mu (y - params))``, where ``g`` is its clipped gradient sum at ``y`` (clip
    ``clip_norm``; ``inf``: none), passed through ``release`` (the record-level local
    steps add each client's noise there: :func:`dpprecond.fl.local_steps.
    local_step_deltas`; ``None``: no noise, the client-level local steps) and divided by
    ``|D_i|``; ``c_i`` is the optional control-variate correction ``correction[i]`` (public
    to the client: SCAFFOLD's ``c - c_i``) and ``mu (y - params)`` the gradient of
    FedProx's proximal term ``mu/2 ||y - params||^2`` (``proximal_mu``; 0: none).
    """
    n_clients = len(bounds) - 1
    sizes = np.diff(bounds).astype(np.float64)[:, None]
    Y = np.tile(params, (n_clients, 1))
    for _ in range(local_steps):
        S = model.clipped_grad_sums(Y, X, y, bounds, clip_norm, x_sq_norms=x_sq_norms)
        if release is not None:
            S = release(S)
        G = S / sizes
        if correction is not None:
            G += correction
        if proximal_mu:
            G += proximal_mu * (Y - params)
        Y -= local_lr * G
    return Y - params


def client_level_updates(model: FLModel, params: np.ndarray, X: np.ndarray, y: np.ndarray,
                         bounds: np.ndarray, clip_norm: float, *, local_steps: int = 1,
                         local_lr: float = 0.1, correction: np.ndarray | None = None,
                         proximal_mu: float = 0.0) -> np.ndarray:
    """Every client's clipped update ``clip_C(Delta_i)``, ``(K, p)``: the client-level part.

    ``Delta_i = (params - y_L) / (local_lr local_steps)`` is client ``i``'s average
    non-private gradient over ``local_steps`` local full-batch steps from ``params`` at
    step size ``local_lr`` (:func:`local_deltas` without noise or per-example clipping,
    with SCAFFOLD's ``correction`` and FedProx's ``proximal_mu`` when given; the plain mean
    gradient when ``local_steps=1``). An update that overflowed is replaced by zero and
    every row is clipped overflow-safely (:func:`dpprecond.clipping.clip_rows_safely`), so
    each row has norm at most ``C`` *as computed*: replacing one client's data moves its
    row by at most ``2C`` (:func:`client_level_sensitivity`) and leaves every other row
    unchanged (the correction and the proximal term are the client's own state and public
    broadcasts, so they move nothing else either).
    """
    # non-private steps on the client's own data: any overflow (a huge record or step
    # size) only makes that client's row non-finite, which counts as zero below; no
    # warning, so that a client's data cannot make its round fail
    with np.errstate(over="ignore", invalid="ignore"):
        delta = local_deltas(model, params, X, y, bounds, np.inf, local_steps=local_steps,
                             local_lr=local_lr, correction=correction,
                             proximal_mu=proximal_mu)
        D = -delta / (local_lr * local_steps)
    return clip_rows_safely(D, clip_norm)  # an update that overflowed counts as zero


def client_level_sensitivity(clip_norm: float) -> float:
    """Replace-one-client l2 sensitivity of the sum of clipped updates: ``2C``.

    Every row of :func:`client_level_updates` has computed norm at most ``C``, so the
    replaced client's row moves by at most ``2C`` (attained by opposite updates) and no
    other row changes: exact for the computed rows, no rounding slack.
    """
    return 2.0 * clip_norm


def client_level_aggregate(model: FLModel, params: np.ndarray, X: np.ndarray, y: np.ndarray,
                           bounds: np.ndarray, clip_norm: float, noise_multiplier: float,
                           server_rng: NoiseSource, *, local_steps: int = 1,
                           local_lr: float = 0.1) -> np.ndarray:
    """Client-level DP aggregate ``(sum_i clip_C(Delta_i) + N(0, (2 z C)^2 I)) / K``, (p,).

    ``clip_C(Delta_i)`` is :func:`client_level_updates`'s row ``i``; the noise is
    :func:`client_level_release`'s.
    """
    D = client_level_updates(model, params, X, y, bounds, clip_norm,
                             local_steps=local_steps, local_lr=local_lr)
    return client_level_release(D, clip_norm, noise_multiplier, server_rng)


def client_level_release(updates: np.ndarray, clip_norm: float, noise_multiplier: float,
                         server_rng: NoiseSource) -> np.ndarray:
    """The trusted aggregator's release of clipped updates: ``(sum_i D_i + N(0, (2 z C)^2
    I)) / K`` for the ``K`` rows ``D_i`` of :func:`client_level_updates`, shape (p,).

    Privacy unit: one client, replace-one; sensitivity of the sum
    :func:`client_level_sensitivity` ``2C``; the noise is added once by a trusted
    aggregator (under secure aggregation each client adds a share instead:
    :mod:`dpprecond.secagg.fl`); event per round ``GaussianDpEvent(z)``.
    """
    n_clients = updates.shape[0]
    total = updates.sum(axis=0)
    if noise_multiplier:  # the sum of K clipped updates
        std = noise_multiplier * client_level_sensitivity(clip_norm) * \
            aggregate_inflation(n_clients)
        total = noise.release(total, std, server_rng)
    return total / n_clients


def covariance_sensitivity(row_clip: float) -> float:
    """Replace-one l2 sensitivity of the upper triangle of ``sum_x x^ x^^T``: ``sqrt(2) C_x^2``.

    Attained by orthogonal rows ``a, b`` of norm ``C_x``: ``||a a^T - b b^T||_F =
    sqrt(2) C_x^2`` and the upper triangle keeps all of it (the off-diagonal entries of a
    difference of two rank-one matrices with orthogonal factors vanish).
    """
    return math.sqrt(2.0) * row_clip**2


def clip_feature_rows(X: np.ndarray, row_clip: float) -> np.ndarray:
    """``[X, 1]`` with every row scaled to norm at most ``row_clip`` (a copy), (n, d + 1).

    Overflow-safe for every finite input (:func:`dpprecond.fl.models.clip_rows_safely`).
    """
    Xt = np.hstack([X, np.ones((X.shape[0], 1), dtype=X.dtype)])
    return clip_rows_safely(Xt, row_clip)


def second_moment_releases(X: np.ndarray, bounds: np.ndarray, row_clip: float,
                           noise_multiplier: float,
                           rngs: Sequence[NoiseSource]) -> Iterator[np.ndarray]:
    """Yield every client's released ``C_i`` (``(d + 1, d + 1)``, symmetric), in client order.

    ``C_i = (sum x^ x^^T + E_i) / |D_i|`` with ``x^ = clip_{C_x}([x, 1])`` and ``E_i``
    symmetric with independent ``N(0, (z sqrt(2) C_x^2 g_i)^2)`` entries on and above the
    diagonal (drawn from ``rngs[i]``), ``g_i = gram_inflation(|D_i|)`` covering the
    rounding of the float64 sum. Privacy: a Gaussian mechanism with sensitivity
    :func:`covariance_sensitivity` and noise multiplier ``z`` (event ``Gaussian(z)``).
    A generator, so that only one ``(d + 1)^2`` matrix per client is alive at a time.
    """
    largest = int(np.diff(bounds).max(initial=1))
    # entries up to |D_i| C_x^2, noise std z sqrt(2) C_x^2: both far from float64's limit
    magnitude = math.log10(largest + 10 * noise_multiplier + 1)
    if math.isfinite(row_clip) and 2 * math.log10(row_clip) + magnitude > 300:
        raise ValueError(f"row_clip={row_clip:g} with clients of up to {largest} rows "
                         f"(noise_multiplier={noise_multiplier:g}): the second moment, of "
                         "size up to rows * row_clip^2, would overflow float64; rescale the "
                         "features so that a smaller row_clip bounds them.")
    Xt = clip_feature_rows(X, row_clip)
    d1 = Xt.shape[1]
    std = noise_multiplier * covariance_sensitivity(row_clip) if noise_multiplier else 0.0
    for i in range(len(bounds) - 1):
        lo, hi = bounds[i], bounds[i + 1]
        part = Xt[lo:hi].astype(np.float64, copy=False)  # exact; the sum is float64
        S = part.T @ part
        if std:
            std_i = std * gram_inflation(int(hi - lo))
            E = noise.symmetric_gaussian(d1, std_i, rngs[i], draws="triangle")
            S = noise.release(S, std_i, rngs[i], noise=E)
        yield S / (hi - lo)


def count_sensitivity() -> float:
    """Replace-one l2 sensitivity of a client's count ``#{x : ||g(x)|| <= C}``: 1.

    One replaced record flips at most its own indicator; every other record's norm, and
    every other client's count, is unchanged (the parameters are the same broadcast).
    """
    return 1.0


def record_counts(model: FLModel, params: np.ndarray, X: np.ndarray, y: np.ndarray,
                  bounds: np.ndarray, clip_norm: float) -> np.ndarray:
    """Every client's count of records whose gradient norm is at most ``clip_norm``, (K,).

    The exact statistic of adaptive clipping (:mod:`dpprecond.fl.adaptive_clip`);
    :func:`noisy_counts` releases it.
    """
    norms_of = getattr(model, "per_example_grad_norms", None)
    if norms_of is not None:
        norms = norms_of(params, X, y)
    else:
        norms = np.linalg.norm(model.per_example_grads(params, X, y), axis=1)
    inside = (norms <= clip_norm).astype(np.float64)
    return np.add.reduceat(inside, bounds[:-1]) if len(inside) else np.zeros(len(bounds) - 1)


def noisy_counts(counts: np.ndarray, noise_multiplier: float,
                 rngs: Sequence[NoiseSource]) -> np.ndarray:
    """Every client's released count ``c_i + N(0, (z_b * 1)^2)``, (K,), in client order.

    Record-level, replace-one: the count has l2 sensitivity :func:`count_sensitivity` (1)
    and client ``i`` adds its own noise from ``rngs[i]``, so each release is a Gaussian
    mechanism with noise multiplier ``z_b`` (event ``Gaussian(z_b)``, recorded once per
    round by :mod:`dpprecond.fl.adaptive_clip`). ``z_b = 0`` releases the counts themselves
    (a non-private run).
    """
    std = noise_multiplier * count_sensitivity()
    out = np.empty(len(counts), dtype=np.float64)
    for i, (c, rng) in enumerate(zip(counts, rngs, strict=True)):
        out[i] = float(noise.release(np.array([c]), std, rng)[0]) if std > 0 else float(c)
    return out
