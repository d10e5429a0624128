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
``trust="secure-aggregation"`` (an assumption: the server sees only the sum)
    Every client adds a share ``N(0, std^2 / K)``, so a client's message alone is a
    Gaussian mechanism with multiplier ``z / sqrt(K)`` and does *not* meet the target:
    only the sum, which carries exactly the central noise, does, and the guarantee holds
    only if a secure aggregation protocol reveals nothing but the sum to the server (and
    the clients add their shares honestly). No such protocol runs in this library: the
    simulation adds the central noise to the sum of the clients' parts, which is the law of
    the sum of ``K`` independent shares (so a run equals the central computation for the
    same seed, up to the summation order). :func:`split_noise` forms shares that sum to a
    central draw, for a deployment that runs a real protocol.

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

__all__ = ["TRUST_MODELS", "FederatedRows", "LocalNoise", "TrustModel", "split_noise"]

#: Who adds the noise of federated PCA: every client its own share (``local``) or a
#: trusted aggregate (``secure-aggregation``).
TRUST_MODELS = ("local", "secure-aggregation")
#: A name of :data:`TRUST_MODELS` (for annotations; a test checks they agree).
TrustModel = Literal["local", "secure-aggregation"]


class FederatedRows:
    """The rows of ``A`` held by ``K`` clients (client ``i`` owns ``X[bounds[i]:bounds[i+1]]``).

    Every pass is the sum (or concatenation) of the clients' passes, each computed by the
    client's own :class:`~dpprecond.pca.rows.ClippedRows`. Centering uses the released (or
    public) mean broadcast to every client.
    """

    def __init__(self, clients: Sequence[ClippedRows], bounds: np.ndarray) -> None:
        self.clients = list(clients)
        self.bounds = np.asarray(bounds, dtype=np.int64)
        self.row_norm = self.clients[0].row_norm
        self.mean = self.clients[0].mean
        self._norms: np.ndarray | None = None

    @classmethod
    def from_data(cls, X: Any, bounds: Any, row_norm: float, *,
                  block_bytes: int = DEFAULT_BLOCK_BYTES) -> FederatedRows:
        """Split ``X`` at ``bounds`` (``0 = b_0 < b_1 < ... < b_K = n``) into clients."""
        bounds = np.asarray(bounds, dtype=np.int64)
        n = X.shape[0]
        if bounds.ndim != 1 or bounds.size < 2 or bounds[0] != 0 or bounds[-1] != n or \
                np.any(np.diff(bounds) <= 0):
            raise ValueError(f"Expected client bounds 0 = b_0 < b_1 < ... < b_K = n = {n} "
                             "(every client holds at least one row), got "
                             f"{bounds.tolist()[:6]}{'...' if bounds.size > 6 else ''}.")
        parts = [ClippedRows.from_data(X[lo:hi], row_norm, block_bytes=block_bytes)
                 for lo, hi in pairwise(bounds)]
        return cls(parts, bounds)

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
        slacks = [c.rounding_slack(n) for c in self.clients]
        return max(slacks) + 2.0 * self.n_clients * 2.0**-53 * n

    def column_sum(self) -> np.ndarray:
        """``sum_i u_i`` over every client's step-1 rows."""
        return np.sum([c.column_sum() for c in self.clients], axis=0)

    def centered(self, mean: np.ndarray) -> FederatedRows:
        """Every client's rows centered at the broadcast ``mean`` and re-clipped."""
        return FederatedRows([c.centered(mean) for c in self.clients], self.bounds)

    def gram(self) -> np.ndarray:
        """``A^T A`` as the sum of the clients' Gram matrices."""
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
                  row_scaled: bool = False, row_sq: bool = False) -> np.ndarray:
        """The sum over clients of each client's :meth:`ClippedRows.block_sum`."""
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


def split_noise(central: np.ndarray, std: float, n_clients: int,
                rng: np.random.Generator) -> np.ndarray:
    """``K`` secure-aggregation shares of a central noise draw, summing to it exactly.

    With ``central ~ N(0, s^2)`` (entrywise) and ``E_i ~ N(0, s^2 / K)`` independent,
    ``W_i = central / K + E_i - mean_j E_j`` (``s = std``) are independent ``N(0, s^2 / K)``: the
    variance is ``s^2/K^2 + (s^2/K)(1 - 1/K) = s^2/K`` and the covariance of ``W_i, W_j``
    is ``s^2/K^2 - s^2/K^2 = 0`` for ``i != j`` (jointly Gaussian, hence independent). So
    the shares have the distribution of each client drawing its own noise, and their sum is
    the central draw. Returns an array of shape ``(K, *central.shape)``.
    """
    shape = (n_clients, *np.shape(central))
    E = rng.standard_normal(shape) * (std / np.sqrt(n_clients))
    return central / n_clients + E - E.mean(axis=0)
