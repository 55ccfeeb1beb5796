"""A job that refuses its config or flags (exit 2, ``recpipe.errors``) fails its task at once,
naming the field: every retry would fail the same way. Any other failure stays retryable."""

from __future__ import annotations

import sys

import pytest
from airflow.sdk.exceptions import AirflowFailException

from operators.base import JobOperator
from recpipe.launch import JobFailedError, JobSpec

REFUSED = (
    "import sys\n"
    "print('recpipe train: config error: train_config.num_steps: must be > 0', file=sys.stderr)\n"
    "sys.exit({code})\n"
)


def _run(tmp_path, code: int):
    op = JobOperator(task_id=f"job_exits_{code}", pipeline_config_path="conf/criteo_deepfm.yaml", retries=2)
    job = JobSpec(name="train", argv=[[sys.executable, "-c", REFUSED.format(code=code)]], cwd=tmp_path)
    return op.run(job, tmp_path / "logs")


def test_a_job_that_exits_2_fails_its_task_without_retries(tmp_path):
    with pytest.raises(AirflowFailException) as err:
        _run(tmp_path, 2)
    assert str(err.value) == "train: recpipe train: config error: train_config.num_steps: must be > 0"


def test_a_job_that_fails_otherwise_is_retried(tmp_path):
    with pytest.raises(JobFailedError) as err:
        _run(tmp_path, 1)
    assert not isinstance(err.value, AirflowFailException) and err.value.exit_code == 1
