"""The approval page (Airflow's Required Actions) asks one question: each figure once, rounded
to 4 digits, each explained in its row; no "promoted" while it asks whether to promote."""

from __future__ import annotations

import re
from types import SimpleNamespace

from jinja2.sandbox import SandboxedEnvironment

from operators.approval import _BODY, _SUBJECT, GATE_FIGURES

DECISION = {
    "model_name": "movielens_deepfm",
    "version": "4",
    "reason": "inconclusive: AUC difference +0.0031 [-0.0101, +0.0163] at 95% (DeLong, p=0.644) is not "
    "significant; the gate would promote it (gate.inconclusive: promote); awaiting approval",
    "metrics": {"auc": 0.7312345678901234, "logloss": 0.5123456789012345, "rows": 336},
    "champion_metrics": {"auc": 0.7281234567890123, "logloss": 0.5187654321098765, "rows": 336},
    "gate": {"auc_a": 0.7281234567890123, "auc_b": 0.7312345678901234, "diff": 0.0031111111111111,
             "se": 0.0067345678901234, "ci_low": -0.0100888888888888, "ci_high": 0.0163111111111111,
             "p_value": 0.6441234567890123, "positives": 201, "negatives": 135, "strata": 0},
}  # fmt: skip


def _render(template: str) -> str:
    ti = SimpleNamespace(xcom_pull=lambda task_ids: DECISION)
    return (
        SandboxedEnvironment()
        .from_string(template)
        .render(ti=ti, dag=SimpleNamespace(dag_id="d"), ds="1998-04-02")
    )


def test_the_approval_page_shows_each_figure_once_rounded_and_explained():
    page = _render(_BODY)
    assert _render(_SUBJECT) == "Promote movielens_deepfm version 4?"
    assert "promoted (" not in page and "awaiting approval" in page
    assert not re.findall(r"\d\.\d{5,}", page), page  # no float past 4 decimals
    rows = [line for line in page.splitlines() if line.startswith("| ") and "---" not in line]
    names = [
        r.split("|")[1].strip() for r in rows if r.split("|")[1].strip() not in ("metric", "gate figure")
    ]
    assert len(names) == len(set(names)), names  # each figure once
    assert "auc_a" not in names and "auc_b" not in names  # the metrics table's auc, not again
    assert set(GATE_FIGURES) <= set(names) and {"auc", "logloss", "rows"} <= set(names)
    for row in rows:
        assert row.rstrip(" |").split("|")[-1].strip(), row  # every row says what it is
    assert "| auc | 0.7312 | 0.7281 |" in page and "| strata | 0 |" in page and "| positives | 201 |" in page
