"""A raw partition's arrival: ``recpipe announce`` publishes it on Redis, and the deferred
``RawPartitionSensor``'s trigger (``PartitionArrivalTrigger``) wakes on the message, or finds
the marker by its own looks when the message was missed or Redis is gone; the real Redis on
127.0.0.1:6379 and the provider's connection (the scheduler-level run: tests/dags/test_stream_days.py)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import threading
import time

import pytest

from recpipe.layout import SUCCESS
from tests.support import RECPIPE, ROOT


@pytest.fixture
def arrivals(monkeypatch):
    monkeypatch.setenv(
        "AIRFLOW_CONN_TEST_ARRIVALS", json.dumps({"conn_type": "redis", "host": "127.0.0.1", "port": 6379})
    )
    monkeypatch.setenv(
        "AIRFLOW_CONN_TEST_NO_REDIS", json.dumps({"conn_type": "redis", "host": "127.0.0.1", "port": 1})
    )


def _first_event(trigger, during=None):
    """The trigger's first event and the seconds it took; ``during`` runs in a thread meanwhile."""

    async def first():
        async for event in trigger.run():
            return event.payload

    if during is not None:
        threading.Thread(target=during, daemon=True).start()
    start = time.monotonic()
    return asyncio.run(first()), time.monotonic() - start


def test_an_announced_partition_wakes_the_wait_at_once(arrivals, tmp_path):
    from operators.triggers import PartitionArrivalTrigger

    partition = tmp_path / "ds=1997-09-22" / "hh=1715"
    marker = partition / SUCCESS
    trigger = PartitionArrivalTrigger(str(marker), "test_arrivals", recheck_s=60, timeout_s=60)

    import redis

    from recpipe.arrivals import CHANNEL

    client = redis.Redis(host="127.0.0.1", port=6379)
    others = client.pubsub_numsub(CHANNEL)[0][1]  # another test's waits may listen too

    def land():
        # once the trigger has subscribed (it looks first, right after subscribing), however
        # long a loaded machine takes to start it; a second at the least
        started = time.monotonic()
        while client.pubsub_numsub(CHANNEL)[0][1] <= others and time.monotonic() - started < 30:
            time.sleep(0.05)
        time.sleep(max(0.5, 1.0 - (time.monotonic() - started)))
        partition.mkdir(parents=True)
        marker.touch()
        done = subprocess.run(
            [*RECPIPE, "announce", str(partition)], capture_output=True, text=True, cwd=ROOT, timeout=60
        )
        assert done.returncode == 0, done.stderr

    event, took = _first_event(trigger, land)
    # the looks come every 60 s: only the message can have ended the wait this soon
    assert event["status"] == "complete" and event["woken_by"] == "message" and took < 30, (event, took)
    assert event["marker"] == str(marker)


def test_a_missed_message_or_no_redis_is_caught_by_the_looks(arrivals, tmp_path):
    from operators.triggers import PartitionArrivalTrigger

    marker = tmp_path / "ds=1997-09-22" / SUCCESS
    marker.parent.mkdir()
    marker.touch()  # landed (and announced) before the wait began
    event, _ = _first_event(PartitionArrivalTrigger(str(marker), "test_arrivals", 60, 60))
    assert (event["status"], event["woken_by"]) == ("complete", "start")
    later = tmp_path / "ds=1997-09-23" / SUCCESS
    trigger = PartitionArrivalTrigger(str(later), "test_no_redis", recheck_s=0.2, timeout_s=60)

    def land():
        time.sleep(3)  # after the trigger's first look (its subscription fails first)
        later.parent.mkdir()
        later.touch()  # never announced, and there is no Redis to announce on

    event, took = _first_event(trigger, land)
    assert (event["status"], event["woken_by"]) == ("complete", "look") and took < 20


def test_a_partition_that_never_lands_fails_the_sensor_naming_it(arrivals, tmp_path):
    from airflow.sdk.exceptions import AirflowSensorTimeout

    from operators.sensors import RawPartitionSensor
    from operators.triggers import PartitionArrivalTrigger

    marker = str(tmp_path / "ds=1997-09-22" / SUCCESS)
    event, _ = _first_event(PartitionArrivalTrigger(marker, "test_arrivals", recheck_s=0.1, timeout_s=0.3))
    assert event["status"] == "timeout"
    sensor = RawPartitionSensor(
        task_id="wait", filepath=marker, arrivals_conn_id="test_arrivals", timeout=0.3
    )
    with pytest.raises(AirflowSensorTimeout, match=f"{marker} is missing"):
        sensor.arrived({}, event)


def test_announcing_an_incomplete_partition_is_refused(tmp_path):
    done = subprocess.run(
        [*RECPIPE, "announce", str(tmp_path)], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert done.returncode == 2 and f"{tmp_path}: no _SUCCESS" in done.stderr


def test_the_stream_pages_announce_runs_as_written(tmp_path):
    # docs/stream.md's two lines, in a folder where the partition's files were written
    import redis

    from tests.support import doc_commands, run_doc_commands

    test = "tests/operators/test_arrivals.py::test_the_stream_pages_announce_runs_as_written"
    partition = tmp_path / "data/raw/my_stream/events/ds=2024-01-01/hh=0915"
    partition.mkdir(parents=True)
    (partition / "part-0.parquet").write_bytes(b"rows")
    pubsub = redis.Redis(host="127.0.0.1", port=6379).pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe("recpipe:partitions")
    try:
        pubsub.get_message(timeout=5)  # the subscription's confirmation: subscribed from here on
        env = {**os.environ, "RECPIPE_ARRIVALS_REDIS_URL": "redis://127.0.0.1:6379/0"}
        done = run_doc_commands(doc_commands("stream.md", test), tmp_path, env)
        deadline, message = time.monotonic() + 10, None
        while message is None and time.monotonic() < deadline:
            message = pubsub.get_message(timeout=1)
    finally:
        pubsub.close()
    assert "announced (1 waiting)" in done.stdout
    assert (partition / SUCCESS).exists()
    assert message is not None and message["data"].decode() == str(partition.resolve())
