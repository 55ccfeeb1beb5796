"""The command line's parser and argument types: one line on stderr and exit 2 for any bad
flag or value (``recpipe.errors``' policy), naming the flag and what it allows.

``argparse`` prints its usage block before the error; a user (and a log) needs the one line:
``<prog>: usage error: argument --rows: a whole number >= 1, not '-5' (<prog> --help)``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import re
import sys
from collections.abc import Callable

from recpipe.errors import EXIT_USAGE

# EasyRec's dotted overrides, --section.field=value: never a flag of a parser
_DOTTED = re.compile(r"--[A-Za-z_]\w*\.[^=\s]*=")


class ArgumentParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose errors are one line (subparsers inherit it), and
    whose ``parse_known_args`` leaves every ``--section.field=value`` override to the extras
    whatever its value holds (argparse takes an argument with a space, as in
    ``--model_config.deepfm.dnn.hidden_units='[64, 32]'``, for a positional)."""

    def error(self, message: str):  # noqa: D102 - argparse's hook
        print(f"{self.prog}: usage error: {message} (see {self.prog} --help)", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)

    def parse_known_args(self, args=None, namespace=None):  # noqa: D102 - argparse's
        args = list(sys.argv[1:] if args is None else args)
        dotted = [a for a in args if _DOTTED.match(a)]
        known, extra = super().parse_known_args([a for a in args if not _DOTTED.match(a)], namespace)
        return known, [*extra, *dotted]


def at_least(low: int) -> Callable[[str], int]:
    """An argument type: a whole number >= ``low``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < low:
            raise argparse.ArgumentTypeError(f"a whole number >= {low}, not {text!r}")
        return value

    parse.__name__ = f"whole number >= {low}"
    return parse


def day(text: str) -> str:
    """An argument type: a day that exists, ``YYYY-MM-DD``."""
    try:
        return dt.date.fromisoformat(text).isoformat() if len(text) == 10 else _bad_day(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"a day YYYY-MM-DD that exists, not {text!r} ({err})") from None


def _bad_day(text: str) -> str:
    raise ValueError("write YYYY-MM-DD")
