"""Evaluation while training: a separate evaluator process beside a real 2-rank Horovod job, and
the chief evaluating its own checkpoints (``master``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from operators.base import last_json_line
from operators.launchers import LocalLauncher
from operators.launchers.topology import evaluator_process, job_spec, training_processes
from recpipe.config.train import TrainDistribute
from tests.trainer.conftest import EARLY, ROOT, with_edits
from trainer.evaluator import HISTORY, TRAIN_DONE, follow
from trainer.loop import Trainer, TrainError, TrainJob

EVAL_DS = "1997-10-15"
EDITS = {
    "data_config.batch_size": 128,
    "train_config.num_steps": 40,
    "train_config.save_checkpoints_steps": 10,
    "train_config.keep_checkpoint_max": 10,
    "eval_ds": EVAL_DS,
}


def _history(model_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (model_dir / HISTORY).read_text().splitlines()]


@pytest.mark.slow
def test_separate_evaluator_follows_a_horovod_job_and_stops_with_it(ml_early, tmp_path):
    import yaml

    config_path = tmp_path / "pipeline.yaml"
    config_path.write_text(yaml.safe_dump(ml_early.to_dict()))
    model_dir = tmp_path / "model"
    edits = {
        **EDITS,
        "train_config.train_distribute": "HorovodStrategy",
        "eval_config.eval_method": "separate",
    }
    common = ["--pipeline_config_path", str(config_path), "--model_dir", str(model_dir)]
    common += [f"--train_ds={EARLY[0]}:{EARLY[1]}", "--edit_config_json", json.dumps(edits)]
    processes = training_processes(
        TrainDistribute.HorovodStrategy, 2, ["trainer.train_eval", *common, "--skip_eval"]
    )
    processes.append(evaluator_process(["trainer.eval", *common]))
    job = job_spec("train", processes, ROOT, {"PYTHONUNBUFFERED": "1"})
    logs = LocalLauncher(tmp_path / "logs", grace_s=3).run(job)
    assert last_json_line(logs[0])["global_step"] == 40
    assert last_json_line(logs[1]) == {"evaluated_steps": [10, 20, 30, 40]}  # every checkpoint, in order
    history = _history(model_dir)
    assert [h["step"] for h in history] == [10, 20, 30, 40]
    assert all(0.0 < h["auc"] < 1.0 and h["logloss"] > 0 for h in history)
    result = json.loads((model_dir / "eval" / "eval_result-40.json").read_text())
    assert result["eval_days"] == [EVAL_DS] and result["auc"] == history[-1]["auc"]
    assert json.loads((model_dir / TRAIN_DONE).read_text())["global_step"] == 40


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
