"""The registered champion, as users serve it: ``mlflow.pyfunc.load_model`` and ``mlflow models
serve`` on 127.0.0.1 answer with the SavedModel's probabilities on the same raw rows."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.dags.conftest import MODEL
from tests.support import free_port

pytestmark = pytest.mark.slow


def test_mlflow_models_serve_answers_with_the_champions_probabilities(daily_runs, tmp_path, monkeypatch):
    import mlflow.pyfunc
    import requests
    import tensorflow as tf
    from mlflow import MlflowClient
    from mlflow.entities import LoggedModelStatus

    uri = daily_runs["tracking_uri"]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    client = MlflowClient(uri, registry_uri=uri)
    champion = client.get_model_version_by_alias(MODEL, "champion")
    # the version comes from an MLflow 3 LoggedModel, its metrics linked to the evaluated day
    logged = client.get_logged_model(champion.tags["model_id"])
    assert logged.status == LoggedModelStatus.READY and champion.source == logged.artifact_location
    linked = {m.key: m for m in logged.metrics or []}
    assert (
        0.5 < linked["auc"].value <= 1 and linked["auc"].dataset_name == f"ds={champion.tags['ds']} held-out"
    )
    assert float(champion.tags["eval.auc"]) == linked["auc"].value
    model = mlflow.pyfunc.load_model(f"models:/{MODEL}@champion")
    rows = model.input_example  # real raw rows of the model's last training day
    assert rows is not None and len(rows) == 5 and "user_id" in rows.columns
    saved = tf.saved_model.load(champion.tags["export_path"]).signatures["serving_default"]
    specs = saved.structured_input_signature[1]
    expected = saved(**{k: tf.constant(rows[k].to_numpy(), dtype=s.dtype) for k, s in specs.items()})
    expected = expected["probability"].numpy()
    np.testing.assert_allclose(model.predict(rows)["probability"].to_numpy(), expected, rtol=1e-6)

    port = free_port()
    cmd = [
        str(Path(sys.executable).with_name("mlflow")),
        "models",
        "serve",
        "-m",
        f"models:/{MODEL}@champion",
    ]
    cmd += ["--env-manager", "local", "-h", "127.0.0.1", "-p", str(port)]
    log = (tmp_path / "serve.log").open("wb")
    proc = subprocess.Popen(
        cmd,
        # as a user with the venv active: the scoring server is `uvicorn` from the venv's bin/
        env={
            **os.environ,
            "MLFLOW_TRACKING_URI": uri,
            "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        },
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                if requests.get(f"http://127.0.0.1:{port}/ping", timeout=2).ok:
                    break
            except requests.RequestException:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "serve.log").read_text()[
                -3000:
            ]
            time.sleep(1)
        answer = requests.post(
            f"http://127.0.0.1:{port}/invocations",
            json={"dataframe_split": rows.to_dict(orient="split")},
            timeout=60,
        )
        assert answer.status_code == 200, answer.text[:2000]
        got = np.array([p["probability"] for p in answer.json()["predictions"]], dtype=np.float32)
        np.testing.assert_allclose(got, expected, rtol=1e-5)
    finally:
        if proc.poll() is None:  # a server that died shows its own error above
            os.killpg(proc.pid, 15)
        proc.wait(30)
