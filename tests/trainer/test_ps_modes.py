"""PaddleRec's parameter-server modes beyond async and sync (``train_config.sync_mode: geo`` and
``half_async``), in real processes started as users start them: ``recpipe train --num_workers N
--num_ps M``. GEO's local copies train as one process would, push and pull what changed, and go
on without a failed worker; half-async applies each merged update once."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tensorflow as tf

from tests.trainer.test_distribute import (
    PS_EDITS,
    SPLITS,
    _assert_same_state,
    _copies,
    _train,
    left_running,
    ps_job_losing_a_worker,
)

pytestmark = pytest.mark.slow

EXACT = {
    "train_config.optimizer_config": SPLITS["lazy_adam+adam"],
    "data_config.batch_size": 128,
    "data_config.shuffle": False,
    "train_config.save_checkpoints_steps": 1000,
}


def test_geo_with_one_worker_trains_as_one_process_and_pushes_every_geo_step(config_path, tmp_path):
    # one worker's copy meets nobody else's change: the ps end where one process ends, slots
    # included, though only every 7th step (and the last 6) reached them
    _train(config_path, tmp_path / "start", "NoStrategy", **EXACT, **{"train_config.num_steps": 3})
    _copies(tmp_path / "start", "one", "geo")
    steps = {"train_config.num_steps": 20}
    one, _ = _train(config_path, tmp_path / "one", "NoStrategy", 1, "--continue_train", **EXACT, **steps)
    geo_edits = {"train_config.sync_mode": "geo", "train_config.geo_step": 7}
    geo, logs = _train(
        config_path,
        tmp_path / "geo",
        "PSStrategy",
        1,
        "--continue_train",
        ps=1,
        **EXACT,
        **steps,
        **geo_edits,
    )
    assert one["global_step"] == geo["global_step"] == 20
    assert abs(one["loss"] - geo["loss"]) < 1e-5
    traffic = geo["distribution"]
    assert traffic["pushes"] == 3  # steps 10, 17 and the last 3 of 20 (resumed at 3)
    assert traffic["rows_received"] == 0  # nobody else changed a row
    # each of the 17 batches applied once, as the ps itself counted
    assert traffic["batches_trained"] == traffic["batches_applied"] == traffic["batches_applied_on_ps"] == 17
    assert traffic["batches_lost"] == 0
    assert "geo: worker 0 holds a copy of" in logs[0].read_text()
    _assert_same_state(tmp_path / "one", tmp_path / "geo")


def test_geo_workers_exchange_changed_rows_checkpoint_and_resume(config_path, tmp_path):
    model_dir = tmp_path / "model"
    edits = {**PS_EDITS, "train_config.num_steps": 40, "train_config.save_checkpoints_steps": 20}
    edits |= {"train_config.sync_mode": "geo", "train_config.geo_step": 5}
    result, logs = _train(config_path, model_dir, "NoStrategy", 2, ps=1, **edits)
    assert result["global_step"] == 40 and np.isfinite(result["loss"])
    traffic = result["distribution"]
    # every 5 of its steps per worker, and what each held at the save and at the end
    assert 8 <= traffic["pushes"] <= 14
    # each worker pulled the rows the other had changed; far fewer rows travel than the
    # 100,000-row item table holds
    assert 0 < traffic["rows_received"] and traffic["rows_sent"] < 40 * 128 * 2
    assert traffic["bytes_to_ps"] > 0 and traffic["bytes_from_ps"] > 0
    assert sorted(p.name for p in model_dir.glob("model.ckpt-*.index")) == [
        "model.ckpt-20.index",
        "model.ckpt-40.index",
    ]
    assert left_running(model_dir) == []
    again, logs = _train(
        config_path,
        model_dir,
        "NoStrategy",
        2,
        "--continue_train",
        ps=1,
        **{**edits, "train_config.num_steps": 50},
    )
    assert again["global_step"] == 50 and "resumed from" in logs[0].read_text()


def test_geo_goes_on_without_a_worker_that_dies(config_path, tmp_path):
    # the dead worker's batch is trained by the other; what it had not pushed is lost, never
    # pushed twice, and every step is counted once
    model_dir = tmp_path / "model"
    geo = {"train_config.sync_mode": "geo", "train_config.geo_step": 4}
    _, logs, result = ps_job_losing_a_worker(config_path, model_dir, 2, 300, **geo)
    assert result["global_step"] == 300 and np.isfinite(result["loss"])
    assert "geo: worker 1 failed" in logs[0].read_text()
    ledger = result["distribution"]
    # every batch trained by exactly one worker (a batch whose push reached the ps is never
    # trained again); each applied once (the ps's own count agrees) or lost with the worker
    assert ledger["batches_trained"] == 300
    assert ledger["batches_applied"] == ledger["batches_applied_on_ps"]
    assert ledger["batches_applied"] + ledger["batches_lost"] == 300
    assert ledger["batches_lost"] <= 4  # at most the geo_step batches of one push
    assert tf.train.latest_checkpoint(str(model_dir)).endswith("model.ckpt-300")
    metrics = [json.loads(line) for line in (model_dir / "train_metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == list(range(10, 301, 10))


def test_half_async_merges_steps_and_applies_each_update_once_when_a_worker_dies(config_path, tmp_path):
    half_async = {"train_config.sync_mode": "half_async", "train_config.max_merge_var_num": 4}
    _, _, result = ps_job_losing_a_worker(config_path, tmp_path / "model", 1, 200, **half_async)
    # a gradient step lost with its worker is run again; an update applies up to 4 steps
    # once (fewer at a checkpoint, every 10 steps: it holds every step before it)
    assert result["global_step"] == 200 and np.isfinite(result["loss"])
    assert 50 < result["distribution"]["updates"] <= 80
    assert result["distribution"]["bytes_to_ps"] > 0


def test_geo_ends_with_a_clear_error_soon_after_its_last_worker_dies(config_path, tmp_path):
    # the chief waits to queue a batch (the queue is full) when its only worker dies: no batch
    # may go in with no one to take it; the job ends with the reason, not at its timeout
    import time

    from recpipe.launch.base import JobFailedError
    from tests.trainer.test_distribute import _job, _kill_after_checkpoint_20

    model_dir = tmp_path / "model"
    edits = {**PS_EDITS, "train_config.num_steps": 5000, "data_config.num_epochs": 50}
    edits |= {"train_config.sync_mode": "geo", "train_config.geo_step": 4}
    job = _job(config_path, model_dir, "NoStrategy", 1, ps=1, **edits)
    started = time.monotonic()
    _, errors = _kill_after_checkpoint_20(job, model_dir, 1, 240)
    assert len(errors) == 1 and isinstance(errors[0], JobFailedError), errors
    assert "every worker failed" in str(errors[0])
    assert time.monotonic() - started < 240
