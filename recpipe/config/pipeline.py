"""The whole pipeline config (EasyRec's ``EasyRecConfig``), as read from ``conf/*.yaml``."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator, model_validator

from recpipe.config.base import Section
from recpipe.config.data import DataConfig, FeatureConfig, FeatureType, InputType
from recpipe.config.model import (
    BATCH_LOSSES,
    MULTI_TASK_BLOCK,
    EvalConfig,
    EvalMethod,
    ExportConfig,
    ModelConfig,
)
from recpipe.config.train import TrainConfig

# a day or a pass (an hour), then optionally ":" and the range's last one
DS_RANGE = r"^\d{4}-\d{2}-\d{2}(/\d{2})?(:\d{4}-\d{2}-\d{2}(/\d{2})?)?$"


def check_ds_range(value: str | None, field: str) -> str | None:
    """``value`` as it is when it names real days (or passes) in order.

    Raises:
        ValueError: an impossible date or hour, ends of two kinds, or the end before the
            start; the message says which (``recpipe.layout.parse_ds_range``'s).
    """
    from recpipe.config.errors import ConfigError
    from recpipe.layout import parse_ds_range

    if value is None:
        return None
    try:
        parse_ds_range(value, field)
    except ConfigError as err:  # the field is named where the error is reported
        raise ValueError(str(err).removeprefix(f"{field}=")) from None
    return value


class PipelineConfig(Section):
    """One pipeline: where data lives and every section EasyRec names.

    Paths are relative to the working directory unless absolute. Day partitions below
    ``raw_input_path`` and ``train_input_path`` are ``ds=YYYY-MM-DD`` directories;
    ``train_ds`` / ``eval_ds`` select them (``YYYY-MM-DD`` or ``START:END``, inclusive). Passes
    (hours, ``ds=YYYY-MM-DD/hh=HH``) are selected as ``YYYY-MM-DD/HH[:YYYY-MM-DD/HH]``.
    """

    model_dir: str
    """Where training writes checkpoints, ``train_result.json`` and the exported model."""
    raw_input_path: str
    """The raw logs: ``ds=YYYY-MM-DD[/hh=HH]`` partitions, each complete once ``_SUCCESS`` is
    there (``dimension_tables`` beside them)."""
    train_input_path: str
    """The prepared features the feature job writes and training reads (Parquet partitions)."""
    eval_input_path: str | None = None
    """The features evaluation reads ``eval_ds`` from (null: ``train_input_path``)."""
    quarantine_path: str | None = None
    """Where the feature job writes the raw rows that fail the schema, each with its reason
    (null: ``<train_input_path>_quarantine``)."""
    train_ds: str | None = None
    """The days (or passes) to train on: ``YYYY-MM-DD``, ``START:END`` (inclusive), or
    ``YYYY-MM-DD/HH[:YYYY-MM-DD/HH]``."""
    eval_ds: str | None = None
    """The days (or passes) to evaluate on, in the same form."""
    data_config: DataConfig
    """Input columns, labels, batches."""
    feature_config: FeatureConfig
    """The features and their embeddings."""
    model_config_: ModelConfig | None = Field(None, alias="model_config")
    """The model (``model_config`` in the file)."""
    train_config: TrainConfig = Field(default_factory=TrainConfig)
    """Optimizers, steps, checkpoints, the distribution strategy."""
    eval_config: EvalConfig = Field(default_factory=EvalConfig)
    """Metrics and where evaluation runs."""
    export_config: ExportConfig = Field(default_factory=ExportConfig)
    """SavedModel export and retention."""

    model_config = {
        "extra": "forbid",
        "validate_assignment": True,
        "populate_by_name": True,
    }

    @field_validator("train_ds", "eval_ds")
    @classmethod
    def _real_days(cls, value: str | None, info) -> str | None:
        return check_ds_range(value, info.field_name)

    @model_validator(mode="after")
    def _weights_of_row_losses(self) -> PipelineConfig:
        model = self.model
        if self.data_config.sample_weight is None or model is None:
            return self
        owners = [model, *model.tasks]
        kinds = {t.loss_type for o in owners for t in o.losses}
        kinds |= {o.loss_type for o in owners if not o.losses}
        batch = sorted(k.value for k in kinds if k in BATCH_LOSSES)
        if batch:
            raise ValueError(
                f"data_config.sample_weight weighs each row's loss; {', '.join(batch)} is a loss of the "
                "batch as a whole"
            )
        return self

    @model_validator(mode="after")
    def _evaluated_for_best(self) -> PipelineConfig:
        export = self.export_config
        wants = "exporter_type: best" if export.exporter_type == "best" else None
        wants = wants or ("enable_early_stop: true" if export.enable_early_stop else None)
        if wants and self.eval_config.eval_method == EvalMethod.none:
            raise ValueError(
                f"export_config.{wants} compares the checkpoints evaluated while training: set "
                "eval_config.eval_method to separate or master"
            )
        return self

    @model_validator(mode="after")
    def _features_match_inputs(self) -> PipelineConfig:
        fields = self.data_config.all_fields()
        if not self.export_config.multi_placeholder and self.data_config.behavior_sequence is not None:
            raise ValueError(
                "export_config.multi_placeholder: false joins a row's fields into one string; a "
                "behavior_sequence history has no place in it (keep multi_placeholder: true)"
            )
        for i, feature in enumerate(self.feature_config.features):
            for column in feature.input_names:
                if column not in fields:
                    raise ValueError(
                        f"feature_config.features[{i}].input_names: {column!r} is not a column of "
                        "data_config.input_fields or a dimension table"
                    )
            column = feature.input_names[0]
            kind = fields[column]
            ids = (InputType.STRING, InputType.INT32, InputType.INT64)
            for column in feature.input_names:
                is_id = feature.feature_type in (FeatureType.IdFeature, FeatureType.ComboFeature)
                if is_id and fields[column] not in ids:
                    raise ValueError(
                        f"feature_config.features[{i}]: {feature.feature_type.value} {feature.name!r} "
                        f"needs a STRING or integer column, {column!r} is {fields[column].value}"
                    )
            if feature.feature_type == FeatureType.RawFeature and feature.ev_params is not None:
                raise ValueError(
                    f"feature_config.features[{i}].ev_params: RawFeature {feature.name!r} has no table"
                )
            listed = (FeatureType.TagFeature, FeatureType.SequenceFeature)
            if feature.feature_type in listed and kind != InputType.STRING:
                raise ValueError(
                    f"feature_config.features[{i}]: {feature.feature_type.value} {feature.name!r} needs "
                    f"a STRING column (or a behavior_sequence history), {column!r} is {kind.value}"
                )
        if self.model_config_ is not None:
            default = self.model_config_.ev_params
            for feature in self.feature_config.features:
                categorical = feature.feature_type != FeatureType.RawFeature
                if default is not None and categorical and feature.ev_params is None:
                    feature.ev_params = default
            self.task_labels()  # every task's label is a label field
            names = {f.name for f in self.feature_config.features}
            for g, group in enumerate(self.model_config_.feature_groups):
                unknown = [n for n in group.feature_names if n not in names]
                if unknown:
                    raise ValueError(
                        f"model_config.feature_groups[{g}].feature_names: unknown features {unknown}"
                    )
        return self

    def task_labels(self) -> list[tuple[int, float | None]]:
        """Each task's label as (its index in ``data_config.label_fields``, its
        ``label_threshold``), in the model's task order; empty for a single-task model.

        Raises:
            ValueError: a task's ``label_name`` is not a label field (or, unset, there is no
                label field at the tower's position)."""
        if self.model_config_ is None:
            return []
        fields = self.data_config.label_fields
        block = MULTI_TASK_BLOCK.get(self.model_config_.model_class)
        out = []
        for i, task in enumerate(self.model_config_.tasks):
            name = task.label_name or (fields[i] if i < len(fields) else None)
            if name not in fields:
                raise ValueError(
                    f"model_config.{block} tower {task.tower_name!r}: label_name {name!r} is not among "
                    f"data_config.label_fields {fields}"
                )
            out.append((fields.index(name), task.label_threshold))
        return out

    def resolved(self, home: Path) -> PipelineConfig:
        """A copy whose relative paths (model_dir, inputs, quarantine) are made absolute
        against ``home``: a job whose working directory differs (spark-submit's JVM) reads the
        same files."""
        fields = ("model_dir", "raw_input_path", "train_input_path", "eval_input_path", "quarantine_path")
        update = {f: str(Path(home) / getattr(self, f)) for f in fields if getattr(self, f)}
        return self.model_copy(update=update)

    def named_paths(self) -> dict[str, str]:
        """Every filesystem path the config names, keyed by its field (as overrides spell
        it): model_dir, the input, eval and quarantine paths, ``train_config``'s
        fine_tune_checkpoint and fine_tune_ckpt_var_map, and each dimension table's file
        (joined to ``raw_input_path`` when relative, as the Spark job reads it). Unset
        fields are left out."""
        tc = self.train_config
        out = {
            "model_dir": self.model_dir,
            "raw_input_path": self.raw_input_path,
            "train_input_path": self.train_input_path,
            "eval_input_path": self.eval_input_path,
            "quarantine_path": self.effective_quarantine_path,
            "train_config.fine_tune_checkpoint": tc.fine_tune_checkpoint,
            "train_config.fine_tune_ckpt_var_map": tc.fine_tune_ckpt_var_map,
        }
        for table in self.data_config.dimension_tables:
            out[f"data_config.dimension_tables[name={table.name}].path"] = str(
                Path(self.raw_input_path) / table.path
            )
        return {k: v for k, v in out.items() if v}

    @property
    def model(self) -> ModelConfig | None:
        """``model_config`` (named so because pydantic reserves ``model_config``)."""
        return self.model_config_

    @property
    def effective_quarantine_path(self) -> str:
        """Where rows that fail the schema go; defaults beside the features."""
        return self.quarantine_path or self.train_input_path.rstrip("/") + "_quarantine"

    def to_dict(self) -> dict:
        """The config as plain data, with EasyRec's section names."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)
