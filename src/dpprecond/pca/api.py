"""Functional API: :func:`fit_private_pca` validates, plans the budget, runs one method.

Privacy unit: one row of ``X`` (one individual), replace-one adjacency. ``row_norm`` is a
public bound given by the caller; it is never derived from the data. Every epsilon comes
from ``dp_accounting`` through :mod:`dpprecond.accounting`. The methods themselves live in
the registry :mod:`dpprecond.pca.methods`.
"""

from __future__ import annotations

import logging
import math
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from dp_accounting import dp_event

from dpprecond._validation import (
    SeedLike,
    check_array,
    check_choice,
    check_epsilon,
    check_int,
    check_matrix_lazy,
    check_positive,
    check_seed,
    check_target_delta,
)
from dpprecond.accounting import AccountantName, PrivacyLedger, epsilon_of
from dpprecond.noise import release
from dpprecond.pca.budget import Budget, BudgetPlan, GaussianScale, secure_aggregation_plan
from dpprecond.pca.core import flip_signs
from dpprecond.pca.federated import (
    TRUST_MODELS,
    FederatedRows,
    LocalNoise,
    check_client_bounds,
)
from dpprecond.pca.methods import FEDERATED_METHODS, METHODS, FitContext
from dpprecond.pca.rows import make_rows, mean_sensitivity, noise_inflation
from dpprecond.pca.secure_plan import ModulusUnavailableError, capped_secure_plan
from dpprecond.secagg.skellam import MAX_BITS
from dpprecond.secagg.sums import SecureSums
from dpprecond.secure import SecureGenerator

__all__ = ["DEFAULT_METHOD", "METHODS", "PCAResult", "check_dense", "check_pca_input",
           "fit_private_pca", "planned_budget", "planned_event", "planned_secure_budget"]

logger = logging.getLogger(__name__)

#: The default method of :func:`fit_private_pca`, :class:`~dpprecond.PrivatePCA` and the CLI.
DEFAULT_METHOD = "auto"


class PrivateDiagnosticsWarning(UserWarning):
    """The fit was asked for diagnostics that are functions of the private data."""


@dataclass(frozen=True)
class PCAResult:
    """Result of :func:`fit_private_pca`. Everything but ``diagnostics`` is public.

    Attributes
    ----------
    components : ndarray of shape (k, d)
        The estimated top-k principal axes as orthonormal rows, as scikit-learn's
        ``components_`` (each signed so that its entry of largest magnitude is positive).
        :attr:`basis` is the same as columns, shape (d, k).
    dp_event : dp_accounting.DpEvent
        Everything the fit released, as one event (compose it with other releases).
    epsilon : float
        Epsilon of ``dp_event`` at ``delta`` from the ``dp_accounting`` accountant (``inf``
        for a non-private run).
    delta : float
        The delta of ``epsilon``.
    method : str
        The method used.
    mean : ndarray of shape (d,) or None
        The mean subtracted before the fit (public, or the private release), in ``X`` units.
    explained_variance : ndarray of shape (k,) or None
        Estimated top-k eigenvalues of the (centered) second moment ``X^T X / n`` in ``X``
        units, from a released noisy matrix (post-processing); exact for ``"exact"``;
        ``None`` for methods that release none (``"power"``).
    total_variance : float or None
        Estimated trace of that second moment, from the same released matrix
        (post-processing, no extra budget; its noise has std ``s sqrt(d)`` for an entry
        noise std ``s``): the denominator of ``explained_variance_ratio``. ``None``
        where ``explained_variance`` is.
    n_samples : int
        Number of rows (public).
    explained_variance_ratio : ndarray of shape (k,) or None
        ``explained_variance / total_variance`` in [0, 1] (post-processing of the same
        released matrix, no extra budget). Where its noise makes the trace smaller than
        the top-k eigenvalues, the total is raised to their sum (and negative eigenvalue
        estimates count as 0), so the ratios never sum above 1.
    info : dict
        Public details: ``noise_multipliers`` (the accounted ones), ``scale`` (the
        calibrated factor), and the method's released choices (``clip_radius``,
        ``n_iter``, ``early_exit``, ``noisy_score``, ...).
    diagnostics : dict or None
        Only with ``diagnostics=True``: values that depend on the private data beyond the
        releases (rows clipped, rows clipped after centering, the number of selection
        trials, rows clipped in the last iteration, fit time). **Not private**: do not
        publish them (the repeat-and-select guarantee assumes the number of trials stays
        hidden).
    """

    components: np.ndarray
    dp_event: dp_event.DpEvent
    epsilon: float
    delta: float
    method: str
    mean: np.ndarray | None = None
    explained_variance: np.ndarray | None = None
    info: dict[str, Any] = field(default_factory=dict)
    diagnostics: dict[str, Any] | None = None
    total_variance: float | None = None
    n_samples: int = 0
    explained_variance_ratio: np.ndarray | None = None

    @property
    def basis(self) -> np.ndarray:
        """The components as an orthonormal basis in columns, shape (d, k)."""
        return self.components.T

def check_dense(name: str, X: Any) -> np.ndarray:
    """Finite, real, dense 2-D float64 array (sparse, complex, text and 1-D input refused)."""
    arr = X if hasattr(X, "toarray") else np.asarray(X)
    if not hasattr(arr, "toarray") and getattr(arr, "ndim", 2) != 2:
        raise ValueError(f"Expected {name} to be a 2-D array, got {arr.ndim}-D array of "
                         f"shape {arr.shape}. Reshape your data with {name}.reshape(-1, 1) "
                         f"for a single feature or {name}.reshape(1, -1) for a single row.")
    return check_array(name, arr, ndim=2, min_rows=1)


def check_pca_input(X: Any, n_components: Any) -> tuple[np.ndarray, int]:
    """Validate the data matrix (2-D, real, ``n >= d``) and ``n_components`` in [1, d].

    A numpy array (memory-mapped included) is not read or copied here: its values are
    checked for NaN and infinity by the first pass over the rows.
    """
    X = check_matrix_lazy("X", X)
    n, d = X.shape
    if d < 1:
        raise ValueError(f"Found array with 0 feature(s) (shape=({n}, 0)) while a minimum of "
                         "1 is required: X needs at least one column.")
    if n < d:
        raise ValueError(
            f"Expected at least as many rows as columns in X (n >= d), got n_samples = {n} < "
            f"n_features = {d}. Private PCA here needs n >= d; add rows or reduce features.")
    if isinstance(n_components, (int, np.integer)) and not isinstance(n_components, bool) \
            and n_components > d:
        raise ValueError(f"n_components={n_components} must be between 1 and n_features = "
                         f"{d}; ask for at most {d} components.")
    k = check_int("n_components", n_components, low=1, high=d)
    return X, k


def _check_center(center: Any, d: int) -> str | np.ndarray | None:
    if center is None:
        return None
    valid = (f"None (uncentered), 'private' (a private mean charged to the budget) or a "
             f"public mean of shape ({d},)")
    if isinstance(center, str):
        if center != "private":
            raise ValueError(f"Unknown center={center!r}; expected one of {valid}.")
        return center
    if np.ndim(center) == 0:  # True, 1.0 ...: not a mean of the d columns
        raise TypeError(f"Expected center to be {valid}, got center={center!r}.")
    mean = check_array("center", center, ndim=1)
    if mean.shape != (d,):
        raise ValueError(f"Expected center to be None, 'private' or a public mean of shape "
                         f"({d},), got shape {mean.shape}.")
    return mean


def planned_event(method: str = DEFAULT_METHOD, *, target_epsilon: float | None,
                  target_delta: float, center: str | np.ndarray | None = None,
                  noise_multiplier: float | None = None, trust: str = "local",
                  **options: Any) -> dp_event.DpEvent:
    """What :func:`fit_private_pca` with these settings will release, from them alone.

    The method registry's budget plan (the same one the fit checks its ledger against),
    computed without any data: callers that compose several fits or stages check their
    whole plan against a ledger with it before touching the data. A non-private setting
    (``method="exact"``, ``add_noise=False``) is a ``NonPrivateDpEvent``. With
    ``trust="secure-aggregation"`` it is the plan of the secure sums (Skellam
    ``ZCDpEvent``s calibrated in RDP, :func:`~dpprecond.pca.budget.secure_aggregation_plan`),
    which is what a federated fit under that trust model records when its sums are not
    capped; a fit under a modulus cap (``max_modulus_bits``, Flower's SecAgg+) may be
    calibrated at a coarser rounding scale, to the same target:
    :func:`planned_secure_budget` gives its plan.
    """
    spec = METHODS[check_choice("method", method, list(METHODS))]
    check_choice("trust", trust, TRUST_MODELS)
    opts = spec.options(options)
    if not spec.private or not opts.get("add_noise", True):
        if trust != "local":
            _refuse_nonprivate_secure_aggregation()
        return dp_event.NonPrivateDpEvent()
    return planned_budget(method, target_epsilon=target_epsilon, target_delta=target_delta,
                          center=center, noise_multiplier=noise_multiplier, trust=trust,
                          **options).event


def planned_budget(method: str = DEFAULT_METHOD, *, target_epsilon: float | None,
                   target_delta: float, center: str | np.ndarray | None = None,
                   noise_multiplier: float | None = None, trust: str = "local",
                   **options: Any) -> BudgetPlan:
    """The budget plan of a private fit with these settings (its noise multipliers and
    event: :func:`planned_event`'s, with the multipliers the kernels draw with)."""
    spec = METHODS[check_choice("method", method, list(METHODS))]
    check_choice("trust", trust, TRUST_MODELS)
    opts = spec.options(options)
    if not spec.private or not opts.get("add_noise", True):
        raise ValueError(f"method={method!r} with these options is not private; it has no "
                         "budget plan.")
    delta = check_target_delta("target_delta", target_delta)
    budget = _budget_of(target_epsilon, noise_multiplier)
    mean_share = opts.get("mean_share") if isinstance(center, str) else None
    plan = spec.plan(budget, delta, opts, mean_share)
    if trust != "local":
        plan = secure_aggregation_plan(plan, _secure_epsilon(budget, delta), delta)
    return plan


def _budget_of(target_epsilon: float | None, noise_multiplier: float | None) -> Budget:
    """A private fit's budget: ``target_epsilon`` (calibrated) or ``noise_multiplier``."""
    if noise_multiplier is None:
        return check_epsilon("target_epsilon", target_epsilon)
    if target_epsilon is not None:
        raise ValueError(f"Give target_epsilon or noise_multiplier, not both (got "
                         f"target_epsilon={target_epsilon!r}, noise_multiplier="
                         f"{noise_multiplier!r}): the multiplier already fixes the epsilon.")
    return GaussianScale(check_positive("noise_multiplier", noise_multiplier))


def _secure_epsilon(budget: Budget, delta: float) -> float:
    """The epsilon the secure sums are calibrated to: the target, or, for a
    ``noise_multiplier``, that Gaussian's (the Skellam sums are not Gaussian, so their own
    calibration is the one of the fit)."""
    if isinstance(budget, GaussianScale):
        return epsilon_of(dp_event.GaussianDpEvent(budget.noise_multiplier), delta, "pld")
    assert budget is not None
    return float(budget)


def _check_remote(method: str, *, clients: Any, trust: str, seed: Any, noise: bool,
                  diagnostics: bool, secure_transport: bool) -> None:
    """What a fit over a network (:mod:`dpprecond.pca.remote`) cannot do, by name."""
    from dpprecond.pca.remote import REMOTE_METHODS

    if clients is not None:
        raise ValueError("clients= splits an in-memory X; over a network the federation "
                         "already defines the clients: leave clients=None.")
    if trust != "local" and not secure_transport:
        raise ValueError(f"trust={trust!r} needs a federation that sums securely "
                         "(RemoteFederation(..., secure_transport=...); on Flower, "
                         "fit_pca_on_flower(..., trust='secure-aggregation')); this one has "
                         "every client add its own noise (trust='local'). The in-process "
                         "simulation is fit_private_pca(X, clients=..., "
                         "trust='secure-aggregation').")
    if method not in REMOTE_METHODS:
        raise ValueError(f"method={method!r} does not run over a network; use one of "
                         f"{list(REMOTE_METHODS)} (fixed's trials and select spawn random "
                         "streams; exact is not private).")
    if not noise:
        raise ValueError("add_noise=False would send every client's exact part to the "
                         "server; a fit over a network is private only.")
    if seed is not None:
        raise ValueError(f"seed={seed!r}: over a network the clients draw the noise; a "
                         "seeded simulation gives the clients the seed (for Flower, "
                         "make_pca_client_app(..., noise_seed=...)).")
    if diagnostics:
        raise ValueError("diagnostics=True needs the clients' private rows; a fit over a "
                         "network has none to offer.")


def _remote_spent(event: Any, delta: float, accountant: AccountantName,
                  ledger: PrivacyLedger | None, *,
                  charged: bool = False) -> Callable[[int, int], str]:
    """What a fit over a network spent when a client goes missing after ``asked`` releases
    (``answered`` of them by every client): at most the plan's event (each release's noise
    is the plan's), charged to ``ledger`` (unless ``charged``: a secure fit charges its
    plan before the first share)."""

    def spent(asked: int, answered: int) -> str:
        eps = epsilon_of(event, delta, accountant)
        if ledger is not None and not charged:
            ledger.spend(event)
        return (f"Privacy already spent: {asked} release(s) were asked for and may have "
                f"reached the server ({answered} answered by every client), at most the "
                f"fit's planned event, epsilon={eps:.6g} at "
                f"delta={delta:g}" + ("; charged to the ledger." if ledger is not None
                                      else "."))

    return spent


def _fit_bits(max_modulus_bits: int | None, federation: Any, secagg: bool) -> int | None:
    """The cap on a secure fit's moduli: ``max_modulus_bits`` and the remote federation's
    transport's (the smaller), or ``None`` (up to ``2^62``)."""
    caps = []
    if max_modulus_bits is not None:
        if not secagg:
            raise ValueError(f"max_modulus_bits={max_modulus_bits!r} applies to "
                             "trust='secure-aggregation' only (the modulus of its secure "
                             "sums); leave it None.")
        caps.append(check_int("max_modulus_bits", max_modulus_bits, low=2, high=MAX_BITS))
    if secagg and federation is not None and federation.secure_fit_bits is not None:
        caps.append(int(federation.secure_fit_bits))
    return min(caps) if caps else None


def _refuse_nonprivate_secure_aggregation() -> None:
    raise ValueError("trust='secure-aggregation' is a private mechanism (every release is "
                     "a secure sum with the clients' Skellam noise); a non-private fit "
                     "(method='exact' or add_noise=False) uses trust='local'.")


def fit_private_pca(X: Any, n_components: int, *, target_epsilon: float | None,
                    target_delta: float, row_norm: float | None,
                    method: str = DEFAULT_METHOD, center: str | np.ndarray | None = None,
                    seed: SeedLike = None, ledger: PrivacyLedger | None = None,
                    diagnostics: bool = False, secure: bool = False,
                    clients: Any = None, trust: str = "local",
                    noise_multiplier: float | None = None, min_clients: int | None = None,
                    max_modulus_bits: int | None = None, **options: Any) -> PCAResult:
    """Differentially private top-k PCA of the rows of ``X``.

    Privacy unit: one row of ``X``, replace-one adjacency. Rows are divided by the public
    ``row_norm`` and any row still above norm 1 is scaled down to norm 1; every release is
    computed from those rows (:mod:`dpprecond.pca.rows`). The result is
    ``(target_epsilon, target_delta)``-DP with the epsilon computed by ``dp_accounting``
    from ``result.dp_event``.

    Parameters
    ----------
    X : array-like of shape (n, d)
        Data, finite, with ``n >= d``. A numpy array (memory-mapped included) is read one
        block of rows at a time; a dask array is read by its scheduler, one row chunk per
        task (a ``dask.distributed`` cluster included; see ``docs/dask.md``). Or a
        :class:`~dpprecond.pca.remote.RemoteFederation`: clients over a network, every
        pass a message round and every client adding its own noise (``trust="local"``)
        or every release one secure sum of the clients' messages
        (``trust="secure-aggregation"``, a federation with a ``secure_transport``:
        :mod:`dpprecond.pca.remote_secure`); methods of
        :data:`~dpprecond.pca.remote.REMOTE_METHODS`, no ``seed``: the clients hold the
        noise; :mod:`dpprecond.adapters.flower.pca` on Flower.
    n_components : int
        Number of components ``k``, ``1 <= k <= d``.
    target_epsilon : float
        Target epsilon (> 0); ignored (may be ``None``) for ``method="exact"``, and
        ``None`` when ``noise_multiplier`` is given.
    target_delta : float
        Target delta, in (0, 0.01] (:data:`dpprecond._validation.MAX_DELTA`); above
        ``1/n`` it warns (:class:`~dpprecond.LargeDeltaWarning`; ``n``, the number of rows,
        is treated as public).
    row_norm : float
        Public bound on the l2 norm of the raw rows (> 0). Required: never derived from
        the data.
    method : str, default="auto"
        A method of :data:`dpprecond.pca.methods.METHODS`: ``"auto"`` (a partial release of
        ``A^T A`` and a coherence probe, then Analyze Gauss completed exactly or the
        preconditioned clipped iteration; the best measured, ``docs/pca_auto.md``),
        ``"select"`` (Algorithm 1 then private selection of (R, T)), ``"fixed"``
        (Algorithm 1 then Algorithm 2 with a given ``clip_radius`` and ``n_iter``),
        ``"analyze_gauss"`` (Dwork et al. 2014),
        ``"power"`` (the DP power method), ``"exact"`` (non-private reference,
        ``epsilon = inf``).
    center : None, "private" or array-like of shape (d,), default=None
        ``None``: uncentered PCA (the paper's problem). An array: a public mean (free).
        ``"private"``: a Gaussian private mean (sensitivity ``2/n`` on the scaled rows)
        that costs the share ``mean_share`` of the budget.
    seed : None, int, SeedSequence or numpy.random.Generator
        Source of randomness (independent streams are spawned from it); ``None`` (default)
        is fresh OS entropy, a fixed seed is for reproducible research only.
    ledger : PrivacyLedger, optional
        A ledger shared with other fits and runs on the same rows: the fit's plan is
        checked against its ``max_epsilon`` before the data is touched
        (:class:`~dpprecond.PrivacyBudgetExceededError`), and the releases made are
        recorded in it.
    diagnostics : bool, default=False
        Also return values that depend on the private data beyond the releases
        (``PCAResult.diagnostics``). They are not private; a warning says so.
    secure : bool, default=False
        Secure mode (:mod:`dpprecond.secure`): every noise draw and random choice from the
        OS CSPRNG and every release snapped to a public grid; ``seed`` must be ``None``.
    clients : array-like of int, optional
        Federated PCA (:mod:`dpprecond.pca.federated`): client ``i`` holds the rows
        ``bounds[i]:bounds[i + 1]`` of ``X`` (``clients`` are these bounds, from 0 to ``n``);
        every pass is the sum of the clients' parts. Methods: those of
        :data:`~dpprecond.pca.methods.FEDERATED_METHODS`.
    trust : {"local", "secure-aggregation"}, default="local"
        Who adds the noise with ``clients`` (:mod:`dpprecond.pca.federated`).
        ``"local"`` (no trusted party): every client adds its own noise at the central std
        to its part, so each client's message meets the target on its own, against
        everyone including the server; the aggregate carries ``sqrt(K)`` times the
        central noise. ``"secure-aggregation"``: every release is a secure sum with
        distributed Skellam noise (:mod:`dpprecond.secagg.sums`): each client rounds its
        scaled part to integers and adds a share of ``1/K`` of the variance (std
        ``std / sqrt(K)``), so a client's message alone does not meet the target; only
        the sum, which the server decodes from the modular sum of the messages, does,
        against a server that sees nothing but the sums. Its epsilon is from the Skellam
        events (``ZCDpEvent``, dp_accounting's RDP accountant, whatever ``accountant``
        says; ``info["accountant"]``), calibrated to the target; ``info
        ["secure_aggregation"]`` lists the sums' moduli and wrap-around bound (and
        ``secure``: whether secure mode was asked for). With ``secure=True`` every
        client's rounding and Skellam share, and the server's public draws, come from the
        OS CSPRNG (in process, and on a remote federation, whose every request then asks
        its clients for secure mode: a seeded client refuses,
        :mod:`dpprecond.pca.remote_secure`); the decoded sums are not snapped (integer
        noise on integer parts). Not with a non-private fit. Without ``clients``,
        ``trust`` must stay ``"local"``.
    min_clients : int, optional
        With ``trust="secure-aggregation"``: the fewest noise shares a released sum may
        hold (default ``K``, all clients). Each share carries ``1/min_clients`` of the
        calibrated variance, so up to ``K - min_clients`` dropouts leave the sum private,
        at ``K / min_clients`` times the variance when every client answers.
    max_modulus_bits : int, optional
        With ``trust="secure-aggregation"``: the largest modulus ``2^b`` the secure
        aggregation carries (default: up to ``2^62`` in process; a remote federation's
        secure transport sets its own, Flower's SecAgg+ 30). Sums that need more at the
        default rounding scale are coarsened to fit, at up to 12.5% more noise std, and
        the fit's events are calibrated at the coarsest scale any sum may take, so the
        epsilon is the target (:mod:`dpprecond.pca.secure_plan`; ``info
        ["secure_aggregation"]`` gives ``max_modulus_bits`` and ``accounted_inflation``);
        a fit no scale fits is refused before the ledger is charged. Methods ``auto``,
        ``analyze_gauss``, ``power``. In process, it reproduces a capped deployment's
        releases.
    noise_multiplier : float, optional
        Instead of ``target_epsilon``: the fit is exactly one Gaussian mechanism with this
        noise multiplier (its releases' precisions ``1/z_i^2`` add up to
        ``1/noise_multiplier^2``, :mod:`dpprecond.pca.budget`), with no calibration. For a
        caller that composes the fit with other Gaussian releases and has calibrated the
        whole once (:func:`dpprecond.pipeline.run_pipeline`). Every method but ``select``
        (whose repeat-and-select is not Gaussian); ``result.epsilon`` is the fit's own.
        Under secure aggregation the Skellam sums are calibrated to that Gaussian's
        epsilon.
    **options
        Method options; :data:`dpprecond.pca.methods.METHODS` lists each method's options
        and defaults (the docs in ``docs/pca.md`` explain them). Common: ``add_noise``
        (default True; False runs the same algorithm without noise and reports
        ``epsilon = inf``, for tests), ``accountant`` (``"pld"``, exact for the Gaussian
        methods; ``"rdp"`` for ``"select"``, the accountant of repeat-and-select),
        ``mean_share`` (0.1, with ``center="private"``).

    Returns
    -------
    PCAResult

    Raises
    ------
    ValueError, TypeError
        On invalid input, naming the parameter and the value.
    PrivacyBudgetExceededError
        If ``ledger`` cannot afford the fit (nothing is released).
    """
    t_start = time.perf_counter()
    spec = METHODS[check_choice("method", method, list(METHODS))]
    remote = callable(getattr(X, "remote_rows", None))  # clients over a network
    if remote:  # a RemoteFederation (pca/remote.py): the rows stay on the clients
        n, d = X.shape
        k = check_int("n_components", n_components, low=1, high=d)
        if n < d:
            raise ValueError(f"Expected at least as many rows as columns (n >= d) over the "
                             f"clients, got n = {n} < d = {d}.")
    else:
        X, k = check_pca_input(X, n_components)
        n, d = X.shape
    if row_norm is None:
        raise ValueError("row_norm is required: give a public bound on the l2 norm of the "
                         "rows of X (e.g. from the data's documented range). It is never "
                         "derived from the data, which would leak private information.")
    row_norm = check_positive("row_norm", row_norm)
    delta = check_target_delta("target_delta", target_delta, n)
    budget: Budget = None
    if spec.private:
        budget = _budget_of(target_epsilon, noise_multiplier)
    elif target_epsilon is not None:
        check_epsilon("target_epsilon", target_epsilon)
    center = _check_center(center, d)
    opts = spec.options(options)
    if secure and seed is not None:
        raise ValueError(f"secure=True refuses seeds (got seed={seed!r}): a seeded fit's noise "
                         "can be regenerated by whoever knows the seed.")
    source: Any = SecureGenerator() if secure else np.random.default_rng(check_seed("seed", seed))
    mean_stream, init_stream, main_stream = source.spawn(3)
    check_choice("trust", trust, TRUST_MODELS)
    if clients is None and trust != "local" and not remote:
        raise ValueError(f"trust={trust!r} applies to federated PCA only: pass clients= (the "
                         "client bounds), or leave trust='local' for a central fit.")
    if clients is not None or remote:
        if spec.name not in FEDERATED_METHODS:
            raise ValueError(f"method={spec.name!r} cannot run federated: every release must "
                             f"be a sum over rows; use one of {list(FEDERATED_METHODS)} "
                             "(select's score needs the exact A^T A, which no party holds).")
    noise = spec.private and opts.get("add_noise", True)
    secagg = trust == "secure-aggregation"
    if min_clients is not None and not secagg:
        raise ValueError(f"min_clients={min_clients!r} applies to trust='secure-aggregation' "
                         "only (the fewest noise shares a secure sum may hold); leave it "
                         "None.")
    if secagg:
        if not noise:
            _refuse_nonprivate_secure_aggregation()
    if remote:
        _check_remote(spec.name, clients=clients, trust=trust, seed=seed, noise=noise,
                      diagnostics=diagnostics,
                      secure_transport=bool(getattr(X, "secure_aggregation", False)))
    mean_share = opts.get("mean_share") if isinstance(center, str) else None
    plan = spec.plan(budget if noise else None, delta, opts, mean_share)
    fit_bits = _fit_bits(max_modulus_bits, X if remote else None, secagg)
    inflation_bound: float | None = None
    if secagg and fit_bits is None:
        plan = secure_aggregation_plan(plan, _secure_epsilon(budget, delta), delta)
    elif fit_bits is not None:  # secure sums within 2^fit_bits: one inflation bound
        from dpprecond.pca.remote import REMOTE_METHODS

        if spec.name not in REMOTE_METHODS:
            raise ValueError(f"max_modulus_bits caps the secure sums of "
                             f"{list(REMOTE_METHODS)}; method={spec.name!r} is not one of "
                             "them (drop max_modulus_bits, or choose one).")
        K = X.n_clients if remote else check_client_bounds(clients, n).size - 1
        if min_clients is not None:
            min_clients = check_int("min_clients", min_clients, low=1, high=K)
        try:
            plan, inflation_bound = capped_secure_plan(
                plan, _secure_epsilon(budget, delta), delta, method=spec.name,
                n_features=d, n_components=k, n_rows=n, n_clients=K,
                min_clients=min_clients, fit_bits=fit_bits, options=opts)
        except ModulusUnavailableError as exc:
            raise ModulusUnavailableError(
                f"{exc} (max_modulus_bits={fit_bits}). Raise max_modulus_bits (in process "
                "up to 62, the default), fit fewer rows or features, or raise epsilon. "
                "Nothing was released or charged.") from None
    if ledger is not None and noise:  # refuse before any data is touched
        ledger.check(plan.event)
    info: dict[str, Any] = {"noise_multipliers": dict(plan.noise_multipliers),
                            "scale": plan.scale}

    # -- rows: every release is computed from the clipped rows (pca/rows.py) ---------------
    if remote and secagg:  # every release one secure sum of the clients' messages
        rows: Any = X.remote_rows(row_norm, secure=secure, spent=_remote_spent(
            plan.event, delta, "rdp", ledger, charged=True))
        info.update(n_clients=rows.n_clients, trust=trust)
        if min_clients is not None:
            min_clients = check_int("min_clients", min_clients, low=1, high=rows.n_clients)
        from dpprecond.pca.remote_secure import secure_noise_sources

        mean_stream, init_stream, main_stream = secure_noise_sources(
            X, fp=noise_inflation(rows), min_clients=min_clients, fit_bits=fit_bits,
            max_inflation=inflation_bound)
        if ledger is not None:  # charged before the first share, as in process
            ledger.spend(plan.event)
    elif remote:  # every pass a message round; each client adds its own noise
        rows = X.remote_rows(row_norm, secure=secure, spent=_remote_spent(
            plan.event, delta, opts.get("accountant", "pld"), ledger))
        info.update(n_clients=rows.n_clients, trust=trust)
        mean_stream, init_stream, main_stream = X.noise_sources()
    elif clients is None:
        rows = make_rows(X, row_norm)  # ClippedRows, or DaskRows for a dask array
    else:
        rows = FederatedRows.from_data(X, clients, row_norm, shared=secagg)
        info.update(n_clients=rows.n_clients, trust=trust)
        K = rows.n_clients
        if trust == "local":  # each client adds its own noise: one stream per client
            mean_stream, init_stream, main_stream = (LocalNoise(s.spawn(K)) for s in
                                                     (mean_stream, init_stream, main_stream))
        else:  # every release a secure sum: one stream per client and a public one
            if min_clients is not None:
                min_clients = check_int("min_clients", min_clients, low=1, high=K)
            sums_made: list[Any] = []
            slack = noise_inflation(rows)
            mean_stream, init_stream, main_stream = (
                SecureSums(streams[:K], streams[K], n_rows=n, fp=slack,
                           min_clients=min_clients, plans=sums_made, fit_bits=fit_bits,
                           max_inflation=inflation_bound)
                for streams in (s.spawn(K + 1) for s in (mean_stream, init_stream,
                                                         main_stream)))
            if ledger is not None:  # charged before the first share, as the FL rounds
                ledger.spend(plan.event)
    # Rounding of the block sums: every noise std is inflated (rows.noise_inflation; for
    # d = 784, 1.4e-6 relatively at n = 1e5, 1.5e-4 at n = 1e7); events keep z. fit_auto
    # applies the same factor.
    fp = noise_inflation(rows)
    z = {key: val * fp for key, val in plan.noise_multipliers.items()}
    mean_used = None
    if center is not None:
        if isinstance(center, str):  # "private": Gaussian mean of the step-1 rows
            s_mean = z.get("z_mean", 0.0) * mean_sensitivity(n)
            mu = release(rows.column_sum() / n, s_mean, mean_stream,
                         sensitivity=mean_sensitivity(n))
        else:
            with np.errstate(over="ignore"):
                mu = center / row_norm
            if not np.all(np.isfinite(mu)):
                raise ValueError(f"center / row_norm overflows (row_norm={row_norm:g}); give "
                                 "a public mean in the units of X that is within range.")
        rows = rows.centered(mu)
        mean_used = mu * row_norm
    S = rows.gram()

    out = spec.run(FitContext(rows, S, k, z, plan, opts, init_stream, main_stream, delta))
    event = plan.event if out.event is None or secagg else out.event
    info.update(out.info)
    if "note" in info:
        logger.info(info["note"])
    accountant: AccountantName = "rdp" if secagg else opts.get("accountant", "pld")
    eps = math.inf if plan.scale == 0 else epsilon_of(event, delta, accountant)
    if secagg:
        info.update(accountant="rdp", secure_aggregation=main_stream.summary())
        if fit_bits is not None:
            info["secure_aggregation"].update(max_modulus_bits=fit_bits,
                                              accounted_inflation=inflation_bound)
    elif ledger is not None and noise:
        ledger.spend(event)
    explained = total = ratio = None
    if out.eigvals is not None:  # in the units of X (inf if row_norm^2 overflows)
        with np.errstate(over="ignore"):
            explained = np.asarray(out.eigvals) / n * row_norm * row_norm
            if out.trace is not None:
                total = float(out.trace) / n * row_norm * row_norm
        if out.trace is not None:  # the ratio, from the rows' units (never overflows)
            ev = np.clip(np.asarray(out.eigvals, dtype=np.float64), 0.0, None)
            denom = max(float(out.trace), float(ev.sum()))
            ratio = ev / denom if denom > 0 else np.zeros_like(ev)
    diag = None
    if diagnostics:
        warnings.warn("PCA diagnostics (rows clipped, selection trials, fit time) are "
                      "functions of the private data and are NOT differentially private; "
                      "do not publish them.", PrivateDiagnosticsWarning, stacklevel=2)
        diag = {"n_clipped": rows.n_clipped, "n_clipped_centered": rows.n_clipped_centered,
                **out.private, "fit_seconds": time.perf_counter() - t_start}
    return PCAResult(components=np.ascontiguousarray(flip_signs(out.basis).T),
                     dp_event=event, epsilon=eps, delta=delta, method=spec.name,
                     mean=mean_used, explained_variance=explained, info=info,
                     diagnostics=diag, total_variance=total, n_samples=n,
                     explained_variance_ratio=ratio)


def planned_secure_budget(method: str = DEFAULT_METHOD, *, target_epsilon: float | None,
                          target_delta: float, n_features: int, n_components: int,
                          n_rows: int, n_clients: int, min_clients: int | None = None,
                          max_modulus_bits: int, center: str | np.ndarray | None = None,
                          noise_multiplier: float | None = None,
                          **options: Any) -> tuple[BudgetPlan, float]:
    """The plan of a federated fit under ``trust="secure-aggregation"`` whose sums must
    fit ``2^max_modulus_bits``, and its inflation bound, from public values alone.

    What :func:`fit_private_pca` with ``max_modulus_bits`` (or a remote federation whose
    transport caps the modulus) plans for ``n_rows`` rows of ``n_features`` over
    ``n_clients`` clients (:func:`~dpprecond.pca.secure_plan.capped_secure_plan`). Raises
    :class:`~dpprecond.pca.secure_plan.ModulusUnavailableError` when no scale fits.
    """
    plan = planned_budget(method, target_epsilon=target_epsilon, target_delta=target_delta,
                          center=center, noise_multiplier=noise_multiplier, **options)
    spec = METHODS[method]
    delta = check_target_delta("target_delta", target_delta)
    budget = _budget_of(target_epsilon, noise_multiplier)
    return capped_secure_plan(plan, _secure_epsilon(budget, delta), delta, method=spec.name,
                              n_features=n_features, n_components=n_components,
                              n_rows=n_rows, n_clients=n_clients, min_clients=min_clients,
                              fit_bits=check_int("max_modulus_bits", max_modulus_bits,
                                                 low=2, high=MAX_BITS),
                              options=spec.options(options))
