"""MLflow tracking and registry for the operators, as an Airflow hook (the project's own: the
only Airflow-MLflow provider on the index is unmaintained).

Where the tracking server is, in order: the Airflow connection ``mlflow_default`` (its
``extra.tracking_uri``, or ``http://host:port``), ``$MLFLOW_TRACKING_URI``, else a SQLite
database ``<var>/mlflow/mlflow.db`` with artifacts in ``<var>/mlflow/artifacts``.

One nested run per task attempt under the DAG run's parent run: ``log_task_run`` is what every
operator's tracking goes through.
"""

# Imports inside functions: MLflow and requests are imported when the hook first talks to the
# server, never at a DAG file's parse.

from __future__ import annotations

import json
import logging
import os
import subprocess
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowNotFoundException

from operators.paths import project_home, var_dir
from recpipe import jsonl
from recpipe.home import default_tracking_uri

log = logging.getLogger(__name__)
PARENT = "parent"
# MLflow 3's UI opens an experiment of this kind on its runs table (model training), not on
# the GenAI traces overview
EXPERIMENT_KIND_TAG, EXPERIMENT_KIND = "mlflow.experimentKind", "custom_model_development"
# the parent run's label (``ds=YYYY-MM-DD [hh=HH]``): its nested runs' names lead with it
LABEL_TAG = "recpipe.label"


class TrackingUnavailableError(RuntimeError):
    """The MLflow tracking server cannot be reached; the message names its URI."""


def flatten(doc: Any, prefix: str = "") -> dict[str, str]:
    """A nested config dict -> ``{"train_config.num_steps": "500", "a.b.0.c": "x"}`` (list
    items by index: MLflow param names allow no brackets)."""
    out: dict[str, str] = {}
    if isinstance(doc, dict):
        for key, value in doc.items():
            out.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    elif isinstance(doc, list) and any(isinstance(v, (dict, list)) for v in doc):
        for i, value in enumerate(doc):
            out.update(flatten(value, f"{prefix}.{i}"))
    else:
        out[prefix] = str(doc)
    return out


def git_commit() -> str:
    """The project's commit (``$RECPIPE_GIT_COMMIT`` in images without .git), or "unknown"."""
    if os.environ.get("RECPIPE_GIT_COMMIT"):
        return os.environ["RECPIPE_GIT_COMMIT"]
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=project_home(), capture_output=True, text=True, timeout=10
        )
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


def jsonl_metrics(path: Path, prefix: str = "") -> list[tuple[str, float, int]]:
    """``(prefix + key, value, step)`` rows of a ``{"step": s, key: value, ...}`` JSON-lines file
    (``train_metrics.jsonl``, ``eval_history.jsonl``); none if the file does not exist.

    A resumed job logs again the steps between its last checkpoint and the crash: each step
    is taken once, from its last line (the run that went on). A line torn by a killed
    process is skipped with a warning, so it never fails the task's retries.
    """

    by_step = {int(e["step"]): e for e in jsonl.read(path) if isinstance(e.get("step"), (int, float))}
    rows = ((step, k, v) for step, entry in sorted(by_step.items()) for k, v in entry.items())
    return [(prefix + k, v, step) for step, k, v in rows if k != "step"]


class MLflowHook(BaseHook):
    """Experiments, parent / nested runs, metrics and the model registry.

    Args:
        mlflow_conn_id: Airflow connection naming the tracking server (optional: without it,
            ``$MLFLOW_TRACKING_URI`` or the local SQLite store).
        check_reachable: probe an HTTP server's ``/health`` first, so an outage fails the task
            at once with a clear message (the task's ``retries`` decide what happens next)
            instead of MLflow's own retry loop.
    """

    conn_name_attr = "mlflow_conn_id"
    default_conn_name = "mlflow_default"
    conn_type = "http"
    hook_name = "MLflow"

    def __init__(self, mlflow_conn_id: str = default_conn_name, check_reachable: bool = True):
        super().__init__()
        self.mlflow_conn_id = mlflow_conn_id
        self.check_reachable = check_reachable
        self._client = None

    # -- connection -----------------------------------------------------------------------
    def tracking_uri(self) -> str:
        """The tracking URI (see the module docstring for the order)."""
        conn = self._connection()
        if conn is not None:
            extra = conn.extra_dejson or {}
            if extra.get("tracking_uri"):
                return extra["tracking_uri"]
            scheme = conn.schema or "http"
            return f"{scheme}://{conn.host}" + (f":{conn.port}" if conn.port else "")
        return default_tracking_uri()

    def artifact_root(self) -> str | None:
        """Artifact root for new experiments on a local store; None lets a server decide."""
        uri = self.tracking_uri()
        if uri.startswith(("sqlite:", "postgresql", "mysql", "file:")) or "://" not in uri:
            return (var_dir() / "mlflow" / "artifacts").as_uri()
        return None

    def _connection(self):
        if not self.mlflow_conn_id:
            return None

        # only "not defined" falls through to the next source: any other error (a secrets
        # backend or the API server down) is raised, since falling back to the local registry
        # then would register and promote into the wrong one
        try:
            return self.get_connection(self.mlflow_conn_id)
        except AirflowNotFoundException:
            return None

    def get_client(self):
        """An ``mlflow.MlflowClient`` for the tracking URI (created once).

        Raises:
            TrackingUnavailableError: an HTTP tracking server does not answer ``/health``.
        """
        if self._client is None:
            from mlflow import MlflowClient

            uri = self.tracking_uri()
            if self.check_reachable and uri.startswith(("http://", "https://")):
                self._probe(uri)
            if uri.startswith("sqlite:///"):
                self._client = _sqlite_client(uri, Path(uri.removeprefix("sqlite:///")))
            else:
                self._client = MlflowClient(tracking_uri=uri, registry_uri=uri)
        return self._client

    @staticmethod
    def _probe(uri: str) -> None:
        from recpipe import tracking

        try:
            tracking.probe(uri, timeout_s=10)
        except tracking.TrackingUnavailableError as err:
            raise TrackingUnavailableError(
                f"MLflow tracking server {uri} is unreachable ({err.reason}); "
                "nothing was logged. Start it (make mlflow) or fix the mlflow_default connection / "
                "MLFLOW_TRACKING_URI; the task fails now so that its retries can log later."
            ) from err

    # -- runs -------------------------------------------------------------------------------
    def experiment_id(self, name: str) -> str:
        """The experiment ``name``, created (with the local artifact root) if missing, of the
        model-training kind (``EXPERIMENT_KIND_TAG``; an older experiment gets the tag)."""
        client = self.get_client()
        exp = client.get_experiment_by_name(name)
        if exp is not None:
            if exp.tags.get(EXPERIMENT_KIND_TAG) != EXPERIMENT_KIND:
                client.set_experiment_tag(exp.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
            return exp.experiment_id
        from mlflow.exceptions import MlflowException

        root = self.artifact_root()
        location = f"{root}/{name}" if root else None
        try:
            return client.create_experiment(
                name, artifact_location=location, tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND}
            )
        except MlflowException as err:  # another task created it meanwhile (a DAG beside this one)
            if err.error_code != "RESOURCE_ALREADY_EXISTS" or client.get_experiment_by_name(name) is None:
                raise
            return client.get_experiment_by_name(name).experiment_id

    def parent_run(
        self,
        experiment: str,
        dag_id: str,
        run_id: str,
        tags: dict[str, str],
        create: bool = True,
        name: str | None = None,
    ) -> str | None:
        """The parent run of a DAG run: found by its (dag_id, run_id) tags, or created (None
        when none exists and not ``create``), named ``name`` (``run_name``: the day first)."""
        client = self.get_client()
        exp_id = self.experiment_id(experiment)
        found = client.search_runs(
            [exp_id],
            filter_string=(
                f"tags.`airflow.dag_id` = '{dag_id}' and tags.`airflow.run_id` = '{run_id}' "
                f"and tags.`recpipe.step` = '{PARENT}'"
            ),
            max_results=1,
        )
        if found:
            return found[0].info.run_id
        if not create:
            return None
        name = name or f"{dag_id} {run_id}"
        label = name.rsplit(" ", 1)[0] if name.startswith("ds=") else name
        run = client.create_run(
            exp_id,
            run_name=name,
            tags={
                "airflow.dag_id": dag_id,
                "airflow.run_id": run_id,
                "recpipe.step": PARENT,
                LABEL_TAG: label,
                **tags,
            },
        )
        return run.info.run_id

    def day_run(self, experiment: str, dag_id: str, day: str, create: bool = True) -> str | None:
        """The run holding a day's per-pass series of a DAG (tags ``airflow.dag_id``,
        ``recpipe.step`` = ``day``, ``ds``), named ``ds=<day> passes``: found or created (None
        when none exists and not ``create``). Its metrics are logged with the pass's hour as
        step, so the UI draws one curve a day; it runs until the day's close ends it."""
        client = self.get_client()
        exp_id = self.experiment_id(experiment)
        found = client.search_runs(
            [exp_id],
            filter_string=(
                f"tags.`airflow.dag_id` = '{dag_id}' and tags.`recpipe.step` = 'day' and tags.ds = '{day}'"
            ),
            max_results=1,
        )
        if found:
            return found[0].info.run_id
        if not create:
            return None
        tags = {"airflow.dag_id": dag_id, "recpipe.step": "day", "ds": day}
        return client.create_run(exp_id, run_name=f"ds={day} passes", tags=tags).info.run_id

    def child_run(self, parent_run_id: str, step: str, tags: dict[str, str] | None = None) -> str:
        """A new nested run (one per task attempt, so a failed attempt stays visible), named
        after the parent's day: ``ds=YYYY-MM-DD [hh=HH] <step>``."""
        client = self.get_client()
        parent = client.get_run(parent_run_id)
        label = parent.data.tags.get(LABEL_TAG)
        run = client.create_run(
            parent.info.experiment_id,
            run_name=f"{label} {step}" if label else step,
            tags={"mlflow.parentRunId": parent_run_id, "recpipe.step": step, **(tags or {})},
        )
        return run.info.run_id

    @contextmanager
    def nested_run(self, parent_run_id: str, step: str, tags: dict[str, str] | None = None) -> Iterator[str]:
        """A ``child_run`` that ends FINISHED when the block completes, FAILED if it raises."""
        run = self.child_run(parent_run_id, step, tags)
        try:
            yield run
        except BaseException:
            self.end_run(run, failed=True)
            raise
        self.end_run(run)

    def log_task_run(
        self,
        parent_run_id: str,
        step: str,
        *,
        tags: dict[str, Any] | None = None,
        params: dict[str, Any] | None = None,
        metrics: Iterable[tuple[str, float, int]] = (),
        parent_metrics: Iterable[tuple[str, float, int]] = (),
        parent_tags: dict[str, Any] | None = None,
        artifacts: Iterable[tuple[str | os.PathLike, str | None]] = (),
        datasets: Iterable[dict[str, str]] = (),
    ) -> str:
        """One task attempt's nested run under ``parent_run_id``, ended FINISHED (FAILED if
        logging raises): its tags, params, ``(key, value, step)`` metrics, dataset inputs
        (``{"name", "digest", "source"}``, see ``log_dataset``) and artifacts (``(path,
        artifact_path)``; paths that do not exist are skipped), and what the task adds to the
        parent run. Returns the nested run's id."""
        with self.nested_run(parent_run_id, step, {k: str(v) for k, v in (tags or {}).items()}) as run:
            if params:
                self.log_params(run, params)
            for dataset in datasets:
                self.log_dataset(run, dataset["name"], dataset["digest"], dataset["source"])
            self.log_metrics(run, metrics)
            self.log_metrics(parent_run_id, parent_metrics)
            if parent_tags:
                self.set_tags(parent_run_id, parent_tags)
            for path, artifact_path in artifacts:
                if Path(path).exists():
                    self.log_artifact(run, path, artifact_path)
        return run

    def ui_url(self) -> str | None:
        """Where people open MLflow's UI: the connection's ``extra.ui_url`` (the published
        address, where the tracking URI is a compose-internal host), else an HTTP tracking
        URI; None for a database store (no UI)."""
        conn = self._connection()
        if conn is not None and (conn.extra_dejson or {}).get("ui_url"):
            return conn.extra_dejson["ui_url"].rstrip("/")
        uri = self.tracking_uri()
        return uri.rstrip("/") if uri.startswith(("http://", "https://")) else None

    def run_link(self, run_id: str) -> str | None:
        """A run's page in MLflow's model-training view (``ui_url``), or None without a UI."""
        from recpipe.runs.compare import experiment_link

        ui = self.ui_url()
        if ui is None:
            return None
        experiment = self.get_client().get_run(run_id).info.experiment_id
        base, query = experiment_link(ui, experiment).split("?", 1)
        return f"{base}/runs/{run_id}?{query}"

    def end_run(self, run_id: str, failed: bool = False) -> None:
        """Mark a run FINISHED (or FAILED) and log its page's link (``run_link``)."""
        self.get_client().set_terminated(run_id, "FAILED" if failed else "FINISHED")
        link = self.run_link(run_id)
        if link is not None:
            self.log.info("MLflow run: %s", link)

    def log_params(self, run_id: str, params: dict[str, Any]) -> None:
        """Log params in batches of 100 (MLflow's limit); values cut to 6,000 characters."""
        from mlflow.entities import Param

        items = [Param(k[:250], str(v)[:6000]) for k, v in params.items()]
        for i in range(0, len(items), 100):
            self.get_client().log_batch(run_id, params=items[i : i + 100])

    def log_metrics(self, run_id: str, rows: Iterable[tuple[str, float, int]]) -> int:
        """Log ``(key, value, step)`` rows in batches; returns how many were logged."""

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        items = [Metric(k, float(v), now, int(s)) for k, v, s in rows]
        for i in range(0, len(items), 1000):
            self.get_client().log_batch(run_id, metrics=items[i : i + 1000])
        return len(items)

    def log_dataset(
        self, run_id: str, name: str, digest: str, source_uri: str, context: str = "evaluation"
    ) -> None:
        """Log a dataset as an input of ``run_id`` (the run's Datasets in the UI): ``name`` and
        ``digest`` are what metrics logged with ``dataset_name`` / ``dataset_digest`` link to;
        the source is the local path ``source_uri`` (source type ``local``, as ``mlflow.data``
        records a local file); ``context`` is the ``mlflow.data.context`` input tag. Logging
        the same dataset twice keeps one input."""

        from mlflow.entities import Dataset, DatasetInput, InputTag

        source = json.dumps({"uri": source_uri})
        dataset = Dataset(name=name, digest=digest, source_type="local", source=source)
        tags = [InputTag("mlflow.data.context", context)]
        self.get_client().log_inputs(run_id, [DatasetInput(dataset, tags)])

    def set_tags(self, run_id: str, tags: dict[str, Any]) -> None:
        for key, value in tags.items():
            self.get_client().set_tag(run_id, key, str(value))

    def log_artifact(self, run_id: str, path: str | os.PathLike, artifact_path: str | None = None) -> None:
        """Log a file, or a directory's contents, under ``artifact_path``."""
        path = Path(path)
        if path.is_dir():
            self.get_client().log_artifacts(run_id, str(path), artifact_path)
        else:
            self.get_client().log_artifact(run_id, str(path), artifact_path)

    def artifact_uri(self, run_id: str, artifact_path: str) -> str:
        return self.get_client().get_run(run_id).info.artifact_uri.rstrip("/") + "/" + artifact_path

    # -- registry ---------------------------------------------------------------------------
    def champion(self, model_name: str, alias: str = "champion"):
        """The registered version holding ``alias``, or None when the registered model or the
        alias does not exist (``recpipe.registry.current``).

        Raises:
            MlflowException: any other error (server down, database error): a failed read is
                never taken for "no champion", which would promote anything.
        """
        from recpipe.registry import current

        return current(self.get_client(), model_name, alias)

    def versions(self, model_name: str, tags: dict[str, str] | None = None) -> list:
        """The versions of ``model_name`` whose tags include ``tags``, newest first ([] when
        the model does not exist; ``recpipe.registry.versions``)."""
        from recpipe.registry import versions

        return versions(self.get_client(), model_name, tags)

    def log_model(self, run_id: str, name: str, local_dir: str | os.PathLike, params: dict[str, Any]):
        """An MLflow 3 ``LoggedModel`` of ``run_id``'s experiment holding the MLflow Model in
        ``local_dir``: created, its artifacts uploaded, then READY (FAILED if the upload
        fails). Returns it (``model_id``, ``artifact_location``)."""
        client = self.get_client()
        experiment_id = client.get_run(run_id).info.experiment_id
        model = client.create_logged_model(
            experiment_id, name=name, source_run_id=run_id, params={k: str(v) for k, v in params.items()}
        )
        try:
            client.log_model_artifacts(model.model_id, str(local_dir))
        except BaseException:
            client.finalize_logged_model(model.model_id, "FAILED")
            raise
        return client.finalize_logged_model(model.model_id, "READY")


def _sqlite_client(uri: str, db: Path):
    """A client of a local SQLite ``db``, its tracking and registry stores opened under an
    exclusive file lock: MLflow creates (and migrates) a database's tables on first use, and
    two task processes doing it at once fail ("table logged_models already exists", "expected
    to match one row when updating alembic_version")."""
    import fcntl

    from mlflow import MlflowClient

    db.parent.mkdir(parents=True, exist_ok=True)
    with open(db.with_name(db.name + ".init.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        client = MlflowClient(tracking_uri=uri, registry_uri=uri)
        client.search_experiments(max_results=1)
        client.search_registered_models(max_results=1)
    return client
