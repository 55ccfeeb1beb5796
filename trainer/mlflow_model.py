"""The export as an MLflow Model: the ``python_function`` (pyfunc) flavor over the SavedModel,
so that ``mlflow.pyfunc.load_model("models:/<name>@champion")`` and ``mlflow models serve``
answer with the SavedModel's probabilities. (``mlflow.tensorflow`` logs Keras models only; the
serving module here is a ``tf.Module``.)

Its signature is the SavedModel's: the raw columns of ``data_config`` (and its dimension
tables) that the features read, typed as declared; outputs ``probability`` and ``logit``
(float32). Its input example is real rows of a raw day, joined with the dimension tables as the
Spark job joins them.
"""

# Imports inside functions: TensorFlow and MLflow are imported when a model is saved or loaded:
# the scoring server's pyfunc module loads light.

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import mlflow.pyfunc
import pandas as pd
import pyarrow as pa
import pyarrow.csv as pacsv

from recpipe import atomic
from recpipe.config.data import InputType
from recpipe.config.model import ModelClass
from recpipe.config.pipeline import PipelineConfig
from recpipe.layout import ds_partition

log = logging.getLogger(__name__)

MLFLOW_TYPES = {
    InputType.STRING: "string",
    InputType.INT32: "integer",
    InputType.INT64: "long",
    InputType.FLOAT: "float",
    InputType.DOUBLE: "double",
    InputType.BOOL: "boolean",
}
ARROW_TYPES = {
    InputType.STRING: pa.string(),
    InputType.INT32: pa.int32(),
    InputType.INT64: pa.int64(),
    InputType.FLOAT: pa.float32(),
    InputType.DOUBLE: pa.float64(),
    InputType.BOOL: pa.bool_(),
}


class SavedModelPyfunc(mlflow.pyfunc.PythonModel):
    """pyfunc over the artifact ``saved_model``: a DataFrame of raw columns -> a DataFrame of
    ``probability`` and ``logit`` (float32), one row per input row."""

    def load_context(self, context) -> None:
        import tensorflow as tf

        loaded = tf.saved_model.load(context.artifacts["saved_model"])
        self._keep = loaded  # the signature needs its object alive
        self._serve = loaded.signatures["serving_default"]

    def predict(self, context, model_input, params=None):
        import numpy as np
        import pandas as pd
        import tensorflow as tf

        feed = {}
        for name, spec in self._serve.structured_input_signature[1].items():
            column = model_input[name]
            if spec.dtype == tf.string:
                values = column.fillna("").astype(str).to_numpy(dtype=object)
            else:
                values = column.to_numpy(dtype=spec.dtype.as_numpy_dtype)
            feed[name] = tf.constant(values, dtype=spec.dtype)
        out = self._serve(**feed)
        # probability and logit first, then a multi-task model's per task
        names = ["probability", "logit", *sorted(k for k in out if k not in ("probability", "logit"))]
        return pd.DataFrame({k: np.asarray(out[k].numpy(), dtype=np.float32) for k in names})


def serving_inputs(config: PipelineConfig) -> dict[str, InputType]:
    """The raw columns the SavedModel takes, in feature order, with their types."""
    types = config.data_config.all_fields()
    return {c: types[c] for f in config.feature_config.features for c in f.input_names}


def signature(config: PipelineConfig):
    """The MLflow ``ModelSignature`` of the SavedModel's ``serving_default``."""
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, Schema

    inputs = Schema([ColSpec(MLFLOW_TYPES[t], name) for name, t in serving_inputs(config).items()])
    names = ["probability", "logit"]
    model = config.model
    if model is not None and model.tasks:
        tasks = list(model.task_names)
        if model.model_class == ModelClass.ESMM:
            tasks.append(model.tasks[1].tower_name)  # p_cvr beside p_ctr and p_ctcvr
        names += sorted([f"probability_{t}" for t in tasks] + [f"logit_{t}" for t in model.task_names])
    outputs = Schema([ColSpec("float", n) for n in names])
    return ModelSignature(inputs=inputs, outputs=outputs)


def raw_rows(config: PipelineConfig, ds: str, limit: int = 5):
    """The first ``limit`` rows of raw day (or pass) ``ds`` with the dimension tables joined (left, on
    each table's key), as the serving inputs (a pandas DataFrame), or None without the day."""
    dc = config.data_config
    files = sorted(ds_partition(config.raw_input_path, ds).glob("*.csv"))
    if not files:
        return None

    def read(path: Path, fields, separator: str, rows: int | None = None) -> pa.Table:
        # every column as text: raw logs hold bad values ("unknown" years) that the Spark job
        # turns into nulls; the same happens below
        options = dict(
            parse_options=pacsv.ParseOptions(delimiter=separator),
            convert_options=pacsv.ConvertOptions(column_types={f.input_name: pa.string() for f in fields}),
        )
        if rows is None:  # a dimension table: all of it
            return pacsv.read_csv(path, **options)
        # the first rows only, streamed: a production day's file is gigabytes
        with pacsv.open_csv(path, read_options=pacsv.ReadOptions(block_size=1 << 20), **options) as reader:
            batches = []
            while sum(b.num_rows for b in batches) < rows:
                try:
                    batches.append(reader.read_next_batch())
                except StopIteration:
                    break
            return pa.Table.from_batches(batches, schema=reader.schema).slice(0, rows)

    table = read(files[0], dc.input_fields, dc.separator, rows=limit)
    for dim in dc.dimension_tables:
        path = Path(dim.path) if Path(dim.path).is_absolute() else Path(config.raw_input_path) / dim.path
        table = table.join(read(path, dim.input_fields, dim.separator), dim.key, join_type="left outer")
    inputs = serving_inputs(config)
    frame = table.select(list(inputs)).to_pandas().head(limit)
    for name, kind in inputs.items():
        if kind in (InputType.FLOAT, InputType.DOUBLE):
            frame[name] = pd.to_numeric(frame[name], errors="coerce").astype(
                ARROW_TYPES[kind].to_pandas_dtype()
            )
        elif kind in (InputType.INT32, InputType.INT64):
            values = pd.to_numeric(frame[name], errors="coerce").fillna(0)
            frame[name] = values.astype(ARROW_TYPES[kind].to_pandas_dtype())
        elif kind == InputType.BOOL:
            frame[name] = frame[name].str.lower().isin(["true", "1"])
        else:
            frame[name] = frame[name].fillna("")
    return frame[list(inputs)]


def save_mlflow_model(
    config: PipelineConfig, saved_model: str | Path, out: str | Path, example_ds: str | None
):
    """Write the MLflow Model (pyfunc over a copy of ``saved_model``) to ``out``, atomically,
    with the signature and, when ``example_ds``'s raw day is at hand, its rows as input example.

    Returns:
        ``out`` as a ``Path``.
    """
    import tensorflow as tf

    out = Path(out)
    example = None
    if example_ds:
        try:
            example = raw_rows(config, example_ds)
        except (OSError, pa.ArrowException, KeyError, ValueError) as err:  # the model matters more
            log.warning("no input example from raw day %s: %s", example_ds, err)
    tmp = atomic.temp_dir_beside(out)
    try:
        mlflow.pyfunc.save_model(
            str(tmp / "model"),
            python_model=SavedModelPyfunc(),
            artifacts={"saved_model": str(saved_model)},
            signature=signature(config),
            input_example=example,
            # explicit: inferring them would start a process that imports everything again
            pip_requirements=[f"tensorflow=={tf.__version__}", f"mlflow=={mlflow.__version__}", "pandas"],
        )
        atomic.replace_dir(tmp / "model", out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out
