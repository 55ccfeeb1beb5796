"""``RawPartitionSensor``: wait for a day's raw partition to be complete (its ``_SUCCESS``)."""

from __future__ import annotations

import os
from datetime import timedelta

from airflow.providers.standard.sensors.filesystem import FileSensor
from airflow.sdk.exceptions import AirflowSensorTimeout

from operators.triggers import PartitionArrivalTrigger


class RawPartitionSensor(FileSensor):
    """Airflow's ``FileSensor`` on ``<raw_input_path>/ds=<ds>/_SUCCESS``, whose timeout
    names the missing path (the stock message gives only the durations).

    Use ``mode="reschedule"`` (the worker slot is freed between pokes) or
    ``deferrable=True`` (the triggerer polls). With ``arrivals_conn_id`` (a ``redis``
    connection) a partition not yet complete is waited for by the triggerer, woken by the
    partition's announcement (``PartitionArrivalTrigger``): the run goes on within a second or
    two of ``recpipe announce``, and looks every ``poke_interval`` all the same. The path is
    absolute, so the ``fs_default`` connection's base path must be empty or ``/``.

    Raises:
        AirflowSensorTimeout: after ``timeout`` seconds without the marker.
    """

    def __init__(self, *, arrivals_conn_id: str | None = None, **kwargs):
        super().__init__(**kwargs)
        self.arrivals_conn_id = arrivals_conn_id

    def execute(self, context) -> None:
        if self.arrivals_conn_id:
            if os.path.exists(self.filepath):  # a backfill, a clear, a late run: no wait
                return
            self.defer(
                trigger=PartitionArrivalTrigger(
                    self.filepath, self.arrivals_conn_id, self.poke_interval, self.timeout
                ),
                method_name="arrived",
                # the trigger ends itself at `timeout`; this only bounds a lost triggerer
                timeout=timedelta(seconds=self.timeout + 2 * self.poke_interval),
            )
        try:
            super().execute(context)
        except AirflowSensorTimeout as err:
            raise self._timed_out() from err

    def arrived(self, context, event: dict) -> None:
        """Resumed from ``PartitionArrivalTrigger``.

        Raises:
            AirflowSensorTimeout: the partition did not arrive within ``timeout``.
        """
        if event.get("status") != "complete":
            raise self._timed_out()
        self.log.info(
            "%s arrived after %.1f s (woken by %s)", event["marker"], event["waited_s"], event["woken_by"]
        )

    def _timed_out(self) -> AirflowSensorTimeout:
        return AirflowSensorTimeout(
            f"raw partition not complete after {self.timeout:.0f} s: {self.filepath} is missing "
            "(the upstream log export has not finished it)"
        )
