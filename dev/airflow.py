"""A real Airflow deployment on 127.0.0.1 and its REST API v2.

``deployment()`` migrates the metadata database and starts the api-server, scheduler,
dag-processor and triggerer (and any further ``airflow`` commands, e.g. a Celery worker) as
process groups; ``Api`` logs in through the simple auth manager and calls ``/api/v2`` through
``apache-airflow-client``. Used by
``make demo`` (a backfill under the scheduler) and by the tests that run the scheduler.
"""

from __future__ import annotations

import atexit
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import urllib3
from airflow_client.client import ApiClient, Configuration
from airflow_client.client.api.backfill_api import BackfillApi
from airflow_client.client.api.dag_api import DAGApi
from airflow_client.client.api.dag_run_api import DagRunApi
from airflow_client.client.api.import_error_api import ImportErrorApi
from airflow_client.client.api.task_api import TaskApi
from airflow_client.client.api.task_instance_api import TaskInstanceApi
from airflow_client.client.api.x_com_api import XComApi
from airflow_client.client.exceptions import ApiException, NotFoundException
from airflow_client.client.models import (
    BackfillPostBody,
    ClearTaskInstancesBody,
    ClearTaskInstancesBodyTaskIdsInner,
    DAGPatchBody,
    DagRunMutableStates,
    DAGRunPatchBody,
    ReprocessBehavior,
    TriggerDAGRunPostBody,
    UpdateHITLDetailPayload,
)

from dev.env import database_env
from recpipe import forkserver
from recpipe.launch.topology import free_ports
from recpipe.layout import SUCCESS

COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer")
TERMINAL = ("success", "failed", "skipped", "upstream_failed", "removed")


class Api:
    """Airflow's REST API v2 through its well-kept client (``apache-airflow-client``), logged in
    as the simple auth manager's user ``admin``; results as JSON-like dicts (times as ISO text).

    Args:
        base: the api-server's URL, e.g. ``http://127.0.0.1:8080``.
        airflow_home: where the simple auth manager writes its generated passwords.
        password: the admin's password, where it is set rather than generated (a
            deployment's ``AIRFLOW_ADMIN_PASSWORD``).

    Attributes:
        dags, dag_runs, task_instances_api, backfills, xcoms, pools, import_errors_api: the
            client's API objects, for what
            the methods below do not cover.
    """

    def __init__(self, base: str, airflow_home: Path | None = None, password: str | None = None):
        self.base = base
        self.home = Path(airflow_home) if airflow_home is not None else None
        self.password = password
        self.token: str | None = None
        self.config = Configuration(host=base)
        client = ApiClient(self.config)
        self.dags, self.dag_runs = DAGApi(client), DagRunApi(client)
        self.task_instances_api, self.backfills, self.xcoms = (
            TaskInstanceApi(client),
            BackfillApi(client),
            XComApi(client),
        )
        self.import_errors_api = ImportErrorApi(client)
        self.tasks_api = TaskApi(client)

    def login(self, timeout: float = 180) -> str:
        """Wait up to ``timeout`` seconds for the api-server and get a token (the simple auth
        manager's ``/auth/token``, which the client does not cover).

        Raises:
            urllib.error.URLError, KeyError, FileNotFoundError: still failing at the deadline.
        """
        deadline = time.monotonic() + timeout
        while True:
            try:
                body = {"username": "admin", "password": self.password or self._generated_password()}
                req = urllib.request.Request(
                    self.base + "/auth/token", data=json.dumps(body).encode(), method="POST"
                )
                req.add_header("Content-Type", "application/json")
                with urllib.request.urlopen(req, timeout=30) as resp:
                    self.token = json.loads(resp.read())["access_token"]
                self.config.access_token = self.token
                return self.token
            except (
                FileNotFoundError,
                urllib.error.URLError,
                ConnectionError,
                KeyError,
                json.JSONDecodeError,
            ):
                if time.monotonic() > deadline:
                    raise
                time.sleep(2)

    def _generated_password(self) -> str:
        if self.home is None:
            raise ValueError("Api needs airflow_home or password")
        passwords = self.home / "simple_auth_manager_passwords.json.generated"
        return json.loads(passwords.read_text())["admin"]

    def import_errors(self) -> dict[str, str]:
        """The DAG files that failed to import: ``{file name: its error}`` (the UI's Import
        Errors)."""
        found = self.import_errors_api.get_import_errors(limit=100).import_errors
        return {e.filename: e.stack_trace for e in found}

    def wait_for_import_error(self, file_name: str, timeout: float = 240) -> str:
        """The import error of the DAG file ``file_name`` once the dag-processor has recorded it.

        Raises:
            TimeoutError: none after ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        while True:
            found = {k: v for k, v in self.import_errors().items() if k.endswith(file_name)}
            if found:
                return next(iter(found.values()))
            if time.monotonic() > deadline:
                raise TimeoutError(f"no import error of {file_name} after {timeout:.0f} s")
            time.sleep(3)

    def dag(self, dag_id: str) -> dict:
        """The DAG (``is_paused``, ...)."""
        return _plain(self.dags.get_dag(dag_id))

    def task_ids(self, dag_id: str) -> set[str]:
        """The ids of the DAG's tasks as the API server has it parsed now."""
        return {t.task_id for t in self.tasks_api.get_tasks(dag_id).tasks}

    def set_paused(self, dag_id: str, paused: bool) -> None:
        self.dags.patch_dag(dag_id, DAGPatchBody(is_paused=paused))

    def wait_for_dag(self, dag_id: str, timeout: float = 240) -> dict:
        """The DAG once the dag-processor has serialised it (HTTP 404 until then)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                return self.dag(dag_id)
            except NotFoundException:
                if time.monotonic() > deadline:
                    raise
                time.sleep(3)

    def trigger(self, dag_id: str, conf: dict, logical_date: str | None = None) -> dict:
        """A new run of ``dag_id`` with ``conf`` (``logical_date``: ISO text, or None)."""
        body = TriggerDAGRunPostBody(logical_date=logical_date, conf=conf)
        return _plain(self.dag_runs.trigger_dag_run(dag_id, body))

    def run(self, dag_id: str, run_id: str) -> dict:
        return _plain(self.dag_runs.get_dag_run(dag_id, run_id))

    def runs(self, dag_id: str, **filters) -> list[dict]:
        """Runs of ``dag_id`` (``state=[...]``, ``logical_date_gte=``, ... as the client's
        ``get_dag_runs`` takes them; at most 1,000)."""
        return [_plain(r) for r in self.dag_runs.get_dag_runs(dag_id, limit=1000, **filters).dag_runs]

    def set_run_state(self, dag_id: str, run_id: str, state: str) -> None:
        self.dag_runs.patch_dag_run(dag_id, run_id, DAGRunPatchBody(state=DagRunMutableStates(state)))

    def wait_for_run(self, dag_id: str, run_id: str, timeout: float = 900) -> dict:
        """The DAG run once it succeeded or failed, or as it is at the deadline."""
        deadline = time.monotonic() + timeout
        while True:
            run = self.run(dag_id, run_id)
            if run["state"] in ("success", "failed") or time.monotonic() > deadline:
                return run
            time.sleep(5)

    def task_instances(self, dag_id: str, run_id: str) -> list[dict]:
        """The run's task instances (``task_id``, ``state``, ``start_date``, ``duration`` in s, ...)."""
        got = self.task_instances_api.get_task_instances(dag_id, run_id, limit=1000)
        return [_plain(t) for t in got.task_instances]

    def task_instance(self, dag_id: str, run_id: str, task_id: str) -> dict:
        return _plain(self.task_instances_api.get_task_instance(dag_id, run_id, task_id))

    def clear(self, dag_id: str, run_id: str, task_ids: list[str] | None = None) -> None:
        """Clear the run's task instances (``task_ids``, or all), so that they run again."""
        body = ClearTaskInstancesBody(dry_run=False, dag_run_id=run_id, only_failed=False)
        if task_ids:  # an anyOf (a task id, or a mapped one's [id, index]) in the client
            body.task_ids = [ClearTaskInstancesBodyTaskIdsInner(t) for t in task_ids]
        self.task_instances_api.post_clear_task_instances(dag_id, body)

    def log(self, dag_id: str, run_id: str, task_id: str, try_number: int = 1) -> str:
        """A task instance's log, whole, as text."""
        got = self.task_instances_api.get_log(dag_id, run_id, task_id, try_number, full_content=True)
        return json.dumps(_plain(got))

    def hitl_detail(self, dag_id: str, run_id: str, task_id: str) -> dict | None:
        """The Human-in-the-loop request of a task (``subject``, ``body``, ``options``, ...),
        or None before the task made it."""
        try:
            return _plain(self.task_instances_api.get_hitl_detail(dag_id, run_id, task_id, -1))
        except NotFoundException:
            return None

    def wait_for_hitl(self, dag_id: str, run_id: str, task_id: str, timeout: float = 900) -> dict:
        """The task's Human-in-the-loop request once it waits for an answer.

        Raises:
            TimeoutError: none within ``timeout`` seconds (the run's state in the message).
        """
        deadline = time.monotonic() + timeout
        while (detail := self.hitl_detail(dag_id, run_id, task_id)) is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{dag_id}/{task_id}: no request; run {self.run(dag_id, run_id)['state']}")
            time.sleep(3)
        return detail

    def answer_hitl(self, dag_id: str, run_id: str, task_id: str, options: list[str]) -> dict:
        """Answer a Human-in-the-loop request as the logged-in user (``admin``)."""
        body = UpdateHITLDetailPayload(chosen_options=options, params_input={})
        return _plain(self.task_instances_api.update_hitl_detail(dag_id, run_id, task_id, -1, body))

    def xcom(self, dag_id: str, run_id: str, task_id: str, key: str = "return_value"):
        """A task instance's XCom value (deserialised)."""
        got = self.xcoms.get_xcom_entry(dag_id, task_id, run_id, key, deserialize=True)
        value = got.actual_instance.value  # native or string: an anyOf of the two
        return json.loads(value) if isinstance(value, str) else value

    def unfinished_backfills(self, dag_id: str) -> list[dict]:
        got = self.backfills.list_backfills(dag_id, limit=100).backfills
        return [b for b in map(_plain, got) if b["completed_at"] is None]

    def cancel_backfill(self, backfill_id: int) -> None:
        self.backfills.cancel_backfill(backfill_id)


def _plain(model) -> dict:
    """A client model as JSON-like data: times as ISO text, states as their values."""
    return model.model_dump(mode="json", by_alias=True)


_template_db: Path | None = None  # a SQLite metadata DB this process migrated


def migrate_db(env: dict) -> None:
    """``airflow db migrate`` for the metadata DB of ``env``. A new SQLite file is a copy of
    one migrated once by this process (the same schema: a migration costs 6-13 s, a copy
    milliseconds); an existing file or another database is migrated in place.

    Raises:
        subprocess.CalledProcessError: the migration failed.
    """
    global _template_db

    def migrate(environ: dict) -> None:
        argv = [sys.executable, "-m", "airflow", "db", "migrate"]
        subprocess.run(argv, env=environ, check=True, capture_output=True)

    url = env.get("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "")
    target = Path(url.removeprefix("sqlite:///")) if url.startswith("sqlite:////") else None
    if target is None or target.exists():
        migrate(env)
        return
    if _template_db is None:
        home = Path(tempfile.mkdtemp(prefix="recpipe-airflow-db-"))
        atexit.register(shutil.rmtree, home, True)
        migrate({**env, "AIRFLOW_HOME": str(home), **database_env(f"sqlite:///{home / 'airflow.db'}")})
        _template_db = home / "airflow.db"
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".partial")
    shutil.copyfile(_template_db, partial)
    partial.rename(target)  # a reader never finds half a database


@contextmanager
def deployment(
    env: dict,
    airflow_home: Path,
    database_url: str | None = None,
    extra_env: dict | None = None,
    workers: tuple[tuple[str, ...], ...] = (),
    port: int | None = None,
    host: str = "127.0.0.1",
    start_worker=None,
) -> Iterator[Api]:
    """Migrate the metadata DB and run the four components (and ``workers``: further
    ``airflow`` commands with their arguments), logged to ``<airflow_home>/<command>.log``;
    yield a logged-in ``Api``; stop them all (SIGTERM, then SIGKILL after 30 s).

    Args:
        env: the environment (``dev.env.airflow_env``); ``extra_env`` goes on top.
        database_url: metadata DB (default SQLite in ``airflow_home``).
        port: the api-server's port (default: a free one).
        host: the address the api-server listens on, and the URL tasks reach it at.
        start_worker: ``(argv, env, log_path) -> Popen`` starts each of ``workers``
            elsewhere (another host: ``dev.hosts.Hosts.popen``); default here.
    """
    port = port or free_ports(1)[0]
    airflow_home = Path(airflow_home)
    env = {
        **env,
        "AIRFLOW_HOME": str(airflow_home),
        "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(airflow_home / "logs"),
        "AIRFLOW__API__HOST": host,
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API__BASE_URL": f"http://{host}:{port}",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://{host}:{port}/execution/",
        "AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK": "False",
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
        # one secret for every component: the api-server checks the tokens tasks get
        "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(16),
        "AIRFLOW__CORE__FERNET_KEY": "",
    }
    env.pop("AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS", None)  # the URL's own, below
    env.update(database_env(database_url or f"sqlite:///{airflow_home / 'airflow.db'}"))
    env.update(extra_env or {})
    airflow_home.mkdir(parents=True, exist_ok=True)
    migrate_db(env)
    procs = []
    server = None
    if not env.get(forkserver.ENV):
        # the deployment's job processes fork from one warm process (recpipe.forkserver)
        server = forkserver.start(env, wait=False, preload=("trainer.preload",))
        env[forkserver.ENV] = server.path
    try:
        # the triggerer's log server would listen on every interface (Airflow binds it to ""): the
        # api-server reads the trigger logs from the shared log folder on this machine instead
        flags = {"api-server": ["--port", str(port)], "triggerer": ["--skip-serve-logs"]}
        commands = [(name, *flags.get(name, [])) for name in COMPONENTS]
        for command in [*commands, *workers]:
            name = "-".join(c for c in command[:2] if not c.startswith("-"))
            if start_worker is not None and command in workers:
                argv = [sys.executable, "-m", "airflow", *command]
                procs.append(start_worker(argv, env, airflow_home / f"{name}.log"))
                continue
            with (airflow_home / f"{name}.log").open("wb") as log:
                procs.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "airflow", *command],
                        env=env,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
        api = Api(f"http://{host}:{port}", airflow_home)
        api.login()
        yield api
    finally:
        for p in procs:
            _killpg(p.pid, signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                _killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=10)
        if server is not None:
            server.stop()


def _killpg(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass


def run_backfill(
    env: dict,
    airflow_home: Path,
    dag_id: str,
    days: list[str],
    timeout: float = 7200,
    echo=print,
    durations: dict | None = None,
    chunk: int | None = None,
    confs: dict[str, dict] | None = None,
    after_chunk=None,
    port: int | None = None,
    database_url: str | None = None,
) -> dict[str, str]:
    """Run ``days`` of ``dag_id`` as an Airflow backfill under a real scheduler.

    Starts a ``deployment`` (the scheduler creating no scheduled runs of its own:
    ``[scheduler] use_job_schedule = False``; the DAG file parsed once), creates the backfill
    through the REST API (one active run at a time, every day re-run;
    ``_create_backfill``), unpauses the DAG, calls ``echo`` with a line per task instance and
    per run as each ends, and pauses the DAG again if it was paused.

    Args:
        env: the Airflow environment (``dev.env.airflow_env``).
        days: logical dates, consecutive, oldest first: ``YYYY-MM-DD`` for a daily DAG,
            ``YYYY-MM-DDTHH:MM`` (UTC) for an hourly one.
        timeout: seconds for each backfill.
        durations: gets ``{(ds, task_id): seconds}`` (``follow_runs``).
        chunk: days per backfill (one after the other; default: all in one). SQLite refused
            the insert of 24 hourly runs at once while the scheduler was writing.
        confs: a DAG run conf by logical date: a chunk's runs take the conf of its first
            day (``--dag-run-conf``).
        after_chunk: called with the deployment's API client and the chunk's days after
            each chunk that succeeded, before the next one starts (a test's checks).
        port: the api-server's port (default: a free one), for a client of one's own.
        database_url: the metadata DB (``deployment``'s; default SQLite in ``airflow_home``).

    Returns:
        ``{ds: run state}``; stops following at the first failed run ("failed") or at the
        deadline (the unfinished days' states as they were), and then cancels the backfill,
        so that the next scheduler to start does not carry on with it.
    """
    airflow_home = Path(airflow_home)
    db = database_url or env.get("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN")
    extra = {
        "AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE": "False",
        # the DAG file does not change during a backfill: parse it once, not every 30 s (each
        # parse is a few CPU-seconds that the tasks on a small machine would wait for)
        "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "3600",
    }
    echo(f"starting Airflow (logs: {airflow_home}/<component>.log)")
    with deployment(env, airflow_home, database_url, extra_env=extra, port=port) as api:
        was_paused = api.wait_for_dag(dag_id)["is_paused"]
        states: dict[str, str] = {}
        try:
            # left by a demo whose deployment was stopped: they would hold the one active run
            cancel_backfills(api, dag_id, echo)
            fail_stale_runs(api, dag_id, days, echo)
            size = chunk or len(days)
            for part in [days[i : i + size] for i in range(0, len(days), size)]:
                since = datetime.now(UTC).isoformat()  # runs queued earlier are not this backfill's
                conf = (confs or {}).get(part[0])
                if db:
                    complete_finished_backfills(db, dag_id)
                _create_backfill(api, dag_id, part, echo, conf)
                states.update(follow_runs(api, dag_id, part, timeout, echo, durations, since))
                if any(states.get(ds) != "success" for ds in part):
                    break
                if after_chunk is not None:
                    after_chunk(api, part)
            return states
        finally:
            if any(states.get(ds) != "success" for ds in days):
                # else the next scheduler to start (make airflow) would carry on with it
                cancel_backfills(api, dag_id, echo)
            api.set_paused(dag_id, was_paused)


def land_when_waited_for(
    port: int,
    airflow_home: Path,
    dag_id: str,
    passes: list[tuple[str, Path]],
    landed: dict,
    stop: threading.Event | None = None,
    extra=None,
    timeout: float = 900,
) -> None:
    """A log exporter's part in a test or bench of partitions that land while a pass waits:
    for each ``(logical date, partition)`` in order, once the run of that logical date has
    deferred ``wait_for_pass`` and the triggerer has subscribed to the arrivals channel,
    write the partition's ``_SUCCESS`` and announce it (``recpipe.arrivals``). Records
    ``landed[logical] = {"at": epoch s, "heard": subscribers, **extra()}``. Run it in a thread
    beside ``run_backfill(..., port=port)``; ``stop`` ends it early."""
    import redis

    from recpipe.arrivals import CHANNEL, announce

    api, deadline = Api(f"http://127.0.0.1:{port}", airflow_home), time.time() + timeout
    client = redis.Redis(host="127.0.0.1", port=6379)

    def waiting(logical: str) -> bool:
        try:
            api.login(timeout=30)
            runs = [r for r in api.runs(dag_id) if r["logical_date"].startswith(logical)]
            state = runs and api.task_instance(dag_id, runs[0]["dag_run_id"], "wait_for_pass")["state"]
        except Exception:  # the deployment is starting
            return False
        # deferred is set before the triggerer runs the wait: its subscription tells that it does
        return state == "deferred" and dict(client.pubsub_numsub(CHANNEL)).get(CHANNEL.encode(), 0) > 0

    for logical, partition in passes:
        while not waiting(logical):
            if (stop is not None and stop.is_set()) or time.time() > deadline:
                return
            time.sleep(0.2)
        time.sleep(0.5)  # past the trigger's first look, just after its subscription
        (Path(partition) / SUCCESS).touch()
        landed[logical] = {"at": time.time(), **(extra() if extra else {})}
        landed[logical]["heard"] = announce(client, partition)


def _utc(d: str) -> datetime:
    """A logical date, ``YYYY-MM-DD`` or ``YYYY-MM-DDTHH:MM``, as a UTC datetime."""
    return datetime.fromisoformat(f"{d}:00+00:00" if "T" in d else f"{d}T00:00:00+00:00")


def complete_finished_backfills(database_url: str, dag_id: str) -> int:
    """Mark ``dag_id``'s backfills whose runs have all ended as completed, by the scheduler's
    own rule (``SchedulerJobRunner._mark_backfills_complete``), which the scheduler applies
    only every 30 s: the next chunk of a backfill can then start at once. Returns how many.
    """
    from airflow.models.backfill import Backfill, BackfillDagRun
    from airflow.models.dagrun import DagRun
    from sqlalchemy import and_, create_engine, exists, select
    from sqlalchemy.orm import Session

    args = {"timeout": 30} if database_url.startswith("sqlite") else {}
    engine = create_engine(database_url, connect_args=args)
    try:
        with Session(engine) as session, session.begin():
            finished = session.scalars(
                select(Backfill).where(
                    Backfill.dag_id == dag_id,
                    Backfill.completed_at.is_(None),
                    exists(select(BackfillDagRun.id).where(BackfillDagRun.backfill_id == Backfill.id)),
                    ~exists(
                        select(DagRun.id).where(
                            and_(DagRun.backfill_id == Backfill.id, DagRun.state.in_(("running", "queued")))
                        )
                    ),
                )
            ).all()
            for backfill in finished:
                backfill.completed_at = datetime.now(UTC)
            return len(finished)
    finally:
        engine.dispose()


def _create_backfill(api: Api, dag_id: str, days: list[str], echo, conf: dict | None = None) -> None:
    """Create the backfill of ``days`` through the REST API (``POST /backfills``, what
    ``airflow backfill create`` does, without a CLI process to start each chunk) while the DAG
    is paused (the scheduler leaves its runs alone while they are inserted), then unpause it.
    SQLite may still refuse the write ("database is locked"): what was committed is cancelled
    and the create tried again.

    Raises:
        RuntimeError: the API refused it otherwise, or four times.
    """

    body = BackfillPostBody(
        dag_id=dag_id, from_date=_utc(days[0]), to_date=_utc(days[-1]), max_active_runs=1,
        reprocess_behavior=ReprocessBehavior.COMPLETED, dag_run_conf=conf or {},
    )  # fmt: skip
    echo(f"backfill {dag_id} {days[0]} .. {days[-1]}" + (f" conf {json.dumps(conf)}" if conf else ""))
    # the scheduler marks the previous chunk's backfill completed up to 30 s after its last
    # run, unless run_backfill did it first (not cancelled here: a cancelled backfill is
    # paused, and a run of it cleared later would stay queued)
    deadline = time.monotonic() + 120
    while api.unfinished_backfills(dag_id) and time.monotonic() < deadline:
        time.sleep(1)
    api.set_paused(dag_id, True)
    error = None
    for attempt in range(4):
        try:
            api.backfills.create_backfill(body)
            error = None
            break
        except ApiException as err:
            error = err
            # SQLite's "database is locked" reaches the client as a server error
            locked = (err.status or 0) >= 500 or "database is locked" in str(err.body)
            if not locked or attempt == 3:
                break
        cancel_backfills(api, dag_id, echo)
        fail_stale_runs(api, dag_id, days, echo)
        echo(f"creating the backfill failed ({error.status}: the metadata database locked?); again in 5 s")
        time.sleep(5)
    api.set_paused(dag_id, False)
    if error is not None:
        raise RuntimeError(f"creating the backfill of {dag_id} {days[0]} .. {days[-1]} failed: {error}")


def fail_stale_runs(api: Api, dag_id: str, days: list[str], echo=print) -> list[str]:
    """Mark the queued or running runs of ``days`` failed: with a deployment just started, they
    are a stopped one's, and no task of theirs runs any more. Returns their run ids."""
    failed = []
    for state in ("running", "queued"):
        for run in api.runs(dag_id, state=[state]):
            if run["logical_date"][: len(days[0])] in days:
                api.set_run_state(dag_id, run["dag_run_id"], "failed")
                failed.append(run["dag_run_id"])
                echo(f"marked the stale run {run['dag_run_id']} failed")
    return failed


def cancel_backfills(api: Api, dag_id: str, echo=print) -> list[int]:
    """Cancel every unfinished backfill of ``dag_id`` (its queued runs are not started; a
    running one finishes). Returns their ids; an API error is reported, not raised."""
    cancelled = []
    try:
        for backfill in api.unfinished_backfills(dag_id):
            api.cancel_backfill(backfill["id"])
            cancelled.append(backfill["id"])
            echo(f"cancelled backfill {backfill['id']} of {dag_id}")
    except (ApiException, urllib3.exceptions.HTTPError, ConnectionError, KeyError) as err:
        echo(f"could not cancel the backfills of {dag_id}: {err}")
    return cancelled


def follow_runs(
    api: Api,
    dag_id: str,
    days: list[str],
    timeout: float,
    echo=print,
    durations: dict | None = None,
    since: str = "",
) -> dict[str, str]:
    """Poll the runs of ``days`` (``YYYY-MM-DD``, or ``YYYY-MM-DDTHH:MM`` for hourly runs)
    every 2 s and ``echo`` each task instance once it ends, then each run; ``durations`` gets
    ``{(ds, task_id): seconds}``. A run last queued before ``since`` (ISO time) is an earlier
    run of that date that the backfill has not re-run yet: it counts as pending. Returns
    ``{ds: state}`` once every run ended, at the first failed run, or at the deadline."""

    window = {"logical_date_gte": _utc(days[0]), "logical_date_lte": _utc(days[-1])}
    durations = {} if durations is None else durations
    printed: set[tuple[str, str]] = set()
    states: dict[str, str] = {}
    deadline = time.monotonic() + timeout
    while True:
        done = 0
        for run in api.runs(dag_id, **window):
            ds = run["logical_date"][: len(days[0])]
            if (run.get("queued_at") or "") < since:
                continue
            states[ds] = run["state"]
            if (ds, "") in printed or run["state"] not in ("running", "success", "failed"):
                done += (ds, "") in printed
                continue
            tis = api.task_instances(dag_id, run["dag_run_id"])
            for ti in sorted(tis, key=lambda t: t["end_date"] or "~"):
                if ti["state"] in TERMINAL and (ds, ti["task_id"]) not in printed:
                    printed.add((ds, ti["task_id"]))
                    durations[(ds, ti["task_id"])] = ti["duration"] or 0.0
                    echo(f"  ds={ds}  {ti['task_id']:<20} {ti['state']:<8} {ti['duration'] or 0:6.1f} s")
            if run["state"] in ("success", "failed"):
                printed.add((ds, ""))
                done += 1
                echo(f"ds={ds}: {run['state']} in {run['duration'] or 0:.0f} s")
                if run["state"] == "failed":
                    echo(f"task logs: {api.home}/logs/dag_id={dag_id}/run_id={run['dag_run_id']}/")
                    return states
        if done == len(days):
            return states
        if time.monotonic() > deadline:
            echo(f"not finished after {timeout:.0f} s; task logs under {api.home}/logs")
            return states
        time.sleep(2)
