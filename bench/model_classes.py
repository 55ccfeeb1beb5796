"""Benchmark: examples per second and per CPU-second of DIN and MMoE beside DeepFM, on the same
rows, and each job's peak RSS.

MovieLens-100K replayed as daily logs and prepared once by the Spark job with
``conf/movielens_din.yaml`` (so the rows carry the histories and the rating): DeepFM, MMoE
(``conf/movielens_mmoe.yaml``: two tasks) and MultiTowerDIN (20 films of history, their
genres and ratings) then each train one epoch over the same partitions, each in a fresh
process (``--only``), in turn, ``--rounds`` rounds (a wall-clock ratio on a shared machine
swings between runs; the CPU-second rate moves less); medians over the rounds.

Printed per model (medians): rows, wall s, CPU s, examples/s, examples per CPU-second,
peak RSS (MiB), and the median over rounds of each round's ratio of a model's examples per
CPU-second to DeepFM's (DIN's goal: at least 0.8x). Two cut-down DINs locate DIN's cost:
``DIN_towers`` (the user and item towers alone: no history looked up, no attention) and
``DIN_score`` (the histories looked up and pooled by a one-layer score, no attention MLP). The
days' preparation (one Spark job over the range, histories included) is timed too (goal: at
most 5 minutes for the 213 days). Figures go to ``bench/results/model_classes.json``.

Usage: ``python bench/model_classes.py [--days 213] [--rounds 2] [--work var/bench/models]``
(``make data`` first: the raw days under data/raw/movielens).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import harness  # noqa: E402
from bench.process_tree import checked  # noqa: E402

MODELS = {
    "DeepFM": "conf/movielens_deepfm.yaml",
    "MMoE": "conf/movielens_mmoe.yaml",
    "DIN": "conf/movielens_din.yaml",
    "DIN_towers": "conf/movielens_din.yaml",
    "DIN_score": "conf/movielens_din.yaml",
}
# the cut-down DINs: where DIN's step goes
EDITS = {
    "DIN_towers": {"model_config.multi_tower.din_towers": [], "model_config.seq_att_groups": []},
    "DIN_score": {"model_config.multi_tower.din_towers": [{"input": "din", "dnn": {"hidden_units": [1]}}]},
}


def _paths(work: Path) -> dict:
    return {
        "raw_input_path": str(ROOT / "data/raw/movielens/events"),
        "train_input_path": str(work / "features"),
    }


def prepare(work: Path, days: int) -> tuple[list[str], dict | None]:
    """The first ``days`` raw days prepared with the DIN config, in one Spark job (the range's
    histories included); the days and the job's wall and CPU seconds (None when every day
    was prepared before)."""
    import psutil

    from features.prepare import prepare_days
    from features.session import get_spark
    from recpipe.config import load_pipeline_config

    raw = ROOT / "data/raw/movielens/events"
    if not raw.is_dir():
        raise SystemExit(f"{raw} is missing: run `make data` first")
    all_days = sorted(p.name.removeprefix("ds=") for p in raw.iterdir() if p.name.startswith("ds="))[:days]
    config = load_pipeline_config(ROOT / MODELS["DIN"], _paths(work))
    if any(not (work / "features" / f"ds={d}" / "_SUCCESS").exists() for d in all_days):
        shutil.rmtree(work / "features", ignore_errors=True)  # the whole range, timed

        def jvm_cpu() -> float:  # this process's children: the Spark JVM and its workers
            return sum(sum(c.cpu_times()[:2]) for c in psutil.Process().children(recursive=True))

        wall = time.perf_counter()
        spark = get_spark("bench-models", master="local[2]")
        cpu = jvm_cpu()
        prepare_days(spark, config, all_days)
        timed = {"days": len(all_days), "wall_s": time.perf_counter() - wall, "jvm_cpu_s": jvm_cpu() - cpu}
        spark.stop()
        return all_days, timed
    return all_days, None


def train_one(name: str, work: Path, days: list[str]) -> dict:
    """One epoch of ``name`` over ``days``; the figures of this process."""
    from recpipe.config import load_pipeline_config
    from trainer.loop import Trainer, TrainJob

    edits = {**_paths(work), "data_config.num_epochs": 1, "train_config.save_checkpoints_steps": 10**6}
    edits |= EDITS.get(name, {})
    config = load_pipeline_config(ROOT / MODELS[name], edits)
    model_dir = work / "models" / name
    shutil.rmtree(model_dir, ignore_errors=True)
    wall, cpu = time.perf_counter(), time.process_time()
    result = Trainer(TrainJob(config=config, model_dir=model_dir, train_days=days)).train()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    rows = result.global_step * config.data_config.batch_size
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out = {"model": name, "rows": rows, "wall_s": wall, "cpu_s": cpu, "peak_rss_mib": peak}
    return out | {"phases": result.phases}


def main() -> None:
    parser = harness.parser(__doc__, rounds=2)
    parser.add_argument("--days", type=int, default=213)
    parser.add_argument("--work", type=Path, default=ROOT / "var/bench/models")
    parser.add_argument("--only", choices=sorted(MODELS), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.only:
        days = json.loads(os.environ["BENCH_DAYS"])
        print(json.dumps(train_one(args.only, args.work, days)))
        return

    shutil.rmtree(args.work / "features", ignore_errors=True)  # the preparation is measured
    days, prepared = prepare(args.work, args.days)
    print(f"{len(days)} MovieLens days ({days[0]} .. {days[-1]}), prepared with histories")
    if prepared:
        print(
            f"prepared in one job: {prepared['wall_s']:.1f} s wall, {prepared['jvm_cpu_s']:.1f} "
            "CPU-s of the JVM (goal: at most 300 s)"
        )
    env = {**os.environ, "BENCH_DAYS": json.dumps(days)}

    def model(name: str):
        def once() -> dict:
            cmd = [sys.executable, __file__, "--only", name, "--work", str(args.work)]
            r = checked(cmd, args.work / "logs" / f"{name}.log", name, env=env).result
            phases = r.pop("phases")
            r |= {k: phases[k] for k in ("first_step_cpu_s", "step_cpu_ms", "step_ops")}
            return r | {"per_s": r["rows"] / r["wall_s"], "per_cpu_s": r["rows"] / r["cpu_s"]}

        return once

    runs = harness.alternate({name: model(name) for name in MODELS}, args.rounds)
    summary = harness.summarize(runs, reference="DeepFM", ratios=("per_cpu_s",))
    models = summary["variants"]
    vs_deepfm = {"DeepFM": 1.0} | {m: r["per_cpu_s"] for m, r in summary["vs_DeepFM"].items()}
    columns = {"rows": "rows", "wall_s": "wall s", "cpu_s": "CPU s", "per_s": "ex/s", "per_cpu_s": "ex/CPU-s"}
    columns |= {"peak_rss_mib": "peak MiB", "step_cpu_ms": "step CPU-ms"}
    print(harness.table(models, columns))
    step = {m: models[m]["step_cpu_ms"] for m in MODELS}
    parts = {
        "towers_vs_deepfm_ms": step["DIN_towers"] - step["DeepFM"],
        "histories_ms": step["DIN_score"] - step["DIN_towers"],
        "attention_mlp_ms": step["DIN"] - step["DIN_score"],
    }
    print(f"DIN's parts of a later step, CPU-ms: {parts}")
    print(
        f"DIN per CPU-s vs DeepFM: {vs_deepfm['DIN']:.2f} (the median of the rounds' ratios; "
        "goal: at least 0.80)"
    )
    figures = {
        "prepared": prepared,
        "rounds": args.rounds,
        "models": models,
        "vs_deepfm": vs_deepfm,
        "step_cpu_ms": step,
        "din_parts": parts,
        "goals": {"din_vs_deepfm": 0.8, "prepare_s": 300},
    }
    figures["goals"]["met"] = {
        "din_vs_deepfm": vs_deepfm["DIN"] >= 0.8,
        "prepare_s": prepared["wall_s"] <= 300,
    }
    harness.finish("model_classes", figures)


if __name__ == "__main__":
    main()
