"""scikit-learn style estimator around :func:`dpprecond.pca.fit_private_pca`."""

from __future__ import annotations

from typing import Any

import numpy as np
from sklearn.base import BaseEstimator, TransformerMixin
from sklearn.utils.validation import check_is_fitted

from dpprecond.pca.api import DEFAULT_OPTIONS, check_dense, fit_private_pca

__all__ = ["PrivatePCA"]

#: Estimator parameters forwarded to :func:`fit_private_pca` as options when not None.
_OPTION_PARAMS = ("mean_trials", "clip_radius", "n_iter", "init_share", "score_share",
                  "h_share", "mean_share", "clip_grid", "t_max", "small_gap", "accountant")


class PrivatePCA(TransformerMixin, BaseEstimator):
    """Differentially private top-k PCA (coherence-adaptive preconditioned power iteration).

    Privacy unit: one row of ``X`` (one individual), replace-one adjacency. Rows are divided
    by the public bound ``row_norm`` and rows still above norm 1 are scaled down to norm 1.
    The fit is ``(epsilon, delta)``-DP; ``epsilon_`` is computed by ``dp_accounting`` from
    ``dp_event_``. Sensitivities and accounting of each method are documented in
    :mod:`dpprecond.pca.core`, :mod:`dpprecond.pca.baselines` and
    :mod:`dpprecond.pca.budget`.

    Parameters
    ----------
    n_components : int
        Number of components ``k`` (``1 <= k <= n_features``).
    epsilon : float
        Target epsilon (> 0).
    delta : float
        Target delta in (0, 1).
    row_norm : float
        Public bound on the l2 norm of the rows (> 0). Required; never derived from data.
    method : {"select", "fixed", "analyze_gauss", "power", "exact"}, default="select"
        ``"select"``: private initialisation then private selection of (R, T);
        ``"fixed"``: fixed ``clip_radius`` and ``n_iter``; ``"analyze_gauss"``;
        ``"power"``: DP power method; ``"exact"``: non-private reference.
    center : None, "private" or array-like of shape (n_features,), default=None
        No centering (uncentered PCA, default), a private mean charged to the budget
        (share ``mean_share``), or a public mean.
    random_state : None, int or numpy.random.Generator, default=None
        Seed of the noise.
    mean_trials, clip_radius, n_iter, init_share, score_share, h_share, mean_share, \
clip_grid, t_max, small_gap, accountant : optional
        Method options (``None``: the method's default); see
        :func:`dpprecond.pca.fit_private_pca`. An option that does not apply to the chosen
        method raises ``TypeError`` at fit.

    Attributes
    ----------
    components_ : ndarray of shape (n_components, n_features)
        Orthonormal rows spanning the private top-k subspace.
    epsilon_ : float
        Epsilon spent at ``delta_`` (from ``dp_accounting``; ``inf`` for ``"exact"``; below
        the target when the selection's gap test failed: the init's and one more Gram
        release's with ``small_gap="refine"``, the init's alone with ``"return_init"``).
    delta_ : float
    dp_event_ : dp_accounting.DpEvent
        All releases of the fit, composable with other events.
    mean_ : ndarray of shape (n_features,)
        Mean subtracted by ``transform`` (zeros when ``center=None``).
    explained_variance_ : ndarray of shape (n_components,) or None
        Private estimate of the top eigenvalues of ``X^T X / n`` (centered if requested),
        from the released noisy matrix (``None`` for ``method="power"``).
    clip_radius_, n_iter_ : float, int
        Selected (``"select"``) or given (``"fixed"``) clip radius and iterations
        (``nan``/``None`` where not applicable).
    early_exit_ : bool
        True when the selection's gap test on the init failed (h <= 0) and no trial ran.
    n_clipped_ : int
        Rows scaled down to norm 1 (data-owner diagnostic, not a private release).
    n_features_in_ : int
    info_ : dict
        The ``info`` dict of :class:`dpprecond.pca.PCAResult`.

    Notes
    -----
    All of scikit-learn's estimator checks pass (``tests/pca/test_estimator.py`` runs
    ``parametrize_with_checks``) except one that is left out:
    ``check_array_api_input`` (it needs ``SCIPY_ARRAY_API=1`` and array-api-compat; the
    estimator computes in NumPy float64 on purpose, since the noise is calibrated there).
    Input must have ``n_samples >= n_features``; a smaller input raises ``ValueError``.
    """

    def __init__(self, n_components: int, *, epsilon: float, delta: float,
                 row_norm: float | None, method: str = "select", center: Any = None,
                 random_state: Any = None, mean_trials: float | None = None,
                 clip_radius: float | None = None, n_iter: int | None = None,
                 init_share: float | None = None, score_share: float | None = None,
                 h_share: float | None = None, mean_share: float | None = None,
                 clip_grid: Any = None, t_max: int | None = None,
                 small_gap: str | None = None, accountant: str | None = None) -> None:
        self.n_components = n_components
        self.epsilon = epsilon
        self.delta = delta
        self.row_norm = row_norm
        self.method = method
        self.center = center
        self.random_state = random_state
        self.mean_trials = mean_trials
        self.clip_radius = clip_radius
        self.n_iter = n_iter
        self.init_share = init_share
        self.score_share = score_share
        self.h_share = h_share
        self.mean_share = mean_share
        self.clip_grid = clip_grid
        self.t_max = t_max
        self.small_gap = small_gap
        self.accountant = accountant

    def _options(self) -> dict[str, Any]:
        opts = {}
        for name in _OPTION_PARAMS:
            value = getattr(self, name)
            if value is None:
                continue
            if self.method in DEFAULT_OPTIONS and name not in DEFAULT_OPTIONS[self.method]:
                raise TypeError(f"Parameter {name}={value!r} does not apply to "
                                f"method={self.method!r}; leave it as None.")
            opts[name] = value
        return opts

    def fit(self, X: Any, y: Any = None) -> PrivatePCA:
        """Fit the private subspace on ``X`` of shape (n_samples, n_features); returns self."""
        result = fit_private_pca(X, self.n_components, method=self.method,
                                 epsilon=self.epsilon, delta=self.delta,
                                 row_norm=self.row_norm, center=self.center,
                                 rng=self.random_state, **self._options())
        d = result.components.shape[0]
        self.components_ = np.ascontiguousarray(result.components.T)
        self.n_components_ = self.components_.shape[0]
        self.n_features_in_ = d
        self.mean_ = np.zeros(d) if result.mean is None else result.mean
        self.epsilon_ = result.epsilon
        self.delta_ = result.delta
        self.dp_event_ = result.dp_event
        self.explained_variance_ = result.explained_variance
        self.clip_radius_ = result.info.get("clip_radius", float("nan"))
        self.n_iter_ = result.info.get("n_iter")
        self.early_exit_ = bool(result.info.get("early_exit", False))
        self.n_clipped_ = result.n_clipped
        self.info_ = result.info
        return self

    def _check_X(self, X: Any) -> np.ndarray:
        check_is_fitted(self, "components_")
        X = check_dense("X", X)
        if X.shape[1] != self.n_features_in_:
            raise ValueError(f"X has {X.shape[1]} features, but {type(self).__name__} is "
                             f"expecting {self.n_features_in_} features as input.")
        return X

    def transform(self, X: Any) -> np.ndarray:
        """Project ``X`` (n, n_features) onto the components: ``(X - mean_) @ components_.T``."""
        X = self._check_X(X)
        return (X - self.mean_) @ self.components_.T

    def inverse_transform(self, X: Any) -> np.ndarray:
        """Map scores (n, n_components) back to feature space: ``X @ components_ + mean_``."""
        check_is_fitted(self, "components_")
        X = check_dense("X", X)
        if X.shape[1] != self.n_components_:
            raise ValueError(f"X has {X.shape[1]} columns, but {type(self).__name__} has "
                             f"{self.n_components_} components.")
        return X @ self.components_ + self.mean_

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.allow_nan = False
        return tags
