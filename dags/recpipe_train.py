"""``recpipe_train``: a training run triggered by hand (Airflow UI "Trigger DAG" form or the
REST API), with the same operators as the daily DAG. The trigger form validates every Param
against its JSON schema; paths must stay inside the project's ``conf/``, ``data/``, ``var/``.

The run trains ``pipeline_config_path`` on ``train_ds`` (warm-started from the champion's model
dir, or the newest promoted one, dated before it unless ``full_retrain``), evaluates on
``eval_ds``, exports, and registers the export without moving the ``champion`` alias.
"""

from __future__ import annotations

from airflow.sdk import DAG, Param

from operators.evaluate import EvalOperator
from operators.export import ExportOperator
from operators.paths import project_home
from operators.register import RegisterModelOperator
from operators.tracking import fail_parent_run
from operators.train import DistributedTrainOperator
from recpipe.config.retrain import active_retrain_config
from recpipe.config.train import TrainDistribute

HOME = project_home()
RETRAIN = active_retrain_config(HOME)
DAY = r"\d{4}-\d{2}-\d{2}"
# inside the project: no absolute path, no "..", only conf/*.yaml
CONFIG_PATH = r"^conf/(?!.*\.\.)[A-Za-z0-9_./-]+\.ya?ml$"
RUN = "{{ run_id | replace(':', '_') | replace('+', '_') }}"
MODEL_DIR = f"{RETRAIN.runs_dir}/{RETRAIN.model_name}/manual/{RUN}"
EDITS = "{{ retrain.with_run_edits(params.edit_config_json) }}"


common = {
    "pipeline_config_path": "{{ params.pipeline_config_path }}",
    "edit_config_json": EDITS,
    "experiment": RETRAIN.experiment,
    "mlflow_conn_id": RETRAIN.tracking.mlflow_conn_id,
}
job = {**common, "cluster_config_path": "{{ params.cluster_config_path }}"}

with DAG(
    dag_id="recpipe_train",
    description="train, evaluate, export and register one model on demand",
    schedule=None,
    catchup=False,
    max_active_runs=2,
    render_template_as_native_obj=True,  # Params arrive typed (bool, int, dict)
    default_args={
        "on_failure_callback": fail_parent_run(RETRAIN.experiment, RETRAIN.tracking.mlflow_conn_id)
    },
    params={
        "pipeline_config_path": Param(
            RETRAIN.pipeline_config_path, type="string", pattern=CONFIG_PATH, description="conf/*.yaml"
        ),
        "cluster_config_path": Param(
            RETRAIN.cluster_config_path, type="string", pattern=CONFIG_PATH, description="conf/cluster/*.yaml"
        ),
        "train_ds": Param(
            "1997-09-22:1997-09-28",
            type="string",
            pattern=f"^{DAY}(:{DAY})?$",
            description="YYYY-MM-DD[:YYYY-MM-DD]",
        ),
        "eval_ds": Param(
            "1997-09-29", type="string", pattern=f"^{DAY}(:{DAY})?$", description="YYYY-MM-DD[:YYYY-MM-DD]"
        ),
        "train_distribute": Param(
            TrainDistribute.NoStrategy.value, type="string", enum=[t.value for t in TrainDistribute]
        ),
        "num_workers": Param(1, type="integer", minimum=1, maximum=64),
        "edit_config_json": Param({}, type="object", description="EasyRec overrides: dotted path -> value"),
        "full_retrain": Param(False, type="boolean"),
    },
    user_defined_macros={"retrain": RETRAIN},
    tags=["recpipe", "manual"],
    doc_md=__doc__,
) as dag:
    train = DistributedTrainOperator(
        task_id="train",
        execution_timeout=RETRAIN.timeouts.of("train"),
        model_dir=MODEL_DIR,
        ds="{{ params.train_ds.split(':')[0] }}",
        train_ds="{{ params.train_ds }}",
        eval_ds="{{ params.eval_ds }}",
        warm_start_root=f"{RETRAIN.runs_dir}/{RETRAIN.model_name}",
        model_name=RETRAIN.model_name,
        alias=RETRAIN.gate.alias,
        full_retrain="{{ params.full_retrain }}",
        train_distribute="{{ params.train_distribute }}",
        num_workers="{{ params.num_workers }}",
        retries=0,
        **job,
    )
    evaluate = EvalOperator(
        task_id="evaluate",
        execution_timeout=RETRAIN.timeouts.of("evaluate"),
        model_dir=MODEL_DIR,
        eval_ds="{{ params.eval_ds }}",
        train_ds="{{ params.train_ds }}",
        **job,
    )
    export = ExportOperator(
        task_id="export",
        execution_timeout=RETRAIN.timeouts.of("export"),
        model_dir=MODEL_DIR,
        export_dir=f"{RETRAIN.export_dir}/{RETRAIN.model_name}",
        **job,
    )
    register = RegisterModelOperator(
        task_id="register",
        execution_timeout=RETRAIN.timeouts.of("register"),
        model_name=RETRAIN.model_name,
        metric=RETRAIN.gate.metric,
        tolerance=RETRAIN.gate.tolerance,
        min_metric=RETRAIN.gate.min_metric,
        min_positives=RETRAIN.gate.min_positives,
        min_negatives=RETRAIN.gate.min_negatives,
        confidence=RETRAIN.gate.confidence,
        inconclusive=RETRAIN.gate.inconclusive,
        alias=RETRAIN.gate.alias,
        promote=False,
        champion_eval_task_id=None,
        **common,
    )
    train >> evaluate >> export >> register
