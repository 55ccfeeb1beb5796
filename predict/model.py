"""A SavedModel export loaded to score Arrow record batches.

The export's ``serving_default`` signature (``trainer.serving``) takes the raw columns by
``input_name``; this module turns an Arrow batch into those tensors as the feature job reads the
raw text (blank -> ``input_fields.default_val``, else missing: NaN for a dense value, ``""`` for
an id), calls it, and returns the outputs under EasyRec's names (``predict.columns``).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from predict.columns import easyrec_name
from predict.files import BadInputError
from predict.stderr import native_stderr_held
from recpipe.errors import PipelineError, UsageError
from recpipe.layout import PIPELINE_ASSET

with native_stderr_held():
    import tensorflow as tf


def find_saved_model(path: str | Path) -> Path:
    """``path`` if it holds ``saved_model.pb``, else its newest numbered version
    (TF Serving's layout, ``<export_dir>/<version>/``).

    Raises:
        UsageError: neither is there.
    """
    path = Path(path)
    if (path / "saved_model.pb").is_file():
        return path
    versions = (
        [p for p in path.iterdir() if p.name.isdigit() and (p / "saved_model.pb").is_file()]
        if path.is_dir()
        else []
    )
    if not versions:
        raise UsageError(
            f"--saved_model_dir={path}: no saved_model.pb in it nor in a numbered version below it"
        )
    return max(versions, key=lambda p: int(p.name))


def registered_export(client, model_name: str, alias: str) -> Path:
    """The export (``export_path`` tag) of the version of ``model_name`` that ``alias`` names
    in MLflow's model registry.

    Raises:
        PipelineError: no such model or alias, or the version has no export on disk.
    """
    from mlflow.exceptions import MlflowException

    try:
        version = client.get_model_version_by_alias(model_name, alias)
    except MlflowException as err:
        raise PipelineError(f"--model_name={model_name} --alias={alias}: {err.message}") from None
    export = version.tags.get("export_path")
    if not export or not Path(export).exists():
        raise PipelineError(
            f"--model_name={model_name} --alias={alias}: version {version.version}'s export "
            f"{export or '(untagged)'} is gone"
        )
    return Path(export)


def _order(name: str) -> tuple[str, int]:
    # probability before logit, the first task's pair before each named task's
    kind, _, task = name.partition("_")
    return task, 0 if kind == "probability" else 1


class ScoringModel:
    """A loaded export: ``inputs`` (column -> ``tf.DType``), ``outputs`` (EasyRec names, in
    order), ``field_order`` (the events' columns as ``data_config.input_fields`` lists them: a
    header-less CSV's names), ``separator`` and ``with_header`` (its ``data_config``'s)."""

    def __init__(self, directory: str | Path):
        self.directory = find_saved_model(directory)
        with native_stderr_held():
            self._loaded = tf.saved_model.load(str(self.directory))
        self._fn = self._loaded.signatures["serving_default"]
        self.inputs = {name: spec.dtype for name, spec in self._fn.structured_input_signature[1].items()}
        self._names = sorted(self._fn.structured_outputs, key=_order)
        self.outputs = [easyrec_name(n) for n in self._names]
        record = self.directory / "assets.extra" / PIPELINE_ASSET
        data = json.loads(record.read_text()).get("data_config", {}) if record.exists() else {}
        fields = list(data.get("input_fields", []))
        for table in data.get("dimension_tables", []):
            fields += table.get("input_fields", [])
        self.defaults = {f["input_name"]: f.get("default_val") for f in fields}
        self.field_order = [f["input_name"] for f in data.get("input_fields", [])]
        self.separator = data.get("separator", ",")
        self.with_header = bool(data.get("with_header", True))
        labels = set(data.get("label_fields", []))
        # export_config.multi_placeholder: false: one string input, these fields joined
        self.joined = [n for n in dict.fromkeys(f["input_name"] for f in fields) if n not in labels]

    def score(self, batch: pa.RecordBatch, where: str, first_row: int = 0) -> dict[str, np.ndarray]:
        """The model's outputs on ``batch``: EasyRec name -> ``float32 [B]``.

        Args:
            batch: rows with (at least) every column in ``inputs``; CSV text or typed values.
            where: the file the rows come from, for messages.
            first_row: how many rows of that file came before ``batch``.

        Raises:
            BadInputError: a column is missing, or a value is not of the column's type.
        """
        tensors = {
            name: self._tensor(batch, name, dtype, where, first_row) for name, dtype in self.inputs.items()
        }
        out = self._fn(**tensors)
        return {easyrec_name(n): out[n].numpy() for n in self._names}

    def _tensor(self, batch: pa.RecordBatch, name: str, dtype: tf.DType, where: str, first_row: int):
        index = batch.schema.get_field_index(name)
        if index < 0 and name == "features" and dtype == tf.string and list(self.inputs) == ["features"]:
            return tf.constant(self._joined(batch, where).to_numpy(zero_copy_only=False).astype(object))
        if index < 0:
            raise BadInputError(
                f"{where}: no column {name!r}, which the model takes (it takes: {', '.join(self.inputs)}; "
                f"the input has: {', '.join(batch.schema.names)})"
            )
        column = batch.column(index)
        default = self.defaults.get(name)
        if dtype == tf.string:
            text = pc.cast(column, pa.string())
            return tf.constant(text.fill_null(default or "").to_numpy(zero_copy_only=False).astype(object))
        target = {tf.float32: pa.float64(), tf.float64: pa.float64(), tf.bool: pa.bool_()}.get(
            dtype, pa.int64()
        )
        if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
            stripped = pc.utf8_trim_whitespace(column)
            column = pc.if_else(pc.equal(stripped, ""), pa.scalar(None, column.type), stripped)
        try:
            values = pc.cast(column, target)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            raise self._bad_value(column, target, name, where, first_row) from None
        if values.null_count:
            if default is not None:
                values = values.fill_null(pc.cast(pa.scalar(default.strip() or default), target))
            elif target == pa.float64():
                values = values.fill_null(float("nan"))
            else:
                row = first_row + pc.index(pc.is_null(values), True).as_py() + 1
                raise BadInputError(
                    f"{where} row {row}: column {name!r} is empty and "
                    f"input_fields.{name}.default_val is unset"
                )
        return tf.constant(values.to_numpy(zero_copy_only=False), dtype=dtype)

    def _joined(self, batch: pa.RecordBatch, where: str) -> pa.Array:
        # the single placeholder's rows: the fields as text, blanks as empty, joined in order
        missing = [n for n in self.joined if batch.schema.get_field_index(n) < 0]
        if missing:
            raise BadInputError(
                f"{where}: no column {missing[0]!r}, which the model's one joined input holds (it joins: "
                f"{', '.join(self.joined)}; the input has: {', '.join(batch.schema.names)})"
            )
        texts = [
            pc.cast(batch.column(batch.schema.get_field_index(n)), pa.string()).fill_null("")
            for n in self.joined
        ]
        return pc.binary_join_element_wise(*texts, self.separator)

    @staticmethod
    def _bad_value(column, target, name: str, where: str, first_row: int) -> BadInputError:
        for i, value in enumerate(column.to_pylist()):
            try:
                pc.cast(pa.array([value]), target)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                return BadInputError(
                    f"{where} row {first_row + i + 1}: column {name!r}: {value!r} is not a {target} value"
                )
        return BadInputError(f"{where}: column {name!r} of type {column.type} cannot be read as {target}")


_LOADED: dict[str, ScoringModel] = {}


def cached(directory: str | Path) -> ScoringModel:
    """The export at ``directory``, loaded once per process (a Spark Python worker keeps it
    for every batch and task it runs)."""
    key = str(directory)
    if key not in _LOADED:
        _LOADED[key] = ScoringModel(directory)
    return _LOADED[key]


def scored(
    model: ScoringModel,
    batch: pa.RecordBatch,
    reserved: list[str],
    outputs: list[tuple[str, str]],
    where: str,
    first_row: int = 0,
) -> pa.RecordBatch:
    """``batch``'s ``reserved`` columns as they came, then each output ``(name, "double" |
    "float")`` of ``model.score`` as ``float64`` / ``float32``: the rows of the output file."""
    scores = model.score(batch, where, first_row)
    arrays = [batch.column(batch.schema.get_field_index(c)) for c in reserved]
    arrays += [
        pa.array(scores[n].astype(np.float64 if kind == "double" else np.float32)) for n, kind in outputs
    ]
    return pa.RecordBatch.from_arrays(arrays, names=[*reserved, *(n for n, _ in outputs)])


def output_schema(reserved: list[pa.Field], outputs: list[tuple[str, str]]) -> pa.Schema:
    """The schema ``scored`` writes: the reserved columns' fields, then the outputs."""
    kinds = {"double": pa.float64(), "float": pa.float32()}
    return pa.schema([*reserved, *(pa.field(n, kinds[k]) for n, k in outputs)])
