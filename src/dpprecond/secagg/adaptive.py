"""Adaptive clipping under secure aggregation: the round's count rides in the secure sum.

Under ``trust="local"`` adaptive clipping (:mod:`dpprecond.fl.adaptive_clip`) has every
client release, beside its message, the noisy count of its records whose gradient norm
is at most the round's clip ``C_t``. Under secure aggregation the count is one more
coordinate of the client's part, so the server learns only the *total* count, noised
once, with the same shares of the same Skellam sum:

    u_i = [p_i, kappa_t c_i],   p_i = sum_{x in D_i} clip_{C_t}(g(x)),
    c_i = #{x in D_i : ||g(x)|| <= C_t}.

The server decodes the sum of the ``u_i``; its first ``p`` coordinates over ``N`` are the
round's size-weighted mean gradient ``G`` (as without adaptive clipping), its last over
``kappa_t N`` the noisy fraction ``b_t``, and ``C_{t+1} = C_t exp(-lr (b_t - gamma))``
(:func:`~dpprecond.fl.adaptive_clip.geometric_update`, post-processing: the clip is
public).

**Sensitivity.** Replacing one record of client ``i`` moves ``p_i`` by at most ``Delta_p
= 2 C_t (1 + slack)`` (:func:`~dpprecond.secagg.rounds.part_sensitivity`, the computed sums)
and ``c_i`` by at most 1 (one indicator, a function of that record and the public
parameters); no other part changes. The count coordinate is the float product
``fl(kappa c)`` of an exact integer ``c <= n`` (rows of the client): ``|fl(kappa c) -
kappa c| <= u kappa c`` (``u = 2^-53``), so two neighbours' coordinates differ by at most
``Delta_c = kappa (1 + 2 u n)``. The part's L2 sensitivity is ``Delta = hypot(Delta_p,
Delta_c)``, computed and then raised by ``2^-50`` relatively to cover the rounding of
``hypot`` (:func:`counted_sensitivity`). Every record adds at most ``sqrt(C_t^2 +
kappa^2) <= Delta`` to the part, which sizes the modulus as for every secure sum.

**Budget.** The sum is one Skellam release with noise multiplier ``z`` over ``Delta``: the
same event, :func:`~dpprecond.secagg.fl.round_event` ``(z)``, as the round without
adaptive clipping, so the run's epsilon is unchanged. The weight ``kappa_t = Delta_p
sqrt(s / (1 - s))`` (``s = count_share``, 5% by default; :func:`count_weight`) gives the
count ``s`` of the sum's Gaussian precision, as the local path gives it: the gradient's
noise std over ``Delta_p`` is ``z / sqrt(1 - s)`` and the count's over 1 is ``z / sqrt(s)``
(up to ``1 + 2 u n`` and the plan's rounding inflation). Unlike the local path, the count's
noise is added once to the total, not once per client.

The plan changes with ``C_t`` (its sensitivity), so each round has its own
(:func:`counted_plan`). Its modulus must fit ``2^30`` (:data:`~dpprecond.secagg.rounds.
FIT_BITS`, what Flower's SecAgg+ carries), and the scale ``gamma`` is a power of two: at
some data shapes only part of each octave of clips has a plan that fits (Fashion-MNIST's
shape at ``K = 100``: about 72%; the plan at ``2^-10`` inflation needs 35 bits and
coarsening the scale within the accounted ``2^-6`` reaches 30 bits only where ``gamma
Delta`` falls low in its octave). So a round applies :meth:`SecureClip.applied`: the
largest clip of ``C_t 2^(-j/16)``, ``j = 0..16``, whose plan fits, else ``C_t`` itself
(the simulator then runs a plan above ``2^30``, which SecAgg+ refuses by name before the
round is charged). The choice is a function of the public clip and settings, the same in
the simulator and on SecAgg+, whose quantization range is ``2^30`` for such a run. The
count is taken at the applied clip; the update moves the target ``C_t`` itself, so that
it settles where the applied clip's fraction is the target quantile.

Scope: the one-message gradient methods (not the noise-aware SOFIM forms, whose noise
variance is fixed at the start), the full-batch mechanism, size weights, as for adaptive
clipping under local trust; the covariance methods and client-level DP keep the fixed clip
(``adaptive_clip="auto"``) and refuse an explicit one by name.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from dpprecond._validation import check_fraction, check_int, check_positive
from dpprecond.fl.client import record_counts
from dpprecond.fl.models import FLModel
from dpprecond.secagg.rounds import FIT_BITS, part_sensitivity, round_plan
from dpprecond.secagg.sums import SumPlan

__all__ = ["FIT_GRID", "SecureClip", "count_weight", "counted_parts", "counted_plan",
           "counted_sensitivity", "split_counted_sum"]

_U = 2.0**-53
#: Clips tried per octave below the target for a plan that fits ``2^FIT_BITS``
#: (:meth:`SecureClip.applied`).
FIT_GRID = 16


def count_weight(part_delta: float, count_share: float) -> float:
    """``kappa = Delta_p sqrt(s / (1 - s))``: the weight of the count coordinate that gives
    the count the share ``s`` of the sum's Gaussian precision (module docstring)."""
    part_delta = check_positive("part_delta", part_delta)
    s = check_fraction("count_share", count_share)
    return part_delta * math.sqrt(s / (1.0 - s))


def counted_sensitivity(part_delta: float, weight: float, max_client_rows: int) -> float:
    """``Delta``: replace-one L2 bound on the change of one client's counted part
    ``[p_i, fl(kappa c_i)]``: ``hypot(Delta_p, kappa (1 + 2 u n))`` raised by ``2^-50``
    (module docstring)."""
    part_delta = check_positive("part_delta", part_delta)
    weight = check_positive("weight", weight)
    n = check_int("max_client_rows", max_client_rows, low=1)
    count_delta = weight * (1.0 + 2.0 * _U * n)
    return math.hypot(part_delta, count_delta) * (1.0 + 2.0**-50)


def counted_plan(model: FLModel, clip_norm: float, noise_multiplier: float, *,
                 count_share: float, n_rows: int, n_clients: int, min_clients: int,
                 max_client_rows: int, dtype: Any = np.float64) -> tuple[SumPlan, float]:
    """A round's plan at the clip ``C_t`` and the count's weight: ``(plan, kappa)``.

    ``p + 1`` coordinates, sensitivity :func:`counted_sensitivity` of the part's
    :func:`~dpprecond.secagg.rounds.part_sensitivity` for clients of at most
    ``max_client_rows`` rows of ``dtype``, the modulus for ``n_rows`` records and
    ``n_clients`` shares (:func:`~dpprecond.secagg.fl.round_plan`).
    """
    delta_p = part_sensitivity(model, clip_norm, max_client_rows, dtype)
    weight = count_weight(delta_p, count_share)
    delta = counted_sensitivity(delta_p, weight, max_client_rows)
    plan = round_plan(int(model.n_params) + 1, delta, noise_multiplier, n_rows=n_rows,
                      n_clients=n_clients, min_clients=min_clients)
    return plan, weight


def counted_parts(model: FLModel, params: np.ndarray, X: Any, y: np.ndarray,
                  bounds: np.ndarray, clip_norm: float, weight: float, *,
                  x_sq_norms: Any = None) -> np.ndarray:
    """Every client's counted part ``[p_i, fl(kappa c_i)]``, ``(K, p + 1)``.

    The clipped gradient sums and the counts come from one pass where the model counts
    inside it (the linear head's ``clipped_grad_sums_and_counts``: the norms it clips with
    are the norms it counts), otherwise from ``clipped_grad_sums`` and
    :func:`~dpprecond.fl.client.record_counts`.
    """
    both = getattr(model, "clipped_grad_sums_and_counts", None)
    if both is not None:
        sums, counts = both(params, X, y, bounds, clip_norm, x_sq_norms=x_sq_norms)
    else:
        sums = model.clipped_grad_sums(params, X, y, bounds, clip_norm, x_sq_norms=x_sq_norms)
        counts = record_counts(model, params, X, y, bounds, clip_norm)
    counts = np.asarray(counts, dtype=np.float64)
    return np.concatenate([np.asarray(sums, dtype=np.float64),
                           (weight * counts)[:, None]], axis=1)


def split_counted_sum(decoded: np.ndarray, weight: float) -> tuple[np.ndarray, float]:
    """The decoded sum of counted parts as ``(gradient sum, noisy total count)``."""
    return decoded[:-1], float(decoded[-1]) / weight


class SecureClip:
    """The clip of a secure-aggregation run with adaptive clipping: its plan per round and
    its geometric update, shared by the simulator and the SecAgg+ strategy.

    Parameters
    ----------
    settings : AdaptiveClip
        The target quantile, learning rate and count share.
    model : FLModel
    initial_clip : float
        ``C_0`` (the settings' ``initial_clip``, else the config's ``clip_norm``).
    noise_multiplier : float
        ``z`` of every round's sum.
    n_rows, n_clients, min_clients, max_client_rows, dtype
        As for :func:`counted_plan`.
    """

    def __init__(self, settings: Any, model: FLModel, initial_clip: float,
                 noise_multiplier: float, *, n_rows: int, n_clients: int, min_clients: int,
                 max_client_rows: int, dtype: Any = np.float64) -> None:
        self.settings = settings.validated()
        self.model = model
        self.clip = check_positive("initial_clip", initial_clip)
        self.noise_multiplier = float(noise_multiplier)
        self._plan_args = {"count_share": self.settings.count_share, "n_rows": n_rows,
                           "n_clients": n_clients, "min_clients": min_clients,
                           "max_client_rows": max_client_rows, "dtype": dtype}
        self.norms: list[float] = []
        self._applied: tuple[float, float] | None = None  # (C_t, the clip applied)

    def plan(self, clip: float | None = None) -> tuple[SumPlan, float]:
        """The round's ``(plan, kappa)`` at ``clip`` (default: :meth:`applied`)."""
        return counted_plan(self.model, self.applied() if clip is None else clip,
                            self.noise_multiplier, **self._plan_args)

    def applied(self) -> float:
        """The clip the round applies: the largest of ``C_t 2^(-j / FIT_GRID)``, ``j = 0
        .. FIT_GRID``, whose plan exists and fits ``2^FIT_BITS``, else ``C_t`` (module
        docstring). A function of public values only."""
        if self._applied is not None and self._applied[0] == self.clip:
            return self._applied[1]
        chosen = self.clip
        for j in range(FIT_GRID + 1):
            candidate = self.clip * 2.0 ** (-j / FIT_GRID)
            try:
                plan, _ = counted_plan(self.model, candidate, self.noise_multiplier,
                                       **self._plan_args)
            except ValueError:  # no exact plan at this clip: try a smaller one
                continue
            if plan.bits <= FIT_BITS:
                chosen = candidate
                break
        self._applied = (self.clip, chosen)
        return chosen

    def update(self, fraction: float) -> float:
        """Record the round's applied clip and move the target to ``C_{t+1} = C_t exp(-lr
        (b_t - gamma))`` (post-processing of the released fraction ``b_t``, the count taken
        at the applied clip); returns the new target. The target moves from itself, not
        from the applied clip (a lowered clip would otherwise drag it down every round):
        it settles where the applied clip's fraction is the target quantile.

        A clip with no exact plan (a scale that overflows near ``2^-1000``, integers beyond
        ``2^52`` or Skellam share means beyond 2^50 at a huge clip: the plan's
        scale stops at 1, so its modulus grows with ``C``) is not taken: the clip stays at
        the round's, whose plan exists, as the local path keeps its clip within the range
        its noise allows. The choice reads only public values."""
        from dpprecond.fl.adaptive_clip import geometric_update

        self.norms.append(self.applied())
        new = geometric_update(self.clip, float(fraction), self.settings.target_quantile,
                               self.settings.learning_rate)
        try:
            counted_plan(self.model, new, self.noise_multiplier, **self._plan_args)
        except ValueError:
            new = self.clip
        self.clip = new
        return self.clip
