"""Passes, base and delta exports, apply-delta and the Redis push, on real MovieLens hours.

One module-scoped chain: pass A (16:00-18:00) -> base, pass B (19:00) -> delta-19, pass C
(20:00) -> delta-20, each pass fine-tuned from the one before; then a full export at C's step
to compare with the base plus its deltas.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from tests.support import ROOT, with_edits

DAY = "1997-09-20"
# online tables everywhere; rows unused for 3 steps are evicted, so deltas carry tombstones;
# lazy Adam moves only the rows in the batch (what a delta needs)
STREAM = {
    "model_config.ev_params": {"filter_freq": 0, "steps_to_live": 3, "max_capacity": 4096},
    "train_config.optimizer_config": [
        {"lazy_adam_optimizer": {"learning_rate": {"constant_learning_rate": {"learning_rate": 0.01}}}},
        {"adam_optimizer": {"learning_rate": {"constant_learning_rate": {"learning_rate": 0.001}}}},
    ],
    "data_config.batch_size": 32,
    "data_config.num_epochs": 1,
    "train_config.log_step_count_steps": 1,
}
PASSES = [("A", f"{DAY}/16:{DAY}/18"), ("B", f"{DAY}/19"), ("C", f"{DAY}/20")]


def _train(config, model_dir: Path, train_ds: str, previous: str | None):
    from recpipe.layout import parse_ds_range
    from trainer.loop import Trainer, TrainJob

    edits = {"train_ds": train_ds, "train_config.fine_tune_checkpoint": previous}
    config = with_edits(config, edits)
    return config, Trainer(TrainJob(config, model_dir, parse_ds_range(train_ds))).train()


@pytest.fixture(scope="module")
def chain(ml_passes, tmp_path_factory):
    """The exports of three passes and a full export at the last one's step."""
    from recpipe.exports.files import read_manifest
    from trainer.delta import export_base, export_delta
    from trainer.scoring import load_model
    from trainer.serving import read_normalization

    root = tmp_path_factory.mktemp("chain")
    config = with_edits(ml_passes, STREAM)
    exports, previous, models = root / "exports" / DAY, None, {}
    for name, train_ds in PASSES:
        model_dir = root / "runs" / name
        pass_config, result = _train(config, model_dir, train_ds, previous)
        model, step = load_model(pass_config, model_dir)
        norm = read_normalization(model_dir)
        if name == "A":
            export_base(pass_config, model, norm, exports, DAY, step, model_dir=model_dir)
        else:
            export_delta(pass_config, model, norm, exports, train_ds[-2:], step, model_dir=model_dir)
        previous, models[name] = result.checkpoint, (pass_config, model, step, norm)
    pass_config, model, step, norm = models["C"]
    full = export_base(pass_config, model, norm, root / "full" / DAY, DAY, step)
    return {
        "config": pass_config,
        "exports": exports,
        "full": full,
        "manifests": {p.name: read_manifest(p) for p in sorted(exports.iterdir())},
        "root": root,
    }


def _rows(params) -> dict[str, dict[int, np.ndarray]]:
    return {
        table: {
            int(k): np.concatenate([v[i] for _, v in sorted(rows.views.items())])
            for i, k in enumerate(rows.ids)
        }
        for table, rows in params.tables.items()
    }


def _assert_same_rows(params, full) -> None:
    """Every table holds the same ids with the same rows in both."""
    got, want = _rows(params), _rows(full)
    assert got.keys() == want.keys()
    for table in want:
        assert got[table].keys() == want[table].keys(), table
        for key, row in want[table].items():
            np.testing.assert_array_equal(got[table][key], row)


def test_deltas_hold_the_touched_rows_and_the_evicted_ids(chain):
    manifests = chain["manifests"]
    assert sorted(manifests) == ["base", "delta-19", "delta-20"]
    base, d19, d20 = manifests["base"], manifests["delta-19"], manifests["delta-20"]
    assert (d19["follows"], d20["follows"], d20["sequence"]) == ("base", "delta-19", 2)
    # global_step counts a pass's own steps (each fine-tunes); the tables' clock goes on
    assert base["ev_step"] < d19["ev_step"] < d20["ev_step"]
    assert d20["ev_step"] - d19["ev_step"] == d20["global_step"] > 0
    # an hour's ratings touch a part of the items; rows unused for 3 steps are evicted
    items = [d19["tables"]["item_id"], d20["tables"]["item_id"]]
    assert all(0 < t["rows"] and t["tombstones"] > 0 for t in items)
    assert items[0]["rows"] < items[0]["rows_used"]
    for name, manifest in manifests.items():
        for rel, entry in manifest["files"].items():
            assert (chain["exports"] / name / rel).stat().st_size == entry["bytes"]


def test_base_plus_deltas_equals_a_full_export_at_the_same_step(chain, tmp_path):
    from recpipe.exports.files import apply, read_params
    from trainer.delta import build_saved_model
    from trainer.mlflow_model import raw_rows

    exports = chain["exports"]
    params = read_params(exports / "base")
    for name in ("delta-19", "delta-20"):
        params = apply(params, read_params(exports / name))
    full = read_params(chain["full"])
    _assert_same_rows(params, full)
    assert params.dense.keys() == full.dense.keys()
    for name, value in full.dense.items():
        np.testing.assert_array_equal(params.dense[name], value)

    out = build_saved_model(exports / "base", [exports / "delta-19", exports / "delta-20"], tmp_path / "sm")
    frame = raw_rows(chain["config"], f"{DAY}/21", limit=1000)  # the next, unseen hour
    inputs = {c: tf.constant(frame[c].to_numpy()) for c in frame.columns}
    served = tf.saved_model.load(str(out)).signatures["serving_default"](**inputs)["probability"].numpy()
    expected = tf.saved_model.load(str(chain["full"])).signatures["serving_default"](**inputs)["probability"]
    assert len(served) == len(frame) > 200
    np.testing.assert_allclose(served, expected.numpy(), atol=1e-6)
    assert served.std() > 0.01  # the model is not constant: the comparison could fail


def test_a_pass_started_again_from_another_model_rebases_the_days_chain(chain, tmp_path):
    # the champion was rolled back during the day: pass D starts again from pass A's model,
    # not from C's, which exported last; its delta holds every row, so the chain applied in
    # order is D's model (a delta of the rows D touched would leave C's rows in serving)
    import shutil

    from recpipe.exports.files import apply, read_manifest, read_params
    from trainer.delta import export_base, export_delta
    from trainer.scoring import load_model
    from trainer.serving import read_normalization

    assert [m["rebased"] for m in chain["manifests"].values()] == [False, False, False]
    exports = tmp_path / "exports" / DAY
    shutil.copytree(chain["exports"], exports)
    d_dir = tmp_path / "runs" / "D"
    config, _ = _train(chain["config"], d_dir, f"{DAY}/20", str(chain["root"] / "runs" / "A"))
    model, step = load_model(config, d_dir)
    norm = read_normalization(d_dir)
    delta = export_delta(config, model, norm, exports, "21", step, model_dir=d_dir)
    manifest = read_manifest(delta)
    assert manifest["rebased"] and manifest["follows"] == "delta-20"
    assert manifest["tables"]["item_id"]["rows"] == manifest["tables"]["item_id"]["rows_used"]
    params = read_params(exports / "base")
    for name in ("delta-19", "delta-20", "delta-21"):
        params = apply(params, read_params(exports / name))
    full = export_base(config, model, norm, tmp_path / "full" / DAY, DAY, step)
    _assert_same_rows(params, read_params(full))


def test_apply_delta_refuses_deltas_out_of_order_and_damaged_files(chain, tmp_path):
    import shutil

    from recpipe.exports.files import DeltaError
    from trainer.delta import build_saved_model

    exports = chain["exports"]
    with pytest.raises(DeltaError, match="follows 'delta-19'.*not 'base'"):
        build_saved_model(exports / "base", [exports / "delta-20"], tmp_path / "sm")
    damaged = tmp_path / "delta-19"
    shutil.copytree(exports / "delta-19", damaged)
    with open(damaged / "params" / "dense.npz", "r+b") as f:
        f.seek(100)
        f.write(b"\xff\xff\xff\xff")
    with pytest.raises(DeltaError, match="dense.npz: checksum differs"):
        build_saved_model(exports / "base", [damaged], tmp_path / "sm")
    assert not (tmp_path / "sm").exists()


def test_a_delta_needs_a_row_wise_optimizer_for_the_tables(chain):
    from trainer.delta import DeltaError, check_row_wise
    from trainer.input import sample_inputs
    from trainer.models.builders import build_model

    config = with_edits(chain["config"], {"train_config.optimizer_config[0]": {"adam_optimizer": {}}})
    model = build_model(config)
    model(sample_inputs(config))
    with pytest.raises(DeltaError, match=r"optimizer_config\[0\]: adam_optimizer moves every row"):
        check_row_wise(config, model)


def test_the_export_command_writes_a_delta_and_the_serve_command_applies_it(chain, tmp_path, capsys):
    import shutil

    from trainer.entry import export_main, serve_main

    exports = tmp_path / "exports"
    shutil.copytree(chain["exports"] / "base", exports / DAY / "base")
    shutil.copytree(chain["exports"] / "delta-19", exports / DAY / "delta-19")
    config_file = tmp_path / "pipeline.json"
    config_file.write_text(json.dumps(chain["config"].to_dict()))
    # pass C again, through the CLI: the same delta as the library call wrote
    args = ["--pipeline_config_path", str(config_file), "--export_dir", str(exports)]
    model_dir = chain["root"] / "runs" / "C"
    assert export_main([*args, "--model_dir", str(model_dir), "--delta", f"{DAY}/20"]) == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed["tables"] == chain["manifests"]["delta-20"]["tables"]
    deltas = [str(exports / DAY / "delta-19"), str(exports / DAY / "delta-20")]
    assert (
        serve_main(["apply-delta", str(exports / DAY / "base"), *deltas, "--out", str(tmp_path / "sm")]) == 0
    )
    assert (tmp_path / "sm" / "saved_model.pb").exists()
    assert export_main([*args, "--model_dir", str(model_dir), "--delta", DAY]) == 2  # a day is no pass


def test_pushes_to_redis_are_idempotent_ordered_and_delete_tombstones(chain):
    import redis

    from recpipe.exports.files import apply, read_params
    from recpipe.exports.store import EmbeddingStore, StoreError
    from tests.trainer.chain import assert_store_holds

    client = redis.Redis(host="127.0.0.1", port=6379, db=0)
    model = f"test-{uuid.uuid4().hex[:8]}"
    online = EmbeddingStore(client, model)
    exports = chain["exports"]
    try:
        online.push(exports / "base")
        with pytest.raises(StoreError, match="push the exports in order"):
            online.push(exports / "delta-20")
        assert online.push(exports / "delta-19")["rows"] > 0
        online.push(exports / "delta-20")
        again = online.push(exports / "delta-20")  # a retried push: the same state
        assert online.applied()["name"] == "delta-20" and again["rows"] > 0
        params = read_params(exports / "base")
        for name in ("delta-19", "delta-20"):
            params = apply(params, read_params(exports / name))
        assert_store_holds(client, model, params)
        # the day's base again (a cleared push of the first pass): older than the store's,
        # so a no-op that keeps what the later passes admitted
        stored = online.read_rows("user_id")
        assert online.push(exports / "base") == {"rows": 0, "deleted": 0, "stale": 1}
        assert online.applied()["name"] == "delta-20"
        assert online.read_rows("user_id").keys() == stored.keys()
        # after a store restart, a base replaces the rows whole
        for key in client.scan_iter(match=f"recpipe:{model}:*"):
            client.delete(key)
        online.push(exports / "base")
        base = read_params(exports / "base")
        assert set(online.read_rows("user_id")) == set(base.tables["user_id"].ids.tolist())
    finally:
        for key in client.scan_iter(match=f"recpipe:{model}:*"):
            client.delete(key)


def test_one_train_job_scores_trains_and_exports_a_pass_as_three_jobs_would(chain, tmp_path, capsys):
    """``recpipe train --score_first --export_dir --delta`` (the stream DAG's one-process
    pass): the score it takes before training equals ``recpipe eval`` of the checkpoint it
    fine-tunes from, row by row, and the delta it writes from the model in memory equals
    ``recpipe export`` of the checkpoint it saved."""
    import shutil

    import pyarrow.parquet as pq

    from recpipe.exports.files import read_manifest, read_params
    from recpipe.layout import ModelDir
    from trainer.entry import export_main, train_eval_main
    from trainer.scoring import evaluate

    runs = chain["root"] / "runs"
    config = with_edits(
        chain["config"], {"train_ds": f"{DAY}/20", "train_config.fine_tune_checkpoint": str(runs / "B")}
    )
    config_file = tmp_path / "pipeline.json"
    config_file.write_text(json.dumps(config.to_dict()))
    for name in ("one", "separate"):  # each an export chain up to pass B
        for export in ("base", "delta-19"):
            shutil.copytree(chain["exports"] / export, tmp_path / name / DAY / export)
    model_dir = tmp_path / "C"
    args = ["--pipeline_config_path", str(config_file), "--model_dir", str(model_dir)]
    one_pass = ["--score_first", "pass_eval_result.json", "--export_dir", str(tmp_path / "one")]
    assert train_eval_main([*args, "--skip_eval", *one_pass, "--delta", f"{DAY}/20"]) == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])

    files = ModelDir(model_dir)
    scored = json.loads(files.result("pass_eval_result.json").read_text())
    separate = tmp_path / "p.pq"
    want = evaluate(config, tmp_path / "B-eval", [f"{DAY}/20"], runs / "B", predictions_path=separate)
    assert scored["checkpoint"] == want["checkpoint"] and scored["global_step"] == want["global_step"] > 0
    assert scored["num_examples"] == want["num_examples"] > 50 and scored["auc"] == pytest.approx(want["auc"])
    got = pq.read_table(files.predictions("pass_eval_result.json")).column("probability").to_numpy()
    np.testing.assert_allclose(got, pq.read_table(separate).column("probability").to_numpy(), atol=1e-6)

    assert printed["export"]["export"] == str(tmp_path / "one" / DAY / "delta-20")
    assert export_main([*args, "--export_dir", str(tmp_path / "separate"), "--delta", f"{DAY}/20"]) == 0
    one, separate = tmp_path / "one" / DAY / "delta-20", tmp_path / "separate" / DAY / "delta-20"
    assert read_manifest(one)["tables"] == read_manifest(separate)["tables"]
    got, want = read_params(one), read_params(separate)
    assert _rows(got).keys() == _rows(want).keys()
    for table, rows in _rows(want).items():
        assert _rows(got)[table].keys() == rows.keys(), table
        for key, row in rows.items():
            np.testing.assert_array_equal(_rows(got)[table][key], row)
    for name, value in want.dense.items():
        np.testing.assert_array_equal(got.dense[name], value)


def test_a_client_scores_with_the_stores_rows_as_the_saved_model_does(chain, store):
    """The store's rows (pushed base and deltas) and the SavedModel's dense part, through the
    export's ids and serving_rows signatures (predict.online), give serving_default's scores;
    ids the store lacks are left out of the rows sent and get the zero row, as in training."""
    from predict.online import StoreScorer
    from recpipe.exports.store import EmbeddingStore
    from trainer.mlflow_model import raw_rows

    client, model = store

    online = EmbeddingStore(client, model)
    for name in ("base", "delta-19", "delta-20"):
        online.push(chain["exports"] / name)
    frame = raw_rows(chain["config"], f"{DAY}/21", limit=1000)  # the next, unseen hour
    request = {c: tf.constant(frame[c].to_numpy()) for c in frame.columns}
    expected = tf.saved_model.load(str(chain["full"])).signatures["serving_default"](**request)
    scorer = StoreScorer(chain["full"], client, model)
    wanted, rows = scorer.ids(request), scorer.rows(request)
    assert set(scorer.layout) == set(wanted) and len(wanted) >= 5  # a table per id feature
    held = {t: len(rows[e["ids"]]) for t, e in scorer.layout.items()}
    assert all(0 < held[t] <= len(wanted[t]) for t in wanted)
    assert any(held[t] < len(wanted[t]) for t in wanted)  # unseen ids: no row in the store
    got = scorer.score(request)
    assert set(got) == set(expected)
    np.testing.assert_allclose(got["probability"], expected["probability"].numpy(), atol=1e-6)
    assert got["probability"].std() > 0.01


@pytest.mark.slow
def test_a_resident_trains_the_next_pass_warm_as_a_new_process_would(chain, tmp_path):
    """The stream DAG's one-process pass in a fork server's resident (``RECPIPE_RESIDENT``,
    ``trainer.warm``): pass B, then pass C from B's checkpoint with B's model and traced step,
    ends with the variables of the chain's C (each pass built afresh); a pass that starts from
    a checkpoint other than the one the resident saved builds afresh, with the same result."""
    import subprocess
    import sys

    from recpipe import forkserver
    from recpipe.launch.isolation import job_environment
    from trainer.checkpoints import resolve

    runs = chain["root"] / "runs"
    server = forkserver.start(wait=True, preload=("trainer.preload",))
    env = job_environment({forkserver.ENV: server.path, "RECPIPE_RESIDENT": f"warm-{uuid.uuid4().hex}"})

    def one_pass(name: str, train_ds: str, start: Path) -> tuple[dict, str]:
        edits = {"train_ds": train_ds, "train_config.fine_tune_checkpoint": str(start)}
        config_file = tmp_path / f"{name}.json"
        config_file.write_text(json.dumps(with_edits(chain["config"], edits).to_dict()))
        args = ["--pipeline_config_path", str(config_file), "--model_dir", str(tmp_path / name)]
        args += ["--skip_eval", "--score_first", "pass_eval_result.json"]
        client = [sys.executable, "-m", forkserver.CLIENT, sys.executable, "-m", "trainer.train_eval", *args]
        out = subprocess.run(client, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0 and "not forked" not in out.stderr, out.stderr[-3000:]
        return json.loads(out.stdout.strip().splitlines()[-1]), out.stderr

    def assert_same_checkpoint(got: Path, want: Path) -> None:
        got, want = tf.train.load_checkpoint(resolve(got)), tf.train.load_checkpoint(resolve(want))
        names = want.get_variable_to_shape_map()
        assert got.get_variable_to_shape_map().keys() == names.keys()
        for name in set(names) - {"_CHECKPOINTABLE_OBJECT_GRAPH"}:
            value = want.get_tensor(name)
            if np.asarray(value).dtype.kind == "f":
                np.testing.assert_allclose(got.get_tensor(name), value, atol=1e-6, err_msg=name)
            else:
                np.testing.assert_array_equal(got.get_tensor(name), value, err_msg=name)

    try:
        b, b_log = one_pass("B", f"{DAY}/19", runs / "A")
        c, c_log = one_pass("C", f"{DAY}/20", tmp_path / "B")
        again, again_log = one_pass("C-again", f"{DAY}/20", runs / "B")
    finally:
        server.stop()
    assert "warm trainer" not in b_log  # the resident's first job builds
    assert f"warm trainer: reusing the model and traced step that saved {b['checkpoint']}" in c_log
    refused = f"it starts from {resolve(runs / 'B')}, not {c['checkpoint']}"
    assert f"warm trainer: building afresh ({refused})" in again_log
    assert_same_checkpoint(tmp_path / "B", runs / "B")
    assert_same_checkpoint(tmp_path / "C", runs / "C")
    assert_same_checkpoint(tmp_path / "C-again", runs / "C")
    assert c["loss"] == pytest.approx(again["loss"], abs=1e-6)
    assert c["global_step"] == again["global_step"] > 0
    scored = [json.loads((tmp_path / n / "pass_eval_result.json").read_text()) for n in ("C", "C-again")]
    assert scored[0]["auc"] == pytest.approx(scored[1]["auc"], abs=1e-9)
