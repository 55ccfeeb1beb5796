"""Feature Parquet (the Spark job's output) -> ``tf.data`` batches.

Each worker reads a disjoint shard: the row groups of the selected ``ds`` partitions, in a
fixed order, are dealt round-robin by ``rank`` over ``world_size``. Synchronous jobs (all-reduce
every step) need the same number of steps on every worker: ``synchronized_batches`` is the
largest shard's batch count, and a worker whose shard is smaller pads its epoch with empty
batches (B = 0), which add nothing to the loss or the gradients. Within an epoch the shard's
row groups are visited in a seeded random order and rows are permuted within each chunk of
``shuffle_buffer_size`` batches, so an epoch is a deterministic function of (seed, epoch):
training resumes exactly by skipping the batches it already consumed.

Batches are dicts of feature name -> tensor: id features ``int64 [B]``, tag features
``RaggedTensor int64 [B, (n)]``, raw features ``float32 [B]``; labels ``float32 [B]``. Ids are
hashed (``trainer.hashing.feature_ids``) as each shuffle chunk is read, once per value: this is
the trainer's one place that hashes (the serving module hashes raw request values the same
way), and the model takes int64 ids only. ``raw_columns`` carries the raw strings of some id
features beside the batch, for metrics grouped by the real ids (GAUC: users that share a hash
bucket stay apart).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import tensorflow as tf

from recpipe.config.data import FeatureType
from recpipe.config.errors import ConfigError
from recpipe.config.pipeline import PipelineConfig
from recpipe.ids import HOLDOUT
from trainer.hashing import feature_ids
from trainer.input.columns import Columns, _kept, _string_buffers
from trainer.input.sharding import RowGroup, row_groups, shard
from trainer.input.specs import feature_spec

# the pipeline has nothing to tune beyond its fixed prefetch, and tf.data's autotuner can hold
# the end of an epoch for seconds
_OPTIONS = tf.data.Options()
_OPTIONS.autotune.enabled = False


class FeatureReader:
    """Batches of one worker's shard, as numpy arrays, for one pipeline config.

    Args:
        config: the pipeline config (feature_config, data_config).
        partitions: finished ``ds=`` directories.
        rank, world_size: this worker's shard.
        batch_size: rows per batch (the last batch of an epoch may be shorter).
        shuffle: permute row groups and rows (seeded by ``seed`` and the epoch).
        holdout: ``{partition: is_holdout}`` keeps only the rows of those partitions whose
            ``_holdout`` column equals the value (see ``holdout_split``).
        raw_columns: id features whose raw string values travel beside each batch
            (``raw_values``), e.g. GAUC's ``uid_field``.
    """

    def __init__(
        self,
        config: PipelineConfig,
        partitions: list[Path],
        rank: int = 0,
        world_size: int = 1,
        batch_size: int | None = None,
        shuffle: bool | None = None,
        seed: int = 0,
        holdout: dict[Path, bool] | None = None,
        raw_columns: tuple[str, ...] = (),
    ):
        dc = config.data_config
        self.raw_columns = list(raw_columns)
        self.config = config
        self.features = list(config.feature_config.features)
        # the label fields, then the sample weight: read and batched alike
        self.label_count = len(dc.label_fields)
        self.labels = list(dc.label_fields) + ([dc.sample_weight] if dc.sample_weight else [])
        self.multi_task = bool(config.model is not None and config.model.tasks)
        self.batch_size = batch_size or dc.batch_size
        self.shuffle = dc.shuffle if shuffle is None else shuffle
        self.buffer_rows = dc.shuffle_buffer_size * self.batch_size
        self.seed = seed
        self.all_groups = row_groups(partitions)
        self.world_size = world_size
        self.groups = shard(self.all_groups, rank, world_size)
        self.columns = self.labels + [f.name for f in self.features]
        self.holdout = holdout or {}
        self._ids = [f.name for f in self.features if f.kind == "id"]
        self._dense = [f.name for f in self.features if f.kind == "dense"]
        # tag and sequence features: ragged lists of ids (a sequence keeps its order)
        self._tags = [f.name for f in self.features if f.kind == "list"]
        self._by_name = {f.name: f for f in self.features}
        id_features = [f.name for f in self.features if f.feature_type == FeatureType.IdFeature]
        unknown = [n for n in self.raw_columns if n not in id_features]
        if unknown:
            raise ConfigError(
                f"{unknown} are not IdFeatures of feature_config: only an id feature's raw values can "
                "be kept beside the batch (eval_config.metrics_set gauc uid_field must name one)"
            )

    @property
    def num_rows(self) -> int:
        """Rows in this worker's shard."""
        return sum(g.rows for g in self.groups)

    def _group_rows(self, g: RowGroup) -> int:
        keep = self.holdout.get(g.path.parent)
        if keep is None:
            return g.rows
        table = pq.ParquetFile(g.path).read_row_group(g.index, columns=[HOLDOUT])
        return int(np.count_nonzero(_kept(table, keep)))

    def synchronized_batches(self, multiple: int = 1) -> int:
        """Batches per epoch every worker runs in a synchronous job: the largest shard's
        ``ceil(rows / batch_size)``, rounded up to a multiple of ``multiple`` (the replicas
        one process feeds). Reads only metadata, and the ``_holdout`` column where rows are
        split."""
        counts = {g: self._group_rows(g) for g in self.all_groups}
        largest = max(
            -(-sum(counts[g] for g in shard(self.all_groups, r, self.world_size)) // self.batch_size)
            for r in range(self.world_size)
        )
        return -(-largest // multiple) * multiple

    def _blocks(self, epoch: int) -> Iterator[Columns]:
        order = np.arange(len(self.groups))
        rng = np.random.default_rng((self.seed, epoch))
        if self.shuffle:
            rng.shuffle(order)
        pending: list[pa.Table] = []
        pending_rows = 0
        for i in order:
            g = self.groups[i]
            table = self._read(g)
            pending.append(table)
            pending_rows += table.num_rows
            if pending_rows >= self.buffer_rows:
                yield self._permute(self.block(pa.concat_tables(pending)), rng)
                pending, pending_rows = [], 0
        if pending:
            yield self._permute(self.block(pa.concat_tables(pending)), rng)

    def _read(self, g: RowGroup) -> pa.Table:
        keep = self.holdout.get(g.path.parent)
        if keep is None:
            return pq.ParquetFile(g.path).read_row_group(g.index, columns=self.columns)
        table = pq.ParquetFile(g.path).read_row_group(g.index, columns=[*self.columns, HOLDOUT])
        return table.filter(pa.array(_kept(table, keep))).select(self.columns)

    def _permute(self, block: Columns, rng: np.random.Generator) -> Columns:
        return block.take(rng.permutation(block.rows)) if self.shuffle else block

    @staticmethod
    def _raw_of(column: pa.Array) -> np.ndarray:
        """One id column's values (nulls as ""): ``object [n]`` of bytes."""
        column = column.fill_null("") if column.null_count else column
        return np.asarray(column.cast(pa.binary()).to_numpy(zero_copy_only=False), dtype=object)

    def _ids_of(self, name: str, column: pa.Array) -> np.ndarray:
        """One id column (nulls as ""), hashed: ``int64 [n]``; a bucketized dense column's
        buckets (``recpipe.config.data.FeatureSpec.boundaries``)."""
        bounds = self._by_name[name].boundaries
        if bounds is not None and self._by_name[name].feature_type == FeatureType.RawFeature:
            values = column.fill_null(0.0).to_numpy().astype(np.float32)
            return np.searchsorted(np.asarray(bounds, np.float32), values, side="right").astype(np.int64)
        if column.null_count:
            column = column.fill_null("")
        blob, offsets = _string_buffers(column)
        strings = tf.strings.substr(blob, offsets[:-1], offsets[1:] - offsets[:-1])
        return feature_ids(strings, self._by_name[name]).numpy()

    def block(self, table: pa.Table) -> Columns:
        """A table's rows (it holds the label fields and the features, as a feature partition
        does) as a ``Columns`` block, in their order, each id hashed here: one vectorised op
        per column and chunk, instead of one per feature and step."""
        rows = table.num_rows
        labels = [np.asarray(table[name].to_numpy(), dtype=np.float32) for name in self.labels]
        ids = [self._ids_of(name, table[name].combine_chunks()) for name in self._ids]
        dense = [table[n].combine_chunks().fill_null(0.0).to_numpy().astype(np.float32) for n in self._dense]
        tags = []
        for name in self._tags:
            column = table[name].combine_chunks()
            splits = column.offsets.to_numpy().astype(np.int64)
            tags.append((self._ids_of(name, column.flatten()), splits - splits[0]))
        raw = [self._raw_of(table[name].combine_chunks()) for name in self.raw_columns]
        return Columns(
            np.stack(labels) if labels else np.zeros((0, rows), np.float32),
            np.stack(ids) if ids else np.zeros((0, rows), np.int64),
            np.stack(dense) if dense else np.zeros((0, rows), np.float32),
            tags,
            np.stack(raw) if raw else np.zeros((0, rows), object),
        )

    def batches(self, epoch: int = 0, skip: int = 0, pad_to: int | None = None) -> Iterator[tuple]:
        """Yield the epoch's batches as flat tuples of numpy arrays (see ``signature``), then
        empty batches until ``pad_to`` batches were counted (synchronous jobs)."""
        n = skip
        for batch in self._data_batches(epoch, skip):
            n += 1
            yield batch
        if pad_to is not None and n < pad_to:
            schema = pq.ParquetFile(self.all_groups[0].path).schema_arrow
            empty = self.block(schema.empty_table().select(self.columns)).flat()
            for _ in range(pad_to - n):
                yield empty

    def _data_batches(self, epoch: int, skip: int) -> Iterator[tuple]:
        carry: Columns | None = None
        n = 0
        for block in self._blocks(epoch):
            if carry is not None:
                block = carry.concat(block)
            full = block.rows - block.rows % self.batch_size
            for start in range(0, full, self.batch_size):
                if n >= skip:
                    yield block.slice(start, start + self.batch_size).flat()
                n += 1
            carry = block.slice(full, block.rows) if full < block.rows else None
        if carry is not None and carry.rows and n >= skip:
            yield carry.flat()

    def signature(self) -> tuple:
        """``tf.TensorSpec`` of each element of a ``batches()`` tuple: labels ``float32 [B]``
        each, ids ``[F_id, B]``, dense ``float32 [F_dense, B]``, per tag feature its values
        ``[n]`` and row splits ``int64 [B + 1]``; ids and tag values ``int64``; last, with
        ``raw_columns``, their raw values ``string [R, B]``. Few, large arrays: tf.data pays per
        array, not per byte."""
        specs = [tf.TensorSpec([None], tf.float32) for _ in self.labels]
        specs += [
            tf.TensorSpec([len(self._ids), None], tf.int64),
            tf.TensorSpec([len(self._dense), None], tf.float32),
        ]
        for _ in self._tags:
            specs += [tf.TensorSpec([None], tf.int64), tf.TensorSpec([None], tf.int64)]
        if self.raw_columns:
            specs.append(tf.TensorSpec([len(self.raw_columns), None], tf.string))
        return tuple(specs)

    def feature_spec(self) -> dict[str, tf.TypeSpec]:
        """The type spec of ``structure``'s features dict (pins a step's input signature)."""
        return feature_spec(self.config)

    def raw_values(self, flat: tuple) -> dict[str, tf.Tensor]:
        """``raw_columns`` name -> its raw values ``string [B]`` in a flat tuple."""
        if not self.raw_columns:
            return {}
        return dict(zip(self.raw_columns, tf.unstack(flat[-1], num=len(self.raw_columns)), strict=True))

    def structure(self, flat: tuple) -> tuple[dict[str, tf.Tensor], tf.Tensor]:
        """Flat tuple -> (features dict, labels ``float32 [B]`` of the first label field, or
        ``float32 [B, L]`` of every label field for a multi-task model)."""
        labels = tf.stack(flat[: self.label_count], axis=1) if self.multi_task else flat[0]
        i = len(self.labels)
        features: dict[str, tf.Tensor] = {}
        if self._ids:
            features.update(zip(self._ids, tf.unstack(flat[i], num=len(self._ids)), strict=True))
        if self._dense:
            dense = tf.unstack(tf.convert_to_tensor(flat[i + 1]), num=len(self._dense))
            features.update(zip(self._dense, dense, strict=True))
        i += 2
        for name in self._tags:
            features[name] = tf.RaggedTensor.from_row_splits(flat[i], flat[i + 1], validate=False)
            i += 2
        return {f.name: features[f.name] for f in self.features}, labels

    def sample_weights(self, flat: tuple) -> tf.Tensor | None:
        """A flat batch's ``data_config.sample_weight`` values, ``float32 [B]``; None when the
        config names none."""
        return flat[self.label_count] if len(self.labels) > self.label_count else None

    def _generated(self, epoch: int, skip: int, pad_to: int | None = None) -> tf.data.Dataset:
        return tf.data.Dataset.from_generator(
            lambda: self.batches(epoch, skip, pad_to), output_signature=self.signature()
        )

    def flat_dataset(
        self, epoch: int = 0, skip: int = 0, prefetch: int = 32, pad_to: int | None = None
    ) -> tf.data.Dataset:
        """The epoch as a ``tf.data.Dataset`` of ``batches()`` tuples, prefetched; the
        training step applies ``structure`` in its own graph (a few tensors a call instead of
        one per feature: calling a ``tf.function`` with 40 tensors cost ~1.5 ms a step)."""
        return self._generated(epoch, skip, pad_to).prefetch(prefetch).with_options(_OPTIONS)

    def dataset(self, epoch: int = 0, skip: int = 0, prefetch: int = 32) -> tf.data.Dataset:
        """The epoch as a ``tf.data.Dataset`` of (features, labels, raw values), prefetched."""
        structure = self._generated(epoch, skip).map(
            lambda *flat: (*self.structure(flat), self.raw_values(flat)),
            num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=True,
        )
        return structure.prefetch(prefetch).with_options(_OPTIONS)
