"""``RetentionOperator``: delete old model dirs, keeping the last K days, the champion's and
those of the champions a rollback may return to (which dirs it may touch:
``recpipe.layout.expired_model_dirs``), and old SavedModel versions, keeping the newest
``export_config.exports_to_keep`` and the same champions'."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from operators.base import RecpipeOperator
from operators.paths import confine
from recpipe import atomic, locks, registry
from recpipe.layout import ModelDir, day_dirs, expired_model_dirs, is_pass_dir

log = logging.getLogger(__name__)


class RetentionOperator(RecpipeOperator):
    """Keep the model dirs (checkpoints included) of the newest ``keep_days`` days under
    ``runs_root``, in the daily layout (``ds=D``) and the hourly one (``ds=D/hh=HH``), and
    the model dir and checkpoint of the version holding ``alias`` and of the ``keep_champions``
    former champions a rollback reaches first (``recpipe.registry.former_champions``); delete
    the rest, then day
    dirs left empty and the leftovers of interrupted writes and deletions
    (``atomic.sweep``). A dir is first
    stripped of its ``_SUCCESS`` marker and renamed aside, so a half-deleted one is never
    taken for a finished model by the next day's warm start. A dir a job trains or fine-tunes
    from right now (``recpipe.locks``) is kept until a later run.

    Args:
        runs_root: ``<runs_dir>/<model_name>`` (templated).
        keep_days: how many day dirs to keep.
        model_name, alias: whose champion is protected.
        keep_champions: former champions kept as rollback targets (model dir, checkpoint and
            export; the retrain config's ``retention_champions``).
        end_parent_run: end the DAG run's MLflow parent run, if a task created one (the last
            task of a DAG whose runs do not all register: ``recpipe_stream_retrain``).
        export_root: ``<export_dir>/<model_name>`` (templated): its numbered SavedModel
            versions beyond the newest ``export_config.exports_to_keep`` (the run's pipeline
            config, overrides applied) go, never the champion's (its ``export_path`` tag);
            None: exports are not touched.

    Returns (XCom): the deleted paths.
    """

    template_fields = (*RecpipeOperator.template_fields, "runs_root", "model_name", "export_root")

    def __init__(
        self,
        *,
        runs_root: str,
        keep_days: int,
        model_name: str,
        alias: str = "champion",
        keep_champions: int = 2,
        end_parent_run: bool = False,
        export_root: str | None = None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.keep_champions = keep_champions
        self.export_root = export_root
        self.end_parent_run = end_parent_run
        self.runs_root = runs_root
        self.keep_days = keep_days
        self.model_name = model_name
        self.alias = alias

    def execute(self, context) -> list[str]:
        root = confine(self.runs_root, "runs_root")
        protected = set()
        champion = self.hook.champion(self.model_name, self.alias)
        kept = [] if champion is None else [champion]
        if champion is not None and self.keep_champions:
            former = registry.former_champions(self.hook.get_client(), self.model_name, self.alias)
            kept += former[: self.keep_champions]
        for version in kept:
            for tag in ("model_dir", "checkpoint"):
                if version.tags.get(tag):
                    protected.add(Path(version.tags[tag]).resolve())
        deleted_exports = []
        if self.export_root is not None:
            keep = self.load_config().export_config.exports_to_keep
            exports = {v.tags["export_path"] for v in kept if v.tags.get("export_path")}
            deleted_exports = self._expire_exports(confine(self.export_root, "export_root"), keep, exports)
        deleted = []
        for path in expired_model_dirs(root, self.keep_days, protected):
            with locks.deleting(path) as free:
                if not free:  # a job trains it or fine-tunes from it right now
                    log.info("retention: %s is in use; kept until the next run", path)
                    continue
                ModelDir(path).success.unlink(missing_ok=True)
                aside = path.with_name(f"{atomic.DELETING}{path.name}")
                path.rename(aside)
                shutil.rmtree(aside)
            deleted.append(str(path))
            log.info("retention: deleted %s", path)
            day = path.parent
            if is_pass_dir(path) and not [p for p in day.iterdir() if not p.name.startswith(".")]:
                shutil.rmtree(day, ignore_errors=True)  # no pass left: the day goes too
        for leftover in atomic.sweep(root) + [p for d in day_dirs(root) for p in atomic.sweep(d)]:
            log.info("retention: removed the leftover %s", leftover)
        log.info(
            "retention: kept %d newest day(s) and versions %s (the %s and its rollback targets): %s",
            self.keep_days,
            [int(v.version) for v in kept],
            self.alias,
            sorted(map(str, protected)) or "no champion",
        )
        if self.end_parent_run:
            parent = self.hook.parent_run(
                self.experiment_name(), context["dag"].dag_id, context["run_id"], {}, create=False
            )
            if parent is not None:  # a quiet pass logged nothing
                self.hook.end_run(parent)
        return deleted + deleted_exports

    @staticmethod
    def _expire_exports(root: Path, keep: int, protected_exports: set[str]) -> list[str]:
        """Delete the numbered versions under ``root`` older than the newest ``keep``, never
        one of ``protected_exports``; each renamed aside first (a half-deleted one is never
        served)."""
        if not root.is_dir():
            return []
        versions = sorted((p for p in root.iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
        protected = {Path(p).resolve() for p in protected_exports}
        deleted = []
        for path in versions[: max(len(versions) - keep, 0)]:
            if path.resolve() in protected:
                continue
            aside = path.with_name(f"{atomic.DELETING}{path.name}")
            path.rename(aside)
            shutil.rmtree(aside)
            deleted.append(str(path))
            log.info("retention: deleted the export %s (exports_to_keep=%d)", path, keep)
        atomic.sweep(root)
        return deleted
