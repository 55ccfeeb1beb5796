"""``data_config`` and ``feature_config``: what the raw logs hold and how features are built.

Field names follow EasyRec's ``DatasetConfig`` and ``FeatureConfig`` (input_fields,
input_name, input_type, label_fields, feature_type IdFeature / RawFeature / TagFeature,
embedding_dim, hash_bucket_size, embedding_name, combiner, separator).
"""

from __future__ import annotations

import itertools
from enum import StrEnum

from pydantic import Field, field_validator, model_validator

from recpipe.config.base import OneOf, Section


class InputType(StrEnum):
    """Raw column types (EasyRec ``DatasetConfig.FieldType``)."""

    STRING = "STRING"
    INT32 = "INT32"
    INT64 = "INT64"
    FLOAT = "FLOAT"
    DOUBLE = "DOUBLE"
    BOOL = "BOOL"


class InputField(Section):
    """One column of the raw logs."""

    input_name: str
    """The column's name (in a header, or its position's name)."""
    input_type: InputType = InputType.STRING
    """Its type: ``STRING``, ``INT32``, ``INT64``, ``FLOAT``, ``DOUBLE`` or ``BOOL``."""
    default_val: str | None = None
    """The value an empty or missing field takes, as text of its type (EasyRec's
    ``input_fields.default_val``; null: the row keeps a null, and a blank label quarantines
    it)."""

    @model_validator(mode="after")
    def _default_of_its_type(self) -> InputField:
        if self.default_val is None or self.input_type == InputType.STRING:
            return self
        text = self.default_val.strip()
        try:
            if self.input_type in (InputType.INT32, InputType.INT64):
                int(text)
            elif self.input_type == InputType.BOOL:
                if text.lower() not in ("true", "false", "0", "1"):
                    raise ValueError(text)
            else:
                float(text)
        except ValueError:
            raise ValueError(
                f"default_val: {self.default_val!r} is not a {self.input_type.value} value"
            ) from None
        return self


class DimensionTable(Section):
    """A dimension snapshot joined to each day's events on ``key`` (e.g. users, items).

    ``path`` is relative to ``raw_input_path`` unless absolute; the file is delimited text
    with a header, ``input_fields`` typed as in the events.
    """

    name: str
    """The table's name (``users``, ``items``)."""
    path: str
    """Its file, relative to ``raw_input_path`` unless absolute."""
    key: str
    """The column it shares with the events and is joined on."""
    separator: str = ","
    """Its column separator."""
    input_fields: list[InputField]
    """Its columns, typed as the events' are."""


class BehaviorSequence(Section):
    """Each event's behaviour history, derived by the Spark job (``features.sequence``): the
    ``fields`` of the user's last ``max_length`` events before the event's ``time_field``,
    oldest first, as columns ``<prefix><field>`` (``array<string>``) that a
    ``SequenceFeature`` reads. Only events strictly earlier than the event enter its history
    (never the event itself, a later one, or one at the same time); earlier days come from a
    per-user state the job carries day to day (``<train_input_path>/_sequence_state/``).
    With ``positive_only`` only events whose first label is positive (clicks) enter it.
    The sequences DIN attends over (Zhou et al., 2018, "Deep Interest Network").
    """

    user_field: str
    """The column whose events form a history (the user's id)."""
    time_field: str
    """The event time (``INT32`` / ``INT64``, seconds); only strictly earlier events enter."""
    fields: list[str] = Field(min_length=1)
    """The columns of past events the history holds (item id, rating, ...)."""
    max_length: int = Field(20, gt=0)
    """The most recent events kept per history."""
    prefix: str = "hist_"
    """Prefix of the history columns: ``<prefix><field>``."""
    positive_only: bool = False
    """Keep only events whose first label is positive (clicks)."""

    def column(self, field: str) -> str:
        """The history column of ``field``: ``<prefix><field>``."""
        return f"{self.prefix}{field}"

    @property
    def columns(self) -> list[str]:
        """The history columns, in ``fields`` order."""
        return [self.column(f) for f in self.fields]


class DataConfig(Section):
    """Raw log format and the input pipeline's batching (EasyRec ``data_config``)."""

    input_format: str = Field("csv", pattern="^(csv|parquet)$")
    """``csv``: delimited text (any one-character ``separator``); ``parquet``: columns by name,
    their types checked against ``input_fields``."""
    separator: str = ","
    """The column separator of text logs (``"\\t"`` for tabs)."""
    with_header: bool = True
    """Text logs: true, each file's first line names ``input_fields`` in order (checked);
    false, columns are matched to ``input_fields`` by position (raw Criteo logs)."""
    input_fields: list[InputField]
    """The raw logs' columns."""
    label_fields: list[str] = Field(default_factory=lambda: ["label"])
    """The label columns, one per task of a multi-task model."""
    sample_weight: str | None = None
    """A numeric input field that weighs each row's loss (EasyRec's ``sample_weight``): the
    batch's loss is ``sum(w_i * loss_i) / B`` (a missing weight counts 1). Evaluation and
    serving ignore it."""
    dimension_tables: list[DimensionTable] = Field(default_factory=list)
    """Snapshots (users, items) joined to each day's events by the feature job."""
    batch_size: int = Field(1024, gt=0)
    """Examples per batch, per worker."""
    num_epochs: int = Field(1, gt=0)
    """Passes over the training days."""
    shuffle: bool = True
    """Shuffle row groups and rows within each chunk, seeded (an epoch is reproducible)."""
    shuffle_buffer_size: int = Field(32, gt=0)
    """Batches per shuffled chunk."""
    prefetch_size: int = Field(32, gt=0)
    """Batches ``tf.data`` prepares ahead of training."""
    max_bad_row_fraction: float = Field(0.01, ge=0.0, le=1.0)
    """Largest share of a day's raw rows that may fail the schema (quarantined); more fails
    the feature job with the top reasons (0-1)."""
    holdout_percent: int = Field(0, ge=0, lt=100)
    """Percent of each day's rows (by a hash of the raw row) held out: on a day in both
    ``train_ds`` and ``eval_ds``, training skips them and evaluation reads only them."""
    behavior_sequence: BehaviorSequence | None = None
    """Each event's behaviour history, for DIN's sequence features."""

    @model_validator(mode="after")
    def _labels_declared(self) -> DataConfig:
        names = {f.input_name for f in self.input_fields}
        if len(names) != len(self.input_fields):
            raise ValueError("input_fields: duplicate input_name")
        missing = [name for name in self.label_fields if name not in names]
        if missing:
            raise ValueError(f"label_fields {missing} are not among input_fields")
        if self.sample_weight is not None:
            kinds = {f.input_name: f.input_type for f in self.input_fields}
            if kinds.get(self.sample_weight) in (None, InputType.STRING, InputType.BOOL):
                raise ValueError(f"sample_weight: {self.sample_weight!r} is not a numeric input field")
            if self.sample_weight in self.label_fields:
                raise ValueError(f"sample_weight: {self.sample_weight!r} is a label field")
        seq = self.behavior_sequence
        if seq is not None:
            known = self.all_fields(sequences=False)
            for where, name in [("user_field", seq.user_field), ("time_field", seq.time_field)] + [
                ("fields", f) for f in seq.fields
            ]:
                if name not in known:
                    raise ValueError(f"behavior_sequence.{where}: {name!r} is not an input field")
            if known[seq.time_field] not in (InputType.INT32, InputType.INT64):
                raise ValueError(f"behavior_sequence.time_field: {seq.time_field!r} must be INT32 or INT64")
            clash = [c for c in seq.columns if c in known]
            if clash:
                raise ValueError(f"behavior_sequence.prefix: {clash} are input fields already")
        return self

    def all_fields(self, sequences: bool = True) -> dict[str, InputType]:
        """Every column available to features: the events' and the dimension tables', and
        (``sequences``) the behaviour history's (STRING: each element is an id string)."""
        fields = {f.input_name: f.input_type for f in self.input_fields}
        for table in self.dimension_tables:
            for f in table.input_fields:
                fields.setdefault(f.input_name, f.input_type)
        if sequences and self.behavior_sequence is not None:
            for column in self.behavior_sequence.columns:
                fields[column] = InputType.STRING
        return fields


class FeatureType(StrEnum):
    """EasyRec feature types supported by recpipe."""

    IdFeature = "IdFeature"
    RawFeature = "RawFeature"
    TagFeature = "TagFeature"
    # an ordered list of ids (a behaviour history), its last ``sequence_length`` kept; the
    # sub feature is an IdFeature (EasyRec's ``sub_feature_type``)
    SequenceFeature = "SequenceFeature"
    # several id columns crossed into one id: their cleaned values joined by
    # ``combo_join_sep``, then hashed as an IdFeature (EasyRec's ``ComboFeature``)
    ComboFeature = "ComboFeature"


class Normalizer(StrEnum):
    """Dense normalisations; statistics come from ``normalization_window_days`` of raw data.

    ``log``: sign(x) * log(1 + |x|) (no statistics); ``min_max``: (x - min) / (max - min)
    clipped to [0, 1]; ``standard``: (x - mean) / std (std 0 -> 1); ``none``.
    """

    none = "none"
    log = "log"
    min_max = "min_max"
    standard = "standard"


class EVParams(Section):
    """Online-learning table options (EasyRec ``EVParams``, DeepRec's EmbeddingVariable).

    With ``ev_params`` a feature's table holds one row per admitted id, keyed by the id's full
    64-bit fingerprint (no ``hash_bucket_size`` modulo, so no collisions); see
    ``trainer.online``. 0 turns a rule off.

    Attributes:
        filter_freq: sightings (occurrences in training batches) before an id gets a row;
            until then it looks up zeros and gets no gradient (DeepRec ``CounterFilter``).
        steps_to_live: a row not looked up in training for this many steps is evicted
            (DeepRec ``GlobalStepEvict``); steps count across fine-tunes.
        delete_after_unseen_days: a row not seen for this many days is evicted at the next
            day boundary (PaddleRec ``sparse_delete_after_unseen_days``).
        max_capacity: the most rows the table may hold (a hard bound): an id admitted to a
            full table takes the least recently seen row not used in this step.
        init_capacity: rows allocated at the start (default ``min(max_capacity, 4096)``); the
            table doubles when an admission finds no free row, up to ``max_capacity``, so its
            memory follows the rows used (DeepRec's EmbeddingVariable, HierarchicalKV's
            ``init_capacity`` / ``max_capacity``). A restored table starts at the power of two
            that holds its rows.
        filter_counter_width: counters per hash of the count-min sketch that counts ids not
            yet admitted. 0 (the default): it starts at the smallest power of two of at least
            ``2 * init_capacity`` and 4096, and doubles whenever half its counters are in use,
            up to that width for ``max_capacity`` (``trainer.online.admission``).
        filter_counter_decay: those counts are multiplied by this at each day boundary.
    """

    filter_freq: int = Field(0, ge=0)
    """Sightings in training batches before an id gets a row (DeepRec ``CounterFilter``; 0:
    at once)."""
    steps_to_live: int = Field(0, ge=0)
    """Training steps without a lookup after which a row is evicted (DeepRec
    ``GlobalStepEvict``; 0: never)."""
    delete_after_unseen_days: int = Field(0, ge=0)
    """Days unseen after which a row is evicted at the next day boundary (PaddleRec
    ``sparse_delete_after_unseen_days``; 0: never)."""
    max_capacity: int = Field(1 << 20, gt=0)
    """The most rows the table holds; a full table's least recently seen row makes room."""
    init_capacity: int | None = Field(None, gt=0)
    """Rows allocated at the start (null: ``min(max_capacity, 4096)``); doubled as needed."""
    filter_counter_width: int = Field(0, ge=0)
    """Counters per hash of the admission sketch (0: sized with the table)."""
    filter_counter_decay: float = Field(0.5, ge=0.0, le=1.0)
    """Factor on the admission counts at each day boundary (0-1)."""

    @property
    def start_capacity(self) -> int:
        """Rows allocated at the start: ``init_capacity``, default ``min(max_capacity, 4096)``."""
        return min(self.max_capacity, self.init_capacity or DEFAULT_INIT_CAPACITY)

    def counter_width(self, capacity: int) -> int:
        """Counters per hash of the admission sketch of a table of ``capacity`` rows."""
        return self.filter_counter_width or sketch_width(capacity)


DEFAULT_INIT_CAPACITY = 4096


def sketch_width(capacity: int) -> int:
    """The sketch width for a table of ``capacity`` rows: the smallest power of two of at least
    ``2 * capacity`` and 4096 (a sketch's start at ``init_capacity``, its bound at
    ``max_capacity``)."""
    return max(4096, 1 << (2 * capacity - 1).bit_length())


class AttentionCombiner(Section):
    """Attention pooling of a sequence: a learned score per element, softmax over the
    sequence, the rows' weighted sum (EasyRec's ``AttentionCombiner``)."""


class SequenceCombiner(OneOf):
    """EasyRec's ``sequence_combiner``: how a SequenceFeature named in a group's
    ``feature_names`` is pooled into one row per example."""

    attention: AttentionCombiner | None = None
    """Each element's row scored by a learned vector, softmax over the sequence's elements,
    the rows summed by those weights."""


class FeatureSpec(Section):
    """One feature (EasyRec ``FeatureConfig``).

    ``ev_params`` (id and tag features) makes the table an online-learning one; a
    feature without it takes ``model_config.ev_params`` when that is set.
    """

    input_names: list[str] = Field(min_length=1)
    """The column the feature reads (an event's, a dimension table's or a history's); a
    ComboFeature's two or more id columns."""
    feature_name: str | None = None
    """The feature's name (null: its column's)."""
    feature_type: FeatureType = FeatureType.IdFeature
    """``IdFeature``, ``RawFeature`` (dense), ``TagFeature`` (a list of ids),
    ``SequenceFeature`` (an ordered history) or ``ComboFeature`` (several ids crossed)."""
    embedding_dim: int = Field(16, gt=0)
    """Width of its embedding rows."""
    hash_bucket_size: int | None = Field(None, gt=0)
    """Rows of a hashed table: ids are fingerprinted modulo this (this or ``num_buckets``
    without ``ev_params``)."""
    num_buckets: int | None = Field(None, gt=0)
    """Rows of an identity table (EasyRec's ``num_buckets``): the column holds integer ids
    and id ``k`` is row ``k``; a value outside ``[0, num_buckets)`` or not an integer takes
    row 0. Id, tag and sequence features."""
    vocab_list: list[str] | None = Field(None, min_length=1)
    """Rows of a vocabulary table (EasyRec's ``vocab_list``): the value ``vocab_list[k]``
    takes row ``k + 1``, any other value (or none) row 0. Id, tag and sequence features."""
    embedding_name: str | None = None
    """Features with the same ``embedding_name`` share one table (null: a table of its own)."""
    separator: str = "|"
    """The separator of a tag or sequence column's ids."""
    combiner: str = Field("sum", pattern="^(sum|mean)$")
    """How a tag feature's rows combine: ``sum`` or ``mean``."""
    normalizer: Normalizer = Normalizer.none
    """A raw feature's normalisation: ``none``, ``log``, ``min_max`` or ``standard``."""
    default_val: float | None = None
    """A raw feature's value where it is missing (null: the window's mean)."""
    boundaries: list[float] | None = Field(None, min_length=1)
    """A raw feature bucketized into an embedding (EasyRec's ``boundaries``): the value ``x``
    takes row ``i``, the number of boundaries ``<= x`` (``len(boundaries) + 1`` rows of
    ``embedding_dim``); ascending, and with ``normalizer: none``."""
    ev_params: EVParams | None = None
    """An online table for this id or tag feature (null: ``model_config.ev_params``, else a
    hashed table)."""
    sequence_length: int = Field(50, gt=0)
    """A sequence feature's most recent ids kept."""
    sub_feature_type: FeatureType = FeatureType.IdFeature
    """A sequence's elements (EasyRec's name): ``IdFeature``, or ``RawFeature`` (numbers,
    each bucketized by ``boundaries``, or by ``num_buckets`` even buckets of
    ``[min_val, max_val]``)."""
    min_val: float = 0.0
    """With ``max_val`` and ``num_buckets``: a sequence of numbers' range, cut into
    ``num_buckets`` even buckets (a value below it takes row 0)."""
    max_val: float = 0.0
    """See ``min_val``."""
    sequence_combiner: SequenceCombiner | None = None
    """A SequenceFeature pooled in a group's ``feature_names`` (EasyRec's): ``{attention:
    {}}``; null: the feature is attended over (a group's ``sequence_features``)."""
    combo_join_sep: str = Field("_", min_length=1)
    """A ComboFeature's separator between its inputs' ids (EasyRec's empty default crosses
    them; joined, each combination is still one id)."""

    @model_validator(mode="after")
    def _inputs_of_its_type(self) -> FeatureSpec:
        combo = self.feature_type == FeatureType.ComboFeature
        if combo and len(self.input_names) < 2:
            raise ValueError("input_names: a ComboFeature crosses two or more columns")
        if not combo and len(self.input_names) != 1:
            raise ValueError(f"input_names: one column (a ComboFeature's several), got {self.input_names}")
        if combo and self.hash_bucket_size is None and self.ev_params is None:
            raise ValueError("hash_bucket_size: a ComboFeature's crossed ids are hashed")
        return self

    @model_validator(mode="after")
    def _combiner_of_a_sequence(self) -> FeatureSpec:
        if self.sequence_combiner is not None and self.feature_type != FeatureType.SequenceFeature:
            raise ValueError(f"sequence_combiner: a SequenceFeature's, not a {self.feature_type.value}'s")
        if self.sequence_combiner is not None and self.ev_params is not None:
            raise ValueError("sequence_combiner: pools a hashed table's rows; drop ev_params")
        return self

    @model_validator(mode="after")
    def _sequence_of_ids(self) -> FeatureSpec:
        if self.sub_feature_type == FeatureType.IdFeature:
            return self
        if (
            self.sub_feature_type != FeatureType.RawFeature
            or self.feature_type != FeatureType.SequenceFeature
        ):
            raise ValueError(
                "sub_feature_type: IdFeature, or a SequenceFeature's RawFeature, "
                f"got {self.sub_feature_type.value}"
            )
        if self.bucket_bounds is None:
            raise ValueError(
                "sub_feature_type: a sequence of numbers is bucketized: give boundaries, or num_buckets "
                "with max_val > min_val"
            )
        return self

    @model_validator(mode="after")
    def _vocabulary(self) -> FeatureSpec:
        if self.vocab_list is None:
            return self
        if self.feature_type in (FeatureType.RawFeature, FeatureType.ComboFeature):
            raise ValueError("vocab_list: id, tag and sequence features only")
        if self.hash_bucket_size is not None or self.num_buckets is not None:
            raise ValueError("give one of hash_bucket_size, num_buckets or vocab_list")
        return self

    @model_validator(mode="after")
    def _one_table_size(self) -> FeatureSpec:
        if self.num_buckets is None:
            return self
        if self.feature_type in (FeatureType.RawFeature, FeatureType.ComboFeature):
            raise ValueError(
                "num_buckets: id, tag and sequence features only (a RawFeature has no ids, a "
                "ComboFeature's are hashed)"
            )
        if self.hash_bucket_size is not None:
            raise ValueError("give hash_bucket_size (hashed ids) or num_buckets (integer ids), not both")
        return self

    @model_validator(mode="after")
    def _bucketized_raw_values(self) -> FeatureSpec:
        if self.boundaries is None:
            return self
        numbers = (
            self.feature_type == FeatureType.SequenceFeature
            and self.sub_feature_type == FeatureType.RawFeature
        )
        if self.feature_type != FeatureType.RawFeature and not numbers:
            raise ValueError(
                "boundaries: RawFeature only (the buckets of a dense value), or a sequence of numbers"
            )
        if any(b >= a for b, a in itertools.pairwise(self.boundaries)):
            raise ValueError(f"boundaries: must ascend strictly, got {self.boundaries}")
        if self.normalizer != Normalizer.none:
            raise ValueError("boundaries: bucketize the raw value (normalizer: none)")
        return self

    @property
    def name(self) -> str:
        """The feature's name: ``feature_name`` or its input column."""
        return self.feature_name or self.input_names[0]

    @property
    def id_buckets(self) -> int | None:
        """The modulo ids are hashed with: ``hash_bucket_size``, or None (the full 64-bit
        fingerprint) for an ``ev_params`` table."""
        return None if self.ev_params is not None else self.hash_bucket_size

    @property
    def bucket_bounds(self) -> list[float] | None:
        """A sequence of numbers' bucket boundaries (EasyRec's): its ``boundaries``, or for
        ``num_buckets`` with ``max_val > min_val`` the values normalised to ``(x - min_val) /
        (max_val - min_val)`` and cut at ``k / num_buckets``, ``k < num_buckets``; else None."""
        if (
            self.feature_type != FeatureType.SequenceFeature
            or self.sub_feature_type != FeatureType.RawFeature
        ):
            return None
        if self.boundaries is not None:
            return list(self.boundaries)
        if self.num_buckets is not None and self.max_val > self.min_val:
            return [k / self.num_buckets for k in range(self.num_buckets)]
        return None

    @property
    def vocabulary(self) -> list[str] | None:
        """``vocab_list`` where ids are looked up in it (no ``ev_params``: an online table
        keys every id by its fingerprint), else None."""
        return self.vocab_list if self.ev_params is None else None

    @property
    def identity_buckets(self) -> int | None:
        """``num_buckets`` where the ids are the column's integers (no ``ev_params``: an
        online table keys every id by its fingerprint), else None."""
        if self.ev_params is not None or self.bucket_bounds is not None:
            return None
        return self.num_buckets

    @property
    def table_rows(self) -> int | None:
        """Rows of the feature's fixed table: ``hash_bucket_size``, ``num_buckets``, or one
        more than its ``boundaries`` or its ``vocab_list``."""
        if self.bucket_bounds is not None:
            return len(self.bucket_bounds) + 1
        if self.boundaries is not None:
            return len(self.boundaries) + 1
        if self.vocab_list is not None:
            return len(self.vocab_list) + 1
        return self.hash_bucket_size or self.num_buckets

    @property
    def kind(self) -> str:
        """What the model takes: ``"id"`` (``int64 [B]``: an Id or ComboFeature, or a RawFeature with
        ``boundaries``), ``"list"`` (``int64 [B, (n)]``: tag and sequence features) or
        ``"dense"`` (``float32 [B]``: a RawFeature)."""
        if self.feature_type in (FeatureType.TagFeature, FeatureType.SequenceFeature):
            return "list"
        if self.feature_type == FeatureType.RawFeature and self.boundaries is None:
            return "dense"
        return "id"


class FeatureConfig(Section):
    """All features, and the window of days over which dense statistics are computed."""

    features: list[FeatureSpec] = Field(min_length=1)
    """The features, each named once."""
    normalization_window_days: int = Field(7, gt=0)
    """Days of raw data the dense features' statistics are computed over."""

    @property
    def online_features(self) -> list[str]:
        """Names of the features with online tables (``ev_params``)."""
        return [f.name for f in self.features if f.ev_params is not None]

    def feature(self, name: str) -> FeatureSpec:
        """The feature called ``name``.

        Raises:
            KeyError: no such feature.
        """
        for feature in self.features:
            if feature.name == name:
                return feature
        raise KeyError(f"feature_config has no feature {name!r}")

    @field_validator("features")
    @classmethod
    def _unique_names(cls, features: list[FeatureSpec]) -> list[FeatureSpec]:
        seen: set[str] = set()
        for feature in features:
            if feature.name in seen:
                raise ValueError(f"duplicate feature name {feature.name!r}")
            seen.add(feature.name)
        return features
