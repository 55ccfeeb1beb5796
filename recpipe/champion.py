"""Who serves, moved by hand: show the registered model's ``champion`` (MLflow's alias), set it
to a version, or roll it back to the one before, with who and why.

The moves are ``recpipe.registry``'s compare-and-set: each states the champion it found and is
refused when another move came first. A move is written ahead (``champion.pending``) and
cleared once its work is done, so a retried ``rollback`` after a failure halfway (a stream
model's store unreachable) finishes the same move instead of choosing another target. Each
move is also logged as an MLflow run in the model's experiment (``recpipe.step = champion``).
Warm start and retention follow the alias. For a stream model the online store is restored
to the champion's rows (``restore_store``). Used by ``recpipe champion`` and by the DAG
``recpipe_champion``.
"""

from __future__ import annotations

import getpass
import json
import os
import uuid
from pathlib import Path
from typing import Any

from recpipe.registry import (
    ALIAS,
    ChampionError,
    begin,
    current,
    finish,
    former_champions,
    history,
    holder,
    missing_files,
    move_alias,
    pending,
    registered_model,
    resume,
    rollback_target,
)

__all__ = [
    "ChampionError", "current", "history", "missing_files", "rollback_target", "set_champion", "rollback",
    "move", "restore_store", "describe", "rollback_targets", "main",
]  # fmt: skip


def describe(version) -> dict[str, Any]:
    """A version as ``recpipe champion show`` prints it."""
    keep = ("ds", "model_dir", "export_path", "promotion", "promotion_reason", "eval.auc")
    extra = {k: v for k, v in version.tags.items() if k in keep or k.startswith("champion.")}
    return {"version": int(version.version), **extra}


def rollback_targets(client, model: str, alias: str = ALIAS) -> list[dict[str, Any]]:
    """The former champions in the order rollbacks reach them (``registry.former_champions``),
    each ``{"version", "ds", "available"}`` plus ``missing`` (what retention or a delete
    removed) when it can no longer serve."""
    found = []
    for version in former_champions(client, model, alias):
        gone = missing_files(version)
        entry = {"version": int(version.version), "ds": version.tags.get("ds", ""), "available": not gone}
        found.append(entry | ({"missing": gone} if gone else {}))
    return found


def _checked(client, model: str, version: int | str):
    from mlflow.exceptions import MlflowException

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
    return chosen


def set_champion(
    client,
    model: str,
    version: int | str,
    reason: str,
    by: str,
    alias: str = ALIAS,
    experiment: str | None = None,
    expect: int | str | None | type(...) = ...,
    action: str = "set",
) -> dict[str, Any]:
    """Move ``alias`` to ``version``, with who (``by``) and why (``reason``, required).

    Args:
        expect: the version the caller saw holding the alias (None: no champion); default:
            the one holding it now (no check against an earlier look).

    Returns:
        ``{"model", "version", "previous", "by", "reason", "at", "action", "id"}``
        (``previous``: the version that held the alias, or None).

    Raises:
        ChampionError: no such version, an empty reason, or the version's model dir or
            export is gone (named; the way out: another version, or a retrain).
        recpipe.registry.ChampionMovedError: ``expect`` does not hold the alias.
    """
    if not reason.strip():
        raise ChampionError("a reason is required: it goes to the version's tags and the history")
    _checked(client, model, version)
    if expect is ...:
        expect = holder(client, model, alias)
    record = move_alias(client, model, version, expect, by=by, reason=reason, action=action, alias=alias)
    _log_run(client, experiment or model, record, alias)
    return {"model": model, **record}


def rollback(
    client, model: str, reason: str, by: str, alias: str = ALIAS, experiment: str | None = None
) -> dict[str, Any]:
    """Move ``alias`` back to ``rollback_target``'s version (see ``set_champion``)."""
    expect = holder(client, model, alias)
    target = rollback_target(client, model, alias)
    return set_champion(
        client, model, target.version, reason, by, alias, experiment, expect=expect, action="rollback"
    )


def is_stream_pass(version) -> bool:
    """Whether ``version`` was trained by a stream pass (its model dir ``ds=D/hh=HH``): the
    versions whose rows an online store holds."""
    from recpipe.layout import partition_ds

    model_dir = version.tags.get("model_dir")
    return bool(model_dir) and "/" in partition_ds(model_dir)


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
    from recpipe.exports.store import EmbeddingStore
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
    return EmbeddingStore(redis_client, model).restore(exports)


def move(
    client,
    model: str,
    action: str,
    reason: str,
    by: str,
    version=None,
    alias: str = ALIAS,
    experiment: str | None = None,
    store=None,
) -> dict[str, Any]:
    """``set`` (to ``version``) or ``rollback`` the alias, then, with ``store`` (a
    ``redis.Redis``) and a stream pass as the new champion, restore the store to its rows
    (``store`` in the record). What ``recpipe champion`` and the DAG ``recpipe_champion`` do.

    The move is written ahead and cleared at the end: a ``rollback`` (or a ``set`` of the same
    version) run while one is pending finishes that move, to its target, store included.

    Raises:
        ChampionError: as ``set_champion`` / ``rollback``; ``set`` without a version; a
            pending move whose champion was moved since (``ChampionMovedError``).
    """
    if action not in ("set", "rollback"):
        raise ChampionError(f"action {action!r}: set or rollback")
    if action == "set" and version in (None, ""):
        raise ChampionError("set: give the version (--version)")
    if not reason.strip():
        raise ChampionError("a reason is required: it goes to the version's tags and the history")
    if registered_model(client, model) is None:
        raise ChampionError(f"no such registered model: {model!r}")
    plan = pending(client, model, alias)
    if plan is not None and (action == "rollback" or int(version) == plan["version"]):
        record = {"model": model, **resume(client, model, plan, alias), "resumed": True}
    else:
        previous = holder(client, model, alias)
        wanted = version if action == "set" else rollback_target(client, model, alias).version
        target = _checked(client, model, wanted)  # a rollback too: its files must be there
        plan = {
            "id": uuid.uuid4().hex, "version": int(target.version), "previous": previous, "action": action,
            "by": by, "reason": reason,
        }  # fmt: skip
        begin(client, model, plan, alias)
        record = {"model": model, **resume(client, model, plan, alias)}
        _log_run(client, experiment or model, record, alias)
    chosen = client.get_model_version(model, str(record["version"]))
    if store is not None and is_stream_pass(chosen):
        record["store"] = restore_store(store, model, chosen)
    finish(client, model, plan["id"], alias)
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
    for key in ("version", "previous", "reason", "by", "action"):
        client.log_param(run.info.run_id, key, str(record.get(key)))
    client.set_terminated(run.info.run_id)


def _parser():
    from recpipe import redis_conn
    from recpipe.arguments import ArgumentParser

    parser = ArgumentParser(
        prog="recpipe champion",
        description="show, set or roll back the version that serves (the registered model's "
        "'champion' alias in MLflow); each move is tagged with who and why, refused when another "
        "move came first, and a stream model's Redis rows follow ($RECPIPE_REDIS_URL)",
    )
    parser.add_argument("action", choices=("show", "set", "rollback"))
    parser.add_argument("--model_name", required=True, help="the registered model")
    parser.add_argument("--version", type=int, default=None, help="set: the version to serve")
    parser.add_argument("--reason", default="", help="set / rollback: why (required)")
    parser.add_argument(
        "--by", default=None,
        help=f"who moves it (default: ${BY_ENV}, else the login name; required where that is a service "
        "account such as root)",
    )  # fmt: skip
    parser.add_argument("--alias", default=ALIAS)
    parser.add_argument("--experiment", default=None, help="where the move is logged (default: the model's)")
    redis_conn.add_arguments(
        parser, "a stream model's online store, restored to the champion's rows", default=None
    )
    parser.add_argument(
        "--tracking_uri",
        default=None,
        help="MLflow (default $MLFLOW_TRACKING_URI, else the deployment's $AIRFLOW_CONN_MLFLOW_DEFAULT, "
        "else <var>/mlflow/mlflow.db)",
    )
    return parser


# logins that name no person: a move by one of them must say who with --by (or $RECPIPE_BY)
SERVICE_ACCOUNTS = frozenset({"root", "airflow", "mlflow", "nobody", "daemon", "recpipe"})
BY_ENV = "RECPIPE_BY"


def mover(given: str | None) -> str:
    """Who moves the champion: ``--by``, else ``$RECPIPE_BY``, else the login name when it
    names a person.

    Raises:
        UsageError: no person is known (the login is a service account such as ``root`` in a
            container): ``--by`` names them.
    """
    from recpipe.errors import UsageError

    for name in (given, os.environ.get(BY_ENV)):
        if name and name.strip():
            return name.strip()
    try:
        login = getpass.getuser()
    except (KeyError, OSError):
        login = ""
    if not login or login in SERVICE_ACCOUNTS:
        raise UsageError(
            f"--by: who moves the champion? This runs as {login or 'an unnamed user'}, a service account: "
            f"give --by NAME (or set ${BY_ENV})"
        )
    return login


def _check_args(args) -> None:
    """Refuse (``UsageError``) a ``set`` without ``--version`` or a move without ``--reason``."""
    from recpipe.errors import UsageError

    if args.action == "set" and args.version is None:
        raise UsageError("recpipe champion set: give the version to serve (--version N)")
    if args.action != "show" and not args.reason.strip():
        raise UsageError(f"recpipe champion {args.action}: give --reason (it goes to the version's tags)")


def _check_model(client, args) -> None:
    """Refuse (``UsageError``) a ``--model_name`` that MLflow does not know, or a ``set`` of a
    version it does not hold."""
    from recpipe import tracking
    from recpipe.errors import UsageError

    if registered_model(client, args.model_name) is None:
        names = sorted(m.name for m in client.search_registered_models(max_results=100))
        where = tracking.redacted(tracking.tracking_uri(args.tracking_uri))
        raise UsageError(
            f"--model_name: no such registered model {args.model_name!r} at {where} "
            f"(registered: {', '.join(names) or 'none'})"
        )
    if args.action == "set":
        from mlflow.exceptions import MlflowException

        try:
            client.get_model_version(args.model_name, str(args.version))
        except MlflowException:
            raise UsageError(
                f"--version {args.version}: {args.model_name} has no version {args.version} "
                "(recpipe champion show lists them)"
            ) from None


def main(argv: list[str] | None = None) -> int:
    """``recpipe champion show | set --version N | rollback --model_name M --reason TEXT``."""
    from recpipe import redis_conn, tracking

    args = _parser().parse_args(argv)
    _check_args(args)  # before any store is asked
    address = redis_conn.resolve(args.redis_url, password_file=args.redis_password_file, default=None)
    by = mover(args.by) if args.action != "show" else None  # who: known before any store is asked
    client = tracking.client(args.tracking_uri)
    _check_model(client, args)
    if args.action == "show":
        champion = current(client, args.model_name, args.alias)
        print(json.dumps({
            "champion": champion and describe(champion),
            "rollback_targets": rollback_targets(client, args.model_name, args.alias) if champion else [],
            "pending": pending(client, args.model_name, args.alias),
            "history": history(client, args.model_name, args.alias),
        }, indent=2))  # fmt: skip
        return 0
    store = address.client() if address is not None else None
    try:
        record = move(
            client, args.model_name, args.action, args.reason, by, args.version, args.alias,
            args.experiment, store,
        )  # fmt: skip
    except Exception as err:
        import redis

        if not isinstance(err, redis.RedisError):
            raise
        raise ChampionError(
            f"the store at {address.where()} failed ({err}) after the {args.alias} moved; run the same "
            "command again: it finishes this move"
        ) from None
    print(json.dumps(record, indent=2))
    return 0
