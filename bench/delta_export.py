"""A pass's delta export against a full export, with a given share of the rows touched.

The MovieLens stream model (``conf/retrain/movielens_stream.yaml``'s online tables) is built
with ``--rows`` admitted ids in each of its id tables, then:

  (a) the full SavedModel export the daily pipeline ships (``export_saved_model``);
  (b) the day's base (``trainer.delta.export_base``: that SavedModel plus every row as files);
  (c) after ``--touched`` of the rows are moved and looked up (their ``ev_versions`` stamped)
      and ``--evicted`` of them freed, the pass's delta (``export_delta``).

Each is timed ``--rounds`` times ((a) and (b) alternating; medians of wall and CPU seconds)
and measured on disk.
Goal (issue 17): (c) <= 1/10 of (a)'s bytes and time at ~10 % touched.

    python bench/delta_export.py [--rows 200000] [--touched 0.1] [--evicted 0.01] [--rounds 3]
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from bench import harness  # noqa: E402


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main() -> int:
    parser = harness.parser(__doc__, rounds=3)
    parser.add_argument("--rows", type=int, default=200_000, help="admitted ids per id table")
    parser.add_argument("--touched", type=float, default=0.1)
    parser.add_argument("--evicted", type=float, default=0.01)
    args = parser.parse_args()

    import numpy as np
    import yaml

    from recpipe.config import load_pipeline_config
    from recpipe.exports.files import TableRows
    from trainer import online
    from trainer.delta import export_base, export_delta
    from trainer.embedding_tables import variable_name
    from trainer.input import sample_inputs
    from trainer.models.builders import build_model
    from trainer.serving import export_saved_model

    stream = yaml.safe_load((ROOT / "conf/retrain/movielens_stream.yaml").read_text())
    edits = dict(stream["edit_config_json"])
    # room for --rows ids in every member of a group
    edits["model_config.ev_params"] = {**edits["model_config.ev_params"], "max_capacity": 8 * args.rows}
    config = load_pipeline_config(ROOT / stream["pipeline_config_path"], edits)
    model = build_model(config)
    model(sample_inputs(config))
    rng = np.random.default_rng(0)
    evs = online.tables(model)
    # each member table of each online table (a group holds several) gets --rows ids, through
    # the tables' own loader (the rows a restored checkpoint would give), all looked up at step 50
    rows = {
        member: TableRows(
            rng.choice(2**62, size=args.rows, replace=False).astype(np.int64),
            {
                ev.member_name(variable_name(view.weights), member): rng.normal(
                    0, 0.01, (args.rows, view.dim)
                ).astype(np.float32)
                for view in ev.views
            },
        )
        for ev in evs
        for member in ev.members
    }
    online.load_rows(model, rows)
    for ev in evs:
        ev.versions.assign(np.where(ev.ids() != online.FREE, 50, 0).astype(np.int64))
    model.ev_clock.step.assign(50)
    online.refresh(model)
    work = Path(tempfile.mkdtemp(prefix="recpipe-delta-"))
    day = "1997-09-22"
    try:
        exports = work / "exports" / day
        paths: dict[str, Path] = {}
        quiet = {"show": lambda line: None}
        first = harness.alternate(
            {
                "full": lambda: paths.update(
                    full=export_saved_model(config, model, work / "m", work / "full", 1)
                ),
                "base": lambda: paths.update(base=export_base(config, model, {}, exports, day, 1)),
            },
            args.rounds,
            **quiet,
        )
        # a pass: some rows looked up and moved, some evicted
        for ev in evs:
            n = int((ev.ids() != online.FREE).sum())  # used rows come first
            touched = rng.choice(n, size=int(n * args.touched), replace=False)
            versions = ev.versions.numpy()
            versions[touched] = 100
            ev.versions.assign(versions)
            for view in ev.views:
                w = view.weights.numpy()
                w[touched] += 0.001
                view.weights.assign(w)
            keys = ev.keys.numpy()
            keys[rng.choice(n, size=int(n * args.evicted), replace=False)] = online.FREE
            ev.keys.assign(keys)
        model.ev_clock.step.assign(100)
        online.refresh(model)
        delta = {"delta": lambda: paths.update(delta=export_delta(config, model, {}, exports, "09", 2))}
        second = harness.alternate(delta, args.rounds, **quiet)
        figures = harness.summarize({**first, **second})["variants"]
        for key, medians in figures.items():
            medians["mib"] = _size(paths[key]) / 2**20
        ids = len(rows) * args.rows
        print(f"{len(evs)} online tables, {len(rows)} id tables x {args.rows:,} ids ({ids:,} rows)")
        print(f"medians of {args.rounds} rounds ((a) and (b) alternating, then (c))")
        labels = {
            "full": "(a) full SavedModel",
            "base": "(b) base (SavedModel + rows)",
            "delta": f"(c) delta, {args.touched:.0%} touched, {args.evicted:.0%} evicted",
        }
        print(
            harness.table(
                {labels[k]: v for k, v in figures.items()},
                {"mib": "MiB", "wall_s": "wall s", "cpu_s": "CPU s"},
            )
        )
        d, f = figures["delta"], figures["full"]
        ratios = {
            "bytes": d["mib"] / f["mib"],
            "wall": d["wall_s"] / f["wall_s"],
            "cpu": d["cpu_s"] / f["cpu_s"],
        }
        shares = ", ".join(f"{k} {v:.3f}" for k, v in ratios.items())
        print(f"delta / full: {shares} (goal: at most 0.1)")
        summary = {
            "id_tables": len(rows),
            "online_tables": len(evs),
            "ids_per_table": args.rows,
            "touched": args.touched,
            "evicted": args.evicted,
            "rounds": args.rounds,
        }
        harness.finish("delta_export", {**summary, **figures, "delta_over_full": ratios})
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
