"""The stream retrain DAG of one retrain config (``kind: stream``; PaddleRec's online
trainer): every run one pass: prepare the pass's features, score the model as it stands on
them (progressive validation), train on them from the day's previous pass (a day's first
pass: from the champion), export the day's base at its first trained pass and a delta after
every other, push it to the Redis embedding store, keep the newest days' pass dirs. A
one-process job does the scoring, training and export in one process (``train``);
``evaluate_pass`` and ``export`` then report what it wrote.

A pass is an hour of data, or ``stream.pass_minutes`` of it (a run every that many minutes).
The last pass of ``stream.close_hour`` (23) closes the day as the daily DAG does: the day's last
model is exported (SavedModel, TF Serving layout, and an MLflow Model), registered, and gated
against the ``champion`` on the day's rows, which the day's progressive scores
(``evaluate_day``) and the champion's (``evaluate_champion``) both predicted before training
on them. A quiet pass (no rows) skips everything after its preparation.
``dags/recpipe_retrain.py`` builds one for each config; building it imports neither
TensorFlow nor Spark.
"""

from __future__ import annotations

from pathlib import Path

from airflow.providers.standard.operators.python import ShortCircuitOperator
from airflow.sdk import DAG

from operators.retrain_dag import RetrainTasks, xcom
from operators.stream import (
    DayEvalOperator,
    OnlineStorePushOperator,
    PassExportOperator,
    ProgressiveEvalOperator,
    closes_day,
    pass_has_rows,
)
from recpipe.config import load_pipeline_config
from recpipe.config.retrain import RetrainConfig
from recpipe.layout import PASS_EVAL_RESULT, SERVING_EXPORT_RECORD, partition_text, pass_key_format


def stream_retrain_dag(home: Path, retrain: RetrainConfig, doc_md: str | None = None) -> DAG:
    """The DAG ``retrain.effective_dag_id`` (schedule ``retrain.effective_schedule``: a pass a
    run); with ``stream.redis_url`` set it pushes to the online store, which the task resolves
    when it runs (the connection ``recpipe_store``, ``$RECPIPE_REDIS_URL``, then the config's
    URL: ``operators.hooks.store``).

    Raises:
        recpipe.config.errors.ConfigError: the pipeline config it names is invalid.
    """
    pipeline = load_pipeline_config(home / retrain.pipeline_config_path, retrain.edit_config_json).resolved(
        home
    )
    minutes = retrain.stream.pass_minutes
    tasks = RetrainTasks(home, retrain, pass_minutes=minutes)
    # the pass a run trains, named by the run's logical date: HH, or HHMM for shorter passes
    key = "{{ logical_date.strftime('" + pass_key_format(minutes) + "') }}"

    with tasks.dag(
        retrain.effective_dag_id,
        description=f"passes of {retrain.model_name} ({retrain.pipeline_config_path})",
        schedule=retrain.effective_schedule,  # max_active_runs 1: a pass continues from the one before
        tags=["recpipe", retrain.model_name, "stream", *retrain.tags],
        doc_md=doc_md,
    ) as dag:
        last, evaluate = _pass_chain(tasks, retrain, pipeline, key)
        register = _day_close(tasks, retrain, [last, evaluate])
        retention = tasks.retention(
            end_parent_run=True,  # a pass that does not close the day registers nothing
            trigger_rule="none_failed",
        )
        # not downstream of closes_day: a short circuit skips its direct downstream tasks whatever
        # their trigger rule, and retention must run after every pass
        [last, evaluate, register] >> retention
        if (approved := tasks.approval(register)) is not None:  # gate.approval: required
            approved >> retention
    return dag


def _pass_chain(tasks: RetrainTasks, retrain: RetrainConfig, pipeline, key: str) -> tuple:
    """A pass's tasks: wait for its partition, prepare it, skip the rest when it has no rows,
    train (scoring it first), report the score and export, push to the store. Returns the
    chain's last task and the progressive evaluation."""
    pass_ds = "{{ ds }}/" + key  # the pass: YYYY-MM-DD/HH[MM]
    model_dir = partition_text(tasks.runs, "{{ ds }}", key)
    wait_for_pass = tasks.wait_for_raw("wait_for_pass", pipeline.raw_input_path, key)
    prepare = tasks.prepare(pass_ds, f"recpipe-{retrain.model_name}-prepare-{{{{ ds }}}}-" + key)
    has_rows = ShortCircuitOperator(
        task_id="has_rows",
        execution_timeout=retrain.timeouts.of("has_rows"),
        python_callable=pass_has_rows,
        op_args=[pipeline.train_input_path, pass_ds],
        ignore_downstream_trigger_rules=False,  # a quiet close_hour still closes the day
    )
    evaluate = ProgressiveEvalOperator(
        task_id="evaluate_pass",
        execution_timeout=retrain.timeouts.of("evaluate_pass"),
        model_dir=model_dir,
        eval_ds=pass_ds,
        previous_in=tasks.runs,
        model_name=retrain.model_name,
        alias=retrain.gate.alias,
        cold_start_from=retrain.stream.cold_start_from,
        result_name=PASS_EVAL_RESULT,
        step="evaluate_pass",
        **tasks.defaults.job(),
    )
    # from the day's previous pass; a day's first pass the champion (or, before any close, the
    # newest pass): never a model its day's close rejected. One process scores the pass first,
    # trains and exports it (a one-process job; a larger one leaves the scoring and the export
    # to those tasks' own jobs)
    train = tasks.train(
        model_dir,
        ds=pass_ds,
        train_ds=pass_ds,
        holdout=False,
        previous_pass=True,
        cold_start_from=retrain.stream.cold_start_from,
        score_first=PASS_EVAL_RESULT,
        export_dir=tasks.exports,
    )
    export = PassExportOperator(
        task_id="export",
        execution_timeout=retrain.timeouts.of("export"),
        model_dir=model_dir,
        export_dir=tasks.exports,
        ds=pass_ds,
        **tasks.defaults.job(),
    )
    # the pass's rows reach the store first; its score is reported beside
    wait_for_pass >> prepare >> has_rows >> train >> [evaluate, export]
    last = export
    if retrain.stream.redis_url:
        last = last >> OnlineStorePushOperator(
            task_id="push",
            execution_timeout=retrain.timeouts.of("push"),
            export_path=xcom("export", "export"),
            model_name=retrain.model_name,
            redis_url=retrain.stream.redis_url,
        )
    return last, evaluate


def _day_close(tasks: RetrainTasks, retrain: RetrainConfig, after: list):
    """The day boundary after the pass's tasks ``after``: at ``stream.close_hour``'s last
    pass, the day's progressive scores and the champion's on the day's rows, the day's last
    model exported, registered and gated. Returns the register task."""
    close = ShortCircuitOperator(
        task_id="closes_day",
        execution_timeout=retrain.timeouts.of("closes_day"),
        python_callable=closes_day,
        op_kwargs={"close_hour": retrain.stream.close_hour, "pass_minutes": retrain.stream.pass_minutes},
        trigger_rule="none_failed",  # after the pass, trained or quiet
        # False: skip only the close chain; retention, downstream through register_and_gate,
        # then runs by its none_failed trigger rule (True would skip it on every pass)
        ignore_downstream_trigger_rules=False,
    )
    evaluate_day = DayEvalOperator(
        task_id="evaluate_day",
        execution_timeout=retrain.timeouts.of("evaluate_day"),
        runs_root=tasks.runs,
        day="{{ ds }}",
        **tasks.defaults.common(),
    )
    day_model = xcom("evaluate_day", "model_dir")
    evaluate_champion = tasks.evaluate_champion(day_model, xcom("evaluate_day", "eval_ds"))
    # <version>/ beside the <day>/ dirs: TF Serving reads numbers only
    export_saved_model = tasks.export(
        day_model, task_id="export_saved_model", record_name=SERVING_EXPORT_RECORD
    )
    register = tasks.register(
        gate={"metric": "auc"},  # progressive scores carry no user ids for gAUC
        history_days=0,
        train_task_id="evaluate_day",
        eval_task_id="evaluate_day",
        export_task_id="export_saved_model",
    )
    after >> close
    close >> evaluate_day >> evaluate_champion >> export_saved_model >> register
    return register
