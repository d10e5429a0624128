"""``dpprecond pca``: private top-k PCA of a named dataset or a matrix file.

Prints one table row per (method, epsilon) with the epsilon actually spent and the
subspace error against the exact top-k subspace of the same (scaled) rows, and can write
everything as JSON.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path
from typing import Any

import numpy as np

from dpprecond.data import DATASETS, load_dataset, load_matrix
from dpprecond.pca.methods import PRIVATE_METHODS

__all__ = ["PRIVATE_METHODS", "load_pca_matrix", "register", "run", "run_pca_table"]


def load_pca_matrix(data: str,
                    data_path: str | None = None) -> tuple[np.ndarray, float | None, str]:
    """The matrix to decompose, the public row-norm bound of its domain, and a description.

    Named image datasets have pixels in [0, 1], so ``sqrt(d)`` bounds every row norm
    without looking at the data; that is the default bound. ``digits`` uses all 1797 rows
    (the PCA literature's matrix), ``fashion-mnist`` its 60000 training rows. A file has no
    known domain: its bound must be given with ``--row-norm``.
    """
    if data in DATASETS:
        ds = load_dataset(data, data_path)
        X = np.vstack([ds.X_train, ds.X_test]) if data == "digits" else ds.X_train
        return X, math.sqrt(X.shape[1]), f"{data} ({X.shape[0]} x {X.shape[1]})"
    path = Path(data)
    if path.suffix and not path.exists():
        raise ValueError(f"--data {data!r}: no such file. Give an existing .npy or .csv file, "
                         f"or one of {sorted(DATASETS)}.")
    if path.suffix.lower() in (".npy", ".csv", ".txt", ".tsv") or path.exists():
        X = load_matrix(path)
        return X, None, f"{path.name} ({X.shape[0]} x {X.shape[1]})"
    raise ValueError(f"Unknown --data {data!r}: give one of {sorted(DATASETS)} or the path of "
                     "a .npy/.csv file.")


def run_pca_table(X: np.ndarray, k: int, methods: list[str], epsilons: list[float],
                  delta: float, row_norm: float, seed: int | None,
                  center: str | None = None, options: dict[str, Any] | None = None,
                  secure: bool = False, ledger: Any = None, clients: np.ndarray | None = None,
                  trust: str = "local") -> list[dict[str, Any]]:
    """Fit every (method, epsilon) and return one record per fit, with its metrics.

    ``clients`` (row bounds, ``fit_private_pca``'s) fits federated PCA under ``trust``;
    the reference stays the exact top-k subspace of all the rows.

    The reference is the exact top-k subspace of the same preprocessed rows (same row
    scaling, no centering noise), so the errors measure the privacy noise alone. This is an
    evaluation by the data owner: the errors, the counts of clipped rows and the fit times
    use the private data and are not private (only the fitted components are).

    Every row is a separate release on the same rows; with a ``ledger`` the table's whole
    plan (the composition of every fit's) is checked against its ``max_epsilon`` before any
    fit, and every fit is recorded in it.
    """
    import warnings

    from dpprecond.pca import fit_private_pca
    from dpprecond.pca.api import PrivateDiagnosticsWarning
    from dpprecond.pca.metrics import captured_variance_ratio, sin_theta, sin_theta_frobenius
    from dpprecond.pca.preprocess import preprocess

    # The non-private answer: exact top-k of the same rows, centered at the exact mean.
    ref_center = None if center is None else X.mean(axis=0)
    def fit(*args: Any, **kwargs: Any) -> Any:  # the table says the diagnostics are private
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", PrivateDiagnosticsWarning)
            return fit_private_pca(*args, **kwargs)

    ref = fit(X, k, method="exact", target_epsilon=None, target_delta=delta,
                          row_norm=row_norm, center=ref_center, diagnostics=True)
    A = preprocess(X, row_norm, center=ref_center).A
    V = ref.basis
    # the exact subspace is the evaluation's reference, not a release: it is not written
    records = [{"method": "exact", "epsilon_target": None, "epsilon": math.inf,
                "delta": delta, "sin_theta": 0.0, "sin_theta_frobenius": 0.0,
                "captured_variance": 1.0, "n_clipped": ref.diagnostics["n_clipped"],
                "fit_seconds": ref.diagnostics["fit_seconds"], "components": None,
                "explained_variance": None}]
    opts = options or {}

    def options_of(method: str) -> dict[str, Any]:
        return {key: val for key, val in opts.items() if key in _OPTION_OWNERS
                and method in _OPTION_OWNERS[key]}

    fit_center = None if center is None else "private"
    if ledger is not None:  # the whole table, before any fit
        from dpprecond.accounting import compose
        from dpprecond.pca.api import planned_event

        ledger.check(compose([planned_event(m, target_epsilon=e, target_delta=delta,
                                            center=fit_center, trust=trust, **options_of(m))
                              for m in methods for e in epsilons]))
    federated: dict[str, Any] = {} if clients is None else {"clients": clients, "trust": trust}
    for method in methods:
        for eps in epsilons:
            method_opts = options_of(method)
            t0 = time.perf_counter()
            res = fit(X, k, method=method, target_epsilon=eps,
                                  target_delta=delta, row_norm=row_norm,
                                  center=fit_center, seed=seed, diagnostics=True,
                                  secure=secure, ledger=ledger, **federated, **method_opts)
            seconds = time.perf_counter() - t0
            records.append({
                "method": method, "epsilon_target": eps, "epsilon": res.epsilon,
                "delta": delta, "sin_theta": sin_theta(res.basis, V),
                "sin_theta_frobenius": sin_theta_frobenius(res.basis, V),
                "captured_variance": captured_variance_ratio(A, res.basis, V),
                "clip_radius": res.info.get("clip_radius"), "n_iter": res.info.get("n_iter"),
                "early_exit": res.info.get("early_exit", False),
                "branch": res.info.get("branch"),
                "n_clipped": res.diagnostics["n_clipped"],
                "fit_seconds": seconds,
                # the releases: components (d x k) and the released eigenvalue estimates
                "components": res.components, "explained_variance": res.explained_variance,
            })
    return records


#: Which CLI options go to which methods.
_OPTION_OWNERS = {
    "clip_radius": ("fixed",),
    "n_iter": ("fixed", "power"),
    "mean_trials": ("select",),
}


#: What to read in the table, printed under it by ``dpprecond pca`` and ``dpprecond demo``.
LEGEND = (
    "capt. var: the rows' variance the private subspace captures, as a share of what the "
    "exact top-k subspace captures (1 = as good as exact): read this first.\n"
    "sin-theta: sine of the largest angle to the exact subspace (0 exact, 1 orthogonal); it "
    "is near 1 as soon as one of the k directions is not found. On digits at small epsilon "
    "the noise is larger than the 2nd to 5th eigenvalues, so those directions are guesses "
    "while the first (the mean image, most of the variance) is found: about 0.8 of the "
    "variance captured with sin-theta near 1.")


def format_table(records: list[dict[str, Any]]) -> str:
    """Plain-text table of :func:`run_pca_table` records (captured variance first)."""
    header = f"{'method':<14}{'eps target':>11}{'eps spent':>11}{'capt. var':>11}" \
             f"{'sin-theta':>11}{'sin-F':>9}{'R':>9}{'T':>5}{'fit s':>8}"
    lines = [header, "-" * len(header)]
    for r in records:
        tgt = "-" if r["epsilon_target"] is None else f"{r['epsilon_target']:g}"
        spent = "inf" if math.isinf(r["epsilon"]) else f"{r['epsilon']:.4f}"
        ag_branch = str(r.get("branch", "")).startswith("analyze_gauss")
        no_radius = r.get("clip_radius") is None or not math.isfinite(r["clip_radius"])
        radius = "-" if no_radius or ag_branch else f"{r['clip_radius']:.3g}"
        iters = "-" if r.get("n_iter") is None or ag_branch else str(r["n_iter"])
        secs = "-" if r.get("fit_seconds") is None else f"{r['fit_seconds']:.2f}"
        note = "  (gap test failed: no trial ran)" if r.get("early_exit") else ""
        if r.get("branch"):
            note = "  (" + {"analyze_gauss": "completed Analyze Gauss",
                            "analyze_gauss_rescaled": "Analyze Gauss at the rows' own scale",
                            }.get(r["branch"], "iterated") + ")"
        lines.append(f"{r['method']:<14}{tgt:>11}{spent:>11}{r['captured_variance']:>11.4f}"
                     f"{r['sin_theta']:>11.4f}{r['sin_theta_frobenius']:>9.4f}"
                     f"{radius:>9}{iters:>5}{secs:>8}{note}")
    return "\n".join(lines)


def register(subparsers: Any) -> None:
    """Add the ``pca`` sub-command."""
    p = subparsers.add_parser(
        "pca", help="differentially private top-k PCA",
        description="Private top-k PCA (privacy unit: one row, replace-one adjacency). "
                    "Prints the epsilon spent (from dp_accounting) and the subspace error "
                    "against the exact top-k subspace.")
    from dpprecond.cli.options import add

    add(p, "pca_data")
    add(p, "pca_data_path")
    add(p, "n_components")
    add(p, "pca_method", choices=(*PRIVATE_METHODS, "all"))
    add(p, "pca_epsilon")
    add(p, "delta")
    add(p, "row_norm")
    add(p, "center")
    from dpprecond.pca.methods import METHODS

    owners = _OPTION_OWNERS

    def shown(key: str) -> str:  # the methods' own defaults, from the registry
        values = [(m, METHODS[m].defaults[key]) for m in owners[key]]
        return ", ".join(f"{v:g} for {m}" if v is not None else f"sqrt(k/n) for {m}"
                         for m, v in values)

    add(p, "clip_radius", shown=shown("clip_radius"))
    add(p, "n_iter", shown=shown("n_iter"))
    add(p, "mean_trials", shown=shown("mean_trials"))
    add(p, "seed")
    add(p, "pca_json")
    add(p, "secure")
    add(p, "pca_max_epsilon")
    add(p, "pca_clients")
    add(p, "pca_trust")
    p.set_defaults(func=run)


def client_bounds(n_rows: int, n_clients: int) -> np.ndarray:
    """Row bounds of ``n_clients`` contiguous blocks of ``n_rows`` rows (sizes differ by at
    most one): client ``i`` holds rows ``bounds[i]:bounds[i + 1]``."""
    from dpprecond._validation import check_int

    k = check_int("--clients", n_clients, low=2, high=n_rows)
    return np.array([i * n_rows // k for i in range(k + 1)], dtype=np.int64)


def _check_federated(args: argparse.Namespace, methods: list[str]) -> list[str]:
    """The methods of a ``--clients`` table (``all``: the federated ones), refusing what
    federated PCA cannot run before the data is read."""
    from dpprecond.pca.methods import FEDERATED_METHODS

    if args.clients == 0:
        if args.trust is not None:
            raise ValueError(f"--trust {args.trust} applies to federated PCA only: give "
                             "--clients K (K >= 2) too, or drop --trust.")
        return methods
    if "all" in methods:
        return [m for m in PRIVATE_METHODS if m in FEDERATED_METHODS]
    bad = [m for m in methods if m not in FEDERATED_METHODS]
    if bad:
        raise ValueError(f"--method {bad[0]} does not run federated (its selection score "
                         "needs the exact A^T A, which no party of a federation holds); "
                         f"with --clients use one of {list(FEDERATED_METHODS)}.")
    return methods


def run(args: argparse.Namespace) -> int:
    """Run the ``pca`` sub-command."""
    from dpprecond._validation import check_epsilon, check_target_delta
    from dpprecond.accounting import PrivacyLedger

    if args.secure and args.seed is not None:
        raise ValueError(f"--secure refuses --seed (got --seed {args.seed}): seeded noise can "
                         "be regenerated by whoever knows the seed; drop --seed.")
    epsilons = [check_epsilon("--epsilon", e) for e in (args.epsilon or [1.0])]
    check_target_delta("--delta", args.delta)  # before the data is read
    ledger = None if args.max_epsilon is None else PrivacyLedger(
        args.delta, max_epsilon=check_epsilon("--max-epsilon", args.max_epsilon))
    from dpprecond.cli.options import check_row_norm

    check_row_norm(args.row_norm)  # before the data is read
    methods = _check_federated(args, args.method or [])
    X, domain_bound, desc = load_pca_matrix(args.data, args.data_path)
    bounds = None if args.clients == 0 else client_bounds(X.shape[0], args.clients)
    trust = args.trust or "local"
    row_norm = args.row_norm if args.row_norm is not None else domain_bound
    if row_norm is None:
        raise ValueError(f"--row-norm is required for {args.data}: give a public bound on the "
                         "l2 norm of its rows (never derived from the data).")
    from dpprecond.pca import DEFAULT_METHOD

    methods = methods or [DEFAULT_METHOD]
    if "all" in methods:
        methods = list(PRIVATE_METHODS)
    options = {key: val for key, val in (("clip_radius", args.clip_radius),
                                         ("n_iter", args.n_iter),
                                         ("mean_trials", args.mean_trials)) if val is not None}
    center = None if args.center == "none" else "private"
    print(f"data: {desc}, k={args.n_components}, delta={args.delta:g}, row_norm={row_norm:g}, "
          f"center={args.center}, "
          f"seed={'fresh OS entropy' if args.seed is None else args.seed}"
          + ("" if bounds is None else f", {args.clients} clients (contiguous blocks of "
             f"{X.shape[0] // args.clients}-{-(-X.shape[0] // args.clients)} rows), "
             f"trust={trust}"))
    records = run_pca_table(X, args.n_components, methods, epsilons, args.delta, row_norm,
                            args.seed, center=center, options=options, secure=args.secure,
                            ledger=ledger, clients=bounds, trust=trust)
    print(format_table(records))
    print(LEGEND)
    if ledger is not None:
        print(f"the table's {ledger.n_releases} releases on the same rows spend epsilon "
              f"{ledger.epsilon:.4f} in total at delta={args.delta:g} (--max-epsilon "
              f"{ledger.max_epsilon:g})")
    clipped = records[0]["n_clipped"]
    print(f"rows scaled down to the row-norm bound: {clipped} of {X.shape[0]}")
    print("(an evaluation for the data owner: the errors against the exact answer, the clipped "
          "rows and the times use the private data and are not private; only the fitted "
          "components and the epsilons are releases)")
    if args.json_path:
        from dpprecond._files import write_json

        payload = {"data": desc, "k": args.n_components, "delta": args.delta,
                   "row_norm": row_norm, "seed": args.seed, "centering": args.center,
                   "n_clients": args.clients or None,
                   "trust": None if bounds is None else trust,
                   # deprecated: the same mode under its old name (it is not a centre)
                   "center": args.center,
                   "results": records}
        write_json(args.json_path, payload, indent=2)  # strict JSON (docs/outputs.md)
        print(f"wrote {args.json_path}")
    return 0
