"""A headless-browser screenshot of a running Airflow's UI (the deployment itself:
``dev.airflow``)."""

from __future__ import annotations

from pathlib import Path


def screenshot(url: str, token: str | None, path: Path, expect: str) -> str:
    """Open ``url`` in headless Chromium (Debian's, via Playwright), logged in to Airflow with
    ``token`` if given, wait until ``expect`` is on the page (up to 180 s), save a PNG and
    return the page's visible text.

    Waiting for the text rather than for network idle: MLflow's and Airflow's UIs poll, and
    on a loaded machine the network may never go quiet for Playwright's 500 ms.
    """
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import sync_playwright

    from tests.browser import CHROMIUM, CHROMIUM_ARGS

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(viewport={"width": 1600, "height": 1000})
            if token:
                context.add_cookies([{"name": "_token", "value": token, "url": url.split("/dags")[0]}])
            page = context.new_page()
            page.goto(url, wait_until="load", timeout=120_000)
            page.get_by_text(expect).first.wait_for(timeout=180_000)
            try:
                page.wait_for_load_state("networkidle", timeout=10_000)
            except PlaywrightTimeout:
                pass  # the text is there; a poll still running only delays the picture
            page.wait_for_timeout(1000)
            page.screenshot(path=str(path), full_page=True)
            return page.inner_text("body")
        finally:
            browser.close()
