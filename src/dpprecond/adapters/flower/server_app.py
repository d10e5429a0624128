"""The Flower ServerApp: builds a :class:`DPFedStrategy` per run and runs it on the Grid."""

from __future__ import annotations

import logging
from collections.abc import Callable

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from dpprecond._validation import check_positive
from dpprecond.adapters.flower.strategy import DPFedStrategy
from dpprecond.fl.engine import FLResult

__all__ = ["make_server_app"]

logger = logging.getLogger(__name__)


def make_server_app(strategy_fn: Callable[[Context], DPFedStrategy], *,
                    round_timeout: float | Callable[[Context], float] = 600.0,
                    on_result: Callable[[FLResult, Context], None] | None = None) -> ServerApp:
    """A ServerApp whose ``main`` runs ``strategy_fn(context)`` for its configured rounds.

    Parameters
    ----------
    strategy_fn : callable
        ``strategy_fn(context) -> DPFedStrategy``: builds the strategy of a run (from the
        run config, or returns a strategy built in Python).
    round_timeout : float or callable, default=600
        Seconds to wait for replies in a round (or ``f(context)``); late clients are left
        out of that round.
    on_result : callable, optional
        ``on_result(result, context)`` after the last round (save, log, ...).
    """
    if not callable(round_timeout):
        check_positive("round_timeout", round_timeout)
    app = ServerApp()

    @app.main()
    def _main(grid: Grid, context: Context) -> None:
        strategy = strategy_fn(context)
        if not isinstance(strategy, DPFedStrategy):
            raise TypeError(f"strategy_fn must return a DPFedStrategy, got "
                            f"{type(strategy).__name__}.")
        timeout = round_timeout(context) if callable(round_timeout) else round_timeout
        result = strategy.run(grid, timeout=timeout)
        logger.info("finished: %d rounds, epsilon=%.4g at delta=%g", len(result.history),
                    result.epsilon, result.delta)
        if on_result is not None:
            on_result(result, context)

    return app
