"""``recpipe``: the project's command-line tool.

Subcommands: ``data`` (``dev.data``), ``features``, ``config``,
``train``, ``eval``, ``export``, ``serve apply-delta`` / ``serve push``, ``ckpt list``,
``predict``, ``runs compare``, ``champion show | set | rollback``, ``announce``.
Commands that read a pipeline config take EasyRec's ``--edit_config_json`` and
``--section.field=value`` overrides. Exit codes (every command): 2 for usage and config
errors, 1 for pipeline errors (``recpipe.errors``).
"""

# Imports inside functions: each command's modules are imported when it runs: `recpipe --help`
# and the light commands load no TensorFlow, Spark or MLflow.

from __future__ import annotations

import argparse
import sys

import yaml

from recpipe import redis_conn
from recpipe.arguments import ArgumentParser
from recpipe.config.args import edits_from_args
from recpipe.config.check import KINDS
from recpipe.errors import UsageError, run_command


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    code = _delegated(argv)
    if code is not None:
        return code
    parser, announce = _parser()
    args, extra = parser.parse_known_args(argv)
    if args.command == "announce":
        if extra:
            announce.error(f"unrecognized arguments: {' '.join(extra)}")
        return run_command(lambda: _announce(args), "recpipe announce")
    return run_command(lambda: _print_configs(args, extra))


def _parser() -> tuple[ArgumentParser, ArgumentParser]:
    """The top-level parser (each delegated command's name, for ``--help``) and ``announce``'s."""
    parser = ArgumentParser(
        prog="recpipe",
        description="recpipe: the project's command-line tool",
        epilog="Commands that read a pipeline config take EasyRec's overrides: --edit_config_json="
        "'{\"train_config.num_steps\": 500}' and --section.field=value (--train_config.num_steps=500). "
        "Days: YYYY-MM-DD or START:END (inclusive); passes YYYY-MM-DD/HH (or /HHMM). Exit codes: 2 "
        "for usage and config errors, 1 for pipeline errors.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    # the demo and benchmark data sets: the development kit's command (dev/data/cli.py)
    sub.add_parser("data", help="fetch, replay or synthesise raw logs (dev.data)", add_help=False)
    sub.add_parser("features", help="Spark feature preparation of days", add_help=False)
    check = sub.add_parser(
        "config",
        help="validate a pipeline, retrain or cluster config (recognised by its fields) and print it, "
        "overrides applied; `recpipe config import F` turns an EasyRec config into recpipe's",
    )
    check.add_argument("path", nargs="?", help="the config file (or --pipeline_config_path)")
    check.add_argument("--pipeline_config_path", default=None, help="a pipeline config (conf/*.yaml)")
    check.add_argument("--kind", choices=KINDS, default=None, help="which config (default: by its fields)")
    check.add_argument("--edit_config_json", default=None, help="overrides of the pipeline config")

    for name in ("train", "eval", "export", "serve", "ckpt"):
        sub.add_parser(name, help=f"see recpipe {name} --help", add_help=False)
    sub.add_parser(
        "predict", help="score rows with a SavedModel export (recpipe predict --help)", add_help=False
    )
    sub.add_parser("runs", help="compare MLflow runs (recpipe runs compare --help)", add_help=False)
    sub.add_parser(
        "champion",
        help="show, set or roll back the serving version (recpipe champion --help)",
        add_help=False,
    )
    announce = sub.add_parser(
        "announce",
        help="tell waiting stream passes that a raw partition is complete (after its _SUCCESS)",
        description="Publish a complete raw partition on Redis (channel recpipe:partitions): a "
        "stream pass waiting for it starts within seconds instead of at its sensor's next look.",
    )
    announce.add_argument("partition", nargs="+", help="the partition directory, ds=D[/hh=HH[MM]]")
    redis_conn.add_arguments(announce, "the Redis of the arrivals connection", env=redis_conn.ARRIVALS_ENV)
    return parser, announce


def _delegated(argv: list[str]) -> int | None:
    """Run a command whose parser lives with its code (``predict``, ``runs``, ``champion``, ...);
    None for the commands parsed here."""
    if argv and argv[0] == "data":
        from dev.data.cli import main as data_main

        return run_command(lambda: data_main(argv[1:]), "recpipe data")
    if argv and argv[0] == "predict":
        from predict.cli import main as predict_main

        return run_command(lambda: predict_main(argv[1:]), "recpipe predict")
    if argv and argv[0] == "runs":
        from recpipe.runs.cli import main as runs_main

        return run_command(lambda: runs_main(argv[1:]), "recpipe runs")
    if argv and argv[0] == "champion":
        from recpipe.champion import main as champion_main

        return run_command(lambda: champion_main(argv[1:]), "recpipe champion")
    if argv[:2] == ["config", "import"]:
        from recpipe.config.easyrec import main as import_main

        return run_command(lambda: import_main(argv[2:]), "recpipe config import")
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
    return None


def _announce(args: argparse.Namespace) -> int:
    import redis

    from recpipe.arrivals import announce
    from recpipe.errors import PipelineError

    address = redis_conn.resolve(
        args.redis_url, env=redis_conn.ARRIVALS_ENV, password_file=args.redis_password_file
    )
    client = address.client()
    for partition in args.partition:
        try:
            heard = announce(client, partition)
        except redis.RedisError as err:
            raise PipelineError(f"no Redis at {address.where()} to announce on: {err}") from None
        print(f"{partition}: announced ({heard} waiting)")
    return 0


def _print_configs(args: argparse.Namespace, extra: list[str]) -> int:
    from recpipe.config.check import check_config

    path = args.path or args.pipeline_config_path
    if path is None or (args.path and args.pipeline_config_path):
        raise UsageError("recpipe config: give one config file (PATH or --pipeline_config_path)")
    kind = "pipeline" if args.pipeline_config_path else args.kind
    configs = check_config(path, kind, edits_from_args(args.edit_config_json, extra))
    for name, config in configs.items():
        if len(configs) > 1:
            print(f"# {name} config")
        data = config.model_dump(mode="json", by_alias=True, exclude_none=True)
        print(yaml.safe_dump(data, sort_keys=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
