"""The model registry's one home: who serves (MLflow's registered-model alias, ``champion``),
the tags recpipe writes there, and the one way the alias moves.

Every move, by the gate, an approver or a person, is a compare-and-set (``move_alias``): the
caller states which version it expects to hold the alias (None: nobody) and the move is
refused with ``ChampionMovedError``, naming who holds it now and who moved it, when that is not
so. The read-compare-write runs under a file lock in ``$RECPIPE_VAR_DIR`` (shared by the
deployment's workers and its ``recpipe champion`` command), since MLflow has no conditional
write. Each move tags the version (``champion.set_by`` / ``set_reason`` / ``set_at``) and
appends to the registered model's history (tag ``champion.history``, JSON, oldest first, and a
Markdown table in its description, newest first, ``history_table``).

A move with work after it (a stream model's store restored to the new champion's rows) is
written ahead as ``champion.pending``: a retry finishes that move, to the same target, instead
of choosing a new one (``resume``).
"""

from __future__ import annotations

import fcntl
import json
import os
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recpipe.errors import PipelineError
from recpipe.home import var_dir
from recpipe.layout import is_finished

ALIAS = "champion"

# the gate's outcomes (version tag ``promotion``; ``gate_outcome`` keeps the gate's own)
PROMOTED, REJECTED, INCONCLUSIVE = "promoted", "rejected", "inconclusive"
AWAITING_APPROVAL = "awaiting_approval"
REJECTED_BY_APPROVER, APPROVAL_TIMED_OUT = "rejected_by_approver", "approval_timed_out"
CHAMPION_MOVED = "champion_moved"

# version tags
PROMOTION, PROMOTION_REASON, GATE_OUTCOME = "promotion", "promotion_reason", "gate_outcome"
SET_BY, SET_REASON, SET_AT = "champion.set_by", "champion.set_reason", "champion.set_at"
# registered-model tags
HISTORY, PENDING = "champion.history", "champion.pending"
HISTORY_KEEP = 50

# what made a version champion (``action`` of a history entry)
ACTIONS = ("promoted", "approved", "set", "rollback")


class ChampionError(PipelineError):
    """No such model or version, its files are gone, or nothing to roll back to (the message
    says which and what to do)."""


class ChampionMovedError(ChampionError):
    """The alias is not held by the version the move expected: someone moved it meanwhile.

    Attributes:
        expected, found: the versions (int, or None for no champion).
    """

    def __init__(self, message: str, expected: int | None, found: int | None):
        super().__init__(message)
        self.expected, self.found = expected, found


@dataclass(frozen=True)
class GateDecision:
    """The gate's outcome (``promoted`` / ``rejected`` / ``inconclusive``), whether the alias
    moves, why, and the numbers behind it (for the log, the version's tags and the parent run)."""

    outcome: str
    promote: bool
    reason: str
    numbers: dict = field(default_factory=dict)


def registered_model(client, model: str):
    """The ``RegisteredModel``, or None when it does not exist.

    Raises:
        MlflowException: any other error: a failed read is never taken for "no model".
    """
    from mlflow.exceptions import MlflowException

    try:
        return client.get_registered_model(model)
    except MlflowException as err:
        if err.error_code == "RESOURCE_DOES_NOT_EXIST":
            return None
        raise


def holder(client, model: str, alias: str = ALIAS) -> int | None:
    """The version number holding ``alias``, or None (no such model or alias)."""
    registered = registered_model(client, model)
    version = None if registered is None else (registered.aliases or {}).get(alias)
    return None if version is None else int(version)


def current(client, model: str, alias: str = ALIAS):
    """The ``ModelVersion`` holding ``alias``, or None (no such model or alias)."""
    version = holder(client, model, alias)
    return None if version is None else client.get_model_version(model, str(version))


def versions(client, model: str, tags: dict[str, Any] | None = None) -> list:
    """The ``ModelVersion`` s of ``model`` whose tags include ``tags`` (values compared as
    text), newest first; [] when the registered model does not exist."""
    if registered_model(client, model) is None:
        return []
    wanted = {k: str(v) for k, v in (tags or {}).items()}
    found = client.search_model_versions(f"name = '{model}'")
    matching = [v for v in found if all(v.tags.get(k) == x for k, x in wanted.items())]
    return sorted(matching, key=lambda v: int(v.version), reverse=True)


def register_version(client, model: str, source: str, run_id: str, tags: dict[str, Any], model_id=None):
    """A new version of ``model`` (the registered model created if missing) from ``source``
    (a logged model's artifact location, with its ``model_id``), its ``tags`` as text."""
    if registered_model(client, model) is None:
        client.create_registered_model(model)
    text = {k: str(v) for k, v in tags.items()}
    return client.create_model_version(model, source, run_id=run_id, tags=text, model_id=model_id)


def version_of_training(client, model: str, dag_run: str, checkpoint: str):
    """The version an earlier attempt registered for this training: tagged with the DAG run
    (``<dag_id>/<run_id>``; a retried task) or, failing that, with the same checkpoint (a
    re-run of the same model); None when there is none. A retry reuses it instead of
    registering the model twice."""
    earlier = versions(client, model, {"dag_run": dag_run})
    earlier = earlier or versions(client, model, {"checkpoint": checkpoint})
    return earlier[0] if earlier else None


def inconclusive_streak(client, model: str, version: str | int) -> int:
    """Inconclusive gates that kept the champion, in a row before ``version``: the versions
    registered before it, newest first, up to the first that was decided or promoted (tags
    ``gate_outcome``, ``promotion``)."""
    streak = 0
    for v in (v for v in versions(client, model) if int(v.version) < int(version)):
        if v.tags.get(GATE_OUTCOME) != INCONCLUSIVE or v.tags.get(PROMOTION) == PROMOTED:
            break
        streak += 1
    return streak


def tag_decision(client, model: str, version: str, decision: GateDecision, promotion: str, reason: str,
                 streak: int) -> None:  # fmt: skip
    """The gate's decision on ``version``'s tags: ``promotion`` (what became of it: one of
    the outcomes above), ``gate_outcome`` (the gate's own), ``promotion_reason``,
    ``inconclusive_days`` (the streak) and the gate's numbers as ``gate.<name>``."""
    tags = {
        PROMOTION: promotion,
        GATE_OUTCOME: decision.outcome,
        PROMOTION_REASON: reason,
        "inconclusive_days": streak,
        **{f"gate.{k}": v for k, v in decision.numbers.items()},
    }
    tag_version(client, model, version, tags)


def tag_version(client, model: str, version: str | int, tags: dict[str, Any]) -> None:
    """Set ``tags`` (values as text) on ``model``'s ``version``."""
    for key, value in tags.items():
        client.set_model_version_tag(model, str(version), key, str(value))


def _tag(client, model: str, key: str, default: str) -> str:
    registered = registered_model(client, model)
    return default if registered is None else (registered.tags or {}).get(key, default)


def history(client, model: str, alias: str = ALIAS) -> list[dict[str, Any]]:
    """The moves, oldest first: ``{"version", "previous", "by", "reason", "at", "action"}``
    (``action``: one of ``ACTIONS``; entries written before it existed read as ``set``)."""
    moves = json.loads(_tag(client, model, _key(HISTORY, alias), "[]"))
    return [{"action": "set", **m} for m in moves]


def _key(tag: str, alias: str) -> str:
    return tag if alias == ALIAS else f"{tag}.{alias}"


@contextmanager
def registry_lock(model: str, alias: str = ALIAS) -> Iterator[None]:
    """Hold the lock of ``model``'s ``alias`` (``<var>/locks/registry/``) for the block: the
    read-compare-write of a move is one step for every process sharing the var dir."""
    path = var_dir() / "locks" / "registry" / f"{model}.{alias}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def move_alias(
    client,
    model: str,
    version: int | str,
    expect: int | str | None,
    *,
    by: str,
    reason: str,
    action: str,
    alias: str = ALIAS,
    move_id: str | None = None,
) -> dict[str, Any]:
    """Compare-and-set: move ``alias`` to ``version`` if ``expect`` holds it now.

    Args:
        expect: the version the caller saw holding the alias (None: no champion).
        by, reason: who and why (tags and history).
        action: what the move is (``ACTIONS``).
        move_id: the id of a pending move this finishes (``begin``).

    Returns:
        The history entry: ``{"version", "previous", "by", "reason", "at", "action", "id"}``.

    Raises:
        ChampionMovedError: another version (or none) holds the alias; nothing was written.
    """
    if action not in ACTIONS:
        raise ValueError(f"action {action!r}: one of {ACTIONS}")
    expected = None if expect in (None, "") else int(expect)
    with registry_lock(model, alias):
        found = holder(client, model, alias)
        moves = history(client, model, alias)
        # a retry of this very move whose alias was set before its record: finish the record
        # (not when another move has since recorded this version as its own)
        unrecorded = not moves or moves[-1]["version"] != found
        finishing = move_id is not None and found == int(version) and found != expected and unrecorded
        if finishing:
            found = expected
        elif found != expected:
            last = next((m for m in reversed(moves) if m["version"] == found), None)
            who = f" (moved by {last['by']} at {last['at']}: {last['reason']})" if last else ""
            raise ChampionMovedError(
                f"{model}: the {alias} is version {found}, not {expected} as this {action} expected{who}; "
                "nothing was moved. Look again (recpipe champion show) and decide on the current state",
                expected,
                found,
            )
        record = {
            "version": int(version),
            "previous": found,
            "by": by,
            "reason": reason,
            "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "action": action,
            "id": move_id or uuid.uuid4().hex,
        }
        if not finishing:
            client.set_registered_model_alias(model, alias, str(version))
        for tag, value in ((SET_BY, by), (SET_REASON, reason), (SET_AT, record["at"])):
            client.set_model_version_tag(model, str(version), tag, value)
        moves = [*moves, *_unrecorded_plan(client, model, alias, found, moves, record["id"]), record]
        client.set_registered_model_tag(model, _key(HISTORY, alias), json.dumps(moves[-HISTORY_KEEP:]))
        describe_history(client, model, moves[-HISTORY_KEEP:], alias)
    return record


def history_table(moves: list[dict[str, Any]], alias: str = ALIAS) -> str:
    """The moves of ``alias`` as a Markdown table, newest first: when, the version, the one it
    replaced, what moved it, who and why (the registered model's page renders it)."""
    head = f"#### {alias} history (recpipe)\n\n| at (UTC) | version | replaced | action | by | reason |\n"
    rows = "".join(
        f"| {m['at']} | {m['version']} | {m['previous'] if m['previous'] is not None else '-'} | "
        f"{m['action']} | {_cell(m['by'])} | {_cell(m['reason'])} |\n"
        for m in reversed(moves)
    )
    return head + "| --- | --- | --- | --- | --- | --- |\n" + rows


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def describe_history(client, model: str, moves: list[dict[str, Any]], alias: str = ALIAS) -> None:
    """Write ``history_table`` into the registered model's description between markers of its
    own, keeping whatever else a person wrote there (called under the move's lock)."""
    start, end = f"<!-- recpipe:{alias}-history -->", f"<!-- /recpipe:{alias}-history -->"
    text = client.get_registered_model(model).description or ""
    block = f"{start}\n{history_table(moves, alias)}{end}"
    if start in text and end in text:
        text = text[: text.index(start)] + block + text[text.index(end) + len(end) :]
    else:
        text = f"{text.rstrip()}\n\n{block}" if text.strip() else block
    client.update_registered_model(model, description=text)


def _unrecorded_plan(client, model: str, alias: str, found, moves: list, move_id: str) -> list[dict]:
    """The pending plan's history entry when its alias move happened and its record did not
    (its process was cut off) and another move now follows it: the chain stays whole."""
    plan = pending(client, model, alias)
    if plan is None or plan.get("id") == move_id or plan.get("version") != found:
        return []
    if any(m.get("id") == plan["id"] for m in moves):
        return []
    at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    keys = ("version", "previous", "by", "reason", "action", "id")
    return [{**{k: plan.get(k) for k in keys}, "at": at}]


def pending(client, model: str, alias: str = ALIAS) -> dict[str, Any] | None:
    """The move written ahead and not finished (``begin``), or None."""
    return json.loads(_tag(client, model, _key(PENDING, alias), "null"))


def begin(client, model: str, plan: dict[str, Any], alias: str = ALIAS) -> None:
    """Write ``plan`` (``{"id", "version", "previous", "action", "by", "reason"}``) ahead of a
    move whose work goes on after the alias (``finish`` clears it)."""
    client.set_registered_model_tag(model, _key(PENDING, alias), json.dumps(plan))


def finish(client, model: str, move_id: str, alias: str = ALIAS) -> None:
    """Clear the pending move ``move_id`` (another one pending is left alone)."""
    with registry_lock(model, alias):
        plan = pending(client, model, alias)
        if plan is not None and plan.get("id") == move_id:
            client.delete_registered_model_tag(model, _key(PENDING, alias))


def resume(client, model: str, plan: dict[str, Any], alias: str = ALIAS) -> dict[str, Any]:
    """Bring the alias where the pending ``plan`` moves it: nothing when it is there already
    (its history entry is returned), the move when ``plan["previous"]`` still holds it.

    Raises:
        ChampionMovedError: a third version holds the alias (the plan no longer applies); the
            plan is cleared first, so the next move starts from the alias as it is.
    """
    found = holder(client, model, alias)
    if found == plan["version"]:
        done = [m for m in history(client, model, alias) if m.get("id") == plan["id"]]
        if done:
            return done[-1]
    try:
        return move_alias(
            client, model, plan["version"], plan["previous"], by=plan["by"], reason=plan["reason"],
            action=plan["action"], alias=alias, move_id=plan["id"],
        )  # fmt: skip
    except ChampionMovedError:
        # refused: the alias never moved for this plan and never will, so nothing is left
        # pending for a later move to resume (and be refused again)
        finish(client, model, plan["id"], alias)
        raise


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


def former_champions(client, model: str, alias: str = ALIAS) -> list:
    """The versions a rollback may go to, in the order rollbacks take them: first what the
    last move replaced (when that move was not itself a rollback), then every earlier
    champion below the current one (in the history, or promoted by its gate) that was not
    rolled back from since, newest first. ``ModelVersion`` objects; [] without a champion."""
    champion = holder(client, model, alias)
    if champion is None:
        return []
    moves = history(client, model, alias)
    rolled_back: set[int] = set()
    held: set[int] = set()
    for m in moves:
        held.add(m["version"])
        if m["action"] == "rollback" and m["previous"] is not None:
            rolled_back.add(m["previous"])
        else:
            rolled_back.discard(m["version"])
    versions = {int(v.version): v for v in client.search_model_versions(f"name = '{model}'")}
    promoted = {n for n, v in versions.items() if v.tags.get(PROMOTION) == PROMOTED}
    order: list[int] = []
    last = moves[-1] if moves else None
    if (
        last
        and last["version"] == champion
        and last["action"] != "rollback"
        and last["previous"] not in (None, champion)
    ):
        order.append(last["previous"])
    earlier = sorted((held | promoted) - rolled_back - {champion}, reverse=True)
    order += [n for n in earlier if n < champion and n not in order]
    return [versions[n] for n in order if n in versions]


def rollback_target(client, model: str, alias: str = ALIAS):
    """The version a rollback moves ``alias`` to (the first of ``former_champions``).

    Raises:
        ChampionError: no champion, or no earlier one.
    """
    if holder(client, model, alias) is None:
        raise ChampionError(f"{model} has no {alias}: nothing to roll back")
    earlier = former_champions(client, model, alias)
    if not earlier:
        raise ChampionError(f"{model}: no champion before the current one: nothing to roll back to")
    return earlier[0]
