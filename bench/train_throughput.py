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

The five alternate, ``--rounds`` times: rates are medians, ratios the median of each round's.

Usage: ``python bench/train_throughput.py [--rows 1000000] [--buckets 12800] [--rounds 3]``
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


# (figure, numerator, denominator): ratios of examples/s and examples per CPU-s within a round
RATIOS = {
    "loop_vs_minimal": ("trainer_loop", "minimal_loop"),
    "loop_vs_compute": ("trainer_loop", "minimal_preloaded"),
    "own_vs_compute": ("trainer_preloaded", "minimal_preloaded"),
}


def main() -> None:
    parser = harness.parser(__doc__, rounds=3, workdir="train_throughput")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--buckets", type=int, default=12_800)
    args = parser.parse_args()
    config = prepare(args.rows, args.workdir, args.buckets)
    print(f"data: {args.rows} rows, {26 * args.buckets * 16 / 1e6:.1f}M embedding parameters, batch 1024")

    def rates(fn):
        return lambda: dict(zip(("examples_per_sec", "per_cpu_s"), fn(), strict=True))

    model_dir = args.workdir / "model"
    variants = {
        "input_only": rates(lambda: input_only(config)),
        "trainer_loop": rates(lambda: trainer_loop(config, model_dir)),
        "minimal_loop": rates(lambda: minimal_loop(config, stream=True)),
        "minimal_preloaded": rates(lambda: minimal_loop(config)),
        "trainer_preloaded": rates(lambda: trainer_loop(config, model_dir, preloaded=True)),
    }
    runs = harness.alternate(variants, args.rounds)
    medians = harness.summarize(runs)["variants"]
    print(harness.table(medians, {"examples_per_sec": "examples/s", "per_cpu_s": "ex/CPU-s"}))
    figures = {"rows": args.rows, "rounds": args.rounds, "rates": medians, "goal_loop_vs_minimal": 0.95}
    for name, (a, b) in RATIOS.items():
        figures[name] = {
            "wall": harness.ratio(runs, a, b, "examples_per_sec"),
            "cpu": harness.ratio(runs, a, b, "per_cpu_s"),
        }
        print(f"{name}: {figures[name]['wall']:.3f} wall, {figures[name]['cpu']:.3f} CPU")
    print("loop / minimal: the goal >= 0.95; / compute only: the input pipeline's share of the cores")
    harness.finish("train_throughput", figures)


if __name__ == "__main__":
    main()
