"""Fixtures for the browser tests: one Debian Chromium per session, driven by Playwright's sync API.

Guarantee: the browser is the system's Chromium launched by executable path (Playwright never
downloads one); every context a test opens is closed at its teardown, and the browser and the
Playwright driver at the end of the session, so no browser process outlives the tests.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import pytest
from playwright.sync_api import Browser, BrowserContext, Playwright, sync_playwright
from support.processes import REPO, AppServer, Ingress

from browser.scenario import PendingRefund, start_pending_refund

CHROMIUM = Path(os.environ.get("CHROMIUM_PATH", "/usr/bin/chromium"))
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SCREENSHOTS = REPO / "test-artifacts" / "screenshots"
PHONE_WIDTH, PHONE_HEIGHT = 390, 844
PHONE: dict[str, Any] = {
    "viewport": {"width": PHONE_WIDTH, "height": PHONE_HEIGHT},
    "device_scale_factor": 3,
    "is_mobile": True,
    "has_touch": True,
}
ACTION_TIMEOUT_MS = 15_000


class ContextFactory(Protocol):
    def __call__(self, **options: Any) -> BrowserContext: ...


class RefundStarter(Protocol):
    def __call__(self, amount: str = "612.40") -> PendingRefund: ...


@pytest.fixture
def pending_refund(
    app_server: AppServer, ingress: Ingress, outbox_dir: Path, demo_db: Path, run_id: str
) -> RefundStarter:
    """Starts this test's refund run (of `amount` USD) and returns it once its approval email is out."""

    def start(amount: str = "612.40") -> PendingRefund:
        return start_pending_refund(ingress, demo_db, outbox_dir, run_id, amount)

    return start


@pytest.fixture(scope="session")
def playwright() -> Iterator[Playwright]:
    with sync_playwright() as driver:
        yield driver


@pytest.fixture(scope="session")
def browser(playwright: Playwright) -> Iterator[Browser]:
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(
            f"no Chromium at {CHROMIUM}: run scripts/bootstrap (installs Debian's chromium) or set CHROMIUM_PATH"
        )
    chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_FLAGS, headless=True)
    try:
        yield chromium
    finally:
        chromium.close()


@pytest.fixture()
def new_context(browser: Browser) -> Iterator[ContextFactory]:
    """Open browser contexts (JavaScript off unless asked: the pages must work without it)."""
    opened: list[BrowserContext] = []

    def open_context(**options: Any) -> BrowserContext:
        context = browser.new_context(**{"java_script_enabled": False, **options})
        context.set_default_timeout(ACTION_TIMEOUT_MS)
        opened.append(context)
        return context

    try:
        yield open_context
    finally:
        for context in opened:
            context.close()


@pytest.fixture(scope="session")
def screenshots() -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    return SCREENSHOTS
