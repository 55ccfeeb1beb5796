"""Synthetic Criteo days prepared by the project's Spark job, shared by the benchmarks.

DeepFM as the issues state it: 26 id fields x 16 dims (``buckets`` rows per table), 13 dense
fields, MLP 256-128-64, batch 1024; features under ``<work>/features/ds=2024-01-0N``.
"""

from __future__ import annotations

import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "conf/criteo_deepfm.yaml"
# the optimizers the benchmarks compare (``train_config.optimizer_config`` entries)
ADAM = {"adam_optimizer": {"learning_rate": {"constant_learning_rate": {"learning_rate": 0.001}}}}
LAZY = {"lazy_adam_optimizer": {"learning_rate": {"constant_learning_rate": {"learning_rate": 0.001}}}}
START = "2024-01-01"


def days(n: int) -> list[str]:
    """The first ``n`` ``ds`` values the synthetic data uses."""
    return [f"2024-01-{d:02d}" for d in range(1, n + 1)]


def bench_edits(work: Path, buckets: int) -> dict:
    """``--edit_config_json`` edits that point conf/criteo_deepfm.yaml at the bench data."""
    edits = {
        "raw_input_path": str(work / "raw"),
        "train_input_path": str(work / "features"),
        "data_config.batch_size": 1024,
        "train_config.log_step_count_steps": 100,
        "train_config.save_checkpoints_steps": 100000,
        "train_config.save_summary_steps": 100000,
    }
    for i in range(1, 27):
        edits[f"feature_config.features[input_names=C{i}].hash_bucket_size"] = buckets
    return edits


def job_edits(work: Path, buckets: int, strategy: str, batch: int, steps: int, train: dict) -> dict:
    """``bench_edits`` for a distributed job of ``steps`` steps on day 1: ``train_distribute``
    ``strategy``, ``batch`` rows a replica's batch, lazy Adam for the tables and Adam for the
    rest, ``train`` as further ``train_config`` fields."""
    return {
        **bench_edits(work, buckets),
        "train_ds": days(1)[0],
        "data_config.batch_size": batch,
        "train_config.num_steps": steps,
        "data_config.num_epochs": 1000,  # num_steps ends the job, over as many epochs as it takes
        "train_config.train_distribute": strategy,
        **{f"train_config.{k}": v for k, v in train.items()},
        "train_config.optimizer_config": [{"lazy_adam_optimizer": {}}, {"adam_optimizer": {}}],
    }


def steady_rate(model_dir: Path) -> float:
    """The chief's examples per second in steady state: the mean of its logged windows
    (``train_metrics.jsonl``) after the first, which holds tracing."""
    from recpipe import jsonl

    windows = jsonl.read(model_dir / "train_metrics.jsonl")[1:]
    if not windows:
        raise SystemExit(f"{model_dir}/train_metrics.jsonl: no logged window after the first")
    return sum(w["examples_per_sec"] for w in windows) / len(windows)


def prepare(rows: int, n_days: int, work: Path, buckets: int, holdout_percent: int = 0):
    """Draw ``rows`` rows over ``n_days`` days and run the Spark job on each (once; kept in
    ``work`` while ``rows``, ``n_days`` and ``holdout_percent`` stay the same). Returns the
    pipeline config."""
    from recpipe.config import load_pipeline_config

    edits = {**bench_edits(work, buckets), "data_config.holdout_percent": holdout_percent}
    config = load_pipeline_config(CONFIG, edits)
    stamp = work / "rows"
    wanted = f"{rows} {n_days}" + (f" {holdout_percent}" if holdout_percent else "")
    marker = work / "features" / f"ds={days(n_days)[-1]}" / "_SUCCESS"
    if marker.exists() and stamp.exists() and stamp.read_text() == wanted:
        return config
    from dev.data.synth import synth_criteo
    from features.prepare import prepare_day
    from features.session import get_spark

    shutil.rmtree(work, ignore_errors=True)
    synth_criteo(rows, n_days, work / "raw", start=START)
    spark = get_spark("recpipe-bench")
    for ds in days(n_days):
        prepare_day(spark, config, ds)
    spark.stop()
    stamp.write_text(wanted)
    return config


def hasher(config):
    """``features -> features`` with each id feature's strings hashed into its
    ``hash_bucket_size`` (``trainer.hashing``), as a hand-written loop's step hashes them."""
    from recpipe.config.data import FeatureType
    from trainer.hashing import hash_ids

    buckets = {
        f.name: f.hash_bucket_size
        for f in config.feature_config.features
        if f.feature_type == FeatureType.IdFeature
    }

    def hashed(features: dict) -> dict:
        return {k: hash_ids(v, buckets[k]) if k in buckets else v for k, v in features.items()}

    return hashed


def parquet_batches(config, ds: str, holdout: bool | None = None, batch_size: int = 1024):
    """Day ``ds``'s prepared rows as a hand-written loop reads them: pyarrow record batches of
    ``batch_size`` rows, each column to a tensor (ids as strings, dense values as float32);
    ``holdout``: only the rows of that side of the Spark job's ``_holdout`` split. Yields
    ``(features, labels)``."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
    import tensorflow as tf

    from recpipe.config.data import FeatureType
    from recpipe.layout import finished_partitions

    names = [f.name for f in config.feature_config.features]
    dense = {f.name for f in config.feature_config.features if f.feature_type == FeatureType.RawFeature}
    label = config.data_config.label_fields[0]
    columns = [label, *names] + (["_holdout"] if holdout is not None else [])
    for part in finished_partitions(config.train_input_path, [ds]):
        for path in sorted(part.glob("*.parquet")):
            for rb in pq.ParquetFile(path).iter_batches(batch_size=batch_size, columns=columns):
                if holdout is not None:
                    rb = rb.filter(pc.equal(rb["_holdout"], holdout))
                    if rb.num_rows == 0:
                        continue
                features = {
                    n: tf.constant(rb[n].fill_null(0.0).to_numpy().astype("float32"))
                    if n in dense
                    else tf.constant(rb[n].to_numpy(zero_copy_only=False).astype(object))
                    for n in names
                }
                yield features, tf.constant(rb[label].to_numpy().astype("float32"))
