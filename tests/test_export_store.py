"""The Redis embedding store over a day of exports, on the Redis server on 127.0.0.1: pushes in
any order never move it backwards, a restarted store is rebuilt from the day's chain, readers
never see a row missing while it is rewritten, and pushers of one model take turns. The
exports are written by ``recpipe.exports.files`` alone (no TensorFlow): a base and three deltas."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import numpy as np
import pytest

from recpipe.exports.files import DELTA_PREFIX, Params, TableRows, write_export

DAY = "2024-05-01"
DIM = 4


def _rows(ids, value: float) -> TableRows:
    ids = np.asarray(ids, np.int64)
    return TableRows(ids, {"t/embedding_weights": np.full((len(ids), DIM), value, np.float32)})


def _export(day_dir, name: str, sequence: int, previous: dict | None, rows: TableRows) -> dict:
    params = Params({"t": rows}, {"dense/w": np.zeros(2, np.float32)}, {})
    return write_export(day_dir, name, sequence, previous, params, 10 * sequence, 100 + sequence)


@pytest.fixture
def day(tmp_path):
    """base: ids 0-9 = 0.0; delta-01: 10-11 = 1.0; delta-02: 0 = 2.0, 5 gone; delta-03: 12 = 3.0."""
    d = tmp_path / DAY
    base = _export(d, "base", 0, None, _rows(range(10), 0.0))
    d1 = _export(d, f"{DELTA_PREFIX}01", 1, base, _rows([10, 11], 1.0))
    gone = _rows([0], 2.0)
    gone.tombstones = np.array([5], np.int64)
    d2 = _export(d, f"{DELTA_PREFIX}02", 2, d1, gone)
    _export(d, f"{DELTA_PREFIX}03", 3, d2, _rows([12], 3.0))
    return d


def _held(client, model) -> dict[int, float]:
    from recpipe.exports.store import EmbeddingStore

    rows = EmbeddingStore(client, model).read_rows("t")
    return {k: float(v["t/embedding_weights"][0]) for k, v in rows.items()}


FINAL = {**{i: 0.0 for i in range(10) if i != 5}, 0: 2.0, 10: 1.0, 11: 1.0, 12: 3.0}


def test_a_cleared_push_of_an_earlier_pass_leaves_the_store_where_it_was(day, store):
    from recpipe.exports.store import EmbeddingStore

    client, model = store

    online = EmbeddingStore(client, model)
    for name in ("base", "delta-01", "delta-02", "delta-03"):
        online.push_chain(day / name)
    assert _held(client, model) == FINAL
    for name in ("delta-01", "base", "delta-02"):  # re-run after the later passes
        totals, pushed = online.push_chain(day / name)
        assert totals == {"rows": 0, "deleted": 0, "stale": 1} and pushed == [day / name]
        assert _held(client, model) == FINAL and online.applied()["name"] == "delta-03"


def test_a_restarted_store_is_rebuilt_from_the_days_chain(day, store):
    from recpipe.exports.store import EmbeddingStore, StoreBehind

    client, model = store

    online = EmbeddingStore(client, model)
    online.push_chain(day / "base")
    with pytest.raises(StoreBehind, match="push the exports in order"):
        online.push(day / "delta-02")
    for key in client.scan_iter(match=f"recpipe:{model}:*"):  # Redis restarted: nothing kept
        client.delete(key)
    with pytest.raises(StoreBehind, match="the store holds nothing"):
        online.push(day / "delta-03")
    totals, pushed = online.push_chain(day / "delta-03")
    assert [p.name for p in pushed] == ["base", "delta-01", "delta-02", "delta-03"]
    assert _held(client, model) == FINAL and online.applied()["sequence"] == "3"
    # a store one push behind takes the missing ones
    online.push_chain(day / "base")  # stale: a no-op
    assert _held(client, model) == FINAL


def test_random_orders_of_pushes_end_where_the_newest_export_pushed_leaves_it(day, store):
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from recpipe.exports.files import apply, chain, read_params
    from recpipe.exports.store import EmbeddingStore

    client, model = store

    online = EmbeddingStore(client, model)
    exports = chain(day)
    expected = []
    params = None
    for item in exports:
        params = read_params(item) if params is None else apply(params, read_params(item))
        rows = params.tables["t"]
        expected.append(
            {int(k): float(v[0]) for k, v in zip(rows.ids, rows.views["t/embedding_weights"], strict=True)}
        )

    @settings(deadline=None)  # the profile's examples (tests/conftest.py)
    @given(st.lists(st.integers(0, len(exports) - 1), min_size=1, max_size=8), st.booleans())
    def pushes(order, restart):
        for key in client.scan_iter(match=f"recpipe:{model}:*"):
            client.delete(key)
        newest = -1
        for k, i in enumerate(order):
            if restart and k == len(order) // 2:
                for key in client.scan_iter(match=f"recpipe:{model}:*"):
                    client.delete(key)
                newest = -1
            online.push_chain(exports[i])
            newest = max(newest, i)
            assert _held(client, model) == expected[newest], (order, k)
            assert online.applied()["name"] == exports[newest].name

    pushes()


def test_readers_never_see_a_row_missing_while_pushes_rewrite_it(tmp_path, store):
    from recpipe.exports.store import EmbeddingStore

    client, model = store

    online = EmbeddingStore(client, model)
    big = tmp_path / "big"
    _export(big, "base", 0, None, _rows(range(2000), 0.5))
    online.push(big / "base")
    missing, done = [], threading.Event()

    def read():
        import redis

        reader = redis.Redis(host="127.0.0.1", port=6379, db=0)
        while not done.is_set():
            found = EmbeddingStore(reader, model).lookup("t", range(2000))
            missing.extend(k for k in range(2000) if k not in found)

    thread = threading.Thread(target=read)
    thread.start()
    try:
        for _ in range(10):  # the same base again: a new generation written and switched to each time
            online.push(big / "base")
    finally:
        done.set()
        thread.join(10)
    assert not missing, f"{len(missing)} reads found no row, e.g. {missing[:3]}"
    assert len(list(client.scan_iter(match=f"recpipe:{model}:g*"))) == 2000  # one generation left


def test_a_push_interrupted_before_its_switch_leaves_rows_the_next_push_deletes(tmp_path, store, monkeypatch):
    """A rebuild that dies after writing some batches of its new generation (the generation
    recorded before its first row) leaves rows no reader sees; the next push deletes them, and
    a store written before the record of generations is swept whole once."""
    import recpipe.exports.store as online_store
    from recpipe.exports.store import EmbeddingStore

    client, model = store

    online = EmbeddingStore(client, model)
    big = tmp_path / "big"
    _export(big, "base", 0, None, _rows(range(50), 0.5))
    online.push(big / "base")
    monkeypatch.setattr(online_store, "BATCH", 10)
    real = online_store._Pusher.switch

    def dies(*args, **kwargs):
        raise ConnectionError("the pusher's host went away")

    monkeypatch.setattr(online_store._Pusher, "switch", dies)
    with pytest.raises(ConnectionError):
        online.push(big / "base")
    keys = lambda: {k.decode().split(":")[2] for k in client.scan_iter(match=f"recpipe:{model}:g*")}  # noqa: E731
    assert keys() == {"g1", "g2"} and online.applied()["generation"] == "1"
    monkeypatch.setattr(online_store._Pusher, "switch", real)
    online.push(big / "base")
    assert keys() == {"g3"} and client.smembers(f"recpipe:{model}:written-generations") == {b"3"}
    # a store from before the record: rows of a generation it does not name are swept too
    client.delete(f"recpipe:{model}:written-generations")
    client.hset(f"recpipe:{model}:g0:t:7", "version", "old")
    online.push(big / "base")
    assert keys() == {"g4"} and len(_held(client, model)) == 50


def _slowed(monkeypatch, when, action):
    """Run ``action()`` whenever the store reads the params of an export named ``when``."""
    import recpipe.exports.store as online_store

    real = online_store.read_params

    def read_params(export, *args, **kwargs):
        if export.name == when:
            action()
        return real(export, *args, **kwargs)

    monkeypatch.setattr(online_store, "read_params", read_params)


@pytest.fixture
def rewrites(tmp_path):
    """base: ids 0-9 = 0.0; delta-01: the same ids = 1.0; delta-02: the same ids = 2.0."""
    d = tmp_path / DAY
    base = _export(d, "base", 0, None, _rows(range(10), 0.0))
    d1 = _export(d, f"{DELTA_PREFIX}01", 1, base, _rows(range(10), 1.0))
    _export(d, f"{DELTA_PREFIX}02", 2, d1, _rows(range(10), 2.0))
    return d


def test_a_pusher_whose_lock_expired_never_writes_over_a_newer_push(rewrites, store, monkeypatch):
    import recpipe.exports.store as online_store
    from recpipe.exports.store import EmbeddingStore, StoreFenced

    client, model = store

    online = EmbeddingStore(client, model)
    online.push(rewrites / "base")
    monkeypatch.setattr(online_store, "LOCK_TIMEOUT_S", 1)
    late = threading.Event()
    _slowed(
        monkeypatch, "delta-01", lambda: late.wait(10) if threading.current_thread().name == "slow" else None
    )
    errors = []

    def slow():
        try:
            online.push(rewrites / "delta-01")
        except StoreFenced as err:
            errors.append(err)

    thread = threading.Thread(target=slow, name="slow")
    thread.start()
    import time

    time.sleep(1.5)  # the slow pusher's lock expires
    online.push_chain(rewrites / "delta-02")  # rebuilt from the base: delta-01 then 02
    late.set()
    thread.join(20)
    assert online.applied()["name"] == "delta-02"
    assert _held(client, model) == dict.fromkeys(range(10), 2.0)  # none of delta-01's values
    assert len(errors) == 1 and "push lock expired" in str(errors[0])


def test_a_rebuild_from_the_base_keeps_serving_every_row_until_it_switches(day, store, monkeypatch):
    from recpipe.exports.store import EmbeddingStore

    client, model = store

    online = EmbeddingStore(client, model)
    online.push_chain(day / "base")
    online.push_chain(day / "delta-01")  # the store serves ids 0-11; delta-02's push is lost
    seen = []
    _slowed(monkeypatch, "delta-02", lambda: seen.append(online.lookup("t", range(13))))
    _, pushed = online.push_chain(day / "delta-03")
    assert [p.name for p in pushed] == ["base", "delta-01", "delta-02", "delta-03"]
    # read while the rebuild had written the base and delta-01 only: delta-01's rows served
    served = {k: float(v["t/embedding_weights"][0]) for k, v in seen[0].items()}
    assert served == {**dict.fromkeys(range(10), 0.0), 10: 1.0, 11: 1.0}
    assert _held(client, model) == FINAL and online.applied()["name"] == "delta-03"


def test_pushers_of_one_model_take_turns(day, store):
    from recpipe.exports.store import LOCK_WAIT_S, EmbeddingStore, StoreError

    client, model = store

    online = EmbeddingStore(client, model)
    held = client.lock(f"recpipe:{model}:push-lock", timeout=30)
    assert held.acquire()
    import recpipe.exports.store as online_store

    try:
        online_store.LOCK_WAIT_S = 0.5
        with pytest.raises(StoreError, match="another push held the store's lock"):
            online.push(day / "base")
    finally:
        online_store.LOCK_WAIT_S = LOCK_WAIT_S
        held.release()
    assert online.push(day / "base")["rows"] == 10


def _one_line_exit_2(capsys, argv: list[str]) -> str:
    from cli.main import main

    try:
        code = main(argv)
    except SystemExit as end:
        code = end.code
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, (code, err)
    return err


@pytest.mark.parametrize(
    "url", ["redis://:s3cret@127.0.0.1:6379/0", "redis://127.0.0.1:6379/0?password=s3cret"]
)
def test_no_command_takes_a_password_on_its_command_line(url, capsys):
    """``ps`` shows a command line to every user of the host: a URL holding a password, in
    its user part or its query (which redis-py reads too), is refused by every command that
    takes a Redis URL, with one line naming the flag and where the password goes instead."""
    for argv, flag in (
        (["serve", "push", "x", "--model", "m", "--redis_url", url], "--redis_url"),
        (["announce", "data/raw/ds=2024-01-01", "--redis_url", url], "--redis_url"),
        (["champion", "rollback", "--model_name", "m", "--reason", "r", "--redis_url", url], "--redis_url"),
    ):
        err = _one_line_exit_2(capsys, argv)
        assert f"{flag} holds a password" in err and "s3cret" not in err, err
    from recpipe.config.retrain import StreamConfig

    with pytest.raises(ValueError, match="holds a password"):
        StreamConfig(redis_url=url)


@pytest.mark.parametrize(
    "uri", ["http://alice:s3cret@127.0.0.1:5000", "postgresql://mlflow:s3cret@127.0.0.1:5432/mlflow"]
)
def test_no_command_takes_a_tracking_password_or_a_spark_token_on_its_command_line(uri, capsys):
    """Every ``--tracking_uri`` (an MLflow server's or database's) and every ``--remote`` (a
    Spark Connect server's, ``;token=``) holding a secret is refused with one line that does
    not repeat it, naming where it goes instead."""
    for argv, flag in (
        (["runs", "compare", "--experiment", "e", "--tracking_uri", uri], "--tracking_uri"),
        (["champion", "show", "--model_name", "m", "--tracking_uri", uri], "--tracking_uri"),
        (["predict", "--input_path", "data/x", "--output_path", "data/y", "--model_name", "m",
          "--tracking_uri", uri], "--tracking_uri"),
    ):  # fmt: skip
        err = _one_line_exit_2(capsys, argv)
        assert f"{flag} holds a password" in err and "s3cret" not in err, err
    remote = "sc://127.0.0.1:15002/;token=s3cret"
    argv = [
        "features",
        "--pipeline_config_path",
        "conf/movielens_deepfm.yaml",
        "--ds",
        "2024-01-01",
        "--remote",
        remote,
    ]
    err = _one_line_exit_2(capsys, argv)
    assert "--remote holds a token" in err and "s3cret" not in err, err


def test_the_feature_jobs_environment_holds_no_secret_of_the_worker(monkeypatch, tmp_path):
    """On the Spark Connect path the feature job's environment is the allowlist's: none of the
    worker's connections, database URL or MLflow password; the Spark Connect URL reaches it in
    its own variable, never on its command line."""
    from features import REMOTE_ENV
    from operators.feature_job import feature_job_environment

    worker = (
        "AIRFLOW_CONN_MLFLOW_DEFAULT",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN",
        "MLFLOW_TRACKING_USERNAME",
        "MLFLOW_TRACKING_PASSWORD",
    )
    for name in (*worker, "RECPIPE_REDIS_URL", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(name, "s3cret")
    env = feature_job_environment(tmp_path, {REMOTE_ENV: "sc://h:1/;token=t"})
    assert "s3cret" not in env.values() and env[REMOTE_ENV] == "sc://h:1/;token=t"
    assert env["RECPIPE_HOME"] == str(tmp_path) and "PATH" in env


def test_spark_submit_gets_the_feature_jobs_environment_not_the_workers(monkeypatch, tmp_path):
    """On the spark-submit path (``operators.spark_submit``, Airflow's operator and hook) the
    ``spark-submit`` process gets the allowlist, Spark's own variables and the operator's
    ``env_vars``; none of the worker's secrets (the provider's hook alone passes them all). The
    application, run by pyspark's own ``spark-submit`` on ``local[1]``, writes the environment
    its driver process got (it starts no SparkContext: nothing binds ``SPARK_LOCAL_IP``)."""
    import json
    import sys

    from operators.spark_submit import FeatureSparkSubmitOperator

    app, dump = tmp_path / "dump_env.py", tmp_path / "env.json"
    app.write_text(f"import json, os\njson.dump(dict(os.environ), open({str(dump)!r}, 'w'))\n")
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:{os.environ['PATH']}")  # spark-submit
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_FEATURES", json.dumps({"conn_type": "spark", "host": "local[1]"}))
    for name in ("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "MLFLOW_TRACKING_PASSWORD", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(name, "s3cret")
    monkeypatch.setenv("SPARK_LOCAL_IP", "198.51.100.7")
    op = FeatureSparkSubmitOperator(
        task_id="prepare_features", conn_id="spark_features", application=str(app),
        env_vars={"RECPIPE_HOME": str(tmp_path), "PYSPARK_PYTHON": "python3"},
    )  # fmt: skip
    op._get_hook().submit(str(app))
    env = json.loads(dump.read_text())
    assert "s3cret" not in env.values() and not [k for k in env if k.startswith("AIRFLOW_CONN_")], sorted(env)
    assert env["SPARK_LOCAL_IP"] == "198.51.100.7" and env["RECPIPE_HOME"] == str(tmp_path)
    assert env["PYSPARK_PYTHON"] == "python3" and "PATH" in env


def test_a_password_with_any_character_comes_from_its_file(day, tmp_path, monkeypatch):
    """The password is read from ``--redis_password_file`` (or the environment's URL) and the
    connection is built from parts: a password holding '/', '@', ':', '#', '?' and '%' (what
    ``openssl rand -base64`` and password managers print) logs in to a Redis that requires it."""
    import subprocess

    import redis

    from recpipe import redis_conn
    from recpipe.exports.store import EmbeddingStore
    from tests.support import RECPIPE, ROOT, RedisServer

    password = "a/b@c:d#e?f%2Fg+h="
    server = RedisServer(password)
    try:
        secret = tmp_path / "redis-password"
        secret.write_text(password + "\n")
        url = f"redis://127.0.0.1:{server.port}/0"
        done = subprocess.run(
            [*RECPIPE, "serve", "push", str(day / "base"), "--model", "pw", "--redis_url", url,
             "--redis_password_file", str(secret)],
            capture_output=True, text=True, cwd=ROOT, timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
        client = redis.Redis(host="127.0.0.1", port=server.port, password=password)
        assert EmbeddingStore(client, "pw").applied()["name"] == "base"
        # the same from the environment's URL, the password percent-encoded there
        from urllib.parse import quote

        monkeypatch.setenv(
            redis_conn.STORE_ENV, f"redis://:{quote(password, safe='')}@127.0.0.1:{server.port}/0"
        )
        assert redis_conn.resolve(None).client().ping()
        # a deployment's: the URL without it, and $RECPIPE_REDIS_PASSWORD_FILE (compose's secret)
        monkeypatch.setenv(redis_conn.STORE_ENV, url)
        monkeypatch.setenv(redis_conn.password_file_env(redis_conn.STORE_ENV), str(secret))
        assert redis_conn.password_file_env(redis_conn.STORE_ENV) == "RECPIPE_REDIS_PASSWORD_FILE"
        assert redis_conn.resolve(None).client().ping()
        # a wrong one is refused by the server, not sent elsewhere
        secret.write_text("wrong")
        address = redis_conn.resolve(url, password_file=str(secret))
        assert (address.host, address.port, address.db) == ("127.0.0.1", server.port, 0)
        with pytest.raises(redis.AuthenticationError):
            address.client().ping()
    finally:
        server.stop()


def test_a_push_to_a_store_that_does_not_answer_is_one_line(day, tmp_path):
    import subprocess

    from tests.support import RECPIPE, ROOT, free_port

    url = f"redis://127.0.0.1:{free_port()}/0"
    done = subprocess.run(
        [*RECPIPE, "serve", "push", str(day / "base"), "--model", "m", "--redis_url", url],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )  # fmt: skip
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and len(lines) == 1 and "did not answer" in lines[0], done.stderr[-2000:]


def test_the_store_is_read_back_after_each_push_and_must_match_the_export(day, store, monkeypatch):
    """After every push a sample of the rows it wrote is read back as serving reads them and
    compared with the export, and its evicted ids must be gone (``recpipe.exports.parity``): a
    row changed behind the export, an evicted row served again, a row lost, each fails."""
    from recpipe.exports import parity
    from recpipe.exports.store import EmbeddingStore

    client, model = store
    online = EmbeddingStore(client, model)
    for name in ("base", "delta-01", "delta-02", "delta-03"):
        totals, _ = online.push_chain(day / name)
        assert totals["checked"] >= 1 and totals["absent"] == (1 if name == "delta-02" else 0), (name, totals)
    generation = online.applied()["generation"]
    row = online.row_key("t", 0, generation)
    client.hset(row, "t/embedding_weights", np.full(DIM, 9.0, "<f4").tobytes())
    with pytest.raises(parity.StoreMismatchError, match="table t id 0 view t/embedding_weights"):
        parity.check(online, [day / "delta-02"])
    client.hset(row, "t/embedding_weights", np.full(DIM, 2.0, "<f4").tobytes())  # as delta-02 wrote it
    assert parity.check(online, [day / "delta-02"]) == {"checked": 1, "absent": 1}
    client.hset(online.row_key("t", 5, generation), "t/embedding_weights", np.zeros(DIM, "<f4").tobytes())
    with pytest.raises(parity.StoreMismatchError, match="id 5: evicted, but the store serves it"):
        parity.check(online, [day / "delta-02", day / "delta-03"])
    client.delete(online.row_key("t", 12, generation))
    with pytest.raises(parity.StoreMismatchError, match="id 12: pushed, but the store lacks it"):
        parity.check(online, [day / "delta-03"])


def test_a_push_that_leaves_evicted_rows_behind_fails(day, store, monkeypatch):
    """A writer that cannot delete (tombstones skipped, as TorchEasyRec's) is caught by the
    push's own read-back, not by a reader days later."""
    from recpipe.exports import files
    from recpipe.exports.parity import StoreMismatchError
    from recpipe.exports.store import EmbeddingStore

    client, model = store
    online = EmbeddingStore(client, model)
    for name in ("base", "delta-01"):
        online.push_chain(day / name)
    real = files.read_params

    def without_tombstones(export, verify=True):
        params = real(export, verify)
        for rows in params.tables.values():
            rows.tombstones = np.zeros(0, np.int64)
        return params

    monkeypatch.setattr("recpipe.exports.store.read_params", without_tombstones)
    with pytest.raises(StoreMismatchError, match="id 5: evicted, but the store serves it"):
        online.push_chain(day / "delta-02")
