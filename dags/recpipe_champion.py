"""``recpipe_champion``: move a model's champion by hand from the Airflow UI ("Trigger DAG"
form): ``set`` it to a registered version or ``rollback`` to the one before, with a reason;
the version is tagged with the triggering user and the reason, the move is logged to MLflow,
and a stream model's online store is restored to the champion's rows. The same as
``recpipe champion`` on the command line. Models: those of the deployment's retrain configs
(``$RECPIPE_RETRAIN_CONFIGS``). Parsing this Airflow DAG file imports neither TensorFlow nor
Spark.
"""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import DAG, Param

from operators.champion import ChampionOperator
from operators.paths import project_home
from recpipe.config.retrain import load_retrain_configs

HOME = project_home()
# the configs that load (recpipe_retrain_configs.py shows the others); a model_name is one file's
CONFIGS = {config.model_name: config for config in load_retrain_configs(HOME)[0].values()}
MODELS = sorted(CONFIGS)

with DAG(
    "recpipe_champion",
    description="set or roll back a model's champion, with a reason",
    schedule=None,
    render_template_as_native_obj=True,
    tags=["recpipe", "champion"],
    doc_md=__doc__,
    params={
        # no default: a form that only needs a reason must not move the first model in the list
        "model_name": Param(type="string", enum=MODELS or [""], description="the model whose champion moves"),
        "action": Param("rollback", type="string", enum=["rollback", "set"]),
        "version": Param(None, type=["null", "integer"], minimum=1, description="set: the version to serve"),
        "reason": Param("", type="string", minLength=3, description="why: goes to the version's tags"),
    },
) as dag:
    ChampionOperator(
        task_id="move_champion",
        model_name="{{ params.model_name }}",
        action="{{ params.action }}",
        version="{{ params.version }}",
        reason="{{ params.reason }}",
        configs=CONFIGS,
        mlflow_conn_id=CONFIGS[MODELS[0]].tracking.mlflow_conn_id if MODELS else "mlflow_default",
        retries=0,
        execution_timeout=timedelta(minutes=10),
    )
