"""``recpipe runs compare``: print and plot MLflow runs side by side.

- ``recpipe runs compare --experiment movielens_deepfm [--last 14]``: the last days of the
  retrain logging to that experiment (AUC before / after, the gate's outcome and DeLong
  interval, rows, positives). ``--experiment`` again (``--experiment movielens_stream``)
  puts another registered model's days beside them, one table.
- ``recpipe runs compare RUN_ID RUN_ID ...``: those runs' metrics and the params that differ
  (e.g. two manual ``recpipe_train`` runs with different ``edit_config_json``).

The PNG goes to ``--out`` and, with the table, to a run of the experiment tagged
``recpipe.step=compare`` (so the comparison is kept beside the runs). The tracking URI is
``--tracking_uri``, else resolved as the DAGs resolve it (``recpipe.tracking``).
"""

# Imports inside functions: MLflow, pandas and the plots are imported when the command runs, not
# when the CLI starts.

from __future__ import annotations

from recpipe.arguments import ArgumentParser, at_least
from recpipe.errors import UsageError
from recpipe.home import var_dir


def main(argv: list[str]) -> int:
    parser = ArgumentParser(prog="recpipe runs", description="compare MLflow runs")
    sub = parser.add_subparsers(dest="action", required=True)
    cmp = sub.add_parser("compare", help="print and plot runs side by side")
    cmp.add_argument("run_ids", nargs="*", help="runs to compare (default: the experiment's days)")
    cmp.add_argument(
        "--experiment",
        action="append",
        help="an experiment of days (a registered model's name); repeat it to compare several",
    )
    cmp.add_argument("--dag_id", default=None, help="only this DAG's runs (default: any)")
    cmp.add_argument("--last", type=at_least(1), default=14, help="how many days")
    cmp.add_argument("--out", default=None, help="PNG path (default var/compare/<name>.png)")
    cmp.add_argument("--no_log", action="store_true", help="do not log the comparison to MLflow")
    cmp.add_argument("--tracking_uri", default=None, help="MLflow (default: as the DAGs, recpipe.tracking)")
    args = parser.parse_args(argv)

    import pandas as pd
    from mlflow.exceptions import MlflowException

    from recpipe import tracking
    from recpipe.runs.compare import (
        day_figure,
        day_history,
        experiments_figure,
        metrics_figure,
        run_table,
        save_png,
    )

    client = tracking.client(args.tracking_uri)
    if args.run_ids:
        for run_id in args.run_ids:
            try:
                client.get_run(run_id)
            except MlflowException:
                raise UsageError(
                    f"run id {run_id!r}: no such MLflow run at "
                    f"{tracking.redacted(tracking.tracking_uri(args.tracking_uri))}"
                ) from None
        metrics, params = run_table(client, args.run_ids)
        experiment_id = client.get_run(args.run_ids[0]).info.experiment_id
        name = "runs-" + "-".join(r[:8] for r in args.run_ids)
        fig = metrics_figure(metrics, f"{len(args.run_ids)} runs")
        with pd.option_context("display.width", 200, "display.max_columns", None):
            print("metrics\n", metrics.to_string(), "\n\nparams that differ\n", params.to_string(), sep="")
        tables = {"metrics": metrics, "params": params}
    else:
        if not args.experiment:
            raise UsageError("give run ids, or --experiment NAME for the days of a daily retrain")
        histories = {}
        for experiment in args.experiment:
            exp = client.get_experiment_by_name(experiment)
            if exp is None:
                raise UsageError(f"--experiment {experiment}: no such MLflow experiment")
            histories[experiment] = (
                exp.experiment_id,
                day_history(client, exp.experiment_id, args.dag_id, args.last),
            )
        experiment_id = next(iter(histories.values()))[0]
        name = "days-" + "-".join(histories)
        if len(histories) == 1:
            days = histories[args.experiment[0]][1]
            fig = day_figure(days, f"{args.experiment[0]}: the last {len(days)} days")
        else:
            days = pd.concat([h.assign(experiment=e) for e, (_, h) in histories.items()], ignore_index=True)
            fig = experiments_figure({e: h for e, (_, h) in histories.items()}, f"the last {args.last} days")
        print(days.drop(columns="run_id").to_string(index=False))
        tables = {"days": days}

    out = save_png(fig, args.out or var_dir() / "compare" / f"{name}.png")
    print(f"\nfigure: {out}")
    if not args.no_log:
        run = client.create_run(experiment_id, run_name=f"compare {name}", tags={"recpipe.step": "compare"})
        client.log_artifact(run.info.run_id, str(out))
        for key, table in tables.items():
            client.log_table(run.info.run_id, table.reset_index(), f"{key}.json")
        client.set_terminated(run.info.run_id)
        print(f"logged to MLflow run {run.info.run_id} (experiment {experiment_id})")
    return 0
