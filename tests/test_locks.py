"""Model-dir locks between real processes: a second trainer is refused naming the holder, a
dead holder's lock is gone, and retention keeps a dir that a job reads or trains."""

from __future__ import annotations

import subprocess
import sys

import pytest

from recpipe import locks
from tests.support import ROOT

HOLD = """
import sys, time
from recpipe import locks
kind, path = sys.argv[1], sys.argv[2]
with (locks.training(path, "day 1997-09-22") if kind == "train" else locks.reading(path)):
    print("held", flush=True)
    time.sleep(120)
"""


def _holder(kind: str, path) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, kind, str(path)], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_one_trainer_per_model_dir_and_a_dead_holder_leaves_no_lock(tmp_path):
    holder = _holder("train", tmp_path / "m")
    try:
        named = rf"being trained by pid {holder.pid} on .*day 1997-09-22"
        with pytest.raises(locks.LockedError, match=named):
            with locks.training(tmp_path / "m"):
                pass
        with locks.deleting(tmp_path / "m") as free:
            assert not free
    finally:
        holder.kill()
        holder.wait()
    with locks.training(tmp_path / "m"):  # the kernel released the killed holder's lock
        pass


def test_retention_keeps_a_dir_a_job_fine_tunes_from(tmp_path, monkeypatch):
    from operators.retention import RetentionOperator

    monkeypatch.setenv("RECPIPE_VAR_DIR", str(tmp_path))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = tmp_path / "runs"
    days = [runs / f"ds=1997-09-{d}" for d in range(20, 24)]
    for day in days:
        day.mkdir(parents=True)
        (day / "_SUCCESS").touch()
    reader = _holder("read", days[0])  # a manual run warm-starting from the oldest day
    try:
        with pytest.raises(locks.LockedError, match="being deleted"):
            with locks.deleting(days[1]) as free:
                assert free
                with locks.reading(days[1]):
                    pass
        op = RetentionOperator(
            task_id="retention",
            pipeline_config_path="conf/movielens_deepfm.yaml",
            runs_root=str(runs),
            keep_days=2,
            model_name="no_such_model",
            mlflow_conn_id="",
        )
        deleted = op.execute({})
        assert deleted == [str(days[1])]  # days[0] is in use: kept until a later run
        assert days[0].exists() and (days[0] / "_SUCCESS").exists()
    finally:
        reader.kill()
        reader.wait()
    assert op.execute({}) == [str(days[0])]
