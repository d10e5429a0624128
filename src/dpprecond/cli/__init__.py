"""The ``dpprecond`` command line: ``pca``, ``fl``, ``demo`` (and more as they land).

Each sub-command lives in its own module exposing ``register(subparsers)``; this module only
assembles them. Library code never prints; printing happens here and in those modules.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

from dpprecond import __version__

__all__ = ["build_parser", "main"]

#: Sub-command modules, in the order of ``dpprecond --help``.
SUBCOMMANDS = ("dpprecond.cli.pca", "dpprecond.cli.fl", "dpprecond.cli.demo",
               "dpprecond.cli.experiment")


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser (all sub-commands registered)."""
    parser = argparse.ArgumentParser(
        prog="dpprecond",
        description="Differentially private learning with cheap preconditioners.")
    parser.add_argument("--version", action="version", version=f"dpprecond {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="log more (-v info, -vv debug)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMANDS:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:  # a sub-command whose module is not built
            if exc.name != name:
                raise
            continue
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``dpprecond`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    level = [logging.WARNING, logging.INFO, logging.DEBUG][min(args.verbose, 2)]
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except (ValueError, TypeError, FileNotFoundError, ImportError) as exc:
        # Bad input gets a clear one-line message, not a traceback.
        print(f"dpprecond {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
