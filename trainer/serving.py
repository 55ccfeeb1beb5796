"""SavedModel export in TF Serving's layout: ``<export_dir>/<version>/``.

The ``serving_default`` signature takes the raw feature columns (named by their
``input_name``, typed by ``data_config``: STRING -> string, INT32/INT64 -> int, FLOAT/DOUBLE ->
float), or with ``export_config.multi_placeholder: false`` EasyRec's one string input
``features`` (each row's non-label fields joined by ``data_config.separator``), and returns
``probability`` and ``logit`` (``float32 [B]``). Inside it the same
transforms as the Spark job and the trainer's reader: ids cleaned then hashed
(``recpipe.ids``: the one other place ids are hashed), tags split, dense
values filled (NaN = missing) and normalised with the constants of the newest training day
(``<model_dir>/normalization.json``). Ids of online tables (``ev_params``) keep their full
fingerprint and look their row up in the id -> row map the SavedModel holds: an unknown or
not yet admitted id gets the zero row. A model with online tables also gets ``ids`` (a
request's ids per table of the online store) and ``serving_rows`` (the request with the rows a
client read from the store: ``trainer.online.served``; the inputs of each table in
``assets.extra/serving_rows.json``). Written to a temporary directory, then renamed.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import tensorflow as tf

from recpipe import atomic, outputs
from recpipe.config.data import FeatureSpec, FeatureType, InputType
from recpipe.config.pipeline import PipelineConfig
from recpipe.layout import PIPELINE_ASSET, SAVED_MODEL_RECORD, SERVING_ROWS, ModelDir
from trainer import online
from trainer.hashing import clean_ids, combo_ids, feature_ids, split_tags
from trainer.models.multitask import MultiTaskModel
from trainer.models.ranking import RankingModel

TF_TYPES = {
    InputType.STRING: tf.string,
    InputType.INT32: tf.int32,
    InputType.INT64: tf.int64,
    InputType.FLOAT: tf.float32,
    InputType.DOUBLE: tf.float64,
    InputType.BOOL: tf.bool,
}


def normalize(x: tf.Tensor, params: dict) -> tf.Tensor:
    """The Spark job's fill + normalisation (``features.transform.normalize``), in float64."""
    x = tf.cast(x, tf.float64)
    x = tf.where(tf.math.is_nan(x), tf.constant(params.get("fill", 0.0), tf.float64), x)
    method = params.get("method", "none")
    if method == "log":
        x = tf.sign(x) * tf.math.log1p(tf.abs(x))
    elif method == "min_max":
        x = tf.clip_by_value((x - params["min"]) / (params["max"] - params["min"]), 0.0, 1.0)
    elif method == "standard":
        x = (x - params["mean"]) / params["std"]
    return tf.cast(x, tf.float32)


class ServingModule(tf.Module):
    """Raw request columns -> {probability, logit}; see the module docstring."""

    def __init__(self, config: PipelineConfig, model: RankingModel, normalization: dict):
        super().__init__()
        # the model's variables are what the SavedModel keeps; the Keras model itself is left
        # untracked, so that saving does not trace every layer's call for Keras's own format
        # (no reader loads it as Keras: serving, predict and MLflow use the signatures)
        object.__setattr__(self, "model", model)
        self.model_variables = list(model.variables)
        self.model_resources = [  # the online tables' id maps
            t
            for t in tf.train.TrackableView(model).descendants()
            if isinstance(t, tf.saved_model.experimental.TrackableResource)
        ]
        self.features: list[FeatureSpec] = list(config.feature_config.features)
        self.normalization = normalization
        dc = config.data_config
        types = dc.all_fields()
        self.inputs = {c: types[c] for f in self.features for c in f.input_names}
        spec = {name: tf.TensorSpec([None], TF_TYPES[kind], name=name) for name, kind in self.inputs.items()}
        if not config.export_config.multi_placeholder:
            # EasyRec's single placeholder: every non-label field, in order, in one string
            self.joined = [n for n in dc.all_fields(sequences=False) if n not in dc.label_fields]
            self.separator = dc.separator
            self.defaults = {f.input_name: f.default_val for f in dc.input_fields}
            for table in dc.dimension_tables:
                for f in table.input_fields:
                    self.defaults.setdefault(f.input_name, f.default_val)
            spec = {"features": tf.TensorSpec([None], tf.string, name="features")}
            self.serve = tf.function(self._serve_joined, input_signature=[spec], autograph=False)
        else:
            self.serve = tf.function(self._serve, input_signature=[spec], autograph=False)
            if online.tables(model):  # the rows a client reads from the online store
                self.row_inputs = online.row_inputs(online.tables(model))
                rows_spec = dict(spec)
                for entry in self.row_inputs.values():
                    rows_spec[entry["ids"]] = tf.TensorSpec([None], tf.int64, name=entry["ids"])
                    for name, dim in entry["views"].values():
                        rows_spec[name] = tf.TensorSpec([None, dim], tf.float32, name=name)
                self.ids = tf.function(self._ids, input_signature=[spec], autograph=False)
                self.serve_rows = tf.function(self._serve_rows, input_signature=[rows_spec], autograph=False)

    def transform(self, raw: dict) -> dict:
        """Raw columns -> the model's features dict: what the Spark job writes (clean ids,
        split tags, filled and normalised dense values), then the ids hashed as the trainer's
        reader hashes them."""
        out = {}
        for f in self.features:
            x = raw[f.input_names[0]]
            if f.boundaries is not None:  # bucketized as the reader does (searchsorted, right)
                filled = normalize(x, self.normalization.get(f.name, {}))
                out[f.name] = tf.cast(tf.raw_ops.Bucketize(input=filled, boundaries=f.boundaries), tf.int64)
            elif f.feature_type == FeatureType.IdFeature:
                out[f.name] = feature_ids(clean_ids(x), f)
            elif f.feature_type == FeatureType.ComboFeature:
                out[f.name] = feature_ids(combo_ids([raw[c] for c in f.input_names], f.combo_join_sep), f)
            elif f.feature_type in (FeatureType.TagFeature, FeatureType.SequenceFeature):
                # a history arrives as the separated string the logs hold, oldest first
                out[f.name] = feature_ids(split_tags(x, f.separator), f)
            else:
                out[f.name] = normalize(x, self.normalization.get(f.name, {}))
        return out

    def split(self, rows: tf.Tensor) -> dict:
        """``features`` (``string [B]``, the joined fields) -> the typed columns ``_serve``
        takes; a blank field takes its ``default_val``, else missing (NaN), ``0`` or ``""``."""
        parts = tf.strings.split(rows, self.separator).to_tensor(
            default_value="", shape=[None, len(self.joined)]
        )
        raw = {}
        for i, name in enumerate(self.joined):
            if name not in self.inputs:
                continue
            kind, text = self.inputs[name], tf.strings.strip(parts[:, i])
            default = self.defaults.get(name)
            if default is not None:
                text = tf.where(tf.equal(text, ""), tf.constant(default.strip() or default), text)
            if kind == InputType.STRING:
                raw[name] = text
            elif kind in (InputType.FLOAT, InputType.DOUBLE):
                blank = tf.equal(text, "")
                number = tf.strings.to_number(tf.where(blank, "0", text), tf.float64)
                raw[name] = tf.cast(
                    tf.where(blank, tf.constant(float("nan"), tf.float64), number), TF_TYPES[kind]
                )
            elif kind == InputType.BOOL:
                raw[name] = tf.equal(tf.strings.lower(text), "true") | tf.equal(text, "1")
            else:
                number = tf.strings.to_number(tf.where(tf.equal(text, ""), "0", text), tf.int64)
                raw[name] = tf.cast(number, TF_TYPES[kind])
        return raw

    def _ids(self, raw):
        tables = online.tables(self.model)
        for ev in tables:
            ev.served = online.RecordIds(ev)
        try:
            self.model(self.transform(raw), training=False)
            return {member: ids for ev in tables for member, ids in ev.served.ids().items()}
        finally:
            for ev in tables:
                ev.served = None

    def _serve_rows(self, inputs):
        tables = online.tables(self.model)
        for ev in tables:
            entries = [self.row_inputs[m] for m in ev.members]
            ids = {m: inputs[e["ids"]] for m, e in zip(ev.members, entries, strict=True)}
            rows = {field: inputs[name] for e in entries for field, (name, _) in e["views"].items()}
            ev.served = online.ProvidedRows(ev, ids, rows)
        try:
            return self._serve({name: inputs[name] for name in self.inputs})
        finally:
            for ev in tables:
                ev.served = None

    def _serve_joined(self, rows):
        return self._serve(self.split(rows["features"]))

    def _serve(self, raw):
        features = self.transform(raw)
        if not isinstance(self.model, MultiTaskModel):
            logit = self.model(features, training=False)
            return {"probability": tf.sigmoid(logit), "logit": logit}
        # a multi-task model: the first task as probability / logit, then every task by name
        logit, extra = self.model.task_outputs(features, training=False)
        out = {"probability": tf.sigmoid(logit[:, 0]), "logit": logit[:, 0]}
        for i, name in enumerate(self.model.task_names):
            out[f"probability_{name}"] = tf.sigmoid(logit[:, i])
            out[f"logit_{name}"] = logit[:, i]
        out.update({f"probability_{k}": v for k, v in extra.items()})
        return out


def write_saved_model(
    config: PipelineConfig, model: RankingModel, normalization: dict, directory: Path
) -> None:
    """Save ``model``'s serving module (``serving_default``), the effective config
    (``assets.extra/pipeline.json``) and ``export_config.asset_files`` into ``directory`` (new
    or empty: the caller writes to a temporary path and renames).

    Raises:
        FileNotFoundError: an ``asset_files`` entry is not a file.
    """
    # a copy: tf.Module swaps the nested dicts of an attribute for trackable wrappers in place
    module = ServingModule(config, model, json.loads(json.dumps(normalization)))
    signatures = {"serving_default": module.serve.get_concrete_function()}
    if hasattr(module, "serve_rows"):
        signatures |= {
            "ids": module.ids.get_concrete_function(),
            "serving_rows": module.serve_rows.get_concrete_function(),
        }
    tf.saved_model.save(module, str(directory), signatures=signatures)
    (directory / "assets.extra").mkdir(exist_ok=True)
    if hasattr(module, "serve_rows"):
        layout = {
            m: {"ids": e["ids"], "views": {f: n for f, (n, _) in e["views"].items()}}
            for m, e in module.row_inputs.items()
        }
        (directory / "assets.extra" / SERVING_ROWS).write_text(json.dumps(layout, indent=2))
    (directory / "assets.extra" / PIPELINE_ASSET).write_text(json.dumps(config.to_dict(), indent=2))
    for name in config.export_config.asset_files:
        source = Path(name)
        if not source.is_file():
            raise FileNotFoundError(f"export_config.asset_files: {source} is not a file (from {Path.cwd()})")
        shutil.copyfile(source, directory / "assets.extra" / source.name)


def read_normalization(model_dir: str | Path) -> dict:
    """The dense normalisation constants serving applies (``<model_dir>/normalization.json``'s
    ``features``; empty when the model has no dense feature)."""
    norm_file = ModelDir(model_dir).normalization
    return json.loads(norm_file.read_text()).get("features", {}) if norm_file.exists() else {}


def export_saved_model(
    config: PipelineConfig,
    model: RankingModel,
    model_dir: str | Path,
    export_dir: str | Path,
    global_step: int | None = None,
) -> Path:
    """Write the SavedModel to ``export_dir/<version>/`` (version: unix seconds, increasing;
    two exports in the same second get distinct versions, ``atomic.publish_numbered``).

    ``assets.extra/recpipe_export.json`` records the model dir and ``global_step``, so a retried
    export finds the version an earlier attempt published (``find_export``).

    Returns:
        The final version directory (a new one, never an existing directory replaced).

    Raises:
        recpipe.outputs.OutputNotOwnedError: ``export_dir`` is a data root.
    """
    export_dir = Path(export_dir)
    outputs.refuse_root(export_dir.resolve(), "export_dir")
    export_dir.mkdir(parents=True, exist_ok=True)
    tmp = atomic.temp_dir_beside(export_dir / "export")
    try:
        write_saved_model(config, model, read_normalization(model_dir), tmp)
        record = {"model_dir": str(Path(model_dir).resolve()), "global_step": global_step}
        (tmp / "assets.extra" / SAVED_MODEL_RECORD).write_text(json.dumps(record))
        outputs.mark(tmp, "export", [model_dir])
        return atomic.publish_numbered(tmp, export_dir, int(time.time()))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def find_export(export_dir: str | Path, model_dir: str | Path, global_step: int) -> Path | None:
    """The newest version under ``export_dir`` exported from ``model_dir`` at ``global_step``
    (an earlier attempt's), or None."""
    export_dir = Path(export_dir)
    want = {"model_dir": str(Path(model_dir).resolve()), "global_step": global_step}
    if not export_dir.is_dir():
        return None
    for version in sorted((p for p in export_dir.iterdir() if p.name.isdigit()), key=lambda p: -int(p.name)):
        record = version / "assets.extra" / SAVED_MODEL_RECORD
        if record.exists() and json.loads(record.read_text()) == want:
            return version
    return None
