"""A headless-browser screenshot of a running Airflow's UI (the deployment itself:
``recpipe.local_airflow``)."""

from __future__ import annotations

from pathlib import Path


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
