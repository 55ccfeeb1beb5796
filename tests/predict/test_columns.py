"""EasyRec's predict flags as recpipe reads them, and the row counts the DAG's check uses."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from predict.columns import easyrec_name, output_columns, reserved_columns, selected_columns
from predict.files import BadInputError, count_rows, data_files
from recpipe.errors import UsageError

OUTPUTS = ["probs", "logits", "probs_ctr", "logits_ctr"]


def test_outputs_take_easyrecs_names_and_types():
    assert [easyrec_name(n) for n in ("probability", "logit", "probability_ctr", "logit_cvr", "y")] == [
        "probs", "logits", "probs_ctr", "logits_cvr", "y",
    ]  # fmt: skip
    assert output_columns("ALL_COLUMNS", OUTPUTS) == [(n, "double") for n in OUTPUTS]
    assert output_columns(" probs_ctr float , logits", OUTPUTS) == [
        ("probs_ctr", "float"),
        ("logits", "double"),
    ]
    for spec, named in [
        ("probs int", "the type must be one of double, float"),
        ("y double", r"'y' is not an output of the model \(it has: probs, logits"),
        ("probs, probs float", "probs is given twice"),
        (" , ", "at least one"),
    ]:
        with pytest.raises(UsageError, match=named):
            output_columns(spec, OUTPUTS)


def test_reserved_and_selected_columns_are_checked_against_the_input():
    cols = ["label", "user", "item"]
    assert reserved_columns("ALL_COLUMNS", cols, ["probs"]) == cols
    assert reserved_columns("", cols, ["probs"]) == []
    assert reserved_columns("item, label", cols, ["probs"]) == ["item", "label"]
    with pytest.raises(UsageError, match="--reserved_cols: the input has no column 'age'"):
        reserved_columns("age", cols, ["probs"])
    with pytest.raises(UsageError, match="'probs' is also an output column"):
        reserved_columns("ALL_COLUMNS", [*cols, "probs"], ["probs"])
    assert selected_columns(None, cols) is None
    assert selected_columns("0,item", cols) == ["label", "item"]  # EasyRec's positions, or names
    with pytest.raises(UsageError, match="position 3 is past the input's 3 columns"):
        selected_columns("3", cols)


def test_rows_are_counted_per_format_and_hidden_files_left_out(tmp_path):
    part = tmp_path / "ds=2024-01-01"
    part.mkdir()
    (part / "a.csv").write_text("h1,h2\n1,2\n3,4\n")
    (part / "b.csv").write_text("h1,h2\n5,6")  # no newline after the last line
    (part / "_SUCCESS").write_text("")
    (part / ".tmp-x").write_text("1,2\n")
    assert [p.name for p in data_files(part)] == ["a.csv", "b.csv"]
    assert count_rows(part, with_header=True) == 3 and count_rows(part) == 5
    pq.write_table(pa.table({"x": list(range(7))}), tmp_path / "p.parquet")
    assert count_rows(tmp_path / "p.parquet") == 7
    with pytest.raises(BadInputError, match="--input_path=.*empty: no data files there"):
        data_files(tmp_path / "empty")
