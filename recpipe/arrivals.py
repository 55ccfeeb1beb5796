"""Announcing a complete raw partition: one Redis pub/sub message on ``CHANNEL`` whose data is
the partition's absolute path, published after its ``_SUCCESS`` is written. A stream pass
waiting for that partition (``operators.triggers.PartitionArrivalTrigger``, the deferred
``RawPartitionSensor``) starts on the message instead of at its next look; a message nobody
hears is harmless, as the wait also looks for the marker every ``sensor.poke_interval_s``.
No Airflow here: a log exporter runs ``recpipe announce PARTITION``.
"""

from __future__ import annotations

import os
from pathlib import Path

from recpipe.errors import UsageError
from recpipe.layout import SUCCESS

CHANNEL = "recpipe:partitions"


def announce(client, partition: str | os.PathLike) -> int:
    """Publish that ``partition`` is complete; the number of subscribers that got it.

    Args:
        client: a ``redis.Redis`` (or a Redis URL).
        partition: the partition directory (``.../ds=D[/hh=HH[MM]]``), complete.

    Raises:
        UsageError: the partition has no ``_SUCCESS``: announcing it would start a pass on an
            incomplete partition's wait for nothing.
    """
    import redis

    path = Path(partition).resolve()
    if not (path / SUCCESS).exists():
        raise UsageError(f"{path}: no {SUCCESS}: announce a partition once it is complete")
    if isinstance(client, str):
        client = redis.Redis.from_url(client)
    return int(client.publish(CHANNEL, str(path)))
