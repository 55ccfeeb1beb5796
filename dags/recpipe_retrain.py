"""The retrain DAGs of a deployment, one per retrain config (Airflow's dynamic DAG generation
from a folder of configs): every ``*.yaml`` under ``$RECPIPE_RETRAIN_CONFIGS`` (default
``conf/retrain/``; or one file) becomes the DAG its ``dag_id`` names (default
``<model_name>_<kind>``): ``kind: daily`` the daily retrain (``operators/daily_dag.py``),
``kind: stream`` the passes (``operators/stream_dag.py``), each on its own schedule, time
zone, pool and tags.

A config that does not load (bad YAML, a field out of range, a pipeline config that fails
its checks) becomes a DAG of its own, ``<file stem>_config_error`` (tag ``config-error``,
no schedule), whose description and docs hold the error and whose one task fails with it;
the other configs' DAGs are built and keep scheduling. Wiring only: parsing this file
imports neither TensorFlow nor Spark. (It names Airflow and DAG here because Airflow's safe
mode parses only the files that say "airflow" and "dag".)
"""

from __future__ import annotations

from operators.config_error import config_error_dag
from operators.daily_dag import daily_retrain_dag
from operators.paths import project_home
from operators.stream_dag import stream_retrain_dag
from recpipe.config.errors import ConfigError
from recpipe.config.retrain import load_retrain_config, retrain_config_files

HOME = project_home()
BUILDERS = {"daily": daily_retrain_dag, "stream": stream_retrain_dag}

SOURCES: dict[str, str] = {}  # dag_id -> the config that defines it

for path in retrain_config_files(HOME):
    try:
        retrain = load_retrain_config(path)
        if retrain.effective_dag_id in SOURCES:
            raise ConfigError(
                f"{path}: dag_id {retrain.effective_dag_id!r} is {SOURCES[retrain.effective_dag_id]}'s"
            )
        dag = BUILDERS[retrain.kind](HOME, retrain, doc_md=f"Retrain config: `{path}`\n\n" + __doc__)
    except ConfigError as err:  # this model's DAG shows the error; the others still load
        dag = config_error_dag(path, err)
    SOURCES[dag.dag_id] = str(path)
    globals()[dag.dag_id] = dag
