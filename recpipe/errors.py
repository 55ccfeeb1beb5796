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

import sys
from collections.abc import Callable

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
    from recpipe.config.errors import ConfigError

    try:
        return fn()
    except (ConfigError, UsageError) as err:
        kind = "config error" if isinstance(err, ConfigError) else "usage error"
        print(f"{prog}: {kind}: {err}", file=sys.stderr)
        return EXIT_USAGE
    except PipelineError as err:
        print(f"{prog}: {type(err).__name__}: {err}", file=sys.stderr)
        return EXIT_PIPELINE
