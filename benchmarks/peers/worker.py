"""One PCA fit in a fresh process, for ``benchmarks/peers.py``: time the fit, save the basis.

Runs under either Python: ours (``dpprecond``, scikit-learn references) or the peers' venv
(``diffprivlib``, ``opendp``); it imports only what its ``--spec`` needs, so it must not
import ``dpprecond`` or the benchmark helpers at module level. Prints one line
``RESULT {json}`` and saves the fitted basis (d x k, columns) to ``--out``.

Specs (``library:variant``):

- ``dpprecond:<method>:uncentered`` / ``dpprecond:<method>:centered``:
  ``fit_private_pca(X, k, method, target_epsilon, target_delta, row_norm, center=None or
  "private")``; (epsilon, delta)-DP, replace-one;
- ``diffprivlib:uncentered``: ``diffprivlib.models.PCA(k, epsilon, data_norm=row_norm,
  centered=True)`` (``centered=True`` means "the data is already centered": it fits the
  second moment ``X^T X``, the uncentered problem); pure epsilon-DP;
- ``diffprivlib:centered``: the same with ``centered=False, bounds=(lo, hi)`` (a private mean
  with half of epsilon, then the covariance with the other half);
- ``opendp:centered``: ``opendp``'s ``dp.sklearn.decomposition.PCA(epsilon, row_norm,
  n_samples, n_features, n_components)`` (private mean, then the eigendecomposition of the
  centered SSCP matrix); pure epsilon-DP. Its constructor's ``epsilon`` is the loss per
  changed record under the symmetric distance (add or remove one); one replaced row is a
  symmetric distance of 2, so the worker passes ``epsilon / 2`` and reports the
  measurement's own privacy map at ``d_in = 2`` (with ``--opendp-epsilon constructor`` it
  passes ``epsilon`` as given);
- ``sklearn:PCA:<solver>`` (centered) and ``sklearn:TruncatedSVD:<algorithm>``
  (uncentered): non-private references.
"""

from __future__ import annotations

import argparse
import json
import time
import warnings
from typing import Any

import numpy as np


def _dist_version(name: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "unknown"


def _versions() -> dict[str, Any]:
    out: dict[str, Any] = {"numpy": np.__version__}
    try:
        from threadpoolctl import threadpool_info

        out["blas"] = [f"{i.get('internal_api')} {i.get('version')} ({i.get('num_threads')} "
                       f"threads)" for i in threadpool_info() if i.get("user_api") == "blas"]
    except ImportError:
        pass
    return out


def fit(spec: str, X: np.ndarray, args: argparse.Namespace) -> tuple[np.ndarray, dict]:
    """Fit ``spec`` on X; return the basis (d x k) and public details."""
    parts = spec.split(":")
    lib = parts[0]
    k = args.k
    info: dict[str, Any] = {}
    if lib == "dpprecond":
        import dpprecond
        from dpprecond.pca import fit_private_pca

        method, variant = parts[1], parts[2]
        t0 = time.perf_counter()
        res = fit_private_pca(X, k, method=method, target_epsilon=args.eps,
                              target_delta=args.delta, row_norm=args.row_norm,
                              center="private" if variant == "centered" else None,
                              seed=args.seed)
        seconds = time.perf_counter() - t0
        info.update(version=dpprecond.__version__, epsilon=res.epsilon, delta=res.delta,
                    privacy="(epsilon, delta)-DP, replace one row",
                    branch=res.info.get("branch"))
        return res.basis, {**info, "fit_seconds": seconds}
    if lib == "diffprivlib":
        import diffprivlib
        from diffprivlib.models import PCA

        centered = parts[1] == "centered"
        kwargs: dict[str, Any] = {"epsilon": args.eps, "data_norm": args.row_norm,
                                  "random_state": args.seed}
        if centered:
            kwargs.update(centered=False, bounds=(args.lo, args.hi))
        else:
            kwargs.update(centered=True)
        model = PCA(n_components=k, **kwargs)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            t0 = time.perf_counter()
            model.fit(X)
            seconds = time.perf_counter() - t0
        info.update(version=diffprivlib.__version__, epsilon=args.eps, delta=0.0,
                    privacy="pure epsilon-DP (diffprivlib's adjacency)",
                    call=f"diffprivlib.models.PCA({k}, {kwargs})",
                    warnings=sorted({str(w.message)[:200] for w in caught}))
        return model.components_.T, {**info, "fit_seconds": seconds}
    if lib == "opendp":
        import opendp.prelude as dp

        dp.enable_features("contrib", "honest-but-curious", "idealized-numerics")
        n, d = X.shape
        eps = args.eps / 2 if args.opendp_epsilon == "replace-one" else args.eps
        model = dp.sklearn.decomposition.PCA(epsilon=eps, row_norm=args.row_norm,
                                             n_samples=n, n_features=d, n_components=k)
        loss = float(model.measurement().map(2))
        t0 = time.perf_counter()
        model.fit(X)
        seconds = time.perf_counter() - t0
        info.update(version=_dist_version("opendp"),
                    constructor_epsilon=eps, epsilon=loss, delta=0.0,
                    privacy="pure epsilon-DP (privacy map at symmetric distance 2 = one "
                            "replaced row)",
                    call=f"dp.sklearn.decomposition.PCA(epsilon={eps}, row_norm="
                         f"{args.row_norm}, n_samples={n}, n_features={d}, n_components={k})")
        return model.components_.T, {**info, "fit_seconds": seconds}
    if lib == "sklearn":
        import sklearn
        from sklearn.decomposition import PCA, TruncatedSVD

        cls, solver = parts[1], parts[2]
        model = (PCA(n_components=k, svd_solver=solver, random_state=args.seed)
                 if cls == "PCA" else
                 TruncatedSVD(n_components=k, algorithm=solver, random_state=args.seed))
        t0 = time.perf_counter()
        model.fit(X)
        seconds = time.perf_counter() - t0
        info.update(version=sklearn.__version__, epsilon=float("inf"), delta=0.0,
                    privacy="non-private", solver=getattr(model, "_fit_svd_solver", solver))
        return model.components_.T, {**info, "fit_seconds": seconds}
    raise SystemExit(f"unknown spec {spec!r}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--spec", required=True)
    p.add_argument("--data", required=True, help=".npy file of X (float64)")
    p.add_argument("--out", required=True, help=".npy file for the basis (d x k)")
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--eps", type=float, default=1.0)
    p.add_argument("--delta", type=float, default=1e-6)
    p.add_argument("--row-norm", type=float, required=True)
    p.add_argument("--lo", type=float, default=0.0, help="public lower bound of a feature")
    p.add_argument("--hi", type=float, default=1.0, help="public upper bound of a feature")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--opendp-epsilon", choices=["replace-one", "constructor"],
                   default="replace-one")
    args = p.parse_args()
    X = np.load(args.data)
    V, info = fit(args.spec, X, args)
    np.save(args.out, np.ascontiguousarray(V, dtype=np.float64))
    print("RESULT " + json.dumps({**info, "spec": args.spec, **_versions()}, default=str),
          flush=True)


if __name__ == "__main__":
    main()
