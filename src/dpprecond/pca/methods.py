"""The private PCA methods as a small registry: options, budget plan, run.

Each method is one :class:`PCAMethod`: its options with their defaults, a check of the
options only it needs, its budget plan (:mod:`dpprecond.pca.budget`: noise multipliers
and the DpEvent of its releases) and its run (a pure function of the clipped rows, their
Gram matrix, the noise multipliers and the random streams, built from the kernels of
:mod:`dpprecond.pca.core` and :mod:`dpprecond.pca.baselines`). Adding a method is adding
one entry to :data:`METHODS`; :func:`dpprecond.pca.fit_private_pca` does everything else
(validation, rows, centering, the ledger, the result).

Every option is validated by name (:data:`OPTION_CHECKS`), so a method only lists the
options it takes. What a run returns in ``info`` is public (released values, their
post-processing and public settings); what depends on the private data beyond the
releases (counts of clipped rows, the number of trials) goes to ``private`` and reaches
the user only through the explicit ``diagnostics=True`` opt-in.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from dp_accounting import dp_event

from dpprecond._validation import check_choice, check_fraction, check_int, check_positive
from dpprecond.accounting import ACCOUNTANTS, DEFAULT_ACCOUNTANT, compose, gaussian
from dpprecond.pca import budget as _budget
from dpprecond.pca.auto import AUTO_DEFAULTS, check_auto_options, fit_auto
from dpprecond.pca.baselines import (
    dp_power_method,
    exact_top_k,
    random_orthonormal,
)
from dpprecond.pca.core import (
    TrialSpec,
    clip_grid,
    iteration_grid,
    private_init,
    refine_init,
    run_trials,
    select,
)
from dpprecond.pca.rows import RowSource

__all__ = ["FEDERATED_METHODS", "METHODS", "OPTION_CHECKS", "PIPELINE_METHODS",
           "PRIVATE_METHODS", "FitContext", "MethodOutput", "PCAMethod"]


@dataclass(frozen=True)
class FitContext:
    """What a method's run sees.

    ``rows`` are the clipped rows (norm <= 1 as computed), ``S = A^T A`` their Gram matrix,
    ``z`` the noise multipliers to draw noise with (the plan's, inflated by the rounding
    bound of the block sums), ``plan`` the budget plan (its multipliers are the accounted
    ones), ``init_stream``/``main_stream`` independent random streams, ``delta`` the
    target delta.
    """

    rows: RowSource
    S: np.ndarray
    k: int
    z: dict[str, float]
    plan: _budget.BudgetPlan
    options: dict[str, Any]
    init_stream: np.random.Generator
    main_stream: np.random.Generator
    delta: float = 1e-6

    @property
    def n(self) -> int:
        """Number of rows."""
        return self.rows.shape[0]

    @property
    def d(self) -> int:
        """Number of columns."""
        return self.rows.shape[1]


@dataclass
class MethodOutput:
    """A method's run: basis, released eigenvalues, the releases made, details.

    ``basis`` is the orthonormal (d, k) basis of the estimate (the kernels' orientation;
    :class:`~dpprecond.pca.PCAResult` turns it into components as rows). ``trace`` is the
    trace of the released matrix the eigenvalues come from (post-processing; ``None``
    when nothing of the kind was released). ``event`` is what was actually released
    (``None``: the plan's event); ``info`` is public; ``private`` holds diagnostics that
    are functions of the private data.
    """

    basis: np.ndarray
    eigvals: np.ndarray | None = None
    event: dp_event.DpEvent | None = None
    info: dict[str, Any] = field(default_factory=dict)
    private: dict[str, Any] = field(default_factory=dict)
    trace: float | None = None


# -- option checks, by option name ------------------------------------------------------


def _open_fraction(name: str, v: Any) -> float:
    return check_fraction(name, v, low=0.0, high=1.0, low_open=True, high_open=True)


def _mean_trials(name: str, v: Any) -> float:
    mt = check_positive(name, v)
    if mt < 1:
        raise ValueError(f"Expected {name} >= 1, got {name}={mt}.")
    return mt


def _bool(name: str, v: Any) -> bool:
    if not isinstance(v, bool):
        raise TypeError(f"Expected {name} to be a bool, got {v!r}.")
    return v


def _radius_grid(name: str, v: Any) -> np.ndarray | None:
    if v is None:
        return None
    try:
        grid = np.asarray(v, dtype=np.float64).ravel()
    except (TypeError, ValueError):
        raise TypeError(f"Expected {name} to be a list of radii, got {name}={v!r}.") from None
    if grid.size == 0 or np.any(np.isnan(grid)) or np.any(grid <= 0):
        raise ValueError(f"Expected {name} to be a non-empty list of positive radii, "
                         f"got {name}={v!r}.")
    return grid


def _iter_grid(name: str, v: Any) -> np.ndarray | None:
    if v is None:
        return None
    grid = np.asarray(v)
    if grid.ndim != 1 or grid.size == 0 or not np.issubdtype(grid.dtype, np.integer) or \
            np.any(grid < 0):
        raise ValueError(f"Expected {name} to be a non-empty list of integers >= 0, got "
                         f"{name}={v!r}.")
    return grid.astype(np.int64)


def _optional_radius(name: str, v: Any) -> float | None:
    return None if v is None else check_positive(name, v, allow_inf=True)


def _checked_by_method(name: str, v: Any) -> Any:
    del name
    return v  # a method-wide check validates it (e.g. auto's check_auto_options)


#: Validator of every option of every method, by name: ``check(name, value) -> value``.
OPTION_CHECKS: dict[str, Callable[[str, Any], Any]] = {
    "add_noise": _bool,
    "accountant": lambda n, v: check_choice(n, v, ACCOUNTANTS),
    "mean_share": _open_fraction,
    "init_share": _open_fraction,
    "score_share": _open_fraction,
    "h_share": _open_fraction,
    "mean_trials": _mean_trials,
    "n_iter": lambda n, v: check_int(n, v, low=0),
    "t_max": lambda n, v: check_int(n, v, low=0),
    "beta": lambda n, v: check_fraction(n, v, low_open=True),
    "h_floor_factor": check_positive,
    "max_batch_columns": lambda n, v: check_int(n, v, low=1),
    "small_gap": lambda n, v: check_choice(n, v, ["refine", "return_init"]),
    "power_init": lambda n, v: check_choice(n, v, ["random", "private"]),
    "clip_radius": _optional_radius,
    "clip_grid": _radius_grid,
    "iter_grid": _iter_grid,
    **{name: _checked_by_method for name in ("probe_share", "iter_choices", "switch_ratio",
                                             "iter_calibration", "branch", "floor_factor",
                                             "count_threshold", "rescale_share")},
}


@dataclass(frozen=True)
class PCAMethod:
    """One private PCA method (see the module docstring)."""

    name: str
    defaults: dict[str, Any]
    plan: Callable[[_budget.Budget, float, dict[str, Any], float | None],
                   _budget.BudgetPlan]
    run: Callable[[FitContext], MethodOutput]
    check: Callable[[dict[str, Any]], None] = lambda opts: None
    private: bool = True
    description: str = ""
    #: every release is a sum over rows, so it runs on rows held by clients
    #: (``fit_private_pca(clients=...)``, :mod:`dpprecond.pca.federated`)
    federated: bool = False
    #: offered as the private feature step of :func:`dpprecond.pipeline.run_pipeline`
    #: (federated, and released eigenvalues to report)
    in_pipeline: bool = False

    def options(self, given: dict[str, Any]) -> dict[str, Any]:
        """The method's options: defaults updated by ``given``, every value checked.

        Raises ``TypeError`` naming unknown options and the valid ones, and
        ``ValueError``/``TypeError`` naming a bad value.
        """
        unknown = sorted(set(given) - set(self.defaults))
        if unknown:
            raise TypeError(f"Unknown option(s) {unknown} for method={self.name!r}; valid "
                            f"options are {sorted(self.defaults)}.")
        opts = {**self.defaults, **given}
        for key, value in list(opts.items()):
            if key in given or value is not None:
                opts[key] = OPTION_CHECKS[key](key, value)
        self.check(opts)
        return opts


# -- the methods ---------------------------------------------------------------------------

_COMMON = {"add_noise": True, "mean_share": 0.1}


def _no_infinite_radius_with_noise(opts: dict[str, Any]) -> None:
    radius = opts.get("clip_radius")
    if radius is not None and math.isinf(radius) and opts.get("add_noise", True):
        raise ValueError("clip_radius=inf is only for add_noise=False (the noise of Z is "
                         "2 R z_Z); give a finite clip_radius.")


def _auto_options(opts: dict[str, Any]) -> dict[str, Any]:
    return {name: opts[name] for name in AUTO_DEFAULTS}


def _check_auto(opts: dict[str, Any]) -> None:
    opts.update(check_auto_options(_auto_options(opts)))


def _run_auto(ctx: FitContext) -> MethodOutput:
    opts = _auto_options(ctx.options)
    multipliers = ctx.plan.noise_multipliers
    noise = opts["add_noise"] and multipliers.get("z_pca", 0.0) > 0
    res = fit_auto(ctx.rows, ctx.S, ctx.k, delta=ctx.delta, rng=ctx.init_stream,
                   noise_multiplier=multipliers["z_pca"] if noise else None,
                   **{**opts, "add_noise": bool(noise)})
    info = {key: (val.tolist() if isinstance(val, np.ndarray) else val)
            for key, val in res.info.items()}
    info["noise_multipliers"] = {**multipliers, **res.info["noise_multipliers"]}
    event = None
    if noise:  # the releases made: the private mean's (if any), then the fit's
        head = [ctx.plan.init_event] if "z_mean" in multipliers else []
        event = compose([*head, res.dp_event])
    return MethodOutput(res.basis, res.eigenvalues, event=event, info=info, trace=res.trace)


def _trace(M: np.ndarray | None) -> float | None:
    """Trace of a released matrix (post-processing), for the explained variance ratio."""
    return None if M is None else float(np.trace(M))


def _run_exact(ctx: FitContext) -> MethodOutput:
    V, eigvals = exact_top_k(ctx.S, ctx.k)
    return MethodOutput(V, eigvals, trace=float(np.trace(ctx.S)))


def _run_analyze_gauss(ctx: FitContext) -> MethodOutput:
    init = private_init(ctx.S, ctx.k, ctx.z["z0"], ctx.init_stream)  # Analyze Gauss
    return MethodOutput(init.X0, init.eigvals[:ctx.k], trace=_trace(init.M))


def _run_power(ctx: FitContext) -> MethodOutput:
    if ctx.options["power_init"] == "private":
        X0 = private_init(ctx.S, ctx.k, ctx.z["z0"], ctx.init_stream).X0
    else:
        X0 = random_orthonormal(ctx.d, ctx.k, ctx.init_stream)
    V = dp_power_method(ctx.S, X0, ctx.options["n_iter"], ctx.z["z_power"], ctx.main_stream)
    return MethodOutput(V, info={"n_iter": ctx.options["n_iter"]})


def _run_fixed(ctx: FitContext) -> MethodOutput:
    opts = ctx.options
    init = private_init(ctx.S, ctx.k, ctx.z["z0"], ctx.init_stream)
    radius = opts["clip_radius"] if opts["clip_radius"] is not None else math.sqrt(ctx.k / ctx.n)
    spec = TrialSpec(radius, opts["n_iter"], ctx.z["zH"], ctx.z["zZ"], ctx.main_stream,
                     opts["h_floor_factor"])
    (V,), clipped_last = run_trials(ctx.rows, ctx.S, init.X0, [spec])
    return MethodOutput(V, init.eigvals[:ctx.k], trace=_trace(init.M),
                        info={"clip_radius": radius, "n_iter": opts["n_iter"]},
                        private={"n_clipped_last_iteration": int(clipped_last[0])})


def _run_select(ctx: FitContext) -> MethodOutput:
    opts, k = ctx.options, ctx.k
    init = private_init(ctx.S, k, ctx.z["z0"], ctx.init_stream)
    radii = opts["clip_grid"] if opts["clip_grid"] is not None else clip_grid(ctx.n, k)
    iters = opts["iter_grid"] if opts["iter_grid"] is not None else iteration_grid(opts["t_max"])
    res = select(ctx.rows, ctx.S, init, z_run=ctx.z["z_run"], mean_trials=opts["mean_trials"],
                 score_share=opts["score_share"], h_share=opts["h_share"], radii=radii,
                 iters=iters, rng=ctx.main_stream, beta=opts["beta"],
                 h_floor_factor=opts["h_floor_factor"],
                 max_batch_columns=opts["max_batch_columns"])
    out = MethodOutput(res.X, init.eigvals[:k], trace=_trace(init.M),
                       info={"clip_radius": res.clip_radius, "n_iter": res.n_iter,
                             "noisy_score": res.noisy_score, "tau_lo": res.tau_lo,
                             "tau_hi": res.tau_hi, "early_exit": res.early_exit,
                             "clip_grid": [float(r) for r in radii],
                             "iter_grid": [int(t) for t in iters]},
                       private={"n_trials": res.n_trials,
                                "n_clipped_last_iteration": res.n_clipped_last})
    if res.early_exit and opts["small_gap"] == "return_init":
        out.event = ctx.plan.init_event
        out.info["note"] = ("Early exit: the released init's eigengap is below the noise "
                            "bound (h <= 0), so X0 is returned and only the init's budget "
                            "(and the private mean's, if any) is spent.")
    elif res.early_exit:  # small_gap == "refine"
        refined = refine_init(ctx.S, init, ctx.z["z_run"], ctx.main_stream)
        out.basis, out.eigvals = refined.X0, refined.eigvals[:k]
        out.trace = _trace(refined.M)
        out.event = compose([ctx.plan.init_event,
                             gaussian(ctx.plan.noise_multipliers["z_run"])])
        out.info["note"] = (
            "Small gap: the released init's eigengap is below the noise bound (h <= 0), "
            "so no trial ran; the trial budget (noise multiplier z_run, which costs at most "
            "the selection's Renyi DP at every order) was spent on a second release of "
            "A^T A, averaged with the init. The reported epsilon is that of the init and "
            "this release.")
    return out


def _check_select(opts: dict[str, Any]) -> None:
    grid = opts["clip_grid"]
    if grid is not None and opts["add_noise"] and not np.all(np.isfinite(grid)):
        raise ValueError(f"Expected clip_grid to hold finite radii (an infinite radius is "
                         f"only for add_noise=False), got clip_grid={list(grid)!r}.")
    if opts["accountant"] != "rdp":
        raise ValueError("method='select' needs accountant='rdp': it is the dp_accounting "
                         "accountant that supports RepeatAndSelectDpEvent.")


def _check_power(opts: dict[str, Any]) -> None:
    check_int("n_iter", opts["n_iter"], low=1)


METHODS: dict[str, PCAMethod] = {
    "auto": PCAMethod(
        "auto",
        {**_COMMON, **{k: v for k, v in AUTO_DEFAULTS.items() if k != "add_noise"}},
        lambda eps, delta, o, ms: _budget.plan_auto(eps, delta, mean_share=ms),
        _run_auto, _check_auto, federated=True, in_pipeline=True,
        description="a partial release of A^T A, a coherence probe, then Analyze Gauss "
                    "completed exactly or the preconditioned clipped iteration (the "
                    "default; docs/pca_auto.md)"),
    "analyze_gauss": PCAMethod(
        "analyze_gauss", {**_COMMON, "accountant": DEFAULT_ACCOUNTANT},
        lambda eps, delta, o, ms: _budget.plan_analyze_gauss(
            eps, delta, mean_share=ms, accountant=o["accountant"]),
        _run_analyze_gauss, federated=True, in_pipeline=True,
        description="Analyze Gauss (Dwork, Talwar, Thakurta and Zhang 2014)"),
    "fixed": PCAMethod(
        "fixed",
        {**_COMMON, "accountant": DEFAULT_ACCOUNTANT, "clip_radius": None, "n_iter": 2,
         "init_share": 0.25, "h_share": 0.5, "h_floor_factor": 4.0},
        lambda eps, delta, o, ms: _budget.plan_fixed(
            eps, delta, n_iter=o["n_iter"], init_share=o["init_share"], h_share=o["h_share"],
            mean_share=ms, accountant=o["accountant"]),
        _run_fixed, _no_infinite_radius_with_noise, federated=True, in_pipeline=True,
        description="Algorithm 1 then Algorithm 2 with a fixed (R, T)"),
    "select": PCAMethod(
        "select",
        {**_COMMON, "accountant": "rdp", "mean_trials": 3.0, "init_share": 0.5,
         "score_share": 0.1, "h_share": 0.5, "clip_grid": None, "iter_grid": None,
         "t_max": 8, "beta": 0.01, "h_floor_factor": 4.0, "max_batch_columns": 1024,
         "small_gap": "refine"},
        lambda eps, delta, o, ms: _budget.plan_select(
            eps, delta, mean_trials=o["mean_trials"], init_share=o["init_share"],
            mean_share=ms, accountant=o["accountant"]),
        _run_select, _check_select,
        description="Algorithm 1 then private selection of (R, T) by repeat-and-select "
                    "(the seed paper's method)"),
    "power": PCAMethod(
        "power",
        {**_COMMON, "accountant": DEFAULT_ACCOUNTANT, "n_iter": 10, "power_init": "random",
         "init_share": 0.25},
        lambda eps, delta, o, ms: _budget.plan_power(
            eps, delta, n_iter=o["n_iter"], private_init=o["power_init"] == "private",
            init_share=o["init_share"], mean_share=ms, accountant=o["accountant"]),
        _run_power, _check_power, federated=True,
        description="the DP power method (row model)"),
    "exact": PCAMethod(
        "exact", {},
        lambda eps, delta, o, ms: _budget.plan_analyze_gauss(None, delta, mean_share=None),
        _run_exact, private=False, federated=True,
        description="the non-private reference (epsilon = inf)"),
}

#: The private methods, in registry order (the CLI's ``--method`` choices; ``all`` runs them).
PRIVATE_METHODS: tuple[str, ...] = tuple(n for n, m in METHODS.items() if m.private)
#: Methods whose releases are all sums over rows (``fit_private_pca(clients=...)``).
FEDERATED_METHODS: tuple[str, ...] = tuple(n for n, m in METHODS.items() if m.federated)
#: The pipeline's private feature methods (``run_pipeline(pca_method=...)``, ``dpprecond fl
#: --pca-method``, the experiment configs' ``pca_method``).
PIPELINE_METHODS: tuple[str, ...] = tuple(n for n, m in METHODS.items() if m.in_pipeline)
