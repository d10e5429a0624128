"""Private hyperparameter selection for federated runs, charged to the budget.

:func:`tune_private` is repeat-and-select (:mod:`dpprecond.selection`; Papernot and
Steinke 2022, Liu and Talwar 2019) over federated runs, built only on
:func:`~dpprecond.fl.simulator.run_federated` and :func:`~dpprecond.fl.engine.plan_event`:

1. with ``validation_fraction > 0`` the training records are split once, at random and
   independently of their values, into a fitting part and a validation part of
   ``n_val = round(validation_fraction * n)`` records (``n_val`` is public); with
   ``validation_fraction = 0`` (the default) every record trains and scores;
2. ``K`` trials, ``K`` drawn from the chosen distribution with mean ``mean_trials`` and kept
   hidden. Each trial draws a candidate uniformly from the search space (method, server
   step, clip norm, method options, adaptive clipping), trains it on the fitting part and
   releases its noisy accuracy on the scoring records;
3. the trial of the highest noisy score is released: its model, its candidate and its
   score. Nothing else (the other trials, ``K``) is released: while the trials run, the
   package's log records are held back and their warnings recorded, and only the
   selected trial's warnings are issued once the selection is made (a warning or a log
   line per trial would tell ``K``, and a run's warning describes its model).

**Privacy unit**: one record of one client, replace-one, as every run of the package.

**The score** is the number of correctly classified scoring records, noised by every
client for its own share (``K_clients`` Gaussians of std ``z_score``), divided by their
number ``n_val``. For a *fixed* model, replacing one record changes the count by at most 1
(that record's indicator): l2 sensitivity 1, and ``1/n_val`` for the accuracy
(:func:`score_sensitivity`). The trial releases the model and then the count of that
model, so by adaptive composition its cost is the training run's plus one Gaussian of
sensitivity 1, whether the scoring records also trained the model (``validation_fraction
= 0``: the accuracy on the training records, ``n`` of them, the least noisy score) or are
held out (an unbiased score on fewer records). The accounting composes both for every
record.

**One trial is one Gaussian.** Every candidate's training run is a composition of
unsampled Gaussian releases (the full-batch mechanism, with or without adaptive
clipping), hence exactly one Gaussian mechanism of precision ``P(c) = P(1) / c^2`` at
noise scale ``c`` (:func:`dpprecond.accounting.gaussian_precision`). A trial of total
noise multiplier ``z`` gives the training the precision ``(1 - score_share) / z^2`` (its
scale ``c`` solved from ``P(1)``, which :func:`~dpprecond.fl.engine.plan_event` computes
from the settings alone) and the score ``score_share / z^2``: every trial, whatever its
candidate, is exactly ``Gaussian(z)``. The selection is
``RepeatAndSelectDpEvent(Gaussian(z), mean_trials, shape)`` and ``z`` is calibrated to the
total ``(epsilon, delta)`` with dp_accounting's Renyi accountant: the reported epsilon is
the whole cost, tuning included.
"""

from __future__ import annotations

import contextlib
import logging
import math
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from itertools import product
from typing import Any, Literal

import numpy as np
from dp_accounting import dp_event
from tqdm.auto import tqdm

from dpprecond._validation import (
    SeedLike,
    check_array,
    check_fraction,
    check_int,
    check_labels,
    check_seed,
)
from dpprecond.accounting import PrivacyLedger, epsilon_of, gaussian_precision
from dpprecond.fl.adaptive_clip import AdaptiveClip
from dpprecond.fl.config import FLConfig
from dpprecond.fl.engine import FLResult, plan_event
from dpprecond.fl.methods import make_method
from dpprecond.fl.models import FLModel, LinearSoftmax
from dpprecond.fl.simulator import run_federated
from dpprecond.noise import release
from dpprecond.secure import SecureGenerator
from dpprecond.selection import (
    calibrate_selection,
    draw_trial_count,
    repeat_and_select_event,
    trial_shape,
)

__all__ = [
    "DEFAULT_SEARCH",
    "Candidate",
    "TuningResult",
    "correct_count",
    "score_sensitivity",
    "search_space",
    "tune_private",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Candidate:
    """One point of the search space (every field public: it describes the mechanism).

    ``clip_norm`` and ``adaptive_clip`` replace the base configuration's when given
    (``adaptive_clip=None`` keeps fixed clipping); ``learning_rate=None`` keeps the
    method's default.
    """

    algorithm: str = "fedgd"
    learning_rate: float | None = None
    clip_norm: float | None = None
    method_options: Mapping[str, Any] = field(default_factory=dict)
    adaptive_clip: AdaptiveClip | None = None

    def describe(self) -> dict[str, Any]:
        """JSON-ready settings."""
        return {"algorithm": self.algorithm, "learning_rate": self.learning_rate,
                "clip_norm": self.clip_norm, "method_options": dict(self.method_options),
                "adaptive_clip": None if self.adaptive_clip is None
                else asdict(self.adaptive_clip)}

    def config(self, base: FLConfig) -> FLConfig:
        """``base`` with this candidate's clipping."""
        return replace(base, clip_norm=base.clip_norm if self.clip_norm is None
                       else float(self.clip_norm), adaptive_clip=self.adaptive_clip)


def search_space(algorithms: Mapping[str, Iterable[float | None]],
                 clip_norms: Iterable[float | None] = (None,),
                 adaptive: Iterable[AdaptiveClip | None] = (None,),
                 method_options: Mapping[str, Mapping[str, Any]] | None = None
                 ) -> list[Candidate]:
    """The grid ``algorithm x its learning rates x clip norms x adaptive clipping``.

    ``algorithms`` maps a method name to its server steps; ``method_options`` optionally
    maps a method name to its fixed options.
    """
    opts = method_options or {}
    return [Candidate(name, lr, clip, dict(opts.get(name, {})), ac)
            for name, lrs in algorithms.items()
            for lr, clip, ac in product(list(lrs), list(clip_norms), list(adaptive))]


#: The default search space (8 candidates): DP-FedGD (server steps 0.3 and 1) and server
#: Adam (0.01 and 0.03), each with adaptive clipping (the median, from the base
#: ``clip_norm``) or a fixed clip of 1. A compact space of candidates that each learn:
#: every trial draws one at random, and a few trials must find a good one.
DEFAULT_SEARCH: tuple[Candidate, ...] = tuple(
    search_space({"fedgd": (0.3, 1.0), "adam": (0.01, 0.03)}, adaptive=(AdaptiveClip(),))
    + search_space({"fedgd": (0.3, 1.0), "adam": (0.01, 0.03)}, clip_norms=(1.0,)))


def score_sensitivity(n_validation: int) -> float:
    """Replace-one l2 sensitivity of the validation accuracy: ``1 / n_validation``.

    The accuracy is ``(1/n_val) sum_j 1[model(x_j) = y_j]``; replacing one record changes
    one indicator, by at most 1.
    """
    return 1.0 / check_int("n_validation", n_validation, low=1)


def correct_count(model: FLModel, params: np.ndarray, X: np.ndarray, y: np.ndarray) -> int:
    """How many of ``(X, y)`` the model classifies correctly (the score before noise)."""
    _, accuracy = model.evaluate(params, X, y)
    return round(float(accuracy) * X.shape[0])


@dataclass
class TuningResult:
    """The released outcome of :func:`tune_private`, and its privacy figures.

    ``result`` (the selected trial's run), ``candidate`` and ``noisy_score`` are the
    release (``None`` when a Poisson number of trials drew none). ``epsilon`` is the total
    of the whole selection at ``delta``, tuning included. ``n_trials`` is a private
    diagnostic: the guarantee assumes it stays hidden, so it is not in :meth:`to_dict`.
    """

    result: FLResult | None
    candidate: Candidate | None
    noisy_score: float
    epsilon: float
    delta: float
    event: dp_event.DpEvent
    trial_noise_multiplier: float
    score_noise_multiplier: float
    n_validation: int
    n_candidates: int
    mean_trials: float
    trials: str | float
    n_trials: int = 0

    def to_dict(self) -> dict[str, Any]:
        """What may be published (no ``n_trials``), JSON-ready."""
        return {"epsilon": self.epsilon, "delta": self.delta,
                "candidate": None if self.candidate is None else self.candidate.describe(),
                "noisy_validation_accuracy": self.noisy_score,
                "trial_noise_multiplier": self.trial_noise_multiplier,
                "score_noise_multiplier": self.score_noise_multiplier,
                "n_validation": self.n_validation, "n_candidates": self.n_candidates,
                "mean_trials": self.mean_trials, "trials": self.trials,
                "selected_run": None if self.result is None else self.result.to_dict()}


def _check_tuning_config(config: FLConfig) -> None:
    if config.mechanism != "full-batch":
        raise ValueError(f"tune_private needs mechanism='full-batch' (got mechanism="
                         f"{config.mechanism!r}): each trial must be one Gaussian mechanism, "
                         "and Poisson-subsampled or client-level runs are not.")
    if config.target_epsilon is None and config.noise_multiplier != 0:
        raise ValueError(f"tune_private needs config.target_epsilon, the total budget with "
                         f"the tuning included (got noise_multiplier="
                         f"{config.noise_multiplier!r}); noise_multiplier=0 asks for a "
                         "non-private search.")


def _check_candidates(candidates: Sequence[Candidate], config: FLConfig) -> list[Candidate]:
    out = list(candidates)
    if not out:
        raise ValueError("candidates is empty; give at least one Candidate.")
    for c in out:
        if not isinstance(c, Candidate):
            raise TypeError(f"Every candidate must be a Candidate, got {type(c).__name__}.")
        make_method(c.algorithm, c.learning_rate, **dict(c.method_options))
        c.config(config).validated()
    return out


def _unit_precision(model: FLModel, cand: Candidate, config: FLConfig) -> float:
    """``P(1)``: the training run's Gaussian precision at noise scale 1."""
    cfg = replace(cand.config(config), target_epsilon=None, noise_multiplier=1.0)
    method = make_method(cand.algorithm, cand.learning_rate, **dict(cand.method_options))
    precision = gaussian_precision(plan_event(model, method, cfg))
    if precision is None or not precision > 0:
        raise ValueError(f"Candidate {cand.describe()} is not a composition of unsampled "
                         "Gaussian releases; tune_private cannot account for it.")
    return precision


@contextlib.contextmanager
def _trial_diagnostics_held() -> Iterator[list[warnings.WarningMessage]]:
    """Hold back a trial's diagnostics: the package's log records (every ``dpprecond``
    logger inherits the level set here) and its warnings (recorded, returned)."""
    package = logging.getLogger("dpprecond")
    level = package.level
    package.setLevel(logging.CRITICAL + 1)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield caught
    finally:
        package.setLevel(level)


def tune_private(X_train: Any, y_train: Any, X_test: Any, y_test: Any, n_classes: int, *,
                 config: FLConfig, candidates: Sequence[Candidate] = DEFAULT_SEARCH,
                 mean_trials: float = 5.0,
                 trials: Literal["geometric", "logarithmic", "poisson"] | float = "geometric",
                 validation_fraction: float = 0.0, score_share: float = 0.1,
                 n_clients: int = 20, partition: Literal["iid", "dirichlet"] = "iid",
                 alpha: float = 0.5, model: FLModel | None = None, seed: SeedLike = None,
                 ledger: PrivacyLedger | None = None, progress: bool = False,
                 secure: bool = False) -> TuningResult:
    """Select a federated configuration privately; the whole selection meets ``config``'s
    ``(target_epsilon, target_delta)`` (see the module docstring).

    Parameters
    ----------
    X_train, y_train, X_test, y_test : array-like
        Private training records (split into fitting and validation parts) and the test
        set every run reports its history on (never used for the selection).
    n_classes : int
        Number of classes.
    config : FLConfig
        The base settings: ``target_epsilon`` is the **total** budget, tuning included
        (``noise_multiplier=0`` runs a non-private search); ``n_rounds``, ``target_delta``,
        ``weighting`` and the others apply to every trial. Full-batch mechanism only.
    candidates : sequence of Candidate
        The search space (:func:`search_space`); default :data:`DEFAULT_SEARCH`.
    mean_trials : float
        Mean number of trials (>= 1).
    trials : {"geometric", "logarithmic", "poisson"} or float
        Distribution of the number of trials, or a truncated-negative-binomial shape
        (:mod:`dpprecond.selection`).
    validation_fraction : float
        Share of the training records held out for the score, in ``[0, 1)``; 0 (default)
        scores on the training records themselves.
    score_share : float
        Share of each trial's budget (Gaussian precision) spent on its score.
    n_clients, partition, alpha, model
        As in :func:`~dpprecond.fl.simulator.run_federated` (each trial partitions the
        fitting part afresh).
    seed : None, int, SeedSequence or Generator
        Root of all randomness (the split, the number of trials, the candidates, the
        runs and the scores); ``None`` draws fresh OS entropy.
    ledger : PrivacyLedger, optional
        Checked against the whole selection before any data is touched; charged with it.
    progress : bool
        A progress bar over the trials. It shows how many trials ran, which the
        guarantee assumes hidden: do not show it to whoever must not learn it.
    secure : bool
        Secure mode (:mod:`dpprecond.secure`) for every trial, the score noise and every
        draw of the selection; refuses seeds.

    Returns
    -------
    TuningResult
    """
    if secure and seed is not None:
        raise ValueError(f"secure=True refuses seeds (got seed={seed!r}): a seeded run's "
                         "noise can be regenerated by whoever knows the seed.")
    config = config.validated()
    _check_tuning_config(config)
    shape = trial_shape(trials)
    repeat_and_select_event(dp_event.GaussianDpEvent(1.0), mean_trials, shape)  # checks
    frac = check_fraction("validation_fraction", validation_fraction)
    share = check_fraction("score_share", score_share, low_open=True)
    X_train = check_array("X_train", X_train)
    y_train = check_labels("y_train", y_train, n_classes, n_rows=X_train.shape[0])
    n = X_train.shape[0]
    n_val = round(frac * n) if frac > 0 else n
    if n_val < 1 or (frac > 0 and n - n_val < n_clients):
        raise ValueError(f"validation_fraction={frac:g} of {n} records leaves {n_val} for "
                         f"validation and {n - n_val} for {n_clients} clients; both parts "
                         "need records (at least one per client).")
    cands = _check_candidates(candidates, config)
    model = model or LinearSoftmax(X_train.shape[1], n_classes)

    private = config.noise_multiplier != 0
    if private:
        z = calibrate_selection(float(config.target_epsilon), config.target_delta,  # type: ignore[arg-type]
                                mean_trials, shape)
        event = repeat_and_select_event(dp_event.GaussianDpEvent(z), mean_trials, shape)
        z_score = z / math.sqrt(share)
        train_precision = (1.0 - share) / z**2
    else:
        z, z_score, train_precision = 0.0, 0.0, math.inf
        event = dp_event.NonPrivateDpEvent()
    if ledger is not None:  # the whole selection, before any data is touched
        ledger.check(event)

    root = check_seed("seed", seed)
    ctrl_seq, trial_root = root.spawn(2)
    ctrl: Any = SecureGenerator() if secure else np.random.default_rng(ctrl_seq)
    X_val, y_val, X_fit, y_fit = X_train, y_train, X_train, y_train
    if frac > 0:
        order = np.argsort(ctrl.random(n), kind="stable")  # a value-independent split
        val_idx, fit_idx = np.sort(order[:n_val]), np.sort(order[n_val:])
        X_val, y_val = X_train[val_idx], y_train[val_idx]
        X_fit, y_fit = X_train[fit_idx], y_train[fit_idx]
    n_trials = draw_trial_count(ctrl, mean_trials, shape)
    picks = [int(ctrl.integers(0, len(cands))) for _ in range(n_trials)]

    best: tuple[float, FLResult, Candidate] | None = None
    best_warnings: list[warnings.WarningMessage] = []
    bar = tqdm(total=None, disable=not progress, desc="private tuning", unit="trial")
    for i, (pick, seq) in enumerate(zip(picks, trial_root.spawn(n_trials), strict=True)):
        cand = cands[pick]
        run_seq, score_seq = seq.spawn(2)
        level: dict[str, Any] = {"noise_multiplier": 0.0}
        if private:
            level["noise_multiplier"] = math.sqrt(
                _unit_precision(model, cand, config) / train_precision)
        cfg = replace(cand.config(config), target_epsilon=None, **level)
        with _trial_diagnostics_held() as caught:  # released only if this trial is chosen
            result = run_federated(X_fit, y_fit, X_test, y_test, n_classes,
                                   algorithm=cand.algorithm, n_clients=n_clients,
                                   partition=partition, alpha=alpha, config=cfg,
                                   learning_rate=cand.learning_rate,
                                   method_options=dict(cand.method_options), model=model,
                                   seed=None if secure else run_seq, secure=secure)
        if private:  # every trial is exactly Gaussian(z): check what was charged
            spent = gaussian_precision(dp_event.ComposedDpEvent(list(result.events)))
            if spent is None or not math.isclose(spent, train_precision, rel_tol=1e-9):
                raise RuntimeError(f"Trial {i} released precision {spent}, planned "
                                   f"{train_precision}; refusing to report its score.")
        count = float(correct_count(model, result.params, X_val, y_val))
        rng: Any = SecureGenerator() if secure else np.random.default_rng(score_seq)
        if private:
            noise = z_score * rng.standard_normal(n_clients)  # each client noises its share
            count = float(release(np.array([count]), z_score * math.sqrt(n_clients), rng,
                                  noise=np.array([noise.sum()]))[0])
        score = count / n_val
        if best is None or score > best[0]:
            best, best_warnings = (score, result, cand), list(caught)
        bar.update(1)
    bar.close()
    for w in best_warnings:  # the selected trial's warnings, now that it is released
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    if ledger is not None:
        ledger.spend(event)
    eps = epsilon_of(event, config.target_delta, "rdp") if private else math.inf
    if best is None:
        logger.warning("The Poisson number of trials was 0: nothing is released.")
    logger.info("Private tuning: %d candidates, mean %.3g trials, epsilon %.4g at delta "
                "%.3g (tuning included).", len(cands), mean_trials, eps, config.target_delta)
    return TuningResult(None if best is None else best[1], None if best is None else best[2],
                        math.nan if best is None else best[0], eps, config.target_delta,
                        event, z, z_score, n_val, len(cands), float(mean_trials), trials,
                        n_trials)
