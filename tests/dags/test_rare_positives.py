"""``recpipe_daily_retrain`` on days of rare positives (``airflow dags test``): click logs in
MovieLens' schema, real users and items, where 0.4 % of the rows are clicks, nearly all by
students. A day holds about 17 held-out clicks, fewer than ``gate.min_positives``, so a gate
over one day's rows is inconclusive every day and a bad day-1 champion would stay for ever.
With ``gate.window_days: 3`` both models are scored on the pooled held-out rows of the last
three days (none of which either trained on), and the clearly better model is promoted within
the window."""

from __future__ import annotations

import json
from datetime import date, timedelta

import pytest

from tests.dags.conftest import MODEL, airflow, new_stack
from tests.support import write_click_log

pytestmark = pytest.mark.slow

DAYS = ["1998-01-05", "1998-01-06", "1998-01-07"]
ROWS = 20_000
MIN_POSITIVES = 40
BAD = {"full_retrain": True, "edit_config_json": {"train_config.num_steps": 1}}


@pytest.fixture(scope="module")
def rare(movielens_raw, tmp_path_factory) -> dict:
    base = tmp_path_factory.mktemp("rare")
    raw = base / "rare_raw"
    clicks = write_click_log(movielens_raw, raw, DAYS, ROWS, p_student=0.02, p_other=0.0002)
    stack = new_stack(
        raw,
        base,
        # a week's window holds up to 60,000 rows: batches of 512 (not 64) keep each day's
        # training to 100-200 steps, enough for the occupation's signal
        edits={"data_config.batch_size": 512},
        start_date=DAYS[0],
        validation={
            "min_rows": 1000,
            "positive_rate_min": 0.0,
            "positive_rate_max": 0.05,
            "drift_tolerance": 5,
        },
        gate={
            "min_metric": 0.0,  # day 1's one-step model becomes the champion whatever its AUC
            "tolerance": 0.02,
            "min_positives": MIN_POSITIVES,
            "window_days": 3,
            "inconclusive": "keep_champion",
            "max_inconclusive_days": 1,  # the first inconclusive day fails its run, loudly
        },
    )
    env = stack["env"]
    logs, codes = {}, {}
    for ds in DAYS:
        conf = ["-c", json.dumps(BAD)] if ds == DAYS[0] else []
        proc = airflow(env, "dags", "test", "recpipe_daily_retrain", ds, *conf, check=False)
        logs[ds], codes[ds] = proc.stdout + proc.stderr, proc.returncode
    return {**stack, "clicks": clicks, "logs": logs, "codes": codes}


def _versions(rare):
    from mlflow import MlflowClient

    client = MlflowClient(rare["tracking_uri"], registry_uri=rare["tracking_uri"])
    return client, sorted(client.search_model_versions(f"name='{MODEL}'"), key=lambda v: int(v.version))


def test_each_day_alone_holds_too_few_clicks_for_the_gate(rare):
    import pyarrow.parquet as pq

    for ds in DAYS:
        table = pq.read_table(rare["var"] / "features" / f"ds={ds}", columns=["label", "_holdout"])
        held = table.filter(table["_holdout"]).column("label").to_numpy()
        assert 0 < held.sum() < MIN_POSITIVES, (ds, int(held.sum()))
        assert held.mean() < 0.01


def test_a_clearly_better_model_is_promoted_once_the_pooled_days_hold_enough_clicks(rare):
    client, versions = _versions(rare)
    outcomes = [(v.tags["ds"], v.tags["promotion"]) for v in versions]
    assert outcomes[0] == (DAYS[0], "promoted")  # the first champion, a one-step model
    promoted = [v for v in versions[1:] if v.tags["promotion"] == "promoted"]
    assert promoted, [v.tags["promotion_reason"] for v in versions]
    first = promoted[0]
    assert float(first.tags["gate.positives"]) >= MIN_POSITIVES
    assert float(first.tags["eval.auc"]) > 0.7 and float(first.tags["gate.diff"]) > 0.1
    # before it, inconclusive days are counted in a row, and gate.max_inconclusive_days (1)
    # failed the run of the first one after its version was registered and tagged
    stuck = versions[1 : versions.index(first)]
    for v in stuck:
        assert v.tags["promotion"] == "inconclusive" and int(v.tags["inconclusive_days"]) >= 1
        assert rare["codes"][v.tags["ds"]] != 0
        assert "GateStuckError" in rare["logs"][v.tags["ds"]]
        assert "inconclusive 1 times in a row" in rare["logs"][v.tags["ds"]]
    assert rare["codes"][first.tags["ds"]] == 0 and first.tags["inconclusive_days"] == "0"
    assert rare["codes"][DAYS[0]] == 0
    assert client.get_model_version_by_alias(MODEL, "champion").version == versions[-1].version or any(
        v.tags["promotion"] != "promoted" for v in versions[versions.index(first) + 1 :]
    )


def test_the_gate_scored_both_models_on_the_same_pooled_rows(rare):
    import pyarrow.parquet as pq

    last = rare["var"] / "runs" / MODEL / f"ds={DAYS[-1]}"
    new = pq.read_table(last / "eval_predictions.parquet").to_pydict()
    old = pq.read_table(last / "champion_eval_predictions.parquet").to_pydict()
    assert new["label"] == old["label"]
    # three days' held-out rows: about 20 % of each
    assert 0.15 * 3 * ROWS < len(new["label"]) < 0.25 * 3 * ROWS
    train = json.loads((last / "train_result.json").read_text())
    assert train["train_ds"] == f"{(date.fromisoformat(DAYS[-1]) - timedelta(days=6)).isoformat()}:{DAYS[-1]}"
