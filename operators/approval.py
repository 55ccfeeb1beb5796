"""A person approves a promotion (``gate.approval: required``): Airflow's Human-in-the-loop
task shows the gate's decision in the UI (Required Actions) and waits; ``ApplyApprovalOperator``
then moves the alias, or keeps the champion and says why (rejected by whom, or no answer in
time)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from airflow.providers.standard.operators.hitl import HITLOperator

from operators.base import RecpipeOperator
from recpipe import registry
from recpipe.registry import APPROVAL_TIMED_OUT, CHAMPION_MOVED, PROMOTED, REJECTED_BY_APPROVER

APPROVE, REJECT = "Approve", "Reject"
GATE_TASK = "register_and_gate"
_DECISION = f"ti.xcom_pull(task_ids='{GATE_TASK}')"
_SUBJECT = "Promote {{ " + _DECISION + "['model_name'] }} version {{ " + _DECISION + "['version'] }}?"
# the gate's figures, each explained on the page (a figure the metrics table shows is not repeated)
GATE_FIGURES = {
    "diff": "AUC difference, new minus champion, on the same held-out rows",
    "se": "standard error of that difference (DeLong)",
    "ci_low": "lower end of the difference's confidence interval",
    "ci_high": "upper end of the difference's confidence interval",
    "p_value": "two-sided p-value of the difference",
    "positives": "held-out rows with a positive label",
    "negatives": "held-out rows with a negative label",
    "strata": "stream passes the AUCs were ranked within (0: all rows ranked together)",
}
_FORMAT = (
    "{% macro fmt(v) %}{% if v is none %}-{% elif v is float %}{{ '%.4f' % v }}"
    "{% else %}{{ v }}{% endif %}{% endmacro %}"
)
_BODY = (
    _FORMAT + "{% set d = " + _DECISION + " %}"
    "**{{ d['model_name'] }} version {{ d['version'] }}** ({{ dag.dag_id }}, {{ ds }}). "
    "The gate found: *{{ d['reason'] }}*\n\n"
    "| metric | new model | champion | what it is |\n| --- | --- | --- | --- |\n"
    "{% for k, v in d['metrics'].items() %}| {{ k }} | {{ fmt(v) }} "
    "| {{ fmt(d['champion_metrics'].get(k)) }} | each model's {{ k }}, on the held-out rows |\n{% endfor %}\n"
    "| gate figure | value | what it is |\n| --- | --- | --- |\n"
    + "".join(
        f"{{% if '{k}' in d['gate'] %}}| {k} | {{{{ fmt(d['gate']['{k}']) }}}} | {text} |\n{{% endif %}}"
        for k, text in GATE_FIGURES.items()
    )
)


def needs_approval(decision: dict | None) -> bool:
    """Whether the gate task's decision waits for a person (a ``ShortCircuitOperator``'s
    callable: a rejected model asks no one)."""
    return bool(decision and decision.get("awaiting_approval"))


def approval_task(timeout_s: float, **kwargs) -> HITLOperator:
    """``approve_promotion``: Approve or Reject, the gate's table as the body; no answer in
    ``timeout_s`` seconds takes ``Reject`` (the champion stays)."""
    return HITLOperator(
        task_id="approve_promotion",
        subject=_SUBJECT,
        body=_BODY,
        options=[APPROVE, REJECT],
        defaults=[REJECT],
        response_timeout=timedelta(seconds=timeout_s),
        **kwargs,
    )


class ApplyApprovalOperator(RecpipeOperator):
    """Apply the answer of ``approve_promotion`` to the version the gate task registered:
    ``Approve`` moves ``alias`` to it (tags ``promotion: promoted``, ``approved_by``) if the
    champion is still the one the gate compared it with (``recpipe.registry.move_alias``);
    when a person moved the champion during the wait, the approval is refused and the
    champion stays (``promotion: champion_moved``, the reason naming who moved it).
    ``Reject`` or a timeout keeps the champion (``promotion: rejected_by_approver`` or
    ``approval_timed_out``). The parent MLflow run gets the same tags.

    Returns (XCom): ``{"version", "promoted", "outcome", "by", "reason"}``.
    """

    def __init__(self, *, model_name: str, alias: str = "champion", **kwargs):
        super().__init__(**kwargs)
        self.model_name, self.alias = model_name, alias

    def execute(self, context) -> dict[str, Any]:
        ti = context["ti"]
        decision = ti.xcom_pull(task_ids=GATE_TASK)
        answer = ti.xcom_pull(task_ids="approve_promotion") or {}
        chosen = (answer.get("chosen_options") or [REJECT])[0]
        by = answer.get("responded_by_user") or None
        name = by.get("name") if isinstance(by, dict) else by
        version = str(decision["version"])
        reason = f"approved by {name}" if chosen == APPROVE else (name or "no answer in time")
        if chosen == APPROVE:
            # the champion the gate compared with; an older decision without it: the one now
            client = self.hook.get_client()
            if "champion_version" in decision:
                expect = decision["champion_version"]
            else:
                expect = registry.holder(client, self.model_name, self.alias)
            try:
                registry.move_alias(
                    client, self.model_name, version, expect, by=name or "approver",
                    reason=f"approved: {decision.get('reason', '')}", action="approved", alias=self.alias,
                )  # fmt: skip
                outcome = PROMOTED
            except registry.ChampionMovedError as err:
                outcome, reason = CHAMPION_MOVED, str(err)
        else:
            outcome = REJECTED_BY_APPROVER if name else APPROVAL_TIMED_OUT
        promoted = outcome == PROMOTED
        decided = "approved_by" if chosen == APPROVE else "decided_by"
        tags = {registry.PROMOTION: outcome, decided: name or "timeout"}
        if outcome == CHAMPION_MOVED:
            tags[registry.PROMOTION_REASON] = reason
        registry.tag_version(self.hook.get_client(), self.model_name, version, tags)
        self.hook.set_tags(self.parent_run_id(context), {**tags, "promoted": promoted})
        if promoted:
            self.log.info(
                "%s version %s is the new %s, approved by %s", self.model_name, version, self.alias, name
            )
        else:
            self.log.warning("%s version %s not promoted: %s (%s); the %s stays", self.model_name, version,
                             outcome, reason, self.alias)  # fmt: skip
        return {"version": version, "promoted": promoted, "outcome": outcome, "by": name, "reason": reason}
