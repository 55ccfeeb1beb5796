"""Moving the champion by hand (``recpipe champion``) against a real MLflow registry (SQLite)
and, for a stream model, a real Redis store: set and roll back with who and why, refused
when a version's files are gone; warm start names a champion whose model dir is gone instead
of falling back in silence; a rollback restores the store to the champion's rows even though
it holds later exports."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from recpipe.champion import ChampionError, history, restore_store, rollback, set_champion
from recpipe.exports.files import Params, TableRows, new_manifest, write_params
from tests.support import RECPIPE, ROOT

MODEL = "champion_model"


@pytest.fixture
def registry(tmp_path, monkeypatch):
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("RECPIPE_VAR_DIR", str(tmp_path))
    return MlflowClient(uri)


def _version(
    client, root: Path, day: str, promoted: bool = True, hour: str | None = None, model: str = MODEL
):
    model_dir = root / "runs" / f"ds={day}" / (f"hh={hour}" if hour else "")
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "_SUCCESS").touch()
    n = len(client.search_model_versions(f"name = '{model}'")) + 1
    export = root / "exports" / str(n)  # beside a stream model's <day>/ export chains
    export.mkdir(parents=True)
    tags = {"ds": day, "model_dir": str(model_dir), "export_path": str(export)}
    if promoted:
        tags["promotion"] = "promoted"
    return client.create_model_version(model, str(export), tags=tags)


def test_set_and_roll_back_with_who_and_why(registry, tmp_path):
    registry.create_registered_model(MODEL)
    v1 = _version(registry, tmp_path, "2024-03-01")
    _version(registry, tmp_path, "2024-03-02", promoted=False)  # rejected by its gate
    v3 = _version(registry, tmp_path, "2024-03-03")
    registry.set_registered_model_alias(MODEL, "champion", v3.version)  # as the gate moved it

    # no manual move yet: back to the newest promoted version below the champion
    back = rollback(registry, MODEL, "day 3 serves badly", "alice")
    assert (back["version"], back["previous"]) == (1, 3)
    assert int(registry.get_registered_model(MODEL).aliases["champion"]) == int(v1.version)
    tags = registry.get_model_version(MODEL, v1.version).tags
    assert tags["champion.set_by"] == "alice" and tags["champion.set_reason"] == "day 3 serves badly"
    # the next day fine-tunes from the champion the rollback chose, not from day 3
    from operators.hooks.mlflow import MLflowHook
    from operators.warm_start import source

    runs = tmp_path / "runs"
    start, _ = source(
        runs, "2024-03-04", runs / "ds=2024-03-04", (MLflowHook(mlflow_conn_id=""), MODEL, "champion")
    )
    assert start.resolve() == Path(v1.tags["model_dir"]).resolve()

    # a manual move, then its rollback: back to what it replaced
    set_champion(registry, MODEL, 3, "fixed upstream", "bob")
    assert rollback(registry, MODEL, "not fixed", "carol")["version"] == 3 - 2
    assert [(m["version"], m["previous"], m["by"]) for m in history(registry, MODEL)] == [
        (1, 3, "alice"),
        (3, 1, "bob"),
        (1, 3, "carol"),
    ]
    # each move is a run in the model's experiment
    experiment = registry.get_experiment_by_name(MODEL)
    runs = registry.search_runs([experiment.experiment_id], "tags.`recpipe.step` = 'champion'")
    assert sorted(r.info.run_name for r in runs) == ["champion 1 -> 3", "champion 3 -> 1", "champion 3 -> 1"]


def test_a_version_whose_files_are_gone_is_refused_naming_them(registry, tmp_path):
    registry.create_registered_model(MODEL)
    v1 = _version(registry, tmp_path, "2024-03-01")
    _version(registry, tmp_path, "2024-03-02")
    registry.set_registered_model_alias(MODEL, "champion", "2")
    (Path(v1.tags["model_dir"]) / "_SUCCESS").unlink()  # retention took it
    with pytest.raises(ChampionError, match=r"version 1: its model dir .*ds=2024-03-01.* is gone"):
        set_champion(registry, MODEL, 1, "back", "alice")
    with pytest.raises(ChampionError, match="no version 7"):
        set_champion(registry, MODEL, 7, "back", "alice")
    with pytest.raises(ChampionError, match="reason is required"):
        set_champion(registry, MODEL, 2, "  ", "alice")
    assert int(registry.get_registered_model(MODEL).aliases["champion"]) == 2


def test_the_rollback_pages_commands_run_as_written(registry, tmp_path):
    from tests.support import doc_commands, run_doc_commands

    model = "movielens_deepfm"  # the page's
    registry.create_registered_model(model)
    for day in range(1, 9):  # day 7's model was rejected by its gate; day 8's is the champion
        _version(registry, tmp_path, f"2024-03-{day:02d}", promoted=day != 7, model=model)
    registry.set_registered_model_alias(model, "champion", "8")
    test = "tests/test_champion.py::test_the_rollback_pages_commands_run_as_written"
    done = run_doc_commands(doc_commands("rollback.md", test), ROOT)
    decoder, outputs, at, out = json.JSONDecoder(), [], 0, done.stdout
    while out[at:].strip():  # one JSON document a command
        doc, at = decoder.raw_decode(out, len(out) - len(out[at:].lstrip()))
        outputs.append(doc)
    shown, back, chosen = outputs
    assert shown["champion"]["version"] == 8
    assert (back["version"], back["previous"]) == (6, 8)  # the newest earlier version its gate promoted
    assert (chosen["version"], chosen["previous"]) == (7, 6)
    assert [h["reason"] for h in history(registry, model)][-2:] == [
        "day 12 AUC fell in serving",
        "back to the pre-drift model",
    ]
    refused = subprocess.run(
        [*RECPIPE, "champion", "set", "--model_name", model, "--version", "9", "--reason", "x"],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )  # fmt: skip
    assert refused.returncode == 1 and "no version 9" in refused.stderr


def test_warm_start_names_a_champion_whose_model_dir_is_gone(registry, tmp_path):
    from operators.hooks.mlflow import MLflowHook
    from operators.warm_start import ChampionGoneError, source

    registry.create_registered_model(MODEL)
    v1 = _version(registry, tmp_path, "2024-03-01")
    registry.set_registered_model_alias(MODEL, "champion", v1.version)
    (Path(v1.tags["model_dir"]) / "_SUCCESS").unlink()
    _version(registry, tmp_path, "2024-03-02", promoted=True)  # a newer promoted one exists
    hook = MLflowHook(mlflow_conn_id="")
    with pytest.raises(ChampionGoneError, match="champion version 1 .* is gone.*recpipe champion set"):
        source(
            tmp_path / "runs", "2024-03-05", tmp_path / "runs" / "ds=2024-03-05", (hook, MODEL, "champion")
        )


def _export(
    day_dir: Path, name: str, hour: str, sequence: int, previous: dict | None, value: float, ids
) -> dict:
    from recpipe import atomic
    from recpipe.exports.files import MANIFEST
    from recpipe.layout import SUCCESS

    rows = TableRows(
        np.asarray(ids, np.int64), {"t/embedding_weights": np.full((len(ids), 2), value, np.float32)}
    )
    params = Params({"t": rows}, {"dense/w": np.zeros(2, np.float32)}, {})
    with atomic.directory(day_dir / name) as tmp:
        files = write_params(params, tmp / "params")
        doc = new_manifest(
            day_dir.name, name, sequence, previous, 10 * sequence, 100 + sequence, params, files
        )
        doc["pass"] = hour
        (tmp / MANIFEST).write_text(json.dumps(doc))
        (tmp / SUCCESS).touch()
    return doc


def test_a_rollback_restores_the_stream_store_to_the_champions_rows(registry, tmp_path, store):
    from recpipe.exports.store import applied, push, read_rows

    client, model = store
    exports = tmp_path / "exports"
    day1, day2 = exports / "2024-03-01", exports / "2024-03-02"
    b1 = _export(day1, "base", "22", 0, None, 1.0, [1, 2])
    _export(day1, "delta-23", "23", 1, b1, 1.5, [2])
    _export(day2, "base", "23", 0, None, 2.0, [1, 2, 3])
    for export in (day1 / "base", day1 / "delta-23", day2 / "base"):
        push(client, model, export)
    assert applied(client, model)["day"] == "2024-03-02"
    registry.create_registered_model(MODEL)
    v1 = _version(registry, tmp_path, "2024-03-01", hour="23")
    _version(registry, tmp_path, "2024-03-02", hour="23")
    registry.set_registered_model_alias(MODEL, "champion", "2")
    rollback(registry, MODEL, "day 2 drifted", "erin")
    restore_store(client, model, registry.get_model_version(MODEL, v1.version))
    rows = read_rows(client, model, "t")
    assert sorted(rows) == [1, 2]  # id 3 was day 2's alone
    np.testing.assert_array_equal(rows[1]["t/embedding_weights"], [1.0, 1.0])
    np.testing.assert_array_equal(rows[2]["t/embedding_weights"], [1.5, 1.5])
    assert (applied(client, model)["day"], applied(client, model)["name"]) == ("2024-03-01", "delta-23")
