"""recpipe's reader of protobuf's text format (EasyRec's ``*.config``), on text written the
ways the format allows; errors name the file, line and column."""

from __future__ import annotations

import math

import pytest

from recpipe.config.errors import ConfigError
from recpipe.config.textformat import Identifier, parse

SAMPLE = r"""
# an EasyRec-style pipeline config, in the forms text format allows
train_input_path: "data/train.csv"
eval_input_path: 'data/eval' "/part-*.csv"   # adjacent strings are one
model_dir: "experiments/deepfm"
train_config {
  log_step_count_steps: 200
  optimizer_config: {
    adam_optimizer: {
      learning_rate: { exponential_decay_learning_rate {
        initial_learning_rate: 1e-4 decay_steps: 0x2710 decay_factor: .5f } }
    }
    use_moving_average: false
  }
  num_steps: 2500;
  sync_replicas: True,
}
data_config <
  separator: "\t"
  input_fields: { input_name: "clk" input_type: INT32 default_val: "0" }
  input_fields { input_name: "c1" input_type: STRING }
  label_fields: "clk"
  input_type: CSVInput
  prefetch_size: -32
>
feature_config: {
  features: [{ input_names: "c1" feature_type: IdFeature hash_bucket_size: 100 },
             { input_names: ["c2", "c3"] feature_type: ComboFeature }]
}
eval_config { metrics_set: { auc {} } }
export_config { boundaries: [1.5, -2, inf, -inf] }
"""


def test_a_pipeline_config_in_every_form_the_format_allows():
    doc = parse(SAMPLE, "a.config")
    assert doc["train_input_path"] == ["data/train.csv"]
    assert doc["eval_input_path"] == ["data/eval/part-*.csv"]
    (train,) = doc["train_config"]
    assert train["num_steps"] == [2500] and train["sync_replicas"] == [True]
    (optimizer,) = train["optimizer_config"]
    assert optimizer["use_moving_average"] == [False]
    (rate,) = optimizer["adam_optimizer"][0]["learning_rate"][0]["exponential_decay_learning_rate"]
    assert rate == {"initial_learning_rate": [1e-4], "decay_steps": [10000], "decay_factor": [0.5]}
    (data,) = doc["data_config"]
    assert data["separator"] == ["\t"] and data["prefetch_size"] == [-32]
    # a repeated field: every occurrence, in order, with or without the colon
    assert [f["input_name"] for f in data["input_fields"]] == [["clk"], ["c1"]]
    assert data["input_fields"][0]["input_type"] == [Identifier("INT32")]
    assert data["input_type"] == [Identifier("CSVInput")] and str(data["input_type"][0]) == "CSVInput"
    features = doc["feature_config"][0]["features"]
    assert [f["feature_type"][0].name for f in features] == ["IdFeature", "ComboFeature"]
    assert features[1]["input_names"] == ["c2", "c3"]
    assert doc["eval_config"][0]["metrics_set"] == [{"auc": [{}]}]
    boundaries = doc["export_config"][0]["boundaries"]
    assert boundaries[:2] == [1.5, -2] and boundaries[2] == math.inf and boundaries[3] == -math.inf


def test_lists_of_numbers_and_extension_names():
    doc = parse("dnn { hidden_units: [32] } dnn { hidden_units: [64, 32] } [my.ext]: 3 empty: []")
    assert [d["hidden_units"] for d in doc["dnn"]] == [[32], [64, 32]]
    assert doc["[my.ext]"] == [3] and doc["empty"] == []


def test_escapes_in_strings():
    doc = parse(r'''a: "tab\there" b: 'q\'s' c: "\101\x42" d: "\\"''')
    assert doc == {"a": ["tab\there"], "b": ["q's"], "c": ["AB"], "d": ["\\"]}


@pytest.mark.parametrize(
    ("text", "where", "what"),
    [
        ("a: 1\nb {\n  c: 2\n", "x.config:3:6: at the end of the file", "expected '}'"),
        ("a: 1\nb: }", "x.config:2:4: at '}'", "expected a value"),
        ("a 1", "x.config:1:3: at '1'", "expected ':' or a message's '{'"),
        ("a: [1 2]", "x.config:1:7: at '2'", "expected ',' or ']' in a list"),
        ("a: 1\n  b: @", "x.config:2:6", "unexpected '@'"),
        ('a: "x\\q"', "x.config:1:4", "unknown escape \\q"),
        ("a: -foo", "x.config:1:4: at '-foo'", "expected a number after '-'"),
    ],
)
def test_a_malformed_config_is_named_by_file_line_and_column(text, where, what):
    with pytest.raises(ConfigError) as err:
        parse(text, "x.config")
    assert str(err.value).startswith(where) and what in str(err.value), str(err.value)
