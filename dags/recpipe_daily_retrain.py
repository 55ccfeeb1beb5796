"""``recpipe_daily_retrain``: every day, prepare the day's features, check them, score the
champion on them, fine-tune from yesterday, evaluate, export, register and gate, clean up.

Settings come from ``$RECPIPE_RETRAIN_CONFIG`` (default ``conf/retrain/movielens_daily.yaml``);
the model from its pipeline config. Wiring only: the work is in ``operators/``, the shared
tasks come from ``operators.retrain_dag``. Parsing this file imports neither TensorFlow nor
Spark. (It names Airflow here because Airflow's safe mode parses only the files that say
"airflow" and "dag".)
"""

from __future__ import annotations

from operators.paths import project_home
from operators.retrain_dag import RetrainTasks
from operators.validate import ValidateFeaturesOperator
from recpipe.config import load_pipeline_config
from recpipe.config.retrain import active_retrain_config
from recpipe.layout import partition_text

HOME = project_home()
RETRAIN = active_retrain_config(HOME, "daily")
PIPELINE = load_pipeline_config(HOME / RETRAIN.pipeline_config_path, RETRAIN.edit_config_json).resolved(HOME)
tasks = RetrainTasks(HOME, RETRAIN)
MODEL_DIR = partition_text(tasks.runs, "{{ ds }}")
# the gate scores both models on the held-out rows of its window (gate.window_days); training
# keeps them out, and the evaluations read only held-out rows of every day of either window
GATE_WINDOW = (
    f"{{{{ macros.ds_add(ds, -{RETRAIN.gate.window_days - 1}) }}}}:{{{{ ds }}}}"
    if RETRAIN.gate.window_days > 1
    else "{{ ds }}"  # the day itself: its dataset is named ds=<day>, not a range of one day
)
SPAN = max(RETRAIN.training_window_days, RETRAIN.gate.window_days)
HELD_OUT = f"{{{{ macros.ds_add(ds, -{SPAN - 1}) }}}}:{{{{ ds }}}}"

with tasks.dag(
    "recpipe_daily_retrain",
    description=f"daily retrain of {RETRAIN.model_name} ({RETRAIN.pipeline_config_path})",
    schedule="@daily",
    doc_md=__doc__,
) as dag:
    wait_for_raw = tasks.wait_for_raw("wait_for_raw", PIPELINE.raw_input_path)
    prepare = tasks.prepare("{{ ds }}", "recpipe-prepare-{{ ds }}")
    validate = ValidateFeaturesOperator(
        task_id="validate_features",
        execution_timeout=RETRAIN.timeouts.of("validate_features"),
        validation=RETRAIN.validation,
        **tasks.common,
    )
    evaluate_champion = tasks.evaluate_champion(MODEL_DIR, GATE_WINDOW, train_ds=HELD_OUT)
    train = tasks.train(MODEL_DIR, training_window_days=RETRAIN.training_window_days, eval_ds=GATE_WINDOW)
    evaluate = tasks.evaluate("evaluate", MODEL_DIR, GATE_WINDOW, train_ds=HELD_OUT)
    export = tasks.export(MODEL_DIR)
    register = tasks.register()
    retention = tasks.retention()

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
