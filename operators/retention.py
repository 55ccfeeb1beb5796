"""``RetentionOperator``: delete old model dirs, keeping the last K days and the champion's."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from operators.base import RecpipeOperator
from operators.paths import confine
from recpipe import locks
from recpipe.layout import ModelDir

log = logging.getLogger(__name__)


def expired(runs_root: Path, keep_days: int, protected: set[Path]) -> list[Path]:
    """The ``ds=`` model dirs beyond the newest ``keep_days``, except ``protected`` ones."""
    days = sorted((p for p in runs_root.glob("ds=*") if p.is_dir()), reverse=True)
    return [p for p in days[keep_days:] if p.resolve() not in protected]


class RetentionOperator(RecpipeOperator):
    """Keep the newest ``keep_days`` model dirs (checkpoints included) under ``runs_root``
    and the model dir of every version holding ``alias``; delete the rest. A dir is first
    stripped of its ``_SUCCESS`` marker and renamed aside, so a half-deleted one is never
    taken for a finished model by the next day's warm start. A dir a job trains or fine-tunes
    from right now (``recpipe.locks``) is kept until a later run.

    Args:
        runs_root: ``<runs_dir>/<model_name>`` (templated).
        keep_days: how many day dirs to keep.
        model_name, alias: whose champion is protected.
        end_parent_run: end the DAG run's MLflow parent run, if a task created one (the last
            task of a DAG whose runs do not all register: ``recpipe_stream_retrain``).

    Returns (XCom): the deleted paths.
    """

    template_fields = (*RecpipeOperator.template_fields, "runs_root", "model_name")

    def __init__(
        self,
        *,
        runs_root: str,
        keep_days: int,
        model_name: str,
        alias: str = "champion",
        end_parent_run: bool = False,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.end_parent_run = end_parent_run
        self.runs_root = runs_root
        self.keep_days = keep_days
        self.model_name = model_name
        self.alias = alias

    def execute(self, context) -> list[str]:
        root = confine(self.runs_root, "runs_root")
        protected = set()
        champion = self.hook.champion(self.model_name, self.alias)
        if champion is not None and champion.tags.get("model_dir"):
            protected.add(Path(champion.tags["model_dir"]).resolve())
        deleted = []
        for path in expired(root, self.keep_days, protected):
            with locks.deleting(path) as free:
                if not free:  # a job trains it or fine-tunes from it right now
                    log.info("retention: %s is in use; kept until the next run", path)
                    continue
                ModelDir(path).success.unlink(missing_ok=True)
                aside = path.with_name(f".deleting-{path.name}")
                path.rename(aside)
                shutil.rmtree(aside)
            deleted.append(str(path))
            log.info("retention: deleted %s", path)
        log.info(
            "retention: kept %d newest day(s) and %s",
            self.keep_days,
            sorted(map(str, protected)) or "no champion",
        )
        if self.end_parent_run:
            parent = self.hook.parent_run(
                self.experiment_name(), context["dag"].dag_id, context["run_id"], {}, create=False
            )
            if parent is not None:  # a quiet pass logged nothing
                self.hook.end_run(parent)
        return deleted
