"""``recpipe_daily_retrain`` run for real on four MovieLens days (Spark, TensorFlow jobs,
MLflow on SQLite), then its results checked on disk and in MLflow; then its tasks retried."""

from __future__ import annotations

import json

import pytest

from tests.dags.conftest import DAYS, MODEL, airflow

pytestmark = pytest.mark.slow


def _client(daily_runs):
    from mlflow import MlflowClient

    return MlflowClient(daily_runs["tracking_uri"], registry_uri=daily_runs["tracking_uri"])


def _runs(daily_runs, step):
    client = _client(daily_runs)
    exp = client.get_experiment_by_name(MODEL)
    runs = client.search_runs([exp.experiment_id], filter_string=f"tags.`recpipe.step` = '{step}'")
    # the parents of the fixture's four days (a sensor test fails a run of another day)
    ours = (r for r in runs if r.data.tags.get("ds", DAYS[0]) in DAYS)
    return sorted(ours, key=lambda r: r.info.start_time)


def test_day_two_fine_tunes_from_day_one(daily_runs):
    day1, day2 = (daily_runs["runs"] / f"ds={d}" for d in DAYS[:2])
    # day 1's dir is gone by now (retention keeps 3 days and the champion's): read the logs
    assert "warm start from nothing (training from scratch)" in daily_runs["logs"][DAYS[0]]
    assert f"warm start from {day1} (champion version 1)" in daily_runs["logs"][DAYS[1]]
    second = json.loads((day2 / "train_result.json").read_text())
    assert second["fine_tune_checkpoint"] == str(day1)
    # the trainer restored every variable of day 1's latest checkpoint, by name
    assert second["fine_tune"]["checkpoint"].startswith(str(day1) + "/model.ckpt-")
    assert second["fine_tune"]["restored"] > 10 and not second["fine_tune"]["missing"]
    assert second["train_ds"] == "1997-09-17:1997-09-23"


def test_mlflow_holds_parent_and_nested_runs_with_metrics(daily_runs):
    parents = _runs(daily_runs, "parent")
    assert [p.data.tags["ds"] for p in parents] == DAYS
    for parent in parents:
        assert parent.info.status == "FINISHED"
        assert parent.data.tags["airflow.dag_id"] == "recpipe_daily_retrain"
        assert parent.data.tags["train_distribute"] == "NoStrategy"
        assert len(parent.data.tags["git_commit"]) in (7, 40) or parent.data.tags["git_commit"] == "unknown"
        assert 0.0 <= parent.data.metrics["eval.auc"] <= 1.0
    # days 1, 2 and 4 learn; day 3's one-step model is a random guess whichever side of 0.5
    assert all(0.5 < parents[i].data.metrics["eval.auc"] for i in (0, 1, 3))
    # named by the day first, then how the DAG run was started (`airflow dags test`: manual)
    assert [p.info.run_name for p in parents] == [f"ds={d} manual" for d in DAYS]
    client = _client(daily_runs)
    train = [
        r for r in _runs(daily_runs, "train") if r.data.tags["mlflow.parentRunId"] == parents[1].info.run_id
    ]
    assert len(train) == 1
    run = train[0]
    assert run.info.run_name == f"ds={DAYS[1]} train"
    assert run.data.params["data_config.batch_size"] == "64"
    assert run.data.params["feature_config.features.0.hash_bucket_size"] == "50000"
    assert run.data.params["recpipe.fine_tune_checkpoint"].endswith(f"ds={DAYS[0]}")
    losses = client.get_metric_history(run.info.run_id, "loss")
    assert len(losses) >= 2 and all(0 < m.value < 5 for m in losses)
    assert client.get_metric_history(run.info.run_id, "examples_per_sec")[0].value > 0
    # the job's peak resident memory, and up to the end of each phase
    assert run.data.metrics["memory_mb.build"] <= run.data.metrics["peak_rss_mb"] < 64_000
    # the separate evaluator scored each checkpoint of the job on the day's held-out rows
    evals = client.get_metric_history(run.info.run_id, "eval_auc")
    steps = sorted(m.step for m in evals)
    assert len(steps) >= 2 and steps[0] == 10 and all(0.0 < m.value < 1.0 for m in evals)
    assert (
        steps[-1]
        == json.loads((daily_runs["runs"] / f"ds={DAYS[1]}" / "train_result.json").read_text())["global_step"]
    )
    prepare = [r for r in _runs(daily_runs, "prepare") if r.data.tags["ds"] == DAYS[1]]
    assert prepare[0].data.metrics["rows"] > 100
    assert "drift.positive_rate" in prepare[0].data.metrics
    artifacts = [a.path for a in client.list_artifacts(run.info.run_id)]
    assert "pipeline.yaml" in artifacts


def test_evaluations_log_the_scored_rows_as_a_dataset_the_models_metrics_link_to(daily_runs):
    client = _client(daily_runs)
    parent = _runs(daily_runs, "parent")[1]
    inputs = {}
    for step in ("eval", "evaluate_champion"):
        (run,) = [
            r for r in _runs(daily_runs, step) if r.data.tags["mlflow.parentRunId"] == parent.info.run_id
        ]
        (entry,) = run.inputs.dataset_inputs
        assert [(t.key, t.value) for t in entry.tags] == [("mlflow.data.context", "evaluation")]
        inputs[step] = entry.dataset
    candidate, champion = inputs["eval"], inputs["evaluate_champion"]
    assert candidate.name == f"ds={DAYS[1]} held-out" and candidate.source_type == "local"
    source = json.loads(candidate.source)["uri"]
    assert (
        source.endswith(f"features/ds={DAYS[1]}")
        and (daily_runs["var"] / "features" / f"ds={DAYS[1]}").is_dir()
    )
    # the same rows scored by both models: one dataset
    assert (champion.name, champion.digest) == (candidate.name, candidate.digest) and len(
        candidate.digest
    ) == 16
    version = next(v for v in client.search_model_versions(f"name = '{MODEL}'") if v.tags["ds"] == DAYS[1])
    linked = {m.key: m for m in client.get_logged_model(version.tags["model_id"]).metrics}
    assert (linked["auc"].dataset_name, linked["auc"].dataset_digest) == (candidate.name, candidate.digest)
    assert linked["auc"].value == parent.data.metrics["eval.auc"]


def test_champion_alias_and_the_gate(daily_runs):
    client = _client(daily_runs)
    versions = {v.tags["ds"]: v for v in client.search_model_versions(f"name = '{MODEL}'")}
    assert set(versions) == set(DAYS)  # one version per DAG run
    promotion = {ds: versions[ds].tags["promotion"] for ds in DAYS}
    # day 1 has no champion and learns (AUC above the floor); days 2 and 4 fine-tune on more
    # rows and are not significantly worse than the champion (inconclusive: promote); the
    # one-step day 3 is significantly worse by more than the tolerance
    assert promotion == dict(zip(DAYS, ["promoted", "promoted", "rejected", "promoted"], strict=True))
    assert "no champion auc on these rows" in versions[DAYS[0]].tags["promotion_reason"]
    worse = versions[DAYS[2]]
    assert worse.tags["promotion_reason"].startswith("significantly worse"), worse.tags["promotion_reason"]
    assert float(worse.tags["gate.ci_high"]) < -0.05 and float(worse.tags["gate.p_value"]) < 0.05
    parent3 = _runs(daily_runs, "parent")[2]
    assert parent3.data.tags["promoted"] == "False"
    assert parent3.data.metrics["eval.auc"] < parent3.data.metrics["evaluate_champion.auc"] - 0.05
    champion = client.get_model_version_by_alias(MODEL, "champion")
    assert champion.version == versions[DAYS[3]].version


def test_the_day_after_a_rejected_day_fine_tunes_from_the_champion(daily_runs):
    client = _client(daily_runs)
    versions = {v.tags["ds"]: v for v in client.search_model_versions(f"name = '{MODEL}'")}
    day2, day3 = (daily_runs["runs"] / f"ds={d}" for d in DAYS[1:3])
    assert (day3 / "_SUCCESS").exists()  # the newest finished dir, but rejected
    log = daily_runs["logs"][DAYS[3]]
    assert f"warm start from {day2} (champion version {versions[DAYS[1]].version})" in log
    result = json.loads((daily_runs["runs"] / f"ds={DAYS[3]}" / "train_result.json").read_text())
    assert result["fine_tune_checkpoint"] == str(day2)


def test_exports_and_retention(daily_runs):
    client = _client(daily_runs)
    champion = client.get_model_version_by_alias(MODEL, "champion")
    exports = sorted(p for p in (daily_runs["var"] / "exports" / MODEL).iterdir())
    assert len(exports) == 4 and all((p / "saved_model.pb").exists() for p in exports)
    assert not any(p.name.startswith(".") for p in exports)
    kept = sorted(p.name for p in daily_runs["runs"].iterdir())
    # retention_days=3: the three newest days, plus the dirs of the champion and of the two
    # champions before it (retention_champions: the versions a rollback reaches), if older
    from recpipe.registry import former_champions

    targets = [v.tags["ds"] for v in former_champions(client, MODEL)[:2]]
    assert targets, "four gated days leave a champion before the current one"
    expected = {f"ds={DAYS[1]}", f"ds={DAYS[2]}", f"ds={DAYS[3]}", f"ds={champion.tags['ds']}"}
    assert set(kept) == expected | {f"ds={day}" for day in targets}
    assert (daily_runs["runs"] / f"ds={champion.tags['ds']}" / "checkpoint").exists()


def test_a_retried_train_task_resumes_and_never_trains_twice(daily_runs):
    day2 = daily_runs["runs"] / f"ds={DAYS[1]}"
    first = json.loads((day2 / "train_result.json").read_text())
    # a finished model dir whose metrics file lost half its last line (a killed writer): the
    # task returns its result without starting a job, and logs the whole lines
    metrics = day2 / "train_metrics.jsonl"
    text = metrics.read_text()
    metrics.write_text(text[: len(text) - len(text.splitlines()[-1]) // 2 - 1])
    proc = airflow(daily_runs["env"], "tasks", "test", "recpipe_daily_retrain", "train", DAYS[1])
    assert "already finished training: not training it again" in proc.stdout + proc.stderr
    assert "train_metrics.jsonl line" in proc.stdout + proc.stderr  # the torn line, skipped
    # an attempt that died after its last checkpoint: the retry resumes (--continue_train)
    (day2 / "_SUCCESS").unlink()
    (day2 / "train_result.json").unlink()
    proc = airflow(daily_runs["env"], "tasks", "test", "recpipe_daily_retrain", "train", DAYS[1])
    out = proc.stdout + proc.stderr
    assert "resuming" in out and "--continue_train" in out
    again = json.loads((day2 / "train_result.json").read_text())
    assert again["global_step"] == first["global_step"]  # nothing left to train: no second pass
    assert again["checkpoint"] == first["checkpoint"]


def test_a_retried_register_task_keeps_one_version_per_dag_run(daily_runs):
    client = _client(daily_runs)
    before = {v.version: v.tags["ds"] for v in client.search_model_versions(f"name = '{MODEL}'")}
    proc = airflow(daily_runs["env"], "tasks", "test", "recpipe_daily_retrain", "register_and_gate", DAYS[3])
    out = proc.stdout + proc.stderr
    version = next(v for v, ds in before.items() if ds == DAYS[3])
    assert f"reusing version {version}, registered by an earlier attempt" in out
    after = {v.version: v.tags["ds"] for v in client.search_model_versions(f"name = '{MODEL}'")}
    assert after == before
    assert client.get_model_version_by_alias(MODEL, "champion").version == version


def test_the_gates_paired_test_on_real_days_and_on_a_low_positive_sample(daily_runs):
    """DeLong's test on the per-row scores the DAG's two evaluations wrote for day 4, as the
    gate read them; then the same rows cut to 10 positives (a TalkingData-like day)."""
    import numpy as np
    import pyarrow.parquet as pq

    from operators.gate import INCONCLUSIVE, gate
    from recpipe.config.retrain import GateConfig
    from recpipe.stats import paired_auc_test

    day4 = daily_runs["runs"] / f"ds={DAYS[3]}"
    old = pq.read_table(day4 / "champion_eval_predictions.parquet").to_pydict()
    new = pq.read_table(day4 / "eval_predictions.parquet").to_pydict()
    assert old["label"] == new["label"] and len(new["label"]) > 30  # the same held-out rows
    y, a, b = (np.asarray(v) for v in (new["label"], old["probability"], new["probability"]))
    paired = paired_auc_test(y, a, b)
    version = next(
        v for v in _client(daily_runs).search_model_versions(f"name = '{MODEL}'") if v.tags["ds"] == DAYS[3]
    )
    assert float(version.tags["gate.diff"]) == pytest.approx(paired.diff, abs=1e-6)
    assert float(version.tags["gate.se"]) == pytest.approx(paired.se, abs=1e-6)
    assert int(version.tags["gate.positives"]) == paired.positives
    keep = np.flatnonzero(y < 0.5).tolist() + np.flatnonzero(y > 0.5)[:10].tolist()
    rare = paired_auc_test(y[keep], a[keep], b[keep])
    decision = gate({"auc": rare.auc_b}, {"auc": rare.auc_a}, GateConfig(min_positives=30), rare)
    assert decision.outcome == INCONCLUSIVE and not decision.promote
    assert decision.reason.startswith("inconclusive: 10 positives")


def test_the_experiment_opens_on_runs_and_no_run_is_left_running(daily_runs):
    client = _client(daily_runs)
    exp = client.get_experiment_by_name(MODEL)  # the registered model's experiment
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"
    # every DAG run is over (some failed on purpose): each of its runs ended
    running = client.search_runs([exp.experiment_id], "attributes.status = 'RUNNING'")
    assert running == [], [r.info.run_name for r in running]


def test_the_champion_after_the_gate_scores_each_days_candidates(daily_runs):
    """batch_predict: each day the version that serves after the gate (day 3's rejected model
    does not) scores the day's candidates; the scores are the SavedModel's own on those rows."""
    import numpy as np
    import pyarrow.csv as pacsv
    import tensorflow as tf

    client = _client(daily_runs)
    versions = {v.tags["ds"]: v for v in client.search_model_versions(f"name = '{MODEL}'")}
    runs = _runs(daily_runs, "batch_predict")
    assert [r.info.run_name for r in runs] == [f"ds={d} batch_predict" for d in DAYS]
    served = [str(versions[d].version) for d in (DAYS[0], DAYS[1], DAYS[1], DAYS[3])]
    assert [r.data.tags["model_version"] for r in runs] == served
    var, day = daily_runs["var"], DAYS[3]
    ids = {c: "string" for c in ("user_id", "item_id", "zip_code", "gender", "occupation", "genres")}
    rows = pacsv.read_csv(var / "candidates" / f"ds={day}" / "part-00000.csv",
                          convert_options=pacsv.ConvertOptions(column_types=ids)).to_pandas()  # fmt: skip
    assert runs[3].data.metrics["rows"] == len(rows) > 100
    out = (var / "scores" / f"ds={day}" / "part-00000.csv").read_text().splitlines()
    assert len(out) == len(rows) and (var / "scores" / f"ds={day}" / "_SUCCESS").exists()
    fields = [line.split("\x01") for line in out]
    assert [f[0] for f in fields] == list(rows["user_id"])  # the reserved columns, in order
    probs = np.array([float(f[-2]) for f in fields])
    fn = tf.saved_model.load(versions[day].tags["export_path"]).signatures["serving_default"]
    request = {c: tf.constant(rows[c].fillna("").to_numpy(dtype=object)) for c in ids}
    request |= {c: tf.constant(rows[c].astype(float).to_numpy()) for c in ("age", "release_year")}
    want = fn(**{k: v for k, v in request.items() if k in fn.structured_input_signature[1]})["probability"]
    np.testing.assert_allclose(probs, want.numpy(), atol=1e-6)


def test_the_hashed_export_serves_on_stock_tensorflow(daily_runs, tmp_path):
    """The daily DeepFM's SavedModel (hashed tables) loads and scores in a process of stock
    TensorFlow alone (``tests/serving_stock.py``)."""
    from tests.serving_stock import check_stock_serving

    newest = sorted((daily_runs["var"] / "exports" / MODEL).iterdir(), key=lambda p: int(p.name))[-1]
    assert check_stock_serving(newest, tmp_path)["ops"] > 10
