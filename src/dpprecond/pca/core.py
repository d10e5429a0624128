"""The private PCA kernels: Algorithms 1-3 of the spec.

Privacy unit: one row of ``A`` (replace-one adjacency); every row of ``A`` has l2 norm at
most 1 as computed (see :mod:`dpprecond.pca.rows`). The functions here are pure functions of
arrays, noise multipliers and an explicit ``numpy.random.Generator``: they *release* noisy
statistics with the sensitivities below and return what they released; the cost of those
releases is described by :mod:`dpprecond.pca.budget` and computed by
:mod:`dpprecond.accounting`.

Sensitivities (replace-one, rows of norm <= 1; each is pinned by a test):

========================================  ===========================
release                                   l2 sensitivity
========================================  ===========================
upper triangle of ``S = A^T A``           ``sqrt(2)``
upper triangle of ``H = X^T A^T A X``     ``sqrt(2)`` (``X`` orthonormal)
``Z = sum_i a_i c_i^T``, ``||c_i|| <= R`` ``2 R``
selection score ``||(I - X X^T) F||_2``   ``sqrt(2) / h``
========================================  ===========================

Noise std is ``noise_multiplier * sensitivity``; a noise multiplier of ``0`` switches the
noise off (non-private reference runs).

Cost: ``S = A^T A`` is computed once (it is needed by Algorithm 1 and by the score).
An iteration of Algorithm 2 makes one pass over ``A``: ``H = X_t^T S X_t`` from ``S``, and
``Z = sum_i a_i c_i^T`` summed block by block from the clipped rows themselves (every
term of norm <= R, so the rounding bound of the noise covers it; see :func:`run_trials`).
All live trials of the selection are stacked side by side, so each block is multiplied
once by ``[X_1 B_1 ... X_L B_L]`` for all of them.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import linalg

from dpprecond._threads import serial_blas
from dpprecond.clipping import clip_to_radius, safe_row_norms
from dpprecond.noise import NoiseSource, release
from dpprecond.pca.rows import DenseRows, RowSource, rows_t_times, rows_times
from dpprecond.secagg.sums import ClientParts
from dpprecond.selection import draw_trial_count

__all__ = [
    "SQRT2",
    "InitRelease",
    "SelectionResult",
    "TrialSpec",
    "clip_grid",
    "clipped_products",
    "flip_signs",
    "iteration_grid",
    "noise_bound",
    "orthonormalize",
    "private_init",
    "run_trials",
    "score_matrix",
    "select",
    "selection_score",
    "spectrum_and_top_eigvecs",
    "top_eigvecs",
]

logger = logging.getLogger(__name__)

SQRT2 = math.sqrt(2.0)


def flip_signs(X: np.ndarray) -> np.ndarray:
    """Make the entry of largest magnitude of every column positive (deterministic signs)."""
    idx = np.argmax(np.abs(X), axis=0)
    signs = np.sign(X[idx, np.arange(X.shape[1])])
    signs[signs == 0] = 1.0
    return X * signs


def orthonormalize(Z: np.ndarray) -> np.ndarray:
    """Q factor of the thin QR of ``Z`` with columns signed so that ``diag(R) >= 0``."""
    Q, R = np.linalg.qr(Z)
    s = np.sign(np.diag(R))
    s[s == 0] = 1.0
    return Q * s


def _serial_blas() -> Any:
    """Run a d x d eigensolver on one BLAS thread.

    The tridiagonal reduction is a long chain of small level-2 BLAS calls; with OpenBLAS
    threads on a busy machine each call waits for a descheduled thread, and a 784 x 784
    partial ``eigh`` was measured at 4.9 s with 2 threads against 0.06 s with one (2 cores,
    load average 4). The limit is restored on exit.
    """
    return serial_blas()


def top_eigvecs(M: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Top ``n`` eigenpairs of a symmetric matrix, eigenvalues in decreasing order."""
    d = M.shape[0]
    # The "evx" driver (bisection + inverse iteration for a few eigenpairs) is much faster
    # here than a full decomposition for k << d. See _serial_blas for the thread limit.
    with _serial_blas():
        w, V = linalg.eigh(M, subset_by_index=[d - n, d - 1], driver="evx",
                           check_finite=False)
    return w[::-1], V[:, ::-1]


def _evx_scale_free(M: np.ndarray) -> bool:
    """Whether LAPACK's ``dsyevx`` works on ``M`` unscaled (its test ``RMIN <= max|M_ij| <=
    RMAX`` over the lower triangle; ``M`` finite), so that :func:`spectrum_and_top_eigvecs`
    can follow its steps."""
    tiny, eps = np.finfo(np.float64).tiny, np.finfo(np.float64).eps
    smlnum = tiny / eps  # LAPACK's SMLNUM = safe minimum / precision
    rmin = math.sqrt(smlnum)
    rmax = min(math.sqrt(1.0 / smlnum), 1.0 / math.sqrt(math.sqrt(tiny)))
    anrm = float(np.max(np.abs(np.tril(M)))) if M.size else 0.0
    return math.isfinite(anrm) and (anrm == 0.0 or rmin <= anrm <= rmax)


def spectrum_and_top_eigvecs(M: np.ndarray,
                             n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """All eigenvalues of a symmetric matrix and its top ``n`` eigenpairs, from one reduction.

    The same numbers as ``np.linalg.eigvalsh(M)[::-1]`` followed by
    ``top_eigvecs(M, n)``, bit for bit, at the cost of one tridiagonal reduction instead of
    two: the steps of LAPACK's ``dsyevx`` (the driver of :func:`top_eigvecs`) are made
    here one by one with its workspace sizes (``dsytrd`` of the lower triangle; ``dstebz``
    and ``dstein`` for the top ``n`` eigenpairs of the tridiagonal matrix; ``dormtr``'s
    ``dormqr`` back to ``M``'s basis; ``dsyevx``'s final sort), and the whole spectrum is
    ``dsterf`` of the same tridiagonal matrix (what ``eigvalsh`` computes). Where
    ``dsyevx`` would take another path (``n >= d``, a matrix it would rescale, or a
    non-finite one), the two calls are made as they are. One BLAS thread
    (:func:`_serial_blas`).

    Returns
    -------
    spectrum : ndarray of shape (d,)
        All eigenvalues, decreasing.
    w, V : ndarray of shape (n,) and (d, n)
        The top ``n`` eigenpairs, eigenvalues decreasing.
    """
    M = np.asarray(M, dtype=np.float64)
    d = M.shape[0]
    if not 1 <= n < d or not _evx_scale_free(M):
        with _serial_blas():
            spectrum = np.linalg.eigvalsh(M)[::-1]
        w, V = top_eigvecs(M, n)
        return spectrum, w, V
    lapack = linalg.lapack
    with _serial_blas():
        lwork = int(lapack.dsyevx_lwork(d, lower=1)[0])
        # dsyevx's work array: tau, e, d (3 d entries), then dsytrd's and dormtr's space.
        c, diag, off, tau, info = lapack.dsytrd(M, lower=1, lwork=lwork - 3 * d)
        if info == 0:
            spectrum, info = lapack.dsterf(diag, off)
        if info == 0:
            m, w, iblock, isplit, info = lapack.dstebz(diag, off, 2, 0.0, 0.0, d - n + 1, d,
                                                      0.0, b"B")
        if info == 0 and m == n:
            w = w[:n].copy()
            Z, info = lapack.dstein(diag, off, w, iblock, isplit)
        if info == 0 and m == n:
            Q, _, info = lapack.dormqr(b"L", b"N", c[1:, :-1], tau, Z[1:], lwork - d)
    if info != 0 or m != n:  # not expected; the library drivers say what went wrong
        with _serial_blas():
            spectrum = np.linalg.eigvalsh(M)[::-1]
        w, V = top_eigvecs(M, n)
        return spectrum, w, V
    V = np.vstack([Z[:1], Q])
    for j in range(n - 1):  # dsyevx's selection sort (eigenvalues increasing)
        i, low = -1, w[j]
        for jj in range(j + 1, n):
            if w[jj] < low:
                i, low = jj, w[jj]
        if i >= 0:
            w[i], w[j] = w[j], low
            V[:, [i, j]] = V[:, [j, i]]
    return np.asarray(spectrum)[::-1], w[::-1], V[:, ::-1]


def noise_bound(std: float, dim: int, beta: float = 0.01) -> float:
    """High-probability bound on ``||W||_2`` for symmetric Gaussian ``W`` of entry std ``std``.

    (choice) ``e_w = 2 std sqrt(dim) + std sqrt(2 ln(1/beta))``: the expected norm of a
    Wigner matrix is at most ``2 std sqrt(dim)`` and the norm is ``std``-Lipschitz in the
    Gaussian entries (Gaussian concentration), so ``P(||W||_2 > e_w) <= beta``.
    """
    return 2.0 * std * math.sqrt(dim) + std * math.sqrt(2.0 * math.log(1.0 / beta))


# --------------------------------------------------------------------------------------
# Algorithm 1
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class InitRelease:
    """Output of Algorithm 1 (everything here is public once released).

    Attributes
    ----------
    X0 : ndarray of shape (d, k)
        Top-k eigenvectors of ``M = A^T A + W``.
    eigvals : ndarray of shape (min(k + 1, d),)
        The largest eigenvalues of ``M``, decreasing.
    noise_std : float
        Entry std of ``W``: ``z0 * sqrt(2)``.
    M : ndarray of shape (d, d) or None
        The released matrix itself (kept so that a later release can be combined with it).
    """

    X0: np.ndarray
    eigvals: np.ndarray
    noise_std: float
    M: np.ndarray | None = None


def private_init(S: np.ndarray, k: int, z0: float, rng: NoiseSource) -> InitRelease:
    """Algorithm 1: release ``M = A^T A + W`` and take its top-k eigenvectors.

    Privacy: the upper triangle (with diagonal) of ``S = A^T A`` has replace-one l2
    sensitivity ``sqrt(2)`` (``a a^T - b b^T`` for unit rows ``a`` ⟂ ``b``); ``W`` is
    symmetric with i.i.d. ``N(0, (z0 sqrt(2))^2)`` upper triangle, so this is the Gaussian
    mechanism with noise multiplier ``z0`` (event ``GaussianDpEvent(z0)``). Analyze Gauss
    is this release with the whole budget.

    Parameters
    ----------
    S : ndarray of shape (d, d)
        ``A^T A``.
    k : int
        Number of components.
    z0 : float
        Noise multiplier (``0``: no noise).
    rng : numpy.random.Generator
        Noise source.
    """
    d = S.shape[0]
    std = z0 * SQRT2
    M = release(S, std, rng, symmetric=True, sensitivity=SQRT2)
    w, V = top_eigvecs(M, min(k + 1, d))
    return InitRelease(X0=V[:, :k].copy(), eigvals=w, noise_std=std, M=M)


def refine_init(S: np.ndarray, init: InitRelease, z: float,
                rng: NoiseSource) -> InitRelease:
    """A second release of ``A^T A``, averaged with the first by inverse variance.

    Privacy: the same Gaussian mechanism as :func:`private_init` (sensitivity ``sqrt(2)``,
    noise multiplier ``z``, event ``GaussianDpEvent(z)``). Combining the two releases is
    post-processing; with weights ``1/s_i^2`` the average is ``A^T A`` plus symmetric
    Gaussian noise of entry variance ``1 / (1/s_0^2 + 1/s_1^2)``: the estimate a single
    release would give with the two Renyi budgets added.
    """
    if init.M is None:
        raise ValueError("refine_init needs the released matrix (InitRelease.M).")
    k = init.X0.shape[1]
    d = S.shape[0]
    std = z * SQRT2
    M2 = release(S, std, rng, symmetric=True, sensitivity=SQRT2)
    if init.noise_std == 0 or std == 0:
        M = M2 if std == 0 else init.M
        combined_std = 0.0
    else:
        w0, w1 = 1.0 / init.noise_std**2, 1.0 / std**2
        M = (w0 * init.M + w1 * M2) / (w0 + w1)
        combined_std = 1.0 / math.sqrt(w0 + w1)
    w, V = top_eigvecs(M, min(k + 1, d))
    return InitRelease(X0=V[:, :k].copy(), eigvals=w, noise_std=combined_std, M=M)


# --------------------------------------------------------------------------------------
# Algorithm 2 (batched over trials)
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TrialSpec:
    """One run of Algorithm 2: clip radius, iterations and noise multipliers.

    ``zH`` and ``zZ`` are per iteration; ``rng`` is the trial's own stream, so the noise of
    a trial does not depend on how trials are batched.
    """

    clip_radius: float
    n_iter: int
    zH: float
    zZ: float
    rng: NoiseSource
    h_floor_factor: float = 4.0


def _preconditioner(H: np.ndarray, floor: float) -> tuple[np.ndarray, float]:
    """``H^{-1/2}`` from ``eigh(H)`` with eigenvalues raised to ``floor`` (post-processing).

    Returns the matrix and its spectral norm ``1 / sqrt(min eigenvalue)``.
    """
    w, V = np.linalg.eigh(H)
    w = np.maximum(w, floor)
    return (V / np.sqrt(w)) @ V.T, float(1.0 / np.sqrt(w[0]))


def clipped_products(block: np.ndarray, XB: np.ndarray, radii: np.ndarray, k: int,
                     scale: np.ndarray | None = None) -> np.ndarray:
    """One block's terms of ``Z_j = sum_i a_i c_ij^T`` for stacked trials, and clip counts.

    ``XB = [X_1 B_1 ... X_m B_m]`` (d x mk, public), ``radii`` the trials' ``R_j``; with
    ``scale`` the rows are ``scale_i block_i`` (the row-scaled fast path of
    :meth:`ClippedRows.block_sum`). ``c_ij = clip_Rj(B_j X_j^T a_i)`` with
    :func:`dpprecond.clipping.clip_to_radius` (overflow-safe, ``||c_ij|| <= R_j`` as
    computed). Returns a flat array: the ``d x mk`` sum, then the ``m`` counts of clipped
    rows (a diagnostic, not a release).
    """
    m = radii.size
    Y = np.ascontiguousarray(rows_times(block, XB))  # one row of Y3 per (row, trial)
    if scale is not None:
        Y *= scale[:, None]
    Y3 = Y.reshape(-1, k)  # one row per (row, trial)
    nu, pre = safe_row_norms(Y3)
    R = np.tile(radii, block.shape[0])
    post = clip_to_radius(nu, pre, R)
    C = Y3 * pre[:, None]
    with np.errstate(under="ignore"):
        C *= post[:, None]
    C = C.reshape(block.shape[0], m * k)
    if scale is not None:
        C *= scale[:, None]
    with np.errstate(divide="ignore", over="ignore"):
        counts = (nu > R * pre).reshape(-1, m).sum(axis=0).astype(np.float64)
    return np.concatenate([rows_t_times(block, C).ravel(), counts])


def _clipped_sums(rows: RowSource, XB: np.ndarray, radii: np.ndarray,
                  k: int) -> tuple[Any, np.ndarray]:
    """``(Z, clipped counts)`` of :func:`clipped_products` summed over all rows (one pass)."""
    d, mk = XB.shape
    size = d * mk + radii.size
    if hasattr(rows, "block_sum"):
        flat = rows.block_sum(clipped_products, XB, radii, k, shape=(size,), row_scaled=True)
        if isinstance(flat, ClientParts):  # secure aggregation: Z stays with the clients;
            counts = flat[d * mk:].total()  # the clip counts are a diagnostic, never released
            return flat[:d * mk].reshape(d, mk), counts.astype(np.int64)
    else:  # a RowSource without its own pass: blocks read with rows.rows
        n = rows.shape[0]
        flat = np.zeros(size)
        for lo in range(0, n, 8192):
            flat += clipped_products(rows.rows(np.arange(lo, min(n, lo + 8192))), XB, radii, k)
    return flat[:d * mk].reshape(d, mk), flat[d * mk:].astype(np.int64)


def run_trials(A: np.ndarray | RowSource, S: np.ndarray, X0: np.ndarray,
               trials: list[TrialSpec], *,
               max_batch_columns: int = 1024) -> tuple[list[np.ndarray], np.ndarray]:
    """Algorithm 2 for several independent trials from the shared start ``X0``, batched.

    For ``t = 0 .. T-1`` (per trial, ``X_t`` orthonormal d x k):

    1. Release ``H = X_t^T A^T A X_t + E_t``, ``E_t`` symmetric with entry std
       ``zH sqrt(2)`` (sensitivity ``sqrt(2)``: ``y y^T`` with ``||y|| = ||X_t^T a|| <= 1``).
    2. ``B = H^{-1/2}`` with eigenvalues of ``H`` raised to the public floor
       ``h_floor_factor * zH * sqrt(2)`` (post-processing of the release; times
       ``sqrt(K)`` in federated PCA where ``K`` clients each add their own noise).
    3. ``y_i = a_i^T X_t B``; clip ``c_i = y_i min(1, R / ||y_i||)``.
    4. Release ``Z = A^T C + G_t``, ``G_t`` i.i.d. ``N(0, (2 R zZ)^2)`` (sensitivity ``2R``:
       ``a c^T - a' c'^T`` with ``||a||, ||a'|| <= 1``, ``||c||, ||c'|| <= R``).
    5. ``X_{t+1}`` = Q of the thin QR of ``Z`` (signs fixed).

    Computation: ``H`` uses ``X_t^T S X_t`` with the precomputed ``S = A^T A`` (its per-row
    terms ``y y^T`` have norm <= 1, the scale of the rounding bound). ``Z`` is summed from
    the clipped rows themselves, ``sum_i a_i c_i^T``, one block of rows at a time
    (:func:`clipped_products`), so every term has norm <= ``R`` and the float64 sum is within
    the rounding bound the noise is inflated by (:meth:`ClippedRows.rounding_slack`); it is
    never formed as ``S X B`` minus a correction over the clipped rows, whose per-row terms
    reach ``||B||_2`` and whose rounding that bound does not cover (issue 17, hole 9). One
    pass over ``A`` per iteration serves every live trial: each block is multiplied once by
    the stacked ``[X_1 B_1 ... X_L B_L]`` (trials sorted by ``T``; the live ones are those
    with ``T > t``; groups of at most ``max_batch_columns`` columns).

    Returns
    -------
    X : list of ndarray (d, k)
        Final iterate of each trial, in the order of ``trials``.
    n_clipped_last : ndarray of int
        Rows clipped in each trial's last iteration (diagnostic; not a private release).
    """
    rows = DenseRows(A) if isinstance(A, np.ndarray) else A
    k = X0.shape[1]
    L = len(trials)
    out: list[np.ndarray] = [X0.copy() for _ in range(L)]
    clipped_last = np.zeros(L, dtype=np.int64)
    order = sorted(range(L), key=lambda i: -trials[i].n_iter)
    per_group = max(1, max_batch_columns // k)
    groups = [order[i:i + per_group] for i in range(0, L, per_group)]
    for group in groups:
        t_max = trials[group[0]].n_iter
        for t in range(t_max):
            live = [i for i in group if trials[i].n_iter > t]
            Xs = np.concatenate([out[i] for i in live], axis=1)  # d x mk
            SX = S @ Xs
            XB = np.empty_like(Xs)
            for j, i in enumerate(live):
                tr = trials[i]
                sl = slice(j * k, (j + 1) * k)
                H = Xs[:, sl].T @ SX[:, sl]
                H = 0.5 * (H + H.T)
                sH = tr.zH * SQRT2
                H = release(H, sH, tr.rng, symmetric=True, sensitivity=SQRT2)
                amp = float(getattr(tr.rng, "noise_amplification", 1.0))  # LocalNoise
                floor = tr.h_floor_factor * sH * amp if sH > 0 else 1e-12 * max(np.trace(H), 1e-300)
                B, _ = _preconditioner(H, floor)
                XB[:, sl] = Xs[:, sl] @ B
            radii = np.array([trials[i].clip_radius for i in live])
            # Z = sum_i a_i c_i^T from the clipped rows themselves: every per-row term has
            # norm <= R (never S X B minus a correction, whose terms reach ||B||_2)
            Z, clipped_count = _clipped_sums(rows, XB, radii, k)
            for j, i in enumerate(live):
                tr = trials[i]
                Zj = Z[:, j * k:(j + 1) * k]
                if tr.zZ > 0:
                    sZ = 2.0 * tr.clip_radius * tr.zZ
                    Zj = release(Zj, sZ, tr.rng, sensitivity=2.0 * tr.clip_radius)
                out[i] = orthonormalize(Zj)
                clipped_last[i] = int(clipped_count[j])
    return out, clipped_last


# --------------------------------------------------------------------------------------
# Algorithm 3
# --------------------------------------------------------------------------------------


def clip_grid(n: int, k: int) -> np.ndarray:
    """(choice) Powers of two from ``sqrt(k/n)/2`` up to ``2`` (public: n, k only)."""
    lo = math.ceil(math.log2(math.sqrt(k / n) / 2.0))
    return 2.0 ** np.arange(lo, 2)


def iteration_grid(t_max: int = 64) -> np.ndarray:
    """(choice) ``{0, 1, 2, 4, ..., t_max}``; ``T = 0`` is the Gram-refinement fallback."""
    ts = [0]
    t = 1
    while t <= t_max:
        ts.append(t)
        t *= 2
    return np.array(ts, dtype=np.int64)


def score_matrix(S: np.ndarray, tau_lo: float, tau_hi: float) -> np.ndarray:
    """``G = U_m diag(phi(lambda))`` so that ``phi(S) = G U_m^T`` (eigenvalues > tau_lo).

    ``phi(x) = 0`` for ``x <= tau_lo``, ``(x - tau_lo)/h`` between, ``1`` for ``x >= tau_hi``
    with ``h = tau_hi - tau_lo > 0``. Only eigenpairs with ``phi > 0`` are kept, so that
    ``||(I - X X^T) phi(S)||_2 = ||(I - X X^T) G||_2``.
    """
    d = S.shape[0]
    with _serial_blas():
        w, U = linalg.eigh(S, subset_by_value=(tau_lo, np.inf), driver="evx",
                           check_finite=False)
    if w.size == 0:
        return np.zeros((d, 0))
    f = np.clip((w - tau_lo) / (tau_hi - tau_lo), 0.0, 1.0)
    return U * f


def selection_score(G: np.ndarray, X: np.ndarray) -> float:
    """``||(I - X X^T) G||_2`` (exact score of a candidate ``X``)."""
    if G.shape[1] == 0:
        return 0.0
    R = G - X @ (X.T @ G)
    return float(np.linalg.norm(R, 2))


@dataclass(frozen=True)
class SelectionResult:
    """Released output of Algorithm 3 plus diagnostics.

    ``X``, ``clip_radius``, ``n_iter`` and ``noisy_score`` are the release. ``n_trials`` (the
    geometric number of trials) and ``n_clipped_last`` are private diagnostics: the
    repeat-and-select guarantee assumes the number of trials stays hidden, so do not
    publish them.
    """

    X: np.ndarray
    clip_radius: float
    n_iter: int
    noisy_score: float
    n_trials: int
    n_clipped_last: int
    early_exit: bool
    tau_lo: float
    tau_hi: float


def select(A: np.ndarray | RowSource, S: np.ndarray, init: InitRelease, *, z_run: float,
           mean_trials: float, score_share: float, h_share: float,
           radii: np.ndarray, iters: np.ndarray, rng: np.random.Generator,
           beta: float = 0.01, h_floor_factor: float = 4.0,
           max_batch_columns: int = 1024) -> SelectionResult:
    """Algorithm 3: private selection of (R, T) by repeat-and-select (Papernot-Steinke).

    Thresholds from the released init: ``e_w`` = :func:`noise_bound` of ``W``,
    ``tau_hi = lam_k - e_w``, ``tau_lo = lam_{k+1} + e_w``, ``h = tau_hi - tau_lo``. If
    ``h <= 0`` the init ``X0`` is returned at once (post-processing of the init: no further
    budget is spent; ``early_exit=True``).

    Otherwise ``K ~ Geometric(1/mean_trials)`` trials (support 1, 2, ...); each draws
    ``(R, T)`` uniformly from the grids, runs Algorithm 2 from ``X0`` with fresh noise and
    the noise multipliers of :func:`dpprecond.pca.budget.trial_multipliers` (total Renyi
    budget ``1/z_run^2`` per trial; a trial with ``T = 0`` instead spends its budget beyond
    the score on a second release of ``A^T A`` averaged with the init's, see
    :func:`refine_init`), and releases a noisy score
    ``||(I - X X^T) phi(A^T A)||_2 + N(0, (z_score sqrt(2)/h)^2)``. The score has
    sensitivity ``sqrt(2)/h``: ``phi`` is ``(1/h)``-Lipschitz, hence ``(1/h)``-Lipschitz in
    Frobenius norm on symmetric matrices, ``||a a^T - b b^T||_F <= sqrt(2)``, and the score
    is 1-Lipschitz in ``phi(A^T A)`` in spectral, hence Frobenius, norm. The trial of least
    noisy score is released. Accounting: ``RepeatAndSelectDpEvent(Gaussian(z_run),
    mean_trials, 1)`` composed after the init's event.
    """
    from dpprecond.pca.budget import trial_multipliers

    d, k = init.X0.shape
    lam = init.eigvals
    e_w = noise_bound(init.noise_std, d, beta)
    lam_k1 = lam[k] if lam.size > k else -np.inf
    tau_hi = float(lam[k - 1] - e_w)
    tau_lo = float(lam_k1 + e_w)
    if not np.isfinite(tau_lo) or tau_hi - tau_lo <= 0:
        logger.info("Selection: threshold gap h=%.4g <= 0; returning the private init "
                    "(only the init's budget is spent).", tau_hi - tau_lo)
        return SelectionResult(init.X0, math.nan, 0, math.nan, 0, 0, True, tau_lo, tau_hi)
    h = tau_hi - tau_lo
    ctrl, trial_root = rng.spawn(2)
    n_trials = draw_trial_count(ctrl, mean_trials, "geometric")  # the shared layer
    R_pick = ctrl.choice(radii, size=n_trials)
    T_pick = ctrl.choice(iters, size=n_trials)
    streams = trial_root.spawn(n_trials)
    specs, z_scores, z_grams = [], [], []
    for R, T, s in zip(R_pick, T_pick, streams, strict=True):
        zs = trial_multipliers(z_run, int(T), score_share=score_share, h_share=h_share)
        specs.append(TrialSpec(float(R), int(T), zs["zH"], zs["zZ"], s, h_floor_factor))
        z_scores.append(zs["z_score"])
        z_grams.append(zs["z_gram"])
    Xs, clipped = run_trials(A, S, init.X0, specs, max_batch_columns=max_batch_columns)
    for i, spec in enumerate(specs):
        if spec.n_iter == 0:  # the fallback: Analyze Gauss with the init's and this budget
            Xs[i] = refine_init(S, init, z_grams[i], spec.rng).X0
    G = score_matrix(S, tau_lo, tau_hi)
    noisy = np.empty(n_trials)
    for i, (X, spec) in enumerate(zip(Xs, specs, strict=True)):
        noisy[i] = selection_score(G, X)
        if z_scores[i] > 0:
            s_score = z_scores[i] * SQRT2 / h
            noisy[i] = release(float(noisy[i]), s_score, spec.rng)
    best = int(np.argmin(noisy))
    return SelectionResult(Xs[best], specs[best].clip_radius, specs[best].n_iter,
                           float(noisy[best]), n_trials, int(clipped[best]), False,
                           tau_lo, tau_hi)
