"""Benchmark: examples/s of the trainer's loop vs a minimal hand-written loop (the ceiling).

DeepFM on synthetic Criteo rows (26 id fields x 16 dims, 13 dense, MLP 256-128-64, Adam),
batch 1024, one epoch, from the Parquet the Spark job writes. Printed:

- the input pipeline alone (``FeatureReader.flat_dataset``, what the loop consumes; no model);
- ``trainer.loop.Trainer`` (input, logging, checkpoints, summaries), steady state;
- a minimal hand-written loop of the same model and optimizer over the same Parquet files
  (pyarrow record batches -> tensors -> one ``tf.function`` step, nothing else), and the ratio
  loop / minimal (the issue's goal: >= 0.95);
- the same minimal loop over batches pre-loaded in memory (compute only, no input cost), and
  the ratio to it: what the input pipeline costs on cores it shares with the step;
- the trainer loop fed the same pre-loaded batches: its own overhead, without input cost.

Usage: ``python bench/train_throughput.py [--rows 1000000] [--buckets 12800]``
(12,800 rows per table x 26 x 16 = 5.3M embedding parameters, as in the issue).
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DS = "2024-01-01"

from bench import harness  # noqa: E402
from bench.results import write_results  # noqa: E402


def prepare(rows: int, work: Path, buckets: int):
    from bench.criteo_data import prepare as prepare_days

    return prepare_days(rows, 1, work, buckets)


class Rate:
    """Examples per wall-clock second and per CPU-second of this process (every thread): on
    a shared machine the second moves less when other work takes the cores."""

    def __init__(self):
        self.wall, self.cpu, self.examples = time.perf_counter(), time.process_time(), 0

    def stop(self) -> tuple[float, float]:
        wall = time.perf_counter() - self.wall
        cpu = time.process_time() - self.cpu
        return self.examples / wall, self.examples / cpu


def _fmt(rates: tuple[float, float]) -> str:
    return f"{rates[0]:,.0f} examples/s, {rates[1]:,.0f} examples per CPU-second"


def input_only(config) -> tuple[float, float]:
    from recpipe.layout import finished_partitions
    from trainer.input import FeatureReader

    reader = FeatureReader(config, finished_partitions(config.train_input_path, [DS]))
    rate = Rate()
    for flat in reader.flat_dataset():
        rate.examples += int(flat[0].shape[0])
    return rate.stop()


def trainer_loop(config, model_dir: Path, preloaded: bool = False) -> tuple[float, float]:
    """Steady state: from the first logged step after 100 to the end of training."""
    from trainer.loop import Trainer, TrainJob

    shutil.rmtree(model_dir, ignore_errors=True)
    trainer = Trainer(TrainJob(config=config, model_dir=model_dir, train_days=[DS]))
    if preloaded:
        batches = _preload(trainer.reader)
        trainer.reader.flat_dataset = lambda epoch, skip, prefetch, pad_to=None: batches[skip:]
    marks: list = []

    def on_log(step: int, _: dict) -> None:
        if step > 100:
            marks.append((step, Rate()))

    result = trainer.train(on_log=on_log)
    first_step, rate = marks[0]
    rate.examples = (result.global_step - first_step) * config.data_config.batch_size
    return rate.stop()


def _preload(reader) -> list:
    import tensorflow as tf

    return [tuple(tf.convert_to_tensor(x) for x in flat) for flat in reader.batches()]


def minimal_loop(config, stream: bool = False) -> tuple[float, float]:
    """``bench.floors.bare_steps``' training step: over batches pre-loaded in memory
    (``stream=False``: compute only), or reading the Parquet files as it goes."""
    from bench.criteo_data import parquet_batches
    from bench.floors import bare_steps, run_steps

    # raw string ids, as a hand-written loop reads them: its step hashes them
    batches = parquet_batches(config, DS) if stream else iter(list(parquet_batches(config, DS)))
    first = next(batches)
    step, _ = bare_steps(config, first)
    step(*first)
    for _, (f, y) in zip(range(99), batches, strict=False):  # warm-up, as the loop's figure skips 100 steps
        step(f, y)
    rate = Rate()
    rate.examples = run_steps(step, batches)["examples"]
    return rate.stop()


def main() -> None:
    parser = harness.parser(__doc__, rounds=None)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--buckets", type=int, default=12_800)
    parser.add_argument("--workdir", default=str(ROOT / "var/bench/train_throughput"))
    args = parser.parse_args()
    work = Path(args.workdir)
    config = prepare(args.rows, work, args.buckets)
    print(f"data: {args.rows} rows, {26 * args.buckets * 16 / 1e6:.1f}M embedding parameters, batch 1024")
    input_rate = input_only(config)
    print(f"input pipeline alone: {_fmt(input_rate)}")
    loop = trainer_loop(config, work / "model")
    print(f"trainer loop:         {_fmt(loop)}")
    streaming = minimal_loop(config, stream=True)
    print(f"minimal loop reading the Parquet files: {_fmt(streaming)}")
    print(
        f"ratio loop / minimal (same Parquet files): {loop[0] / streaming[0]:.3f} wall, "
        f"{loop[1] / streaming[1]:.3f} CPU (goal >= 0.95)"
    )
    ceiling = minimal_loop(config)
    print(f"minimal loop on pre-loaded batches (compute only): {_fmt(ceiling)}")
    print(
        f"ratio loop / compute only: {loop[0] / ceiling[0]:.3f} wall, {loop[1] / ceiling[1]:.3f} CPU "
        "(the input pipeline's share of the cores)"
    )
    own = trainer_loop(config, work / "model", preloaded=True)
    print(
        f"trainer loop on pre-loaded batches: {_fmt(own)}, ratio {own[0] / ceiling[0]:.3f} wall, "
        f"{own[1] / ceiling[1]:.3f} CPU (the loop's own overhead)"
    )
    rates = {
        "input_only": input_rate,
        "trainer_loop": loop,
        "minimal_loop": streaming,
        "minimal_preloaded": ceiling,
        "trainer_preloaded": own,
    }
    figures = {
        "rows": args.rows,
        "rates": {k: {"examples_per_sec": round(w), "per_cpu_s": round(c)} for k, (w, c) in rates.items()},
        "loop_vs_minimal": {"wall": loop[0] / streaming[0], "cpu": loop[1] / streaming[1]},
        "loop_vs_compute": {"wall": loop[0] / ceiling[0], "cpu": loop[1] / ceiling[1]},
        "own_vs_compute": {"wall": own[0] / ceiling[0], "cpu": own[1] / ceiling[1]},
        "goal_loop_vs_minimal": 0.95,
    }
    print(f"-> {write_results('train_throughput', figures).relative_to(ROOT)}")


if __name__ == "__main__":
    main()
