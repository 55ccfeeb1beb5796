"""Who serves, moved by hand: show the registered model's ``champion`` (MLflow's alias), set it
to a version, or roll it back to the one before, with who and why.

Every move tags the version (``champion.set_by``, ``champion.reason``, ``champion.set_at``),
appends to the registered model's history (tag ``champion.history``, JSON), and is logged as
an MLflow run in the model's experiment (``recpipe.step = champion``). Warm start and
retention follow the alias, so the next run fine-tunes from the new champion and its files
are kept. For a stream model the online store is restored to the champion's rows
(``restore_store``: its day's exports up to its pass, in a new generation). Used by
``recpipe champion`` and by the DAG ``recpipe_champion``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from recpipe.errors import PipelineError
from recpipe.layout import is_finished

HISTORY = "champion.history"
HISTORY_KEEP = 50


class ChampionError(PipelineError):
    """No such version, its files are gone, or nothing to roll back to (the message says
    which and what to do)."""


def _client(tracking_uri: str | None = None):
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri)


def current(client, model: str, alias: str = "champion"):
    """The ``ModelVersion`` holding ``alias``, or None (no such model or alias)."""
    from mlflow.exceptions import MlflowException

    try:
        registered = client.get_registered_model(model)
    except MlflowException as err:
        if err.error_code == "RESOURCE_DOES_NOT_EXIST":
            return None
        raise
    version = (registered.aliases or {}).get(alias)
    return None if version is None else client.get_model_version(model, str(version))


def history(client, model: str) -> list[dict[str, Any]]:
    """The manual moves, oldest first: ``{"version", "previous", "by", "reason", "at"}``."""
    tags = client.get_registered_model(model).tags or {}
    return json.loads(tags.get(HISTORY, "[]"))


def missing_files(version) -> list[str]:
    """What of ``version``'s files is gone: its model dir (finished, ``_SUCCESS``) and its
    export (``tags.export_path``); [] when both are there."""
    gone = []
    model_dir, export = version.tags.get("model_dir"), version.tags.get("export_path")
    if not model_dir or not is_finished(model_dir):
        gone.append(f"model dir {model_dir or '(untagged)'}")
    if not export or not Path(export).exists():
        gone.append(f"export {export or '(untagged)'}")
    return gone


def describe(version) -> dict[str, Any]:
    """A version as ``recpipe champion show`` prints it."""
    keep = ("ds", "model_dir", "export_path", "promotion", "promotion_reason", "eval.auc")
    extra = {k: v for k, v in version.tags.items() if k in keep or k.startswith("champion.")}
    return {"version": int(version.version), **extra}


def set_champion(
    client,
    model: str,
    version: int | str,
    reason: str,
    by: str,
    alias: str = "champion",
    experiment: str | None = None,
) -> dict[str, Any]:
    """Move ``alias`` to ``version``, with who (``by``) and why (``reason``, required).

    Returns:
        ``{"model", "version", "previous", "by", "reason", "at"}`` (``previous``: the version
        that held the alias, or None).

    Raises:
        ChampionError: no such version, an empty reason, or the version's model dir or
            export is gone (named; the way out: another version, or a retrain).
    """
    from mlflow.exceptions import MlflowException

    if not reason.strip():
        raise ChampionError("a reason is required: it goes to the version's tags and the history")
    try:
        chosen = client.get_model_version(model, str(version))
    except MlflowException:
        raise ChampionError(f"{model} has no version {version} (recpipe champion show lists them)") from None
    if gone := missing_files(chosen):
        raise ChampionError(
            f"{model} version {version}: its {' and '.join(gone)} {'is' if len(gone) == 1 else 'are'} gone "
            "(retention or a manual delete): "
            "it cannot serve nor be fine-tuned from; choose another version, or retrain"
        )
    before = current(client, model, alias)
    previous = None if before is None else int(before.version)
    record = {
        "model": model,
        "version": int(chosen.version),
        "previous": previous,
        "by": by,
        "reason": reason,
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    client.set_registered_model_alias(model, alias, chosen.version)
    for key in ("by", "reason", "at"):
        client.set_model_version_tag(model, chosen.version, f"champion.set_{key}", record[key])
    moves = [*history(client, model), {k: record[k] for k in ("version", "previous", "by", "reason", "at")}]
    client.set_registered_model_tag(model, HISTORY, json.dumps(moves[-HISTORY_KEEP:]))
    _log_run(client, experiment or model, record, alias)
    return record


def rollback_target(client, model: str, alias: str = "champion"):
    """The version a rollback moves ``alias`` to: the one a manual move replaced, when the
    champion came from one; else the newest version below the champion that its gate promoted
    (tag ``promotion: promoted``).

    Raises:
        ChampionError: no champion, or no earlier one.
    """
    champion = current(client, model, alias)
    if champion is None:
        raise ChampionError(f"{model} has no {alias}: nothing to roll back")
    moves = history(client, model)
    if moves and moves[-1]["version"] == int(champion.version) and moves[-1]["previous"] is not None:
        return client.get_model_version(model, str(moves[-1]["previous"]))
    earlier = [
        v
        for v in client.search_model_versions(f"name = '{model}'")
        if int(v.version) < int(champion.version) and v.tags.get("promotion") == "promoted"
    ]
    if not earlier:
        raise ChampionError(
            f"{model}: no version before {champion.version} was promoted: nothing to roll back to"
        )
    return max(earlier, key=lambda v: int(v.version))


def rollback(
    client, model: str, reason: str, by: str, alias: str = "champion", experiment: str | None = None
) -> dict[str, Any]:
    """Move ``alias`` back to ``rollback_target``'s version (see ``set_champion``)."""
    target = rollback_target(client, model, alias)
    return set_champion(client, model, target.version, reason, by, alias, experiment)


def restore_store(redis_client, model: str, version) -> dict[str, int]:
    """Rebuild the online store of stream model ``model`` from ``version``'s export chain: the
    exports of its day (``<export root>/<ds>/``, beside its SavedModel ``export_path``) up to
    the pass of its model dir, in a new generation switched to at once (readers never see a
    mix), even when the store holds later exports (a rollback moves it back on purpose).

    Raises:
        ChampionError: the version is not a stream pass, or its day's exports are gone.
        recpipe.exports.store.StoreError: as a push.
    """
    from recpipe.exports.files import chain, pass_of
    from recpipe.exports.store import restore
    from recpipe.layout import partition_ds

    export, day = version.tags.get("export_path"), version.tags.get("ds", "")
    model_dir = version.tags.get("model_dir")
    if not export or not model_dir or "/" not in partition_ds(model_dir):
        raise ChampionError(f"{model} version {version.version} is not a stream pass: no store to restore")
    hour = partition_ds(model_dir).split("/")[1]
    day_dir = Path(export).parent / day
    exports = (
        [e for e in chain(day_dir) if pass_of(e) is None or pass_of(e) <= hour] if day_dir.is_dir() else []
    )
    if not exports:
        raise ChampionError(f"{model} version {version.version}: no exports of {day} under {day_dir.parent}")
    return restore(redis_client, model, exports)


def move(
    client,
    model: str,
    action: str,
    reason: str,
    by: str,
    version=None,
    alias: str = "champion",
    experiment: str | None = None,
    redis_url: str | None = None,
) -> dict[str, Any]:
    """``set`` (to ``version``) or ``rollback`` the alias, then, with ``redis_url`` (a stream
    model's store), restore the store to the new champion's rows (``store`` in the record).
    What ``recpipe champion`` and the DAG ``recpipe_champion`` do.

    Raises:
        ChampionError: as ``set_champion`` / ``rollback``; ``set`` without a version.
    """
    if action == "set":
        if version in (None, ""):
            raise ChampionError("set: give the version (--version)")
        record = set_champion(client, model, version, reason, by, alias, experiment)
    else:
        record = rollback(client, model, reason, by, alias, experiment)
    if redis_url:
        import redis

        chosen = client.get_model_version(model, str(record["version"]))
        record["store"] = restore_store(redis.Redis.from_url(redis_url), model, chosen)
    return record


def _log_run(client, experiment: str, record: dict, alias: str) -> None:
    found = client.get_experiment_by_name(experiment)
    experiment_id = found.experiment_id if found else client.create_experiment(experiment)
    name = f"{alias} {record['previous']} -> {record['version']}"
    run = client.create_run(
        experiment_id,
        run_name=name,
        tags={
            "recpipe.step": "champion",
            "recpipe.champion.by": record["by"],
            "mlflow.note.content": record["reason"],
        },
    )
    for key in ("version", "previous", "reason", "by"):
        client.log_param(run.info.run_id, key, str(record[key]))
    client.set_terminated(run.info.run_id)


def main(argv: list[str] | None = None) -> int:
    """``recpipe champion show | set --version N | rollback --model_name M --reason TEXT``."""
    import argparse
    import getpass
    import os

    parser = argparse.ArgumentParser(
        prog="recpipe champion",
        description="show, set or roll back the version that serves (the registered model's "
        "'champion' alias in MLflow); each move is tagged with who and why, and with --redis_url a "
        "stream model's Redis rows follow",
    )
    parser.add_argument("action", choices=("show", "set", "rollback"))
    parser.add_argument("--model_name", required=True, help="the registered model")
    parser.add_argument("--version", default=None, help="set: the version to serve")
    parser.add_argument("--reason", default="", help="set / rollback: why (required)")
    parser.add_argument("--by", default=None, help="who (default: the login name)")
    parser.add_argument("--alias", default="champion")
    parser.add_argument("--experiment", default=None, help="where the move is logged (default: the model's)")
    parser.add_argument(
        "--redis_url",
        default=os.environ.get("RECPIPE_REDIS_URL"),
        help="a stream model's online store, restored to the champion's rows ($RECPIPE_REDIS_URL)",
    )
    parser.add_argument("--tracking_uri", default=None, help="MLflow (default $MLFLOW_TRACKING_URI)")
    args = parser.parse_args(argv)
    client = _client(args.tracking_uri)
    if args.action == "show":
        champion = current(client, args.model_name, args.alias)
        moves = history(client, args.model_name) if champion is not None else []
        print(json.dumps({"champion": champion and describe(champion), "history": moves}, indent=2))
        return 0
    by = args.by or getpass.getuser()
    record = move(
        client, args.model_name, args.action, args.reason, by, args.version, args.alias, args.experiment,
        args.redis_url,
    )  # fmt: skip
    print(json.dumps(record, indent=2))
    return 0
