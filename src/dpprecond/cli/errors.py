"""Mistakes on the command line, told in the user's own terms.

* :class:`Parser` refuses an unknown argument in the sub-command that received it, with
  that sub-command's usage and the closest flag it has (``--epsilion``: did you mean
  ``--epsilon``?), and exits 2.
* :func:`user_message` rewrites an error of the library (which names its parameters,
  ``target_epsilon``) with the flags the user typed (``--epsilon``), at the CLI boundary.
"""

from __future__ import annotations

import argparse
import difflib
import re
from collections.abc import Sequence
from typing import NoReturn

from dpprecond.cli.options import flag_names

__all__ = ["Parser", "leaf_parser", "suggest_flag", "user_message"]


def _flags(parser: argparse.ArgumentParser) -> list[str]:
    return [flag for action in parser._actions for flag in action.option_strings
            if flag.startswith("--")]


def suggest_flag(parser: argparse.ArgumentParser, unknown: str) -> str | None:
    """The flag of ``parser`` closest to ``unknown`` (difflib), or ``None``."""
    name = unknown.split("=", 1)[0]
    if not name.startswith("-"):
        return None
    if not name.startswith("--"):
        name = "-" + name
    close = difflib.get_close_matches(name, _flags(parser), n=1, cutoff=0.6)
    return close[0] if close else None


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose sub-commands refuse unknown arguments themselves.

    Plain argparse hands a sub-command's unknown arguments up to the top-level parser,
    which prints its own usage; here the sub-command that got them prints its usage and
    the closest flag it has. Sub-parsers inherit the class (``add_subparsers``).
    """

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: argparse.Namespace | None = None,
                         ) -> tuple[argparse.Namespace, list[str]]:
        ns, extras = super().parse_known_args(args, namespace)
        if extras:
            self.unknown(extras)
        return ns, extras

    def unknown(self, extras: list[str]) -> NoReturn:
        """Exit 2 naming the unknown arguments and the closest flags."""
        hints = []
        for item in extras:
            close = suggest_flag(self, item)
            if close is not None:
                hints.append(f"{item.split('=', 1)[0]}: did you mean {close}?")
        what = "argument" if len(extras) == 1 else "arguments"
        text = f"unrecognized {what}: {' '.join(extras)}"
        if hints:
            text += " (" + "; ".join(hints) + ")"
        else:
            text += f" (see {self.prog} --help)"
        self.error(text)


def leaf_parser(parser: argparse.ArgumentParser,
                args: argparse.Namespace) -> argparse.ArgumentParser:
    """The (sub-)sub-command's parser that ``args`` were parsed by."""
    current = parser
    while True:
        subs = [a for a in current._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            return current
        chosen = getattr(args, subs[0].dest or "", None)
        if chosen is None or chosen not in subs[0].choices:
            return current
        current = subs[0].choices[chosen]


def _typed(argv: Sequence[str], flags: tuple[str, ...]) -> str | None:
    """The one of ``flags`` that the user typed in ``argv`` (``--epsilon 1``,
    ``--epsilon=1``, ``-k5``), or ``None``."""
    for item in argv:
        for flag in flags:
            if item == flag or item.startswith(flag + "=") or (
                    not flag.startswith("--") and item.startswith(flag)):
                return flag
    return None


def user_message(message: str, parser: argparse.ArgumentParser,
                 argv: Sequence[str]) -> str:
    """``message`` with the library's parameter names replaced by the flags the user typed.

    ``Expected target_epsilon > 0, got target_epsilon=0.0`` becomes ``Expected --epsilon
    > 0, got --epsilon=0.0`` when the user typed ``--epsilon``. Only the parameters of the
    flags in ``argv`` are replaced: a name given as ``--option NAME=VALUE`` (in ``argv``
    or in the message), or one the user did not set, stays as it is.
    """
    for param, flags in sorted(flag_names(parser).items(), key=lambda kv: -len(kv[0])):
        flag = _typed(argv, flags)
        if flag is None or param == flag.lstrip("-"):
            continue
        message = re.sub(rf"(?<![\w.\-])(?<!--option ){re.escape(param)}(?![\w])", flag,
                         message)
    return message
