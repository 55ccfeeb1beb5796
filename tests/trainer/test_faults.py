"""The trainer's fault paths on real MovieLens features: a diverged loss stops the job, a
second trainer on a model dir in use fails naming the holder, and a job killed between
checkpoints and resumed logs each step once to MLflow."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
import yaml

from operators.hooks.mlflow import MLflowHook, jsonl_metrics
from recpipe.layout import parse_ds_range
from tests.support import EARLY, ROOT, train_args, with_edits
from trainer.loop import DivergedError, Trainer, TrainJob

DAYS = parse_ds_range(":".join(EARLY))


def _train_cmd(config, model_dir: Path, tmp_path: Path, *extra: str) -> list[str]:
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(config.to_dict()))
    return [sys.executable, "-m", "trainer.train_eval", *train_args(path, model_dir, {}, *extra)]


def test_a_diverged_loss_stops_training_before_its_checkpoint(ml_early, tmp_path):
    sgd = {"sgd_optimizer": {"learning_rate": {"constant_learning_rate": {"learning_rate": 1e30}}}}
    config = with_edits(
        ml_early,
        {
            "train_config.optimizer_config": [sgd],
            "train_config.num_steps": 200,
            "train_config.log_step_count_steps": 5,
            "train_config.save_checkpoints_steps": 2,
            "data_config.batch_size": 128,
        },
    )
    with pytest.raises(DivergedError, match=r"the loss is (nan|inf) at step \d+: training diverged") as err:
        Trainer(TrainJob(config=config, model_dir=tmp_path, train_days=DAYS)).train()
    step = int(str(err.value).split(" at step ")[1].split(":")[0])
    assert step < 200
    # every checkpoint written holds finite weights: the diverged step was not saved
    latest = tf.train.latest_checkpoint(str(tmp_path))
    if latest is not None:
        reader = tf.train.load_checkpoint(latest)
        for name, _ in tf.train.list_variables(latest):
            value = reader.get_tensor(name)
            if np.issubdtype(np.asarray(value).dtype, np.floating):
                assert np.isfinite(value).all(), name


def test_a_second_trainer_on_a_model_dir_in_use_fails_at_once_naming_the_holder(ml_early, tmp_path):
    model_dir = tmp_path / "m"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from recpipe import locks\n"
            f"with locks.training({str(model_dir)!r}, 'zombie attempt'):\n"
            "    print('locked', flush=True); time.sleep(120)",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        start = time.monotonic()
        config = with_edits(ml_early, {"train_config.num_steps": 5})
        done = subprocess.run(
            _train_cmd(config, model_dir, tmp_path), capture_output=True, text=True, cwd=ROOT, timeout=300
        )
        assert done.returncode == 1, done.stderr[-2000:]
        assert f"is being trained by pid {holder.pid}" in done.stderr and "zombie attempt" in done.stderr
        assert time.monotonic() - start < 120
        assert not list(model_dir.glob("model.ckpt-*"))  # it wrote nothing
    finally:
        holder.kill()
        holder.wait()


def test_a_job_killed_between_checkpoints_and_resumed_logs_each_step_once(ml_early, tmp_path, monkeypatch):
    model_dir = tmp_path / "m"
    metrics = model_dir / "train_metrics.jsonl"
    config = with_edits(
        ml_early,
        {
            "train_config.num_steps": 100000,
            "train_config.log_step_count_steps": 5,
            "train_config.save_checkpoints_steps": 50,
            "data_config.batch_size": 64,
        },
    )
    proc = subprocess.Popen(
        _train_cmd(config, model_dir, tmp_path),
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 300
    try:
        while not (tf.train.latest_checkpoint(str(model_dir)) and _last_step(metrics) >= 65):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    saved = int(tf.train.latest_checkpoint(str(model_dir)).rsplit("-", 1)[1])
    logged = _last_step(metrics)
    with metrics.open("a") as out:
        out.write('{"step": 99999, "lo')  # a line torn by the kill
    final = logged + 20
    resumed = with_edits(config, {"train_config.num_steps": final})
    done = subprocess.run(
        _train_cmd(resumed, model_dir, tmp_path, "--continue_train"),
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [line for line in metrics.read_text().splitlines() if line.strip()]
    written = [json.loads(line)["step"] for line in lines if line.endswith("}")]
    # the steps between the checkpoint and the kill were logged twice in the file
    assert written.count(final) == 1 and all(written.count(s) == 2 for s in range(saved + 5, logged + 1, 5))

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    hook = MLflowHook(mlflow_conn_id="")
    run = hook.child_run(hook.parent_run("faults", "dag", "run", {}), "train")
    hook.log_metrics(run, jsonl_metrics(metrics))
    history = hook.get_client().get_metric_history(run, "loss")
    steps = sorted(m.step for m in history)
    assert steps == list(range(5, final + 1, 5))  # each once, the torn line left out


def _last_step(path: Path) -> int:
    if not path.exists():
        return 0
    steps = [json.loads(line)["step"] for line in path.read_text().splitlines() if line.endswith("}")]
    return max(steps, default=0)


def test_a_job_process_prints_its_threads_stacks_on_sigusr1_and_goes_on():
    # what the stuck-job tests send before they give up (test_distribute._kill_after_checkpoint_20)
    code = (
        "import os, signal, threading, time\n"
        "from trainer.entry import _setup_logging\n"
        "_setup_logging()\n"
        "threading.Thread(target=time.sleep, args=(5,), name='waiting', daemon=True).start()\n"
        "os.kill(os.getpid(), signal.SIGUSR1)\n"
        "print('still running')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "still running", done.stderr
    assert "Current thread 0x" in done.stderr and done.stderr.count("hread 0x") == 2  # both threads
    assert 'File "<string>", line 5' in done.stderr  # the main thread's stack, at the kill
