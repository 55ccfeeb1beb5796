"""Input shards on real feature partitions: disjoint, complete, resumable."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pyarrow.parquet as pq
import pytest

from recpipe.layout import finished_partitions, parse_ds_range
from tests.support import EARLY
from trainer.input import FeatureReader, InputError, holdout_split

KEYS = ("user_id", "item_id")  # unique per example in MovieLens


def _keys(reader, epoch=0, skip=0):
    """The (user, item) raw ids of the reader's examples, in order (``raw_columns=KEYS``)."""
    keys = []
    for flat in reader.batches(epoch, skip):
        raw = reader.raw_values(flat)
        keys += list(zip(raw["user_id"].numpy(), raw["item_id"].numpy(), strict=True))
    return keys


def test_workers_read_disjoint_shards_covering_every_example(ml_early):
    parts = finished_partitions(ml_early.train_input_path, parse_ds_range(":".join(EARLY)))
    expected = sum(pq.ParquetFile(f).metadata.num_rows for p in parts for f in p.glob("*.parquet"))
    seen = Counter()
    for rank in range(3):
        seen.update(
            _keys(FeatureReader(ml_early, parts, rank=rank, world_size=3, batch_size=100, raw_columns=KEYS))
        )
    assert sum(seen.values()) == expected  # none missed
    assert max(seen.values()) == 1  # none seen twice ((user, item) is unique in MovieLens)


def test_epoch_order_is_seeded_and_resume_skips_consumed_batches(ml_early):
    parts = finished_partitions(ml_early.train_input_path, parse_ds_range(":".join(EARLY)))
    reader = FeatureReader(ml_early, parts, batch_size=64, raw_columns=KEYS)
    full = _keys(reader, epoch=1)
    assert full == _keys(reader, epoch=1) and full != _keys(reader, epoch=2)
    assert _keys(reader, epoch=1, skip=5) == full[5 * 64 :]
    sizes = [flat[0].shape[0] for flat in reader.batches()]
    assert set(sizes[:-1]) == {64} and 0 < sizes[-1] <= 64 and sum(sizes) == reader.num_rows


def test_tags_arrive_as_ragged_rows(ml_early):
    parts = finished_partitions(ml_early.train_input_path, ["1997-09-22"])
    reader = FeatureReader(ml_early, parts, batch_size=8, shuffle=False)
    features, labels = reader.structure(next(reader.batches()))
    assert features["genres"].shape[0] == 8 and labels.dtype == np.float32
    assert all(len(row) >= 1 for row in features["genres"].to_list())


def test_ids_are_hashed_as_read_and_equal_the_hash_of_the_raw_values(ml_early):
    import pyarrow as pa
    import tensorflow as tf

    from tests.support import with_edits
    from trainer.hashing import hash_ids

    parts = finished_partitions(ml_early.train_input_path, parse_ds_range(":".join(EARLY)))
    # chunks of 3 x 97 rows, and days that are no multiple of them: batches take carried rows
    config = with_edits(ml_early, {"data_config.shuffle_buffer_size": 3})
    ids = [f for f in config.feature_config.features if f.feature_type.value == "IdFeature"]
    reader = FeatureReader(config, parts, batch_size=97, raw_columns=tuple(f.name for f in ids))
    labels = len(reader.labels)  # one float32 [B] per label field, then the ids
    assert reader.signature()[labels].dtype == tf.int64 and reader.signature()[-1].dtype == tf.string
    n = 0
    for flat in reader.batches(epoch=3):
        features, labels = reader.structure(flat)
        for f, (name, raw) in zip(ids, reader.raw_values(flat).items(), strict=True):
            assert features[name].dtype == tf.int64
            np.testing.assert_array_equal(features[name], hash_ids(raw, f.hash_bucket_size))
        n += int(labels.shape[0])
    assert n == reader.num_rows
    # tags, unshuffled: each row's hashed tokens in the order the Spark job wrote them
    plain = FeatureReader(config, parts[:2], batch_size=97, shuffle=False)
    got = [row for flat in plain.batches() for row in plain.structure(flat)[0]["genres"].to_list()]
    column = pa.concat_tables([pq.read_table(p, columns=["genres"]) for p in parts[:2]])["genres"]
    bucket = config.feature_config.feature("genres").hash_bucket_size
    want = [
        hash_ids(tf.constant(row or [], tf.string), bucket).numpy().tolist() for row in column.to_pylist()
    ]
    assert got == want and any(len(row) > 1 for row in got)


def test_input_errors(ml_early):
    config = ml_early.model_copy(update={"train_input_path": "/nowhere"})
    with pytest.raises(InputError, match="no finished feature partition under /nowhere"):
        holdout_split(config, ["2020-01-01"], "train")


def test_a_day_in_both_ranges_is_split_by_its_holdout_rows(ml_early):
    from tests.support import with_edits
    from trainer.input import holdout_split

    config = with_edits(ml_early, {"train_ds": "1997-09-20:1997-09-23", "eval_ds": "1997-09-23"})
    train_parts, train_keep = holdout_split(config, parse_ds_range(config.train_ds), "train")
    eval_parts, eval_keep = holdout_split(config, parse_ds_range(config.eval_ds), "eval")
    day = train_parts[-1]
    # every training day leaves its held-out rows out, not only the evaluated one: a wider
    # gate window later (gate.window_days raised) scores rows this model never trained on
    assert train_keep == dict.fromkeys(train_parts, False)
    assert eval_keep == {day: True} and eval_parts == [day]
    held_out = Counter(
        _keys(FeatureReader(config, eval_parts, batch_size=50, holdout=eval_keep, raw_columns=KEYS))
    )
    trained = Counter(
        _keys(FeatureReader(config, train_parts, batch_size=50, holdout=train_keep, raw_columns=KEYS))
    )
    day_rows = pq.read_table(day).num_rows
    assert 0.1 < sum(held_out.values()) / day_rows < 0.3  # holdout_percent: 20
    assert not set(held_out) & set(trained)  # no evaluated row was trained on
    all_held = with_edits(config, {"eval_ds": config.train_ds})
    parts, keep = holdout_split(all_held, parse_ds_range(config.train_ds), "eval")
    every_held_out = Counter(
        _keys(FeatureReader(config, parts, batch_size=50, holdout=keep, raw_columns=KEYS))
    )
    assert not set(every_held_out) & set(trained)  # no held-out row of any day was trained on
    every_row = sum(pq.read_table(p).num_rows for p in train_parts)
    assert sum(trained.values()) + sum(every_held_out.values()) == every_row
    # ranges that do not overlap read whole days
    disjoint = with_edits(config, {"eval_ds": "1997-09-24"})
    assert holdout_split(disjoint, ["1997-09-24"], "eval")[1] == {}
    no_holdout = with_edits(config, {"data_config.holdout_percent": 0})
    with pytest.raises(InputError, match="holdout_percent is 0"):
        holdout_split(no_holdout, ["1997-09-23"], "eval")


def test_synchronous_shards_are_padded_to_the_largest_with_empty_batches(ml_early):
    from tests.support import with_edits

    # eval_ds inside train_ds: the padded counts must follow the holdout filter, not metadata
    config = with_edits(ml_early, {"train_ds": ":".join(EARLY), "eval_ds": EARLY[1]})
    from trainer.input import holdout_split

    parts, holdout = holdout_split(config, parse_ds_range(":".join(EARLY)), "train")
    readers = [
        FeatureReader(config, parts, r, 3, batch_size=100, holdout=holdout, raw_columns=KEYS)
        for r in range(3)
    ]
    steps = readers[0].synchronized_batches()
    seen = Counter()
    for reader in readers:
        assert reader.synchronized_batches() == steps  # every rank agrees
        batches = list(reader.batches(pad_to=steps))
        assert len(batches) == steps
        sizes = [b[0].shape[0] for b in batches]
        data = [s for s in sizes if s]
        assert sizes == data + [0] * (steps - len(data))  # empty batches only at the end
        for flat in batches:
            raw = reader.raw_values(flat)
            seen.update(zip(raw["user_id"].numpy(), raw["item_id"].numpy(), strict=True))
    whole = FeatureReader(config, parts, batch_size=100, holdout=holdout)
    assert sum(seen.values()) == sum(b[0].shape[0] for b in whole.batches())  # none missed
    assert max(seen.values()) == 1  # none twice
    assert steps == max(-(-sum(b[0].shape[0] for b in r.batches()) // 100) for r in readers)
    assert readers[0].synchronized_batches(multiple=4) % 4 == 0
    assert len(list(readers[2].batches(skip=steps - 1, pad_to=steps))) == 1  # resume inside padding


def _identity(config, buckets: dict[str, int]):
    from tests.support import with_edits

    edits = {}
    for name, n in buckets.items():
        edits[f"feature_config.features[input_names={name}].hash_bucket_size"] = None
        edits[f"feature_config.features[input_names={name}].num_buckets"] = n
    return with_edits(config, edits)


def test_num_buckets_ids_are_the_columns_integers(ml_early):
    """EasyRec's ``num_buckets``: user 17 is row 17; an item id at or above the bound, or a
    value that is no integer, is row 0."""
    import tensorflow as tf

    from trainer.hashing import identity_ids

    config = _identity(ml_early, {"user_id": 1000, "item_id": 500})
    parts = finished_partitions(config.train_input_path, parse_ds_range(":".join(EARLY)))
    reader = FeatureReader(config, parts, batch_size=256, raw_columns=KEYS)
    seen_zero = False
    for flat in reader.batches():
        features, _ = reader.structure(flat)
        raw = reader.raw_values(flat)
        users = np.array([int(v) for v in raw["user_id"].numpy()])
        items = np.array([int(v) for v in raw["item_id"].numpy()])
        np.testing.assert_array_equal(features["user_id"].numpy(), users)
        np.testing.assert_array_equal(features["item_id"].numpy(), np.where(items < 500, items, 0))
        seen_zero |= bool((items >= 500).any())
    assert seen_zero
    got = identity_ids(tf.constant(["7", "", "-3", "4.0", " 5", "999999999999999999999", "99"]), 100)
    assert got.numpy().tolist() == [7, 0, 0, 0, 0, 0, 99]
    ragged = identity_ids(tf.ragged.constant([["1", "x"], [], ["3"]]), 10)
    assert ragged.to_list() == [[1, 0], [], [3]]
