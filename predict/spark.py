"""Batch prediction on Spark: the rows read by Spark, scored in its Python workers through Arrow
(``mapInArrow``; each worker loads the SavedModel once, ``predict.model.cached``), written by
Spark into a temporary directory that replaces the output whole. The same command runs in local
mode or on a cluster (``--master``). Not on a Spark Connect server: its Python client needs
protobuf 6, TensorFlow (which reads the export here) protobuf 5, so they cannot share a process."""

from __future__ import annotations

import os
import re
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql import types as T

from predict.columns import output_columns, reserved_columns, selected_columns
from predict.files import COMMAND, BadInputError, data_files, file_format
from predict.local import PredictOptions, csv_names, rebatch
from predict.model import ScoringModel, cached, scored
from recpipe import outputs as owned

_SPARK_TYPES = {"double": T.DoubleType(), "float": T.FloatType()}


def predict_on_spark(spark: SparkSession, saved_model: str | os.PathLike, input_path: str | os.PathLike,
                     output_path: str | os.PathLike, options: PredictOptions) -> dict:  # fmt: skip
    """Score every row under ``input_path`` into ``output_path`` on ``spark`` (see the module
    docstring); the same options and result as ``predict.local.predict_files``.

    Raises:
        BadInputError: no input, a missing column, a value of the wrong type (the first a worker
            met), a bad flag for this input; nothing is written then.
    """
    owned.check(output_path, COMMAND, [input_path])
    model = ScoringModel(saved_model)  # the driver's copy: inputs, outputs, data_config
    files = data_files(input_path)
    fmt = file_format(files, options.input_format)
    out_fmt = options.output_format or fmt
    paths = [str(f) for f in files]
    if fmt == "csv":
        sep = model.separator if options.input_sep is None else options.input_sep
        header = model.with_header if options.with_header is None else options.with_header
        names = csv_names(files[0], sep, header, model)
        schema = T.StructType([T.StructField(n, T.StringType()) for n in names])
        rows = spark.read.csv(paths, schema=schema, sep=sep, header=header, mode="FAILFAST")
    else:
        rows = spark.read.parquet(*paths)
    chosen = selected_columns(options.selected_cols, rows.columns)
    if chosen is not None:
        rows = rows.select(*chosen)
    outputs = output_columns(options.output_cols, model.outputs)
    reserved = reserved_columns(options.reserved_cols, rows.columns, [n for n, _ in outputs])
    schema = T.StructType(
        [rows.schema[c] for c in reserved] + [T.StructField(n, _SPARK_TYPES[k]) for n, k in outputs]
    )
    directory, batch_size, where = str(model.directory), options.batch_size, f"--input_path={input_path}"

    def score(batches):
        worker_model = cached(directory)
        for batch in rebatch(batches, batch_size):
            yield scored(worker_model, batch, reserved, outputs, where)

    out = rows.mapInArrow(score, schema)
    with owned.directory(output_path, COMMAND, [input_path]) as tmp:
        try:
            if out_fmt == "parquet":
                out.write.mode("overwrite").parquet(str(tmp))
                written = spark.read.parquet(str(tmp)).count()
            else:
                out.write.mode("overwrite").csv(str(tmp), sep=options.output_sep, header=False)
                written = spark.read.csv(str(tmp), sep=options.output_sep).count()
        except Exception as err:  # a worker's BadInputError arrives inside Spark's own error
            found = re.search(r"BadInputError: (.+)", str(err))
            if found is None:
                raise
            raise BadInputError(found.group(1).strip()) from None
        Path(tmp, "_SUCCESS").write_text("")
    return {"rows": written, "files": len(files), "columns": schema.names, "saved_model": directory}
