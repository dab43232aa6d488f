"""Debian's chromium driven by Playwright's Python API, for the console's browser tests.

Playwright is pointed at the system's browser (`CHROMIUM`), so it downloads nothing. A module
starts one browser; each test gets a fresh page of it through `Console`, which records what the
page logs as an error, every uncaught exception and every Content-Security-Policy violation, so
a test can say that the page ran clean.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from playwright.sync_api import Browser, ConsoleMessage, Page, sync_playwright

from tests.twserve.support.live import CONTROL_KEY

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# The console logs a refused fetch as "Failed to load resource: … status of 422 (…)".
_FAILED_LOAD = re.compile(r"Failed to load resource: the server responded with a status of (\d+)")


@contextmanager
def chromium() -> Iterator[Browser]:
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            yield browser
        finally:
            browser.close()


@dataclass
class Console:
    """One page of the console at `base` (``http://127.0.0.1:<control port>``)."""

    page: Page
    base: str
    errors: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.page.on("console", self._console)
        self.page.on("pageerror", lambda exc: self.errors.append(f"uncaught: {exc}"))
        self.page.set_default_timeout(10_000)

    def _console(self, message: ConsoleMessage) -> None:
        if message.type == "error":
            self.errors.append(message.text)

    def open(self, fragment: str = "#/traffic") -> None:
        self.page.goto(f"{self.base}/ui/{fragment}")

    def sign_in(self, key: str = CONTROL_KEY, fragment: str = "#/traffic") -> None:
        self.open(fragment)
        self.page.fill("#control-key", key)
        self.page.click("#signin button[type=submit]")
        if key == CONTROL_KEY:
            self.page.wait_for_selector("#nav a.active")

    def go(self, fragment: str) -> None:
        self.page.evaluate("f => { location.hash = f; }", fragment)

    def unexpected_errors(self, *statuses: int) -> list[str]:
        """What the page logged as errors, less the refused fetches of `statuses` a test
        provoked on purpose."""
        out = []
        for text in self.errors:
            m = _FAILED_LOAD.search(text)
            if m is None or int(m[1]) not in statuses:
                out.append(text)
        return out


@contextmanager
def console_page(
    browser: Browser, base: str, *, width: int = 1280, height: int = 800
) -> Iterator[Console]:
    context = browser.new_context(viewport={"width": width, "height": height})
    try:
        yield Console(context.new_page(), base)
    finally:
        context.close()
