"""The retrain configs that do not load, as this file's import error in the Airflow UI (DAG
import errors): each broken file of ``$RECPIPE_RETRAIN_CONFIGS`` and why. It defines no DAG,
so its error stops nothing from scheduling; ``dags/recpipe_retrain.py`` builds the DAGs of
the configs that load. (Airflow's safe mode parses only the files that say "airflow" and
"dag".)
"""

from __future__ import annotations

from operators.paths import project_home
from recpipe.config.errors import ConfigError
from recpipe.config.retrain import load_retrain_configs

_broken = load_retrain_configs(project_home())[1]
if _broken:
    raise ConfigError(
        f"{len(_broken)} retrain config(s) do not load; their models have no DAG until fixed:\n\n"
        + "\n\n".join(f"{path}:\n{error}" for path, error in _broken.items())
    )
