"""The settings of a federated run shared by every method: privacy, clipping, mechanism.

The bottom of the federated layers: it imports no other module of :mod:`dpprecond.fl`
except the backend names; :mod:`dpprecond.fl.accounting` reads these settings.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal

from dpprecond._validation import (
    check_choice,
    check_epsilon,
    check_fraction,
    check_int,
    check_positive,
    check_target_delta,
)
from dpprecond.accounting import ACCOUNTANTS, DEFAULT_ACCOUNTANT, Accountant
from dpprecond.fl.backend import BACKENDS

__all__ = ["MAX_CLIP_NORM", "MAX_NOISE_STD", "MECHANISMS", "AdaptiveClip", "FLConfig",
           "Mechanism", "check_privacy_level"]

#: The client mechanisms (:mod:`dpprecond.fl.accounting` describes their releases).
Mechanism = Literal["full-batch", "poisson", "client-level"]
MECHANISMS: tuple[str, ...] = ("full-batch", "poisson", "client-level")


def check_privacy_level(target_epsilon: float | None,
                        noise_multiplier: float | None) -> None:
    """Exactly one of ``target_epsilon`` and ``noise_multiplier`` (``0``: non-private).

    Raises ``ValueError`` when both or neither are given, naming both, and checks the one
    given (``target_epsilon > 0`` finite, ``noise_multiplier >= 0`` finite).
    """
    if target_epsilon is not None and noise_multiplier is not None:
        raise ValueError(
            f"Give target_epsilon or noise_multiplier, not both (got "
            f"target_epsilon={target_epsilon!r}, noise_multiplier={noise_multiplier!r}): "
            "target_epsilon calibrates the noise, noise_multiplier sets it (0 = non-private).")
    if target_epsilon is None and noise_multiplier is None:
        raise ValueError("Give the privacy level: target_epsilon=... (the noise is calibrated "
                         "to it) or noise_multiplier=... (explicit noise; noise_multiplier=0 "
                         "asks for a non-private run).")
    if target_epsilon is not None:
        check_epsilon("target_epsilon", target_epsilon)
    else:
        check_positive("noise_multiplier", noise_multiplier, allow_zero=True)



#: Largest clipping norm of a private run (larger ones overflow the noise arithmetic).
MAX_CLIP_NORM = 1e100
#: Largest noise standard deviation ``2 z C`` of a message: beyond it the server step's
#: arithmetic (SOFIM squares the aggregate) overflows float64.
MAX_NOISE_STD = 1e100


@dataclass(frozen=True)
class AdaptiveClip:
    """Settings of adaptive clipping (:mod:`dpprecond.fl.adaptive_clip`); every field is
    public.

    Parameters
    ----------
    target_quantile : float
        The quantile ``gamma`` of the per-example gradient norms the clip tracks, in
        ``(0, 1)``; 0.5 (the median) by default, as Andrew et al. recommend.
    learning_rate : float
        Step ``eta`` of the geometric update (0.2, the paper's and Flower's default).
    initial_clip : float or None
        ``C_0``; ``None`` starts from ``FLConfig.clip_norm``.
    count_share : float
        The share of each round's privacy budget (Gaussian precision) spent on the count,
        in ``(0, 1)``; the messages' noise multiplier rises by ``1/sqrt(1 - count_share)``
        (0.05: 2.6% more noise on the messages).
    """

    target_quantile: float = 0.5
    learning_rate: float = 0.2
    initial_clip: float | None = None
    count_share: float = 0.05

    def validated(self) -> AdaptiveClip:
        """Check every field (``ValueError``/``TypeError`` naming it); return self."""
        check_fraction("target_quantile", self.target_quantile, low_open=True)
        check_positive("learning_rate", self.learning_rate)
        if self.initial_clip is not None:
            check_positive("initial_clip", self.initial_clip)
        check_fraction("count_share", self.count_share, low_open=True)
        return self


@dataclass(frozen=True)
class FLConfig:
    """Settings of a federated run (privacy, clipping, mechanism, aggregation).

    Parameters
    ----------
    n_rounds : int
        Number of rounds T.
    clip_norm : float
        Clipping norm C (per example, or per client update for ``"client-level"``);
        ``inf`` disables clipping (only with ``noise_multiplier=0``, a non-private run).
    target_epsilon : float or None
        Privacy budget of the whole run: the noise multiplier is calibrated so that the
        run is ``(target_epsilon, target_delta)``-DP. Give exactly one of
        ``target_epsilon`` and ``noise_multiplier``.
    target_delta : float
        Delta (default 1e-5, as in the paper), at most 0.01; :func:`~dpprecond.fl.simulate`
        warns when it is above ``1/n`` for the ``n`` records of all clients
        (:class:`~dpprecond.LargeDeltaWarning`).
    noise_multiplier : float or None
        Explicit z instead of a target; the reported epsilon is what it spends.
        ``noise_multiplier=0`` is the one way to ask for a non-private run (logged as a
        warning).
    mechanism : {"full-batch", "poisson", "client-level"}
        The client mechanism of the gradient methods (see :mod:`dpprecond.fl.accounting`);
        DP-FedAvg, DP-SCAFFOLD, DP-FedProx, DP-FedFC and DP-FedNew define their own releases
        on top of the full-batch mechanism; DP-FedAvg and DP-FedProx also have a
        client-level form (``"client-level"``, :mod:`dpprecond.fl.methods.local`).
    sampling_rate, local_steps, local_lr
        Poisson rate and local steps (``"poisson"``; local steps also for client-level).
    weighting : {"size", "uniform"} or None
        Aggregation weights of the clients' messages: ``|D_i| / n`` (size) or ``1/K``
        (uniform, as the DP-FedSOFIM authors). ``None`` (the default) is ``"size"``, the
        measured best (docs/fl_defaults.md), except for client-level DP, which needs
        ``"uniform"``; :meth:`validated` returns the config with the choice made. Size
        weighting keeps learning when some clients hold a handful of records (a client's
        message carries noise of std ``2 z C / |D_i|``, so
        under uniform weights one-record clients add as much noise as the largest ones;
        docs/fl_defaults.md measures both). What the weights reveal: the client sizes
        ``|D_i|``, which this package treats as **public** at every record-level
        mechanism. Under replace-one adjacency (``"full-batch"``) a neighbouring data set
        has the same sizes, so the weights are identical on neighbours and reveal nothing
        the guarantee protects; every message is divided by ``|D_i|`` already. The
        Poisson mechanism (add/remove-one) normalises by ``q |D_i|`` and treats the sizes
        as public metadata in the same way. Client-level DP refuses size weights (a size
        there describes the protected client).
    accountant : {"pld", "rdp"}
        dp_accounting accountant used for calibration and reported epsilons (default:
        :data:`dpprecond.accounting.DEFAULT_ACCOUNTANT`).
    precision : {"float64", "float32"}
        Precision of the linear head's kernel. ``"float32"``: the records are rounded to
        float32 once, saturating at float32's largest value (a per-record map: every
        finite record stays finite) and both products run in float32 at half the
        memory traffic, on sub-blocks of 32 rows whose partial sums are added in float64.
        In both precisions the noise is inflated by the bound on the rounding of the
        computed sums (:func:`dpprecond.fl.kernels.rounding_slack`: about ``2e-9`` in
        float64, ``2e-6`` per client row in float32), so the guarantee is the same; the
        float32 bound costs that much more noise (0.6% for 3,000-row clients).
    backend : {"numpy", "torch"}
        Array library of the linear head's kernel (:mod:`dpprecond.fl.backend`); the
        noise is drawn on the host by the library's noise source on every backend.
    device : str or None
        Torch device (``"cpu"``, ``"cuda"``, ``"cuda:N"``); ``None``: CUDA when present,
        else the CPU. Only with ``backend="torch"``.
    trust : {"local", "secure-aggregation"}
        Who may see a client's release. ``"local"`` (the paper): every message is noised
        by its client, private against everyone. ``"secure-aggregation"``: the server sees
        only the sum of the clients' messages (secure aggregation), and each client adds a
        share of the distributed Skellam noise that the sum carries once
        (:mod:`dpprecond.secagg`; the one-message gradient methods and DP-FedFC /
        DP-FedNew, full-batch, ``weighting="size"``; or the gradient methods with
        ``mechanism="client-level"``, uniform weights, where the secure sum of clipped
        updates replaces the trusted aggregator; RDP accounting).
    adaptive_clip : AdaptiveClip, None or "auto"
        Adaptive clipping (:mod:`dpprecond.fl.adaptive_clip`): the clip follows a private
        geometric update towards a quantile of the per-example gradient norms, starting
        at ``clip_norm``; its counts are charged inside the same budget (the run's
        epsilon is unchanged). Full-batch mechanism only. ``None``: the fixed clip
        ``clip_norm``. ``"auto"`` (the default, the measured best of docs/fl_defaults.md):
        ``AdaptiveClip()`` wherever adaptive clipping runs (a private full-batch run with
        ``trust="local"`` of a method that accepts it: not the noise-aware SOFIM forms;
        with ``trust="secure-aggregation"`` of a one-message gradient method, its count a
        coordinate of the secure sum, :mod:`dpprecond.secagg.adaptive`), the fixed clip
        elsewhere (non-private runs, the Poisson and client-level mechanisms, the
        covariance methods under secure aggregation); the run's recorded config says which
        (:func:`dpprecond.fl.adaptive_clip.resolve_adaptive_clip`).

    Every field is public (it describes the mechanism, not the data).
    """

    n_rounds: int = 70
    clip_norm: float = 10.0
    target_epsilon: float | None = None
    target_delta: float = 1e-5
    noise_multiplier: float | None = None
    mechanism: Mechanism = "full-batch"
    sampling_rate: float = 1.0
    local_steps: int = 1
    local_lr: float = 0.1
    weighting: Literal["uniform", "size"] | None = None
    accountant: Accountant = DEFAULT_ACCOUNTANT
    precision: Literal["float64", "float32"] = "float64"
    backend: Literal["numpy", "torch"] = "numpy"
    device: str | None = None
    trust: Literal["local", "secure-aggregation"] = "local"
    adaptive_clip: AdaptiveClip | Literal["auto"] | None = "auto"

    def validated(self) -> FLConfig:
        """Check every field (raise ``ValueError``/``TypeError`` naming it); return the
        config with ``weighting=None`` resolved (itself when nothing is to resolve)."""
        if self.weighting is None:
            weighting: Literal["uniform", "size"] = (
                "uniform" if self.mechanism == "client-level" else "size")
            return replace(self, weighting=weighting).validated()
        check_int("n_rounds", self.n_rounds, low=1)
        check_positive("clip_norm", self.clip_norm, allow_inf=True)
        check_privacy_level(self.target_epsilon, self.noise_multiplier)
        check_target_delta("target_delta", self.target_delta)
        check_choice("mechanism", self.mechanism, MECHANISMS)
        check_fraction("sampling_rate", self.sampling_rate, low_open=True, high_open=False)
        check_int("local_steps", self.local_steps, low=1)
        check_positive("local_lr", self.local_lr)
        check_choice("weighting", self.weighting, ("uniform", "size"))
        check_choice("accountant", self.accountant, ACCOUNTANTS)
        check_choice("precision", self.precision, ("float64", "float32"))
        check_choice("backend", self.backend, BACKENDS)
        check_choice("trust", self.trust, ("local", "secure-aggregation"))
        if self.device is not None and self.backend != "torch":
            raise ValueError(f"device={self.device!r} needs backend='torch' (the numpy "
                             "backend runs on the CPU); drop device or set backend='torch'.")
        if self.device is not None and not isinstance(self.device, str):
            raise TypeError(f"device must be a string such as 'cpu' or 'cuda', got "
                            f"{type(self.device).__name__}.")
        if self.adaptive_clip is not None and self.adaptive_clip != "auto":
            self._check_adaptive_clip()
        private = self.target_epsilon is not None or bool(self.noise_multiplier)
        if private and not math.isinf(self.clip_norm) and self.clip_norm > MAX_CLIP_NORM:
            raise ValueError(f"clip_norm={self.clip_norm:g} is too large: per-example "
                             f"gradients beyond {MAX_CLIP_NORM:g} and their noise would "
                             "overflow float64 arithmetic; rescale the features instead.")
        if private and math.isinf(self.clip_norm):
            raise ValueError("A private run needs a finite clip_norm (the sensitivity is "
                             "2 * clip_norm); got clip_norm=inf.")
        if self.mechanism == "client-level" and self.weighting != "uniform":
            raise ValueError("Client-level DP needs weighting='uniform' (size weights would "
                             "leak client sizes and change the sensitivity).")
        if self.mechanism != "poisson" and self.sampling_rate != 1.0:
            raise ValueError("sampling_rate < 1 needs mechanism='poisson'.")
        if self.mechanism == "full-batch" and self.local_steps != 1:
            raise ValueError("local_steps > 1 needs mechanism='poisson' or 'client-level' "
                             "(the paper's full-batch mechanism sends one step per round).")
        return self

    def _check_adaptive_clip(self) -> None:
        if not isinstance(self.adaptive_clip, AdaptiveClip):
            raise TypeError(f"adaptive_clip must be an AdaptiveClip (dpprecond.fl."
                            f"adaptive_clip), 'auto' or None, got {self.adaptive_clip!r}.")
        self.adaptive_clip.validated()
        if self.mechanism != "full-batch":
            raise ValueError(f"adaptive_clip needs mechanism='full-batch', got mechanism="
                             f"{self.mechanism!r} (the Poisson events do not compose as one "
                             "Gaussian; client-level DP clips whole updates); drop "
                             "adaptive_clip or use the full-batch mechanism.")

    @property
    def private(self) -> bool:
        """False only for the explicit non-private run (``noise_multiplier=0``)."""
        return self.noise_multiplier != 0
