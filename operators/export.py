"""``ExportOperator``: the SavedModel for serving, logged to MLflow as the version's source."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from airflow.sdk import Asset

from operators.base import JobOperator
from operators.paths import confine

log = logging.getLogger(__name__)
RECORD = "export.json"


def export_asset(model_name: str) -> Asset:
    """The Airflow asset a model's exports update (``recpipe://exports/<model_name>``)."""
    return Asset(f"recpipe://exports/{model_name}", group="model")


class ExportOperator(JobOperator):
    """Export ``model_dir``'s latest checkpoint to ``export_dir/<version>/`` (TF Serving's
    layout, written to a temporary directory and renamed) and log it to MLflow as artifact
    ``model`` of a nested run. A retry reuses an export the previous attempt finished.

    Args:
        model_dir: the trained model dir (templated).
        export_dir: the model's export root, e.g. ``var/exports/<model_name>`` (templated).

    Returns (XCom): ``{"export_path", "global_step", "artifact_uri", "mlflow_run_id"}``.
    """

    template_fields = (*JobOperator.template_fields, "model_dir", "export_dir")
    ui_color = "#f7ecd4"

    def __init__(self, *, model_dir: str, export_dir: str, **kwargs):
        super().__init__(**kwargs)
        self.model_dir = model_dir
        self.export_dir = export_dir

    def execute(self, context) -> dict:
        model_dir = confine(self.model_dir, "model_dir")
        export_dir = confine(self.export_dir, "export_dir")
        record = model_dir / RECORD
        done = json.loads(record.read_text()) if record.exists() else None
        if done and Path(done["export_path"]).is_dir():
            log.info("reusing the export %s of an earlier attempt", done["export_path"])
        else:
            self.load_config()
            args = [
                "--pipeline_config_path",
                str(self.config_path()),
                "--model_dir",
                str(model_dir),
                "--export_dir",
                str(export_dir),
                "--edit_config_json",
                json.dumps(self.edits()),
            ]
            summary = self.run_job("export", "trainer.export", args, model_dir / "logs")
            done = {"export_path": summary["export"], "global_step": summary["global_step"]}
            tmp = model_dir / f".{RECORD}.tmp"
            tmp.write_text(json.dumps(done))
            tmp.replace(record)
        hook = self.hook
        parent = self.parent_run_id(context)
        with hook.nested_run(parent, "export", {"export_path": done["export_path"]}) as run:
            hook.log_artifact(run, done["export_path"], "model")
        return {**done, "artifact_uri": hook.artifact_uri(run, "model"), "mlflow_run_id": run}
