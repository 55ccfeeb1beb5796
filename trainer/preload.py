"""What a fork server (``recpipe.forkserver``) imports before it forks trainer processes, by
being imported: trainer's package first (it sets TensorFlow's variables), then the libraries
every job imports (scipy.stats for the AUC's ranks, mlflow for an export's MLflow model). The
server's starter names this module: ``forkserver.start(preload=("trainer.preload",))``."""

import importlib

MODULES = (
    "trainer",
    "tensorflow",
    "tf_keras",
    "pandas",
    "pyarrow.parquet",
    "pydantic",
    "yaml",
    "scipy.stats",
    "mlflow",
)

for _name in MODULES:
    importlib.import_module(_name)
