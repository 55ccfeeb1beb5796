"""``PartitionArrivalTrigger``: the triggerer's wait for a raw partition's ``_SUCCESS``, woken
by the partition's announcement (``recpipe.arrivals``, Redis pub/sub through the connection of
apache-airflow-providers-redis) and looking for the marker every ``recheck_s`` as well, so a
message published before the subscription, or a Redis that is down, costs at most one look's
delay and never the pass."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from recpipe.arrivals import CHANNEL
from recpipe.redis_conn import read_password

log = logging.getLogger(__name__)


class PartitionArrivalTrigger(BaseTrigger):
    """Fires once ``marker`` exists, or when ``timeout_s`` has passed.

    Args:
        marker: the partition's ``_SUCCESS`` (absolute path).
        redis_conn_id: an Airflow connection of type ``redis`` (host, port, password, extra
            ``db``) whose ``recpipe:partitions`` channel announces partitions.
        recheck_s: seconds between looks for the marker without a message (> 0).
        timeout_s: seconds from the trigger's start to give up (the sensor's ``timeout``).

    Events: ``{"status": "complete", "marker", "waited_s", "woken_by"}`` (``message``, ``look``
    or ``start``) or ``{"status": "timeout", "marker", "waited_s"}``.
    """

    def __init__(self, marker: str, redis_conn_id: str, recheck_s: float, timeout_s: float):
        super().__init__()
        self.marker, self.redis_conn_id = marker, redis_conn_id
        self.recheck_s, self.timeout_s = float(recheck_s), float(timeout_s)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "marker": self.marker,
                "redis_conn_id": self.redis_conn_id,
                "recheck_s": self.recheck_s,
                "timeout_s": self.timeout_s,
            },
        )

    async def _subscribe(self):
        """A client and its pub/sub subscribed to ``CHANNEL`` on the connection's Redis, or
        (None, None), logged."""
        import redis.asyncio as aioredis
        from airflow.providers.redis.hooks.redis import RedisHook
        from asgiref.sync import sync_to_async
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff

        try:
            conn = await sync_to_async(RedisHook.get_connection)(self.redis_conn_id)
            password, password_file = conn.password, conn.extra_dejson.get("password_file")
            if not password and password_file:  # a deployment's secret file, not the connection
                password = read_password(password_file, f"connection {self.redis_conn_id}'s password_file")
            client = aioredis.Redis(
                host=conn.host or "127.0.0.1",
                port=conn.port or 6379,
                username=conn.login or None,
                password=password or None,
                db=int(conn.extra_dejson.get("db") or 0),
                socket_connect_timeout=5,
                retry=Retry(NoBackoff(), 0),  # no Redis: fall back to the looks at once
            )
            pubsub = client.pubsub(ignore_subscribe_messages=True)
            await pubsub.subscribe(CHANNEL)
            return client, pubsub
        except Exception as err:  # no connection or no Redis: the looks still find the marker
            log.warning(
                "no arrival messages from connection %r (%s): looking for %s every %g s",
                self.redis_conn_id, err, self.marker, self.recheck_s,
            )  # fmt: skip
            return None, None

    async def run(self):
        start = time.monotonic()
        client, pubsub = await self._subscribe()  # subscribed before the first look: none is missed
        woken_by = "start"
        try:
            while True:
                waited = time.monotonic() - start
                if os.path.exists(self.marker):
                    yield TriggerEvent(
                        {
                            "status": "complete",
                            "marker": self.marker,
                            "waited_s": waited,
                            "woken_by": woken_by,
                        }
                    )
                    return
                if waited >= self.timeout_s:
                    yield TriggerEvent({"status": "timeout", "marker": self.marker, "waited_s": waited})
                    return
                wait = min(self.recheck_s, self.timeout_s - waited)
                woken_by = "look"
                if pubsub is None:
                    await asyncio.sleep(wait)
                    continue
                try:
                    message = await pubsub.get_message(timeout=wait)
                except Exception as err:  # Redis went away: go on looking
                    log.warning("arrival messages lost (%s): looking every %g s", err, self.recheck_s)
                    pubsub = None
                    continue
                if message is not None:
                    woken_by = "message"  # any partition's: the look below tells whether it is ours
        finally:
            if client is not None:
                await client.aclose()
