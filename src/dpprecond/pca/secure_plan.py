"""The secure sums of a federated PCA fit under a modulus cap: their bits, their scale.

Under ``trust="secure-aggregation"`` every release of a federated fit is a secure sum
(:mod:`dpprecond.secagg.sums`): each client scales its part by a power of two ``gamma``,
rounds it to integers and adds its Skellam share, and the server reads the sum modulo
``2^bits``. In process a sum may take up to ``2^62``; a secure-aggregation protocol may
carry less (Flower's SecAgg+: ``2^30``, :data:`~dpprecond.secagg.rounds.FIT_BITS`).

A sum's bits grow with ``gamma`` (the integers are ``gamma`` times the data), so a sum that
does not fit at the default scale (``gamma Delta >= sqrt(m) / 2^-10``: the rounding adds at
most ``2^-10`` to the noise std, :data:`~dpprecond.secagg.sums.ROUNDING_INFLATION`) fits at
a coarser one, at more noise: the decoded std is ``z Delta (1 + inflation)`` with
``inflation = sqrt(m) / (gamma Delta)``. The accounting must cover the coarsest scale a sum
may take (:func:`~dpprecond.secagg.sums.sum_event` at that inflation), so a fit under a cap
of ``2^fit_bits`` chooses, before any data is touched, one bound ``I`` on the inflation of
all its sums (:func:`capped_secure_plan`):

- ``I`` is the smallest of ``2^-10, 2^-9, ..., 2^-3`` (:data:`MAX_FIT_INFLATION`) at which
  every sum the method may make fits ``2^fit_bits`` even at the largest ``gamma Delta`` its
  sensitivity may give it (:func:`sum_modulus_bits`); its inputs are public (``n``, ``d``,
  ``k``, ``K``, ``min_clients``, the method, its options, the budget);
- the fit's Skellam events are calibrated at ``I``
  (:func:`~dpprecond.pca.budget.secure_aggregation_plan`), so the reported epsilon is the
  target whatever scale each sum takes;
- each release starts at ``2^-10`` and halves ``gamma`` only while its own modulus exceeds
  the cap and its inflation stays at most ``I``, below ``gamma = 1`` if need be
  (:func:`~dpprecond.secagg.sums.plan_sum` with ``fit_bits``, ``max_inflation`` and
  ``min_scale = 0``): a sum that fits at the default scale keeps it.

Where every sum fits at ``2^-10``, ``I = 2^-10`` and the fit is the uncapped fit, event and
releases alike. Each release plans its default scale first, so a sum with no plan there
(Skellam shares of mean above ``2^50``, at very small epsilon or many iterations) is
refused before the charge even where a coarser scale would fit; coarsening applies to
sums whose default-scale plan exists and needs too many bits. Where none of the bounds
fits, the fit is refused (:class:`ModulusUnavailableError`) before the ledger is charged.
``2^-3`` is the coarsest bound: at most 12.5% more noise std than the central Gaussian's;
the Skellam bound of :mod:`dpprecond.secagg.sums` needs ``inflation <= 1/5``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from dpprecond.pca.budget import BudgetPlan, secure_aggregation_plan
from dpprecond.secagg.sums import ROUNDING_INFLATION, check_inflation, plan_sum

__all__ = ["MAX_FIT_INFLATION", "ModulusUnavailableError", "capped_secure_plan",
           "fit_inflations", "gram_modulus_bits", "secure_release_sums", "sum_modulus_bits",
           "widest_sum"]

#: The coarsest rounding scale a capped fit may take: the decoded noise std at most 12.5%
#: above the central Gaussian's.
MAX_FIT_INFLATION = 2.0**-3


class ModulusUnavailableError(ValueError):
    """A secure sum of the fit needs a modulus above the cap even at the coarsest scale the
    accounting covers (:data:`MAX_FIT_INFLATION`), or has no plan at all."""


def fit_inflations() -> list[float]:
    """The bounds a capped fit tries, finest first: ``2^-10, 2^-9, ..., 2^-3``."""
    lo = round(math.log2(ROUNDING_INFLATION))
    hi = round(math.log2(MAX_FIT_INFLATION))
    return [2.0**e for e in range(lo, hi + 1)]


def sum_modulus_bits(dim: int, n_rows: int, n_clients: int, noise_multiplier: float,
                     min_clients: int | None = None, *,
                     inflation: float = ROUNDING_INFLATION) -> int:
    """Bits of the modulus a secure sum of ``dim`` coordinates over ``n_rows`` rows needs
    at noise multiplier ``noise_multiplier``, at the largest ``gamma Delta`` any release
    sensitivity may give it at rounding inflation ``inflation``.

    ``gamma`` is the power of two with ``gamma Delta`` in ``[sqrt(m) / inflation,
    2 sqrt(m) / inflation)`` (:func:`~dpprecond.secagg.sums.plan_sum`), and the plan's
    integers depend on ``Delta`` only through ``gamma Delta`` (its bits grow with it): the
    bound is the plan at ``gamma = 1`` and ``Delta`` the largest float below ``2 sqrt(m) /
    inflation``, the supremum a release attains. The multiplier is nudged up by
    ``2^-39`` (:func:`~dpprecond.secagg.sums.release_plan` plans a release at ``z (1 +
    2^-40)``). The bits grow with ``dim``, with the multiplier and as the inflation falls.
    A capped release (:func:`~dpprecond.secagg.sums.release_plan`: ``plan_sum(...,
    fit_bits=, max_inflation=inflation, min_scale=0)``) coarsens its scale down to a
    ``gamma Delta`` in ``[sqrt(m) / inflation, 2 sqrt(m) / inflation)``, below
    ``gamma = 1`` if need be, so it fits whenever this bound does.
    """
    inflation = check_inflation(inflation)
    # gamma Delta < 2 sqrt(m) / inflation exactly (for a power-of-two inflation); a plan
    # at a sensitivity that large takes gamma = 1, so gamma Delta is this value itself.
    worst = float(np.nextafter(2.0 * math.sqrt(dim) / inflation, 0.0))
    k_min = n_clients if min_clients is None else min_clients
    return plan_sum(dim, worst, noise_multiplier * (1.0 + 2.0**-39), n_rows=n_rows,
                    n_clients=n_clients, min_clients=k_min, inflation=inflation).bits


def gram_modulus_bits(n_features: int, n_rows: int, n_clients: int,
                      noise_multiplier: float, min_clients: int | None = None, *,
                      inflation: float = ROUNDING_INFLATION) -> int:
    """Bits of the modulus a secure Gram sum of ``d = n_features`` (its ``d (d + 1) / 2``
    coordinates) needs over ``n_rows`` rows (:func:`sum_modulus_bits`)."""
    return sum_modulus_bits(n_features * (n_features + 1) // 2, n_rows, n_clients,
                            noise_multiplier, min_clients, inflation=inflation)


def secure_release_sums(method: str, plan: BudgetPlan, n_features: int, n_components: int,
                        options: dict[str, Any] | None = None
                        ) -> list[tuple[str, int, float]]:
    """Every kind of secure sum a fit of ``method`` may make: ``(what, coordinates, noise
    multiplier)``, the largest multiplier of each kind.

    The multipliers are the plan's (``z0``, ``z_power``, ``z_mean``) and, for ``auto``,
    those :func:`~dpprecond.pca.auto.fit_auto` splits ``z_pca`` into: ``M1`` at ``z /
    sqrt(init_share)``, the probe at ``z / sqrt(probe_share)`` (not with
    ``branch="analyze_gauss"``, which never releases it), the rescaled diagnostic at
    ``z / sqrt(rescale_share)`` (``branch="rule"``), the completion at ``z / sqrt(rest)``
    (at ``z / sqrt(1 - init_share)``, smaller, when the fit releases no probe) and the
    iteration's steps at ``z / sqrt(rest w_0)`` (``w_0 = 1 / (2^T - 1)`` the smallest step
    weight of the most steps ``T`` it may take). ``options`` are the
    method's (``auto``'s: :data:`~dpprecond.pca.auto.AUTO_DEFAULTS`).
    """
    from dpprecond.pca.auto import AUTO_DEFAULTS, HIST_EDGES, check_auto_options

    d = int(n_features)
    k = min(int(n_components), d)  # a larger k is refused by the fit, by name
    z = plan.noise_multipliers
    gram, product = d * (d + 1) // 2, d * k
    sums: list[tuple[str, int, float]] = []
    if "z_mean" in z:
        sums.append(("the private mean", d, z["z_mean"]))
    if method == "auto":
        opts = check_auto_options({key: val for key, val in (options or {}).items()
                                   if key in AUTO_DEFAULTS})
        zp, s1, sc = z["z_pca"], opts["init_share"], opts["probe_share"]
        rest = 1.0 - s1 - sc
        sums.append(("the Gram matrix", gram, zp / math.sqrt(s1)))
        if opts["branch"] != "analyze_gauss":  # the forced Analyze Gauss releases no probe
            sums.append(("auto's probe", 2 * (HIST_EDGES.size + 1), zp / math.sqrt(sc)))
        left = rest
        if opts["branch"] == "rule":
            st = opts["rescale_share"]
            sums.append(("auto's rescaled Gram matrix", gram, zp / math.sqrt(st)))
            left = rest - st  # check_auto_options: rest > rescale_share
        z_left = zp / math.sqrt(left)
        if opts["branch"] != "iterate":
            sums.append(("the Gram matrix's completion", gram, z_left))
        if opts["branch"] != "analyze_gauss":
            steps = opts["n_iter"] if opts["n_iter"] is not None else max(opts["iter_choices"])
            sums.append(("auto's clipped step", product,
                         z_left * math.sqrt(2.0**steps - 1.0)))
    elif method == "power":
        if "z0" in z:
            sums.append(("the Gram matrix", gram, z["z0"]))
        sums.append(("a power iteration's product", product, z["z_power"]))
    else:
        sums.append(("the Gram matrix", gram, z["z0"]))
    return [(what, dim, mult) for what, dim, mult in sums if math.isfinite(mult)]


def widest_sum(plan: BudgetPlan, *, method: str, n_features: int, n_components: int,
               n_rows: int, n_clients: int, min_clients: int | None,
               options: dict[str, Any] | None = None,
               inflation: float = ROUNDING_INFLATION) -> tuple[int, str, int, float]:
    """``(bits, what, coordinates, noise multiplier)`` of the sum of a fit at ``plan``
    (a secure plan) that needs the most bits at rounding inflation ``inflation``
    (:func:`sum_modulus_bits` of every sum :func:`secure_release_sums` lists).

    Raises :class:`ModulusUnavailableError` when a sum has no plan at all at its worst
    scale (integers beyond ``2^52``, shares above ``2^50``, no modulus up to ``2^62``).
    """
    need = []
    for what, dim, z in secure_release_sums(method, plan, n_features, n_components, options):
        try:
            bits = sum_modulus_bits(dim, n_rows, n_clients, z, min_clients,
                                    inflation=inflation)
        except ValueError as exc:  # no plan at all at the sum's worst scale
            raise ModulusUnavailableError(
                f"a secure sum of {what} of d={n_features} features over n={n_rows} rows "
                f"({dim} coordinates at noise multiplier {z:.4g}, {n_clients} clients) has "
                f"no plan at the worst scale a release may give it: {exc}") from exc
        need.append((bits, what, dim, z))
    return max(need, key=lambda item: item[0])


def capped_secure_plan(plan: BudgetPlan, epsilon: float, delta: float, *, method: str,
                       n_features: int, n_components: int, n_rows: int, n_clients: int,
                       min_clients: int | None, fit_bits: int,
                       options: dict[str, Any] | None = None) -> tuple[BudgetPlan, float]:
    """The secure plan of a fit whose sums must fit ``2^fit_bits``, and its inflation bound.

    ``plan`` is the method's Gaussian plan; each bound of :func:`fit_inflations` (finest
    first) recalibrates it (:func:`~dpprecond.pca.budget.secure_aggregation_plan` at that
    inflation, to ``(epsilon, delta)``) until every sum fits at its worst scale
    (:func:`widest_sum`). Returns ``(secure plan, inflation bound)``: the releases take
    ``plan_sum(..., fit_bits=fit_bits, max_inflation=bound)``. At the first bound,
    ``2^-10``, the plan is the uncapped fit's.

    Raises :class:`ModulusUnavailableError` naming the sum, its bits and the cap when no
    bound fits.
    """
    where: dict[str, Any] = dict(method=method, n_features=n_features,
                                 n_components=n_components, n_rows=n_rows,
                                 n_clients=n_clients, min_clients=min_clients, options=options)
    widest: tuple[int, str, int, float] | None = None
    for inflation in fit_inflations():
        secure = secure_aggregation_plan(plan, epsilon, delta, inflation=inflation)
        # A release plans its default scale first (then coarsens): that plan must exist
        # at this calibration's multipliers (raises ModulusUnavailableError otherwise;
        # a coarser bound only raises the multipliers).
        widest = widest_sum(secure, **where)
        if inflation != ROUNDING_INFLATION:
            widest = widest_sum(secure, **where, inflation=inflation)
        if widest[0] <= fit_bits:
            return secure, inflation
    assert widest is not None
    bits, what, dim, z = widest
    raise ModulusUnavailableError(
        f"a secure sum of {what} of d={n_features} features over n={n_rows} rows ({dim} "
        f"coordinates at noise multiplier {z:.4g}, {n_clients} clients) needs a modulus of "
        f"2^{bits} even at the coarsest rounding scale the accounting covers (inflation "
        f"2^{round(math.log2(MAX_FIT_INFLATION))}: noise std at most 12.5% above the central "
        f"Gaussian's), above the 2^{fit_bits} the secure aggregation carries")
