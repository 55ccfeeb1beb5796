"""A retrain DAG's own settings (``conf/retrain/*.yaml``, one file a DAG): its kind, id,
schedule and pool, training window, checks, promotion gate, retention and tracking. The model
itself stays in the pipeline config and the resources in the cluster config, as PaddleRec
keeps them apart."""

from __future__ import annotations

import os
import re
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import Field, field_validator, model_validator

from recpipe.config.base import Section
from recpipe.config.errors import ConfigError
from recpipe.config.loader import read_yaml, validate


class SensorConfig(Section):
    """Waiting for the day's raw partition (``_SUCCESS``).

    ``mode: reschedule`` frees the worker slot between pokes; ``deferrable`` hands the wait to
    the triggerer. Times in seconds.
    """

    mode: str = Field("reschedule", pattern="^(poke|reschedule)$")
    """``reschedule`` frees the worker slot between pokes; ``poke`` holds it."""
    deferrable: bool = False
    """Hand the wait to Airflow's triggerer instead (``mode`` then does not apply)."""
    poke_interval_s: float = Field(300, gt=0)
    """Seconds between looks for the partition's ``_SUCCESS``."""
    timeout_s: float = Field(6 * 3600, gt=0)
    """Seconds after which the sensor fails, naming the missing path."""
    arrivals_conn_id: str | None = None
    """An Airflow connection (type ``redis``) on whose ``recpipe:partitions`` channel
    ``recpipe announce`` publishes complete partitions: the wait is the triggerer's and ends on
    the message, within seconds of the partition landing (it still looks every
    ``poke_interval_s``); null: poke by ``mode``."""


class ValidationConfig(Section):
    """Checks of the day's features (``_stats.json``): failing ones stop the run, drift warns.

    ``drift_tolerance``: a relative change (0.25 = 25 %) of rows, positive rate, a column's
    null share or a dense feature's mean against the previous prepared day, above which a
    warning goes to the log and to MLflow.
    """

    min_rows: int = Field(1, ge=1)
    """Fewest feature rows a day (or pass) may have; fewer fails ``validate_features``."""
    positive_rate_min: float = Field(0.0, ge=0.0, le=1.0)
    """Lowest share of positive labels allowed (0-1)."""
    positive_rate_max: float = Field(1.0, ge=0.0, le=1.0)
    """Highest share of positive labels allowed (0-1)."""
    drift_tolerance: float = Field(0.25, gt=0.0)
    """Relative change against the previous prepared day above which drift warns (0.25 = 25 %)."""
    drift_lookback_days: int = Field(7, ge=1)
    """How many days back to look for the previous prepared day."""

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
    """The metric compared: ``auc``, ``gauc``, or a task's (``<task>/auc``)."""
    guard_tasks: list[str] = Field(default_factory=list)
    """Tasks of a multi-task model whose AUC may not drop by more than ``tolerance`` either."""
    tolerance: float = Field(0.002, ge=0.0)
    """How much worse (absolute metric) a significantly different new model may be and still
    be promoted."""
    min_metric: float = Field(0.5, ge=0.0, le=1.0)
    """A floor: a new model below it is never promoted."""
    min_positives: int = Field(30, ge=0)
    """Fewer held-out positives than this makes the comparison inconclusive."""
    min_negatives: int = Field(30, ge=0)
    """Fewer held-out negatives than this makes the comparison inconclusive."""
    confidence: float = Field(0.95, gt=0.0, lt=1.0)
    """Confidence level of DeLong's paired test (0-1, exclusive)."""
    inconclusive: str = Field("keep_champion", pattern="^(keep_champion|promote)$")
    """What an inconclusive comparison does: ``keep_champion`` or ``promote``."""
    alias: str = "champion"
    """The registered model's alias the gate moves."""
    window_days: int = Field(1, ge=1)
    """Days of held-out rows both models are scored on (the day's and the ones before)."""
    max_inconclusive_days: int = Field(14, ge=0)
    """Inconclusive days in a row after which the gate fails loudly (``GateStuckError``;
    0: never)."""
    approval: Literal["off", "required"] = "off"
    """``required``: a person approves each promotion in the Airflow UI (Human-in-the-loop
    task ``approve_promotion``) before the alias moves."""
    approval_timeout_s: float = Field(24 * 3600, gt=0)
    """Seconds to wait for that answer; none by then keeps the champion."""


class TimeoutConfig(Section):
    """Each task's ``execution_timeout`` in seconds: ``tasks`` by task id, else ``default_s``.

    A job task's launcher stops the whole job (every process tree) shortly before, so a hung
    collective fails the task with a clear error and its retry can start, instead of holding
    the worker slot for ever.
    """

    default_s: float = Field(3600, gt=0)
    """Seconds a task may run when ``tasks`` does not name it."""
    tasks: dict[str, float] = Field(default_factory=lambda: {"train": 6 * 3600, "prepare_features": 2 * 3600})
    """Seconds by task id (``train``, ``prepare_features``, ``wait_for_pass``, ...)."""

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
    """The MLflow experiment (null: ``model_name``)."""
    mlflow_conn_id: str = "mlflow_default"
    """The Airflow connection of the MLflow tracking server."""
    retries: int = Field(2, ge=0)
    """Retries of each task of a scheduled run (a by-hand run: none)."""
    retry_delay_s: float = Field(60, ge=0)
    """Seconds between a task's tries."""


class NotificationConfig(Section):
    """Who hears about the DAG's runs: e-mail through Airflow's ``SmtpNotifier`` (the SMTP
    provider) on the connection ``smtp_conn_id``, to ``to`` (none: nobody), ``on`` these
    events: ``failure`` (any task, a stuck gate's ``GateStuckError`` included), ``promotion``
    and ``rejection`` (the gate's decision, with its reason), ``approval`` (a promotion
    waiting for a person, ``gate.approval: required``)."""

    to: list[str] = Field(default_factory=list)
    """Recipients' addresses (empty: nobody is mailed)."""
    smtp_conn_id: str = "smtp_default"
    """The Airflow SMTP connection mail goes through."""
    from_email: str = "recpipe@localhost"
    """The sender's address."""
    on: list[Literal["failure", "promotion", "rejection", "approval"]] = Field(
        default_factory=lambda: ["failure", "promotion", "rejection", "approval"]
    )
    """The events that send mail."""


class StreamConfig(Section):
    """The intraday retrain (``recpipe_stream_retrain``): one pass an hour (or every
    ``pass_minutes``), a base export at the day's first trained pass, a delta after every other
    one, pushed to the online store.

    ``redis_url``: the Redis embedding store the exports are pushed to (``recpipe.
    online_store``), or null for no push. ``close_hour``: the hour whose last pass closes the
    day: the day's model is exported whole, registered and gated (``gate``); 23: the day's last.
    """

    redis_url: str | None = "redis://127.0.0.1:6379/0"
    """The Redis the exports are pushed to, ``redis://host:port/db`` without a password (null: no
    push). A deployment's connection ``recpipe_store`` or ``$RECPIPE_REDIS_URL`` wins; a
    password goes there."""

    @field_validator("redis_url")
    @classmethod
    def _no_password(cls, value: str | None) -> str | None:
        from recpipe.redis_conn import parse, url_password

        if value is not None:
            if url_password(value) is not None:
                raise ValueError(
                    "holds a password, which the DAG would show in the UI: put it in the Airflow "
                    "connection recpipe_store (or $RECPIPE_REDIS_URL) and give redis://host:port/db here"
                )
            parse(value, "stream.redis_url")
        return value

    close_hour: int = Field(23, ge=0, le=23)
    """The UTC hour whose last pass closes the day: whole export, registration, gate (0-23)."""
    cold_start_from: str | None = Field(None, pattern=r"^[A-Za-z0-9_.-]+$")
    """The ``model_name`` of another retrain config (a daily model of the same pipeline
    config) whose champion a pass fine-tunes from when this model has nothing to start from:
    no champion and no promoted version yet (a new stream), or none dated before the pass.
    What the two models share by name (the dense layers, tables of the same kind and shape)
    is restored and the rest reported (``fine_tune.json``); null: such a pass starts from
    scratch."""
    pass_minutes: int = 60
    """Minutes of data a pass trains on (60, 30, 20, 15, 10 or 5: a pass never spans two
    hours). A pass of an hour is named ``HH`` (raw ``ds=D/hh=HH``), a shorter one by its start,
    ``HHMM`` (``ds=D/hh=HHMM``)."""

    @field_validator("pass_minutes")
    @classmethod
    def _divides_the_hour(cls, value: int) -> int:
        from recpipe.layout import PASS_MINUTES

        if value not in PASS_MINUTES:
            raise ValueError(f"{value}: a pass lasts one of {list(PASS_MINUTES)} minutes")
        return value


class BatchPredictConfig(Section):
    """A partition the champion scores each day after the gate (``recpipe predict``'s flags,
    EasyRec's names). Paths are relative to the project home and templated (``{{ ds }}``)."""

    input_path: str
    """The rows to score, e.g. ``data/candidates/ds={{ ds }}`` (CSV or Parquet)."""
    output_path: str
    """Where the scores go, e.g. ``data/scores/<model_name>/ds={{ ds }}``: a day's own
    directory, so it must hold ``{{ ds }}`` or ``{{ ds_nodash }}`` (a re-run replaces only its
    own earlier output, ``recpipe.outputs``)."""
    reserved_cols: str = "ALL_COLUMNS"
    """Input columns copied beside the scores: ``ALL_COLUMNS``, a comma-separated list, or ``""``."""
    output_cols: str = "ALL_COLUMNS"
    """Outputs and their types: ``ALL_COLUMNS`` or ``"probs double,logits float"``."""
    batch_size: int = Field(1024, gt=0)
    """Rows per call of the model."""
    output_format: Literal["csv", "parquet"] | None = None
    """``csv`` or ``parquet`` (null: the input's)."""
    input_sep: str | None = None
    """A CSV input's separator (null: the pipeline's ``data_config.separator``)."""
    with_header: bool | None = None
    """Whether a CSV input has a header line (null: the pipeline's ``data_config.with_header``)."""

    @field_validator("output_path")
    @classmethod
    def _a_day_of_its_own(cls, value: str) -> str:
        if not re.search(r"\{\{\s*ds(_nodash)?\s*\}\}", value):
            raise ValueError(
                "must hold {{ ds }} or {{ ds_nodash }}: each day's scores in a directory of their own"
            )
        return value


class RetrainConfig(Section):
    """One daily retrain: which pipeline, from when, with which window and rules.

    Paths are relative to the project home. Day ``ds`` trains on ``[ds - training_window_days
    + 1, ds]`` (its held-out rows excluded), fine-tuning from the last successful day's model
    dir under ``runs_dir`` unless the run asks for ``full_retrain``.
    """

    pipeline_config_path: str
    """The pipeline config (``conf/*.yaml``) the DAG trains, relative to the project home."""
    cluster_config_path: str = "conf/cluster/local.yaml"
    """The cluster config its jobs run on."""
    model_name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    """The registered model, and the key of everything the model writes (dirs, experiment,
    Redis keys)."""
    kind: Literal["daily", "stream"] = "daily"
    """``daily``: one run a day; ``stream``: one pass a run, exported as deltas and pushed."""
    dag_id: str | None = Field(None, pattern=r"^[A-Za-z0-9_.-]+$")
    """The DAG's id (null: ``<model_name>_<kind>``)."""
    schedule: str | None = None
    """A preset (``@daily``, ``@hourly``, ...) or a cron expression in ``timezone`` (null:
    ``@daily``, or ``@hourly`` for a stream)."""
    timezone: str = "UTC"
    """The IANA time zone of the schedule and of ``start_date`` / ``end_date``."""
    start_date: date
    """The first day the DAG runs for (its midnight in ``timezone``)."""
    end_date: date | None = None
    """The last (null: none)."""
    catchup: bool = False
    """Whether the scheduler runs the days missed since ``start_date``."""
    max_active_runs: int = Field(1, ge=1)
    """Runs at a time (a stream's must be 1: a pass continues from the one before)."""
    owner: str = "recpipe"
    """The DAG's owner in the Airflow UI."""
    tags: list[str] = Field(default_factory=list)
    """Tags of the DAG in the Airflow UI (``recpipe`` and ``model_name`` are added)."""
    pool: str | None = None
    """The Airflow pool whose slots the job tasks (train, evaluations, exports) take (null:
    ``default_pool``)."""
    pool_slots: int = Field(1, ge=1)
    """Slots each job task takes."""
    priority_weight: int = 1
    """Priority of this model's tasks when a pool is full."""
    training_window_days: int = Field(7, ge=1)
    """Day ``ds`` trains on ``[ds - training_window_days + 1, ds]``."""
    retention_days: int = Field(7, ge=1)
    """Days of model dirs kept under ``runs_dir`` (the champion's always)."""
    retention_champions: int = Field(2, ge=0)
    """Former champions whose model dirs and exports retention keeps beyond ``retention_days``:
    the versions ``recpipe champion rollback`` reaches first (``champion show`` lists them)."""
    runs_dir: str = "var/runs"
    """Model dirs: ``<runs_dir>/<model_name>/ds=YYYY-MM-DD[/hh=HH]``."""
    export_dir: str = "var/exports"
    """SavedModels: ``<export_dir>/<model_name>/...``."""
    edit_config_json: dict = Field(default_factory=dict)
    """Overrides of the pipeline config for every run (``section.field: value``, EasyRec's
    ``--edit_config_json``); a run's own overrides win."""
    spark_connect_conn_id: str | None = "spark_connect_default"
    """The Spark Connect server the feature job is a session on (null: a ``spark-submit`` on
    ``spark_conn_id``, a JVM per run)."""
    spark_conn_id: str = "spark_default"
    """The Spark connection ``spark-submit`` uses when ``spark_connect_conn_id`` is null."""
    sensor: SensorConfig = Field(default_factory=SensorConfig)
    """Waiting for the day's (or pass's) raw partition."""
    validation: ValidationConfig = Field(default_factory=ValidationConfig)
    """Checks of the prepared features."""
    gate: GateConfig = Field(default_factory=GateConfig)
    """Promotion of the new model over the champion."""
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)
    """MLflow and retries."""
    timeouts: TimeoutConfig = Field(default_factory=TimeoutConfig)
    """Each task's time limit."""
    stream: StreamConfig = Field(default_factory=StreamConfig)
    """The stream's push and close (``kind: stream``)."""
    notifications: NotificationConfig = Field(default_factory=NotificationConfig)
    """Who is mailed about runs and decisions."""
    batch_predict: BatchPredictConfig | None = None
    """A partition the champion scores each day after the gate (null: none; daily DAGs)."""

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
        if self.kind == "stream" and self.schedule is not None and self.stream.pass_minutes != 60:
            _check_pass_schedule(self.schedule, self.stream.pass_minutes)
        if self.kind == "stream" and self.batch_predict is not None:
            raise ValueError(
                "batch_predict: a daily model's task; a stream model's scores come from its store"
            )
        if self.stream.cold_start_from == self.model_name:
            raise ValueError(
                f"stream.cold_start_from: {self.model_name!r} is this model; name another model "
                "(a daily model of the same pipeline config)"
            )
        return self

    @property
    def effective_dag_id(self) -> str:
        """``dag_id``, else ``<model_name>_<kind>``."""
        return self.dag_id or f"{self.model_name}_{self.kind}"

    @property
    def effective_schedule(self) -> str:
        """``schedule``, else ``@daily`` (daily), ``@hourly`` (stream: one pass an hour) or
        ``*/N * * * *`` (a stream's passes of N = ``stream.pass_minutes`` minutes)."""
        if self.schedule or self.kind != "stream":
            return self.schedule or "@daily"
        minutes = self.stream.pass_minutes
        return "@hourly" if minutes == 60 else f"*/{minutes} * * * *"

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


def load_retrain_configs(home) -> tuple[dict[Path, RetrainConfig], dict[Path, str]]:
    """Every retrain config of the deployment (``retrain_config_files``), loaded: ``(the
    configs that load, by file; the ones that do not, by file, each with its error)``. Configs
    that share a ``dag_id`` or a ``model_name`` all fail, whatever their files' names, each
    error naming the others: ``model_name`` keys the model dirs, exports, registered model and
    store keys, so two DAGs of one name would train, gate and push over each other, and no file
    name should decide which of them is the model. Never raises for a bad file: one model's
    broken config must not hide the others."""
    loaded: dict[Path, RetrainConfig] = {}
    broken: dict[Path, str] = {}
    for path in retrain_config_files(home):
        try:
            loaded[path] = load_retrain_config(path)
        except ConfigError as err:
            broken[path] = str(err)
        except Exception as err:  # noqa: BLE001 - whatever it is, the other models keep their DAGs
            broken[path] = f"{path}: {type(err).__name__}: {err}"
    for field, key in (("dag_id", lambda r: r.effective_dag_id), ("model_name", lambda r: r.model_name)):
        owners: dict[str, list[Path]] = {}
        for path, retrain in loaded.items():
            owners.setdefault(key(retrain), []).append(path)
        for value, paths in owners.items():
            if len(paths) < 2:
                continue
            for path in paths:
                others = ", ".join(str(p) for p in paths if p != path)
                broken.setdefault(
                    path,
                    f"{path}: {field} {value!r} is also {others}'s: a model's dirs, registered model and "
                    "store keys are its name's, so none of them runs; give each its own",
                )
    return {p: r for p, r in loaded.items() if p not in broken}, broken


def _check_pass_schedule(schedule: str, pass_minutes: int) -> None:
    """A stream's own schedule must fire at pass starts only: a run's logical date names its
    pass (``recpipe.layout.pass_key_format``).

    Raises:
        ValueError: a preset, or a cron time that starts no pass of ``pass_minutes``.
    """
    from croniter import croniter

    if schedule.startswith("@"):
        raise ValueError(f"schedule {schedule!r}: passes of {pass_minutes} minutes need a cron expression")
    fires = croniter(schedule, datetime(2000, 1, 1))
    for _ in range(1440 // pass_minutes):
        at = fires.get_next(datetime)
        if at.minute % pass_minutes or at.second:
            raise ValueError(
                f"schedule {schedule!r} fires at {at:%H:%M}, which starts no pass of "
                f"stream.pass_minutes {pass_minutes}"
            )
