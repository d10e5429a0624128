"""Functional API: :func:`fit_private_pca` validates, plans the budget, runs one method.

Privacy unit: one row of ``X`` (one individual), replace-one adjacency. ``row_norm`` is a
public bound given by the caller; it is never derived from the data. Every epsilon comes
from ``dp_accounting`` through :mod:`dpprecond.accounting`.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from dp_accounting import dp_event

from dpprecond._validation import (
    check_array,
    check_choice,
    check_delta,
    check_epsilon,
    check_fraction,
    check_int,
    check_positive,
    check_random_state,
)
from dpprecond.accounting import compose, epsilon_of, gaussian
from dpprecond.pca import budget as _budget
from dpprecond.pca.baselines import (
    analyze_gauss,
    dp_power_method,
    exact_top_k,
    random_orthonormal,
)
from dpprecond.pca.core import (
    TrialSpec,
    clip_grid,
    flip_signs,
    iteration_grid,
    private_init,
    refine_init,
    run_trials,
    select,
)
from dpprecond.pca.noise import gaussian_matrix
from dpprecond.pca.rows import ClippedRows, mean_sensitivity

__all__ = ["METHODS", "PCAResult", "check_dense", "check_pca_input", "fit_private_pca"]

logger = logging.getLogger(__name__)

METHODS: tuple[str, ...] = ("select", "fixed", "analyze_gauss", "power", "exact")

_COMMON = {"add_noise": True, "accountant": "rdp", "mean_share": 0.1}
#: Options of each method and their defaults (all choices are documented in
#: :func:`fit_private_pca`).
DEFAULT_OPTIONS: dict[str, dict[str, Any]] = {
    # Tuned on the regime map (benchmarks/pca_tune.py, docs/pca.md): the spec's 1/4, 10 and
    # 64 lost more to Analyze Gauss on every cell measured.
    "select": {**_COMMON, "mean_trials": 3.0, "init_share": 0.5, "score_share": 0.1,
               "h_share": 0.5, "clip_grid": None, "iter_grid": None, "t_max": 8,
               "beta": 0.01, "h_floor_factor": 4.0, "max_batch_columns": 1024,
               "small_gap": "refine"},
    "fixed": {**_COMMON, "clip_radius": None, "n_iter": 2, "init_share": 0.25, "h_share": 0.5,
              "h_floor_factor": 4.0},
    "analyze_gauss": {**_COMMON},
    "power": {**_COMMON, "n_iter": 10, "power_init": "random", "init_share": 0.25},
    "exact": {"accountant": "rdp"},
}


@dataclass(frozen=True)
class PCAResult:
    """Result of :func:`fit_private_pca`.

    Attributes
    ----------
    components : ndarray of shape (d, k)
        Orthonormal basis of the estimated top-k subspace (columns signed so that the entry
        of largest magnitude is positive).
    dp_event : dp_accounting.DpEvent
        Everything the fit released, as one event (compose it with other releases).
    epsilon : float
        Epsilon of ``dp_event`` at ``delta`` from the ``dp_accounting`` accountant (``inf``
        for a non-private run). After an early exit this is the init's epsilon alone.
    delta : float
        The delta of ``epsilon``.
    n_clipped : int
        Rows scaled down to norm 1 after the division by ``row_norm`` (a count for the data
        owner, not a private release).
    method : str
        The method used.
    mean : ndarray of shape (d,) or None
        The mean subtracted before the fit (public, or the private release), in ``X`` units.
    explained_variance : ndarray of shape (k,) or None
        Estimated top-k eigenvalues of the (centered) second moment ``X^T X / n`` in ``X``
        units: from the released noisy matrix of Algorithm 1 / Analyze Gauss
        (post-processing), exact for ``method="exact"``, ``None`` for ``"power"``.
    info : dict
        Details: ``noise_multipliers``, ``scale`` (calibrated factor), ``clip_radius`` and
        ``n_iter`` (selected or fixed), ``early_exit``, ``noisy_score``, ``tau_lo``,
        ``tau_hi``, ``n_clipped_centered``, ``fit_seconds`` and, as private diagnostics that
        must not be published (the repeat-and-select guarantee assumes the number of trials
        stays hidden), ``n_trials`` and ``n_clipped_last_iteration``.
    """

    components: np.ndarray
    dp_event: dp_event.DpEvent
    epsilon: float
    delta: float
    n_clipped: int
    method: str
    mean: np.ndarray | None = None
    explained_variance: np.ndarray | None = None
    info: dict[str, Any] = field(default_factory=dict)


def check_pca_input(X: Any, n_components: Any) -> tuple[np.ndarray, int]:
    """Validate the data matrix (finite, 2-D, ``n >= d``) and ``n_components`` in [1, d]."""
    X = check_dense("X", X)
    n, d = X.shape
    if d < 1:
        raise ValueError(f"Found array with 0 feature(s) (shape=({n}, 0)) while a minimum of "
                         "1 is required: X needs at least one column.")
    if n < d:
        raise ValueError(
            f"Expected at least as many rows as columns in X (n >= d), got n_samples = {n} < "
            f"n_features = {d}. Private PCA here needs n >= d; add rows or reduce features.")
    k = check_int("n_components", n_components, low=1, high=d)
    return X, k


def check_dense(name: str, X: Any) -> np.ndarray:
    """Finite, real, dense 2-D float64 array (sparse, complex and 1-D input refused)."""
    if hasattr(X, "toarray") or type(X).__module__.startswith("scipy.sparse"):
        raise TypeError(f"Sparse input is not supported for {name} (got "
                        f"{type(X).__name__}); convert it with {name}.toarray() first.")
    arr = np.asarray(X)
    if np.iscomplexobj(arr):
        raise ValueError(f"Complex data not supported in {name} (dtype {arr.dtype}).")
    if arr.ndim != 2:
        raise ValueError(f"Expected {name} to be a 2-D array, got {arr.ndim}-D array of "
                         f"shape {arr.shape}. Reshape your data with {name}.reshape(-1, 1) "
                         f"for a single feature or {name}.reshape(1, -1) for a single row.")
    return check_array(name, arr, ndim=2, min_rows=1)


def _check_center(center: Any, d: int) -> str | np.ndarray | None:
    if center is None:
        return None
    if isinstance(center, str):
        check_choice("center", center, ["private"])
        return center
    mean = check_array("center", center, ndim=1)
    if mean.shape != (d,):
        raise ValueError(f"Expected center to be None, 'private' or a public mean of shape "
                         f"({d},), got shape {mean.shape}.")
    return mean


def _check_options(method: str, options: dict[str, Any]) -> dict[str, Any]:
    allowed = DEFAULT_OPTIONS[method]
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise TypeError(f"Unknown option(s) {unknown} for method={method!r}; "
                        f"valid options are {sorted(allowed)}.")
    opts = {**allowed, **options}
    if not isinstance(opts["add_noise"] if "add_noise" in opts else True, bool):
        raise TypeError(f"Expected add_noise to be a bool, got {opts['add_noise']!r}.")
    check_choice("accountant", opts["accountant"], ["rdp", "pld"])
    if method == "select" and opts["accountant"] != "rdp":
        raise ValueError("method='select' needs accountant='rdp': it is the dp_accounting "
                         "accountant that supports RepeatAndSelectDpEvent.")
    for name in ("init_share", "score_share", "h_share", "mean_share"):
        if name in opts:
            opts[name] = check_fraction(name, opts[name], low=0.0, high=1.0, low_open=True,
                                        high_open=True)
    if "mean_trials" in opts:
        mt = check_positive("mean_trials", opts["mean_trials"])
        if mt < 1:
            raise ValueError(f"Expected mean_trials >= 1, got mean_trials={mt}.")
        opts["mean_trials"] = mt
    if "n_iter" in opts:
        low = 1 if method == "power" else 0
        opts["n_iter"] = check_int("n_iter", opts["n_iter"], low=low)
    if "t_max" in opts:
        opts["t_max"] = check_int("t_max", opts["t_max"], low=0)
    for name in ("beta",):
        if name in opts:
            opts[name] = check_fraction(name, opts[name], low_open=True)
    for name in ("h_floor_factor",):
        if name in opts:
            opts[name] = check_positive(name, opts[name])
    if "max_batch_columns" in opts:
        opts["max_batch_columns"] = check_int("max_batch_columns", opts["max_batch_columns"],
                                              low=1)
    if "small_gap" in opts:
        check_choice("small_gap", opts["small_gap"], ["refine", "return_init"])
    if "power_init" in opts:
        check_choice("power_init", opts["power_init"], ["random", "private"])
    noise = opts.get("add_noise", False)
    if opts.get("clip_radius") is not None:
        opts["clip_radius"] = check_positive("clip_radius", opts["clip_radius"],
                                             allow_inf=not noise)
    if opts.get("clip_grid") is not None:
        grid = np.asarray(opts["clip_grid"], dtype=np.float64).ravel()
        if grid.size == 0 or np.any(np.isnan(grid)) or np.any(grid <= 0) or (
                noise and not np.all(np.isfinite(grid))):
            raise ValueError(f"Expected clip_grid to be a non-empty list of positive finite "
                             f"radii, got clip_grid={opts['clip_grid']!r}.")
        opts["clip_grid"] = grid
    if opts.get("iter_grid") is not None:
        grid = np.asarray(opts["iter_grid"])
        if grid.ndim != 1 or grid.size == 0 or not np.issubdtype(grid.dtype, np.integer) or (
                np.any(grid < 0)):
            raise ValueError(f"Expected iter_grid to be a non-empty list of integers >= 0, "
                             f"got iter_grid={opts['iter_grid']!r}.")
        opts["iter_grid"] = grid.astype(np.int64)
    return opts


def fit_private_pca(X: Any, n_components: int, *, method: str = "select",
                    epsilon: float | None, delta: float, row_norm: float | None,
                    center: str | np.ndarray | None = None, rng: Any = None,
                    **options: Any) -> PCAResult:
    """Differentially private top-k PCA of the rows of ``X``.

    Privacy unit: one row of ``X``, replace-one adjacency. Rows are divided by the public
    ``row_norm`` and any row still above norm 1 is scaled down to norm 1 (see
    :mod:`dpprecond.pca.preprocess`). The result is ``(epsilon, delta)``-DP with the
    epsilon computed by ``dp_accounting`` from ``result.dp_event``.

    Parameters
    ----------
    X : array-like of shape (n, d)
        Data, finite, with ``n >= d``.
    n_components : int
        Number of components ``k``, ``1 <= k <= d``.
    method : {"select", "fixed", "analyze_gauss", "power", "exact"}, default="select"
        ``"select"``: Algorithm 1 then private selection of (R, T) (Algorithm 3);
        ``"fixed"``: Algorithm 1 then Algorithm 2 with the given ``clip_radius`` and
        ``n_iter``; ``"analyze_gauss"``: Dwork et al. (2014); ``"power"``: the DP power
        method (row model); ``"exact"``: non-private reference (``epsilon = inf``).
    epsilon : float
        Target epsilon (> 0); ignored (may be ``None``) for ``method="exact"``.
    delta : float
        Target delta in (0, 1).
    row_norm : float
        Public bound on the l2 norm of the raw rows (> 0). Required: never derived from
        the data.
    center : None, "private" or array-like of shape (d,), default=None
        ``None``: uncentered PCA (the paper's problem). An array: a public mean (free).
        ``"private"``: a Gaussian private mean (sensitivity ``2/n`` on the scaled rows)
        that costs the share ``mean_share`` of the budget.
    rng : None, int, SeedSequence or numpy.random.Generator
        Source of randomness (independent streams are spawned from it).
    **options
        Method options (choices marked so; defaults in ``DEFAULT_OPTIONS``):

        - all private methods: ``add_noise`` (default True; False runs the same algorithm
          without noise, reports ``epsilon = inf``, for tests), ``accountant`` ("rdp"),
          ``mean_share`` (0.1, with ``center="private"``);
        - ``"select"``: ``mean_trials`` (3), ``init_share`` (1/2), ``score_share`` (0.1),
          ``h_share`` (1/2), ``clip_grid`` (powers of two from ``sqrt(k/n)/2`` to 2),
          ``iter_grid`` ({0, 1, 2, 4, ..., t_max}), ``t_max`` (8), ``beta`` (0.01, failure
          probability of the noise bound used for the thresholds), ``h_floor_factor`` (4:
          eigenvalues of the noisy ``H`` are raised to 4 times its entry noise std),
          ``max_batch_columns`` (1024), ``small_gap`` ("refine": when the init's gap test
          fails (h <= 0) spend the trial budget on a second release of ``A^T A`` averaged
          with the first -- an Analyze Gauss with both budgets, never more costly than the
          selection at any Renyi order; "return_init": return ``X0`` and charge only the
          init, the spec's early exit);
        - ``"fixed"``: ``clip_radius`` (default ``sqrt(k/n)``, public: with an exact
          preconditioner ``sum_i ||y_i||^2 = k``, so ``sqrt(k/n)`` is the root mean square
          of the preconditioned row norms), ``n_iter`` (2), ``init_share``, ``h_share``,
          ``h_floor_factor``. (choice) Defaults from a measurement on family 1
          (n = 1e5, k = 5, eps = 1, 2 seeds): among R in {0.75, 1, 1.5, 2, 3} x sqrt(k/n)
          and T in {2, 4, 8}, T = 2 was best for every R and R <= sqrt(k/n) best
          (sin-theta 0.13 vs Analyze Gauss 0.20 at d = 400, 0.36 vs 0.53 at d = 1500);
          R = sqrt(k/n) rather than 0.75 sqrt(k/n) leaves room for coherent data;
        - ``"power"``: ``n_iter`` (10), ``power_init`` ("random": data-independent start;
          "private": Algorithm 1 with ``init_share``).

    Returns
    -------
    PCAResult

    Raises
    ------
    ValueError, TypeError
        On invalid input, naming the parameter and the value.
    """
    t_start = time.perf_counter()
    method = check_choice("method", method, METHODS)
    X, k = check_pca_input(X, n_components)
    n, d = X.shape
    if row_norm is None:
        raise ValueError("row_norm is required: give a public bound on the l2 norm of the "
                         "rows of X (e.g. from the data's documented range). It is never "
                         "derived from the data, which would leak private information.")
    row_norm = check_positive("row_norm", row_norm)
    delta = check_delta(delta)
    if method == "exact":
        if epsilon is not None:
            check_epsilon(epsilon)
    else:
        epsilon = check_epsilon(epsilon)
    center = _check_center(center, d)
    opts = _check_options(method, options)
    gen = check_random_state(rng)
    mean_stream, init_stream, main_stream = gen.spawn(3)
    target = epsilon if opts.get("add_noise", False) else None
    mean_share = opts.get("mean_share") if isinstance(center, str) else None
    acc = opts["accountant"]
    info: dict[str, Any] = {"early_exit": False}

    # -- budget plan: one calibrated scale factor -----------------------------------------
    if method == "select":
        plan = _budget.plan_select(target, delta, mean_trials=opts["mean_trials"],
                                   init_share=opts["init_share"], mean_share=mean_share,
                                   accountant=acc)
    elif method == "fixed":
        plan = _budget.plan_fixed(target, delta, n_iter=opts["n_iter"],
                                  init_share=opts["init_share"], h_share=opts["h_share"],
                                  mean_share=mean_share, accountant=acc)
    elif method == "analyze_gauss":
        plan = _budget.plan_analyze_gauss(target, delta, mean_share=mean_share, accountant=acc)
    elif method == "power":
        plan = _budget.plan_power(target, delta, n_iter=opts["n_iter"],
                                  private_init=opts["power_init"] == "private",
                                  init_share=opts["init_share"], mean_share=mean_share,
                                  accountant=acc)
    else:
        plan = _budget.plan_analyze_gauss(None, delta, mean_share=None)
    z = plan.noise_multipliers
    info["noise_multipliers"] = dict(z)
    info["scale"] = plan.scale

    # -- rows: every release is computed from the clipped rows (pca/rows.py) ---------------
    rows = ClippedRows.from_data(X, row_norm)
    n_clipped = rows.n_clipped
    mean_used = None
    # Rounding of the block sums: every noise std is inflated by the bound of
    # ClippedRows.rounding_slack (below 1e-6 relatively for n <= 1e7); events keep z.
    fp = 1.0 + rows.rounding_slack()
    z = {key: val * fp for key, val in z.items()}
    if center is not None:
        if isinstance(center, str):  # "private": Gaussian mean of the step-1 rows
            mu = rows.column_sum() / n
            mu += gaussian_matrix((d,), z.get("z_mean", 0.0) * mean_sensitivity(n),
                                  mean_stream)
        else:
            with np.errstate(over="ignore"):
                mu = center / row_norm
            if not np.all(np.isfinite(mu)):
                raise ValueError(f"center / row_norm overflows (row_norm={row_norm:g}); give "
                                 "a public mean in the units of X that is within range.")
        rows = rows.centered(mu)
        mean_used = mu * row_norm
    n_clipped_centered = rows.n_clipped_centered
    S = rows.gram()
    A = rows
    info["n_clipped_centered"] = n_clipped_centered
    event = plan.event
    eigvals = None

    # -- method -------------------------------------------------------------------------------
    if method == "exact":
        V, eigvals = exact_top_k(S, k)
    elif method == "analyze_gauss":
        V, eigvals = analyze_gauss(S, k, z["z0"], init_stream)
    elif method == "power":
        if opts["power_init"] == "private":
            X0 = private_init(S, k, z["z0"], init_stream).X0
        else:
            X0 = random_orthonormal(d, k, init_stream)
        V = dp_power_method(S, X0, opts["n_iter"], z["z_power"], main_stream)
        info["n_iter"] = opts["n_iter"]
    elif method == "fixed":
        init = private_init(S, k, z["z0"], init_stream)
        eigvals = init.eigvals[:k]
        if opts["clip_radius"] is None:
            opts["clip_radius"] = math.sqrt(k / n)
        spec = TrialSpec(opts["clip_radius"], opts["n_iter"], z["zH"], z["zZ"], main_stream,
                         opts["h_floor_factor"])
        (V,), clipped_last = run_trials(A, S, init.X0, [spec])
        info.update(clip_radius=opts["clip_radius"], n_iter=opts["n_iter"],
                    n_clipped_last_iteration=int(clipped_last[0]))
    else:  # select
        init = private_init(S, k, z["z0"], init_stream)
        eigvals = init.eigvals[:k]
        radii = opts["clip_grid"] if opts["clip_grid"] is not None else clip_grid(n, k)
        iters = (opts["iter_grid"] if opts["iter_grid"] is not None
                 else iteration_grid(opts["t_max"]))
        res = select(A, S, init, z_run=z["z_run"], mean_trials=opts["mean_trials"],
                     score_share=opts["score_share"], h_share=opts["h_share"], radii=radii,
                     iters=iters, rng=main_stream, beta=opts["beta"],
                     h_floor_factor=opts["h_floor_factor"],
                     max_batch_columns=opts["max_batch_columns"])
        V = res.X
        info.update(clip_radius=res.clip_radius, n_iter=res.n_iter,
                    noisy_score=res.noisy_score, tau_lo=res.tau_lo, tau_hi=res.tau_hi,
                    early_exit=res.early_exit, n_trials=res.n_trials,
                    n_clipped_last_iteration=res.n_clipped_last,
                    clip_grid=[float(r) for r in radii], iter_grid=[int(t) for t in iters])
        if res.early_exit and opts["small_gap"] == "return_init":
            event = plan.init_event
            info["note"] = ("Early exit: the released init's eigengap is below the noise "
                            "bound (h <= 0), so X0 is returned and only the init's budget "
                            "(and the private mean's, if any) is spent.")
            logger.info(info["note"])
        elif res.early_exit:  # small_gap == "refine"
            refined = refine_init(S, init, z["z_run"], main_stream)
            V, eigvals = refined.X0, refined.eigvals[:k]
            event = compose([plan.init_event, gaussian(plan.noise_multipliers["z_run"])])
            info["note"] = (
                "Small gap: the released init's eigengap is below the noise bound (h <= 0), "
                "so no trial ran; the trial budget (noise multiplier z_run, which costs at "
                "most the selection's Renyi DP at every order) was spent on a second release "
                "of A^T A, averaged with the init. The reported epsilon is that of the init "
                "and this release.")
            logger.info(info["note"])
    if plan.scale == 0:
        eps = math.inf
    else:
        eps = epsilon_of(event, delta, acc)
    explained = None
    if eigvals is not None:  # in the units of X (inf if row_norm^2 overflows)
        with np.errstate(over="ignore"):
            explained = np.asarray(eigvals) / n * row_norm * row_norm
    info["fit_seconds"] = time.perf_counter() - t_start
    return PCAResult(components=flip_signs(np.ascontiguousarray(V)), dp_event=event,
                     epsilon=eps, delta=delta, n_clipped=n_clipped, method=method,
                     mean=mean_used, explained_variance=explained, info=info)
