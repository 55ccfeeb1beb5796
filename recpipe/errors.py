"""The errors a user can act on, and the exit code every ``recpipe`` command gives them.

Exit codes, one policy for every command (``recpipe ...``, ``python -m trainer.*``,
``spark-submit features/prepare.py``):

- 0: done;
- 2: usage and config errors (``UsageError``, ``recpipe.config.ConfigError`` and its kinds:
  a bad flag, file, field, strategy or model config); argparse exits 2 for bad flags too;
- 1: pipeline errors (``PipelineError``: bad data, missing partitions or checkpoints, a
  failed job), and anything unexpected (with its traceback).
"""

from __future__ import annotations

import logging
import os
import sys
import traceback
from collections.abc import Callable
from typing import NoReturn

from recpipe.config.errors import ConfigError

EXIT_USAGE = 2
EXIT_PIPELINE = 1


class PipelineError(RuntimeError):
    """A job cannot go on with the data, files or checkpoints it was given; the message names them.

    Command-line tools print these as one line and exit 1, without a traceback.
    """


class UsageError(ValueError):
    """A command was called in a way it cannot honour (the message names the flag to change).

    Command-line tools print these as one line and exit 2.
    """


def run_command(fn: Callable[[], int], prog: str = "recpipe") -> int:
    """Run a command's body under the exit-code policy above.

    Returns:
        ``fn()``'s code, or 2 / 1 after printing ``<prog>: <kind>: <message>`` to stderr.
    """

    try:
        return fn()
    except (ConfigError, UsageError, PipelineError) as err:
        return report(err, prog)


def report(err: BaseException, prog: str = "recpipe") -> int:
    """Print ``err`` as the policy above says (one line for the user's errors, the traceback
    for anything else) and return its exit code."""

    if isinstance(err, (ConfigError, UsageError)):
        kind = "config error" if isinstance(err, ConfigError) else "usage error"
        print(f"{prog}: {kind}: {err}", file=sys.stderr)
        return EXIT_USAGE
    if isinstance(err, PipelineError):
        print(f"{prog}: {type(err).__name__}: {err}", file=sys.stderr)
    else:
        traceback.print_exception(err, file=sys.stderr)
    return EXIT_PIPELINE


def exit_now(err: BaseException, prog: str = "recpipe") -> NoReturn:
    """Report ``err`` (see ``report``), flush the logs and end the process at once with its
    exit code, skipping the interpreter's teardown: for a process whose libraries can block
    in their finalizers after a failure (TensorFlow's ``ClusterCoordinator`` waits there on a
    worker it lost), so that its launcher sees it fail instead of hang."""
    code = report(err, prog)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
