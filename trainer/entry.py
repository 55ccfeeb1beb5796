"""Shared command-line handling of ``trainer.train_eval``, ``trainer.eval``, ``trainer.export``
and their ``recpipe train / eval / export / ckpt`` twins (EasyRec's flags).

``recpipe train --num_workers N [--num_ps M] [--cluster_config_path conf/cluster/X.yaml]``
starts the whole job (every worker, ps and the separate evaluator) through the launcher the
DAG uses (``recpipe.launch``), as EasyRec's users run ``horovodrun ... train_eval`` and
PaddleRec's ``local_cluster_train``. Without those flags the command is one process of a job.
Exit codes: ``recpipe.errors`` (2 usage / config, 1 pipeline).
"""

# Imports inside functions: each command imports the TensorFlow modules it needs when it runs:
# `--help` and usage errors answer without TensorFlow.

from __future__ import annotations

import contextlib
import faulthandler
import io
import json
import logging
import os
import signal
import sys
from pathlib import Path

from recpipe import atomic, jsonl, locks
from recpipe.arguments import ArgumentParser, at_least
from recpipe.config import ClusterConfig, ConfigError, load_cluster_config
from recpipe.config.args import add_config_args, config_from_args
from recpipe.config.model import EvalMethod
from recpipe.errors import UsageError, exit_now, run_command
from recpipe.exports.files import read_manifest
from recpipe.launch import launcher_for, run_job, training_job
from recpipe.layout import ModelDir, day_of, parse_ds_range, pass_of
from trainer.memory import peak_rss_mb

# TensorFlow's C++ start-up chatter hides the log lines users need.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
LAUNCH_FLAGS = ("--num_workers", "--num_ps", "--cluster_config_path")


def _setup_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # `kill -USR1 <pid>` prints every thread's Python stack to the job's log: where a stuck
    # process waits, without stopping it (where stderr is a file: not in an in-process test)
    with contextlib.suppress(io.UnsupportedOperation, AttributeError, ValueError):
        faulthandler.register(signal.SIGUSR1, file=sys.stderr.fileno(), all_threads=True)


def _days(value: str | None, field: str) -> list[str]:

    if not value:
        raise ConfigError(
            f"{field} is not set: pass --{field}=YYYY-MM-DD[:YYYY-MM-DD] or set it in the config"
        )
    return parse_ds_range(value, field)


def train_eval_main(argv: list[str] | None = None) -> int:
    """``python -m trainer.train_eval`` / ``recpipe train``: train, then evaluate on ``eval_ds``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = ArgumentParser(prog="recpipe train", description="train, then evaluate on eval_ds")
    add_config_args(parser)
    parser.add_argument("--model_dir", default=None, help="overrides the config's model_dir")
    parser.add_argument(
        "--continue_train", action="store_true", help="resume from model_dir's latest checkpoint"
    )
    parser.add_argument(
        "--skip_eval", action="store_true", help="train only; the caller evaluates eval_ds (the DAGs do)"
    )
    one_pass = parser.add_argument_group(
        "a stream pass in one process (the stream DAG's train task: no job of its own to score or export)"
    )
    one_pass.add_argument(
        "--score_first",
        metavar="RESULT_NAME",
        default=None,
        help="before training, score train_ds with the model the job fine-tunes from into "
        "model_dir/RESULT_NAME and its predictions (progressive validation; nothing when the job "
        "resumes or starts from scratch)",
    )
    one_pass.add_argument(
        "--export_dir", default=None, help="after training, export the model here (with --base or --delta)"
    )
    target = one_pass.add_mutually_exclusive_group()
    target.add_argument("--base", metavar="DAY[/PASS]", default=None, help="as recpipe export --base")
    target.add_argument("--delta", metavar="DAY/PASS", default=None, help="as recpipe export --delta")
    launch = parser.add_argument_group("multi-process jobs (started here through recpipe.launch)")
    launch.add_argument(
        "--num_workers", type=at_least(1), default=None, help="worker processes / Horovod ranks"
    )
    launch.add_argument(
        "--num_ps", type=at_least(0), default=None, help="parameter servers (PSStrategy, NoStrategy)"
    )
    launch.add_argument(
        "--cluster_config_path", default=None, help="conf/cluster/*.yaml (default: one local worker)"
    )
    args, extra = parser.parse_known_args(argv)
    if any(getattr(args, flag[2:]) is not None for flag in LAUNCH_FLAGS):
        return run_command(lambda: _launch(args, extra, _without_launch_flags(argv)), "recpipe train")
    return run_command(lambda: _train_eval(args, extra), "recpipe train")


def _train_eval(args, extra) -> int:
    _setup_logging()
    config = config_from_args(args, extra)
    model_dir = Path(args.model_dir or config.model_dir)
    train_days = _days(config.train_ds, "train_ds")
    if bool(args.export_dir) != bool(args.base or args.delta):
        raise UsageError("--export_dir and --base / --delta go together: where, and which export")
    from trainer import warm
    from trainer.distribute import distribution_for
    from trainer.loop import Trainer, TrainJob
    from trainer.scoring import evaluate
    from trainer.server_watch import watching_servers

    dist = distribution_for(config.train_config, config.feature_config.online_features)
    if (args.score_first or args.export_dir) and (dist.world_size > 1 or getattr(dist, "cluster", None)):
        raise UsageError(
            "--score_first and --export_dir are for one-process jobs: a multi-process job's tasks "
            "score (recpipe eval) and export (recpipe export) on their own"
        )
    job = TrainJob(
        config=config, model_dir=model_dir, train_days=train_days, continue_train=args.continue_train
    )
    with contextlib.ExitStack() as held:
        if dist.is_chief:  # one job per model dir; retention keeps the fine-tune source meanwhile
            held.enter_context(locks.training(model_dir, "recpipe train"))
            source = Path(config.train_config.fine_tune_checkpoint or "")
            source = source if source.is_dir() else source.parent  # a dir or a checkpoint prefix
            if config.train_config.fine_tune_checkpoint and not args.continue_train and source.is_dir():
                held.enter_context(locks.reading(source))
        cluster = getattr(dist, "cluster", {}) if dist.is_chief else {}
        if cluster.get("ps"):  # a parameter-server job: its chief watches the ps and workers
            servers = {kind: cluster[kind] for kind in ("ps", "worker") if cluster.get(kind)}
            held.enter_context(watching_servers(servers, config.train_config.server_timeout_secs))
        try:
            one_process = dist.world_size == 1 and not getattr(dist, "cluster", None)
            kept = warm.take(config, args.continue_train) if warm.enabled() and one_process else None
            trainer = Trainer(job, dist, warm=kept)
            on_start = args.score_first and _score_first(config, model_dir, train_days, args.score_first)
            result = trainer.train(on_log=_metrics_log(model_dir), on_start=on_start)
        except Exception as raised:
            err = dist.job_failure(raised) or raised  # e.g. a lost rank, said in one line
            if dist.exits_at_once_on_error:
                held.close()  # release the model dir's locks first
                exit_now(err, "recpipe train")
            if err is raised:
                raise
            raise err from raised
    if not dist.is_chief:
        return 0  # the chief writes the config, evaluates and prints the result
    atomic.write_text(ModelDir(model_dir).pipeline_config, _yaml(config))
    summary = _summary(result)
    if args.export_dir:
        # a delta's rows come from the model in memory, the checkpoint just saved; a base's
        # SavedModel from a model restored from it: the trained model's traced functions hold
        # table variables that growth replaced, which tf.saved_model.save cannot reach
        model = trainer.model
        if args.base:
            from trainer.scoring import load_model

            model, _ = load_model(config, result.checkpoint)
        summary["export"] = _export_online(config, model, model_dir, result.global_step, args)
    if config.eval_ds and not args.skip_eval:
        summary["eval"] = evaluate(config, model_dir, _days(config.eval_ds, "eval_ds"), result.checkpoint)
    if one_process:  # in a resident (trainer.warm): the next pass may start from here
        warm.keep(trainer, result.checkpoint)
    print(json.dumps(summary))
    return 0


def _summary(result) -> dict:
    """The result line's figures of a ``trainer.loop.TrainResult``."""
    summary = {
        "global_step": result.global_step,
        "checkpoint": result.checkpoint,
        "loss": result.loss,
        "examples_per_sec": round(result.examples_per_sec),
        "cpu_seconds": round(result.cpu_seconds, 2),
        "fine_tune": result.fine_tune,
        # the chief's peak resident memory, and up to the end of each phase (MiB)
        "peak_rss_mb": peak_rss_mb(),
        "memory_mb": result.memory_mb,
        # the first step (tracing and first run), the later steps, the traced step's operations
        "phases": result.phases,
    }
    if result.distribution:  # a distribution's own figures (geo: bytes to and from the ps)
        summary["distribution"] = result.distribution
    if result.online_tables:  # the day's rows used, admitted, evicted, filtered share per table
        summary["online_tables"] = result.online_tables
    return summary


def _score_first(config, model_dir: Path, days: list[str], result_name: str):
    """``Trainer.train``'s ``on_start`` for ``--score_first``: the model as restored from the
    fine-tune checkpoint scored on ``days`` (``trainer.scoring.score``), result and predictions
    under ``model_dir`` as ``recpipe eval`` of that checkpoint writes them."""

    def on_start(model, fine_tune: dict) -> None:
        from trainer.checkpoints import checkpoint_step
        from trainer.scoring import score

        files = ModelDir(model_dir)
        source = fine_tune["checkpoint"]
        score(
            config,
            model,
            checkpoint_step(source),
            source,
            model_dir,
            days,
            files.result(result_name),
            files.predictions(result_name),
        )

    return on_start


def _without_launch_flags(argv: list[str]) -> list[str]:
    """``argv`` less the launch flags and their values (``--flag V`` or ``--flag=V``)."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in LAUNCH_FLAGS:
            skip = True
        elif not arg.startswith(tuple(f"{flag}=" for flag in LAUNCH_FLAGS)):
            out.append(arg)
    return out


def _launch(args, extra, train_args: list[str]) -> int:
    """Start every process of the job with the cluster config's launcher, wait, and print the
    chief's result line."""

    _setup_logging()
    config = config_from_args(args, extra)  # a bad config fails here, before any process
    cluster = load_cluster_config(args.cluster_config_path) if args.cluster_config_path else ClusterConfig()
    model_dir = Path(args.model_dir or config.model_dir)  # the job's logs go under it
    eval_args = None
    if config.eval_config.eval_method == EvalMethod.separate:
        eval_args = [a for a in train_args if a not in ("--continue_train", "--skip_eval")]
    job = training_job(
        "train",
        config.train_config.train_distribute,
        cluster,
        train_args,
        cwd=Path.cwd(),
        workers=args.num_workers,
        ps=args.num_ps,
        eval_args=eval_args,
        sync_mode=config.train_config.ps_mode,
    )
    logs = ModelDir(model_dir).logs
    logging.getLogger(__name__).info("%s: %s, logs in %s", job.name, job.roles or "manifests", logs)
    result = run_job(launcher_for(cluster, logs), job)
    print(json.dumps(result))
    return 0


def _metrics_log(model_dir: Path):
    """An ``on_log`` callback appending one JSON line per logged step to
    ``<model_dir>/train_metrics.jsonl`` (``recpipe.jsonl``), which the Airflow operator
    forwards to MLflow."""
    path = ModelDir(model_dir).train_metrics

    def on_log(step: int, values: dict) -> None:
        jsonl.append(path, {"step": step, **{k: float(v) for k, v in values.items()}})

    return on_log


def _yaml(config) -> str:
    import yaml

    return yaml.safe_dump(config.to_dict(), sort_keys=False)


def eval_main(argv: list[str] | None = None) -> int:
    """``python -m trainer.eval`` / ``recpipe eval``: write ``eval_result.json`` for a checkpoint."""
    parser = ArgumentParser(prog="recpipe eval", description="evaluate a checkpoint on eval_ds")
    add_config_args(parser)
    parser.add_argument("--model_dir", default=None)
    parser.add_argument(
        "--checkpoint_path",
        default=None,
        help="default: model_dir's latest checkpoint (exporter_type best: its best/)",
    )
    parser.add_argument(
        "--eval_result_path", default=None, help="result file (default: model_dir/eval_result.json)"
    )
    parser.add_argument(
        "--predictions_path", default=None, help="also write each row's label and probability (Parquet)"
    )
    parser.add_argument(
        "--follow",
        action="store_true",
        help="the separate evaluator: evaluate each new checkpoint of model_dir until training ends",
    )
    args, extra = parser.parse_known_args(argv)

    def run() -> int:
        _setup_logging()
        config = config_from_args(args, extra)
        from trainer.scoring import evaluate

        days = _days(config.eval_ds, "eval_ds")
        model_dir = args.model_dir or config.model_dir
        if args.follow:
            from trainer.sidecar_evaluator import follow

            print(json.dumps({"evaluated_steps": follow(config, model_dir, days)}))
            return 0
        result = evaluate(
            config, model_dir, days, args.checkpoint_path, args.eval_result_path, args.predictions_path
        )
        print(json.dumps({**result, "peak_rss_mb": peak_rss_mb()}))
        return 0

    return run_command(run, "recpipe eval")


def pooled_eval_main(argv: list[str] | None = None) -> int:
    """``python -m trainer.pooled_eval --predictions P... --out F``: AUC and logloss of the
    rows of several evaluations pooled (``trainer.metrics.pooled_eval``); prints the result."""
    parser = ArgumentParser(prog="trainer.pooled_eval", description="metrics of pooled predictions")
    parser.add_argument("--predictions", nargs="+", required=True, help="Parquet files: label, probability")
    parser.add_argument("--out", required=True, help="the pooled rows (Parquet)")
    args = parser.parse_args(argv)

    def run() -> int:
        _setup_logging()
        from trainer.metrics import pooled_eval

        print(json.dumps(pooled_eval(args.predictions, args.out)))
        return 0

    return run_command(run, "trainer.pooled_eval")


def export_main(argv: list[str] | None = None) -> int:
    """``python -m trainer.export`` / ``recpipe export``: write a SavedModel version."""
    parser = ArgumentParser(prog="recpipe export", description="export a SavedModel for serving")
    add_config_args(parser)
    parser.add_argument("--model_dir", default=None)
    parser.add_argument("--export_dir", required=True)
    parser.add_argument(
        "--checkpoint_path",
        default=None,
        help="default: model_dir's latest checkpoint (exporter_type best: its best/)",
    )
    online = parser.add_mutually_exclusive_group()
    online.add_argument(
        "--base",
        metavar="DAY[/PASS]",
        default=None,
        help="write the base: <export_dir>/DAY/base/ (DAY/PASS, PASS HH or HHMM: the pass that "
        "exports it, recorded)",
    )
    online.add_argument(
        "--delta",
        metavar="DAY/PASS",
        default=None,
        help="write the pass's delta since the day's previous export: <export_dir>/DAY/delta-PASS/ "
        "(PASS: HH, or HHMM for a pass shorter than an hour)",
    )
    args, extra = parser.parse_known_args(argv)

    def run() -> int:
        _setup_logging()
        config = config_from_args(args, extra)
        from trainer.best_exporter import export_checkpoint
        from trainer.scoring import load_model
        from trainer.serving import export_saved_model, find_export

        model_dir = args.model_dir or config.model_dir
        model, step = load_model(config, args.checkpoint_path or export_checkpoint(config, model_dir))
        if args.base or args.delta:
            print(
                json.dumps(
                    {**_export_online(config, model, model_dir, step, args), "peak_rss_mb": peak_rss_mb()}
                )
            )
            return 0
        export = find_export(args.export_dir, model_dir, step)
        if export is not None:  # a retry after the export was published, before it was recorded
            logging.getLogger(__name__).info("reusing %s, exported from model_dir at step %d", export, step)
        else:
            export = export_saved_model(config, model, model_dir, args.export_dir, step)
        from trainer.mlflow_model import save_mlflow_model

        # the same SavedModel as an MLflow Model (what the registry serves); example rows from
        # the last training day
        days = parse_ds_range(config.train_ds, "train_ds") if config.train_ds else []
        mlflow_model = save_mlflow_model(
            config, export, ModelDir(model_dir).mlflow_model, days[-1] if days else None
        )
        done = {"export": str(export), "global_step": step, "mlflow_model": str(mlflow_model)}
        print(json.dumps({**done, "peak_rss_mb": peak_rss_mb()}))
        return 0

    return run_command(run, "recpipe export")


def _export_online(config, model, model_dir, step: int, args) -> dict:
    """``recpipe export --base DAY`` / ``--delta DAY/HH[MM]``: the manifest's summary."""
    from trainer.delta import export_base, export_delta
    from trainer.serving import read_normalization

    normalization = read_normalization(model_dir)
    if args.base:
        day = day_of(args.base)  # the day, or the pass that exports the day's base
        key = pass_of(args.base)
        out = export_base(
            config, model, normalization, Path(args.export_dir) / day, day, step, key, Path(model_dir)
        )
    else:
        day, key = day_of(args.delta), pass_of(args.delta)
        if key is None:
            raise UsageError(f"--delta {args.delta}: give the pass, YYYY-MM-DD/HH or YYYY-MM-DD/HHMM")
        out = export_delta(
            config, model, normalization, Path(args.export_dir) / day, key, step, Path(model_dir)
        )
    manifest = read_manifest(out)
    size = sum(f["bytes"] for f in manifest["files"].values())
    return {
        "export": str(out),
        "kind": manifest["kind"],
        "global_step": step,
        "bytes": size,
        "tables": manifest["tables"],
    }


def serve_main(argv: list[str] | None = None) -> int:
    """``recpipe serve apply-delta BASE DELTA... --out DIR``: a SavedModel from a base and its
    deltas; ``recpipe serve push EXPORT --model NAME [--redis_url URL]``: an export's rows to
    the online store (``recpipe.exports.store``)."""
    parser = ArgumentParser(prog="recpipe serve", description="build or push what serving reads")
    sub = parser.add_subparsers(dest="action", required=True)
    apply = sub.add_parser("apply-delta", help="a SavedModel from a base export and its deltas, in order")
    apply.add_argument("base")
    apply.add_argument("deltas", nargs="*")
    apply.add_argument("--out", required=True)
    push = sub.add_parser("push", help="write a base or delta export's rows to Redis")
    push.add_argument("exports", nargs="+", help="base / delta directories, pushed in the order given")
    push.add_argument("--model", required=True, help="the model's name in the store")
    from recpipe.redis_conn import add_arguments

    add_arguments(push, "the online store")
    args = parser.parse_args(argv)

    def run() -> int:
        _setup_logging()
        if args.action == "apply-delta":
            from trainer.delta import build_saved_model

            out = build_saved_model(Path(args.base), [Path(d) for d in args.deltas], Path(args.out))
            print(json.dumps({"saved_model": str(out), "deltas": len(args.deltas)}))
            return 0
        import redis

        from recpipe import redis_conn
        from recpipe.errors import PipelineError
        from recpipe.exports.store import EmbeddingStore

        address = redis_conn.resolve(args.redis_url, password_file=args.redis_password_file)
        client = address.client()
        for export in args.exports:
            try:
                totals, pushed = EmbeddingStore(client, args.model).push_chain(Path(export))
            except redis.RedisError as err:
                raise PipelineError(f"the store at {address.where()} did not answer: {err}") from None
            print(json.dumps({"export": export, **totals, "pushed": [str(p) for p in pushed]}))
        return 0

    return run_command(run, "recpipe serve")


def ckpt_main(argv: list[str] | None = None) -> int:
    """``recpipe ckpt list``: print each variable's name and shape, as EasyRec's doc does, then
    each online table's rows used / capacity."""
    parser = ArgumentParser(prog="recpipe ckpt", description="inspect checkpoints")
    sub = parser.add_subparsers(dest="action", required=True)
    ls = sub.add_parser("list", help="each variable's name and shape")
    ls.add_argument("checkpoint", help="a checkpoint prefix or a model_dir")
    args = parser.parse_args(argv)

    def run() -> int:
        from trainer.checkpoints import list_online_tables, list_variables

        for name, shape in list_variables(args.checkpoint):
            print(f"{name}\t{shape}")
        for table, used, capacity in list_online_tables(args.checkpoint):
            print(f"{table}\trows used {used} / capacity {capacity}")
        return 0

    return run_command(run, "recpipe ckpt")
