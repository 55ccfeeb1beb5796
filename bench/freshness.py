"""What freshness buys: the AUC of the model served on each event when the served model is synced
once a day, every hour or every pass of 15 minutes, against the daily retrain, on the same days.

After Monolith (Liu et al. 2022, "Monolith: Real Time Recommendation System With Collisionless
Embedding Table", Table 2: batch training against online training synced every 5 h / 1 h /
30 min). Two data sets: MovieLens-100K (its first ``--movielens_days`` days with ratings, from
1997-09-20), and the drifting synthetic stream with ids that arrive all day
(``dev/data/drift.py`` with ``slices``; ``--drift_days`` of ``--drift_rows``). Each data set's
features are prepared by one ``recpipe features`` range job, its event time kept beside the
labels (never a feature).

Variants, trained in this process with recpipe's trainer (``Trainer.train_batches``):

- **daily retrain**: the daily DAG's training (``conf/retrain/movielens_daily.yaml``: its
  window of days, epochs and batch, fine-tuning the model of the day before); day ``d``'s events
  are scored by the model trained through day ``d - 1``;
- **stream, synced every day / hour / pass**: one model trained pass after pass as the stream
  DAG's passes train (``conf/retrain/movielens_stream.yaml``'s edits, 15-minute passes, each
  pass shuffled, one epoch); an event is scored by the model as it was at the last sync before
  it (the day's, the hour's or the pass's start), before any training on it. The three differ
  only in how long the served model lags the trained one.

Printed per data set and variant: the AUC of every scored event after ``--warmup_days`` (pooled)
and the mean of the days' AUCs; DeLong's paired differences on the same events, with their 95 %
intervals (``recpipe.stats.paired_auc_test``): against the daily retrain, and for the stream's
hourly and every-pass syncs against its daily sync (freshness alone). Also the warm process's
cost of a pass of ``--pass_rows`` MovieLens rows (score, then train; wall and CPU seconds): what
a pass costs without the process starts, tracing and restores of a pass under Airflow
(``bench/pass_latency.py``). Figures go to ``bench/results/freshness.json``.

    python bench/freshness.py [--movielens_days 120] [--drift_days 14] [--drift_rows 20000]
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from datetime import date
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import harness  # noqa: E402
from bench.days import day_range, features_once  # noqa: E402
from bench.process_tree import checked, recpipe  # noqa: E402

OUT = ROOT / "var/bench/freshness"
PASS_MINUTES = 15
# the stream's served model synced every day, hour, pass (minutes)
SYNCS = {"stream_synced_daily": 1440, "stream_synced_hourly": 60, "stream_synced_every_pass": PASS_MINUTES}
# a stream config's keys that name its data or its held-out days, not how it trains
NOT_TRAINING = {"raw_input_path", "train_input_path", "train_ds", "eval_ds"}


def retrain_edits(name: str) -> tuple[dict, int]:
    """A shipped retrain config's training edits and its window of days."""
    from recpipe.config.retrain import load_retrain_config

    retrain = load_retrain_config(ROOT / "conf/retrain" / f"{name}.yaml")
    edits = {k: v for k, v in (retrain.edit_config_json or {}).items() if k not in NOT_TRAINING}
    return edits, retrain.training_window_days


def prepare(pipeline: Path, raw: Path, features: Path, days: list[str], extra: dict) -> dict:
    """One ``recpipe features`` job over ``days`` with the event time kept as a label column;
    the effective edits."""
    edits = {"raw_input_path": str(raw), "train_input_path": str(features), **extra}
    features_once(pipeline, days, features.parent / "features.log", edits, each_day=True)
    return edits


def movielens(n_days: int) -> tuple[Path, dict, list[str]]:
    """MovieLens-100K replayed by day from 1997-09-20: (pipeline config, edits, days)."""
    raw = OUT / "movielens/raw"
    if not (raw / "events").exists():
        checked(recpipe("data fetch", "movielens-100k"), OUT / "fetch.log", "recpipe data fetch", cwd=ROOT)
        argv = recpipe("data replay", "movielens-100k", "--out", str(raw))
        checked(argv, OUT / "replay.log", "recpipe data replay", cwd=ROOT)
    pipeline = ROOT / "conf/movielens_deepfm.yaml"
    # the first n_days days with ratings (a few days of the data have none)
    days = sorted(d.name[3:] for d in (raw / "events").glob("ds=*") if (d / "_SUCCESS").exists())[:n_days]
    extra = {"data_config.label_fields": ["label", "rating", "timestamp"]}
    return pipeline, prepare(pipeline, raw / "events", OUT / "movielens/features", days, extra), days


def drift(n_days: int, rows: int) -> tuple[Path, dict, list[str]]:
    """The drifting stream, ids sliding every 15 minutes: (pipeline config, edits, days)."""
    from dev.data.drift import synth_drift
    from recpipe.config.loader import read_yaml

    raw = OUT / f"drift-{rows}/raw"
    days = day_range("2024-01-01", n_days)
    if not all((raw / f"ds={d}" / "_SUCCESS").exists() for d in days):
        synth_drift(rows, n_days, raw, slices=1440 // PASS_MINUTES)
    pipeline = ROOT / "conf/drift_deepfm.yaml"
    fields = read_yaml(pipeline)["data_config"]["input_fields"]
    extra = {
        "data_config.input_fields": [*fields, {"input_name": "timestamp", "input_type": "INT64"}],
        "data_config.label_fields": ["label", "timestamp"],
    }
    return pipeline, prepare(pipeline, raw, OUT / f"drift-{rows}/features", days, extra), days


def day_table(config, reader, ds: str):
    """Day ``ds``'s feature rows in event-time order (label fields and features), and each
    row's minute of the day ``int64 [N]``."""
    import pyarrow.parquet as pq

    from recpipe.layout import ds_partition

    table = pq.read_table(ds_partition(config.train_input_path, ds), columns=reader.columns)
    table = table.sort_by("timestamp")
    midnight = (date.fromisoformat(ds) - date(1970, 1, 1)).days * 86400
    minute = (table["timestamp"].to_numpy().astype(np.int64) - midnight) // 60
    return table, np.clip(minute, 0, 1439)


def trainer_for(pipeline: Path, edits: dict, first_day: str, model_dir: Path):
    from recpipe.config.loader import load_pipeline_config
    from recpipe.layout import ds_partition
    from trainer.loop import Trainer, TrainJob

    config = load_pipeline_config(pipeline, edits).resolved(ROOT)
    shutil.rmtree(model_dir, ignore_errors=True)
    assert (ds_partition(config.train_input_path, first_day) / "_SUCCESS").exists(), first_day
    return Trainer(TrainJob(config=config, model_dir=model_dir, train_days=[first_day])), config


def scored(trainer, block, index: np.ndarray, chunk: int = 4096) -> np.ndarray:
    """The trainer's model's probabilities on ``block``'s rows ``index``, as it is now."""
    part = block.take(index)
    return np.concatenate(
        [
            trainer.predict_batch(part.slice(i, min(i + chunk, part.rows)).flat())
            for i in range(0, part.rows, chunk)
        ]
        or [np.zeros(0, np.float32)]
    ).reshape(-1)


def batches(block, index: np.ndarray, size: int, rng: np.random.Generator):
    part = block.take(rng.permutation(index))
    for i in range(0, part.rows, size):
        yield part.slice(i, min(i + size, part.rows)).flat()


def run_stream(pipeline: Path, edits: dict, days: list[str], name: str) -> tuple[dict, dict]:
    """One model trained pass after pass; each event scored at each sync interval's last sync
    before it. (variant -> scores per day, figures, the labels per day in the scores' order)."""
    trainer, config = trainer_for(pipeline, edits, days[0], OUT / name / "stream")
    reader, size = trainer.reader, config.data_config.batch_size
    rng = np.random.default_rng(config.train_config.random_seed)
    scores, labels = {v: {} for v in SYNCS}, {}
    cpu, wall, passes, rows = time.process_time(), time.perf_counter(), 0, 0
    for ds in days:
        table, minute = day_table(config, reader, ds)
        block = reader.block(table)
        labels[ds] = block.labels[0]  # label_fields[0]: the click
        for v in SYNCS:
            scores[v][ds] = np.zeros(table.num_rows, np.float32)
        for start in range(0, 1440, PASS_MINUTES):
            for v, every in SYNCS.items():
                if start % every == 0:  # a sync: the served model becomes the trained one
                    index = np.flatnonzero((minute >= start) & (minute < start + every))
                    if len(index):
                        scores[v][ds][index] = scored(trainer, block, index)
            index = np.flatnonzero((minute >= start) & (minute < start + PASS_MINUTES))
            if len(index):  # a quiet pass trains nothing
                trainer.train_batches(batches(block, index, size, rng), ds)
                passes, rows = passes + 1, rows + len(index)
    figures = {
        "passes_with_rows": passes,
        "rows": rows,
        "wall_s": round(time.perf_counter() - wall, 1),
        "cpu_s": round(time.process_time() - cpu, 1),
    }
    return scores, figures, labels


def run_daily(pipeline: Path, edits: dict, window: int, days: list[str], name: str) -> tuple[dict, dict]:
    """The daily retrain: each day scored by the model of the day before, then a fine-tune on
    the window of days ending with it (its config's epochs and batch). (scores per day, figures)."""
    trainer, config = trainer_for(pipeline, edits, days[0], OUT / name / "daily")
    reader, dc = trainer.reader, config.data_config
    rng = np.random.default_rng(config.train_config.random_seed)
    blocks, scores = {}, {}
    cpu, wall = time.process_time(), time.perf_counter()
    for i, ds in enumerate(days):
        table, _ = day_table(config, reader, ds)
        blocks[ds] = reader.block(table)
        scores[ds] = scored(trainer, blocks[ds], np.arange(table.num_rows))
        span = days[max(0, i - window + 1) : i + 1]
        block = blocks[span[0]]
        for d in span[1:]:
            block = block.concat(blocks[d])
        for _ in range(dc.num_epochs):
            trainer.train_batches(batches(block, np.arange(block.rows), dc.batch_size, rng), ds)
        if i - window + 1 >= 0:
            blocks.pop(days[i - window + 1])  # out of tomorrow's window
    return scores, {
        "wall_s": round(time.perf_counter() - wall, 1),
        "cpu_s": round(time.process_time() - cpu, 1),
    }


def compare(labels: dict, variants: dict[str, dict], scored_days: list[str]) -> dict:
    """Per variant: pooled AUC, mean daily AUC, and DeLong's paired differences (95 %
    intervals, p-values) against the daily retrain and, for the stream's fresher syncs,
    against the stream synced daily (what freshness alone buys), on the same events."""
    from recpipe.stats import auc, paired_auc_test

    y = np.concatenate([labels[d] for d in scored_days])
    pooled = {name: np.concatenate([per_day[d] for d in scored_days]) for name, per_day in variants.items()}
    out = {}
    for name, per_day in variants.items():
        daily = [auc(labels[d], per_day[d]) for d in scored_days if 0 < labels[d].sum() < len(labels[d])]
        out[name] = {
            "auc": round(float(auc(y, pooled[name])), 4),
            "mean_daily_auc": round(float(np.mean(daily)), 4),
        }
        for base in ("daily_retrain", "stream_synced_daily"):
            if name == base or (base == "stream_synced_daily" and name == "daily_retrain"):
                continue
            test = paired_auc_test(y, pooled[base], pooled[name])
            out[name][f"vs_{base}"] = {
                "diff": round(test.diff, 4),
                "ci95_low": round(test.ci_low, 4),
                "ci95_high": round(test.ci_high, 4),
                "p_value": round(test.p_value, 4),
            }
    out["events_scored"] = int(len(y))
    out["days_scored"] = len(scored_days)
    return out


def warm_pass(pipeline: Path, edits: dict, days: list[str], rows: int) -> dict:
    """A pass of ``rows`` MovieLens rows in a warm process: scored, then trained (one epoch at
    the stream's batch), after a first pass has traced both; wall and CPU seconds."""
    trainer, config = trainer_for(pipeline, edits, days[0], OUT / "warm")
    reader, size = trainer.reader, config.data_config.batch_size
    rng = np.random.default_rng(0)
    tables = []
    for ds in days:
        tables.append(day_table(config, reader, ds)[0])
        if sum(t.num_rows for t in tables) >= rows:
            break
    import pyarrow as pa

    block = reader.block(pa.concat_tables(tables).slice(0, rows))
    index = np.arange(block.rows)
    out = {}

    def one_pass():
        scored(trainer, block, index)
        trainer.train_batches(batches(block, index, size, rng), days[0])

    for run in ("first", "warm"):
        took = harness.Clock().measure(one_pass)
        out[f"{run}_pass_s"], out[f"{run}_pass_cpu_s"] = round(took["wall_s"], 2), round(took["cpu_s"], 2)
    out["rows"] = int(block.rows)
    out["examples_per_s"] = round(block.rows / out["warm_pass_s"])
    out["examples_per_cpu_s"] = round(block.rows / max(out["warm_pass_cpu_s"], 1e-9))
    return out


def one_data_set(name: str, pipeline: Path, edits: dict, days: list[str], warmup: int) -> dict:
    stream_edits, _ = retrain_edits("movielens_stream")
    daily_edits, window = retrain_edits("movielens_daily")
    if name.startswith("drift"):  # the drifting vocabulary outgrows the MovieLens table's cap
        stream_edits["model_config.ev_params"] = {
            **stream_edits["model_config.ev_params"],
            "max_capacity": 1 << 17,
        }
    variants, figures = {}, {}
    scores, figures["daily_retrain"] = run_daily(pipeline, {**edits, **daily_edits}, window, days, name)
    variants["daily_retrain"] = scores
    scores, figures["stream"], labels = run_stream(pipeline, {**edits, **stream_edits}, days, name)
    variants.update(scores)
    result = {
        "days": f"{days[0]}:{days[-1]}",
        "training_window_days": window,
        **compare(labels, variants, days[warmup:]),
    }
    result["cost"] = figures
    return result


def main() -> None:
    parser = harness.parser(__doc__, rounds=None)
    parser.add_argument("--movielens_days", type=int, default=120)
    parser.add_argument("--drift_days", type=int, default=14)
    parser.add_argument("--drift_rows", type=int, default=20_000)
    parser.add_argument("--warmup_days", type=int, default=7, help="days trained on, not scored")
    parser.add_argument("--pass_rows", type=int, default=10_000)
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    results = {"pass_minutes": PASS_MINUTES, "warmup_days": args.warmup_days}
    pipeline, edits, days = movielens(args.movielens_days)
    stream_edits, _ = retrain_edits("movielens_stream")
    results["warm_pass"] = warm_pass(pipeline, {**edits, **stream_edits}, days, args.pass_rows)
    print("warm pass:", results["warm_pass"], flush=True)
    results["movielens"] = one_data_set("movielens", pipeline, edits, days, args.warmup_days)
    pipeline, edits, days = drift(args.drift_days, args.drift_rows)
    results["drift"] = one_data_set(f"drift-{args.drift_rows}", pipeline, edits, days, args.warmup_days)
    for name in ("movielens", "drift"):
        r = results[name]
        print(f"\n{name} {r['days']}: {r['events_scored']} events on {r['days_scored']} days scored")
        for variant in ("daily_retrain", *SYNCS):
            f = r[variant]
            line = f"  {variant:26s} AUC {f['auc']:.4f}  mean daily {f['mean_daily_auc']:.4f}"
            for base in ("daily_retrain", "stream_synced_daily"):
                if f"vs_{base}" in f:
                    t = f[f"vs_{base}"]
                    line += f"  vs {base} {t['diff']:+.4f} [{t['ci95_low']:+.4f}, {t['ci95_high']:+.4f}]"
            print(line)
        print("  cost:", r["cost"])
    harness.finish("freshness", results)


if __name__ == "__main__":
    main()
