"""The noise-and-release primitive: draws, layouts, snapping, observation, errors."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from dpprecond.noise import NoiseSource, gaussian, keyed_stream, release, symmetric_gaussian
from dpprecond.secure import SecureGenerator, observe_releases


def test_sources_satisfy_the_protocol() -> None:
    assert isinstance(np.random.default_rng(0), NoiseSource)
    assert isinstance(SecureGenerator(), NoiseSource)
    assert not isinstance(object(), NoiseSource)


def test_gaussian_is_std_times_standard_normal() -> None:
    a, b = np.random.default_rng(3), np.random.default_rng(3)
    assert np.array_equal(gaussian((4, 2), 0.7, a), 0.7 * b.standard_normal((4, 2)))


def test_scalar_draw_matches_generator_normal() -> None:
    a, b = np.random.default_rng(5), np.random.default_rng(5)
    x = release(2.5, 0.3, a)
    assert isinstance(x, float)
    assert x == 2.5 + b.normal(0.0, 0.3)


def test_zero_std_draws_nothing() -> None:
    rng = np.random.default_rng(1)
    state = rng.bit_generator.state
    assert np.array_equal(gaussian((3,), 0.0, rng), np.zeros(3))
    assert np.array_equal(symmetric_gaussian(3, 0.0, rng), np.zeros((3, 3)))
    v = np.arange(3.0)
    out = release(v, 0.0, rng)
    assert np.array_equal(out, v) and out is not v
    assert rng.bit_generator.state == state


@pytest.mark.parametrize("draws", ["square", "triangle"])
def test_symmetric_layouts(draws: str) -> None:
    d, std = 5, 1.3
    W = symmetric_gaussian(d, std, np.random.default_rng(7), draws=draws)  # type: ignore[arg-type]
    ref = np.random.default_rng(7)
    if draws == "square":  # a (d, d) draw, upper triangle kept, scaled after mirroring
        w = np.triu(ref.standard_normal((d, d)))
        expected = (w + np.triu(w, 1).T) * std
    else:  # d (d + 1) / 2 draws in row-major upper-triangle order
        iu = np.triu_indices(d)
        E = np.zeros((d, d))
        E[iu] = std * ref.standard_normal(len(iu[0]))
        expected = E + np.triu(E, 1).T
    assert np.array_equal(W, expected)
    assert np.array_equal(W, W.T)


def test_release_adds_the_noise_of_the_value_shape() -> None:
    S = np.eye(4)
    out = release(S, 0.5, np.random.default_rng(2), symmetric=True)
    assert np.array_equal(out, S + symmetric_gaussian(4, 0.5, np.random.default_rng(2)))
    assert np.array_equal(S, np.eye(4))  # not modified
    v = np.ones(6)
    assert np.array_equal(release(v, 0.5, np.random.default_rng(2)),
                          v + 0.5 * np.random.default_rng(2).standard_normal(6))


def test_release_with_given_noise_draws_nothing() -> None:
    rng = np.random.default_rng(0)
    state = rng.bit_generator.state
    noise = np.array([0.25, -1.0])
    assert np.array_equal(release(np.ones(2), 1.0, rng, noise=noise), np.ones(2) + noise)
    assert rng.bit_generator.state == state


def test_secure_release_is_snapped_and_observed() -> None:
    std = 3.0
    grid = math.ldexp(1.0, math.floor(math.log2(std)) - 24)
    with observe_releases() as seen:
        out = release(np.full(50, 1 / 3), std, SecureGenerator())
        plain = release(np.full(2, 1 / 3), std, np.random.default_rng(0))
    assert np.array_equal(out / grid, np.rint(out / grid))
    assert not np.all(np.isclose(out, 1 / 3))
    assert len(seen) == 2 and seen[0][1] == std
    assert np.array_equal(seen[0][0], out) and np.array_equal(seen[1][0], plain)


class _Batch:
    """A batch source: ``n`` draws per call (a leading axis)."""

    def __init__(self, n: int) -> None:
        self.rng, self.n = np.random.default_rng(0), n

    def standard_normal(self, size: Any = None) -> np.ndarray:
        shape = () if size is None else tuple(np.atleast_1d(size))
        return self.rng.standard_normal((self.n, *shape))


def test_batch_source_broadcasts() -> None:
    out = release(np.zeros(3), 1.0, _Batch(10))
    assert out.shape == (10, 3)


@pytest.mark.parametrize("std", [-1.0, math.inf, math.nan])
def test_bad_std_is_named(std: float) -> None:
    with pytest.raises(ValueError, match="std="):
        release(np.zeros(2), std, np.random.default_rng(0))


def test_symmetric_needs_a_square_value() -> None:
    with pytest.raises(ValueError, match="square value"):
        release(np.zeros((2, 3)), 1.0, np.random.default_rng(0), symmetric=True)
    with pytest.raises(ValueError, match="draws="):
        symmetric_gaussian(2, 1.0, np.random.default_rng(0), draws="cube")  # type: ignore[arg-type]


def test_keyed_stream() -> None:
    a = keyed_stream(11, 2, 3).standard_normal(4)
    b = np.random.default_rng(np.random.SeedSequence(11, spawn_key=(2, 3))).standard_normal(4)
    assert np.array_equal(a, b)
    assert not np.array_equal(a, keyed_stream(11, 3, 2).standard_normal(4))
    with pytest.raises(ValueError, match="key\\[0\\]=-1"):
        keyed_stream(1, -1)
    with pytest.raises(ValueError, match="seed=True"):
        keyed_stream(True)


def test_release_asks_is_secure_at_call_time(release_spy: object) -> None:
    release(np.zeros(2), 1.0, SecureGenerator())
    release(np.zeros(2), 1.0, np.random.default_rng(0))
    assert release_spy.calls == [True, False]  # type: ignore[attr-defined]
