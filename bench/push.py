"""The push to the Redis embedding store against its floor, variants compared in one run.

A day's base export of ``--rows`` rows (one online table, ``--dim`` float32 a row) and a
delta that moves ``--touched`` of them and deletes ``--evicted``, written by
``recpipe.exports.files`` (no TensorFlow), pushed to the Redis at ``--redis_url`` by:

  floor     a bare pipelined ``HSET`` a row (the same keys and fields, no lock, no fencing,
            no script), batches of ``store.BATCH``;
  push      ``recpipe.exports.store.EmbeddingStore.push`` of the base then the delta: the base's rows into a
            new generation, one ``HSET`` each in the fenced script, then the switch and the
            old generation's deletion; the delta in place, one ``HSET`` a row too.

Each variant runs once a round, alternating, ``--rounds`` rounds; printed and kept: the
medians of wall and CPU seconds (this process's and the Redis server's, from ``INFO cpu``),
rows per wall second and per CPU-second, and the median of each round's ratio to the floor.
Figures go to ``bench/results/push.json``.

    python bench/push.py [--rows 1000000] [--dim 16] [--rounds 3]
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import harness  # noqa: E402

DAY = "2024-05-01"


def _export(day_dir: Path, name: str, sequence: int, previous, tables) -> dict:
    import numpy as np

    from recpipe.exports.files import Params, write_export

    params = Params(tables, {"dense/w": np.zeros(2, np.float32)}, {})
    return write_export(day_dir, name, sequence, previous, params, 10 * sequence, 100 + sequence)


def main() -> int:
    parser = harness.parser(__doc__, rounds=3)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--touched", type=float, default=0.1)
    parser.add_argument("--evicted", type=float, default=0.01)
    parser.add_argument(
        "--redis_url", default="redis://127.0.0.1:6379/13", help="a database of its own: emptied"
    )
    args = parser.parse_args()

    import numpy as np
    import redis

    from bench.floors import hset_rows, redis_cpu_s
    from recpipe.exports import store
    from recpipe.exports.files import DELTA_PREFIX, TableRows

    client = redis.Redis.from_url(args.redis_url)
    client.flushdb()
    rng = np.random.default_rng(0)
    view = "item_id/embedding_weights"
    work = Path(tempfile.mkdtemp(prefix="bench-push-"))
    day = work / DAY
    ids = np.arange(args.rows, dtype=np.int64)
    base = _export(
        day,
        "base",
        0,
        None,
        {"item_id": TableRows(ids, {view: rng.standard_normal((args.rows, args.dim), "f4")})},
    )
    moved = rng.choice(ids, int(args.rows * args.touched), replace=False)
    gone = rng.choice(np.setdiff1d(ids, moved), int(args.rows * args.evicted), replace=False)
    delta_rows = TableRows(np.sort(moved), {view: rng.standard_normal((len(moved), args.dim), "f4")})
    delta_rows.tombstones = np.sort(gone)
    _export(day, f"{DELTA_PREFIX}01", 1, base, {"item_id": delta_rows})
    exports = [day / "base", day / f"{DELTA_PREFIX}01"]
    rows = args.rows + len(moved) + len(gone)

    def floor(model: str) -> None:
        rows_of = store.EmbeddingStore(client, model)
        hset_rows(client, exports, lambda table, key: rows_of.row_key(table, key, 1), store.BATCH)

    def push(model: str) -> None:
        for export in exports:
            store.EmbeddingStore(client, model).push(export)

    def measured(fn):
        def once() -> dict:
            wall, cpu, server = time.perf_counter(), time.process_time(), redis_cpu_s(client)
            fn("bench-push")  # the database is emptied after each call
            figures = {
                "wall_s": time.perf_counter() - wall,
                "client_cpu_s": time.process_time() - cpu,
                "server_cpu_s": redis_cpu_s(client) - server,
            }
            figures["cpu_s"] = figures["client_cpu_s"] + figures["server_cpu_s"]
            client.flushdb()
            return figures

        return once

    runs = harness.alternate({"floor": measured(floor), "push": measured(push)}, args.rounds)
    best = harness.versus(runs, "floor", {"wall_s": "wall_vs_floor", "cpu_s": "cpu_vs_floor"})
    for f in best.values():
        f |= {"rows_per_s": rows / f["wall_s"], "rows_per_cpu_s": rows / f["cpu_s"]}
    print(
        f"{rows:,} row writes and deletes (base {args.rows:,} rows of {args.dim} floats, delta "
        f"{len(moved):,} moved and {len(gone):,} deleted), medians of {args.rounds} alternating rounds"
    )
    columns = {"wall_s": "wall s", "cpu_s": "CPU s", "rows_per_s": "rows/s", "rows_per_cpu_s": "rows/CPU-s"}
    print(harness.table(best, columns | {"wall_vs_floor": "wall/floor", "cpu_vs_floor": "CPU/floor"}))
    harness.finish("push", {"rows": rows, "rounds": args.rounds, "figures": best})
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
