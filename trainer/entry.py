"""Shared command-line handling of ``trainer.train_eval``, ``trainer.eval``, ``trainer.export``
and their ``recpipe train / eval / export / ckpt`` twins (EasyRec's flags)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

from recpipe.cli import add_config_args, config_from_args
from recpipe.config import ConfigError
from recpipe.errors import PipelineError

# TensorFlow's C++ start-up chatter hides the log lines users need.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def _setup_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def _days(value: str | None, field: str) -> list[str]:
    from trainer.input import parse_ds_range

    if not value:
        raise ConfigError(
            f"{field} is not set: pass --{field}=YYYY-MM-DD[:YYYY-MM-DD] or set it in the config"
        )
    return parse_ds_range(value)


def train_eval_main(argv: list[str] | None = None) -> int:
    """``python -m trainer.train_eval`` / ``recpipe train``: train, then evaluate on ``eval_ds``."""
    parser = argparse.ArgumentParser(prog="trainer.train_eval", description="train, then evaluate on eval_ds")
    add_config_args(parser)
    parser.add_argument("--model_dir", default=None, help="overrides the config's model_dir")
    parser.add_argument(
        "--continue_train", action="store_true", help="resume from model_dir's latest checkpoint"
    )
    parser.add_argument(
        "--skip_eval", action="store_true", help="train only; the caller evaluates eval_ds (the DAGs do)"
    )
    args, extra = parser.parse_known_args(argv)
    return _guard(lambda: _train_eval(args, extra))


def _train_eval(args, extra) -> int:
    _setup_logging()
    config = config_from_args(args, extra)
    model_dir = Path(args.model_dir or config.model_dir)
    train_days = _days(config.train_ds, "train_ds")
    from trainer.distribute import distribution_for
    from trainer.evaluation import evaluate
    from trainer.loop import Trainer, TrainJob

    dist = distribution_for(config.train_config)
    job = TrainJob(
        config=config,
        model_dir=model_dir,
        train_days=train_days,
        continue_train=args.continue_train,
        rank=dist.rank,
        world_size=dist.world_size,
        is_chief=dist.is_chief,
    )
    trainer = Trainer(job, dist)
    result = trainer.train(on_log=_metrics_log(model_dir))
    if not dist.is_chief:
        return 0  # the chief writes the config, evaluates and prints the result
    _write_config(config, model_dir)
    summary = {
        "global_step": result.global_step,
        "checkpoint": result.checkpoint,
        "loss": result.loss,
        "examples_per_sec": round(result.examples_per_sec),
        "fine_tune": result.fine_tune,
    }
    if config.eval_ds and not args.skip_eval:
        summary["eval"] = evaluate(config, model_dir, _days(config.eval_ds, "eval_ds"), result.checkpoint)
    print(json.dumps(summary))
    return 0


def _metrics_log(model_dir: Path):
    """An ``on_log`` callback appending one JSON line per logged step to
    ``<model_dir>/train_metrics.jsonl``, which the Airflow operator forwards to MLflow."""
    path = model_dir / "train_metrics.jsonl"

    def on_log(step: int, values: dict) -> None:
        model_dir.mkdir(parents=True, exist_ok=True)
        with path.open("a") as out:
            out.write(json.dumps({"step": step, **{k: float(v) for k, v in values.items()}}) + "\n")

    return on_log


def _write_config(config, model_dir: Path) -> None:
    import yaml

    tmp = model_dir / ".pipeline.yaml.tmp"
    tmp.write_text(yaml.safe_dump(config.to_dict(), sort_keys=False))
    tmp.replace(model_dir / "pipeline.yaml")


def eval_main(argv: list[str] | None = None) -> int:
    """``python -m trainer.eval`` / ``recpipe eval``: write ``eval_result.json`` for a checkpoint."""
    parser = argparse.ArgumentParser(prog="trainer.eval", description="evaluate a checkpoint on eval_ds")
    add_config_args(parser)
    parser.add_argument("--model_dir", default=None)
    parser.add_argument("--checkpoint_path", default=None, help="default: model_dir's latest checkpoint")
    parser.add_argument(
        "--eval_result_path", default=None, help="result file (default: model_dir/eval_result.json)"
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
        from trainer.evaluation import evaluate

        days = _days(config.eval_ds, "eval_ds")
        model_dir = args.model_dir or config.model_dir
        if args.follow:
            from trainer.evaluator import follow

            print(json.dumps({"evaluated_steps": follow(config, model_dir, days)}))
            return 0
        result = evaluate(config, model_dir, days, args.checkpoint_path, args.eval_result_path)
        print(json.dumps(result))
        return 0

    return _guard(run)


def export_main(argv: list[str] | None = None) -> int:
    """``python -m trainer.export`` / ``recpipe export``: write a SavedModel version."""
    parser = argparse.ArgumentParser(prog="trainer.export", description="export a SavedModel for serving")
    add_config_args(parser)
    parser.add_argument("--model_dir", default=None)
    parser.add_argument("--export_dir", required=True)
    parser.add_argument("--checkpoint_path", default=None, help="default: model_dir's latest checkpoint")
    args, extra = parser.parse_known_args(argv)

    def run() -> int:
        _setup_logging()
        config = config_from_args(args, extra)
        from trainer.evaluation import load_model
        from trainer.exporter import export_saved_model

        model_dir = args.model_dir or config.model_dir
        model, step = load_model(config, args.checkpoint_path or model_dir)
        print(
            json.dumps(
                {
                    "export": str(export_saved_model(config, model, model_dir, args.export_dir)),
                    "global_step": step,
                }
            )
        )
        return 0

    return _guard(run)


def ckpt_main(argv: list[str] | None = None) -> int:
    """``recpipe ckpt list``: print each variable's name and shape, as EasyRec's doc does."""
    parser = argparse.ArgumentParser(prog="recpipe ckpt", description="inspect checkpoints")
    sub = parser.add_subparsers(dest="action", required=True)
    ls = sub.add_parser("list", help="each variable's name and shape")
    ls.add_argument("checkpoint", help="a checkpoint prefix or a model_dir")
    args = parser.parse_args(argv)

    def run() -> int:
        from trainer.checkpoints import list_variables

        for name, shape in list_variables(args.checkpoint):
            print(f"{name}\t{shape}")
        return 0

    return _guard(run)


def _guard(fn) -> int:
    # ConfigError, StrategyError and model / embedding config errors are ValueErrors
    try:
        return fn()
    except (PipelineError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
