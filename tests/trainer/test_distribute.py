"""Distributed training in real processes, started as users start them: ``recpipe train
--num_workers N [--num_ps M]`` through the local launcher the DAG uses. Mirrored replicas equal
one process on the global batch; multi-worker jobs train, checkpoint from the chief only, resume."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from recpipe.config import ClusterConfig
from recpipe.config.train import TrainDistribute
from recpipe.launch import JobFailedError, JobSpec, LocalLauncher, job_result, training_job
from recpipe.launch.local import tail
from recpipe.launch.topology import training_processes
from tests.support import EARLY, RECPIPE, ROOT, processes_writing_to, train_args

pytestmark = pytest.mark.slow


def _job(config_path: Path, model_dir: Path, distribute: str, workers: int = 1, *extra, ps: int = 0, **edits):
    """The ``JobSpec`` of trainer.train_eval as a ``distribute`` job on the early days."""
    edits = {"train_config.train_distribute": distribute, **edits}
    args = train_args(config_path, model_dir, edits, *extra)
    return training_job(
        "train", TrainDistribute(distribute), ClusterConfig(), args, cwd=ROOT, workers=workers, ps=ps
    )


def _train(
    config_path: Path, model_dir: Path, distribute: str, workers: int = 1, *extra, ps: int = 0, **edits
):
    """``recpipe train ... --num_workers W [--num_ps P]``: the whole ``distribute`` job from the
    command line, as a user starts it; return (the chief's result, the job's log files)."""
    launch = ["--num_workers", str(workers), *(["--num_ps", str(ps)] if ps else [])]
    strategy = f"--train_config.train_distribute={distribute}"
    argv = [*RECPIPE, "train", *train_args(config_path, model_dir, edits, strategy, *launch, *extra)]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-30000:]
    logs = sorted((model_dir / "logs").glob("train-*.log"), key=lambda p: int(p.stem.split("-")[1]))
    return json.loads(done.stdout.strip().splitlines()[-1]), logs


def _weights(model_dir: Path) -> dict[str, np.ndarray]:
    reader = tf.train.load_checkpoint(str(model_dir))
    return {
        name: reader.get_tensor(name)
        for name, dtype in reader.get_variable_to_dtype_map().items()
        if dtype.is_floating and name.startswith("variables/")
    }


SPLITS = {
    "adam": [{"adam_optimizer": {}}],
    "lazy_adam+adam": [{"lazy_adam_optimizer": {}}, {"adam_optimizer": {}}],
    "ftrl+adam": [{"ftrl_optimizer": {}}, {"adam_optimizer": {}}],
}


@pytest.mark.parametrize("optimizers", ["adam", "lazy_adam+adam", "ftrl+adam"])
def test_mirrored_replicas_match_one_process_on_the_global_batch(config_path, tmp_path, optimizers):
    # both start from one checkpoint (weights and optimizer slots), read rows in file order;
    # the row-wise optimizers get the replicas' IndexedSlices concatenated, duplicates included
    split = {"train_config.optimizer_config": SPLITS[optimizers]}
    start, _ = _train(config_path, tmp_path / "start", "NoStrategy", **{"train_config.num_steps": 3, **split})
    common = {
        **split,
        "data_config.shuffle": False,
        "train_config.num_steps": 6,
        "train_config.fine_tune_checkpoint": start["checkpoint"],
    }
    one, _ = _train(config_path, tmp_path / "one", "NoStrategy", **common, **{"data_config.batch_size": 256})
    two, _ = _train(
        config_path,
        tmp_path / "two",
        "MirroredStrategy",
        **common,
        **{"data_config.batch_size": 128, "train_config.num_gpus_per_worker": 2},
    )
    assert one["global_step"] == two["global_step"] == 6
    assert abs(one["loss"] - two["loss"]) < 1e-5
    a, b = _weights(tmp_path / "one"), _weights(tmp_path / "two")
    assert a.keys() == b.keys() and len(a) > 10
    moved = max(float(np.abs(a[k] - _weights(tmp_path / "start")[k]).max()) for k in a)
    assert moved > 1e-3  # training did change the weights
    for name in a:
        np.testing.assert_allclose(a[name], b[name], atol=2e-5, err_msg=name)


@pytest.mark.parametrize(
    ("distribute", "optimizers"),
    [("MultiWorkerMirroredStrategy", "adam"), ("HorovodStrategy", "lazy_adam+adam")],
)
def test_two_worker_job_trains_checkpoints_from_the_chief_and_resumes(
    config_path, tmp_path, distribute, optimizers
):
    model_dir = tmp_path / "model"
    edits = {
        "train_config.optimizer_config": SPLITS[optimizers],
        "data_config.batch_size": 128,
        "train_config.num_steps": 30,
        "train_config.save_checkpoints_steps": 10,
        "train_config.log_step_count_steps": 10,
    }
    result, logs = _train(config_path, model_dir, distribute, 2, **edits)
    assert result["global_step"] == 30 and np.isfinite(result["loss"])
    assert result["checkpoint"].endswith("model.ckpt-30")
    assert sorted(p.name for p in model_dir.glob("model.ckpt-*.index")) == [
        "model.ckpt-10.index",
        "model.ckpt-20.index",
        "model.ckpt-30.index",
    ]
    text = "\n".join(p.read_text() for p in logs)
    assert "rank 1 of 2" in text and "rank 0 of 2" in text  # both ranks read their own shard
    metrics = [json.loads(line) for line in (model_dir / "train_metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [10, 20, 30]  # the chief alone logs
    # a retry resumes from the latest checkpoint and runs the remaining steps only
    edits["train_config.num_steps"] = 40
    again, _ = _train(config_path, model_dir, distribute, 2, "--continue_train", **edits)
    assert again["global_step"] == 40 and again["checkpoint"].endswith("model.ckpt-40")


def test_a_failing_worker_stops_the_job_and_is_named(config_path, tmp_path):
    # rank 1 gets a model_dir it cannot create: the job must fail, naming that worker
    processes = training_processes(
        TrainDistribute.MultiWorkerMirroredStrategy,
        2,
        [
            "trainer.train_eval",
            "--pipeline_config_path",
            str(config_path),
            f"--train_ds={EARLY[0]}:{EARLY[1]}",
            "--edit_config_json",
            '{"train_config.train_distribute": "MultiWorkerMirroredStrategy"}',
        ],
    )
    blocker = tmp_path / "file"
    blocker.write_text("")
    argv = [
        p.argv + ["--model_dir", str(tmp_path / "m" if i == 0 else blocker / "m")]
        for i, p in enumerate(processes)
    ]
    job = JobSpec(
        name="train", argv=argv, cwd=ROOT, envs=[p.env for p in processes], roles=[p.role for p in processes]
    )
    with pytest.raises(JobFailedError, match=r"train worker 1 exited with code 1") as err:
        LocalLauncher(tmp_path / "logs", grace_s=3).run(job)
    assert "NotADirectoryError" in str(err.value)  # the log's tail
    assert left_running(tmp_path) == []  # worker 0, waiting for its peer, was stopped


def _kill_after_checkpoint_20(job, model_dir: Path, index: int, join_s: float) -> tuple[list, list]:
    """Run ``job`` in a thread, SIGKILL its process ``index`` once ``model.ckpt-20`` exists,
    wait for the job to end; return (its logs, the errors it raised)."""
    import contextlib
    import signal
    import threading
    import time

    launcher = LocalLauncher(model_dir / "logs", grace_s=3)
    logs: list = []
    errors: list[Exception] = []

    def run():
        try:
            logs.extend(launcher.run(job))
        except Exception as err:  # noqa: BLE001 - the callers assert what it was
            errors.append(err)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 300
        while not (model_dir / "model.ckpt-20.index").exists():
            assert time.monotonic() < deadline and thread.is_alive(), errors
            time.sleep(0.2)
        os.kill(launcher._procs[index].pid, signal.SIGKILL)  # dies mid-training
        thread.join(join_s)
        if thread.is_alive():  # say where each process stood: a rare hang is seen in CI only
            for proc in launcher._procs:  # each live process prints its threads' stacks
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGUSR1)
            time.sleep(3)
            tails = "\n".join(
                f"--- {job.role(i)}:\n{tail(launcher.log_dir / f'{job.name}-{i}.log', 60)}"
                for i in range(len(job.argv))
            )
            raise AssertionError(f"the job did not end within {join_s} s; its logs end:\n{tails}")
    finally:
        if thread.is_alive():
            launcher.kill()  # leave no process behind for the tests that follow
    return logs, errors


def job_processes(model_dir: Path) -> list[int]:
    """Live processes of the job that trains ``model_dir``: those whose output goes to a log
    under it (the launcher points each process's stdout at ``<model_dir>/logs/<job>-<i>.log``).
    Another test's job, on the other pytest-xdist worker, never matches."""
    return processes_writing_to(f"{model_dir}/")


def left_running(model_dir: Path, settle_s: float = 10) -> list[int]:
    """``job_processes`` once they are gone, or those left after ``settle_s``: a forked
    process (``recpipe.forkserver``) ends a moment after its client, which the launcher
    waited for (the server kills it when it sees the client's connection close)."""
    import time

    deadline = time.monotonic() + settle_s
    while (left := job_processes(model_dir)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def test_embedding_parallel_lookup_and_gradient_equal_one_unsharded_table(tmp_path):
    (p,) = training_processes(
        TrainDistribute.HorovodStrategy, 2, ["tests.trainer.ep_lookup_check", str(tmp_path)]
    )
    LocalLauncher(tmp_path / "logs", grace_s=3).run(JobSpec(name="ep", argv=[p.argv], cwd=ROOT, envs=[p.env]))
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for report in reports:
        for case in ("batch", "empty_on_last_rank"):
            r = report[case]
            assert r["sparse_gradient"]  # the shard's gradient stays IndexedSlices
            assert r["lookup_error"] < 1e-6 and r["gradient_error"] < 1e-5
            assert r["gradient_norm"] > 1.0  # rows of this shard were looked up by the ranks


def test_a_worker_killed_mid_training_fails_the_job_and_a_retry_resumes(config_path, tmp_path):

    model_dir = tmp_path / "model"
    edits = {
        "data_config.batch_size": 128,
        "data_config.num_epochs": 50,
        "train_config.num_steps": 5000,
        "train_config.save_checkpoints_steps": 10,
    }
    job = _job(config_path, model_dir, "MultiWorkerMirroredStrategy", 2, **edits)
    _, errors = _kill_after_checkpoint_20(job, model_dir, 1, 60)
    assert isinstance(errors[0], JobFailedError) and "train worker 1 exited with code -9" in str(errors[0])
    assert left_running(model_dir) == []  # worker 0 was stopped, not left waiting
    latest = tf.train.latest_checkpoint(str(model_dir))
    saved = int(latest.rsplit("-", 1)[1])
    assert saved >= 20
    # the retry (Airflow's, via --continue_train) resumes from the latest checkpoint
    edits["train_config.num_steps"] = saved + 10
    again, logs = _train(
        config_path, model_dir, "MultiWorkerMirroredStrategy", 2, "--continue_train", **edits
    )
    assert again["global_step"] == saved + 10
    assert f"resumed from {latest} at step {saved}" in logs[0].read_text()


def _state(model_dir: Path) -> dict[str, np.ndarray]:
    """Every float tensor of the latest checkpoint: weights, optimizer slots."""
    reader = tf.train.load_checkpoint(str(model_dir))
    return {
        name: reader.get_tensor(name)
        for name, dtype in reader.get_variable_to_dtype_map().items()
        if dtype.is_floating
    }


def _assert_same_state(a_dir: Path, b_dir: Path) -> None:
    a, b = _state(a_dir), _state(b_dir)
    assert a.keys() == b.keys() and sum("OPTIMIZER_SLOT" in k or "_variables" in k for k in a) > 5
    for name in a:
        np.testing.assert_allclose(a[name], b[name], atol=3e-5, err_msg=name)


def _copies(model_dir: Path, *names: str) -> None:
    """Copies of ``model_dir`` (less its logs) beside it, one per name."""
    import shutil

    for name in names:
        shutil.copytree(model_dir, model_dir.parent / name, ignore=shutil.ignore_patterns("logs"))


def test_embedding_parallel_equals_horovod_and_checkpoints_restore_to_another_world_size(
    config_path, tmp_path
):

    # lazy Adam on the tables (their slots must follow each rank's rows), Adam on the rest
    edits = {
        "train_config.optimizer_config": SPLITS["lazy_adam+adam"],
        "data_config.batch_size": 128,
        "data_config.shuffle": False,
        "train_config.save_checkpoints_steps": 1000,
    }
    ep = "EmbeddingParallelStrategy"
    one, _ = _train(config_path, tmp_path / "ep1", ep, 1, **edits, **{"train_config.num_steps": 4})
    assert one["global_step"] == 4

    # 1 -> 2 ranks: the sharded job resumes the 1-rank checkpoint and trains as Horovod does
    _copies(tmp_path / "ep1", "ep2", "hvd2")
    steps = {"train_config.num_steps": 10}
    two, logs = _train(config_path, tmp_path / "ep2", ep, 2, "--continue_train", **edits, **steps)
    ref, _ = _train(
        config_path, tmp_path / "hvd2", "HorovodStrategy", 2, "--continue_train", **edits, **steps
    )
    assert two["global_step"] == ref["global_step"] == 10
    assert "resumed from" in logs[0].read_text()
    assert abs(two["loss"] - ref["loss"]) < 1e-4
    moved = _state(tmp_path / "ep2")
    start = _state(tmp_path / "ep1")
    assert max(float(np.abs(moved[k] - start[k]).max()) for k in start) > 1e-3
    _assert_same_state(tmp_path / "ep2", tmp_path / "hvd2")

    # 2 -> 1 rank: the 2-rank checkpoint (gathered on the chief) resumes in one rank
    _copies(tmp_path / "ep2", "ep2to1", "single")
    steps = {"train_config.num_steps": 14}
    back, _ = _train(config_path, tmp_path / "ep2to1", ep, 1, "--continue_train", **edits, **steps)
    plain, _ = _train(config_path, tmp_path / "single", "NoStrategy", 1, "--continue_train", **edits, **steps)
    assert back["global_step"] == plain["global_step"] == 14
    _assert_same_state(tmp_path / "ep2to1", tmp_path / "single")


PS_EDITS = {
    "train_config.optimizer_config": SPLITS["lazy_adam+adam"],
    "data_config.batch_size": 128,
    "train_config.num_steps": 30,
    "train_config.save_checkpoints_steps": 10,
    "train_config.log_step_count_steps": 10,
}


def ps_job_losing_a_worker(config_path: Path, model_dir: Path, killed: int, steps: int, **edits):
    """A parameter-server job (NoStrategy, 2 workers, 1 ps) of ``steps`` steps whose process
    ``killed`` (1: worker 0, 2: worker 1) is SIGKILLed once checkpoint 20 exists; the job must
    end without an error. Returns (the job, its logs, the chief's result)."""
    edits = {**PS_EDITS, "train_config.num_steps": steps, "data_config.num_epochs": 20, **edits}
    job = _job(config_path, model_dir, "NoStrategy", 2, ps=1, **edits)
    logs, errors = _kill_after_checkpoint_20(job, model_dir, killed, 400)
    assert not errors, errors
    return job, logs, job_result(logs[0])


def test_parameter_server_job_partitions_tables_trains_and_resumes(ml_early, config_path, tmp_path):
    from tests.support import with_edits
    from trainer.scoring import evaluate

    model_dir = tmp_path / "model"
    # a first DNN layer of 1024 units: its kernel (over 256 KiB) is partitioned too
    wide_dnn = {**PS_EDITS, "model_config.deepfm.dnn.hidden_units": [1024, 32]}
    result, logs = _train(config_path, model_dir, "PSStrategy", 2, ps=2, **wide_dnn)
    assert result["global_step"] == 30 and np.isfinite(result["loss"])
    chief = logs[0].read_text()
    # the item table (100,000 x 16 floats) is split over both ps; the checkpoint keeps one
    # entry per table and per dense weight, as every other strategy writes it
    assert "rows in 2 parts" in chief and "/job:ps/replica:0/task:1" in chief
    names = {k: v.shape for k, v in _state(model_dir).items()}
    assert names["variables/deepfm.Sinput_layer.Sitem_id.Sembedding_weights/.ATTRIBUTES/VARIABLE_VALUE"] == (
        100000,
        16,
    )
    kernel = "variables/deepfm.Stower.Sdnn.Sdense_0.Skernel/.ATTRIBUTES/VARIABLE_VALUE"
    assert names[kernel][1] == 1024 and not any("part_" in k for k in names)
    # so the evaluator and export read it as any other checkpoint
    metrics = evaluate(with_edits(ml_early, wide_dnn), model_dir, [EARLY[1]])
    assert 0.5 < metrics["auc"] < 1.0
    assert sorted(p.name for p in model_dir.glob("model.ckpt-*.index"))[-1] == "model.ckpt-30.index"
    assert left_running(model_dir) == []  # servers stopped with the job
    again, logs = _train(
        config_path,
        model_dir,
        "PSStrategy",
        2,
        "--continue_train",
        ps=2,
        **{**wide_dnn, "train_config.num_steps": 40},
    )
    assert again["global_step"] == 40
    assert "resumed from" in logs[0].read_text()


def test_asynchronous_parameter_server_training_goes_on_when_a_worker_dies(config_path, tmp_path):
    # the launcher restarts the worker, as Kubernetes would; TensorFlow's coordinator runs
    # its steps on the other worker meanwhile and takes it back

    model_dir = tmp_path / "model"
    # NoStrategy with ps in the cluster: parameter-server training, as in EasyRec
    job, logs, result = ps_job_losing_a_worker(config_path, model_dir, 2, 400)
    assert job.roles == ["chief", "worker 0", "worker 1", "ps 0"]
    # no step lost; the step running on the killed worker may have updated the ps before it
    # died and is run again (TensorFlow's coordinator runs a step at least once)
    assert 400 <= result["global_step"] <= 402
    assert logs[2].read_text().count("serving worker 1") == 2  # started again, one log
    assert tf.train.latest_checkpoint(str(model_dir)).endswith(f"model.ckpt-{result['global_step']}")


def test_a_failed_parameter_server_chief_exits_with_its_error_and_the_job_ends(config_path, tmp_path):
    # the chief exits at once on an error (TensorFlow's ClusterCoordinator can block in its
    # destructor after a failure); its error is the job's, and no server is left running
    sgd = {"sgd_optimizer": {"learning_rate": {"constant_learning_rate": {"learning_rate": 1e30}}}}
    edits = {**PS_EDITS, "train_config.optimizer_config": [sgd], "train_config.num_steps": 200}
    job = _job(config_path, tmp_path / "model", "NoStrategy", 1, ps=1, **edits)
    with pytest.raises(JobFailedError, match=r"train chief exited with code 1") as err:
        LocalLauncher(tmp_path / "logs", grace_s=3).run(job)
    assert "recpipe train: DivergedError: the loss is" in str(err.value)
    # it did not wait on the coordinator's teardown
    assert "ClusterCoordinator destructor" not in (tmp_path / "logs" / "train-0.log").read_text()
    assert left_running(tmp_path / "logs") == []


def _one_process_and_sync_ps(config_path, tmp_path, steps: int, ps: int, **extra):
    """From one 3-step start: ``steps`` steps of one process on 256-row batches (``one``) and
    of a synchronous PS job, 2 workers on 128 rows each and ``ps`` ps (``sync``); returns
    both results and the sync job's logs."""
    edits = {
        "train_config.optimizer_config": SPLITS["lazy_adam+adam"],
        "data_config.shuffle": False,
        "data_config.batch_size": 256,
        "train_config.save_checkpoints_steps": 1000,
        **extra,
    }
    _train(config_path, tmp_path / "start", "NoStrategy", **edits, **{"train_config.num_steps": 3})
    _copies(tmp_path / "start", "one", "sync")
    edits["train_config.num_steps"] = steps
    resume = "--continue_train"
    one, _ = _train(config_path, tmp_path / "one", "NoStrategy", 1, resume, **edits)
    edits |= {"data_config.batch_size": 128, "train_config.sync_replicas": True}
    sync, logs = _train(config_path, tmp_path / "sync", "NoStrategy", 2, resume, ps=ps, **edits)
    return one, sync, logs


def test_synchronous_parameter_server_equals_one_process_on_the_global_batch(config_path, tmp_path):
    # NoStrategy + sync_replicas with 2 workers and 2 ps (the item table partitioned): each
    # update sums one 128-row batch per worker, so it equals one process on 256 rows
    one, sync, logs = _one_process_and_sync_ps(config_path, tmp_path, 8, 2)
    assert one["global_step"] == sync["global_step"] == 8
    assert "rows in 2 parts" in logs[0].read_text()
    assert abs(one["loss"] - sync["loss"]) < 1e-5
    start_state, moved = _state(tmp_path / "start"), _state(tmp_path / "sync")
    assert max(float(np.abs(moved[k] - start_state[k]).max()) for k in start_state) > 1e-3
    _assert_same_state(tmp_path / "one", tmp_path / "sync")


def test_synchronous_parameter_server_moves_batch_norm_statistics_once_an_update(config_path, tmp_path):
    # with use_bn, each worker's gradient step used to move the moving mean on the ps (twice
    # an update with two workers, again for a step run twice); now the chief moves it once,
    # with the workers' batch means averaged: the global batch's mean, as one process. One
    # update: the weights are still the same on both
    _one_process_and_sync_ps(config_path, tmp_path, 4, 1, **{"model_config.deepfm.dnn.use_bn": True})
    start, one, sync = (_state(tmp_path / d) for d in ("start", "one", "sync"))
    first, second = sorted(k for k in one if "moving_mean" in k)  # bn_0, bn_1
    assert "bn_0" in first and "bn_1" in second
    # the first layer's batch mean is the global batch's exactly
    assert float(np.abs(one[first] - start[first]).max()) > 1e-4  # it moved
    np.testing.assert_allclose(sync[first], one[first], atol=1e-6)
    # the second's input was normalized by each worker's statistics: close, not equal; two
    # moving-average steps an update (each worker's) would move it about twice as far
    moved = [np.abs(state[second] - start[second]).sum() for state in (one, sync)]
    assert 0.8 < moved[1] / moved[0] < 1.2, moved


def test_synchronous_parameter_server_applies_each_update_once_when_a_worker_dies(config_path, tmp_path):
    # a gradient step lost with its worker is run again on the other one; the update waits
    # for it, so no update is lost or applied twice
    model_dir = tmp_path / "model"
    edits = {"train_config.sync_replicas": True, "data_config.batch_size": 64}
    _, logs, result = ps_job_losing_a_worker(config_path, model_dir, 1, 200, **edits)
    assert result["global_step"] == 200 and np.isfinite(result["loss"])
    assert logs[1].read_text().count("serving worker 0") == 2  # started again, one log
    metrics = [json.loads(line) for line in (model_dir / "train_metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == list(range(10, 201, 10))


# a wide admission sketch: with no collisions, counting per owner rank (EmbeddingParallel) and
# over the union of the ranks' ids (Horovod) admit the same ids; tables start small and grow
# (each EmbeddingParallel rank its own share, as far as its ids need)
EV = {"filter_freq": 2, "init_capacity": 64, "max_capacity": 2048, "filter_counter_width": 1 << 16}
ONLINE_EDITS = {
    "feature_config.features[input_names=user_id].ev_params": EV,
    "feature_config.features[input_names=item_id].ev_params": EV,
    "train_config.optimizer_config": SPLITS["lazy_adam+adam"],
    "data_config.batch_size": 128,
    "data_config.shuffle": False,
    "train_config.save_checkpoints_steps": 1000,
}


def _online_state(model_dir: Path) -> tuple[dict, dict]:
    """The latest checkpoint as (online table -> {id: its deep and wide rows, their Adam m and
    v rows, its count}, every other float variable and slot by name): online rows sit in
    different rows on different world sizes and groupings, so they are compared by id, table
    by table (``saved_online_tables``: a group is split by its rows' tags)."""
    from trainer.checkpoints import saved_names, saved_online_tables

    path = tf.train.latest_checkpoint(str(model_dir))
    reader = tf.train.load_checkpoint(path)
    names = saved_names(path)
    online, sources = {}, set()
    for table, saved in saved_online_tables(path).items():
        sources.add(saved.source.rsplit("/", 1)[1])
        parts = [saved.arrays[n] for n in sorted(saved.arrays)]
        assert len(parts) == 6, sorted(saved.arrays)  # deep and wide rows, each with m and v
        online[table] = {
            int(k): np.concatenate([p[i] for p in parts] + [[saved.freqs[i]]])
            for i, k in enumerate(saved.ids)
        }
    dense = {
        name: reader.get_tensor(key)
        for name, key in names.items()
        if not any(f"/{s}/" in name for s in sources) and reader.get_variable_to_dtype_map()[key].is_floating
    }
    return online, dense


def _assert_same_online_state(a_dir: Path, b_dir: Path) -> None:
    (a_online, a_dense), (b_online, b_dense) = _online_state(a_dir), _online_state(b_dir)
    assert a_online.keys() == b_online.keys() and len(a_online) == 2  # user and item ids
    for table, rows in a_online.items():
        assert rows.keys() == b_online[table].keys() and len(rows) > 20, table
        for key, values in rows.items():
            np.testing.assert_allclose(values, b_online[table][key], atol=3e-5, err_msg=f"{table} id {key}")
    assert a_dense.keys() == b_dense.keys() and len(a_dense) > 10
    for name, value in a_dense.items():
        np.testing.assert_allclose(value, b_dense[name], atol=3e-5, err_msg=name)


def test_online_tables_under_embedding_parallel_equal_horovod_and_re_shard(config_path, tmp_path):
    """From one process's checkpoint (re-sharded by id), 2-rank EmbeddingParallel (ids owned by
    rank id mod 2, each rank its own map) trains as 2-rank Horovod does (every rank the whole
    table, admitting the union of the ranks' ids), which equals one process on the global
    batch. (Re-sharding from 2 ranks to 1 is the same code path, tested by id in
    tests/trainer/test_online_tables.py.)"""
    ep = "EmbeddingParallelStrategy"
    start, _ = _train(
        config_path, tmp_path / "start", "NoStrategy", **ONLINE_EDITS, **{"train_config.num_steps": 4}
    )
    _copies(tmp_path / "start", "ep2", "hvd2")  # 1 -> 2 ranks: each takes the ids it owns
    steps = {"train_config.num_steps": 12}
    two, _ = _train(config_path, tmp_path / "ep2", ep, 2, "--continue_train", **ONLINE_EDITS, **steps)
    ref, _ = _train(
        config_path, tmp_path / "hvd2", "HorovodStrategy", 2, "--continue_train", **ONLINE_EDITS, **steps
    )
    assert two["global_step"] == ref["global_step"] == 12
    assert abs(two["loss"] - ref["loss"]) < 1e-4
    # rows used, admitted, filtered share; capacities differ (each rank grows its own share)
    figures = {k: v for k, v in two["online_tables"].items() if not k.endswith("/capacity")}
    assert figures == {k: v for k, v in ref["online_tables"].items() if not k.endswith("/capacity")}
    admitted = two["online_tables"]["ev/deepfm/input_layer/item_id/admitted"]
    assert admitted > 50  # new ids admitted by the 2-rank jobs
    for result in (two, ref):  # from 64 rows (32 a rank), as far as the rows need
        # one group holds both tables (one ev_params, one dimension): its capacity is theirs
        used = sum(
            result["online_tables"][f"ev/deepfm/input_layer/{t}/rows_used"] for t in ("user_id", "item_id")
        )
        for table in ("user_id", "item_id"):
            capacity = result["online_tables"][f"ev/deepfm/input_layer/{table}/capacity"]
            assert capacity <= 2 * used + 64, (table, used, capacity)
        assert result["online_tables"]["ev/deepfm/input_layer/item_id/capacity"] > 64  # grew
    _assert_same_online_state(tmp_path / "ep2", tmp_path / "hvd2")


def assert_ep_trains_as_horovod(config, tmp_path: Path, train_ds: str, online: list[str]) -> dict:
    """``config`` (another model's, on its own features) with online tables for ``online``:
    from one process's checkpoint (hashed rows are drawn per rank), 2-rank EmbeddingParallel
    (rows sharded by id, looked up by all-to-all) and 2-rank Horovod (every rank the whole
    table) train on to step 10 with the same loss and table figures. Returns the
    EmbeddingParallel job's result."""
    import yaml

    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(config.to_dict()))
    edits = {
        **{f"feature_config.features[input_names={name}].ev_params": EV for name in online},
        **{k: v for k, v in ONLINE_EDITS.items() if not k.startswith("feature_config")},
    }
    days = f"--train_ds={train_ds}"
    _train(path, tmp_path / "start", "NoStrategy", 1, days, **edits, **{"train_config.num_steps": 2})
    _copies(tmp_path / "start", "ep", "hvd")
    on = ("--continue_train", days)
    steps = {"train_config.num_steps": 10}
    ep, _ = _train(path, tmp_path / "ep", "EmbeddingParallelStrategy", 2, *on, **edits, **steps)
    hvd, _ = _train(path, tmp_path / "hvd", "HorovodStrategy", 2, *on, **edits, **steps)
    assert ep["global_step"] == hvd["global_step"] == 10
    assert abs(ep["loss"] - hvd["loss"]) < 1e-4
    figures = {k: v for k, v in ep["online_tables"].items() if not k.endswith("/capacity")}
    assert figures == {k: v for k, v in hvd["online_tables"].items() if not k.endswith("/capacity")}
    assert any(k.endswith("/admitted") and v > 50 for k, v in figures.items())
    return ep


def assert_trains_under_the_other_strategies(config, tmp_path: Path, train_ds: str) -> dict:
    """``config`` (another model's, on its own features, hashed tables) trains 6 steps under
    MirroredStrategy (2 replicas), MultiWorkerMirroredStrategy (2 workers), asynchronous PS
    and GEO PS (2 workers, 1 ps each), each a real job: every one ends at step 6 with a finite
    loss and a checkpoint that evaluates as any other. Returns each job's result line."""
    import yaml

    from trainer.scoring import evaluate

    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(config.to_dict()))
    edits = {
        "data_config.batch_size": 64,
        "train_config.num_steps": 6,
        "train_config.log_step_count_steps": 3,
    }
    days = f"--train_ds={train_ds}"
    jobs = {
        "mirrored": ("MirroredStrategy", 1, 0, {"train_config.num_gpus_per_worker": 2}),
        "multi_worker": ("MultiWorkerMirroredStrategy", 2, 0, {}),
        "ps": ("PSStrategy", 2, 1, {}),
        "geo": ("PSStrategy", 2, 1, {"train_config.sync_mode": "geo", "train_config.geo_step": 2}),
    }
    results = {}
    for name, (strategy, workers, ps, more) in jobs.items():
        result, _ = _train(path, tmp_path / name, strategy, workers, days, ps=ps, **edits, **more)
        assert result["global_step"] == 6 and np.isfinite(result["loss"]), (name, result)
        metrics = evaluate(config, tmp_path / name, [train_ds.split(":")[-1]])
        assert 0.0 < metrics["auc"] < 1.0, (name, metrics)
        results[name] = result
    return results


def test_the_check_that_a_job_left_nothing_running_sees_only_that_job(tmp_path):
    # another test's PS job, on the other pytest-xdist worker, serves meanwhile: a check by
    # command line (any trainer.distribute.server) failed on it, and misses forked processes
    other = tmp_path / "other" / "logs"
    other.mkdir(parents=True)
    mine = tmp_path / "mine" / "logs"
    mine.mkdir(parents=True)
    code = "import time; time.sleep(60)  # trainer.distribute.server"
    with (other / "train-1.log").open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=out, stderr=subprocess.STDOUT)
    try:
        assert job_processes(tmp_path / "mine") == []
        assert job_processes(tmp_path / "other") == [proc.pid]
    finally:
        proc.kill()
        proc.wait()


def test_a_lost_task_is_the_one_the_error_blames_never_this_process():
    from trainer.distribute.base import lost_task

    cluster = {"worker": ["w0:2222", "w1:2222", "w2:2222"]}
    aborted = (
        "Collective ops on /job:worker/replica:0/task:0/device:CPU:0 aborted by: Error reported from "
        "/job:worker/task:2: Task /job:worker/replica:0/task:2 heartbeat timeout"
    )
    assert lost_task(RuntimeError(aborted), cluster, ("worker", 0)) == "worker 2 (w2:2222)"
    assert (
        lost_task(RuntimeError("on /job:worker/replica:0/task:1/x"), cluster, ("worker", 0))
        == "worker 1 (w1:2222)"
    )
    assert lost_task(RuntimeError("/job:worker/task:0 only"), cluster, ("worker", 0)) is None
    assert lost_task(RuntimeError("/job:ps/task:0"), cluster) is None  # no such task in the cluster


def test_an_error_that_blames_no_task_names_the_peer_that_does_not_answer():
    """A cancelled all-reduce names no task: the peer whose server port refuses a connect is
    the one named."""
    import socket

    from trainer.distribute.base import silent_task

    with socket.socket() as listening, socket.socket() as closed:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        closed.bind(("127.0.0.1", 0))  # bound, never listening: a connect is refused
        up, down = (f"127.0.0.1:{s.getsockname()[1]}" for s in (listening, closed))
        me = ("worker", 0)
        assert silent_task({"worker": ["me:1", up, down]}, me, timeout_s=1) == f"worker 2 ({down})"
        assert silent_task({"worker": ["me:1", up]}, me, timeout_s=1) is None


def test_a_failed_horovod_collective_is_told_from_other_errors():
    """The texts Horovod 0.28's ops fail with when a rank is lost (the op in flight with Gloo's
    reason, under recpipe's name for it; later ones eager or traced, Horovod shut down) are
    collective failures; an op's own error is not."""
    from trainer.distribute.horovod import is_collective_failure

    shut_down = "Horovod has been shut down. This was caused by an exception on one of the ranks"
    texts = [
        f"{{{{function_node __wrapped__HorovodAllreduce_device_/job:localhost}}}} {shut_down} "
        "[Op:HorovodAllreduce]",
        "Graph execution error:\n\nDetected at node recpipe_sparse_grad_3 defined at:\n  File "
        '"horovod/tensorflow/mpi_ops.py", line 130, in _allreduce\n\nGloo allgather failed: '
        "Read error [198.51.100.12]:41213: No route to host\n\t [[{{node recpipe_sparse_grad_3}}]]",
    ]
    for text in texts:
        assert is_collective_failure(tf.errors.UnknownError(None, None, text)), text
    with pytest.raises(tf.errors.InvalidArgumentError) as own:
        tf.gather(tf.constant([1.0]), tf.constant([5]))
    assert not is_collective_failure(own.value)
    assert not is_collective_failure(ValueError("rank 1 has no rows"))
