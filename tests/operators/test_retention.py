"""Retention over many days, in the daily layout (``ds=D``) and the hourly one
(``ds=D/hh=HH``): a property test of ``recpipe.layout.expired_model_dirs`` over random runs
of days, passes and promotions, and ``RetentionOperator`` against a real MLflow registry
(SQLite) whose champion is a pass of a day long gone from the window."""

from __future__ import annotations

from datetime import date, timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from recpipe.layout import expired_model_dirs, model_dirs, partition_ds

START = date(2024, 3, 1)

days = st.lists(
    st.fixed_dictionaries(
        {
            "passes": st.lists(st.integers(0, 23), max_size=4, unique=True),  # [] : a daily dir
            "promote": st.booleans(),
            "champion_is_checkpoint": st.booleans(),
        }
    ),
    min_size=1,
    max_size=10,
)


def _make(root: Path, day: str, passes: list[int]) -> list[Path]:
    if not passes:
        made = [root / f"ds={day}"]
    else:
        made = [root / f"ds={day}" / f"hh={h:02d}" for h in sorted(passes)]
    for path in made:
        path.mkdir(parents=True, exist_ok=True)
        (path / "model.ckpt-10.index").touch()
        (path / "_SUCCESS").touch()
    return made


def _delete(path: Path) -> None:
    import shutil

    shutil.rmtree(path)
    if path.name.startswith("hh=") and not any(path.parent.iterdir()):
        path.parent.rmdir()


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])  # the profile's examples
@given(run=days, keep_days=st.integers(1, 3))
def test_retention_never_deletes_the_champion_nor_the_newest_days(run, keep_days, tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    champion: Path | None = None
    for i, d in enumerate(run):
        day = (START + timedelta(days=i)).isoformat()
        made = _make(root, day, d["passes"])
        if d["promote"]:
            champion = made[-1] / "model.ckpt-10" if d["champion_is_checkpoint"] else made[-1]
        before = set(model_dirs(root))
        gone = expired_model_dirs(root, keep_days, {champion} if champion else set())
        for path in gone:
            _delete(path)
        after = set(model_dirs(root))
        assert after == before - set(gone)
        if champion is not None:
            assert champion.exists() or (champion.parent / "model.ckpt-10.index").exists(), (i, champion)
        newest = sorted({partition_ds(p).partition("/")[0] for p in before})[-keep_days:]
        for path in before:
            if partition_ds(path).partition("/")[0] in newest:
                assert path in after, (i, path, newest)
            elif champion is None or not (path == champion or path in champion.parents):
                assert path not in after, (i, path)


@pytest.fixture
def registry(tmp_path, monkeypatch):
    from mlflow import MlflowClient

    monkeypatch.setenv("RECPIPE_VAR_DIR", str(tmp_path))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return MlflowClient(uri)


def test_the_stream_champion_survives_many_days_of_retention(tmp_path, registry):
    """The champion is day 1's 23:00 pass; every later day is rejected. With one day kept, six
    days of retention delete every other pass and keep the champion's, and the leftovers of
    interrupted deletions and writes."""
    from operators.retention import RetentionOperator

    runs = tmp_path / "runs"
    model = "stream_model"
    registry.create_registered_model(model)
    champion_dir = runs / "ds=2024-03-01" / "hh=23"
    op = RetentionOperator(
        task_id="retention",
        pipeline_config_path="conf/movielens_deepfm.yaml",
        runs_root=str(runs),
        keep_days=1,
        model_name=model,
        mlflow_conn_id="",
    )
    deleted = []
    for i in range(6):
        day = (START + timedelta(days=i)).isoformat()
        _make(runs, day, [21, 22, 23])
        if i == 0:
            version = registry.create_model_version(
                model,
                str(tmp_path / "export"),
                tags={"model_dir": str(champion_dir), "checkpoint": str(champion_dir / "model.ckpt-10")},
            )
            registry.set_registered_model_alias(model, "champion", version.version)
        (runs / f".deleting-ds={day}").mkdir()  # a deletion interrupted by a crash
        (runs / f"ds={day}" / ".tmp-x-999999999-abcdef12").mkdir()  # a writer long dead
        deleted += op.execute({})
    assert champion_dir.is_dir() and (champion_dir / "_SUCCESS").exists()
    left = sorted(partition_ds(p) for p in model_dirs(runs))
    assert left == ["2024-03-01/23", "2024-03-06/21", "2024-03-06/22", "2024-03-06/23"]
    assert len(deleted) == 3 * 5 - 1
    assert not [p for p in runs.rglob(".deleting-*")]
    assert not [p for p in runs.glob("ds=*/.tmp-*")]


def test_exports_beyond_exports_to_keep_go_but_never_the_champions(tmp_path, registry):
    """export_config.exports_to_keep (EasyRec's name) of the run's pipeline config, overrides
    applied: the newest versions stay, and the champion's however old; the day dirs of a
    stream model's delta chains beside them are not versions and stay."""
    from operators.retention import RetentionOperator

    exports, model = tmp_path / "exports", "exports_model"
    for version in (1, 2, 3, 9, 10):
        (exports / str(version) / "variables").mkdir(parents=True)
    (exports / "2024-03-01" / "base-00").mkdir(parents=True)
    registry.create_registered_model(model)
    old = registry.create_model_version(model, str(exports / "2"), tags={"export_path": str(exports / "2")})
    registry.set_registered_model_alias(model, "champion", old.version)
    op = RetentionOperator(
        task_id="retention",
        pipeline_config_path="conf/movielens_deepfm.yaml",
        edit_config_json={"export_config.exports_to_keep": 2},
        runs_root=str(tmp_path / "runs"),
        export_root=str(exports),
        keep_days=1,
        model_name=model,
        mlflow_conn_id="",
    )
    deleted = op.execute({})
    assert sorted(p.name for p in exports.iterdir()) == ["10", "2", "2024-03-01", "9"]
    assert sorted(Path(p).name for p in deleted) == ["1", "3"]


@pytest.mark.parametrize("keep_champions", [2, 0])
def test_the_champions_before_the_current_one_stay_rollback_targets(tmp_path, registry, keep_champions):
    """Four days, one kept: version 1 (day 1) was champion until version 3 (day 3) replaced
    it (day 2's was rejected). Retention keeps the model dirs and exports of the champion and
    of the ``keep_champions`` before it, so that ``recpipe champion rollback`` still reaches
    version 1; with none kept, the rollback names what is gone."""
    from operators.retention import RetentionOperator
    from recpipe.champion import ChampionError, rollback
    from recpipe.registry import move_alias

    runs, exports, model = tmp_path / "runs", tmp_path / "exports", "kept_model"
    registry.create_registered_model(model)
    op = RetentionOperator(
        task_id="retention",
        pipeline_config_path="conf/movielens_deepfm.yaml",
        edit_config_json={"export_config.exports_to_keep": 1},
        runs_root=str(runs),
        export_root=str(exports),
        keep_days=1,
        keep_champions=keep_champions,
        model_name=model,
        mlflow_conn_id="",
    )
    champion = None
    for i in range(4):
        day = (START + timedelta(days=i)).isoformat()
        (model_dir,) = _make(runs, day, [])
        export = exports / str(i + 1)
        (export / "variables").mkdir(parents=True)
        tags = {"ds": day, "model_dir": str(model_dir), "export_path": str(export)}
        promoted = i in (0, 2)
        version = registry.create_model_version(
            model, str(export), tags={**tags, "promotion": "promoted" if promoted else "rejected"}
        )
        if promoted:
            move_alias(registry, model, version.version, champion, by="gate", reason="day", action="promoted")
            champion = int(version.version)
        op.execute({})
    kept = sorted(partition_ds(p) for p in model_dirs(runs))
    if keep_champions:
        assert kept == ["2024-03-01", "2024-03-03", "2024-03-04"]
        assert sorted(p.name for p in exports.iterdir()) == ["1", "3", "4"]
        assert rollback(registry, model, "day 3 serves badly", "alice")["version"] == 1
    else:
        assert kept == ["2024-03-03", "2024-03-04"]
        with pytest.raises(ChampionError, match="version 1: its model dir .* export .* are gone"):
            rollback(registry, model, "day 3 serves badly", "alice")
