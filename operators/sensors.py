"""``RawPartitionSensor``: wait for a day's raw partition to be complete (its ``_SUCCESS``)."""

from __future__ import annotations

from airflow.providers.standard.sensors.filesystem import FileSensor
from airflow.sdk.exceptions import AirflowSensorTimeout


class RawPartitionSensor(FileSensor):
    """Airflow's ``FileSensor`` on ``<raw_input_path>/ds=<ds>/_SUCCESS``, whose timeout
    names the missing path (the stock message gives only the durations).

    Use ``mode="reschedule"`` (the worker slot is freed between pokes) or
    ``deferrable=True`` (the triggerer polls). The path is absolute, so the ``fs_default``
    connection's base path must be empty or ``/``.

    Raises:
        AirflowSensorTimeout: after ``timeout`` seconds without the marker.
    """

    def execute(self, context) -> None:
        try:
            super().execute(context)
        except AirflowSensorTimeout as err:
            raise AirflowSensorTimeout(
                f"raw partition not complete after {self.timeout:.0f} s: {self.path} is missing "
                "(the upstream log export has not finished this day)"
            ) from err
