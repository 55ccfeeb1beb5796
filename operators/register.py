"""``RegisterModelOperator``: register the export in MLflow's model registry and move the
``champion`` alias to it only if it is not worse than the champion on the same rows."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

from operators.base import RecpipeOperator

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GateDecision:
    """Whether to promote, and why (for the log and the MLflow tags)."""

    promote: bool
    reason: str


def gate(
    candidate: dict | None,
    champion: dict | None,
    metric: str,
    tolerance: float,
    min_metric: float = 0.5,
) -> GateDecision:
    """The promotion rule.

    A candidate is rejected, champion or not, when its metric is missing or not finite (a
    diverged model scores NaN) or below ``min_metric`` (an AUC under 0.5 ranks worse than
    chance). Otherwise it wins without a champion, or when it is at most ``tolerance`` worse
    than the champion scored on the same rows.

    Args:
        candidate: the new model's metrics on the day's held-out rows (``{"auc": ...}``).
        champion: the champion's metrics on the same rows, or None when there is no champion.
        metric: ``auc`` or ``gauc`` (higher is better).
        tolerance: how much worse than the champion the candidate may be and still win.
        min_metric: the floor (``gate.min_metric``).
    """
    if not candidate or metric not in candidate:
        return GateDecision(False, f"the new model has no {metric} on the eval data")
    new = candidate[metric]
    if new is None or not math.isfinite(new):
        return GateDecision(False, f"new {metric}={new} is not a finite number")
    if new < min_metric:
        return GateDecision(False, f"new {metric}={new:.4f} is below the floor gate.min_metric={min_metric}")
    old = (champion or {}).get(metric)
    if old is None or not math.isfinite(old):
        return GateDecision(
            True, f"no champion {metric} on these rows; new {metric}={new:.4f} >= floor {min_metric}"
        )
    if new >= old - tolerance:
        return GateDecision(True, f"new {metric}={new:.4f} >= champion {old:.4f} - tolerance {tolerance}")
    return GateDecision(
        False,
        f"new {metric}={new:.4f} is worse than champion {old:.4f} by {old - new:.4f} > tolerance {tolerance}",
    )


class RegisterModelOperator(RecpipeOperator):
    """Register the exported SavedModel as a new version of ``model_name`` and gate it.

    Reads the XComs of the train, eval, champion-eval and export tasks. The version's tags
    hold the day, checkpoint, model dir, export path and metrics; the decision goes to the
    log, to the version (``promotion``, ``promotion_reason``) and to the parent run. A
    rejected candidate does not fail the DAG run. The parent run is ended here. A retry finds
    the version its DAG run registered (tag ``dag_run``) and gates it again: one version per
    DAG run.

    Args:
        model_name: the registered model (templated).
        promote: move the alias when the gate passes (manual runs may only register).

    Returns (XCom): ``{"model_name", "version", "promoted", "reason"}``.
    """

    template_fields = (*RecpipeOperator.template_fields, "model_name")
    ui_color = "#d9f7d4"

    def __init__(
        self,
        *,
        model_name: str,
        metric: str = "auc",
        tolerance: float = 0.002,
        min_metric: float = 0.5,
        alias: str = "champion",
        promote: bool = True,
        train_task_id: str = "train",
        eval_task_id: str = "evaluate",
        champion_eval_task_id: str | None = "evaluate_champion",
        export_task_id: str = "export",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.model_name = model_name
        self.metric = metric
        self.tolerance = tolerance
        self.min_metric = min_metric
        self.alias = alias
        self.promote = promote
        self.task_ids = (train_task_id, eval_task_id, champion_eval_task_id, export_task_id)

    def execute(self, context) -> dict:
        ti = context["ti"]
        train, evaluation, champion_eval, export = (
            ti.xcom_pull(task_ids=t) if t else None for t in self.task_ids
        )
        hook = self.hook
        candidate = (evaluation or {}).get("metrics")
        champion = (champion_eval or {}).get("metrics")
        current = hook.champion(self.model_name, self.alias)
        if current is not None and champion is None:
            # a champion exists but was not scored on these rows: no fair comparison
            decision = GateDecision(
                False, f"{self.alias} version {current.version} was not evaluated on these rows"
            )
        else:
            decision = gate(candidate, champion, self.metric, self.tolerance, self.min_metric)
        dag_run = f"{context['dag'].dag_id}/{context['run_id']}"
        earlier = hook.versions(self.model_name, {"dag_run": dag_run})
        if earlier:  # a retry: the version an earlier attempt registered, not a second one
            version = earlier[0]
            log.info("reusing version %s, registered by an earlier attempt of %s", version.version, dag_run)
        else:
            version = hook.register(
                self.model_name,
                export["artifact_uri"],
                export["mlflow_run_id"],
                {
                    "ds": context.get("ds") or train.get("train_ds", ""),
                    "dag_run": dag_run,
                    "checkpoint": train["checkpoint"],
                    "model_dir": train["model_dir"],
                    "export_path": export["export_path"],
                    **{f"eval.{k}": v for k, v in (candidate or {}).items()},
                },
            )
        promoted = decision.promote and self.promote
        reason = decision.reason if self.promote else f"promotion not requested ({decision.reason})"
        if promoted:
            hook.set_alias(self.model_name, version.version, self.alias)
            log.info("%s version %s is the new %s: %s", self.model_name, version.version, self.alias, reason)
        else:
            log.warning("%s version %s not promoted: %s", self.model_name, version.version, reason)
        hook.set_version_tags(
            self.model_name,
            version.version,
            {"promotion": "promoted" if promoted else "rejected", "promotion_reason": reason},
        )
        parent = self.parent_run_id(context)
        hook.set_tags(
            parent, {"promoted": promoted, "promotion_reason": reason, "model_version": version.version}
        )
        hook.end_run(parent)
        return {
            "model_name": self.model_name,
            "version": version.version,
            "promoted": promoted,
            "reason": reason,
        }
