"""The retrain DAGs of a deployment, one per retrain config (Airflow's dynamic DAG generation
from a folder of configs): every ``*.yaml`` under ``$RECPIPE_RETRAIN_CONFIGS`` (default
``conf/retrain/``; or one file) becomes the DAG its ``dag_id`` names (default
``<model_name>_<kind>``): ``kind: daily`` the daily retrain (``operators/daily_dag.py``),
``kind: stream`` the passes (``operators/stream_dag.py``), each on its own schedule, time
zone, pool and tags.

A config that does not load (bad YAML, a field out of range, a pipeline config that fails
its checks, a ``dag_id`` another file has) is this file's import error in the Airflow UI,
naming the file and its error (``operators.config_error``); the other configs' DAGs are
built and keep scheduling. Wiring only: parsing this file
imports neither TensorFlow nor Spark. (It names Airflow and DAG here because Airflow's safe
mode parses only the files that say "airflow" and "dag".)
"""

from __future__ import annotations

from operators.config_error import UnloadableConfigs
from operators.daily_dag import daily_retrain_dag
from operators.paths import project_home
from operators.stream_dag import stream_retrain_dag
from recpipe.config.errors import ConfigError
from recpipe.config.retrain import load_retrain_config, retrain_config_files

HOME = project_home()
BUILDERS = {"daily": daily_retrain_dag, "stream": stream_retrain_dag}

SOURCES: dict[str, str] = {}  # dag_id -> the config that defines it
ERRORS = []  # (path, error) of the configs that do not load

for path in retrain_config_files(HOME):
    try:
        retrain = load_retrain_config(path)
        if retrain.effective_dag_id in SOURCES:
            raise ConfigError(
                f"{path}: dag_id {retrain.effective_dag_id!r} is {SOURCES[retrain.effective_dag_id]}'s"
            )
        dag = BUILDERS[retrain.kind](HOME, retrain, doc_md=f"Retrain config: `{path}`\n\n" + __doc__)
    except ConfigError as err:  # an import error names it; the other models still load
        ERRORS.append((path, err))
        continue
    SOURCES[dag.dag_id] = str(path)
    globals()[dag.dag_id] = dag

if ERRORS:
    unloadable = UnloadableConfigs(ERRORS)
