"""The training loop on real MovieLens features: checkpoints, resume, fine-tune, eval, CLI."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from recpipe.layout import parse_ds_range
from tests.support import EARLY, RECPIPE, ROOT, with_edits
from trainer.checkpoints import CheckpointError, list_variables, read_var_map
from trainer.loop import Trainer, TrainError, TrainJob
from trainer.scoring import evaluate, load_model

DAYS = parse_ds_range(":".join(EARLY))
EVAL = parse_ds_range("1997-10-10:1997-10-20")


def _job(config, model_dir, **kw):
    return TrainJob(config=config, model_dir=Path(model_dir), train_days=DAYS, **kw)


def _small(config, **edits):
    return with_edits(
        config, {"train_config.log_step_count_steps": 10, "data_config.batch_size": 128, **edits}
    )


def _values(trainer):
    return {name: v.numpy() for name, v in trainer.variables.items()}


def test_train_writes_checkpoints_summaries_and_refuses_to_overwrite(ml_early, tmp_path):
    config = _small(
        ml_early,
        **{
            "train_config.num_steps": 60,
            "train_config.save_checkpoints_steps": 20,
            "train_config.keep_checkpoint_max": 2,
            "train_config.save_summary_steps": 10,
        },
    )
    logged = []
    result = Trainer(_job(config, tmp_path)).train(on_log=lambda step, m: logged.append((step, m)))
    assert result.global_step == 60 and result.checkpoint.endswith("model.ckpt-60")
    assert np.isfinite(result.loss) and result.examples_per_sec > 0
    # the memory profile: the peak up to the end of each phase, in order, none falling
    assert list(result.memory_mb) == ["build", "first_step", "train", "save"]
    peaks = list(result.memory_mb.values())
    assert peaks == sorted(peaks) and 100 < peaks[0] < 64_000
    # the step by phase: the first (traced, then run) takes longer than a later one
    phases = result.phases
    assert set(phases) == {"first_step_s", "first_step_cpu_s", "step_ms", "step_cpu_ms", "step_ops"}
    assert phases["first_step_s"] > phases["step_ms"] / 1e3 > 0 and 100 < phases["step_ops"] < 10_000
    assert [s for s, _ in logged] == [10, 20, 30, 40, 50, 60]
    assert set(logged[0][1]) == {"loss", "learning_rate", "examples_per_sec"}
    kept = sorted(p.name for p in tmp_path.glob("model.ckpt-*.index"))
    assert kept == ["model.ckpt-40.index", "model.ckpt-60.index"]  # keep_checkpoint_max
    assert list((tmp_path / "train").glob("events.out.tfevents.*"))
    assert (
        json.loads((tmp_path / "normalization.json").read_text())["features"]["age"]["method"] == "standard"
    )
    with pytest.raises(TrainError, match="already holds checkpoints.*--continue_train"):
        Trainer(_job(config, tmp_path)).train()


LAZY_SPLIT = [{"lazy_adam_optimizer": {}}, {"adam_optimizer": {}}]


@pytest.mark.parametrize("optimizers", [None, LAZY_SPLIT], ids=["adam", "lazy_adam+adam"])
def test_continue_train_resumes_step_slots_and_input_position(ml_early, tmp_path, optimizers):
    opt = {"train_config.optimizer_config": optimizers} if optimizers else {}
    config = _small(
        ml_early, **{"train_config.num_steps": 30, "train_config.save_checkpoints_steps": 1000, **opt}
    )
    straight = Trainer(_job(_small(ml_early, **{"train_config.num_steps": 60, **opt}), tmp_path / "a"))
    straight.train()
    Trainer(_job(config, tmp_path / "b")).train()
    resumed = Trainer(
        _job(_small(ml_early, **{"train_config.num_steps": 60, **opt}), tmp_path / "b", continue_train=True)
    )
    result = resumed.train()
    assert result.global_step == 60
    a, b = _values(straight), _values(resumed)
    assert a.keys() == b.keys()
    for name in a:  # same data order and optimizer state: the same weights as one run
        np.testing.assert_allclose(a[name], b[name], rtol=1e-5, atol=1e-6, err_msg=name)
    slots = [v.numpy() for v in resumed.optimizers[0].variables]
    np.testing.assert_allclose(slots[1], straight.optimizers[0].variables[1].numpy(), rtol=1e-5, atol=1e-7)


def test_one_trace_per_job_and_fine_tune_carries_the_slots(ml_early, tmp_path):
    # 128 does not divide the days' rows: the last batch of the epoch is short
    config = _small(ml_early, **{"train_config.optimizer_config": LAZY_SPLIT, "data_config.num_epochs": 1})
    first = Trainer(_job(config, tmp_path / "day1"))
    result = first.train()
    assert first.reader.num_rows % 128 and result.global_step == -(-first.reader.num_rows // 128)
    assert first.train_step.experimental_get_tracing_count() == 1
    tuned = Trainer(
        _job(
            _small(
                ml_early,
                **{
                    "train_config.optimizer_config": LAZY_SPLIT,
                    "train_config.num_steps": 5,
                    "train_config.fine_tune_checkpoint": str(tmp_path / "day1"),
                },
            ),
            tmp_path / "day2",
        )
    )
    slots_before = {v.name: v.numpy() for opt in first.optimizers for v in opt.variables}
    report = tuned._restore()
    # one entry per slot of each table (fused tables count per table), every slot variable covered
    assert report["slots_restored"] >= sum(len(opt.variables) - 1 for opt in first.optimizers)
    assert report["optimizer_iterations"] == {
        "optimizer_0": result.global_step,
        "optimizer_1": result.global_step,
    }
    for opt in tuned.optimizers:
        for v in opt.variables:
            np.testing.assert_array_equal(v.numpy(), slots_before[v.name], err_msg=v.name)
    assert int(tuned.global_step) == 0
    assert report["source"] == str(tmp_path / "day1")
    # a retry resumes from the run's own checkpoint and still reports where the run started
    assert tuned.train().fine_tune == report
    again = _small(
        ml_early,
        **{"train_config.optimizer_config": LAZY_SPLIT, "train_config.num_steps": 8,
           "train_config.fine_tune_checkpoint": "unused"},
    )  # fmt: skip
    resumed = Trainer(_job(again, tmp_path / "day2", continue_train=True)).train()
    assert resumed.global_step == 8 and resumed.fine_tune == report


def test_embedding_regularization_stays_on_the_looked_up_rows():
    from trainer.loop import _l2_on_rows

    table, dense = tf.Variable([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]), tf.Variable([1.0])
    grad = tf.IndexedSlices(tf.ones([3, 2]), tf.constant([2, 0, 2]), tf.constant([3, 2]))
    (g_table, g_dense), reg_loss = _l2_on_rows([grad, tf.constant([0.5])], [table, dense], {table.ref()}, 0.1)
    assert isinstance(g_table, tf.IndexedSlices)
    np.testing.assert_allclose(g_table.values.numpy(), [[1.5, 1.6], [1.1, 1.2], [1.5, 1.6]], rtol=1e-6)
    np.testing.assert_array_equal(g_dense.numpy(), [0.5])
    assert float(reg_loss) == pytest.approx(0.1 * 0.5 * (2 * (25 + 36) + 1 + 4))


def test_l2_regularization_shrinks_the_dense_kernels_only(ml_early, tmp_path):
    """EasyRec's ``l2_regularization`` of a model block: the same steps with a large weight
    leave the MLP's kernels smaller and the embedding tables as they are without it."""

    def trained(l2: float, name: str):
        config = _small(
            ml_early, **{"train_config.num_steps": 30, "model_config.deepfm.l2_regularization": l2}
        )
        assert config.model.l2_regularization == l2
        Trainer(_job(config, tmp_path / name)).train()
        model, _ = load_model(config, tmp_path / name)
        kernels = [v for v in model.trainable_variables if "kernel" in v.name]
        tables = model.variable_groups()["embedding"]
        return sum(float(tf.reduce_sum(k**2)) for k in kernels), sum(
            float(tf.reduce_sum(t**2)) for t in tables
        )

    (kernels, tables), (kernels_l2, tables_l2) = trained(0.0, "plain"), trained(0.5, "l2")
    assert kernels_l2 < 0.8 * kernels
    assert tables_l2 == pytest.approx(tables, rel=0.2)


def test_a_crashed_save_never_becomes_the_latest(ml_early, tmp_path):
    config = _small(ml_early, **{"train_config.num_steps": 20})
    Trainer(_job(config, tmp_path)).train()
    # what a save killed before its state update leaves behind: files, no 'checkpoint' entry
    (tmp_path / "model.ckpt-999.index").write_bytes(b"partial")
    (tmp_path / "model.ckpt-999.data-00000-of-00001").write_bytes(b"partial")
    assert tf.train.latest_checkpoint(str(tmp_path)).endswith("model.ckpt-20")
    result = Trainer(
        _job(_small(ml_early, **{"train_config.num_steps": 30}), tmp_path, continue_train=True)
    ).train()
    assert result.global_step == 30


def test_fine_tune_by_name_with_var_map(ml_early, tmp_path):
    base = Trainer(_job(_small(ml_early, **{"train_config.num_steps": 20}), tmp_path / "base"))
    base.train()
    old_name = "deepfm/input_layer/user_id/embedding_weights"
    new_name = "deepfm/input_layer/uid/embedding_weights"
    var_map = tmp_path / "var_map.txt"
    var_map.write_text(f"{new_name}\t{old_name}\n# comment\n\ndeepfm/logit/kernel\tdeepfm/logit/kernel\n")
    edits = {
        "train_config.num_steps": 5,
        "train_config.fine_tune_checkpoint": str(tmp_path / "base"),
        "train_config.fine_tune_ckpt_var_map": str(var_map),
        "feature_config.features[input_names[0]=user_id].embedding_name": "uid",
    }
    tuned = Trainer(_job(_small(ml_early, **edits), tmp_path / "tuned"))
    before = tuned.variables[new_name].numpy().copy()
    report = tuned._restore()
    assert report["restored"] == 2 and not report["missing"]
    np.testing.assert_array_equal(tuned.variables[new_name].numpy(), base.variables[old_name].numpy())
    assert not np.array_equal(before, tuned.variables[new_name].numpy())

    # without a map: names are matched as they are, the renamed table is reported missing
    edits.pop("train_config.fine_tune_ckpt_var_map")
    edits["feature_config.features[input_names[0]=item_id].hash_bucket_size"] = 777
    plain = Trainer(_job(_small(ml_early, **edits), tmp_path / "plain"))
    result = plain.train()
    assert result.global_step == 5  # fine-tuning starts from step 0
    assert result.fine_tune["missing"] == [new_name, "deepfm/wide/wide_embedding/uid/embedding_weights"]
    assert result.fine_tune["shape_mismatch"][0].startswith(
        "deepfm/input_layer/item_id/embedding_weights: model [777"
    )


def test_malformed_var_map_line_is_named(tmp_path):
    path = tmp_path / "map.txt"
    path.write_text("a\tb\nonly_one_name\n")
    with pytest.raises(CheckpointError, match=r"map\.txt:2: expected"):
        read_var_map(path)


def test_eval_writes_exact_metrics_and_ckpt_list_shows_names(ml_early, tmp_path):
    config = _small(ml_early, **{"train_config.num_steps": 40})
    Trainer(_job(config, tmp_path)).train()
    result = evaluate(config, tmp_path, EVAL)
    stored = json.loads((tmp_path / "eval_result.json").read_text())
    assert stored == result and result["global_step"] == 40
    assert 0.5 < result["auc"] < 1 and 0 < result["logloss"] < 1 and "gauc" in result
    assert result["num_examples"] > 1000
    # eval_config.num_examples (EasyRec's): the first rows only, not a whole last batch
    capped = evaluate(with_edits(config, {"eval_config.num_examples": 300}), tmp_path, EVAL)
    assert capped["num_examples"] == 300 and capped["auc"] != result["auc"]
    names = dict(list_variables(tmp_path))
    assert names["deepfm/input_layer/item_id/embedding_weights"] == [100000, 16]
    assert names["global_step"] == []
    done = subprocess.run(
        [sys.executable, "-m", "cli", "ckpt", "list", str(tmp_path / "model.ckpt-40")],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert done.returncode == 0 and "deepfm/tower/dnn/dense_0/kernel\t[98, 64]" in done.stdout


@pytest.mark.parametrize("model_class", ["DNN", "WideAndDeep", "DeepFM", "DLRM", "DCN", "MultiTower"])
def test_every_model_class_learns(ml_early, tmp_path, model_class):
    edits = {"model_config.model_class": model_class, "train_config.num_steps": 80}
    if model_class == "WideAndDeep":  # three optimizers: wide, dense, deep embeddings
        fast = {"learning_rate": {"constant_learning_rate": {"learning_rate": 0.05}}}
        edits["train_config.optimizer_config"] = [
            {"ftrl_optimizer": fast},
            {"adam_optimizer": {}},
            {"adagrad_optimizer": fast},
        ]
    if model_class == "DLRM":
        edits["model_config.dlrm"] = {"bot_dnn": {"hidden_units": [32, 16]}}
    if model_class == "MultiTower":  # a tower per feature group (EasyRec's l2 on its kernels)
        groups = [g.group_name for g in ml_early.model.feature_groups]
        edits["model_config.multi_tower"] = {
            "towers": [{"input": g} for g in groups],
            "l2_regularization": 1e-4,
        }
    trainer = Trainer(_job(_small(ml_early, **edits), tmp_path))
    result = trainer.train()
    assert result.global_step == 80 and np.isfinite(result.loss)
    assert evaluate(trainer.config, tmp_path, EVAL)["auc"] > 0.55


def test_eta_text():
    from trainer.hooks import eta_text

    assert [eta_text(50, 10), eta_text(1850, 10), eta_text(3660, 1)] == ["5s", "3m05s", "1h01m"]
    assert eta_text(float("inf"), 1) == eta_text(5, 0) == "?"


def test_train_eval_cli(ml_early, tmp_path):
    import yaml

    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(ml_early.to_dict()))
    cmd = [
        sys.executable,
        "-m",
        "trainer.train_eval",
        "--pipeline_config_path",
        str(path),
        "--model_dir",
        str(tmp_path / "m"),
        f"--train_ds={EARLY[0]}:{EARLY[1]}",
        "--eval_ds=1997-10-15",
        "--edit_config_json",
        '{"train_config.num_steps": 15, "train_config.log_step_count_steps": 5}',
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["global_step"] == 15 and summary["eval"]["eval_days"] == ["1997-10-15"]
    # progress a person can read: step of the planned steps (num_steps here) and an ETA
    assert re.search(r"step 10/15 loss [\d.]+ lr \S+ examples/s \d+ eta \d+s", done.stderr), done.stderr[
        -2000:
    ]
    assert yaml.safe_load((tmp_path / "m/pipeline.yaml").read_text())["train_config"]["num_steps"] == 15
    again = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    assert again.returncode == 2 and "already holds checkpoints" in again.stderr


def test_recpipe_train_exit_codes_and_messages_name_commands_that_exist(ml_early, tmp_path):
    """2 for usage and config errors, 1 for pipeline errors; a multi-process strategy started
    as one process points to ``recpipe train --num_workers N``, which then starts it."""
    import yaml

    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(ml_early.to_dict()))
    base = [*RECPIPE, "train", "--pipeline_config_path", str(path)]
    base += ["--model_dir", str(tmp_path / "m"), f"--train_ds={EARLY[0]}:{EARLY[1]}"]

    def run(*args):
        return subprocess.run([*base, *args], capture_output=True, text=True, cwd=ROOT, timeout=600)

    alone = run("--train_config.train_distribute=MultiWorkerMirroredStrategy")
    assert alone.returncode == 2 and "recpipe train --num_workers N" in alone.stderr
    too_many = run("--num_workers", "2")  # NoStrategy is one process
    assert too_many.returncode == 2 and "NoStrategy runs in one process" in too_many.stderr
    reversed_days = run("--train_ds=1997-10-20:1997-09-20")
    # the config's check names the field and says why
    assert reversed_days.returncode == 2 and "train_ds: '1997-10-20:1997-09-20': end before start" in (
        reversed_days.stderr
    )
    no_data = run("--train_ds=2001-01-01")  # a pipeline error: no finished partition
    assert no_data.returncode == 1 and "no finished feature partition" in no_data.stderr
    failed_job = run("--num_workers", "1", "--train_ds=2001-01-01")  # the job's process fails
    assert failed_job.returncode == 1 and "train worker 0 exited with code 1" in failed_job.stderr


def test_train_batches_in_process_trains_and_scores_as_the_job_does(ml_early, tmp_path):
    """The warm path (bench/freshness.py): the same batches through ``train_batches`` leave the
    variables ``train()`` leaves, in two calls (two passes of one process), and
    ``predict_batch`` scores as the saved checkpoint does."""
    from trainer.scoring import load_model

    config = _small(ml_early, **{"data_config.num_epochs": 1})
    job = Trainer(_job(config, tmp_path / "job"))
    job.train()
    warm = Trainer(_job(config, tmp_path / "warm"))
    first = list(warm.reader.batches(0))
    half = len(first) // 2
    assert np.isfinite(warm.train_batches(first[:half], DAYS[0]))
    warm.train_batches(first[half:], DAYS[-1])
    assert np.isnan(warm.train_batches([], DAYS[-1]))  # a quiet pass
    assert int(warm.global_step) == len(first) == int(job.global_step)
    expected, got = _values(job), _values(warm)
    for name, value in expected.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-4, atol=1e-6, err_msg=name)
    model, _ = load_model(config, job.manager.latest_checkpoint)
    flat = first[0]
    features, _ = warm.reader.structure(flat)
    saved = tf.sigmoid(model(features, training=False)).numpy()
    probs = warm.predict_batch(flat)
    assert probs.shape == (len(flat[0]),) and 0 < probs.min() and probs.max() < 1
    np.testing.assert_allclose(probs, saved, rtol=1e-4, atol=1e-5)


def test_a_stream_model_cold_starts_from_a_daily_model_of_its_pipeline(ml_early, tmp_path):
    # stream.cold_start_from: the stream's online tables (ev_params) have no rows in a daily
    # model's checkpoint (hashed tables) and start empty; the dense layers carry over
    daily = _small(ml_early, **{"train_config.num_steps": 5})
    base = Trainer(_job(daily, tmp_path / "daily"))
    base.train()
    online = {
        "train_config.num_steps": 5,
        "model_config.ev_params": {"filter_freq": 0, "max_capacity": 4096},
        "train_config.optimizer_config": [{"lazy_adam_optimizer": {}}, {"adam_optimizer": {}}],
        "train_config.fine_tune_checkpoint": str(tmp_path / "daily"),
    }
    stream = Trainer(_job(_small(ml_early, **online), tmp_path / "stream"))
    result = stream.train()
    report = result.fine_tune
    dense = [n for n in base.variables if "/dnn/" in n or "/logit/" in n]
    assert len(dense) >= 4 and report["restored"] >= len(dense), report
    # the online tables' clock is the stream's own; it starts at its beginning
    assert set(report["missing"]) == {"ev_clock/step", "ev_clock/day"} and report["shape_mismatch"] == []
    assert "online_rows_restored" not in report  # the daily model has no online rows
    assert result.global_step == 5 and np.isfinite(result.loss)
