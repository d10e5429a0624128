"""scikit-learn style estimator around :func:`dpprecond.pca.fit_private_pca`."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
from sklearn.base import BaseEstimator, ClassNamePrefixFeaturesOutMixin, TransformerMixin
from sklearn.utils.validation import check_is_fitted

from dpprecond._validation import is_dask_array
from dpprecond.pca.api import DEFAULT_METHOD, check_dense, fit_private_pca

#: The public default number of components (never derived from the data).
DEFAULT_N_COMPONENTS = 2

__all__ = ["PrivateModelSelectionWarning", "PrivatePCA"]


class PrivateModelSelectionWarning(UserWarning):
    """A private estimator was cloned: every fit of a clone spends budget (model selection)."""


#: What a clone of a private estimator means (warned by ``__sklearn_clone__``).
MODEL_SELECTION_NOTE = (
    "{name} was cloned (as GridSearchCV, cross_validate and other model-selection tools "
    "do): every fit of a clone is a new private release on the rows it is given and spends "
    "its target_epsilon (recorded in the shared ledger when one is set, recorded nowhere "
    "otherwise), and choosing hyperparameters by a score computed on private data is "
    "itself a release that no ledger charges: charge it, or state that the tuning is "
    "assumed free (docs/privacy.md).")


def _out_dtype(X: Any) -> np.dtype:
    """float32 input stays float32 (as scikit-learn's PCA keeps it); anything else float64."""
    dtype = getattr(X, "dtype", None)
    return np.dtype(np.float32) if dtype == np.float32 else np.dtype(np.float64)


class PrivatePCA(ClassNamePrefixFeaturesOutMixin, TransformerMixin, BaseEstimator):
    """Differentially private top-k PCA that adapts to the coherence of the data.

    The default method, ``"auto"`` (:mod:`dpprecond.pca.auto`), releases part of ``A^T A``,
    probes the rows' coherence privately and then either completes Analyze Gauss or runs
    the preconditioned clipped power iteration; it spends exactly the target budget.

    Privacy unit: one row of ``X`` (one individual), replace-one adjacency. Rows are divided
    by the public bound ``row_norm`` and rows still above norm 1 are scaled down to norm 1.
    The fit is ``(target_epsilon, target_delta)``-DP; ``epsilon_`` is computed by
    ``dp_accounting`` from ``dp_event_``. Sensitivities and accounting of each method are
    documented in :mod:`dpprecond.pca.core`, :mod:`dpprecond.pca.baselines` and
    :mod:`dpprecond.pca.budget`.

    Parameters
    ----------
    n_components : int, default=2
        Number of components ``k`` (``1 <= k <= n_features``). The default is public (the
        usual two of a scatter plot) and never derived from the data; the noise of the
        default method does not grow with ``k``, but the smaller gaps of more components
        make each harder to estimate, so ask for the number you need.
    target_epsilon : float
        Target epsilon (> 0).
    target_delta : float
        Target delta in (0, 1).
    row_norm : float
        Public bound on the l2 norm of the rows (> 0). Required; never derived from data.
    method : str, default="auto"
        A method of :data:`dpprecond.pca.methods.METHODS` (see
        :func:`dpprecond.pca.fit_private_pca`); ``"auto"`` is the best measured
        (``docs/pca_auto.md``).
    center : None, "private" or array-like of shape (n_features,), default=None
        No centering (uncentered PCA, default), a private mean charged to the budget
        (option ``mean_share``), or a public mean.
    random_state : None, int or numpy.random.Generator, default=None
        Seed of the noise; ``None`` (default) is fresh OS entropy. A fixed seed is for
        reproducible research only.
    options : dict, default=None
        Options of the method (``None``: its defaults); an option that does not apply to
        the method raises ``TypeError`` at fit.
    ledger : PrivacyLedger, default=None
        A ledger shared with other fits and runs on the same rows: the fit is refused
        before touching the data if it would exceed the ledger's ``max_epsilon``, and its
        releases are recorded there. ``sklearn.base.clone`` shares it by reference
        (:class:`~dpprecond.accounting.PrivacyLedger`), so every fit of a model-selection
        tool (``GridSearchCV``, ``cross_validate``) is recorded in it and refused by its
        cap; cloning warns (:class:`PrivateModelSelectionWarning`) that each fit spends
        budget and that choosing hyperparameters on private data is itself a release.
    diagnostics : bool, default=False
        Also store ``diagnostics_``: values that depend on the private data beyond the
        releases (rows clipped, selection trials, fit time). They are NOT private; a
        warning says so at fit.
    secure : bool, default=False
        Secure mode (:mod:`dpprecond.secure`): CSPRNG noise, snapped releases, and
        ``random_state`` must be ``None``.

    Attributes
    ----------
    components_ : ndarray of shape (n_components, n_features)
        Orthonormal rows spanning the private top-k subspace, the same orientation as
        :attr:`dpprecond.pca.PCAResult.components` and scikit-learn's ``PCA``; float32 for
        float32 input (computed in float64, where the noise is calibrated).
    epsilon_ : float
        Epsilon spent at ``delta_`` (from ``dp_accounting``; ``inf`` for ``"exact"``; below
        the target when the selection's gap test failed with
        ``options={"small_gap": "return_init"}``).
    delta_ : float
    dp_event_ : dp_accounting.DpEvent
        All releases of the fit, composable with other events.
    mean_ : ndarray of shape (n_features,)
        Mean subtracted by ``transform`` (zeros when ``center=None``).
    explained_variance_ : ndarray of shape (n_components,) or None
        Private estimate of the top eigenvalues of ``X^T X / n`` (centered if requested),
        from a released noisy matrix (``None`` for ``method="power"``).
    explained_variance_ratio_ : ndarray of shape (n_components,) or None
        ``explained_variance_`` over the trace of the same released matrix
        (:attr:`dpprecond.pca.PCAResult.explained_variance_ratio`): post-processing of
        what the fit released, so it costs no budget; noisy like the released matrix.
    n_samples_ : int
        Number of rows seen at fit (public).
    n_features_in_ : int
    info_ : dict
        Public details of the fit (:attr:`dpprecond.pca.PCAResult.info`): the noise
        multipliers and the method's released choices (``branch``, ``clip_radius``,
        ``n_iter``, ``early_exit``...).
    diagnostics_ : dict or None
        Only with ``diagnostics=True`` (not private, see above).

    Notes
    -----
    Everything a fitted estimator holds (and pickles) is released or public, unless
    ``diagnostics=True``. All of scikit-learn's estimator checks pass
    (``tests/pca/test_estimator.py`` runs ``parametrize_with_checks``) except
    ``check_array_api_input`` (it needs ``SCIPY_ARRAY_API=1`` and array-api-compat; the
    estimator computes in NumPy float64 on purpose, since the noise is calibrated there).
    Input must have ``n_samples >= n_features``; a smaller input raises ``ValueError``.
    """

    def __init__(self, n_components: int = DEFAULT_N_COMPONENTS, *, target_epsilon: float,
                 target_delta: float,
                 row_norm: float | None, method: str = DEFAULT_METHOD, center: Any = None,
                 random_state: Any = None, options: dict[str, Any] | None = None,
                 ledger: Any = None, diagnostics: bool = False, secure: bool = False) -> None:
        self.n_components = n_components
        self.target_epsilon = target_epsilon
        self.target_delta = target_delta
        self.row_norm = row_norm
        self.method = method
        self.center = center
        self.random_state = random_state
        self.options = options
        self.ledger = ledger
        self.diagnostics = diagnostics
        self.secure = secure

    def __sklearn_clone__(self) -> PrivatePCA:
        warnings.warn(MODEL_SELECTION_NOTE.format(name=type(self).__name__),
                      PrivateModelSelectionWarning, stacklevel=2)
        return super().__sklearn_clone__()

    def fit(self, X: Any, y: Any = None) -> PrivatePCA:
        """Fit the private subspace on ``X`` of shape (n_samples, n_features); returns self."""
        if self.options is not None and not isinstance(self.options, dict):
            raise TypeError(f"Expected options to be a dict or None, got "
                            f"{type(self.options).__name__}.")
        if not isinstance(self.diagnostics, bool):
            raise TypeError(f"Expected diagnostics to be a bool, got {self.diagnostics!r}.")
        if self.secure is True and self.random_state is not None:
            raise ValueError(f"secure=True refuses seeds (got random_state="
                             f"{self.random_state!r}): a seeded fit's noise can be regenerated "
                             "by whoever knows the seed.")
        result = fit_private_pca(X, self.n_components, method=self.method,
                                 target_epsilon=self.target_epsilon,
                                 target_delta=self.target_delta, row_norm=self.row_norm,
                                 center=self.center, seed=self.random_state,
                                 ledger=self.ledger, diagnostics=self.diagnostics,
                                 secure=self.secure,
                                 **(self.options or {}))
        dtype = _out_dtype(X)
        k, d = result.components.shape
        self.components_ = result.components.astype(dtype)
        self.n_components_ = k
        self.n_features_in_ = d
        self.n_samples_ = result.n_samples
        mean = np.zeros(d) if result.mean is None else result.mean
        self.mean_ = mean.astype(dtype)
        self.epsilon_ = result.epsilon
        self.delta_ = result.delta
        self.dp_event_ = result.dp_event
        ev, ratio = result.explained_variance, result.explained_variance_ratio
        self.explained_variance_ = None if ev is None else ev.astype(dtype)
        self.explained_variance_ratio_ = None if ratio is None else ratio.astype(dtype)
        self.info_ = result.info
        self.diagnostics_ = result.diagnostics
        return self

    @property
    def _n_features_out(self) -> int:
        """Number of output features (scikit-learn's ``ClassNamePrefixFeaturesOutMixin``
        names them ``privatepca0``, ``privatepca1``, ...)."""
        return int(self.components_.shape[0])

    def _check_X(self, X: Any, width: int, what: str) -> Any:
        check_is_fitted(self, "components_")
        if is_dask_array(X):  # kept lazy: checked by shape and dtype only
            if X.ndim != 2:
                raise ValueError(f"Expected X to be a 2-D array, got a {X.ndim}-D dask array.")
            if X.dtype.kind not in "biuf":
                raise TypeError(f"Expected a real dask array, got dtype {X.dtype}.")
        else:
            X = check_dense("X", X)
        if X.shape[1] != width:
            raise ValueError(f"X has {X.shape[1]} features, but {type(self).__name__} is "
                             f"expecting {width} {what} as input.")
        return X

    def transform(self, X: Any) -> Any:
        """Project ``X`` (n, n_features) onto the components: ``(X - mean_) @ components_.T``.

        Float32 input gives float32 output; a dask array gives a lazy dask array (nothing is
        computed until you ask, as dask-ml's transformers do).
        """
        dtype = _out_dtype(X)
        X = self._check_X(X, self.n_features_in_, "features")
        C, mu = self.components_.astype(np.float64), self.mean_.astype(np.float64)
        with np.errstate(over="ignore"):  # a projection beyond the float range is inf
            return ((X.astype(np.float64) - mu) @ C.T).astype(dtype)

    def inverse_transform(self, X: Any) -> Any:
        """Map scores (n, n_components) back to feature space: ``X @ components_ + mean_``."""
        dtype = _out_dtype(X)
        X = self._check_X(X, self.n_components_, "components")
        C, mu = self.components_.astype(np.float64), self.mean_.astype(np.float64)
        with np.errstate(over="ignore"):  # a point beyond the float range is inf
            return (X.astype(np.float64) @ C + mu).astype(dtype)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.allow_nan = False
        if tags.transformer_tags is not None:
            tags.transformer_tags.preserves_dtype = ["float64", "float32"]
        return tags
