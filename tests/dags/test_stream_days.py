"""``recpipe_stream_retrain`` over three days of click logs, as the scheduler's backfill runs it
(``make demo-stream``), in passes of 30 minutes (``stream.pass_minutes``, passes named
``hh=HHMM``): two passes a day (20:00, and 20:30 which closes the day, the last pass of
``close_hour`` 20; day 1 also a quiet 19:30) of 400 MovieLens (user, item) pairs whose clicks
follow the user's occupation (a signal a few passes learn: a MovieLens hour's ratings are too
few to tell a model from noise), ``retention_days: 1``. Day 1's model becomes the champion; day
2 is trained badly on purpose (from scratch, one step a pass: the run's conf) and its close is
rejected; day 3 starts again from the champion, is gated against it and promoted. After every
pass the Redis rows equal the rows of the day's exports applied in order (what ``recpipe serve
apply-delta`` builds the served SavedModel from) and the champion's model dir is on disk; at
the end, the push of an earlier pass, cleared and run again, leaves the store where it was, and
a whole earlier pass run again trains, exports and pushes nothing twice."""

from __future__ import annotations

import json
import os
import threading
import uuid
from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.dags.conftest import fresh_postgres_db
from tests.support import ROOT, spark_connect_url, write_click_log

# the module's backfill of 7 passes runs in the first test's time: up to its own 1500 s limit
# (11-18 min on the 2-core machine), past pytest's 1200 s default
pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]

DAYS = ["1997-11-12", "1997-11-13", "1997-11-14"]
TIMES = ["20:00", "20:30"]  # the passes' starts: 30-minute passes, named by them
PASSES = [t.replace(":", "") for t in TIMES]
ROWS = 400
QUIET = f"{DAYS[0]}/1930"  # a quiet pass: prepared, then everything after it skipped
DAG_ID = "recpipe_stream_retrain"
BAD = {"full_retrain": True, "edit_config_json": {"train_config.num_steps": 1}}


def _rate(optimizer: str, rate: float) -> dict:
    return {optimizer: {"learning_rate": {"constant_learning_rate": {"learning_rate": rate}}}}


def _store_rows(client, model: str, tables) -> dict:
    from recpipe.exports.store import EmbeddingStore

    return {t: EmbeddingStore(client, model).read_rows(t) for t in tables}


def _chain_rows(day_dir, upto: str) -> dict:
    from recpipe.exports.files import apply, chain, read_params

    params = None
    for export in chain(day_dir):
        params = read_params(export) if params is None else apply(params, read_params(export))
        if export.name == upto:
            break
    return {
        t: {int(k): {v: rows.views[v][i] for v in rows.views} for i, k in enumerate(rows.ids)}
        for t, rows in params.tables.items()
    }


def _same(store: dict, want: dict) -> None:
    assert store.keys() == want.keys()
    for table, rows in want.items():
        assert store[table].keys() == rows.keys(), table
        for key, views in rows.items():
            for view, values in views.items():
                np.testing.assert_array_equal(store[table][key][view], values, err_msg=f"{table} {key}")


def _clear(api, client, model, day, want, task_ids, pass_dir=None) -> dict:
    """Clear ``task_ids`` (None: every task) of the run of ``day``'s first pass, after the
    later one; wait for it to run again; return the store (and ``pass_dir``) before and
    after."""
    from recpipe.exports.store import EmbeddingStore

    def state():
        online = EmbeddingStore(client, model)
        out = {"applied": dict(online.applied()), "rows": _store_rows(client, model, want)}
        if pass_dir is not None:
            out["train_result"] = json.loads((pass_dir / "train_result.json").read_text())["global_step"]
            out["checkpoints"] = sorted(p.name for p in pass_dir.glob("model.ckpt-*.index"))
            exports = pass_dir.parents[3] / "exports" / pass_dir.parents[1].name / day
            out["exports"] = {p.name: (p / "manifest.json").read_text() for p in sorted(exports.iterdir())}
        return out

    before = state()
    run_id = next(
        r["dag_run_id"] for r in api.runs(DAG_ID) if r["logical_date"].startswith(f"{day}T{TIMES[0]}")
    )
    api.clear(DAG_ID, run_id, task_ids or None)
    rerun = api.wait_for_run(DAG_ID, run_id, timeout=300)
    push = api.task_instance(DAG_ID, run_id, "push")
    after = state()
    rows = (before.pop("rows"), after.pop("rows"))
    return {"cleared": task_ids or "all", "state": rerun["state"], "tries": push["try_number"],
            "before": before, "after": after, "rows": rows}  # fmt: skip


@pytest.fixture(scope="module")
def days(movielens_hourly_raw, tmp_path_factory) -> dict:
    import redis
    from mlflow import MlflowClient

    from dev.airflow import land_when_waited_for, run_backfill
    from dev.env import airflow_env
    from recpipe.exports.store import EmbeddingStore
    from recpipe.launch.topology import free_ports

    spark_connect_url()  # prepare_features runs on it
    base = tmp_path_factory.mktemp("stream_days")
    var = base / "var"
    hours = [QUIET, *[f"{d}/{p}" for d in DAYS for p in PASSES]]
    rows = {h: 0 if h == QUIET else ROWS for h in hours}
    write_click_log(movielens_hourly_raw, var / "raw", hours, rows, p_student=0.7, p_other=0.15)
    # the quiet pass lands once its run waits for it, and is announced (recpipe.arrivals)
    quiet_partition = var / "raw" / "events" / f"ds={DAYS[0]}" / f"hh={QUIET[-4:]}"
    (quiet_partition / "_SUCCESS").unlink()
    model = f"stream_days_{uuid.uuid4().hex[:6]}"
    config = yaml.safe_load((ROOT / "conf/retrain/movielens_stream.yaml").read_text())
    config.update(
        model_name=model,
        start_date=DAYS[0],
        runs_dir=str(var / "runs"),
        export_dir=str(var / "exports"),
        retention_days=1,
        # a look a minute: a wait that ends sooner was ended by the partition's announcement
        sensor={**config["sensor"], "poke_interval_s": 60, "timeout_s": 600},
        tracking={"retries": 0},
        # day 1 has no champion: any finite AUC; a day not significantly worse takes over
        gate={"min_metric": 0.0, "inconclusive": "promote", "tolerance": 0.02},
    )
    config["stream"].update(close_hour=int(PASSES[-1][:2]), pass_minutes=30)
    config["edit_config_json"].update(
        {
            "raw_input_path": str(var / "raw" / "events"),
            "train_input_path": str(var / "features"),
            "model_dir": str(var / "model"),
            "data_config.num_epochs": 3,
            "train_config.optimizer_config": [
                {
                    "lazy_adam_optimizer": {
                        "learning_rate": {"constant_learning_rate": {"learning_rate": 0.05}}
                    }
                },
                {"adam_optimizer": {"learning_rate": {"constant_learning_rate": {"learning_rate": 0.01}}}},
            ],
        }
    )
    (base / "stream.yaml").write_text(yaml.safe_dump(config))
    env = {
        **os.environ,
        **airflow_env(ROOT, base / "airflow"),
        "RECPIPE_VAR_DIR": str(var),
        "RECPIPE_RETRAIN_CONFIGS": str(base / "stream.yaml"),
        "MLFLOW_TRACKING_URI": f"sqlite:///{var / 'mlflow' / 'mlflow.db'}",
    }
    client = redis.Redis(host="127.0.0.1", port=6379)
    online = EmbeddingStore(client, model)
    registry = MlflowClient(env["MLFLOW_TRACKING_URI"])
    runs, exports = var / "runs" / model, var / "exports" / model
    checks: list[dict] = []
    passes = [f"{DAYS[0]}T19:30", *[f"{d}T{t}" for d in DAYS for t in TIMES]]

    def after(api, part):
        """After each pass: the store against the day's chain, the champion's dir on disk."""
        (logical,) = part
        day, key = logical[:10], logical[11:].replace(":", "")
        if logical == passes[0]:  # the quiet pass: nothing trained, exported or pushed
            checks.append(
                {"quiet": sorted(p.name for p in runs.rglob("hh=*")), "applied": online.applied()}
            )
            (run,) = [r for r in api.runs(DAG_ID) if r["logical_date"].startswith(logical)]
            tis = {t["task_id"]: t for t in api.task_instances(DAG_ID, run["dag_run_id"])}
            checks.append(
                {
                    "arrival": landed.get(logical, {}),
                    "wait": tis["wait_for_pass"],
                    "prepare": tis["prepare_features"],
                }
            )
            return
        record = online.applied()
        day_dir = exports / day
        want = _chain_rows(day_dir, record["name"])
        _same(_store_rows(client, model, want), want)
        champion = None
        try:
            champion = registry.get_model_version_by_alias(model, "champion")
        except Exception:  # no champion before the first close
            pass
        checks.append(
            {
                "pass": f"{day}/{key}",
                "applied": dict(record),
                "champion": champion and dict(champion.tags),
                "champion_dir_exists": champion is None or Path(champion.tags["model_dir"]).is_dir(),
                "pass_dirs": sorted(str(p.relative_to(runs)) for p in runs.glob("ds=*/hh=*")),
            }
        )
        if logical == passes[-1]:
            checks.append(_clear(api, client, model, day, want, ["push"]))
            checks.append(_clear(api, client, model, day, want, None, runs / f"ds={day}" / f"hh={PASSES[0]}"))

    landed: dict = {}
    port = free_ports(1)[0]  # the api-server's: the thread below asks it when to land
    threading.Thread(
        target=land_when_waited_for,
        args=(port, base / "airflow", DAG_ID, [(passes[0], quiet_partition)], landed),
        daemon=True,
    ).start()
    lines: list[str] = []
    with fresh_postgres_db() as db:  # as deployed: SQLite's write lock slows every task's state
        states = run_backfill(
            env, base / "airflow", DAG_ID, passes, 1500, lines.append, chunk=1,
            confs={f"{DAYS[1]}T{t}": BAD for t in TIMES}, after_chunk=after, port=port,
            database_url=db,
        )  # fmt: skip
    yield {
        "states": states,
        "checks": checks,
        "lines": lines,
        "registry": registry,
        "model": model,
        "runs": runs,
        "exports": exports,
        "redis": client,
        "tracking_uri": env["MLFLOW_TRACKING_URI"],
    }
    for key in client.scan_iter(match=f"recpipe:{model}:*"):
        client.delete(key)


def test_every_pass_ran_and_the_store_followed_each_one(days):
    states = days["states"]
    assert states == {p: "success" for p in states} and len(states) == 7, days["lines"][-20:]
    pushed = [c["applied"]["day"] + "/" + c["applied"]["name"] for c in days["checks"] if "pass" in c]
    assert pushed == [f"{d}/{n}" for d in DAYS for n in ("base", f"delta-{PASSES[1]}")]


def test_a_quiet_pass_is_prepared_and_skips_the_rest(days):
    (quiet,) = [c for c in days["checks"] if "quiet" in c]
    assert quiet == {"quiet": [], "applied": {}}
    stats = days["runs"].parents[1] / "features" / f"ds={DAYS[0]}" / "hh=1930" / "_stats.json"
    assert json.loads(stats.read_text())["rows"] == 0


def test_a_pass_waiting_for_its_partition_starts_when_it_is_announced(days):
    from datetime import datetime

    (arrival,) = [c for c in days["checks"] if "arrival" in c]
    landed = arrival["arrival"]
    assert landed.get("heard", 0) >= 1, landed  # the triggerer's subscription heard it
    ended = datetime.fromisoformat(arrival["wait"]["end_date"]).timestamp()
    started = datetime.fromisoformat(arrival["prepare"]["start_date"]).timestamp()
    # the sensor looks once a minute: only the message ends the wait this soon
    assert 0 <= ended - landed["at"] < 20 and started - landed["at"] < 40, (landed, arrival)


def test_each_pass_fine_tunes_from_the_days_previous_pass(days):
    runs = days["runs"] / f"ds={DAYS[2]}"
    first = json.loads((runs / f"hh={PASSES[0]}" / "train_result.json").read_text())
    second = json.loads((runs / f"hh={PASSES[1]}" / "train_result.json").read_text())
    assert second["fine_tune_checkpoint"] == str(runs / f"hh={PASSES[0]}")
    assert first["train_ds"] == f"{DAYS[2]}/{PASSES[0]}" and second["online_tables"]
    assert second["global_step"] == 3 * -(-ROWS // 32)  # 3 epochs of 400 rows, batch 32
    # one job a pass: it scored the pass before training and exported it after
    for key in PASSES[:1]:  # PASSES[-1] closes the day: its close runs jobs of its own
        assert sorted(p.name for p in (runs / f"hh={key}" / "logs").iterdir()) == ["train-0.log"]
        assert (runs / f"hh={key}" / "pass_eval_predictions.parquet").exists()


def test_day_two_is_rejected_and_day_three_promoted_against_day_ones_champion(days):
    registry, model = days["registry"], days["model"]
    versions = sorted(registry.search_model_versions(f"name='{model}'"), key=lambda v: int(v.version))
    outcomes = [(v.tags["ds"], v.tags["promotion"]) for v in versions]
    assert outcomes == [(DAYS[0], "promoted"), (DAYS[1], "rejected"), (DAYS[2], "promoted")], [
        v.tags.get("promotion_reason") for v in versions
    ]
    champion = registry.get_model_version_by_alias(model, "champion")
    assert champion.version == versions[2].version
    # day 3's first pass fine-tuned from day 1's champion, not from day 2's rejected model,
    # and was scored by it (the model it started from) before training
    first = days["runs"] / f"ds={DAYS[2]}" / f"hh={PASSES[0]}"
    assert (
        json.loads((first / "train_result.json").read_text())["fine_tune_checkpoint"]
        == (versions[0].tags["model_dir"])
    )
    scored = json.loads((first / "pass_eval_result.json").read_text())
    assert scored["checkpoint"].startswith(versions[0].tags["model_dir"])
    # each close: a SavedModel in TF Serving's layout beside the day dirs, the day's rows scored
    numbered = sorted(p.name for p in days["exports"].iterdir() if p.name.isdigit())
    assert len(numbered) == 3 and [v.tags["export_path"].rsplit("/", 1)[1] for v in versions] == numbered


def test_progressive_validation_draws_one_curve_a_day_in_mlflow(days):
    client = days["registry"]
    exp = client.get_experiment_by_name(days["model"])  # the registered model's own experiment
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"
    day_runs = {
        r.data.tags["ds"]: r for r in client.search_runs([exp.experiment_id], "tags.`recpipe.step` = 'day'")
    }
    assert sorted(day_runs) == DAYS
    # day 1's 20:00 had no model before it; later days' first pass is scored by the champion;
    # a pass shorter than an hour is drawn at its minute of the day
    steps = {
        d: [m.step for m in client.get_metric_history(r.info.run_id, "pass_auc")] for d, r in day_runs.items()
    }
    assert steps == {DAYS[0]: [1230], DAYS[1]: [1200, 1230], DAYS[2]: [1200, 1230]}
    rows = client.get_metric_history(day_runs[DAYS[0]].info.run_id, "pass_rows")
    assert [(m.step, m.value) for m in rows] == [(1230, float(ROWS))]
    parents = client.search_runs(
        [exp.experiment_id],
        "tags.`recpipe.step` = 'parent' and tags.`airflow.dag_id` = 'recpipe_stream_retrain'",
    )
    # every trained pass's parent run is ended (a re-run's too); the quiet pass logged none
    assert len(parents) >= 6 and {r.info.status for r in parents} == {"FINISHED"}
    # named by day and pass first, then how the DAG run was started
    assert {r.info.run_name for r in parents} >= {f"ds={d} hh={p} backfill" for d in DAYS for p in PASSES}
    # each day's close ended its curve, with the day's pooled scores
    assert {r.info.run_name: r.info.status for r in day_runs.values()} == {
        f"ds={d} passes": "FINISHED" for d in DAYS
    }
    assert all(0 < r.data.metrics["day_auc"] < 1 for r in day_runs.values())
    # the DAG runs are over: no run of the experiment is left RUNNING
    running = client.search_runs([exp.experiment_id], "attributes.status = 'RUNNING'")
    assert running == [], [(r.info.run_name, r.data.tags.get("recpipe.step")) for r in running]


def test_retention_never_deleted_the_champions_dir(days):
    checks = [c for c in days["checks"] if "pass" in c]
    assert all(c["champion_dir_exists"] for c in checks), checks
    # after day 3's first pass: day 1's champion pass is kept, one day back beyond the window
    day3 = next(c for c in checks if c["pass"] == f"{DAYS[2]}/{PASSES[0]}")
    assert f"ds={DAYS[0]}/hh={PASSES[-1]}" in day3["pass_dirs"]
    assert f"ds={DAYS[0]}/hh={PASSES[0]}" not in day3["pass_dirs"]


def test_a_cleared_push_of_an_earlier_pass_leaves_the_store_where_it_was(days):
    (cleared,) = [c for c in days["checks"] if c.get("cleared") == ["push"]]
    assert cleared["state"] == "success" and cleared["tries"] >= 2
    assert cleared["after"] == cleared["before"]
    _same(*reversed(cleared["rows"]))


def test_an_earlier_pass_run_again_trains_exports_and_pushes_nothing_twice(days):
    (again,) = [c for c in days["checks"] if c.get("cleared") == "all"]
    assert again["state"] == "success" and again["tries"] >= 3
    assert again["after"] == again["before"]  # same step, checkpoints, manifests, store record
    assert again["before"]["train_result"] == 3 * -(-ROWS // 32)
    _same(*reversed(again["rows"]))


def test_a_rollback_reaches_day_ones_champion_though_retention_keeps_one_day(days):
    """After day 3's close, day 1's version is the one a rollback goes back to (day 2's was
    rejected). Retention keeps one day, but also the champions a rollback reaches
    (``retention_champions``): its pass dir and export are there, ``champion show`` lists it as
    available, and ``recpipe champion rollback`` moves the alias and restores the store to its
    rows. (Refusal of a version whose files are gone: tests/test_champion.py.)"""
    import json
    import os
    import subprocess

    from recpipe.exports.store import EmbeddingStore
    from tests.support import RECPIPE, ROOT

    registry, model, client = days["registry"], days["model"], days["redis"]
    env = {**os.environ, "MLFLOW_TRACKING_URI": days["tracking_uri"]}
    env.pop("RECPIPE_REDIS_URL", None)

    def run(action, *extra):
        argv = [*RECPIPE, "champion", action, "--model_name", model, *extra]
        done = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=120, env=env)
        assert done.returncode == 0, done.stdout + done.stderr
        return json.loads(done.stdout)

    shown = run("show")
    (first, *_) = shown["rollback_targets"]
    assert first["available"] and first["ds"] == DAYS[0], shown["rollback_targets"]
    moved = run("rollback", "--reason", "day 3 serves badly", "--by", "Ana", "--redis_url", "redis://127.0.0.1:6379/0")
    assert moved["version"] == first["version"] and moved["store"]["rows"] > 0
    assert int(registry.get_model_version_by_alias(model, "champion").version) == first["version"]
    assert EmbeddingStore(client, model).applied()["day"] == DAYS[0]
