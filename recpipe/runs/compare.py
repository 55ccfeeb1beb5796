"""Runs side by side, from MLflow's client: the last days of a daily retrain (AUC before and
after, the gate's outcome, rows, positives), or any runs (metrics, and the params that differ).
Tables are pandas DataFrames; figures matplotlib (Agg), written as PNG and logged to MLflow.
"""

# Imports inside functions: matplotlib is imported where a figure is drawn.

from __future__ import annotations

from pathlib import Path

import pandas as pd

from recpipe import atomic

PARENT = "parent"
DAY_COLUMNS = [
    "ds",
    "auc_before",
    "auc_after",
    "outcome",
    "inconclusive_days",
    "promoted",
    "version",
    "rows",
    "positives",
    "run_id",
]


def day_history(
    client, experiment_id: str, dag_id: str, last: int = 14, until: str | None = None
) -> pd.DataFrame:
    """The newest parent run of each of the last ``last`` days (up to ``until``, a
    ``YYYY-MM-DD``, if given) of ``dag_id`` in the experiment, oldest day first: ``ds``,
    ``auc_before`` (the champion on the day's held-out rows), ``auc_after`` (the new model,
    same rows), the gate's ``outcome`` (promoted / rejected / inconclusive),
    ``inconclusive_days`` (inconclusive gates in a row up to that day), ``promoted``
    (whether the alias moved: an inconclusive day may move it), ``version``, ``rows`` and
    ``positives`` of the day, ``run_id``."""
    runs = client.search_runs(
        [experiment_id],
        filter_string=f"tags.`recpipe.step` = '{PARENT}' and tags.`airflow.dag_id` = '{dag_id}'",
        order_by=["attributes.start_time DESC"],
        max_results=max(5 * last, 50),
    )
    newest: dict[str, object] = {}
    for run in runs:
        newest.setdefault(run.data.tags.get("ds", ""), run)
    rows = []
    for ds in sorted(d for d in newest if until is None or d <= until)[-last:]:
        run = newest[ds]
        m, t = run.data.metrics, run.data.tags
        outcome = t.get("promotion") or {"True": "promoted", "False": "rejected"}.get(
            t.get("promoted", ""), ""
        )
        n, rate = m.get("prepare.rows"), m.get("prepare.positive_rate")
        rows.append(
            {
                "ds": ds,
                "auc_before": m.get("evaluate_champion.auc"),
                "auc_after": m.get("eval.auc"),
                "outcome": outcome or ("failed" if run.info.status == "FAILED" else ""),
                "inconclusive_days": int(t.get("inconclusive_days") or 0),
                "promoted": t.get("promoted") == "True",
                "version": t.get("model_version", ""),
                "rows": None if n is None else int(n),
                "positives": None if n is None or rate is None else int(round(n * rate)),
                "run_id": run.info.run_id,
            }
        )
    return pd.DataFrame(rows, columns=DAY_COLUMNS)


def day_figure(days: pd.DataFrame, title: str):
    """AUC before / after per day, promoted days marked; a matplotlib ``Figure``."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    fig = Figure(figsize=(max(6, 0.6 * len(days) + 3), 4), layout="constrained")
    ax = fig.subplots()
    x = range(len(days))
    ax.plot(x, days["auc_before"], "o--", color="grey", label="champion (before)")
    ax.plot(x, days["auc_after"], "o-", color="tab:blue", label="new model (after)")
    promoted = [i for i, p in enumerate(days["promoted"]) if p]
    ax.scatter(
        promoted,
        days["auc_after"].iloc[promoted],
        s=120,
        facecolors="none",
        edgecolors="tab:green",
        label="promoted",
        zorder=3,
    )
    ax.set_xticks(list(x), days["ds"], rotation=45, ha="right")
    ax.set_ylabel("AUC on the day's held-out rows")
    ax.set_title(title)
    ax.legend()
    return fig


def run_table(client, run_ids: list[str]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(metrics, params)`` of the runs, one column per run (named by run name and id
    prefix): every metric's latest value; only the params whose values differ."""
    runs = [client.get_run(r) for r in run_ids]
    names = [f"{r.info.run_name or 'run'} ({r.info.run_id[:8]})" for r in runs]
    metrics = pd.DataFrame({n: r.data.metrics for n, r in zip(names, runs, strict=True)}).sort_index()
    params = pd.DataFrame({n: r.data.params for n, r in zip(names, runs, strict=True)}).sort_index()
    differ = params.astype(str).nunique(axis=1, dropna=False) > 1
    return metrics, params[differ]


def metrics_figure(metrics: pd.DataFrame, title: str, keys: list[str] | None = None):
    """Bars of the runs' ``keys`` metrics (default: auc, gauc, logloss where present)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    keys = [
        k
        for k in (keys or ["eval.auc", "eval.gauc", "eval.logloss", "auc", "gauc", "logloss"])
        if k in metrics.index
    ]
    shown = metrics.loc[keys] if keys else metrics.head(6)
    fig = Figure(figsize=(max(6, 1.5 * len(shown.index) + 2), 4), layout="constrained")
    ax = fig.subplots()
    width = 0.8 / max(len(shown.columns), 1)
    for i, column in enumerate(shown.columns):
        ax.bar([k + i * width for k in range(len(shown.index))], shown[column], width, label=column)
    ax.set_xticks([k + 0.4 - width / 2 for k in range(len(shown.index))], shown.index)
    ax.set_title(title)
    ax.legend(fontsize="small")
    return fig


def save_png(fig, path: str | Path) -> Path:
    """Write ``fig`` as PNG (atomically); returns the path."""

    with atomic.file(path) as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    return Path(path)
