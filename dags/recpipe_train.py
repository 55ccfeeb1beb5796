"""``recpipe_train``: a training run triggered by hand (Airflow UI "Trigger DAG" form or the
REST API), with the same operators as the daily DAG. The trigger form validates every Param
against its JSON schema; paths must stay inside the project's ``conf/``, ``data/``, ``var/``.

The run trains ``pipeline_config_path`` on ``train_ds`` (warm-started from the champion's model
dir, or the newest promoted one, dated before it unless ``full_retrain``), evaluates on
``eval_ds``, exports, and registers the export without moving the ``champion`` alias.
"""

from __future__ import annotations

from airflow.sdk import Param

from operators.paths import project_home
from operators.retrain_dag import RetrainTasks
from recpipe.config.retrain import train_dag_config
from recpipe.config.train import TrainDistribute

HOME = project_home()
RETRAIN = train_dag_config(HOME)
DAY = r"\d{4}-\d{2}-\d{2}"
# inside the project: no absolute path, no "..", only conf/*.yaml
CONFIG_PATH = r"^conf/(?!.*\.\.)[A-Za-z0-9_./-]+\.ya?ml$"
RUN = "{{ run_id | replace(':', '_') | replace('+', '_') }}"
tasks = RetrainTasks(
    HOME,
    RETRAIN,
    pipeline_config_path="{{ params.pipeline_config_path }}",
    cluster_config_path="{{ params.cluster_config_path }}",
)
MODEL_DIR = f"{tasks.runs}/manual/{RUN}"


def _ds_param(default: str) -> Param:
    return Param(default, type="string", pattern=f"^{DAY}(:{DAY})?$", description="YYYY-MM-DD[:YYYY-MM-DD]")


with tasks.dag(
    "recpipe_train",
    description="train, evaluate, export and register one model on demand",
    schedule=None,
    catchup=False,
    max_active_runs=2,
    params={
        "pipeline_config_path": Param(
            RETRAIN.pipeline_config_path, type="string", pattern=CONFIG_PATH, description="conf/*.yaml"
        ),
        "cluster_config_path": Param(
            RETRAIN.cluster_config_path, type="string", pattern=CONFIG_PATH, description="conf/cluster/*.yaml"
        ),
        "train_ds": _ds_param("1997-09-22:1997-09-28"),
        "eval_ds": _ds_param("1997-09-29"),
        "train_distribute": Param(
            TrainDistribute.NoStrategy.value, type="string", enum=[t.value for t in TrainDistribute]
        ),
        "num_workers": Param(1, type="integer", minimum=1, maximum=64),
    },
    tags=["recpipe", "manual"],
    doc_md=__doc__,
) as dag:
    train = tasks.train(
        MODEL_DIR,
        ds="{{ params.train_ds.split(':')[0] }}",
        train_ds="{{ params.train_ds }}",
        eval_ds="{{ params.eval_ds }}",
        train_distribute="{{ params.train_distribute }}",
        num_workers="{{ params.num_workers }}",
        retries=0,
    )
    evaluate = tasks.evaluate("evaluate", MODEL_DIR, "{{ params.eval_ds }}", train_ds="{{ params.train_ds }}")
    export = tasks.export(MODEL_DIR, outlets=[])
    # registers without moving the alias: a manual run is no day's gate
    register = tasks.register(
        "register", gate={"max_inconclusive_days": 0}, promote=False, champion_eval_task_id=None
    )
    train >> evaluate >> export >> register
