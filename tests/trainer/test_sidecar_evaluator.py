"""Evaluation while training: a separate evaluator process beside a real 2-rank Horovod job
started by ``recpipe train --num_workers 2``, and the chief evaluating its own checkpoints
(``master``)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from recpipe import jsonl
from recpipe.launch import job_result
from recpipe.layout import ModelDir
from tests.support import RECPIPE, ROOT, train_args, with_edits
from trainer.loop import Trainer, TrainError, TrainJob
from trainer.sidecar_evaluator import follow

EVAL_DS = "1997-10-15"
EDITS = {
    "data_config.batch_size": 128,
    "train_config.num_steps": 40,
    "train_config.save_checkpoints_steps": 10,
    "train_config.keep_checkpoint_max": 10,
    "eval_ds": EVAL_DS,
}


def _history(model_dir: Path) -> list[dict]:
    return jsonl.read(ModelDir(model_dir).eval_history)  # whole lines only


@pytest.mark.slow
def test_recpipe_train_starts_a_horovod_job_with_its_separate_evaluator(ml_early, tmp_path):
    """``recpipe train --num_workers 2``: the 2 ranks and the evaluator that follows them, from
    the command line, through the launcher the DAG uses."""
    import yaml

    config_path = tmp_path / "pipeline.yaml"
    config_path.write_text(yaml.safe_dump(ml_early.to_dict()))
    model_dir = tmp_path / "model"
    edits = {**EDITS, "eval_config.eval_method": "separate"}
    strategy = "--train_config.train_distribute=HorovodStrategy"
    done = subprocess.run(
        [*RECPIPE, "train", *train_args(config_path, model_dir, edits, strategy, "--num_workers", "2")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["global_step"] == 40  # the chief's result
    logs = ModelDir(model_dir).logs
    assert sorted(p.name for p in logs.iterdir()) == ["train-0.log", "train-1.log"]  # horovodrun, evaluator
    assert "rank 1 of 2" in (logs / "train-0.log").read_text()
    assert job_result(logs / "train-1.log") == {"evaluated_steps": [10, 20, 30, 40]}  # every one, in order
    history = _history(model_dir)
    assert [h["step"] for h in history] == [10, 20, 30, 40]
    assert all(0.0 < h["auc"] < 1.0 and h["logloss"] > 0 for h in history)
    result = json.loads(ModelDir(model_dir).eval_result_at(40).read_text())
    assert result["eval_days"] == [EVAL_DS] and result["auc"] == history[-1]["auc"]
    assert json.loads(ModelDir(model_dir).train_done.read_text())["global_step"] == 40


def test_master_evaluates_each_checkpoint_on_the_chief(ml_early, tmp_path):
    config = with_edits(ml_early, {**EDITS, "eval_config.eval_method": "master"})
    days = [f"1997-09-{d}" for d in range(20, 31)]
    Trainer(TrainJob(config=config, model_dir=tmp_path, train_days=days)).train()
    assert [h["step"] for h in _history(tmp_path)] == [10, 20, 30, 40]
    assert sorted(p.name for p in (tmp_path / "eval").iterdir())[:2] == [
        "eval_result-10.json",
        "eval_result-20.json",
    ]
    no_eval_ds = with_edits(ml_early, {**EDITS, "eval_config.eval_method": "master", "eval_ds": None})
    with pytest.raises(TrainError, match="eval_method: master evaluates eval_ds, which is not set"):
        Trainer(TrainJob(config=no_eval_ds, model_dir=tmp_path / "b", train_days=days)).train()


def test_follow_gives_up_when_training_never_finishes(ml_early, tmp_path):
    with pytest.raises(TimeoutError, match="training did not finish within 1 s"):
        follow(ml_early, tmp_path, [EVAL_DS], poll_s=0.2, timeout_s=1)


def test_a_restarted_evaluator_sees_its_jobs_end_and_skips_done_steps(ml_early, tmp_path, monkeypatch):
    import time

    job_started = time.time()
    config = with_edits(ml_early, {**EDITS, "train_config.num_steps": 20})
    days = [f"1997-09-{d}" for d in range(20, 31)]
    Trainer(TrainJob(config=config, model_dir=tmp_path, train_days=days)).train()
    ModelDir(tmp_path).eval_history.write_text('{"step": 10, "auc": 0.5}\n{"step": 20, "au')  # then it died
    time.sleep(1.5)  # the marker is now older than a process started at this moment
    # the launcher gives every process, restarted ones too, the job's start
    monkeypatch.setenv("RECPIPE_JOB_STARTED", repr(job_started))
    assert follow(config, tmp_path, [EVAL_DS], poll_s=0.2, timeout_s=60) == [20]
    assert [h["step"] for h in _history(tmp_path)] == [10, 20]  # the torn line left out


def test_the_best_exporter_keeps_the_best_checkpoint_and_training_stops_early(ml_early, tmp_path):
    """EasyRec's ``exporter_type: best`` with ``enable_early_stop``: a rate too small to move
    a float32 weight scores every checkpoint alike, so the first stays the best, training ends
    once the latest evaluated step is ``max_check_steps`` past it, and the export task loads
    the kept copy."""
    from trainer.best_exporter import export_checkpoint

    still = {"learning_rate": {"constant_learning_rate": {"learning_rate": 1e-12}}}
    edits = {
        **EDITS,
        "train_config.num_steps": 80,
        "train_config.keep_checkpoint_max": 1,  # the best survives only as its copy
        "train_config.optimizer_config": [{"adam_optimizer": still}],
        "eval_config.eval_method": "master",
        "export_config.exporter_type": "best",
        "export_config.enable_early_stop": True,
        "export_config.max_check_steps": 20,
    }
    config = with_edits(ml_early, edits)
    days = [f"1997-09-{d}" for d in range(20, 31)]
    result = Trainer(TrainJob(config=config, model_dir=tmp_path, train_days=days)).train()
    history = _history(tmp_path)
    assert [h["step"] for h in history] == [10, 20, 30] and len({h["auc"] for h in history}) == 1, history
    assert result.global_step == 30
    best = tmp_path / "best"
    assert json.loads((best / "best.json").read_text())["step"] == 10
    assert export_checkpoint(config, tmp_path) == str(best / "model.ckpt-10")
    assert not (tmp_path / "model.ckpt-10.index").exists()  # keep_checkpoint_max deleted it
    import shutil

    shutil.rmtree(best)  # a champion trained before the config asked for best: its latest
    assert export_checkpoint(config, tmp_path) == str(tmp_path / "model.ckpt-30")
    with pytest.raises(Exception, match="compares the checkpoints evaluated while training"):
        with_edits(ml_early, {**edits, "eval_config.eval_method": "none"})


def test_best_and_early_stop_read_the_history_as_easyrec_does(ml_early, tmp_path):
    from trainer.best_exporter import best_entry, early_stop
    from trainer.checkpoints import CheckpointError

    history = [{"step": 10, "auc": 0.7, "logloss": 0.5}, {"step": 20, "auc": 0.72, "logloss": 0.6},
               {"step": 30, "auc": 0.72, "logloss": 0.4}]  # fmt: skip
    assert best_entry(history, "auc", True)["step"] == 20  # the earliest of equals
    assert best_entry(history, "logloss", False)["step"] == 30
    assert best_entry(history, "gauc", True) is None
    for line in history:
        jsonl.append(ModelDir(tmp_path).eval_history, line)
    stop = {"export_config.enable_early_stop": True, "eval_config.eval_method": "master"}
    assert early_stop(with_edits(ml_early, {**stop, "export_config.max_check_steps": 20}), tmp_path) is None
    reason = early_stop(with_edits(ml_early, {**stop, "export_config.max_check_steps": 10}), tmp_path)
    assert reason.startswith("early stop: auc has not improved for 10 steps (best 0.72 at step 20")
    wrong = with_edits(ml_early, {**stop, "export_config.best_exporter_metric": "gauc"})
    held = "'gauc' is not among the evaluations' metrics \\(auc, logloss\\)"
    with pytest.raises(CheckpointError, match=held):
        early_stop(wrong, tmp_path)
