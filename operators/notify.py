"""E-mail about a retrain DAG's runs (``notifications`` of the retrain config) through the
SMTP provider's ``SmtpNotifier``: a failed task (a stuck gate included) and the gate's
decision (promoted or rejected, with its reason)."""

from __future__ import annotations

from airflow.providers.smtp.notifications.smtp import SmtpNotifier

from recpipe.config.retrain import NotificationConfig

_FAILED = "recpipe {{ dag.dag_id }} {{ ds }}: {{ ti.task_id }} failed"
_FAILED_BODY = (
    "<p>{{ dag.dag_id }}, run {{ run_id }}: task {{ ti.task_id }} failed (try {{ ti.try_number }}).</p>"
    "<pre>{{ exception }}</pre>"
)
_DECISION = "{{ ti.xcom_pull(task_ids=ti.task_id) }}"
_GATE = (
    "recpipe {{ dag.dag_id }} {{ ds }}: version " + _DECISION.replace("}}", "['version'] }}") + " "
    "{{ 'awaits approval' if ti.xcom_pull(task_ids=ti.task_id)['awaiting_approval'] else "
    "('promoted' if ti.xcom_pull(task_ids=ti.task_id)['promoted'] else 'rejected') }}"
)
_GATE_BODY = "<p>" + _DECISION.replace("}}", "['reason'] }}") + "</p><pre>" + _DECISION + "</pre>"


def on_failure(config: NotificationConfig) -> list[SmtpNotifier]:
    """The failure callbacks ``config`` asks for ([] when none)."""
    if not config.to or "failure" not in config.on:
        return []
    return [_notifier(config, _FAILED, _FAILED_BODY)]


class DecisionNotifier(SmtpNotifier):
    """``SmtpNotifier`` for the gate task's success: sends only the decisions in ``send_on``
    (``promotion``, ``rejection``, ``approval``: a promotion waiting for a person), read from
    the task's XCom."""

    def __init__(self, *, send_on: set[str], **kwargs):
        super().__init__(**kwargs)
        self.send_on = set(send_on)

    def notify(self, context) -> None:
        ti = context["ti"]
        decision = ti.xcom_pull(task_ids=ti.task_id) or {}
        if decision.get("awaiting_approval"):
            kind = "approval"
        else:
            kind = "promotion" if decision.get("promoted") else "rejection"
        if kind in self.send_on:
            super().notify(context)


def on_decision(config: NotificationConfig) -> list[SmtpNotifier]:
    """The gate task's success callbacks: its decision, when ``config`` asks for promotions
    or rejections ([] when neither)."""
    wanted = {"promotion", "rejection", "approval"} & set(config.on)
    if not config.to or not wanted:
        return []
    return [
        DecisionNotifier(
            send_on=wanted,
            to=config.to,
            from_email=config.from_email,
            subject=_GATE,
            html_content=_GATE_BODY,
            smtp_conn_id=config.smtp_conn_id,
        )
    ]


def _notifier(config: NotificationConfig, subject: str, body: str, to=None) -> SmtpNotifier:
    return SmtpNotifier(
        to=config.to if to is None else to,
        from_email=config.from_email,
        subject=subject,
        html_content=body,
        smtp_conn_id=config.smtp_conn_id,
    )
