"""Gaussian noise and the noisy release: the one place a mechanism adds noise to a value.

Every mechanism of the library releases ``value + noise`` with ``noise`` i.i.d.
``N(0, std^2)`` (entrywise; for a symmetric statistic, on and above the diagonal) and
``std = noise_multiplier * sensitivity`` (the accounting layer's convention). It does so
with :func:`release`, which draws the noise from a :class:`NoiseSource`, forms the sum,
snaps it in secure mode (:func:`dpprecond.secure.snap`) and shows it to
:func:`dpprecond.secure.observe_releases` (the audits' view of a run).

Noise sources
-------------
A :class:`NoiseSource` is anything with a numpy-style ``standard_normal(size)``:

- a ``numpy.random.Generator`` (the default; :func:`keyed_stream` gives the generator of a
  ``(seed, key...)`` pair, the independent streams that tests and per-client noise use);
- :class:`dpprecond.secure.SecureGenerator` (secure mode: the OS CSPRNG; releases are
  snapped);
- wrappers that draw the same law differently: federated PCA's
  :class:`dpprecond.pca.federated.LocalNoise` (every client adds its own share) and the
  audits' batch source (many independent draws in one call);
- a *distributed* source (:func:`is_distributed`: it has ``release_sum``), federated
  PCA's :class:`dpprecond.secagg.sums.SecureSums` under secure aggregation: the noise is
  not Gaussian and not drawn here; :func:`release` hands it the value (a sum of client
  parts), the std and the release's sensitivity, and it returns the decoded secure sum.
  Such a source never gives Gaussian noise (:func:`gaussian` and
  :func:`symmetric_gaussian` refuse it);
- a *deferred* source (:func:`is_deferred`: it has ``deferred_release``), federated PCA
  over a network (:mod:`dpprecond.pca.remote`): the noise is Gaussian but drawn by each
  client on its own machine, so :func:`gaussian` and :func:`symmetric_gaussian` return
  the source's handle on the clients' draws (``source.draw(...)``, same law, same layout
  of each client's stream) and :func:`release` hands the value (a deferred sum over the
  clients) and that handle to ``source.deferred_release``, which returns the sum of the
  clients' noisy parts.

A draw of zero std returns zeros *without* touching the source, so switching a release off
does not shift the draws of the releases after it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np

from dpprecond import secure as _secure

__all__ = ["CoupledNoise", "NoiseSource", "coupled_symmetric_gaussian", "gaussian",
           "is_deferred", "is_distributed", "keyed_stream", "release", "symmetric_gaussian"]


@runtime_checkable
class NoiseSource(Protocol):
    """A source of standard normal draws (numpy ``Generator``-compatible).

    ``standard_normal(None)`` returns one float; ``standard_normal(shape)`` an array of that
    shape (a batch source may prepend a batch axis: :func:`release` broadcasts).
    """

    def standard_normal(self, size: Any = None) -> Any:
        """Standard normal draws of shape ``size`` (a float for ``None``)."""
        ...


def keyed_stream(seed: int, *key: int) -> np.random.Generator:
    """The generator of ``(seed, *key)``: ``SeedSequence(seed, spawn_key=key)``.

    Streams of distinct keys are independent, and a stream does not depend on which other
    streams were made or in which order (unlike drawing from one shared generator).

    Parameters
    ----------
    seed : int
        Root entropy, ``>= 0``.
    *key : int
        The stream's key (for instance ``(round_index, client)``), each ``>= 0``.
    """
    for name, value in (("seed", seed), *((f"key[{i}]", v) for i, v in enumerate(key))):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
            raise ValueError(f"Expected {name} to be an int >= 0, got {name}={value!r}.")
    return np.random.default_rng(np.random.SeedSequence(int(seed),
                                                        spawn_key=tuple(int(k) for k in key)))


def is_distributed(source: Any) -> bool:
    """True for a source whose noise the clients add to a secure sum (``release_sum``)."""
    return callable(getattr(source, "release_sum", None))


def is_deferred(source: Any) -> bool:
    """True for a source whose Gaussian noise each client draws itself (``deferred_release``)."""
    return callable(getattr(source, "deferred_release", None))


def _no_distributed(source: Any) -> None:
    if is_distributed(source):
        raise TypeError("Gaussian noise cannot be drawn from a secure-aggregation source: "
                        "its noise is the clients' Skellam shares (use release()).")


def _check_std(std: float) -> float:
    std = float(std)
    if not (math.isfinite(std) and std >= 0):
        raise ValueError(f"Expected a finite noise std >= 0, got std={std!r}.")
    return std


def gaussian(shape: tuple[int, ...], std: float, source: NoiseSource) -> Any:
    """I.i.d. ``N(0, std^2)`` noise of the given shape (zeros, no draw, when ``std == 0``).

    Parameters
    ----------
    shape : tuple of int
        Shape of the noise; ``()`` gives a float drawn with ``standard_normal(None)``.
    std : float
        Standard deviation of every entry, finite and ``>= 0``.
    source : NoiseSource
        Where the draws come from.

    Returns
    -------
    noise : ndarray of shape ``shape`` (float for ``shape == ()``)
    """
    std = _check_std(std)
    _no_distributed(source)
    shape = tuple(shape)
    if std == 0:
        return 0.0 if shape == () else np.zeros(shape)
    if is_deferred(source):  # each client draws std * standard_normal(shape) itself
        return source.draw("gaussian", shape, std)  # type: ignore[attr-defined]
    return std * source.standard_normal(None if shape == () else shape)


def symmetric_gaussian(dim: int, std: float, source: NoiseSource, *,
                       draws: Literal["square", "triangle"] = "square") -> np.ndarray:
    """Symmetric noise: entries on and above the diagonal i.i.d. ``N(0, std^2)``, mirrored.

    The noise of a release of the upper triangle (diagonal included) of a symmetric matrix
    statistic: the lower triangle is a copy, hence post-processing, so the l2 sensitivity
    of the release is the one of the upper triangle. The only symmetric-noise builder of
    the library.

    Parameters
    ----------
    dim : int
        Size of the ``(dim, dim)`` matrix.
    std : float
        Standard deviation of every entry on and above the diagonal; ``0`` gives zeros.
    source : NoiseSource
        Where the draws come from.
    draws : {"square", "triangle"}
        How the draws are laid out (same law, different use of the stream): ``"square"``
        draws a ``(dim, dim)`` array and keeps its upper triangle (the PCA releases);
        ``"triangle"`` draws the ``dim (dim + 1) / 2`` upper-triangle entries in row-major
        order (the federated second-moment releases).

    Returns
    -------
    W : ndarray of shape (dim, dim)
        Symmetric noise matrix.
    """
    std = _check_std(std)
    _no_distributed(source)
    if std == 0:
        return np.zeros((dim, dim))
    if draws not in ("square", "triangle"):
        raise ValueError(f"Expected draws in ('square', 'triangle'), got draws={draws!r}.")
    if is_deferred(source):  # each client draws this function's noise itself
        return source.draw("symmetric", (dim, dim), std,  # type: ignore[attr-defined]
                           draws=draws)
    if draws == "square":
        upper = np.triu(source.standard_normal((dim, dim)))
        upper *= std
    elif draws == "triangle":
        iu = np.triu_indices(dim)
        upper = np.zeros((dim, dim))
        upper[iu] = std * source.standard_normal(len(iu[0]))
    else:
        raise ValueError(f"Expected draws in ('square', 'triangle'), got draws={draws!r}.")
    return upper + np.triu(upper, 1).T


# --------------------------------------------------------------------------------------
# Coupled noise: two independent releases from one full-precision draw
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CoupledNoise:
    """Two independent symmetric Gaussian noises built from a full-budget draw.

    ``full`` (entry variance ``v``) is the noise a single release at the combined precision
    would add; ``extra`` (variance ``v1 - v``) is independent of it. Then

    - ``first = full + extra`` has variance ``v1``;
    - ``second = full - (v / (v1 - v)) extra`` has variance ``v v1 / (v1 - v)``, i.e.
      precision ``1/v - 1/v1``;
    - ``Cov(first, second) = v - (v / (v1 - v)) (v1 - v) = 0``: jointly Gaussian and
      uncorrelated, hence independent, so ``(first, second)`` has exactly the distribution
      of two independent draws and the privacy analysis of two independent releases holds;
    - the inverse-variance average of ``S + first`` and ``S + second`` is ``S + full``.
    """

    full: np.ndarray
    extra: np.ndarray
    var_full: float
    var_first: float

    @property
    def first(self) -> np.ndarray:
        """The first release's noise (variance ``var_first``)."""
        return self.full + self.extra

    @property
    def var_second(self) -> float:
        """Entry variance of :attr:`second` (``inf`` when the first takes everything)."""
        if self.var_first == self.var_full:
            return math.inf
        return self.var_full * self.var_first / (self.var_first - self.var_full)

    @property
    def second(self) -> np.ndarray:
        """The second release's noise, independent of :attr:`first`."""
        if self.var_first == self.var_full:
            raise ValueError("No precision is left for a second release (var_first == "
                             "var_full).")
        return self.full - (self.var_full / (self.var_first - self.var_full)) * self.extra


def coupled_symmetric_gaussian(dim: int, std_full: float, std_first: float,
                               source: NoiseSource) -> CoupledNoise:
    """Draw :class:`CoupledNoise` for two releases of a symmetric ``dim x dim`` statistic.

    ``full`` is drawn first, with exactly the call :func:`symmetric_gaussian` makes for a
    single release of entry std ``std_full``, so a source in the same state gives the same
    ``full`` as that single release. ``extra``
    (std ``sqrt(std_first^2 - std_full^2)``) is drawn next from the same generator.

    Parameters
    ----------
    dim : int
        Size of the symmetric matrices.
    std_full : float
        Entry std of the combined (full-precision) noise; ``0`` switches noise off.
    std_first : float
        Entry std of the first release's noise, ``>= std_full``.
    source : NoiseSource
        Where the draws come from.
    """
    if std_first < std_full:
        raise ValueError(f"Expected std_first >= std_full, got std_first={std_first} < "
                         f"std_full={std_full}.")
    full = symmetric_gaussian(dim, std_full, source)
    extra = symmetric_gaussian(dim, math.sqrt(std_first**2 - std_full**2), source)
    return CoupledNoise(full, extra, std_full**2, std_first**2)


def release(value: Any, std: float, source: NoiseSource, *, symmetric: bool = False,
            noise: Any = None, sensitivity: float | None = None) -> Any:
    """``value + noise`` with ``noise ~ N(0, std^2)``: the one place a noisy release is formed.

    The noise has the shape of ``value`` (symmetric for ``symmetric=True``) and is drawn
    from ``source``, unless ``noise`` is given (noise drawn beforehand with this module,
    such as a coupled pair; ``std`` is then the std it has). With a secure source
    (:func:`dpprecond.secure.is_secure`) the sum is snapped to a grid far below ``std``;
    otherwise it is the plain float64 sum. ``value`` is not modified. Inside
    :func:`dpprecond.secure.observe_releases` a copy of every release is recorded.

    Parameters
    ----------
    value : float or ndarray
        The exact statistic (its sensitivity is the caller's to state).
    std : float
        Noise standard deviation, ``noise_multiplier * sensitivity``; ``0`` releases
        ``value`` itself (no draw).
    source : NoiseSource
        Where the draws come from; also decides snapping.
    symmetric : bool
        ``value`` is a symmetric ``(d, d)`` matrix: noise from :func:`symmetric_gaussian`.
    noise : float or ndarray, optional
        Noise drawn beforehand (then nothing is drawn here).
    sensitivity : float, optional
        The release's l2 sensitivity (``std / sensitivity`` is its noise multiplier, times
        the rounding slack). Unused by Gaussian sources; a distributed source
        (:func:`is_distributed`) needs it to scale and round the clients' parts.

    Returns
    -------
    released : float or ndarray
        ``value + noise``, snapped in secure mode (a batch source broadcasts to a batch).
    """
    std = _check_std(std)
    if is_deferred(source):  # clients far away: each adds its own draw to its part
        out = source.deferred_release(value, std,  # type: ignore[attr-defined]
                                      symmetric=symmetric, noise=noise,
                                      sensitivity=sensitivity)
        for seen in _secure._OBSERVERS.get():
            seen.append((np.array(out, copy=True), std))
        return out
    if is_distributed(source):  # secure aggregation: the clients' shares, a decoded sum
        if noise is not None:
            raise TypeError("Noise drawn beforehand cannot enter a secure sum: under secure "
                            "aggregation the clients add the noise.")
        out = source.release_sum(value, std, symmetric=symmetric,  # type: ignore[attr-defined]
                                 sensitivity=sensitivity)
        for seen in _secure._OBSERVERS.get():
            seen.append((np.array(out, copy=True), std))
        return out
    if noise is None:
        if symmetric:
            shape = np.shape(value)
            if len(shape) != 2 or shape[0] != shape[1]:
                raise ValueError(f"Expected a square value for symmetric=True, got shape "
                                 f"{shape}.")
            noise = symmetric_gaussian(shape[0], std, source)
        else:
            noise = gaussian(np.shape(value), std, source)
    out = value + noise
    if _secure.is_secure(source):  # looked up at call time (tests spy on it)
        out = _secure.snap(out, std)
    for seen in _secure._OBSERVERS.get():
        seen.append((np.array(out, copy=True), std))
    return out
