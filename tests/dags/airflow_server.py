"""Start a real Airflow deployment (api-server, scheduler, dag-processor, triggerer with the
LocalExecutor) on 127.0.0.1 for a test, and talk to it through the REST API v2."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path

from tests.support import free_port

COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer")


class Api:
    """A tiny REST API v2 client (token from the simple auth manager)."""

    def __init__(self, base: str, airflow_home: Path):
        self.base = base
        self.home = airflow_home
        self.token = None

    def login(self, timeout: float = 180) -> str:
        passwords = self.home / "simple_auth_manager_passwords.json.generated"
        deadline = time.monotonic() + timeout
        while True:
            try:
                password = json.loads(passwords.read_text())["admin"]
                self.token = self._call(
                    "POST", "/auth/token", {"username": "admin", "password": password}, auth=False
                )["access_token"]
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

    def _call(self, method: str, path: str, body=None, auth: bool = True):
        req = urllib.request.Request(self.base + path, method=method)
        req.add_header("Content-Type", "application/json")
        if auth:
            req.add_header("Authorization", f"Bearer {self.token}")
        data = json.dumps(body).encode() if body is not None else None
        with urllib.request.urlopen(req, data=data, timeout=30) as resp:
            text = resp.read().decode()
            return json.loads(text) if text else None

    def get(self, path):
        return self._call("GET", path)

    def post(self, path, body):
        return self._call("POST", path, body)

    def patch(self, path, body):
        return self._call("PATCH", path, body)

    def wait_for_dag(self, dag_id: str, timeout: float = 240) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            try:
                return self.get(f"/api/v2/dags/{dag_id}")
            except urllib.error.HTTPError as err:
                if err.code != 404 or time.monotonic() > deadline:
                    raise
                time.sleep(3)

    def wait_for_run(self, dag_id: str, run_id: str, timeout: float = 900) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            run = self.get(f"/api/v2/dags/{dag_id}/dagRuns/{urllib.request.quote(run_id, safe='')}")
            if run["state"] in ("success", "failed") or time.monotonic() > deadline:
                return run
            time.sleep(5)


@contextmanager
def deployment(
    env: dict,
    airflow_home: Path,
    database_url: str | None = None,
    extra_env: dict | None = None,
    workers: tuple[tuple[str, ...], ...] = (),
):
    """Migrate the metadata DB and run the four components (and ``workers``: further
    ``airflow`` commands, e.g. a Celery worker, with ``extra_env`` on top); yield an ``Api``;
    stop them all."""
    port = free_port()
    env = {
        **env,
        "AIRFLOW_HOME": str(airflow_home),
        "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(airflow_home / "logs"),
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
        "AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK": "False",
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
        "AIRFLOW__API_AUTH__JWT_SECRET": "recpipe-test-secret",
        "AIRFLOW__CORE__FERNET_KEY": "",
    }
    env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] = database_url or f"sqlite:///{airflow_home / 'airflow.db'}"
    env.update(extra_env or {})
    airflow_home.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [sys.executable, "-m", "airflow", "db", "migrate"], env=env, check=True, capture_output=True
    )
    procs = []
    try:
        commands = [(name, *(["--port", str(port)] if name == "api-server" else [])) for name in COMPONENTS]
        for command in [*commands, *workers]:
            log = (airflow_home / f"{'-'.join(c for c in command[:2] if not c.startswith('-'))}.log").open(
                "wb"
            )
            args = [sys.executable, "-m", "airflow", *command]
            procs.append(
                subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            )
        api = Api(f"http://127.0.0.1:{port}", airflow_home)
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


def _killpg(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass


def screenshot(url: str, token: str | None, path: Path) -> str:
    """Open ``url`` in headless Chromium (Debian's, via Playwright), logged in to Airflow with
    ``token`` if given, wait for the page to settle, save a PNG and return the page's visible
    text."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path="/usr/bin/chromium",
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
            ],
        )
        try:
            context = browser.new_context(viewport={"width": 1600, "height": 1000})
            if token:
                context.add_cookies([{"name": "_token", "value": token, "url": url.split("/dags")[0]}])
            page = context.new_page()
            page.goto(url, wait_until="networkidle", timeout=60_000)
            page.wait_for_timeout(3000)
            page.screenshot(path=str(path), full_page=True)
            return page.inner_text("body")
        finally:
            browser.close()
