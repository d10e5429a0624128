"""The one place that checks that Flower is installed (before anything imports it)."""

from __future__ import annotations

MIN_FLWR = (1, 42)


def require_flwr() -> None:
    """Raise ``ImportError`` naming the ``flower`` extra if flwr is missing or too old."""
    try:
        import flwr  # noqa: F401
    except ImportError as exc:
        raise ImportError("dpprecond.adapters.flower needs Flower (flwr >= 1.42, the Message "
                          "API): pip install 'dpprecond[flower]'") from exc
    from importlib.metadata import PackageNotFoundError, version

    try:
        found = version("flwr")
    except PackageNotFoundError:  # pragma: no cover - a vendored flwr without metadata
        return
    parts = tuple(int(p) for p in found.split(".")[:2] if p.isdigit())
    if parts < MIN_FLWR:
        raise ImportError(f"dpprecond.adapters.flower needs flwr >= 1.42 (the Message API), "
                          f"found flwr {found}: pip install -U 'dpprecond[flower]'")
