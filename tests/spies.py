"""Spies the secure-aggregation tests share: where each Skellam share's (and each public
draw's) randomness came from, and what a ClientApp raised."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest


def share_sources(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Patch ``secagg.sums.skellam_noise``; the returned list gets the type name of the
    generator of every share drawn from then on (one client message, one share)."""
    import dpprecond.secagg.sums as sums

    kinds: list[str] = []
    real = sums.skellam_noise

    def noise(lam: float, size: int, rng: Any) -> Any:
        kinds.append(type(rng).__name__)
        return real(lam, size, rng)

    monkeypatch.setattr(sums, "skellam_noise", noise)
    return kinds


def public_draw_sources(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Patch ``pca.remote_secure._generator``; the returned list gets the type name of the
    generator of every public draw of a secure fit over a network (one client, one
    ``secure-public`` request) from then on."""
    import dpprecond.pca.remote_secure as remote_secure

    kinds: list[str] = []
    real = remote_secure._generator

    def generator(state: Any, key: str, seed: Any, secure: bool, *spawn_key: int) -> Any:
        gen = real(state, key, seed, secure, *spawn_key)
        if key.startswith("public-"):
            kinds.append(type(gen).__name__)
        return gen

    monkeypatch.setattr(remote_secure, "_generator", generator)
    return kinds


def recording_app(inner: Callable[[Any, Any], Any]) -> tuple[Callable[[Any, Any], Any],
                                                             list[str]]:
    """``inner`` (a ClientApp) wrapped so that every exception it raises on a message is
    recorded (and raised again); returns the wrapper and the list of messages."""
    errors: list[str] = []

    def recording(message: Any, context: Any) -> Any:
        try:
            return inner(message, context)
        except Exception as exc:
            errors.append(str(exc))
            raise

    return recording, errors
