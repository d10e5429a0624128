"""Private features, then DP federated training, under one privacy ledger.

The DP-FedSOFIM paper trains a linear head on 64-dimensional frozen features. Without a
public feature extractor, :func:`run_pipeline` builds the features privately:

1. the training data is split among the clients (as in :func:`dpprecond.fl.run_federated`);
2. **federated private PCA** (:func:`dpprecond.pca.fit_private_pca` with ``clients=``) on
   the clients' rows, with a share ``pca_share`` of the budget. ``trust="local"`` (no
   trusted party): every client adds its own noise, so each client's message meets the
   target on its own (the aggregate carries ``sqrt(K)`` times the central noise).
   ``trust="secure-aggregation"``: every release is a secure sum with distributed
   Skellam noise, each client adding a share of ``1/K`` of its variance (std
   ``std / sqrt(K)``), so only the sum meets the target, against a server that sees
   nothing but the sum (:mod:`dpprecond.pca.federated`, :mod:`dpprecond.secagg.sums`);
3. every record is projected on the released components and publicly rescaled,
   ``z = V^T x sqrt(k) / row_norm`` (``V`` released, ``k`` and ``row_norm`` public: a
   row-wise post-processing of the release and of the record itself);
4. **DP federated training** on ``z`` with the rest of the budget, same clients, same
   records, under the same trust model: ``trust="secure-aggregation"`` runs the
   distributed Skellam rounds (:mod:`dpprecond.secagg.fl`).

Privacy unit: one record of one client, replace-one adjacency, in both stages. Both
stages release only unsampled Gaussian mechanisms (``auto``, ``analyze_gauss`` or ``fixed`` PCA,
full-batch federated methods), so their composition is exactly one Gaussian mechanism
whose precision ``1/z^2`` is the sum of theirs (GDP composition, also adaptive, Dong,
Roth and Su 2019): the target is calibrated **once** (dp_accounting's exact Gaussian
epsilon gives its precision ``P``), ``P`` is split as ``pca_share * P`` for the PCA and
the rest for the training, each stage runs from its own multiplier without calibrating
again (:func:`split_noise`, :func:`training_scale`), and **one**
:class:`~dpprecond.accounting.PrivacyLedger` records every release
of both stages and reports the total per record from dp_accounting.

Under ``trust="secure-aggregation"`` the training's releases are Skellam sums (an RDP
bound, not Gaussian), and so are the PCA's (secure sums with Skellam noise, calibrated
in RDP to the epsilon of its Gaussian share above): the training's Skellam noise
multiplier is the smallest one whose ``T`` sums, composed with the PCA's releases in
dp_accounting's RDP accountant, meet the target. The ledger composes the same events
with the same accountant, so its total is that composition (at most the target).

``features="random:64"`` is the data-independent control: a fixed random feature map
(:func:`dpprecond.features.random_features.random_fourier_features`, public seed), which
costs nothing, so the whole budget goes to the training.
"""

from __future__ import annotations

import contextlib
import math
import os
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from dp_accounting import dp_event

from dpprecond._files import write_json
from dpprecond._validation import (
    LargeDeltaWarning,
    SeedLike,
    check_array,
    check_choice,
    check_fraction,
    check_int,
    check_labels,
    check_positive,
    check_seed,
    check_target_delta,
)
from dpprecond.accounting import (
    DEFAULT_ACCOUNTANT,
    Accountant,
    PrivacyLedger,
    calibrate_noise,
    compose,
    epsilon_of,
    gaussian,
    gaussian_precision,
)
from dpprecond.fl import AdaptiveClip, ClientData, FLConfig, make_method, simulate
from dpprecond.fl.engine import FLResult, plan_event
from dpprecond.fl.models import LinearSoftmax
from dpprecond.fl.partition import make_partition
from dpprecond.pca.api import DEFAULT_METHOD
from dpprecond.pca.federated import TRUST_MODELS, TrustModel
from dpprecond.pca.methods import PIPELINE_METHODS

__all__ = ["DEFAULT_PCA_METHOD", "PCA_METHODS", "PipelineResult", "parse_features", "run_pipeline",
           "split_budget", "split_noise", "training_scale"]

#: Federated PCA methods of the pipeline (every release an unsampled Gaussian), from the
#: PCA registry (:data:`dpprecond.pca.methods.PIPELINE_METHODS`); the default is the PCA
#: default, ``auto`` (docs/pca_auto.md).
PCA_METHODS = PIPELINE_METHODS
DEFAULT_PCA_METHOD = DEFAULT_METHOD


def parse_features(text: str) -> tuple[str, int | None]:
    """``"pixels"`` -> ``("pixels", None)``; ``"pca:64"`` / ``"random:64"`` -> kind, dim."""
    kind, sep, dim = text.partition(":")
    if kind == "pixels" and not sep:
        return "pixels", None
    if kind in ("pca", "random") and sep:
        try:
            k = int(dim)
        except ValueError:
            k = 0
        if k >= 1:
            return kind, k
    raise ValueError(f"Unknown features={text!r}; expected 'pixels', 'pca:K' or 'random:K' "
                     "with an integer K >= 1 (e.g. pca:64).")


def split_noise(target_epsilon: float, target_delta: float,
                share: float) -> tuple[float, float]:
    """``(z_pca, z_fl)``: the one calibration of a pipeline, split between its stages.

    The target ``(epsilon, delta)`` is calibrated once, to one Gaussian mechanism of
    multiplier ``z`` (precision ``P = 1/z^2``, dp_accounting's exact Gaussian epsilon);
    the PCA gets ``share * P`` and the training the rest, so each stage is one Gaussian of
    multiplier ``z_pca = z / sqrt(share)``, resp. ``z_fl = z / sqrt(1 - share)``, and
    their composition is exactly the target's Gaussian. No stage calibrates again.
    """
    z = calibrate_noise(gaussian, target_epsilon, target_delta, "pld")
    return z / math.sqrt(share), z / math.sqrt(1.0 - share)


def split_budget(target_epsilon: float, target_delta: float,
                 share: float) -> tuple[float, float]:
    """``(epsilon_pca, epsilon_fl)``: the epsilons of the two stages of :func:`split_noise`.

    For reports: each stage's own epsilon at ``target_delta`` (from dp_accounting); the
    stages are run from the multipliers, not from these.
    """
    return tuple(epsilon_of(gaussian(z), target_delta, "pld")  # type: ignore[return-value]
                 for z in split_noise(target_epsilon, target_delta, share))


def training_scale(model: LinearSoftmax, method: Any,
                   config_for: Callable[[dict[str, Any]], FLConfig], z_fl: float) -> float:
    """The training's noise scale whose whole run is one Gaussian of multiplier ``z_fl``.

    A full-batch training releases only Gaussians whose multipliers are proportional to
    its scale ``c``, so its precision is ``P(c) = P(1) / c^2`` and ``c = z_fl sqrt(P(1))``
    (no calibration). Refuses a training with any other release.
    """
    precision = gaussian_precision(plan_event(model, method, config_for(
        {"noise_multiplier": 1.0})))
    if precision is None or precision <= 0:
        raise ValueError(f"algorithm={method.name!r} releases more than Gaussian sums "
                         "(or nothing), so the pipeline's precision split does not apply "
                         "to it; run its stages separately with their own budgets.")
    return z_fl * math.sqrt(precision)


def _secure_training_noise(model: LinearSoftmax, method: Any,
                           config_for: Callable[[dict[str, Any]], FLConfig],
                           pca_event: dp_event.DpEvent, target_epsilon: float,
                           target_delta: float, pca_share: float) -> float:
    """The Skellam noise multiplier of a secure-aggregation training after a PCA stage.

    The training's ``T`` Skellam sums are not Gaussian, so the precision split of
    :func:`split_budget` does not apply to them: the PCA keeps its share (it is
    calibrated to it), and the training's noise multiplier is the smallest ``z`` whose
    ``T`` sums composed with the PCA's releases, in dp_accounting's RDP accountant, meet
    ``target_epsilon`` at ``target_delta``.
    """

    def whole(z: float) -> dp_event.DpEvent:
        return compose([pca_event, plan_event(model, method,
                                              config_for({"noise_multiplier": z}))])

    if epsilon_of(pca_event, target_delta, "rdp") >= target_epsilon:
        raise ValueError(f"pca_share={pca_share:g} leaves the secure-aggregation training no "
                         f"budget: the PCA stage alone spends target_epsilon="
                         f"{target_epsilon:g} in the RDP accounting of the Skellam "
                         "composition; lower pca_share.")
    return calibrate_noise(whole, target_epsilon, target_delta, "rdp")


@contextlib.contextmanager
def _delta_checked() -> Iterator[None]:
    """A stage of :func:`run_pipeline`, which has already checked its delta against n."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LargeDeltaWarning)
        yield


@dataclass
class PipelineResult:
    """The training result, the features' description and the ledger of both stages."""

    fl: FLResult
    features: str
    epsilon: float
    delta: float
    ledger: PrivacyLedger | None
    pca_epsilon: float | None = None
    components: np.ndarray | None = None
    test_features: np.ndarray | None = None

    @property
    def final_accuracy(self) -> float:
        """Test accuracy after the last round."""
        return self.fl.final_accuracy

    def to_dict(self) -> dict[str, Any]:
        """The training's :meth:`FLResult.to_dict` with the pipeline's releases and totals:
        ``features``, ``total_epsilon`` (both stages, from the ledger), ``pca_epsilon`` and
        the released ``pca_components`` (for ``pca:K`` features)."""
        out = {**self.fl.to_dict(), "features": self.features,
               "total_epsilon": self.epsilon, "pca_epsilon": self.pca_epsilon}
        if self.components is not None:
            out["pca_components"] = self.components
        return out

    def save_json(self, path: str | os.PathLike) -> None:
        """Write :meth:`to_dict` as strict JSON, atomically (docs/outputs.md)."""
        write_json(path, self.to_dict())


def run_pipeline(X_train: Any, y_train: Any, X_test: Any, y_test: Any, n_classes: int, *,
                 features: str = "pca:64", target_epsilon: float | None,
                 target_delta: float = 1e-5, row_norm: float,
                 pca_share: float = 0.2, pca_method: str = DEFAULT_PCA_METHOD,
                 pca_options: dict[str, Any] | None = None,
                 trust: TrustModel = "local",
                 algorithm: str = "sofim-lagged", learning_rate: float | None = None,
                 method_options: dict[str, Any] | None = None,
                 n_clients: int = 20, partition: Literal["iid", "dirichlet"] = "iid",
                 alpha: float = 0.5, n_rounds: int = 70, clip_norm: float = 10.0,
                 weighting: Literal["uniform", "size"] | None = None,
                 adaptive_clip: AdaptiveClip | Literal["auto"] | None = "auto",
                 accountant: Accountant = DEFAULT_ACCOUNTANT, seed: SeedLike = None,
                 ledger: PrivacyLedger | None = None, secure: bool = False,
                 progress: bool = False,
                 callback: Callable[[dict[str, float]], None] | None = None,
                 ) -> PipelineResult:
    """Private features, then DP federated training, one ledger (see the module docstring).

    Parameters
    ----------
    X_train, y_train, X_test, y_test : array-like
        Records (rows) and labels; ``X_test`` is public evaluation data.
    n_classes : int
        Number of classes.
    features : str
        ``"pca:K"`` (private federated PCA, ``K`` components), ``"random:K"`` (a fixed
        random map, free) or ``"pixels"`` (the rows as they are).
    target_epsilon : float or None
        Total budget per record over both stages; ``None`` is a non-private run (exact PCA,
        no noise).
    target_delta : float
        Delta of both stages and of the total.
    row_norm : float
        Public bound on the l2 norm of a training row (for the PCA and the rescaling).
    pca_share : float in (0, 1)
        Share of the budget's Gaussian precision spent on the PCA.
    pca_method, pca_options
        The federated PCA (one of :data:`PCA_METHODS`: ``"auto"``, ``"analyze_gauss"`` or
        ``"fixed"``) and its options.
    trust : {"local", "secure-aggregation"}
        The trust model of the whole run (both stages). ``"local"``: every client adds its
        own noise to every message. ``"secure-aggregation"``: the server sees only sums;
        the PCA's releases (planned by ``planned_event(..., trust=trust)``) and the
        training's rounds (:mod:`dpprecond.secagg.fl`: one-message gradient methods and
        fedfc / fednew, size weighting, a private run) are secure sums with distributed
        Skellam noise; with
        ``pca:K`` the training's Skellam noise is calibrated so that the composition of
        the PCA's releases and the ``T`` Skellam sums, in dp_accounting's RDP accountant,
        meets ``target_epsilon`` (see the module docstring).
    algorithm, learning_rate, method_options
        The federated method (:mod:`dpprecond.fl.methods`, full-batch Gaussian methods),
        its ``learning_rate`` option (``None`` keeps its default) and its other options.
    n_clients, partition, alpha, n_rounds, clip_norm, weighting, adaptive_clip, accountant
        Federation and training settings, with the defaults of
        :class:`~dpprecond.fl.FLConfig` (``weighting=None``: size weights;
        ``adaptive_clip="auto"``: adaptive clipping where it runs, the fixed
        ``clip_norm`` under secure aggregation).
    seed : None, int, SeedSequence or Generator
        ``spawn(3)``: partition, PCA, training. ``None`` is fresh OS entropy.
    ledger : PrivacyLedger, optional
        A ledger to record both stages in (for example one that already holds other
        releases on the same records); by default a new one capped at ``target_epsilon``.
        The whole plan (the PCA's releases and every round's) is checked against its
        ``max_epsilon`` before any data is touched
        (:class:`~dpprecond.PrivacyBudgetExceededError`; nothing is released or recorded).
    secure : bool
        Secure mode (:mod:`dpprecond.secure`) for both stages: every noise draw from the OS
        CSPRNG and every release snapped; ``seed`` must be ``None`` (the partition then
        comes from fresh entropy too).
    progress : bool
        Show a tqdm bar over the rounds.
    callback : callable, optional
        Called with each training round's history record (as by
        :func:`dpprecond.fl.engine.simulate`); the first call marks the end of the
        features stage.
    """
    if secure and seed is not None:
        raise ValueError(f"secure=True refuses seeds (got seed={seed!r}): a seeded run's "
                         "noise can be regenerated by whoever knows the seed.")
    kind, dim = parse_features(features)
    k = int(dim or 0)
    X_train = check_array("X_train", X_train)
    X_test = check_array("X_test", X_test)
    y_train = check_labels("y_train", y_train, n_classes, n_rows=X_train.shape[0])
    n_clients = check_int("n_clients", n_clients, low=1, high=X_train.shape[0])
    row_norm = check_positive("row_norm", row_norm)
    private = target_epsilon is not None and not math.isinf(target_epsilon)
    if private:  # once for both stages: n, the records of all clients, is treated as public
        check_target_delta("target_delta", target_delta, X_train.shape[0])
    pca_share = check_fraction("pca_share", pca_share, low_open=True)
    check_choice("pca_method", pca_method, PCA_METHODS)
    check_choice("trust", trust, TRUST_MODELS)
    secagg = trust == "secure-aggregation"
    if secagg and not private:
        raise ValueError("trust='secure-aggregation' is a private mechanism (the training's "
                         "Skellam noise); a non-private run (target_epsilon=None or inf) "
                         "uses trust='local'.")
    if private and ledger is None:
        ledger = PrivacyLedger(target_delta, max_epsilon=target_epsilon)
    options = dict(method_options or {})
    if learning_rate is not None:
        if "learning_rate" in options:
            raise ValueError("Give the learning rate once: learning_rate= or "
                             "method_options['learning_rate'], not both.")
        options["learning_rate"] = learning_rate
    method = make_method(algorithm, **options)
    model = LinearSoftmax(k if kind in ("pca", "random") else X_train.shape[1], n_classes)
    eps_pca, V = None, None
    z_pca = z_fl = None  # the stages' multipliers, from one calibration (private pca:K)
    pca_event = None
    if kind == "pca":
        from dpprecond.pca.api import planned_event

        if private:
            assert target_epsilon is not None
            z_pca, z_fl = split_noise(target_epsilon, target_delta, pca_share)
        if ledger is not None:  # private, or a caller's ledger
            pca_event = planned_event(pca_method if private else "exact",
                                      target_epsilon=None, noise_multiplier=z_pca,
                                      target_delta=target_delta,
                                      trust=trust if private else "local",
                                      **(pca_options or {}))
            if private:  # the stage's own epsilon (Skellam sums: an RDP bound)
                eps_pca = epsilon_of(pca_event, target_delta, "rdp" if secagg else "pld")

    def config_for(level: dict[str, Any]) -> FLConfig:
        return FLConfig(n_rounds=n_rounds, clip_norm=clip_norm, target_delta=target_delta,
                        weighting=weighting, accountant=accountant, trust=trust,
                        adaptive_clip=adaptive_clip,
                        **level).validated()

    if secagg:  # what secure aggregation does not run, by name, before any calibration
        from dpprecond.fl.methods import LocalStepsMethod
        from dpprecond.secagg.fl import check_secure_aggregation

        if isinstance(method, LocalStepsMethod):  # run_pipeline has no client level
            raise ValueError(f"run_pipeline with trust='secure-aggregation' trains at the "
                             f"record level (mechanism='full-batch'), where {method.name!r} "
                             "cannot run on secure sums (each local step uses the client's "
                             "own noisy gradient before any sum). Use trust='local', or a "
                             "gradient or covariance method (fedgd, sofim*, adam, yogi, "
                             "fedfc, fednew).")
        check_secure_aggregation(method, config_for({"noise_multiplier": 1.0}), secure=secure)
    if not private:
        config = config_for({"noise_multiplier": 0.0})
    elif secagg and kind == "pca":
        assert target_epsilon is not None and pca_event is not None  # private: a ledger
        config = config_for({"noise_multiplier": _secure_training_noise(
            model, method, config_for, pca_event, target_epsilon, target_delta, pca_share)})
    elif kind == "pca":
        assert z_fl is not None
        config = config_for({"noise_multiplier": training_scale(model, method, config_for,
                                                                z_fl)})
    else:
        config = config_for({"target_epsilon": target_epsilon})
    if ledger is not None:  # the whole plan of both stages, before any data is touched
        stages = [plan_event(model, method, config)]
        if pca_event is not None:
            stages.insert(0, pca_event)
        ledger.check(compose(stages))
    part_seq, pca_seq, fl_seq = check_seed("seed", seed).spawn(3)
    parts = make_partition(y_train, n_clients, partition, alpha, np.random.default_rng(part_seq))
    data = ClientData.from_partition(X_train, y_train, parts, n_classes)

    if kind == "pca":
        from dpprecond.pca import fit_private_pca

        with _delta_checked():
            pca = fit_private_pca(data.X, k, method=pca_method if private else "exact",
                                  target_epsilon=None, noise_multiplier=z_pca,
                                  target_delta=target_delta,
                                  row_norm=row_norm, seed=None if secure else pca_seq,
                                  ledger=ledger, secure=secure, clients=data.bounds,
                                  trust=trust, **(pca_options or {}))
        V = pca.basis
        scale = math.sqrt(k) / row_norm
        Z_train, Z_test = data.X @ V * scale, X_test @ V * scale
        desc = (f"private federated PCA to {k} dims ({pca_method}, trust={trust}, "
                f"{'pca_share=' + format(pca_share, 'g') if private else 'exact'})")
    elif kind == "random":
        from dpprecond.features.random_features import random_fourier_features

        Z_train = random_fourier_features(data.X, k)
        Z_test = random_fourier_features(X_test, k)
        desc = f"random Fourier features to {k} dims (public seed, no budget)"
    else:
        Z_train, Z_test, desc = data.X, X_test, "the rows as they are"
    train = ClientData(Z_train, data.y, data.bounds, n_classes)
    with _delta_checked():
        fl = simulate(model, train, method, config, X_test=Z_test, y_test=y_test,
                      seed=None if secure else fl_seq, ledger=ledger, progress=progress,
                      callback=callback, secure=secure)
    total = ledger.epsilon if ledger is not None else math.inf
    return PipelineResult(fl, desc, total, target_delta, ledger, eps_pca,
                          None if V is None else np.ascontiguousarray(V.T), Z_test)
