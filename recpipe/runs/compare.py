"""Runs side by side, from MLflow's client: the last days of a daily retrain (AUC before and
after, the gate's outcome, rows, positives), or any runs (metrics, and the params that differ).
Tables are pandas DataFrames; figures matplotlib (Agg), written as PNG and logged to MLflow.
"""

# Imports inside functions: matplotlib is imported where a figure is drawn.

from __future__ import annotations

from pathlib import Path

import pandas as pd

from recpipe import atomic
from recpipe.registry import CHAMPION_MOVED, INCONCLUSIVE, PROMOTED, PROMOTION, REJECTED

PARENT = "parent"
DAY_COLUMNS = [
    "ds",
    "auc_before",
    "auc_after",
    "outcome",
    "inconclusive_days",
    "promoted",
    "diff",
    "ci_low",
    "ci_high",
    "version",
    "rows",
    "positives",
    "run_id",
]


def experiment_link(ui: str, experiment_id: str) -> str:
    """The MLflow UI's page of an experiment's runs table. MLflow 3.17's UI opens every
    experiment in its GenAI view unless the page asks for the model-training one
    (``workflowType=machine_learning``, which the browser then remembers): the experiment's
    ``mlflow.experimentKind`` tag alone picks only its tabs."""
    return f"{ui.rstrip('/')}/#/experiments/{experiment_id}?workflowType=machine_learning"


def retrain_dag(client, experiment_id: str) -> str | None:
    """The DAG whose days an experiment holds: the newest parent run's that a gate decided
    (a manual ``recpipe_train`` run registers without a gate, ``promotion`` = registered)."""
    found = client.search_runs(
        [experiment_id],
        filter_string=f"tags.`recpipe.step` = '{PARENT}' and tags.promotion != 'registered'",
        order_by=["attributes.start_time DESC"],
        max_results=1,
    )
    return found[0].data.tags.get("airflow.dag_id") if found else None


def day_history(
    client, experiment_id: str, dag_id: str | None = None, last: int = 14, until: str | None = None
) -> pd.DataFrame:
    """The newest parent run of each of the last ``last`` days (up to ``until``, a
    ``YYYY-MM-DD``, if given) of ``dag_id`` (None: ``retrain_dag``) in the experiment, oldest day
    first: ``ds``, ``auc_before`` (the champion on the day's held-out rows), ``auc_after``
    (the new model, same rows), the gate's ``outcome`` (promoted / rejected / inconclusive),
    ``inconclusive_days`` (inconclusive gates in a row up to that day), ``promoted``
    (whether the alias moved: an inconclusive day may move it), the paired test's AUC
    difference (new - champion) ``diff`` and its DeLong interval ``ci_low`` .. ``ci_high``
    (None without a paired test), ``version``, ``rows`` and ``positives`` of the day,
    ``run_id``; for a multi-task model, then each task's ``<task>/auc`` (the new model's)."""
    dag_id = dag_id or retrain_dag(client, experiment_id)
    dag = f" and tags.`airflow.dag_id` = '{dag_id}'" if dag_id else ""
    runs = client.search_runs(
        [experiment_id],
        filter_string=f"tags.`recpipe.step` = '{PARENT}'{dag}",
        order_by=["attributes.start_time DESC"],
        max_results=max(5 * last, 50),
    )
    newest: dict[str, object] = {}
    for run in runs:
        newest.setdefault(run.data.tags.get("ds", ""), run)
    rows, tasks = [], {}
    for ds in sorted(d for d in newest if until is None or d <= until)[-last:]:
        run = newest[ds]
        m, t = run.data.metrics, run.data.tags
        outcome = t.get(PROMOTION) or {"True": PROMOTED, "False": REJECTED}.get(t.get("promoted", ""), "")
        n, rate = m.get("prepare.rows"), m.get("prepare.positive_rate")
        rows.append(
            {
                "ds": ds,
                "auc_before": m.get("evaluate_champion.auc"),
                "auc_after": m.get("eval.auc"),
                "outcome": outcome or ("failed" if run.info.status == "FAILED" else ""),
                "inconclusive_days": int(t.get("inconclusive_days") or 0),
                "promoted": t.get("promoted") == "True",
                "diff": m.get("gate.diff"),
                "ci_low": m.get("gate.ci_low"),
                "ci_high": m.get("gate.ci_high"),
                "version": t.get("model_version", ""),
                "rows": None if n is None else int(n),
                "positives": None if n is None or rate is None else int(round(n * rate)),
                "run_id": run.info.run_id,
            }
        )
        # eval.<task>/auc: a multi-task model's tasks (trainer.scoring)
        for key, value in m.items():
            if key.startswith("eval.") and key.endswith("/auc"):
                task = key.removeprefix("eval.")
                tasks.setdefault(task, None)
                rows[-1][task] = value
    return pd.DataFrame(rows, columns=DAY_COLUMNS + list(tasks))


def day_figure(days: pd.DataFrame, title: str):
    """Two panels, one column per day; a matplotlib ``Figure``. Above: AUC before (the
    champion) and after (the new model), promoted days circled. Below: the gate's paired
    AUC difference (new - champion) with its DeLong confidence interval, coloured by the
    gate's outcome: an interval across 0 is an inconclusive day, which shows why a model was
    kept (or, under ``gate.inconclusive: promote``, taken)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    fig = Figure(figsize=(max(6, 0.6 * len(days) + 3), 6.5), layout="constrained")
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=[3, 2])
    x = list(range(len(days)))
    top.plot(x, days["auc_before"], "o--", color="grey", label="champion (before)")
    top.plot(x, days["auc_after"], "o-", color="tab:blue", label="new model (after)")
    promoted = [i for i, p in enumerate(days["promoted"]) if p]
    top.scatter(
        promoted,
        days["auc_after"].iloc[promoted],
        s=120,
        facecolors="none",
        edgecolors="tab:green",
        label="promoted",
        zorder=3,
    )
    top.set_ylabel("AUC on the day's held-out rows")
    top.set_title(title)
    top.legend(fontsize="small")
    colours = {
        PROMOTED: "tab:green",
        REJECTED: "tab:red",
        INCONCLUSIVE: "tab:orange",
        CHAMPION_MOVED: "tab:grey",
    }
    bottom.axhline(0, color="grey", linewidth=0.8)
    for outcome, colour in colours.items():
        rows = [i for i in x if days["outcome"].iloc[i] == outcome and _number(days["diff"].iloc[i])]
        if not rows:
            continue
        diff = days["diff"].iloc[rows].to_numpy(float)
        low = diff - days["ci_low"].iloc[rows].to_numpy(float)
        high = days["ci_high"].iloc[rows].to_numpy(float) - diff
        bottom.errorbar(rows, diff, yerr=[low, high], fmt="o", capsize=4, color=colour, label=outcome)
    bottom.set_ylabel("AUC new - champion\n(DeLong interval)")
    bottom.set_xticks(x, days["ds"], rotation=45, ha="right")
    if bottom.get_legend_handles_labels()[0]:
        bottom.legend(fontsize="small")
    return fig


def experiments_figure(histories: dict[str, pd.DataFrame], title: str):
    """The new model's AUC per day of several experiments (``day_history`` each, by name),
    one line each on the union of their days; a matplotlib ``Figure``."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    days = sorted({d for h in histories.values() for d in h["ds"]})
    fig = Figure(figsize=(max(6, 0.6 * len(days) + 3), 4), layout="constrained")
    ax = fig.subplots()
    for name, history in histories.items():
        at = {d: i for i, d in enumerate(days)}
        ax.plot([at[d] for d in history["ds"]], history["auc_after"], "o-", label=name)
    ax.set_xticks(range(len(days)), days, rotation=45, ha="right")
    ax.set_ylabel("AUC of the day's new model")
    ax.set_title(title)
    ax.legend(fontsize="small")
    return fig


def _number(value) -> bool:
    return value is not None and value == value


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
