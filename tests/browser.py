"""Airflow's and MLflow's UIs as an operator clicks them, in headless Chromium (Debian's,
driven by Playwright through its ``executable_path``; Playwright's own browser download does
not reach this machine)."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import unquote

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
]


class Browser:
    """One headless Chromium for a test: ``airflow(...)`` and ``page(...)`` open pages in it.

    Use as a context manager; ``shots`` is where ``screenshot`` writes PNGs."""

    def __init__(self, shots: Path):
        self.shots = shots

    def __enter__(self) -> Browser:
        from playwright.sync_api import sync_playwright

        self._pw = sync_playwright().start()
        self._browser = self._pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        return self

    def __exit__(self, *exc) -> None:
        self._browser.close()
        self._pw.stop()

    def page(self, http_credentials: dict | None = None):
        """A new page of a new context (``http_credentials``: basic auth, as MLflow's)."""
        context = self._browser.new_context(
            viewport={"width": 1400, "height": 1000}, http_credentials=http_credentials
        )
        context.set_default_timeout(120_000)
        return context.new_page()

    def airflow(self, base: str, user: str, password: str) -> AirflowUI:
        """Airflow's UI at ``base``, logged in on its login form."""
        return AirflowUI(self, self.page(), base, user, password)

    def screenshot(self, page, name: str) -> Path:
        self.shots.mkdir(parents=True, exist_ok=True)
        path = self.shots / f"{name}.png"
        page.screenshot(path=str(path), full_page=True)
        return path


class AirflowUI:
    """The pages of Airflow 3's UI a team uses: the trigger form (a logical date and Params),
    the Human-in-the-loop answer of a task; each step waits for what it needs (up to 120 s)."""

    def __init__(self, browser: Browser, page, base: str, user: str, password: str):
        self.browser, self.page, self.base = browser, page, base.rstrip("/")
        page.goto(self.base + "/", wait_until="load")
        page.locator("input[name=username]").fill(user)
        page.locator("input[name=password]").fill(password)
        page.get_by_role("button", name="Sign in").click()
        page.wait_for_url(lambda url: "/auth/login" not in url)

    def trigger(self, dag_id: str, params: dict, logical_date: str | None = None) -> str:
        """Fill ``dag_id``'s trigger form (a single run) and press Trigger, leaving "Unpause on
        trigger" ticked; the new run's id.

        Args:
            params: Param name -> value: an object Param's JSON goes into its editor, an
                enum's value is chosen in its list, others are typed.
            logical_date: ``YYYY-MM-DD HH:MM`` (UTC) in the date picker; None keeps now.
        """
        form = self._form(dag_id)
        if logical_date is not None:
            self._pick_date(form.get_by_test_id("datetime-input"), logical_date)
        for name, value in params.items():
            self._fill(form, name, value)
        form.get_by_test_id("trigger-dag-submit").click()
        self.page.wait_for_url(lambda url: "/runs/" in url)
        run_id = unquote(self.page.url.split("/runs/", 1)[1].split("/")[0].split("?")[0])
        self._leave()
        return run_id

    def backfill(self, dag_id: str, first: str, last: str, params: dict) -> None:
        """The same form's *Backfill*: runs from ``first`` to ``last`` (``YYYY-MM-DD HH:MM``),
        one at a time, with ``params`` (as ``trigger``'s), the DAG unpaused."""
        form = self._form(dag_id)
        form.get_by_text("Backfill", exact=True).click()
        dates = form.get_by_test_id("datetime-input")
        dates.first.wait_for()
        self._pick_date(dates.nth(0), first)
        self._pick_date(dates.nth(1), last)
        form.locator("input[name=max_active_runs]").fill("1")
        if params:  # (Airflow 3.3's form sends the Run Parameters only with this ticked)
            form.get_by_text("Override parameters on existing runs").click()
        for name, value in params.items():
            self._fill(form, name, value)
        form.get_by_role("button", name="Run Backfill").click()
        form.wait_for(state="hidden")
        self._leave()

    def _form(self, dag_id: str):
        self.page.goto(f"{self.base}/dags/{dag_id}", wait_until="load")
        self.page.get_by_role("button", name="Trigger").first.click()
        form = self.page.get_by_role("dialog")
        form.get_by_text("Run Parameters").wait_for()
        return form

    def _pick_date(self, opener, when: str) -> None:
        day, time = when.split()
        opener.click()
        picker = self.page.locator("[data-scope=popover][data-part=content][data-state=open]")
        picker.get_by_placeholder("YYYY/MM/DD").fill(day.replace("-", "/"))
        picker.get_by_placeholder("HH:mm").fill(time)
        picker.get_by_placeholder("HH:mm").press("Enter")
        if picker.count():
            self.page.keyboard.press("Escape")

    def _fill(self, form, name: str, value) -> None:
        if isinstance(value, dict):  # the JSON editor (Monaco): replace its text
            editor = form.locator(f"#element_{name} .monaco-editor")
            editor.wait_for()
            editor.click()
            self.page.keyboard.press("Control+A")
            self.page.keyboard.press("Backspace")
            self.page.keyboard.insert_text(json.dumps(value))
            # the form takes a field's value when it loses focus
            self.page.evaluate("document.activeElement && document.activeElement.blur()")
        elif form.locator(f"#element_{name} [role=combobox]").count():
            form.locator(f"#element_{name}").click()  # an enum: its list, filtered by the value typed
            self.page.keyboard.type(str(value))
            self.page.keyboard.press("Enter")
        else:
            form.locator(f"[name=element_{name}]").fill(str(value))

    def choice_shown(self, dag_id: str, name: str) -> str:
        """What ``dag_id``'s trigger form shows chosen for the enum Param ``name`` before anyone
        touches it ("" when nothing is); the form is closed again."""
        form = self._form(dag_id)
        field = form.locator(f"#element_{name}")
        field.wait_for()
        shown = field.locator("input").first.input_value() if field.locator("input").count() else ""
        chosen = field.locator("[data-part=value-text], [data-part=item-text][data-state=checked]")
        shown = shown or (chosen.first.inner_text() if chosen.count() else "")
        self.page.keyboard.press("Escape")
        self._leave()
        return shown.strip()

    def required_action(self, dag_id: str, run_id: str, task_id: str) -> str:
        """The text of the task's Required Actions tab once its options show."""
        self.page.goto(
            f"{self.base}/dags/{dag_id}/runs/{run_id}/tasks/{task_id}/required_actions", wait_until="load"
        )
        self.page.locator("[data-testid^=hitl-option-]").first.wait_for()
        return self.page.locator("body").inner_text()

    def answer(self, dag_id: str, run_id: str, task_id: str, option: str) -> None:
        """Choose ``option`` on the task's Required Actions tab (Human-in-the-loop)."""
        self.page.goto(
            f"{self.base}/dags/{dag_id}/runs/{run_id}/tasks/{task_id}/required_actions", wait_until="load"
        )
        self.page.get_by_test_id(f"hitl-option-{option}").click()
        self.page.get_by_text(f"{task_id} response successful").wait_for()
        self._leave()

    def _leave(self) -> None:
        # an open DAG page polls the API and renders its grid every few seconds: over the
        # minutes a test then waits for the run, a minute of the renderer's CPU
        self.page.goto("about:blank")
