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
    assert [(h["reason"], h["by"]) for h in history(registry, model)][-2:] == [
        ("day 12 AUC fell in serving", "Ana Lima"),
        ("back to the pre-drift model", "Ana Lima"),
    ]
    assert client_tags(registry, model, 7)["champion.set_by"] == "Ana Lima"
    argv = [*RECPIPE, "champion", "set", "--model_name", model, "--version", "9", "--reason", "x"]
    argv += ["--by", "Ana"]
    refused = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert refused.returncode == 2 and "no version 9" in refused.stderr


def client_tags(registry, model: str, version: int) -> dict:
    return dict(registry.get_model_version(model, str(version)).tags)


def test_a_move_by_a_service_account_must_name_the_person(monkeypatch):
    """In a container every login is ``root``: a move without ``--by`` (or ``$RECPIPE_BY``) is
    refused in one line before any store is asked, and ``--by`` is what the history records."""
    import getpass

    from recpipe.champion import mover
    from recpipe.errors import UsageError

    monkeypatch.delenv("RECPIPE_BY", raising=False)
    monkeypatch.setattr(getpass, "getuser", lambda: "root")
    with pytest.raises(UsageError, match=r"--by: who moves the champion\? This runs as root"):
        mover(None)
    assert mover("Ana Lima") == "Ana Lima"
    monkeypatch.setenv("RECPIPE_BY", "Bo")
    assert mover(None) == "Bo"
    monkeypatch.delenv("RECPIPE_BY")
    monkeypatch.setattr(getpass, "getuser", lambda: "ana")
    assert mover(None) == "ana"


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


def _pass(runs: Path, ds: str, source: Path | None) -> Path:
    """A finished pass dir ``runs/ds=D/hh=HHMM`` warm-started from ``source``."""
    day, key = ds.split("/")
    pass_dir = runs / f"ds={day}" / f"hh={key}"
    pass_dir.mkdir(parents=True)
    (pass_dir / "fine_tune.json").write_text(json.dumps({"source": str(source) if source else None}))
    (pass_dir / "_SUCCESS").touch()
    return pass_dir


def test_after_a_rollback_during_a_day_its_next_pass_starts_again_from_the_champion(registry, tmp_path):
    # the day's passes descend from version 2; version 2 is rolled back to version 1 after the
    # 20:00 pass: 20:30 starts from version 1, and 21:00 goes on from 20:30 (its chain's start
    # is the champion)
    from operators.hooks.mlflow import MLflowHook
    from operators.warm_start import source

    registry.create_registered_model(MODEL)
    v1 = _version(registry, tmp_path, "2024-03-01")
    v2 = _version(registry, tmp_path, "2024-03-02")
    registry.set_registered_model_alias(MODEL, "champion", v2.version)
    runs, day = tmp_path / "runs", "2024-03-03"
    registered = (MLflowHook(mlflow_conn_id=""), MODEL, "champion")
    first = _pass(runs, f"{day}/2000", Path(v2.tags["model_dir"]))
    second = runs / f"ds={day}" / "hh=2030"
    start, why = source(runs, f"{day}/2030", second, registered, previous_pass=True)
    assert (start, why) == (first, "the day's previous pass")

    rollback(registry, MODEL, "version 2 serves badly", "alice")
    start, why = source(runs, f"{day}/2030", second, registered, previous_pass=True)
    assert start.resolve() == Path(v1.tags["model_dir"]).resolve()
    assert "champion version 1" in why and "no longer the champion" in why
    _pass(runs, f"{day}/2030", start)  # trained from it, checkpoint prefix or model dir alike
    start, why = source(runs, f"{day}/2100", runs / f"ds={day}" / "hh=2100", registered, previous_pass=True)
    assert (start, why) == (second, "the day's previous pass")
    # a day that started from scratch (no champion then) goes on from its previous pass
    (second / "fine_tune.json").write_text(json.dumps({"source": None}))
    start, _ = source(runs, f"{day}/2100", runs / f"ds={day}" / "hh=2100", registered, previous_pass=True)
    assert start == second


def test_a_new_stream_starts_from_the_daily_models_champion(registry, tmp_path):
    # stream.cold_start_from: a stream with nothing of its own fine-tunes from the daily
    # model's champion; once it has a pass of the day or a champion, from those
    from operators.hooks.mlflow import MLflowHook
    from operators.warm_start import source

    daily, stream = "daily_model", "stream_model"
    registry.create_registered_model(daily)
    v1 = _version(registry, tmp_path / "daily", "2024-03-01", model=daily)
    registry.set_registered_model_alias(daily, "champion", v1.version)
    runs, day = tmp_path / "stream" / "runs", "2024-03-02"
    hook = MLflowHook(mlflow_conn_id="")
    registered = (hook, stream, "champion")
    first = runs / f"ds={day}" / "hh=0000"
    start, why = source(runs, f"{day}/0000", first, registered, True, cold_start_from=daily)
    assert start.resolve() == Path(v1.tags["model_dir"]).resolve()
    assert why.startswith("daily_model champion version 1 (a cold start")
    assert source(runs, f"{day}/0000", first, registered, True)[0] is None  # without it: scratch
    _pass(runs, f"{day}/0000", start)
    start, why = source(runs, f"{day}/0100", runs / f"ds={day}" / "hh=0100", registered, True, daily)
    assert (start, why) == (first, "the day's previous pass")
    # the daily champion is dated on the pass's day or later: not a model trained before it
    assert source(runs, "2024-03-01/0000", None, registered, True, daily)[0] is None


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
    from recpipe.exports.store import EmbeddingStore

    client, model = store

    online = EmbeddingStore(client, model)
    exports = tmp_path / "exports"
    day1, day2 = exports / "2024-03-01", exports / "2024-03-02"
    b1 = _export(day1, "base", "22", 0, None, 1.0, [1, 2])
    _export(day1, "delta-23", "23", 1, b1, 1.5, [2])
    _export(day2, "base", "23", 0, None, 2.0, [1, 2, 3])
    for export in (day1 / "base", day1 / "delta-23", day2 / "base"):
        online.push(export)
    assert online.applied()["day"] == "2024-03-02"
    registry.create_registered_model(MODEL)
    v1 = _version(registry, tmp_path, "2024-03-01", hour="23")
    _version(registry, tmp_path, "2024-03-02", hour="23")
    registry.set_registered_model_alias(MODEL, "champion", "2")
    rollback(registry, MODEL, "day 2 drifted", "erin")
    restore_store(client, model, registry.get_model_version(MODEL, v1.version))
    rows = online.read_rows("t")
    assert sorted(rows) == [1, 2]  # id 3 was day 2's alone
    np.testing.assert_array_equal(rows[1]["t/embedding_weights"], [1.0, 1.0])
    np.testing.assert_array_equal(rows[2]["t/embedding_weights"], [1.5, 1.5])
    assert (online.applied()["day"], online.applied()["name"]) == ("2024-03-01", "delta-23")


def test_a_move_states_the_champion_it_expects_and_is_refused_when_it_moved(registry, tmp_path):
    """Compare-and-set: a move that expected another champion (a gate that compared with
    version 1, an approval given after a day's wait) writes nothing and names who holds the
    alias now and who moved it; a move to where the alias already is, by a retry of the move
    that put it there, finishes without a second history entry."""
    from recpipe.registry import ChampionMovedError, move_alias

    registry.create_registered_model(MODEL)
    for day in ("2024-03-01", "2024-03-02", "2024-03-03"):
        _version(registry, tmp_path, day)
    move_alias(registry, MODEL, 1, None, by="gate", reason="first", action="promoted")
    set_champion(registry, MODEL, 2, "day 2 by hand", "alice")
    with pytest.raises(ChampionMovedError, match=r"version 2, not 1 .*moved by alice .*day 2 by hand"):
        move_alias(registry, MODEL, 3, 1, by="bob", reason="approved", action="approved")
    assert int(registry.get_registered_model(MODEL).aliases["champion"]) == 2
    assert [m["version"] for m in history(registry, MODEL)] == [1, 2]
    with pytest.raises(ChampionMovedError, match="version 2, not None"):
        move_alias(registry, MODEL, 3, None, by="gate", reason="first day", action="promoted")


def test_a_rollback_that_failed_halfway_reaches_the_same_target_when_retried(registry, tmp_path, store):
    """The alias moves, then the store's restore fails (Redis unreachable): the same command
    again finishes that rollback (store included) instead of taking the last move's
    ``previous``, which would flip the champion back to the bad version."""
    from recpipe.champion import move
    from recpipe.exports.store import EmbeddingStore
    from recpipe.redis_conn import parse
    from recpipe.registry import pending
    from tests.support import free_port

    client, model = store

    online = EmbeddingStore(client, model)
    registry.create_registered_model(model)
    exports = tmp_path / "exports"
    for n, day in enumerate(("2024-03-01", "2024-03-02"), start=1):
        _export(exports / day, "base", "23", 0, None, float(n), [1, 2])
        _version(registry, tmp_path, day, hour="23", model=model)
    online.push(exports / "2024-03-02" / "base")
    registry.set_registered_model_alias(model, "champion", "2")

    unreachable = parse(f"redis://127.0.0.1:{free_port()}/0", "test").client(timeout_s=1)
    import redis

    with pytest.raises(redis.ConnectionError):
        move(registry, model, "rollback", "day 2 drifted", "erin", store=unreachable)
    assert int(registry.get_registered_model(model).aliases["champion"]) == 1  # moved, store not
    assert pending(registry, model)["version"] == 1
    assert online.applied()["day"] == "2024-03-02"

    again = move(registry, model, "rollback", "day 2 drifted", "erin", store=client)
    assert (again["version"], again["previous"], again.get("resumed")) == (1, 2, True)
    assert int(registry.get_registered_model(model).aliases["champion"]) == 1
    assert online.applied()["day"] == "2024-03-01" and pending(registry, model) is None
    assert [(m["version"], m["action"]) for m in history(registry, model)] == [(1, "rollback")]
    # a rollback after it goes further back, never to the version rolled back from
    with pytest.raises(ChampionError, match="nothing to roll back to"):
        move(registry, model, "rollback", "again", "erin", store=client)


def test_champion_show_lists_the_versions_a_rollback_can_reach(registry, tmp_path):
    """``recpipe champion show``: the former champions in the order rollbacks take them, and
    which of them retention has made unreachable (its model dir or export gone)."""
    registry.create_registered_model(MODEL)
    versions = [_version(registry, tmp_path, f"2024-03-0{d}", promoted=d != 3) for d in range(1, 5)]
    registry.set_registered_model_alias(MODEL, "champion", "4")
    (Path(versions[0].tags["model_dir"]) / "_SUCCESS").unlink()
    done = subprocess.run(
        [*RECPIPE, "champion", "show", "--model_name", MODEL],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)
    assert shown["champion"]["version"] == 4
    assert [(t["version"], t["available"]) for t in shown["rollback_targets"]] == [(2, True), (1, False)]
    assert "model dir" in shown["rollback_targets"][1]["missing"][0]


def test_the_champion_command_finds_the_deployments_registry_and_fails_fast(tmp_path, registry):
    """Without ``--tracking_uri`` the command uses the deployment's MLflow as the DAGs do
    (``$MLFLOW_TRACKING_URI``, else ``$AIRFLOW_CONN_MLFLOW_DEFAULT``), never a new
    ``./mlflow.db``; a server that does not answer is one line within seconds; a typo in the
    model's name is "no such registered model", exit 2."""
    import os
    import time

    from tests.support import free_port

    registry.create_registered_model(MODEL)
    env = {
        k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "AIRFLOW_CONN_MLFLOW_DEFAULT")
    }
    env["RECPIPE_VAR_DIR"] = str(tmp_path / "var")
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    show = [*RECPIPE, "champion", "show", "--model_name"]
    # the project's store under the var dir: the registry fixture's database
    done = subprocess.run([*show, MODEL], capture_output=True, text=True, cwd=cwd, env=env, timeout=120)
    assert done.returncode == 2 and "no such registered model" in done.stderr  # var/mlflow/mlflow.db
    assert (tmp_path / "var" / "mlflow" / "mlflow.db").exists() and not list(cwd.iterdir())
    env["MLFLOW_TRACKING_URI"] = registry.tracking_uri
    done = subprocess.run([*show, MODEL], capture_output=True, text=True, cwd=cwd, env=env, timeout=120)
    assert done.returncode == 0 and json.loads(done.stdout)["champion"] is None, done.stderr
    done = subprocess.run([*show, "typo"], capture_output=True, text=True, cwd=cwd, env=env, timeout=120)
    assert done.returncode == 2 and "no such registered model 'typo'" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr

    del env["MLFLOW_TRACKING_URI"]
    port = free_port()
    env["AIRFLOW_CONN_MLFLOW_DEFAULT"] = json.dumps({"conn_type": "http", "host": "127.0.0.1", "port": port})
    started = time.monotonic()
    done = subprocess.run([*show, MODEL], capture_output=True, text=True, cwd=cwd, env=env, timeout=120)
    assert time.monotonic() - started < 30
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and len(lines) == 1 and f"127.0.0.1:{port} does not answer" in lines[0], lines


def test_the_history_is_a_table_on_the_registered_models_page(registry, tmp_path):
    """Each move rewrites a Markdown table in the registered model's description (newest first,
    who and why, a ``|`` in a reason escaped), keeping the text a person wrote there."""
    registry.create_registered_model(MODEL, description="Owned by the ranking team.")
    for day in ("2024-03-01", "2024-03-02"):
        _version(registry, tmp_path, day)
    set_champion(registry, MODEL, 1, "first | day", "alice")
    set_champion(registry, MODEL, 2, "second day", "bob")
    text = registry.get_registered_model(MODEL).description
    assert text.startswith("Owned by the ranking team.")
    rows = [r for r in text.splitlines() if r.startswith("| 20")]
    assert [r.split(" | ")[1:3] for r in rows] == [["2", "1"], ["1", "-"]]
    assert "| bob | second day |" in rows[0] and "| alice | first \\| day |" in rows[1]
    assert text.count("recpipe:champion-history -->") == 2  # one block, rewritten in place
