"""The daily retrain DAG of one retrain config (``kind: daily``): every day, prepare the day's
features, check them, score the champion on them, fine-tune from yesterday, evaluate, export,
register and gate, score the day's ``batch_predict`` partition with the champion, clean up.
``dags/recpipe_retrain.py`` builds one for each config; the shared tasks come from
``operators.retrain_dag``. Building it imports neither TensorFlow nor Spark."""

from __future__ import annotations

from pathlib import Path

from airflow.sdk import DAG

from operators.retrain_dag import RetrainTasks
from operators.validate import ValidateFeaturesOperator
from recpipe.config import load_pipeline_config
from recpipe.config.retrain import RetrainConfig
from recpipe.layout import partition_text


def daily_retrain_dag(home: Path, retrain: RetrainConfig, doc_md: str | None = None) -> DAG:
    """The DAG ``retrain.effective_dag_id`` (schedule ``retrain.effective_schedule``).

    Raises:
        recpipe.config.errors.ConfigError: the pipeline config it names is invalid.
    """
    pipeline = load_pipeline_config(home / retrain.pipeline_config_path, retrain.edit_config_json).resolved(
        home
    )
    tasks = RetrainTasks(home, retrain)
    model_dir = partition_text(tasks.runs, "{{ ds }}")
    # the gate scores both models on the held-out rows of its window (gate.window_days); training
    # keeps them out, and the evaluations read only held-out rows of every day of either window
    gate_window = (
        f"{{{{ macros.ds_add(ds, -{retrain.gate.window_days - 1}) }}}}:{{{{ ds }}}}"
        if retrain.gate.window_days > 1
        else "{{ ds }}"  # the day itself: its dataset is named ds=<day>, not a range of one day
    )
    span = max(retrain.training_window_days, retrain.gate.window_days)
    held_out = f"{{{{ macros.ds_add(ds, -{span - 1}) }}}}:{{{{ ds }}}}"

    with tasks.dag(
        retrain.effective_dag_id,
        description=f"daily retrain of {retrain.model_name} ({retrain.pipeline_config_path})",
        schedule=retrain.effective_schedule,
        doc_md=doc_md,
    ) as dag:
        wait_for_raw = tasks.wait_for_raw("wait_for_raw", pipeline.raw_input_path)
        prepare = tasks.prepare("{{ ds }}", f"recpipe-{retrain.model_name}-prepare-{{{{ ds }}}}")
        validate = ValidateFeaturesOperator(
            task_id="validate_features",
            execution_timeout=retrain.timeouts.of("validate_features"),
            validation=retrain.validation,
            **tasks.defaults.common(),
        )
        evaluate_champion = tasks.evaluate_champion(model_dir, gate_window, train_ds=held_out)
        train = tasks.train(model_dir, training_window_days=retrain.training_window_days, eval_ds=gate_window)
        evaluate = tasks.evaluate("evaluate", model_dir, gate_window, train_ds=held_out)
        export = tasks.export(model_dir)
        register = tasks.register()
        approved = tasks.approval(register)  # gate.approval: required
        retention = tasks.retention(**({"trigger_rule": "none_failed"} if approved else {}))
        # the champion after the gate (and the approval) scores the day's partition
        score = tasks.batch_predict(model_dir, **({"trigger_rule": "none_failed"} if approved else {}))
        if approved is not None:
            approved >> retention
            if score is not None:
                approved >> score
        if score is not None:
            register >> score
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
    return dag
