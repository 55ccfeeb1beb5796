"""bench/days.py: day ranges cross month ends, and a shipped config's copy changes only what
it is given."""

from __future__ import annotations

import yaml

from bench.days import config_copy, day_range
from bench.results import ROOT


def test_a_day_range_crosses_a_month_end():
    assert day_range("1997-09-29", 3) == ["1997-09-29", "1997-09-30", "1997-10-01"]
    assert day_range("2024-01-01", 0) == []


def test_a_config_copy_merges_its_changes_into_the_shipped_file(tmp_path):
    path = config_copy(
        "conf/retrain/movielens_stream.yaml",
        tmp_path / "deep" / "stream.yaml",
        {"dag_id": "bench", "tracking": {"retries": 0}, "edit_config_json": {"raw_input_path": "/x"}},
    )
    shipped = yaml.safe_load((ROOT / "conf/retrain/movielens_stream.yaml").read_text())
    copy = yaml.safe_load(path.read_text())
    assert copy["dag_id"] == "bench" and copy["edit_config_json"]["raw_input_path"] == "/x"
    assert copy["tracking"] == {**shipped["tracking"], "retries": 0}
    # every other edit of the shipped config is kept
    assert {k: v for k, v in copy["edit_config_json"].items() if k != "raw_input_path"} == {
        k: v for k, v in shipped["edit_config_json"].items() if k != "raw_input_path"
    }
    assert copy["stream"] == shipped["stream"]
