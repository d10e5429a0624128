"""Private PCA ``method="auto"``: a partial release of ``A^T A``, then the better completion.

Privacy unit: one row of ``A`` (replace-one adjacency); every row has l2 norm at most 1 as
computed (:mod:`dpprecond.pca.rows`). Given one Gaussian's worth of privacy, noise
multiplier ``z`` (precision ``1/z^2``, calibrated exactly for ``(epsilon, delta)`` by
:func:`dpprecond.pca.budget.plan_auto`), the method spends that precision in shares:

1. ``M1 = A^T A + W1`` (upper triangle; sensitivity ``sqrt(2)``; share ``init_share``).
   Its eigenvalues and top-k eigenvectors ``X0`` are public from here on.
2. A probe: the histogram of the preconditioned row norms ``r_i = ||B0 X0^T a_i||`` (in
   units of ``sqrt(k/n)``), ``B0 = (X0^T M1 X0)^{-1/2}`` (post-processing of ``M1``), on
   public bins. Replace-one moves one row from one bin to another: sensitivity
   ``sqrt(2)``; share ``probe_share``.
3. A rule (:func:`predict_errors`) computed from ``M1``'s eigenvalues, the noisy histogram
   and public ``(n, d, k, z)`` only predicts the error of each completion and picks one:

   a. *Analyze Gauss*: a second release ``M2 = A^T A + W2`` with the rest of the
      precision, averaged with ``M1`` by inverse variance; the average is ``A^T A`` plus
      one symmetric Gaussian of precision ``(init_share + rest)/(2 z^2)`` per entry. The
      two noises are drawn coupled (:func:`coupled_symmetric_noise`) so that this branch
      returns, for the same random stream, Analyze Gauss's own noise scaled by
      ``(1 - probe_share)^{-1/2}`` (exactly Analyze Gauss when ``probe_share = 0``).
   b. *Preconditioned clipped iteration* (:func:`clipped_step`), ``T`` times from ``X0``:
      ``B_t = (X_t^T M1 X_t)^{-1/2}`` (post-processing of ``M1``: no release), clip
      ``c_i = clip_R(B_t X_t^T a_i)`` and release ``Z_t = sum_i a_i c_i^T + G_t``
      (sensitivity ``2R``); the rest of the precision is split over the ``T`` releases
      with weights ``2^t`` (the last, which sets the error, gets the most).

Accounting: both branches release Gaussians whose precisions add up to ``1/z^2``
(``init + probe + rest``), so each branch is exactly the Gaussian mechanism with
multiplier ``z`` (adaptive composition of Gaussian mechanisms, Dong, Roth and Su 2019,
Cor. 3.3): the branch choice, a function of released values, changes nothing. The
returned ``DpEvent`` lists the releases actually made; its epsilon (PLD, exact) equals the
target in every branch. No budget is left unspent.

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
    check_choice,
    check_delta,
    check_epsilon,
    check_fraction,
    check_int,
    check_positive,
    check_random_state,
)
from dpprecond.accounting import compose, epsilon_of, gaussian
from dpprecond.clipping import clip_to_radius, safe_row_norms
from dpprecond.pca.budget import plan_auto
from dpprecond.pca.core import SQRT2, _serial_blas, orthonormalize, top_eigvecs
from dpprecond.pca.noise import gaussian_matrix, symmetric_gaussian
from dpprecond.pca.rows import RowSource
from dpprecond.secure import release

__all__ = [
    "AUTO_DEFAULTS",
    "HIST_EDGES",
    "RADIUS_GRID",
    "AutoResult",
    "CoupledNoise",
    "Prediction",
    "check_auto_options",
    "clipped_step",
    "coupled_symmetric_noise",
    "estimate_spectrum",
    "fit_auto",
    "iteration_weights",
    "noisy_histogram",
    "preconditioned_norms",
    "predict_errors",
    "probe_counts",
]

#: Edges of the probe histogram, in units of ``sqrt(k/n)`` (public): ``2^(j/2)`` from
#: 1/16 to 64, plus an underflow and an overflow bin.
HIST_EDGES = 2.0 ** (np.arange(-8, 13) / 2.0)
#: A value standing for each bin (geometric centres; the overflow bin counts as 64).
HIST_REPS = np.concatenate([[HIST_EDGES[0] / 2.0], np.sqrt(HIST_EDGES[:-1] * HIST_EDGES[1:]),
                            [HIST_EDGES[-1]]])
#: Clip radii the rule chooses from, in units of the rows' RMS preconditioned norm.
RADIUS_GRID = 2.0 ** np.arange(-3, 6)

#: Options of :func:`fit_auto` and their defaults.
AUTO_DEFAULTS: dict[str, Any] = {
    "init_share": 0.5,
    "probe_share": 0.01,
    "n_iter": None,
    "iter_choices": (2, 3),
    "switch_ratio": 0.9,
    "iter_calibration": 1.0,
    "branch": "rule",
    "clip_radius": None,
    "floor_factor": 4.0,
    "count_threshold": 3.0,
    "add_noise": True,
}


# --------------------------------------------------------------------------------------
# Noise coupling
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CoupledNoise:
    """Two independent symmetric Gaussian noises built from a full-budget draw.

    ``full`` (entry variance ``v``) is the noise a single release at the combined precision
    would add; ``extra`` (variance ``v1 - v``) is independent of it. Then

    - ``first = full + extra`` has variance ``v1``;
    - ``second = full - (v / (v1 - v)) extra`` has variance ``v v1 / (v1 - v)``, i.e.
      precision ``1/v - 1/v1``;
    - ``Cov(first, second) = v - (v / (v1 - v)) (v1 - v) = 0``: jointly Gaussian and
      uncorrelated, hence independent, so ``(first, second)`` has exactly the distribution
      of two independent draws and the privacy analysis of two independent releases holds;
    - the inverse-variance average of ``S + first`` and ``S + second`` is ``S + full``.
    """

    full: np.ndarray
    extra: np.ndarray
    var_full: float
    var_first: float

    @property
    def first(self) -> np.ndarray:
        """The first release's noise (variance ``var_first``)."""
        return self.full + self.extra

    @property
    def var_second(self) -> float:
        """Entry variance of :attr:`second` (``inf`` when the first takes everything)."""
        if self.var_first == self.var_full:
            return math.inf
        return self.var_full * self.var_first / (self.var_first - self.var_full)

    @property
    def second(self) -> np.ndarray:
        """The second release's noise, independent of :attr:`first`."""
        if self.var_first == self.var_full:
            raise ValueError("No precision is left for a second release (var_first == "
                             "var_full).")
        return self.full - (self.var_full / (self.var_first - self.var_full)) * self.extra


def coupled_symmetric_noise(dim: int, std_full: float, std_first: float,
                            rng: np.random.Generator) -> CoupledNoise:
    """Draw :class:`CoupledNoise` for two releases of a symmetric ``dim x dim`` statistic.

    ``full`` is drawn first, with exactly the call :func:`dpprecond.pca.noise.
    symmetric_gaussian` makes for a single release of entry std ``std_full``, so a
    generator in the same state gives the same ``full`` as that single release. ``extra``
    (std ``sqrt(std_first^2 - std_full^2)``) is drawn next from the same generator.

    Parameters
    ----------
    dim : int
        Size of the symmetric matrices.
    std_full : float
        Entry std of the combined (full-precision) noise; ``0`` switches noise off.
    std_first : float
        Entry std of the first release's noise, ``>= std_full``.
    rng : numpy.random.Generator
        Noise source.
    """
    if std_first < std_full:
        raise ValueError(f"Expected std_first >= std_full, got std_first={std_first} < "
                         f"std_full={std_full}.")
    full = symmetric_gaussian(dim, std_full, rng)
    extra = symmetric_gaussian(dim, math.sqrt(std_first**2 - std_full**2), rng)
    return CoupledNoise(full, extra, std_full**2, std_first**2)


# --------------------------------------------------------------------------------------
# Passes over the rows
# --------------------------------------------------------------------------------------


def _block_sum(rows: RowSource, func: Any, *args: Any, shape: tuple[int, ...]) -> np.ndarray:
    """``sum_b func(A_b, *args)`` over row blocks: the rows' own pass when they have one
    (on a dask cluster, on the workers), else blocks read with ``rows.rows``. The block
    functions below also take raw rows with their scale factors (``row_scaled``)."""
    if hasattr(rows, "block_sum"):
        return rows.block_sum(func, *args, shape=shape, row_scaled=True)
    out = np.zeros(shape)
    n = rows.shape[0]
    for lo in range(0, n, 8192):
        out += func(rows.rows(np.arange(lo, min(n, lo + 8192))), *args)
    return out


def _block_preconditioned_norms(block: np.ndarray, XB: np.ndarray,
                                scale: np.ndarray | None = None) -> np.ndarray:
    Y = block @ XB
    if scale is not None:  # the rows are scale_i * block_i
        Y *= scale[:, None]
    nu, pre = safe_row_norms(Y)
    with np.errstate(divide="ignore", over="ignore"):
        return np.where(pre == 1.0, nu, nu / pre)


def _block_histogram(block: np.ndarray, XB: np.ndarray, unit: float,
                     edges: np.ndarray, scale: np.ndarray | None = None) -> np.ndarray:
    r = _block_preconditioned_norms(block, XB, scale) / unit
    idx = np.searchsorted(edges, r, side="right")
    return np.bincount(idx, minlength=edges.size + 1).astype(np.float64)


def _block_clipped_step(block: np.ndarray, XB: np.ndarray, radius: float,
                        scale: np.ndarray | None = None) -> np.ndarray:
    # With ``scale``, the rows are a_i = scale_i block_i: c_i is computed from a_i XB and
    # a_i c_i^T = block_i (scale_i c_i)^T, so the block is never copied.
    Y = block @ XB
    if scale is not None:
        Y *= scale[:, None]
    nu, pre = safe_row_norms(Y)
    post = clip_to_radius(nu, pre, radius)
    C = Y * pre[:, None]
    with np.errstate(under="ignore"):
        C *= post[:, None]
    if scale is not None:
        C *= scale[:, None]
    return block.T @ C


def preconditioned_norms(rows: RowSource, X: np.ndarray, B: np.ndarray) -> np.ndarray:
    """``||B X^T a_i||`` for every row (one pass over ``A``; not a release by itself)."""
    XB = X @ B
    n = rows.shape[0]
    parts = [_block_preconditioned_norms(rows.rows(np.arange(lo, min(n, lo + 8192))), XB)
             for lo in range(0, n, 8192)]
    return np.concatenate(parts) if parts else np.zeros(0)


def probe_counts(rows: RowSource, X: np.ndarray, B: np.ndarray, unit: float,
                 edges: np.ndarray, std: float, rng: Any) -> np.ndarray:
    """Release the histogram of ``||B X^T a_i|| / unit`` on ``edges`` (one pass over ``A``).

    The counts are a sum of per-row indicator vectors (each client's or worker's blocks
    counted where they are); the release is :func:`noisy_histogram`'s, sensitivity
    ``sqrt(2)``.
    """
    counts = _block_sum(rows, _block_histogram, X @ B, unit, edges, shape=(edges.size + 1,))
    return release(counts, gaussian_matrix(counts.shape, std, rng), std, rng)


def noisy_histogram(values: np.ndarray, edges: np.ndarray, std: float,
                    rng: np.random.Generator) -> np.ndarray:
    """Release the counts of ``values`` in the bins of ``edges`` plus Gaussian noise.

    Bins: ``[0, e_0)``, ``[e_0, e_1)``, ..., ``[e_last, inf)``. Replace-one adjacency
    moves one value from one bin to another, so the count vector has l2 sensitivity
    ``sqrt(2)``; ``std`` must be ``noise_multiplier * sqrt(2)``.
    """
    idx = np.searchsorted(edges, values, side="right")
    counts = np.bincount(idx, minlength=edges.size + 1).astype(np.float64)
    return release(counts, gaussian_matrix(counts.shape, std, rng), std, rng)


def clipped_step(rows: RowSource, X: np.ndarray, B: np.ndarray, radius: float,
                 noise_std: float, rng: np.random.Generator) -> np.ndarray:
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
    return release(Z, gaussian_matrix((d, k), noise_std, rng), noise_std, rng)


def _preconditioner(H: np.ndarray, floor: float) -> np.ndarray:
    """``H^{-1/2}`` with eigenvalues raised to ``floor`` (``H`` symmetrised first)."""
    w, V = np.linalg.eigh(0.5 * (H + H.T))
    w = np.maximum(w, floor)
    return (V / np.sqrt(w)) @ V.T


def iteration_weights(n_iter: int) -> np.ndarray:
    """Shares of the iteration precision per step: ``2^t`` normalised (last step most)."""
    w = 2.0 ** np.arange(n_iter)
    return w / w.sum()


# --------------------------------------------------------------------------------------
# The rule
# --------------------------------------------------------------------------------------


def estimate_spectrum(eigvals: np.ndarray, center: float, k: int, noise_std: float,
                      d: int) -> tuple[float | None, np.ndarray]:
    """Estimates of the eigenvalues of ``A^T A`` from those of ``M1 = A^T A + W1``.

    ``W1`` is symmetric with entry std ``s``: its spectrum is a semicircle of half-width
    ``e = 2 s sqrt(d)``, centred here at ``center`` (the median eigenvalue of ``M1``, which
    the symmetric noise leaves in place). An eigenvalue of ``A^T A`` at height ``h`` above
    the centre shows in ``M1`` at about ``h + s^2 d / h`` if ``h > s sqrt(d)`` and inside
    the noise bulk otherwise (the spiked-Wigner transition; Baik, Ben Arous and Peche 2005,
    Peche 2006). Inverting: ``h = (t + sqrt(t^2 - e^2)) / 2`` for an observed height
    ``t > e``.

    Parameters
    ----------
    eigvals : ndarray
        Eigenvalues of ``M1`` in decreasing order (at least ``k + 1``; the rest of the
        spectrum is taken at ``center``).
    center, k, noise_std, d
        Bulk centre, number of components, entry std ``s`` of ``W1``, dimension.

    Returns
    -------
    lam_k : float or None
        ``lambda_k``; ``None`` when the k-th eigenvalue of ``M1`` is inside the noise bulk
        (``M1`` does not locate the top-k subspace).
    lam_rest : ndarray of shape (d - k,)
        ``lambda_{k+1}, ..., lambda_d``: inverted where above the bulk, ``center`` below,
        except ``lambda_{k+1}`` inside the bulk, taken as the top of the data's own bulk,
        whose half-width adds to the noise's in quadrature (free convolution of two
        semicircles): ``center + sqrt(max(0, t^2 - e^2))``. Capped at ``lam_k``.
    """
    edge = 2.0 * noise_std * math.sqrt(d)
    m = d - k
    t = np.asarray(eigvals, dtype=np.float64)[: d] - center
    above = t > edge
    h = np.where(above, (t + np.sqrt(np.maximum(t * t - edge * edge, 0.0))) / 2.0, 0.0)
    lam_k = float(center + h[k - 1]) if above[k - 1] else None
    rest = np.full(m, center)
    top = min(m, t.size - k)
    rest[:top] = center + h[k:k + top]
    if top > 0 and not above[k]:
        rest[0] = center + math.sqrt(max(0.0, float(t[k]) ** 2 - edge * edge))
    if lam_k is not None:
        rest = np.minimum(rest, lam_k)
    return lam_k, rest


@dataclass(frozen=True)
class Prediction:
    """Predicted errors of the two completions (computed from released values only).

    ``iterate`` says whether the rule picks the iteration; ``radius_factor`` (R in units of
    the rows' RMS preconditioned norm) and ``n_iter`` are its parameters; ``lam_k`` and
    ``lam_k1`` the spectrum estimates; ``rms_norm`` the RMS of the probe's norms (units of
    ``sqrt(k/n)``); ``reason`` a short explanation.
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


def _tan_to_sin(t: float) -> float:
    return t / math.sqrt(1.0 + t * t) if math.isfinite(t) else 1.0


def predict_errors(*, eigvals: np.ndarray, center: float, counts: np.ndarray, n: int, d: int,
                   k: int, init_std: float, full_std: float, rest_multiplier: float,
                   iter_choices: tuple[int, ...], count_std: float,
                   switch_ratio: float, iter_calibration: float,
                   count_threshold: float) -> Prediction:
    """The rule: predicted spectral sin-theta of each completion, and the choice.

    First-order perturbation of the k-th eigenvector, direction by direction
    (``lambda_j``, ``j > k``, from :func:`estimate_spectrum`; ``c_k = 1 + sqrt(k/(d-k))``
    turns the column norm into the spectral norm of the ``(d-k) x k`` tilt, as for a
    Gaussian matrix):

    - Analyze Gauss, entry noise std ``s``:
      ``tan^2 = c_k^2 s^2 sum_j 1 / (lambda_k - lambda_j)^2``.
    - Iteration with clip radius ``R`` (``w_i = min(1, R / r_i)``, ``r_i`` the
      preconditioned row norms): near ``V_k``, ``Z = S_w X B + G`` with
      ``S_w = sum_i w_i a_i a_i^T``, whose eigenvalues are about ``lambda_k a`` in the
      top-k directions (``a = mean(w r^2)``, ``r`` in units of the RMS norm) and
      ``lambda_j b`` outside (``b = mean(w)``: the rest of a row is taken independent of
      its top-k part). Per step, direction ``j`` contracts by
      ``rho_j = lambda_j b / (lambda_k a)`` and receives the noise of ``G_t`` (entry std
      ``2 R z_t``) divided by the top-k signal ``sqrt(lambda_k) a``; independent steps add
      in quadrature: ``e_j <- rho_j^2 e_j + (2 R z_t / (sqrt(lambda_k) a))^2``, from the
      start ``e_j = s_1^2 / (lambda_k - lambda_j)^2`` (``M1``'s own error, capped at a
      random start's ``tan^2 = (d - k)/k``); ``tan^2 = c_k^2 sum_j e_j``.
      ``a`` and ``b`` come from the released histogram (counts below ``count_threshold``
      noise stds read as zero); ``T`` and ``R`` are chosen from ``iter_choices`` and
      :data:`RADIUS_GRID` by the prediction. Clipping shrinks the noise with ``R`` but,
      when a few rows carry the top directions (coherence), shrinks ``a`` faster than
      ``b`` and the gap with it: the trade-off is found per data set.

    ``iter_calibration`` multiplies the iteration's noise term (1: the theory as is; the
    development cells measured 0.95, docs/pca_auto.md). The iteration is chosen when its
    predicted error is below ``switch_ratio`` times Analyze Gauss's, and never when
    ``lambda_k`` is not detectable in ``M1`` (the start would be random and the
    prediction has nothing to stand on).
    """
    m = d - k
    if m <= 0:
        return Prediction(False, 0.0, 0.0, math.nan, 0, None, math.nan, 1.0,
                          "Analyze Gauss: k = d, the top-k subspace is the whole space.")
    ck = 1.0 + math.sqrt(k / m)
    lam_k, lam_rest = estimate_spectrum(eigvals, center, k, init_std, d)
    lam_k1 = float(lam_rest[0])
    cnt = np.where(counts > count_threshold * count_std, counts, 0.0)
    total = float(cnt.sum())
    rms = math.sqrt(float((cnt * HIST_REPS**2).sum()) / total) if total > 0 else 1.0
    if lam_k is None or total <= 0:
        why = ("lambda_k is inside M1's noise bulk" if lam_k is None
               else "the probe histogram is empty after thresholding")
        return Prediction(False, 1.0, 1.0, math.nan, 0, lam_k, lam_k1, rms,
                          f"Analyze Gauss: {why}.")
    gaps = np.maximum(lam_k - lam_rest, 1e-300)
    inv2 = 1.0 / gaps**2
    e_ag = _tan_to_sin(ck * full_std * math.sqrt(float(inv2.sum())))
    start = init_std**2 * inv2
    if start.sum() > m / k:
        start *= (m / k) / start.sum()
    p = cnt / total
    r = HIST_REPS / rms
    best = (math.inf, math.nan, 0)
    for T in iter_choices:
        zs = rest_multiplier / np.sqrt(iteration_weights(T))
        for Rn in RADIUS_GRID:
            w = np.minimum(1.0, Rn / r)
            a = float((p * w * r * r).sum())
            b = float((p * w).sum())
            rho = lam_rest * b / (lam_k * a)
            if np.any(rho >= 1.0):
                continue
            R = Rn * math.sqrt(k / n)
            e = start.copy()
            for zt in zs:
                q = iter_calibration * 2.0 * R * zt / (math.sqrt(lam_k) * a)
                e = rho**2 * e + q * q
            err = _tan_to_sin(ck * math.sqrt(float(e.sum())))
            if err < best[0]:
                best = (err, float(Rn), int(T))
    e_it, Rn, T = best
    iterate = bool(e_it < switch_ratio * e_ag)
    reason = (f"{'iteration' if iterate else 'Analyze Gauss'}: predicted sin-theta "
              f"{e_it:.3g} (iteration, T={T}, R={Rn:g} rms) vs {e_ag:.3g} (Analyze Gauss), "
              f"switch ratio {switch_ratio:g}.")
    return Prediction(iterate, e_ag, float(e_it), Rn, T, lam_k, lam_k1, rms, reason)


# --------------------------------------------------------------------------------------
# The method
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AutoResult:
    """Output of :func:`fit_auto` (everything here is released or public).

    Attributes
    ----------
    components : ndarray of shape (d, k)
        Orthonormal basis of the estimated top-k subspace.
    eigenvalues : ndarray of shape (k,)
        Released estimates of the top-k eigenvalues of ``A^T A``: of the averaged matrix
        (Analyze Gauss branch) or ``eig(X^T M1 X)`` at the output ``X`` (iteration).
    dp_event : dp_accounting.DpEvent
        The releases actually made (composes to one Gaussian with multiplier
        ``noise_multipliers["z_pca"]``).
    epsilon : float
        Epsilon of ``dp_event`` at ``delta`` (PLD, exact; ``inf`` without noise).
    delta : float
    branch : str
        ``"analyze_gauss"`` or ``"iterate"``.
    info : dict
        Noise multipliers, the rule's prediction, the clip radius and iterations used.
    """

    components: np.ndarray
    eigenvalues: np.ndarray
    dp_event: dp_event.DpEvent
    epsilon: float
    delta: float
    branch: str
    info: dict[str, Any] = field(default_factory=dict)


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
    return opts


def fit_auto(rows: RowSource, S: np.ndarray, k: int, *, epsilon: float | None, delta: float,
             rng: Any = None, budget_share: float = 1.0,
             noise_multiplier: float | None = None, **options: Any) -> AutoResult:
    """Private top-k PCA that spends the whole ``(epsilon, delta)``: see the module doc.

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
    epsilon : float or None
        Target epsilon; ``None`` only with ``add_noise=False``.
    delta : float
        Target delta.
    rng : None, int, SeedSequence or numpy.random.Generator
        Noise source (fresh OS entropy when ``None``). With the same generator state,
        the Analyze Gauss branch reuses exactly the noise that
        :func:`dpprecond.pca.baselines.analyze_gauss` would draw (scaled by
        ``(1 - probe_share)^{-1/2}``).
    budget_share : float, default=1
        Share of the ``(epsilon, delta)`` Gaussian precision this fit may spend; the
        caller spent the rest on earlier Gaussian releases (a private mean with share
        ``1 - budget_share``). The returned event is this fit's releases only; composed
        with the caller's ``Gaussian(z / sqrt(1 - budget_share))`` it is exactly
        ``(epsilon, delta)``.
    noise_multiplier : float, optional
        The multiplier ``z`` of the one Gaussian this fit spends, already calibrated by the
        caller (``budget.plan_auto(...).noise_multipliers["z_pca"]``, as
        :func:`dpprecond.pca.fit_private_pca` does); then ``epsilon`` and ``budget_share``
        are not used for calibration.
    **options
        ``init_share`` (0.5): precision share of ``M1``. ``probe_share`` (0.01): share of
        the histogram probe. ``n_iter`` (None: the rule picks from ``iter_choices``,
        (2, 3)). ``switch_ratio`` (0.9) and ``iter_calibration`` (1): the rule's
        constants (:func:`predict_errors`). ``branch`` ("rule"; "analyze_gauss" or
        "iterate" force a branch, same budget). ``clip_radius`` (None: the rule's choice;
        a number fixes R in units of the rows' RMS preconditioned norm).
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
    probe histogram of ``r_i``                  ``sqrt(2)``   ``z / sqrt(probe_share)``
    (a) ``M2``: upper triangle of ``A^T A``     ``sqrt(2)``   ``z / sqrt(rest)``
    (b) ``Z_t = sum a_i c_i^T``, ``t < T``      ``2 R``       ``z / sqrt(rest w_t)``
    ==========================================  ============  ===============================

    with ``rest = 1 - init_share - probe_share`` and ``sum_t w_t = 1``. Noise stds are
    also multiplied by ``1 + rows.rounding_slack()`` when the rows provide it (the
    floating-point excess of block sums, :mod:`dpprecond.pca.rows`).
    """
    opts = check_auto_options(options)
    noise = opts["add_noise"]
    delta = check_delta(delta)
    if noise and noise_multiplier is None:
        epsilon = check_epsilon(epsilon)
    budget_share = check_fraction("budget_share", budget_share, low_open=True,
                                  high_open=False)
    n, d = rows.shape
    k = check_int("k", k, low=1, high=d)
    S = np.asarray(S, dtype=np.float64)
    if S.shape != (d, d):
        raise ValueError(f"Expected S of shape ({d}, {d}) (A^T A of the rows), got "
                         f"{S.shape}.")
    # A numpy Generator, or a stand-in that draws the noise differently (secure mode's
    # SecureGenerator, federated PCA's LocalNoise: each client's own noise).
    gen = rng if hasattr(rng, "standard_normal") and not isinstance(
        rng, np.random.RandomState) else check_random_state(rng, "rng")

    s1, sc = opts["init_share"], opts["probe_share"]
    rest = 1.0 - s1 - sc
    if noise and noise_multiplier is not None:
        z = check_positive("noise_multiplier", noise_multiplier)
    elif noise:
        z = plan_auto(epsilon, delta).noise_multipliers["z_pca"] / math.sqrt(budget_share)
    else:
        z = 0.0
    fp = 1.0 + rows.rounding_slack() if hasattr(rows, "rounding_slack") else 1.0
    z1, zc, zr = (z / math.sqrt(s1), z / math.sqrt(sc), z / math.sqrt(rest))
    z_ag = z / math.sqrt(s1 + rest)  # the inverse-variance average of M1 and M2
    std1, std_ag, std_c = SQRT2 * z1 * fp, SQRT2 * z_ag * fp, SQRT2 * zc * fp
    # The noise the releases actually carry, for the rule and the floors: federated PCA
    # without a trusted party (LocalNoise) adds every client's noise, sqrt(K) times std.
    amp = float(getattr(gen, "noise_amplification", 1.0))

    # -- release 1: M1 (coupled with the Analyze Gauss completion) -----------------------
    coupled = coupled_symmetric_noise(d, std_ag, std1, gen)
    M1 = release(S, coupled.first, std1, gen)
    with _serial_blas():  # see core._serial_blas: a d x d eigensolver on one BLAS thread
        spectrum = np.linalg.eigvalsh(M1)[::-1]
    center = float(np.median(spectrum))
    w1, U1 = top_eigvecs(M1, min(k + 1, d))
    X0 = U1[:, :k].copy()
    floor = opts["floor_factor"] * std1 * amp if noise else 1e-12 * max(float(np.trace(S)), 1e-300)
    B0 = _preconditioner(X0.T @ M1 @ X0, floor)

    # -- release 2: the probe histogram ---------------------------------------------------
    unit = math.sqrt(k / n)
    counts = probe_counts(rows, X0, B0, unit, HIST_EDGES, std_c, gen)

    # -- the rule (released values and public parameters only) ---------------------------
    iter_choices = (opts["n_iter"],) if opts["n_iter"] is not None else opts["iter_choices"]
    pred = predict_errors(eigvals=spectrum, center=center, counts=counts, n=n, d=d, k=k,
                          init_std=std1 * amp, full_std=std_ag * amp,
                          rest_multiplier=zr * amp, iter_choices=iter_choices,
                          count_std=std_c * amp,
                          switch_ratio=opts["switch_ratio"],
                          iter_calibration=opts["iter_calibration"],
                          count_threshold=opts["count_threshold"])
    branch = opts["branch"]
    if branch == "rule":
        branch = "iterate" if pred.iterate else "analyze_gauss"
    info: dict[str, Any] = {
        "noise_multipliers": {"z_pca": z, "z_init": z1, "z_probe": zc, "z_rest": zr},
        "prediction": asdict(pred), "probe_counts": counts, "center": center,
        "init_eigenvalues": w1, "n_iter": 0, "clip_radius": math.nan,
    }
    events = [gaussian(z1), gaussian(zc)]

    if branch == "analyze_gauss":
        if noise:
            M2 = release(S, coupled.second, math.sqrt(coupled.var_second), gen)
            v1, v2 = coupled.var_first, coupled.var_second
            M = (M1 / v1 + M2 / v2) / (1.0 / v1 + 1.0 / v2)
        else:
            M = S
        wa, Ua = top_eigvecs(M, k)
        X, eigenvalues = Ua, wa
        events.append(gaussian(zr))
    else:
        T = pred.n_iter if pred.n_iter > 0 else (opts["n_iter"] or max(iter_choices))
        Rn = opts["clip_radius"] if opts["clip_radius"] is not None else (
            pred.radius_factor if math.isfinite(pred.radius_factor) else 1.0)
        weights = iteration_weights(T)
        zts = [zr / math.sqrt(w) for w in weights]
        X = X0
        radii = []
        for t, zt in enumerate(zts):
            B = B0 if t == 0 else _preconditioner(X.T @ M1 @ X, floor)
            # At t = 0 the preconditioner uses M1's biased top eigenvalues, so the released
            # histogram's RMS sets the scale; later X is no longer aligned with W1.
            radius = Rn * unit * (pred.rms_norm if t == 0 else 1.0)
            radii.append(radius)
            Z = clipped_step(rows, X, B, radius, 2.0 * radius * zt * fp if noise else 0.0, gen)
            X = orthonormalize(Z)
            events.append(gaussian(zt))
        eigenvalues = np.linalg.eigvalsh(X.T @ M1 @ X)[::-1]
        info.update(n_iter=T, clip_radius=radii[-1], clip_radius_factor=Rn, clip_radii=radii,
                    iteration_multipliers=zts)
    event = compose(events)
    eps = epsilon_of(event, delta, "pld") if noise else math.inf
    info["branch"] = branch
    return AutoResult(components=np.ascontiguousarray(X), eigenvalues=np.asarray(eigenvalues),
                      dp_event=event if noise else dp_event.NonPrivateDpEvent(),
                      epsilon=eps, delta=delta, branch=branch, info=info)
