"""The intraday DAG ``recpipe_stream_retrain`` for real (``airflow dags test``) on three
MovieLens hours of 1997-09-20: 15:00 (no rating: a quiet pass), 16:00 (the day's base) and
17:00 (a delta), pushed to the Redis server on 127.0.0.1. 17:00 is made the day's close
(``stream.close_hour``): it registers and gates the day's model."""

from __future__ import annotations

import json
import os
import shutil
import uuid

import numpy as np
import pytest
import yaml

from tests.dags.conftest import airflow
from tests.support import ROOT

DAY = "1997-09-20"
HOURS = ["15", "16", "17"]


@pytest.fixture(scope="module")
def stream(movielens_hourly_raw, tmp_path_factory) -> dict:
    from recpipe.localenv import airflow_env

    base = tmp_path_factory.mktemp("stream")
    var = base / "var"
    shutil.copytree(movielens_hourly_raw / "events" / f"ds={DAY}", var / "raw" / "events" / f"ds={DAY}")
    shutil.copytree(movielens_hourly_raw / "dims", var / "raw" / "dims")
    model = f"stream_test_{uuid.uuid4().hex[:6]}"
    config = yaml.safe_load((ROOT / "conf/retrain/movielens_stream.yaml").read_text())
    config.update(
        model_name=model,
        start_date=DAY,
        runs_dir=str(var / "runs"),
        export_dir=str(var / "exports"),
        sensor={"mode": "reschedule", "poke_interval_s": 1, "timeout_s": 3},
        tracking={"retries": 0},
        # the first day has no champion: any finite AUC is promoted, whatever 88 rows give
        gate={"min_metric": 0.0},
    )
    config["stream"]["close_hour"] = 17
    config["edit_config_json"].update(
        raw_input_path=str(var / "raw" / "events"),
        train_input_path=str(var / "features"),
        model_dir=str(var / "model"),
    )
    (base / "stream.yaml").write_text(yaml.safe_dump(config))
    env = {
        **os.environ,
        **airflow_env(ROOT, base / "airflow"),
        "RECPIPE_VAR_DIR": str(var),
        "RECPIPE_STREAM_CONFIG": str(base / "stream.yaml"),
        "MLFLOW_TRACKING_URI": f"sqlite:///{var / 'mlflow' / 'mlflow.db'}",
    }
    airflow(env, "db", "migrate")
    logs = {}
    for hh in HOURS:
        proc = airflow(env, "dags", "test", "recpipe_stream_retrain", f"{DAY}T{hh}:00:00+00:00")
        logs[hh] = proc.stdout + proc.stderr
    import redis

    client = redis.Redis(host="127.0.0.1", port=6379)
    # 17:00 once more (a second run of the pass, as a cleared or retried run would be)
    pass_dir = var / "runs" / model / f"ds={DAY}" / "hh=17"
    before = _state(pass_dir, var / "exports" / model / DAY, client, model)
    from mlflow.tracking import MlflowClient

    registry = MlflowClient(env["MLFLOW_TRACKING_URI"])
    first = [dict(v.tags) for v in registry.search_model_versions(f"name='{model}'")]
    proc = airflow(env, "dags", "test", "recpipe_stream_retrain", f"{DAY}T17:00:00+00:00")
    rerun = {
        "before": before,
        "after": _state(pass_dir, var / "exports" / model / DAY, client, model),
        "versions": first,
    }
    yield {"env": env, "var": var, "model": model, "logs": logs, "redis": client, "rerun": rerun}
    for key in client.scan_iter(match=f"recpipe:{model}:*"):
        client.delete(key)


def _state(pass_dir, day_dir, client, model) -> dict:
    from recpipe.online_store import applied

    return {
        "train_result": (pass_dir / "train_result.json").read_text(),
        "checkpoints": sorted(p.name for p in pass_dir.glob("model.ckpt-*.index")),
        "exports": {p.name: (p / "manifest.json").read_text() for p in sorted(day_dir.iterdir())},
        "applied": applied(client, model),
    }


def test_a_pass_run_again_is_not_trained_exported_or_pushed_twice(stream):
    before, after = stream["rerun"]["before"], stream["rerun"]["after"]
    assert json.loads(before["train_result"])["global_step"] == 3
    assert after == before  # same step, checkpoints, manifests (no new delta) and store state


def test_a_quiet_hour_is_prepared_and_skips_the_rest(stream):
    features = stream["var"] / "features" / f"ds={DAY}"
    assert json.loads((features / "hh=15" / "_stats.json").read_text())["rows"] == 0
    runs = stream["var"] / "runs" / stream["model"] / f"ds={DAY}"
    assert sorted(p.name for p in runs.iterdir()) == ["hh=16", "hh=17"]


def test_each_pass_fine_tunes_from_the_one_before(stream):
    runs = stream["var"] / "runs" / stream["model"] / f"ds={DAY}"
    first = json.loads((runs / "hh=16" / "train_result.json").read_text())
    second = json.loads((runs / "hh=17" / "train_result.json").read_text())
    assert first["fine_tune_checkpoint"] is None and first["train_ds"] == f"{DAY}/16"
    assert second["fine_tune_checkpoint"] == str(runs / "hh=16")
    assert second["online_tables"] and second["global_step"] == 3  # 88 ratings, batch 32, one epoch


def test_the_first_trained_pass_exports_the_base_and_the_next_a_delta_pushed_to_redis(stream):
    from recpipe.online_store import applied, read_rows
    from recpipe.params import apply, read_manifest, read_params

    day_dir = stream["var"] / "exports" / stream["model"] / DAY
    assert sorted(p.name for p in day_dir.iterdir()) == ["base", "delta-17"]
    assert (day_dir / "base" / "saved_model.pb").exists()
    delta = read_manifest(day_dir / "delta-17")
    assert delta["follows"] == "base" and delta["sequence"] == 1
    # filter_freq 2: no item was rated twice yet; 17:00 touched most genres, not all
    assert delta["tables"]["item_id"]["rows_used"] == 0
    assert 0 < delta["tables"]["genres"]["rows"] < delta["tables"]["genres"]["rows_used"]
    client, model = stream["redis"], stream["model"]
    assert applied(client, model)["name"] == "delta-17"
    params = apply(read_params(day_dir / "base"), read_params(day_dir / "delta-17"))
    for table, rows in params.tables.items():
        stored = read_rows(client, model, table)
        assert set(stored) == set(rows.ids.tolist()), table
        for i, key in enumerate(rows.ids.tolist()):
            for view, values in rows.views.items():
                np.testing.assert_array_equal(stored[key][view], values[i])


def test_progressive_validation_draws_one_curve_a_day_in_mlflow(stream):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(stream["env"]["MLFLOW_TRACKING_URI"])
    exp = client.get_experiment_by_name("movielens_deepfm")
    day_runs = client.search_runs([exp.experiment_id], "tags.`recpipe.step` = 'day'")
    assert [r.data.tags["ds"] for r in day_runs] == [DAY]
    history = client.get_metric_history(day_runs[0].info.run_id, "pass_auc")
    # 16:00 had no model before it to score; 17:00 scored 16:00's on all of its 88 ratings
    assert [m.step for m in history] == [17] and 0.0 <= history[0].value <= 1.0
    rows = client.get_metric_history(day_runs[0].info.run_id, "pass_rows")
    assert [(m.step, m.value) for m in rows] == [(17, 88.0)]
    # each trained pass's parent run (16:00, 17:00 and its re-run) is ended by retention, the
    # passes that do not close the day too; the quiet 15:00 logged nothing
    parents = client.search_runs(
        [exp.experiment_id],
        "tags.`recpipe.step` = 'parent' and tags.`airflow.dag_id` = 'recpipe_stream_retrain'",
    )
    assert len(parents) == 3, [r.data.tags["airflow.run_id"] for r in parents]
    assert {r.info.status for r in parents} == {"FINISHED"}


def test_the_close_hour_exports_registers_and_gates_the_days_model(stream):
    import pyarrow.parquet as pq
    from mlflow.tracking import MlflowClient

    from trainer.metrics import auc

    client = MlflowClient(stream["env"]["MLFLOW_TRACKING_URI"])
    model, var = stream["model"], stream["var"]
    pass_dir = var / "runs" / model / f"ds={DAY}" / "hh=17"
    versions = client.search_model_versions(f"name='{model}'")
    assert len(versions) == 1  # the re-run of 17:00 gated the version it had registered
    version = versions[0]
    assert client.get_model_version_by_alias(model, "champion").version == version.version
    first = stream["rerun"]["versions"][0]
    assert first["promotion"] == "promoted" and first["ds"] == DAY
    assert first["model_dir"] == str(pass_dir)
    assert (pass_dir / (first["checkpoint"].rsplit("/", 1)[1] + ".index")).exists()
    # the SavedModel in TF Serving's layout, a numbered version beside the day dirs
    numbered = [p for p in (var / "exports" / model).iterdir() if p.name.isdigit()]
    assert len(numbered) == 1 and (numbered[0] / "saved_model.pb").exists()
    assert first["export_path"] == str(numbered[0])
    # the day's score: the progressive one, 16:00's model on 17:00's 88 ratings
    scored = pq.read_table(pass_dir / "day_eval_predictions.parquet").to_pydict()
    assert len(scored["label"]) == 88
    assert float(first["eval.auc"]) == pytest.approx(
        auc(np.array(scored["label"]), np.array(scored["probability"]))
    )
    # the re-run scored the champion (the version itself) on the same rows, the other side of
    # the gate's paired test, and kept it without gating it against itself
    champion_rows = pq.read_table(pass_dir / "champion_eval_predictions.parquet").to_pydict()
    assert champion_rows["label"] == scored["label"]
    assert dict(version.tags) == first
