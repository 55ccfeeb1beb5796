"""Incremental training against full retraining, day after day, on real MovieLens days.

For each of ``--days`` days from ``--start`` (default 1997-09-20, the first day of the data;
the daily retrain's edits: batch 64, 2 epochs):

  (a) incremental: fine-tune from the day before's model on that day only (as the DAGs do);
  (b) full: train from scratch on every day so far, from 1997-09-20.

With a later ``--start`` the days before it are history: (a)'s first day fine-tunes a base
model trained from scratch on them (once, timed apart), as an incremental job in production
starts from the model it has, and (b) trains on them every day.

Both score the next day (next-day AUC, all of its rows). Each training is one ``recpipe
train`` process; printed per day: each variant's next-day AUC, process wall time and the
training loop's CPU-seconds. Goal (issue 17): (a)'s mean AUC within 0.003 of (b)'s at <= 1/10
of its time.

    python bench/incremental_vs_full.py [--days 30] [--start 1997-09-20] [--workdir var/bench/incremental]
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from datetime import date, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import harness  # noqa: E402
from bench.days import config_copy, day_range, features_once, train_day  # noqa: E402

FIRST = date(1997, 9, 20)
EDITS = {
    "data_config.batch_size": 64,
    "data_config.num_epochs": 2,
    "train_config.log_step_count_steps": 50,
    "train_config.save_checkpoints_steps": 100000,
}


def constant_lr(rate: float) -> dict:
    """Edits that train with Adam at a constant learning ``rate`` (the config's decays)."""
    lr = {"constant_learning_rate": {"learning_rate": rate}}
    return {"train_config.optimizer_config": [{"adam_optimizer": {"learning_rate": lr}}]}


def train(
    config: Path, model_dir: Path, train_ds: str, eval_ds: str, previous: Path | None, extra=None
) -> dict:
    """One ``recpipe train`` process; its result line with the process's wall seconds."""
    m = train_day(config, model_dir, train_ds, eval_ds, {**EDITS, **(extra or {})}, previous)
    return {**m.result, "wall_s": m.wall_s}


def compare(xs: list[dict], ys: list[dict]) -> tuple[float, float, float, float, str]:
    """(mean AUC of xs, of ys, mean of the per-day differences, its standard error over the
    days, a note of the days left out) over the days where both AUCs are defined: a next day
    whose rows are all of one label (1997-11-04 has 2 rows) has none."""
    pairs = [(x["eval"]["auc"], y["eval"]["auc"]) for x, y in zip(xs, ys, strict=True)]
    kept = [(x, y) for x, y in pairs if math.isfinite(x) and math.isfinite(y)]
    per_day = [x - y for x, y in kept]
    # the days' spread: how far the mean difference is from noise on days this small
    se = statistics.stdev(per_day) / len(per_day) ** 0.5 if len(per_day) > 1 else float("nan")
    left_out = f" ({len(pairs) - len(kept)} day(s) without an AUC left out)" if len(kept) < len(pairs) else ""
    mean = statistics.fmean
    return mean(x for x, _ in kept), mean(y for _, y in kept), mean(per_day), se, left_out


def main() -> int:
    parser = harness.parser(__doc__, rounds=None, workdir="incremental")
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument(
        "--incremental-lr",
        type=float,
        help="also run (a'): (a) at this constant Adam learning rate. The config's rate decays "
        "with the global step, which fine-tuning carries from day to day",
    )
    parser.add_argument(
        "--start",
        type=date.fromisoformat,
        default=FIRST,
        help="the first day compared; the days from 1997-09-20 before it are history",
    )
    args = parser.parse_args()
    out = args.workdir
    if args.start < FIRST:
        parser.error(f"--start {args.start} is before the data's first day {FIRST}")
    days = day_range(args.start, args.days + 1)
    path = config_copy("conf/movielens_deepfm.yaml", out / "pipeline.yaml", {
        "raw_input_path": str(ROOT / "data/raw/movielens/events"),
        "train_input_path": str(out / "features"),
        "model_dir": str(out / "model"),
    })  # fmt: skip
    features_once(path, day_range(FIRST, (args.start - FIRST).days + len(days)), out / "features.log")
    side = f"{'AUC':>8s} {'wall s':>7s} {'loop CPU-s':>10s}"
    print(f"{'day':10s} (a) {side}   (b) {side}")
    base = None
    if args.start > FIRST:
        history = f"{FIRST}:{args.start - timedelta(days=1)}"
        base = out / "base"
        b0 = train(path, base, history, days[0], None)
        print(
            f"base model on {history}: next-day AUC {b0['eval']['auc']:.4f}, "
            f"{b0['wall_s']:.1f} s wall, {b0['cpu_seconds']:.2f} loop CPU-s (not counted)"
        )
    rows, constant = [], []
    for i, ds in enumerate(days[:-1]):
        previous = out / "incremental" / days[i - 1] if i else base
        a = train(path, out / "incremental" / ds, ds, days[i + 1], previous)
        b = train(path, out / "full" / ds, f"{FIRST}:{ds}", days[i + 1], None)
        rows.append((ds, a, b))
        line = (
            f"{ds:10s}     {a['eval']['auc']:8.4f} {a['wall_s']:7.1f} {a['cpu_seconds']:10.2f}       "
            f"{b['eval']['auc']:8.4f} {b['wall_s']:7.1f} {b['cpu_seconds']:10.2f}"
        )
        if args.incremental_lr:
            prev_c = out / "incremental_constant" / days[i - 1] if i else base
            c = train(
                path,
                out / "incremental_constant" / ds,
                ds,
                days[i + 1],
                prev_c,
                constant_lr(args.incremental_lr),
            )
            constant.append(c)
            line += f"   (a') {c['eval']['auc']:8.4f} {c['wall_s']:7.1f} {c['cpu_seconds']:10.2f}"
        print(line, flush=True)
    auc_a, auc_b, diff, se, left_out = compare([r[1] for r in rows], [r[2] for r in rows])
    wall_a, wall_b = sum(r[1]["wall_s"] for r in rows), sum(r[2]["wall_s"] for r in rows)
    cpu_a, cpu_b = sum(r[1]["cpu_seconds"] for r in rows), sum(r[2]["cpu_seconds"] for r in rows)
    print(
        f"mean next-day AUC: (a) {auc_a:.4f}, (b) {auc_b:.4f}, (a) - (b) = {diff:+.4f} "
        f"(standard error over days {se:.4f}; goal >= -0.003){left_out}"
    )
    print(
        f"time: (a) / (b) = {wall_a / wall_b:.3f} by process wall ({wall_a:.0f} s / {wall_b:.0f} s), "
        f"{cpu_a / cpu_b:.3f} by training-loop CPU ({cpu_a:.0f} / {cpu_b:.0f} CPU-s) (goal <= 0.1)"
    )
    if constant:
        auc_c, _, diff_c, se_c, left_out = compare(constant, [r[2] for r in rows])
        cpu_c = sum(c["cpu_seconds"] for c in constant)
        print(
            f"(a') constant learning rate {args.incremental_lr:g}: mean next-day AUC {auc_c:.4f}, "
            f"(a') - (b) = {diff_c:+.4f} (standard error {se_c:.4f}); "
            f"loop CPU (a') / (b) = {cpu_c / cpu_b:.3f}{left_out}"
        )
    kept = [r for r in rows if math.isfinite(r[1]["eval"]["auc"]) and math.isfinite(r[2]["eval"]["auc"])]
    figures = {
        "start": str(args.start),
        "days": len(rows),
        "days_compared": len(kept),
        "base_next_day_auc": b0["eval"]["auc"] if base is not None else None,
        "incremental": {"mean_auc": auc_a, "loop_cpu_s": cpu_a, "wall_s": wall_a},
        "full": {"mean_auc": auc_b, "loop_cpu_s": cpu_b, "wall_s": wall_b},
        "auc_diff": diff,
        "auc_diff_se": se,
        "days_incremental_ahead": sum(r[1]["eval"]["auc"] > r[2]["eval"]["auc"] for r in kept),
        "time_ratio": {"loop_cpu": cpu_a / cpu_b, "wall": wall_a / wall_b},
    }
    # a results file a start day: the docs quote both runs
    harness.finish(f"incremental_vs_full_{args.start}", figures)
    (out / "results.json").write_text(json.dumps([{"ds": d, "a": a, "b": b} for d, a, b in rows], indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
