"""Private PCA ``method="auto"``: a partial release of ``A^T A``, then the better completion.

Privacy unit: one row of ``A`` (replace-one adjacency); every row has l2 norm at most 1 as
computed (:mod:`dpprecond.pca.rows`). Given one Gaussian's worth of privacy, noise
multiplier ``z`` (precision ``1/z^2``, calibrated exactly for ``(epsilon, delta)`` by
:func:`dpprecond.pca.budget.plan_auto`), the method spends that precision in shares:

1. ``M1 = A^T A + W1`` (upper triangle; sensitivity ``sqrt(2)``; share ``init_share``).
   Its eigenvalues and top-k eigenvectors ``X0`` are public from here on.
2. A probe: the histogram of the preconditioned row norms ``r_i = ||B0 X0^T a_i||`` (in
   units of ``sqrt(k/n)``), ``B0 = (X0^T M1 X0)^{-1/2}`` (post-processing of ``M1``), on
   public bins, with each bin's sum of rest energies. Replace-one moves one row from one
   bin to another: sensitivity 2 (:func:`probe`); share ``probe_share``. Not released
   when no outcome of it can change the choice (:func:`choice_without_probe`, from
   ``M1``'s eigenvalues: some but not all of the top k stand out of the noise, or even
   the iteration's best case loses); its share then goes to Analyze Gauss.
3. A rule (:func:`predict_errors`) computed from ``M1``'s eigenvalues, the noisy histogram
   and public ``(n, d, k, z)`` only predicts the error of each completion and picks one:

   a. *Analyze Gauss*: a second release ``M2 = A^T A + W2`` with the rest of the
      precision, averaged with ``M1`` by inverse variance; the average is ``A^T A`` plus
      one symmetric Gaussian of precision ``(init_share + rest)/(2 z^2)`` per entry. The
      two noises are drawn coupled (:func:`dpprecond.noise.coupled_symmetric_gaussian`)
      for the whole precision ``1/(2 z^2)``: without the probe, this branch returns, for
      the same random stream, exactly Analyze Gauss at multiplier ``z`` (its own noise);
      after a probe, ``M2`` adds an independent draw for the probe's share.
   b. *Preconditioned clipped iteration* (:func:`clipped_step`), ``T`` times from ``X0``:
      ``B_t = (X_t^T M1 X_t)^{-1/2}`` (post-processing of ``M1``: no release), clip
      ``c_i = clip_R(B_t X_t^T a_i)`` and release ``Z_t = sum_i a_i c_i^T + G_t``
      (sensitivity ``2R``); the rest of the precision is split over the ``T`` releases
      with weights ``2^t`` (the last, which sets the error, gets the most).

Accounting: both branches release Gaussians whose precisions add up to ``1/z^2``
(``init + probe + rest``, or ``init + (1 - init)`` without the probe), so each branch is
exactly the Gaussian mechanism with multiplier ``z`` (adaptive composition of Gaussian
mechanisms, Dong, Roth and Su 2019, Cor. 3.3): the branch choice, a function of released
values, changes nothing. The returned ``DpEvent`` lists the releases actually made; its
epsilon (PLD, exact) equals the target in every branch. No budget is left unspent.

Everything in the returned ``info`` is computed from the releases and public values (no
clipped-row counts, no fit time).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from dp_accounting import dp_event

from dpprecond._validation import (
    SeedLike,
    check_choice,
    check_delta,
    check_fraction,
    check_int,
    check_positive,
    check_random_state,
)
from dpprecond.accounting import compose, epsilon_of, gaussian
from dpprecond.clipping import clip_to_radius, row_sq_norms, safe_row_norms
from dpprecond.noise import (
    NoiseSource,
    coupled_symmetric_gaussian,
    is_deferred,
    is_distributed,
    release,
    symmetric_gaussian,
)
from dpprecond.pca.core import (
    SQRT2,
    _serial_blas,
    orthonormalize,
    spectrum_and_top_eigvecs,
    top_eigvecs,
)
from dpprecond.pca.rows import (
    RowSource,
    clip_unit_rows,
    noise_inflation,
    rows_t_times,
    rows_times,
)

__all__ = [
    "AUTO_DEFAULTS",
    "HIST_EDGES",
    "RADIUS_GRID",
    "AutoResult",
    "Prediction",
    "Spectrum",
    "ag_error",
    "check_auto_options",
    "choice_without_probe",
    "clipped_step",
    "clipping_factors",
    "estimate_spectrum",
    "fit_auto",
    "iteration_error",
    "iteration_weights",
    "predict_errors",
    "probe",
    "rescaled_gram",
    "row_scale",
]

#: Edges of the probe histogram, in units of ``sqrt(k/n)`` (public): ``2^(j/2)`` from
#: 2^-10 to 64, plus an underflow and an overflow bin (the low bins resolve rows far below
#: their bound seen through a noise-driven ``X0``, :func:`row_scale`).
HIST_EDGES = 2.0 ** (np.arange(-20, 13) / 2.0)
#: A value standing for each bin (geometric centres; the overflow bin counts as 64).
HIST_REPS = np.concatenate([[HIST_EDGES[0] / 2.0], np.sqrt(HIST_EDGES[:-1] * HIST_EDGES[1:]),
                            [HIST_EDGES[-1]]])
#: At most this share of the rows may lie above the rows' scale ``tau``.
RESCALE_QUANTILE = 0.01
#: The diagnostic release at the rows' scale is made only if its noise, relative to the
#: data, is at most this share of ``M1``'s: ``tau^2 sqrt(init_share / rescale_share)``.
RESCALE_GAIN = 0.5
#: Clip radii the rule chooses from, in units of the rows' RMS preconditioned norm.
RADIUS_GRID = 2.0 ** np.arange(-3, 6)

#: Options of :func:`fit_auto` and their defaults.
AUTO_DEFAULTS: dict[str, Any] = {
    "init_share": 0.5,
    "probe_share": 0.01,
    "n_iter": None,
    "iter_choices": (2, 3),
    "switch_ratio": 0.9,
    "iter_calibration": 1.15,
    "branch": "rule",
    "clip_radius": None,
    "floor_factor": 4.0,
    "count_threshold": 3.0,
    "rescale_share": 0.02,
    "add_noise": True,
}


# --------------------------------------------------------------------------------------
# Passes over the rows
# --------------------------------------------------------------------------------------


def _block_sum(rows: RowSource, func: Any, *args: Any, shape: tuple[int, ...],
               row_sq: bool = False) -> np.ndarray:
    """``sum_b func(A_b, *args)`` over row blocks: the rows' own pass when they have one
    (on a dask cluster, on the workers), else blocks read with ``rows.rows``. The block
    functions below also take raw rows with their scale factors (``row_scaled``); with
    ``row_sq``, also the raw rows' squared norms (``sq``)."""
    if hasattr(rows, "block_sum"):
        return rows.block_sum(func, *args, shape=shape, row_scaled=True, row_sq=row_sq)
    out = np.zeros(shape)
    n = rows.shape[0]
    for lo in range(0, n, 8192):
        out += func(rows.rows(np.arange(lo, min(n, lo + 8192))), *args)
    return out


def _block_probe(block: np.ndarray, X: np.ndarray, B: np.ndarray, unit: float,
                 edges: np.ndarray, scale: np.ndarray | None = None,
                 sq: np.ndarray | None = None) -> np.ndarray:
    """One block's term of the probe: ``[counts; rest energies]`` per bin of ``r_i / unit``.

    ``r_i = ||B X^T a_i||``; the rest energy of a row is ``||a_i||^2 - ||X^T a_i||^2``
    clamped to ``[0, 1]`` as computed (``X`` orthonormal, ``||a_i|| <= 1``), so each row
    adds one indicator and one value in ``[0, 1]`` to its bin. One product with the block
    (``X^T a_i``), then a k x k one; ``sq`` (the squared norms of the rows of ``block``,
    :func:`dpprecond.clipping.row_sq_norms`, when the pass kept them) spares the block's
    second read.
    """
    P = rows_times(block, X)
    if scale is not None:  # the rows are scale_i * block_i (raw rows on the fast path)
        P *= scale[:, None]
    Y = P @ B
    nu, pre = safe_row_norms(Y)
    with np.errstate(divide="ignore", over="ignore"):
        r = np.where(pre == 1.0, nu, nu / pre) / unit
    raw_sq = row_sq_norms(block) if sq is None else sq
    sq = raw_sq
    if scale is not None:
        with np.errstate(over="ignore"):
            s2 = scale * scale
        if np.all(np.isfinite(s2)):
            sq = raw_sq * s2
        else:  # a tiny public bound (scale > 1e154, e.g. on a zero row): scale the norm
            nu_b, pre_b = safe_row_norms(block, raw_sq)  # first, then square: <= 1, never
            sq = (np.where(pre_b == 1.0, nu_b, nu_b / pre_b) * scale) ** 2  # inf * 0
    rest = np.clip(sq - np.einsum("ij,ij->i", P, P), 0.0, 1.0)
    idx = np.searchsorted(edges, r, side="right")
    nb = edges.size + 1
    return np.concatenate([np.bincount(idx, minlength=nb).astype(np.float64),
                           np.bincount(idx, weights=rest, minlength=nb)])


def _block_rescaled_gram(block: np.ndarray, tau: float,
                         scale: np.ndarray | None = None) -> np.ndarray:
    """One block's term of ``sum_i c_i c_i^T`` with ``c_i = clip_1(a_i / tau)``.

    The rows are divided by the public ``tau`` and clipped to norm 1 as computed
    (:func:`dpprecond.clipping.clip_to_radius`), so each term has norm at most 1.
    """
    factor = (scale / tau)[:, None] if scale is not None else 1.0 / tau
    with np.errstate(over="ignore", under="ignore"):
        Y = block * factor
    Y, _ = clip_unit_rows(Y)
    return Y.T @ Y


def _block_clipped_step(block: np.ndarray, XB: np.ndarray, radius: float,
                        scale: np.ndarray | None = None) -> np.ndarray:
    # With ``scale``, the rows are a_i = scale_i block_i: c_i is computed from a_i XB and
    # a_i c_i^T = block_i (scale_i c_i)^T, so the block is never copied.
    Y = rows_times(block, XB)
    if scale is not None:
        Y *= scale[:, None]
    nu, pre = safe_row_norms(Y)
    post = clip_to_radius(nu, pre, radius)
    C = Y * pre[:, None]
    with np.errstate(under="ignore"):
        C *= post[:, None]
    if scale is not None:
        C *= scale[:, None]
    return rows_t_times(block, C)


def probe(rows: RowSource, X: np.ndarray, B: np.ndarray, unit: float, edges: np.ndarray,
          std: float, rng: NoiseSource) -> tuple[np.ndarray, np.ndarray]:
    """Release the probe: per bin of ``r_i / unit`` on ``edges``, the number of rows and the
    sum of their rest energies ``||a_i||^2 - ||X^T a_i||^2`` (one pass over ``A``).

    ``r_i = ||B X^T a_i||`` with ``X`` (orthonormal) and ``B`` public. Replace-one moves one
    row from a bin ``u`` to a bin ``v``: the counts change by ``e_v - e_u`` and the energies
    by ``-e e_u + e' e_v`` with ``e, e'`` in ``[0, 1]``, so the released vector (counts
    and energies together) has l2 sensitivity ``sqrt(1 + 1 + e^2 + e'^2) <= 2``; ``std``
    must be ``noise_multiplier * 2``. Each client's or worker's blocks are summed where
    they are (:func:`_block_sum`).

    Returns
    -------
    counts, energies : ndarray of shape (edges.size + 1,)
        The released (noisy) values.
    """
    nb = edges.size + 1
    total = _block_sum(rows, _block_probe, X, B, unit, edges, shape=(2 * nb,), row_sq=True)
    out = release(total, std, rng, sensitivity=2.0)
    return out[:nb], out[nb:]


def row_scale(counts: np.ndarray, n: int, d: int, std: float, unit: float,
              precision_top: float, quantile: float = RESCALE_QUANTILE) -> float:
    """The rows' scale ``tau`` read from the probe when ``X0`` is noise-driven (post-processing).

    With ``lambda_k`` hidden, ``X0`` (the top eigenvectors of ``M1``) is about independent
    of the data, so ``r_i^2 = sum_j (x_j^T a_i)^2 / nu_j`` is about ``||a_i||^2 H / d``
    with ``H = sum_j 1 / nu_j`` (``precision_top``; ``nu_j`` the eigenvalues of
    ``X0^T M1 X0`` as floored). ``tau`` is the norm matching the smallest bin edge with at
    most ``quantile * n`` rows above it (counted with a margin of two noise stds of the
    summed counts), rounded up to the grid ``2^(j/4)``; 1 (the public bound) if there is
    none. A small ``k`` spreads ``r`` by the chi distribution, which only raises ``tau``.
    """
    above = np.cumsum(counts[::-1])[::-1]  # above[j]: rows in bins j, j+1, ...
    for j, edge in enumerate(HIST_EDGES):
        nb = HIST_EDGES.size - j  # bins j+1 .. last
        if above[j + 1] + 2.0 * std * math.sqrt(nb) <= quantile * n:
            tau = edge * unit * math.sqrt(d / max(precision_top, 1e-300))
            return float(min(1.0, 2.0 ** (math.ceil(4.0 * math.log2(tau)) / 4.0)))
    return 1.0


def rescaled_gram(rows: RowSource, tau: float) -> np.ndarray:
    """``sum_i c_i c_i^T`` with ``c_i = clip_1(a_i / tau)`` (one pass; not a release).

    Released with symmetric Gaussian noise it has the Gram matrix's sensitivity
    ``sqrt(2)`` (every ``c_i`` has norm at most 1 as computed).
    """
    d = rows.shape[1]
    S = _block_sum(rows, _block_rescaled_gram, tau, shape=(d, d))
    return 0.5 * (S + S.T)


def clipped_step(rows: RowSource, X: np.ndarray, B: np.ndarray, radius: float,
                 noise_std: float, rng: NoiseSource) -> np.ndarray:
    """Release ``Z = sum_i a_i c_i^T + G`` with ``c_i = clip_R(B X^T a_i)`` (one pass).

    Privacy: ``X`` and ``B`` are public (functions of earlier releases); each row
    contributes ``a_i c_i^T`` with ``||a_i|| <= 1`` and ``||c_i|| <= R`` as computed
    (:func:`dpprecond.clipping.clip_to_radius`), so replacing one row changes ``Z`` by at
    most ``2R`` in Frobenius norm. ``G`` is i.i.d. ``N(0, noise_std^2)`` with
    ``noise_std = 2 R z``: the Gaussian mechanism with multiplier ``z``.

    Returns the released ``Z`` (d x k).
    """
    d, k = X.shape
    Z = _block_sum(rows, _block_clipped_step, X @ B, radius, shape=(d, k))
    return release(Z, noise_std, rng, sensitivity=2.0 * radius)


def _preconditioner(H: np.ndarray, floor: float) -> np.ndarray:
    """``H^{-1/2}`` with eigenvalues raised to ``floor`` (``H`` symmetrised first)."""
    w, V = np.linalg.eigh(0.5 * (H + H.T))
    w = np.maximum(w, floor)
    return (V / np.sqrt(w)) @ V.T


def _preconditioner_and_rms(H: np.ndarray, floor: float) -> tuple[np.ndarray, float]:
    """``B = H^{-1/2}`` (eigenvalues floored) and the RMS preconditioned norm it implies.

    With ``H ~ X^T S X``, ``sum_i ||B X^T a_i||^2 = tr(B H B) = sum_j nu_j / max(nu_j,
    floor)``: 1 per direction unless the floor binds (rows far below their bound, where
    ``M1``'s noise is large next to ``lambda_k``). The radius of a step is set in units of
    this RMS, as the first step's is in units of the probe's (both public).
    """
    w, V = np.linalg.eigh(0.5 * (H + H.T))
    wf = np.maximum(w, floor)
    share = float(np.mean(np.clip(w, 0.0, None) / wf))
    return (V / np.sqrt(wf)) @ V.T, max(math.sqrt(share), 0.125)


def iteration_weights(n_iter: int) -> np.ndarray:
    """Shares of the iteration precision per step: ``2^t`` normalised (last step most)."""
    w = 2.0 ** np.arange(n_iter)
    return w / w.sum()


# --------------------------------------------------------------------------------------
# The rule
# --------------------------------------------------------------------------------------

#: Above this predicted sin-theta Analyze Gauss is taken as having found nothing: where it
#: saturates, no completion can be worse than it by more than ``1 / SATURATED``.
SATURATED = 0.98
#: A hidden ``lambda_k`` lies at most this many times the detection threshold above the
#: bulk centre (else it would show), and the rule tries the heights
#: ``HIDDEN_FACTOR * threshold * HIDDEN_STEPS``.
HIDDEN_FACTOR = 1.25
HIDDEN_STEPS = 2.0 ** (-np.arange(11) / 2.0)
#: With ``lambda_k`` hidden the probe sees the rows through a random ``X0``, i.e. their
#: norms: if more than ``HIDDEN_TAIL`` of its energy lies beyond ``HIDDEN_TAIL_NORM`` times
#: its RMS, those rows could carry the top k alone (a coherent spike, which clipping
#: removes) and the rule does not iterate.
HIDDEN_TAIL = 0.01
HIDDEN_TAIL_NORM = 3.0
#: With ``lambda_k`` visible but ``M1``'s own start poor (predicted ``tan^2`` of ``X0``
#: above this), ``X0`` mixes the spike's rows with the rest, the probe underestimates how
#: coherent they are, and the same heavy-tail test applies: a heavy tail of the probe's
#: norms takes Analyze Gauss (issue 21: family 2 at 3% of the rows, just above detection).
POOR_START_TAN2 = 1.0


@dataclass(frozen=True)
class Spectrum:
    """Estimates of the eigenvalues of ``A^T A`` from those of ``M1`` (public: post-processing).

    ``center`` and ``edge``: centre and half-width of the noise bulk of the bottom ``d - k``
    eigenvalues; ``top`` (k,) and ``rest`` (d - k,): the estimated eigenvalues, decreasing
    within each; ``n_visible``: how many of the top k stand out of the bulk (the others are
    hidden: their estimate is a placeholder, ``center + edge / 2``).
    """

    center: float
    edge: float
    top: np.ndarray
    rest: np.ndarray
    n_visible: int

    @property
    def threshold(self) -> float:
        """Height above ``center`` of an eigenvalue that shows exactly at the bulk edge."""
        return self.edge / 2.0


def _spike_height(t: np.ndarray, edge: float) -> np.ndarray:
    """Invert the spiked-Wigner shift: an eigenvalue ``h > edge/2`` above the bulk centre
    shows at ``t = h + edge^2 / (4 h)``; ``t <= edge`` is inside the bulk (``nan``)."""
    with np.errstate(invalid="ignore"):
        return np.where(t > edge, (t + np.sqrt(np.maximum(t * t - edge * edge, 0.0))) / 2.0,
                        np.nan)


def estimate_spectrum(eigvals: np.ndarray, k: int, noise_std: float) -> Spectrum:
    """Estimates of the eigenvalues of ``A^T A`` from those of ``M1 = A^T A + W1``.

    ``W1`` is symmetric with entry std ``s``. The bottom ``m = d - k`` eigenvalues of ``M1``
    are the noise bulk (the data's own bottom eigenvalues spread by ``W1``): its centre
    ``c`` is their median and its half-width ``e`` the larger of the noise's own,
    ``2 s sqrt(m)`` (a semicircle: the noise restricted to the bottom directions), and the
    observed one (interquartile range / 0.808, robust to outliers). The median of *all*
    eigenvalues, used before, lies among the spikes once ``k >= d/2`` (issue 21).

    Top k: their spread from ``W1`` (variance ``s^2 k``, the k x k block of the noise) is
    removed by shrinking them towards their mean (factor ``sqrt(1 - s^2 k / var)``, 0 for a
    flat group, near 1 for well-separated eigenvalues); then the bulk's repulsion
    (spiked Wigner, Baik, Ben Arous and Peche 2005): an eigenvalue at height ``h > e/2``
    above ``c`` shows at ``h + e^2 / (4 h)``, inverted by :func:`_spike_height`; one
    inside the bulk is hidden.

    Bottom ``d - k``: an eigenvalue above the bulk edge is inverted the same way; inside
    the bulk the noise spread is removed by shrinking towards ``c`` (factor
    ``sqrt(1 - (2 s sqrt(m) / 2e)^2)``... i.e. ``sqrt(1 - s^2 m / (e/2)^2)``, 0 when the
    bulk is pure noise). Everything is capped at the k-th estimate.

    Parameters
    ----------
    eigvals : ndarray of shape (d,)
        Eigenvalues of ``M1``, decreasing.
    k : int
        Number of components, ``1 <= k < d``.
    noise_std : float
        Entry std ``s`` of ``W1``.
    """
    mu = np.asarray(eigvals, dtype=np.float64)
    d = mu.size
    m = d - k
    bottom = mu[k:]
    c = float(np.median(bottom))
    q75, q25 = np.percentile(bottom, [75.0, 25.0]) if m >= 4 else (c, c)
    e = max(2.0 * noise_std * math.sqrt(m), float(q75 - q25) / 0.808)
    t = mu[:k] - c
    if k > 1:
        var = float(np.var(t))
        f = math.sqrt(max(0.0, 1.0 - noise_std**2 * k / var)) if var > 0 else 0.0
        t = t.mean() + f * (t - t.mean())
    h = _spike_height(t, e)
    # Visible: above the edge of the whole noise matrix (2 s sqrt(d), where hidden spikes
    # leave the top eigenvalues of M1), not only above the bottom group's own edge, by
    # three Tracy-Widom scales s d^(-1/6) (the largest eigenvalue's fluctuation).
    margin = 3.0 * noise_std * d ** (-1.0 / 6.0)
    visible = ~np.isnan(h) & (t > max(e, 2.0 * noise_std * math.sqrt(d)) + margin)
    n_vis = int(np.argmin(visible)) if not visible.all() else k
    top = np.where(visible, c + np.nan_to_num(h), c + e / 2.0)
    tb = bottom - c
    fb = math.sqrt(max(0.0, 1.0 - (noise_std * math.sqrt(m) / (e / 2.0)) ** 2))
    hb = _spike_height(tb, e)
    rest = c + np.where(np.isnan(hb), fb * tb, hb)
    # The eigenvalues of A^T A are >= 0 (the noise's are not: c may be below 0).
    top = np.maximum(top, 0.0)
    rest = np.clip(rest, 0.0, top.min())
    return Spectrum(c, e, top, rest, n_vis)


@dataclass(frozen=True)
class Prediction:
    """Predicted errors of the two completions (computed from released values only).

    ``iterate`` says whether the rule picks the iteration; ``radius_factor`` (R in units of
    the rows' RMS preconditioned norm) and ``n_iter`` are its parameters; ``lam_k`` and
    ``lam_k1`` the spectrum estimates (``lam_k`` is ``None`` when ``lambda_k`` is hidden in
    ``M1``'s noise: the errors are then those of the worst height tried); ``rms_norm`` the
    RMS of the probe's norms (units of ``sqrt(k/n)``); ``top_factor`` and ``rest_factor``
    the clipping factors ``a`` and ``b`` at the chosen radius; ``reason`` a short
    explanation.
    """

    iterate: bool
    error_analyze_gauss: float
    error_iterate: float
    radius_factor: float
    n_iter: int
    lam_k: float | None
    lam_k1: float
    rms_norm: float
    reason: str
    hidden: bool = False
    top_factor: float = math.nan
    rest_factor: float = math.nan


def _tan_to_sin(t: float) -> float:
    return t / math.sqrt(1.0 + t * t) if math.isfinite(t) else 1.0


def _first_order(std: float, lam_k: float, rest: np.ndarray) -> np.ndarray:
    """Per direction ``j > k``: ``s^2 / (lambda_k - lambda_j)^2`` (first-order tilt^2)."""
    gaps = np.maximum(lam_k - rest, 1e-300)
    with np.errstate(over="ignore"):
        return (std / gaps) ** 2


def ag_error(std: float, lam_k: float, rest: np.ndarray, ck: float) -> float:
    """Predicted spectral sin-theta of the top-k eigenvectors of ``A^T A + W`` (entry std s).

    First order: direction ``j`` tilts by ``s / (lambda_k - lambda_j)``; the ``(d-k) x k``
    tilt has spectral norm ``c_k`` times its column norm (a Gaussian matrix,
    ``c_k = 1 + sqrt(k / (d - k))``). Near the detection threshold the first order
    underestimates: with ``T = sum_j s^2 / (lambda_k - lambda_j)^2`` the spiked-Wigner
    overlap ``1 - T`` gives ``tan^2 = T / (1 - T)``; ``T >= 1``: nothing found (1).
    """
    T = float(_first_order(std, lam_k, rest).sum())
    if T >= 1.0:
        return 1.0
    return _tan_to_sin(ck * math.sqrt(T / (1.0 - T)))


def iteration_error(start: np.ndarray, rho: np.ndarray, noise: np.ndarray, ck: float,
                    share: np.ndarray | None = None) -> float:
    """Predicted sin-theta after the clipped steps (module doc of :func:`predict_errors`).

    ``start`` (d - k,): tilt^2 per direction of the starting subspace; ``rho`` (d - k,):
    contraction per step; ``noise`` (T,): the tilt^2 one step's noise adds per direction
    at an aligned start; ``share`` (d - k,): ``lambda_j / lambda_k``. With tilt ``E``
    (``X ~ (V_k + V_perp E) (I + E^T E)^(-1/2)``) the top-k signal of a step shrinks by
    ``(1 + |E|^2)^(1/2)`` while the preconditioner and the radius follow the energy ``X``
    holds, ``(lambda_k + sum_j lambda_j e_j) / (1 + |E|^2)``: a step's noise weighs
    ``1 + sum_j e_j lambda_j / lambda_k`` times more. From a random start (``tan^2 =
    (d - k) / k``) the first steps are that much noisier (what makes a hidden
    ``lambda_k`` hard).
    """
    e = start.copy()
    w = np.ones_like(e) if share is None else share
    for q2 in noise:
        e = rho * rho * e + q2 * (1.0 + float(e @ w))
    return _tan_to_sin(ck * math.sqrt(float(e.sum())))


def clipping_factors(counts: np.ndarray, energies: np.ndarray, count_std: float,
                     threshold: float) -> tuple[float, np.ndarray, np.ndarray, np.ndarray]:
    """From the released probe: the RMS norm (units of ``sqrt(k/n)``) and, per bin, the
    share of rows ``p``, of preconditioned energy ``p r^2`` and of rest energy.

    Counts and energies below ``threshold`` noise stds read as zero. Returns
    ``(rms, r, top_share, rest_share)`` with ``r`` the bins' norms in units of the RMS.
    """
    cnt = np.where(counts > threshold * count_std, counts, 0.0)
    en = np.where(energies > threshold * count_std, energies, 0.0)
    total = float(cnt.sum())
    if total <= 0:
        return 1.0, HIST_REPS.copy(), np.zeros_like(cnt), np.zeros_like(cnt)
    rms = math.sqrt(float((cnt * HIST_REPS**2).sum()) / total)
    r = HIST_REPS / rms
    top = cnt * r * r
    top = top / top.sum() if top.sum() > 0 else top
    if en.sum() > 0:
        rest = en / en.sum()
    else:  # no rest energy above the noise: the rows' shares stand in for it
        rest = cnt / total
    return rms, r, top, rest


def _start_tilt(init_std: float, lam_k: float, rest: np.ndarray, m: int, k: int) -> np.ndarray:
    """``M1``'s own tilt^2 per direction (first order, ``1/(1 - T)`` corrected), at most a
    random start's ``(d - k) / k`` in total."""
    t1 = _first_order(init_std, lam_k, rest)
    tot = float(t1.sum())
    start = t1 / (1.0 - tot) if tot < 1.0 else np.full(m, math.inf)
    return start if start.sum() <= m / k else np.full(m, 1.0 / k)


def predict_errors(*, eigvals: np.ndarray, counts: np.ndarray, energies: np.ndarray, n: int,
                   d: int, k: int, init_std: float, full_std: float, rest_multiplier: float,
                   iter_choices: tuple[int, ...], count_std: float, switch_ratio: float,
                   iter_calibration: float, count_threshold: float) -> Prediction:
    """The rule: predicted spectral sin-theta of each completion, and the choice.

    Everything here is released or public: ``M1``'s eigenvalues, the probe, ``n, d, k``
    and the noise stds. ``lambda`` are estimated by :func:`estimate_spectrum`.

    - Analyze Gauss, entry noise std ``s``: :func:`ag_error`.
    - Iteration with clip radius ``R`` (``w_i = min(1, R / r_i)``, ``r_i`` the
      preconditioned row norms): near ``V_k``, ``Z = S_w X B + G`` with
      ``S_w = sum_i w_i a_i a_i^T``, whose eigenvalues are about ``lambda_k a`` in the
      top-k directions, with ``a`` the preconditioned energy kept by the clip
      (``sum w_i r_i^2 / sum r_i^2``), and ``lambda_j b`` outside, with ``b`` the rest
      energy kept (``sum w_i e_i / sum e_i``, ``e_i = ||a_i||^2 - ||X0^T a_i||^2``: the
      probe releases it per bin, so a row's weight and its rest need not be independent,
      which the rule of issue 9 assumed). Per step direction ``j`` contracts by
      ``rho_j = lambda_j b / (lambda_k a)`` and receives the noise of ``G_t`` (entry std
      ``2 R z_t``) over the top-k signal ``sqrt(lambda_k) a``: ``q_t = 2 R z_t /
      (sqrt(lambda_k) a)`` (times ``iter_calibration``, 1.15 by default: the 85th
      percentile of measured / predicted on the development records, whose median is
      0.95); :func:`iteration_error`. Start:
      ``M1``'s own error (:func:`_start_tilt`).
    - ``R`` and ``T`` minimise the predicted iteration error over :data:`RADIUS_GRID` and
      ``iter_choices``; the rule iterates if that is below ``switch_ratio`` times Analyze
      Gauss's.
    - A **hidden** ``lambda_k`` (inside ``M1``'s noise bulk): if some of the top k stand
      out, the hidden ones may sit just above ``lambda_{k+1}`` (a decaying spectrum, as for
      images): Analyze Gauss. If none does, ``X0`` is random, the probe sees the rows'
      norms, and a heavy tail of them (:data:`HIDDEN_TAIL`) could carry a coherent spike
      that clipping removes: Analyze Gauss. Otherwise ``lambda_k = c + h`` with ``h``
      unknown below ``HIDDEN_FACTOR`` times the detection threshold, and the rule takes
      the worst case over ``h``: it iterates (from a random start) only if at every
      height where Analyze Gauss would find something (predicted below
      :data:`SATURATED`) the iteration is predicted below ``switch_ratio`` times it, and
      somewhere below it at all. (Before that, :func:`fit_auto` tries the rows' own scale
      when they lie far below their bound.)
    - A **visible** ``lambda_k`` with a poor start (``M1``'s predicted ``tan^2`` above
      :data:`POOR_START_TAN2`) and the same heavy tail: Analyze Gauss. Near the detection
      threshold ``X0`` mixes the rows that carry the spike with the rest, so the probe
      underestimates their coherence and the predicted gain does not come (issue 21:
      family 2 with 3% of the rows carrying the spike). ``R`` and ``T`` are still chosen,
      so a forced iteration keeps them.
    """
    m = d - k
    if m <= 0:
        return Prediction(False, 0.0, 0.0, math.nan, 0, None, math.nan, 1.0,
                          "Analyze Gauss: k = d, the top-k subspace is the whole space.")
    ck = 1.0 + math.sqrt(k / m)
    spec = estimate_spectrum(np.asarray(eigvals, dtype=np.float64)[:d], k, init_std)
    lam_k1 = float(spec.rest[0])
    rms, r, top_share, rest_share = clipping_factors(counts, energies, count_std,
                                                     count_threshold)
    if top_share.sum() <= 0:
        return Prediction(False, 1.0, 1.0, math.nan, 0, None, lam_k1, rms,
                          "Analyze Gauss: the probe is empty after thresholding.")
    hidden = spec.n_visible < k
    guard = ""
    if hidden:
        tail = float(top_share[r > HIDDEN_TAIL_NORM].sum())
        why = (f"{spec.n_visible} of the top {k} stand out: the hidden ones may sit just "
               "above lambda_{k+1} (a decaying spectrum)" if spec.n_visible > 0 else
               f"{tail:.1%} of the probe's energy lies beyond {HIDDEN_TAIL_NORM:g} x its RMS "
               "(rows that could carry the top k alone)" if tail > HIDDEN_TAIL else "")
        if why:
            return Prediction(False, 1.0, 1.0, math.nan, 0, None, lam_k1, rms,
                              f"Analyze Gauss: lambda_k is hidden in M1's noise and {why}.",
                              True)
        h_max = HIDDEN_FACTOR * spec.threshold
        heights = [max(spec.center, 0.0) + h_max * f for f in HIDDEN_STEPS]
    else:
        heights = [max(float(spec.top[-1]), 1e-300)]
        start_tan2 = float(_start_tilt(init_std, heights[0], np.minimum(spec.rest, heights[0]),
                                       m, k).sum())
        tail = float(top_share[r > HIDDEN_TAIL_NORM].sum())
        if start_tan2 > POOR_START_TAN2 and tail > HIDDEN_TAIL:
            # The iteration's radius and steps are still chosen below (a forced iteration
            # keeps them); only the choice is Analyze Gauss's.
            guard = (f"M1's start is poor (predicted tan^2 {start_tan2:.3g} > "
                     f"{POOR_START_TAN2:g}) and {tail:.1%} of the probe's energy lies beyond "
                     f"{HIDDEN_TAIL_NORM:g} x its RMS (rows that could carry the top k alone)")
    cases = []  # per height: lambda_k, the rest, Analyze Gauss's error, the start
    for lam_k in heights:
        rest = np.minimum(spec.rest, lam_k)
        start = (np.full(m, 1.0 / k) if hidden  # a random start: tan^2 = (d - k) / k
                 else _start_tilt(init_std, lam_k, rest, m, k))
        cases.append((lam_k, rest, ag_error(full_std, lam_k, rest, ck), start))
    unit = math.sqrt(k / n)
    best: tuple[float, float, float, int, float, float, float] | None = None
    for T in iter_choices:
        zs = rest_multiplier / np.sqrt(iteration_weights(T))
        for Rn in RADIUS_GRID:
            w = np.minimum(1.0, Rn / r)
            a = float((top_share * w).sum())
            b = float((rest_share * w).sum())
            if a <= 0:
                continue
            worst, found, pair = -math.inf, False, (1.0, 1.0)
            for lam_k, rest, e_ag, start in cases:
                rho = rest * b / (lam_k * a)
                if np.any(rho >= 1.0):
                    e_it = 1.0
                else:
                    q = iter_calibration * 2.0 * Rn * unit * zs / (math.sqrt(lam_k) * a)
                    e_it = iteration_error(start, rho, q * q, ck, rest / lam_k)
                found = found or e_it < switch_ratio * e_ag
                if hidden and e_ag >= SATURATED:  # Analyze Gauss finds nothing there
                    continue
                if e_it / max(e_ag, 1e-300) > worst:
                    worst, pair = e_it / max(e_ag, 1e-300), (e_ag, e_it)
            if not found or worst == -math.inf:
                continue
            cand = (worst, pair[1], pair[0], int(T), float(Rn), a, b)
            if best is None or cand[:2] < best[:2]:
                best = cand
    if best is None:
        return Prediction(False, cases[0][2], 1.0, math.nan, 0, None if hidden else
                          cases[0][0], lam_k1, rms, "Analyze Gauss: no clip radius gives "
                          "the iteration a predicted gain.", hidden)
    worst, e_it, e_ag, T, Rn, a, b = best
    iterate = bool(worst < switch_ratio) and not guard
    where = (f"lambda_k hidden in M1's noise, worst height up to {HIDDEN_FACTOR:g} x the "
             "threshold: " if hidden else "")
    reason = (f"{'iteration' if iterate else 'Analyze Gauss'}: {where}predicted sin-theta "
              f"{e_it:.3g} (iteration, T={T}, R={Rn:g} rms) vs {e_ag:.3g} (Analyze Gauss), "
              f"switch ratio {switch_ratio:g}" + (f"; but {guard}." if guard else "."))
    return Prediction(iterate, float(e_ag), float(e_it), Rn, T,
                      None if hidden else float(spec.top[-1]), lam_k1, rms, reason, hidden,
                      a, b)


#: Relative margin of :func:`choice_without_probe`'s bound over rounding (the bound
#: ``R / a >= 1`` holds exactly; the computed shares may exceed it by a few ulps).
_BOUND_MARGIN = 1e-9


def choice_without_probe(*, eigvals: np.ndarray, n: int, d: int, k: int, init_std: float,
                         full_std: float, rest_multiplier: float,
                         iter_choices: tuple[int, ...], switch_ratio: float,
                         iter_calibration: float) -> Prediction | None:
    """The rule's choice when no outcome of the probe can change it, else ``None``.

    Takes the arguments of :func:`predict_errors` but the probe's (released values and
    public parameters only). Returns Analyze Gauss's :class:`Prediction` in three cases,
    in each of which :func:`predict_errors` picks Analyze Gauss for *every* histogram:

    - ``k = d``: nothing to predict.
    - ``lambda_k`` hidden in ``M1``'s noise while some of the top k stand out
      (``0 < n_visible < k``): :func:`predict_errors` returns Analyze Gauss before reading
      the probe.
    - ``lambda_k`` visible and the iteration's best case still predicted no better than
      ``switch_ratio`` times Analyze Gauss. Whatever the histogram, the kept energy
      ``a = sum_b p_b r_b^2 min(1, R / r_b)`` (``p_b`` the rows' shares, ``r_b`` in units of
      the RMS, so ``sum_b p_b r_b^2 = 1``) is at most ``R sum_b p_b r_b <= R`` (Cauchy-
      Schwarz), so every step's noise ``q_t = c 2 R u z_t / (sqrt(lambda_k) a)`` is at
      least ``c 2 u z_t / sqrt(lambda_k)``; and :func:`iteration_error` increases with
      the contraction ``rho``, the start and ``q``, so no radius does better than
      ``rho = 0``, a zero start and that ``q``. If this bound (less a margin of
      :data:`_BOUND_MARGIN` for rounding) is at least ``switch_ratio`` times Analyze
      Gauss's predicted error for every ``T``, no radius is found and the rule picks
      Analyze Gauss.

    :func:`fit_auto` then does not release the probe and gives its share to Analyze
    Gauss's second release (a test checks the claim against :func:`predict_errors` on
    random histograms). ``error_iterate`` is then the bound and ``rms_norm`` is ``nan``.
    """
    m = d - k
    if m <= 0:
        return Prediction(False, 0.0, 0.0, math.nan, 0, None, math.nan, math.nan,
                          "Analyze Gauss: k = d, the top-k subspace is the whole space; "
                          "no probe.")
    spec = estimate_spectrum(np.asarray(eigvals, dtype=np.float64)[:d], k, init_std)
    lam_k1 = float(spec.rest[0])
    if 0 < spec.n_visible < k:
        return Prediction(False, 1.0, 1.0, math.nan, 0, None, lam_k1, math.nan,
                          f"Analyze Gauss: lambda_k is hidden in M1's noise and "
                          f"{spec.n_visible} of the top {k} stand out: the hidden ones may "
                          "sit just above lambda_{k+1} (a decaying spectrum); no probe (no "
                          "outcome of it changes this choice).", True)
    if spec.n_visible < k:  # none stands out: the probe decides (row scale, heavy tail)
        return None
    lam_k = max(float(spec.top[-1]), 1e-300)
    rest = np.minimum(spec.rest, lam_k)
    ck = 1.0 + math.sqrt(k / m)
    e_ag = ag_error(full_std, lam_k, rest, ck)
    unit = math.sqrt(k / n)
    bound = math.inf
    for T in iter_choices:
        zs = rest_multiplier / np.sqrt(iteration_weights(T))
        q = (1.0 - _BOUND_MARGIN) * iter_calibration * 2.0 * unit * zs / math.sqrt(lam_k)
        zero = np.zeros(m)
        bound = min(bound, iteration_error(zero, zero, q * q, ck, rest / lam_k))
    if bound * (1.0 - _BOUND_MARGIN) < switch_ratio * e_ag:
        return None
    return Prediction(False, float(e_ag), float(bound), math.nan, 0, float(spec.top[-1]),
                      lam_k1, math.nan,
                      f"Analyze Gauss: predicted sin-theta {e_ag:.3g}; the iteration's best "
                      f"case (no clipping loss, no contraction) is {bound:.3g}, above "
                      f"{switch_ratio:g} x it; no probe (no outcome of it changes this "
                      "choice).")


# --------------------------------------------------------------------------------------
# The method
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AutoResult:
    """Output of :func:`fit_auto` (everything here is released or public).

    Attributes
    ----------
    basis : ndarray of shape (d, k)
        Orthonormal basis of the estimated top-k subspace (columns; the kernels'
        orientation: :class:`~dpprecond.pca.PCAResult` and :class:`~dpprecond.PrivatePCA`
        hold it as components in rows, shape (k, d), as scikit-learn does).
    eigenvalues : ndarray of shape (k,)
        Released estimates of the top-k eigenvalues of ``A^T A``: of the averaged matrix
        (Analyze Gauss branches; times ``tau^2`` at the rows' scale ``tau``) or
        ``eig(X^T M1 X)`` at the output ``X`` (iteration).
    trace : float
        Trace of the released matrix the eigenvalues come from (post-processing), in the
        same units: the total variance of the explained variance ratio.
    dp_event : dp_accounting.DpEvent
        The releases actually made (composes to one Gaussian with multiplier
        ``noise_multipliers["z_pca"]``).
    epsilon : float
        Epsilon of ``dp_event`` at ``delta`` (PLD, exact; ``inf`` without noise), computed
        when asked (the library's callers account ``dp_event`` in their ledger).
    delta : float
    branch : str
        ``"analyze_gauss"`` or ``"iterate"``.
    info : dict
        Noise multipliers, the rule's prediction, the clip radius and iterations used.
    """

    basis: np.ndarray
    eigenvalues: np.ndarray
    dp_event: dp_event.DpEvent
    delta: float
    branch: str
    info: dict[str, Any] = field(default_factory=dict)
    trace: float = math.nan

    @property
    def epsilon(self) -> float:
        """Epsilon of ``dp_event`` at ``delta`` (PLD, exact; ``inf`` without noise)."""
        return epsilon_of(self.dp_event, self.delta, "pld")


def check_auto_options(options: dict[str, Any]) -> dict[str, Any]:
    """Validate :func:`fit_auto`'s options (unknown names: TypeError; bad values: ValueError)."""
    unknown = sorted(set(options) - set(AUTO_DEFAULTS))
    if unknown:
        raise TypeError(f"Unknown option(s) {unknown} for method='auto'; valid options are "
                        f"{sorted(AUTO_DEFAULTS)}.")
    opts = {**AUTO_DEFAULTS, **options}
    if not isinstance(opts["add_noise"], bool):
        raise TypeError(f"Expected add_noise to be a bool, got {opts['add_noise']!r}.")
    opts["init_share"] = check_fraction("init_share", opts["init_share"], low_open=True)
    opts["probe_share"] = check_fraction("probe_share", opts["probe_share"], low_open=True)
    if opts["init_share"] + opts["probe_share"] >= 1.0:
        raise ValueError(f"Expected init_share + probe_share < 1 (the rest pays for the "
                         f"second stage), got init_share={opts['init_share']} and "
                         f"probe_share={opts['probe_share']}.")
    if opts["n_iter"] is not None:
        opts["n_iter"] = check_int("n_iter", opts["n_iter"], low=1, high=64)
    choices = opts["iter_choices"]
    if (not isinstance(choices, (tuple, list)) or not choices
            or any(isinstance(t, bool) or not isinstance(t, (int, np.integer))
                   or not 1 <= int(t) <= 64 for t in choices)):
        raise ValueError(f"Expected iter_choices to be a non-empty tuple of integers in "
                         f"[1, 64], got iter_choices={choices!r}.")
    opts["iter_choices"] = tuple(int(t) for t in choices)
    opts["switch_ratio"] = check_positive("switch_ratio", opts["switch_ratio"])
    opts["iter_calibration"] = check_positive("iter_calibration", opts["iter_calibration"])
    check_choice("branch", opts["branch"], ["rule", "analyze_gauss", "iterate"])
    if opts["clip_radius"] is not None:
        opts["clip_radius"] = check_positive("clip_radius", opts["clip_radius"],
                                             allow_inf=not opts["add_noise"])
    opts["floor_factor"] = check_positive("floor_factor", opts["floor_factor"])
    opts["count_threshold"] = check_positive("count_threshold", opts["count_threshold"],
                                             allow_zero=True)
    opts["rescale_share"] = check_fraction("rescale_share", opts["rescale_share"],
                                           low_open=True)
    spent = opts["init_share"] + opts["probe_share"] + opts["rescale_share"]
    if spent >= 1.0:
        raise ValueError(f"Expected init_share + probe_share + rescale_share < 1 (the rest "
                         f"pays for the completion), got {spent:g}.")
    return opts


def fit_auto(rows: RowSource, S: np.ndarray, k: int, *, noise_multiplier: float | None,
             delta: float, rng: NoiseSource | SeedLike = None,
             **options: Any) -> AutoResult:
    """Private top-k PCA that spends one calibrated Gaussian budget: see the module doc.

    Parameters
    ----------
    rows : RowSource
        The rows of ``A`` (each of norm <= 1 as computed), e.g. a
        :class:`~dpprecond.pca.rows.ClippedRows` or :class:`~dpprecond.pca.rows.DenseRows`.
    S : ndarray of shape (d, d)
        ``A^T A`` computed from the same rows (``rows.gram()``).
    k : int
        Number of components, ``1 <= k <= d`` (``k = d`` always takes the Analyze Gauss
        branch: there is no gap to predict).
    noise_multiplier : float or None
        The multiplier ``z`` of the one Gaussian this fit spends, calibrated by the caller
        (``budget.plan_auto(epsilon, delta).noise_multipliers["z_pca"]``, as
        :func:`dpprecond.pca.fit_private_pca` does: the calibration happens once, there);
        ``None`` only with ``add_noise=False``.
    delta : float
        Target delta (of :attr:`AutoResult.epsilon`).
    rng : None, int, SeedSequence or NoiseSource
        Noise source (fresh OS entropy when ``None``). With the same generator state,
        the Analyze Gauss branch without a probe returns exactly what
        :func:`dpprecond.pca.baselines.analyze_gauss` returns at multiplier ``z``.
    **options
        ``init_share`` (0.5): precision share of ``M1``. ``probe_share`` (0.01): share of
        the histogram probe. ``n_iter`` (None: the rule picks from ``iter_choices``,
        (2, 3)). ``switch_ratio`` (0.9) and ``iter_calibration`` (1.15): the rule's
        constants (:func:`predict_errors`). ``branch`` ("rule"; "analyze_gauss" or
        "iterate" force a branch, same budget; "analyze_gauss" releases no probe).
        ``clip_radius`` (None: the rule's choice; a number fixes R in units of the rows'
        RMS preconditioned norm).
        ``floor_factor`` (4): eigenvalues of ``X^T M1 X`` are raised to this many times
        ``M1``'s entry noise std before inverting. ``count_threshold`` (3): noisy counts
        below this many noise stds are read as zero by the rule. ``add_noise`` (True;
        False runs the same algorithm without noise and reports ``epsilon = inf``).

    Returns
    -------
    AutoResult

    Notes
    -----
    Releases and sensitivities (replace-one, rows of norm <= 1):

    ==========================================  ============  ===============================
    release                                     sensitivity   noise multiplier
    ==========================================  ============  ===============================
    ``M1``: upper triangle of ``A^T A``         ``sqrt(2)``   ``z / sqrt(init_share)``
    probe histogram of ``r_i`` (if released)    ``2``         ``z / sqrt(probe_share)``
    (a) ``M2``: upper triangle of ``A^T A``     ``sqrt(2)``   ``z / sqrt(rest)``
    (b) ``Z_t = sum a_i c_i^T``, ``t < T``      ``2 R``       ``z / sqrt(rest w_t)``
    ==========================================  ============  ===============================

    with ``rest = 1 - init_share - probe_share`` (``1 - init_share`` without the probe)
    and ``sum_t w_t = 1``. Noise stds are
    also multiplied by :func:`~dpprecond.pca.rows.noise_inflation` (the floating-point
    excess of block sums, :mod:`dpprecond.pca.rows`).
    """
    opts = check_auto_options(options)
    noise = opts["add_noise"]
    delta = check_delta("delta", delta)
    if noise and noise_multiplier is None:
        raise TypeError("Expected noise_multiplier (calibrated once by the caller: "
                        "budget.plan_auto(epsilon, delta).noise_multipliers['z_pca']), got "
                        "None; None is only for add_noise=False.")
    n, d = rows.shape
    k = check_int("k", k, low=1, high=d)
    distributed = is_distributed(rng)  # secure aggregation: S is held as client parts
    if not (distributed or is_deferred(rng)):  # deferred: S is a sum the clients compute
        S = np.asarray(S, dtype=np.float64)
    if S.shape != (d, d):
        raise ValueError(f"Expected S of shape ({d}, {d}) (A^T A of the rows), got "
                         f"{S.shape}.")
    # A numpy Generator, or a stand-in that draws the noise differently (secure mode's
    # SecureGenerator, federated PCA's LocalNoise: each client's own noise).
    gen: NoiseSource = (rng if isinstance(rng, NoiseSource) and not isinstance(
        rng, np.random.RandomState) else check_random_state("rng", rng))

    s1, sc = opts["init_share"], opts["probe_share"]
    rest = 1.0 - s1 - sc
    z = check_positive("noise_multiplier", noise_multiplier) if noise else 0.0
    fp = noise_inflation(rows)
    z1, zc = z / math.sqrt(s1), z / math.sqrt(sc)
    # The probe's vector (counts and rest energies) has sensitivity 2 (see probe).
    std1, std_c = SQRT2 * z1 * fp, 2.0 * zc * fp
    # The coupled pair's average is Analyze Gauss at the whole precision (multiplier z):
    # what the Analyze Gauss branch returns when the probe is not released.
    std_ag = SQRT2 * z * fp
    # The noise the releases actually carry, for the rule and the floors: federated PCA
    # without a trusted party (LocalNoise) adds every client's noise, sqrt(K) times std.
    amp = float(getattr(gen, "noise_amplification", 1.0))

    # -- release 1: M1 (coupled with the Analyze Gauss completion; under secure
    # aggregation the clients' Skellam shares cannot be coupled: M2 is drawn on its own)
    coupled = None if distributed else coupled_symmetric_gaussian(d, std_ag, std1, gen)
    if coupled is None:
        M1 = release(S, std1, gen, symmetric=True, sensitivity=SQRT2)
    else:
        M1 = release(S, std1, gen, noise=coupled.first)
    # The whole spectrum (for the rule) and the top k + 1 eigenpairs from one reduction.
    spectrum, w1, U1 = spectrum_and_top_eigvecs(M1, min(k + 1, d))
    X0 = U1[:, :k].copy()
    floor = opts["floor_factor"] * std1 * amp if noise else 1e-12 * max(float(np.trace(S)), 1e-300)
    B0 = _preconditioner(X0.T @ M1 @ X0, floor)

    # -- release 2: the probe (rows and rest energy per bin of preconditioned norm), unless
    # no outcome of it can change the choice (released values only): its share then goes
    # to Analyze Gauss's second release -------------------------------------------------
    iter_choices = (opts["n_iter"],) if opts["n_iter"] is not None else opts["iter_choices"]
    branch = opts["branch"]
    unit = math.sqrt(k / n)
    decided = None
    if branch != "iterate":
        decided = choice_without_probe(
            eigvals=spectrum, n=n, d=d, k=k, init_std=std1 * amp,
            full_std=SQRT2 * z / math.sqrt(s1 + rest) * fp * amp,
            rest_multiplier=z / math.sqrt(rest) * amp, iter_choices=iter_choices,
            switch_ratio=opts["switch_ratio"], iter_calibration=opts["iter_calibration"])
        if decided is None and branch == "analyze_gauss":
            decided = Prediction(False, math.nan, math.nan, math.nan, 0, None, math.nan,
                                 math.nan, "Analyze Gauss: forced (branch='analyze_gauss'); "
                                 "no probe.")
    events = [gaussian(z1)]
    info: dict[str, Any] = {"noise_multipliers": {"z_pca": z, "z_init": z1},
                            "probe_counts": None, "probe_energies": None,
                            "init_eigenvalues": w1, "n_iter": 0, "clip_radius": math.nan,
                            "row_scale": 1.0}
    if decided is None:
        counts, energies = probe(rows, X0, B0, unit, HIST_EDGES, std_c, gen)
        events.append(gaussian(zc))
        info["noise_multipliers"]["z_probe"] = zc
        info.update(probe_counts=counts, probe_energies=energies)
        left = rest  # precision share not yet spent
    else:
        left = 1.0 - s1

    # -- release 3, only when M1 shows none of the top k and the rows lie far below their
    # bound (released values only): A^T A of the rows clipped at their own scale ---------
    rescaled = None
    if decided is None and branch == "rule" and noise and k < d and \
            estimate_spectrum(spectrum, k, std1 * amp).n_visible == 0:
        nu = np.maximum(np.linalg.eigvalsh(0.5 * (X0.T @ M1 @ X0 + (X0.T @ M1 @ X0).T)),
                        floor)
        tau = row_scale(counts, n, d, std_c * amp, unit, float(np.sum(1.0 / nu)))
        st = opts["rescale_share"]
        info["row_scale_candidate"] = tau
        if tau * tau * math.sqrt(s1 / st) <= RESCALE_GAIN:
            # The diagnostic: its noise is tau^2 times smaller next to the data. If it shows
            # the top k, the clipped rows keep the signal: complete Analyze Gauss there.
            zt = z / math.sqrt(st)
            std_t = SQRT2 * zt * fp
            S_tau = rescaled_gram(rows, tau)
            M_tau = release(S_tau, std_t, gen, symmetric=True, sensitivity=SQRT2)
            events.append(gaussian(zt))
            left -= st
            info["noise_multipliers"]["z_rescaled"] = zt
            with _serial_blas():
                spec_tau = estimate_spectrum(np.linalg.eigvalsh(M_tau)[::-1], k, std_t * amp)
            if spec_tau.n_visible == k:
                rescaled = (S_tau, M_tau, std_t, tau)
    z_left = z / math.sqrt(left)
    info["noise_multipliers"]["z_rest"] = z_left

    # -- the rule (released values and public parameters only) ---------------------------
    std_full = SQRT2 * z / math.sqrt(s1 + left) * fp  # Analyze Gauss completed now
    pred = decided if decided is not None else predict_errors(
        eigvals=spectrum, counts=counts, energies=energies, n=n, d=d, k=k,
        init_std=std1 * amp, full_std=std_full * amp, rest_multiplier=z_left * amp,
        iter_choices=iter_choices, count_std=std_c * amp, switch_ratio=opts["switch_ratio"],
        iter_calibration=opts["iter_calibration"], count_threshold=opts["count_threshold"])
    info["prediction"] = asdict(pred)
    if branch == "rule":
        branch = ("analyze_gauss_rescaled" if rescaled is not None else
                  "iterate" if pred.iterate else "analyze_gauss")

    if branch == "analyze_gauss_rescaled":
        assert rescaled is not None
        S_tau, M_tau, std_t, tau = rescaled
        std2 = SQRT2 * z_left * fp
        M2 = release(S_tau, std2, gen, symmetric=True, sensitivity=SQRT2)
        v1, v2 = std_t**2, std2**2
        M = (M_tau / v1 + M2 / v2) / (1.0 / v1 + 1.0 / v2)
        wa, X = top_eigvecs(M, k)
        eigenvalues = wa * tau * tau  # in the units of A^T A (of the clipped rows)
        trace = float(np.trace(M)) * tau * tau
        events.append(gaussian(z_left))
        info["row_scale"] = tau
    elif branch == "analyze_gauss":
        if noise and coupled is None:  # independent M2 with the precision left
            v1, v2 = std1**2, (SQRT2 * z_left * fp) ** 2
            M2 = release(S, math.sqrt(v2), gen, symmetric=True, sensitivity=SQRT2)
            M = (M1 / v1 + M2 / v2) / (1.0 / v1 + 1.0 / v2)
        elif noise:
            assert coupled is not None
            second = coupled.second
            v2 = coupled.var_second
            if left < 1.0 - s1:  # the probe (and the diagnostic) spent some: add noise
                v_left = (SQRT2 * z_left * fp) ** 2
                second = second + symmetric_gaussian(d, math.sqrt(v_left - v2), gen)
                v2 = v_left
            M2 = release(S, math.sqrt(v2), gen, noise=second)
            v1 = coupled.var_first
            M = (M1 / v1 + M2 / v2) / (1.0 / v1 + 1.0 / v2)
        else:
            M = S
        wa, Ua = top_eigvecs(M, k)
        X, eigenvalues = Ua, wa
        trace = float(np.trace(M))
        events.append(gaussian(z_left))
    else:
        T = pred.n_iter if pred.n_iter > 0 else (opts["n_iter"] or max(iter_choices))
        Rn = opts["clip_radius"] if opts["clip_radius"] is not None else (
            pred.radius_factor if math.isfinite(pred.radius_factor) else 1.0)
        weights = iteration_weights(T)
        zts = [z_left / math.sqrt(w) for w in weights]
        X = X0
        radii = []
        for t, zt in enumerate(zts):
            if t == 0:  # M1's top eigenvalues are biased up: the probe's RMS sets the scale
                B, scale = B0, pred.rms_norm
            else:  # X is no longer aligned with W1: X^T M1 X ~ X^T S X + a k x k noise
                B, scale = _preconditioner_and_rms(X.T @ M1 @ X, floor)
            radius = Rn * unit * scale
            radii.append(radius)
            Z = clipped_step(rows, X, B, radius, 2.0 * radius * zt * fp if noise else 0.0, gen)
            X = orthonormalize(Z)
            events.append(gaussian(zt))
        eigenvalues = np.linalg.eigvalsh(X.T @ M1 @ X)[::-1]
        trace = float(np.trace(M1))
        info.update(n_iter=T, clip_radius=radii[-1], clip_radius_factor=Rn, clip_radii=radii,
                    iteration_multipliers=zts)
    event = compose(events)
    info["branch"] = branch
    return AutoResult(basis=np.ascontiguousarray(X), eigenvalues=np.asarray(eigenvalues),
                      dp_event=event if noise else dp_event.NonPrivateDpEvent(),
                      delta=delta, branch=branch, info=info, trace=trace)
