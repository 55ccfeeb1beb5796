"""deploy/airflow/airflow_local_settings.py: Airflow processes started as the project starts
them import it, and only the commands that fork tasks pre-import the tasks' modules."""

from __future__ import annotations

import os
import subprocess
import sys

from dev.env import airflow_env
from tests.support import ROOT

CHECK = """
import sys
import airflow  # initialises Airflow's settings, which import airflow_local_settings
import airflow_local_settings as local
print(local.__file__)
print("mlflow" in sys.modules)
print(",".join(local._preload(["airflow", "api-server"])))
print(",".join(local._preload(["airflow", "scheduler"])))
print(",".join(local._preload(["airflow", "celery", "worker"])))
"""


def test_forking_commands_preload_what_every_task_imports(tmp_path):
    env = {**os.environ, **airflow_env(ROOT, tmp_path / "airflow")}
    out = subprocess.run(
        [sys.executable, "-c", CHECK], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    path, mlflow_at_start, api_server, scheduler, worker = out.stdout.strip().splitlines()[-5:]
    assert path == str(ROOT / "deploy" / "airflow" / "airflow_local_settings.py")
    assert mlflow_at_start == "False"  # this process is no scheduler: nothing pre-imported
    assert api_server == ""
    from_dag = {"airflow.providers.apache.spark.operators.spark_submit", "operators.retrain_dag"}
    assert from_dag | {"mlflow", "scipy.stats"} <= set(scheduler.split(",")) == set(worker.split(","))
