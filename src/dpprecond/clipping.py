"""Row norms and clipping that no finite input can overflow, underflow or cancel.

Every mechanism in dpprecond bounds the contribution of one privacy unit by clipping a
vector (a PCA row, a per-example gradient, a feature row) to a radius. The sensitivity
proof holds for the numbers the code computes only if the clipped vector, *as computed*,
has norm at most the radius. Two things break the naive ``x * min(1, r / ||x||)``:

- ``||x||^2`` overflows to ``inf`` for entries near ``1e155`` and above (and underflows to
  ``0`` for entries below about ``1e-162``), so the factor becomes ``0`` or ``inf``;
- a factor that is itself subnormal is rounded with a large *relative* error, so the
  clipped vector can come out longer than the radius.

The scheme here: every row is first multiplied by a power of two ``pre_i`` (exact in
binary floating point) that brings its largest entry into ``[0.5, 1)`` whenever its squared
norm is outside a safe range (``pre_i = 1`` otherwise, the common case, at no extra cost),
its norm ``nu_i = ||x_i pre_i||`` is computed without risk, and the clipped row is
``(x_i pre_i) post_i`` with ``post_i = SHRINK * min(1 / pre_i, r / nu_i)``, applied as two
separate products. Rounding: ``nu_i`` has relative error at most ``gamma_{d+1}``
(``gamma_m = m u / (1 - m u)``, ``u = 2^-53``) and each product at most ``u``, so the
computed row has norm at most ``r * SHRINK * (1 + u)^2 / (1 - gamma_{d+1})``, which is
``<= r`` for ``d < 2^22`` with ``SHRINK = 1 - 2^-30`` (checked by :func:`check_width`).
The factor ``SHRINK`` changes every clipped or scaled vector by less than ``1e-9``
relatively.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "MAX_WIDTH",
    "SHRINK",
    "check_width",
    "clip_rows_safely",
    "clip_to_radius",
    "gamma",
    "row_sq_norms",
    "safe_row_norms",
    "unit_scale",
]

#: Every clipped or scaled vector is multiplied by this factor (see the module docstring).
SHRINK = 1.0 - 2.0**-30
#: Widest row for which the rounding argument of the module docstring holds.
MAX_WIDTH = 2**22
_UNIT_ROUNDOFF = 2.0**-53
#: Squared norms in this range are computed directly (no overflow, no underflow risk).
_SAFE_SQ = (1e-280, 1e280)


def gamma(m: float) -> float:
    """Higham's ``gamma_m = m u / (1 - m u)``: relative error bound of ``m`` rounded operations.

    A sum of ``m`` floating-point terms, in any order, differs from the exact sum by at most
    ``gamma_{m-1}`` times the sum of the absolute values of the terms.
    """
    mu = m * _UNIT_ROUNDOFF
    if mu >= 1.0:
        return float("inf")
    return mu / (1.0 - mu)


def check_width(name: str, d: int) -> None:
    """Refuse rows wider than :data:`MAX_WIDTH` (the rounding argument needs it)."""
    if d >= MAX_WIDTH:
        raise ValueError(f"{name} has {d} columns; rows wider than {MAX_WIDTH} are not "
                         "supported (the clipping's rounding bound needs fewer columns).")


def row_sq_norms(X: np.ndarray) -> np.ndarray:
    """``sum_j x_ij^2`` per row as :func:`safe_row_norms` computes it (may overflow to inf,
    or underflow, for rows outside its safe range: it rescales those itself)."""
    return np.einsum("ij,ij->i", X, X)


def safe_row_norms(X: np.ndarray, sq: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(nu, pre)`` with ``pre_i`` a power of two and ``nu_i = ||x_i pre_i||``.

    ``pre_i = 1`` for rows whose squared norm lies in a safe range (then ``nu_i = ||x_i||``
    to a few ulp). Other rows (squared norm overflowing, underflowing, or zero) are scaled
    by ``2^-e`` with ``e`` the binary exponent of their largest entry (clamped to
    ``[-1000, 1000]``), which is exact. The true norm is ``nu_i / pre_i`` (not computed:
    it may not be representable).

    Parameters
    ----------
    X : ndarray of shape (n, d)
        Finite rows.
    sq : ndarray of shape (n,), optional
        ``row_sq_norms(X)`` if it was already computed (the same numbers: a pass that
        kept them does not read ``X`` again, except its rows outside the safe range).

    Returns
    -------
    nu, pre : ndarray of shape (n,)
    """
    if sq is None:
        sq = row_sq_norms(X)
    nu = np.sqrt(sq)
    pre = np.ones(X.shape[0])
    bad = ~((sq > _SAFE_SQ[0]) & (sq < _SAFE_SQ[1]))
    if bad.any():
        Xb = X[bad]
        top = np.abs(Xb).max(axis=1)
        exponent = np.frexp(top)[1]
        p = np.ldexp(1.0, np.clip(-exponent, -1000, 1000))
        Y = Xb * p[:, None]
        nu[bad] = np.sqrt(np.einsum("ij,ij->i", Y, Y))
        pre[bad] = p
    return nu, pre


def clip_to_radius(nu: np.ndarray, pre: np.ndarray,
                   radius: float | np.ndarray) -> np.ndarray:
    """``post`` such that ``(x_i pre_i) post_i = x_i min(1, radius / ||x_i||) SHRINK``.

    ``radius`` is one radius for every row, or an array of one radius per row.

    ``radius = inf`` gives ``post = SHRINK / pre`` (no clipping). A zero row gets
    ``post = SHRINK / pre`` (it stays zero). Apply as ``(X * pre) * post``, never as
    ``X * (pre * post)`` (the product of the factors can be subnormal).
    """
    with np.errstate(divide="ignore", over="ignore"):
        inv_pre = 1.0 / pre
        ratio = np.where(nu > 0, radius / np.where(nu > 0, nu, 1.0), np.inf)
    return SHRINK * np.minimum(inv_pre, ratio)


def unit_scale(nu: np.ndarray, pre: np.ndarray, bound: float) -> tuple[np.ndarray, np.ndarray]:
    """``post`` such that ``(x_i pre_i) post_i = clip_bound(x_i) / bound * SHRINK``.

    The PCA row map: divide by the public ``bound``, then scale rows still above norm 1
    down to norm 1. Returns ``(post, clipped)`` where ``clipped`` marks the rows whose norm
    exceeded ``bound``. Overflow of ``bound * pre`` means the row is far below the bound
    (not clipped, post underflows towards 0, which is the right tiny row); underflow means
    it is far above (clipped).
    """
    with np.errstate(over="ignore", under="ignore"):
        level = bound * pre  # exact unless it over/underflows (pre is a power of two)
    clipped = nu > level
    post = np.empty_like(nu)
    post[clipped] = SHRINK / nu[clipped]
    with np.errstate(divide="ignore", under="ignore"):
        post[~clipped] = SHRINK / level[~clipped]
    return post, clipped


def clip_rows_safely(G: np.ndarray, clip_norm: float) -> np.ndarray:
    """Rows of ``G`` clipped to norm ``clip_norm``, for any input (a new array).

    A row with a non-finite entry (a per-example gradient that overflowed) is replaced by
    zero: a deterministic function of that example, so the sensitivity is kept. Finite rows
    are clipped with the overflow-safe factors of :mod:`dpprecond.clipping` (norm at most
    ``clip_norm`` as computed). ``clip_norm = inf`` returns the rows unchanged.
    """
    if np.isinf(clip_norm):
        return np.array(G, dtype=np.float64)
    G = np.where(np.isfinite(G).all(axis=1)[:, None], G, 0.0)
    nu, pre = safe_row_norms(G)
    G *= pre[:, None]
    G *= clip_to_radius(nu, pre, clip_norm)[:, None]
    return G
