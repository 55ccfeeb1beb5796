"""The pipeline config: shipped files, EasyRec overrides, and every error path."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from recpipe.config import (
    ConfigError,
    apply_edits,
    load_cluster_config,
    load_pipeline_config,
    parse_edit_config_json,
    parse_extend_args,
)
from recpipe.config.retrain import load_retrain_config
from recpipe.config.train import TrainDistribute
from recpipe.paths import confine_config
from tests.support import ROOT

ML = ROOT / "conf/movielens_deepfm.yaml"


@pytest.mark.parametrize("path", sorted((ROOT / "conf").glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_configs_load(path):
    config = load_pipeline_config(path)
    assert config.train_config.log_step_count_steps > 0
    assert config.model is not None and config.model.feature_groups


@pytest.mark.parametrize("path", sorted((ROOT / "conf/retrain").glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_retrain_configs_load_with_their_pipeline_edits(path):
    retrain = load_retrain_config(path)
    config = load_pipeline_config(ROOT / retrain.pipeline_config_path, retrain.edit_config_json)
    assert (ROOT / retrain.cluster_config_path).is_file()
    confine_config(config.resolved(ROOT))  # the DAGs' jobs refuse paths outside conf/, data/, var/
    if retrain.gate.window_days <= retrain.training_window_days:
        # the gate's days are training days: it scores their held-out rows
        assert config.data_config.holdout_percent > 0


@pytest.mark.parametrize("path", sorted((ROOT / "conf/cluster").glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_cluster_configs_load(path):
    cluster = load_cluster_config(path)
    assert cluster.launcher in ("local", "kubernetes") and cluster.worker.count >= 1


def test_easyrec_defaults():
    config = load_pipeline_config(ROOT / "conf/avazu_deepfm.yaml")
    tc = config.train_config
    assert (tc.log_step_count_steps, tc.save_checkpoints_steps, tc.keep_checkpoint_max) == (10, 1000, 10)
    assert tc.save_summary_steps == 1000 and tc.train_distribute == TrainDistribute.NoStrategy
    assert tc.optimizer_config[0].which() == "adam_optimizer"
    assert config.eval_config.eval_method.value == "none"


def test_both_override_forms():
    edits = parse_edit_config_json('{"train_config.num_steps": 500, "data_config.batch_size": 64}')
    edits |= parse_extend_args(["--train_config.train_distribute=HorovodStrategy", "--model_dir=/tmp/m"])
    config = load_pipeline_config(ML, edits)
    assert config.train_config.num_steps == 500 and config.data_config.batch_size == 64
    assert config.train_config.train_distribute == TrainDistribute.HorovodStrategy
    assert config.model_dir == "/tmp/m"


def test_override_list_selectors():
    edits = {
        "feature_config.features[input_names[0]=item_id].embedding_dim": 8,
        "feature_config.features[0].hash_bucket_size": 77,
        "model_config.deepfm.dnn.hidden_units": [16, 8],
        "train_config.optimizer_config[0].adam_optimizer.learning_rate"
        ".exponential_decay_learning_rate.initial_learning_rate": 0.5,
    }
    config = load_pipeline_config(ML, edits)
    by_name = {f.name: f for f in config.feature_config.features}
    assert by_name["item_id"].embedding_dim == 8 and by_name["user_id"].hash_bucket_size == 77
    assert config.model.deepfm.dnn.hidden_units == [16, 8]
    lr = config.train_config.optimizer_config[0].value().learning_rate.value()
    assert lr.initial_learning_rate == 0.5


def test_extend_args_parse_yaml_scalars():
    edits = parse_extend_args(
        ["--train_config.sync_replicas=true", "--data_config.num_epochs=3", "--eval_ds=2024-01-02"]
    )
    assert edits == {"train_config.sync_replicas": True, "data_config.num_epochs": 3, "eval_ds": "2024-01-02"}


def test_apply_edits_creates_missing_sections():
    assert apply_edits({}, {"eval_config.eval_method": "master"}) == {
        "eval_config": {"eval_method": "master"}
    }


@pytest.mark.parametrize(
    "edits, message",
    [
        ({"train_config.num_stepz": 5}, "train_config.num_stepz: Extra inputs are not permitted"),
        ({"train_config.num_steps": "many"}, "train_config.num_steps: Input should be a valid integer"),
        (
            {"train_config.save_checkpoints_secs": 60},
            "save_checkpoints_steps and save_checkpoints_secs are both set",
        ),
        ({"train_config.train_distribute": "Magic"}, "train_config.train_distribute: Input should be"),
        (
            {"train_config.sync_replicas": True, "train_config.train_distribute": "PSStrategy"},
            "sync_replicas",
        ),
        (
            {"train_config.sync_mode": "geo", "train_config.train_distribute": "MirroredStrategy"},
            "sync_mode: geo is a parameter-server mode; train_distribute: MirroredStrategy has no",
        ),
        (
            {"train_config.sync_mode": "geo", "train_config.sync_replicas": True},
            "sync_mode: geo contradicts sync_replicas: true",
        ),
        ({"train_config.sync_mode": "gossip"}, "train_config.sync_mode: Input should be"),
        ({"train_config.geo_step": 0}, "train_config.geo_step: Input should be greater than 0"),
        ({"train_config.optimizer_config": [{}]}, "train_config.optimizer_config[0]: set exactly one of"),
        (
            {"train_config.optimizer_config": [{"adam_optimizer": {}, "sgd_optimizer": {}}]},
            "set exactly one of",
        ),
        ({"feature_config.features[0].embedding_dim": 0}, "feature_config.features[0].embedding_dim"),
        ({"feature_config.features[0].input_names": ["nope"]}, "'nope' is not a column"),
        ({"data_config.label_fields": ["clicked"]}, "label_fields ['clicked'] are not among input_fields"),
        ({"model_config.feature_groups[0].feature_names": ["ghost"]}, "unknown features ['ghost']"),
        (
            {"eval_config.metrics_set": [{"auc": {}, "gauc": {"uid_field": "u"}}]},
            "eval_config.metrics_set[0]",
        ),
        ({"feature_config.features[0].combiner": "max"}, "feature_config.features[0].combiner"),
        (
            {"feature_config.features[0].ev_params": {"filter_freq": 2, "use_cache": True}},
            "feature_config.features[0].ev_params.use_cache: Extra inputs",
        ),
        ({"model_config.ev_params": {"max_capacity": 0}}, "model_config.ev_params.max_capacity"),
        (
            {"feature_config.features[input_names=age].ev_params": {}},
            "ev_params: RawFeature 'age' has no table",
        ),
        (
            {"eval_config.metrics_set": [{"auc": {"num_thresholds": 1000}}]},
            "eval_config.metrics_set[0].auc.num_thresholds: recpipe computes the exact AUC",
        ),
    ],
)
def test_invalid_values_name_file_and_field(edits, message):
    with pytest.raises(ConfigError) as err:
        load_pipeline_config(ML, edits)
    assert "movielens_deepfm.yaml" in str(err.value)
    assert message in str(err.value)


def test_unknown_key_in_file_is_an_error(tmp_path):
    raw = yaml.safe_load(ML.read_text())
    raw["train_config"]["num_step"] = 10
    path = tmp_path / "typo.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match=r"typo\.yaml: train_config\.num_step: Extra inputs"):
        load_pipeline_config(path)


def test_model_ev_params_default_every_id_and_tag_feature_without_their_own():
    config = load_pipeline_config(
        ML,
        {
            "model_config.ev_params": {"filter_freq": 2},
            "feature_config.features[input_names=item_id].ev_params": {"filter_freq": 5},
        },
    )
    params = {f.name: f.ev_params for f in config.feature_config.features}
    assert params["user_id"].filter_freq == 2 and params["genres"].filter_freq == 2
    assert params["item_id"].filter_freq == 5 and params["age"] is None
    assert params["user_id"].max_capacity == 1 << 20
    feature = config.feature_config.feature("user_id")
    assert feature.id_buckets is None and feature.hash_bucket_size == 50000  # the full fingerprint


def test_id_feature_on_float_column_is_rejected():
    with pytest.raises(ConfigError, match="IdFeature 'rating' needs a STRING or integer column"):
        load_pipeline_config(ML, {"feature_config.features[0].input_names": ["rating"]})


@pytest.mark.parametrize(
    "text, message",
    [(None, "no such config file"), ("a: [1", "not valid YAML"), ("- 1\n- 2\n", "expected a mapping")],
)
def test_unreadable_files(tmp_path, text, message):
    path = tmp_path / "c.yaml"
    if text is not None:
        path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_pipeline_config(path)


@pytest.mark.parametrize(
    "fn, arg, message",
    [
        (parse_edit_config_json, "{not json", "not valid JSON"),
        (parse_edit_config_json, "[1, 2]", "expected a JSON object"),
        (parse_extend_args, ["--num_steps"], "expected --section.field=value"),
        (parse_extend_args, ["--trian_config.num_steps=1"], "'trian_config' is not a config section"),
    ],
)
def test_bad_override_syntax(fn, arg, message):
    with pytest.raises(ConfigError, match=message):
        fn(arg)


@pytest.mark.parametrize(
    "path, message",
    [
        ("feature_config.features[99].embedding_dim", r"index \[99\] out of range"),
        ("feature_config.features[input_names=ghost].embedding_dim", "no element with input_names=ghost"),
        ("model_dir.x", "'x' is not a section"),
    ],
)
def test_bad_override_paths(path, message):
    with pytest.raises(ConfigError, match=message):
        load_pipeline_config(ML, {path: 1})


def test_cluster_errors_name_file_and_field(tmp_path):
    path = tmp_path / "cluster.yaml"
    path.write_text("launcher: local\nworker: {count: 0}\nps: {memory: lots}\n")
    with pytest.raises(ConfigError) as err:
        load_cluster_config(path)
    text = str(err.value)
    assert "cluster.yaml" in text and "worker: at least one worker" in text
    assert "ps.memory: 'lots' is not a memory quantity" in text


def test_cli_prints_effective_config_and_fails_clearly():
    recpipe = [sys.executable, "-m", "cli", "config", "--pipeline_config_path", str(ML)]
    ok = subprocess.run([*recpipe, "--train_config.num_steps=7"], capture_output=True, text=True, cwd=ROOT)
    assert ok.returncode == 0, ok.stderr
    assert yaml.safe_load(ok.stdout)["train_config"]["num_steps"] == 7
    bad = subprocess.run([*recpipe, "--train_config.num_steps=-1"], capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 2
    assert "train_config.num_steps: Input should be greater than 0" in bad.stderr


def test_cli_checks_retrain_and_cluster_configs_by_their_fields(tmp_path):
    recpipe = [sys.executable, "-m", "cli", "config"]
    cluster = subprocess.run([*recpipe, "conf/cluster/local.yaml"], capture_output=True, text=True, cwd=ROOT)
    assert cluster.returncode == 0, cluster.stderr
    assert yaml.safe_load(cluster.stdout)["launcher"] == "local"
    # a retrain config: itself, the pipeline config it names with its edits, its cluster config
    retrain = subprocess.run(
        [*recpipe, "conf/retrain/movielens_daily.yaml"], capture_output=True, text=True, cwd=ROOT
    )
    assert retrain.returncode == 0, retrain.stderr
    docs = retrain.stdout.split("# ")[1:]
    assert [d.split()[0] for d in docs] == ["retrain", "pipeline", "cluster"]
    assert yaml.safe_load(docs[1].split("\n", 1)[1])["data_config"]["batch_size"] == 64
    # a retrain config whose pipeline config's edits are wrong fails naming the field
    broken = tmp_path / "retrain.yaml"
    raw = yaml.safe_load((ROOT / "conf/retrain/movielens_daily.yaml").read_text())
    raw["edit_config_json"]["data_config.batch_size"] = 0
    broken.write_text(yaml.safe_dump(raw))
    bad = subprocess.run([*recpipe, str(broken)], capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 2 and "data_config.batch_size" in bad.stderr, bad.stderr
    # neither kind: the message asks for --kind
    odd = tmp_path / "odd.yaml"
    odd.write_text("something: 1\n")
    unknown = subprocess.run([*recpipe, str(odd)], capture_output=True, text=True, cwd=ROOT)
    assert unknown.returncode == 2 and "give --kind" in unknown.stderr


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("1997-13-45:1997-01-01", "month must be in 1..12"),
        ("1997-02-30", "day is out of range for month"),
        ("1997-03-05:1997-01-01", "end before start"),
        ("1997-02-03/25", "the pass after '/' must be HH (00..23) or HHMM"),
        ("yesterday", "'yesterday' is not a date YYYY-MM-DD; expected YYYY-MM-DD (a day)"),
    ],
)
def test_impossible_days_and_reversed_ranges_name_the_field(value, why):
    with pytest.raises(ConfigError) as err:
        load_pipeline_config(ML, parse_extend_args([f"--train_ds={value}"]))
    assert f"train_ds: '{value}'" in str(err.value) and why in str(err.value)


def test_a_streams_pass_length_sets_its_schedule_and_close():
    from datetime import datetime

    from operators.stream import closes_day
    from recpipe.config.retrain import RetrainConfig

    raw = yaml.safe_load((ROOT / "conf/retrain/movielens_stream.yaml").read_text())
    assert RetrainConfig(**raw).effective_schedule == "@hourly"
    raw["stream"]["pass_minutes"] = 15
    assert RetrainConfig(**raw).effective_schedule == "*/15 * * * *"
    for schedule, why in (("@hourly", "need a cron expression"), ("*/10 * * * *", "fires at 00:10")):
        with pytest.raises(ValueError, match=why):
            RetrainConfig(**{**raw, "schedule": schedule})
    with pytest.raises(ValueError, match="a pass lasts one of"):
        RetrainConfig(**{**raw, "stream": {**raw["stream"], "pass_minutes": 7}})
    # the last pass of close_hour closes the day, whatever the passes' length
    at = [datetime(1997, 9, 22, 23, m) for m in (0, 15, 30, 45)]
    assert [closes_day(t, 23, 15) for t in at] == [False, False, False, True]
    assert closes_day(at[0], 23) and not closes_day(datetime(1997, 9, 22, 22), 23)


def test_the_best_exporter_and_early_stopping_need_evaluation_while_training():
    for edits, field in (
        ({"export_config.exporter_type": "best"}, "export_config.exporter_type: best"),
        ({"export_config.enable_early_stop": True}, "export_config.enable_early_stop: true"),
    ):
        with pytest.raises(ConfigError) as err:
            load_pipeline_config(ML, edits)
        assert field in str(err.value) and "eval_config.eval_method" in str(err.value), str(err.value)
        load_pipeline_config(ML, {**edits, "eval_config.eval_method": "separate"})
    with pytest.raises(ConfigError, match="export_config.exporter_type"):
        load_pipeline_config(ML, {"export_config.exporter_type": "latest"})
    assert load_pipeline_config(ML, {"export_config.exports_to_keep": 3}).export_config.exports_to_keep == 3


def test_a_folder_of_retrain_configs_loads_each_alone(tmp_path, monkeypatch):
    # a broken file is an error of its own; two claims to one dag_id fail both, whatever their
    # names' order, each naming the other; the rest load
    from recpipe.config.retrain import RETRAIN_CONFIGS_VARIABLE, load_retrain_configs

    shipped = (ROOT / "conf/retrain/movielens_daily.yaml").read_text()
    (tmp_path / "a.yaml").write_text(shipped)
    (tmp_path / "b.yaml").write_text(shipped)  # the same dag_id
    (tmp_path / "c.yaml").write_text(shipped.replace("retention_days: 7", "retention_days: -1"))
    (tmp_path / "notes.txt").write_text("not a config")
    (tmp_path / "d.yaml").write_text(
        shipped.replace("dag_id: recpipe_daily_retrain", "dag_id: other").replace(
            "model_name: movielens_deepfm", "model_name: other"
        )
    )
    monkeypatch.setenv(RETRAIN_CONFIGS_VARIABLE, str(tmp_path))
    loaded, broken = load_retrain_configs(ROOT)
    assert list(loaded) == [tmp_path / "d.yaml"]
    assert sorted(broken) == [tmp_path / "a.yaml", tmp_path / "b.yaml", tmp_path / "c.yaml"]
    for mine, other in (("a", "b"), ("b", "a")):
        twice = broken[tmp_path / f"{mine}.yaml"]
        assert "'recpipe_daily_retrain'" in twice and f"{other}.yaml" in twice, twice
    assert "retention_days" in broken[tmp_path / "c.yaml"]


# fields no code reads by name: refused when set (a validator says why), a oneof's options
# (read through OneOf.which / value), or an alias
REFUSED = {
    "num_thresholds",
    "num_class",
}  # num_class: 1 only
BY_ONEOF = {"exponential_decay_learning_rate", "constant_learning_rate", "model_config"}


def test_every_accepted_field_is_read_or_refused():
    # by name, over the code that consumes configs (a field some class reads elsewhere counts):
    # `.name`, "name" or getattr(..., "name") outside the line that declares it
    import re

    from recpipe.config.reference import ROOTS, rows

    code = []
    for folder in ("trainer", "features", "operators", "recpipe", "dags"):
        for path in (ROOT / folder).rglob("*.py"):
            if path.name != "reference.py":
                code += [line for line in path.read_text().splitlines() if not re.match(r"\s+\w+: .*=", line)]
    text = "\n".join(code)
    names = {row.path.rsplit(".", 1)[-1] for model in ROOTS.values() for row in rows(model)}
    unread = sorted(n for n in names - REFUSED - BY_ONEOF if not re.search(rf"\.{n}\b|[\"']{n}[\"']", text))
    assert unread == []
    # the refused ones are refused
    for edits in (
        {"export_config.exporter_type": "best"},
        {"eval_config.metrics_set": [{"auc": {"num_thresholds": 100}}]},
        {
            "model_config.model_class": "MMoE",
            "model_config.mmoe": {"task_towers": [{"tower_name": "a", "num_class": 2}]},
        },
    ):
        with pytest.raises(ConfigError):
            load_pipeline_config(ML, edits)


@pytest.mark.parametrize(
    ("path", "ok"),
    [("data/scores/m/ds={{ ds }}", True), ("data/scores/{{ds_nodash}}", True), ("data/scores/m", False),
     ("data/scores/{{ ts }}", False)],
)  # fmt: skip
def test_batch_predicts_output_is_a_days_own_directory(path, ok):
    from pydantic import ValidationError

    from recpipe.config.retrain import BatchPredictConfig

    if ok:
        assert BatchPredictConfig(input_path="data/c/ds={{ ds }}", output_path=path).output_path == path
        return
    with pytest.raises(ValidationError, match=r"must hold \{\{ ds \}\} or \{\{ ds_nodash \}\}"):
        BatchPredictConfig(input_path="data/c/ds={{ ds }}", output_path=path)
