"""Online tables (``ev_params``) against fixed hashed tables of the same memory, day after day.

A drifting synthetic stream (``recpipe data synth drift``: users and items that enter and fade)
is prepared by the Spark job, then trained one day at a time, each day fine-tuning from the
day before (as the daily DAG does), by

  (a) fixed hashed tables (``hash_bucket_size``) sized to the memory of (b), and
  (b) online tables: ``filter_freq``, ``delete_after_unseen_days``, ``max_capacity``.

Each day is one ``recpipe train`` process per variant (the two alternate, so that load from
other tenants falls on both), run ``--rounds`` times: rates are the medians over the rounds;
it evaluates on the next day (next-day AUC). Printed per day:
rows used / capacity, admitted, evicted, the process's peak RSS, examples/s by wall time and
per CPU-second of the training loop, next-day AUC. Then the goals: rows <= max_capacity every
day, RSS flat (+-10 %) after the warm-up days, (b) at >= 0.8x (a)'s examples per CPU-second,
mean next-day AUC of (b) >= (a) - 0.002.

    python bench/online_tables.py [--days 30] [--rows 50000] [--batch_size 1024] [--rounds 2]
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import harness  # noqa: E402
from bench.days import config_copy, day_range, features_once, train_day  # noqa: E402

DIM = 16
CAPACITY = {"user_id": 8192, "item_id": 4096}
EV = {"filter_freq": 2, "delete_after_unseen_days": 3}
WARM_UP_DAYS = 5


def fixed_buckets(capacity: int, width: int) -> int:
    """Hashed rows costing what an online table of ``capacity`` rows costs: deep (dim 16) and
    wide (dim 1) weights with lazy Adam's two slots each (12 bytes a column), plus, once for
    both, 5 int64s a row (id, count, step, day, free-row stack) and the count-min sketch's 4
    float32 counters per column."""
    online = capacity * (12 * DIM + 12 * 1 + 5 * 8) + 4 * 4 * width
    return online // (12 * DIM + 12 * 1)


def edits(variant: str) -> dict:
    out = {}
    for feature, capacity in CAPACITY.items():
        key = f"feature_config.features[input_names={feature}]"
        if variant == "online":
            out[f"{key}.ev_params"] = {**EV, "max_capacity": capacity}
        else:
            out[f"{key}.hash_bucket_size"] = fixed_buckets(capacity, max(4096, 2 * capacity))
    return out


def run_day(
    variant: str, ds: str, next_ds: str, model_dir: Path, previous: Path | None, config: Path
) -> dict:
    """One ``recpipe train`` process: train ``ds`` (fine-tuning from ``previous``), evaluate
    ``next_ds``; return its result line with its peak RSS (MiB, ``bench.process_tree``)."""
    measured = train_day(config, model_dir, ds, next_ds, edits(variant), previous)
    return {**measured.result, "peak_rss_mib": measured.peak_rss_mb}


def table_figures(result: dict, table: str) -> dict:
    online = result.get("online_tables") or {}
    prefix = f"ev/deepfm/input_layer/{table}/"
    return {k: online.get(prefix + k) for k in ("rows_used", "capacity", "admitted", "evicted")}


def main() -> int:
    parser = harness.parser(__doc__, rounds=2, workdir="online_tables")
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--rows", type=int, default=50_000, help="rows a day")
    parser.add_argument("--batch_size", type=int, default=1024, help="data_config.batch_size (its default)")
    args = parser.parse_args()
    out = args.workdir
    raw, features = out / "raw", out / "features"
    days = day_range("2024-01-01", args.days + 1)
    if not (raw / f"ds={days[-1]}").exists():
        from dev.data.drift import synth_drift

        synth_drift(args.rows, len(days), raw)
    changes = {
        "raw_input_path": str(raw),
        "train_input_path": str(features),
        "model_dir": str(out / "models"),
    }
    config = config_copy("conf/drift_deepfm.yaml", out / "pipeline.yaml",
                         {**changes, "data_config": {"batch_size": args.batch_size}})  # fmt: skip
    features_once(config, days, out / "features.log")
    print(
        f"{args.days} days of {args.rows} rows, batch {args.batch_size}; (a) hashed tables of equal memory:",
        edits("hashed"),
    )
    header = f"{'day':10s} {'variant':7s} {'user rows':>13s} {'adm':>5s} {'evi':>5s} {'RSS MiB':>8s}"
    print(header + f" {'ex/s wall':>9s} {'ex/CPU-s':>8s} {'next AUC':>8s}")
    rows: dict[str, list[dict]] = {"hashed": [], "online": []}
    for i, ds in enumerate(days[:-1]):

        def day(variant: str, i: int = i, ds: str = ds):
            def once() -> dict:
                previous = out / "models" / variant / days[i - 1] if i else None
                return run_day(variant, ds, days[i + 1], out / "models" / variant / ds, previous, config)

            return once

        runs = harness.alternate({v: day(v) for v in rows}, args.rounds, show=lambda line: None)
        for variant, results in runs.items():
            result = results[-1]  # the model the next day fine-tunes from
            user = table_figures(result, "user_id")
            examples = statistics.median(r["examples_per_sec"] for r in results)
            loop_cpu_s = statistics.median(r["cpu_seconds"] for r in results)
            cpu_rate = args.rows / max(loop_cpu_s, 1e-9)
            entry = {
                "ds": ds,
                "rss": result["peak_rss_mib"],
                "wall_rate": examples,
                "cpu_rate": cpu_rate,
                "loop_cpu_s": loop_cpu_s,
                "auc": result["eval"]["auc"],
                # the first step (tracing, Grappler) and later steps, medians over the rounds
                **{
                    k: statistics.median((r.get("phases") or {}).get(k, 0) for r in results)
                    for k in ("first_step_cpu_s", "step_cpu_ms", "step_ops")
                },
                **{f"user_{k}": v for k, v in user.items()},
                **{f"item_{k}": v for k, v in table_figures(result, "item_id").items()},
            }
            rows[variant].append(entry)
            used = f"{user['rows_used']}/{user['capacity']}" if user["rows_used"] is not None else "-"
            print(
                f"{ds:10s} {variant:7s} {used:>13s} {user['admitted'] or 0:>5} {user['evicted'] or 0:>5} "
                f"{entry['rss']:8.0f} {examples:9.0f} {cpu_rate:8.0f} {entry['auc']:8.4f}",
                flush=True,
            )
    (out / "results.json").write_text(json.dumps(rows, indent=2))
    figures = _goals(rows)
    harness.finish("online_tables", {"days": args.days, "rows_a_day": args.rows,
                                     "batch_size": args.batch_size, "rounds": args.rounds,
                                     "capacity": CAPACITY, **EV, **figures})  # fmt: skip
    return 0


def _goals(rows: dict[str, list[dict]]) -> dict:
    """Print the figures against their goals; return them (the results file's)."""
    a, b = rows["hashed"], rows["online"]
    over = [r["ds"] for r in b for t in ("user", "item") if r[f"{t}_rows_used"] > r[f"{t}_capacity"]]
    late = b[WARM_UP_DAYS:] or b  # short runs: every day
    rss = [r["rss"] for r in late]
    mid = statistics.median_high(rss)
    spread = max(abs(x - mid) / mid for x in rss)
    cpu_a = sum(r["cpu_rate"] for r in a) / len(a)
    cpu_b = sum(r["cpu_rate"] for r in b) / len(b)
    auc_a = sum(r["auc"] for r in a[1:]) / (len(a) - 1)
    auc_b = sum(r["auc"] for r in b[1:]) / (len(b) - 1)
    print(f"rows <= max_capacity every day: {not over} {over or ''}")
    print(
        f"(b) peak RSS after day {WARM_UP_DAYS}: median {mid:.0f} MiB, max deviation {spread:.1%} (goal 10 %)"
    )
    print(
        f"examples per CPU-second: (a) {cpu_a:.0f}, (b) {cpu_b:.0f}, ratio {cpu_b / cpu_a:.2f} (goal >= 0.8)"
    )
    print(
        f"mean next-day AUC (days 2..): (a) {auc_a:.4f}, (b) {auc_b:.4f}, "
        f"(b) - (a) {auc_b - auc_a:+.4f} (goal >= -0.002)"
    )
    ratios = sorted(y["cpu_rate"] / x["cpu_rate"] for x, y in zip(a, b, strict=True))
    return {
        "within_capacity": not over,
        "user_rows_used": {"max": max(r["user_rows_used"] for r in b),
                           "after_warm_up_min": min(r["user_rows_used"] for r in late),
                           "after_warm_up_max": max(r["user_rows_used"] for r in late)},
        "online_rss_mib": {"min": min(rss), "max": max(rss), "median": mid, "spread": spread},
        "per_cpu_s": {"hashed": cpu_a, "online": cpu_b, "ratio": cpu_b / cpu_a,
                      "day_ratio_median": statistics.median_high(ratios),
                      "day_ratio_min": ratios[0], "day_ratio_max": ratios[-1]},
        "next_day_auc": {"hashed": auc_a, "online": auc_b, "diff": auc_b - auc_a},
        # where (b)'s CPU goes: medians over the days
        "phases": {name: {k: statistics.median_high(r[k] for r in days)
                          for k in ("first_step_cpu_s", "step_cpu_ms", "step_ops")}
                   for name, days in (("hashed", a), ("online", b))},
        "loop_cpu_s_median": {name: statistics.median_high(r["loop_cpu_s"] for r in days)
                              for name, days in (("hashed", a), ("online", b))},
        "warm_up_days": WARM_UP_DAYS,
    }  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
