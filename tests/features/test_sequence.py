"""Behaviour histories (``features.sequence``): every row's history holds the user's last
events strictly before it, from earlier days (through the carried state) and the same day,
never the row's own event, a later one or one at the same time; checked on a hand-made case
and, as a property (Hypothesis), against a brute force over random days of events."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from features.schema import BAD
from features.sequence import add_histories, previous_state, state_root, write_state
from recpipe.config.data import BehaviorSequence, InputType
from recpipe.layout import ds_partition

TYPES = {"user_id": InputType.STRING, "item_id": InputType.STRING, "genre": InputType.STRING,
         "ts": InputType.INT64, "label": InputType.INT32}  # fmt: skip
COLUMNS = ["user_id", "item_id", "genre", "ts", "label", BAD]


def _day(spark, root, seq, ds, events, positive_only=False):
    """Run one day through add_histories and publish its state; rows as dicts, in order."""
    from pyspark.sql import functions as F

    rows = spark.createDataFrame(
        [(u, i, g, t, y, b) for u, i, g, t, y, b in events],
        "user_id string, item_id string, genre string, ts long, label int, _bad boolean",
    ).withColumnRenamed("_bad", BAD)
    good = ~F.col(BAD) & (F.col("label") > 0) if positive_only else ~F.col(BAD)
    out, state, figures = add_histories(spark, rows, seq, TYPES, root, ds, good)
    write_state(state, ds_partition(state_root(root), ds))
    got = {(r["user_id"], r["item_id"], r["ts"]): (r["hist_item_id"], r["hist_genre"]) for r in out.collect()}
    return got, figures


def test_histories_follow_time_ties_and_days(spark, tmp_path):
    seq = BehaviorSequence(user_field="user_id", time_field="ts", fields=["item_id", "genre"], max_length=3)
    day1 = [
        ("u1", "a", "x", 10, 1, False),
        ("u1", "b", "y", 20, 1, False),
        ("u1", "c", "x", 20, 1, False),  # a tie with b: neither sees the other
        ("u2", "d", "z", 5, 1, False),
    ]
    got, figures = _day(spark, tmp_path, seq, "2024-01-01", day1)
    assert figures == {"state_from": None}
    assert got[("u1", "a", 10)] == ([], [])
    assert got[("u1", "b", 20)] == (["a"], ["x"])
    assert got[("u1", "c", 20)] == (["a"], ["x"])
    assert got[("u2", "d", 5)] == ([], [])
    day2 = [
        ("u1", "e", "z", 1, 1, False),  # earlier in the clock than day 1's, later as a day
        ("u1", "f", "y", 2, 0, True),  # quarantined: not an event, still has a history
        ("u1", "g", "x", 3, 1, False),
        ("u3", "h", "x", 1, 1, False),
    ]
    got, figures = _day(spark, tmp_path, seq, "2024-01-02", day2)
    assert figures == {"state_from": "2024-01-01"}
    # the last 3 of day 1 (ties ordered by their values: b before c), then the day's own
    assert got[("u1", "e", 1)] == (["a", "b", "c"], ["x", "y", "x"])
    assert got[("u1", "f", 2)] == (["b", "c", "e"], ["y", "x", "z"])
    assert got[("u1", "g", 3)] == (["b", "c", "e"], ["y", "x", "z"])  # f was no event
    assert got[("u3", "h", 1)] == ([], [])
    # u2 kept its state through a day without events
    state = spark.read.parquet(str(ds_partition(state_root(tmp_path), "2024-01-02")))
    users = {r["user"]: [e["v"][0] for e in r["_events"]] for r in state.collect()}
    assert users == {"u1": ["c", "e", "g"], "u2": ["d"], "u3": ["h"]}
    assert previous_state(tmp_path, "2024-01-03") == "2024-01-02"
    assert previous_state(tmp_path, "2024-01-02/05") == "2024-01-01"


def _brute(days, n, positive_only):
    """Each row's expected history: earlier days' events, then the day's strictly earlier ones,
    each day's ordered by (time, item, genre); the last n."""
    out = []
    for d, events in enumerate(days):
        for u, i, _g, t, _y, _ in events:
            earlier = []
            for e, day in enumerate(days[: d + 1]):
                counted = [
                    (tt, ii, gg)
                    for uu, ii, gg, tt, yy, bb in day
                    if uu == u and not bb and (yy > 0 or not positive_only) and (e < d or tt < t)
                ]
                earlier += sorted(counted)
            last = earlier[-n:]
            out.append({(u, i, t): ([x[1] for x in last], [x[2] for x in last])})
    return out


event = st.tuples(
    st.sampled_from(["u1", "u2", "u3"]),
    st.sampled_from(["a", "b", "c", "d"]),
    st.sampled_from(["x", "y"]),
    st.integers(0, 6),  # few times: many ties
    st.integers(0, 1),
    st.booleans(),
)


@pytest.mark.slow
@settings(
    max_examples=6,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    days=st.lists(
        st.lists(event, min_size=1, max_size=12, unique_by=lambda e: (e[0], e[1], e[3])),
        min_size=1,
        max_size=3,
    ),
    n=st.integers(1, 4),
    positive_only=st.booleans(),
)
def test_no_history_holds_the_event_itself_or_a_later_one(spark, tmp_path_factory, days, n, positive_only):
    root = tmp_path_factory.mktemp("seq")
    seq = BehaviorSequence(
        user_field="user_id",
        time_field="ts",
        fields=["item_id", "genre"],
        max_length=n,
        positive_only=positive_only,
    )
    expected = _brute(days, n, positive_only)
    k = 0
    for d, events in enumerate(days):
        got, _ = _day(spark, root, seq, f"2024-01-0{d + 1}", events, positive_only)
        for u, i, _g, t, _y, _b in events:
            assert got[(u, i, t)] == expected[k][(u, i, t)], (d, u, i, t)
            k += 1


def test_movielens_days_carry_each_users_last_items_without_leakage(spark, movielens_config):
    """Three real MovieLens days through the Spark job: each row's ``hist_item_id`` is the
    user's last 20 items rated strictly before it (earlier days through the state), exactly."""
    import json
    from pathlib import Path

    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    from features.prepare import prepare_day
    from recpipe.config.data import FeatureSpec, FeatureType
    from tests.support import with_edits

    days = ["1997-09-20", "1997-09-21", "1997-09-22"]
    config = with_edits(
        movielens_config,
        {"data_config.behavior_sequence": {"user_field": "user_id", "time_field": "timestamp",
                                           "fields": ["item_id", "genres"], "max_length": 20}},
    )  # fmt: skip
    features = config.feature_config.features
    for name in ("hist_item_id", "hist_genres"):
        features.append(
            FeatureSpec(input_names=[name], feature_type=FeatureType.SequenceFeature, sequence_length=20)
        )
    raw = Path(config.raw_input_path)
    items = pacsv.read_csv(raw.parent / "dims" / "items.csv").to_pydict()
    genres = dict(zip(map(str, items["item_id"]), items["genres"], strict=True))
    seen: dict[str, list[tuple[int, str, str]]] = {}  # user -> earlier days' events
    for d, ds in enumerate(days):
        stats = prepare_day(spark, config, ds)
        assert stats["sequence"]["state_from"] == (days[d - 1] if d else None)
        assert stats["sequence"]["users"] >= len(seen)
        assert 0 <= stats["sequence"]["hist_item_id.empty_share"] <= 1
        events = pacsv.read_csv(next((raw / f"ds={ds}").glob("*.csv"))).to_pydict()
        today: dict[str, list[tuple[int, str, str]]] = {}
        for u, i, t in zip(events["user_id"], events["item_id"], events["timestamp"], strict=True):
            today.setdefault(str(u), []).append((t, str(i), genres[str(i)]))
        got = pq.read_table(
            Path(config.train_input_path) / f"ds={ds}",
            columns=["user_id", "item_id", "hist_item_id", "hist_genres"],
        ).to_pylist()
        assert len(got) == sum(map(len, today.values()))
        checked_ties = 0
        for row in got:
            user = row["user_id"]
            (t,) = [e[0] for e in today[user] if e[1] == row["item_id"]]
            want = seen.get(user, []) + sorted(e for e in today[user] if e[0] < t)
            want = want[-20:]
            assert row["hist_item_id"] == [e[1] for e in want], (ds, user, row["item_id"])
            assert row["hist_genres"] == [e[2] for e in want]
            # never the event's own item, nor one rated at its time or later
            assert row["item_id"] not in row["hist_item_id"]
            checked_ties += sum(e[0] == t for e in today[user]) > 1
        assert checked_ties > 0  # MovieLens users rate several items in one second
        for user, events_today in today.items():
            seen[user] = (seen.get(user, []) + sorted(events_today))[-20:]
    state = Path(config.train_input_path) / "_sequence_state" / f"ds={days[-1]}" / "_SUCCESS"
    assert state.exists()
    stats_file = json.loads((Path(config.train_input_path) / f"ds={days[-1]}" / "_stats.json").read_text())
    assert stats_file["sequence"]["hist_item_id.mean_length"] > 0


@pytest.mark.parametrize(
    "edit, message",
    [
        ({"user_field": "uid"}, "behavior_sequence.user_field: 'uid' is not an input field"),
        ({"time_field": "rating"}, "behavior_sequence.time_field: 'rating' must be INT32 or INT64"),
        ({"fields": ["item_id", "tag"]}, "behavior_sequence.fields: 'tag' is not an input field"),
        ({"prefix": ""}, "behavior_sequence.prefix: \\['item_id'\\] are input fields already"),
    ],
)
def test_a_bad_behavior_sequence_names_its_field(edit, message):
    from recpipe.config import load_pipeline_config
    from recpipe.config.errors import ConfigError
    from tests.support import ROOT, with_edits

    config = load_pipeline_config(ROOT / "conf/movielens_deepfm.yaml")
    seq = {"user_field": "user_id", "time_field": "timestamp", "fields": ["item_id"], **edit}
    with pytest.raises(ConfigError, match=message):
        with_edits(config, {"data_config.behavior_sequence": seq})
