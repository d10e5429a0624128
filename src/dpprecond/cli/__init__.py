"""The ``dpprecond`` command line: ``pca``, ``fl``, ``demo`` (and more as they land).

Each sub-command lives in its own module exposing ``register(subparsers)``; this module only
assembles them. Library code never prints; printing happens here and in those modules.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import sys
import traceback
import warnings
from collections.abc import Sequence

from dpprecond import __version__

__all__ = ["build_parser", "main"]

#: Sub-command modules, in the order of ``dpprecond --help``.
SUBCOMMANDS = ("dpprecond.cli.pca", "dpprecond.cli.fl", "dpprecond.cli.demo",
               "dpprecond.cli.experiment")


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser (all sub-commands registered)."""
    from dpprecond.cli.errors import Parser
    from dpprecond.cli.options import add

    parser = Parser(
        prog="dpprecond",
        description="Differentially private learning with cheap preconditioners.")
    parser.add_argument("--version", action="version", version=f"dpprecond {__version__}")
    add(parser, "verbose")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMANDS:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``dpprecond`` console script."""
    from dpprecond.cli.errors import leaf_parser, user_message

    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    level = [logging.WARNING, logging.INFO, logging.DEBUG][min(args.verbose, 2)]
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    from dpprecond.accounting import PrivacyBudgetExceededError

    prog = leaf_parser(parser, args).prog

    def one_line(message: Warning | str, category: type[Warning], filename: str,
                 lineno: int, line: str | None = None) -> str:
        # a warning is one line in the user's terms (not a file, a line number and a class)
        text = user_message(str(message), leaf_parser(parser, args), argv)
        return f"{prog}: warning: {text}\n"

    plain_format = warnings.formatwarning
    try:
        with contextlib.ExitStack() as stack:
            stack.callback(setattr, warnings, "formatwarning", plain_format)
            warnings.formatwarning = one_line
            return int(args.func(args) or 0)
    except (ValueError, TypeError, OSError, ImportError, PrivacyBudgetExceededError) as exc:
        # Bad input gets a clear one-line message, not a traceback (-v shows it).
        if args.verbose:
            traceback.print_exc()
        # in the user's terms: the flags typed, not the library's parameter names
        text = user_message(str(exc), leaf_parser(parser, args), argv)
        print(f"{prog}: error: {text}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"dpprecond {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # a bug: say so, and show the traceback with -v
        if args.verbose:
            raise
        print(f"dpprecond {args.command}: unexpected error {type(exc).__name__}: {exc} "
              "(rerun with -v for the traceback, and please report it)", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
