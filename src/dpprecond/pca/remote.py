"""Federated private PCA over a network: deferred sums, each client's noisy part.

In-process federated PCA (:mod:`dpprecond.pca.federated`, ``trust="local"``) computes
every client's part with the client's own :class:`~dpprecond.pca.rows.ClippedRows` and
stands in for the clients' noise with :class:`~dpprecond.pca.federated.LocalNoise` (the
sum of one draw per client stream). This module runs the same fit when the clients are
far away (the transport is a parameter; :mod:`dpprecond.adapters.flower.pca` is the Flower
one), with the noise added on each client's machine:

- :class:`RemoteFederation` is what :func:`~dpprecond.pca.fit_private_pca` receives
  instead of ``X``; its :class:`RemoteRows` implements the passes the fits use on
  :class:`~dpprecond.pca.federated.FederatedRows` (``gram``, ``column_sum``,
  ``block_sum``, ``centered``, ``shape``, ``rounding_slack``), each returning a
  :class:`DeferredSum`: a description of a sum over the clients (the pass, its public
  arguments and the linear maps with public arrays the kernel applies to it: ``@``,
  ``.T``, ``+``, scalars), which nobody evaluates at the server;
- :class:`RemoteNoise` is the noise source of the three streams of the fit (mean, init,
  main). :func:`dpprecond.noise.gaussian` and :func:`~dpprecond.noise.symmetric_gaussian`
  return its :class:`DeferredNoise` handles (a draw each client makes from its own stream,
  with the same function and layout), so coupled draws
  (:func:`~dpprecond.noise.coupled_symmetric_gaussian`) work unchanged; and
  :func:`dpprecond.noise.release` hands it the value and the noise: one message round, in
  which every client evaluates the value on its rows with the library's own passes
  (:func:`client_answer`), adds its own evaluation of the noise, and replies; the server
  adds the replies in client order. A public draw (``standard_normal`` called directly, the
  power method's random start) is one round too: the sum of the clients' draws, as
  :class:`~dpprecond.pca.federated.LocalNoise` forms it.

Privacy unit: one row (one record of one client), replace-one adjacency, rows clipped to
norm 1 after division by the public ``row_norm``, exactly as central and in-process
federated PCA: each row enters one client's part, so every release has its central
sensitivity and each client's message is by itself the Gaussian mechanism with the fit's
noise multiplier on its records (``trust="local"``: no trusted party; the server and the
network see only noisy parts). The accounting is the fit's own (the same plan, events
and epsilon as in process). What leaves a client: its client id, its number of rows
``n_i`` (public under replace-one), its rounding bound (a function of ``n``, ``d`` and
its block size), noisy parts, and its raw draws for public randomness (never usable as
noise; without a seed drawn from a generator of their own).

The client checks what it is asked (:func:`client_answer`): the value must be one of the
library's passes (a fixed list of block functions) under linear maps with public arrays,
from which it bounds the sensitivity itself (leaf sensitivity times the maps' norms); the
noise must have positive variance, be uncorrelated with the noise of each of its earlier
releases of the fit (a server cannot cancel noise by combining draws), use no public draw,
and, with ``min_noise_multiplier`` ``Z``, keep the fit a Gaussian mechanism of multiplier
at least ``Z``: the precisions ``(bound / std)^2`` of its releases so far sum to at most
``1 / Z^2`` (each release alone is then at least ``Z`` times its bound; a new fit id
starts afresh: the client keeps no budget across fits). A release whose noise holds a
symmetric draw is the upper triangle of the noisy part, mirrored (the only entries whose
noise is i.i.d.). Every node has its declared shape (nothing is broadcast), every public
number is finite and within :data:`PUBLIC_LIMIT`, and a block function gets exactly its
listed arguments (:data:`BLOCK_ARGS`) and only the flags it takes (:data:`BLOCK_ROW_SQ`:
whether a pass runs never depends on the rows). A pass cannot drop a client: the transport must
return every client's part or raise (:class:`ClientMissingError`, also raised for a part
of the wrong shape or not finite); :func:`~dpprecond.pca.fit_private_pca` then stops with
a :class:`ClientMissingError` stating the privacy spent (nothing before the first release
was asked for; otherwise at most the fit's planned event, charged to its ``ledger``),
whatever the transport. A client keeps every noise draw of the fit in its state until the
fit ends (a later release may combine them, as ``auto``'s coupled pair does).

Under ``trust="secure-aggregation"`` (a federation with a ``secure_transport``) every
release is instead one secure sum of the clients' encoded messages
(:mod:`dpprecond.pca.remote_secure`); the rows, the rounding bounds and the checks of the
deferred expressions are this module's.

Seeds: with ``noise_seed`` client ``i`` draws stream ``j`` (0 mean, 1 init, 2 main) from
``keyed_stream(noise_seed, j, i)``, which is the stream
``fit_private_pca(X, ..., seed=noise_seed, clients=bounds)`` gives its client ``i``
(``default_rng(seed).spawn(3)[j].spawn(K)[i]``), and keeps its state between messages;
without, every request draws fresh OS entropy (``secure``: :mod:`dpprecond.secure`'s
generator, and every release snapped).
"""

from __future__ import annotations

import json
import math
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import reduce
from typing import Any

import numpy as np

from dpprecond._validation import check_int
from dpprecond.noise import gaussian, keyed_stream, release, symmetric_gaussian
from dpprecond.pca.federated import combined_rounding_slack
from dpprecond.pca.rows import DEFAULT_BLOCK_BYTES, ClippedRows

__all__ = [
    "REMOTE_METHODS",
    "STREAMS",
    "ClientMissingError",
    "DeferredNoise",
    "DeferredSum",
    "RemoteFederation",
    "RemoteNoise",
    "RemoteRows",
    "Transport",
    "client_answer",
]

#: The methods that run over a network: every release a sum over rows, every random
#: choice a noise draw (``fixed``'s trials and ``select`` do not; ``exact`` is not private).
REMOTE_METHODS = ("auto", "analyze_gauss", "power")
#: The fit's noise streams, in :func:`~dpprecond.pca.fit_private_pca`'s spawn order.
STREAMS = ("mean", "init", "main")
SQRT2 = math.sqrt(2.0)
#: Relative tolerance of the client's independence check (a covariance of two releases'
#: noise that is zero in exact arithmetic, as the coupled pair's, is ~1e-16 as computed).
COV_TOL = 1e-9
#: The largest norm a client lets a part (or any node of its value) reach: ``n_i`` times
#: the node's sensitivity bound must stay below it (far from float64's 1.8e308).
PART_LIMIT = 1e300
#: The largest magnitude (and, for a divisor or a scale, the inverse of the smallest) of a
#: public number a client accepts in a request: far beyond any fit's (orthonormal
#: iterates, preconditioners, means, radii, 1/n), and small enough that no pass over rows
#: of norm <= 1 overflows, so whether a part is finite never depends on the data.
PUBLIC_LIMIT = 1e100


class ClientMissingError(RuntimeError):
    """A client did not answer a pass: a PCA release is a sum over every client's rows.

    Attributes: ``clients`` (the missing client ids), ``reasons`` (client id -> why),
    ``kind`` (the pass), ``releases_made`` (the releases every client had answered before).
    """

    def __init__(self, message: str, *, clients: Sequence[int], reasons: dict[int, str],
                 kind: str = "", releases_made: int = 0) -> None:
        super().__init__(message)
        self.clients = list(clients)
        self.reasons = dict(reasons)
        self.kind = kind
        self.releases_made = releases_made


#: ``transport(request, arrays) -> one array per client, in client order`` (raises
#: :class:`ClientMissingError` when a client does not answer).
Transport = Callable[[dict[str, Any], list[np.ndarray]], list[np.ndarray]]


# ---------------------------------------------------------------------------------------
# Deferred expressions
# ---------------------------------------------------------------------------------------


def _is_zero(x: Any) -> bool:
    """Zero noise from a zero std (:func:`dpprecond.noise.gaussian` draws nothing then)."""
    return not isinstance(x, _Expr) and not np.any(np.asarray(x))


def _scalar(c: Any) -> float:
    if isinstance(c, _Expr) or np.ndim(c) != 0:
        raise TypeError("A deferred sum over clients is scaled by public scalars only.")
    return float(c)


class _Expr:
    """A node of a deferred linear expression (``op`` on ``args``, of shape ``shape``)."""

    __array_ufunc__ = None  # numpy defers to the reflected operators below

    def __init__(self, op: str, args: tuple[Any, ...], shape: tuple[int, ...]) -> None:
        self.op, self.args, self.shape = op, args, tuple(int(s) for s in shape)

    @property
    def ndim(self) -> int:
        """Number of dimensions of the value."""
        return len(self.shape)

    def _same(self, other: Any) -> _Expr:
        if type(other) is not type(self) or other.shape != self.shape:
            raise TypeError(f"Cannot combine a {type(self).__name__} of shape {self.shape} "
                            f"with {type(other).__name__} "
                            f"{getattr(other, 'shape', '')}.")
        return other

    def __add__(self, other: Any) -> _Expr:
        if _is_zero(other):
            return self
        return type(self)("add", (self, self._same(other)), self.shape)

    def __radd__(self, other: Any) -> _Expr:
        if _is_zero(other):
            return self
        return type(self)("add", (self._same(other), self), self.shape)

    def __sub__(self, other: Any) -> _Expr:
        if _is_zero(other):
            return self
        return type(self)("sub", (self, self._same(other)), self.shape)

    def __neg__(self) -> _Expr:
        return type(self)("neg", (self,), self.shape)

    def __mul__(self, c: Any) -> _Expr:
        return type(self)("mul", (self, _scalar(c)), self.shape)

    def __rmul__(self, c: Any) -> _Expr:
        return type(self)("rmul", (_scalar(c), self), self.shape)

    def __truediv__(self, c: Any) -> _Expr:
        return type(self)("div", (self, _scalar(c)), self.shape)

    def __array__(self, *args: Any, **kwargs: Any) -> np.ndarray:
        raise TypeError(f"A {type(self).__name__} is computed by the clients; it has no value "
                        "at the server (only dpprecond.noise.release gives one, noised).")


class DeferredSum(_Expr):
    """A sum over the clients of a pass over their rows, under public linear maps.

    Leaves (``op="pass"``): ``(kind, args, mean, row_scaled, row_sq)``, ``kind`` one of
    ``"gram"``, ``"column_sum"`` or a block function of :data:`BLOCK_FUNCTIONS`.
    """

    def __matmul__(self, other: Any) -> DeferredSum:
        A = np.asarray(other, dtype=np.float64)
        shape = (self.shape[0],) if A.ndim == 1 else (self.shape[0], A.shape[1])
        return DeferredSum("matmul", (self, A), shape)

    def __rmatmul__(self, other: Any) -> DeferredSum:
        A = np.asarray(other, dtype=np.float64)
        shape = (A.shape[0],) if self.ndim == 1 else (A.shape[0], self.shape[1])
        return DeferredSum("rmatmul", (A, self), shape)

    @property
    def T(self) -> DeferredSum:
        """The transposed sum."""
        return DeferredSum("T", (self,), self.shape[::-1])


class DeferredNoise(_Expr):
    """Noise the clients draw: a linear combination of draws (leaf ``op="draw"``, id)."""


def _block_functions() -> dict[str, tuple[Any, Callable[[tuple[Any, ...]], float]]]:
    """The block functions a client evaluates, with the l2 sensitivity of their row sum."""
    from dpprecond.pca import auto

    return {
        "probe": (auto._block_probe, lambda args: 2.0),  # one indicator, one energy
        "rescaled_gram": (auto._block_rescaled_gram, lambda args: SQRT2),
        "clipped_step": (auto._block_clipped_step, lambda args: 2.0 * float(args[1])),
    }


#: The block functions that also take the rows' squared norms (``row_sq=True``; all
#: three take ``row_scaled``): a request's flag is checked against it, so that whether a
#: pass runs never depends on the rows.
BLOCK_ROW_SQ = frozenset({"probe"})

#: The public arguments of each block function, in order: ``"matrix"`` (2-D array),
#: ``"vector"`` (1-D array), ``"positive"`` (a scalar in ``[1/PUBLIC_LIMIT,
#: PUBLIC_LIMIT]``). Exactly these: an extra positional argument would be the block
#: function's ``scale`` (the rows' factors), which only the client's own pass may set.
BLOCK_ARGS: dict[str, tuple[str, ...]] = {
    "probe": ("matrix", "matrix", "positive", "vector"),  # X, B, unit, edges
    "rescaled_gram": ("positive",),  # tau
    "clipped_step": ("matrix", "positive"),  # X @ B, radius
}


def _block_name(func: Any) -> str:
    for name, (f, _) in _block_functions().items():
        if f is func:
            return name
    raise TypeError(f"The pass {getattr(func, '__qualname__', func)!r} does not run over a "
                    f"network; the clients evaluate only {sorted(_block_functions())} (the "
                    f"passes of {list(REMOTE_METHODS)}).")


def _encode(expr: _Expr, arrays: list[np.ndarray]) -> Any:
    """A JSON-able tree of ``expr``; arrays go to ``arrays`` (referenced by index)."""

    def value(v: Any) -> Any:
        if isinstance(v, _Expr):
            return _encode(v, arrays)
        if isinstance(v, np.ndarray):
            arrays.append(np.ascontiguousarray(v, dtype=np.float64))
            return {"array": len(arrays) - 1}
        if v is None or isinstance(v, (bool, str)):
            return v
        if isinstance(v, (int, np.integer)):
            return int(v)
        if isinstance(v, (float, np.floating)):
            return float(v)
        raise TypeError(f"Cannot send a {type(v).__name__} to the clients.")

    if expr.op == "pass":
        kind, args, mean, row_scaled, row_sq = expr.args
        return {"op": "pass", "shape": list(expr.shape), "kind": kind,
                "args": [value(a) for a in args], "mean": value(mean),
                "row_scaled": bool(row_scaled), "row_sq": bool(row_sq)}
    if expr.op == "draw":
        return {"op": "draw", "shape": list(expr.shape), "id": int(expr.args[0])}
    return {"op": expr.op, "shape": list(expr.shape), "args": [value(a) for a in expr.args]}


# ---------------------------------------------------------------------------------------
# The server side: the federation, its rows and its noise streams
# ---------------------------------------------------------------------------------------


@dataclass
class _Session:
    """One fit's bookkeeping shared by its rows and its streams."""

    transport: Transport
    fit_id: str
    row_norm: float = 1.0
    secure: bool = False
    d: int = 0  # the number of features every client's rows must have
    n_clients: int = 0
    next_draw: int = 0
    pending: list[dict[str, Any]] = field(default_factory=list)
    releases: int = 0  # answered by every client
    asked: int = 0  # sent (some clients may have answered)
    #: ``spent(asked, answered) -> sentence``: the privacy spent when the fit stops after
    #: ``asked`` releases were sent (it charges the fit's ledger); set by the fit
    spent: Callable[[int, int], str] | None = None
    #: secure aggregation: ``secure_transport(request, arrays, plan) -> (sum modulo the
    #: plan's modulus, number of shares)`` (:mod:`dpprecond.pca.remote_secure`)
    secure_transport: Any = None

    def _stopped(self, exc: ClientMissingError) -> ClientMissingError:
        """The error that stops the fit: ``exc``, the reason, and the privacy spent."""
        spent = ("Nothing was released (no release had been asked for)." if self.asked == 0
                 else self.spent(self.asked, self.releases) if self.spent is not None else
                 f"{self.asked} release(s) were asked for and may have reached the server "
                 f"({self.releases} answered by every client).")
        return ClientMissingError(
            f"{exc} A PCA pass is a sum over every client's rows and cannot drop a client, "
            f"so the fit stopped. {spent}", clients=exc.clients, reasons=exc.reasons,
            kind=exc.kind, releases_made=self.releases)

    def request(self, kind: str, **fields: Any) -> dict[str, Any]:
        """A request of this fit: its kind, the fit's public settings, ``fields``."""
        return {"kind": kind, "fit": self.fit_id, "row_norm": self.row_norm,
                "secure": self.secure, "d": self.d, "pending": list(self.pending), **fields}

    def secure_call(self, arrays: list[np.ndarray], sum_plan: Any,
                    **fields: Any) -> tuple[np.ndarray, int]:
        """One secure sum (``kind="secure-release"``): ``(the sum modulo 2^bits, shares)``."""
        self.asked += 1
        request = self.request("secure-release", **fields)
        try:
            total, n_shares = self.secure_transport(request, list(arrays), sum_plan)
        except ClientMissingError as exc:
            raise self._stopped(exc) from exc
        total = np.asarray(total)
        if total.shape != (sum_plan.dim,) or total.dtype.kind not in "iu" or (total < 0).any() \
                or (total >= sum_plan.modulus).any():
            raise self._stopped(ClientMissingError(
                f"Federated PCA secure sum: the transport returned {total.shape} values of "
                f"dtype {total.dtype}, expected {sum_plan.dim} integers in [0, 2^{sum_plan.bits}).",
                clients=[], reasons={}, kind="secure-release"))
        return total.astype(np.int64), int(n_shares)

    def call(self, kind: str, shape: tuple[int, ...], arrays: list[np.ndarray] | None = None,
             **fields: Any) -> list[np.ndarray]:
        """One round: the pending draws, then ``kind``; every client's array of ``shape``
        (finite), in client order."""
        request = self.request(kind, **fields)
        if kind == "release":
            self.asked += 1
        try:
            parts = [np.asarray(p, dtype=np.float64)
                     for p in self.transport(request, list(arrays or []))]
        except ClientMissingError as exc:
            raise self._stopped(exc) from exc
        bad = {i: f"a part of shape {p.shape} (finite: {bool(np.isfinite(p).all())}), "
                  f"expected finite values of shape {tuple(shape)}"
               for i, p in enumerate(parts) if p.shape != tuple(shape)
               or not np.isfinite(p).all()}
        if len(parts) != self.n_clients:
            bad.update({i: "no part" for i in range(len(parts), self.n_clients)})
        if bad:
            raise self._stopped(ClientMissingError(
                f"Federated PCA request {kind!r}: client(s) {sorted(bad)} sent "
                + "; ".join(f"client {i}: {why}" for i, why in bad.items()) + ".",
                clients=sorted(bad), reasons=bad, kind=kind))
        self.pending.clear()  # every client has made them
        return parts


class RemoteNoise:
    """One of the fit's noise streams (:data:`STREAMS`), drawn on every client.

    Stands in for :class:`~dpprecond.pca.federated.LocalNoise`: the same draws, made by
    each client from its own stream; only sums of noisy parts come back.
    """

    def __init__(self, session: _Session, stream: int, n_clients: int) -> None:
        self._session, self.stream, self.n_clients = session, int(stream), int(n_clients)

    @property
    def noise_amplification(self) -> float:
        """``sqrt(K)``: the std of the summed noise over the std each client adds."""
        return float(np.sqrt(self.n_clients))

    @property
    def secure(self) -> bool:
        """Secure mode: the clients draw from the OS CSPRNG and snap their releases."""
        return self._session.secure

    def draw(self, kind: str, shape: tuple[int, ...], std: float, *,
             draws: str = "square") -> DeferredNoise:
        """A draw every client makes next from this stream (``gaussian``/``symmetric``)."""
        s = self._session
        spec = {"id": s.next_draw, "stream": self.stream, "kind": kind,
                "shape": [int(v) for v in shape], "std": float(std), "draws": draws}
        s.next_draw += 1
        s.pending.append(spec)
        return DeferredNoise("draw", (spec["id"],), tuple(shape))

    def standard_normal(self, size: Any = None) -> Any:
        """Public randomness: the sum over clients of one standard normal draw each."""
        shape = None if size is None else [int(v) for v in np.atleast_1d(size)]
        spec = self.draw("public", () if shape is None else tuple(shape), 1.0)
        parts = self._session.call("public", spec.shape, id=spec.args[0])
        draws = [float(p) if shape is None else p for p in parts]
        return sum(draws)  # as LocalNoise: 0 + client 0 + client 1 + ...

    def deferred_release(self, value: Any, std: float, *, symmetric: bool = False,
                         noise: Any = None, sensitivity: float | None = None) -> Any:
        """``value + noise`` as the sum over clients of each client's noisy part."""
        if not isinstance(value, DeferredSum):
            raise TypeError(f"Over a network a release is a pass over the clients' rows; got "
                            f"a {type(value).__name__} (the server holds no private value).")
        if not std > 0:
            raise ValueError(f"Expected a release with noise (std > 0) over a network, got "
                             f"std={std!r}: a client never sends an exact part.")
        if noise is None:
            noise = (symmetric_gaussian(value.shape[0], std, self) if symmetric
                     else gaussian(value.shape, std, self))
        if not isinstance(noise, DeferredNoise) or noise.shape != value.shape:
            raise TypeError("The noise of a release over a network must be drawn by the clients "
                            "(from this source), of the value's shape.")
        arrays: list[np.ndarray] = []
        s = self._session
        parts = s.call("release", value.shape, arrays, value=_encode(value, arrays),
                       noise=_encode(noise, arrays), std=float(std),
                       sensitivity=None if sensitivity is None else float(sensitivity))
        s.releases += 1
        out = reduce(operator.add, parts)  # client order
        return float(out) if value.shape == () else out

    def normal(self, *args: Any, **kwargs: Any) -> Any:
        raise AttributeError("RemoteNoise has no normal(): the PCA kernels draw with "
                             "dpprecond.noise.gaussian.")

    def spawn(self, n_children: int) -> Any:
        raise TypeError(f"A method that spawns streams (trials) does not run over a network; "
                        f"use one of {list(REMOTE_METHODS)}.")


class RemoteRows:
    """The clients' rows as the fits see them: every pass a :class:`DeferredSum`."""

    def __init__(self, session: _Session, n_rows: Sequence[int], d: int,
                 slacks: Sequence[float], mean: np.ndarray | None = None) -> None:
        self._session = session
        self.client_rows = [int(v) for v in n_rows]
        self.d = int(d)
        self._slacks = [float(v) for v in slacks]
        self.mean = mean

    @property
    def n_clients(self) -> int:
        """Number of clients K."""
        return len(self.client_rows)

    @property
    def shape(self) -> tuple[int, int]:
        """``(n, d)`` of the whole ``A`` (``n_i`` are public under replace-one)."""
        return sum(self.client_rows), self.d

    def rounding_slack(self) -> float:
        """As :meth:`FederatedRows.rounding_slack`, from the bounds the clients reported."""
        return combined_rounding_slack(self._slacks, self.shape[0])

    def _pass(self, kind: str, args: tuple[Any, ...], shape: tuple[int, ...],
              row_scaled: bool = False, row_sq: bool = False) -> DeferredSum:
        return DeferredSum("pass", (kind, args, self.mean, row_scaled, row_sq), shape)

    def gram(self) -> DeferredSum:
        """``A^T A``: the sum of the clients' Gram matrices."""
        return self._pass("gram", (), (self.d, self.d))

    def column_sum(self) -> DeferredSum:
        """``sum_i u_i`` over the clients' step-1 rows."""
        return self._pass("column_sum", (), (self.d,))

    def block_sum(self, func: Any, *args: Any, shape: tuple[int, ...],
                  row_scaled: bool = False, row_sq: bool = False) -> DeferredSum:
        """The sum over clients of :meth:`ClippedRows.block_sum` (a listed block function)."""
        return self._pass(_block_name(func), args, tuple(shape), row_scaled, row_sq)

    def centered(self, mean: np.ndarray) -> RemoteRows:
        """Every client's rows centered at the broadcast ``mean`` (sent with each pass)."""
        return RemoteRows(self._session, self.client_rows, self.d, self._slacks,
                          np.asarray(mean, dtype=np.float64))

    def _private(self, name: str) -> Any:
        raise TypeError(f"{name} is a function of the clients' private rows; a fit over a "
                        "network offers no diagnostics (diagnostics=False).")

    @property
    def n_clipped(self) -> int:
        """Not available: a private diagnostic."""
        return self._private("n_clipped")

    @property
    def n_clipped_centered(self) -> int:
        """Not available: a private diagnostic."""
        return self._private("n_clipped_centered")


class RemoteFederation:
    """The clients of a fit over a network: what :func:`fit_private_pca` takes as ``X``.

    Parameters
    ----------
    transport : callable
        ``transport(request, arrays) -> [array of client 0, ..., client K-1]``.
    n_rows : sequence of int
        Every client's number of rows, in client order (public: replace-one).
    n_features : int
        ``d``, the same on every client.
    fit_id : str
        Names the fit in every request (a client starts its streams afresh for a new one).
    secure_transport : callable, optional
        ``secure_transport(request, arrays, plan) -> (sum modulo 2^bits, shares)``: one
        secure sum of the clients' messages
        (:func:`~dpprecond.pca.remote_secure.client_secure_message`); needed for
        ``trust="secure-aggregation"`` (the fit's streams are then
        :func:`~dpprecond.pca.remote_secure.secure_noise_sources`). Its optional attribute
        ``fit_bits`` is the largest modulus ``2^fit_bits`` it carries (Flower's SecAgg+:
        30); the fit then caps every sum to it (:mod:`dpprecond.pca.secure_plan`).
    """

    def __init__(self, transport: Transport, n_rows: Sequence[int], n_features: int, *,
                 fit_id: str, secure_transport: Any = None) -> None:
        if len(n_rows) < 1 or min(n_rows) < 1:
            raise ValueError(f"Expected every client to hold at least one row, got n_rows="
                             f"{list(n_rows)}.")
        self._session = _Session(transport, str(fit_id), n_clients=len(n_rows),
                                 secure_transport=secure_transport)
        self.n_rows = [int(v) for v in n_rows]
        self.n_features = int(n_features)

    @property
    def shape(self) -> tuple[int, int]:
        """``(n, d)`` over every client."""
        return sum(self.n_rows), self.n_features

    @property
    def n_clients(self) -> int:
        """Number of clients K."""
        return len(self.n_rows)

    @property
    def releases(self) -> int:
        """Releases every client has answered so far."""
        return self._session.releases

    @property
    def releases_asked(self) -> int:
        """Releases asked for so far (a failed pass included: some clients may have sent
        their noisy part)."""
        return self._session.asked

    def remote_rows(self, row_norm: float, *, secure: bool = False,
                    spent: Callable[[int, int], str] | None = None) -> RemoteRows:
        """The rows (one round: every client's rounding bound for ``n`` terms).

        ``spent(asked, answered)``: called once if a client goes missing after
        ``asked >= 1`` releases were sent (``answered`` by every client); it charges the
        fit's ledger and returns the sentence stating the privacy spent, which ends the
        :class:`ClientMissingError`'s message.
        """
        s = self._session
        s.row_norm, s.secure, s.d = float(row_norm), bool(secure), self.n_features
        s.spent = spent
        slacks = [float(p) for p in s.call("slack", (), n=self.shape[0])]
        return RemoteRows(s, self.n_rows, self.n_features, slacks)

    def noise_sources(self) -> tuple[RemoteNoise, RemoteNoise, RemoteNoise]:
        """The fit's mean, init and main streams (:data:`STREAMS`)."""
        return tuple(RemoteNoise(self._session, j, self.n_clients)  # type: ignore[return-value]
                     for j in range(len(STREAMS)))

    @property
    def secure_aggregation(self) -> bool:
        """True when the federation sums securely (it has a ``secure_transport``)."""
        return self._session.secure_transport is not None

    @property
    def secure_fit_bits(self) -> int | None:
        """The largest modulus ``2^bits`` the secure transport carries (its ``fit_bits``
        attribute; ``None``: up to ``2^62``): a fit caps its sums to it
        (:mod:`dpprecond.pca.secure_plan`)."""
        bits = getattr(self._session.secure_transport, "fit_bits", None)
        return None if bits is None else check_int("secure_transport.fit_bits", bits, low=2,
                                                   high=62)

    @property
    def session(self) -> _Session:
        """The fit's bookkeeping (its transports, counters and pending draws)."""
        return self._session


# ---------------------------------------------------------------------------------------
# The client side
# ---------------------------------------------------------------------------------------


@dataclass
class ClientState:
    """What a client keeps between the messages of one fit (JSON-able, plus the draws)."""

    fit: str = ""
    streams: dict[str, Any] = field(default_factory=dict)  # seeded: bit generator states
    draw_std: dict[str, float] = field(default_factory=dict)  # id -> std (public: 0)
    released: list[dict[str, float]] = field(default_factory=list)  # noise coefficients
    draws: dict[str, np.ndarray] = field(default_factory=dict)
    symmetric: list[str] = field(default_factory=list)  # ids of the symmetric draws
    #: sum over the fit's releases of ``(sensitivity bound / noise std)^2``: the fit so far
    #: is one Gaussian mechanism with noise multiplier ``precision ** -0.5``
    precision: float = 0.0

    def meta(self) -> str:
        """The JSON part."""
        return json.dumps({"fit": self.fit, "streams": self.streams,
                           "draw_std": self.draw_std, "released": self.released,
                           "symmetric": self.symmetric, "precision": self.precision})

    @classmethod
    def load(cls, meta: str | None, draws: dict[str, np.ndarray]) -> ClientState:
        """Rebuild from :meth:`meta` and the stored draws."""
        if not meta:
            return cls()
        m = json.loads(meta)
        return cls(m["fit"], m["streams"], m["draw_std"], m["released"], dict(draws),
                   list(m.get("symmetric", [])), float(m.get("precision", 0.0)))


def _stream(state: ClientState, j: int, client_id: int, seed: int | None,
            secure: bool) -> Any:
    if seed is None:
        if secure:
            from dpprecond.secure import SecureGenerator

            return SecureGenerator()
        return np.random.default_rng()  # fresh OS entropy for this request
    gen = keyed_stream(seed, j, client_id)
    if str(j) in state.streams:
        gen.bit_generator.state = state.streams[str(j)]
    return gen


def _release_source(secure: bool) -> Any:
    """The source :func:`dpprecond.noise.release` sees for a client's release (its noise is
    already drawn): secure mode's generator (the release is snapped) or a plain one."""
    if secure:
        from dpprecond.secure import SecureGenerator

        return SecureGenerator()
    return np.random.default_rng(0)  # never drawn from: the noise is given


def _draw(spec: dict[str, Any], gen: Any) -> np.ndarray:
    kind, shape, std = spec["kind"], tuple(spec["shape"]), float(spec["std"])
    if kind == "public":
        return np.asarray(gen.standard_normal(None if shape == () else shape))
    if kind == "gaussian":
        return np.asarray(gaussian(shape, std, gen))
    if kind == "symmetric":
        if len(shape) != 2 or shape[0] != shape[1]:
            raise ValueError(f"A symmetric draw needs a square shape, got {shape}.")
        return symmetric_gaussian(shape[0], std, gen, draws=spec["draws"])
    raise ValueError(f"Unknown draw kind {kind!r}.")


def _array(node: Any, arrays: Sequence[np.ndarray]) -> Any:
    if isinstance(node, dict) and "array" in node:
        A = np.asarray(arrays[int(node["array"])], dtype=np.float64)
        if A.ndim > 2:
            raise ValueError(f"Refusing a public array of {A.ndim} dimensions (at most 2).")
        if not np.all(np.isfinite(A)) or (A.size and float(np.max(np.abs(A))) > PUBLIC_LIMIT):
            raise ValueError(f"Refusing a public array that is not finite or has entries "
                             f"beyond {PUBLIC_LIMIT:g} in magnitude (a pass on it could "
                             "overflow depending on the rows).")
        return A
    return node


def _public_scalar(x: Any, what: str, *, positive: bool = False) -> float:
    """A public number of a request: finite, ``|x| <= PUBLIC_LIMIT`` (and, ``positive``,
    ``x >= 1/PUBLIC_LIMIT``)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise ValueError(f"Refusing {what}={x!r}: expected a number.")
    x = float(x)
    low = 1.0 / PUBLIC_LIMIT if positive else -PUBLIC_LIMIT
    if not (math.isfinite(x) and low <= x <= PUBLIC_LIMIT):
        raise ValueError(f"Refusing {what}={x!r}: expected a finite number in "
                         f"[{low:g}, {PUBLIC_LIMIT:g}].")
    return x


def _block_args(kind: str, raw: Sequence[Any], arrays: Sequence[np.ndarray],
                d: int) -> tuple[Any, ...]:
    """The checked public arguments of block function ``kind`` (:data:`BLOCK_ARGS`)."""
    expected = BLOCK_ARGS[kind]
    if len(raw) != len(expected):
        raise ValueError(f"Refusing pass {kind!r} with {len(raw)} arguments; it takes "
                         f"exactly {len(expected)} ({', '.join(expected)}).")
    out: list[Any] = []
    for i, (a, want) in enumerate(zip(raw, expected, strict=True)):
        if want == "positive":
            out.append(_public_scalar(a, f"{kind} argument {i}", positive=True))
            continue
        A = _array(a, arrays)
        if not isinstance(A, np.ndarray) or A.ndim != (2 if want == "matrix" else 1):
            raise ValueError(f"Refusing pass {kind!r}: argument {i} must be a {want}.")
        if i == 0 and want == "matrix" and A.shape[0] != d:
            raise ValueError(f"Refusing pass {kind!r}: argument 0 has {A.shape[0]} rows, "
                             f"this client's rows have {d} columns.")
        out.append(A)
    return tuple(out)


def _block_shape(kind: str, args: tuple[Any, ...], d: int) -> tuple[int, ...]:
    """The shape of one block's term of block function ``kind`` on ``args``."""
    if kind == "probe":  # counts and energies per bin of the edges
        return (2 * (args[3].size + 1),)
    if kind == "rescaled_gram":
        return (d, d)
    return (d, int(args[0].shape[1]))  # clipped_step: a_i c_i^T with c_i = clip(XB^T a_i)


def _check_shape(node: dict[str, Any], v: Any, what: str) -> Any:
    """``v`` if it has the node's declared shape (nothing is ever broadcast)."""
    if np.shape(v) != tuple(node["shape"]):
        raise ValueError(f"Refusing a request whose {what} {node['op']!r} has shape "
                         f"{np.shape(v)}, declared {tuple(node['shape'])}: a sum of terms "
                         "of different shapes would broadcast one of them, which its "
                         "sensitivity bound does not cover.")
    return v


def _same_shape(a: Any, b: Any, what: str) -> None:
    if np.shape(a) != np.shape(b):
        raise ValueError(f"Refusing a {what} of terms of shapes {np.shape(a)} and "
                         f"{np.shape(b)} (it would broadcast; the bound covers no "
                         "broadcast).")


def _map(node: Any, arrays: Sequence[np.ndarray]) -> np.ndarray:
    A = _array(node, arrays)
    if not isinstance(A, np.ndarray):
        raise ValueError("Refusing a product with something other than a public array.")
    return A


def _evaluate_value(node: dict[str, Any], arrays: Sequence[np.ndarray],
                    rows_of: Callable[[Any], ClippedRows],
                    memo: dict[str, tuple[np.ndarray, float]]) -> tuple[np.ndarray, float]:
    """``(this client's part, an upper bound on its l2 sensitivity)``; every node's value
    has its declared shape."""
    v, s = _value_node(node, arrays, rows_of, memo)
    # Every node's value is a sum of n_i row terms each within its bound s (the leaves'
    # terms are, and the maps act on each term), so n_i * s bounds its norm: within
    # PART_LIMIT nothing overflows, and the refusal depends on public numbers only.
    n_i = rows_of(None).shape[0]
    if not (math.isfinite(s) and s * max(n_i, 1) <= PART_LIMIT):
        raise ValueError(f"Refusing a request whose {node['op']!r} node has the sensitivity "
                         f"bound {s:.6g}: over this client's {n_i} rows its value could reach "
                         f"{s * n_i:.3g}, beyond {PART_LIMIT:g} (it could overflow, depending "
                         "on the rows).")
    return _check_shape(node, v, "value"), s


def _value_node(node: dict[str, Any], arrays: Sequence[np.ndarray],
                rows_of: Callable[[Any], ClippedRows],
                memo: dict[str, tuple[np.ndarray, float]]) -> tuple[np.ndarray, float]:
    op = node["op"]
    if op == "pass":
        key = json.dumps(node, sort_keys=True)
        if key not in memo:
            mean = _array(node["mean"], arrays)
            d = rows_of(None).shape[1]
            if mean is not None and (not isinstance(mean, np.ndarray) or mean.shape != (d,)):
                raise ValueError(f"Refusing a mean of shape {np.shape(mean)}; expected ({d},).")
            rows = rows_of(mean)
            kind, shape = node["kind"], tuple(node["shape"])
            if kind == "gram":
                memo[key] = (rows.gram(), SQRT2)
            elif kind == "column_sum":
                memo[key] = (np.asarray(rows.column_sum()), 2.0)
            else:
                funcs = _block_functions()
                if kind not in funcs:
                    raise ValueError(f"Refusing an unknown pass {kind!r}: this client evaluates "
                                     f"only gram, column_sum and {sorted(funcs)}.")
                func, sens = funcs[kind]
                args = _block_args(kind, node["args"], arrays, d)
                own = _block_shape(kind, args, d)
                if shape != own:  # block_sum would broadcast each term into `shape`
                    raise ValueError(f"Refusing pass {kind!r} declared of shape {shape}; its "
                                     f"terms have shape {own}.")
                row_sq = bool(node["row_sq"])
                if row_sq and kind not in BLOCK_ROW_SQ:
                    # its fast path would call it with sq=, a TypeError on just the blocks
                    # that need no prescaling: a refusal that would depend on the rows
                    raise ValueError(f"Refusing pass {kind!r} with row_sq=True: it takes no "
                                     f"squared norms (only {sorted(BLOCK_ROW_SQ)} do).")
                memo[key] = (rows.block_sum(func, *args, shape=shape,
                                            row_scaled=bool(node["row_scaled"]),
                                            row_sq=row_sq), sens(args))
        return memo[key]
    args = node["args"]
    if op == "matmul":
        (v, s), A = _evaluate_value(args[0], arrays, rows_of, memo), _map(args[1], arrays)
        return v @ A, s * float(np.linalg.norm(np.atleast_2d(A), 2))
    if op == "rmatmul":
        A, (v, s) = _map(args[0], arrays), _evaluate_value(args[1], arrays, rows_of, memo)
        return A @ v, s * float(np.linalg.norm(np.atleast_2d(A), 2))
    if op == "T":
        v, s = _evaluate_value(args[0], arrays, rows_of, memo)
        return v.T, s
    if op == "neg":
        v, s = _evaluate_value(args[0], arrays, rows_of, memo)
        return -v, s
    if op in ("add", "sub"):
        (a, sa), (b, sb) = (_evaluate_value(x, arrays, rows_of, memo) for x in args)
        _same_shape(a, b, "sum")
        return (a + b if op == "add" else a - b), sa + sb
    if op in ("mul", "rmul"):
        inner, c = (args[0], args[1]) if op == "mul" else (args[1], args[0])
        c = _public_scalar(c, "a scale factor")
        v, s = _evaluate_value(inner, arrays, rows_of, memo)
        return (v * c if op == "mul" else c * v), s * abs(c)
    if op == "div":
        c = _public_scalar(args[1], "a divisor")
        if abs(c) < 1.0 / PUBLIC_LIMIT:
            raise ValueError(f"Refusing a division by {c!r} (below {1 / PUBLIC_LIMIT:g} in "
                             "magnitude).")
        v, s = _evaluate_value(args[0], arrays, rows_of, memo)
        return v / c, s / abs(c)
    raise ValueError(f"Refusing an unknown operation {op!r} on a pass.")


def _evaluate_noise(node: dict[str, Any], draws: dict[str, np.ndarray],
                    draw_std: dict[str, float]) -> tuple[Any, dict[str, float]]:
    """``(this client's noise, its coefficient on each draw)``."""
    op = node["op"]
    if op == "draw":
        key = str(node["id"])
        if key not in draws or draw_std.get(key, 0.0) <= 0:
            raise ValueError(f"Refusing a release whose noise uses draw {key}, which this "
                             "client never drew as noise (or drew as public randomness).")
        return _check_shape(node, draws[key], "noise draw"), {key: 1.0}
    args = node["args"]

    def combine(ca: dict[str, float], cb: dict[str, float], sign: float) -> dict[str, float]:
        out = dict(ca)
        for k, c in cb.items():
            out[k] = out.get(k, 0.0) + sign * c
        return out

    if op in ("add", "sub"):
        (a, ca), (b, cb) = (_evaluate_noise(x, draws, draw_std) for x in args)
        _same_shape(a, b, "noise")
        return (a + b, combine(ca, cb, 1.0)) if op == "add" else (a - b, combine(ca, cb, -1.0))
    if op == "neg":
        a, ca = _evaluate_noise(args[0], draws, draw_std)
        return -a, {k: -c for k, c in ca.items()}
    if op in ("mul", "rmul", "div"):
        inner, c = (args[0], args[1]) if op != "rmul" else (args[1], args[0])
        c = _public_scalar(c, "a noise coefficient")
        if op == "div" and abs(c) < 1.0 / PUBLIC_LIMIT:
            raise ValueError(f"Refusing a division of noise by {c!r}.")
        a, ca = _evaluate_noise(inner, draws, draw_std)
        if op == "div":
            return a / c, {k: v / c for k, v in ca.items()}
        return (a * c if op == "mul" else c * a), {k: v * c for k, v in ca.items()}
    raise ValueError(f"Refusing an unknown operation {op!r} on noise.")


def _covariance(a: dict[str, float], b: dict[str, float], draw_std: dict[str, float]) -> float:
    return sum(c * b[k] * draw_std[k] ** 2 for k, c in a.items() if k in b)


def _client_rows(X: Any, row_norm: float, block_bytes: int) -> ClippedRows:
    """This client's rows; the refusal of a NaN or an infinity does not say where it is (the
    message goes to the server, and which record is incomplete is the client's)."""
    try:
        return ClippedRows.from_data(X, row_norm, block_bytes=block_bytes)
    except ValueError as exc:
        if "NaN or infinite" not in str(exc):
            raise
        raise ValueError("This client's rows contain NaN or infinite entries; the data owner "
                         "must remove or impute them (positions are not sent).") from None


def begin_request(request: dict[str, Any], X: Any, state: ClientState,
                  noise_seed: int | None) -> None:
    """A client's first checks of any request: its rows are a 2-D array of the fit's
    ``d`` columns; a new fit id starts a fresh state (refused for a seeded client that
    has answered another fit: the same seed would draw the same noise twice)."""
    shape = np.shape(X)
    if len(shape) != 2 or shape[0] < 1:
        raise ValueError(f"This client's rows must be a 2-D array with at least one row, got "
                         f"shape {shape}; a PCA federation needs every client's rows.")
    if "d" in request and int(request["d"]) != shape[1]:
        raise ValueError(f"The fit has d={int(request['d'])} features, this client's rows have "
                         f"{shape[1]} columns; refusing (every client holds the same d "
                         "columns).")
    if request.get("fit") != state.fit:  # a new fit: fresh streams and history
        if noise_seed is not None and state.fit:
            # Seeded streams are the same for every fit: a second fit would draw the same
            # noise (two fits at stds s1, s2 give s2 r1 - s1 r2 = (s2 - s1) part, exactly).
            raise ValueError(f"This client follows noise_seed and has answered fit "
                             f"{state.fit!r}; a second fit ({request.get('fit')!r}) would "
                             "draw the same noise, and the two would reveal its parts. Start "
                             "a new client state (a new run) for another seeded fit.")
        state.__init__()  # type: ignore[misc]
        state.fit = str(request.get("fit"))


def request_row_norm(request: dict[str, Any]) -> float:
    """The request's public ``row_norm``: a finite number > 0 (``ValueError`` otherwise)."""
    row_norm = request.get("row_norm")
    if isinstance(row_norm, bool) or not isinstance(row_norm, (int, float)) \
            or not (math.isfinite(row_norm) and row_norm > 0):
        raise ValueError(f"Refusing a request with row_norm={row_norm!r}: expected a finite "
                         "number > 0 (the public bound on the rows' norms).")
    return float(row_norm)


def evaluate_part(value: dict[str, Any], arrays: Sequence[np.ndarray],
                  base: ClippedRows) -> tuple[np.ndarray, float]:
    """``(this client's part of a deferred sum, a bound on its l2 sensitivity)``: the
    encoded ``value`` evaluated on the client's rows ``base`` (centered at a broadcast
    mean where a pass names one), every node checked (module docstring)."""
    centered: dict[bytes, ClippedRows] = {}

    def rows_of(mean: Any) -> ClippedRows:
        if mean is None:
            return base
        key = np.asarray(mean).tobytes()
        if key not in centered:
            centered[key] = base.centered(np.asarray(mean))
        return centered[key]

    return _evaluate_value(value, arrays, rows_of, {})


def client_answer(request: dict[str, Any], arrays: Sequence[np.ndarray], X: Any, *,
                  client_id: int, state: ClientState, noise_seed: int | None = None,
                  secure: bool = False, min_noise_multiplier: float = 0.0,
                  block_bytes: int = DEFAULT_BLOCK_BYTES) -> np.ndarray:
    """One client's answer to one request of a fit over a network (Flower-free).

    ``request["kind"]`` is ``"slack"`` (its rounding bound for ``n`` terms),
    ``"public"`` (its raw draw for public randomness) or ``"release"`` (its part of a
    deferred sum plus its own noise). The request's pending draws are made first, in
    order, from this client's streams. ``state`` is updated in place (the caller stores
    it). Raises ``ValueError`` for a request it refuses (module docstring).
    """
    begin_request(request, X, state, noise_seed)
    secure = secure or bool(request.get("secure", False))
    if secure and noise_seed is not None:
        raise ValueError("Secure mode refuses seeds: a seeded stream can be regenerated.")
    gens: dict[int, Any] = {}
    for spec in request.get("pending", []):
        j = int(spec["stream"])
        if not 0 <= j < len(STREAMS):
            raise ValueError(f"Unknown noise stream {j}; expected 0..{len(STREAMS) - 1}.")
        if j not in gens:
            gens[j] = _stream(state, j, client_id, noise_seed, secure)
        key = str(spec["id"])
        if key in state.draw_std:
            raise ValueError(f"Draw {key} was already made; refusing to redraw it.")
        # Unseeded, a public draw (revealed raw) comes from a generator of its own, never
        # from the one that draws this request's noise.
        own = spec["kind"] == "public" and noise_seed is None
        gen = _stream(state, j, client_id, None, secure) if own else gens[j]
        state.draws[key] = _draw(spec, gen)
        state.draw_std[key] = 0.0 if spec["kind"] == "public" else float(spec["std"])
        if spec["kind"] == "symmetric":
            state.symmetric.append(key)
    if noise_seed is not None:
        for j, gen in gens.items():
            state.streams[str(j)] = gen.bit_generator.state
    row_norm = request_row_norm(request)
    kind = request["kind"]
    if kind == "slack":
        rows = _client_rows(X, row_norm, block_bytes)
        return np.asarray(rows.rounding_slack(int(request["n"])))
    if kind == "public":
        key = str(request["id"])
        if state.draw_std.get(key, None) != 0.0:
            raise ValueError(f"Draw {key} is not a public draw; refusing to reveal it.")
        return state.draws.pop(key)
    if kind != "release":
        raise ValueError(f"Unknown request kind {kind!r}.")
    part, sens = evaluate_part(request["value"], arrays,
                               _client_rows(X, row_norm, block_bytes))
    noise, coefs = _evaluate_noise(request["noise"], state.draws, state.draw_std)
    var = _covariance(coefs, coefs, state.draw_std)
    if not var > 0:
        raise ValueError("Refusing a release without noise (its noise variance is 0).")
    for past in state.released:
        cov = _covariance(coefs, past, state.draw_std)
        if abs(cov) > COV_TOL * math.sqrt(var * _covariance(past, past, state.draw_std)):
            raise ValueError("Refusing a release whose noise is correlated with the noise of "
                             "an earlier release (combined, they would reveal the part).")
    std = math.sqrt(var)
    if not (math.isfinite(sens) and sens >= 0 and np.all(np.isfinite(part))):
        raise ValueError(f"Refusing a release whose sensitivity bound is {sens!r} (expected "
                         "a finite number >= 0) or whose part is not finite.")
    # Gaussian releases compose as one Gaussian mechanism whose precision 1/z^2 is the sum
    # of theirs: the floor bounds the whole fit (many releases each at the floor would not).
    floor = float(min_noise_multiplier)
    ratio = sens / std
    precision = state.precision + ratio * ratio  # inf, never OverflowError, for a tiny std
    if floor > 0 and not precision * floor * floor <= 1.0 + COV_TOL:
        raise ValueError(f"The server asked for noise std {std:.6g} on a pass of sensitivity "
                         f"<= {sens:.6g} (multiplier {1 / ratio if ratio else math.inf:.4g}); "
                         f"with this fit's "
                         f"{len(state.released)} earlier release(s) the fit would be a Gaussian "
                         f"mechanism of noise multiplier {precision ** -0.5:.4g}, below this "
                         f"client's min-noise-multiplier={floor:g}; refusing.")
    if np.shape(part) != np.shape(noise):
        raise ValueError(f"The noise's shape {np.shape(noise)} is not the part's "
                         f"{np.shape(part)}.")
    state.released.append(coefs)
    state.precision = precision
    part, noise = np.asarray(part, dtype=np.float64), np.asarray(noise, dtype=np.float64)
    if any(key in coefs for key in state.symmetric):
        # Symmetric noise is i.i.d. on and above the diagonal only: release that triangle,
        # mirrored (post-processing), so that a value that is not symmetric cannot show
        # out - out.T, its noiseless antisymmetric part. A symmetric value is unchanged
        # (mirroring each term, then adding, is mirroring the sum, entry by entry).
        part, noise = (np.triu(a) + np.triu(a, 1).T for a in (part, noise))
    # The library's one release: part + noise, snapped in secure mode (a secure source).
    out = release(part, std, _release_source(secure), noise=noise)
    return np.asarray(out, dtype=np.float64)
