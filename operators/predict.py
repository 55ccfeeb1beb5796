"""``BatchPredictOperator``: the day's partition scored by the champion after the gate
(``recpipe predict`` as a job on this worker), its row count checked and logged to MLflow."""

from __future__ import annotations

import logging

from airflow.sdk.exceptions import AirflowSkipException

from operators.base import JobOperator
from operators.paths import confine
from predict.files import count_rows, data_files, file_format
from recpipe.config.retrain import BatchPredictConfig
from recpipe.errors import PipelineError
from recpipe.layout import ModelDir

log = logging.getLogger(__name__)


class BatchPredictMismatchError(PipelineError):
    """The scores do not hold one row per input row."""


class BatchPredictOperator(JobOperator):
    """Score ``batch_predict.input_path`` with the version of ``model_name`` that ``alias``
    names when the task runs (after the gate and any approval: the champion that serves) into
    ``batch_predict.output_path`` (replaced whole), then check that the output holds the
    input's rows and log a nested ``batch_predict`` run (the version, the paths, ``rows``).

    Args:
        model_name, alias: the registered model and the alias that scores.
        batch_predict: the retrain config's ``batch_predict`` section; its paths are templated.
        model_dir: the day's model dir, whose ``logs/`` keep the job's log (templated).

    Returns (XCom): ``{"version", "export_path", "output_path", "rows"}``.

    Raises:
        AirflowSkipException: no version holds the alias yet.
        BatchPredictMismatchError: the output's rows differ from the input's.
    """

    template_fields = (*JobOperator.template_fields, "input_path", "output_path", "model_dir")
    ui_color = "#e4f1d9"

    def __init__(
        self, *, model_name: str, batch_predict: BatchPredictConfig | dict, model_dir: str,
        alias: str = "champion", **kwargs,
    ):  # fmt: skip
        super().__init__(**kwargs)
        self.model_name, self.alias, self.model_dir = model_name, alias, model_dir
        self.settings = BatchPredictConfig.model_validate(batch_predict)
        self.input_path, self.output_path = self.settings.input_path, self.settings.output_path

    def execute(self, context) -> dict:
        version = self.hook.champion(self.model_name, self.alias)
        if version is None:
            raise AirflowSkipException(f"{self.model_name} has no {self.alias} yet: nothing scores")
        export = confine(version.tags.get("export_path", ""), "export_path")
        source = confine(self.input_path, "batch_predict.input_path")
        target = confine(self.output_path, "batch_predict.output_path")
        config = self.load_config()
        s = self.settings
        with_header = config.data_config.with_header if s.with_header is None else s.with_header
        args = [
            "--input_path", str(source), "--output_path", str(target), "--saved_model_dir", str(export),
            "--reserved_cols", s.reserved_cols, "--output_cols", s.output_cols,
            "--batch_size", str(s.batch_size),
            f"--with_header={str(with_header).lower()}",
            *(["--output_format", s.output_format] if s.output_format else []),
            *(["--input_sep", s.input_sep] if s.input_sep is not None else []),
        ]  # fmt: skip
        logs = ModelDir(confine(self.model_dir, "model_dir")).logs
        summary = self.run_command("batch_predict", "predict.cli", args, logs)
        rows_in = count_rows(source, with_header=with_header)
        rows_out = count_rows(target, fmt=s.output_format or file_format(data_files(source)))
        if not rows_in == rows_out == summary["rows"]:
            raise BatchPredictMismatchError(
                f"batch_predict: {target} holds {rows_out} rows, {source} {rows_in} "
                f"(the job wrote {summary['rows']})"
            )
        log.info("version %s scored %d rows of %s into %s", version.version, rows_out, source, target)
        self.hook.log_task_run(
            self.parent_run_id(context),
            "batch_predict",
            tags={"model_version": version.version, "export_path": str(export), "alias": self.alias},
            params={"input_path": str(source), "output_path": str(target), "output_cols": s.output_cols},
            metrics=[("rows", rows_out, 0)],
            parent_metrics=[("batch_predict.rows", rows_out, 0)],
        )
        return {
            "version": int(version.version),
            "export_path": str(export),
            "output_path": str(target),
            "rows": rows_out,
        }
