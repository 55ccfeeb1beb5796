"""SavedModel export in TF Serving's layout: ``<export_dir>/<version>/``.

The ``serving_default`` signature takes the raw feature columns (named by their
``input_name``, typed by ``data_config``: STRING -> string, INT32/INT64 -> int, FLOAT/DOUBLE ->
float) and returns ``probability`` and ``logit`` (``float32 [B]``). Inside it the same
transforms as the Spark job and the trainer's reader: ids cleaned then hashed
(``recpipe.ids``: the one other place ids are hashed), tags split, dense
values filled (NaN = missing) and normalised with the constants of the newest training day
(``<model_dir>/normalization.json``). Ids of online tables (``ev_params``) keep their full
fingerprint and look their row up in the id -> row map the SavedModel holds: an unknown or
not yet admitted id gets the zero row. Written to a temporary directory, then renamed.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import tensorflow as tf

from recpipe import atomic
from recpipe.config.data import FeatureSpec, FeatureType, InputType
from recpipe.config.pipeline import PipelineConfig
from recpipe.layout import ModelDir
from trainer.hashing import clean_ids, hash_ids, split_tags
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
        self.model = model
        self.features: list[FeatureSpec] = list(config.feature_config.features)
        self.normalization = normalization
        types = config.data_config.all_fields()
        self.inputs = {f.input_names[0]: types[f.input_names[0]] for f in self.features}
        spec = {name: tf.TensorSpec([None], TF_TYPES[kind], name=name) for name, kind in self.inputs.items()}
        self.serve = tf.function(self._serve, input_signature=[spec])

    def transform(self, raw: dict) -> dict:
        """Raw columns -> the model's features dict: what the Spark job writes (clean ids,
        split tags, filled and normalised dense values), then the ids hashed as the trainer's
        reader hashes them."""
        out = {}
        for f in self.features:
            x = raw[f.input_names[0]]
            if f.feature_type == FeatureType.IdFeature:
                out[f.name] = hash_ids(clean_ids(x), f.id_buckets)
            elif f.feature_type in (FeatureType.TagFeature, FeatureType.SequenceFeature):
                # a history arrives as the separated string the logs hold, oldest first
                out[f.name] = hash_ids(split_tags(x, f.separator), f.id_buckets)
            else:
                out[f.name] = normalize(x, self.normalization.get(f.name, {}))
        return out

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


EXPORT_RECORD = "recpipe_export.json"  # in assets.extra/: which model dir and step it holds


def write_saved_model(
    config: PipelineConfig, model: RankingModel, normalization: dict, directory: Path
) -> None:
    """Save ``model``'s serving module (``serving_default``) and the effective config
    (``assets.extra/pipeline.json``) into ``directory`` (new or empty: the caller writes to a
    temporary path and renames)."""
    # a copy: tf.Module swaps the nested dicts of an attribute for trackable wrappers in place
    module = ServingModule(config, model, json.loads(json.dumps(normalization)))
    tf.saved_model.save(
        module, str(directory), signatures={"serving_default": module.serve.get_concrete_function()}
    )
    (directory / "assets.extra").mkdir(exist_ok=True)
    (directory / "assets.extra" / "pipeline.json").write_text(json.dumps(config.to_dict(), indent=2))


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
        The final version directory.
    """
    export_dir = Path(export_dir)
    export_dir.mkdir(parents=True, exist_ok=True)
    tmp = atomic.temp_dir_beside(export_dir / "export")
    try:
        write_saved_model(config, model, read_normalization(model_dir), tmp)
        record = {"model_dir": str(Path(model_dir).resolve()), "global_step": global_step}
        (tmp / "assets.extra" / EXPORT_RECORD).write_text(json.dumps(record))
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
        record = version / "assets.extra" / EXPORT_RECORD
        if record.exists() and json.loads(record.read_text()) == want:
            return version
    return None
