"""``ValidateFeaturesOperator``: checks of a prepared day before any training on it."""

from __future__ import annotations

import json
import logging
from datetime import date, timedelta
from pathlib import Path

from operators.base import RecpipeOperator
from operators.paths import project_home
from recpipe.config.retrain import ValidationConfig
from recpipe.layout import FeaturePartition, partition_ds

log = logging.getLogger(__name__)


class FeatureValidationError(ValueError):
    """The day's features fail a check; the message names the file and the bound."""


def drift(today: dict, before: dict, tolerance: float) -> tuple[dict[str, float], list[str]]:
    """Relative changes between two days' ``_stats.json`` and the ones above ``tolerance``.

    Compared: ``rows``, ``positive_rate``, each column's null share, each dense feature's mean.

    Returns:
        ({"drift.<name>": relative change}, ["<name>: <before> -> <today> (+x%)", ...])
    """

    def shares(stats: dict) -> dict[str, float]:
        values = {"rows": stats["rows"], "positive_rate": stats.get("positive_rate") or 0.0}
        rows = max(stats["rows"], 1)
        values.update({f"null_share.{c}": n / rows for c, n in stats.get("nulls", {}).items()})
        for name, m in stats.get("dense_moments", {}).items():
            if m.get("count"):
                values[f"mean.{name}"] = m["sum"] / m["count"]
        return values

    now, then = shares(today), shares(before)
    changes, warnings = {}, []
    for key in sorted(now.keys() & then.keys()):
        a, b = then[key], now[key]
        if a == b:
            rel = 0.0
        elif abs(a) < 1e-12:
            rel = float("inf") if abs(b) > 1e-6 else 0.0
        else:
            rel = (b - a) / abs(a)
        changes[f"drift.{key}"] = rel if rel != float("inf") else 1e9
        if abs(rel) > tolerance:
            warnings.append(f"{key}: {a:.4g} -> {b:.4g} ({rel:+.0%})")
    return changes, warnings


class ValidateFeaturesOperator(RecpipeOperator):
    """Check the day's ``_stats.json``: enough rows and a positive rate within bounds (else
    fail), and report drift against the newest prepared day before it (warn, never fail). The
    stats, the drift and the warnings go to the log and to an MLflow nested run ``prepare``.

    Args:
        ds: the day (templated).
        validation: the retrain config's ``validation`` section whole (``ValidationConfig`` or
            its dict; default: its defaults): ``min_rows``, ``positive_rate_min`` /
            ``positive_rate_max`` (the checks), ``drift_tolerance`` (relative change above which
            drift is reported), ``drift_lookback_days`` (how far back to look for the previous
            prepared day).

    Returns (XCom): ``{"rows", "positive_rate", "drift_warnings", "previous_ds", "mlflow_run_id"}``.

    Raises:
        FeatureValidationError: missing stats, too few rows or a positive rate out of bounds.
    """

    template_fields = (*RecpipeOperator.template_fields, "ds")
    ui_color = "#f7f3d4"

    def __init__(
        self,
        *,
        ds: str = "{{ ds }}",
        validation: ValidationConfig | dict | None = None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.ds = ds
        self.validation = ValidationConfig.model_validate(validation or {})

    def execute(self, context) -> dict:
        config = self.load_config()
        root = project_home() / config.train_input_path
        day = FeaturePartition.of(root, self.ds)
        path = day.stats
        if not day.success.exists() or not path.exists():
            raise FeatureValidationError(f"{path}: missing (the feature job did not finish ds={self.ds})")
        stats = json.loads(path.read_text())
        rules = self.validation
        if stats["rows"] < rules.min_rows:
            raise FeatureValidationError(f"{path}: rows={stats['rows']} < min_rows={rules.min_rows}")
        rate = stats.get("positive_rate")
        if rate is None or not rules.positive_rate_min <= rate <= rules.positive_rate_max:
            raise FeatureValidationError(
                f"{path}: positive_rate={rate} outside [{rules.positive_rate_min}, {rules.positive_rate_max}]"
            )
        previous = self._previous(root)
        changes, warnings = {}, []
        if previous is not None:
            changes, warnings = drift(stats, json.loads(previous.read_text()), rules.drift_tolerance)
            for w in warnings:
                log.warning("drift against %s: %s", previous.parent.name, w)
        run = self._track(context, path, stats, changes, warnings)
        return {
            "rows": stats["rows"],
            "positive_rate": rate,
            "previous_ds": partition_ds(previous.parent) if previous else None,
            "drift_warnings": warnings,
            "mlflow_run_id": run,
        }

    def _previous(self, root: Path) -> Path | None:
        day = date.fromisoformat(self.ds)
        for k in range(1, self.validation.drift_lookback_days + 1):
            candidate = FeaturePartition.of(root, (day - timedelta(days=k)).isoformat()).stats
            if candidate.exists():
                return candidate
        return None

    def _track(self, context, path: Path, stats: dict, changes: dict, warnings: list[str]) -> str:
        values = {
            "rows": stats["rows"],
            "rows_quarantined": stats.get("rows_quarantined", 0),
            "positive_rate": stats["positive_rate"],
            **{f"nulls.{c}": n for c, n in stats.get("nulls", {}).items()},
            **changes,
        }
        return self.hook.log_task_run(
            self.parent_run_id(context),
            "prepare",
            tags={"ds": self.ds, "drift_warnings": "; ".join(warnings) or "none"},
            metrics=[(k, v, 0) for k, v in values.items()],
            parent_metrics=[
                ("prepare.rows", stats["rows"], 0),
                ("prepare.positive_rate", stats["positive_rate"], 0),
            ],
            parent_tags={"drift_warnings": "; ".join(warnings)} if warnings else None,
            artifacts=[(path, "features"), (FeaturePartition(path.parent).normalization, "features")],
        )
