"""``recpipe_daily_retrain``: every day, prepare the day's features, check them, score the
champion on them, fine-tune from yesterday, evaluate, export, register and gate, clean up.

Settings come from ``$RECPIPE_RETRAIN_CONFIG`` (default ``conf/retrain/movielens_daily.yaml``);
the model from its pipeline config. Wiring only: the work is in ``operators/``. Parsing this
file imports neither TensorFlow nor Spark.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from airflow.sdk import DAG, Param

from operators.evaluate import EvalOperator
from operators.export import ExportOperator, export_asset
from operators.feature_job import feature_job, raw_partition_sensor
from operators.paths import project_home
from operators.register import RegisterModelOperator
from operators.retention import RetentionOperator
from operators.tracking import fail_parent_run
from operators.train import DistributedTrainOperator
from operators.validate import ValidateFeaturesOperator
from recpipe.config import load_pipeline_config
from recpipe.config.retrain import active_retrain_config

HOME = project_home()
RETRAIN = active_retrain_config(HOME)
PIPELINE = load_pipeline_config(HOME / RETRAIN.pipeline_config_path, RETRAIN.edit_config_json).resolved(HOME)
RUNS = f"{RETRAIN.runs_dir}/{RETRAIN.model_name}"
MODEL_DIR = RUNS + "/ds={{ ds }}"
EXPORTS = f"{RETRAIN.export_dir}/{RETRAIN.model_name}"
# the gate scores both models on the held-out rows of its window (gate.window_days); training
# keeps them out, and the evaluations read only held-out rows of every day of either window
GATE_WINDOW = (
    f"{{{{ macros.ds_add(ds, -{RETRAIN.gate.window_days - 1}) }}}}:{{{{ ds }}}}"
    if RETRAIN.gate.window_days > 1
    else "{{ ds }}"  # the day itself: its dataset is named ds=<day>, not a range of one day
)
SPAN = max(RETRAIN.training_window_days, RETRAIN.gate.window_days)
HELD_OUT = f"{{{{ macros.ds_add(ds, -{SPAN - 1}) }}}}:{{{{ ds }}}}"
# the retrain config's overrides, then the run's (Params / trigger conf); a dict, rendered
# natively. spark-submit takes it as one argument of JSON text (the "=" form keeps the native
# renderer from turning the text back into a dict)
EDITS = "{{ retrain.with_run_edits(params.edit_config_json) }}"
EDITS_ARG = "--edit_config_json={{ retrain.with_run_edits(params.edit_config_json) | tojson }}"


def _utc(d) -> datetime:
    return datetime(d.year, d.month, d.day, tzinfo=UTC)


common = {
    "pipeline_config_path": RETRAIN.pipeline_config_path,
    "edit_config_json": EDITS,
    "experiment": RETRAIN.experiment,
    "mlflow_conn_id": RETRAIN.tracking.mlflow_conn_id,
}
job = {**common, "cluster_config_path": RETRAIN.cluster_config_path}

with DAG(
    dag_id="recpipe_daily_retrain",
    description=f"daily retrain of {RETRAIN.model_name} ({RETRAIN.pipeline_config_path})",
    schedule="@daily",
    start_date=_utc(RETRAIN.start_date),
    end_date=_utc(RETRAIN.end_date) if RETRAIN.end_date else None,
    catchup=RETRAIN.catchup,
    max_active_runs=1,
    render_template_as_native_obj=True,  # Params arrive typed (bool, int, dict)
    default_args={
        "retries": RETRAIN.tracking.retries,
        "retry_delay": timedelta(seconds=RETRAIN.tracking.retry_delay_s),
        "on_failure_callback": fail_parent_run(RETRAIN.experiment, RETRAIN.tracking.mlflow_conn_id),
    },
    params={
        "full_retrain": Param(False, type="boolean", description="train from scratch, not from yesterday"),
        "edit_config_json": Param(
            {},
            type="object",
            description="EasyRec overrides (dotted path -> value) on top of the retrain config's",
        ),
    },
    user_defined_macros={"retrain": RETRAIN},
    tags=["recpipe", RETRAIN.model_name],
    doc_md=__doc__,
) as dag:
    wait_for_raw = raw_partition_sensor(
        "wait_for_raw", f"{PIPELINE.raw_input_path}/ds={{{{ ds }}}}/_SUCCESS", RETRAIN
    )
    prepare = feature_job(HOME, RETRAIN, "{{ ds }}", EDITS_ARG, "recpipe-prepare-{{ ds }}")
    validate = ValidateFeaturesOperator(
        task_id="validate_features",
        execution_timeout=RETRAIN.timeouts.of("validate_features"),
        min_rows=RETRAIN.validation.min_rows,
        positive_rate_min=RETRAIN.validation.positive_rate_min,
        positive_rate_max=RETRAIN.validation.positive_rate_max,
        drift_tolerance=RETRAIN.validation.drift_tolerance,
        drift_lookback_days=RETRAIN.validation.drift_lookback_days,
        **common,
    )
    evaluate_champion = EvalOperator(
        task_id="evaluate_champion",
        execution_timeout=RETRAIN.timeouts.of("evaluate_champion"),
        model_dir=MODEL_DIR,
        eval_ds=GATE_WINDOW,
        train_ds=HELD_OUT,
        champion_of=RETRAIN.model_name,
        alias=RETRAIN.gate.alias,
        result_name="champion_eval_result.json",
        step="evaluate_champion",
        **job,
    )
    train = DistributedTrainOperator(
        task_id="train",
        execution_timeout=RETRAIN.timeouts.of("train"),
        model_dir=MODEL_DIR,
        training_window_days=RETRAIN.training_window_days,
        eval_ds=GATE_WINDOW,
        warm_start_root=RUNS,
        model_name=RETRAIN.model_name,
        alias=RETRAIN.gate.alias,
        full_retrain="{{ params.full_retrain }}",
        **job,
    )
    evaluate = EvalOperator(
        task_id="evaluate",
        execution_timeout=RETRAIN.timeouts.of("evaluate"),
        model_dir=MODEL_DIR,
        eval_ds=GATE_WINDOW,
        train_ds=HELD_OUT,
        **job,
    )
    export = ExportOperator(
        task_id="export",
        execution_timeout=RETRAIN.timeouts.of("export"),
        model_dir=MODEL_DIR,
        export_dir=EXPORTS,
        outlets=[export_asset(RETRAIN.model_name)],
        **job,
    )
    register = RegisterModelOperator(
        task_id="register_and_gate",
        execution_timeout=RETRAIN.timeouts.of("register_and_gate"),
        model_name=RETRAIN.model_name,
        metric=RETRAIN.gate.metric,
        tolerance=RETRAIN.gate.tolerance,
        min_metric=RETRAIN.gate.min_metric,
        min_positives=RETRAIN.gate.min_positives,
        min_negatives=RETRAIN.gate.min_negatives,
        confidence=RETRAIN.gate.confidence,
        inconclusive=RETRAIN.gate.inconclusive,
        max_inconclusive_days=RETRAIN.gate.max_inconclusive_days,
        alias=RETRAIN.gate.alias,
        **common,
    )
    retention = RetentionOperator(
        task_id="retention",
        execution_timeout=RETRAIN.timeouts.of("retention"),
        runs_root=RUNS,
        keep_days=RETRAIN.retention_days,
        model_name=RETRAIN.model_name,
        alias=RETRAIN.gate.alias,
        **common,
    )

    (
        wait_for_raw
        >> prepare
        >> validate
        >> evaluate_champion
        >> train
        >> evaluate
        >> export
        >> register
        >> retention
    )
