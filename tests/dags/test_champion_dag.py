"""``recpipe_champion`` (the Airflow UI's way to move a champion) run by ``airflow dags test``
against the deployment's real MLflow registry (SQLite): a rollback with a reason moves the
alias and tags the version; a model that is not the deployment's is refused."""

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
