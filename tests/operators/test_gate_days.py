"""The gate over many days: inconclusive gates that kept the champion are counted in a row from
the registry's versions (a property test over random sequences of outcomes), the count that
fails the task at ``gate.max_inconclusive_days``; MLflow's registry on SQLite."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

# (gate_outcome, promotion): an inconclusive gate promotes under gate.inconclusive: promote
OUTCOMES = (
    ("promoted", "promoted"),
    ("rejected", "rejected"),
    ("inconclusive", "inconclusive"),
    ("inconclusive", "promoted"),
)


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    """A SQLite registry, the one ``MLflowHook`` finds through ``$MLFLOW_TRACKING_URI``."""
    from mlflow import MlflowClient

    path = tmp_path_factory.mktemp("registry")
    uri = f"sqlite:///{path / 'mlflow.db'}"
    with pytest.MonkeyPatch.context() as env:
        env.setenv("MLFLOW_TRACKING_URI", uri)
        yield MlflowClient(uri), path


def _operator(model: str, max_days: int = 0):
    """A register task (no Airflow connection: the hook takes ``$MLFLOW_TRACKING_URI``)."""
    from operators.register import RegisterModelOperator

    return RegisterModelOperator(
        task_id="register_and_gate",
        pipeline_config_path="conf/movielens_deepfm.yaml",
        model_name=model,
        gate={"max_inconclusive_days": max_days},
        mlflow_conn_id="",
    )


@settings(max_examples=15, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(OUTCOMES), min_size=1, max_size=8))
def test_inconclusive_gates_are_counted_in_a_row_over_any_sequence_of_days(registry, outcomes):
    from recpipe.registry import inconclusive_streak

    client, path = registry
    model = f"m{uuid.uuid4().hex[:8]}"
    client.create_registered_model(model)
    want = 0
    for outcome, promotion in outcomes:
        tags = {"gate_outcome": outcome, "promotion": promotion}
        version = client.create_model_version(model, str(path / "export"), tags=tags)
        streak = inconclusive_streak(client, model, version.version)
        assert streak == want, (outcomes, version.version)
        want = want + 1 if (outcome, promotion) == ("inconclusive", "inconclusive") else 0
