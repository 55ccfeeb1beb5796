"""A retrain DAG's own settings (``conf/retrain/*.yaml``, one file a DAG): its kind, id,
schedule and pool, training window, checks, promotion gate, retention and tracking. The model
itself stays in the pipeline config and the resources in the cluster config, as PaddleRec
keeps them apart."""

from __future__ import annotations

import os
from datetime import date, timedelta
from pathlib import Path
from typing import Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import Field, field_validator, model_validator

from recpipe.config.base import Section
from recpipe.config.loader import read_yaml, validate


class SensorConfig(Section):
    """Waiting for the day's raw partition (``_SUCCESS``).

    ``mode: reschedule`` frees the worker slot between pokes; ``deferrable`` hands the wait to
    the triggerer. Times in seconds.
    """

    mode: str = Field("reschedule", pattern="^(poke|reschedule)$")
    deferrable: bool = False
    poke_interval_s: float = Field(300, gt=0)
    timeout_s: float = Field(6 * 3600, gt=0)


class ValidationConfig(Section):
    """Checks of the day's features (``_stats.json``): failing ones stop the run, drift warns.

    ``drift_tolerance``: a relative change (0.25 = 25 %) of rows, positive rate, a column's
    null share or a dense feature's mean against the previous prepared day, above which a
    warning goes to the log and to MLflow.
    """

    min_rows: int = Field(1, ge=1)
    positive_rate_min: float = Field(0.0, ge=0.0, le=1.0)
    positive_rate_max: float = Field(1.0, ge=0.0, le=1.0)
    drift_tolerance: float = Field(0.25, gt=0.0)
    drift_lookback_days: int = Field(7, ge=1)

    @model_validator(mode="after")
    def _bounds(self) -> ValidationConfig:
        if self.positive_rate_min > self.positive_rate_max:
            raise ValueError("positive_rate_min is above positive_rate_max")
        return self


class GateConfig(Section):
    """Promotion (``operators/gate.py``): never a metric that is not finite or is below
    ``min_metric`` (0.5: an AUC no better than chance). Against a champion scored on the same
    rows, DeLong's paired test of the AUC difference at ``confidence``: too few held-out
    labels (``min_positives`` / ``min_negatives``) or no significant difference is
    inconclusive, and ``inconclusive`` decides (``keep_champion`` or ``promote``); a
    significant difference promotes unless the new model is worse by more than ``tolerance``.
    ``gauc`` is compared by ``tolerance`` alone.

    ``window_days``: both models are scored on the held-out rows of the last this-many days,
    not the day's alone, so that days with few positives (rare clicks) pool into a test with
    power; the daily DAG keeps every one of those rows out of training, so neither model
    trained on them. ``max_inconclusive_days``: that many inconclusive days in a row fail
    the gate's task loudly (0: never), instead of keeping a stale champion for ever.

    A multi-task model (``model_config.task_towers``): ``metric`` may name a task,
    ``<task>/auc``, whose rows the paired test then reads; ``guard_tasks`` refuses a
    promotion that loses more than ``tolerance`` of the metric on any of those tasks."""

    metric: str = Field("auc", pattern=r"^([A-Za-z][A-Za-z0-9_]*/)?(auc|gauc)$")
    guard_tasks: list[str] = Field(default_factory=list)
    tolerance: float = Field(0.002, ge=0.0)
    min_metric: float = Field(0.5, ge=0.0, le=1.0)
    min_positives: int = Field(30, ge=0)
    min_negatives: int = Field(30, ge=0)
    confidence: float = Field(0.95, gt=0.0, lt=1.0)
    inconclusive: str = Field("keep_champion", pattern="^(keep_champion|promote)$")
    alias: str = "champion"
    window_days: int = Field(1, ge=1)
    max_inconclusive_days: int = Field(14, ge=0)
    # required: a person approves each promotion the gate decides (Airflow's Human-in-the-loop
    # task, approve_promotion); no answer within approval_timeout_s keeps the champion
    approval: Literal["off", "required"] = "off"
    approval_timeout_s: float = Field(24 * 3600, gt=0)


class TimeoutConfig(Section):
    """Each task's ``execution_timeout`` in seconds: ``tasks`` by task id, else ``default_s``.

    A job task's launcher stops the whole job (every process tree) shortly before, so a hung
    collective fails the task with a clear error and its retry can start, instead of holding
    the worker slot for ever.
    """

    default_s: float = Field(3600, gt=0)
    tasks: dict[str, float] = Field(default_factory=lambda: {"train": 6 * 3600, "prepare_features": 2 * 3600})

    def of(self, task_id: str):
        """The ``timedelta`` for ``task_id``."""

        return timedelta(seconds=self.tasks.get(task_id, self.default_s))

    @model_validator(mode="after")
    def _positive(self) -> TimeoutConfig:
        bad = {k: v for k, v in self.tasks.items() if not v > 0}
        if bad:
            raise ValueError(f"timeouts must be positive seconds: {bad}")
        return self


class TrackingConfig(Section):
    """MLflow: the experiment (default: the registered model's name, ``model_name``: one
    experiment per registered model, so a daily DAG's days and a stream's passes of the same
    pipeline config stay apart), the Airflow
    connection naming the server, and how often a task retries when it is unreachable."""

    experiment: str | None = None
    mlflow_conn_id: str = "mlflow_default"
    retries: int = Field(2, ge=0)
    retry_delay_s: float = Field(60, ge=0)


class NotificationConfig(Section):
    """Who hears about the DAG's runs: e-mail through Airflow's ``SmtpNotifier`` (the SMTP
    provider) on the connection ``smtp_conn_id``, to ``to`` (none: nobody), ``on`` these
    events: ``failure`` (any task, a stuck gate's ``GateStuckError`` included), ``promotion``
    and ``rejection`` (the gate's decision, with its reason), ``approval`` (a promotion
    waiting for a person, ``gate.approval: required``)."""

    to: list[str] = Field(default_factory=list)
    smtp_conn_id: str = "smtp_default"
    from_email: str = "recpipe@localhost"
    on: list[Literal["failure", "promotion", "rejection", "approval"]] = Field(
        default_factory=lambda: ["failure", "promotion", "rejection", "approval"]
    )


class StreamConfig(Section):
    """The intraday retrain (``recpipe_stream_retrain``): one pass an hour, a base export at the
    day's first trained pass, a delta after every other one, pushed to the online store.

    ``redis_url``: the Redis embedding store the exports are pushed to (``recpipe.
    online_store``), or null for no push. ``close_hour``: the pass (UTC hour) after which the
    day's model is exported whole, registered and gated (``gate``); 23: the day's last.
    """

    redis_url: str | None = "redis://127.0.0.1:6379/0"
    close_hour: int = Field(23, ge=0, le=23)


class RetrainConfig(Section):
    """One daily retrain: which pipeline, from when, with which window and rules.

    Paths are relative to the project home. Day ``ds`` trains on ``[ds - training_window_days
    + 1, ds]`` (its held-out rows excluded), fine-tuning from the last successful day's model
    dir under ``runs_dir`` unless the run asks for ``full_retrain``.
    """

    pipeline_config_path: str
    cluster_config_path: str = "conf/cluster/local.yaml"
    model_name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    # the DAG: daily (one run a day) or stream (one pass a run, recpipe_stream_retrain's tasks)
    kind: Literal["daily", "stream"] = "daily"
    dag_id: str | None = Field(None, pattern=r"^[A-Za-z0-9_.-]+$")
    # a preset (@daily, @hourly, ...) or a cron expression; default @daily / @hourly by kind
    schedule: str | None = None
    timezone: str = "UTC"
    start_date: date
    end_date: date | None = None
    catchup: bool = False
    max_active_runs: int = Field(1, ge=1)
    owner: str = "recpipe"
    tags: list[str] = Field(default_factory=list)
    # the Airflow pool the model's job tasks take slots of (None: default_pool), how many
    # each, and their priority among the models that share the pool
    pool: str | None = None
    pool_slots: int = Field(1, ge=1)
    priority_weight: int = 1
    training_window_days: int = Field(7, ge=1)
    retention_days: int = Field(7, ge=1)
    runs_dir: str = "var/runs"
    export_dir: str = "var/exports"
    edit_config_json: dict = Field(default_factory=dict)
    # the feature job: a session on this Spark Connect server (conn type spark_connect), or
    # with null a spark-submit on spark_conn_id (a JVM per run)
    spark_connect_conn_id: str | None = "spark_connect_default"
    spark_conn_id: str = "spark_default"
    sensor: SensorConfig = Field(default_factory=SensorConfig)
    validation: ValidationConfig = Field(default_factory=ValidationConfig)
    gate: GateConfig = Field(default_factory=GateConfig)
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)
    timeouts: TimeoutConfig = Field(default_factory=TimeoutConfig)
    stream: StreamConfig = Field(default_factory=StreamConfig)
    notifications: NotificationConfig = Field(default_factory=NotificationConfig)

    @field_validator("schedule")
    @classmethod
    def _schedule(cls, value: str | None) -> str | None:
        from croniter import croniter

        presets = {"@once", "@hourly", "@daily", "@weekly", "@monthly", "@quarterly", "@yearly"}
        if value is not None and value not in presets and not croniter.is_valid(value):
            raise ValueError(f"{value!r} is neither a cron expression nor one of {sorted(presets)}")
        return value

    @field_validator("timezone")
    @classmethod
    def _timezone(cls, value: str) -> str:
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"{value!r} is not an IANA time zone (e.g. UTC, Asia/Shanghai)") from None
        return value

    @model_validator(mode="after")
    def _one_pass_at_a_time(self) -> RetrainConfig:
        if self.kind == "stream" and self.max_active_runs != 1:
            raise ValueError("max_active_runs: a stream's pass continues from the one before: it must be 1")
        if self.end_date is not None and self.end_date < self.start_date:
            raise ValueError(f"end_date {self.end_date} is before start_date {self.start_date}")
        return self

    @property
    def effective_dag_id(self) -> str:
        """``dag_id``, else ``<model_name>_<kind>``."""
        return self.dag_id or f"{self.model_name}_{self.kind}"

    @property
    def effective_schedule(self) -> str:
        """``schedule``, else ``@daily`` (daily) or ``@hourly`` (stream: one pass an hour)."""
        return self.schedule or ("@hourly" if self.kind == "stream" else "@daily")

    def with_run_edits(self, run_edits: dict | None) -> dict:
        """``edit_config_json`` of a run: this config's overrides (where data live, the daily
        schedule's epochs), then the run's own (Params or trigger conf), which win."""
        return {**self.edit_config_json, **(run_edits or {})}

    @property
    def experiment(self) -> str:
        """The MLflow experiment: ``tracking.experiment`` or the registered model's name."""

        return self.tracking.experiment or self.model_name


# where a deployment's retrain configs are: a folder (every *.yaml in it a DAG) or one file
RETRAIN_CONFIGS_VARIABLE = "RECPIPE_RETRAIN_CONFIGS"
RETRAIN_CONFIGS_DEFAULT = "conf/retrain"
# the config the manual DAG recpipe_train takes its defaults from
TRAIN_CONFIG_VARIABLE, TRAIN_CONFIG_DEFAULT = "RECPIPE_TRAIN_CONFIG", "conf/retrain/movielens_daily.yaml"


def retrain_config_files(home) -> list[Path]:
    """The deployment's retrain configs: every ``*.yaml`` / ``*.yml`` in the folder
    ``$RECPIPE_RETRAIN_CONFIGS`` names (relative to ``home`` or absolute; default
    ``conf/retrain``), in name order, or the one file it names."""
    where = Path(home) / os.environ.get(RETRAIN_CONFIGS_VARIABLE, RETRAIN_CONFIGS_DEFAULT)
    if where.is_file():
        return [where]
    return sorted(p for p in where.glob("*") if p.suffix in (".yaml", ".yml") and p.is_file())


def train_dag_config(home) -> RetrainConfig:
    """The retrain config whose pipeline and cluster configs ``recpipe_train`` (by hand)
    defaults to: ``$RECPIPE_TRAIN_CONFIG`` (default ``conf/retrain/movielens_daily.yaml``).

    Raises:
        ConfigError: as ``load_retrain_config``.
    """
    return load_retrain_config(Path(home) / os.environ.get(TRAIN_CONFIG_VARIABLE, TRAIN_CONFIG_DEFAULT))


def load_retrain_config(path) -> RetrainConfig:
    """Load ``conf/retrain/*.yaml``.

    Raises:
        ConfigError: unreadable file or invalid value (file + field named).
    """

    return validate(RetrainConfig, read_yaml(path), str(path))
