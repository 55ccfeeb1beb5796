"""``recpipe config import``: EasyRec's pipeline configs in, recpipe's YAML out, every field
mapped or refused with its dotted path (tests/config/easyrec/ holds configs written for these
tests in EasyRec's format)."""

from __future__ import annotations

import json
import subprocess

import pytest
import yaml

from recpipe.config.easyrec import import_config
from recpipe.config.errors import ConfigError
from tests.support import RECPIPE, ROOT

SAMPLE = ROOT / "tests/config/easyrec/deepfm_criteo.config"


def _imported(text: str) -> dict:
    return import_config(text, "team.config")


def test_a_deepfm_config_maps_field_by_field():
    notes: list[str] = []
    raw = import_config(SAMPLE.read_text(), str(SAMPLE), notes)
    assert raw["model_dir"] == "experiments/deepfm_criteo"
    assert raw["raw_input_path"] == "data/raw/criteo_like/train.tsv"
    data = raw["data_config"]
    assert data["input_format"] == "csv" and data["separator"] == "\t" and data["with_header"] is False
    assert [f["input_name"] for f in data["input_fields"]] == ["label", "i1", "i2", "c1", "c2", "c3"]
    assert data["label_fields"] == ["label"]  # a repeated field given once is a list of one
    assert data["input_fields"][1] == {"input_name": "i1", "input_type": "DOUBLE", "default_val": "0"}
    features = raw["feature_config"]["features"]
    assert features[4] == {
        "input_names": ["c3"],
        "feature_type": "TagFeature",
        "separator": ",",
        "embedding_dim": 8,
        "hash_bucket_size": 1000,
    }
    assert features[3]["num_buckets"] == 10000 and "hash_bucket_size" not in features[3]
    groups = raw["model_config"]["feature_groups"]
    assert groups[0]["feature_names"] == ["c1", "c2", "c3"]  # the [a, b] list form
    assert groups[1]["feature_names"] == ["i1", "i2", "c1", "c2", "c3"]  # the repeated form
    assert raw["model_config"]["deepfm"]["dnn"]["hidden_units"] == [128, 64]
    train = raw["train_config"]
    assert train["sync_replicas"] is True and train["num_steps"] == 400
    assert list(train["optimizer_config"][0]) == ["adam_optimizer"]  # use_moving_average: false taken
    assert raw["eval_config"]["metrics_set"] == [
        {"auc": {}},
        {"gauc": {"uid_field": "c1", "reduction": "mean"}},
    ]
    assert notes == []  # it evaluated on its training file


def _legacy(text: str) -> str:
    """The same config with its features as EasyRec's older top-level ``feature_configs`` list."""
    start = text.index("feature_config: {")
    end = text.index("\nmodel_config")
    block = text[start:end]
    body = block[block.index("{") + 1 : block.rindex("}")]
    return text[:start] + body.replace("  features {", "feature_configs {") + text[end:]


def test_the_json_form_and_the_legacy_feature_configs_list_import_alike():
    text_form = _imported(SAMPLE.read_text())
    as_json = json.loads(json.dumps(text_form))  # recpipe's names are EasyRec's, but two
    as_json["data_config"]["input_type"] = "CSVInput"
    del as_json["data_config"]["input_format"]
    as_json["train_input_path"] = as_json.pop("raw_input_path")
    assert _imported(json.dumps(as_json)) == text_form
    legacy = _legacy(SAMPLE.read_text())
    assert "feature_config:" not in legacy and legacy.count("feature_configs {") == 5
    assert _imported(legacy) == text_form


@pytest.mark.parametrize(
    "edit, named",
    [
        (
            ('input_names: "c1"', 'input_names: "c1" vocab_file: "c1.txt"'),
            "feature_config.features[2].vocab_file",
        ),
        (("input_type: CSVInput", "input_type: OdpsInputV2"), "data_config.input_type: OdpsInputV2"),
        (("use_moving_average: false", "use_moving_average: true"), "use_moving_average"),
        (("eval_config {", "eval_config {\n}\neval_config {"), "eval_config: given 2 times"),
        (("metrics_set: { auc {} }", "metrics_set: { recall_at_topk { topk: 5 } }"), "recall_at_topk"),
        (('model_class: "DeepFM"', 'model_class: "PLE"'), "model_config.model_class"),
    ],
)
def test_a_field_recpipe_cannot_honour_is_refused_by_its_path(edit, named):
    old, new = edit
    text = SAMPLE.read_text()
    assert old in text
    with pytest.raises(ConfigError) as refused:
        _imported(text.replace(old, new, 1))
    assert named in str(refused.value) and str(refused.value).startswith("team.config")


def test_a_separate_evaluation_file_is_written_into_the_header(tmp_path):
    text = SAMPLE.read_text().replace(
        'eval_input_path: "data/raw/criteo_like/train.tsv"',
        'eval_input_path: "data/raw/criteo_like/eval.tsv"',
    )
    (tmp_path / "team.config").write_text(text)
    out = tmp_path / "team.yaml"
    done = subprocess.run(
        [*RECPIPE, "config", "import", str(tmp_path / "team.config"), "--output", str(out)],
        capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    written = out.read_text()
    assert "# EasyRec evaluated on data/raw/criteo_like/eval.tsv" in written
    assert yaml.safe_load(written)["model_dir"] == "experiments/deepfm_criteo"
    # what it wrote is a pipeline config `recpipe config` accepts
    check = subprocess.run([*RECPIPE, "config", str(out)], capture_output=True, text=True, cwd=ROOT)
    assert check.returncode == 0, check.stderr


def test_a_refusal_is_one_line_and_exit_2(tmp_path):
    bad = tmp_path / "team.config"
    bad.write_text(SAMPLE.read_text().replace("input_type: CSVInput", "input_type: KafkaInput"))
    done = subprocess.run([*RECPIPE, "config", "import", str(bad)], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "data_config.input_type: KafkaInput" in done.stderr


def test_the_share_of_a_folder_that_imports_is_counted(tmp_path, capsys):
    from dev.easyrec_share import main

    refused = tmp_path / "refused.config"
    refused.write_text(SAMPLE.read_text().replace('input_names: "c1"', 'input_names: "c1" kv_separator: ":"'))
    (tmp_path / "ok.config").write_text(SAMPLE.read_text())
    (tmp_path / "rtp.config").write_text(SAMPLE.read_text().replace("CSVInput", "RTPInput"))
    assert main([str(tmp_path)]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed == ["1 of 2 import", "1 of 2 build", "    1  feature_config.features[].kv_separator"]
    assert main([str(tmp_path / "none")]) == 2


@pytest.mark.parametrize(
    "features, error",
    [
        ('input_names: "i1" feature_type: RawFeature boundaries: [1.0, 5.0]', None),
        ('input_names: "i1" feature_type: RawFeature boundaries: [5.0, 1.0]', "must ascend"),
        ('input_names: "c1" feature_type: IdFeature boundaries: [1.0]', "RawFeature only"),
        ('input_names: "c1" feature_type: RawFeature num_buckets: 10', "no ids"),
    ],
)
def test_boundaries_and_num_buckets_are_checked_where_they_apply(features, error):
    text = SAMPLE.read_text()
    start = text.index("  features {")
    text = text[:start] + '  features { feature_name: "b" ' + features + " }\n" + text[start:]
    if error is None:
        raw = _imported(text)
        assert raw["feature_config"]["features"][0]["boundaries"] == [1.0, 5.0]
        return
    with pytest.raises(ConfigError, match=error):
        _imported(text)


def _scores(raw: dict):
    """The imported config's model built and run on a sample batch: its logits."""
    from recpipe.config.pipeline import PipelineConfig
    from trainer.input import sample_inputs
    from trainer.models.builders import build_model

    config = PipelineConfig.model_validate(raw)
    model = build_model(config)
    return model, model(sample_inputs(config))


def test_a_dbmtl_config_with_a_cross_and_attended_histories_imports_and_builds():
    notes: list[str] = []
    raw = import_config((ROOT / "tests/config/easyrec/dbmtl_shop.config").read_text(), "shop.config", notes)
    fields = [f["input_name"] for f in raw["data_config"]["input_fields"]]
    assert fields[-2:] == ["score1", "score2"]  # auto_expand_input_fields: score[1-2]
    group = raw["model_config"]["feature_groups"][0]
    assert group["feature_names"][-2:] == ["score1", "score2"]
    combo = raw["feature_config"]["features"][2]
    assert combo["feature_type"] == "ComboFeature" and combo["input_names"] == ["user_id", "site_id"]
    att = group["sequence_features"][0]
    assert att["seq_att_map"][0] == {"key": ["brand", "cate_id"], "hist_seq": ["hist_brand", "hist_cate"]}
    assert "tf_summary" not in att
    assert raw["eval_config"]["metrics_set"] == [{"auc": {}}]
    assert any("num_thresholds" in n for n in notes) and any("eval_online" in n for n in notes)
    assert any(n.startswith("data_config.file_shard: True dropped") for n in notes)
    model, logits = _scores(raw)
    assert logits.shape[1] == 2 and model.attention is not None
    assert model.embedding.tables["user_site"].rows == 100000


def test_easyrecs_dcn_towers_and_f1_loss_are_spelled_as_recpipes():
    notes: list[str] = []
    raw = import_config((ROOT / "tests/config/easyrec/dcn_criteo.config").read_text(), "dcn.config", notes)
    dcn = raw["model_config"]["dcn"]
    assert dcn == {
        "deep_tower": {"hidden_units": [64, 32]},
        "cross_num": 4,
        "final_dnn": {"hidden_units": [16]},
    }
    assert raw["model_config"]["losses"][1] == {
        "loss_type": "F1_REWEIGHTED_LOSS",
        "weight": 0.5,
        "f1_beta_square": 2.25,
    }
    assert any("DCN-v2" in n for n in notes)
    model, logits = _scores(raw)
    assert logits.shape.rank == 1 and len(model.tower.cross) == 4
    two = (
        (ROOT / "tests/config/easyrec/dcn_criteo.config")
        .read_text()
        .replace('cross_tower { input: "all"', 'cross_tower { input: "other"')
    )
    with pytest.raises(ConfigError, match="model_config.dcn: the cross and deep towers read"):
        _imported(two)


def test_a_value_given_twice_counts_once_its_last_as_protobufs_merge_reads_it():
    text = SAMPLE.read_text().replace("num_steps: 400", "num_steps: 400\n  num_steps: 500", 1)
    assert _imported(text)["train_config"]["num_steps"] == 500



def test_shared_names_and_a_sample_weight_import_as_easyrec_builds_them():
    text = SAMPLE.read_text()
    text = text.replace(
        'input_fields { input_name: "c3" input_type: STRING }',
        'input_fields { input_name: "c3" input_type: STRING }\n'
        '  input_fields { input_name: "c4" input_type: STRING }\n'
        '  input_fields { input_name: "w" input_type: FLOAT }\n  sample_weight: "w"',
    )
    text = text.replace(
        'features { input_names: "c1" feature_type: IdFeature',
        'features { input_names: "c1" shared_names: "c4" feature_type: IdFeature',
    )
    text = text.replace('feature_names: "c2"\n', 'feature_names: "c2"\n    feature_names: "c4"\n')
    raw = _imported(text)
    c1, c4 = (f for f in raw["feature_config"]["features"] if f["input_names"][0] in ("c1", "c4"))
    assert c1["embedding_name"] == c4["embedding_name"] == "c1" and c4["feature_name"] == "c4"
    assert c4["hash_bucket_size"] == c1["hash_bucket_size"] == 100000
    assert raw["data_config"]["sample_weight"] == "w"


def test_config_import_writes_only_a_new_file_or_its_own_earlier_import(tmp_path):
    """``--output`` may not overwrite a file it did not write (a pipeline config of ``conf/``, the
    input itself), nor create directories: each is exit 2 in one line, the file unchanged; its
    own earlier import of the same file is replaced."""
    source = tmp_path / "team.config"
    source.write_text(SAMPLE.read_text())
    ours = tmp_path / "team.yaml"
    shipped = ROOT / "conf" / "movielens_deepfm.yaml"
    before = shipped.read_bytes()

    def run(output) -> subprocess.CompletedProcess:
        argv = [*RECPIPE, "config", "import", str(source), "--output", str(output)]
        return subprocess.run(argv, capture_output=True, text=True, cwd=ROOT)

    for target, why in (
        (shipped, "is not this command's import"),
        (source, "the file being imported"),
        (tmp_path / "new" / "dir" / "team.yaml", "does not exist"),
        (tmp_path, "not a file"),
    ):
        done = run(target)
        assert done.returncode == 2 and why in done.stderr, (target, done.stderr)
        assert done.stderr.count("\n") == 1, done.stderr
    assert shipped.read_bytes() == before and not (tmp_path / "new").exists()
    assert source.read_text() == SAMPLE.read_text()
    for _ in range(2):  # new, then its own earlier output
        done = run(ours)
        assert done.returncode == 0, done.stderr
