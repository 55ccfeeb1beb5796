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
    from mlflow import MlflowClient

    path = tmp_path_factory.mktemp("registry")
    return MlflowClient(f"sqlite:///{path / 'mlflow.db'}"), path


def _operator(model: str, uri: str, max_days: int = 0):
    """A register task over the registry at ``uri`` (its hook's client set directly: the task
    runs outside Airflow here)."""
    from operators.register import RegisterModelOperator

    op = RegisterModelOperator(
        task_id="register_and_gate",
        pipeline_config_path="conf/movielens_deepfm.yaml",
        model_name=model,
        max_inconclusive_days=max_days,
        mlflow_conn_id="",
    )
    op.hook._client = __import__("mlflow").MlflowClient(uri)
    return op


@settings(max_examples=15, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(OUTCOMES), min_size=1, max_size=8))
def test_inconclusive_gates_are_counted_in_a_row_over_any_sequence_of_days(registry, outcomes):
    client, path = registry
    model = f"m{uuid.uuid4().hex[:8]}"
    client.create_registered_model(model)
    op = _operator(model, f"sqlite:///{path / 'mlflow.db'}")
    want = 0
    for outcome, promotion in outcomes:
        tags = {"gate_outcome": outcome, "promotion": promotion}
        version = client.create_model_version(model, str(path / "export"), tags=tags)
        streak = op._inconclusive_streak(version.version)
        assert streak == want, (outcomes, version.version)
        want = want + 1 if (outcome, promotion) == ("inconclusive", "inconclusive") else 0
