"""Federated private PCA: the rows are split over clients, every pass is a sum over them.

Privacy unit: one row (one record of one client), replace-one adjacency, rows of norm
<= 1 as in central PCA (:mod:`dpprecond.pca.rows`); the sensitivities of every release
are the central ones, because each row enters exactly one client's part. Each client
computes its part of every pass over ``A`` (its Gram matrix, its products with the
broadcast iterate, its clipped sums) with the same functions as central PCA
(:class:`FederatedRows` holds one :class:`~dpprecond.pca.rows.ClippedRows` per client),
and the server adds the parts. Who adds the noise is the trust model:

``trust="local"`` (no trusted party)
    Every client adds its own Gaussian noise with the *central* standard deviation to its
    part before sending it, so each client's message meets the target on its own: it is a
    Gaussian mechanism with the central noise multiplier ``z`` on the client's records, and
    the guarantee holds against the server and everyone else; the accounting is the central
    one (events and epsilon unchanged). The aggregate then carries ``K`` independent
    noises: ``sqrt(K)`` times the central noise std (:class:`LocalNoise` draws them, one
    stream per client).
``trust="secure-aggregation"`` (the server sees only sums; :mod:`dpprecond.secagg.sums`)
    Every release is a secure sum with distributed Skellam noise: each client computes its
    part (:class:`FederatedRows` with ``shared=True`` returns the parts, a
    :class:`~dpprecond.secagg.sums.ClientParts`, never their sum), scales it by a power of
    two ``gamma``, rounds it to integers with its own uniforms (``floor(y) + [U <= y -
    floor(y)]``), adds its Skellam share of ``1/K`` of the variance (std ``std /
    sqrt(K)`` for ``min_clients = K``) and sends it modulo ``2^bits``; the server decodes
    the modular sum. A client's message alone does not meet the target: only the sum
    does, against an honest-but-curious server that sees nothing but the sum (and
    clients that add their shares honestly). The noise source of the kernels is
    :class:`~dpprecond.secagg.sums.SecureSums`; :func:`dpprecond.noise.release` hands it
    every release with its central sensitivity.

    Sensitivity of the rounded release (one row, replace-one, rows of norm ``<= 1``): the
    row's client's computed part moves by at most ``Delta`` (the central sensitivity,
    times ``1 + rounding slack``); with the same uniforms the rounded parts move by an
    integer vector with ``|w_j| <= ceil(gamma |delta_j|)``, so ``||w||_2 <= gamma Delta +
    sqrt(m)`` on ``m`` released coordinates and ``||w||_1 <= min(sqrt(m) ||w||_2,
    ||w||_2^2)``; joint quasi-convexity of Renyi divergence carries the Skellam RDP bound
    at these sensitivities to the mixture over the uniforms. ``gamma`` is the smallest
    power of two with ``sqrt(m) / (gamma Delta) <= 2^-10``: the noise std is at most
    ``1 + 2^-10`` times the central Gaussian one. The modulus is the smallest power of two
    whose wrap-around bound is at most ``1e-12`` per sum.

    Accounting: each Gaussian release of the method's plan (noise multiplier ``z``)
    becomes ``ZCDpEvent(rho, rho/2)``, ``rho = 1/(2 z^2) + 1/(2 z^4 (2^10 + 1)^2)``
    (:func:`~dpprecond.secagg.sums.sum_event`, which dominates every such sum), and the
    plan's common scale is recalibrated with dp_accounting's RDP accountant to the
    target (:func:`~dpprecond.pca.budget.secure_aggregation_plan`). The fit records its
    plan's event, charged to a ledger before the first share is computed; for ``auto``
    it dominates the releases of every branch (their precisions add up to the plan's).
    ``auto``'s two Gram releases are drawn independently (the Gaussian coupling of the
    central fit has no Skellam counterpart). Dropouts: ``min_clients`` (default ``K``)
    sets each share to ``1/min_clients`` of the variance; a sum with fewer shares is not
    released (:class:`~dpprecond.secagg.skellam.InsufficientNoiseError`); the simulation
    has every client answer. ``secure=True`` draws every client's rounding and share (and
    the server's public draws) from the OS CSPRNG
    (:meth:`~dpprecond.secure.SecureGenerator.poisson`); not available: non-private fits.

Over a network (:mod:`dpprecond.pca.remote`, on Flower :mod:`dpprecond.adapters.flower.pca`)
the same fit runs under ``trust="local"`` with each client adding its own draw to its own
part on its machine (the streams :class:`LocalNoise` would give it), and under
``trust="secure-aggregation"`` with each client sending its encoded message to a secure
sum (:mod:`dpprecond.pca.remote_secure`; on Flower's SecAgg+
:mod:`dpprecond.adapters.flower.pca_secagg`), from the streams
:class:`~dpprecond.secagg.sums.SecureSums` gives it.

Methods: every release of ``auto``, ``analyze_gauss``, ``fixed``, ``power`` (and ``exact``)
is a sum over rows (``auto``'s probe is a histogram: a sum of per-row indicator vectors),
so they run federated; whatever a method computes between releases is a function of
released values, broadcast to every client. ``select`` does not: its selection score needs the
eigendecomposition of the exact ``A^T A``, which no party holds in a federation.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import pairwise
from typing import Any, Literal

import numpy as np

from dpprecond.pca.rows import DEFAULT_BLOCK_BYTES, ClippedRows
from dpprecond.secagg.sums import ClientParts

__all__ = ["TRUST_MODELS", "FederatedRows", "LocalNoise", "TrustModel",
           "check_client_bounds", "combined_rounding_slack"]

#: Who adds the noise of federated PCA: every client its own full noise (``local``) or
#: every client a Skellam share of a secure sum (``secure-aggregation``).
TRUST_MODELS = ("local", "secure-aggregation")
#: A name of :data:`TRUST_MODELS` (for annotations; a test checks they agree).
TrustModel = Literal["local", "secure-aggregation"]


def combined_rounding_slack(client_slacks: Sequence[float], n: int) -> float:
    """The rounding bound of a sum over clients: the largest client's bound of its block
    sums (each at ``n`` terms) plus one addition per client (``K`` clients, ``n`` rows).

    The one definition for in-process federated PCA and for a fit over a network
    (:mod:`dpprecond.pca.remote`, whose clients report their own bounds).
    """
    return max(client_slacks) + 2.0 * len(client_slacks) * 2.0**-53 * n


def check_client_bounds(bounds: Any, n: int) -> np.ndarray:
    """Client bounds ``0 = b_0 < b_1 < ... < b_K = n`` as int64 (``ValueError`` naming the
    bounds otherwise: floats, unsorted, an empty client, not ending at ``n``)."""
    raw = np.asarray(bounds)
    if raw.dtype.kind not in "iu":  # 0.5 or 14.0 would be truncated silently
        raise ValueError(f"Expected client bounds of integers 0 = b_0 < b_1 < ... < b_K = "
                         f"n = {n}, got dtype {raw.dtype} "
                         f"({raw.ravel().tolist()[:6]}); pass row indices as ints.")
    out = raw.astype(np.int64)
    if out.ndim != 1 or out.size < 2 or out[0] != 0 or out[-1] != n or \
            np.any(np.diff(out) <= 0):
        raise ValueError(f"Expected client bounds 0 = b_0 < b_1 < ... < b_K = n = {n} "
                         "(every client holds at least one row), got "
                         f"{out.tolist()[:6]}{'...' if out.size > 6 else ''}.")
    return out


class FederatedRows:
    """The rows of ``A`` held by ``K`` clients (client ``i`` owns ``X[bounds[i]:bounds[i+1]]``).

    Every pass is the sum (or concatenation) of the clients' passes, each computed by the
    client's own :class:`~dpprecond.pca.rows.ClippedRows`. Centering uses the released (or
    public) mean broadcast to every client.
    """

    def __init__(self, clients: Sequence[ClippedRows], bounds: np.ndarray, *,
                 shared: bool = False) -> None:
        self.clients = list(clients)
        self.bounds = np.asarray(bounds, dtype=np.int64)
        #: secure aggregation: the passes return their clients' parts
        #: (:class:`~dpprecond.secagg.sums.ClientParts`), never the sum
        self.shared = shared
        self.row_norm = self.clients[0].row_norm
        self.mean = self.clients[0].mean
        self._norms: np.ndarray | None = None

    @classmethod
    def from_data(cls, X: Any, bounds: Any, row_norm: float, *,
                  block_bytes: int = DEFAULT_BLOCK_BYTES,
                  shared: bool = False) -> FederatedRows:
        """Split ``X`` at ``bounds`` (``0 = b_0 < b_1 < ... < b_K = n``) into clients."""
        bounds = check_client_bounds(bounds, X.shape[0])
        parts = [ClippedRows.from_data(X[lo:hi], row_norm, block_bytes=block_bytes)
                 for lo, hi in pairwise(bounds)]
        return cls(parts, bounds, shared=shared)

    @property
    def n_clients(self) -> int:
        """Number of clients K."""
        return len(self.clients)

    @property
    def shape(self) -> tuple[int, int]:
        """``(n, d)`` of the whole ``A``."""
        return int(self.bounds[-1]), self.clients[0].shape[1]

    @property
    def n_clipped(self) -> int:
        """Rows scaled down in step 1 (a diagnostic, not a release)."""
        return sum(c.n_clipped for c in self.clients)

    @property
    def n_clipped_centered(self) -> int:
        """Rows scaled down after centering (a diagnostic, not a release)."""
        return sum(c.n_clipped_centered for c in self.clients)

    def rounding_slack(self) -> float:
        """The rounding bound of the block sums plus one addition per client."""
        n = self.shape[0]
        return combined_rounding_slack([c.rounding_slack(n) for c in self.clients], n)

    def column_sum(self) -> Any:
        """``sum_i u_i`` over every client's step-1 rows (the parts when ``shared``)."""
        if self.shared:
            return ClientParts([c.column_sum() for c in self.clients])
        return np.sum([c.column_sum() for c in self.clients], axis=0)

    def centered(self, mean: np.ndarray) -> FederatedRows:
        """Every client's rows centered at the broadcast ``mean`` and re-clipped."""
        return FederatedRows([c.centered(mean) for c in self.clients], self.bounds,
                             shared=self.shared)

    def gram(self) -> Any:
        """``A^T A`` as the sum of the clients' Gram matrices (the parts when ``shared``)."""
        if self.shared:
            return ClientParts([c.gram() for c in self.clients])
        S = np.zeros((self.shape[1],) * 2)
        for c in self.clients:
            S += c.gram()
        return S

    def blocks(self) -> Iterator[tuple[int, int, np.ndarray]]:
        """``(lo, hi, A[lo:hi])``: every client's blocks in client order, in global rows."""
        for c, start in zip(self.clients, self.bounds[:-1], strict=False):
            for lo, hi, block in c.blocks():
                yield int(start) + lo, int(start) + hi, block

    def block_sum(self, func: Any, *args: Any, shape: tuple[int, ...],
                  row_scaled: bool = False, row_sq: bool = False) -> Any:
        """The sum over clients of each client's :meth:`ClippedRows.block_sum` (the parts
        when ``shared``)."""
        if self.shared:
            return ClientParts([c.block_sum(func, *args, shape=shape, row_scaled=row_scaled,
                                            row_sq=row_sq)
                                for c in self.clients])
        out = np.zeros(shape)
        for c in self.clients:
            out += c.block_sum(func, *args, shape=shape, row_scaled=row_scaled,
                               row_sq=row_sq)
        return out

    def times(self, M: np.ndarray) -> np.ndarray:
        """``A @ M``: each client's rows times the broadcast ``M``, stacked."""
        return np.concatenate([c.times(M) for c in self.clients], axis=0)

    def t_times(self, D: np.ndarray) -> np.ndarray:
        """``A^T D``: the sum of each client's ``A_i^T D_i``."""
        out = np.zeros((self.shape[1], D.shape[1]))
        for c, lo, hi in zip(self.clients, self.bounds[:-1], self.bounds[1:], strict=True):
            out += c.t_times(D[lo:hi])
        return out

    def rows(self, idx: np.ndarray) -> np.ndarray:
        """Rows ``idx`` (sorted) of ``A``, each read by its client."""
        idx = np.asarray(idx)
        out = np.empty((idx.size, self.shape[1]))
        owner = np.searchsorted(self.bounds, idx, side="right") - 1
        for i, c in enumerate(self.clients):
            sel = np.flatnonzero(owner == i)
            if sel.size:
                out[sel] = c.rows(idx[sel] - self.bounds[i])
        return out

    @property
    def norms(self) -> np.ndarray:
        """l2 norms of the rows of ``A`` (each client's, concatenated)."""
        if self._norms is None:
            self._norms = np.concatenate([c.norms for c in self.clients])
        return self._norms

    def materialize(self) -> np.ndarray:
        """All of ``A`` (for metrics and tests)."""
        return np.concatenate([c.materialize() for c in self.clients], axis=0)


class LocalNoise:
    """The sum of ``K`` clients' independent noise draws, one stream per client.

    Stands in for a numpy ``Generator`` in the PCA kernels under ``trust="local"``: every
    ``standard_normal`` / ``normal`` draw is the sum of one draw from each client's stream,
    i.e. each client adds its own noise with the requested std to its part.
    """

    def __init__(self, streams: Sequence[Any]) -> None:
        self.streams = list(streams)

    def standard_normal(self, size: Any = None) -> Any:
        """Sum over clients of a standard normal draw each (variance ``K``)."""
        return sum(s.standard_normal(size) for s in self.streams)

    def normal(self, loc: float = 0.0, scale: float = 1.0, size: Any = None) -> Any:
        """``loc + scale * standard_normal(size)`` with the clients' summed noise."""
        return loc + scale * self.standard_normal(size)

    @property
    def noise_amplification(self) -> float:
        """``sqrt(K)``: the std of the summed noise over the std each client adds."""
        return float(np.sqrt(len(self.streams)))

    @property
    def secure(self) -> bool:
        """True when every client's stream is a secure one (releases are then snapped)."""
        from dpprecond.secure import is_secure

        return all(is_secure(s) for s in self.streams)

    def spawn(self, n_children: int) -> list[LocalNoise]:
        """Children that keep one independent stream per client."""
        per_client = [s.spawn(n_children) for s in self.streams]
        return [LocalNoise([children[j] for children in per_client])
                for j in range(int(n_children))]

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"LocalNoise has no {name!r}: only noise draws run federated "
                             "(the method needs another kind of randomness; see "
                             "dpprecond.pca.methods.FEDERATED_METHODS).")
