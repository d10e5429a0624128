"""One BLAS thread for a block of code, without rescanning the loaded libraries each time.

``threadpoolctl.threadpool_limits`` inspects every loaded shared library on each call
(2.6-6 ms measured), which dominated small PCA selections and short federated runs; a
``ThreadpoolController`` built once and reused makes the limit cost microseconds.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from functools import lru_cache
from typing import Any

__all__ = ["serial_blas"]


@lru_cache(maxsize=1)
def _controller() -> Any:
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()


def serial_blas() -> AbstractContextManager[Any]:
    """A context in which BLAS runs on one thread (restored on exit)."""
    return _controller().limit(limits=1, user_api="blas")
