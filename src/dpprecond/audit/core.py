"""Empirical privacy audits: a lower bound on epsilon from a distinguishing test.

An audit runs a mechanism many times on two neighbouring datasets ``D`` and ``D'`` and
tries to tell the outputs apart with a threshold test on a scalar statistic (Jagielski,
Ullman and Oprea, 2020; Nasr, Song, Thakurta, Papernot and Carlini, 2021). If the mechanism
is ``(epsilon, delta)``-DP, every test that guesses "``D'``" on a set ``S`` of outputs has

    FPR = P[M(D) in S],  FNR = P[M(D') not in S],
    FPR + e^epsilon FNR >= 1 - delta  and  FNR + e^epsilon FPR >= 1 - delta,

so ``epsilon >= max(ln((1 - delta - FNR) / FPR), ln((1 - delta - FPR) / FNR))``. The
audit estimates FPR and FNR from held-out runs and replaces each by its one-sided
Clopper-Pearson upper bound at level ``1 - alpha/2`` (``alpha = 1 - confidence``); by the
union bound both hold together with probability at least ``1 - alpha``, and the bound is
decreasing in both rates, so the returned epsilon is a lower bound on the true epsilon of
the mechanism with confidence ``confidence``.

Choosing the threshold validly: the runs of each side are split; the threshold and the
direction of the test (guess ``D'`` above or below it) are chosen on the first
``calibration_fraction`` of the runs (the value that maximizes the same bound computed on
those runs), and the bound is computed only on the remaining runs, which are independent
of that choice. The test is then a fixed set ``S`` for the held-out runs and the
inequality above applies as stated.

Reading the result: a bound *above* the claimed epsilon proves, at the stated confidence,
that the code as run violates its claim. A bound below the claim proves nothing about the
claim; it measures the audit's power. With ``N`` held-out runs per side the bound cannot
exceed about ``ln(N / ln(2 / alpha))`` (no false positive at all), so large epsilons need
many runs. :func:`gaussian_audit_ceiling` gives the bound an ideal audit of a Gaussian
mechanism with the same number of runs would typically reach.

Statistics with power: for a Gaussian mechanism the likelihood ratio is monotone in the
projection of the output on the sensitivity direction (the difference of the noiseless
outputs on ``D'`` and ``D``), so that projection is the optimal statistic.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats

from dpprecond._validation import check_delta, check_fraction, check_int, check_positive

__all__ = [
    "AuditResult",
    "audit",
    "clopper_pearson_upper",
    "epsilon_lower_bound",
    "gaussian_audit_ceiling",
    "heldout_for_power",
    "largest_certifiable_bound",
    "sample_statistics",
    "threshold_audit",
]

#: A mechanism run once: ``(dataset, rng) -> statistic`` (or an output, see ``statistic``).
Mechanism = Callable[[Any, np.random.Generator], Any]
#: A vectorized mechanism: ``(dataset, rng, n_runs) -> statistics`` of shape ``(n_runs,)``.
BatchMechanism = Callable[[Any, np.random.Generator, int], np.ndarray]

#: Most candidate thresholds tried on the calibration runs (quantiles of the pooled runs).
MAX_THRESHOLDS = 2048


def clopper_pearson_upper(k: Any, n: Any, alpha: float) -> np.ndarray:
    """One-sided Clopper-Pearson upper bound on a binomial rate, level ``1 - alpha``.

    ``P[p <= upper] >= 1 - alpha`` for ``k`` successes in ``n`` trials: ``upper`` is the
    ``1 - alpha`` quantile of ``Beta(k + 1, n - k)`` (``1`` when ``k = n``). Vectorized
    over ``k`` and ``n``.
    """
    k = np.asarray(k, dtype=np.float64)
    n = np.asarray(n, dtype=np.float64)
    full = k >= n
    with np.errstate(invalid="ignore", divide="ignore"):
        upper = stats.beta.ppf(1.0 - alpha, k + 1.0, np.where(full, 1.0, n - k))
    return np.where(full, 1.0, upper)


def epsilon_lower_bound(false_positives: Any, n_null: Any, false_negatives: Any, n_alt: Any,
                        delta: float, confidence: float = 0.95) -> np.ndarray:
    """Lower bound on epsilon, valid with probability ``confidence``, from one test's errors.

    Parameters
    ----------
    false_positives, n_null : int or array
        Runs on ``D`` that the test attributed to ``D'``, out of ``n_null`` runs on ``D``.
    false_negatives, n_alt : int or array
        Runs on ``D'`` attributed to ``D``, out of ``n_alt`` runs on ``D'``.
    delta : float
        The delta of the claim being audited.
    confidence : float
        Joint confidence of the two Clopper-Pearson bounds (each at ``1 - alpha/2``).

    Returns
    -------
    ndarray
        ``max(0, ln((1 - delta - FNR_hi) / FPR_hi), ln((1 - delta - FPR_hi) / FNR_hi))``
        (see the module docstring), with the shape of the broadcast inputs.
    """
    alpha = 1.0 - confidence
    fpr = clopper_pearson_upper(false_positives, n_null, alpha / 2.0)
    fnr = clopper_pearson_upper(false_negatives, n_alt, alpha / 2.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        one = np.log(np.maximum(1.0 - delta - fnr, 0.0) / fpr)
        two = np.log(np.maximum(1.0 - delta - fpr, 0.0) / fnr)
    return np.maximum(0.0, np.maximum(np.nan_to_num(one, nan=0.0, neginf=0.0),
                                      np.nan_to_num(two, nan=0.0, neginf=0.0)))


@dataclass(frozen=True)
class AuditResult:
    """Outcome of a threshold audit (see the module docstring).

    Attributes
    ----------
    epsilon_lower_bound : float
        Lower bound on the mechanism's epsilon at ``delta``, valid with ``confidence``.
    confidence : float
    delta : float
    n_runs : tuple of int
        Runs on ``D`` and on ``D'`` (calibration and held-out together).
    n_heldout : tuple of int
        Held-out runs on ``D`` and ``D'`` (the ones the bound is computed from).
    threshold : float
        The threshold chosen on the calibration runs.
    direction : int
        ``+1``: the test guesses ``D'`` when the statistic is above ``threshold``;
        ``-1``: when it is below.
    false_positives, false_negatives : int
        Held-out runs on ``D`` guessed ``D'``, and on ``D'`` guessed ``D``.
    claimed_epsilon : float or None
        The epsilon the mechanism claims, if given.
    """

    epsilon_lower_bound: float
    confidence: float
    delta: float
    n_runs: tuple[int, int]
    n_heldout: tuple[int, int]
    threshold: float
    direction: int
    false_positives: int
    false_negatives: int
    claimed_epsilon: float | None = None

    @property
    def violation(self) -> bool:
        """True when the lower bound exceeds the claimed epsilon (a proven violation)."""
        return self.claimed_epsilon is not None and (
            self.epsilon_lower_bound > self.claimed_epsilon)

    def summary(self) -> str:
        """One line: bound, confidence, runs, errors and the claim."""
        claim = "" if self.claimed_epsilon is None else (
            f" (claimed {self.claimed_epsilon:.4g}{', VIOLATED' if self.violation else ''})")
        return (f"epsilon >= {self.epsilon_lower_bound:.4g} at delta={self.delta:g} with "
                f"{100 * self.confidence:g}% confidence{claim}; held-out runs "
                f"{self.n_heldout[0]}+{self.n_heldout[1]}, FP={self.false_positives}, "
                f"FN={self.false_negatives}")


def _errors(null_sorted: np.ndarray, alt_sorted: np.ndarray,
            thresholds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """False positives ``#(null > t)`` and false negatives ``#(alt <= t)`` per threshold."""
    fp = null_sorted.size - np.searchsorted(null_sorted, thresholds, side="right")
    fn = np.searchsorted(alt_sorted, thresholds, side="right")
    return fp, fn


def threshold_audit(null_stats: Any, alt_stats: Any, delta: float, *,
                    confidence: float = 0.95, calibration_fraction: float = 0.5,
                    claimed_epsilon: float | None = None) -> AuditResult:
    """Audit from precomputed statistics of runs on ``D`` (null) and on ``D'`` (alt).

    The runs are i.i.d. on each side, in any order; the first ``calibration_fraction`` of
    each side chooses the threshold and direction, the rest gives the bound (see the module
    docstring).

    Parameters
    ----------
    null_stats, alt_stats : array-like of shape (n,) and (m,)
        The statistic of each run on ``D`` and on ``D'`` (finite).
    delta : float
        Delta of the audited claim, in [0, 1).
    confidence : float, default=0.95
        Confidence of the lower bound, in (0, 1).
    calibration_fraction : float, default=0.5
        Share of each side's runs used to choose the threshold, in (0, 1).
    claimed_epsilon : float, optional
        The claim, recorded in the result (``AuditResult.violation``).

    Returns
    -------
    AuditResult
    """
    null = _check_stats("null_stats", null_stats)
    alt = _check_stats("alt_stats", alt_stats)
    delta = _check_audit_delta(delta)
    confidence = check_fraction("confidence", confidence, low_open=True, high_open=True)
    frac = check_fraction("calibration_fraction", calibration_fraction, low_open=True,
                          high_open=True)
    n_cal = (max(1, int(frac * null.size)), max(1, int(frac * alt.size)))
    if n_cal[0] >= null.size or n_cal[1] >= alt.size:
        raise ValueError(f"Need at least 2 runs per side to split into calibration and "
                         f"held-out runs, got {null.size} and {alt.size}.")
    best = (-1.0, 0.0, 1)
    for direction in (1, -1):
        cal_null = np.sort(direction * null[:n_cal[0]])
        cal_alt = np.sort(direction * alt[:n_cal[1]])
        pooled = np.concatenate([cal_null, cal_alt])
        qs = np.linspace(0.0, 1.0, min(MAX_THRESHOLDS, pooled.size))
        values = np.unique(np.quantile(pooled, qs, method="inverted_cdf"))
        thresholds = np.sort(np.concatenate([values, 0.5 * (values[1:] + values[:-1])]))
        fp, fn = _errors(cal_null, cal_alt, thresholds)
        eps = epsilon_lower_bound(fp, n_cal[0], fn, n_cal[1], delta, confidence)
        # Among equally good thresholds (a flat stretch, e.g. between two separated
        # samples) take the middle one: the held-out runs are less likely to straddle it.
        ties = np.flatnonzero(eps >= eps.max() - 1e-12)
        i = int(ties[ties.size // 2])
        if eps[i] > best[0]:
            best = (float(eps[i]), float(thresholds[i]), direction)
    _, t, direction = best
    held_null = np.sort(direction * null[n_cal[0]:])
    held_alt = np.sort(direction * alt[n_cal[1]:])
    fp, fn = _errors(held_null, held_alt, np.array([t]))
    bound = float(epsilon_lower_bound(fp[0], held_null.size, fn[0], held_alt.size, delta,
                                      confidence))
    return AuditResult(bound, confidence, delta, (null.size, alt.size),
                       (held_null.size, held_alt.size), direction * t, direction,
                       int(fp[0]), int(fn[0]), claimed_epsilon)


def sample_statistics(mechanism: Mechanism | BatchMechanism, dataset: Any, n_runs: int,
                      rng: np.random.Generator, *, batch: bool = False,
                      statistic: Callable[[Any], float] | None = None) -> np.ndarray:
    """Run ``mechanism`` ``n_runs`` times on ``dataset``; return the statistics, (n_runs,).

    With ``batch=False`` each run gets its own generator spawned from ``rng`` and the
    result (passed through ``statistic`` when given) must be a scalar. With ``batch=True``
    the mechanism is called once as ``mechanism(dataset, rng, n_runs)`` and must return
    ``n_runs`` i.i.d. statistics (or outputs that ``statistic`` maps to them).
    """
    n_runs = check_int("n_runs", n_runs, low=1)
    if batch:
        out = mechanism(dataset, rng, n_runs)  # type: ignore[call-arg]
        values = np.asarray(out if statistic is None else statistic(out), dtype=np.float64)
        if values.shape != (n_runs,):
            raise ValueError(f"A batch mechanism must return {n_runs} statistics, got shape "
                             f"{values.shape}.")
    else:
        values = np.empty(n_runs)
        for i, g in enumerate(rng.spawn(n_runs)):
            out = mechanism(dataset, g)  # type: ignore[call-arg]
            values[i] = float(out if statistic is None else statistic(out))
    return _check_stats("the mechanism's statistics", values)


def audit(mechanism: Mechanism | BatchMechanism, pair: tuple[Any, Any], *, n_runs: int,
          delta: float, confidence: float = 0.95, batch: bool = False,
          statistic: Callable[[Any], float] | None = None,
          claimed_epsilon: float | None = None, calibration_fraction: float = 0.5,
          seed: Any = None) -> AuditResult:
    """Run ``mechanism`` ``n_runs`` times on each dataset of ``pair`` and audit it.

    Parameters
    ----------
    mechanism : callable
        ``(dataset, rng) -> statistic`` (or an output that ``statistic`` maps to a scalar);
        with ``batch=True``, ``(dataset, rng, n) -> statistics of shape (n,)``.
    pair : (D, D')
        Neighbouring datasets (the worst case for the claim's privacy unit).
    n_runs : int
        Runs per dataset (calibration and held-out together, at least 4).
    delta : float
        Delta of the claim.
    confidence : float, default=0.95
        Confidence of the lower bound.
    batch : bool, default=False
        Whether ``mechanism`` is vectorized over runs.
    statistic : callable, optional
        Maps an output (or a batch of outputs) to statistics.
    claimed_epsilon : float, optional
        The mechanism's claimed epsilon at ``delta`` (recorded; see ``violation``).
    calibration_fraction : float, default=0.5
        Share of the runs that choose the threshold.
    seed : None, int or SeedSequence
        Root of the noise of all runs; ``None`` draws fresh OS entropy.

    Returns
    -------
    AuditResult
    """
    n_runs = check_int("n_runs", n_runs, low=4)
    if claimed_epsilon is not None:
        claimed_epsilon = check_positive("claimed_epsilon", claimed_epsilon, allow_zero=True,
                                         allow_inf=True)
    root = seed if isinstance(seed, np.random.SeedSequence) else np.random.SeedSequence(seed)
    rng_null, rng_alt = (np.random.default_rng(s) for s in root.spawn(2))
    null = sample_statistics(mechanism, pair[0], n_runs, rng_null, batch=batch,
                             statistic=statistic)
    alt = sample_statistics(mechanism, pair[1], n_runs, rng_alt, batch=batch,
                            statistic=statistic)
    return threshold_audit(null, alt, delta, confidence=confidence,
                           calibration_fraction=calibration_fraction,
                           claimed_epsilon=claimed_epsilon)


def gaussian_audit_ceiling(mu: float, n_heldout: int, delta: float,
                           confidence: float = 0.95) -> float:
    """The bound a threshold audit of ``N(0, 1)`` against ``N(mu, 1)`` typically reaches.

    Plugs the expected error counts of every threshold (``n_heldout`` runs per side) into
    :func:`epsilon_lower_bound` and returns the best. It is what an audit with the optimal
    statistic and a well chosen threshold gets on a Gaussian mechanism whose pair has
    ``mu = sensitivity / noise std`` (a typical value, not a guarantee). As ``n_heldout``
    grows it tends to the exact epsilon of that Gaussian mechanism at ``delta``.
    """
    mu = check_positive("mu", mu, allow_zero=True)
    n = check_int("n_heldout", n_heldout, low=1)
    t = np.linspace(-10.0, 10.0 + mu, 4001)
    fp = np.round(n * stats.norm.sf(t))
    fn = np.round(n * stats.norm.cdf(t - mu))
    return float(np.max(epsilon_lower_bound(fp, n, fn, n, delta, confidence)))


def largest_certifiable_bound(claimed_epsilon: float, n_heldout: int, delta: float,
                              confidence: float = 0.95) -> float:
    """The bound an audit with ``n_heldout`` runs per side could certify at most, typically,
    if the mechanism were exactly at its claim: :func:`gaussian_audit_ceiling` of the
    Gaussian mechanism whose epsilon at ``delta`` is ``claimed_epsilon``.

    It measures the power of the audit's size, whatever the pair: an audit whose largest
    certifiable bound is far below the claim could not see a violation of that size. (What
    a given pair can show at most is its own Gaussian's epsilon, ``AuditCase.pair_epsilon``.)
    """
    from dpprecond.accounting import calibrate_noise, gaussian

    claimed_epsilon = check_positive("claimed_epsilon", claimed_epsilon)
    z = calibrate_noise(gaussian, claimed_epsilon, check_delta("delta", delta), "pld", rel_tol=1e-6)
    return gaussian_audit_ceiling(1.0 / z, n_heldout, delta, confidence)


def heldout_for_power(claimed_epsilon: float, delta: float, fraction: float = 0.9,
                      confidence: float = 0.95) -> int:
    """The fewest held-out runs per side whose :func:`largest_certifiable_bound` reaches
    ``fraction`` of the claim (a search over powers of ``2^(1/8)``, rounded up to a
    thousand)."""
    fraction = check_fraction("fraction", fraction, low_open=True, high_open=True)
    target = fraction * check_positive("claimed_epsilon", claimed_epsilon)
    n = 1000.0
    while largest_certifiable_bound(claimed_epsilon, int(n), delta, confidence) < target:
        n *= 2.0 ** 0.125
        if n > 1e12:
            raise ValueError(f"No audit of up to 1e12 runs reaches {fraction:g} of "
                             f"claimed_epsilon={claimed_epsilon:g} at delta={delta:g}.")
    return int(math.ceil(n / 1000.0) * 1000)


def _check_stats(name: str, values: Any) -> np.ndarray:
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim != 1 or arr.size < 2:
        raise ValueError(f"Expected {name} to be a 1-D array of at least 2 runs, got shape "
                         f"{arr.shape}.")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} contains NaN or infinite statistics; a statistic must be "
                         "finite (map non-finite outputs to a finite value first).")
    return arr


def _check_audit_delta(delta: Any) -> float:
    if isinstance(delta, (int, float)) and not isinstance(delta, bool) and delta == 0:
        return 0.0  # pure DP claims are audited too
    if isinstance(delta, (int, float)) and math.isfinite(delta) and delta >= 1:
        raise ValueError(f"Expected delta in [0, 1), got delta={delta!r}: a claim with "
                         "delta >= 1 says nothing and cannot be audited.")
    return check_delta("delta", delta)
