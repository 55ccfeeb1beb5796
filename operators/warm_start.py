"""Which model a training job fine-tunes from, and so which model is "the model as it stands"
before a pass: one rule for the train task and the stream's progressive evaluation."""

from __future__ import annotations

from pathlib import Path

from recpipe.errors import PipelineError
from recpipe.layout import day_of, day_root, finished_model_dirs, is_finished, partition_ds
from recpipe.registry import PROMOTED, PROMOTION


class ChampionGoneError(PipelineError):
    """The champion's model dir is gone: never replaced by another model in silence."""


def source(
    root: Path,
    ds: str,
    model_dir: Path | None,
    registered=None,
    previous_pass: bool = False,
    cold_start_from: str | None = None,
) -> tuple[Path | None, str]:
    """The model dir under ``root`` to start ``ds`` from, never a rejected model, and why.

    In order:

    1. ``previous_pass`` (``ds`` a pass, ``YYYY-MM-DD/HH``): the newest finished pass of the
       same day before it, as long as the day's chain started from the ``alias`` version
       (``recpipe.layout.day_root``): after the champion was moved during the day (a
       rollback), the day's next pass starts again from the champion, and its export rebases
       the day's chain on it (``trainer.delta.write_export``);
    2. with ``registered`` = ``(hook, model_name, alias)``: the model dir of the ``alias``
       version, else of the newest version tagged ``promotion: promoted``, dated before ``ds``
       and finished; None when versions exist but none qualifies (a rejected model is never
       built on: a stream day after a rejected close starts again from the champion);
    3. the newest finished model dir dated before ``ds`` (nothing registered yet);
    4. with ``cold_start_from`` (another registered model's name) and ``registered``, where
       the rules above found nothing: that model's ``alias`` version's model dir, dated
       before ``ds`` and finished (a new stream starts from the daily model's champion).

    Args:
        root: the runs root (``<runs_dir>/<model_name>``).
        ds: the day or pass to train (or score).
        model_dir: the job's own model dir, never its own source (None: none).

    Raises:
        MlflowException: the registry could not be read (the task fails and is retried; it
            never falls back to an unvetted model dir).
        ChampionGoneError: the ``alias`` version, dated before ``ds``, has lost its model dir
            (names the version and the way out), rather than a silent fallback.
    """
    own = model_dir.resolve() if model_dir is not None else None
    champion = None
    if registered:
        hook, model_name, alias = registered
        champion = hook.champion(model_name, alias)
    if previous_pass:
        today = [p for p in finished_model_dirs(root, before=ds) if day_of(partition_ds(p)) == day_of(ds)]
        if today and today[-1].resolve() != own:
            held = _usable(champion, ds, own) if champion is not None else None
            # the day's chain is walked back only when there is a champion to compare it with
            started = day_root(today[-1]) if held is not None else None
            if started is None or started == held.resolve():
                return today[-1], "the day's previous pass"
            return held, (
                f"{alias} version {champion.version}: the day's passes so far descend from "
                f"{started}, which is no longer the {alias}; the day starts again from it"
            )

    found, why = _registered_or_newest(root, ds, own, registered, champion)
    if found is None and cold_start_from and registered:
        hook, _, alias = registered
        other = hook.champion(cold_start_from, alias)
        if other is not None and (start := _usable(other, ds, own)):
            return start, f"{cold_start_from} {alias} version {other.version} (a cold start: {why})"
    return found, why


def _usable(version, ds: str, own: Path | None) -> Path | None:
    """``version``'s model dir when it is a start for ``ds``: tagged, finished, not ``own``,
    and dated before ``ds``'s day (a model of a pass's own day trained on its rows)."""
    path, day = version.tags.get("model_dir"), version.tags.get("ds", "")
    if not path or not day or day >= day_of(ds) or not is_finished(path):
        return None
    return None if Path(path).resolve() == own else Path(path)


def _registered_or_newest(root: Path, ds: str, own, registered, champion) -> tuple[Path | None, str]:
    """Rules 2 and 3 of ``source``."""
    if registered:
        hook, model_name, alias = registered
        if champion is not None and (found := _usable(champion, ds, own)):
            return found, f"{alias} version {champion.version}"
        if champion is not None:
            path, day = champion.tags.get("model_dir"), champion.tags.get("ds", "")
            theirs = path and own is not None and Path(path).resolve() == own
            if day and day < ds and not theirs and not (path and is_finished(path)):
                raise ChampionGoneError(
                    f"{model_name} {alias} version {champion.version} ({day}): its model dir "
                    f"{path or '(untagged)'} is gone, so nothing vetted to fine-tune from: set another "
                    f"champion (recpipe champion set --model_name {model_name} --version N --reason ..., "
                    "or rollback), or run with the Param full_retrain"
                )
        versions = hook.versions(model_name)
        if versions:
            for version in versions:
                if version.tags.get(PROMOTION) == PROMOTED and (found := _usable(version, ds, own)):
                    return found, f"newest promoted version {version.version}"
            return None, f"no promoted version of {model_name} dated before {ds}"
    found = finished_model_dirs(root, before=ds)
    if not found or found[-1].resolve() == own:
        return None, "no earlier finished model dir"
    return found[-1], "newest finished model dir (nothing registered yet)"
