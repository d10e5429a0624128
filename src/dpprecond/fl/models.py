"""Models for federated training, exposed through one small protocol.

The simulator needs only two model operations: the *per-client sums of clipped per-example
gradients* at the current parameters, and an evaluation (loss, accuracy). Parameters are
always one flat float vector of length ``n_params``, so that the server optimizers of
:mod:`dpprecond.fl.server` are model-agnostic.

- :class:`LinearSoftmax`: a linear softmax head with bias (the model of the DP-FedSOFIM
  paper). The per-example gradient of the cross-entropy is the outer product
  ``x~ (softmax - onehot)^T`` with ``x~ = [x, 1]``, so its norm is
  ``||x~|| * ||softmax - onehot||``: clipping needs no per-example backward pass and the
  clipped sums of all clients cost two dense matrix products.
- :class:`TorchModel`: any ``torch.nn.Module`` classifier, per-example gradients from
  ``torch.func`` (``vmap(grad(...))``). Needs the optional extra ``dpprecond[torch]``.

Data handed to the models is *client-contiguous*: the rows of client ``i`` are
``X[bounds[i]:bounds[i + 1]]`` (see :class:`dpprecond.fl.simulator.ClientData`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple, Protocol, runtime_checkable

import numpy as np

from dpprecond.clipping import SHRINK, clip_rows_safely, clip_to_radius, safe_row_norms
from dpprecond.fl.backend import backend_of, import_torch
from dpprecond.fl.kernels import clipped_sums, rounding_slack, scale_exponent

__all__ = [
    "FLModel",
    "LinearSoftmax",
    "TorchModel",
    "block_products",
    "clip_factors",
    "clip_rows_safely",
    "round_evaluator",
]


@runtime_checkable
class FLModel(Protocol):
    """What the simulator needs from a model (flat parameter vector of length n_params)."""

    n_params: int

    def init_params(self, rng: np.random.Generator) -> np.ndarray:
        """Initial parameters, shape (n_params,)."""
        ...

    def clipped_grad_sums(self, params: np.ndarray, X: np.ndarray, y: np.ndarray,
                          bounds: np.ndarray, clip_norm: float, *,
                          x_sq_norms: np.ndarray | None = None) -> np.ndarray:
        """Per-client sums of per-example gradients clipped to ``clip_norm``, (K, n_params).

        ``params`` is (n_params,) shared by all clients or (K, n_params), one per client.
        ``x_sq_norms`` optionally caches ``||x_j||^2`` (a model may ignore it).
        """
        ...

    def per_example_grads(self, params: np.ndarray, X: np.ndarray,
                          y: np.ndarray) -> np.ndarray:
        """Unclipped per-example gradients, (n, n_params) (for tests and small data)."""
        ...

    def evaluate(self, params: np.ndarray, X: np.ndarray, y: np.ndarray) -> tuple[float, float]:
        """Mean cross-entropy loss and accuracy of ``params`` on (X, y)."""
        ...


def clip_factors(norms: np.ndarray, clip_norm: float) -> np.ndarray:
    """``min(1, clip_norm / norm)`` elementwise (1 where the norm is 0; all 1 if C = inf)."""
    if np.isinf(clip_norm):
        return np.ones_like(norms)
    with np.errstate(divide="ignore", over="ignore"):  # an overflow means a factor of 1
        return np.minimum(1.0, clip_norm / np.maximum(norms, 1e-300))


def block_products(X: np.ndarray, R: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """``X_i^T R_i`` for every contiguous row block ``i``, shape (K, d, k).

    The blocks together cost one ``X^T R``. Many small multi-threaded BLAS calls pay a
    thread start-up per call (about 10x slower for K = 100 on 2 busy cores), so with
    several blocks each call runs single-threaded BLAS and the blocks are spread over a
    pool of ``os.cpu_count()`` threads (BLAS releases the GIL). Results do not depend on
    the scheduling: every block is computed by exactly one call.
    """
    n_blocks = len(bounds) - 1
    out = np.zeros((n_blocks, X.shape[1], R.shape[1]), dtype=np.result_type(X, R))
    caller = np.geterr()  # the caller's np.errstate, which pool threads do not inherit

    def one(i: int) -> None:
        lo, hi = bounds[i], bounds[i + 1]
        if hi > lo:
            with np.errstate(**caller):
                np.matmul(X[lo:hi].T, R[lo:hi], out=out[i])

    n_threads = min(os.cpu_count() or 1, n_blocks)
    if n_threads <= 1:
        for i in range(n_blocks):
            one(i)
        return out
    from dpprecond._threads import serial_blas

    with serial_blas(), ThreadPoolExecutor(max_workers=n_threads) as pool:
        list(pool.map(one, range(n_blocks)))
    return out


def _softmax_residuals(logits: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Return ``softmax(logits) - onehot(y)`` (in place on ``logits``) and per-row losses.

    ``logits`` may hold ``-inf`` (a class infinitely less likely) but no ``nan``/``+inf``.
    """
    with np.errstate(invalid="ignore"):
        logits -= logits.max(axis=1, keepdims=True)
    np.exp(logits, out=logits)
    total = logits.sum(axis=1, keepdims=True)
    logits /= total
    rows = np.arange(len(y))
    losses = -np.log(np.maximum(logits[rows, y], 1e-300))
    logits[rows, y] -= 1.0
    return logits, losses


#: Rows whose squared norm reaches this go through the overflow-safe path.
_SQ_LIMIT = 1e280


class _HardRows(NamedTuple):
    """Rows of ``[x, 1]`` that the plain computation cannot handle, computed safely.

    ``idx`` are the row indices, ``Y = [x, 1] * pre`` (``pre`` a power of two, exact),
    ``nu = ||Y||``, and ``shifted`` their logits minus the row maximum (``<= 0``, ``-inf``
    allowed); ``failed`` marks rows whose scaled logits still overflow (astronomically large
    parameters): they contribute nothing.
    """

    idx: np.ndarray
    Y: np.ndarray
    pre: np.ndarray
    nu: np.ndarray
    shifted: np.ndarray
    failed: np.ndarray


class LinearSoftmax:
    """Linear softmax classifier with bias, with closed-form per-example gradients.

    Parameters are the flattened ``(n_features + 1, n_classes)`` matrix ``W`` whose last row
    is the bias; ``n_params = (n_features + 1) * n_classes``.

    Parameters
    ----------
    n_features : int
        Input dimension d.
    n_classes : int
        Number of classes k.
    """

    def __init__(self, n_features: int, n_classes: int) -> None:
        from dpprecond._validation import check_int

        self.n_features = check_int("n_features", n_features, low=1)
        self.n_classes = check_int("n_classes", n_classes, low=2)
        self.n_params = (self.n_features + 1) * self.n_classes

    def __repr__(self) -> str:
        return f"LinearSoftmax(n_features={self.n_features}, n_classes={self.n_classes})"

    def _unflatten(self, params: np.ndarray) -> np.ndarray:
        return params.reshape(self.n_features + 1, self.n_classes)

    def init_params(self, rng: np.random.Generator) -> np.ndarray:
        """Zeros (the convex problem needs no random start; ``rng`` is unused)."""
        del rng
        return np.zeros(self.n_params)

    def logits(self, params: np.ndarray, X: np.ndarray) -> np.ndarray:
        """``X W[:d] + b``, shape (n, n_classes) (plain: may overflow for huge rows).

        Computed as ``(W[:d]^T X^T)^T``, the layout in which OpenBLAS runs a product with
        ``n_classes`` columns fastest here (Fashion-MNIST's 10,000 test rows, one BLAS
        thread: 8.9 ms against 13.8 ms for ``X @ W``; the round's kernel holds its blocks
        the same way, :mod:`dpprecond.fl.kernels`): the same dot products, in another
        order. The result is a Fortran-ordered view.
        """
        W = self._unflatten(params)
        return (W[:-1].T @ X.T).T + W[-1]

    def shifted_logits(self, params: np.ndarray, X: np.ndarray,
                       bounds: np.ndarray | None = None,
                       x_sq_norms: np.ndarray | None = None) -> tuple[np.ndarray, _HardRows]:
        """Logits minus their row maximum, finite or ``-inf``, for every finite input.

        ``params`` is shared (n_params,) or one per client (K, n_params) with ``bounds``.
        Rows whose squared norm is out of range or whose plain logits are not finite are
        recomputed from ``[x, 1] * pre`` (``pre`` an exact power of two bringing the
        largest entry near 1): their logits are ``(Y W - max) / pre``, which can only
        round towards ``-inf``. Returns the shifted logits and the recomputed rows.
        """
        n = X.shape[0]
        if params.ndim == 1:
            with np.errstate(over="ignore", invalid="ignore"):
                L = self.logits(params, X)
        else:
            if bounds is None:
                raise ValueError("Per-client parameters need the client bounds.")
            L = np.empty((n, self.n_classes), dtype=np.result_type(X, params))
            with np.errstate(over="ignore", invalid="ignore"):
                for i in range(len(bounds) - 1):
                    lo, hi = bounds[i], bounds[i + 1]
                    L[lo:hi] = self.logits(params[i], X[lo:hi])
        sq = np.einsum("ij,ij->i", X, X) if x_sq_norms is None else x_sq_norms
        hard = ~(sq < _SQ_LIMIT) | ~np.isfinite(L).all(axis=1)
        idx = np.flatnonzero(hard)
        with np.errstate(invalid="ignore", over="ignore"):  # hard rows are redone below
            L -= L.max(axis=1, keepdims=True)
        Xt = np.hstack([X[idx], np.ones((idx.size, 1), dtype=X.dtype)])
        nu, pre = safe_row_norms(Xt)
        top = np.abs(Xt).max(axis=1) if idx.size else np.zeros(0)
        # scale every hard row (also ones with an ordinary norm but overflowing logits)
        pre = np.where(pre == 1.0, np.ldexp(1.0, np.clip(-np.frexp(top)[1], -1000, 1000)),
                       pre)
        Y = Xt * pre[:, None]
        nu = np.sqrt(np.einsum("ij,ij->i", Y, Y))
        shifted = np.zeros((idx.size, self.n_classes))
        failed = np.zeros(idx.size, dtype=bool)
        if idx.size:
            owner = (np.zeros(idx.size, dtype=np.int64) if bounds is None or params.ndim == 1
                     else np.searchsorted(bounds, idx, side="right") - 1)
            Ws = (self._unflatten(params)[None] if params.ndim == 1
                  else params.reshape(-1, self.n_features + 1, self.n_classes))
            with np.errstate(over="ignore", invalid="ignore"):
                scaled = np.einsum("nd,ndk->nk", Y, Ws[owner])
                failed = ~np.isfinite(scaled).all(axis=1)
                scaled[failed] = 0.0
                shifted = scaled - scaled.max(axis=1, keepdims=True)
                shifted /= pre[:, None]
            L[idx] = shifted
        return L, _HardRows(idx, Y, pre, nu, shifted, failed)

    @property
    def counts_in_pass(self) -> bool:
        """Whether a round may take its sums and counts from
        :meth:`clipped_grad_sums_and_counts` (one pass): only while
        :meth:`clipped_grad_sums` and :meth:`per_example_grad_norms` (the count's norms)
        are this class's own (a subclass that overrides either, e.g. a reference path,
        gets its own method called)."""
        cls = type(self)
        return (cls.clipped_grad_sums is LinearSoftmax.clipped_grad_sums
                and cls.per_example_grad_norms is LinearSoftmax.per_example_grad_norms)

    def clipped_grad_sums(self, params: np.ndarray, X: np.ndarray, y: np.ndarray,
                          bounds: np.ndarray, clip_norm: float, *,
                          x_sq_norms: np.ndarray | None = None) -> np.ndarray:
        """Per-client sums of clipped per-example gradients, shape (K, n_params).

        One pass over ``X`` (:func:`dpprecond.fl.kernels.clipped_sums`: logits, residuals,
        clip factors and the client's ``X_b^T R_b`` while a block of rows is in cache);
        ``X`` may be float64 or float32 (the products then run in float32 on small
        sub-blocks whose partial sums are added in float64; see the kernel's rounding
        bound), a numpy array or a torch tensor (the kernel runs on its device; the sums
        come back as numpy float64). Records the fast path cannot handle
        (huge entries, overflowing logits) go through the overflow-safe path
        (:meth:`clipped_grad_sums_safe`).
        """
        return self._sums(params, X, y, bounds, clip_norm, x_sq_norms, counted=False)[0]

    def clipped_grad_sums_and_counts(self, params: np.ndarray, X: np.ndarray, y: np.ndarray,
                                     bounds: np.ndarray, clip_norm: float, *,
                                     x_sq_norms: np.ndarray | None = None
                                     ) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`clipped_grad_sums` and adaptive clipping's counts, in the same pass.

        The counts, shape (K,), are each client's records whose per-example gradient norm
        is at most ``clip_norm`` (:func:`dpprecond.fl.client.record_counts`), from the
        norms the kernel computes its clip factors from (a hard record's from
        :meth:`per_example_grad_norms`, the overflow-safe path); each record's indicator
        depends on that record and ``params`` only (sensitivity 1, as for
        :func:`~dpprecond.fl.client.record_counts`). With float32 or torch rows the norms
        are those of the rows the pass reads.
        """
        sums, counts = self._sums(params, X, y, bounds, clip_norm, x_sq_norms, counted=True)
        assert counts is not None
        return sums, counts

    def _sums(self, params: np.ndarray, X: Any, y: np.ndarray, bounds: np.ndarray,
              clip_norm: float, x_sq_norms: Any, *, counted: bool
              ) -> tuple[np.ndarray, np.ndarray | None]:
        be = backend_of(X)
        if x_sq_norms is None:
            x_sq_norms = be.asarray(np.einsum("ij,ij->i", *(2 * [be.to_numpy(X)]),
                                              dtype=np.float64))
        W = params.reshape(-1, self.n_features + 1, self.n_classes)
        W = W[0] if params.ndim == 1 else W
        counts = None
        if counted:
            out, hard, counts = clipped_sums(X, y, W, bounds, clip_norm, x_sq_norms,
                                             return_counts=True)
        else:
            out, hard = clipped_sums(X, y, W, bounds, clip_norm, x_sq_norms)
        if hard.size:  # rare: a hostile or extreme record
            owner = np.searchsorted(bounds, hard, side="right") - 1
            K = len(bounds) - 1
            sub_bounds = np.r_[0, np.cumsum(np.bincount(owner, minlength=K))].astype(np.int64)
            Xh = np.asarray(be.to_numpy(X[be.label_index(hard)]), dtype=np.float64)
            sub = self.clipped_grad_sums_safe(params, Xh, y[hard], sub_bounds, clip_norm)
            out += sub.reshape(out.shape)
            if counts is not None:  # their norms from the overflow-safe path, per client
                yh, inside = y[hard], np.zeros(hard.size)
                for i in np.unique(owner):
                    rows = owner == i
                    p = params if params.ndim == 1 else params[i]
                    inside[rows] = self.per_example_grad_norms(p, Xh[rows], yh[rows]) \
                        <= clip_norm
                counts += np.bincount(owner, weights=inside, minlength=K)
        return out.reshape(len(bounds) - 1, self.n_params), counts

    def rounding_slack(self, max_client_rows: int, dtype: Any = np.float64) -> float:
        """Relative excess of a computed clipped sum over ``2C`` (see the kernel)."""
        return rounding_slack(int(max_client_rows), dtype)

    def clipped_grad_sums_safe(self, params: np.ndarray, X: np.ndarray, y: np.ndarray,
                               bounds: np.ndarray, clip_norm: float, *,
                               x_sq_norms: np.ndarray | None = None) -> np.ndarray:
        """The overflow-safe reference of :meth:`clipped_grad_sums`, shape (K, n_params).

        Cost: one forward product ``X W`` (all clients at once when ``params`` is shared)
        and one product ``X_i^T R_i`` per client on contiguous row blocks, whose total is
        one ``X^T R``; the per-example norms come from ``||x~|| ||r||`` in O(n (d + k)).

        Overflow safety (every finite record): a record whose squared norm is out of range
        or whose logits overflow is handled apart (:meth:`shifted_logits`): its gradient
        ``x~ r^T`` is formed as ``(x~ pre) (r f)^T`` with ``pre`` an exact power of two and
        ``f = min(1 / pre, C / (||x~ pre|| ||r||))``, so no factor overflows or becomes
        subnormal and its norm is at most ``C`` as computed (:mod:`dpprecond.clipping`).
        A record whose scaled logits still overflow contributes nothing (a deterministic
        function of the record and the public parameters, so the sensitivity is kept).
        """
        n_clients = len(bounds) - 1
        k = self.n_classes
        if x_sq_norms is None:
            x_sq_norms = np.einsum("ij,ij->i", X, X)
        L, hard = self.shifted_logits(params, X, bounds, x_sq_norms)
        R, _ = _softmax_residuals(L, y)
        R[hard.idx] = 0.0  # hard rows are added below from their scaled form
        hard_R = _softmax_residuals(hard.shifted.copy(), y[hard.idx])[0]
        hard_R[hard.failed] = 0.0
        if not np.isinf(clip_norm):
            x_norms = np.sqrt(x_sq_norms + 1.0)
            x_norms[hard.idx] = 1.0
            r_norms = np.sqrt(np.einsum("ij,ij->i", R, R))
            # min(1, C / n) 2^e: never subnormal, also for a tiny C (see fl/kernels.py)
            e = scale_exponent(clip_norm, wide=False)
            with np.errstate(divide="ignore", over="ignore"):
                factor = np.minimum(2.0**e, clip_norm * 2.0**e
                                    / np.maximum(x_norms * r_norms, 1e-300))
            R *= factor[:, None] * SHRINK
            hr = np.sqrt(np.einsum("ij,ij->i", hard_R, hard_R))
            hard_R *= clip_to_radius(hard.nu * hr, hard.pre, clip_norm)[:, None]
        else:
            hard_R /= hard.pre[:, None]
        out = np.empty((n_clients, self.n_features + 1, k), dtype=R.dtype)
        out[:, :-1] = block_products(X, R, bounds)
        nonempty = np.diff(bounds) > 0  # empty blocks (a Poisson sample of 0) sum to 0
        out[:, -1] = 0.0
        if nonempty.any():
            out[nonempty, -1] = np.add.reduceat(R, bounds[:-1][nonempty], axis=0)
        if not np.isinf(clip_norm) and e:
            out *= 2.0**-e
        if hard.idx.size:
            owner = np.searchsorted(bounds, hard.idx, side="right") - 1
            np.add.at(out, owner, np.einsum("nd,nk->ndk", hard.Y, hard_R))
        return out.reshape(n_clients, self.n_params)

    def per_example_grads(self, params: np.ndarray, X: np.ndarray,
                          y: np.ndarray) -> np.ndarray:
        """Closed-form per-example gradients ``x~_j r_j^T`` flattened, shape (n, n_params)."""
        R, _ = _softmax_residuals(self.logits(params, X), y)
        Xt = np.hstack([X, np.ones((X.shape[0], 1), dtype=X.dtype)])
        return np.einsum("ni,nj->nij", Xt, R).reshape(X.shape[0], self.n_params)

    def per_example_grad_norms(self, params: np.ndarray, X: np.ndarray,
                               y: np.ndarray) -> np.ndarray:
        """``||x~_j|| * ||softmax_j - onehot_j||`` without forming any gradient, shape (n,).

        Overflow-safe for every finite record, as :meth:`clipped_grad_sums_safe`: a record
        whose squared norm or logits are out of range is handled from its scaled form; a
        norm too large for float64 is ``inf`` (above every clip), and a record whose
        scaled logits still overflow, whose clipped gradient is zero, has norm 0.
        """
        with np.errstate(over="ignore"):  # an overflowing norm makes its row a hard one
            x_sq = np.einsum("ij,ij->i", X, X)
        L, hard = self.shifted_logits(params, X, np.array([0, X.shape[0]]), x_sq)
        R, _ = _softmax_residuals(L, y)
        R[hard.idx] = 0.0
        with np.errstate(over="ignore", invalid="ignore"):  # hard rows: overwritten below
            norms = np.sqrt(x_sq + 1.0) * np.sqrt(np.einsum("ij,ij->i", R, R))
            if hard.idx.size:
                hard_R = _softmax_residuals(hard.shifted.copy(), y[hard.idx])[0]
                hard_R[hard.failed] = 0.0
                hr = np.sqrt(np.einsum("ij,ij->i", hard_R, hard_R))
                norms[hard.idx] = hard.nu * hr / hard.pre
        return norms

    def evaluate(self, params: np.ndarray, X: np.ndarray, y: np.ndarray, *,
                 x_sq_norms: np.ndarray | None = None) -> tuple[float, float]:
        """Mean cross-entropy and accuracy on (X, y) (finite logits for every finite row).

        Non-finite parameters (a diverged model) give ``(nan, nan)``, never a plausible
        value. ``x_sq_norms``: ``einsum("ij,ij->i", X, X)`` if the caller kept it (the
        rounds of a run evaluate one test set: :func:`round_evaluator`).
        """
        if not np.all(np.isfinite(params)):
            return float("nan"), float("nan")
        logits, _ = self.shifted_logits(params, X, None, x_sq_norms)
        acc = float(np.mean(np.argmax(logits, axis=1) == y))
        _, losses = _softmax_residuals(logits, y)
        return float(losses.mean()), acc


class TorchModel:
    """Any ``torch.nn.Module`` classifier, with per-example gradients from ``torch.func``.

    The module maps a float batch (n, n_features) to logits (n, n_classes); the loss is the
    cross-entropy. Parameters travel as one flat numpy vector (the order of
    ``module.named_parameters()``); the module's own tensors are never modified.
    Per-example gradients are computed by ``vmap(grad(loss))`` in chunks of
    ``chunk_size`` examples, so memory stays at ``chunk_size * n_params`` floats. Layers
    that per-example gradients cannot go through (BatchNorm, Dropout, recurrent layers...)
    are refused with :class:`~dpprecond.fl.module_validator.UnsupportedModuleError`, which
    names them and the fix (:func:`~dpprecond.fl.module_validator.fix_module`).

    Parameters
    ----------
    module : torch.nn.Module
        The network (its current parameters are the initial parameters).
    chunk_size : int, default=1024
        Examples per vectorized per-example-gradient call.
    """

    def __init__(self, module: Any, chunk_size: int = 1024) -> None:
        torch = import_torch("TorchModel")
        from dpprecond._validation import check_int

        if not isinstance(module, torch.nn.Module):
            raise TypeError(f"Expected a torch.nn.Module, got {type(module).__name__}.")
        from dpprecond.fl.module_validator import check_module

        check_module(module)  # names unsupported layers (BatchNorm, Dropout...) and the fix
        self.module = module
        self.chunk_size = check_int("chunk_size", chunk_size, low=1)
        self._names = [n for n, _ in module.named_parameters()]
        self._shapes = [tuple(p.shape) for _, p in module.named_parameters()]
        self._sizes = [int(np.prod(s)) for s in self._shapes]
        self._dtype = next(module.parameters()).dtype
        self.n_params = int(sum(self._sizes))
        self._torch = torch

    def __repr__(self) -> str:
        return f"TorchModel({type(self.module).__name__}, n_params={self.n_params})"

    def _to_dict(self, flat: np.ndarray) -> dict[str, Any]:
        t = self._torch.as_tensor(np.ascontiguousarray(flat), dtype=self._dtype)
        parts = self._torch.split(t, self._sizes)
        return {n: p.reshape(s) for n, p, s in zip(self._names, parts, self._shapes, strict=True)}

    def init_params(self, rng: np.random.Generator) -> np.ndarray:
        """The module's current parameters, flattened (``rng`` is unused)."""
        del rng
        with self._torch.no_grad():
            return np.concatenate([p.detach().cpu().double().numpy().ravel()
                                   for p in self.module.parameters()])

    def _per_example(self, params: np.ndarray, X: np.ndarray, y: np.ndarray) -> np.ndarray:
        torch = self._torch
        from torch.func import functional_call, grad, vmap

        pdict = self._to_dict(params)

        def loss_one(p: dict[str, Any], x: Any, t: Any) -> Any:
            out = functional_call(self.module, p, (x.unsqueeze(0),))
            return torch.nn.functional.cross_entropy(out, t.unsqueeze(0))

        per_ex = vmap(grad(loss_one), in_dims=(None, 0, 0))
        chunks = []
        for lo in range(0, X.shape[0], self.chunk_size):
            xb = torch.as_tensor(X[lo:lo + self.chunk_size], dtype=self._dtype)
            yb = torch.as_tensor(y[lo:lo + self.chunk_size], dtype=torch.long)
            g = per_ex(pdict, xb, yb)
            chunks.append(torch.cat([g[n].reshape(xb.shape[0], -1) for n in self._names],
                                    dim=1).detach().double().numpy())
        if not chunks:
            return np.zeros((0, self.n_params))
        return np.concatenate(chunks, axis=0)

    def per_example_grads(self, params: np.ndarray, X: np.ndarray,
                          y: np.ndarray) -> np.ndarray:
        """Per-example gradients from ``torch.func``, shape (n, n_params)."""
        return self._per_example(params, X, y)

    def rounding_slack(self, max_client_rows: int, dtype: Any = np.float64) -> float:
        """Relative excess of a computed clipped sum over ``2C``: one float64 sum of
        ``max_client_rows`` clipped gradients (see :mod:`dpprecond.fl.kernels`)."""
        return rounding_slack(int(max_client_rows), np.float64,
                              block_rows=int(max_client_rows))

    def clipped_grad_sums(self, params: np.ndarray, X: np.ndarray, y: np.ndarray,
                          bounds: np.ndarray, clip_norm: float, *,
                          x_sq_norms: np.ndarray | None = None) -> np.ndarray:
        """Per-client sums of clipped per-example gradients, shape (K, n_params)."""
        del x_sq_norms
        n_clients = len(bounds) - 1
        out = np.zeros((n_clients, self.n_params))
        for i in range(n_clients):  # one vmap call per client block (chunked inside)
            lo, hi = bounds[i], bounds[i + 1]
            p = params if params.ndim == 1 else params[i]
            G = self._per_example(p, X[lo:hi], y[lo:hi])
            out[i] = clip_rows_safely(G, clip_norm).sum(axis=0)
        return out

    def evaluate(self, params: np.ndarray, X: np.ndarray, y: np.ndarray) -> tuple[float, float]:
        """Mean cross-entropy and accuracy on (X, y)."""
        torch = self._torch
        from torch.func import functional_call

        with torch.no_grad():
            out = functional_call(self.module, self._to_dict(params),
                                  (torch.as_tensor(X, dtype=self._dtype),))
            t = torch.as_tensor(y, dtype=torch.long)
            loss = float(torch.nn.functional.cross_entropy(out, t))
            acc = float((out.argmax(dim=1) == t).double().mean())
        return loss, acc


def round_evaluator(model: FLModel, X: np.ndarray,
                   y: np.ndarray) -> Callable[[np.ndarray], tuple[float, float]]:
    """``params -> model.evaluate(params, X, y)`` for the one test set of a run.

    A linear softmax head computes the test rows' squared norms (its check for rows that
    need the overflow-safe logits) once here instead of every round; other models (a
    subclass that overrides ``evaluate`` among them) are called as they are.
    """
    if isinstance(model, LinearSoftmax) and type(model).evaluate is LinearSoftmax.evaluate:
        sq = np.einsum("ij,ij->i", X, X)
        return lambda params: model.evaluate(params, X, y, x_sq_norms=sq)
    return lambda params: model.evaluate(params, X, y)
