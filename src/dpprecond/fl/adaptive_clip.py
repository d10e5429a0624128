"""Adaptive clipping: the clip norm follows a private estimate of a quantile of the norms.

After Andrew, Thakkar, McMahan and Ramaswamy (2021), "Differentially private learning
with adaptive clipping", the geometric update of TensorFlow Federated's quantile
estimator and of Flower's adaptive-clipping strategies, at the privacy unit of this
package (one record of one client, replace-one):

1. in round ``t`` every client ``i`` counts its records whose per-example gradient norm
   at the round's parameters is at most the current clip ``C_t``,
   ``c_i = #{x in D_i : ||g(x)|| <= C_t}``, and releases ``c_i + N(0, z_b^2)`` (its own
   noise, no trusted server);
2. the server forms the noisy fraction ``b_t = sum_i (c_i + noise) / n`` (``n`` the number
   of training records of all clients, public as everywhere in this package) and updates
   ``C_{t+1} = C_t * exp(-lr * (b_t - target_quantile))``;
3. the round's messages are clipped at ``C_t`` and noised with the multiplier ``z_u``.

**Sensitivity of the count.** Replacing one record of client ``i`` changes one indicator
in ``c_i`` from 0 to 1 or back, or none: ``|c_i - c_i'| <= 1`` and the other clients'
counts do not change. The count is a Gaussian mechanism with l2 sensitivity 1 and noise
multiplier ``z_b``: event ``GaussianDpEvent(z_b)`` per round
(:func:`count_sensitivity` pins it; tests check the worst-case neighbours).

**The combined budget** (the paper's Section 3). Every event of the gradient methods'
full-batch schedules is an unsampled Gaussian, and unsampled Gaussians compose exactly as
one Gaussian whose precision ``1/z^2`` is the sum of theirs
(:func:`dpprecond.accounting.gaussian_precision`). The method's noise is calibrated as
without adaptive clipping (scale ``c``, total precision ``P``); then every multiplier of
the method is raised to ``z / sqrt(1 - count_share)`` and the count of each of the ``T``
rounds gets ``z_b = sqrt(T / (count_share * P))``, so that the run's total precision stays
``(1 - count_share) P + count_share P = P``. The epsilon of a run is therefore *exactly*
that of the same configuration without adaptive clipping (PLD and RDP alike); every
release is recorded in the ledger as it is made. For the paper's one release per round,
``z_u = z / sqrt(1 - s)`` and ``z_b = z / sqrt(s)``: the paper's
``z_Delta = (z^-2 - (2 sigma_b)^-2)^(-1/2)`` in this package's sensitivities.

The clip ``C_t`` is post-processing of the released counts, so it is public: it is
reported in the run's settings (``clip_norms``).

Scope: the full-batch client mechanism (every method: DP-FedGD, the SOFIM forms, Adam,
Yogi, DP-FedAvg, DP-SCAFFOLD, DP-FedFC, DP-FedNew). The Poisson mechanism (its subsampled
events do not compose as one Gaussian) and client-level DP (its norm is the client's
update, not a record's) are refused by name, as are the noise-aware SOFIM options (their
noise variance is fixed at the start of a run).

How it runs: :class:`AdaptiveClipMethod` wraps the method's halves (its schedule, hence
the calibration and the ledger's plan, is the method's; its server state carries
``C_t``) and adds the count's halves: :meth:`~AdaptiveClipMethod.begin_round` (the
round's clip ``C_t`` and the client half, a :class:`~dpprecond.fl.tasks.RecordCountTask`),
:meth:`~AdaptiveClipMethod.count_releases` (its event, recorded before the release) and
:meth:`~AdaptiveClipMethod.update_clip` (the server half). Both drivers run them:
:func:`dpprecond.fl.engine.simulate` on all clients at once in each round, the count
released with the round's task by :func:`dpprecond.fl.tasks.release_round` (inside the
gradient pass for the linear head's full-batch gradient: the norms it clips with are the
norms it counts, so the count costs no second read of the data); the Flower adapter
(:mod:`dpprecond.adapters.flower.server_side`) sends the count task with each round's
request, every client releases its count with its own noise (the same count streams,
:func:`count_root`) beside its message, and the server updates the clip from the
repliers' counts, so that a seeded Flower run reproduces the engine's. Under
``trust="secure-aggregation"`` the count is one more coordinate of the round's secure sum
(:mod:`dpprecond.secagg.adaptive`: the server learns only the noisy total), for the
one-message gradient methods, in the simulator and on SecAgg+.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from dpprecond.accounting import gaussian, gaussian_precision
from dpprecond.fl.accounting import Releases, Schedule
from dpprecond.fl.client import (
    Stream,
    count_sensitivity,
    noisy_counts,
    record_counts,
)
from dpprecond.fl.config import MAX_CLIP_NORM, MAX_NOISE_STD, AdaptiveClip, FLConfig
from dpprecond.fl.methods import Method, RunSpec
from dpprecond.fl.models import FLModel
from dpprecond.fl.tasks import ClientTask, RecordCountTask
from dpprecond.secure import SecureRoot

__all__ = [
    "AdaptiveClip",
    "AdaptiveClipMethod",
    "count_fraction",
    "count_root",
    "count_sensitivity",
    "geometric_update",
    "noisy_counts",
    "noisy_fraction",
    "record_counts",
    "resolve_adaptive_clip",
    "split_multipliers",
    "with_adaptive_clip",
]

#: The spawn-key child of a run's root that the count noise is drawn from: the engine
#: spawns children 0 (model init), 1 (message noise) and 2 (one-off releases).
COUNT_STREAM = 3


def split_multipliers(multipliers: Mapping[str, float], precision: float, n_rounds: int,
                      count_share: float) -> tuple[dict[str, float], float]:
    """The method's raised multipliers and the count's ``z_b`` (module docstring).

    ``precision`` is the total Gaussian precision ``P`` of the method's calibrated
    schedule over ``n_rounds`` rounds; a non-private run (``P`` infinite or every
    multiplier 0) keeps zeros.
    """
    s = float(count_share)
    if not math.isfinite(precision) or precision <= 0:
        return dict(multipliers), 0.0
    raised = {k: v / math.sqrt(1.0 - s) for k, v in multipliers.items()}
    return raised, math.sqrt(n_rounds / (s * precision))


def count_fraction(replies: Mapping[str, np.ndarray], sizes: np.ndarray) -> float:
    """The server half of the count: ``b = sum_i (c_i + noise_i) / sum_i |D_i|``.

    ``replies["count"]``: the released counts of the clients that answered (one row each,
    :class:`~dpprecond.fl.tasks.RecordCountTask`), ``sizes`` their ``|D_i|`` (public); with
    every client, the denominator is ``n``, the records of all clients. Post-processing.
    """
    total = 0.0
    for c in np.asarray(replies["count"], dtype=np.float64).reshape(-1):
        total += float(c)
    return total / int(np.sum(sizes))


def noisy_fraction(counts: np.ndarray, n_records: int, count_multiplier: float,
                   rngs: Sequence[Stream]) -> float:
    """``sum_i (c_i + N(0, (z_b * 1)^2)) / n``: each client noises its own count."""
    return count_fraction({"count": noisy_counts(counts, count_multiplier, rngs)},
                          np.array([n_records]))


def geometric_update(clip_norm: float, fraction: float, target_quantile: float,
                     learning_rate: float, upper: float | None = None) -> float:
    """``C * exp(-lr * (b - gamma))``, kept within ``[tiny, upper]`` (default
    ``MAX_CLIP_NORM``; the engine passes the largest clip whose noise std stays finite)."""
    top = MAX_CLIP_NORM if upper is None else min(upper, MAX_CLIP_NORM)
    step = -learning_rate * (fraction - target_quantile)
    new = clip_norm * math.exp(min(step, 700.0))
    return float(min(max(new, np.finfo(np.float64).tiny), top))


def count_root(noise_root: Any) -> Any:
    """The count streams' root, the sibling ``COUNT_STREAM`` of the message noise root
    (secure mode: the OS CSPRNG, as every other draw). Client ``i`` draws round ``t``'s
    count noise from ``stream(count_root(noise_root), t, i)``, in every driver."""
    if isinstance(noise_root, SecureRoot):
        return noise_root
    return np.random.SeedSequence(noise_root.entropy,
                                  spawn_key=(*noise_root.spawn_key[:-1], COUNT_STREAM),
                                  pool_size=noise_root.pool_size)


class AdaptiveClipMethod(Method):
    """A method run with adaptive clipping: counts, raised noise, clip per round.

    Wraps any method of :mod:`dpprecond.fl.methods` (built by :func:`with_adaptive_clip`).
    Its schedule (hence the calibration and the ledger's plan) is the method's. Every
    :class:`~dpprecond.fl.methods.RunSpec` it is given carries the calibrated multipliers;
    the halves of the wrapped method see them raised (:meth:`inner_spec`), at the clip of
    the spec (:meth:`begin_round` gives each round's). Its server state is ``(method
    state, C_t, (C_0, ..., C_{t-1}))``, so checkpoints resume with the clip and its
    history.
    """

    def __init__(self, inner: Method, settings: AdaptiveClip) -> None:
        self.inner = inner
        self.settings = settings.validated()
        self.name = inner.name
        self.clip_norms: list[float] = []
        self._z_count = 0.0

    # -- planning ----------------------------------------------------------------------

    def schedule(self, config: FLConfig) -> Schedule:
        return self.inner.schedule(config)

    def check(self, config: FLConfig, model: FLModel) -> None:
        self.inner.check(config, model)
        if config.mechanism != "full-batch":
            raise ValueError(f"adaptive_clip needs mechanism='full-batch' (got "
                             f"mechanism={config.mechanism!r}): the Poisson events do not "
                             "compose as one Gaussian and client-level DP clips whole "
                             "updates. Drop adaptive_clip or use the full-batch mechanism.")
        if getattr(self.inner, "noise_aware", None) is not None:
            raise ValueError("adaptive_clip cannot run with noise_aware=True: the noise-aware "
                             "preconditioner fixes the noise variance (hence the clip) at the "
                             "start of the run. Drop one of them.")
        if not hasattr(model, "per_example_grad_norms") and \
                not hasattr(model, "per_example_grads"):
            raise TypeError(f"adaptive_clip needs per-example gradient norms; "
                            f"{type(model).__name__} has neither per_example_grad_norms nor "
                            "per_example_grads.")

    def noise_multiplier(self, multipliers: Mapping[str, float]) -> float:
        s = self.settings.count_share
        return self.inner.noise_multiplier({k: v / math.sqrt(1.0 - s)
                                            for k, v in multipliers.items()})

    def describe(self) -> dict[str, Any]:
        return {**self.inner.describe(), "clip_norms": list(self.clip_norms),
                "count_noise_multiplier": self._z_count}

    def inner_spec(self, run: RunSpec, clip: float | None = None) -> RunSpec:
        """What the wrapped method's halves see: the multipliers raised, the count's
        ``z_b`` set aside (module docstring), at ``clip`` (default: the spec's)."""
        schedule = self.inner.schedule(run.config)
        unit = schedule.multipliers(1.0)
        key = next(iter(unit))
        scale = run.multipliers[key] / unit[key] if unit[key] else 0.0
        precision = gaussian_precision(schedule.event(scale)) if scale > 0 else math.inf
        if precision is None:
            raise ValueError("adaptive_clip needs a schedule of unsampled Gaussian releases.")
        raised, self._z_count = split_multipliers(run.multipliers, precision,
                                                  int(run.config.n_rounds),
                                                  self.settings.count_share)
        config = run.config if clip is None else replace(run.config, clip_norm=float(clip))
        return replace(run, config=config, multipliers=raised)

    def initial_clip(self, config: FLConfig) -> float:
        """``C_0``: the settings' ``initial_clip``, else ``config.clip_norm``."""
        s = self.settings
        return float(config.clip_norm if s.initial_clip is None else s.initial_clip)

    # -- the client half: the wrapped method's, raised ---------------------------------

    def setup_task(self, run: RunSpec) -> ClientTask | None:
        return self.inner.setup_task(self.inner_spec(run, self.initial_clip(run.config)))

    def round_task(self, run: RunSpec) -> ClientTask:
        return self.inner.round_task(self.inner_spec(run))

    def reports_sizes(self, config: FLConfig) -> bool:
        """True: the count's server half divides by the repliers' records
        (:func:`count_fraction`; ``|D_i|`` is public under the replace-one unit)."""
        return True

    # -- the server half: the wrapped method's, and the clip -------------------------

    def server_init(self, run: RunSpec, params: np.ndarray,
                    setup: Mapping[str, np.ndarray] | None = None,
                    clients: Sequence[int] = ()) -> Any:
        clip = self.initial_clip(run.config)
        self.clip_norms = []
        return (self.inner.server_init(self.inner_spec(run, clip), params, setup, clients),
                clip, ())

    def broadcast(self, state: Any) -> dict[str, np.ndarray]:
        return self.inner.broadcast(state[0])

    def eligible(self, clients: Sequence[int], state: Any) -> list[int]:
        return self.inner.eligible(clients, state[0])

    def server_update(self, run: RunSpec, replies: Mapping[str, np.ndarray],
                      clients: Sequence[int], sizes: np.ndarray, state: Any,
                      params: np.ndarray) -> tuple[np.ndarray, Any]:
        inner_state, clip, history = state
        updates, inner_state = self.inner.server_update(self.inner_spec(run), replies,
                                                        clients, sizes, inner_state, params)
        return updates, (inner_state, clip, history)

    # -- the count: client half (a task), server half (the clip update) --------------

    def begin_round(self, run: RunSpec, state: Any) -> tuple[RunSpec, ClientTask, Any]:
        """A round at the state's clip ``C_t``: ``(the round's spec, the count task, the
        state with C_t in its clip history)``.

        The round's messages are clipped at ``C_t`` (the spec returned: give it to
        :meth:`round_task` and :meth:`server_update`); every client releases the count
        task (:class:`~dpprecond.fl.tasks.RecordCountTask` at ``C_t`` with ``z_b``) at the
        round's parameters, from its own count stream (:func:`count_root`), and the
        driver records :meth:`count_releases` before it. ``state=None`` (no run started)
        describes the first round and returns ``None``.
        """
        if state is None:
            clip, new_state = self.initial_clip(run.config), None
        else:
            inner_state, clip, history = state
            clip = float(clip)
            new_state = (inner_state, clip, (*history, clip))
            self.clip_norms = list(new_state[2])
        round_spec = replace(run, config=replace(run.config, clip_norm=clip))
        self.inner_spec(round_spec)  # sets the count's z_b
        return round_spec, RecordCountTask(clip, self._z_count).validated(), new_state

    def count_releases(self, run: RunSpec) -> Releases:
        """One round's count releases, per record: one ``Gaussian(z_b)`` (sensitivity 1)."""
        self.inner_spec(run)
        return [(gaussian(self._z_count), 1)]

    def update_clip(self, round_spec: RunSpec, replies: Mapping[str, np.ndarray],
                    sizes: np.ndarray, state: Any) -> Any:
        """The count's server half: the state with ``C_{t+1} = C_t exp(-lr (b_t -
        gamma))``, ``b_t`` the repliers' noisy fraction (:func:`count_fraction`).

        Post-processing of the released counts; ``round_spec`` is :meth:`begin_round`'s
        (its largest raised multiplier bounds ``C_{t+1}`` so that the noise std stays
        finite).
        """
        inner_state, clip, history = state
        fraction = count_fraction(replies, sizes)
        sub = self.inner_spec(round_spec)
        z_max = max(sub.multipliers.values(), default=0.0)
        upper = MAX_NOISE_STD / (2.0 * z_max) if z_max > 0 else None
        new_clip = geometric_update(float(clip), fraction, self.settings.target_quantile,
                                    self.settings.learning_rate, upper)
        return (inner_state, new_clip, history)


def resolve_adaptive_clip(method: Method, config: FLConfig) -> AdaptiveClip | None:
    """The adaptive clipping a run of ``method`` under ``config`` uses (``None``: fixed).

    An explicit ``AdaptiveClip`` or ``None`` is returned as given (an ``AdaptiveClip`` the
    run cannot take is refused later, by name). ``"auto"`` (the default) is
    ``AdaptiveClip()`` where adaptive clipping runs: a private run (not
    ``noise_multiplier=0``) of the full-batch mechanism with ``trust="local"``, of a
    method that does not fix its noise variance at the start (the noise-aware SOFIM
    forms), or with ``trust="secure-aggregation"`` of a one-message gradient method
    (:func:`secure_counts`: the count is a coordinate of the secure sum); otherwise
    ``None``.
    """
    setting = config.adaptive_clip
    if setting != "auto":
        return setting
    inner = method.inner if isinstance(method, AdaptiveClipMethod) else method
    runs = (config.private and config.mechanism == "full-batch"
            and getattr(inner, "noise_aware", None) is None
            and (config.trust == "local" or secure_counts(inner)))
    return AdaptiveClip() if runs else None


def secure_counts(method: Method) -> bool:
    """Whether a secure-aggregation run of ``method`` can carry adaptive clipping's count
    in its round sums (:mod:`dpprecond.secagg.adaptive`): the one-message gradient methods
    that do not fix their noise variance at the start (full-batch mechanism)."""
    from dpprecond.fl.methods import GradientMethod

    return isinstance(method, GradientMethod) and getattr(method, "noise_aware", None) is None


def with_adaptive_clip(method: Method, config: FLConfig) -> Method:
    """``method`` itself, or wrapped for adaptive clipping (:func:`resolve_adaptive_clip`)."""
    settings = resolve_adaptive_clip(method, config)
    if settings is None or isinstance(method, AdaptiveClipMethod):
        return method
    return AdaptiveClipMethod(method, settings)
