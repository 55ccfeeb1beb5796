"""Export: the reloaded SavedModel scores raw rows like the in-process model scores features."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import tensorflow as tf

from recpipe.layout import finished_partitions, parse_ds_range
from tests.support import EARLY, with_edits
from trainer.input import FeatureReader
from trainer.loop import Trainer, TrainJob
from trainer.scoring import load_model
from trainer.serving import export_saved_model, find_export

LAST = EARLY[1]


def _raw_requests(config, day: str = LAST) -> dict[str, np.ndarray]:
    """``day``'s raw events (default: the last training day's) joined with the dimension
    snapshots, as a client would send them: raw strings and floats, NaN where a value is
    missing."""
    raw = Path(config.raw_input_path)
    strings = pacsv.ConvertOptions(
        column_types={"user_id": "string", "item_id": "string", "zip_code": "string"}
    )
    events = pacsv.read_csv(raw / f"ds={day}" / "part-00000.csv", convert_options=strings).to_pandas()
    users = pacsv.read_csv(raw / "../dims/users.csv", convert_options=strings).to_pandas()
    items = pacsv.read_csv(raw / "../dims/items.csv", convert_options=strings).to_pandas()
    rows = events.merge(users, on="user_id", how="left").merge(items, on="item_id", how="left")
    out = {
        c: rows[c].astype(str).to_numpy(dtype=object)
        for c in ("user_id", "item_id", "gender", "occupation", "zip_code")
    }
    out["genres"] = rows["genres"].fillna("").to_numpy(dtype=object)
    out["age"] = rows["age"].astype(float).to_numpy()
    out["release_year"] = rows["release_year"].astype(float).to_numpy()
    return out


def test_saved_model_reproduces_the_model_on_raw_values(ml_early, tmp_path, monkeypatch):
    config = with_edits(ml_early, {"train_config.num_steps": 60})
    days = parse_ds_range(":".join(EARLY))
    Trainer(TrainJob(config=config, model_dir=tmp_path / "m", train_days=days)).train()
    model, step = load_model(config, tmp_path / "m")
    final = export_saved_model(config, model, tmp_path / "m", tmp_path / "exports")
    assert final.parent == tmp_path / "exports" and final.name.isdigit()
    assert (final / "saved_model.pb").exists() and [p.name for p in final.parent.iterdir()] == [final.name]
    # the signatures and the variables only: no Keras layer saved with its traced calls (the
    # traces took most of an export's time)
    from tensorflow.core.protobuf import saved_model_pb2

    saved = saved_model_pb2.SavedModel.FromString((final / "saved_model.pb").read_bytes())
    graph = saved.meta_graphs[0].object_graph_def
    kinds = {n.user_object.identifier for n in graph.nodes if n.WhichOneof("kind") == "user_object"}
    assert not any(k.startswith("_tf_keras") for k in kinds), kinds
    assert len(graph.concrete_functions) <= 4, list(graph.concrete_functions)

    reader = FeatureReader(
        config, finished_partitions(config.train_input_path, [LAST]), shuffle=False, batch_size=10**6
    )
    features, _ = reader.structure(next(reader.batches()))
    expected = tf.sigmoid(model(features)).numpy()
    assert (
        pq.ParquetFile(
            next((Path(config.train_input_path) / f"ds={LAST}").glob("*.parquet"))
        ).metadata.num_rows
        == expected.size
    )

    served = tf.saved_model.load(str(final)).signatures["serving_default"]
    request = _raw_requests(config)
    got = served(**{k: tf.constant(v) for k, v in request.items()})
    np.testing.assert_allclose(got["probability"].numpy(), expected, rtol=0, atol=1e-5)
    np.testing.assert_allclose(tf.sigmoid(got["logit"]).numpy(), got["probability"].numpy(), atol=1e-6)
    assert set(served.structured_input_signature[1]) == set(request)
    assert served.structured_input_signature[1]["age"].dtype == tf.float64

    # a second export in the same second (an export retried, or another run's) gets its own
    # version; both load; a retry of this model dir at this step finds the newest of them
    import trainer.serving

    second = final.parent / str(int(final.name) + 1)
    monkeypatch.setattr(trainer.serving.time, "time", lambda: float(final.name))
    again = export_saved_model(config, model, tmp_path / "m", tmp_path / "exports", step)
    assert again == second and (final / "saved_model.pb").exists()
    for version in (final, again):
        assert "serving_default" in tf.saved_model.load(str(version)).signatures
    assert find_export(tmp_path / "exports", tmp_path / "m", step) == again
    assert find_export(tmp_path / "exports", tmp_path / "m", step + 1) is None

    # the same SavedModel as an MLflow Model: pyfunc answers with its probabilities on real
    # raw rows (the input example: the last training day's first rows, joined as Spark joins)
    import mlflow.pyfunc

    from trainer.mlflow_model import raw_rows, save_mlflow_model

    saved = save_mlflow_model(
        with_edits(config, {"train_ds": ":".join(EARLY)}), final, tmp_path / "mlm", LAST
    )
    assert (saved / "MLmodel").exists() and (saved / "input_example.json").exists()
    pyfunc = mlflow.pyfunc.load_model(str(saved))
    inputs = pyfunc.metadata.get_input_schema().input_names()
    assert set(inputs) == set(request)  # the SavedModel's raw columns
    rows = raw_rows(config, LAST, limit=50)
    assert len(rows) == 50 and list(rows.columns) == inputs
    got = pyfunc.predict(rows)
    direct = served(
        **{
            k: tf.constant(rows[k].to_numpy(), dtype=spec.dtype)
            for k, spec in served.structured_input_signature[1].items()
        }
    )
    np.testing.assert_allclose(got["probability"].to_numpy(), direct["probability"].numpy(), rtol=1e-6)


def test_num_buckets_features_train_and_serve_the_same_ids(ml_early, tmp_path):
    """Identity tables (EasyRec's ``num_buckets``) for the user and item ids: the table has
    ``num_buckets`` rows and the SavedModel maps raw ids to them as the reader does."""
    from tests.trainer.test_input import _identity

    identity = _identity(ml_early, {"user_id": 1000, "item_id": 1700})
    config = with_edits(identity, {"train_config.num_steps": 30})
    days = parse_ds_range(":".join(EARLY))
    Trainer(TrainJob(config=config, model_dir=tmp_path / "m", train_days=days)).train()
    model, _ = load_model(config, tmp_path / "m")
    assert model.embedding.tables["user_id"].rows == 1000
    final = export_saved_model(config, model, tmp_path / "m", tmp_path / "exports")
    reader = FeatureReader(
        config, finished_partitions(config.train_input_path, [LAST]), shuffle=False, batch_size=10**6
    )
    features, _ = reader.structure(next(reader.batches()))
    served = tf.saved_model.load(str(final)).signatures["serving_default"]
    got = served(**{k: tf.constant(v) for k, v in _raw_requests(config).items()})
    np.testing.assert_allclose(got["probability"].numpy(), tf.sigmoid(model(features)).numpy(), atol=1e-5)


def test_boundaries_bucketize_a_raw_feature_into_an_embedding(spark, movielens_raw, ml_early, tmp_path):
    """EasyRec's ``boundaries``: the user's age becomes one of 7 rows of an embedding table;
    the reader's buckets and the SavedModel's (from raw ages) agree, so the served scores
    equal the model's."""
    from tests.trainer.conftest import _days, _prepare

    age = "feature_config.features[input_names=age]"
    config = with_edits(
        ml_early,
        {
            f"{age}.normalizer": "none",
            f"{age}.boundaries": [18, 25, 35, 45, 50, 56],
            "train_input_path": str(tmp_path / "features"),
            "train_config.num_steps": 30,
        },
    )
    _prepare(spark, config, _days(movielens_raw / "events", *EARLY))
    reader = FeatureReader(
        config, finished_partitions(config.train_input_path, [LAST]), shuffle=False, batch_size=10**6
    )
    features, _ = reader.structure(next(reader.batches()))
    ages = _raw_requests(config)["age"]
    assert features["age"].dtype == tf.int64
    np.testing.assert_array_equal(
        features["age"].numpy(), np.searchsorted([18, 25, 35, 45, 50, 56], ages, "right")
    )
    days = parse_ds_range(":".join(EARLY))
    Trainer(TrainJob(config=config, model_dir=tmp_path / "m", train_days=days)).train()
    model, _ = load_model(config, tmp_path / "m")
    assert model.embedding.tables["age"].rows == 7 and model.dense_names == ["release_year"]
    final = export_saved_model(config, model, tmp_path / "m", tmp_path / "exports")
    served = tf.saved_model.load(str(final)).signatures["serving_default"]
    got = served(**{k: tf.constant(v) for k, v in _raw_requests(config).items()})
    np.testing.assert_allclose(got["probability"].numpy(), tf.sigmoid(model(features)).numpy(), atol=1e-5)


def test_a_combo_feature_crosses_its_inputs_alike_in_the_job_and_the_saved_model(
    spark, movielens_raw, ml_early, tmp_path
):
    """EasyRec's ``ComboFeature``: gender x occupation as one hashed id; the job writes
    ``<gender>_<occupation>`` (empty when either is missing), and the SavedModel, given the
    raw columns, scores as the model does on the job's features. The model also learns a
    dropout rate per feature (``variational_dropout``): training moves them, serving scales
    by ``1 - p`` as the model does."""
    from tests.trainer.conftest import _days, _prepare

    combo = {
        "input_names": ["gender", "occupation"],
        "feature_name": "gender_occupation",
        "feature_type": "ComboFeature",
        "embedding_dim": 16,
        "hash_bucket_size": 1000,
    }
    groups = [g.model_dump(exclude_defaults=True) for g in ml_early.model.feature_groups]
    groups[1]["feature_names"].append("gender_occupation")
    features = [f.model_dump(exclude_defaults=True) for f in ml_early.feature_config.features]
    config = with_edits(
        ml_early,
        {
            "feature_config.features": [*features, combo],
            "model_config.feature_groups": groups,
            "model_config.variational_dropout": {"regularization_lambda": 0.01},
            "train_input_path": str(tmp_path / "features"),
            "train_config.num_steps": 30,
        },
    )
    _prepare(spark, config, _days(movielens_raw / "events", *EARLY))
    written = pq.read_table(
        next((Path(config.train_input_path) / f"ds={LAST}").glob("*.parquet")),
        columns=["gender_occupation"],
    ).column(0)
    raw = _raw_requests(config)
    crossed = [f"{g}_{o}" for g, o in zip(raw["gender"], raw["occupation"], strict=True)]
    assert Counter(written.to_pylist()) == Counter(crossed)
    days = parse_ds_range(":".join(EARLY))
    Trainer(TrainJob(config=config, model_dir=tmp_path / "m", train_days=days)).train()
    model, _ = load_model(config, tmp_path / "m")
    assert model.embedding.tables["gender_occupation"].rows == 1000
    rates = model.feature_dropout.dropout_rates().numpy()
    assert rates.shape == (7 + 2,) and np.all(rates != 0.5)  # 7 embedded, 2 raw; trained
    reader = FeatureReader(
        config, finished_partitions(config.train_input_path, [LAST]), shuffle=False, batch_size=10**6
    )
    features, _ = reader.structure(next(reader.batches()))
    final = export_saved_model(config, model, tmp_path / "m", tmp_path / "exports")
    served = tf.saved_model.load(str(final)).signatures["serving_default"]
    got = served(**{k: tf.constant(v) for k, v in raw.items()})
    np.testing.assert_allclose(got["probability"].numpy(), tf.sigmoid(model(features)).numpy(), atol=1e-5)


def test_asset_files_go_into_the_saved_models_assets_extra(ml_early, tmp_path, monkeypatch):
    import pytest

    from trainer.input import sample_inputs
    from trainer.models.builders import build_model
    from trainer.serving import write_saved_model

    monkeypatch.chdir(tmp_path)
    (tmp_path / "fg.json").write_text('{"features": []}')
    config = with_edits(ml_early, {"export_config.asset_files": ["fg.json"]})
    model = build_model(config)
    model(sample_inputs(config))
    write_saved_model(config, model, {}, tmp_path / "v1")
    assert (tmp_path / "v1/assets.extra/fg.json").read_text() == '{"features": []}'
    missing = with_edits(ml_early, {"export_config.asset_files": ["gone/vocab.txt"]})
    with pytest.raises(FileNotFoundError, match="export_config.asset_files: gone/vocab.txt is not a file"):
        write_saved_model(missing, model, {}, tmp_path / "v2")
    with pytest.raises(Exception, match="recpipe's records in assets.extra"):
        with_edits(ml_early, {"export_config.asset_files": ["conf/pipeline.json"]})
