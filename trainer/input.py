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
hashed (``trainer.features.ids.hash_ids``) as each shuffle chunk is read, once per value, so
batches carry numbers only and the training step hashes nothing; a reader with
``raw_ids=True`` keeps the strings instead (``string [B]``; the model hashes them, as the
serving graph does), for metrics grouped by the real ids.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date, timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import tensorflow as tf

from recpipe.config.data import FeatureType
from recpipe.config.pipeline import PipelineConfig
from recpipe.errors import PipelineError
from recpipe.ids import HOLDOUT
from trainer.features.ids import hash_ids

# tf.data's autotuner held the end of an epoch for ~7 s in 3 runs of 4 (bench/vs_deepctr.py);
# the pipeline has nothing to tune beyond its fixed prefetch
_OPTIONS = tf.data.Options()
_OPTIONS.autotune.enabled = False


class InputError(PipelineError):
    """No finished feature partition matches the requested days."""


def parse_ds_range(text: str) -> list[str]:
    """``YYYY-MM-DD`` or ``START:END`` (inclusive) -> the days in it.

    Raises:
        ValueError: malformed dates, or END before START.
    """
    start, _, end = text.partition(":")
    first, last = date.fromisoformat(start), date.fromisoformat(end or start)
    if last < first:
        raise ValueError(f"ds range {text!r}: end before start")
    return [(first + timedelta(days=k)).isoformat() for k in range((last - first).days + 1)]


def holdout_split(config: PipelineConfig, days: list[str], role: str) -> tuple[list[Path], dict[Path, bool]]:
    """The finished partitions of ``days`` for ``role`` ("train" or "eval") and, for the days in
    both ``train_ds`` and ``eval_ds``, which rows to keep: ``{partition: is_holdout}``.

    A day in both ranges is split by the Spark job's ``_holdout`` column (``data_config.
    holdout_percent``): training reads its other rows, evaluation only the held-out ones, so no
    evaluated row was trained on. Days in one range only are read whole.

    Raises:
        InputError: no finished partition; or a shared day without holdout (the config has
            ``holdout_percent: 0``, so training would see the evaluation rows).
    """
    root = config.train_input_path if role == "train" else config.eval_input_path or config.train_input_path
    partitions = finished_partitions(root, days)
    if not (config.train_ds and config.eval_ds):
        return partitions, {}
    shared = set(parse_ds_range(config.train_ds)) & set(parse_ds_range(config.eval_ds))
    if shared and config.eval_input_path not in (None, config.train_input_path):
        shared = set()  # separate eval data: nothing to split
    keep = {}
    for part in partitions:
        if part.name.removeprefix("ds=") in shared:
            if not config.data_config.holdout_percent:
                raise InputError(
                    f"{part.name} is in both train_ds and eval_ds but data_config.holdout_percent "
                    "is 0: set it (and re-run the feature job) or make the ranges disjoint"
                )
            keep[part] = role == "eval"
    return partitions, keep


def finished_partitions(root: str | Path, days: list[str]) -> list[Path]:
    """The ``ds=`` partitions of ``days`` under ``root`` that carry ``_SUCCESS``.

    Raises:
        InputError: none of them exists.
    """
    found = [Path(root) / f"ds={d}" for d in days if (Path(root) / f"ds={d}" / "_SUCCESS").exists()]
    if not found:
        raise InputError(f"no finished feature partition under {root} for ds {days[0]}..{days[-1]}")
    return found


@dataclass(frozen=True)
class RowGroup:
    """One Parquet row group: the unit of sharding."""

    path: Path
    index: int
    rows: int


def row_groups(partitions: list[Path]) -> list[RowGroup]:
    """Every row group of every data file, in a stable order."""
    out = []
    for part in partitions:
        for path in sorted(part.glob("*.parquet")):
            meta = pq.ParquetFile(path).metadata
            out += [RowGroup(path, i, meta.row_group(i).num_rows) for i in range(meta.num_row_groups)]
    return out


def shard(groups: list[RowGroup], rank: int, world_size: int) -> list[RowGroup]:
    """Row groups of worker ``rank``: disjoint across ranks, together all of them.

    Raises:
        ValueError: rank outside [0, world_size).
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} outside world of size {world_size}")
    return groups[rank::world_size]


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
        raw_ids: id and tag values as their strings instead of hashed ``int64`` ids.
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
        raw_ids: bool = False,
    ):
        dc = config.data_config
        self.raw_ids = raw_ids
        self.config = config
        self.features = list(config.feature_config.features)
        self.labels = list(dc.label_fields)
        self.batch_size = batch_size or dc.batch_size
        self.shuffle = dc.shuffle if shuffle is None else shuffle
        self.buffer_rows = dc.shuffle_buffer_size * self.batch_size
        self.seed = seed
        self.all_groups = row_groups(partitions)
        self.world_size = world_size
        self.groups = shard(self.all_groups, rank, world_size)
        self.columns = self.labels + [f.name for f in self.features]
        self.holdout = holdout or {}
        self._ids = [f.name for f in self.features if f.feature_type == FeatureType.IdFeature]
        self._dense = [f.name for f in self.features if f.feature_type == FeatureType.RawFeature]
        self._tags = [f.name for f in self.features if f.feature_type == FeatureType.TagFeature]
        self._buckets = {f.name: f.hash_bucket_size for f in self.features}

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
                yield self._permute(self._columns(pa.concat_tables(pending)), rng)
                pending, pending_rows = [], 0
        if pending:
            yield self._permute(self._columns(pa.concat_tables(pending)), rng)

    def _read(self, g: RowGroup) -> pa.Table:
        keep = self.holdout.get(g.path.parent)
        if keep is None:
            return pq.ParquetFile(g.path).read_row_group(g.index, columns=self.columns)
        table = pq.ParquetFile(g.path).read_row_group(g.index, columns=[*self.columns, HOLDOUT])
        return table.filter(pa.array(_kept(table, keep))).select(self.columns)

    def _permute(self, block: Columns, rng: np.random.Generator) -> Columns:
        return block.take(rng.permutation(block.rows)) if self.shuffle else block

    def _ids_of(self, name: str, column: pa.Array) -> np.ndarray:
        """One id column (nulls as ""): hashed ``int64 [n]``, or ``object [n]`` of bytes."""
        if column.null_count:
            column = column.fill_null("")
        if self.raw_ids:
            return np.asarray(column.cast(pa.binary()).to_numpy(zero_copy_only=False), dtype=object)
        blob, offsets = _string_buffers(column)
        strings = tf.strings.substr(blob, offsets[:-1], offsets[1:] - offsets[:-1])
        return hash_ids(strings, self._buckets[name]).numpy()

    def _columns(self, table: pa.Table) -> Columns:
        """A table's rows as a ``Columns`` block, each id hashed here: one vectorised op per
        column and chunk, instead of one per feature and step."""
        rows = table.num_rows
        labels = [np.asarray(table[name].to_numpy(), dtype=np.float32) for name in self.labels]
        ids = [self._ids_of(name, table[name].combine_chunks()) for name in self._ids]
        dense = [table[n].combine_chunks().fill_null(0.0).to_numpy().astype(np.float32) for n in self._dense]
        tags = []
        for name in self._tags:
            column = table[name].combine_chunks()
            splits = column.offsets.to_numpy().astype(np.int64)
            tags.append((self._ids_of(name, column.flatten()), splits - splits[0]))
        return Columns(
            np.stack(labels) if labels else np.zeros((0, rows), np.float32),
            np.stack(ids) if ids else np.zeros((0, rows), object if self.raw_ids else np.int64),
            np.stack(dense) if dense else np.zeros((0, rows), np.float32),
            tags,
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
            empty = self._columns(schema.empty_table().select(self.columns)).flat()
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
        ``[n]`` and row splits ``int64 [B + 1]``; ids and tag values ``int64`` (``string`` with
        ``raw_ids``). Few, large arrays: tf.data pays per array, not per byte."""
        ids = tf.string if self.raw_ids else tf.int64
        specs = [tf.TensorSpec([None], tf.float32) for _ in self.labels]
        specs += [
            tf.TensorSpec([len(self._ids), None], ids),
            tf.TensorSpec([len(self._dense), None], tf.float32),
        ]
        for _ in self._tags:
            specs += [tf.TensorSpec([None], ids), tf.TensorSpec([None], tf.int64)]
        return tuple(specs)

    def feature_spec(self) -> dict[str, tf.TypeSpec]:
        """The type spec of ``structure``'s features dict (pins a step's input signature)."""
        return feature_spec(self.config, hashed=not self.raw_ids)

    def structure(self, flat: tuple) -> tuple[dict[str, tf.Tensor], tf.Tensor]:
        """Flat tuple -> (features dict, labels [B] of the first label field)."""
        labels = flat[0]
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
        """The epoch as a ``tf.data.Dataset`` of (features, labels), prefetched."""
        structure = self._generated(epoch, skip).map(
            lambda *flat: self.structure(flat), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True
        )
        return structure.prefetch(prefetch).with_options(_OPTIONS)


def _kept(table: pa.Table, keep: bool) -> np.ndarray:
    """Rows of ``table`` whose ``_holdout`` column equals ``keep``: bool ``[rows]``."""
    return table[HOLDOUT].to_numpy(zero_copy_only=False) == keep


def _string_buffers(column: pa.Array) -> tuple[bytes, np.ndarray]:
    """A string column without nulls as (its bytes, int64 offsets [n + 1] from 0).

    TensorFlow cuts the values apart again with one ``substr`` (``FeatureReader._ids_of``):
    no Python object per value.
    """
    width = np.int64 if pa.types.is_large_string(column.type) else np.int32
    _, offsets_buf, data_buf = column.buffers()
    offsets = np.frombuffer(offsets_buf, dtype=width)[column.offset : column.offset + len(column) + 1]
    offsets = offsets.astype(np.int64)
    data = b"" if data_buf is None else data_buf[offsets[0] : offsets[-1]].to_pybytes()
    return data, offsets - offsets[0]


class Columns:
    """A block of rows as numpy arrays, from which batches are cut.

    Attributes:
        labels: ``float32 [L, N]``.
        ids: ``int64 [F_id, N]`` hashed ids, or ``object [F_id, N]`` of bytes (raw ids).
        dense: ``float32 [F_dense, N]``.
        tags: per tag feature, (values ``[M]`` as ``ids``, row splits ``int64 [N + 1]``).
    """

    def __init__(self, labels: np.ndarray, ids: np.ndarray, dense: np.ndarray, tags: list[tuple]):
        self.labels, self.ids, self.dense, self.tags = labels, ids, dense, tags

    @property
    def rows(self) -> int:
        return self.labels.shape[1]

    def take(self, index: np.ndarray) -> Columns:
        """Rows ``index`` (int ``[K]``), in that order."""
        tags = []
        for values, splits in self.tags:
            lengths = np.diff(splits)[index]
            out_splits = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
            shift = np.repeat(splits[:-1][index] - out_splits[:-1], lengths)
            tags.append((values[np.arange(out_splits[-1]) + shift], out_splits))
        return Columns(self.labels[:, index], self.ids[:, index], self.dense[:, index], tags)

    def slice(self, start: int, stop: int) -> Columns:
        """Rows ``[start, stop)``."""
        tags = [(v[s[start] : s[stop]], s[start : stop + 1] - s[start]) for v, s in self.tags]
        return Columns(self.labels[:, start:stop], self.ids[:, start:stop], self.dense[:, start:stop], tags)

    def concat(self, other: Columns) -> Columns:
        """These rows, then ``other``'s."""
        tags = [
            (np.concatenate([v, ov]), np.concatenate([s, os_[1:] + s[-1]]))
            for (v, s), (ov, os_) in zip(self.tags, other.tags, strict=True)
        ]
        return Columns(
            np.concatenate([self.labels, other.labels], axis=1),
            np.concatenate([self.ids, other.ids], axis=1),
            np.concatenate([self.dense, other.dense], axis=1),
            tags,
        )

    def flat(self) -> tuple:
        """The ``FeatureReader.signature`` tuple, as contiguous arrays."""
        out = [np.ascontiguousarray(x) for x in self.labels]
        out += [np.ascontiguousarray(self.ids), np.ascontiguousarray(self.dense)]
        for values, splits in self.tags:
            out += [np.ascontiguousarray(values), np.ascontiguousarray(splits)]
        return tuple(out)


def feature_spec(config: PipelineConfig, hashed: bool = False) -> dict[str, tf.TypeSpec]:
    """The type spec of a features dict (pins a step's input signature): ids and tags as
    strings, or as ``int64`` ids already hashed (``FeatureReader`` without ``raw_ids``)."""
    ids = tf.int64 if hashed else tf.string
    spec: dict[str, tf.TypeSpec] = {}
    for f in config.feature_config.features:
        if f.feature_type == FeatureType.IdFeature:
            spec[f.name] = tf.TensorSpec([None], ids)
        elif f.feature_type == FeatureType.TagFeature:
            spec[f.name] = tf.RaggedTensorSpec([None, None], ids, ragged_rank=1, row_splits_dtype=tf.int64)
        else:
            spec[f.name] = tf.TensorSpec([None], tf.float32)
    return spec


def sample_inputs(config: PipelineConfig) -> dict[str, tf.Tensor]:
    """A one-row features dict (empty ids and tags, zero dense values) to build a model."""
    sample: dict[str, tf.Tensor] = {}
    for f in config.feature_config.features:
        if f.feature_type == FeatureType.IdFeature:
            sample[f.name] = tf.constant([""])
        elif f.feature_type == FeatureType.TagFeature:
            sample[f.name] = tf.RaggedTensor.from_row_splits(
                tf.constant([], tf.string), tf.constant([0, 0], tf.int64)
            )
        else:
            sample[f.name] = tf.constant([0.0])
    return sample
