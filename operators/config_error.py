"""The retrain configs that do not load, as an import error of the DAG file that builds the
deployment's DAGs (``dags/recpipe_retrain.py``): the other models' DAGs are built and keep
scheduling, and the Airflow UI lists the error (Import Errors) with each broken file named."""

from __future__ import annotations

from pathlib import Path

from airflow.sdk import DAG

from recpipe.config.errors import ConfigError


class UnloadableConfigs(DAG):
    """Stands for the configs that failed to load. Airflow's DAG processor validates every DAG
    a file defines before it keeps it (``DagBag.process_file``); this one's validation raises
    :class:`ConfigError` naming each file and its error, which Airflow records as the DAG
    file's import error while it keeps the file's other DAGs. It is never scheduled or shown.

    Args:
        errors: ``[(config path, the error it raised)]``, at least one.
    """

    def __init__(self, errors: list[tuple[Path, Exception]]):
        super().__init__(dag_id="recpipe_unloadable_configs", schedule=None)
        self.config_errors = [(str(path), str(err)) for path, err in errors]

    def message(self) -> str:
        """Each broken file and its error, one paragraph per file."""
        count = len(self.config_errors)
        head = f"{count} retrain config{'s' if count > 1 else ''} did not load; the others' DAGs did"
        return "\n\n".join([head, *(f"{path}:\n{err}" for path, err in self.config_errors)])

    def validate(self) -> None:
        """Raises:
        ConfigError: always, with :meth:`message`."""
        raise ConfigError(self.message())
