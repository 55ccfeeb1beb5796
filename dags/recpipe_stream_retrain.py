"""``recpipe_stream_retrain``: every hour one pass (PaddleRec's online trainer): prepare the
hour's features, score the model as it stands on them (progressive validation), train on
them from the day's previous pass (a day's first pass: from the champion), export the day's
base at its first trained pass and a delta after every other, push it to the Redis embedding
store, keep the newest days' pass dirs.

The pass at ``stream.close_hour`` (23) closes the day as ``recpipe_daily_retrain`` does: the
day's last model is exported (SavedModel, TF Serving layout, and an MLflow Model), registered,
and gated against the ``champion`` on the day's rows, which the day's progressive scores
(``evaluate_day``) and the champion's (``evaluate_champion``) both predicted before training
on them.

Settings come from ``$RECPIPE_STREAM_CONFIG`` (default ``conf/retrain/movielens_stream.yaml``).
A quiet hour (no rows) skips everything after its preparation. Wiring only: the work is in
``operators/``. Parsing this file imports neither TensorFlow nor Spark.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta

from airflow.providers.standard.operators.python import ShortCircuitOperator
from airflow.sdk import DAG, Param

from operators.evaluate import EvalOperator
from operators.export import ExportOperator, export_asset
from operators.feature_job import feature_job, raw_partition_sensor
from operators.paths import project_home
from operators.register import RegisterModelOperator
from operators.retention import RetentionOperator
from operators.stream import (
    DayEvalOperator,
    OnlineStorePushOperator,
    PassExportOperator,
    ProgressiveEvalOperator,
    closes_day,
    pass_has_rows,
)
from operators.tracking import fail_parent_run
from operators.train import DistributedTrainOperator
from recpipe.config import load_pipeline_config
from recpipe.config.retrain import load_retrain_config

HOME = project_home()
STREAM = load_retrain_config(
    HOME / os.environ.get("RECPIPE_STREAM_CONFIG", "conf/retrain/movielens_stream.yaml")
)
PIPELINE = load_pipeline_config(HOME / STREAM.pipeline_config_path, STREAM.edit_config_json).resolved(HOME)
HH = "{{ logical_date.strftime('%H') }}"
PASS = "{{ ds }}/" + HH  # the pass: YYYY-MM-DD/HH
RUNS = f"{STREAM.runs_dir}/{STREAM.model_name}"
MODEL_DIR = RUNS + "/ds={{ ds }}/hh=" + HH
EXPORTS = f"{STREAM.export_dir}/{STREAM.model_name}"
# the deployment's store wins over the config's (docker-compose.yaml sets it)
REDIS_URL = os.environ.get("RECPIPE_REDIS_URL") or STREAM.stream.redis_url
EDITS = "{{ stream.with_run_edits(params.edit_config_json) }}"
EDITS_ARG = "--edit_config_json={{ stream.with_run_edits(params.edit_config_json) | tojson }}"

common = {
    "pipeline_config_path": STREAM.pipeline_config_path,
    "edit_config_json": EDITS,
    "experiment": STREAM.experiment,
    "mlflow_conn_id": STREAM.tracking.mlflow_conn_id,
}
job = {**common, "cluster_config_path": STREAM.cluster_config_path}

with DAG(
    dag_id="recpipe_stream_retrain",
    description=f"hourly passes of {STREAM.model_name} ({STREAM.pipeline_config_path})",
    schedule="@hourly",
    start_date=datetime(*STREAM.start_date.timetuple()[:3], tzinfo=UTC),
    catchup=STREAM.catchup,
    max_active_runs=1,  # a pass continues from the one before
    render_template_as_native_obj=True,
    default_args={
        "retries": STREAM.tracking.retries,
        "retry_delay": timedelta(seconds=STREAM.tracking.retry_delay_s),
        "on_failure_callback": fail_parent_run(STREAM.experiment, STREAM.tracking.mlflow_conn_id),
    },
    params={
        "full_retrain": Param(False, type="boolean", description="train the pass from scratch"),
        "edit_config_json": Param(
            {},
            type="object",
            description="EasyRec overrides (dotted path -> value) on top of the stream config's",
        ),
    },
    user_defined_macros={"stream": STREAM},
    tags=["recpipe", STREAM.model_name, "stream"],
    doc_md=__doc__,
) as dag:
    marker = f"{PIPELINE.raw_input_path}/ds={{{{ ds }}}}/hh={HH}/_SUCCESS"
    wait_for_pass = raw_partition_sensor("wait_for_pass", marker, STREAM)
    prepare = feature_job(HOME, STREAM, PASS, EDITS_ARG, "recpipe-prepare-{{ ds }}-" + HH)
    has_rows = ShortCircuitOperator(
        task_id="has_rows",
        execution_timeout=STREAM.timeouts.of("has_rows"),
        python_callable=pass_has_rows,
        op_args=[PIPELINE.train_input_path, PASS],
        ignore_downstream_trigger_rules=False,  # a quiet close_hour still closes the day
    )
    evaluate = ProgressiveEvalOperator(
        task_id="evaluate_pass",
        execution_timeout=STREAM.timeouts.of("evaluate_pass"),
        model_dir=MODEL_DIR,
        eval_ds=PASS,
        previous_in=RUNS,
        model_name=STREAM.model_name,
        alias=STREAM.gate.alias,
        result_name="pass_eval_result.json",
        step="evaluate_pass",
        **job,
    )
    train = DistributedTrainOperator(
        task_id="train",
        execution_timeout=STREAM.timeouts.of("train"),
        model_dir=MODEL_DIR,
        ds=PASS,
        train_ds=PASS,
        holdout=False,
        # the day's previous pass; a day's first pass the champion (or, before any close,
        # the newest pass): never a model its day's close rejected
        warm_start_root=RUNS,
        previous_pass=True,
        model_name=STREAM.model_name,
        alias=STREAM.gate.alias,
        full_retrain="{{ params.full_retrain }}",
        **job,
    )
    export = PassExportOperator(
        task_id="export",
        execution_timeout=STREAM.timeouts.of("export"),
        model_dir=MODEL_DIR,
        export_dir=EXPORTS,
        ds=PASS,
        **job,
    )
    retention = RetentionOperator(
        task_id="retention",
        execution_timeout=STREAM.timeouts.of("retention"),
        runs_root=RUNS,
        keep_days=STREAM.retention_days,  # whole days of pass dirs, and the champion's
        model_name=STREAM.model_name,
        alias=STREAM.gate.alias,
        end_parent_run=True,  # a pass that does not close the day registers nothing
        trigger_rule="none_failed",
        **common,
    )
    last = wait_for_pass >> prepare >> has_rows >> evaluate >> train >> export
    if REDIS_URL:
        last = last >> OnlineStorePushOperator(
            task_id="push",
            execution_timeout=STREAM.timeouts.of("push"),
            export_path="{{ ti.xcom_pull(task_ids='export')['export'] }}",
            model_name=STREAM.model_name,
            redis_url=REDIS_URL,
        )

    # the day boundary
    close = ShortCircuitOperator(
        task_id="closes_day",
        execution_timeout=STREAM.timeouts.of("closes_day"),
        python_callable=closes_day,
        op_kwargs={"close_hour": STREAM.stream.close_hour},
        trigger_rule="none_failed",  # after the pass, trained or quiet
        # False: skip only the close chain; retention, downstream through register_and_gate,
        # then runs by its none_failed trigger rule (True would skip it on every pass)
        ignore_downstream_trigger_rules=False,
    )
    day_eval = "{{ ti.xcom_pull(task_ids='evaluate_day')"
    evaluate_day = DayEvalOperator(
        task_id="evaluate_day",
        execution_timeout=STREAM.timeouts.of("evaluate_day"),
        runs_root=RUNS,
        day="{{ ds }}",
        **common,
    )
    evaluate_champion = EvalOperator(
        task_id="evaluate_champion",
        execution_timeout=STREAM.timeouts.of("evaluate_champion"),
        model_dir=day_eval + "['model_dir'] }}",
        eval_ds=day_eval + "['eval_ds'] }}",
        champion_of=STREAM.model_name,
        alias=STREAM.gate.alias,
        result_name="champion_eval_result.json",
        step="evaluate_champion",
        **job,
    )
    export_saved_model = ExportOperator(
        task_id="export_saved_model",
        execution_timeout=STREAM.timeouts.of("export_saved_model"),
        model_dir=day_eval + "['model_dir'] }}",
        export_dir=EXPORTS,  # <version>/ beside the <day>/ dirs: TF Serving reads numbers only
        record_name="serving_export.json",
        outlets=[export_asset(STREAM.model_name)],
        **job,
    )
    gate = STREAM.gate
    register = RegisterModelOperator(
        task_id="register_and_gate",
        execution_timeout=STREAM.timeouts.of("register_and_gate"),
        model_name=STREAM.model_name,
        metric="auc",  # progressive scores carry no user ids for gAUC
        tolerance=gate.tolerance,
        min_metric=gate.min_metric,
        min_positives=gate.min_positives,
        min_negatives=gate.min_negatives,
        confidence=gate.confidence,
        inconclusive=gate.inconclusive,
        max_inconclusive_days=gate.max_inconclusive_days,
        alias=gate.alias,
        history_days=0,
        train_task_id="evaluate_day",
        eval_task_id="evaluate_day",
        export_task_id="export_saved_model",
        **common,
    )
    last >> close >> evaluate_day >> evaluate_champion >> export_saved_model >> register
    # not downstream of closes_day: a short circuit skips its direct downstream tasks whatever
    # their trigger rule, and retention must run after every pass
    [last, register] >> retention
