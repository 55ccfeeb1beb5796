"""``ExportOperator``: the SavedModel for serving, logged to MLflow as the version's source."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from airflow.sdk import Asset

from operators.base import JobOperator
from operators.paths import confine
from recpipe import atomic
from recpipe.layout import ModelDir

log = logging.getLogger(__name__)


def export_asset(model_name: str) -> Asset:
    """The Airflow asset a model's exports update (``recpipe://exports/<model_name>``)."""
    return Asset(f"recpipe://exports/{model_name}", group="model")


class ExportOperator(JobOperator):
    """Export ``model_dir``'s latest checkpoint to ``export_dir/<version>/`` (TF Serving's
    layout, written to a temporary directory and renamed) and, as an MLflow Model (pyfunc over
    the SavedModel, ``trainer/mlflow_model.py``), log it as an MLflow 3 ``LoggedModel`` of the
    nested ``export`` run: ``mlflow.pyfunc.load_model`` and ``mlflow models serve`` take the
    registered version. A retry reuses an export the previous attempt finished.

    Args:
        model_dir: the trained model dir (templated).
        export_dir: the model's export root, e.g. ``var/exports/<model_name>`` (templated).
        record_name: the file in ``model_dir`` recording the export, for a retry.

    Returns (XCom): ``{"export_path", "global_step", "mlflow_model", "model_id", "artifact_uri"
    (the logged model's artifact location), "mlflow_run_id"}``.
    """

    template_fields = (*JobOperator.template_fields, "model_dir", "export_dir")
    ui_color = "#f7ecd4"

    def __init__(self, *, model_dir: str, export_dir: str, record_name: str = "export.json", **kwargs):
        super().__init__(**kwargs)
        self.model_dir = model_dir
        self.export_dir = export_dir
        self.record_name = record_name

    def execute(self, context) -> dict:
        out = ModelDir(confine(self.model_dir, "model_dir"))
        export_dir = confine(self.export_dir, "export_dir")
        record = out.path / self.record_name
        done = json.loads(record.read_text()) if record.exists() else None
        if done and Path(done["export_path"]).is_dir():
            log.info("reusing the export %s of an earlier attempt", done["export_path"])
        else:
            self.load_config()
            args = [*self.config_args(), "--model_dir", str(out.path), "--export_dir", str(export_dir)]
            summary = self.run_command("export", "trainer.export", args, out.logs)
            done = {
                "export_path": summary["export"],
                "global_step": summary["global_step"],
                "mlflow_model": summary["mlflow_model"],
                "peak_rss_mb": summary.get("peak_rss_mb"),
            }
            atomic.write_text(record, json.dumps(done))
        peak = done.get("peak_rss_mb")
        run = self.hook.log_task_run(
            self.parent_run_id(context),
            "export",
            tags={"export_path": done["export_path"]},
            metrics=[("peak_rss_mb", peak, done["global_step"])] if peak else (),
        )
        # the MLflow Model (pyfunc over the SavedModel) as a LoggedModel: the version's source
        model = self.hook.log_model(
            run,
            Path(export_dir).name,
            done.get("mlflow_model") or done["export_path"],
            {"global_step": done["global_step"], "export_path": done["export_path"]},
        )
        # the version's source is the logged model's artifact location: a ``models:/<id>``
        # source would be resolved through the process's global tracking URI, not the hook's
        return {
            **done,
            "model_id": model.model_id,
            "artifact_uri": model.artifact_location,
            "mlflow_run_id": run,
        }
