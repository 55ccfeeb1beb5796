"""``recpipe_champion`` (the Airflow UI's way to move a champion) run by ``airflow dags test``
against the deployment's real MLflow registry (SQLite): a rollback with a reason moves the
alias and tags the version; a model that is not the deployment's is refused; an approval that
arrives after the champion was moved by hand is refused."""

from __future__ import annotations

import json

import pytest

from tests.dags.conftest import MODEL, airflow, new_stack

pytestmark = pytest.mark.slow


def test_a_rollback_triggered_from_the_ui(movielens_raw, tmp_path_factory):
    from mlflow import MlflowClient

    stack = new_stack(movielens_raw, tmp_path_factory.mktemp("champion"))
    client = MlflowClient(stack["tracking_uri"])
    client.create_registered_model(MODEL)
    for n, day in enumerate(["1997-09-22", "1997-09-23"], start=1):
        model_dir = stack["var"] / "runs" / MODEL / f"ds={day}"
        model_dir.mkdir(parents=True)
        (model_dir / "_SUCCESS").touch()
        export = stack["var"] / "exports" / MODEL / str(n)
        export.mkdir(parents=True)
        tags = {"ds": day, "model_dir": str(model_dir), "export_path": str(export), "promotion": "promoted"}
        client.create_model_version(MODEL, str(export), tags=tags)
    client.set_registered_model_alias(MODEL, "champion", "2")

    conf = {"model_name": MODEL, "action": "rollback", "reason": "day 2 serves badly"}
    airflow(stack["env"], "dags", "test", "recpipe_champion", "-c", json.dumps(conf))
    assert int(client.get_registered_model(MODEL).aliases["champion"]) == 1
    tags = client.get_model_version(MODEL, "1").tags
    assert tags["champion.set_reason"] == "day 2 serves badly" and tags["champion.set_by"]

    other = {**conf, "model_name": "someone_elses"}
    proc = airflow(stack["env"], "dags", "test", "recpipe_champion", "-c", json.dumps(other), check=False)
    assert "someone_elses" in proc.stdout + proc.stderr
    assert int(client.get_registered_model(MODEL).aliases["champion"]) == 1


APPROVAL_DAG = """
from airflow.sdk import DAG
from airflow.providers.standard.operators.python import PythonOperator
from operators.approval import ApplyApprovalOperator

with DAG("approval_race", schedule=None) as dag:
    gate = PythonOperator(
        task_id="register_and_gate",
        python_callable=lambda: {"version": "3", "reason": "better on the day", "champion_version": 1},
    )
    answer = PythonOperator(
        task_id="approve_promotion",
        python_callable=lambda: {"chosen_options": ["Approve"], "responded_by_user": {"name": "alice"}},
    )
    apply = ApplyApprovalOperator(
        task_id="apply_approval", model_name=%r, pipeline_config_path="conf/movielens_deepfm.yaml"
    )
    gate >> answer >> apply
"""


def test_an_approval_given_after_a_manual_move_is_refused(movielens_raw, tmp_path_factory, monkeypatch):
    """The gate compared version 3 with champion 1 and waited for a person; meanwhile someone
    moved the champion to 2 by hand. The approval arriving later is refused (the champion
    stays 2; version 3 is tagged ``champion_moved`` with who moved it), instead of silently
    undoing the manual move. The same approval against an unmoved champion promotes."""
    from mlflow import MlflowClient

    from recpipe.champion import set_champion
    from recpipe.registry import move_alias

    stack = new_stack(movielens_raw, tmp_path_factory.mktemp("approval"))
    dags = stack["base"] / "dags"
    dags.mkdir()
    (dags / "approval_race.py").write_text(APPROVAL_DAG % MODEL)
    env = {**stack["env"], "AIRFLOW__CORE__DAGS_FOLDER": str(dags)}
    client = MlflowClient(stack["tracking_uri"])
    client.create_registered_model(MODEL)
    for n in range(1, 4):
        model_dir = stack["var"] / "runs" / MODEL / f"ds=1997-09-2{n}"
        model_dir.mkdir(parents=True)
        (model_dir / "_SUCCESS").touch()
        export = stack["var"] / "exports" / MODEL / str(n)
        export.mkdir(parents=True)
        tags = {"ds": f"1997-09-2{n}", "model_dir": str(model_dir), "export_path": str(export)}
        client.create_model_version(MODEL, str(export), tags={**tags, "promotion": "promoted"})
    monkeypatch.setenv("RECPIPE_VAR_DIR", str(stack["var"]))  # the registry's lock, as the task's
    move_alias(client, MODEL, 1, None, by="gate", reason="day 1", action="promoted")
    set_champion(client, MODEL, 2, "day 2 by hand during the wait", "bob")

    airflow(env, "dags", "test", "approval_race")
    assert int(client.get_registered_model(MODEL).aliases["champion"]) == 2
    tags = client.get_model_version(MODEL, "3").tags
    assert tags["promotion"] == "champion_moved" and "moved by bob" in tags["promotion_reason"], tags

    set_champion(client, MODEL, 1, "back to the one the gate compared with", "bob")
    airflow(env, "dags", "test", "approval_race")
    assert int(client.get_registered_model(MODEL).aliases["champion"]) == 3
    assert client.get_model_version(MODEL, "3").tags["approved_by"] == "alice"
