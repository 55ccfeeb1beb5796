"""The retrain DAGs of a deployment, one per retrain config (Airflow's dynamic DAG generation
from a folder of configs): every ``*.yaml`` under ``$RECPIPE_RETRAIN_CONFIGS`` (default
``conf/retrain/``; or one file) becomes the DAG its ``dag_id`` names (default
``<model_name>_<kind>``): ``kind: daily`` the daily retrain (``operators/daily_dag.py``),
``kind: stream`` the passes (``operators/stream_dag.py``), each on its own schedule, time
zone, pool and tags.

A config that does not load (bad YAML, a field out of range, a pipeline config that fails
its checks, a ``dag_id`` an earlier file has) is left out here and is the import error of
``dags/recpipe_retrain_configs.py``, which names each such file and its error. Not this
file's: Airflow schedules none of a file's DAGs while the file has an import error, and the
other models must keep scheduling. Wiring only: parsing this file imports neither
TensorFlow nor Spark. (It names Airflow and DAG here because Airflow's safe mode parses only
the files that say "airflow" and "dag".)
"""

from __future__ import annotations

from operators.daily_dag import daily_retrain_dag
from operators.paths import project_home
from operators.stream_dag import stream_retrain_dag
from recpipe.config.retrain import load_retrain_configs

HOME = project_home()
BUILDERS = {"daily": daily_retrain_dag, "stream": stream_retrain_dag}

SOURCES: dict[str, str] = {}  # dag_id -> the config that defines it

for path, retrain in load_retrain_configs(HOME)[0].items():
    dag = BUILDERS[retrain.kind](HOME, retrain, doc_md=f"Retrain config: `{path}`\n\n" + __doc__)
    SOURCES[dag.dag_id] = str(path)
    globals()[dag.dag_id] = dag
