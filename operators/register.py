"""``RegisterModelOperator``: register the export in MLflow's model registry and move the
``champion`` alias to it only if the gate (``operators/gate.py``) promotes it."""

# Imports inside execute defer pandas and matplotlib off the DAG files'
# parse.

from __future__ import annotations

import logging

from operators.base import RecpipeOperator
from operators.gate import POLICY_PROMOTE, class_counts, gate, paired_scores
from recpipe import registry
from recpipe.config.retrain import GateConfig
from recpipe.errors import PipelineError
from recpipe.registry import AWAITING_APPROVAL, CHAMPION_MOVED, INCONCLUSIVE, PROMOTED, REJECTED, GateDecision

log = logging.getLogger(__name__)


class GateStuckError(PipelineError):
    """The gate was inconclusive ``max_inconclusive_days`` times in a row."""


class RegisterModelOperator(RecpipeOperator):
    """Register the exported SavedModel as a new version of ``model_name`` and gate it.

    Reads the XComs of the train, eval, champion-eval and export tasks. The version's tags
    hold the day, checkpoint, model dir, export path and metrics; the decision goes to the
    log, to the version (``promotion``, ``promotion_reason``) and to the parent run. A
    rejected candidate does not fail the DAG run. The parent run is ended here. A retry finds
    the version its DAG run registered (tag ``dag_run``), and a re-run the version of the same
    checkpoint (tag ``checkpoint``), and gates it again: one version per trained model.

    Args:
        model_name: the registered model (templated).
        gate: the retrain config's ``gate`` section whole (``GateConfig`` or its dict; default:
            its defaults): the rules (``operators.gate``), the ``alias`` to move, and
            ``max_inconclusive_days``: this many inconclusive gates in a row that kept the
            champion (this one and the newest versions before it) fail the task after the
            version is registered and tagged (0: never): a champion that no test can displace
            is a problem to see, not to keep for ever.
        promote: move the alias when the gate passes (manual runs may only register).
        history_days: the parent run gets a table (``history/days.json``) and a figure
            (``history/days.png``) of the DAG's last this-many days: AUC before / after, the
            gate's outcome, rows, positives (``recpipe.runs.compare``); 0 for none.

    Returns (XCom): ``{"model_name", "version", "promoted", "outcome", "reason", "gate",
    "inconclusive_days", "champion_version"}`` (``outcome``: promoted / rejected / inconclusive /
    champion_moved; ``gate``: the paired test's numbers; ``inconclusive_days``: inconclusive
    gates in a row that kept the champion, this one included; ``champion_version``: the
    champion the gate compared with, which an approval's move expects to replace).

    Raises:
        GateStuckError: ``max_inconclusive_days`` inconclusive gates in a row.
    """

    template_fields = (*RecpipeOperator.template_fields, "model_name")
    ui_color = "#d9f7d4"

    def __init__(
        self,
        *,
        model_name: str,
        gate: GateConfig | dict | None = None,
        promote: bool = True,
        history_days: int = 14,
        train_task_id: str = "train",
        eval_task_id: str = "evaluate",
        champion_eval_task_id: str | None = "evaluate_champion",
        export_task_id: str = "export",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.model_name = model_name
        self.gate = GateConfig.model_validate(gate or {})
        self.alias = self.gate.alias
        self.promote = promote
        self.history_days = history_days
        self.task_ids = (train_task_id, eval_task_id, champion_eval_task_id, export_task_id)

    def execute(self, context) -> dict:
        ti = context["ti"]
        train, evaluation, champion_eval, export = (
            ti.xcom_pull(task_ids=t) if t else None for t in self.task_ids
        )
        evaluation, champion_eval = evaluation or {}, champion_eval or {}
        candidate, champion = evaluation.get("metrics"), champion_eval.get("metrics")
        current = self.hook.champion(self.model_name, self.alias)
        # the move expects the champion the gate compared with (the one evaluate_champion
        # scored), so that a champion moved meanwhile (a rollback by hand) is not overwritten
        if "version" in champion_eval:
            expect = champion_eval["version"]
        else:
            expect = None if current is None else int(current.version)
        decision = self._decide(current, evaluation, champion_eval)
        version, earlier = self._version(context, train, export, evaluation)
        if earlier and current is not None and current.version == version.version:
            # a re-run of the champion itself: a gate against itself says nothing, and its tags
            # keep the decision that promoted it
            reason = f"version {version.version} is the {self.alias} already"
            log.info("%s: %s", self.model_name, reason)
            self.hook.end_run(self.parent_run_id(context))
            return {
                "model_name": self.model_name,
                "version": version.version,
                "promoted": True,
                "outcome": PROMOTED,
                "reason": reason,
                "gate": {},
            }
        promoted, outcome, reason, awaiting = self._apply(decision, version.version, expect)
        # an inconclusive gate that kept the champion (gate.inconclusive: keep_champion) counts
        kept = decision.outcome == INCONCLUSIVE and not promoted
        client = self.hook.get_client()
        streak = registry.inconclusive_streak(client, self.model_name, version.version) + 1 if kept else 0
        self._record(context, decision, version.version, promoted, outcome, reason, streak)
        if self.gate.max_inconclusive_days and streak >= self.gate.max_inconclusive_days:
            raise GateStuckError(
                f"{self.model_name}: the gate was inconclusive {streak} times in a row (version "
                f"{version.version}: {decision.reason}); gate.max_inconclusive_days="
                f"{self.gate.max_inconclusive_days}. The champion cannot be tested on this few held-out "
                "rows: raise gate.window_days or data_config.holdout_percent, or decide by hand"
            )
        return {
            "model_name": self.model_name,
            "version": version.version,
            "promoted": promoted,
            "awaiting_approval": awaiting,
            "outcome": outcome,
            "reason": reason,
            "metrics": {k: v for k, v in (candidate or {}).items() if isinstance(v, int | float)},
            "champion_metrics": {k: v for k, v in (champion or {}).items() if isinstance(v, int | float)},
            "gate": decision.numbers,
            "inconclusive_days": streak,
            "champion_version": expect,
        }

    def _decide(self, current, evaluation: dict, champion_eval: dict) -> GateDecision:
        """The gate's decision on the candidate's ``evaluation`` against ``champion_eval``
        (the XComs of the evaluate tasks) for the ``current`` champion (None: there is none)."""
        rules, champion = self.gate, champion_eval.get("metrics")
        if current is not None and champion is None:
            # a champion exists but was not scored on these rows: no fair comparison
            why = f"{self.alias} version {current.version} was not evaluated on these rows"
            return GateDecision(REJECTED, False, why)
        task = rules.metric.split("/")[0] if "/" in rules.metric else None
        paired, why = paired_scores(
            champion_eval.get("predictions"), evaluation.get("predictions"), rules.confidence, task
        )
        if paired is None and champion:
            log.info("gate without a paired test: %s", why)
        held_out = class_counts(evaluation.get("predictions"), task)
        return gate(evaluation.get("metrics"), champion, rules, paired, held_out)

    def _version(self, context, train: dict, export: dict, evaluation: dict):
        """The model version of this training: the one a retry of this DAG run, or a re-run
        of the same checkpoint, registered (``(version, True)``), else a new one with its tags
        (``(version, False)``)."""
        client, candidate = self.hook.get_client(), evaluation.get("metrics")
        dag_run = f"{context['dag'].dag_id}/{context['run_id']}"
        version = registry.version_of_training(client, self.model_name, dag_run, train["checkpoint"])
        if version is not None:
            log.info(
                "reusing version %s, registered by an earlier attempt of %s",
                version.version,
                version.tags.get("dag_run"),
            )
            return version, True
        version = registry.register_version(
            client,
            self.model_name,
            export["artifact_uri"],
            export["mlflow_run_id"],
            {
                "ds": context.get("ds") or train.get("train_ds", ""),
                "dag_run": dag_run,
                "checkpoint": train["checkpoint"],
                "model_dir": train["model_dir"],
                "export_path": export["export_path"],
                "model_id": export.get("model_id") or "",
                **{f"eval.{k}": v for k, v in (candidate or {}).items()},
            },
            model_id=export.get("model_id"),
        )
        if export.get("model_id") and evaluation and candidate:
            self._link_metrics(export["model_id"], evaluation)
        return version, False

    def _apply(self, decision: GateDecision, version: str, expect: int | None) -> tuple[bool, str, str, bool]:
        """Act on ``decision`` for ``version``: move the alias from ``expect`` (compare and
        set), leave it for an approval, or keep the champion. Returns ``(promoted, outcome,
        reason, awaiting_approval)``."""
        promoted = decision.promote and self.promote
        outcome = decision.outcome if self.promote else "registered"
        reason = decision.reason if self.promote else f"promotion not requested ({decision.reason})"
        if promoted and self.gate.approval == "required":
            # the alias moves only once a person approves (operators/approval.py): the page asks
            reason = f"{reason.replace(POLICY_PROMOTE, 'the gate would promote it')}; awaiting approval"
            log.info("%s version %s awaits approval: %s", self.model_name, version, reason)
            return False, AWAITING_APPROVAL, reason, True
        if not promoted:
            log.warning("%s version %s not promoted: %s", self.model_name, version, reason)
            return False, outcome, reason, False
        try:
            registry.move_alias(
                self.hook.get_client(), self.model_name, version, expect, by="gate",
                reason=reason, action="promoted", alias=self.alias,
            )  # fmt: skip
        except registry.ChampionMovedError as err:
            log.warning("%s version %s not promoted: %s", self.model_name, version, err)
            return False, CHAMPION_MOVED, str(err), False
        log.info("%s version %s is the new %s: %s", self.model_name, version, self.alias, reason)
        return True, outcome, reason, False

    def _record(self, context, decision, version: str, promoted, outcome, reason, streak: int) -> None:
        """The decision on the version's tags and the parent run's (tags, the gate's numbers
        as metrics, the days' history), then the parent run ended."""
        hook = self.hook
        promotion = PROMOTED if promoted else outcome
        client = hook.get_client()
        registry.tag_decision(client, self.model_name, version, decision, promotion, reason, streak)
        numbers = {f"gate.{k}": v for k, v in decision.numbers.items()}
        parent = self.parent_run_id(context)
        hook.set_tags(
            parent,
            {
                "promoted": promoted,
                "promotion": outcome,
                "promotion_reason": reason,
                "model_version": version,
                "inconclusive_days": streak,
            },
        )
        metrics = [(k, v, 0) for k, v in numbers.items() if v == v]  # NaN-free
        hook.log_metrics(parent, [*metrics, ("inconclusive_days", streak, 0)])
        if self.promote and self.history_days:
            self._log_history(context, parent)
        hook.end_run(parent)

    def _log_history(self, context, parent: str) -> None:
        from recpipe.runs.compare import day_figure, day_history

        client = self.hook.get_client()
        experiment_id = client.get_run(parent).info.experiment_id
        days = day_history(client, experiment_id, context["dag"].dag_id, self.history_days, context.get("ds"))
        client.log_table(parent, days, "history/days.json")
        title = f"{self.model_name}: the last {len(days)} days"
        client.log_figure(parent, day_figure(days, title), "history/days.png")

    def _link_metrics(self, model_id: str, evaluation: dict) -> None:
        """The new model's metrics linked to its LoggedModel and to the evaluated rows (the
        dataset input the evaluate task logged, ``EvalOperator``'s ``eval_dataset``), on the
        eval run."""
        dataset = evaluation.get("dataset") or {}
        client = self.hook.get_client()
        for key, value in evaluation["metrics"].items():
            if value is None:  # undefined on these rows (EvalOperator)
                continue
            client.log_metric(
                evaluation["mlflow_run_id"],
                key,
                value,
                step=evaluation.get("global_step") or 0,
                model_id=model_id,
                dataset_name=dataset.get("name"),
                dataset_digest=dataset.get("digest"),
            )
