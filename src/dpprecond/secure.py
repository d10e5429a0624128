"""Secure mode: noise from the operating system's CSPRNG, snapped releases, no seeds.

By default every release draws its noise from numpy's PCG64 generator seeded with fresh OS
entropy (:func:`dpprecond._validation.check_seed`): unpredictable to anyone who does not
hold the seed, but not a cryptographic generator, and its Gaussian sampler works in
floating point. Secure mode (``secure=True`` on :func:`dpprecond.pca.fit_private_pca`,
:class:`dpprecond.PrivatePCA`, :func:`dpprecond.fl.simulate`, :func:`dpprecond.fl.run_federated`
and ``--secure`` on the CLI) changes three things, after the Opacus idea of a secure mode:

1. **A cryptographic source.** Every noise draw, Poisson mask and random choice comes from
   :class:`SecureGenerator`, which reads ``os.urandom`` (the kernel's CSPRNG). User seeds
   are refused: a seeded secure run would be reproducible by whoever knows the seed.
2. **A sampler that hides floating-point structure.** Mironov (CCS 2012) showed that a
   Laplace mechanism implemented in floating point leaks its input through the set of
   representable outputs (``x + noise`` lands on different float patterns for different
   ``x``), and Holohan and Braghin (ESORICS 2021) showed the same for common Gaussian
   samplers. Each standard normal here is the sum of four Box-Muller samples built from
   53-bit CSPRNG uniforms, divided by two, which spreads the low-order bits (their proposed
   mitigation).
3. **Snapping.** Every noisy release is rounded to a public power-of-two grid ``Lambda``
   about ``2^-24`` times its noise standard deviation (:func:`dpprecond.noise.release`,
   through :func:`snap`), which erases the
   low-order bits that carry the leak while changing each value by far less than the noise
   (a relative change of about ``1e-7`` of one standard deviation). This follows
   Mironov's snapping mechanism for Laplace noise.

**The limit, stated plainly.** These steps remove the known attacks, but the formal
(epsilon, delta) guarantee of a *floating-point* Gaussian mechanism with snapping has not
been proven here: the proofs the library relies on are for real-valued Gaussian noise. A
rigorous alternative is the discrete Gaussian mechanism on a lattice (Canonne, Kamath and
Steinke, NeurIPS 2020), sampled exactly with integer arithmetic; it is not implemented.
Outside secure mode the same caveat applies without the mitigations. Under secure
aggregation (the FL rounds of :mod:`dpprecond.secagg.fl` and Flower's SecAgg+ clients)
the noise is integer: each client's Skellam share (:meth:`SecureGenerator.poisson`) is
added to its integer message and each release is a function of the integer sum, so
there is nothing to snap. Secure mode also
gives up reproducibility (no seeds, and a resumed checkpointed run continues with fresh
noise) and costs time (``os.urandom`` and four samples per draw).
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import os
from collections.abc import Iterator
from typing import Any

import numpy as np

from dpprecond._poisson import poisson_from_uniforms

__all__ = ["SECURE_ROOT", "SecureGenerator", "SecureRoot", "is_secure", "observe_releases",
           "snap"]

#: The lists that :func:`observe_releases` blocks fill (empty outside one).
_OBSERVERS: contextvars.ContextVar[tuple[list[Any], ...]] = contextvars.ContextVar(
    "dpprecond_release_observers", default=())

_TWO53 = float(2**53)
#: Snapping grid relative to the noise std: Lambda = 2^(floor(log2 std) - 24).
SNAP_BITS = 24


class SecureGenerator:
    """A numpy-Generator-like source backed by ``os.urandom`` (the OS CSPRNG).

    Implements the methods the library draws noise and choices with: ``random``,
    ``standard_normal``, ``normal``, ``integers``, ``choice``, ``geometric``, ``poisson``
    and ``spawn``
    (independent generators: every draw reads fresh OS entropy, so there is no state).
    """

    def __repr__(self) -> str:
        return "SecureGenerator(os.urandom)"

    @staticmethod
    def _uniform53(n: int) -> np.ndarray:
        bits = np.frombuffer(os.urandom(8 * n), dtype=np.uint64) >> np.uint64(11)
        return bits.astype(np.float64) / _TWO53  # 53-bit uniforms in [0, 1)

    def random(self, size: Any = None) -> Any:
        """Uniform floats in [0, 1) with 53 random bits."""
        n = 1 if size is None else int(np.prod(size))
        out = self._uniform53(n)
        return float(out[0]) if size is None else out.reshape(size)

    def _box_muller(self, n: int) -> np.ndarray:
        m = (n + 1) // 2
        u1 = 1.0 - self._uniform53(m)  # in (0, 1]: log is finite
        u2 = self._uniform53(m)
        r = np.sqrt(-2.0 * np.log(u1))
        theta = 2.0 * math.pi * u2
        return np.concatenate([r * np.cos(theta), r * np.sin(theta)])[:n]

    def standard_normal(self, size: Any = None) -> Any:
        """Standard normals: the mean of four Box-Muller normals times two (see module)."""
        n = 1 if size is None else int(np.prod(size))
        z = self._box_muller(4 * n).reshape(4, n).sum(axis=0) * 0.5
        return float(z[0]) if size is None else z.reshape(size)

    def normal(self, loc: float = 0.0, scale: float = 1.0, size: Any = None) -> Any:
        """``loc + scale * standard_normal(size)``."""
        return loc + scale * self.standard_normal(size)

    def integers(self, low: int, high: int | None = None, size: Any = None) -> Any:
        """Uniform integers in ``[low, high)`` without modulo bias (rejection sampling)."""
        if high is None:
            low, high = 0, low
        span = int(high) - int(low)
        if span <= 0:
            raise ValueError(f"Expected high > low, got low={low}, high={high}.")
        n = 1 if size is None else int(np.prod(size))
        bits = max(1, (span - 1).bit_length())
        out = np.empty(n, dtype=np.int64)
        filled = 0
        while filled < n:
            draw = np.frombuffer(os.urandom(8 * (n - filled)), dtype=np.uint64)
            draw = draw >> np.uint64(64 - bits)
            ok = draw[draw < span]
            out[filled:filled + ok.size] = ok.astype(np.int64) + int(low)
            filled += ok.size
        return int(out[0]) if size is None else out.reshape(size)

    def choice(self, a: Any, size: Any = None) -> Any:
        """Uniform choice with replacement from ``a`` (an array or ``range(a)``)."""
        arr = np.arange(a) if isinstance(a, (int, np.integer)) else np.asarray(a)
        idx = self.integers(0, len(arr), size)
        return arr[idx]

    def geometric(self, p: float, size: Any = None) -> Any:
        """Geometric on ``{1, 2, ...}`` with success probability ``p`` (inverse CDF)."""
        u = 1.0 - self.random(size)  # in (0, 1]
        if p >= 1.0:
            return 1 if size is None else np.ones(np.shape(u), dtype=np.int64)
        k = np.ceil(np.log(u) / math.log1p(-p))
        k = np.maximum(k, 1).astype(np.int64)
        return int(k) if size is None else k

    def poisson(self, lam: float = 1.0, size: Any = None) -> Any:
        """Poisson(``lam``) integers (int64): numpy's algorithms on CSPRNG uniforms
        (:func:`dpprecond._poisson.poisson_from_uniforms`; means up to ``2^50``). The
        Skellam shares of secure aggregation are differences of two such draws: integer
        noise on integer messages, so no floating-point pattern of the release depends on
        the data (what snapping guards against for the Gaussian)."""
        n = 1 if size is None else int(np.prod(size))
        out = poisson_from_uniforms(lam, n, self._uniform53)
        return int(out[0]) if size is None else out.reshape(size)

    def spawn(self, n_children: int) -> list[SecureGenerator]:
        """Independent generators (each reads the OS CSPRNG)."""
        return [SecureGenerator() for _ in range(int(n_children))]


class SecureRoot:
    """The root of a secure run's streams: every stream is a :class:`SecureGenerator`."""

    def spawn(self, n_children: int) -> list[SecureRoot]:
        """Children that are secure roots too."""
        return [SecureRoot() for _ in range(int(n_children))]

    def __repr__(self) -> str:
        return "SecureRoot()"


#: A shared secure root (stateless).
SECURE_ROOT = SecureRoot()


def is_secure(rng: Any) -> bool:
    """True for a :class:`SecureGenerator`, or a wrapper of secure streams (``secure``)."""
    return isinstance(rng, SecureGenerator) or getattr(rng, "secure", False) is True


def snap(values: np.ndarray, noise_std: float) -> np.ndarray:
    """Round ``values`` (in place when an array) to the grid ``2^(floor(log2 std) - 24)``."""
    if noise_std <= 0 or not math.isfinite(noise_std):
        return values
    grid = math.ldexp(1.0, math.floor(math.log2(noise_std)) - SNAP_BITS)
    if isinstance(values, np.ndarray):
        np.divide(values, grid, out=values)
        np.rint(values, out=values)
        np.multiply(values, grid, out=values)
        return values
    return float(np.rint(values / grid) * grid)


@contextlib.contextmanager
def observe_releases() -> Iterator[list[tuple[np.ndarray, float]]]:
    """Record ``(released value, noise std)`` of every release made inside the block.

    For audits and tests: every mechanism forms its releases with
    :func:`dpprecond.noise.release`, so the list holds, in order, exactly what a run
    released (an attacker's view of it), whatever entry point made them. Thread- and
    context-local (a ``contextvars`` variable).
    """
    seen: list[tuple[np.ndarray, float]] = []
    token = _OBSERVERS.set((*_OBSERVERS.get(), seen))
    try:
        yield seen
    finally:
        _OBSERVERS.reset(token)
