"""The base of the errors a user can act on (bad data, missing partitions, checkpoints)."""

from __future__ import annotations


class PipelineError(RuntimeError):
    """A job cannot go on with the data, files or checkpoints it was given; the message names them.

    Command-line tools print these as one line and exit non-zero, without a traceback.
    """
